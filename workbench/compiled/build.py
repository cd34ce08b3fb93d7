"""The kernel builder: numba compiles each kernel module into one object file (run apart).

Run as ``python -m workbench.compiled.build [modules...]`` (the engine starts it in the
background, niced, when a kernel is first wanted and the cache lacks it; ``workbench warmup``
runs it in the foreground). Only this process imports numba and the kernel modules.

A kernel module (``workbench/compiled/kernels/<module>.py``) writes its kernels as plain
Python functions in numba's nopython subset and marks each with :func:`export`::

    from numba import carray
    from workbench.compiled.build import export

    @export("scale", "f32[] f32[] i64 f32")
    def scale(x, y, n, a):
        X, Y = carray(x, (n,)), carray(y, (n,))
        for i in range(n):
            Y[i] = X[i] * a

Array arguments arrive as pointers (``carray`` views them with the shapes the caller passes);
kernels cannot allocate (no NRT) and never raise (numba's "numpy" error model: an integer
division by zero gives 0, no exception). Loop shapes that should be compile-time constants (a
stride, a kernel size) are written as literals in a thin exported function that calls an
``@njit(inline="always")`` helper: numba inlines it and LLVM's vectoriser then sees the
constant (with the stride as a run-time argument it emits no packed FMAs).

For each export the builder compiles a numba ``cfunc``, takes the optimised LLVM module, adds a
plain C entry point ``wb_<module>_<name>`` that calls numba's function and drops everything
else (the Python error path included), and emits position-independent code for this CPU. The
object and a JSON description go to the cache (:mod:`workbench.compiled.cache`), where
:mod:`workbench.compiled.image` loads them without numba.

A C kernel module (``kernels/<module>.c`` and its ``.py`` description, see
``kernels/gemm_avx2.py``) is compiled by the system C compiler (:func:`cache.compiler`) with
the module's ``CFLAGS`` into a shared library, which the engine loads with ctypes; numba is
not needed for it.
"""

from __future__ import annotations

import argparse
import ctypes
import fcntl
import importlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import traceback

from workbench.compiled import cache
from workbench.compiled.spec import parse
from workbench.files import write_atomic

#: numba's fastmath flags a kernel may use (never nnan/ninf: NaN and Inf keep their meaning)
ALLOWED_FASTMATH = frozenset(("contract", "nsz", "arcp", "reassoc", "afn"))
#: the default: fused multiply-add contraction only
DEFAULT_FASTMATH = frozenset(("contract",))

_EXPORTS: dict = {}   # module -> [(name, pyfunc, spec string, fastmath)]


def export(name: str, args: str, *, fastmath=DEFAULT_FASTMATH, noalias: bool = True):
    """Mark a kernel for the builder: its name within the module and its argument string
    (:mod:`workbench.compiled.spec`). ``fastmath``: a subset of :data:`ALLOWED_FASTMATH`.
    ``noalias`` (the default): the kernel's array arguments never overlap one another (an
    array written in place is one argument), so LLVM may keep loads in registers across
    stores (weights hoisted out of a loop over outputs); callers must honour it."""
    parse(args)
    fm = frozenset(fastmath)
    if not fm <= ALLOWED_FASTMATH:
        raise ValueError(f"kernel {name}: fastmath flags {sorted(fm - ALLOWED_FASTMATH)} are "
                         f"not allowed (NaN and Inf must keep their meaning)")

    def mark(fn):
        module = fn.__module__.rpartition(".")[2]
        _EXPORTS.setdefault(module, []).append((name, fn, args, fm, noalias))
        return fn
    return mark


def symbol(module: str, name: str) -> str:
    return f"wb_{module}_{name}"


def _numba_sig(args: str):
    from numba import types  # noqa: PLC0415

    scal = {"i64": types.int64, "f32": types.float32, "f64": types.float64}
    arr = {"f32": types.float32, "f64": types.float64, "i64": types.int64,
           "i32": types.int32, "u8": types.uint8, "i8": types.int8}
    ts = [scal[c] if kind == "scalar" else types.CPointer(arr[c]) for kind, c in parse(args)]
    return types.void(*ts)


