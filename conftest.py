"""Repository-level pytest set-up: the notebooks are part of the test suite.

Whenever nbval is installed (the ``test`` extra), ``python3 -m pytest`` also collects
``notebooks/*.ipynb`` (``testpaths`` in pyproject.toml) and runs each notebook top to bottom
in lax mode: every cell must run without error, and the cells marked ``# NBVAL_CHECK_OUTPUT``
must reproduce their committed output after the sanitizers of
``notebooks/nbval_sanitize.cfg`` (addresses, paths, timings) are applied. The kernel is the
Python running pytest (``--nbval-current-env``), so the notebooks see the installed package;
``WORKBENCH_NOTEBOOK_OFFLINE=1`` (unless set otherwise) keeps them on the offline twins.
Passing ``--nbval`` (strict) or other nbval options on the command line still works.

``slow`` (the day-to-day ``python3 -m pytest -m "not slow"`` leaves it out) is given here, in
one place, to whole groups besides the tests marked one by one: the notebooks, the real-browser
tests, the multi-process MPI tests, the ONNX conformance sweep, and the folders in
:data:`SLOW_FOLDERS`. The full test command runs everything.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent

#: test folders that are slow as a whole (real models, zoo twins, fuzzing, SINGA's ported
#: suites and example programs)
SLOW_FOLDERS = ("tests/zoo", "tests/zoo_sklearn", "tests/fuzz", "tests/singa",
                "tests/browser", "tests/dist")
#: marks that make a test slow as well
SLOW_MARKS = ("browser", "dist", "conformance")


def pytest_configure(config):
    opt = config.option
    if not hasattr(opt, "nbval_lax"):  # nbval is not installed: notebooks are not collected
        return
    # the notebooks' first cell then uses an empty private zoo cache and no network, so they
    # run on the untrained twins whatever this machine has cached (the checked outputs are
    # the twins'); the kernels inherit this environment
    os.environ.setdefault("WORKBENCH_NOTEBOOK_OFFLINE", "1")
    if not (opt.nbval or opt.nbval_lax):
        opt.nbval_lax = True
    if not opt.nbval_sanitize_with and not getattr(opt, "sanitize_with", None):
        opt.nbval_sanitize_with = str(ROOT / "notebooks" / "nbval_sanitize.cfg")
    if not opt.nbval_kernel_name:
        opt.nbval_current_env = True
    # the notebooks' kernels are stopped before their TemporaryDirectory finalizers run, so
    # their private zoo caches would stay in /tmp: the kernels get a TMPDIR of this session's
    # own, removed at the end (see _notebook_tmpdir)
    config._wb_notebook_tmp = tempfile.mkdtemp(prefix="wb-pytest-notebooks-")


def pytest_unconfigure(config):
    folder = getattr(config, "_wb_notebook_tmp", None)
    if folder:
        shutil.rmtree(folder, ignore_errors=True)


@pytest.hookimpl(hookwrapper=True, tryfirst=True)
def pytest_runtest_setup(item):
    """A notebook's kernel starts in its first cell's set-up: it inherits ``TMPDIR`` pointing
    at the session's folder (only the kernel's environment; the rest of the suite keeps its
    own)."""
    folder = getattr(item.config, "_wb_notebook_tmp", None)
    if folder is None or Path(str(getattr(item, "path", "") or "")).suffix != ".ipynb":
        yield
        return
    old = os.environ.get("TMPDIR")
    os.environ["TMPDIR"] = folder
    try:
        yield
    finally:
        if old is None:
            os.environ.pop("TMPDIR", None)
        else:
            os.environ["TMPDIR"] = old


def pytest_collection_modifyitems(config, items):
    """``slow`` on the notebooks, the groups of :data:`SLOW_MARKS` and the folders of
    :data:`SLOW_FOLDERS` (see the module docstring)."""
    folders = [ROOT / f for f in SLOW_FOLDERS]
    for item in items:
        path = Path(str(getattr(item, "path", None) or item.fspath))
        if (path.suffix == ".ipynb" or any(item.get_closest_marker(m) for m in SLOW_MARKS)
                or any(path.is_relative_to(f) for f in folders)):
            item.add_marker(pytest.mark.slow)
