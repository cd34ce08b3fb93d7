"""torch.onnx's dynamo exporter (the default since torch 2.9) writes every scalar constant as a
0-d initializer (the attention scale, GELU's sqrt(2), 1 and 0.5, mask fills) and GELU as
``x * ((1 + erf(x / sqrt2)) * 0.5)``. ``SONNXModel`` keeps 0-d float initializers out of the
parameters (overridable: ``params=``, ``constants=``, ``scalar_params=``), so such a model
trains as PyTorch trains it, and the training fusions read those initializers as constants
(checked in every run: a changed value or a constant made a parameter runs unfused).

The models are ``tests/data/dynamo_{bert,gpt2}_block.onnx``, written by
``scripts/make_dynamo_test_exports.py`` (the blocks of ``test_fusion_exports.py``): the
tests need no onnxscript."""

from __future__ import annotations

import os

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
from onnx import numpy_helper  # noqa: E402

from tests.autograd import test_fusion_exports as fx  # noqa: E402
from workbench import sonnx  # noqa: E402
from workbench.errors import InputError  # noqa: E402

UNFUSED, _feeds, _torch_blocks, _train_export = \
    fx.UNFUSED, fx._feeds, fx._torch_blocks, fx._train_export
kernels = fx.kernels          # the fixture: the compiled kernel modules are loaded

DATA = os.path.join(os.path.dirname(__file__), "..", "data")
CORE = {"bert": ["MatMul", "Div", "Add", "Softmax", "MatMul"],
        "gpt2": ["MatMul", "Mul", "Where", "Softmax", "MatMul"]}
GELU = ["Div", "Erf", "Add", "Mul", "Mul"]


def _proto(case):
    return onnx.load(os.path.join(DATA, f"dynamo_{case}_block.onnx"))


def _scalars(proto):
    return sorted(i.name for i in proto.graph.initializer
                  if not i.dims and numpy_helper.to_array(i).dtype.kind == "f")


def test_scalar_initializers_are_constants_with_explicit_overrides(monkeypatch, tmp_path):
    proto = _proto("bert")
    scalars = _scalars(proto)
    assert len(scalars) == 5            # scale, 1, finfo.min, sqrt(2), 0.5
    weights = {i.name for i in proto.graph.initializer
               if i.dims and numpy_helper.to_array(i).dtype.kind == "f"}
    m = sonnx.SONNXModel(proto)
    assert set(m.get_params()) == weights
    assert all(p.requires_grad for p in m.get_params().values())

    m = sonnx.SONNXModel(proto, params=[scalars[0]], constants=["qkv.bias"])
    assert set(m.get_params()) == weights - {"qkv.bias"} | {scalars[0]}
    assert set(sonnx.SONNXModel(proto, scalar_params=True).get_params()) \
        == weights | set(scalars)
    # a cut keeps the choice for the initializers it keeps
    cut = m.cut("linear_1")
    assert set(cut.get_params()) == {"val_2", "val_36", "o.bias", scalars[0]}

    class Singa(sonnx.SONNXModel):
        scalar_params = True
    assert set(Singa(proto).get_params()) == weights | set(scalars)
    monkeypatch.setenv("WORKBENCH_SCALAR_PARAMS", "1")
    assert set(sonnx.SONNXModel(proto).get_params()) == weights | set(scalars)
    assert set(sonnx.SONNXModel(proto, scalar_params=False).get_params()) == weights
    monkeypatch.setenv("WORKBENCH_SCALAR_PARAMS", "maybe")
    with pytest.raises(InputError, match="WORKBENCH_SCALAR_PARAMS"):
        sonnx.SONNXModel(proto)
    monkeypatch.delenv("WORKBENCH_SCALAR_PARAMS")

    with pytest.raises(InputError, match=r"\['nope'\] are no initializers"):
        sonnx.SONNXModel(proto, params=["nope"])
    with pytest.raises(InputError, match="no float initializers"):
        sonnx.SONNXModel(proto, params="val_49")          # int64 shape
    with pytest.raises(InputError, match="running statistics"):
        sonnx.SONNXModel(_bn_proto(), params=["mean"])
    with pytest.raises(InputError, match="both as params and as constants"):
        sonnx.SONNXModel(proto, params=["o.bias"], constants=["o.bias"])

    # states saved with the scalars as parameters load only into a model that trains them
    path = tmp_path / "states.npz"
    sonnx.SONNXModel(proto, scalar_params=True).save_states(path)
    with pytest.raises(InputError, match=r"keeps as constants .*scalar_params=True"):
        sonnx.SONNXModel(proto).load_states(path)
    sonnx.SONNXModel(proto, params=scalars).load_states(path)


