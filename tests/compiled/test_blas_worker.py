"""The BLAS worker (``blas_worker``): weight-gradient products queued on a C thread give
numpy's own bits (``ops.parallel.defer_matmul``), complete once settled, and stay inline
wherever they must."""

from __future__ import annotations

import time

import numpy as np
import pytest

from workbench import compiled
from workbench.compiled import cache
from workbench.ops import parallel


@pytest.fixture(scope="module")
def worker():
    why = compiled.c_unavailable("blas_worker")
    if why:
        pytest.skip(why)
    if not compiled.wait(["blas_worker"], timeout=300):
        pytest.skip(f"blas_worker is not available: {compiled.status()['modules']}")
    if parallel._sgemm() is None:
        pytest.skip("numpy's BLAS is not a recognised OpenBLAS: products stay inline")
    assert parallel._worker_calls() is not None   # (its one-time check against numpy)
    return compiled.kernel("blas_worker.stats")


@pytest.fixture
def two(monkeypatch):
    monkeypatch.setenv("WORKBENCH_NUM_THREADS", "2")
    monkeypatch.setenv("WORKBENCH_BLAS_WORKER", "1")
    monkeypatch.setattr(parallel, "_DEFER_MIN", 1)    # small products queue too


def _stats(k):
    out = np.zeros(4, np.int64)
    k(out)
    return out


def _operands(rng, m, k, n):
    """(a, b) pairs in the layouts a backward hands over: X^T (a transposed view), row
    slices and column slices (leading dimensions larger than the width), contiguous."""
    x = rng.standard_normal((k + 3, m + 5)).astype(np.float32)
    g = rng.standard_normal((k + 2, n + 4)).astype(np.float32)
    yield x[:k, :m].T, g[:k, :n]                 # Trans, lda m + 5; NoTrans, ldb n + 4
    yield np.ascontiguousarray(x[:k, :m].T), np.asfortranarray(g[:k, :n])   # NoTrans, Trans
    yield x[1:k + 1, 2:m + 2].T.copy(), g[:k, 1:n + 1].copy()


@pytest.mark.parametrize("m,k,n", [(64, 256, 64), (2, 2, 2), (17, 300, 5), (256, 256, 64)])
def test_queued_products_give_numpys_bits(worker, two, m, k, n):
    rng = np.random.default_rng(m + k + n)
    before = _stats(worker)[2]
    pairs = list(_operands(rng, m, k, n))
    with parallel.one_blas_thread():
        want = [np.matmul(a, b) for a, b in pairs]
        with parallel.deferred_products():
            got = [parallel.defer_matmul(a, b) for a, b in pairs]
            assert all(isinstance(y, np.ndarray) for y in got)
        # leaving the block waited for every product
    for y, w in zip(got, want):
        assert y.shape == w.shape and y.dtype == np.float32 and np.array_equal(y, w)
    assert _stats(worker)[2] == before + len(pairs)


def test_more_jobs_than_the_queue_holds(worker, two):
    rng = np.random.default_rng(1)
    a = rng.standard_normal((40, 33)).astype(np.float32)
    bs = [rng.standard_normal((40, 9)).astype(np.float32) for _ in range(600)]
    with parallel.one_blas_thread(), parallel.deferred_products():
        got = [parallel.defer_matmul(a.T, b) for b in bs]
        parallel.settle()
        assert all(np.array_equal(y, np.matmul(a.T, b)) for y, b in zip(got, bs))
        again = parallel.defer_matmul(a.T, bs[0])     # after settle(): queues afresh
    assert np.array_equal(again, got[0])


def test_an_error_inside_still_waits_for_the_queued_products(worker, two):
    a = np.ones((300, 200), np.float32)
    b = np.ones((300, 150), np.float32)
    y = None
    with pytest.raises(RuntimeError), parallel.one_blas_thread(), \
            parallel.deferred_products():
        y = parallel.defer_matmul(a.T, b)
        raise RuntimeError("in the middle of a backward")
    assert np.array_equal(y, np.full((200, 150), 300, np.float32))
    assert not parallel._DEFER.__dict__.get("keep")


def test_products_stay_inline_where_they_must(worker, monkeypatch):
    a = np.ones((8, 6), np.float32)
    b = np.ones((8, 5), np.float32)
    monkeypatch.setenv("WORKBENCH_NUM_THREADS", "2")
    monkeypatch.delenv("WORKBENCH_BLAS_WORKER", raising=False)
    monkeypatch.setattr(parallel, "_DEFER_MIN", 1)
    with parallel.deferred_products():
        assert parallel.defer_matmul(a.T, b) is None          # off unless asked for
    monkeypatch.setattr(parallel, "_DEFER_MIN", 1 << 18)
    monkeypatch.setenv("WORKBENCH_BLAS_WORKER", "1")
    assert parallel.defer_matmul(a.T, b) is None              # outside deferred_products
    with parallel.deferred_products():
        assert parallel.defer_matmul(a.T, b) is None          # under _DEFER_MIN: inline
        monkeypatch.setattr(parallel, "_DEFER_MIN", 1)
        assert parallel.defer_matmul(a.T.astype(np.float64), b.astype(np.float64)) is None
        assert parallel.defer_matmul(a[:, :1].T, b) is None      # one row: numpy.s vector path
        assert parallel.defer_matmul(a.T[::2, ::2], b[::2]) is None  # numpy copies these
        assert parallel.defer_matmul(a.T, a) is None               # same data: numpy's syrk
        with compiled.disabled():
            assert parallel.defer_matmul(a.T, b) is None
        y = parallel.defer_matmul(a.T, b)
        assert y is not None
    assert np.array_equal(y, np.full((6, 5), 8, np.float32))
    monkeypatch.setenv("WORKBENCH_NUM_THREADS", "1")   # (read when the block begins)
    with parallel.deferred_products():
        assert parallel.defer_matmul(a.T, b) is None               # one engine thread


