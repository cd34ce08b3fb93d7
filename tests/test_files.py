"""workbench.files.write_atomic: the one way the workbench writes a user's file (exported and
edited models, saved states): atomic, never over an existing file unless asked, even when the
file appears while it is being written, with the permissions a new file should have."""

from __future__ import annotations

import os
import stat

import pytest

from workbench import files
from workbench.errors import ExportError, OverwriteError


def _debris(folder):
    return [p.name for p in folder.iterdir() if p.name.endswith(".tmp")]


def test_writes_a_new_file_with_the_umask_permissions(tmp_path):
    old = os.umask(0o027)
    try:
        path = files.write_atomic(tmp_path / "m.onnx", lambda f: f.write(b"abc"))
    finally:
        os.umask(old)
    assert open(path, "rb").read() == b"abc"
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o640      # not mkstemp's private 0o600
    assert _debris(tmp_path) == []


def test_never_replaces_a_file_without_overwrite(tmp_path):
    path = tmp_path / "m.onnx"
    path.write_bytes(b"theirs")
    with pytest.raises(OverwriteError, match="overwrite=True"):
        files.write_atomic(path, lambda f: f.write(b"ours"))
    assert path.read_bytes() == b"theirs" and _debris(tmp_path) == []


@pytest.mark.parametrize("links", [True, False], ids=["hard-links", "no-hard-links"])
def test_a_file_that_appears_while_writing_is_kept(tmp_path, monkeypatch, links):
    """Another writer takes the name between the check and the rename: its file stays."""
    if not links:
        def no_link(*a, **k):
            raise PermissionError(1, "Operation not permitted")
        monkeypatch.setattr(os, "link", no_link)
    path = tmp_path / "m.onnx"

    def write(f):
        path.write_bytes(b"theirs")                   # someone else, meanwhile
        f.write(b"ours")

    with pytest.raises(OverwriteError, match="appeared while writing"):
        files.write_atomic(path, write)
    assert path.read_bytes() == b"theirs" and _debris(tmp_path) == []
    # and without the race, the fallback still writes
    files.write_atomic(tmp_path / "n.onnx", lambda f: f.write(b"ours"))
    assert (tmp_path / "n.onnx").read_bytes() == b"ours" and _debris(tmp_path) == []


def test_overwrite_replaces_and_keeps_the_permissions(tmp_path):
    path = tmp_path / "m.onnx"
    path.write_bytes(b"old")
    os.chmod(path, 0o604)
    files.write_atomic(path, lambda f: f.write(b"new"), overwrite=True)
    assert path.read_bytes() == b"new" and stat.S_IMODE(os.stat(path).st_mode) == 0o604
    assert _debris(tmp_path) == []


def test_a_failed_write_leaves_nothing(tmp_path):
    path = tmp_path / "m.onnx"

    def fail(f):
        f.write(b"half")
        raise RuntimeError("the serializer failed")

    with pytest.raises(RuntimeError, match="serializer"):
        files.write_atomic(path, fail)
    assert list(tmp_path.iterdir()) == []
    with pytest.raises(ExportError, match="cannot write"):
        files.write_atomic(tmp_path / "no-such-folder" / "m.onnx", lambda f: f.write(b"x"))
