import numpy as np
import pytest
import synth

from workbench.errors import InputError
from workbench.graph.executor import Plan, layer_nodes, resolve_cut
from workbench.graph.load import load
from workbench.widgets import LayerCutter


def test_slider_range_and_outputs_match_resolve_cut():
    m = synth.mlp()
    g = load(m).graph
    cutter = LayerCutter(m)
    n = len(layer_nodes(g))
    assert (cutter.slider.min, cutter.slider.max, cutter.slider.value) == (-n, -1, -1)
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
    assert "float32 [N, 16]" in repr(cutter)


def test_cut_model_is_equivalent_to_the_executor(require_runnable, rng):
    m = synth.mlp()
    require_runnable(m)
    g = load(m).graph
    x = rng.standard_normal((3, 8)).astype(np.float32)
    cutter = LayerCutter(m)
    for k in range(-1, -len(layer_nodes(g)) - 1, -1):
        cutter.last_layers = k
        want = Plan(g, outputs=resolve_cut(g, k)).run([x])
        got = cutter.model.run([x])
        assert len(got) == len(want)
        for a, b in zip(got, want):
            np.testing.assert_array_equal(a, b)
    for name in ("fc1_bias", "relu1", "h4"):
        cutter.last_layers = name
        want = Plan(g, outputs=resolve_cut(g, name)).run([x])
        np.testing.assert_array_equal(cutter.model.run([x])[0], want[0])


def test_cut_model_structure_and_head(require_runnable, rng):
    m = synth.mlp()
    cutter = LayerCutter(m, last_layers="relu1")
    cm = cutter.model
    assert [n.name for n in cm.graph.nodes] == ["fc1", "fc1_bias", "relu1"]
    assert set(cm.graph.initializers) == {"W1", "b1"}
    import onnx
    onnx.checker.check_model(cm.to_proto())
    cutter.head_classes = 5
    cutter.freeze = True
    assert cutter.head_box.value and cutter.classes_box.value == 5 and cutter.freeze_box.value
    cm = cutter.model
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
    assert cutter.head_classes == 0 and cutter.model.head is None


def test_cutter_on_graph_without_nodes():
    from onnx import TensorProto, helper
    g = helper.make_graph([], "passthrough",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])],
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])])
    cutter = LayerCutter(helper.make_model(g))
    assert cutter.outputs == ["x"] and cutter.slider.min == -1
