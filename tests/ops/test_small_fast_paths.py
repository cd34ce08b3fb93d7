"""The lean host paths of the per-token kernels of a transformer at batch 1 (issue 16): small
MatMul / Gemm products as one BLAS call, LayerNormalization over the last axis, the in-place
softmax of FusedAttention and FusedMatMul's in-place bias / residual; each against the general
path it stands for (bit for bit where both compute the same operations)."""

from __future__ import annotations

import contextlib
from types import SimpleNamespace

import numpy as np
import pytest

from workbench import compiled
from workbench.errors import ShapeError
from workbench.ops import linalg
from workbench.ops.activation import softmax
from workbench.ops.linalg import _broadcasts_into, fused_attention, fused_matmul_epilogue, gemm
from workbench.ops.norm import layer_norm
from workbench.ops.parallel import parallel_matmul

RNG = np.random.default_rng(3)


def _f(*shape, dtype=np.float32):
    return RNG.standard_normal(shape).astype(dtype)


@pytest.mark.parametrize("ashape,bshape", [
    ((32, 64), (64, 64)), ((1, 32, 64), (64, 256)), ((2, 4, 7, 16), (2, 4, 16, 7)),
    ((3, 1, 5, 8), (4, 8, 2)), ((5,), (5, 3)), ((6, 5), (5,)), ((1, 1), (1, 1)),
    ((8, 4, 32, 16), (8, 4, 16, 32))])   # attention's stacked product: equal batch dims
@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int64])
def test_small_matmul_equals_the_general_path(ashape, bshape, dtype):
    a, b = _f(*ashape, dtype=np.float64), _f(*bshape, dtype=np.float64)
    a, b = (a * 4).astype(dtype), (b * 4).astype(dtype)
    got = linalg.matmul(a, b)
    if a.ndim >= 2 and b.ndim >= 2:
        ref = parallel_matmul(np, a, b)   # the general path (one BLAS call when small)
    else:
        ref = np.matmul(a, b)
    assert got.shape == ref.shape and got.dtype == ref.dtype
    np.testing.assert_array_equal(got, ref)


def test_small_matmul_of_views_and_errors():
    a = _f(2, 16, 8).transpose(0, 2, 1)          # not contiguous
    b = _f(2, 16, 4)
    np.testing.assert_array_equal(linalg.matmul(a, b), parallel_matmul(np, a, b))
    with pytest.raises(ShapeError, match="inner dimensions"):
        linalg.matmul(_f(3, 4), _f(5, 2))
    with pytest.raises(ShapeError, match="broadcast"):
        linalg.matmul(_f(2, 3, 4), _f(3, 4, 2))


@pytest.mark.parametrize("trans", [(0, 0), (0, 1), (1, 0), (1, 1)])
def test_small_gemm_equals_the_general_path(trans):
    ta, tb = trans
    a = _f(8, 3) if ta else _f(3, 8)
    b = _f(5, 8) if tb else _f(8, 5)
    c = _f(5)
    got = gemm(a, b, c, alpha=0.5, beta=2.0, transA=ta, transB=tb)
    ap, bp = (a.T if ta else a), (b.T if tb else b)
    ref = parallel_matmul(np, ap, bp)
    ref = ref * np.float32(0.5)
    ref += c * np.float32(2.0)
    np.testing.assert_array_equal(got, ref)
    ints = gemm(np.arange(6).reshape(2, 3), np.arange(6).reshape(3, 2))
    np.testing.assert_array_equal(ints, np.arange(6).reshape(2, 3) @ np.arange(6).reshape(3, 2))


@pytest.mark.parametrize("shape", [(1, 32, 64), (8, 32, 64), (5, 7), (3, 1), (4,)])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("with_bias", [True, False])
@pytest.mark.parametrize("axis", [-1, "last"])
def test_layer_norm_last_axis_equals_the_general_path(shape, dtype, with_bias, axis):
    x = (_f(*shape, dtype=np.float64) * 3 + 1).astype(dtype)
    s = _f(shape[-1], dtype=dtype)
    b = _f(shape[-1], dtype=dtype) if with_bias else None
    ax = -1 if axis == -1 else len(shape) - 1
    with compiled.disabled():   # the numpy fast path (float32 may run compiled otherwise)
        fast = layer_norm(x, s, b, axis=ax, epsilon=1e-12)
    # asking for the Mean / InvStdDev outputs takes the general path
    general = layer_norm(x, s, b, axis=ax, epsilon=1e-12, ctx=SimpleNamespace(n_outputs=3))[0]
    assert fast.dtype == general.dtype == dtype
    np.testing.assert_array_equal(fast, general)
    fast = layer_norm(x, s, b, axis=ax, epsilon=1e-12)   # compiled when loaded (float32)
    d = x.astype(np.float64) - x.astype(np.float64).mean(-1, keepdims=True)
    ref = d / np.sqrt((d * d).mean(-1, keepdims=True) + 1e-12) * s + (0 if b is None else b)
    np.testing.assert_allclose(fast, ref, rtol=2e-5 if dtype == np.float32 else 1e-12,
                               atol=2e-5 if dtype == np.float32 else 1e-12)


