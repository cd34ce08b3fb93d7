"""float32 MatMul / FusedMatMul products by the compiled ``gemm_avx2`` kernel in inference
plans (``workbench/ops/linalg.py::_c_gemm``): against the numpy/BLAS path with tolerances on
odd shapes and every epilogue, NaN/Inf, the weights packed once and packed again when they
change, the same bits whatever the rows' split, and the fallback when the kernel is not
there. The kernel's own tiles and tails are tested in ``tests/compiled/test_gemm.py``."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import workbench as wb
from workbench import backend, compiled
from workbench.ops import linalg
from workbench.ops.linalg import fused_matmul_epilogue, matmul
from workbench.ops.registry import NodeContext

RNG = np.random.default_rng(2323)


@pytest.fixture(scope="module")
def gemm():
    why = compiled.c_unavailable("gemm_avx2")
    if why:
        pytest.skip(why)
    if not compiled.wait(["gemm_avx2"], timeout=300):
        pytest.skip(f"gemm_avx2 is not available: {compiled.status()['modules']}")
    return compiled.kernel("gemm_avx2.gemm")


def _ctx(training=False):
    return NodeContext("mm", "FusedMatMul", 1, 1, training=training)


def _f32(*shape):
    return RNG.standard_normal(shape).astype(np.float32)


def _close(got, want, k):
    assert got.dtype == np.float32 and got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-6 * max(1, k))


@pytest.mark.parametrize("rows", [1, 2, 5, 7])
def test_odd_shapes_and_epilogues_match_numpy(gemm, rows):
    """Rows 1..7 (row tails), N ending a 16-column panel anywhere, K from 1; every epilogue
    FusedMatMul has, against the numpy path (no context: BLAS)."""
    for k, n in [(1, 1), (3, 7), (5, 8), (9, 9), (16, 15), (64, 17), (7, 24), (33, 40)]:
        a, w, b = _f32(1, rows, k), _f32(k, n), _f32(n)
        z, g, be = _f32(1, rows, n), _f32(n) + 1, _f32(n)
        _close(matmul(a, w, ctx=_ctx()), matmul(a, w), k)
        for act in ("", "Gelu", "GeluTanh", "Relu"):
            for bias, res in [(None, None), (b, None), (b, z), (None, z)]:
                want = fused_matmul_epilogue(a, w, bias, res, activation=act)
                _close(fused_matmul_epilogue(a, w, bias, res, activation=act, ctx=_ctx()),
                       want, k)
        if n > 1:   # LayerNorm folded in; SkipLayerNormalization's form
            want = fused_matmul_epilogue(a, w, b, z, g, be, epsilon=1e-3)
            _close(fused_matmul_epilogue(a, w, b, z, g, be, epsilon=1e-3, ctx=_ctx()),
                   want, k)
            want = fused_matmul_epilogue(a, w, b, z, g, be, skip_norm=1)
            _close(fused_matmul_epilogue(a, w, b, z, g, be, skip_norm=1, ctx=_ctx()),
                   want, k)


def test_kernel_path_is_taken_and_declined(gemm):
    """The packed weights land in the node's context when the kernel ran; not for float64,
    batched or vector B, training plans, or a residual that only broadcasts."""
    a, w, b = _f32(2, 3, 8), _f32(8, 20), _f32(20)
    ctx = _ctx()
    matmul(a, w, ctx=ctx)
    assert linalg._GEMM_PACK in ctx.extra
    for args in [(a.astype(np.float64), w.astype(np.float64)), (a, _f32(2, 8, 20)),
                 (a, _f32(8)), (a[:, :, ::2], _f32(4, 20))]:
        ctx = _ctx()
        got, want = matmul(*args, ctx=ctx), np.matmul(*args)
        assert got.dtype == want.dtype
        np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-5)
        assert linalg._GEMM_PACK not in ctx.extra
    ctx = _ctx(training=True)
    np.testing.assert_array_equal(matmul(a, w, ctx=ctx), matmul(a, w))
    assert linalg._GEMM_PACK not in ctx.extra
    ctx, zb = _ctx(), _f32(1, 20)   # broadcast residual: the general path's add
    _close(fused_matmul_epilogue(a, w, b, zb, ctx=ctx), a @ w + b + zb, 8)


def test_nan_and_inf_propagate(gemm):
    a, w, b = _f32(1, 7, 12), _f32(12, 19), _f32(19)
    a[0, 1, 3] = np.nan
    a[0, 4, 0] = np.inf
    w[5, 18] = -np.inf
    for act in ("", "Gelu", "Relu"):
        with np.errstate(invalid="ignore"):
            want = fused_matmul_epilogue(a, w, b, activation=act)
            got = fused_matmul_epilogue(a, w, b, activation=act, ctx=_ctx())
        np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
        np.testing.assert_array_equal(np.isinf(got), np.isinf(want))
        fin = np.isfinite(want)
        np.testing.assert_allclose(got[fin], want[fin], rtol=2e-5, atol=2e-5)
        assert np.isnan(got[0, 1]).all()


def test_weights_packed_once_and_again_when_changed(gemm):
    a, w, b = _f32(1, 6, 10), _f32(10, 30), _f32(30)
    ctx = _ctx()
    fused_matmul_epilogue(a, w, b, ctx=ctx)
    packed = ctx.extra[linalg._GEMM_PACK][5]
    fused_matmul_epilogue(a, w, b, ctx=ctx)
    assert ctx.extra[linalg._GEMM_PACK][5] is packed       # the same weights: kept
    w *= -2                                                   # updated in place
    _close(fused_matmul_epilogue(a, w, b, ctx=ctx), a @ w + b, 10)
    b[:] = 7                                                  # the bias in place
    _close(fused_matmul_epilogue(a, w, b, ctx=ctx), a @ w + 7, 10)
    w2 = _f32(10, 30)                                         # another array
    _close(fused_matmul_epilogue(a, w2, b, ctx=ctx), a @ w2 + b, 10)
    assert ctx.extra[linalg._GEMM_PACK][0] is w2


def _linear_model():
    w, b = _f32(12, 21), _f32(21)
    nodes = [helper.make_node("MatMul", ["x", "W"], ["m"]),
             helper.make_node("Add", ["m", "B"], ["y"])]
    g = helper.make_graph(
        nodes, "lin", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 4, 12])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 4, 21])],
        [numpy_helper.from_array(w, "W"), numpy_helper.from_array(b, "B")])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def test_model_weights_assigned_by_the_user_are_used(gemm):
    """wb.load(...).run packs the weights once; set_params (a new array) and an in-place
    update both reach the next run; backend.prepare gives the same bits."""
    proto = _linear_model()
    x = _f32(3, 4, 12)
    model, rep = wb.load(proto), backend.prepare(proto)
    np.testing.assert_array_equal(np.asarray(model.run(x)[0]), rep.run([x])[0])
    w, b = _f32(12, 21), _f32(21)
    model.set_params({"W": w, "B": b})
    _close(np.asarray(model.run(x)[0]), x @ w + b, 12)
    model.get_params()["W"].data *= 0.5
    _close(np.asarray(model.run(x)[0]), x @ (w * 0.5) + b, 12)


def test_rows_split_over_workers_gives_the_same_bits(gemm, monkeypatch):
    a, w, b, z = _f32(1, 700, 96), _f32(96, 70), _f32(70), _f32(1, 700, 70)
    monkeypatch.setenv("WORKBENCH_NUM_THREADS", "1")
    one = fused_matmul_epilogue(a, w, b, z, ctx=_ctx())
    monkeypatch.setenv("WORKBENCH_NUM_THREADS", "3")
    np.testing.assert_array_equal(fused_matmul_epilogue(a, w, b, z, ctx=_ctx()), one)
    _close(one, a @ w + b + z, 96)


def test_fallback_without_the_kernel(monkeypatch):
    """compiled.disabled() (and a kernel that is not loaded: no compiler, no AVX2+FMA) runs
    the numpy/BLAS path: the same bits as no context at all, nothing packed."""
    a, w, b, z = _f32(2, 5, 16), _f32(16, 18), _f32(18), _f32(2, 5, 18)
    ctx = _ctx()
    with compiled.disabled():
        want = fused_matmul_epilogue(a, w, b, z, activation="Gelu")
        np.testing.assert_array_equal(
            fused_matmul_epilogue(a, w, b, z, activation="Gelu", ctx=ctx), want)
        np.testing.assert_array_equal(matmul(a, w, ctx=ctx), matmul(a, w))
    assert linalg._GEMM_PACK not in ctx.extra
    monkeypatch.setattr(compiled, "kernel", lambda name: None)
    np.testing.assert_array_equal(matmul(a, w, ctx=ctx), matmul(a, w))
    assert linalg._GEMM_PACK not in ctx.extra
