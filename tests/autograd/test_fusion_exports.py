"""The training-time fusions (workbench/autodiff/fusion.py's GELU chain, fuse_attention.py's
attention core) with the Tensor runner's shape memo and Constant reuse, on graphs as exporters
write them beyond the shapes the fusion tests build: a fused step gives the graph's own shapes
(a constant of a higher rank than the value it scales broadcasts the result to that rank: such
a chain or core runs unfused), and on small torch.onnx exports (nn.TransformerEncoderLayer
with a padding mask, BERT- and GPT-2-style blocks) fused training equals unfused training
within float rounding and PyTorch's gradients, with batch and mask values changing between
steps, graph mode gives the eager bits, and the tape of a fused step exports a graph that
onnxruntime runs to the same outputs."""

from __future__ import annotations

import copy
import io
import math
import pickle
import warnings

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

from tests.autograd import test_graph_fusion as graph_fusion  # noqa: E402
from workbench import autograd, sonnx, tensor  # noqa: E402
from workbench.autodiff.tape import tape_order  # noqa: E402

kernels = graph_fusion.kernels          # the fixture: the compiled kernel modules are loaded

UNFUSED = {"WORKBENCH_FUSE_ATTENTION": "0", "WORKBENCH_FUSE_GELU": "0",
           "WORKBENCH_SHAPE_MEMO": "0"}




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


# ----------------------------------------------------------------- torch.onnx exports
def _torch_blocks(torch):
    """Three small self-attention blocks as PyTorch writes them: ``nn.TransformerEncoderLayer``
    (GELU, a boolean key padding mask), a BERT-style block (the extended mask ``(1 - mask) *
    finfo.min`` made in the graph from int64 token masks, Q K^T then Div by sqrt(d), erf
    GELU) and a GPT-2-style block (the causal ``Where`` with finfo.min, scores scaled by Mul,
    odd head size 7 over 3 heads)."""
    nn, F = torch.nn, torch.nn.functional

    class Attention(nn.Module):
        def __init__(self, e, h, dh, bert):
            super().__init__()
            self.h, self.dh, self.bert = h, dh, bert
            self.qkv = nn.Linear(e, 3 * h * dh)
            self.o = nn.Linear(h * dh, e)
            self.f1, self.f2 = nn.Linear(e, 2 * e), nn.Linear(2 * e, e)
            self.register_buffer("causal", torch.tril(torch.ones(16, 16, dtype=torch.bool)))

        def forward(self, x, am=None):
            b, s, _ = x.shape
            q, k, v = (t.reshape(b, s, self.h, self.dh).transpose(1, 2)
                       for t in self.qkv(x).split(self.h * self.dh, -1))
            if self.bert:
                sc = q @ k.transpose(-1, -2) / math.sqrt(self.dh)
                sc = sc + (1.0 - am[:, None, None, :].to(x.dtype)) * torch.finfo(x.dtype).min
            else:
                sc = (q @ k.transpose(-1, -2)) * (1.0 / math.sqrt(self.dh))
                sc = torch.where(self.causal[:s, :s], sc,
                                 torch.tensor(torch.finfo(x.dtype).min, dtype=x.dtype))
            o = (torch.softmax(sc, -1) @ v).transpose(1, 2).reshape(b, s, self.h * self.dh)
            x = x + self.o(o)
            return x + self.f2(F.gelu(self.f1(x)))

    class Tel(nn.Module):
        def __init__(self):
            super().__init__()
            self.layer = nn.TransformerEncoderLayer(16, 2, 32, dropout=0.0, activation="gelu",
                                                    batch_first=True)

        def forward(self, x, pad):
            return self.layer(x, src_key_padding_mask=pad)

    return {"tel": Tel, "bert": lambda: Attention(16, 2, 8, True),
            "gpt2": lambda: Attention(16, 3, 7, False)}


def _feeds(case, batch, rng):
    x = rng.standard_normal((batch, 5, 16)).astype(np.float32)
    if case == "gpt2":
        return [x]
    keep = rng.random((batch, 5)) > 0.3
    keep[:, 0] = True
    return [x, ~keep] if case == "tel" else [x, keep.astype(np.int64)]


