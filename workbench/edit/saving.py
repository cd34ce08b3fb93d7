"""Saving an edited model: atomic writes (``workbench.files.write_atomic``), never over an
existing file unless asked, weights in an external-data file when the model is too big for one
protobuf (or when asked)."""

from __future__ import annotations

import os

import onnx
from onnx import numpy_helper

from workbench.edit.errors import EditError
from workbench.files import write_atomic

#: above this many bytes a model is saved with external data by default (protobuf's limit
#: is 2 GiB for the whole message)
EXTERNAL_ABOVE = 2**31 - 2**26
#: tensors at least this big go to the data file
EXTERNAL_MIN_BYTES = 1024


def save(m: onnx.ModelProto, path, *, overwrite: bool = False,
         external_data: bool | None = None) -> str:
    path = os.fspath(path)
    if os.path.isdir(path):
        raise EditError(f"{path} is a folder; give a file name")
    if external_data is None:
        external_data = m.ByteSize() > EXTERNAL_ABOVE
    if not external_data:
        data = m.SerializeToString()
        return write_atomic(path, lambda f: f.write(data), overwrite=overwrite)
    location = os.path.basename(path) + ".data"
    data_path = os.path.join(os.path.dirname(os.path.abspath(path)), location)
    for p in (path, data_path):
        if os.path.exists(p) and not overwrite:
            from workbench.errors import OverwriteError  # noqa: PLC0415
            raise OverwriteError(f"{p} already exists; pass overwrite=True to replace it")
    out = onnx.ModelProto()
    out.CopyFrom(m)
    chunks, offset = [], 0
    for t in out.graph.initializer:
        raw = t.raw_data if t.HasField("raw_data") else None
        if raw is None:
            if t.data_type == onnx.TensorProto.STRING:
                continue
            raw = numpy_helper.to_array(t).astype(
                numpy_helper.to_array(t).dtype.newbyteorder("<")).tobytes()
        if len(raw) < EXTERNAL_MIN_BYTES:
            continue
        pad = (-offset) % 64
        if pad:
            chunks.append(b"\0" * pad)
            offset += pad
        dims, dtype, name = list(t.dims), t.data_type, t.name
        t.Clear()
        t.name, t.data_type = name, dtype
        t.dims.extend(dims)
        t.data_location = onnx.TensorProto.EXTERNAL
        for k, v in (("location", location), ("offset", str(offset)), ("length", str(len(raw)))):
            e = t.external_data.add()
            e.key, e.value = k, v
        chunks.append(raw)
        offset += len(raw)

    def write_data(f):
        for c in chunks:
            f.write(c)

    write_atomic(data_path, write_data, overwrite=overwrite)
    data = out.SerializeToString()
    return write_atomic(path, lambda f: f.write(data), overwrite=overwrite)
