"""A training step's losses and weights do not depend on the engine's thread count.

MatMul/Gemm products of a training step (forward inside ``SONNXModel.forward`` /
``model(...)``, and the gradient rules) run through ``ops.parallel.exact_matmul``: a 2-D product
is one single-threaded BLAS call (splitting it over threads changes its rounding), a stacked
product is split over its batch axis only. The shapes here are large enough that the engine's
general ``parallel_matmul`` would split them over two threads.
"""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from workbench import autograd, compiled, opt, sonnx, tensor
from workbench.ops import parallel


def _onnx(nodes, name, inits, x_shape, y_shape):
    g = helper.make_graph(nodes, name, [helper.make_tensor_value_info(
        "x", TensorProto.FLOAT, x_shape)], [helper.make_tensor_value_info(
            "y", TensorProto.FLOAT, y_shape)],
        [numpy_helper.from_array(v, k) for k, v in inits.items()])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])
    m.ir_version = 8
    return m


def _model():
    rng = np.random.default_rng(3)
    inits = {"w1": rng.standard_normal((64, 256)).astype(np.float32) * 0.1,
             "w2": rng.standard_normal((256, 64)).astype(np.float32) * 0.02,
             "w3": rng.standard_normal((4, 64)).astype(np.float32) * 1e-3,
             "b3": np.zeros(4, np.float32),
             "shape3": np.array([8, 32, 64], np.int64),
             "shape2": np.array([256, 64], np.int64)}
    nodes = [
        helper.make_node("MatMul", ["x", "w1"], ["h"]),          # 256x64 @ 64x256
        helper.make_node("Relu", ["h"], ["r"]),
        helper.make_node("MatMul", ["r", "w2"], ["z"]),          # 256x256 @ 256x64
        helper.make_node("Reshape", ["z", "shape3"], ["z3"]),
        helper.make_node("Transpose", ["z3"], ["z3t"], perm=[0, 2, 1]),
        helper.make_node("MatMul", ["z3t", "z3"], ["s"]),        # 8 x (64x32 @ 32x64)
        helper.make_node("MatMul", ["z3", "s"], ["u"]),          # 8 x (32x64 @ 64x64)
        helper.make_node("Reshape", ["u", "shape2"], ["u2"]),
        helper.make_node("Gemm", ["u2", "w3", "b3"], ["y"], transB=1),
    ]
    return _onnx(nodes, "mm", inits, [256, 64], [256, 4])


def _train(monkeypatch, threads, model=None, x_shape=(256, 64), seed=4, lr=0.01, steps=3):
    """Losses and parameters after ``steps`` SGD steps of ``model`` (default: the products'
    model) at ``threads`` engine threads."""
    monkeypatch.setenv("WORKBENCH_NUM_THREADS", str(threads))
    rng = np.random.default_rng(seed)
    x = tensor.from_numpy(rng.standard_normal(x_shape).astype(np.float32))
    labels = rng.integers(0, 4, size=x_shape[0]).astype(np.int64)
    m = sonnx.SONNXModel(model if model is not None else _model())
    m.compile([x], is_train=True, use_graph=False)
    sgd = opt.SGD(lr=lr, momentum=0.9)
    losses = []
    for _ in range(steps):
        loss = autograd.softmax_cross_entropy(m.forward(x)[-1], labels)
        sgd.backward_and_update(loss)
        losses.append(loss.numpy().copy())
    return losses, {k: v.numpy().copy() for k, v in m.get_params().items()}


def test_losses_and_weights_do_not_depend_on_the_thread_count(monkeypatch):
    threadpoolctl = pytest.importorskip("threadpoolctl")
    monkeypatch.setattr(parallel, "_PARALLEL_GEMM_MIN", 1 << 16)  # every stack splits too
    one = _train(monkeypatch, 1)
    runs = []
    for worker in ("0", "1"):    # the weight gradients inline, and on the BLAS worker
        monkeypatch.setenv("WORKBENCH_BLAS_WORKER", worker)
        with threadpoolctl.threadpool_limits(2, user_api="blas"):  # BLAS' own threads kept out
            runs.append(_train(monkeypatch, 2))
    for two in runs:
        for a, b in zip(one[0], two[0]):
            assert np.array_equal(a, b)
        assert one[1].keys() == two[1].keys()
        for k in one[1]:
            assert np.array_equal(one[1][k], two[1][k]), k


