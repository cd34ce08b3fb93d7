"""Writing files: the one place for atomic writes.

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


def write_atomic(path, write: Callable[[IO[bytes]], object], *, overwrite: bool = False) -> str:
    """Write ``path`` with ``write(f)`` (``f`` a binary file) through a temporary file and an
    atomic rename; raises ``FileExistsError`` for an existing file unless ``overwrite``.
    Returns the path."""
    path = os.fspath(path)
    if os.path.exists(path) and not overwrite:
        raise FileExistsError(f"{path} already exists; pass overwrite=True to replace it")
    folder = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(prefix=f".{os.path.basename(path)}.", suffix=".tmp", dir=folder)
    try:
        with os.fdopen(fd, "wb") as f:
            write(f)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    return path