def _target_machine():
    import llvmlite.binding as llvm  # noqa: PLC0415

    target = llvm.Target.from_default_triple()
    return target.create_target_machine(
        cpu=llvm.get_host_cpu_name(), features=llvm.get_host_cpu_features().flatten(),
        opt=3, reloc="pic", codemodel="small")


def _core_name(ir: str, wrapper: str) -> str:
    """The name of numba's native function that the cfunc wrapper ``wrapper`` calls."""
    import llvmlite.binding as llvm  # noqa: PLC0415

    mod = llvm.parse_assembly(ir)
    for block in mod.get_function(wrapper).blocks:
        for ins in block.instructions:
            if ins.opcode == "call":
                callee = list(ins.operands)[-1]
                if callee.value_kind == llvm.ValueKind.function and \
                        not mod.get_function(callee.name).is_declaration:
                    return callee.name
    raise RuntimeError(f"cannot find numba's native function behind {wrapper}")


def _mark_noalias(ir: str, core: str) -> str:
    """``ir`` with ``noalias`` on the pointer parameters of function ``core``."""
    head = "define "
    for line in ir.splitlines():
        if line.startswith(head) and f'@"{core}"(' in line or \
                line.startswith(head) and f"@{core}(" in line:
            i = line.index("(")
            params = line[i + 1:line.rindex(")")]
            new = ", ".join(p if not p.startswith("ptr ") or "noalias" in p
                            else "ptr noalias " + p[4:] for p in params.split(", "))
            return ir.replace(line, line[:i + 1] + new + line[line.rindex(")"):], 1)
    raise RuntimeError(f"cannot find the definition of {core}")


def _entry_module(cf, sym: str, noalias: bool):
    """numba's optimised module of cfunc ``cf`` with a C entry point ``sym`` that calls its
    native function; every other symbol made internal."""
    import llvmlite.binding as llvm  # noqa: PLC0415

    ir = cf.inspect_llvm()
    core_name = _core_name(ir, cf.native_name)
    if noalias:
        ir = _mark_noalias(ir, core_name)
    mod = llvm.parse_assembly(ir)
    core = mod.get_function(core_name)
    params = [str(a.type) for a in core.arguments][2:]  # after (retptr, excinfo)
    formals = ", ".join(f"{t} %a{i}" for i, t in enumerate(params))
    ir = (f'define void @"{sym}"({formals}) {{\n'
          f"entry:\n  %r = alloca ptr\n  %e = alloca ptr\n"
          f'  %s = call i32 @"{core.name}"(ptr %r, ptr %e'
          + "".join(f", {t} %a{i}" for i, t in enumerate(params)) + ")\n  ret void\n}\n"
          f'declare i32 @"{core.name}"(ptr, ptr{"".join(", " + t for t in params)})\n')
    entry = llvm.parse_assembly(ir)
    entry.triple, entry.data_layout = mod.triple, mod.data_layout
    mod.link_in(entry)
    for f in mod.functions:
        if not f.is_declaration and f.name != sym:
            f.linkage = "internal"
    for g in mod.global_variables:
        if not g.is_declaration:
            g.linkage = "internal"
    return mod


