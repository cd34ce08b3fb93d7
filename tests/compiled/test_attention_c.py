"""The C kernel module ``attention_avx2`` (``kernels/attention_avx2.c``): FusedAttention in one
call against the numpy path (the reference: ``compiled.disabled()``, no node context) —
sequence lengths and head sizes that hit every tail of the register tiles and the 8x8 K
packing, more query rows than the kernel holds at once, every layout (the head split and
merge folded as strides, 3-D and 4-D inputs, broadcast batches, strided slices, other output
permutations), masks of every broadcast form, -inf / NaN / +inf rows, an empty batch; the
(batch, head) split over threads gives the same bits; the node's pre-bound call (kept, made
again when shapes change, not used when training or turned off); the fallback without the
module."""

from __future__ import annotations

import sys

import numpy as np
import pytest

from workbench import compiled
from workbench.compiled import cache
from workbench.ops import linalg
from workbench.ops.registry import FUSED_DOMAIN, NodeContext, lookup

RNG = np.random.default_rng(2323)
SPLIT = dict(q_perm=[0, 2, 1, 3], k_perm=[0, 2, 3, 1], v_perm=[0, 2, 1, 3],
             out_perm=[0, 2, 1, 3])


@pytest.fixture(scope="module")
def att():
    why = compiled.c_unavailable("attention_avx2")
    if why:
        pytest.skip(why)
    if not compiled.wait(["attention_avx2"], timeout=300):
        pytest.skip(f"attention_avx2 is not available: {compiled.status()['modules']}")
    return compiled.kernel("attention_avx2.attention")


def _f(*shape):
    return RNG.standard_normal(shape).astype(np.float32)


def _ctx(training=False):
    return NodeContext("n", "FusedAttention", 1, 1, training=training)


def _op(*args, ctx=None, **kw):
    return lookup("FusedAttention", FUSED_DOMAIN, 1).fn(*args, ctx=ctx, **kw)


def _numpy(*args, **kw):
    with compiled.disabled():
        return _op(*args, **kw)


def _check(args, kw, ctx=None, exact_nan=True):
    """The kernel's answer (through a fresh node context, which must bind) against numpy's."""
    ctx = _ctx() if ctx is None else ctx
    got = _op(*args, ctx=ctx, **kw)
    want = _numpy(*args, **kw)
    assert linalg._ATT_BOUND in ctx.extra, "the compiled call was not taken"
    assert got.shape == want.shape and got.dtype == np.float32
    if exact_nan:
        np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-6)
    return got, ctx


def _heads(b, s, h, d, scale=0.5, scale_op="mul"):
    """Q, K, V as the graph gives them, (b, s, h*d), and the folded head split / merge."""
    shp = np.array([b, s, h, d], np.int64)
    q, k, v = _f(b, s, h * d), _f(b, s, h * d), _f(b, s, h * d)
    out = np.array([b, s, h * d], np.int64)
    return (q, k, v, shp, out), dict(SPLIT, scale=scale, scale_op=scale_op)


@pytest.mark.parametrize("sq,sk,d,dv", [(1, 1, 1, 1), (3, 7, 3, 5), (4, 8, 8, 8),
                                        (5, 9, 13, 9), (7, 17, 16, 17), (9, 33, 5, 24),
                                        (70, 12, 9, 3)])
def test_plain_heads_every_tail(att, sq, sk, d, dv):
    """(B, H, Sq, D) @ (B, H, D, Sk) -> softmax -> @ (B, H, Sk, Dv), no layout folded: every
    row / column / head-size tail, Sq past the rows held at once, K read in place (Sk a
    multiple of 8) or packed, scaled by a product or a quotient (power of two or not)."""
    q, k, v = _f(2, 3, sq, d), _f(2, 3, d, sk), _f(2, 3, sk, dv)
    _check((q, k, v), dict(scale=0.37, scale_op="mul"))
    _check((q, k, v), dict(scale=3.0, scale_op="div"))
    _check((q, k, v), dict(scale=8.0, scale_op="div"))
    _check((q, k, v), {})


