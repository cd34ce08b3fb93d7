"""Repository-level pytest set-up: the notebooks are part of the test suite.

Whenever nbval is installed (the ``test`` extra), ``python3 -m pytest`` also collects
``notebooks/*.ipynb`` (``testpaths`` in pyproject.toml) and runs each notebook top to bottom
in lax mode: every cell must run without error, and the cells marked ``# NBVAL_CHECK_OUTPUT``
must reproduce their committed output after the sanitizers of
``notebooks/nbval_sanitize.cfg`` (addresses, paths, timings) are applied. The kernel is the
Python running pytest (``--nbval-current-env``), so the notebooks see the installed package;
``WORKBENCH_NOTEBOOK_OFFLINE=1`` (unless set otherwise) keeps them on the offline twins.
Passing ``--nbval`` (strict) or other nbval options on the command line still works.
"""

from __future__ import annotations

import os
from pathlib import Path

ROOT = Path(__file__).resolve().parent


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
