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
import time
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


_ENV_BYTES = getattr(os.environ, "_data", None)
if not isinstance(_ENV_BYTES, dict) or not all(type(k) is bytes for k in list(_ENV_BYTES)[:1]):
    _ENV_BYTES = None
_N_WORKERS: list = [None, -1.0, 1]   # [(the two variables' values), time read, the count]


def n_workers():
    """Threads for tap loops: ``WORKBENCH_NUM_THREADS`` or ``OMP_NUM_THREADS`` if set, else
    the CPUs this process may run on (at most 8).

    The answer is remembered for the variables' values and, when it comes from the CPU
    affinity (a system call: ~2.5 us, ~35 calls in a transformer's training step), re-read
    at most once a second."""
    env = _ENV_BYTES
    if env is not None:     # os.environ's own table: the same values without decoding
        key = (env.get(b"WORKBENCH_NUM_THREADS"), env.get(b"OMP_NUM_THREADS"))
    else:                   # pragma: no cover - an interpreter without that table
        key = (os.environ.get("WORKBENCH_NUM_THREADS"), os.environ.get("OMP_NUM_THREADS"))
    memo = _N_WORKERS
    now = time.monotonic()
    if memo[0] == key and now - memo[1] < 1.0:
        return memo[2]
    n = 0
    for v in key:
        v = os.fsdecode(v or b"").strip()
        if v.isdigit() and int(v) > 0:
            n = min(int(v), 64)
            break
    if not n:
        try:
            n = len(os.sched_getaffinity(0))
        except AttributeError:  # pragma: no cover - not Linux
            n = os.cpu_count() or 1
        n = max(1, min(n, 8))
    memo[:] = [key, now, n]
    return n


def call_blocks(kernel, blocks_, work) -> None:
    """``kernel(b)`` for each call block of a compiled C kernel (one int64 array per range of
    rows), split over the engine's threads by the C block pool (:class:`BlockTask`), or as
    :func:`run_blocks` splits jobs while that is not loaded; a single block is called here,
    without a pool."""
    if len(blocks_) == 1:
        kernel(blocks_[0])
        return
    BlockTask(kernel, blocks_)(work)


#: multiply-adds (element-operations) from which a :class:`BlockTask` of several blocks
#: runs over the C block pool: its hand-off costs ~2-5 us when a pool thread is polling
#: (the 200 us after its last block), ~30-60 us to wake it; below this the blocks run one
#: after another on the calling thread (the same bits either way)
POOL_MIN = 1 << 20
_POOL_CALL: list = []   # [raw blas_worker.par] once loaded


def _pool_call():
    """The raw ``blas_worker.par`` entry (the C block pool), or None while it is not loaded
    or compiled kernels are turned off."""
    if _POOL_CALL:
        from workbench import compiled  # noqa: PLC0415
        return _POOL_CALL[0] if compiled.enabled() else None
    from workbench import compiled  # noqa: PLC0415
    k = compiled.kernel("blas_worker.par")
    if k is None:
        return None
    _POOL_CALL.append(k.raw)
    return k.raw


def pool_ready() -> bool:
    """Whether the C block pool is loaded (a split's hand-off then costs microseconds, not
    the ~50-70 us of :func:`run_blocks`' Python pool)."""
    return _pool_call() is not None


class BlockTask:
    """A compiled kernel's call blocks (int64 arrays, one per range of rows: the kernels of
    ``dwconv_avx2``, ``gemm_avx2.gemm_block``, ...) made into one task of the C block pool
    ``blas_worker.par``: calling it runs every block, over up to ``n_workers()`` threads
    (the caller and the pool's C threads, which claim blocks one at a time) when ``work`` is
    at least :data:`POOL_MIN`, else one after another in one C call. Each block is computed
    whole by one thread, so the output is the same whichever thread ran it, at any thread
    count. Without the pool entry (not built yet, kernels turned off) the blocks go to
    :func:`run_blocks`.

    The blocks are referenced by address: the task keeps them alive, and a caller may
    rewrite their contents (array addresses) between calls. Not reentrant for one task; the
    pool runs one task at a time (a second thread's task runs on that thread)."""

    __slots__ = ("kernel", "blocks", "desc", "addr")

    def __init__(self, kernel, blocks_):
        import ctypes  # noqa: PLC0415

        from workbench import compiled  # noqa: PLC0415

        self.kernel = kernel
        self.blocks = list(blocks_)
        n = len(self.blocks)
        dp = compiled.data_pointer
        self.desc = np.empty(3 + n, np.int64)
        self.desc[0] = ctypes.cast(kernel.raw, ctypes.c_void_p).value
        self.desc[1], self.desc[2] = n, 1
        self.desc[3:] = [dp(b) for b in self.blocks]
        self.addr = dp(self.desc)

    def __call__(self, work) -> None:
        par = _pool_call()
        if par is None:
            raw = self.kernel.raw
            dp = self.desc

            def run(chunk):
                for a in chunk:
                    raw(int(a))
            run_blocks(np, list(dp[3:]), run, work)
            return
        self.desc[2] = n_workers() if work >= POOL_MIN else 1
        par(self.addr)


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


