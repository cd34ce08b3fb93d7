"""Writing a ModelProto to a file: :func:`save_atomic` (a temporary file in the same folder,
then an atomic rename; never over an existing file unless asked).

Making a ModelProto from recorded Tensors (``to_onnx``) is ``workbench.autodiff.export``.
"""

from __future__ import annotations

import onnx

from workbench.files import write_atomic


def save_atomic(proto: onnx.ModelProto, path, *, overwrite: bool = False) -> str:
    """Write ``proto`` to ``path`` through a temporary file and an atomic rename; an existing
    file is replaced only with ``overwrite=True``."""
    return write_atomic(path, lambda f: f.write(proto.SerializeToString()),
                        overwrite=overwrite)
