"""Parallel execution helpers shared by the conv, pool and linalg kernel families (no kernels).

- :func:`run_blocks` spreads independent blocks of work over a small thread pool (numpy
  releases the GIL inside its loops); :func:`blocks` cuts (image, channel) blocks that fit in
  cache.
- :func:`parallel_matmul` splits a product over those threads, each calling BLAS on its own
  images or columns while BLAS itself runs single-threaded (:class:`single_threaded_blas`):
  BLAS' own worker threads busy-wait between calls and collapse when the machine has more
  runnable threads than cores.
- :func:`scratch` hands out per-thread reusable workspaces for large temporaries.
- :func:`exact_matmul` is a product whose bits do not depend on the thread count (what a
  training step's products use, see :func:`exact_products`).

The thread count is ``WORKBENCH_NUM_THREADS`` (or ``OMP_NUM_THREADS``) when set, else the
CPUs the process may run on (at most 8). On cupy everything runs as one block on the calling
thread.
"""

from __future__ import annotations

import math
import os
import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np  # host-side checks and dtype constants only

_SCRATCH = threading.local()
_SCRATCH_MAX = 256 << 20


def scratch(xp, shape, dtype, slot="cols"):
    """A reusable per-thread workspace (numpy only) for temporaries such as im2col matrices.

    Large fresh allocations are mapped from the OS on each call and page-faulted on first
    touch, which costs as much as the copy itself; reusing one buffer per ``slot`` avoids
    that. The caller must not return (a view of) the workspace.
    """
    dt = np.dtype(dtype)
    nbytes = int(math.prod(shape)) * dt.itemsize
    if xp is not np or nbytes > _SCRATCH_MAX or nbytes == 0:
        return xp.empty(shape, dtype=dt)
    bufs = getattr(_SCRATCH, "bufs", None)
    if bufs is None:
        bufs = _SCRATCH.bufs = {}
    buf = bufs.get(slot)
    if buf is None or buf.nbytes < nbytes:
        buf = bufs[slot] = xp.empty(nbytes, dtype=xp.uint8)
    return buf[:nbytes].view(dt).reshape(shape)