def compile_module(module: str, progress=None) -> tuple:
    """(object bytes, exports description) of kernel module ``module``."""
    import llvmlite.binding as llvm  # noqa: PLC0415
    from numba import cfunc  # noqa: PLC0415

    importlib.import_module(f"workbench.compiled.kernels.{module}")
    exports = _EXPORTS.get(module, [])
    if not exports:
        raise RuntimeError(f"kernel module {module} exports no kernel (mark them with "
                           f"@export)")
    linked = None
    described = {}
    for name, fn, args, fm, noalias in exports:
        t0 = time.perf_counter()
        cf = cfunc(_numba_sig(args), nopython=True, error_model="numpy",
                   fastmath=set(fm) if fm else False)(fn)
        sym = symbol(module, name)
        mod = _entry_module(cf, sym, noalias)
        if linked is None:
            linked = mod
        else:
            linked.link_in(mod)
        described[name] = {"symbol": sym, "args": args}
        if progress:
            progress(f"  {module}.{name}: {time.perf_counter() - t0:.1f} s")
    tm = _target_machine()
    pb = llvm.create_pass_builder(tm, llvm.create_pipeline_tuning_options(speed_level=3))
    pb.getModulePassManager().run(linked, pb)  # O3 again: it may use the noalias facts
    pb = llvm.create_pass_builder(tm, llvm.create_pipeline_tuning_options(speed_level=3))
    mpm = llvm.create_new_module_pass_manager()
    mpm.add_global_dead_code_eliminate_pass()
    mpm.add_strip_dead_prototype_pass()
    mpm.run(linked, pb)
    linked.verify()
    obj = tm.emit_object(linked)
    from workbench.compiled import image  # noqa: PLC0415

    if image.supported() is None:  # refuse an object the engine could not load
        image.load(obj)
    return obj, described


def compile_c_module(module: str, progress=None, work_dir: str | None = None) -> tuple:
    """(shared library bytes, exports description) of C kernel module ``module``; the
    compiler writes into a temporary folder inside ``work_dir`` (the cache folder: never
    ``$TMPDIR``, where a builder ended mid-way would leave it behind), else ``$TMPDIR``."""
    spec = cache.c_spec(module)
    cc = cache.compiler()
    if cc is None:
        raise RuntimeError("no C compiler (set CC, or install cc/gcc)")
    src = cache.c_source(module)
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix=_WORK_PREFIX, dir=work_dir) as tmp:
        out = os.path.join(tmp, f"{module}.so")
        cmd = [*cc["command"], *spec.CFLAGS, "-o", out, src]
        proc = subprocess.run(cmd, stdin=subprocess.DEVNULL, capture_output=True, text=True)
        if proc.returncode != 0:
            raise RuntimeError(f"{' '.join(cmd)} failed (status {proc.returncode}): "
                               f"{proc.stderr.strip()[-1500:]}")
        lib = ctypes.CDLL(out)   # refuse a library that lacks an export
        described = {}
        for name, args in spec.EXPORTS.items():
            parse(args)
            sym = symbol(module, name)
            getattr(lib, sym)
            described[name] = {"symbol": sym, "args": args}
        with open(out, "rb") as f:
            data = f.read()
    if progress:
        progress(f"  {module}: {os.path.basename(cc['path'])} {' '.join(spec.CFLAGS)}: "
                 f"{time.perf_counter() - t0:.1f} s")
    return data, described


def _versions(module: str | None = None) -> dict:
    if module is not None and cache.c_source(module) is not None:
        cc = cache.compiler()
        return {"kind": "c", "compiler": cc and cc["path"],
                "cflags": list(cache.c_spec(module).CFLAGS)}
    import llvmlite  # noqa: PLC0415
    import llvmlite.binding as llvm  # noqa: PLC0415
    import numba  # noqa: PLC0415

    return {"numba": numba.__version__, "llvmlite": llvmlite.__version__,
            "cpu": llvm.get_host_cpu_name(),
            "features": llvm.get_host_cpu_features().flatten()}


_WORK_PREFIX = ".wb-cc-"   # the C compiler's temporary folders (in the cache folder)
_STALE_WORK_SECONDS = 3600


def _drop_stale_work(folder: str) -> None:
    """Remove compiler work folders that a builder ended mid-way left in ``folder``."""
    try:
        names = [n for n in os.listdir(folder) if n.startswith(_WORK_PREFIX)]
    except OSError:
        return
    for n in names:
        path = os.path.join(folder, n)
        try:
            if time.time() - os.path.getmtime(path) > _STALE_WORK_SECONDS:
                shutil.rmtree(path, ignore_errors=True)
        except OSError:
            pass


