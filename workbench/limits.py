"""Resource limits that protect the user's process from a hostile or broken model.

A model can ask for values of any size (``ConstantOfShape`` of ``[2**40]``, ``Expand`` to 2**44
elements, a ``Split`` into 2**31 outputs) or for loops that never end. Kernels call
:func:`check_alloc` before allocating anything whose size comes from the model, and ``Loop`` /
``Scan`` call :func:`check_iterations`; both raise :class:`~workbench.errors.ResourceError`
naming what was refused and how to raise the limit.

Limits (each settable in code or through the environment):

- memory budget for ONE value: ``set_memory_budget(nbytes)`` or ``WORKBENCH_MEMORY_BUDGET``
  (bytes such as ``8e9``/``8GiB``/``512MB``, or a fraction of RAM such as ``0.5``). Default: half of
  the memory this process can use (physical RAM, lowered by an address-space rlimit or a cgroup
  limit when one is set).
- Loop/Scan iteration ceiling: ``set_max_loop_iterations(n)`` or
  ``WORKBENCH_MAX_LOOP_ITERATIONS``. Default 10**7.
- seconds allowed to ONNX shape inference (run in a helper process):
  ``WORKBENCH_SHAPE_INFERENCE_TIMEOUT``, default 300.
"""

from __future__ import annotations

import contextlib
import math
import os
import re
import threading
import time

from workbench.errors import ResourceError

DEFAULT_BUDGET_FRACTION = 0.5
DEFAULT_MAX_LOOP_ITERATIONS = 10**7

_budget: int | None = None
_max_iters: int | None = None
_local = threading.local()   # temporary, per-thread budgets (constant folding)

_UNITS = {"": 1, "b": 1, "k": 10**3, "kb": 10**3, "m": 10**6, "mb": 10**6, "g": 10**9,
          "gb": 10**9, "t": 10**12, "tb": 10**12, "kib": 2**10, "mib": 2**20, "gib": 2**30,
          "tib": 2**40}


def _physical_memory() -> int:
    try:
        return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    except (ValueError, OSError, AttributeError):  # pragma: no cover - non-POSIX
        return 8 * 2**30


def usable_memory() -> int:
    """Bytes this process may use: physical RAM, lowered by RLIMIT_AS and a cgroup limit."""
    mem = _physical_memory()
    try:
        import resource  # noqa: PLC0415

        soft, _ = resource.getrlimit(resource.RLIMIT_AS)
        if soft not in (resource.RLIM_INFINITY, -1) and soft > 0:
            mem = min(mem, int(soft))
    except (ImportError, ValueError, OSError):  # pragma: no cover - non-POSIX
        pass
    cg = _cgroup_limit()
    if cg is not None and cg < mem:
        mem = cg
    return mem


_CGROUP = {"at": -1.0, "value": None}
_CGROUP_TTL = 1.0  # seconds a read of the cgroup limit is reused (every tensor load asks)


def _cgroup_limit() -> int | None:
    """The cgroup memory limit in bytes (None without one), re-read at most once a second."""
    now = time.monotonic()
    if 0 <= now - _CGROUP["at"] < _CGROUP_TTL:
        return _CGROUP["value"]
    value = None
    for p in ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"):
        try:
            with open(p) as f:
                txt = f.read().strip()
            if txt.isdigit() and int(txt) > 0:
                value = int(txt) if value is None else min(value, int(txt))
        except OSError:
            pass
    _CGROUP["at"], _CGROUP["value"] = now, value
    return value


def parse_size(text: str) -> int:
    """``"8GiB"`` / ``"512MB"`` / ``"8e9"`` -> bytes; ``"0.25"`` (below 1) -> that fraction of
    :func:`usable_memory`."""
    s = str(text).strip().lower().replace("_", "")
    m = re.fullmatch(r"([0-9]*\.?[0-9]+(?:e[0-9]+)?)\s*([a-z]*)", s)
    if not m or m.group(2) not in _UNITS:
        raise ValueError(f"cannot read {text!r} as a memory size: use bytes (8e9), a unit "
                         f"(512MB, 8GiB) or a fraction of RAM below 1 (0.5)")
    value = float(m.group(1))
    if not m.group(2) and value < 1:
        if value <= 0:
            raise ValueError(f"memory budget fraction must be above 0, got {text!r}")
        return int(value * usable_memory())
    return int(value * _UNITS[m.group(2)])


def memory_budget() -> int:
    """Bytes one value may take (see the module docstring)."""
    tmp = getattr(_local, "budget", None)
    if tmp is not None:
        return tmp
    if _budget is not None:
        return _budget
    env = os.environ.get("WORKBENCH_MEMORY_BUDGET")
    if env:
        try:
            return parse_size(env)
        except ValueError as e:
            raise ResourceError(f"WORKBENCH_MEMORY_BUDGET: {e}") from None
    return int(DEFAULT_BUDGET_FRACTION * usable_memory())


