"""Set-up for SINGA's ported test files.

SINGA's tests write files into the working directory (``test_model.py`` saves
``snapshot1_<test>.zip`` and leaves it there); each test here runs in its own temporary
directory so nothing lands in the repository.
"""

from __future__ import annotations

import pytest


@pytest.fixture(autouse=True)
def _run_in_tmp_path(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