@pytest.mark.parametrize("b,s,h,d", [(1, 32, 4, 16), (2, 7, 3, 5), (3, 9, 2, 24)])
def test_folded_head_split_and_merge(att, b, s, h, d):
    """BERT's and GPT-2's layout: Q/K/V (B, S, H*D) reshaped and transposed as strides, the
    output written straight into (B, S, H*D); GPT-2's Q/K/V are slices of one projection."""
    args, kw = _heads(b, s, h, d, 4.0, "div")
    m = np.where(RNG.random((b, 1, 1, s)) < 0.3, -10000.0, 0.0).astype(np.float32)
    got, _ = _check((*args[:3], m, args[3], args[3], args[3], None), dict(kw, mask="add"))
    assert got.shape == (b, s, h, d)
    qkv = _f(b, s, 3 * h * d)
    q, k, v = (qkv[..., i * h * d:(i + 1) * h * d] for i in range(3))
    causal = ~np.tril(np.ones((s, s), bool))
    got, _ = _check((q, k, v, causal, args[3], args[3], args[3], args[4]),
                    dict(kw, scale=0.25, scale_op="mul", mask="fill_where_true",
                         fill=-3.4028234663852886e38))
    assert got.shape == (b, s, h * d) and got.flags.c_contiguous


def test_other_layouts(att):
    """3-D inputs, a K batch broadcast over Q's, V read with a column stride (transposed),
    the output in another permutation (column stride) and a Reshape target with 0 / -1."""
    q, k, v = _f(6, 5, 4), _f(6, 4, 9), _f(6, 9, 7)
    _check((q, k, v), {})
    _check((_f(2, 3, 5, 4), _f(1, 3, 4, 9), _f(2, 1, 9, 7)), {})
    vt = _f(2, 3, 7, 9)
    _check((_f(2, 3, 5, 4), _f(2, 3, 4, 9), vt), dict(v_perm=[0, 1, 3, 2]))
    _check((_f(2, 3, 5, 4), _f(2, 3, 4, 9), _f(2, 3, 9, 7), None, None, None, None,
            np.array([0, -1], np.int64)), dict(out_perm=[1, 3, 0, 2]))
    # K with its columns in place and contiguous rows of D: K given (B, H, D, Sk) directly
    _check((_f(2, 2, 5, 3), np.ascontiguousarray(_f(2, 2, 16, 3).transpose(0, 1, 3, 2)),
            _f(2, 2, 16, 8)), dict(scale=0.5, scale_op="mul"))


@pytest.mark.parametrize("form", ["row", "cols", "b11s", "1hqs", "full", "bq1", "strided",
                                  "scalar"])
def test_additive_masks(att, form):
    """An additive float32 mask in every broadcast form, contiguous or not."""
    b, h, sq, sk = 2, 3, 5, 11
    shapes = {"row": (sk,), "cols": (sq, sk), "b11s": (b, 1, 1, sk), "1hqs": (1, h, sq, sk),
              "full": (b, h, sq, sk), "bq1": (b, 1, sq, 1), "scalar": (1,)}
    m = _f(sk, sq).T if form == "strided" else _f(*shapes[form])
    _check((_f(b, h, sq, 6), _f(b, h, 6, sk), _f(b, h, sk, 9), m),
           dict(mask="add", scale=0.5, scale_op="mul"))


@pytest.mark.parametrize("mode", ["fill_where_true", "fill_where_false"])
@pytest.mark.parametrize("shape", [(5, 11), (2, 1, 1, 11), (2, 3, 5, 11), (2, 1, 5, 1),
                                   (11,)])
def test_fill_masks(att, mode, shape):
    """A boolean mask (fill where true / false) in every broadcast form, the fill value
    finite or -inf (a fully filled row then gives NaN, as numpy's softmax)."""
    b, h, sq, sk = 2, 3, 5, 11
    m = RNG.random(shape) < 0.4
    args = (_f(b, h, sq, 4), _f(b, h, 4, sk), _f(b, h, sk, 9), m)
    _check(args, dict(mask=mode, fill=-1e9))
    _check(args, dict(mask=mode, fill=-np.inf))


def test_inf_and_nan_rows(att):
    """Rows of only -inf, a NaN, a +inf in the scores, NaN in V: the numpy path's NaNs."""
    b, h, sq, sk = 1, 2, 6, 10
    m = np.zeros((sq, sk), np.float32)
    m[1] = -np.inf
    m[2, 3] = np.nan
    m[3, 0] = np.inf
    m[4, :9] = -np.inf          # one entry left: probability 1
    v = _f(b, h, sk, 5)
    got, _ = _check((_f(b, h, sq, 3), _f(b, h, 3, sk), v, m), dict(mask="add"))
    assert np.isnan(got[:, :, 1:4]).all() and not np.isnan(got[:, :, [0, 4, 5]]).any()
    np.testing.assert_allclose(got[0, :, 4], v[0, :, 9], rtol=1e-6)
    q = _f(b, h, sq, 3)
    q[0, 1, 2, 1] = np.nan
    v[0, 0, 4, 2] = np.nan
    _check((q, _f(b, h, 3, sk), v), {})


