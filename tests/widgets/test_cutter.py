import numpy as np
import pytest
import synth

from workbench.errors import InputError
from workbench.graph.load import load
from workbench.runtime.cut import layer_nodes, resolve_cut
from workbench.runtime.plan import Plan
from workbench.widgets import LayerCutter


def test_slider_range_and_outputs_match_resolve_cut():
    m = synth.mlp()
    g = load(m).graph
    cutter = LayerCutter(m)
    n = len(layer_nodes(g))
    # every node of an MLP is drawn: a position each
    assert (cutter.slider.options[0][1], cutter.slider.options[-1][1]) == (-n, -1)
    assert cutter.slider.value == -1 and len(cutter.slider.options) == n
    for k in range(-1, -n - 1, -1):
        cutter.slider.value = k                    # moving the slider
        assert cutter.last_layers == k
        assert cutter.outputs == resolve_cut(g, k)
    cutter.last_layers = -1
    assert cutter.view.dimmed == [] and cutter.outputs == ["y"]
    with pytest.raises(InputError):
        cutter.last_layers = 3
    with pytest.raises(InputError):
        cutter.last_layers = "no_such_node"


def test_click_picks_a_cut_by_node_name():
    cutter = LayerCutter(synth.mlp())
    cutter.view.set_state({"selected": "relu1"})   # a click in the embedded graph
    assert cutter.last_layers == "relu1"
    assert cutter.outputs == ["h3"]
    assert cutter.slider.value == -4               # the same cut as an int
    assert cutter.view.marked == ["relu1"]
    assert set(cutter.view.dimmed) == {"fc2", "fc2_bias", "softmax", "y"}
    assert "relu1" in cutter.cut_label.value and "h3" in cutter.info.value
    assert "layer 3 of 6" in cutter.cut_label.value       # fc1, fc1_bias, relu1 | of 6
    assert "float32 [N, 16]" in repr(cutter)


def test_slider_counts_layers_without_constants_and_marks_the_folded_graph():
    """SINGA's count: Constant nodes are not layers. The drawing folds them (and shape
    computations) into their consumer; a cut on a folded node marks the node it folds into."""
    from onnx import TensorProto, helper, numpy_helper
    nodes = [helper.make_node("Relu", ["x"], ["r"], name="relu"),
             helper.make_node("Constant", [], ["shape"], name="const",
                              value=numpy_helper.from_array(np.array([2, 3], np.int64))),
             helper.make_node("Shape", ["r"], ["s"], name="shape_of"),
             helper.make_node("Reshape", ["r", "shape"], ["y0"], name="reshape"),
             helper.make_node("Sigmoid", ["y0"], ["y"], name="sig")]
    g = helper.make_graph(nodes, "g",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3, 2])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3]),
                           helper.make_tensor_value_info("s", TensorProto.INT64, [2])])
    cutter = LayerCutter(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]))
    # relu, shape_of (a graph output), reshape, sig: not const
    assert [v for _, v in cutter.slider.options] == [-4, -3, -2, -1]
    d = cutter.view.graph_data
    host = dict(zip(d["name"], d["host"]))
    assert host["const"] == d["name"].index("reshape")       # folded in the drawing
    cutter.last_layers = "reshape"
    assert cutter.view.marked == ["reshape"] and "layer 3 of 4" in cutter.cut_label.value


def _forward(model, x):
    from workbench import tensor
    out = model.forward(tensor.Tensor(data=x))
    return [tensor.to_numpy(t) for t in (out if isinstance(out, (list, tuple)) else [out])]


