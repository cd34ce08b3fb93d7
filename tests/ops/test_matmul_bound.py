"""The pre-bound FusedMatMul / MatMul / Gemm step (``workbench/ops/linalg.py::_make_bound``,
one ``gemm_avx2.fused_block`` call that runs the C GEMM and calls the compiled GELU and
LayerNorm kernels from C): taken from a node's second run with the same arrays, the same bits
as the full path (every epilogue form, tails of the register tile, NaN rows, large offsets),
declined whenever an input differs, re-packed after in-place weight edits, and never used when
the kernels are off or missing. Gemm ``A @ B' + C`` through the same C path."""

from __future__ import annotations

import numpy as np
import pytest

from workbench import compiled
from workbench.ops import linalg, parallel
from workbench.ops.linalg import fused_matmul_epilogue, gemm, matmul
from workbench.ops.registry import NodeContext

RNG = np.random.default_rng(2324)


@pytest.fixture(scope="module")
def kernels():
    why = compiled.c_unavailable("gemm_avx2")
    if why:
        pytest.skip(why)
    if not compiled.wait(["gemm_avx2", "transformer"], timeout=300) \
            or compiled.kernel("transformer.gelu") is None:
        pytest.skip(f"kernels not available: {compiled.status()['modules']}")
    return compiled.kernel("gemm_avx2.fused_block")


def _ctx():
    return NodeContext("mm", "FusedMatMul", 1, 1)


def _f32(*shape):
    return RNG.standard_normal(shape).astype(np.float32)


def _runs(fn, n=3):
    """``fn(ctx)`` n times on one context; the context and the results."""
    ctx = _ctx()
    return ctx, [fn(ctx) for _ in range(n)]


def _forms(k, n, rows):
    a, w, b, z = _f32(1, rows, k), _f32(k, n), _f32(n), _f32(1, rows, n)
    g, be = _f32(n) + 1, _f32(n)
    return a, w, [dict(), dict(bias=b), dict(bias=b, Z=z), dict(Z=z),
                  dict(bias=b, activation="Gelu"), dict(bias=b, Z=z, activation="Gelu"),
                  dict(bias=b, activation="GeluTanh"), dict(Z=z, activation="Relu"),
                  dict(bias=b, Z=z, gamma=g, beta=be, epsilon=1e-3),
                  dict(bias=b, gamma=g, epsilon=1e-5),
                  dict(bias=b, activation="Gelu", gamma=g, beta=be),
                  dict(bias=b, Z=z, gamma=g, beta=be, skip_norm=1),
                  dict(Z=z, gamma=g, skip_norm=1)]


@pytest.mark.parametrize("k,n,rows", [(1, 1, 1), (9, 17, 7), (64, 40, 13)])
def test_bound_step_gives_the_full_paths_bits(kernels, k, n, rows):
    """Every epilogue form: the bound runs (2nd, 3rd) equal the full first run bit for bit
    (the same kernels on the same arrays); the numpy path agrees within rounding. ReLU has no
    compiled epilogue here: it is not bound (its full path runs every time)."""
    a, w, forms = _forms(k, n, rows)
    for kw in forms:
        ctx, (first, *later) = _runs(lambda c, kw=kw: fused_matmul_epilogue(a, w, ctx=c, **kw))
        assert (linalg._MM_BOUND in ctx.extra) == (kw.get("activation") != "Relu"), kw
        for y in later:
            np.testing.assert_array_equal(y, first)
        want = fused_matmul_epilogue(a, w, **kw)
        np.testing.assert_allclose(first, want, rtol=3e-5, atol=3e-5 * max(1, k))
    ctx, (first, *later) = _runs(lambda c: matmul(a, w, ctx=c))
    assert linalg._MM_BOUND in ctx.extra
    for y in later:
        np.testing.assert_array_equal(y, first)