def test_empty_batch_and_empty_values(att):
    """An empty batch or no values per head: numpy's (empty) answer."""
    for q, k, v in ((_f(0, 2, 3, 4), _f(0, 2, 4, 5), _f(0, 2, 5, 6)),
                    (_f(2, 2, 3, 4), _f(2, 2, 4, 5), _f(2, 2, 5, 0))):
        got = _op(q, k, v, ctx=_ctx())
        want = _numpy(q, k, v)
        assert got.shape == want.shape


def test_thread_split_is_bit_identical(att, monkeypatch):
    """The (batch, head) pairs split over the engine's threads: the same bits as one call."""
    args, kw = _heads(3, 19, 5, 12)
    args = (*args[:3], None, args[3], args[3], args[3], args[4])
    monkeypatch.setenv("WORKBENCH_NUM_THREADS", "1")
    one = _op(*args, ctx=_ctx(), **kw)
    monkeypatch.setattr(linalg, "_ATT_SPLIT_MIN", 1)
    monkeypatch.setenv("WORKBENCH_NUM_THREADS", "2")
    ctx = _ctx()
    for _ in range(3):
        np.testing.assert_array_equal(_op(*args, ctx=ctx, **kw), one)
    assert len(ctx.extra[linalg._ATT_BOUND].blocks) > 2   # the split blocks were used


def test_pieces_over_the_c_workers_are_bit_identical(att, monkeypatch):
    """The (batch, head) pairs cut into pieces run by the C workers (``Pieces``; forced for
    this small call): at 2 and 3 threads, with a mask, the bits of one call at 1 thread; the
    Python pool's split while the C workers are missing, again the same; bound again with
    pieces once they load."""
    from workbench.ops import parallel

    if not compiled.wait(["blas_worker"], timeout=300) or parallel.pieces_entry() is None:
        pytest.skip("blas_worker is not loaded")
    args, kw = _heads(3, 19, 5, 12)
    m = np.where(RNG.random((3, 1, 1, 19)) < 0.2, -1e4, 0).astype(np.float32)
    args = (*args[:3], m, args[3], args[3], args[3], args[4])
    kw = dict(kw, mask="add")
    monkeypatch.setenv("WORKBENCH_NUM_THREADS", "1")
    one = _op(*args, ctx=_ctx(), **kw)
    monkeypatch.setattr(linalg, "_ATT_PIECES_MIN", 1)
    for threads in ("2", "3"):
        monkeypatch.setenv("WORKBENCH_NUM_THREADS", threads)
        ctx = _ctx()
        for _ in range(3):
            np.testing.assert_array_equal(_op(*args, ctx=ctx, **kw), one)
        assert ctx.extra[linalg._ATT_BOUND].pieces is not None
    real = linalg.pieces_entry
    monkeypatch.setattr(linalg, "pieces_entry", lambda: None)
    monkeypatch.setattr(linalg, "_ATT_SPLIT_MIN", 1)
    ctx = _ctx()
    for _ in range(2):
        np.testing.assert_array_equal(_op(*args, ctx=ctx, **kw), one)
    assert ctx.extra[linalg._ATT_BOUND].pieces is None
    monkeypatch.setattr(linalg, "pieces_entry", real)   # loaded later: bound again
    np.testing.assert_array_equal(_op(*args, ctx=ctx, **kw), one)
    assert ctx.extra[linalg._ATT_BOUND].pieces is not None


