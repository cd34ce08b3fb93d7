"""Compiled CPU kernels, never waited for: numpy runs until they are ready.

Kernels are written in numba's subset of Python (``workbench/compiled/kernels/<module>.py``,
see :mod:`workbench.compiled.build`) and compiled, per module, by a builder process into
machine code for this CPU, cached in ``<cache home>/compiled/<machine>/`` (``$WORKBENCH_HOME``
or ``~/.cache/onnx-workbench``). This process loads that code directly
(:mod:`workbench.compiled.image`): it never imports numba or LLVM, so a run costs neither
their memory (~160 MB) nor their import time.

Use in a kernel::

    from workbench import compiled

    k = compiled.kernel("conv_nhwc.dw_k3s1")     # the compiled kernel if ready, else None
    if k is not None and x.dtype == np.float32:
        k(x, w, b, y, ...)                        # arrays and scalars, as its argument string
    else:
        ...                                       # the numpy path (the reference)

The first ``kernel()`` call for a module starts its preparation in a background thread and
returns None at once: the cached object is loaded (milliseconds), or, when there is none, a
builder subprocess (niced) compiles the requested modules and then every other one; each is
loaded as soon as its object appears. Nothing ever blocks a run on a compiler.

Controls: ``WORKBENCH_COMPILED=0`` (or :func:`set_enabled(False)`, :func:`disabled`) keeps
everything on numpy; ``WORKBENCH_COMPILED=wait`` makes the first ``kernel()`` of a module wait
for it (benchmarks); :func:`wait` waits explicitly (tests, benchmarks); :func:`warmup` /
``workbench warmup`` compiles ahead of time; :func:`status` says where each module stands.
Without numba (a dependency on Linux x86-64 only; elsewhere the loader is unsupported anyway)
nothing is built and everything runs on numpy; kernels already in the cache still load.

C kernel modules (``kernels/<module>.c``, e.g. ``gemm_avx2``) are built by the same builder
with the system C compiler into a shared library and loaded with ctypes; they need no numba,
but a C compiler and the CPU flags their description requires (else "unavailable", with the
reason, and numpy runs).
"""

from __future__ import annotations

import contextlib
import ctypes
import importlib.util
import os
import subprocess
import sys
import threading
import time

import numpy as np

from workbench.compiled import cache
from workbench.compiled.image import ImageError, load, supported
from workbench.compiled.spec import ARRAY_DTYPES, parse

__all__ = ["Kernel", "kernel", "wait", "warmup", "status", "enabled", "set_enabled",
           "disabled", "modules", "stop_builds", "cannot_build"]

_CTYPES = {"i64": ctypes.c_int64, "f32": ctypes.c_float, "f64": ctypes.c_double}


#: the offset of the data pointer in a numpy array object, when :data:`data_pointer` reads it
#: there (set by :func:`_data_pointer_reader`'s probe), else None
_DATA_OFFSET: list = [None]


def _data_pointer_reader():
    """A fast ``a -> a.ctypes.data``: the ``data`` field of numpy's array struct sits right
    after the object header (``object.__basicsize__``); read there when a check on a few
    arrays (views with offsets included) agrees with ``ndarray.ctypes``, else the slow way
    (~20x slower: it builds a ctypes object per call)."""
    at = ctypes.c_size_t.from_address
    off = object.__basicsize__
    probe = np.arange(24, dtype=np.float32).reshape(2, 3, 4)
    try:
        if all(at(id(a) + off).value == a.ctypes.data
               for a in (probe, probe[1], probe[:, 1:], np.empty(0), probe.T)):
            _DATA_OFFSET[0] = off
            return lambda a: at(id(a) + off).value
    except (ValueError, OverflowError):  # pragma: no cover - an unusual interpreter
        pass
    return lambda a: a.ctypes.data  # pragma: no cover


data_pointer = _data_pointer_reader()


def data_pointer_offset():
    """The offset of the data pointer in a numpy array object when :data:`data_pointer`
    reads it there (C code given an array object's address, Python's ``id``, reads the same
    field), else None. The probe that chose :data:`data_pointer`'s fast path established it."""
    return _DATA_OFFSET[0]


