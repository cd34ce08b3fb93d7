"""Writing files: the one place for atomic writes, and the workbench's cache folder.

Every file the engine writes for the user (exported ``.onnx`` models, ``save_states``
archives) goes through :func:`write_atomic`: a temporary file in the target's folder, then an
atomic rename, so a reader never sees a half-written file and a failure leaves nothing behind;
an existing file is replaced only when asked.
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
    ``overwrite``, ``ExportError`` when the file cannot be written. Returns the path."""
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
            write(f)
        os.replace(tmp, path)
    except BaseException as e:
        if os.path.exists(tmp):
            os.unlink(tmp)
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
