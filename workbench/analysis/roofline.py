"""The roofline of this machine: peak FLOP/s and memory bandwidth, measured once and cached.

- **Threads: those our timed runs use.** The engine's CPU runs hold BLAS on one thread and
  split large products over their own worker threads (``ops.parallel.n_workers()``:
  ``WORKBENCH_NUM_THREADS`` / ``OMP_NUM_THREADS``, else the CPUs, at most 8), and
  ``Analysis.profile_ours`` times exactly that; so the peaks are measured the same way by
  default: ``threads`` worker threads, each running single-threaded BLAS on its share
  (``measure_peaks(threads=1)`` for one core, e.g. beside onnxruntime profiled with one
  thread). ``Peaks.threads`` and ``describe()`` say which.
- Peak compute: float32 matrix products (sgemm) at growing sizes (256 ... 2048, where BLAS
  reaches its peak), each split by columns over the threads, the best rate seen.
- Peak bandwidth: a copy of a 128 MiB array (far beyond the caches) split over the threads
  (numpy releases the GIL while copying), counted as STREAM does: bytes read + written.
- The measurement is capped at a few seconds (``budget_s``), never a timed assertion, and is
  cached as JSON in ``$XDG_CACHE_HOME/onnx-workbench/peaks.json`` (``~/.cache/...`` without
  it), keyed by the CPU model, a hash of its flags and the thread count. ``recalibrate=True``
  measures again. On a busy machine the peaks come out low: recalibrate when it is quiet.

A node with arithmetic intensity ``I = flops / bytes`` can reach at most
``min(peak_flops, I x bandwidth)``: it is *memory-bound* below the ridge point
``peak_flops / bandwidth`` and *compute-bound* above it; the least time the machine allows
is ``max(flops / peak_flops, bytes / bandwidth)``. ``% of roof`` is that time over the
measured one. The memory roof is main-memory bandwidth: a node whose operands stay in a
cache can run above it (over 100 % of its roof); so can any node when the peaks were
measured while other work was running.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field

import numpy as np

from workbench.errors import InputError

CACHE_NAME = "peaks.json"
#: the sgemm sizes tried, smallest first (the best rate counts)
GEMM_SIZES = (256, 512, 1024, 2048)
COPY_BYTES = 128 * 1024 * 1024


@dataclass
class Peaks:
    """A machine's roofline: ``flops_per_s`` (float32) and ``bytes_per_s`` (memory)."""

    flops_per_s: float
    bytes_per_s: float
    cpu: str = ""
    threads: int = 1
    source: str = "given"        # "measured", "cache" or "given"
    details: dict = field(default_factory=dict)

    def __post_init__(self):
        if not (self.flops_per_s > 0 and self.bytes_per_s > 0):
            raise InputError(f"peaks must be positive (got {self.flops_per_s} FLOP/s, "
                             f"{self.bytes_per_s} B/s)")

    @property
    def ridge(self) -> float:
        """The arithmetic intensity (FLOP/byte) where the memory roof meets the compute roof."""
        return self.flops_per_s / self.bytes_per_s

    def describe(self) -> str:
        how = self.details.get("threads_how") if isinstance(self.details, dict) else None
        return (f"peak {self.flops_per_s / 1e9:.1f} GFLOP/s (float32 sgemm), "
                f"{self.bytes_per_s / 1e9:.1f} GB/s (copy), ridge at {self.ridge:.1f} FLOP/B; "
                f"{self.cpu or 'this CPU'}, {self.threads} thread(s)"
                + (f" ({how})" if how else "") + f", {self.source}")


@dataclass
class Placement:
    bound: str | None            # "compute", "memory" or None (no work at all)
    roof_flops_per_s: float | None
    time_s: float


def place(flops: float, nbytes: float, peaks: Peaks) -> Placement:
    """Where a node with ``flops`` and ``nbytes`` moved sits under ``peaks``' roofline."""
    if flops <= 0 and nbytes <= 0:
        return Placement(None, None, 0.0)
    t = max(flops / peaks.flops_per_s, nbytes / peaks.bytes_per_s)
    if nbytes <= 0:
        return Placement("compute", peaks.flops_per_s, t)
    intensity = flops / nbytes
    roof = min(peaks.flops_per_s, intensity * peaks.bytes_per_s)
    return Placement("compute" if intensity >= peaks.ridge else "memory", roof, t)


