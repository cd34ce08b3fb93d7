"""The C block pool (``blas_worker.par``, :class:`workbench.ops.parallel.BlockTask`) and the
inference splits that use it: every block runs once whatever the thread count (1, 2, 3, 8),
two Python threads at once, a forked child, the pool not loaded (the Python pool's fallback);
``gemm_avx2.iconv_block`` on pixel and panel ranges gives ``iconv``'s bits; NhwcConv and
NhwcConvChain give the same bits at 1, 2 and 3 threads, pool on or off."""

from __future__ import annotations

import multiprocessing
import threading

import numpy as np
import pytest

from workbench import compiled
from workbench.ops import conv_nhwc, parallel
from workbench.ops.registry import FUSED_DOMAIN, NodeContext, lookup

RNG = np.random.default_rng(923)
_KEEP: list = []


@pytest.fixture(scope="module")
def pool():
    for m in ("blas_worker", "dwconv_avx2", "gemm_avx2"):
        why = compiled.c_unavailable(m)
        if why:
            pytest.skip(why)
    if not compiled.wait(["blas_worker", "dwconv_avx2", "gemm_avx2"], timeout=300):
        pytest.skip(f"C kernels not available: {compiled.status()['modules']}")
    assert parallel.pool_ready()
    return compiled.kernel("dwconv_avx2.interleave2")


def _interleave_task(k, P, c, cuts):
    """A BlockTask of ``interleave2`` over pixel ranges ``cuts`` (empty ranges included),
    with its inputs and the output it writes."""
    a = RNG.standard_normal((1, 1, P, c)).astype(np.float32)
    b = RNG.standard_normal((1, 1, P, c)).astype(np.float32)
    y = np.full((1, 1, P, 2 * c), np.nan, np.float32)
    dp = compiled.data_pointer
    blocks = [np.array([dp(a), dp(b), dp(y), c, c, c, p0, p1], np.int64)
              for p0, p1 in zip(cuts, cuts[1:])]
    want = np.stack([a, b], -1).reshape(y.shape)
    _KEEP.append((a, b))        # the blocks hold addresses only: keep the inputs alive
    return parallel.BlockTask(k, blocks), y, want


@pytest.mark.parametrize("threads", ["1", "2", "3", "8"])
def test_every_block_runs_once_at_any_thread_count(pool, monkeypatch, threads):
    monkeypatch.setenv("WORKBENCH_NUM_THREADS", threads)
    cuts = [0, 0, 1, 5, 5, 64, 65, 200, 333, 334, 500]      # 10 ranges, 2 of them empty
    task, y, want = _interleave_task(pool, 500, 9, cuts)
    for work in (0, 1 << 30):                                 # one thread / the pool
        y[...] = np.nan
        task(work)
        np.testing.assert_array_equal(y, want)
    out = np.zeros(9, np.int64)     # blocks run by each of 7 pool threads, by callers;
    compiled.kernel("blas_worker.par_stats")(out)             # threads started
    assert out[-1] <= 7 and (threads == "1" or out[:8].sum() > 0)


def test_a_single_block_and_many_blocks(pool, monkeypatch):
    monkeypatch.setenv("WORKBENCH_NUM_THREADS", "2")
    task, y, want = _interleave_task(pool, 7, 3, [0, 7])
    task(1 << 30)
    np.testing.assert_array_equal(y, want)
    cuts = list(range(0, 3001, 3))                            # 1000 blocks
    task, y, want = _interleave_task(pool, 3000, 2, cuts)
    task(1 << 30)
    np.testing.assert_array_equal(y, want)


def test_without_the_pool_the_python_pool_runs_the_blocks(pool, monkeypatch):
    monkeypatch.setenv("WORKBENCH_NUM_THREADS", "2")
    monkeypatch.setattr(parallel, "_pool_call", lambda: None)
    task, y, want = _interleave_task(pool, 300, 5, [0, 50, 120, 300])
    task(1 << 30)
    np.testing.assert_array_equal(y, want)