def _bn_proto():
    from onnx import TensorProto, helper
    inits = [numpy_helper.from_array(np.full(3, v, np.float32), n)
             for n, v in (("scale", 1.0), ("bias", 0.0), ("mean", 0.0), ("var", 1.0))]
    g = helper.make_graph(
        [helper.make_node("BatchNormalization", ["X", "scale", "bias", "mean", "var"], ["Y"])],
        "bn", [helper.make_tensor_value_info("X", TensorProto.FLOAT, [2, 3])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [2, 3])], inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 15)])


def _torch_training(torch, case, feeds, targets):
    """(losses, the first step's {name: (weight, grad)}) of PyTorch's SGD on the block."""
    torch.manual_seed(0)
    model = _torch_blocks(torch)[case]().eval()
    with torch.no_grad():   # as scripts/make_dynamo_test_exports.py
        for p in model.parameters():
            p.add_(torch.randn(p.shape) * 0.05)
    losses, first = [], None
    for f, t in zip(feeds, targets):
        model.zero_grad()
        loss = ((model(*[torch.from_numpy(a) for a in f]) - torch.from_numpy(t)) ** 2).mean()
        loss.backward()
        losses.append(loss.item())
        if first is None:
            first = {k: (p.detach().numpy().copy(), p.grad.numpy().copy())
                     for k, p in model.named_parameters()}
        with torch.no_grad():
            for p in model.parameters():
                p.sub_(0.05 * p.grad)
    return losses, first


@pytest.mark.usefixtures("kernels")
@pytest.mark.parametrize("case", ["bert", "gpt2"])
def test_dynamo_exports_train_fused_as_torch(monkeypatch, case):
    torch = pytest.importorskip("torch", reason="PyTorch CPU is the oracle")
    proto = _proto(case)
    rng = np.random.default_rng(3)
    feeds = [_feeds(case, b, rng) for b in (2, 3, 2)]     # batch and mask values change
    targets = [rng.standard_normal((b, 5, 16)).astype(np.float32) for b in (2, 3, 2)]

    fused = _train_export(proto, feeds, targets)
    graph = _train_export(proto, feeds, targets, use_graph=True)
    # the initializer constants are fused as Constant nodes are, in both GELU orders
    assert fused[2] == CORE[case] + GELU
    assert graph[2] == fused[2] and graph[0] == fused[0]      # graph mode: the eager bits

    # SGD with lr 0.05 as _train_export: the losses of three steps are PyTorch's
    t_losses, t_first = _torch_training(torch, case, feeds, targets)
    np.testing.assert_allclose(fused[0], t_losses, rtol=2e-6)
    inits = {i.name: numpy_helper.to_array(i) for i in proto.graph.initializer}
    scale = max(np.abs(g).max() for _, g in t_first.values())
    assert len(fused[1][0]) == len(t_first)
    for name, g in fused[1][0].items():   # initializers matched by value (weights transposed)
        w = [tg if np.array_equal(tw, inits[name]) else tg.T for tw, tg in t_first.values()
             if np.array_equal(tw, inits[name]) or np.array_equal(tw.T, inits[name])]
        assert len(w) == 1, name
        np.testing.assert_allclose(g, w[0], rtol=1e-3, atol=1e-5 * scale, err_msg=name)

    for k, v in UNFUSED.items():
        monkeypatch.setenv(k, v)
    plain = _train_export(proto, feeds, targets)
    assert not plain[2]
    np.testing.assert_allclose(fused[0], plain[0], rtol=1e-6)

    # the tape of a fused step exports the graph (constants included): onnxruntime gives
    # our forward
    ort = pytest.importorskip("onnxruntime")
    exported, f, out = fused[3]
    sess = ort.InferenceSession(exported.SerializeToString(),
                                providers=["CPUExecutionProvider"])
    got = sess.run(None, {i.name: a for i, a in zip(sess.get_inputs(), f)})[0]
    np.testing.assert_allclose(got, out, rtol=1e-5, atol=1e-6)


@pytest.mark.usefixtures("kernels")
def test_constants_trained_as_parameters_run_unfused(monkeypatch):
    # WORKBENCH_SCALAR_PARAMS=1 (the earlier rule): the scale and GELU's constants need
    # gradients, which the fused kernels do not make: every chain runs unfused, with the
    # bits of the fusions turned off
    # (the GPT-2 block: in the BERT block, the extended mask's 1.0, which GELU's Add
    # shares, trained as a parameter makes the second step's loss NaN)
    proto = _proto("gpt2")
    rng = np.random.default_rng(5)
    feeds = [_feeds("gpt2", b, rng) for b in (2, 2)]
    targets = [rng.standard_normal((2, 5, 16)).astype(np.float32) for _ in range(2)]
    monkeypatch.setenv("WORKBENCH_SCALAR_PARAMS", "1")
    trained = _train_export(proto, feeds, targets)
    assert trained[2] == []
    assert set(_scalars(proto)) <= set(trained[1][0])
    for k, v in UNFUSED.items():
        monkeypatch.setenv(k, v)
    plain = _train_export(proto, feeds, targets)
    assert trained[0] == plain[0]
    for k, g in plain[1][-1].items():
        np.testing.assert_array_equal(trained[1][-1][k], g, err_msg=k)


