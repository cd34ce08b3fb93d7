"""The ported SINGA tests run in a temporary working directory (``conftest.py``, 5.): the files
they write (``test_model.py``'s ``snapshot1_<test>.zip``) never land in the repository."""

from __future__ import annotations

import pathlib

REPO = pathlib.Path(__file__).resolve().parents[2]


def test_each_test_runs_in_its_own_temporary_directory(tmp_path):
    cwd = pathlib.Path.cwd().resolve()
    assert cwd == tmp_path.resolve()
    assert REPO not in cwd.parents and cwd != REPO
