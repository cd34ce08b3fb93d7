"""The training step's fused attention core (workbench/autodiff/fuse_attention.py): the same
training as the unfused core within float rounding (scale by Div / Mul / none, with and without
a mask), the tape still holds (and exports) the original nodes, cores the analysis or the
run-time checks must not fuse stay unfused (bit for bit), a single-node backward of a fused
node is refused clearly, and the compiled forward / backward entries match numpy on odd
sizes and strided operands."""

from __future__ import annotations

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

from workbench import autograd, compiled, opt, sonnx, tensor  # noqa: E402
from workbench.autodiff import backprop, fuse_attention  # noqa: E402
from workbench.autodiff.tape import tape_order  # noqa: E402
from workbench.compiled import image  # noqa: E402
from workbench.errors import GradientError  # noqa: E402

B, S, H, DH = 2, 6, 2, 4
E = H * DH


@pytest.fixture(scope="module")
def kernels():
    if image.supported() is not None or not compiled.wait(["attention_avx2"], timeout=900) \
            or compiled.kernel("attention_avx2.attention_grad") is None:
        pytest.skip(f"kernel module attention_avx2 is not available: {compiled.status()}")


def _const(name, value):
    return helper.make_node("Constant", [], [name], name=name,
                            value=numpy_helper.from_array(np.array(value, np.float32), name))


def _i64(name, values):
    return numpy_helper.from_array(np.array(values, np.int64), name)