@pytest.mark.parametrize("sa,sb", [((256, 64), (64, 256)), ((8, 32, 64), (64, 48)),
                                   ((6, 3, 20, 16), (6, 3, 16, 24)), ((2, 20, 16), (16, 8)),
                                   ((5, 16), (3, 16, 7))])
def test_exact_matmul_gives_one_threads_bits(monkeypatch, sa, sb):
    rng = np.random.default_rng(0)
    a = rng.standard_normal(sa).astype(np.float32)
    b = rng.standard_normal(sb).astype(np.float32)
    monkeypatch.setenv("WORKBENCH_NUM_THREADS", "1")
    with parallel.one_blas_thread():
        want = np.matmul(a, b)
    monkeypatch.setenv("WORKBENCH_NUM_THREADS", "2")
    monkeypatch.setattr(parallel, "_PARALLEL_GEMM_MIN", 1)   # split whatever may be split
    got = parallel.exact_matmul(np, a, b)
    assert got.shape == want.shape and np.array_equal(got, want)
    out = np.empty_like(want)
    assert parallel.exact_matmul(np, a, b, out=out) is out and np.array_equal(out, want)
    assert parallel.exact_products_active() is False
    with parallel.exact_products(), parallel.exact_products():
        assert parallel.exact_products_active()
    assert not parallel.exact_products_active()


def _shared_weight_grads(monkeypatch, threads):
    """Gradients of a weight used by two MatMuls (its two gradients are added by the backward
    engine: a queued product must be complete by then) and of a Gemm's weight."""
    monkeypatch.setenv("WORKBENCH_NUM_THREADS", str(threads))
    rng = np.random.default_rng(5)
    w = tensor.from_numpy(rng.standard_normal((48, 48)).astype(np.float32) * 0.2)
    v = tensor.from_numpy(rng.standard_normal((5, 48)).astype(np.float32) * 0.2)
    for t in (w, v):
        t.requires_grad = t.stores_grad = True
    x = tensor.from_numpy(rng.standard_normal((4, 40, 48)).astype(np.float32))
    h = autograd.matmul(autograd.relu(autograd.matmul(x, w)), w)
    y = autograd.gemm(autograd.reshape(h, (160, 48)), v, None, 1.0, 0.0, 0, 1)
    loss = autograd.reduce_mean(autograd.mul(y, y))
    got = {id(p): g.numpy().copy() for p, g in autograd.backward(loss)}
    return got[id(w)], got[id(v)]


def test_a_weight_used_twice_gets_its_queued_gradients_added_complete(monkeypatch):
    monkeypatch.setattr(parallel, "_DEFER_MIN", 1)     # every weight gradient queued
    one = _shared_weight_grads(monkeypatch, 1)
    monkeypatch.setenv("WORKBENCH_BLAS_WORKER", "1")
    stats = compiled.kernel("blas_worker.stats") if parallel._worker_calls() else None
    counts = np.zeros(4, np.int64)
    if stats is not None:
        stats(counts)
    two = _shared_weight_grads(monkeypatch, 2)
    assert all(np.array_equal(a, b) for a, b in zip(one, two))
    if stats is not None:       # the worker is built: the three products went through it
        after = np.zeros(4, np.int64)
        stats(after)
        assert after[2] - counts[2] == 3


