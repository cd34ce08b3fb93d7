"""Value kinds beyond tensors, as onnxruntime's Python API passes them.

- string tensors: numpy arrays of ``str`` (dtype ``object``; ``<U``/``S`` arrays are accepted
  as feeds and converted to ``object``);
- maps (``map(K, V)``): a Python ``dict``;
- sequences (``seq(...)``): a Python ``list`` (of arrays, or of dicts for ``seq(map(...))``,
  what ZipMap returns).

:func:`check_feed` validates a feed against its declared type (keys and values of maps
included) with an error naming the input, and returns it in the engine's form.
"""

from __future__ import annotations

import numpy as np
import onnx

from workbench.errors import InputError

_STRING = onnx.TensorProto.STRING
_INTS = {onnx.TensorProto.INT64, onnx.TensorProto.INT32, onnx.TensorProto.INT16,
         onnx.TensorProto.INT8, onnx.TensorProto.UINT8, onnx.TensorProto.UINT16,
         onnx.TensorProto.UINT32, onnx.TensorProto.UINT64}
_FLOATS = {onnx.TensorProto.FLOAT, onnx.TensorProto.DOUBLE, onnx.TensorProto.FLOAT16}


def type_str(tp) -> str:
    """``map(string, float)``-style text of a TypeProto."""
    kind = tp.WhichOneof("value") if tp is not None else None
    if kind == "tensor_type":
        elem = onnx.helper.tensor_dtype_to_string(tp.tensor_type.elem_type)[12:].lower()
        return f"tensor({elem})"
    if kind == "map_type":
        key = onnx.helper.tensor_dtype_to_string(tp.map_type.key_type)[12:].lower()
        return f"map({key}, {type_str(tp.map_type.value_type)})"
    if kind == "sequence_type":
        return f"seq({type_str(tp.sequence_type.elem_type)})"
    if kind == "optional_type":
        return f"optional({type_str(tp.optional_type.elem_type)})"
    return "?"


def _scalar_ok(elem: int, v) -> bool:
    if elem == _STRING:
        return isinstance(v, (str, np.str_))
    if elem in _INTS:
        return isinstance(v, (int, np.integer)) and not isinstance(v, bool)
    if elem in _FLOATS:
        return isinstance(v, (int, float, np.integer, np.floating)) and not isinstance(v, bool)
    return True


def _check_map(name: str, tp, v, where: str = "") -> None:
    if not isinstance(v, dict):
        raise InputError(f"input {name!r}{where} must be a map {type_str(tp)} (a Python dict), "
                         f"got {type(v).__name__}")
    mt = tp.map_type
    val_tp = mt.value_type
    val_elem = val_tp.tensor_type.elem_type if val_tp.HasField("tensor_type") else None
    for k, x in v.items():
        if not _scalar_ok(mt.key_type, k):
            raise InputError(f"input {name!r}{where}: map key {k!r} is a {type(k).__name__}, "
                             f"but the model declares {type_str(tp)}")
        if val_elem is not None and not _scalar_ok(val_elem, x):
            raise InputError(f"input {name!r}{where}: the value of key {k!r} is {x!r} "
                             f"({type(x).__name__}), but the model declares {type_str(tp)}")


def check_feed(info, v):
    """Validate a non-tensor feed (map, sequence of maps) and convert string arrays to
    ``object``; returns the value to store. Tensor feeds are otherwise left to the
    executor's dtype/shape checks."""
    tp = info.type_proto
    kind = tp.WhichOneof("value") if tp is not None else "tensor_type"
    if kind == "tensor_type":
        if isinstance(v, dict):
            raise InputError(f"input {info.name!r} is a tensor; got a dict (maps are only "
                             f"accepted where the model declares a map input)")
        if isinstance(v, np.ndarray) and v.dtype.kind in "US" and \
                (tp is None or tp.tensor_type.elem_type in (_STRING, 0)):
            out = np.empty(v.shape, dtype=object)
            out[...] = v.astype(str) if v.dtype.kind == "S" else v
            return out
        return v
    if kind == "map_type":
        _check_map(info.name, tp, v)
        return v
    if kind == "sequence_type" and tp.sequence_type.elem_type.HasField("map_type"):
        if not isinstance(v, (list, tuple)):
            raise InputError(f"input {info.name!r} must be a list of dicts "
                             f"({type_str(tp)}), got {type(v).__name__}")
        for i, m in enumerate(v):
            _check_map(info.name, tp.sequence_type.elem_type, m, f" (element {i})")
        return list(v)
    return v