def _batch_work(xp, a, b, out, epilogue):
    """A :func:`run_blocks` job function computing ``out[i0:i1] = a[i0:i1] @ b[i0:i1]`` (an
    operand without that leading axis, or with one entry there, broadcast) for each
    ``(i0, i1)`` of its chunk, then ``epilogue(out[i0:i1], slice(i0, i1), full)``: a stack
    split over its leading batch axis, each matrix the call numpy's own loop makes."""
    nd, full = out.ndim, slice(None)

    def part(op, i0, i1):
        return op[i0:i1] if op.ndim == nd and op.shape[0] != 1 else op

    def work(chunk):
        for i0, i1 in chunk:
            xp.matmul(part(a, i0, i1), part(b, i0, i1), out=out[i0:i1])
            if epilogue is not None:
                epilogue(out[i0:i1], slice(i0, i1), full)
    return work


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
        work = _batch_work(xp, a, b, out, epilogue)
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


# fixed_matmul's row pieces are whole multiples of this many rows. OpenBLAS 0.3.31's AVX2
# sgemm (Zen 3) computes a piece of rows of the left operand that starts at a multiple of 12
# exactly as the whole product computes those rows (checked: 9 shapes from 64x100352x147 to
# 4000x64x300, pieces of 12..192 rows; 6-row pieces and every column split differ), so there
# such pieces also keep the bits of one call; 48 is a multiple of the row blocks of the
# other x86 sgemm kernels too. What the contract rests on is only that the pieces depend on
# the shape, not on the thread count.
_ROW_UNIT = 48
_ROW_PIECES = 4     # at most this many row pieces (the work of 2 threads, with some slack)


# Per operand layout: whether one BLAS call computes exactly the bits of fixed_matmul's row
# pieces (sgemm's order of operations depends on the shapes and strides, never on the
# values, so one comparison on random operands of that layout answers for it). Where it
# does, one thread makes one call (the pieces cost it up to ~7 %: 512x4608 @ 4608x392,
# 22.7 ms as one call, 24.2 as four row pieces, one thread, AMD EPYC Zen 3); where not, the
# pieces run at one thread too.
_WHOLE_SAME: dict = {}


def _probe_whole(a, b, out, step, key) -> None:
    """Whether one call gives the row pieces' bits, on random operands of ``a``'s and ``b``'s
    layout (real operands could be degenerate: zeros give equal results in any order); a
    layout that cannot be copied (a sparse view) is taken as "no"."""
    ra, rb = np.empty_like(a), np.empty_like(b)
    same = False
    if ra.strides == a.strides and rb.strides == b.strides:
        rng = np.random.default_rng(0)
        ra[...] = rng.standard_normal(a.shape)
        rb[...] = rng.standard_normal(b.shape)
        whole = np.empty_like(out)
        np.matmul(ra, rb, out=whole)
        pieces = np.empty_like(out)
        for i in range(0, int(out.shape[-2]), step):
            np.matmul(ra[..., i:i + step, :], rb, out=pieces[..., i:i + step, :])
        same = whole.strides == out.strides and bool(np.array_equal(whole, pieces))
    if len(_WHOLE_SAME) >= 4096:
        _WHOLE_SAME.clear()
    _WHOLE_SAME[key] = same


