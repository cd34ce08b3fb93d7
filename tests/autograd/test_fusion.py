"""The training step's fused erf GELU chain (workbench/autodiff/fusion.py): the same training as
the unfused chain within float rounding, the tape still holds (and exports) the five original
nodes, chains the analysis must not fuse stay unfused, a single-node backward of a fused node
is refused clearly, and the compiled GELU gradient matches its numpy reference (edge values,
thread split)."""

from __future__ import annotations

import math

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

from workbench import autograd, compiled, opt, sonnx, tensor  # noqa: E402
from workbench.autodiff import backprop, fusion  # noqa: E402
from workbench.autodiff.tape import tape_order  # noqa: E402
from workbench.compiled import image  # noqa: E402
from workbench.errors import GradientError  # noqa: E402

needs_kernels = pytest.mark.skipif(image.supported() is not None,
                                   reason=f"compiled kernels: {image.supported()}")


@pytest.fixture(scope="module")
def kernels():
    if image.supported() is not None or not compiled.wait(["transformer"], timeout=900) or \
            compiled.kernel("transformer.gelu_grad") is None:
        pytest.skip(f"kernel module transformer is not available: {compiled.status()}")


def _const(name, value):
    return helper.make_node("Constant", [], [name], name=name,
                            value=numpy_helper.from_array(np.array(value, np.float32), name))