class Kernel:
    """A loaded kernel: call it with numpy arrays and Python numbers in the order of its
    argument string; arrays are checked (dtype, C-contiguous, writeable where written) before
    their pointers go to the machine code. ``raw`` is the bare ctypes function (pointers as
    integers) for callers that check their arrays themselves. The call releases the GIL."""

    __slots__ = ("name", "args", "raw", "_arrays", "_n")

    def __init__(self, name: str, address: int, args: str):
        spec = parse(args)
        self.name, self.args, self._n = name, args, len(spec)
        types = [_CTYPES[c] if kind == "scalar" else ctypes.c_void_p for kind, c in spec]
        self.raw = ctypes.CFUNCTYPE(None, *types)(address)
        self._arrays = tuple((i, np.dtype(ARRAY_DTYPES[c]), kind == "out")
                             for i, (kind, c) in enumerate(spec) if kind != "scalar")

    def __call__(self, *args):
        if len(args) != self._n:
            raise TypeError(f"compiled kernel {self.name} takes {self._n} arguments "
                            f"({self.args}), got {len(args)}")
        conv = list(args)
        for i, dt, written in self._arrays:
            a = args[i]
            if type(a) is not np.ndarray or a.dtype != dt or not a.flags.c_contiguous \
                    or (written and not a.flags.writeable):
                raise TypeError(
                    f"compiled kernel {self.name}: argument {i} must be a C-contiguous "
                    f"{'writeable ' if written else ''}{dt} array, got "
                    f"{type(a).__name__}{'' if not hasattr(a, 'dtype') else ' ' + str(a.dtype)}")
            conv[i] = data_pointer(a)
        self.raw(*conv)

    def __repr__(self):
        return f"<compiled kernel {self.name}({self.args})>"


# ------------------------------------------------------------------------------ state
_LOCK = threading.RLock()
_DONE = threading.Condition(_LOCK)
_KERNELS: dict = {}   # "module.name" -> Kernel
_STATE: dict = {}     # module -> {"state": ..., "why": ..., ...}
_QUEUE: list = []     # modules requested, not yet handled by the worker
_WORKER: list = []    # the background thread, while it runs
_PROCS: list = []     # builder subprocesses started by this process
_ENABLED: list = []   # [bool] once decided
_WAIT_MODE: list = []


def _env_setting() -> str:
    return os.environ.get("WORKBENCH_COMPILED", "").strip().lower()


def enabled() -> bool:
    """Whether compiled kernels are used at all (``WORKBENCH_COMPILED`` not 0/off/false/no,
    or :func:`set_enabled`)."""
    if not _ENABLED:
        _ENABLED.append(_env_setting() not in ("0", "off", "false", "no"))
        _WAIT_MODE.append(_env_setting() == "wait")
    return _ENABLED[0]


def set_enabled(flag: bool) -> bool:
    """Turn compiled kernels on or off for this process; returns the previous setting.
    Kernels already loaded stay loaded (and are used again once turned back on)."""
    prev = enabled()
    _ENABLED[0] = bool(flag)
    return prev


@contextlib.contextmanager
def disabled():
    """Context manager: numpy only inside (kernels return None)."""
    prev = set_enabled(False)
    try:
        yield
    finally:
        set_enabled(prev)


def modules() -> list:
    """The kernel modules of this version of the engine."""
    return cache.module_names()


def kernel(name: str):
    """The compiled kernel ``"module.name"`` if it is loaded, else None (the caller runs its
    numpy path). The first call for a module starts its preparation in the background."""
    k = _KERNELS.get(name)
    if k is not None:
        return k if (_ENABLED[0] if _ENABLED else enabled()) else None
    if not enabled():
        return None
    module = name.partition(".")[0]
    if module not in _STATE:
        _request(_load_cached([module]))
        if _WAIT_MODE[0]:
            wait([module])
    return _KERNELS.get(name)


def request(modules_) -> None:
    """Start preparing these kernel modules in the background (what a pass that will want
    them calls at prepare time, so that they may be ready by the first run). Those already
    built for this CPU and engine version are loaded at once (milliseconds each)."""
    if enabled():
        _request(_load_cached([m for m in modules_ if m not in _STATE]))