# ---------------------------------------------------------------------------- measuring
def cpu_identity() -> tuple:
    """(CPU model name, sha1 of its flags) from /proc/cpuinfo; platform facts elsewhere."""
    model, flags = "", ""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                key, _, val = line.partition(":")
                key = key.strip()
                if key == "model name" and not model:
                    model = val.strip()
                elif key in ("flags", "Features") and not flags:
                    flags = val.strip()
                if model and flags:
                    break
    except OSError:
        pass
    model = model or platform.processor() or platform.machine()
    return model, hashlib.sha1(" ".join(sorted(flags.split())).encode()).hexdigest()[:12]


def _threads() -> int:
    """The threads our timed runs compute with: the engine's worker threads."""
    from workbench.ops.parallel import n_workers  # noqa: PLC0415

    return int(n_workers())


#: how the peaks' threads run (said in the cache and in ``describe()``)
THREADS_HOW = "BLAS on one thread in each, as the engine's timed runs"


def cache_path() -> str:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "onnx-workbench", CACHE_NAME)


def _key(cpu: str, flags: str, threads: int) -> str:
    return f"{cpu} | flags {flags} | {threads} threads x 1 BLAS thread"


def _split_matmul(pool, threads: int):
    """``matmul(a, b, out=c)`` split by columns over ``threads`` threads of ``pool`` (None:
    one call), each a single-threaded BLAS call (the caller holds BLAS on one thread)."""
    def mm(a, b, c):
        if pool is None:
            np.matmul(a, b, out=c)
            return
        n = b.shape[1]
        cuts = np.linspace(0, n, threads + 1).astype(int)
        list(pool.map(lambda k: np.matmul(a, b[:, cuts[k]:cuts[k + 1]],
                                          out=c[:, cuts[k]:cuts[k + 1]]), range(threads)))
    return mm


def measure_gemm(budget_s: float = 2.0, threads: int | None = None) -> tuple:
    """(best FLOP/s, {size: best FLOP/s}) of float32 matrix products on ``threads`` threads
    (default: the engine's workers), BLAS on one thread in each: rounds over the sizes until
    ``budget_s`` is spent (a size whose product would not fit what is left is skipped), so
    that a quiet moment on a shared machine is likely to be caught."""
    from workbench.ops.parallel import one_blas_thread  # noqa: PLC0415

    threads = max(1, int(threads or _threads()))
    pool = ThreadPoolExecutor(threads) if threads > 1 else None
    try:
        with one_blas_thread():
            return _measure_gemm(budget_s, _split_matmul(pool, threads))
    finally:
        if pool is not None:
            pool.shutdown()


def _measure_gemm(budget_s: float, mm) -> tuple:
    rng = np.random.default_rng(0)
    rates: dict = {}
    t_end = time.perf_counter() + budget_s
    mats: dict = {}
    cost: dict = {}                                  # seconds of one product per size
    while True:
        ran = False
        for n in GEMM_SIZES:
            left = t_end - time.perf_counter()
            if left <= 0:
                break
            if n in cost and cost[n] > left:
                continue
            if n not in mats:
                if mats and max(cost.values()) * (n / max(mats)) ** 3 * 2 > left:
                    continue                         # the first product (plus a warm-up)
                mats[n] = (rng.standard_normal((n, n), dtype=np.float32),
                           rng.standard_normal((n, n), dtype=np.float32),
                           np.empty((n, n), np.float32))
                mm(*mats[n])                                            # warm-up
            a, b, c = mats[n]
            t0 = time.perf_counter()
            mm(a, b, c)
            dt = max(time.perf_counter() - t0, 1e-9)
            cost[n] = min(cost.get(n, dt), dt)
            rates[n] = max(rates.get(n, 0.0), 2.0 * n ** 3 / dt)
            ran = True
        if not ran or time.perf_counter() >= t_end:
            break
    return max(rates.values()), rates


