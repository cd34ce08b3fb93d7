"""The compiled-kernel core: the object loader, the Kernel call checks, the background builder
(a cold cache never blocks), the cache keys, the off switch, failures recorded once."""

from __future__ import annotations

import json
import os
import shutil
import struct
import subprocess
import sys
import time

import numpy as np
import pytest

from workbench import compiled
from workbench.compiled import cache, image
from workbench.compiled.spec import parse

pytestmark = pytest.mark.skipif(image.supported() is not None,
                                reason=str(image.supported()))

numba_missing = pytest.mark.skipif(compiled.can_build() is not None,
                                   reason=str(compiled.can_build()))


def _object(module="conv_nhwc"):
    """The cached object of a kernel module (built by the session fixture when numba is
    there)."""
    if not compiled.wait([module], timeout=900):
        pytest.skip(f"kernel module {module} is not available: {compiled.status()}")
    p = cache.paths(module)
    with open(p["object"], "rb") as f:
        return f.read(), cache.read_json(p["meta"])


# ------------------------------------------------------------------------------ spec
def test_argument_strings():
    assert parse("f32[] f32[]! i64 f32 f64") == (
        ("array", "f32"), ("out", "f32"), ("scalar", "i64"), ("scalar", "f32"),
        ("scalar", "f64"))
    with pytest.raises(ValueError, match="unknown kernel argument type 'f16'"):
        parse("f16")
    with pytest.raises(ValueError, match="'i64\\[\\]\\?'"):
        parse("i64[]?")


# ------------------------------------------------------------------------------ loader
def _emit(ir: str) -> bytes:
    """Position-independent object code of LLVM IR ``ir`` (as the builder emits it)."""
    llvm = pytest.importorskip("llvmlite.binding")
    llvm.initialize_native_target()
    llvm.initialize_native_asmprinter()
    tm = llvm.Target.from_default_triple().create_target_machine(reloc="pic",
                                                                 codemodel="small")
    return tm.emit_object(llvm.parse_assembly(ir))