def _train_export(proto, feeds, targets, use_graph=False):
    m = sonnx.SONNXModel(proto)
    m.compile([tensor.PlaceHolder(a.shape, dtype=a.dtype) for a in feeds[0]], is_train=True,
              use_graph=use_graph)
    params = m.get_params()
    names = {id(p): k for k, p in params.items()}
    losses, grads, fused = [], [], []
    for f, t in zip(feeds, targets):
        xs = [tensor.from_numpy(a) for a in f]
        o = m.forward(*xs)[0]
        # the tape of this step as ONNX (before the update changes the weights)
        exported = (sonnx.to_onnx(xs, [o]), f, o.numpy().copy())
        loss = autograd.mse_loss(o, t)
        losses.append(loss.item())
        fused = [n.op_type for n in tape_order([loss]) if n.grad_rule is not None]
        g = {names[id(p)]: d.numpy().copy() for p, d in autograd.backward(loss)}
        grads.append(g)
        for k, d in g.items():
            params[k].data = params[k].data - np.float32(0.05) * d
    return losses, grads, fused, exported


@pytest.mark.parametrize("case", ["tel", "bert", "gpt2"])
def test_torch_exports_train_fused_as_unfused_and_as_torch(kernels, monkeypatch, case):
    torch = pytest.importorskip("torch", reason="PyTorch CPU exports the models")
    torch.manual_seed(0)
    model = _torch_blocks(torch)[case]().eval()
    with torch.no_grad():   # distinct values: the exporter merges equal initializers
        for p in model.parameters():
            p.add_(torch.randn(p.shape) * 0.05)
    rng = np.random.default_rng(3)
    feeds = [_feeds(case, b, rng) for b in (2, 3, 2)]     # batch and mask values change
    targets = [rng.standard_normal((b, 5, 16)).astype(np.float32) for b in (2, 3, 2)]
    names = ["x", "mask"][:len(feeds[0])]
    buf = io.BytesIO()
    # (the legacy exporter: it needs no onnxscript; with gradients on, torch's fused
    # encoder-layer fast path, which it cannot export, stays off)
    with warnings.catch_warnings():   # the tracer's and the legacy exporter's notices
        warnings.simplefilter("ignore")
        torch.onnx.export(model, tuple(torch.from_numpy(a) for a in feeds[0]), buf,
                          opset_version=17, input_names=names, output_names=["y"],
                          dynamic_axes={n: {0: "batch"} for n in names + ["y"]}, dynamo=False)
    proto = onnx.load_from_string(buf.getvalue())

    fused = _train_export(proto, feeds, targets)
    graph = _train_export(proto, feeds, targets, use_graph=True)
    for k, v in UNFUSED.items():
        monkeypatch.setenv(k, v)
    plain = _train_export(proto, feeds, targets)
    core = {"tel": ["MatMul", "Add"], "bert": ["MatMul", "Div", "Add"],
            "gpt2": ["MatMul", "Mul", "Where"]}[case] + ["Softmax", "MatMul"]
    assert fused[2] == core + ["Div", "Erf", "Add", "Mul", "Mul"]
    assert graph[2] == fused[2] and not plain[2]
    assert graph[0] == fused[0]                      # graph mode: the eager bits
    np.testing.assert_allclose(fused[0], plain[0], rtol=1e-5)
    for gf, gp in zip(fused[1], plain[1]):
        assert gf.keys() == gp.keys()
        scale = max(np.abs(g).max() for g in gp.values())
        for k, g in gp.items():
            np.testing.assert_allclose(gf[k], g, rtol=1e-4, atol=1e-5 * scale, err_msg=k)

    # the first step's gradients against PyTorch's, initializers matched by value
    xs = [torch.from_numpy(a) for a in feeds[0]]
    loss = ((model(*xs) - torch.from_numpy(targets[0])) ** 2).mean()
    loss.backward()
    np.testing.assert_allclose(fused[0][0], loss.item(), rtol=1e-5)
    tp = {k: (p.detach().numpy(), p.grad.numpy()) for k, p in model.named_parameters()}
    inits = {i.name: numpy_helper.to_array(i) for i in proto.graph.initializer}
    scale = max(np.abs(g).max() for _, g in tp.values())
    for name, g in fused[1][0].items():
        w = [tg if np.array_equal(tw, inits[name]) else tg.T for tw, tg in tp.values()
             if np.array_equal(tw, inits[name]) or np.array_equal(tw.T, inits[name])]
        assert len(w) == 1, name
        np.testing.assert_allclose(g, w[0], rtol=1e-3, atol=1e-5 * scale, err_msg=name)

    # the tape of a fused step exports the original graph: onnxruntime gives our forward
    ort = pytest.importorskip("onnxruntime")
    exported, f, out = fused[3]
    assert "Softmax" in [n.op_type for n in exported.graph.node]
    sess = ort.InferenceSession(exported.SerializeToString(),
                                providers=["CPUExecutionProvider"])
    got = sess.run(None, {i.name: a for i, a in zip(sess.get_inputs(), f)})[0]
    np.testing.assert_allclose(got, out, rtol=1e-5, atol=1e-6)