def attention_model(scale="Div", mask=True, extra_output=False, mask_input=True):
    """X (B, S, E) -> Q, K, V projections -> heads -> the exported attention core -> merge
    -> a (B*S*E, 3) head on the flattened values (logits (B, 3))."""
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array((rng.standard_normal((E, E)) * 0.5).astype(np.float32), n)
             for n in ("Wq", "Wk", "Wv")]
    inits += [numpy_helper.from_array((rng.standard_normal((S * E, 3)) * 0.2)
                                      .astype(np.float32), "Wo"),
              _i64("split", [B, S, H, DH]), _i64("merge", [B, S * E])]
    nodes = [helper.make_node("MatMul", ["X", f"W{c}"], [c], name=f"{c}/proj") for c in "qkv"]
    nodes += [helper.make_node("Reshape", [c, "split"], [f"{c}4"], name=f"{c}/split")
              for c in "qkv"]
    nodes += [helper.make_node("Transpose", ["q4"], ["qh"], perm=[0, 2, 1, 3], name="q/t"),
              helper.make_node("Transpose", ["k4"], ["kt"], perm=[0, 2, 3, 1], name="k/t"),
              helper.make_node("Transpose", ["v4"], ["vh"], perm=[0, 2, 1, 3], name="v/t"),
              helper.make_node("MatMul", ["qh", "kt"], ["s"], name="attn/MatMul")]
    x = "s"
    if scale:
        nodes += [_const("c", 2.0 if scale == "Div" else 0.5),
                  helper.make_node(scale, ["s", "c"], ["d"], name=f"attn/{scale}")]
        x = "d"
    if mask in ("where", "where_rev"):   # GPT-2's causal mask: a scalar fill by a Where
        causal = np.triu(np.ones((S, S), bool), 1)
        cond = causal if mask == "where" else ~causal
        nodes += [helper.make_node("Constant", [], ["cond"], name="cond",
                                   value=numpy_helper.from_array(cond.reshape(1, 1, S, S),
                                                                 "cond")),
                  _const("fill", np.finfo(np.float32).min)]
        ins_ = ["cond", "fill", x] if mask == "where" else ["cond", x, "fill"]
        nodes.append(helper.make_node("Where", ins_, ["a"], name="attn/Where"))
        x = "a"
    elif mask:
        nodes.append(helper.make_node("Add", [x, "M"], ["a"], name="attn/Add"))
        x = "a"
    nodes += [helper.make_node("Softmax", [x], ["p"], axis=-1, name="attn/Softmax"),
              helper.make_node("MatMul", ["p", "vh"], ["o"], name="attn/MatMul_1"),
              helper.make_node("Transpose", ["o"], ["ot"], perm=[0, 2, 1, 3], name="o/t"),
              helper.make_node("Reshape", ["ot", "merge"], ["flat"], name="o/merge"),
              helper.make_node("MatMul", ["flat", "Wo"], ["logits"], name="head")]
    ins = [helper.make_tensor_value_info("X", TensorProto.FLOAT, [B, S, E])]
    if mask is True and mask_input:
        ins.append(helper.make_tensor_value_info("M", TensorProto.FLOAT, [B, 1, 1, S]))
    elif mask is True:
        inits.append(numpy_helper.from_array(MASK, "M"))
    outs = [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [B, 3])]
    if extra_output:   # the probabilities are also a graph output: must not fuse
        outs.append(helper.make_tensor_value_info("p", TensorProto.FLOAT, [B, H, S, S]))
    g = helper.make_graph(nodes, "attention", ins, outs, inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


X = np.random.default_rng(1).standard_normal((B, S, E)).astype(np.float32)
MASK = np.zeros((B, 1, 1, S), np.float32)
MASK[1, ..., 4:] = -10000.0
Y = np.array([0, 2])


def train(proto, steps=3, mask=True, mask_input=True):
    """(losses, weights, the last step's tape nodes) of ``steps`` SGD steps."""
    m = sonnx.SONNXModel(proto)
    feeds = [X, MASK] if mask is True and mask_input else [X]
    m.compile([tensor.PlaceHolder(a.shape) for a in feeds], is_train=True)
    sgd = opt.SGD(lr=0.1, momentum=0.9)
    losses, nodes = [], []
    for _ in range(steps):
        outs = m.forward(*[tensor.from_numpy(a) for a in feeds])
        loss = autograd.softmax_cross_entropy(outs[0], Y)
        nodes = tape_order([loss])
        losses.append(loss.item())
        sgd.backward_and_update(loss)
    return losses, {k: v.numpy().copy() for k, v in m.get_params().items()}, nodes


def _fused_ops(nodes):
    return [n.op_type for n in nodes if n.grad_rule is not None]


@pytest.mark.parametrize("scale,mask", [("Div", True), ("Mul", False), ("", True),
                                        ("Mul", "where"), ("Div", "where_rev")])
def test_fused_training_equals_unfused(kernels, monkeypatch, scale, mask):
    fused = train(attention_model(scale, mask), mask=mask)
    monkeypatch.setenv("WORKBENCH_FUSE_ATTENTION", "0")
    plain = train(attention_model(scale, mask), mask=mask)
    masks = {True: ["Add"], False: [], "where": ["Where"], "where_rev": ["Where"]}
    want = ["MatMul"] + ([scale] if scale else []) + masks[mask] + ["Softmax", "MatMul"]
    assert _fused_ops(fused[2]) == want
    assert not _fused_ops(plain[2])
    assert [n.op_type for n in fused[2]] == [n.op_type for n in plain[2]]
    np.testing.assert_allclose(fused[0], plain[0], rtol=1e-5)
    assert fused[0][2] < fused[0][0]
    for k in plain[1]:
        np.testing.assert_allclose(fused[1][k], plain[1][k], rtol=1e-4, atol=1e-5)


def test_fused_step_exports_the_original_nodes_and_refuses_single_node_backward(kernels):
    m = sonnx.SONNXModel(attention_model())
    m.compile([tensor.PlaceHolder(X.shape), tensor.PlaceHolder(MASK.shape)], is_train=True)
    x, mk = tensor.from_numpy(X), tensor.from_numpy(MASK)
    m.forward(x, mk)
    check_fused_core_exports_and_refuses_single_node_backward(m, X)    # fused


def check_fused_core_exports_and_refuses_single_node_backward(m, xa):
    """A forward of ``m`` (the attention model, compiled) on ``xa`` and MASK runs its core
    fused: the tape keeps the five original nodes, ``to_onnx`` writes them and runs to the
    same output, and a single node's backward is refused."""
    x, mk = tensor.from_numpy(xa), tensor.from_numpy(MASK)
    out = m.forward(x, mk)[0]
    core = [n for n in tape_order([out]) if n.grad_rule is not None]
    assert [n.op_type for n in core] == ["MatMul", "Div", "Add", "Softmax", "MatMul"]
    exported = sonnx.to_onnx([x, mk], [out])
    ops = [n.op_type for n in exported.graph.node]
    for op in ("Div", "Add", "Softmax"):
        assert op in ops
    from workbench import backend
    got = backend.prepare(exported).run([xa, MASK])[0]
    np.testing.assert_allclose(got, out.numpy(), rtol=1e-5, atol=1e-6)
    last = core[-1]
    with pytest.raises(GradientError, match="attention core"):
        backprop.run_rule(last, [np.ones(last.out_meta[0][0], np.float32)], (True, True))


def test_cores_the_checks_refuse_run_unfused_bit_for_bit(kernels, monkeypatch):
    # the probabilities are a graph output: the analysis leaves the core alone
    _, _, nodes = train(attention_model(extra_output=True), steps=2)
    assert not _fused_ops(nodes)
    # the mask is a trainable weight (it needs a gradient): the run-time check stops at Add
    # and the rest runs unfused, from values made as the kernels make them
    fused = train(attention_model(mask_input=False), steps=3, mask_input=False)
    assert _fused_ops(fused[2]) == []
    with compiled.disabled():
        off = train(attention_model(), steps=2)
    assert not _fused_ops(off[2])
    monkeypatch.setenv("WORKBENCH_FUSE_ATTENTION", "0")
    plain = train(attention_model(mask_input=False), steps=3, mask_input=False)
    assert fused[0] == plain[0]
    for k in plain[1]:
        assert np.array_equal(fused[1][k], plain[1][k]), k
    with compiled.disabled():
        assert off[0] == train(attention_model(), steps=2)[0]


def _reference(q, k, v, m, c, op):
    s = np.matmul(q.astype(np.float64), k)
    s = s / c if op == "/" else (s * c if op == "*" else s)
    if m is not None:
        s = s + m
    p = np.exp(s - s.max(-1, keepdims=True))
    return p / p.sum(-1, keepdims=True)


def _reference_fill(q, k, cond, c, op, fill):
    s = np.matmul(q.astype(np.float64), k)
    s = s / c if op == "/" else (s * c if op == "*" else s)
    s = np.where(cond == (fill == 2), -2.0, s)
    p = np.exp(s - s.max(-1, keepdims=True))
    return p / p.sum(-1, keepdims=True)


@pytest.mark.parametrize("op,c,rank,fill", [("/", 3.0, 4, 0), ("*", 0.25, 4, 2),
                                            ("/", 8.0, 3, 0), (None, None, 4, 3)])
def test_compiled_forward_and_backward_match_numpy(kernels, op, c, rank, fill):
    rng = np.random.default_rng(5)
    b, h, sq, sk, d, dv = 2, 3, 5, 11, 3, 9
    # strided operands, as the graph's head split gives them
    q = rng.standard_normal((b, sq, h, d)).astype(np.float32).transpose(0, 2, 1, 3)
    k = rng.standard_normal((b, sk, h, d)).astype(np.float32).transpose(0, 2, 3, 1)
    v = rng.standard_normal((b, sk, h, dv)).astype(np.float32).transpose(0, 2, 1, 3)
    m = (rng.standard_normal((b, 1, 1, sk)) * 2).astype(np.float32)
    if rank == 3:   # no head axis: (batch, rows, columns), a causal-style (Sq, Sk) mask
        q, k, v = q[:, 0], k[:, 1], v[:, 2]
        m = np.triu(np.full((sq, sk), -1e4, np.float32), 1)
    core = fuse_attention.Core(None if op is None else (op, c), (0, 0, 0),
                               (fill, -2.0) if fill else None)
    if fill:   # a Where's condition (filled where true / where false), broadcast over rows
        m = rng.random((b, 1, sq, sk)) < 0.3
        m[..., 0] = fill == 3   # no row filled everywhere
    core.q, core.k, core.mask = q, k, m
    core.p = np.empty(q.shape[:-1] + (sk,), np.float32)
    o = fuse_attention._forward_c(core, v)
    p_ref = _reference(q, k, v, m, c, op) if not fill else _reference_fill(q, k, m, c, op,
                                                                           fill)
    np.testing.assert_allclose(core.p, p_ref, rtol=2e-5, atol=1e-6)
    np.testing.assert_allclose(o, np.matmul(p_ref, v), rtol=2e-5, atol=2e-6)
    g = rng.standard_normal(o.shape).astype(np.float32).swapaxes(-1, -2).copy() \
        .swapaxes(-1, -2)   # a strided output gradient
    scale = None if op is None else (op, c)
    fm = (m, fill) if fill else (None, 0)
    got = fuse_attention._grad_c(core.p, g, q, k, v, core.c, scale, *fm)
    ref = fuse_attention._grad_numpy(core.p, g, q, k, v, core.c, scale, *fm)
    for a, r in zip(got, ref):
        assert a.shape == r.shape
        np.testing.assert_allclose(a, r, rtol=2e-5, atol=2e-6)
    # the gradient's arithmetic in float64 from the same probabilities
    p64, g64 = core.p.astype(np.float64), g.astype(np.float64)
    dp = np.matmul(g64, v.swapaxes(-1, -2))
    ds = p64 * (dp - (dp * p64).sum(-1, keepdims=True))
    ds = ds / c if op == "/" else (ds * c if op == "*" else ds)
    if fill:   # Where's rule: the filled scores take no gradient
        ds = np.where(m == (fill == 2), 0.0, ds)
    np.testing.assert_allclose(got[0], np.matmul(ds, k.swapaxes(-1, -2)), rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(got[1], np.matmul(q.swapaxes(-1, -2), ds), rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(got[2], np.matmul(p64.swapaxes(-1, -2), g64), rtol=1e-4,
                               atol=1e-5)


def test_backward_without_kernels_after_a_fused_forward_uses_numpy(kernels):
    def step(off_in_backward):
        m = sonnx.SONNXModel(attention_model())
        m.compile([tensor.PlaceHolder(X.shape), tensor.PlaceHolder(MASK.shape)],
                  is_train=True)
        sgd = opt.SGD(lr=0.1)
        xs = [tensor.from_numpy(X), tensor.from_numpy(MASK)]
        for i in range(2):
            loss = autograd.softmax_cross_entropy(m.forward(*xs)[0], Y)
            if i == 1 and off_in_backward:
                assert _fused_ops(tape_order([loss]))
                with compiled.disabled():
                    sgd.backward_and_update(loss)
            else:
                sgd.backward_and_update(loss)
        return {k: v.numpy().copy() for k, v in m.get_params().items()}
    c, n = step(False), step(True)
    for k in c:
        np.testing.assert_allclose(n[k], c[k], rtol=1e-5, atol=1e-6)