def gelu_mlp(extra_output=False, seed=0):
    """X(4,16) @ W1 + b1 -> the exported erf GELU chain -> @ W2 (3 classes)."""
    rng = np.random.default_rng(seed)
    inits = [numpy_helper.from_array((rng.standard_normal((16, 32)) * 0.5).astype(np.float32),
                                     "W1"),
             numpy_helper.from_array(rng.standard_normal(32).astype(np.float32), "b1"),
             numpy_helper.from_array((rng.standard_normal((32, 3)) * 0.3).astype(np.float32),
                                     "W2")]
    nodes = [helper.make_node("MatMul", ["X", "W1"], ["mm"], name="mm"),
             helper.make_node("Add", ["b1", "mm"], ["h"], name="bias"),
             _const("c_sqrt2", math.sqrt(2.0)),
             helper.make_node("Div", ["h", "c_sqrt2"], ["d"], name="act/Div"),
             helper.make_node("Erf", ["d"], ["e"], name="act/Erf"),
             _const("c_one", 1.0),
             helper.make_node("Add", ["e", "c_one"], ["a"], name="act/Add"),
             helper.make_node("Mul", ["h", "a"], ["m"], name="act/Mul"),
             _const("c_half", 0.5),
             helper.make_node("Mul", ["m", "c_half"], ["g"], name="act/Mul_1"),
             helper.make_node("MatMul", ["g", "W2"], ["logits"], name="head")]
    outs = [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [4, 3])]
    if extra_output:   # the Erf value is also read outside the chain: must not fuse
        outs.append(helper.make_tensor_value_info("e", TensorProto.FLOAT, [4, 32]))
    g = helper.make_graph(nodes, "gelu_mlp",
                          [helper.make_tensor_value_info("X", TensorProto.FLOAT, [4, 16])],
                          outs, inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


X = np.random.default_rng(1).standard_normal((4, 16)).astype(np.float32)
Y = np.array([0, 1, 2, 1])


def train(proto, steps=3):
    """(losses, weights, the last step's tape nodes) of ``steps`` SGD steps."""
    m = sonnx.SONNXModel(proto)
    m.compile([tensor.PlaceHolder(X.shape)], is_train=True)
    sgd = opt.SGD(lr=0.1, momentum=0.9)
    losses, nodes = [], []
    for _ in range(steps):
        outs = m.forward(tensor.from_numpy(X))
        loss = autograd.softmax_cross_entropy(outs[0], Y)
        nodes = tape_order([loss])
        losses.append(loss.item())
        sgd.backward_and_update(loss)
    return losses, {k: v.numpy().copy() for k, v in m.get_params().items()}, nodes


def test_fused_training_equals_unfused(kernels, monkeypatch):
    fused = train(gelu_mlp())
    monkeypatch.setenv("WORKBENCH_FUSE_GELU", "0")
    plain = train(gelu_mlp())
    # the first run finds the chain, later runs are fused; the tape keeps the five nodes
    ops = [(n.op_type, n.grad_rule is not None) for n in fused[2]]
    assert [o for o, f in ops if f] == ["Div", "Erf", "Add", "Mul", "Mul"]
    assert not any(n.grad_rule is not None for n in plain[2])
    assert [n.op_type for n in fused[2]] == [n.op_type for n in plain[2]]
    np.testing.assert_allclose(fused[0], plain[0], rtol=1e-5)
    assert fused[0][2] < fused[0][0]
    for k in plain[1]:
        np.testing.assert_allclose(fused[1][k], plain[1][k], rtol=1e-4, atol=1e-5)


def test_fused_step_exports_the_original_nodes_and_refuses_single_node_backward(kernels):
    m = sonnx.SONNXModel(gelu_mlp())
    m.compile([tensor.PlaceHolder(X.shape)], is_train=True)
    x = tensor.from_numpy(X)
    m.forward(x)
    out = m.forward(x)[0]    # fused
    chain = [n for n in tape_order([out]) if n.grad_rule is not None]
    assert len(chain) == 5
    exported = sonnx.to_onnx([x], [out])
    ops = [n.op_type for n in exported.graph.node]
    for op in ("Div", "Erf", "Add"):
        assert op in ops
    assert ops.count("Mul") == 2
    # the exported graph computes what the fused step computed
    from workbench import backend
    got = backend.prepare(exported).run([X])[0]
    np.testing.assert_allclose(got, out.numpy(), rtol=1e-5, atol=1e-6)
    last = chain[-1]
    with pytest.raises(GradientError, match="fused with its GELU chain"):
        backprop.run_rule(last, [np.ones(last.out_meta[0][0], np.float32)], (True, False))


def test_chains_with_another_reader_or_without_kernels_stay_unfused(kernels, monkeypatch):
    _, _, nodes = train(gelu_mlp(extra_output=True), steps=2)
    assert not any(n.grad_rule is not None for n in nodes)
    with compiled.disabled():
        losses, _, nodes = train(gelu_mlp(), steps=2)
    assert not any(n.grad_rule is not None for n in nodes)
    monkeypatch.setenv("WORKBENCH_FUSE_GELU", "0")
    assert losses == pytest.approx(train(gelu_mlp(), steps=2)[0], rel=1e-6)


@needs_kernels
def test_gelu_grad_kernel_matches_numpy_and_thread_split(kernels, monkeypatch):
    rng = np.random.default_rng(3)
    x = (rng.standard_normal(40_000) * 3).astype(np.float32)
    x[:12] = [0.0, -0.0, 1e-30, -1e-30, 10.0, -10.0, 50.0, -50.0, 4.0, -4.0, 1e-45, 3.92]
    g = rng.standard_normal(x.shape).astype(np.float32)
    monkeypatch.setenv("WORKBENCH_NUM_THREADS", "1")
    one = fusion.gelu_grad(x, g)
    ref = fusion._gelu_grad_numpy(x.astype(np.float32), g)
    np.testing.assert_allclose(one, ref, rtol=2e-5, atol=2e-6)
    monkeypatch.setenv("WORKBENCH_NUM_THREADS", "2")
    assert np.array_equal(fusion.gelu_grad(x, g), one)   # elementwise: same bits
    # strided inputs are copied; NaN and +-Inf give NaN, as the chain's own rules
    edge = np.array([np.nan, np.inf, -np.inf, 1.0], np.float32)
    d = fusion.gelu_grad(edge[::1], np.ones(4, np.float32))
    assert np.isnan(d[:3]).all() and np.isnan(fusion._gelu_grad_numpy(edge, np.ones(4,
                                                                         np.float32))[:3]).all()
    np.testing.assert_allclose(d[3], 0.5 * (1 + math.erf(1 / math.sqrt(2)))
                               + math.exp(-0.5) / math.sqrt(2 * math.pi), rtol=1e-6)
    two_d = x.reshape(200, 200)[:, ::2]
    np.testing.assert_allclose(fusion.gelu_grad(two_d, np.ones_like(two_d)),
                               fusion._gelu_grad_numpy(two_d, np.ones_like(two_d)),
                               rtol=2e-5, atol=2e-6)