def test_layer_norm_rows_with_offsets_and_nan(kernels):
    a, w, b, z = _f32(1, 7, 16), _f32(16, 24), _f32(24), _f32(1, 7, 24)
    z[0, 2] += 3e4                      # a large common offset in one row
    a[0, 4, 1] = np.nan                 # a NaN row
    g, be = _f32(24) + 1, _f32(24)
    for kw in (dict(bias=b, Z=z, gamma=g, beta=be), dict(bias=b, Z=z, gamma=g, skip_norm=1)):
        with np.errstate(invalid="ignore"):
            ctx, (first, *later) = _runs(
                lambda c, kw=kw: fused_matmul_epilogue(a, w, ctx=c, **kw))
            want = fused_matmul_epilogue(a, w, **kw)
        assert linalg._MM_BOUND in ctx.extra
        for y in later:
            np.testing.assert_array_equal(y, first)
        assert np.isnan(first[0, 4]).all() and np.isfinite(np.delete(first, 4, 1)).all()
        fin = np.isfinite(want)
        np.testing.assert_allclose(first[fin], want[fin], rtol=1e-4, atol=1e-4)


def test_bound_step_declines_what_differs(kernels):
    """Another A shape, a residual where there was none, float64, a strided A: the full path
    (right results), and a changed shape is bound again after two runs of it."""
    a, w, b, z = _f32(1, 6, 12), _f32(12, 20), _f32(20), _f32(1, 6, 20)
    ctx = _ctx()
    for _ in range(2):
        fused_matmul_epilogue(a, w, b, ctx=ctx)
    bound = ctx.extra[linalg._MM_BOUND]
    a2 = _f32(2, 5, 12)
    np.testing.assert_allclose(fused_matmul_epilogue(a2, w, b, ctx=ctx), a2 @ w + b,
                               rtol=2e-5, atol=2e-5)
    assert linalg._MM_BOUND not in ctx.extra           # the other shape: unbound...
    fused_matmul_epilogue(a2, w, b, ctx=ctx)
    assert ctx.extra[linalg._MM_BOUND] is not bound    # ...then bound for it
    assert bound(a, w, b, z, None, None) is None        # a residual it was not made for
    assert bound(a.astype(np.float64), w, b, None, None, None) is None
    wide = _f32(1, 6, 24)
    assert bound(wide[:, :, ::2], w, b, None, None, None) is None
    assert bound(a, w, _f32(20), None, None, None) is None   # another bias array
    np.testing.assert_array_equal(bound(a, w, b, None, None, None),   # its own shape
                                  fused_matmul_epilogue(a, w, b, ctx=_ctx()))
    with compiled.disabled():                           # kernels off: numpy's bits
        ctx2 = _ctx()
        got = [fused_matmul_epilogue(a, w, b, ctx=ctx2) for _ in range(3)]
        np.testing.assert_array_equal(got[2], fused_matmul_epilogue(a, w, b))
        assert linalg._MM_BOUND not in ctx2.extra


def test_in_place_edits_reach_the_bound_step(kernels):
    a, w, b = _f32(1, 5, 10), _f32(10, 30), _f32(30)
    g = _f32(30) + 1
    ctx, _ = _runs(lambda c: fused_matmul_epilogue(a, w, b, gamma=g, ctx=c))
    first = ctx.extra[linalg._MM_BOUND]
    w *= -2                                   # weights updated in place: packed again
    g *= 3                                    # gamma read where it is, each run
    want = fused_matmul_epilogue(a, w, b, gamma=g)
    np.testing.assert_allclose(fused_matmul_epilogue(a, w, b, gamma=g, ctx=ctx), want,
                               rtol=3e-5, atol=3e-5)
    assert ctx.extra[linalg._MM_BOUND] is not first    # bound again on the new packing
    np.testing.assert_array_equal(fused_matmul_epilogue(a, w, b, gamma=g, ctx=ctx),
                                  fused_matmul_epilogue(a, w, b, gamma=g, ctx=_ctx()))
    b[:] = 5                                  # the bias in place
    for _ in range(3):
        got = fused_matmul_epilogue(a, w, b, gamma=g, ctx=ctx)
    np.testing.assert_allclose(got, fused_matmul_epilogue(a, w, b, gamma=g), rtol=3e-5,
                               atol=3e-5)
    assert linalg._MM_BOUND in ctx.extra