def measure_bandwidth(budget_s: float = 1.0, nbytes: int | None = None,
                      threads: int | None = None) -> tuple:
    """(best bytes/s, {"1 thread": .., "N threads": ..}) of a large array copy
    (``nbytes``: :data:`COPY_BYTES` by default) on up to ``threads`` threads (default: the
    engine's workers)."""
    n = (nbytes or COPY_BYTES) // 4
    src = np.ones(n, np.float32)
    dst = np.empty_like(src)
    np.copyto(dst, src)                              # touch the pages
    threads = max(1, int(threads or _threads()))
    chunks = [slice(int(a), int(b)) for a, b in
              zip(np.linspace(0, n, threads + 1)[:-1], np.linspace(0, n, threads + 1)[1:])]
    rates = {}
    t_end = time.perf_counter() + budget_s

    def one():
        t0 = time.perf_counter()
        np.copyto(dst, src)
        return 2.0 * src.nbytes / max(time.perf_counter() - t0, 1e-9)

    def many(pool):
        t0 = time.perf_counter()
        list(pool.map(lambda s: np.copyto(dst[s], src[s]), chunks))
        return 2.0 * src.nbytes / max(time.perf_counter() - t0, 1e-9)

    rates["1 thread"] = max(one() for _ in range(3))
    if threads > 1:
        with ThreadPoolExecutor(threads) as pool:
            best = 0.0
            for _ in range(5):
                best = max(best, many(pool))
                if time.perf_counter() > t_end:
                    break
            rates[f"{threads} threads"] = best
    return max(rates.values()), rates


def cached_peaks(threads: int | None = None) -> Peaks | None:
    """This machine's :class:`Peaks` from the cache, or None when they were never measured
    here (for this CPU, flags and thread count: by default the engine's workers); measures
    nothing."""
    cpu, flags = cpu_identity()
    threads = max(1, int(threads or _threads()))
    d = _read_cache(cache_path()).get(_key(cpu, flags, threads))
    if d is None:
        return None
    try:
        return Peaks(float(d["flops_per_s"]), float(d["bytes_per_s"]), cpu, threads,
                     "cache", dict(d.get("details", {})))
    except (KeyError, TypeError, ValueError, InputError):
        return None                                  # a damaged entry


def measure_peaks(*, recalibrate: bool = False, budget_s: float = 3.0,
                  cache: bool = True, threads: int | None = None) -> Peaks:
    """This machine's :class:`Peaks` on ``threads`` threads (default: the engine's worker
    threads, what our timed runs use; BLAS on one thread in each), from the cache unless
    ``recalibrate`` (or none is cached for this CPU, flags and thread count); measuring
    takes at most ~``budget_s``."""
    threads = max(1, int(threads or _threads()))
    if cache and not recalibrate:
        p = cached_peaks(threads)
        if p is not None:
            return p
    cpu, flags = cpu_identity()
    key = _key(cpu, flags, threads)
    path = cache_path()
    stored = _read_cache(path) if cache else {}
    f, gemm = measure_gemm(budget_s * 2 / 3, threads)
    b, copy = measure_bandwidth(budget_s / 3, threads=threads)
    details = {"sgemm_flops_per_s": {str(k): v for k, v in gemm.items()},
               "copy_bytes_per_s": copy, "numpy": np.__version__,
               "threads_how": THREADS_HOW if threads == _threads()
               else "BLAS on one thread in each",
               "measured_at": time.strftime("%Y-%m-%d %H:%M:%S")}
    peaks = Peaks(f, b, cpu, threads, "measured", details)
    if cache:
        stored[key] = {"flops_per_s": f, "bytes_per_s": b, "details": details}
        _write_cache(path, stored)
    return peaks


def _read_cache(path: str) -> dict:
    try:
        with open(path, encoding="utf-8") as fh:
            data = json.load(fh)
        return data if isinstance(data, dict) else {}
    except (OSError, ValueError):
        return {}


def _write_cache(path: str, data: dict) -> None:
    """Replace the cache file atomically; a cache that cannot be written is only skipped."""
    from workbench.files import write_atomic  # noqa: PLC0415

    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        write_atomic(path, lambda f: f.write(json.dumps(data, indent=1).encode()),
                     overwrite=True)
    except Exception:  # noqa: BLE001  (OSError, ExportError: caching is optional)
        pass