def test_cut_model_is_equivalent_to_the_executor_and_model_cut(require_runnable, rng):
    sonnx = pytest.importorskip("workbench.sonnx")
    m = synth.mlp()
    require_runnable(m)
    g = load(m).graph
    x = rng.standard_normal((3, 8)).astype(np.float32)
    cutter = LayerCutter(m)
    full = sonnx.SONNXModel(m)
    choices = list(range(-1, -len(layer_nodes(g)) - 1, -1)) + ["fc1_bias", "relu1", "h4"]
    for k in choices:
        cutter.last_layers = k
        want = Plan(g, outputs=resolve_cut(g, k)).run([x])
        cm = cutter.model                          # Model.cut(k): a new SONNXModel
        assert isinstance(cm, sonnx.SONNXModel)
        ref = full.cut(k)
        assert cm.output_names == ref.output_names == cutter.outputs
        assert list(cm.get_params()) == list(ref.get_params())
        for got in (_forward(cm, x), _forward(ref, x), cutter.cut_graph().run([x])):
            assert len(got) == len(want)
            for a, b in zip(got, want):
                np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-6)


def test_a_workbench_model_is_cut_with_its_own_cut(require_runnable, rng):
    sonnx = pytest.importorskip("workbench.sonnx")
    m = synth.mlp()
    require_runnable(m)
    full = sonnx.SONNXModel(m)
    cutter = LayerCutter(full, last_layers="relu1")
    assert cutter.graph is full.onnx_graph or len(cutter.graph.nodes) == 6
    cm = cutter.model
    assert cm.output_names == ["h3"]
    x = rng.standard_normal((3, 8)).astype(np.float32)
    np.testing.assert_allclose(_forward(cm, x)[0], _forward(full.cut("relu1"), x)[0])


def test_new_head_on_the_model(require_runnable, rng):
    pytest.importorskip("workbench.sonnx")
    m = synth.mlp()
    require_runnable(m)
    cutter = LayerCutter(m, last_layers="relu1", head_classes=5, freeze=True)
    hm = cutter.model
    x = rng.standard_normal((3, 8)).astype(np.float32)
    y, = _forward(hm, x)
    assert y.shape == (3, 5)
    params = hm.get_params()
    assert {k for k, p in params.items() if p.requires_grad} == {"head.W", "head.b"}
    cutter.freeze = False
    assert all(p.requires_grad for p in cutter.model.get_params().values())


def test_graph_level_cut_structure_and_head(require_runnable, rng):
    m = synth.mlp()
    cutter = LayerCutter(m, last_layers="relu1")
    cm = cutter.cut_graph()
    assert [n.name for n in cm.graph.nodes] == ["fc1", "fc1_bias", "relu1"]
    assert set(cm.graph.initializers) == {"W1", "b1"}
    import onnx
    onnx.checker.check_model(cm.to_proto())
    cutter.head_classes = 5
    cutter.freeze = True
    assert cutter.head_box.value and cutter.classes_box.value == 5 and cutter.freeze_box.value
    cm = cutter.cut_graph()
    assert cm.outputs == ["head.logits"]
    assert cm.head == {"in_features": 16, "classes": 5, "source": "h3"}
    assert cm.frozen == {"W1", "b1"} and cm.trainable == ["head.weight", "head.bias"]
    assert "Linear(16 → 5)" in cutter.info.value
    require_runnable(m)
    require_runnable(cm.to_proto())
    x = rng.standard_normal((3, 8)).astype(np.float32)
    y, = cm.run([x])
    h = np.maximum(x @ load(m).graph.initializers["W1"] + load(m).graph.initializers["b1"], 0)
    np.testing.assert_allclose(y, h @ cm.graph.initializers["head.weight"].T, rtol=1e-5,
                               atol=1e-5)
    cutter.head_box.value = False                   # the checkbox removes the head
    assert cutter.head_classes == 0 and cutter.cut_graph().head is None


def test_cutter_on_graph_without_nodes():
    from onnx import TensorProto, helper
    g = helper.make_graph([], "passthrough",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])],
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])])
    cutter = LayerCutter(helper.make_model(g))
    assert cutter.outputs == ["x"] and [v for _, v in cutter.slider.options] == [-1]


