"""Where compiled kernels are cached, and when a cached one is stale.

``<cache home>/compiled/<machine key>/<module>-<source key>.o`` (the object) and ``.json``
(what it exports, which sources it was built from, how long it took); ``.failed.json`` records
a build that failed (not retried until a source changes). The machine key hashes the CPU's model
name and feature flags (``/proc/cpuinfo``), so a home folder shared between machines keeps one
set per CPU; the source key hashes the kernel module's file and the builder's own files, so
editing either rebuilds. Computing both reads a few small files: no numba, no LLVM.

A C kernel module (``kernels/<module>.c`` beside its ``.py`` description, see
``kernels/gemm_avx2.py``) is built by the system C compiler into ``<module>-<key>.so``; its
source key also hashes the C file, the compiler (resolved path, size, modification time) and
the flags, so a new compiler or new flags rebuild it.
"""

from __future__ import annotations

import functools
import hashlib
import importlib
import json
import os
import platform
import shlex
import shutil
import time

from workbench.files import cache_home

#: bumped when the builder's output format or calling convention changes
FORMAT = 1
_HERE = os.path.dirname(os.path.abspath(__file__))
KERNELS_DIR = os.path.join(_HERE, "kernels")
#: the builder's own files: a change to any of them rebuilds every module
_BUILDER_FILES = ("build.py", "spec.py")


def module_names() -> list:
    """The kernel modules (files in ``workbench/compiled/kernels/``), sorted."""
    try:
        names = os.listdir(KERNELS_DIR)
    except OSError:
        return []
    return sorted(n[:-3] for n in names
                  if n.endswith(".py") and not n.startswith("_") and n[:-3].isidentifier())


def _shared_kernel_files() -> list:
    """``kernels/_*.py`` besides ``__init__.py``: data the kernel modules import, sorted."""
    try:
        names = os.listdir(KERNELS_DIR)
    except OSError:
        return []
    return sorted(n for n in names if n.startswith("_") and n.endswith(".py")
                  and n != "__init__.py")


def module_path(module: str) -> str:
    return os.path.join(KERNELS_DIR, module + ".py")


def c_source(module: str) -> str | None:
    """The C source of a C kernel module (``kernels/<module>.c``), or None (a numba one)."""
    p = os.path.join(KERNELS_DIR, module + ".c")
    return p if os.path.isfile(p) else None


def c_spec(module: str):
    """The description (``SOURCE``, ``CFLAGS``, ``REQUIRES``, ``EXPORTS``) of a C kernel
    module: its ``.py`` file, which imports nothing heavy."""
    return importlib.import_module(f"workbench.compiled.kernels.{module}")


@functools.lru_cache(maxsize=4)
def _compiler(cc_env: str | None) -> dict | None:
    words = shlex.split(cc_env) if cc_env else []
    if words:
        exe = shutil.which(words[0])
    else:
        exe = next((e for e in (shutil.which(n) for n in ("cc", "gcc")) if e), None)
        words = [exe] if exe else []
    if not exe:
        return None
    real = os.path.realpath(exe)
    try:
        st = os.stat(real)
    except OSError:
        return None
    return {"command": [exe, *words[1:]], "path": real,
            "id": f"{real}:{st.st_size}:{st.st_mtime_ns}:{' '.join(words[1:])}"}


def compiler() -> dict | None:
    """The system C compiler (``$CC``, else ``cc`` or ``gcc`` on the PATH): ``{"command":
    [...], "path": ..., "id": ...}``, or None when there is none."""
    return _compiler(os.environ.get("CC", "").strip() or None)


@functools.lru_cache(maxsize=1)
def cpu_flags() -> frozenset:
    """The CPU's feature flags as ``/proc/cpuinfo`` lists them (empty when unreadable)."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                if line.split(":", 1)[0].strip() in ("flags", "Features"):
                    return frozenset(line.split(":", 1)[1].split())
    except OSError:
        pass
    return frozenset()


@functools.lru_cache(maxsize=1)
def machine_key() -> str:
    """A short hash of this CPU's model and feature flags (and the machine type)."""
    parts = [platform.machine(), platform.system()]
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            seen = set()
            for line in f:
                key = line.split(":", 1)[0].strip()
                if key in ("model name", "flags", "Features", "CPU implementer", "CPU part") \
                        and key not in seen:
                    seen.add(key)
                    parts.append(line.strip())
    except OSError:
        parts.append(platform.processor())
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:16]