def parallel_copy(xp, dst, src, axis):
    """``copyto(dst, src)`` split along ``axis`` over the worker threads (numpy)."""
    n = dst.shape[axis]
    pre = (slice(None),) * axis

    def work(chunk):
        for i0, i1 in chunk:
            xp.copyto(dst[pre + (slice(i0, i1),)], src[pre + (slice(i0, i1),)])
    step = max(1, n // (4 * n_workers()))
    run_blocks(xp, [(i, min(n, i + step)) for i in range(0, n, step)], work, dst.size)


def parallel_add(xp, out, a, b, post=None):
    """``out = a + b`` (or a copy of ``a`` when ``b`` is None), split over images (axis 0);
    ``post(out[n0:n1], n0, n1)`` then runs on each piece in the same worker (in cache)."""
    def work(chunk):
        for n0, n1 in chunk:
            if b is None:
                xp.copyto(out[n0:n1], a[n0:n1])
            else:
                xp.add(a[n0:n1], b, out=out[n0:n1])
            if post is not None:
                post(out[n0:n1], n0, n1)
    n = out.shape[0]
    run_blocks(xp, [(i, i + 1) for i in range(n)] if xp is np else [(0, n)], work, out.size)



_BLOCK = 1 << 15  # accumulator elements per block: small enough to stay in L2 across taps


def blocks(xp, N, C, per_channel, block=_BLOCK):
    """(batch slice, channel slice) blocks of about ``block`` elements for tap-by-tap loops.

    On numpy each block's accumulator stays in cache while every kernel tap is added into it;
    on other array modules (cupy) the whole tensor is one block (one launch per tap).
    """
    if xp is not np:
        return [(slice(None), slice(None))]
    per_image = max(1, C * per_channel)
    if per_image <= block:
        nb = max(1, block // per_image)
        return [(slice(n, min(N, n + nb)), slice(None)) for n in range(0, N, nb)]
    cb = max(1, block // max(1, per_channel))
    return [(slice(n, n + 1), slice(c, min(C, c + cb)))
            for n in range(N) for c in range(0, C, cb)]


_PARALLEL_MIN = 1 << 18  # element-ops under which a tap loop stays on the calling thread
_POOL: list = []
_POOL_LOCK = threading.Lock()


def n_workers():
    """Threads for tap loops: ``WORKBENCH_NUM_THREADS`` or ``OMP_NUM_THREADS`` if set, else
    the CPUs this process may run on (at most 8)."""
    for var in ("WORKBENCH_NUM_THREADS", "OMP_NUM_THREADS"):
        v = os.environ.get(var, "").strip()
        if v.isdigit() and int(v) > 0:
            return min(int(v), 64)
    try:
        n = len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        n = os.cpu_count() or 1
    return max(1, min(n, 8))


def call_blocks(kernel, blocks_, work) -> None:
    """``kernel(b)`` for each call block of a compiled C kernel (one int64 array per range of
    rows), split over the engine's threads as :func:`run_blocks` splits jobs; a single block
    is called here, without the pool."""
    if len(blocks_) == 1:
        kernel(blocks_[0])
        return

    def run(chunk):
        for b in chunk:
            kernel(b)
    run_blocks(np, blocks_, run, work)


def run_blocks(xp, jobs, fn, work):
    """Run ``fn(chunk)`` over chunks of ``jobs``, in parallel threads on numpy.

    numpy releases the GIL inside its loops, so independent blocks of work (depthwise conv,
    pooling, im2col copies, per-image GEMMs) use every core. Chunks are pulled from a shared
    queue (a few per thread), so a thread that the OS preempts does not hold the others up.
    ``work`` is the number of element-operations; small jobs stay on the calling thread.
    """
    nw = n_workers()
    if xp is not np or nw == 1 or work < _PARALLEL_MIN or len(jobs) < 2:
        fn(jobs)
        return
    nw = min(nw, len(jobs))
    with _POOL_LOCK:
        if not _POOL or _POOL[0]._max_workers < nw - 1:
            _POOL[:] = [ThreadPoolExecutor(max_workers=nw - 1,
                                           thread_name_prefix="workbench-blocks")]
        pool = _POOL[0]
    step = -(-len(jobs) // min(len(jobs), 4 * nw))
    chunks = iter([jobs[i:i + step] for i in range(0, len(jobs), step)])
    lock = threading.Lock()

    def worker():
        while True:
            with lock:
                chunk = next(chunks, None)
            if chunk is None:
                return
            fn(chunk)
    futures = [pool.submit(worker) for _ in range(nw - 1)]
    try:
        worker()
    finally:
        for f in futures:
            f.result()


_BLAS = {"state": None, "users": 0, "saved": None}
_BLAS_LOCK = threading.Lock()


def blas_controller():
    """The thread-count controllers of the loaded BLAS libraries (threadpoolctl), or None.

    numpy's BLAS is the one that matters; scipy may load a second copy, which is controlled
    alongside (it is idle while our kernels run).
    """
    with _BLAS_LOCK:
        if _BLAS["state"] is None:
            try:
                from threadpoolctl import ThreadpoolController  # noqa: PLC0415

                ctls = [c for c in ThreadpoolController().lib_controllers
                        if c.user_api == "blas"]
            except Exception:  # noqa: BLE001 - optional; any failure means "leave BLAS be"
                ctls = []
            _BLAS["state"] = tuple(ctls)
        return _BLAS["state"] or None


def _thread_accessors(ctl) -> tuple:
    """(get, set) of a BLAS controller's thread count: OpenBLAS' own C functions called
    directly (0.2-0.3 us a call; threadpoolctl's wrappers cost 1-3 us, paid twice per run of
    every plan) when it uses its own threads, threadpoolctl's methods otherwise (an OpenMP
    build, MKL, BLIS: per-thread limits and other rules threadpoolctl knows)."""
    key = id(ctl)
    acc = _ACCESSORS.get(key)
    if acc is None:
        acc = (ctl.get_num_threads, ctl.set_num_threads)
        if getattr(ctl, "internal_api", None) == "openblas" and \
                getattr(ctl, "threading_layer", None) == "pthreads":
            lib = getattr(ctl, "dynlib", None)
            for prefix in ("", "scipy_"):
                for suffix in ("", "64_", "_64"):
                    get = getattr(lib, f"{prefix}openblas_get_num_threads{suffix}", None)
                    put = getattr(lib, f"{prefix}openblas_set_num_threads{suffix}", None)
                    if get is not None and put is not None:
                        acc = (get, put)
                        break
                else:
                    continue
                break
        _ACCESSORS[key] = acc
    return acc


_ACCESSORS: dict = {}


class single_threaded_blas:
    """Context manager: the BLAS libraries run single-threaded inside, restored on exit.

    The GEMM-based kernels split their products over the worker threads themselves (each
    thread calls BLAS on its own images or columns). BLAS' own threads, which busy-wait
    between calls, would compete with them; on a machine with more runnable threads than
    cores they slow everything down several times. Nested and concurrent uses are counted;
    the first entry sets one thread, the last exit restores the previous counts.
    """

    def __init__(self, ctls):
        self.ctls = ctls or ()
        self._acc = tuple(_thread_accessors(c) for c in self.ctls)

    # (straight loops, no comprehensions: every CPU run of a plan passes here twice)
    def __enter__(self):
        if self._acc:
            with _BLAS_LOCK:
                if _BLAS["users"] == 0:
                    saved = []
                    for get, put in self._acc:
                        n = get()
                        saved.append(n)
                        if n != 1:
                            put(1)
                    _BLAS["saved"] = saved
                _BLAS["users"] += 1
        return self

    def __exit__(self, *exc):
        if self._acc:
            with _BLAS_LOCK:
                _BLAS["users"] -= 1
                if _BLAS["users"] == 0:
                    k = 0
                    for n in _BLAS["saved"] or ():
                        if n is not None and n != 1:
                            self._acc[k][1](n)
                        k += 1
        return False


def one_blas_thread() -> single_threaded_blas:
    """A reusable :class:`single_threaded_blas` for the loaded BLAS libraries (made once)."""
    ctx = _BLAS.get("ctx")
    if ctx is None:
        ctx = _BLAS["ctx"] = single_threaded_blas(blas_controller())
    return ctx


_PARALLEL_GEMM_MIN = 1 << 22  # multiply-adds under which a product stays one BLAS call


def parallel_matmul(xp, a, b, out=None, epilogue=None):
    """``matmul(a, b)`` with the work split over the worker threads (numpy).

    The split is over the leading batch axis of the result when it has at least as many
    entries as there are threads (whole-image GEMMs), else over the result's columns. Each
    piece is one single-threaded BLAS call. Elsewhere (cupy, one thread, small products,
    no BLAS controller) this is plain ``matmul``.

    ``epilogue(piece, rows, cols)`` runs right after each piece's product, in the same worker
    while the piece is still in cache: ``piece`` is ``out[rows, ..., cols]`` (``rows`` a
    slice of the leading axis, ``cols`` of the last one).
    """
    full = slice(None)
    nw = n_workers()
    ctl = blas_controller() if xp is np and nw > 1 else None
    if out is None:
        shape = np.broadcast_shapes(a.shape[:-2], b.shape[:-2]) + (a.shape[-2], b.shape[-1])
        out = xp.empty(shape, dtype=np.result_type(a.dtype, b.dtype))
    macs = int(math.prod(out.shape)) * int(a.shape[-1])
    if ctl is None or a.ndim < 2 or b.ndim < 2 or macs < _PARALLEL_GEMM_MIN or out.size == 0:
        xp.matmul(a, b, out=out)
        if epilogue is not None:
            epilogue(out, full, full)
        return out
    nd = out.ndim
    if nd > 2 and out.shape[0] >= nw:
        def part(op, i0, i1):
            return op[i0:i1] if op.ndim == nd and op.shape[0] != 1 else op

        def work(chunk):
            for i0, i1 in chunk:
                xp.matmul(part(a, i0, i1), part(b, i0, i1), out=out[i0:i1])
                if epilogue is not None:
                    epilogue(out[i0:i1], slice(i0, i1), full)
        n = out.shape[0]
    else:
        def work(chunk):
            for i0, i1 in chunk:
                xp.matmul(a, b[..., i0:i1], out=out[..., i0:i1])
                if epilogue is not None:
                    epilogue(out[..., i0:i1], full, slice(i0, i1))
        n = out.shape[-1]
    step = 1 if nd > 2 and out.shape[0] >= nw else max(64, -(-n // (2 * nw)))
    jobs = [(i, min(n, i + step)) for i in range(0, n, step)]
    with single_threaded_blas(ctl):
        run_blocks(xp, jobs, work, 1 << 30)
    return out


# Inside a training step the products must compute the same bits at any thread count (a
# step's losses and weights must not depend on it). Splitting one 2-D product over columns or
# rows does not: OpenBLAS 0.3.31 (AVX2 Zen 3, one BLAS thread) rounds 256x64 @ 64x256 split
# into 64- or 128-column pieces differently from the whole product, and so for every shape
# tried up to 1024^3 and conv-like 64x576 @ 576x3136, whichever axis is split. Stacked
# products split over their leading batch axis do keep their bits (numpy's loop makes the
# same one-matrix BLAS call for each batch entry either way). At a BERT-like step's sizes the
# column split was also slower (256x64 @ 64x256: 101 us as one call, 174 us split over two
# threads), its pieces being too small to pay the pool's hand-off.
_EXACT = [0]


class exact_products:
    """Context manager: MatMul-family products inside give the same bits at any thread count
    (:func:`exact_matmul`). Reentrant (a counter); the training forward and backward enter it.
    """

    __slots__ = ()

    def __enter__(self):
        _EXACT[0] += 1
        return self

    def __exit__(self, *exc):
        _EXACT[0] -= 1
        return False


def exact_products_active() -> bool:
    """Whether the calling code runs inside :class:`exact_products`."""
    return _EXACT[0] > 0


def exact_matmul(xp, a, b, out=None):
    """``matmul(a, b)`` with bits independent of the engine's thread count.

    A 2-D product (or a stack whose leading axis is shorter than the thread count) is one
    BLAS call; a stack of products is split over its leading batch axis only, each piece one
    single-threaded BLAS call per matrix as numpy's own loop makes them, so the pieces round
    as the whole does.
    """
    if xp is np and _BLAS["users"] == 0 and n_workers() > 1:
        ctl = blas_controller()   # BLAS' own threads would change the bits: one thread
        if ctl is not None:
            with single_threaded_blas(ctl):
                return exact_matmul(xp, a, b, out)
    if xp is np and a.ndim > 2 and b.ndim >= 2:
        nd = max(a.ndim, b.ndim)
        if out is None:
            shape = np.broadcast_shapes(a.shape[:-2], b.shape[:-2]) + (a.shape[-2],
                                                                       b.shape[-1])
            out = xp.empty(shape, dtype=np.result_type(a.dtype, b.dtype))
        nw = n_workers()
        ctl = blas_controller() if nw > 1 else None
        if ctl is not None and out.ndim == nd and out.shape[0] >= nw and \
                int(math.prod(out.shape)) * int(a.shape[-1]) >= _PARALLEL_GEMM_MIN:
            return parallel_matmul(xp, a, b, out=out)   # splits over the batch axis only
        xp.matmul(a, b, out=out)
        return out
    if out is None:
        return xp.matmul(a, b)
    xp.matmul(a, b, out=out)
    return out
