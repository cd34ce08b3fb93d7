"""The training-time fusions (workbench/autodiff/fusion.py's GELU chain, fuse_attention.py's
attention core) and the Tensor runner's shape memo on graphs as exporters write them beyond
the shapes the fusion tests build: a fused step gives the graph's own shapes and values (a
constant of a higher rank than the value it scales broadcasts the result to that rank), and
the fused training equals the unfused one within float rounding."""

from __future__ import annotations

import math

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

from tests.helpers.singa_flag import singa_training_flag  # noqa: E402,F401
from workbench import autograd, compiled, sonnx, tensor  # noqa: E402
from workbench.autodiff.tape import tape_order  # noqa: E402
from workbench.compiled import image  # noqa: E402

UNFUSED = {"WORKBENCH_FUSE_ATTENTION": "0", "WORKBENCH_FUSE_GELU": "0",
           "WORKBENCH_SHAPE_MEMO": "0"}


@pytest.fixture(scope="module")
def kernels():
    names = ("transformer.gelu_grad", "attention_avx2.attention_grad")
    if image.supported() is not None \
            or not compiled.wait(["transformer", "attention_avx2"], timeout=900) \
            or any(compiled.kernel(k) is None for k in names):
        pytest.skip(f"kernel modules are not available: {compiled.status()}")


def _const(name, value, shape=()):
    return helper.make_node("Constant", [], [name], name=name, value=numpy_helper.from_array(
        np.full(shape, value, np.float32), name))


def _model(nodes, x_shape, out_shape, inits, inputs=()):
    g = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("X", TensorProto.FLOAT, list(x_shape))]
        + list(inputs), [helper.make_tensor_value_info("out", TensorProto.FLOAT, out_shape)],
        inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def gelu_model(cshape):
    """X (4, 6) @ W -> the erf GELU chain with constants of shape ``cshape``."""
    w = np.random.default_rng(0).standard_normal((6, 6)).astype(np.float32) * 0.3
    nodes = [helper.make_node("MatMul", ["X", "W"], ["x"]),
             _const("s2", math.sqrt(2.0), cshape), _const("one", 1.0, cshape),
             _const("half", 0.5, cshape),
             helper.make_node("Div", ["x", "s2"], ["d"]), helper.make_node("Erf", ["d"], ["e"]),
             helper.make_node("Add", ["e", "one"], ["a"]),
             helper.make_node("Mul", ["x", "a"], ["m"]),
             helper.make_node("Mul", ["m", "half"], ["out"])]
    out = [1] * max(0, len(cshape) - 2) + [4, 6]
    return _model(nodes, (4, 6), out, [numpy_helper.from_array(w, "W")])


def attention_model(cshape, fill_shape=None):
    """X (3, 5, 8) -> Q, K, V (rank 3) -> MatMul, Div by a constant of shape ``cshape``
    (then, with ``fill_shape``, a causal Where with a fill of that shape), Softmax, MatMul."""
    rng = np.random.default_rng(1)
    inits = [numpy_helper.from_array(rng.standard_normal((8, 8)).astype(np.float32) * 0.3, n)
             for n in ("Wq", "Wk", "Wv")]
    nodes = [helper.make_node("MatMul", ["X", f"W{c}"], [c]) for c in "qkv"]
    nodes += [helper.make_node("Transpose", ["k"], ["kt"], perm=[0, 2, 1]),
              helper.make_node("MatMul", ["q", "kt"], ["s"]), _const("c", 2.0, cshape),
              helper.make_node("Div", ["s", "c"], ["d"])]
    rank = len(cshape)
    x = "d"
    if fill_shape is not None:
        cond = np.tril(np.ones((5, 5), bool))
        nodes += [helper.make_node("Constant", [], ["cond"], value=numpy_helper.from_array(
                      cond, "cond")), _const("fill", -1e9, fill_shape),
                  helper.make_node("Where", ["cond", "d", "fill"], ["w"])]
        rank, x = max(rank, len(fill_shape)), "w"
    nodes += [helper.make_node("Softmax", [x], ["p"], axis=-1),
              helper.make_node("MatMul", ["p", "v"], ["out"])]
    out = [1] * max(0, rank - 3) + [3, 5, 8]
    return _model(nodes, (3, 5, 8), out, inits)