def test_checks_made_in_c_decline_before_computing(kernels):
    """The bound call's weight-sample and bias checks run in C (``checked_block``): an edit
    of one sampled weight element or of one bias element declines (None: the full path runs,
    which packs again); an A whose strides differ but that numpy calls C-contiguous (a
    size-1 axis) still takes the bound call; kernels turned off decline."""
    a, w, b, z = _f32(1, 6, 12), _f32(12, 20), _f32(20), _f32(1, 6, 20)
    for kw in (dict(Z=z), dict(Z=z, activation="Gelu"), dict(Z=z, gamma=_f32(20) + 1)):
        ctx, _ = _runs(lambda c, kw=kw: fused_matmul_epilogue(a, w, b, ctx=c, **kw))
        bound = ctx.extra[linalg._MM_BOUND]
        args = (a, w, b, z, kw.get("gamma"), None)
        want = fused_matmul_epilogue(a, w, b, **kw)
        np.testing.assert_allclose(bound(*args), want, rtol=3e-5, atol=3e-5)
        odd = np.lib.stride_tricks.as_strided(a, a.shape, (4, 48, 4))
        assert odd.flags.c_contiguous and odd.strides != a.strides
        np.testing.assert_array_equal(bound(odd, *args[1:]), bound(*args))
        idx = ctx.extra[linalg._GEMM_PACK][2]
        flat = w.reshape(-1)
        keep = flat[idx[5]]
        flat[idx[5]] = keep + 1
        assert bound(*args) is None                     # a sampled weight edited in place
        flat[idx[5]] = keep
        assert bound(*args) is not None
        keep = b[7]
        b[7] = keep + 1
        assert bound(*args) is None                     # one bias element edited
        b[7] = keep
        with compiled.disabled():
            assert bound(*args) is None
        np.testing.assert_allclose(bound(*args), want, rtol=3e-5, atol=3e-5)


def test_not_bound_without_the_kernel(monkeypatch):
    """No C compiler / no AVX2+FMA / not built yet: the numpy path, nothing bound."""
    a, w = _f32(1, 4, 8), _f32(8, 9)
    monkeypatch.setattr(compiled, "kernel", lambda name: None)
    ctx, ys = _runs(lambda c: matmul(a, w, ctx=c))
    assert linalg._MM_BOUND not in ctx.extra
    np.testing.assert_array_equal(ys[2], matmul(a, w))


def test_same_bits_for_any_thread_count(kernels, monkeypatch):
    a, w, b, z = _f32(1, 40, 32), _f32(32, 48), _f32(48), _f32(1, 40, 48)
    g = _f32(48) + 1
    monkeypatch.setenv("WORKBENCH_NUM_THREADS", "1")
    _, one = _runs(lambda c: fused_matmul_epilogue(a, w, b, z, g, activation="Gelu", ctx=c))
    monkeypatch.setenv("WORKBENCH_NUM_THREADS", "3")
    _, three = _runs(lambda c: fused_matmul_epilogue(a, w, b, z, g, activation="Gelu", ctx=c))
    for y in one + three:
        np.testing.assert_array_equal(y, one[0])


@pytest.mark.parametrize("trans_b", [0, 1])
def test_gemm_through_the_c_path(kernels, trans_b):
    """Gemm A @ B' + C (a Linear layer) with a context: the C GEMM, bound from the second run;
    alpha != 1, transA or a (1, N) C take the numpy path; all agree with numpy."""
    a, c = _f32(3, 21), _f32(19)
    bt = _f32(19, 21) if trans_b else _f32(21, 19)
    want = a @ (bt.T if trans_b else bt) + c
    for C in (c, None):
        ctx, ys = _runs(lambda x, C=C: gemm(a, bt, C, transB=trans_b, ctx=x))
        assert linalg._GEMM_PACK in ctx.extra and linalg._MM_BOUND in ctx.extra
        for y in ys:
            assert y.dtype == np.float32
            np.testing.assert_array_equal(y, ys[0])
        np.testing.assert_allclose(ys[0], want if C is not None else want - c, rtol=2e-5,
                                   atol=2e-5)
    for kw in (dict(alpha=0.5), dict(transA=1)):
        aa = np.ascontiguousarray(a.T) if kw.get("transA") else a
        ctx = _ctx()
        got = gemm(aa, bt, c, transB=trans_b, ctx=ctx, **kw)
        assert linalg._GEMM_PACK not in ctx.extra
        np.testing.assert_array_equal(got, gemm(aa, bt, c, transB=trans_b, **kw))
    ctx = _ctx()
    np.testing.assert_array_equal(gemm(a, bt, c.reshape(1, -1), transB=trans_b, ctx=ctx),
                                  gemm(a, bt, c.reshape(1, -1), transB=trans_b))
    # one row against a large weight (a classifier at batch 1): BLAS's product, not packed
    a1, big = _f32(1, 520), _f32(520, 520)
    ctx = _ctx()
    np.testing.assert_array_equal(gemm(a1, big, None, transB=trans_b, ctx=ctx),
                                  gemm(a1, big, None, transB=trans_b))
    assert linalg._GEMM_PACK not in ctx.extra


