"""The repository's root holds only what is meant to be there: what a newcomer sees first on
opening the clone. A file a test or a program left behind (a checkpoint, a zip, a model) shows
up here, whether committed or merely lying in the working tree without being ignored."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

#: the intended top level, each with what it is for (add a line here to add a top-level entry)
INTENDED = {
    ".ci": "what CI runs (.ci/run)",
    ".gitignore": "git",
    "LICENSE": "Apache-2.0, shipped in the wheel",
    "README.md": "the first page",
    "benchmarks": "measurements against onnxruntime and PyTorch",
    "conftest.py": "pytest set-up for the whole tree (nbval, the slow groups)",
    "docs": "the documentation",
    "environment.yml": "conda",
    "examples": "SINGA's example programs, ported",
    "extensions": "the JupyterLab extension's source",
    "jupyter-config": "the server extension's config, installed with the package",
    "notebooks": "tutorials, course, zoo demos",
    "pyproject.toml": "the package",
    "scripts": "set-up, build and check scripts",
    "tests": "the tests",
    "workbench": "the package's source",
}


def _top_level() -> set[str]:
    """Top-level names of the files git tracks or would add (ignored ones left out)."""
    try:
        out = subprocess.run(["git", "ls-files", "-z", "-co", "--exclude-standard"], cwd=ROOT,
                             capture_output=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("not a git checkout (an unpacked sdist): nothing to compare")
    return {f.decode().split("/")[0] for f in out.split(b"\0") if f}


def test_the_root_holds_only_intended_files():
    extra = sorted(_top_level() - set(INTENDED))
    assert not extra, (
        f"unexpected at the repository's root: {extra}. A test or program's output belongs in "
        f"a temporary folder (pytest's tmp_path) or test-artifacts/ (ignored); a new top-level "
        f"part of the project gets its line in INTENDED in {Path(__file__).name}")


def test_every_intended_entry_is_there():
    """INTENDED stays true as the tree changes (a moved or removed entry is taken out)."""
    missing = sorted(n for n in INTENDED if not (ROOT / n).exists())
    assert not missing, f"INTENDED names what the root no longer holds: {missing}"
