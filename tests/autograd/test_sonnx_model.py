"""SONNXModel beyond the snippets: last_layers / aux_output, prepare/SingaRep, Model.cut,
training-mode forms of imported nodes, parameters vs states vs constants."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from workbench import autograd, opt, sonnx, tensor
from workbench.errors import InputError, ShapeError


def mlp_proto(opset=13):
    rng = np.random.default_rng(0)
    inits = {"w1": rng.standard_normal((4, 6)).astype(np.float32),
             "b1": rng.standard_normal(6).astype(np.float32),
             "w2": rng.standard_normal((6, 3)).astype(np.float32),
             "shape": np.array([-1, 3], np.int64),
             "ratio": np.array(0.5, np.float32)}
    nodes = [
        helper.make_node("MatMul", ["x", "w1"], ["h"], name="mm1"),
        helper.make_node("Add", ["h", "b1"], ["hb"], name="add1"),
        helper.make_node("Relu", ["hb"], ["r"], name="relu"),
        helper.make_node("Dropout", ["r", "ratio"], ["d"], name="drop"),
        helper.make_node("Constant", [], ["two"], name="two",
                         value=numpy_helper.from_array(np.array(2.0, np.float32))),
        helper.make_node("MatMul", ["d", "w2"], ["o"], name="mm2"),
        helper.make_node("Mul", ["o", "two"], ["o2"], name="scale"),
        helper.make_node("Reshape", ["o2", "shape"], ["y"], name="reshape"),
    ]
    g = helper.make_graph(nodes, "mlp", [helper.make_tensor_value_info(
        "x", TensorProto.FLOAT, ["N", 4])], [helper.make_tensor_value_info(
            "y", TensorProto.FLOAT, ["N", 3])], [numpy_helper.from_array(v, k) for k, v in
                                                 inits.items()])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = 8
    onnx.checker.check_model(m)
    return m


X = np.random.default_rng(1).standard_normal((5, 4)).astype(np.float32)


def ref(x, upto):
    rng = np.random.default_rng(0)
    w1, b1, w2 = (rng.standard_normal((4, 6)).astype(np.float32),
                  rng.standard_normal(6).astype(np.float32),
                  rng.standard_normal((6, 3)).astype(np.float32))
    r = np.maximum(x @ w1 + b1, 0)
    return {"relu": r, "mm2": r @ w2, "y": (r @ w2) * 2}[upto]


def test_parameters_states_and_constants():
    m = sonnx.SONNXModel(mlp_proto())
    assert sorted(m.get_params()) == ["b1", "w1", "w2"]  # Dropout's ratio is a setting
    assert "shape" not in m.get_states() and "ratio" not in m.get_states()
    assert m.layer_names() == ["mm1", "add1", "relu", "drop", "mm2", "scale", "reshape"]


def test_last_layers_counts_nodes_like_the_singa_page():
    m = sonnx.SONNXModel(mlp_proto())
    m.eval()
    x = tensor.from_numpy(X)
    np.testing.assert_allclose(m.forward(x)[0].numpy(), ref(X, "y"), rtol=1e-5)
    np.testing.assert_allclose(m.forward(x, last_layers=-1)[0].numpy(), ref(X, "y"), rtol=1e-5)
    # -2: cut after the second-to-last node (Mul), -3: after mm2 ... Constants not counted
    np.testing.assert_allclose(m.forward(x, last_layers=-2)[0].numpy(), ref(X, "y"),
                               rtol=1e-5)
    np.testing.assert_allclose(m.forward(x, last_layers=-3)[0].numpy(), ref(X, "mm2"),
                               rtol=1e-5)
    np.testing.assert_allclose(m.forward(x, last_layers="relu")[0].numpy(), ref(X, "relu"),
                               rtol=1e-5)
    outs = m.forward(x, last_layers="o", aux_output=["r"])
    np.testing.assert_allclose(outs[1].numpy(), ref(X, "relu"), rtol=1e-5)
    with pytest.raises(InputError, match="did you mean"):
        m.forward(x, last_layers="rellu")
    with pytest.raises(InputError, match="smallest value is -7"):
        m.forward(x, last_layers=-8)


def test_prepare_and_singarep():
    rep = sonnx.prepare(mlp_proto(), "CPU")
    outs = rep.run([X])
    assert isinstance(outs[0], np.ndarray)
    np.testing.assert_allclose(outs[0], ref(X, "y"), rtol=1e-5)
    touts = rep.run([tensor.from_numpy(X)], last_layers="relu")
    assert isinstance(touts[0], tensor.Tensor)
    np.testing.assert_allclose(touts[0].numpy(), ref(X, "relu"), rtol=1e-5)
    back = sonnx.SingaBackend.prepare(mlp_proto()).run(X)
    np.testing.assert_allclose(back[0], ref(X, "y"), rtol=1e-5)


def test_cut_returns_a_new_smaller_model_with_current_weights():
    m = sonnx.SONNXModel(mlp_proto())
    m.get_params()["w1"].data *= 2
    c = m.cut("relu")
    assert c is not m
    assert [n.name for n in c.onnx_graph.nodes] == ["mm1", "add1", "relu"]
    assert sorted(c.get_params()) == ["b1", "w1"]
    rng = np.random.default_rng(0)
    w1 = rng.standard_normal((4, 6)).astype(np.float32) * 2
    b1 = rng.standard_normal(6).astype(np.float32)
    np.testing.assert_allclose(c.forward(tensor.from_numpy(X))[0].numpy(),
                               np.maximum(X @ w1 + b1, 0), rtol=1e-5)
    onnx.checker.check_model(c._proto)
    # the original is untouched by changes to the copy
    c.get_params()["w1"].data *= 0
    assert np.abs(m.get_params()["w1"].numpy()).sum() > 0


def test_training_mode_uses_the_training_forms_of_imported_nodes():
    m = sonnx.SONNXModel(mlp_proto())
    m.train()
    autograd.manual_seed(0)
    h = m.forward(tensor.from_numpy(np.abs(X) + 1), last_layers="d")[0].numpy()
    frac = (h == 0).mean()
    assert 0.2 < frac < 0.8  # dropout 0.5 drops in training
    m.eval()
    h = m.forward(tensor.from_numpy(np.abs(X) + 1), last_layers="d")[0].numpy()
    np.testing.assert_allclose(h, ref(np.abs(X) + 1, "relu"), rtol=1e-5)


def test_sgd_on_imported_graph_reduces_mse():
    m = sonnx.SONNXModel(mlp_proto())
    m.eval()  # no dropout: deterministic
    target = np.zeros((5, 3), np.float32)
    sgd = opt.SGD(lr=0.01)
    losses = []
    for _ in range(5):
        y = m.forward(tensor.from_numpy(X))[0]
        loss = autograd.mse_loss(y, target)
        losses.append(loss.item())
        sgd.backward_and_update(loss)
    assert losses[-1] < losses[0]


def test_input_checks():
    m = sonnx.SONNXModel(mlp_proto())
    with pytest.raises(InputError, match="takes 1 input"):
        m.forward(tensor.from_numpy(X), tensor.from_numpy(X))
    with pytest.raises(InputError, match="expects dtype float32"):
        m.forward(tensor.from_numpy(X.astype(np.int64)))
    with pytest.raises(ShapeError, match="dimension 1 differs"):
        m.forward(tensor.from_numpy(np.ones((5, 5), np.float32)))
    with pytest.raises(ShapeError, match="rank"):
        m.forward(tensor.from_numpy(np.ones((5,), np.float32)))


def test_compile_for_inference_saves_nothing_for_backward_until_train():
    m = sonnx.SONNXModel(mlp_proto())
    m.compile([tensor.PlaceHolder((5, 4))], is_train=False)
    y = m.forward(tensor.from_numpy(X))[0]
    assert y.creator is not None and y.creator.saved_in is None and not y.requires_grad
    exported = sonnx.to_onnx([tensor.PlaceHolder((5, 4))], [y])  # still exportable
    assert [n.name for n in exported.graph.node][-1] == "reshape"
    m.train()
    y = m.forward(tensor.from_numpy(X))[0]
    assert y.requires_grad


def test_export_without_compile_keeps_names_and_dynamic_dims(tmp_path):
    ort = pytest.importorskip("onnxruntime")
    m = sonnx.SONNXModel(mlp_proto())
    np.testing.assert_allclose(m.run(X)[0], ref(X, "y"), rtol=1e-5)
    path = tmp_path / "mlp.onnx"
    m.export(path)
    p = onnx.load(str(path))
    assert [i.name for i in p.graph.input] == ["x"] and [o.name for o in p.graph.output] == ["y"]
    assert p.graph.input[0].type.tensor_type.shape.dim[0].dim_param == "N"
    s = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    np.testing.assert_allclose(s.run(None, {"x": X})[0], ref(X, "y"), rtol=1e-5)


def test_a_training_step_records_its_constants_made_once():
    """The Tensor runner makes a host Constant's array once and hands it out on every run;
    each step still records the Constant on the tape (export writes it) and uses its value."""
    from workbench.autodiff.tape import tape_order
    m = sonnx.SONNXModel(mlp_proto())
    m.eval()   # no dropout: the reference below holds
    twos = []
    for _ in range(3):
        x = tensor.from_numpy(X)
        y = m.forward(x)[0]
        np.testing.assert_allclose(y.numpy(), ref(X, "y"), rtol=1e-5)
        nodes = [n for n in tape_order([y]) if n.op_type == "Constant"]
        assert len(nodes) == 1 and nodes[0].name == "two"
        twos.append(nodes[0].fn())
    assert twos[0] is twos[1] is twos[2] and float(twos[0]) == 2.0
    exported = sonnx.to_onnx([x], [y])
    consts = [n for n in exported.graph.node if n.op_type == "Constant"]
    inits = {i.name: numpy_helper.to_array(i) for i in exported.graph.initializer}
    assert consts or any(v.shape == () and float(v) == 2.0 for v in inits.values())


def test_a_direct_forward_runs_with_one_blas_thread():
    """``forward`` called directly computes with one BLAS thread, as ``model(...)`` and the
    backward do, and gives BLAS its thread count back afterwards."""
    threadpoolctl = pytest.importorskip("threadpoolctl")
    from workbench.ops import parallel

    m = sonnx.SONNXModel(mlp_proto())
    m.eval()
    seen = []
    real = m._forward

    def spy(*a, **k):
        seen.append(threadpoolctl.threadpool_info())
        return real(*a, **k)

    m._forward = spy
    def blas_threads(info):
        return [i["num_threads"] for i in info if i["user_api"] == "blas"]

    with threadpoolctl.threadpool_limits(2, user_api="blas"):
        before = blas_threads(threadpoolctl.threadpool_info())
        y = m.forward(tensor.from_numpy(X))[0].numpy()
        after = blas_threads(threadpoolctl.threadpool_info())
    inside = blas_threads(seen[0])
    assert inside and all(n == 1 for n in inside)
    assert after == before
    with parallel.one_blas_thread():
        want = m.forward(tensor.from_numpy(X))[0].numpy()
    np.testing.assert_array_equal(y, want)