def test_layer_norm_node_bound_call(kernels):
    """A LayerNormalization node's pre-bound kernel call (``rowwise.bind_layer_norm``): from
    its second run the same bits as the full path (rows with a large offset and NaN, beta or
    not), declined for another shape or gamma, in-place gamma edits seen, kernels off: numpy."""
    from workbench.ops.norm import _LN_BOUND, layer_norm

    x, g, be = _f32(2, 7, 24), _f32(24) + 1, _f32(24)
    x[0, 3] += 5e4
    x[1, 2, 5] = np.nan
    for beta in (be, None):
        ctx = NodeContext("ln", "LayerNormalization", 17, 1)
        with np.errstate(invalid="ignore"):
            ys = [layer_norm(x, g, beta, epsilon=1e-5, ctx=ctx) for _ in range(3)]
            want = layer_norm(x, g, beta, epsilon=1e-5)
        assert _LN_BOUND in ctx.extra
        for y in ys:
            np.testing.assert_array_equal(y, want)
        assert np.isnan(ys[2][1, 2]).all() and np.isfinite(ys[2][0]).all()
    bound = ctx.extra[_LN_BOUND]
    assert bound(_f32(1, 7, 24), g, None) is None and bound(x, g.copy(), None) is None
    assert bound(_f32(2, 7, 48)[:, :, ::2], g, None) is None          # not C-contiguous
    x1 = _f32(1, 7, 24)   # bind on a size-1 axis, then give it other strides there
    for _ in range(2):
        layer_norm(x1, g, None, epsilon=1e-5, ctx=ctx)
    odd = np.lib.stride_tricks.as_strided(x1, x1.shape, (8, 96, 4))
    assert odd.flags.c_contiguous and odd.strides != x1.strides
    np.testing.assert_array_equal(ctx.extra[_LN_BOUND](odd, g, None),
                                  layer_norm(x1, g, None, epsilon=1e-5))
    g *= 2
    with np.errstate(invalid="ignore"):
        np.testing.assert_array_equal(layer_norm(x, g, None, epsilon=1e-5, ctx=ctx),
                                      layer_norm(x, g, None, epsilon=1e-5))
        with compiled.disabled():
            got = layer_norm(x, g, None, epsilon=1e-5, ctx=ctx)
            np.testing.assert_array_equal(got, layer_norm(x, g, None, epsilon=1e-5))