def test_two_python_threads_at_once(pool, monkeypatch):
    """The pool runs one task at a time: a second thread's task runs on that thread."""
    monkeypatch.setenv("WORKBENCH_NUM_THREADS", "2")
    tasks = [_interleave_task(pool, 400, 16, list(range(0, 401, 25))) for _ in range(2)]
    bad = []

    def run(t, y, want):
        for _ in range(200):
            y[...] = np.nan
            t(1 << 30)
            if not np.array_equal(y, want):
                bad.append(1)
    threads = [threading.Thread(target=run, args=t) for t in tasks]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not bad


def _child(q):
    k = compiled.kernel("dwconv_avx2.interleave2")
    task, y, want = _interleave_task(k, 300, 4, list(range(0, 301, 30)))
    task(1 << 30)
    q.put(bool(np.array_equal(y, want)))


def test_a_forked_child_starts_its_own_pool(pool, monkeypatch):
    monkeypatch.setenv("WORKBENCH_NUM_THREADS", "2")
    task, y, want = _interleave_task(pool, 300, 4, list(range(0, 301, 30)))
    task(1 << 30)                                             # the parent's threads run
    ctx = multiprocessing.get_context("fork")
    q = ctx.Queue()
    p = ctx.Process(target=_child, args=(q,))
    p.start()
    assert q.get(timeout=60)
    p.join(60)
    assert p.exitcode == 0


def _iconv_case(n, h, w, c, m, k, stride):
    x = RNG.standard_normal((n, h, w, c)).astype(np.float32)
    wt = RNG.standard_normal((k, k, c, m)).astype(np.float32)
    b = RNG.standard_normal(m).astype(np.float32)
    return x, wt, b


@pytest.mark.parametrize("case", [(1, 7, 7, 24, 40, 3, 1), (2, 9, 5, 8, 9, 3, 2),
                                  (1, 4, 4, 16, 64, 1, 2), (1, 3, 3, 5, 33, 3, 1)])