def _load_cached(mods) -> list:
    """Load now, in the calling thread, the modules of ``mods`` whose cached object is fresh
    (a cached module loads in 3-12 ms here), so that a run's first call of a kernel gets it
    and a model's first run computes as its later runs do (no numpy-path first run that
    differs from them in the last bits). What is not cached (or cannot be loaded here) is
    returned for the background worker; nothing ever waits for a compiler."""
    rest = []
    folder = None
    known = set(cache.module_names())
    for m in mods:
        if m in _STATE or m not in known:
            rest.append(m)
            continue
        try:
            if folder is None:
                folder = cache.cache_dir(create=False)
            if cache.c_source(m) is not None and c_unavailable(m):
                rest.append(m)        # the worker records why
                continue
            with _LOCK:
                if m in _STATE:
                    continue
                _STATE[m] = {"state": "loading"}
            if not _load_module(m, folder):
                with _LOCK:
                    if _STATE.get(m, {}).get("state") == "loading":
                        del _STATE[m]
                rest.append(m)
        except OSError:
            with _LOCK:
                if _STATE.get(m, {}).get("state") == "loading":
                    del _STATE[m]
            rest.append(m)
    return rest


def _request(mods) -> None:
    known = set(cache.module_names())
    with _LOCK:
        for m in mods:
            if m in _STATE:
                continue
            if m not in known:
                _STATE[m] = {"state": "failed", "why": f"no kernel module {m!r}"}
                continue
            _STATE[m] = {"state": "queued"}
            _QUEUE.append(m)
        if _QUEUE and not _WORKER:
            t = threading.Thread(target=_work, name="workbench-compiled", daemon=True)
            _WORKER.append(t)
            t.start()
        _DONE.notify_all()


def _set(module: str, state: str, **info) -> None:
    with _LOCK:
        _STATE[module] = {"state": state, **info}
        _DONE.notify_all()


def _load_module(module: str, folder: str) -> bool:
    """Load a fresh cached object of ``module``; True when it is ready."""
    meta = cache.fresh_meta(module, folder)
    if meta is None:
        return False
    p = cache.paths(module, folder)
    try:
        if meta.get("kind") == "c":
            addresses = _load_library(p["object"], meta["exports"])
        else:
            with open(p["object"], "rb") as f:
                addresses = load(f.read())
        loaded = {}
        for name, d in meta["exports"].items():
            if d["symbol"] not in addresses:
                raise ImageError(f"the object lacks {d['symbol']}")
            loaded[f"{module}.{name}"] = Kernel(f"{module}.{name}", addresses[d["symbol"]],
                                                d["args"])
    except (ImageError, OSError, KeyError, TypeError, ValueError) as e:
        _set(module, "failed", why=f"cannot load {p['object']}: {e}")
        return True
    with _LOCK:
        _KERNELS.update(loaded)
    _set(module, "ready", kernels=sorted(loaded), build_seconds=meta.get("seconds"))
    return True


_LIBRARIES: list = []   # C kernel libraries loaded (kept for the life of the process)


def _load_library(path: str, exports: dict) -> dict:
    """``{symbol: address}`` of a C kernel module's shared library (loaded with ctypes)."""
    try:
        lib = ctypes.CDLL(path)
    except OSError as e:
        raise ImageError(str(e)) from None
    _LIBRARIES.append(lib)
    out = {}
    for d in exports.values():
        try:
            out[d["symbol"]] = ctypes.cast(getattr(lib, d["symbol"]), ctypes.c_void_p).value
        except AttributeError:
            pass   # reported as missing by the caller
    return out


def c_unavailable(module: str) -> str | None:
    """Why C kernel module ``module`` cannot be built or used here (one line), or None."""
    why = supported()
    if why:
        return why
    need = [f for f in cache.c_spec(module).REQUIRES if f not in cache.cpu_flags()]
    if need:
        return (f"this CPU lacks {', '.join(need)} (/proc/cpuinfo); the engine runs "
                f"{module}'s work on numpy")
    if cache.compiler() is None:
        cc = os.environ.get("CC", "").strip()
        return (f"no C compiler ({'CC=' + cc + ' not found' if cc else 'cc/gcc not on PATH'}"
                f"); the engine runs {module}'s work on numpy")
    return None


def _why_not(module: str) -> str | None:
    """Why ``module`` cannot be built here, or None."""
    if cache.c_source(module) is not None:
        return c_unavailable(module)
    return can_build()


def can_build() -> str | None:
    """None when this process can start the builder, else why not."""
    why = supported()
    if why:
        return why
    try:
        found = importlib.util.find_spec("numba") is not None
    except (ImportError, ValueError):   # a broken or blocked installation: as absent
        found = False
    if not found:
        return ("numba is not installed (pip install numba, or reinstall onnx-workbench); the "
                "engine runs on numpy")
    return None


