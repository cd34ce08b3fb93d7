"""Shared fixtures. Kept small: model builders live in ``tests/helpers``."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # ``tests.helpers`` importable however pytest is started
    sys.path.insert(0, str(ROOT))

TORCH_SKIP_REASON = ("PyTorch is not installed: the real-model tests export their models with "
                     "torch.onnx (pip install torch, CPU build)")


class _ExportCache:
    """Builds each torch model once and exports it once per opset, for the whole session."""

    def __init__(self):
        self._models: dict = {}
        self._protos: dict = {}

    def model(self, name: str):
        from tests.helpers import torch_models  # noqa: PLC0415

        if name not in self._models:
            self._models[name] = torch_models.build(name)
        return self._models[name]

    def proto(self, name: str, opset: int = 17):
        from tests.helpers import torch_models  # noqa: PLC0415

        key = (name, opset)
        if key not in self._protos:
            model, example = self.model(name)
            self._protos[key] = torch_models.export_onnx(model, example, None, opset=opset)
        return self._protos[key]


@pytest.fixture(scope="session")
def torch_exports():
    """Session cache of the PyTorch-built models: ``.model(name)``, ``.proto(name, opset)``."""
    pytest.importorskip("torch", reason=TORCH_SKIP_REASON)
    return _ExportCache()


# ----------------------------------------------------------------------------- compiled kernels
#: how long the session waits for the compiled kernels before its first test (a cold cache
#: builds them: about 1.5 min per module on a loaded 2-core machine); past it, the builder is
#: ended and the whole session runs on numpy (the compiled-path tests skip, saying why)
COMPILE_WAIT_SECONDS = float(os.environ.get("WORKBENCH_TEST_COMPILE_WAIT", "480"))

#: what the session's wait found (printed in the summary; read by tests/compiled)
COMPILED_SESSION: dict = {}


def pytest_configure(config):
    """Start building the compiled kernels (a cold cache: ~40 s on a quiet 2-core machine)
    before the tests are collected, so the build runs while pytest imports and collects (the
    session fixture below then waits for what is left)."""
    from workbench import compiled  # noqa: PLC0415

    if not os.environ.get("WORKBENCH_KERNEL_CACHE"):
        # the notebooks (nbval, tests/helpers/kernel.py) run offline with a private,
        # temporary WORKBENCH_HOME: their kernels load the session's compiled kernels from
        # here instead of building all of them again in the background
        from workbench.compiled import cache  # noqa: PLC0415
        os.environ["WORKBENCH_KERNEL_CACHE"] = os.path.dirname(cache.cache_dir())
    if compiled.enabled() and "cold" not in COMPILED_SESSION:
        states = compiled.status()["modules"].values()
        COMPILED_SESSION["cold"] = any(st["state"] == "cold" for st in states)
        COMPILED_SESSION["t0"] = time.monotonic()
        compiled.request(compiled.modules())


@pytest.fixture(scope="session", autouse=True)
def compiled_kernels():
    """The compiled kernels (``workbench.compiled``) are loaded, or built once per machine
    into the user's cache (the same objects ``workbench warmup`` writes: the one thing tests
    write there on purpose) before the first test, so every test sees the same kernels from
    its start to its end: a kernel becoming ready in the middle of a test would change which
    path runs. The wait is bounded (``WORKBENCH_TEST_COMPILE_WAIT`` seconds); when it runs out
    the builder is ended and compiled kernels are turned off for the session.
    ``WORKBENCH_COMPILED=0`` runs the whole suite on numpy; without numba only kernels
    already in the cache load."""
    from workbench import compiled  # noqa: PLC0415

    if compiled.enabled():
        t0 = COMPILED_SESSION.pop("t0", time.monotonic())
        cold = COMPILED_SESSION.pop("cold", None)
        if cold is None:
            cold = any(st["state"] == "cold" for st in compiled.status()["modules"].values())
        done = compiled.wait(timeout=COMPILE_WAIT_SECONDS)
        states = {m: st["state"] for m, st in compiled.status()["modules"].items()}
        timed_out = not done and any(s in ("queued", "building") for s in states.values())
        if timed_out:
            why = (f"the test session's wait for the compiled kernels ran out "
                   f"({COMPILE_WAIT_SECONDS:.0f} s, WORKBENCH_TEST_COMPILE_WAIT)")
            compiled.stop_builds(why)
            compiled.set_enabled(False)
        COMPILED_SESSION.update(cold=cold, seconds=round(time.monotonic() - t0, 1),
                                timed_out=timed_out, states=states)
    else:
        COMPILED_SESSION.update(off=True)
    yield


def pytest_terminal_summary(terminalreporter):
    s = COMPILED_SESSION
    if not s:
        return
    if s.get("off"):
        line = "compiled kernels: off (WORKBENCH_COMPILED); the suite ran on numpy"
    else:
        line = (f"compiled kernels: {s['states']} after {s['seconds']} s from the session's "
                f"start ({'cold cache' if s['cold'] else 'from the cache'})")
        if s["timed_out"]:
            line += "; the wait ran out: the suite ran on numpy"
    terminalreporter.write_line(line)


# ----------------------------------------------------------------------------- devices
def cuda_skip_reason() -> str | None:
    """Why CUDA tests cannot run here, or None when cupy sees a GPU."""
    from workbench import device as wbdevice  # noqa: PLC0415
    from workbench.arrays import cupy_module  # noqa: PLC0415

    if cupy_module() is None:
        return "no CUDA GPU/cupy: cupy is not installed (pip install '.[gpu-cuda12]')"
    if not wbdevice.cuda_available():
        return "no CUDA GPU/cupy: cupy sees no CUDA GPU"
    return None


#: the devices tests are parametrised over: the CPU always, CUDA:0 marked ``gpu``
DEVICES = ["CPU", pytest.param("CUDA:0", marks=pytest.mark.gpu)]


@pytest.fixture(autouse=True)
def singa_training_flag():
    """SINGA's global ``autograd.training`` (set by ``Model.train`` and SINGA's programs; it
    also turns on the tape's ``set_save_all``) put back after every test, so no test sees what
    an earlier one left (a test of another file failed when run after a training test)."""
    mod = sys.modules.get("workbench.singa.autograd")
    before = mod.training if mod is not None else False
    yield
    mod = sys.modules.get("workbench.singa.autograd")
    if mod is not None and mod.training != before:
        mod.training = before


@pytest.fixture(params=DEVICES)
def device(request):
    """A workbench Device: 'CPU', then 'CUDA:0' (skipped without cupy and a GPU)."""
    from workbench import device as wbdevice  # noqa: PLC0415

    if request.param != "CPU":
        reason = cuda_skip_reason()
        if reason:
            pytest.skip(reason)
    return wbdevice.get_device(request.param)


@pytest.fixture
def cuda():
    """The CUDA:0 Device (skipped without cupy and a GPU)."""
    from workbench import device as wbdevice  # noqa: PLC0415

    reason = cuda_skip_reason()
    if reason:
        pytest.skip(reason)
    return wbdevice.get_device("CUDA:0")


def pytest_collection_modifyitems(config, items):
    """Tests that take the ``cuda`` fixture are GPU tests too (``-m gpu`` selects them)."""
    for item in items:
        if "cuda" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.gpu)


def pytest_sessionfinish(session, exitstatus):
    """Close the widgets the tests made while the interpreter is still whole (ipywidgets'
    ``Widget.__del__`` otherwise complains at exit)."""
    import gc  # noqa: PLC0415
    import sys  # noqa: PLC0415
    w = sys.modules.get("ipywidgets")
    if w is not None:
        # (no kernel here: a test's fake comm may already be gone, so closing can fail;
        # then the comm is dropped, which is all ``__del__`` would do)
        import warnings  # noqa: PLC0415
        with warnings.catch_warnings():  # isinstance() on every object wakes deprecations
            warnings.simplefilter("ignore")
            widgets = [o for o in gc.get_objects() if isinstance(o, w.Widget)]
        for obj in widgets:
            if getattr(obj, "comm", None) is not None:
                try:
                    obj.close()
                except Exception:  # noqa: BLE001 - best effort at exit
                    obj.comm = None
        gc.collect()