@pytest.mark.parametrize("k,n,rows", [(9, 17, 7), (64, 40, 13), (16, 24, 71)])
def test_row_pieces_give_one_calls_bits(kernels, monkeypatch, k, n, rows):
    """Products cut into row pieces over the C workers (forced for these small shapes): at
    2 and 3 threads, every epilogue form (GELU, LayerNorm, residual, SkipLayerNorm) gives
    the bits of the one-call step at 1 thread, on the full path (first runs) and the bound
    step alike, pieces smaller than the 6-row tile included; without the C workers the
    Python pool's split, again the same bits."""
    if not compiled.wait(["blas_worker"], timeout=300) or parallel.pieces_entry() is None:
        pytest.skip("blas_worker is not loaded")
    monkeypatch.setattr(linalg, "_GEMM_PIECES_MIN", 1)
    a, w, forms = _forms(k, n, rows)
    forms = [kw for kw in forms if kw.get("activation") != "Relu"]
    monkeypatch.setenv("WORKBENCH_NUM_THREADS", "1")
    want = [_runs(lambda c, kw=kw: fused_matmul_epilogue(a, w, ctx=c, **kw))[1] for kw in forms]
    for threads in ("2", "3"):
        monkeypatch.setenv("WORKBENCH_NUM_THREADS", threads)
        for kw, ys1 in zip(forms, want):
            ctx, ys = _runs(lambda c, kw=kw: fused_matmul_epilogue(a, w, ctx=c, **kw), n=4)
            assert linalg._MM_BOUND in ctx.extra, kw
            for y in ys:
                np.testing.assert_array_equal(y, ys1[0])
    monkeypatch.setattr(linalg, "pieces_entry", lambda: None)
    monkeypatch.setattr(linalg, "_PARALLEL_GEMM_MIN", 1)
    monkeypatch.setattr(parallel, "_PARALLEL_MIN", 1)
    for kw, ys1 in zip(forms, want):
        _, ys = _runs(lambda c, kw=kw: fused_matmul_epilogue(a, w, ctx=c, **kw))
        for y in ys:
            np.testing.assert_array_equal(y, ys1[0])


def test_split_bound_step_at_one_thread_and_after_edits(kernels, monkeypatch):
    """A step bound with row pieces runs as one call when the thread count drops to 1 and
    in pieces again at 2 (the same bits), and sees in-place weight and bias edits."""
    if not compiled.wait(["blas_worker"], timeout=300) or parallel.pieces_entry() is None:
        pytest.skip("blas_worker is not loaded")
    monkeypatch.setattr(linalg, "_GEMM_PIECES_MIN", 1)
    a, w, b = _f32(2, 20, 32), _f32(32, 48), _f32(48)
    monkeypatch.setenv("WORKBENCH_NUM_THREADS", "2")
    ctx, ys = _runs(lambda c: fused_matmul_epilogue(a, w, b, activation="Gelu", ctx=c))
    bound = ctx.extra[linalg._MM_BOUND]
    monkeypatch.setenv("WORKBENCH_NUM_THREADS", "1")
    np.testing.assert_array_equal(fused_matmul_epilogue(a, w, b, activation="Gelu", ctx=ctx),
                                  ys[0])
    monkeypatch.setenv("WORKBENCH_NUM_THREADS", "2")
    np.testing.assert_array_equal(fused_matmul_epilogue(a, w, b, activation="Gelu", ctx=ctx),
                                  ys[0])
    assert ctx.extra[linalg._MM_BOUND] is bound
    w *= -2                     # updated in place (the packing's sampled check sees it)
    b[:] = 0.5
    got = fused_matmul_epilogue(a, w, b, activation="Gelu", ctx=ctx)
    np.testing.assert_array_equal(got, fused_matmul_epilogue(a, w, b, activation="Gelu",
                                                             ctx=_ctx()))
    assert not np.array_equal(got, ys[0])


def test_bound_again_once_the_c_workers_load(kernels, monkeypatch):
    """Bound while ``blas_worker`` was not loaded yet (a cold start): one call; once it is
    loaded the step is bound again with row pieces; the same bits throughout."""
    if not compiled.wait(["blas_worker"], timeout=300) or parallel.pieces_entry() is None:
        pytest.skip("blas_worker is not loaded")
    real = linalg.pieces_entry
    monkeypatch.setattr(linalg, "_GEMM_PIECES_MIN", 1)
    monkeypatch.setenv("WORKBENCH_NUM_THREADS", "2")
    a, w, b = _f32(1, 30, 16), _f32(16, 24), _f32(24)
    monkeypatch.setattr(linalg, "pieces_entry", lambda: None)
    ctx, ys = _runs(lambda c: fused_matmul_epilogue(a, w, b, activation="Gelu", ctx=c))
    first = ctx.extra[linalg._MM_BOUND]
    monkeypatch.setattr(linalg, "pieces_entry", real)
    ys += [fused_matmul_epilogue(a, w, b, activation="Gelu", ctx=ctx) for _ in range(3)]
    assert ctx.extra[linalg._MM_BOUND] is not first
    for y in ys:
        np.testing.assert_array_equal(y, ys[0])