def build(module: str, folder: str | None = None, *, force: bool = False,
          progress=None, create: bool = True) -> dict:
    """Build ``module`` into the cache unless a build of its current sources is there (or
    failed). Returns its metadata (``{"status": "built"|"cached"|"failed"|"gone", ...}``).
    ``create=False``: a cache folder that no longer exists is not made again ("gone": the
    background builder of a process whose private, temporary cache home was removed)."""
    folder = folder or cache.cache_dir()
    if not create and not os.path.isdir(folder):
        return {"module": module, "status": "gone"}
    os.makedirs(folder, exist_ok=True)
    p = cache.paths(module, folder)
    with open(os.path.join(folder, f".{module}.lock"), "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)   # another builder may be on this module
        try:
            if not force:
                meta = cache.fresh_meta(module, folder)
                if meta is not None:
                    return dict(meta, status="cached")
                rec = cache.fresh_failure(module, folder)
                if rec is not None:
                    return dict(rec, status="failed")
            key = cache.source_key(module)
            t0 = time.perf_counter()
            try:
                if cache.c_source(module) is not None:
                    obj, described = compile_c_module(module, progress, work_dir=folder)
                else:
                    obj, described = compile_module(module, progress)
            except Exception as e:  # noqa: BLE001 - recorded, the engine keeps numpy
                rec = {"module": module, "source_key": key, "error": f"{type(e).__name__}: {e}",
                       "traceback": traceback.format_exc()[-4000:], "when": time.time()}
                write_atomic(p["failed"], lambda f: f.write(json.dumps(rec).encode()),
                             overwrite=True)
                return dict(rec, status="failed")
            meta = {"module": module, "source_key": key, "format": cache.FORMAT,
                    "exports": described, "seconds": round(time.perf_counter() - t0, 2),
                    "when": time.time(), **_versions(module)}
            write_atomic(p["object"], lambda f: f.write(obj), overwrite=True)
            write_atomic(p["meta"], lambda f: f.write(json.dumps(meta).encode()),
                         overwrite=True)
            if os.path.exists(p["failed"]):
                os.unlink(p["failed"])
            cache.prune(module, folder)
            return dict(meta, status="built")
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m workbench.compiled.build",
                                 description="compile the engine's kernels into the cache")
    ap.add_argument("modules", nargs="*", help="kernel modules, in this order (default: all)")
    ap.add_argument("--all", action="store_true", help="then every other module too")
    ap.add_argument("--dir", help="cache folder (default: this machine's)")
    ap.add_argument("--force", action="store_true", help="rebuild even if cached")
    ap.add_argument("--nice", type=int, default=0, help="lower this process' priority")
    ap.add_argument("--quiet", action="store_true")
    a = ap.parse_args(argv)
    if a.nice:
        try:
            os.nice(a.nice)
        except OSError:
            pass
    known = cache.module_names()
    mods = list(a.modules) or list(known)
    unknown = [m for m in mods if m not in known]
    if unknown:
        print(f"unknown kernel module(s) {unknown}; known: {known}", file=sys.stderr)
        return 2
    if a.all:
        mods += [m for m in known if m not in mods]
    say = None if a.quiet else (lambda s: print(s, flush=True))
    folder = a.dir or cache.cache_dir()
    os.makedirs(folder, exist_ok=True)
    _drop_stale_work(folder)
    failed = 0
    for m in mods:
        # a folder removed while building (a notebook's temporary WORKBENCH_HOME, deleted
        # when its kernel stopped) is not made again: nothing would ever read it
        try:
            r = build(m, folder, force=a.force, progress=say, create=False)
        except OSError:
            if os.path.isdir(folder):
                raise
            r = {"status": "gone"}   # removed in the middle of this module's build
        if r["status"] == "gone":
            if say:
                say(f"the cache folder {folder} was removed: stopping")
            return 0
        failed += r["status"] == "failed"
        if say:
            if r["status"] == "failed":
                say(f"{m}: FAILED: {r['error']}")
            elif r["status"] == "cached":
                say(f"{m}: up to date ({len(r['exports'])} kernels)")
            else:
                say(f"{m}: built {len(r['exports'])} kernels in {r['seconds']} s")
    return 1 if failed else 0


if __name__ == "__main__":
    # run the imported module's main: kernel modules register into *its* table, not
    # into this __main__ copy's
    from workbench.compiled import build as _self

    sys.exit(_self.main())