def _exported_blocks(blocks=3):
    """Blocks as exporters write them: a MatMul, then the batch size read back with
    Shape -> Gather -> Unsqueeze -> Concat (with Constant nodes) to Reshape, then a Relu."""
    from onnx import TensorProto, helper, numpy_helper
    rng = np.random.default_rng(0)
    nodes, inits, x = [], [], "x"
    for b in range(blocks):
        p = f"/blocks.{b}/"

        def node(op, ins, name, p=p, **kw):
            nodes.append(helper.make_node(op, ins, [p + name + "_output_0"], name=p + name, **kw))
            return p + name + "_output_0"

        inits.append(numpy_helper.from_array(
            rng.standard_normal((6, 6)).astype(np.float32), p + "w"))
        mm = node("MatMul", [x, p + "w"], "MatMul")
        shp = node("Shape", [mm], "Shape")
        idx = node("Constant", [], "Constant",
                   value=numpy_helper.from_array(np.array(0, np.int64)))
        n = node("Gather", [shp, idx], "Gather", axis=0)
        ax = node("Constant", [], "Constant_1",
                  value=numpy_helper.from_array(np.array([0], np.int64)))
        n = node("Unsqueeze", [n, ax], "Unsqueeze")
        rest = node("Constant", [], "Constant_2",
                    value=numpy_helper.from_array(np.array([2, 3], np.int64)))
        to = node("Concat", [n, rest], "Concat", axis=0)
        r = node("Reshape", [mm, to], "Reshape")
        x = node("Relu", [r], "Relu")
        if b < blocks - 1:
            to6 = node("Constant", [], "Constant_3",
                       value=numpy_helper.from_array(np.array([-1, 6], np.int64)))
            x = node("Reshape", [x, to6], "Flat")
    g = helper.make_graph(nodes, "blocks",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 6])],
                          [helper.make_tensor_value_info(x, TensorProto.FLOAT, ["N", 2, 3])],
                          inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def test_slider_steps_over_drawn_layers_not_shape_arithmetic(rng):
    """A transformer export has hundreds of shape-arithmetic nodes between its layers (issue
    26: 814 positions on a 12-block GPT-2): the slider stops only at nodes the drawing shows,
    its readout is still the last_layers value, and every stop cuts as resolve_cut says."""
    m = _exported_blocks(3)
    g = load(m).graph
    layers = layer_nodes(g)
    cutter = LayerCutter(m)
    stops = [v for _, v in cutter.slider.options]
    assert [label for label, _ in cutter.slider.options] == [str(v) for v in stops]
    at = [layers[k].name.rsplit("/", 1)[1] for k in stops]
    # 3 blocks of MatMul, Reshape, Relu (+ the Flat reshape between blocks), the last being -1
    assert at == ["MatMul", "Reshape", "Relu", "Flat"] * 2 + ["MatMul", "Reshape", "Relu"]
    assert len(stops) < len(layers) / 2
    x = rng.standard_normal((2, 6)).astype(np.float32)
    for k in stops:
        cutter.slider.value = k
        assert cutter.last_layers == k and cutter.outputs == resolve_cut(g, k)
        assert cutter.cut_graph().run({"x": x})[0].dtype == np.float32
    # a cut given on a folded node (by its count or name) still cuts there; the slider and
    # the drawing show it at the node it is drawn in
    k_unsq = next(i for i, n in enumerate(layers)
                  if n.name == "/blocks.1/Unsqueeze") - len(layers)
    cutter.last_layers = k_unsq
    assert cutter.outputs == resolve_cut(g, k_unsq) == ["/blocks.1/Unsqueeze_output_0"]
    assert cutter.view.marked == ["/blocks.1/Unsqueeze"]
    reshape = next(i for i, n in enumerate(layers)
                   if n.name == "/blocks.1/Reshape") - len(layers)
    assert cutter.slider.value == reshape
    cutter.last_layers = "/blocks.0/Concat"
    assert cutter.slider.value == stops[1]                 # /blocks.0/Reshape