def set_memory_budget(nbytes: int | float | str | None) -> None:
    """Set the budget for one value (bytes, a size string, or a fraction of RAM below 1);
    ``None`` restores the default."""
    global _budget
    if nbytes is None:
        _budget = None
    elif isinstance(nbytes, str) or (isinstance(nbytes, float) and nbytes < 1):
        _budget = parse_size(str(nbytes))
    else:
        if nbytes <= 0:
            raise ValueError(f"memory budget must be positive, got {nbytes}")
        _budget = int(nbytes)


@contextlib.contextmanager
def temporary_budget(nbytes: int):
    """Within the block, on this thread only, the budget is at most ``nbytes`` (constant
    folding uses it: a value too big to fold is refused before it is computed)."""
    prev = getattr(_local, "budget", None)
    _local.budget = min(int(nbytes), memory_budget())
    try:
        yield
    finally:
        _local.budget = prev


def max_loop_iterations() -> int:
    if _max_iters is not None:
        return _max_iters
    env = os.environ.get("WORKBENCH_MAX_LOOP_ITERATIONS")
    if env:
        try:
            return int(float(env))
        except ValueError:
            raise ResourceError(f"WORKBENCH_MAX_LOOP_ITERATIONS must be an integer, got "
                                f"{env!r}") from None
    return DEFAULT_MAX_LOOP_ITERATIONS


def set_max_loop_iterations(n: int | None) -> None:
    """Ceiling on Loop/Scan iterations; ``None`` restores the default (10**7)."""
    global _max_iters
    if n is not None and int(n) < 1:
        raise ValueError(f"the iteration ceiling must be at least 1, got {n}")
    _max_iters = None if n is None else int(n)


def shape_inference_timeout() -> float:
    try:
        return float(os.environ.get("WORKBENCH_SHAPE_INFERENCE_TIMEOUT", "300"))
    except ValueError:
        return 300.0


def _fmt_bytes(n: float) -> str:
    for unit, size in (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= size:
            return f"{n / size:,.1f} {unit}"
    return f"{int(n):,} bytes"


def nbytes_of(shape, itemsize: int) -> int:
    """Exact byte count of a value (Python integers: no overflow)."""
    n = 1
    for d in shape:
        n *= max(int(d), 0)
    return n * int(itemsize)


def check_alloc(shape, dtype=None, *, what: str = "the output", itemsize: int | None = None,
                count: int = 1) -> None:
    """Raise ResourceError if ``count`` values of ``shape`` and ``dtype`` exceed the budget.

    ``shape`` may hold negative entries (treated as 0: the kernel reports those itself).
    """
    if itemsize is None:
        import numpy as np  # noqa: PLC0415

        try:
            itemsize = np.dtype(dtype).itemsize if dtype is not None else 8
        except TypeError:
            itemsize = 8
        itemsize = max(itemsize, 1)
    need = nbytes_of(shape, itemsize) * max(int(count), 1)
    budget = memory_budget()
    if need > budget:
        shp = "[" + ", ".join(str(int(d)) for d in shape) + "]"
        n_el = math.prod(max(int(d), 0) for d in shape)
        raise ResourceError(
            f"{what} would have shape {shp} ({n_el:,} elements, {_fmt_bytes(need)}), more "
            f"than the memory budget of {_fmt_bytes(budget)} for one value; refused before "
            f"allocating. If the model really needs it, raise the budget with "
            f"workbench.limits.set_memory_budget(...) or WORKBENCH_MEMORY_BUDGET")


def check_count(n: int, *, what: str, limit: int | None = None) -> None:
    """Refuse a count of things (outputs, splits, repeats) above ``limit`` (default: the
    budget in bytes / 8, i.e. what could not possibly fit)."""
    lim = limit if limit is not None else max(memory_budget() // 8, 1)
    if int(n) > lim:
        raise ResourceError(f"{what}: {int(n):,} is more than the engine allows ({lim:,}); "
                            f"refused before allocating")


def check_iterations(done: int, *, what: str) -> None:
    """Called by Loop/Scan before iteration ``done`` (0-based)."""
    ceiling = max_loop_iterations()
    if done >= ceiling:
        raise ResourceError(
            f"{what} reached the iteration ceiling of {ceiling:,} and was stopped. If the model "
            f"really needs more, raise it with workbench.limits.set_max_loop_iterations(n) or "
            f"WORKBENCH_MAX_LOOP_ITERATIONS")