def test_iconv_block_ranges_give_iconvs_bits(pool, case):
    """Pixel ranges x panel ranges (16 channels; a tail panel of 8 or fewer, one row, a
    range smaller than a tile) tiling the output: the bits of one ``iconv`` call."""
    n, h, w, c, m, k, s = case
    x, wt, b = _iconv_case(n, h, w, c, m, k, s)
    pad = k // 2
    out = ((h + 2 * pad - k) // s + 1, (w + 2 * pad - k) // s + 1)
    ind = conv_nhwc.indirection(h, w, c, k, k, [s, s], [1, 1], [pad, pad], out)
    wp, bp = conv_nhwc.pack_panels(wt, b)
    zero = np.zeros(c, np.float32)
    rows = n * out[0] * out[1]
    z = RNG.standard_normal((rows, m)).astype(np.float32)
    ref = np.empty((rows, m), np.float32)
    compiled.kernel("gemm_avx2.iconv")(x, ind, zero, wp, bp, z, ref, c, k * k, m,
                                       out[0] * out[1], h * w * c, 0, rows, 1, 0.0, 6.0)
    panels = -(-m // 16)
    dp = compiled.data_pointer
    for rcuts, qcuts in (([0, rows], [0, panels]), ([0, 1, rows], [0, 1, panels]),
                         ([0, rows // 2, rows], list(range(panels + 1)))):
        y = np.full((rows, m), np.nan, np.float32)
        blocks = [np.concatenate([conv_nhwc.call_block(
            [dp(x), dp(ind), dp(zero), dp(wp), dp(bp), dp(z), dp(y)],
            [c, k * k, m, out[0] * out[1], h * w * c, r0, r1, 1], 0.0, 6.0),
            np.array([q0, q1], np.int64)])
            for r0, r1 in zip(rcuts, rcuts[1:]) for q0, q1 in zip(qcuts, qcuts[1:])]
        parallel.BlockTask(compiled.kernel("gemm_avx2.iconv_block"), blocks)(1 << 30)
        np.testing.assert_array_equal(y.view(np.int32), ref.view(np.int32))


def test_iconv_jobs_cover_the_output():
    for rows, m, nw in ((49, 512, 2), (196, 256, 2), (3136, 64, 2), (49, 24, 2), (5, 40, 3),
                        (12544, 64, 1), (49, 512, 4)):
        jobs = conv_nhwc._iconv_jobs(rows, m, nw)
        panels = -(-m // 16)
        cover = np.zeros((rows, panels), int)
        for r0, r1, q0, q1 in jobs:
            cover[r0:r1, q0:q1] += 1
        assert (cover == 1).all(), (rows, m, nw, jobs)
    assert len(conv_nhwc._iconv_jobs(49, 512, 2)) == 2           # panel ranges
    assert conv_nhwc._iconv_jobs(49, 512, 2)[0][:2] == (0, 49)


def test_chain_jobs_weigh_the_expand_halo():
    # batch 1, 7 output rows (MobileNetV2's last blocks): two ranges, not four
    assert conv_nhwc._chain_jobs(1, 7, 7, 160, 960, 160, 7, 7, 1, 1, 2) == [(0, 4), (4, 7)]
    # batch 8: whole images per range, two per thread
    assert len(conv_nhwc._chain_jobs(8, 7, 7, 160, 960, 160, 7, 7, 1, 1, 2)) == 4
    for args in ((1, 14, 14, 0, 232, 232, 7, 7, 2, 1, 3), (3, 5, 5, 8, 16, 8, 5, 5, 1, 1, 2),
                 (1, 112, 112, 16, 96, 24, 56, 56, 2, 1, 4)):
        jobs = conv_nhwc._chain_jobs(*args)
        rows = args[0] * args[6]
        assert jobs[0][0] == 0 and jobs[-1][1] == rows
        assert all(a[1] == b[0] for a, b in zip(jobs, jobs[1:]))
        assert args[-1] <= len(jobs) <= 4 * args[-1]


def _conv(x, wt, b, ctx, pads):
    return lookup("NhwcConv", FUSED_DOMAIN, 1).fn(x, wt, b, activation="Relu", pads=pads,
                                                  ctx=ctx)


def _chain(a, ctx):
    return lookup("NhwcConvChain", FUSED_DOMAIN, 1).fn(
        *a, None, None, ctx=ctx, strides=[1, 1], pads=[1, 1, 1, 1],
        expand_activation="Clip", expand_params=[0.0, 6.0], dw_activation="Clip",
        dw_params=[0.0, 6.0])


def test_layers_have_the_same_bits_at_1_2_3_threads(pool, monkeypatch):
    """A 3x3 layer on a 7x7 map (panel ranges at 2 threads), one on 20x20 (pixel ranges), a
    padded 1x1 (iconv), a 1x1 on 25 rows (its bound call: panel ranges), an inverted-residual
    chain on 7 rows: 1, 2, 3 threads, a node's repeated runs (its kept blocks), the C pool or
    the Python pool: one answer."""
    monkeypatch.setattr(conv_nhwc, "_split_min", lambda: 0)
    convs = [(_iconv_case(1, 7, 7, 32, 96, 3, 1), [1, 1, 1, 1]),
             (_iconv_case(1, 20, 20, 8, 24, 3, 1), [1, 1, 1, 1]),
             (_iconv_case(1, 9, 9, 16, 40, 1, 1), [1, 0, 0, 1]),
             (_iconv_case(1, 5, 5, 16, 72, 1, 1), [0, 0, 0, 0])]   # 1x1: panel ranges
    e = RNG.standard_normal
    chain = (e((1, 7, 7, 8)).astype(np.float32), e((1, 1, 8, 48)).astype(np.float32),
             e(48).astype(np.float32), e((3, 3, 1, 48)).astype(np.float32),
             e(48).astype(np.float32), e((1, 1, 48, 16)).astype(np.float32),
             e(16).astype(np.float32))
    want = None
    for threads in ("1", "2", "3"):
        monkeypatch.setenv("WORKBENCH_NUM_THREADS", threads)
        for python_pool in (False, True):
            with monkeypatch.context() as mp:
                if python_pool:
                    mp.setattr(parallel, "_pool_call", lambda: None)
                ctxs = [NodeContext(f"n{i}", "NhwcConv", 1, 1) for i in range(5)]
                for _ in range(2):
                    got = [_conv(*c[0], ctx, c[1]) for c, ctx in zip(convs, ctxs)]
                    got.append(_chain(chain, ctxs[4]))
                    if want is None:
                        want = got
                    for g, w in zip(got, want):
                        np.testing.assert_array_equal(g.view(np.int32), w.view(np.int32))


@pytest.mark.parametrize("m", [40, 1280, 24 + 16 * 5, 9 + 16 * 4])
def test_gemm_panels_block_gives_gemms_bits(pool, monkeypatch, m):
    """Panel ranges of a 1x1 layer with few rows (a tail panel of <= 8 columns computed with
    the full one before it: the cuts never part them), as the bound call makes them at 2, 3
    and 4 threads: the bits of one ``gemm`` call."""
    rows, c = 13, 24
    a = RNG.standard_normal((rows, c)).astype(np.float32)
    wt = RNG.standard_normal((c, m)).astype(np.float32)
    b = RNG.standard_normal(m).astype(np.float32)
    z = RNG.standard_normal((rows, m)).astype(np.float32)
    wp, bp = conv_nhwc.pack_panels(wt, b)
    ref = np.empty((rows, m), np.float32)
    compiled.kernel("gemm_avx2.gemm")(a, wp, bp, z, ref, c, m, 0, rows, 1, -1.0, 2.0)
    dp = compiled.data_pointer
    panels = -(-m // 16)
    for threads in ("2", "3", "4"):
        monkeypatch.setenv("WORKBENCH_NUM_THREADS", threads)
        cuts = conv_nhwc._panel_cuts(rows, m)
        if cuts is None:
            continue
        assert cuts[0] == 0 and cuts[-1] == panels
        if 0 < m % 16 <= 8:
            assert panels - 1 not in cuts
        y = np.full((rows, m), np.nan, np.float32)
        blocks = [np.concatenate([conv_nhwc.call_block(
            [dp(a), dp(wp), dp(bp), dp(z), dp(y)], [c, m, 0, rows, 1], -1.0, 2.0),
            np.array([q0, q1], np.int64)]) for q0, q1 in zip(cuts, cuts[1:])]
        parallel.BlockTask(compiled.kernel("gemm_avx2.gemm_panels_block"), blocks)(1 << 30)
        np.testing.assert_array_equal(y.view(np.int32), ref.view(np.int32))


@pytest.mark.parametrize("threads", ["1", "2"])
def test_an_iconv_nodes_bound_call_follows_its_inputs(pool, monkeypatch, threads):
    """A 3x3 node bound after its second run (the kept iconv_block pieces, X/Z/Y written per
    call): new input arrays each run, a residual or none, its weights and bias updated in
    place, another input shape; and a 3-channel stem (a padded copy of X: never bound):
    always the answer of a fresh node."""
    monkeypatch.setenv("WORKBENCH_NUM_THREADS", threads)
    monkeypatch.setattr(conv_nhwc, "_split_min", lambda: 0)
    for c, m, has_z in ((16, 40, True), (16, 40, False), (3, 8, False)):
        x, wt, b = _iconv_case(1, 6, 6, c, m, 3, 1)
        ctx = NodeContext("n", "NhwcConv", 1, 1)
        for run in range(6):
            xs = RNG.standard_normal((1, 6 if run < 5 else 4, 6, c)).astype(np.float32)
            z = RNG.standard_normal(xs.shape[:3] + (m,)).astype(np.float32) if has_z \
                else None
            if run == 3:
                wt[0, 0, 0, 0] += 1.0      # an in-place update the node must see
            if run == 4:
                b[-1] -= 1.0
            args = (xs, wt, b, z)
            got = lookup("NhwcConv", FUSED_DOMAIN, 1).fn(*args, activation="Relu",
                                                         pads=[1, 1, 1, 1], ctx=ctx)
            want = lookup("NhwcConv", FUSED_DOMAIN, 1).fn(
                *[None if a is None else a.copy() for a in args], activation="Relu",
                pads=[1, 1, 1, 1], ctx=NodeContext("f", "NhwcConv", 1, 1))
            np.testing.assert_array_equal(got.view(np.int32), want.view(np.int32))
            if run == 2:
                assert (conv_nhwc._BOUND in ctx.extra) == (c >= 8)