def fixed_matmul(xp, a, b, out=None, epilogue=None):
    """``matmul(a, b)`` split over the worker threads in pieces fixed by the operands' shapes
    alone, so that its bits do not depend on the thread count (a training step's convolution
    products: :func:`parallel_matmul` splits by the number of threads, and a column or row
    piece of an OpenBLAS product may round differently from the whole).

    A stack whose leading axis has more than one entry is split over that axis (each matrix
    one BLAS call, as numpy's own loop makes it: the same bits as one call). A single matrix
    product of at least ``_PARALLEL_GEMM_MIN`` multiply-adds and ``2 * _ROW_UNIT`` rows is
    cut into at most ``_ROW_PIECES`` row pieces of whole ``_ROW_UNIT`` multiples; each piece
    is one single-threaded BLAS call, at one thread as at several (in order on the calling
    thread) — except where one call was seen to compute the pieces' very bits for that layout
    (``_WHOLE_SAME``: checked once per process and layout, on random operands): one thread
    then makes one call. Smaller products are one call. ``epilogue(piece, rows, cols)`` as in
    :func:`parallel_matmul` (row pieces: called once on the whole result, after them).
    """
    if xp is not np or a.ndim < 2 or b.ndim < 2:
        return parallel_matmul(xp, a, b, out=out, epilogue=epilogue)
    full = slice(None)
    if out is None:
        shape = np.broadcast_shapes(a.shape[:-2], b.shape[:-2]) + (a.shape[-2], b.shape[-1])
        out = np.empty(shape, dtype=np.result_type(a.dtype, b.dtype))
    nd = out.ndim
    m = int(out.shape[-2])
    macs = int(math.prod(out.shape)) * int(a.shape[-1])
    with one_blas_thread():     # BLAS' own threads would split (and round) by their count
        if macs < _PARALLEL_GEMM_MIN or out.size == 0 or \
                not (nd > 2 and out.shape[0] > 1) and m < 2 * _ROW_UNIT:
            np.matmul(a, b, out=out)
            if epilogue is not None:
                epilogue(out, full, full)
            return out
        if nd > 2 and out.shape[0] > 1:
            jobs = [(i, i + 1) for i in range(out.shape[0])]
            run_blocks(np, jobs, _batch_work(np, a, b, out, epilogue), 1 << 30)
            return out
        per = -(-m // _ROW_PIECES)
        step = -(-per // _ROW_UNIT) * _ROW_UNIT

        def rows(chunk):
            for i0, i1 in chunk:
                np.matmul(a[..., i0:i1, :], b, out=out[..., i0:i1, :])
        key = (a.shape, b.shape, a.strides, b.strides, out.strides, a.dtype, b.dtype, step)
        same = _WHOLE_SAME.get(key)
        if same and n_workers() == 1:
            np.matmul(a, b, out=out)    # one call: proven to give the pieces' bits
        else:
            run_blocks(np, [(i, min(m, i + step)) for i in range(0, m, step)], rows, 1 << 30)
            if same is None:
                _probe_whole(a, b, out, step, key)
    if epilogue is not None:
        epilogue(out, full, full)
    return out


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


# ------------------------------------------------------------------ products on a BLAS worker
# A training backward's weight-gradient products (X^T @ dY) are needed only by the optimizer
# after the backward: inside deferred_products() they are queued on a C worker thread
# (compiled module blas_worker) that calls OpenBLAS' cblas_sgemm with exactly the arguments
# numpy's matmul passes on the calling thread, so each product has the same bits whichever
# thread runs it and whatever the thread count; the calling thread goes on with the backward.
# A Python thread pool hands over slowly: its worker needs the GIL to start each product and
# to finish it, and the main thread holds the GIL between its numpy calls (row 23u's pool
# version: same bits, slower on the loaded machine).
_DEFER = threading.local()
# multiply-adds under which a product stays inline: queuing costs the calling thread ~13 us
# (64x8 @ 8x64 takes 4 us, 64x256 @ 256x64 37 us on the 2-core AMD EPYC)
_DEFER_MIN = 1 << 18
# the worker polls for jobs during a deferred_products block instead of sleeping between them
_POLL = [True]
_SGEMM: list = []       # [(address, ilp64) or None] once looked up


def worker_wanted() -> bool:
    """Whether :func:`deferred_products` may use the BLAS worker: ``WORKBENCH_BLAS_WORKER``
    set to 1/on/true/yes. Off by default: on the shared 2-core AMD EPYC (load 2-5) the
    BERT-like step measured no faster with it (in-process, alternated: wall min/q25 14.20/15.69
    vs 13.31/14.79 ms without, load 2.2; 11.40/12.45 vs 12.00/12.49 at an idle moment): the
    products it takes (~0.8 ms a step) are small, and on a busy machine the worker waits for a
    core while the backward waits for its products (benchmarks/README.md, row 23z2)."""
    return os.environ.get("WORKBENCH_BLAS_WORKER", "").strip().lower() in ("1", "on", "true",
                                                                           "yes")


def _blas_layout(x):
    """(transpose code, leading dimension) numpy's matmul gives a 2-D float32 operand
    (CblasNoTrans 111 for rows of unit stride, CblasTrans 112 for columns), or None when
    numpy would copy it first."""
    s0, s1 = x.strides
    m, n = x.shape
    if s1 == 4 and s0 % 4 == 0 and n <= s0 // 4 < (1 << 31):
        return 111, s0 // 4
    if s0 == 4 and s1 % 4 == 0 and m <= s1 // 4 < (1 << 31):
        return 112, s1 // 4
    return None


def _sgemm():
    """``(address, ilp64)`` of ``cblas_sgemm`` in the OpenBLAS numpy itself loaded, or None
    (another BLAS, or numpy's library not recognised: the products then stay inline)."""
    if _SGEMM:
        return _SGEMM[0]
    import ctypes  # noqa: PLC0415

    found = None
    for ctl in blas_controller() or ():
        path = str(getattr(ctl, "filepath", "") or "")
        if getattr(ctl, "internal_api", None) != "openblas" or "numpy" not in path:
            continue
        lib = getattr(ctl, "dynlib", None)
        for prefix in ("scipy_", ""):
            for suffix in ("64_", "_64", ""):
                fn = getattr(lib, f"{prefix}cblas_sgemm{suffix}", None)
                if fn is not None:
                    found = (ctypes.cast(fn, ctypes.c_void_p).value, bool(suffix))
                    break
            if found:
                break
        if found:
            break
    _SGEMM.append(found)
    return found


def _worker_calls():
    """``(submit, wait_for)`` raw calls of the loaded ``blas_worker`` module, checked once
    against numpy's own product (same bits, both layouts), or None."""
    from workbench import compiled  # noqa: PLC0415

    sub = compiled.kernel("blas_worker.submit")     # None while kernels are turned off
    if sub is None:
        return None    # or not built yet: asked again at the next product
    w = _BLAS.get("worker")
    if w is not None:
        return w or None
    wait = compiled.kernel("blas_worker.wait_for")
    poll = compiled.kernel("blas_worker.poll")
    if wait is None or poll is None or _sgemm() is None:
        return None
    calls = (sub.raw, wait.raw, poll.raw)
    rng = np.random.default_rng(7)
    a = rng.standard_normal((37, 19)).astype(np.float32)
    b = rng.standard_normal((37, 23)).astype(np.float32)
    ok = True
    with one_blas_thread():
        for x, y in ((a.T, b), (a[:, :17].T, b[:, 1:])):   # Trans (lda 19), NoTrans (ldb 23)
            out = _submit(calls, x, y)
            calls[1](out[1])
            ok = ok and np.array_equal(out[0], np.matmul(x, y))
    _BLAS["worker"] = calls if ok else ()
    return calls if ok else None


def _submit(calls, a, b):
    """Queue ``a @ b`` (2-D float32, layouts numpy hands to BLAS as they are); returns the
    output array and the job's ticket."""
    from workbench.compiled import data_pointer  # noqa: PLC0415

    la, lb = _blas_layout(a), _blas_layout(b)
    m, k = a.shape
    n = b.shape[1]
    out = np.empty((m, n), np.float32)
    addr, ilp64 = _SGEMM[0]
    job = np.array((addr, ilp64, la[0], lb[0], m, n, k, data_pointer(a), la[1],
                    data_pointer(b), lb[1], data_pointer(out), n, 0), np.int64)
    calls[0](data_pointer(job))
    return out, int(job[13])


class deferred_products:
    """Context manager: inside, :func:`defer_matmul` may queue products on the BLAS worker;
    on leaving (also on an error) every product queued inside has finished. Reentrant per
    thread. Enter it inside the one-BLAS-thread region the products need
    (:func:`one_blas_thread`): the worker's calls read OpenBLAS' global thread count."""

    __slots__ = ()

    def __enter__(self):
        st = _DEFER.__dict__
        on = st["on"] = st.get("on", 0) + 1
        if on == 1:   # the worker's calls, or None: looked up once per block
            calls = st["calls"] = _worker_calls() if worker_wanted() and n_workers() > 1 \
                else None
            if calls and _POLL[0]:
                calls[2](1)
                st["polling"] = calls[2]
        return self

    def __exit__(self, *exc):
        st = _DEFER.__dict__
        st["on"] -= 1
        if st["on"] == 0:
            try:
                settle()
            finally:
                poll = st.pop("polling", None)
                if poll is not None:
                    poll(0)
        return False


def settle() -> None:
    """Wait until the products this thread queued have finished (their arrays are then
    complete); a no-op when none is queued."""
    keep = _DEFER.__dict__.get("keep")
    if keep:
        _BLAS["worker"][1](_DEFER.__dict__["last"])
        keep.clear()


def defer_matmul(a, b):
    """``a @ b`` for 2-D float32 numpy arrays queued on the BLAS worker: returns the output
    array, complete only after :func:`settle` (or the end of :func:`deferred_products`);
    nobody may read it, nor write ``a`` or ``b``, before. None where the product is to be
    computed inline: outside :func:`deferred_products`, with one engine thread or without
    ``WORKBENCH_BLAS_WORKER`` (:func:`worker_wanted`; both read when the block began), the
    worker not built, kernels turned off, other dtypes or layouts numpy
    would copy, a dimension under 2 (numpy's vector paths), ``a`` and ``b`` the same data
    (numpy's syrk path), a small product (under ``_DEFER_MIN`` multiply-adds)."""
    from workbench.compiled import data_pointer, enabled  # noqa: PLC0415

    st = _DEFER.__dict__
    calls = st.get("calls") if st.get("on") else None
    if not calls or not enabled() or type(a) is not np.ndarray or type(b) is not np.ndarray \
            or a.dtype != np.float32 or b.dtype != np.float32 or a.ndim != 2 or b.ndim != 2 \
            or min(a.shape) < 2 or b.shape[1] < 2 or a.shape[1] != b.shape[0] \
            or a.shape[0] * a.shape[1] * b.shape[1] < _DEFER_MIN \
            or _blas_layout(a) is None or _blas_layout(b) is None \
            or data_pointer(a) == data_pointer(b):
        return None
    out, job = _submit(calls, a, b)
    keep = st.get("keep")
    if keep is None:
        keep = st["keep"] = []
    keep.append((a, b, out))    # alive (and unchanged: the caller's promise) until settled
    st["last"] = job
    return out


# Pieces of one compiled kernel call over the C block pool (inference products, attention)
# ------------------------------------------------------------------------------------------
def pieces_entry():
    """``(call, address)`` of the loaded C block pool ``blas_worker.par`` (its ctypes call
    and its machine-code address, for a C caller), or None (kernels not built or turned
    off)."""
    raw = _pool_call()
    if raw is None:
        return None
    import ctypes  # noqa: PLC0415

    return raw, ctypes.cast(raw, ctypes.c_void_p).value


def row_cuts(rows: int, pieces: int, unit: int) -> list:
    """``pieces + 1`` row cuts of ``rows`` rows into at most ``pieces`` near-equal ranges of
    whole multiples of ``unit`` rows (the last takes the rest); fewer where the rows do not
    fill them."""
    units = -(-rows // unit)
    pieces = max(1, min(pieces, units))
    cuts = [min(rows, (units * i // pieces) * unit) for i in range(pieces + 1)]
    cuts[-1] = rows
    return cuts


class Pieces:
    """A kernel call cut into pieces, each its own int64 block, run by the C block pool
    ``blas_worker.par`` (as :class:`BlockTask`) on the calling thread and the pool's C
    threads (the engine's thread count at construction, the caller included; no Python, no
    GIL in the pool threads): ``run()`` returns when every piece has run. The blocks and the
    argument array live as long as this object. The caller writes each block's array
    addresses before ``run()``; a kernel whose pieces write disjoint outputs, each in a
    fixed order, gives one call's bits whoever runs which piece. Its callers
    (``ops/linalg.py``) know only ``blocks``, ``run()``, ``runner`` and ``address`` (a C
    caller, ``gemm_avx2.checked_pieces``, calls the function at ``runner`` with the
    descriptor at ``address``)."""

    __slots__ = ("blocks", "arg", "runner", "_call", "_addr")

    def __init__(self, fn_address: int, blocks, entry):
        from workbench.compiled import data_pointer  # noqa: PLC0415

        self.blocks = list(blocks)
        n = len(self.blocks)
        self.arg = np.array([fn_address, n, max(1, n_workers()),
                             *[data_pointer(b) for b in self.blocks]], np.int64)
        self._call, self._addr = entry[0], data_pointer(self.arg)
        self.runner = entry[1]

    @property
    def address(self) -> int:
        """The descriptor's address (``blas_worker.par``'s argument)."""
        return self._addr

    def run(self) -> None:
        self._call(self._addr)