def _builder(mods, folder, *, nice=10, quiet=True):
    cmd = [sys.executable, "-m", "workbench.compiled.build", "--dir", folder, "--nice",
           str(nice), *mods]
    if quiet:
        cmd.insert(3, "--quiet")
    return cmd


def _work() -> None:
    """The background worker: load what is cached, build what is not (one builder process
    for everything missing, the requested modules first), load each as it appears."""
    try:
        while True:
            with _LOCK:
                todo, _QUEUE[:] = list(_QUEUE), []
                if not todo:
                    _WORKER.clear()
                    _DONE.notify_all()
                    return
            try:
                folder = cache.cache_dir()
            except OSError as e:
                for m in todo:
                    _set(m, "failed", why=f"no cache folder: {e}")
                continue
            missing = []
            for m in todo:
                if cache.c_source(m) is not None and c_unavailable(m):
                    _set(m, "unavailable", why=c_unavailable(m))   # not even a cached one
                    continue
                if _load_module(m, folder):
                    continue
                rec = cache.fresh_failure(m, folder)
                if rec is not None:
                    _set(m, "failed", why=f"the last build failed: {rec.get('error')}")
                else:
                    missing.append(m)
            if not missing:
                continue
            for m in [m for m in missing if _why_not(m)]:
                _set(m, "unavailable", why=_why_not(m))
                missing.remove(m)
            if not missing:
                continue
            for m in missing:
                _set(m, "building")
            others = [m for m in cache.module_names() if m not in missing
                      and not _why_not(m)]
            cmd = _builder(missing + others, folder)
            try:
                proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL,
                                        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                        start_new_session=True)
            except OSError as e:
                for m in missing:
                    _set(m, "failed", why=f"cannot start the builder: {e}")
                continue
            _PROCS.append(proc)
            pending = list(missing)
            while pending:
                done = proc.poll() is not None
                for m in list(pending):
                    if _load_module(m, folder):
                        pending.remove(m)
                    elif cache.fresh_failure(m, folder) is not None:
                        rec = cache.fresh_failure(m, folder)
                        _set(m, "failed", why=f"build failed: {rec.get('error')}")
                        pending.remove(m)
                if done:
                    err = proc.stderr.read().decode("utf-8", "replace")[-2000:]
                    for m in pending:
                        if _STATE.get(m, {}).get("state") == "building":  # not stopped
                            _set(m, "failed", why=f"the builder ended (status "
                                                  f"{proc.returncode}) without {m}: "
                                                  f"{err.strip()}")
                    break
                time.sleep(0.25)
            # the builder goes on with the other modules: they are picked up when asked for
            # (it exits by itself; never killed here, so that the cache gets filled)
    except Exception as e:  # noqa: BLE001 - never let the worker die silently
        with _LOCK:
            for m, st in _STATE.items():
                if st["state"] in ("queued", "building"):
                    _STATE[m] = {"state": "failed", "why": f"{type(e).__name__}: {e}"}
            _WORKER.clear()
            _DONE.notify_all()


def wait(modules_=None, timeout: float | None = None) -> bool:
    """Block until these kernel modules (default: all) are ready, failed or unavailable (or
    ``timeout`` seconds pass); True when all of them are ready. For tests and benchmarks: a
    normal run never waits."""
    mods = list(modules_) if modules_ is not None else cache.module_names()
    if not enabled():
        return False
    _request(mods)
    end = None if timeout is None else time.monotonic() + timeout
    with _LOCK:
        while True:
            states = [_STATE.get(m, {}).get("state") for m in mods]
            if all(s in ("ready", "failed", "unavailable") for s in states):
                return all(s == "ready" for s in states)
            left = None if end is None else end - time.monotonic()
            if left is not None and left <= 0:
                return False
            _DONE.wait(0.5 if left is None else min(left, 0.5))