# ---------------------------------------------------------------- convolutions (row 23z6)
def _conv_model():
    """3x3 conv (im2col, the batch merged into one product), a strided 1x1 conv, a depthwise
    conv, a ConvTranspose, global pooling and a Gemm head: 96-192 output channels, so that
    the products of the forward and of both gradients have rows to split."""
    rng = np.random.default_rng(6)
    inits = {"w1": rng.standard_normal((96, 8, 3, 3)).astype(np.float32) * 0.1,
             "b1": rng.standard_normal(96).astype(np.float32) * 0.1,
             "w2": rng.standard_normal((192, 96, 1, 1)).astype(np.float32) * 0.1,
             "w3": rng.standard_normal((192, 1, 3, 3)).astype(np.float32) * 0.2,
             "w4": rng.standard_normal((192, 96, 2, 2)).astype(np.float32) * 0.05,
             "w5": rng.standard_normal((4, 96)).astype(np.float32) * 0.1,
             "b5": np.zeros(4, np.float32)}
    nodes = [
        helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c1"], ["r1"]),
        helper.make_node("Conv", ["r1", "w2"], ["c2"], strides=[2, 2]),
        helper.make_node("Relu", ["c2"], ["r2"]),
        helper.make_node("Conv", ["r2", "w3"], ["c3"], group=192, pads=[1, 1, 1, 1]),
        helper.make_node("ConvTranspose", ["c3", "w4"], ["c4"], strides=[2, 2]),
        helper.make_node("GlobalAveragePool", ["c4"], ["p"]),
        helper.make_node("Flatten", ["p"], ["f"]),
        helper.make_node("Gemm", ["f", "w5", "b5"], ["y"], transB=1),
    ]
    return _onnx(nodes, "conv", inits, [4, 8, 10, 10], [4, 4])


def _train_conv(monkeypatch, threads):
    return _train(monkeypatch, threads, _conv_model(), (4, 8, 10, 10), seed=7, lr=0.05)


@pytest.mark.parametrize("kernels", ["numpy", "compiled"])
def test_conv_training_does_not_depend_on_the_thread_count(monkeypatch, kernels):
    """numpy: the im2col products (whatever the compiled kernels would take at these small
    sizes runs on numpy's path); compiled: the kernels as they are (when built)."""
    import contextlib
    threadpoolctl = pytest.importorskip("threadpoolctl")
    monkeypatch.setattr(parallel, "_PARALLEL_GEMM_MIN", 1 << 14)   # these small products split
    mode = compiled.disabled if kernels == "numpy" else contextlib.nullcontext
    with mode():
        one = _train_conv(monkeypatch, 1)
    assert np.isfinite(one[0]).all() and one[0][-1] < one[0][0]    # it trains
    for threads in (2, 3):
        with threadpoolctl.threadpool_limits(2, user_api="blas"), mode():   # BLAS' own
            other = _train_conv(monkeypatch, threads)                     # threads kept out
        for a, b in zip(one[0], other[0]):
            assert np.array_equal(a, b), threads
        assert one[1].keys() == other[1].keys()
        for k in one[1]:
            assert np.array_equal(one[1][k], other[1][k]), (threads, k)


@pytest.mark.parametrize("sa,sb", [((200, 72), (72, 60)), ((1, 150, 40), (1, 40, 64)),
                                   ((3, 100, 30), (30, 50)), ((97, 64), (2, 64, 33)),
                                   ((40, 64), (64, 200))])
def test_fixed_matmul_bits_do_not_depend_on_the_thread_count(monkeypatch, sa, sb):
    rng = np.random.default_rng(1)
    a = rng.standard_normal(sa).astype(np.float32)
    b = rng.standard_normal(sb).astype(np.float32)
    monkeypatch.setattr(parallel, "_PARALLEL_GEMM_MIN", 1 << 10)
    seen = []

    def epilogue(piece, rows, cols):
        seen.append(piece.shape)
        piece += 1.0
    got = []
    for threads in (1, 2, 3):
        monkeypatch.setenv("WORKBENCH_NUM_THREADS", str(threads))
        out = parallel.fixed_matmul(np, a, b)
        np.testing.assert_allclose(out, np.matmul(a, b), rtol=1e-5, atol=1e-4)
        into = np.empty_like(out)
        assert parallel.fixed_matmul(np, a, b, out=into, epilogue=epilogue) is into
        np.testing.assert_array_equal(into, out + 1.0)
        got.append(out)
    assert all(np.array_equal(got[0], g) for g in got[1:])
    assert sum(int(np.prod(s)) for s in seen) == 3 * got[0].size   # each element once
    # a layout whose one call rounds otherwise than its pieces: one thread runs the pieces
    monkeypatch.setattr(parallel, "_WHOLE_SAME", dict.fromkeys(parallel._WHOLE_SAME, False))
    monkeypatch.setenv("WORKBENCH_NUM_THREADS", "1")
    assert np.array_equal(parallel.fixed_matmul(np, a, b), got[0])