def train(proto, x_shape, steps=3, env=None, monkeypatch=None):
    """(outputs, losses, {param: grads of the last step}, the last step's fused ops) of
    ``steps`` SGD steps on fresh inputs (p -= 0.1 g)."""
    for k, v in (env or {}).items():
        monkeypatch.setenv(k, v)
    rng = np.random.default_rng(2)
    m = sonnx.SONNXModel(proto)
    m.compile([tensor.PlaceHolder(x_shape)], is_train=True)
    params = m.get_params()
    names = {id(p): k for k, p in params.items()}
    outs, losses, grads, fused = [], [], {}, []
    for _ in range(steps):
        o = m.forward(tensor.from_numpy(rng.standard_normal(x_shape).astype(np.float32)))[0]
        outs.append(o.numpy().copy())
        loss = autograd.mse_loss(o, np.ones(o.shape, np.float32))
        losses.append(loss.item())
        fused = [n.op_type for n in tape_order([loss]) if n.grad_rule is not None]
        grads = {names[id(p)]: g.numpy().copy() for p, g in autograd.backward(loss)}
        for k, g in grads.items():
            params[k].data = params[k].data - np.float32(0.1) * g
    for k in env or {}:
        monkeypatch.delenv(k)
    return outs, losses, grads, fused


def _same_training(fused, plain):
    assert [o.shape for o in fused[0]] == [o.shape for o in plain[0]]
    for a, b in zip(fused[0], plain[0]):
        np.testing.assert_allclose(a, b, rtol=2e-5, atol=2e-6)
    np.testing.assert_allclose(fused[1], plain[1], rtol=1e-5)
    assert fused[2].keys() == plain[2].keys()
    for k, g in plain[2].items():
        np.testing.assert_allclose(fused[2][k], g, rtol=1e-4, atol=1e-5 * np.abs(g).max())


@pytest.mark.parametrize("cshape,fuses", [((), True), ((1,), True), ((1, 1), True),
                                          ((1, 1, 1), False)])
def test_gelu_constants_of_a_higher_rank_keep_the_graphs_shape(kernels, monkeypatch, cshape,
                                                                fuses):
    # constants of shape (1, 1, 1) broadcast the (4, 6) activations to (1, 4, 6): the fused
    # step (which computes GELU in x's shape) ran with (4, 6) from the second step on
    fused = train(gelu_model(cshape), (4, 6))
    plain = train(gelu_model(cshape), (4, 6), env=UNFUSED, monkeypatch=monkeypatch)
    want = (1,) * max(0, len(cshape) - 2) + (4, 6)
    assert {o.shape for o in fused[0]} == {want}
    assert fused[3] == (["Div", "Erf", "Add", "Mul", "Mul"] if fuses else [])
    _same_training(fused, plain)


@pytest.mark.parametrize("cshape,fill_shape,fuses", [
    ((), None, True), ((1, 1, 1), None, True), ((1, 1, 1, 1), None, False),
    ((), (1, 1, 1), True), ((), (1, 1, 1, 1), False)])
def test_attention_constants_of_a_higher_rank_keep_the_graphs_shape(kernels, monkeypatch,
                                                                    cshape, fill_shape, fuses):
    # rank-3 scores (a (batch * heads, S, S) export) scaled by a (1, 1, 1, 1) constant, or
    # filled by a (1, 1, 1, 1) Where constant, are rank 4: the fused core dropped the axis
    fused = train(attention_model(cshape, fill_shape), (3, 5, 8))
    plain = train(attention_model(cshape, fill_shape), (3, 5, 8), env=UNFUSED,
                  monkeypatch=monkeypatch)
    rank = max(len(cshape), len(fill_shape or ()))
    assert {o.shape for o in fused[0]} == {(1,) * max(0, rank - 3) + (3, 5, 8)}
    want = ["MatMul", "Div"] + (["Where"] if fill_shape is not None else []) \
        + ["Softmax", "MatMul"]
    assert fused[3] == (want if fuses else [])
    _same_training(fused, plain)