@pytest.mark.usefixtures("kernels")
def test_a_changed_constant_initializer_runs_unfused():
    # the fused kernels bake the constants' values in: each run checks them, and a value
    # changed between steps (here the attention scale) runs that core unfused, like a model
    # whose file holds the new value
    from workbench import autograd, tensor
    from workbench.autodiff.tape import tape_order
    proto = _proto("bert")
    scale = next(i for i in proto.graph.initializer
                 if not i.dims and abs(numpy_helper.to_array(i) - 8 ** 0.5) < 1e-6)
    rng = np.random.default_rng(7)
    f = _feeds("bert", 2, rng)
    xs = [tensor.from_numpy(a) for a in f]

    def step(m):
        m.compile([tensor.PlaceHolder(a.shape, dtype=a.dtype) for a in f], is_train=True)
        for _ in range(2):   # the fusions start at a runner's second run
            loss = autograd.mse_loss(m.forward(*xs)[0], tensor.from_numpy(np.zeros(
                (2, 5, 16), np.float32)))
        return loss, [n.op_type for n in tape_order([loss]) if n.grad_rule is not None]

    m = sonnx.SONNXModel(proto)
    assert step(m)[1] == CORE["bert"] + GELU
    m._weights[scale.name].data = np.array(2.0, np.float32)
    changed, ops = step(m)
    assert ops == GELU
    scale.CopyFrom(numpy_helper.from_array(np.array(2.0, np.float32), scale.name))
    want, _ = step(sonnx.SONNXModel(proto))
    np.testing.assert_allclose(changed.item(), want.item(), rtol=1e-6)


def _gelu_half_first(cshape, as_initializers):
    """X (4, 6) @ W -> the erf GELU chain in the dynamo exporter's order, ``0.5 * (1 + erf(x /
    sqrt2))`` then ``x *`` that, the constants (of shape ``cshape``) as initializers (with
    ``constants=`` for the non-0-d ones) or Constant nodes."""
    from onnx import helper
    vals = {"s2": np.sqrt(2.0), "one": 1.0, "half": 0.5}
    consts = {k: np.full(cshape, v, np.float32) for k, v in vals.items()}
    nodes = [] if as_initializers else [
        helper.make_node("Constant", [], [k], value=numpy_helper.from_array(a, k))
        for k, a in consts.items()]
    nodes += [helper.make_node("MatMul", ["X", "W"], ["x"]),
              helper.make_node("Div", ["x", "s2"], ["d"]), helper.make_node("Erf", ["d"], ["e"]),
              helper.make_node("Add", ["e", "one"], ["a"]),
              helper.make_node("Mul", ["half", "a"], ["m"]),
              helper.make_node("Mul", ["x", "m"], ["out"])]
    w = np.random.default_rng(0).standard_normal((6, 6)).astype(np.float32) * 0.3
    inits = [numpy_helper.from_array(w, "W")]
    if as_initializers:
        inits += [numpy_helper.from_array(a, k) for k, a in consts.items()]
    out = [1] * max(0, len(cshape) - 2) + [4, 6]
    return fx._model(nodes, (4, 6), out, inits)


@pytest.mark.usefixtures("kernels")
@pytest.mark.parametrize("cshape,fuses", [((), True), ((1, 1), True), ((1, 1, 1), False)])
@pytest.mark.parametrize("as_initializers", [True, False])
def test_gelu_with_the_half_first_trains_fused_as_unfused(monkeypatch, cshape, fuses,
                                                          as_initializers):
    # (1, 1, 1) constants broadcast the (4, 6) activations to rank 3: unfused, as in
    # test_fusion_exports; the fused gradient goes to x at the last Mul. Initializers that
    # are not 0-d are parameters by default: constants= keeps them constant
    proto = _gelu_half_first(cshape, as_initializers)
    original = sonnx.SONNXModel
    monkeypatch.setattr(sonnx, "SONNXModel", lambda p: original(
        p, constants=["s2", "one", "half"] if as_initializers else None))
    fused = fx.train(proto, (4, 6))
    plain = fx.train(proto, (4, 6), env=UNFUSED, monkeypatch=monkeypatch)
    assert set(fused[2]) == {"W"}
    assert fused[3] == (GELU if fuses else [])
    assert {o.shape for o in fused[0]} == {(1,) * max(0, len(cshape) - 2) + (4, 6)}
    fx._same_training(fused, plain)