def test_the_pre_bound_call(att, monkeypatch):
    """Kept across runs with new data (Reshape targets equal but new arrays), made again for
    new shapes, skipped when kernels are turned off; training contexts never use it."""
    args, kw = _heads(2, 9, 3, 8)
    ctx = _ctx()
    _op(*args[:3], None, *args[3:4] * 3, args[4], ctx=ctx, **kw)
    bound = ctx.extra[linalg._ATT_BOUND]
    args2, _ = _heads(2, 9, 3, 8)
    shp = args2[3].copy()
    got = _op(*args2[:3], None, shp, shp.copy(), shp.copy(), args2[4].copy(), ctx=ctx, **kw)
    assert ctx.extra[linalg._ATT_BOUND] is bound
    want = _numpy(*args2[:3], None, shp, shp, shp, args2[4], **kw)
    np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-6)
    args3, _ = _heads(2, 10, 3, 8)
    _check((*args3[:3], None, args3[3], args3[3], args3[3], args3[4]), kw, ctx=ctx)
    assert ctx.extra[linalg._ATT_BOUND] is not bound
    with compiled.disabled():
        np.testing.assert_array_equal(
            _op(*args3[:3], None, *args3[3:4] * 3, args3[4], ctx=ctx, **kw),
            _op(*args3[:3], None, *args3[3:4] * 3, args3[4], **kw))
    train = _ctx(training=True)
    _op(*args3[:3], None, *args3[3:4] * 3, args3[4], ctx=train, **kw)
    assert linalg._ATT_BOUND not in train.extra
    # a mask of another dtype is not the kernel's: the general path (numpy's promotion)
    ctx = _ctx()
    m = np.zeros((2, 1, 1, 10), np.float64)
    for _ in range(2):
        _op(*args3[:3], m, *args3[3:4] * 3, args3[4], ctx=ctx, **dict(kw, mask="add"))
        assert linalg._ATT_BOUND not in ctx.extra and linalg._ATT_SKIP in ctx.extra
    monkeypatch.setattr(linalg, "_attention_bind", None)   # not tried again for these inputs
    _op(*args3[:3], m, *args3[3:4] * 3, args3[4], ctx=ctx, **dict(kw, mask="add"))


def test_falls_back_without_the_module(fresh_home, monkeypatch):
    """No compiler (``CC=nope``) or a CPU without AVX2/FMA: the module is unavailable with a
    one-line reason and FusedAttention runs its numpy path in an inference plan."""
    monkeypatch.setenv("CC", "nope")
    # the numba modules the numpy path asks for are not built into this empty home either
    monkeypatch.setattr(compiled, "_builder", lambda *a, **k: [sys.executable, "-c", "pass"])
    why = compiled.c_unavailable("attention_avx2")
    assert why and "no C compiler" in why and "\n" not in why
    assert compiled.kernel("attention_avx2.attention") is None
    args, kw = _heads(1, 6, 2, 4)
    ctx = _ctx()
    got = _op(*args[:3], None, *args[3:4] * 3, args[4], ctx=ctx, **kw)
    assert linalg._ATT_BOUND not in ctx.extra
    np.testing.assert_allclose(got, _numpy(*args[:3], None, *args[3:4] * 3, args[4], **kw),
                               rtol=2e-5, atol=2e-6)
    monkeypatch.setattr(cache, "cpu_flags", lambda: frozenset({"sse2", "avx"}))
    assert "lacks avx2, fma" in compiled.c_unavailable("attention_avx2")


def test_objects_call_gives_the_same_bits(att, monkeypatch):
    """The pre-bound call hands the arrays' ids to ``gemm_avx2.objects_call`` (C reads their
    data pointers): the same bits as the call that writes the pointers from Python."""
    if not compiled.wait(["gemm_avx2"], timeout=300) \
            or compiled.kernel("gemm_avx2.objects_call") is None:
        pytest.skip("gemm_avx2 is not available")
    args, kw = _heads(1, 32, 4, 16)
    m = np.where(RNG.random((1, 1, 1, 32)) < 0.3, -10000.0, 0.0).astype(np.float32)
    args = (*args[:3], m, args[3], args[3], args[3], args[4])
    kw = dict(kw, mask="add")
    ctx = _ctx()
    by_id = [_op(*args, ctx=ctx, **kw) for _ in range(3)]
    assert ctx.extra[linalg._ATT_BOUND].objects_block is not None
    real = compiled.kernel
    monkeypatch.setattr(compiled, "kernel",
                        lambda name: None if name == "gemm_avx2.objects_call" else real(name))
    ctx2 = _ctx()
    by_ptr = [_op(*args, ctx=ctx2, **kw) for _ in range(3)]
    assert ctx2.extra[linalg._ATT_BOUND].objects_block is None
    for a, b in zip(by_id, by_ptr):
        np.testing.assert_array_equal(a, b)