def test_loader_refuses_what_it_cannot_load():
    with pytest.raises(image.ImageError, match="not an ELF"):
        image.load(b"hello world" * 10)
    obj, _ = _object()
    bad = bytearray(obj)
    struct.pack_into("<H", bad, 18, 183)  # e_machine: aarch64
    with pytest.raises(image.ImageError, match="not an x86-64 relocatable"):
        image.load(bytes(bad))
    with pytest.raises(image.ImageError, match="truncated|past the end"):
        image.load(obj[:len(obj) // 2])


@numba_missing
def test_loader_refuses_calls_outside_the_c_library():
    ir = """
    declare i32 @system(ptr)
    @cmd = internal constant [3 x i8] c"ls\\00"
    define void @wb_t_bad() {
      %r = call i32 @system(ptr @cmd)
      ret void
    }
    """
    with pytest.raises(image.ImageError, match="calls 'system'"):
        image.load(_emit(ir))


@numba_missing
def test_loader_links_c_library_calls_and_data():
    """An object calling expf and reading a constant table: stubs and PC-relative data."""
    ir = """
    declare float @expf(float)
    @tab = internal constant [4 x float] [float 1.0, float 2.0, float 3.0, float 4.0]
    define void @wb_t_exp(ptr %x, ptr %y, i64 %n) {
    entry:
      br label %loop
    loop:
      %i = phi i64 [0, %entry], [%j, %loop]
      %px = getelementptr float, ptr %x, i64 %i
      %v = load float, ptr %px
      %e = call float @expf(float %v)
      %k = and i64 %i, 3
      %pt = getelementptr [4 x float], ptr @tab, i64 0, i64 %k
      %t = load float, ptr %pt
      %r = fmul float %e, %t
      %py = getelementptr float, ptr %y, i64 %i
      store float %r, ptr %py
      %j = add i64 %i, 1
      %c = icmp slt i64 %j, %n
      br i1 %c, label %loop, label %done
    done:
      ret void
    }
    """
    exports = image.load(_emit(ir))
    k = compiled.Kernel("t.exp", exports["wb_t_exp"], "f32[] f32[]! i64")
    x = np.linspace(-2, 2, 11, dtype=np.float32)
    y = np.empty_like(x)
    k(x, y, x.size)
    np.testing.assert_allclose(y, np.exp(x) * np.tile([1, 2, 3, 4], 3)[:11], rtol=1e-6)


# ------------------------------------------------------------------------------ Kernel
def test_kernel_checks_its_arguments():
    obj, meta = _object()
    addresses = image.load(obj)
    d = meta["exports"]["bias_act"]
    k = compiled.Kernel("conv_nhwc.bias_act", addresses[d["symbol"]], d["args"])
    y = np.arange(12, dtype=np.float32).reshape(3, 4) - 5
    b = np.ones(4, np.float32)
    k(y, b, b, 3, 4, 1, 0, 0, -np.inf, np.inf)
    np.testing.assert_array_equal(y, np.arange(12).reshape(3, 4) - 4)
    with pytest.raises(TypeError, match="takes 10 arguments"):
        k(y, b)
    with pytest.raises(TypeError, match="argument 0 must be a C-contiguous writeable float32"):
        k(y.astype(np.float64), b, b, 3, 4, 1, 0, 0, 0.0, 1.0)
    with pytest.raises(TypeError, match="argument 0 must be a C-contiguous"):
        k(y.T, b, b, 3, 4, 1, 0, 0, 0.0, 1.0)
    ro = y.copy()
    ro.flags.writeable = False
    with pytest.raises(TypeError, match="writeable"):
        k(ro, b, b, 3, 4, 1, 0, 0, 0.0, 1.0)
    with pytest.raises(TypeError, match="argument 1 must be"):
        k(y, [1.0, 1.0, 1.0, 1.0], b, 3, 4, 1, 0, 0, 0.0, 1.0)


def test_data_pointer_reads_views():
    a = np.arange(60, dtype=np.float32).reshape(3, 4, 5)
    for v in (a, a[1], a[:, 2:], a[..., 1:], a.T, a[::2]):
        assert compiled.data_pointer(v) == v.ctypes.data


# ------------------------------------------------------------------------------ state
def test_off_switch(fresh_home, monkeypatch):
    monkeypatch.setenv("WORKBENCH_COMPILED", "0")
    compiled._forget()
    assert compiled.kernel("conv_nhwc.dw_k3s1") is None
    assert not compiled.enabled()
    assert compiled.status()["modules"]["conv_nhwc"]["state"] == "cold"
    assert not compiled._WORKER  # nothing started
    assert compiled.wait(["conv_nhwc"]) is False


def test_disabled_context_hides_loaded_kernels():
    if not compiled.wait(["conv_nhwc"], timeout=900):
        pytest.skip("conv_nhwc not available")
    assert compiled.kernel("conv_nhwc.dw_k3s1") is not None
    with compiled.disabled():
        assert compiled.kernel("conv_nhwc.dw_k3s1") is None
    assert compiled.kernel("conv_nhwc.dw_k3s1") is not None


def test_unknown_module_is_a_failure_not_a_hang(fresh_home):
    assert compiled.kernel("no_such_module.k") is None
    assert compiled.wait(["no_such_module"], timeout=5) is False
    assert "no kernel module" in compiled.status()["modules"].get(
        "no_such_module", compiled._STATE["no_such_module"])["why"]


def test_without_numba_everything_stays_on_numpy(fresh_home, monkeypatch):
    monkeypatch.setattr(compiled, "can_build", lambda: "numba is not installed (test)")
    assert compiled.kernel("conv_nhwc.dw_k3s1") is None
    assert compiled.wait(["conv_nhwc"], timeout=30) is False
    st = compiled.status()["modules"]["conv_nhwc"]
    assert st["state"] == "unavailable" and "numba is not installed" in st["why"]


@numba_missing
def test_cold_cache_never_blocks(fresh_home):
    """The first request in an empty cache returns None at once and starts one builder
    process in the background (ended by the fixture: the full build from a cold cache is what
    the session's own wait does on a clean machine, see tests/conftest.py)."""
    t0 = time.perf_counter()
    assert compiled.kernel("conv_nhwc.dw_k3s1") is None
    assert time.perf_counter() - t0 < 1.0
    assert compiled.kernel("conv_nhwc.bias_act") is None   # asked again: still no wait
    deadline = time.monotonic() + 60
    while not compiled._PROCS and time.monotonic() < deadline:
        time.sleep(0.05)
    assert len(compiled._PROCS) == 1, compiled.status()
    assert compiled.status()["modules"]["conv_nhwc"]["state"] == "building"
    assert compiled.wait(["conv_nhwc"], timeout=0.5) is False   # a bounded wait returns
    assert "conv_nhwc" in compiled.stop_builds("test")
    assert not compiled._PROCS
    st = compiled.status()["modules"]["conv_nhwc"]
    assert st["state"] == "failed" and st["why"] == "test"


def test_session_kernels_are_ready_where_numba_is_installed():
    """On a machine that can build, the session's wait ends with every module ready (a
    failed build fails here, saying why); skipped when the session runs on numpy."""
    if not compiled.enabled():
        pytest.skip("compiled kernels are off in this session (WORKBENCH_COMPILED=0, or the "
                    "session's wait for the build ran out: see the summary line)")
    if compiled.can_build() is not None and not all(
            cache.fresh_meta(m) is not None for m in compiled.modules()):
        pytest.skip(compiled.can_build())
    st = compiled.status()["modules"]
    bad = {m: s for m, s in st.items() if s["state"] != "ready"
           and not (cache.c_source(m) and compiled.c_unavailable(m))}  # no cc, no AVX2/FMA
    assert not bad, f"compiled kernel modules not ready: {bad}"


def test_a_cached_module_loads_in_a_fresh_process_without_building():
    if not compiled.wait(["conv_nhwc"], timeout=30):
        pytest.skip(f"conv_nhwc is not available: {compiled.status()['modules']}")
    code = ("import time, workbench.compiled as c; t=time.perf_counter(); "
            "ok=c.wait(['conv_nhwc']); print(ok, time.perf_counter()-t, bool(c._PROCS))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env=dict(os.environ), timeout=120)
    ok, secs, started = out.stdout.split()
    assert ok == "True" and started == "False" and float(secs) < 5, out


def test_a_cached_kernel_is_there_at_its_first_call():
    """A module already built for this CPU is loaded at the first call of one of its kernels
    (milliseconds), so a model's first run computes as its later runs do: no numpy-path first
    run that differs from them in the last bits."""
    if not compiled.wait(["conv_nhwc", "transformer"], timeout=30):
        pytest.skip(f"kernels are not available: {compiled.status()['modules']}")
    code = ("import time, workbench.compiled as c; t=time.perf_counter(); "
            "k=c.kernel('conv_nhwc.bias_act'); r=c.request(['transformer']); "
            "print(k is not None, c.status()['modules']['transformer']['state'], "
            "time.perf_counter()-t, bool(c._PROCS))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env=dict(os.environ), timeout=120)
    got, state, secs, started = out.stdout.split()
    assert got == "True" and state == "ready" and started == "False", out
    assert float(secs) < 5, out


def test_old_versions_are_pruned(tmp_path):
    folder = str(tmp_path)
    today = cache.paths("conv_nhwc", folder)
    old = os.path.join(folder, "conv_nhwc-0123456789abcdef.o")
    recent = os.path.join(folder, "conv_nhwc-fedcba9876543210.json")
    other = os.path.join(folder, "norm_x-0123456789abcdef.o")
    for f in (today["object"], old, recent, other):
        with open(f, "wb") as fh:
            fh.write(b"x")
    long_ago = time.time() - cache.STALE_SECONDS - 10
    for f in (today["object"], old, other):
        os.utime(f, (long_ago, long_ago))
    assert cache.prune("conv_nhwc", folder) == [old]
    assert os.path.exists(today["object"]) and os.path.exists(recent)
    assert os.path.exists(other)


def test_a_builder_whose_cache_folder_was_removed_stops(tmp_path, monkeypatch):
    """A notebook's private, temporary WORKBENCH_HOME is removed when its kernel stops: the
    background builder it started neither makes that folder again nor leaves compiler work
    folders in $TMPDIR (they go in the cache folder; stale ones there are dropped)."""
    from workbench.compiled import build

    folder = tmp_path / "home" / "compiled"
    folder.mkdir(parents=True)
    stale = folder / (build._WORK_PREFIX + "left")
    stale.mkdir()
    long_ago = time.time() - build._STALE_WORK_SECONDS - 10
    os.utime(stale, (long_ago, long_ago))
    fresh = folder / (build._WORK_PREFIX + "busy")
    fresh.mkdir()
    build._drop_stale_work(str(folder))
    assert not stale.exists() and fresh.exists()
    assert build.build("trees", str(tmp_path / "gone"), create=False) == {
        "module": "trees", "status": "gone"}
    assert not (tmp_path / "gone").exists()
    calls = []
    real = build.build

    def removing(module, folder_, **kw):   # the kernel stopped after the first module
        calls.append(module)
        shutil.rmtree(str(tmp_path / "home"))
        return real(module, folder_, **kw)
    monkeypatch.setattr(build, "build", removing)
    assert build.main(["--dir", str(folder), "--quiet", "trees", "conv_nhwc"]) == 0
    assert calls == ["trees"] and not (tmp_path / "home").exists()


def test_a_failed_build_is_recorded_and_not_retried(fresh_home):
    folder = cache.cache_dir()
    rec = {"module": "conv_nhwc", "source_key": cache.source_key("conv_nhwc"),
           "error": "SyntaxError: made up"}
    with open(cache.paths("conv_nhwc", folder)["failed"], "w") as f:
        json.dump(rec, f)
    assert compiled.kernel("conv_nhwc.dw_k3s1") is None
    assert compiled.wait(["conv_nhwc"], timeout=30) is False
    st = compiled.status()["modules"]["conv_nhwc"]
    assert st["state"] == "failed" and "made up" in st["why"]
    assert not compiled._PROCS


def test_a_kernel_cache_of_its_own(tmp_path, monkeypatch):
    """``WORKBENCH_KERNEL_CACHE`` holds the compiled kernels whatever ``WORKBENCH_HOME`` is
    (notebooks with a private home share the session's kernels)."""
    monkeypatch.setenv("WORKBENCH_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("WORKBENCH_KERNEL_CACHE", str(tmp_path / "kernels"))
    assert cache.cache_dir() == str(tmp_path / "kernels" / cache.machine_key())
    monkeypatch.delenv("WORKBENCH_KERNEL_CACHE")
    assert cache.cache_dir() == str(tmp_path / "home" / "compiled" / cache.machine_key())


def test_cache_keys():
    assert len(cache.machine_key()) == 16
    k = cache.source_key("conv_nhwc")
    assert k == cache.source_key("conv_nhwc") and len(k) == 32
    assert "conv_nhwc" in cache.module_names()


def test_stale_objects_are_not_loaded(fresh_home):
    """An object built from other sources (its key differs) is ignored."""
    folder = cache.cache_dir()
    p = cache.paths("conv_nhwc", folder)
    with open(p["object"], "wb") as f:
        f.write(b"\x7fELF garbage")
    with open(p["meta"], "w") as f:
        json.dump({"source_key": "0" * 32, "exports": {}}, f)
    assert cache.fresh_meta("conv_nhwc", folder) is None


def test_warmup_command(capsys):
    from workbench import cli

    assert cli.main(["warmup", "--status"]) == 0
    out = capsys.readouterr().out
    assert "conv_nhwc:" in out
    if not compiled.enabled():   # the session runs on numpy: no foreground build here
        assert "compiled kernels: off" in out
        return
    assert "compiled kernels: on" in out
    if compiled.can_build() is not None:
        assert cli.main(["warmup"]) == 2
        assert "cannot compile kernels here" in capsys.readouterr().err
        return
    assert cli.main(["warmup", "conv_nhwc"]) == 0
    out = capsys.readouterr().out
    assert "conv_nhwc: up to date" in out or "conv_nhwc: built" in out
    assert "1 module(s) ready, 0 failed" in out
    assert compiled.kernel("conv_nhwc.dw_k3s1") is not None
