"""Writing files: the one place for atomic writes, and the workbench's cache folder.

Every file the engine writes for the user (exported ``.onnx`` models, ``save_states``
archives) goes through :func:`write_atomic`: a temporary file in the target's folder, then an
atomic rename, so a reader never sees a half-written file and a failure leaves nothing behind;
an existing file is replaced only when asked. :func:`cache_home` is the user's workbench cache
folder (downloads, the trunk cache).
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from typing import IO

from workbench.errors import ExportError, OverwriteError


def write_atomic(path, write: Callable[[IO[bytes]], object], *, overwrite: bool = False) -> str:
    """Write ``path`` with ``write(f)`` (``f`` a binary file) through a temporary file and an
    atomic rename; raises ``OverwriteError`` (a ``FileExistsError``) for an existing file unless
    ``overwrite``, ``ExportError`` when the file cannot be written. Returns the path.

    Without ``overwrite`` the file is published with a hard link, which fails if the name was
    taken meanwhile (another writer, between our check and our rename): nothing existing is
    ever replaced. The data is flushed to disk before it gets the name; the file gets the
    permissions a new file would get (the umask), or those of the file it replaces."""
    path = os.fspath(path)
    if os.path.exists(path) and not overwrite:
        raise OverwriteError(f"{path} already exists; pass overwrite=True to replace it")
    folder = os.path.dirname(os.path.abspath(path))
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{os.path.basename(path)}.", suffix=".tmp",
                                   dir=folder)
    except OSError as e:
        raise ExportError(f"cannot write {path}: {e.strerror or e}") from e
    try:
        with os.fdopen(fd, "wb") as f:
            if hasattr(os, "fchmod"):
                os.fchmod(f.fileno(), _mode_for(path))
            write(f)
            f.flush()
            os.fsync(f.fileno())
        if overwrite:
            os.replace(tmp, path)
        else:
            _publish_new(tmp, path)
    except BaseException as e:
        if os.path.exists(tmp):
            os.unlink(tmp)
        if isinstance(e, OverwriteError):
            raise
        if isinstance(e, OSError):
            raise ExportError(f"cannot write {path}: {e.strerror or e}") from e
        if isinstance(e, ValueError) and "2GB" in str(e).replace(" ", "").upper():
            raise ExportError(f"cannot write {path}: {e} (models over 2 GB need external "
                              f"data: onnx.save_model(..., save_as_external_data=True))") from e
        raise
    return path


def cache_home(create: bool = True) -> str:
    """The workbench cache folder: ``$WORKBENCH_HOME``, else ``$XDG_CACHE_HOME/onnx-workbench``
    or ``~/.cache/onnx-workbench`` (created on demand unless ``create`` is false). The zoo's
    downloads and the compiled kernels (``workbench.compiled``) live there."""
    home = os.environ.get("WORKBENCH_HOME")
    if not home:
        base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
        home = os.path.join(base, "onnx-workbench")
    if create:
        os.makedirs(home, exist_ok=True)
    return home


def _publish_new(tmp: str, path: str) -> None:
    """Give ``tmp`` the name ``path`` only if no file has it (then ``tmp`` is gone)."""
    try:
        os.link(tmp, path)
    except FileExistsError:
        raise OverwriteError(f"{path} already exists (it appeared while writing); pass "
                             f"overwrite=True to replace it") from None
    except OSError:
        # a file system without hard links: the best we can do is check again
        if os.path.lexists(path):
            raise OverwriteError(f"{path} already exists (it appeared while writing); pass "
                                 f"overwrite=True to replace it") from None
        os.replace(tmp, path)
        return
    os.unlink(tmp)


def _mode_for(path: str) -> int:
    """The permission bits for ``path``: those of the file it replaces, else 0o666 less the
    process's umask (mkstemp makes 0o600 files, private to the writer)."""
    try:
        return os.stat(path).st_mode & 0o7777
    except OSError:
        pass
    return 0o666 & ~_umask()


def _umask() -> int:
    try:   # Linux: read it without changing it (os.umask sets it: racy with other threads)
        with open("/proc/self/status", encoding="ascii", errors="replace") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    return 0o022