def test_layer_norm_other_cases_keep_the_general_path():
    x = _f(2, 3, 4)
    s = _f(3, 4)
    y = layer_norm(x, s, None, axis=1)       # two axes: the general path
    d = x - x.mean((1, 2), keepdims=True)
    ref = d / np.sqrt((d * d).mean((1, 2), keepdims=True) + 1e-5) * s
    np.testing.assert_allclose(y, ref, rtol=1e-5, atol=1e-5)
    h = layer_norm(x.astype(np.float16), s[0].astype(np.float16), None)   # float16
    assert h.dtype == np.float16


@pytest.mark.parametrize("mask", ["add", "fill_where_false", ""])
def test_attention_in_place_softmax_equals_the_softmax_kernel(mask):
    q, k, v = _f(2, 3, 6, 8), _f(2, 3, 8, 6), _f(2, 3, 6, 8)
    m = {"add": _f(2, 1, 1, 6), "fill_where_false": np.tril(np.ones((6, 6), bool)),
         "": None}[mask]
    s = np.matmul(q, k) / np.float32(3.0)
    if mask == "add":
        s = s + m
    elif mask:
        s = np.where(m, s, np.float32(-1e9))
    with compiled.disabled():   # the numpy paths: bit for bit
        got = fused_attention(q, k, v, m, scale=3.0, scale_op="div", mask=mask, fill=-1e9)
        ref = np.matmul(softmax(s, axis=-1), v)
    np.testing.assert_array_equal(got, ref)
    got = fused_attention(q, k, v, m, scale=3.0, scale_op="div", mask=mask, fill=-1e9)
    np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-6)   # compiled when loaded
    # a row masked everywhere with -inf is NaN, as Softmax gives it, with no warning raised
    minf = np.zeros((2, 1, 1, 6), np.float32)
    minf[0] = -np.inf
    with np.errstate(all="raise"):
        nan = fused_attention(q, k, v, minf, mask="add")
    assert np.isnan(nan[0]).all() and np.isfinite(nan[1]).all()


def test_broadcasts_into_and_fused_matmul_operands():
    assert _broadcasts_into((64,), (1, 32, 64)) and _broadcasts_into((1, 64), (2, 32, 64))
    assert _broadcasts_into((32, 1), (2, 32, 64)) and _broadcasts_into((), (3,))
    assert not _broadcasts_into((2, 32, 64), (32, 64))
    assert not _broadcasts_into((3, 64), (2, 32, 64))
    a, w = _f(2, 5, 4), _f(4, 3)
    for bias, z in ((_f(1, 3), _f(5, 1)), (_f(3), _f(2, 5, 3)), (_f(5, 3), None),
                    (_f(2, 5, 3), _f(3))):   # per column, per row, whole-shape operands
        got = fused_matmul_epilogue(a, w, bias, z)
        ref = a @ w + bias + (0 if z is None else z)
        np.testing.assert_allclose(got, ref, rtol=1e-6, atol=1e-6)


def test_float32_erf_of_the_gelu_epilogue():
    """The rational float32 erf of FusedMatMul's erf GELU against float64 erf on a dense
    grid, its limits, and the epilogue against the GELU formula (float64 takes scipy's erf)."""
    special = pytest.importorskip("scipy.special")
    xs = np.linspace(-8, 8, 400001).astype(np.float32)
    keep = xs.copy()
    got = linalg._erf_f32(xs)
    assert got.dtype == np.float32 and np.array_equal(xs, keep)   # x is not written
    in_place = xs.copy()
    assert linalg._erf_f32(in_place, out=in_place) is in_place
    np.testing.assert_array_equal(in_place, got)
    assert np.abs(got - special.erf(xs.astype(np.float64))).max() < 4e-7
    edge = linalg._erf_f32(np.array([np.nan, np.inf, -np.inf, 0.0, -0.0], np.float32))
    assert np.isnan(edge[0]) and abs(edge[1] - 1) < 2e-7 and abs(edge[2] + 1) < 2e-7
    assert edge[3] == 0 and np.signbit(edge[4])
    for dtype, tol in ((np.float32, 2e-6), (np.float64, 1e-14)):
        y = (_f(4, 64, dtype=np.float64) * 3).astype(dtype)
        ref = y.astype(np.float64) * 0.5 * (1 + special.erf(y.astype(np.float64) / np.sqrt(2)))
        out = y.copy()
        linalg._epilogue_inplace(out, "Gelu")
        assert out.dtype == dtype
        np.testing.assert_allclose(out, ref, rtol=tol, atol=tol)


def _fused_reference(a, w, bias, z, gamma, beta, activation, eps):
    """FusedMatMul's general path, step by step: the product, then ``_matmul_epilogue``,
    then the LayerNormalization kernel."""
    y = linalg._matmul_epilogue(linalg.matmul(a, w), bias, z, activation, np)
    return y if gamma is None else layer_norm(y, gamma, beta, epsilon=eps)