def _bn_model():
    """X (2, 3, 6, 6) -> Conv 3x3 -> BatchNormalization -> Relu -> Flatten -> MatMul (3)."""
    rng = np.random.default_rng(5)
    inits = [numpy_helper.from_array(a.astype(np.float32), n) for n, a in (
        ("W", rng.standard_normal((4, 3, 3, 3)) * 0.3), ("s", 1 + rng.random(4)),
        ("b", rng.standard_normal(4) * 0.1), ("mean", rng.standard_normal(4) * 0.1),
        ("var", 1 + rng.random(4)), ("W2", rng.standard_normal((64, 3)) * 0.2))]
    nodes = [helper.make_node("Conv", ["X", "W"], ["c"]),
             helper.make_node("BatchNormalization", ["c", "s", "b", "mean", "var"], ["n"]),
             helper.make_node("Relu", ["n"], ["r"]), helper.make_node("Flatten", ["r"], ["f"]),
             helper.make_node("MatMul", ["f", "W2"], ["out"])]
    return _model(nodes, (2, 3, 6, 6), [2, 3], inits)


@pytest.mark.parametrize("build,shape", [(_bn_model, (2, 3, 6, 6)),
                                         (lambda: attention_model(()), (3, 5, 8))])
def test_a_deep_copy_of_a_graph_mode_model_trains_as_the_original(request, build, shape):
    # a deep copy kept the graph-mode replays, whose Tensor runner knows its steps by id():
    # the copy's steps (new objects) were all re-prepared as plain steps, which lost the
    # recorded calls (BatchNormalization's running-statistics updates: other losses from the
    # copy's second replay on) and the fusions, and could take another object's call
    if build is not _bn_model:
        request.getfixturevalue("kernels")
    rng = np.random.default_rng(4)
    xs = [rng.standard_normal(shape).astype(np.float32) for _ in range(6)]

    def step(m, x):
        o = m.forward(tensor.from_numpy(x))[0]
        loss = autograd.mse_loss(o, np.ones(o.shape, np.float32))
        fused = [n.op_type for n in tape_order([loss]) if n.grad_rule is not None]
        for p, g in autograd.backward(loss):
            p.data = p.data - np.float32(0.1) * g.numpy()
        return loss.item(), fused

    def model():
        m = sonnx.SONNXModel(build())
        m.compile([tensor.PlaceHolder(shape)], is_train=True, use_graph=True)
        return m

    ref = model()
    want = [step(ref, x) for x in xs]
    m = model()
    got = [step(m, x) for x in xs[:3]]
    c = copy.deepcopy(m)
    del m
    got += [step(c, x) for x in xs[3:]]
    # a pickle of a model with replays failed (a replay's calls hold local functions)
    x = tensor.from_numpy(xs[0])
    ref.eval()
    back = pickle.loads(pickle.dumps(ref))
    assert np.array_equal(back.forward(x)[0].numpy(), ref.forward(x)[0].numpy())
    if build is _bn_model:   # nothing fused: the same bits
        assert got == want
        for k, t in ref.get_states().items():
            assert np.array_equal(c.get_states()[k].numpy(), t.numpy()), k
    else:   # the copy's first step runs eager and unfused (as a new model's), then fused
        np.testing.assert_allclose([g[0] for g in got], [w[0] for w in want], rtol=1e-6)
        assert got[3][1] == [] and got[4][1] == got[5][1] == want[5][1] != []