def test_the_module_needs_no_vector_instructions():
    assert cache.c_spec("blas_worker").REQUIRES == ()


# ------------------------------------------------------------------ pieces (inference splits)
@pytest.fixture(scope="module")
def pieces():
    why = compiled.c_unavailable("blas_worker") or compiled.c_unavailable("gemm_avx2")
    if why:
        pytest.skip(why)
    if not compiled.wait(["blas_worker", "gemm_avx2"], timeout=300):
        pytest.skip(f"kernels not available: {compiled.status()['modules']}")
    entry = parallel.pieces_entry()
    assert entry is not None
    return entry


def _gemm_blocks(a, packed, bias, y, k, m, cuts):
    """gemm_avx2.gemm_block blocks computing rows cuts[i]..cuts[i+1] of y = a @ W + bias."""
    from workbench.ops.linalg import _f64_bits

    dp = compiled.data_pointer
    out = []
    for r0, r1 in zip(cuts[:-1], cuts[1:]):
        out.append(np.array((dp(a), dp(packed[0]), dp(packed[1]), dp(a), dp(y), k, m, r0, r1,
                             0, _f64_bits(-np.inf), _f64_bits(np.inf)), np.int64))
    return out


@pytest.mark.parametrize("rows,n", [(1, 1), (3, 5), (5, 2), (7, 3), (13, 8), (96, 5), (200, 40)])
def test_pieces_run_every_piece_once_with_one_calls_bits(pieces, rows, n):
    """A GEMM cut into n row pieces (pieces smaller than the 6-row tile, one row, more pieces
    than rows: empty ones) run by the caller and the block pool's threads: every row
    written, the bits of one call, whichever thread ran which piece; again right away (the
    pool threads polling) and after a pause (asleep)."""
    from workbench.ops.conv_nhwc import pack_panels
    from workbench.ops.linalg import _kernel_address

    rng = np.random.default_rng(rows)
    k, m = 37, 29
    a = rng.standard_normal((rows, k)).astype(np.float32)
    w = rng.standard_normal((k, m)).astype(np.float32)
    bias = rng.standard_normal(m).astype(np.float32)
    packed = pack_panels(w, bias)
    fn = _kernel_address("gemm_avx2.gemm_block")
    whole = np.full((rows, m), np.nan, np.float32)
    compiled.kernel("gemm_avx2.gemm_block")(_gemm_blocks(a, packed, bias, whole, k, m,
                                                         [0, rows])[0])
    cuts = [rows * i // n for i in range(n + 1)]
    for pause in (0.0, 0.002):
        for _ in range(3):
            y = np.full((rows, m), np.nan, np.float32)
            job = parallel.Pieces(fn, _gemm_blocks(a, packed, bias, y, k, m, cuts), pieces)
            time.sleep(pause)
            job.run()
            np.testing.assert_array_equal(y, whole)
    np.testing.assert_allclose(whole, a @ w + bias, rtol=1e-4, atol=1e-4)


def test_many_one_row_pieces_give_one_calls_bits(pieces):
    """300 one-row pieces (far more than threads: claimed one at a time from the pool's
    counter) write what one call writes."""
    from workbench.ops.conv_nhwc import pack_panels
    from workbench.ops.linalg import _kernel_address

    rng = np.random.default_rng(5)
    rows, k, m = 300, 8, 16
    a = rng.standard_normal((rows, k)).astype(np.float32)
    packed = pack_panels(rng.standard_normal((k, m)).astype(np.float32), None)
    fn = _kernel_address("gemm_avx2.gemm_block")
    y1, y2 = (np.full((rows, m), np.nan, np.float32) for _ in range(2))
    parallel.Pieces(fn, _gemm_blocks(a, packed, None, y1, k, m, list(range(rows + 1))),
                    pieces).run()
    parallel.Pieces(fn, _gemm_blocks(a, packed, None, y2, k, m, [0, rows]), pieces).run()
    np.testing.assert_array_equal(y1, y2)


def test_row_cuts():
    assert parallel.row_cuts(256, 4, 6) == [0, 60, 126, 192, 256]
    assert parallel.row_cuts(7, 4, 6) == [0, 6, 7]          # fewer pieces than asked
    assert parallel.row_cuts(5, 4, 6) == [0, 5]
    assert parallel.row_cuts(12, 2, 6) == [0, 6, 12]
    for rows in (1, 6, 13, 97, 1000):
        for p in (1, 2, 3, 8):
            c = parallel.row_cuts(rows, p, 6)
            assert c[0] == 0 and c[-1] == rows and len(c) - 1 <= p
            assert all(b > a for a, b in zip(c, c[1:]))
            assert all(x % 6 == 0 for x in c[:-1])