def peaks_dict(p: Peaks) -> dict:
    return asdict(p)


# ---------------------------------------------------------------------------- the plot
def plot_roofline(analysis, *, peaks: Peaks | None = None, ax=None, top_ops: int = 10,
                  measured: str = "auto"):
    """A log-log roofline (matplotlib): the two roofs of ``peaks`` (the analysis's own after
    :meth:`~workbench.analysis.Analysis.roofline`) and one point per node, coloured by op
    type (the ``top_ops`` op types by FLOPs, the rest as "other"), sized by FLOPs.

    A node's height is its measured rate (FLOPs / time: ours, else onnxruntime's) where a
    time is known and ``measured`` is not "no", else its roof (the best it could do). Nodes
    without FLOPs cannot sit on a log axis and are left out (counted in the title).
    Returns the matplotlib Axes."""
    try:
        import matplotlib.pyplot as plt  # noqa: PLC0415
    except ImportError:
        raise ImportError("plot_roofline needs matplotlib (pip install matplotlib, or the "
                          "'lab' extra)") from None
    peaks = peaks or analysis.peaks
    if peaks is None:
        analysis.roofline()
        peaks = analysis.peaks
    elif analysis.peaks is not peaks:
        analysis.roofline(peaks)
    if ax is None:
        _, ax = plt.subplots(figsize=(7.5, 5))
    rows = [r for r in analysis.records if not r["static"] and r["flops"]
            and r["bytes_read"] is not None and r["bytes_written"] is not None]
    skipped = sum(1 for r in analysis.records if not r["static"]) - len(rows)
    flops_by_op: dict = {}
    for r in rows:
        flops_by_op[r["op"]] = flops_by_op.get(r["op"], 0) + r["flops"]
    top = [op for op, _ in sorted(flops_by_op.items(), key=lambda kv: -kv[1])[:top_ops]]
    used_measured = False
    series: dict = {}
    total = sum(flops_by_op.values()) or 1
    for r in rows:
        moved = r["bytes_read"] + r["bytes_written"]
        x = r["flops"] / moved if moved else peaks.ridge * 10
        t = r["time_ours_ms"] if r["time_ours_ms"] is not None else r["time_ort_ms"]
        if t and measured != "no":
            y = r["flops"] / (t / 1e3)
            used_measured = True
        else:
            y = r["roof_flops_per_s"] or peaks.flops_per_s
        key = r["op"] if r["op"] in top else "other"
        s = series.setdefault(key, ([], [], []))
        s[0].append(x)
        s[1].append(y)
        s[2].append(12 + 300 * r["flops"] / total)
    xs = [x for s in series.values() for x in s[0]] or [peaks.ridge]
    lo, hi = min(min(xs), peaks.ridge) / 4, max(max(xs), peaks.ridge) * 4
    grid = np.geomspace(lo, hi, 200)
    ax.loglog(grid, np.minimum(peaks.flops_per_s, grid * peaks.bytes_per_s), color="black",
              lw=1.5, label=f"roof: {peaks.flops_per_s / 1e9:.0f} GFLOP/s, "
                            f"{peaks.bytes_per_s / 1e9:.0f} GB/s")
    ax.axvline(peaks.ridge, color="grey", ls=":", lw=1)
    for key in top + (["other"] if "other" in series else []):
        if key in series:
            x, y, s = series[key]
            ax.scatter(x, y, s=s, alpha=0.7, label=key, edgecolors="none")
    ax.set_xlabel("arithmetic intensity (FLOP per byte moved)")
    ax.set_ylabel("FLOP/s (" + ("measured" if used_measured else "attainable: on the roof")
                  + ")")
    title = f"Roofline: {analysis.label}"
    if skipped:
        title += f"\n({skipped} node(s) without FLOPs not shown)"
    ax.set_title(title, fontsize=10)
    ax.legend(fontsize=7, loc="lower right")
    ax.grid(True, which="both", alpha=0.2)
    return ax