@pytest.mark.parametrize("use_compiled", [True, False])
@pytest.mark.parametrize("activation,with_z,with_norm", [
    ("", True, True), ("", False, False), ("", True, False), ("Gelu", False, False),
    ("GeluTanh", True, False), ("Gelu", True, True)])
def test_fused_matmul_float32_lean_path_equals_the_general_path(activation, with_z, with_norm,
                                                                use_compiled):
    """The lean float32 FusedMatMul (``_fused_f32``: few checks, the same calls) gives the
    general path's bits, with the compiled GELU / LayerNorm kernels and without them."""
    a, w, bias = _f(2, 7, 24), _f(24, 40), _f(40)
    z = _f(2, 7, 40) if with_z else None
    gamma, beta = (_f(40), _f(40)) if with_norm else (None, None)
    a[0, 0, :3] = [np.nan, np.inf, -np.inf]
    if use_compiled:
        compiled.wait(["transformer"], timeout=120)
    with compiled.disabled() if not use_compiled else contextlib.nullcontext():
        got = fused_matmul_epilogue(a, w, bias, z, gamma, beta, activation=activation,
                                    epsilon=1e-5)
        ref = _fused_reference(a, w, bias, z, gamma, beta, activation, 1e-5)
        lean = linalg._fused_f32(a, w, bias, z, gamma, beta, activation, 1e-5)
    assert lean is not None
    np.testing.assert_array_equal(got, ref)
    np.testing.assert_array_equal(lean, ref)
    # outside the lean case (a strided A, a (1, N) bias, Relu): the general path
    assert linalg._fused_f32(a[:, ::2], w, bias, z, None, None, "", 1e-5) is None
    assert linalg._fused_f32(a, w, bias.reshape(1, 40), z, None, None, "", 1e-5) is None
    assert linalg._fused_f32(a, w, bias, z, None, None, "Relu", 1e-5) is None


@pytest.mark.parametrize("case", ["bert", "gpt2", "fill_false", "plain"])
def test_attention_lean_float32_path_equals_the_general_path(case, monkeypatch):
    """FusedAttention's lean float32 path (per-shape work kept, the same views, products and
    compiled softmax call) gives the general path's bits, on a second call with other data
    (the kept plan) too; masks it does not take go the general way."""
    compiled.wait(["transformer"], timeout=120)
    b, s, h, d = 2, 6, 3, 4
    shp = np.array([b, s, h, d], np.int64)
    kw = dict(q_perm=[0, 2, 1, 3], k_perm=[0, 2, 3, 1], v_perm=[0, 2, 1, 3],
              out_perm=[0, 2, 1, 3])
    if case == "bert":
        kw.update(scale=2.0, scale_op="div", mask="add")
        m = _f(b, 1, 1, s)
    elif case == "gpt2":
        kw.update(scale=0.5, scale_op="mul", mask="fill_where_true", fill=-3.4e38)
        m = ~np.tril(np.ones((s, s), bool))
    elif case == "fill_false":
        kw.update(mask="fill_where_false", fill=-1e9)
        m = np.tril(np.ones((s, s), bool))
    else:
        kw.update(q_perm=[], k_perm=[], v_perm=[], out_perm=[], mask="")
        m = None
    out_shape = np.array([b, s, h * d], np.int64) if kw["out_perm"] else None
    general = linalg._attention_f32
    for _ in range(2):
        if case == "plain":
            q, k, v = _f(b, h, s, d), _f(b, h, d, s), _f(b, h, s, d)
            args = (q, k, v, m, None, None, None, None)
        else:
            q, k, v = _f(b, s, h * d), _f(b, s, h * d), _f(b, s, h * d)
            args = (q, k, v, m, shp, shp, shp, out_shape)
        got = fused_attention(*args, **kw)
        assert linalg._attention_f32(*args[:8], kw.get("scale", 1.0), kw.get("scale_op", ""),
                                     kw["mask"], kw.get("fill", 0.0), kw["q_perm"],
                                     kw["k_perm"], kw["v_perm"], kw["out_perm"]) is not None
        monkeypatch.setattr(linalg, "_attention_f32", lambda *a: None)
        ref = fused_attention(*args, **kw)
        monkeypatch.setattr(linalg, "_attention_f32", general)
        np.testing.assert_array_equal(got, ref)
    if m is not None:   # a mask of another dtype: the general path (numpy's rules)
        other = m.astype(np.float64 if kw["mask"] == "add" else np.uint8)
        assert linalg._attention_f32(q, k, v, other, shp, shp, shp, out_shape,
                                     kw.get("scale", 1.0), kw.get("scale_op", ""), kw["mask"],
                                     kw.get("fill", 0.0), kw["q_perm"], kw["k_perm"],
                                     kw["v_perm"], kw["out_perm"]) is None