def status() -> dict:
    """``{module: {"state": "ready"|"building"|"queued"|"failed"|"unavailable"|"cold"|
    "cached", ...}}`` for every kernel module ("cold": not asked for and not in the cache;
    "cached": in the cache, not loaded yet), plus the cache folder and whether compiled kernels
    are on."""
    out = {}
    try:
        folder = cache.cache_dir(create=False)
    except OSError:
        folder = None
    for m in cache.module_names():
        st = dict(_STATE.get(m, {}))
        if not st and cache.c_source(m) is not None and c_unavailable(m):
            st = {"state": "unavailable", "why": c_unavailable(m)}
        if not st:
            fresh = folder is not None and cache.fresh_meta(m, folder) is not None
            st = {"state": "cached" if fresh else "cold"}
        out[m] = st
    return {"enabled": enabled(), "folder": folder, "modules": out}


def warmup(modules_=None, *, force: bool = False, progress=print) -> dict:
    """Compile the kernel modules (default: all) now, in the foreground, and load them;
    returns ``{"seconds": ..., "modules": {module: build result}}`` (a module that cannot be
    built here: not ok, ``"unavailable": True``, the reason as its error). Raises
    ``RuntimeError`` naming why when none of them can be built here."""
    mods = list(modules_) if modules_ is not None else cache.module_names()
    why = cannot_build(mods)
    if why:
        raise RuntimeError(why)
    folder = cache.cache_dir()
    t0 = time.perf_counter()
    results = {}
    for m in mods:
        if m in cache.module_names() and _why_not(m):
            results[m] = {"ok": False, "seconds": 0.0, "error": _why_not(m),
                          "unavailable": True}
            continue
        cmd = _builder([m], folder, nice=0, quiet=progress is None)
        if force:
            cmd.append("--force")
        t1 = time.perf_counter()
        proc = subprocess.run(cmd, stdin=subprocess.DEVNULL, capture_output=True, text=True)
        for line in proc.stdout.splitlines():
            if progress:
                progress(line)
        meta = cache.fresh_meta(m, folder)
        rec = cache.fresh_failure(m, folder)
        results[m] = {"ok": meta is not None, "seconds": round(time.perf_counter() - t1, 2),
                      "error": None if meta is not None else
                      (rec or {}).get("error") or proc.stderr.strip()[-2000:]}
        if meta is not None:
            with _LOCK:
                _STATE.pop(m, None)
                for k in [k for k in _KERNELS if k.startswith(m + ".")]:
                    del _KERNELS[k]
            _load_module(m, folder)
    return {"seconds": round(time.perf_counter() - t0, 2), "folder": folder,
            "modules": results}


def cannot_build(modules_=None) -> str | None:
    """None when at least one of these modules (default: all) can be built here, else why
    not (the reasons, one per kind)."""
    mods = list(modules_) if modules_ is not None else cache.module_names()
    whys = [_why_not(m) if m in cache.module_names() else None for m in mods]
    if not mods or any(w is None for w in whys):
        return None
    return "; ".join(dict.fromkeys(whys))


def stop_builds(why: str = "stopped") -> list:
    """End the builder processes this process started (tests whose bounded wait ran out: a
    build must not go on competing with them for the CPU); the modules they were building
    become "failed" with ``why`` for this process (their cache is left as it is, so a later
    process builds or loads them). Returns the modules stopped."""
    with _LOCK:
        procs = list(_PROCS)
        _PROCS.clear()
    for p in procs:
        if p.poll() is None:
            p.kill()
            p.wait()
    stopped = []
    with _LOCK:
        for m, st in _STATE.items():
            if st["state"] in ("queued", "building"):
                _STATE[m] = {"state": "failed", "why": why}
                stopped.append(m)
        _QUEUE.clear()
        _DONE.notify_all()
    return stopped


def _forget() -> None:
    """Forget every module's state and loaded kernel (tests: a fresh start with another
    cache folder). Builder processes started here are ended."""
    with _LOCK:
        for p in _PROCS:
            if p.poll() is None:
                p.kill()
                p.wait()
        _PROCS.clear()
        _KERNELS.clear()
        _STATE.clear()
        _QUEUE.clear()
        _ENABLED.clear()
        _WAIT_MODE.clear()
    cache.machine_key.cache_clear()
    w = list(_WORKER)
    for t in w:
        t.join(timeout=30)


def _after_fork_in_child() -> None:
    # the worker thread does not exist in a forked child; loaded kernels (mapped pages) do
    if hasattr(_LOCK, "_at_fork_reinit"):
        _LOCK._at_fork_reinit()
    _WORKER.clear()
    _PROCS.clear()
    for m, st in list(_STATE.items()):
        if st.get("state") in ("queued", "building"):
            del _STATE[m]
    _QUEUE.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)