def _file_digest(path: str) -> str:
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def source_key(module: str) -> str:
    """A hash of the module's source, the builder's files and :data:`FORMAT`."""
    h = hashlib.sha256(f"format {FORMAT}\n".encode())
    for name in _BUILDER_FILES:
        h.update(_file_digest(os.path.join(_HERE, name)).encode())
    h.update(_file_digest(module_path(module)).encode())
    for name in _shared_kernel_files():   # constants the kernels import (``kernels/_*.py``)
        h.update(_file_digest(os.path.join(KERNELS_DIR, name)).encode())
    src = c_source(module)
    if src is not None:   # a C module: its source, the compiler and the flags too
        cc = compiler()
        h.update(_file_digest(src).encode())
        h.update(f"{cc['id'] if cc else 'no compiler'}\n".encode())
        h.update(" ".join(c_spec(module).CFLAGS).encode())
    return h.hexdigest()[:32]


def cache_dir(create: bool = True) -> str:
    """The folder of this machine's compiled kernels: ``$WORKBENCH_KERNEL_CACHE/<machine>``
    when that is set (a kernel cache shared by processes whose ``WORKBENCH_HOME`` differs:
    notebooks with a private, temporary home, a classroom's accounts), else
    ``<cache home>/compiled/<machine>``."""
    root = os.environ.get("WORKBENCH_KERNEL_CACHE")
    if root:
        d = os.path.join(os.path.abspath(os.path.expanduser(root)), machine_key())
    else:
        d = os.path.join(cache_home(create=create), "compiled", machine_key())
    if create:
        os.makedirs(d, exist_ok=True)
    return d


def paths(module: str, folder: str | None = None) -> dict:
    """The files of today's build of ``module``: named by its source key, so that builds of
    other versions (another checkout, an older install sharing the cache home) stay beside
    it instead of being rebuilt over one another."""
    folder = folder or cache_dir()
    base = os.path.join(folder, f"{module}-{source_key(module)[:16]}")
    obj = ".so" if c_source(module) is not None else ".o"
    return {"object": base + obj, "meta": base + ".json", "failed": base + ".failed.json"}


#: builds of other versions of a module unused for this long are removed by the builder
STALE_SECONDS = 30 * 24 * 3600


def prune(module: str, folder: str, now: float | None = None) -> list:
    """Remove the files of ``module``'s other versions not modified for
    :data:`STALE_SECONDS`; returns the removed paths."""
    keep = set(paths(module, folder).values())
    now = time.time() if now is None else now
    removed = []
    try:
        names = os.listdir(folder)
    except OSError:
        return removed
    for n in names:
        stem = n.split(".", 1)[0]
        if stem.rpartition("-")[0] != module:
            continue
        f = os.path.join(folder, n)
        try:
            if f not in keep and now - os.path.getmtime(f) > STALE_SECONDS:
                os.unlink(f)
                removed.append(f)
        except OSError:
            pass
    return removed


def read_json(path: str):
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def fresh_meta(module: str, folder: str | None = None):
    """The metadata of a cached build of ``module`` made from today's sources, or None."""
    p = paths(module, folder)
    meta = read_json(p["meta"])
    if not isinstance(meta, dict) or meta.get("source_key") != source_key(module):
        return None
    if not os.path.exists(p["object"]):
        return None
    return meta


def fresh_failure(module: str, folder: str | None = None):
    """The record of a failed build of today's sources, or None."""
    rec = read_json(paths(module, folder)["failed"])
    if isinstance(rec, dict) and rec.get("source_key") == source_key(module):
        return rec
    return None
