"""Edit records: the JSON-able form of an edit, and the Python script that replays them.

A record is a plain dict::

    {"edit": "rename_value", "args": {"old": "x", "new": "pixels"}}
    {"edit": "set_dims", "args": {...}, "check": "static"}      # optional check mode

Argument values are JSON values, except two encoded forms:

- an array: ``{"__array__": {"dtype": "float32", "shape": [2, 3], "base64": "..."}}`` (the raw
  little-endian bytes; string arrays carry ``"values": [...]`` instead of ``base64``);
- another model (``compose``): ``{"__model__": {"path": "pre.onnx"}}`` or
  ``{"__model__": {"ref": "model_1"}}`` (a ModelProto the session holds under that name).

:func:`to_python` writes a record as one line of Python. Every string that came from a model
or a user goes through ``repr``, and only literals are written (str, int, float, bool, None,
lists, dicts, arrays), so a hostile node name cannot put code into a replay script.
"""

from __future__ import annotations

import base64
import math
import re

import numpy as np

from workbench.arrays.dtypes import dtype_name, np_dtype_of_onnx
from workbench.edit.errors import EditError

#: arrays up to this many elements are written as a list in scripts, bigger ones as base64
INLINE_ELEMENTS = 256


def _np_dtype(name: str) -> np.dtype:
    if name == "string":
        return np.dtype(object)
    from onnx import TensorProto  # noqa: PLC0415
    key = name.upper()
    if key == "FLOAT32":
        key = "FLOAT"
    if key == "FLOAT64":
        key = "DOUBLE"
    if hasattr(TensorProto, key):
        return np_dtype_of_onnx(getattr(TensorProto, key))
    try:
        return np.dtype(name)
    except TypeError:
        raise EditError(f"unknown dtype {name!r}") from None


def dtype_of(a: np.ndarray) -> str:
    from workbench.arrays.dtypes import onnx_dtype_of_np  # noqa: PLC0415
    if a.dtype.kind in "OUS":
        return "string"
    try:
        name = dtype_name(onnx_dtype_of_np(a.dtype))
    except TypeError:
        raise EditError(f"arrays of dtype {a.dtype} cannot be stored in an ONNX model") from None
    return {"float": "float32", "double": "float64"}.get(name, name)


def encode(value):
    """A JSON-able form of an argument value (arrays and models encoded, tuples as lists)."""
    if isinstance(value, np.ndarray) or isinstance(value, np.generic):
        a = np.asarray(value)
        dt = dtype_of(a)
        if dt == "string":
            vals = [x.decode("utf-8", "replace") if isinstance(x, bytes) else str(x)
                    for x in a.ravel()]
            return {"__array__": {"dtype": dt, "shape": list(a.shape), "values": vals}}
        raw = np.ascontiguousarray(a).astype(a.dtype.newbyteorder("<"), copy=False).tobytes()
        return {"__array__": {"dtype": dt, "shape": list(a.shape),
                              "base64": base64.b64encode(raw).decode("ascii")}}
    if isinstance(value, ModelRef):
        return {"__model__": value.spec()}
    if isinstance(value, dict):
        out = {}
        for k, v in value.items():
            if not isinstance(k, str):
                raise EditError(f"record keys must be strings, got {k!r}")
            out[k] = encode(v)
        return out
    if isinstance(value, (list, tuple)):
        return [encode(v) for v in value]
    if isinstance(value, (bool, type(None), str)):
        return value
    if isinstance(value, (int, np.integer)):
        return int(value)
    if isinstance(value, (float, np.floating)):
        return float(value)
    if isinstance(value, bytes):
        return {"__bytes__": base64.b64encode(value).decode("ascii")}
    raise EditError(f"an edit argument of type {type(value).__name__} cannot be recorded "
                    f"(use strings, numbers, lists, dicts or numpy arrays)")


def decode(value, models: dict | None = None, *, lenient: bool = False):
    """The inverse of :func:`encode` (``models``: the session's models by ref; ``lenient``: a
    ref the session does not hold stays a bare reference, for writing it into a script)."""
    if isinstance(value, dict):
        if set(value) == {"__array__"}:
            return _decode_array(value["__array__"])
        if set(value) == {"__model__"}:
            spec = value["__model__"]
            if not isinstance(spec, dict) or len(spec) != 1 or not (
                    set(spec) <= {"path", "ref"}) or not isinstance(next(iter(spec.values())),
                                                                     str):
                raise EditError(f"a model is given as {{'path': ...}} or {{'ref': ...}}, got "
                                f"{spec!r}")
            if "ref" in spec:
                if lenient and (not models or spec["ref"] not in models):
                    return ModelRef(ref=spec["ref"])
                if not models or spec["ref"] not in models:
                    raise EditError(f"no model {spec['ref']!r} in this session (known: "
                                    f"{sorted(models or {})})")
                return ModelRef(ref=spec["ref"], proto=models[spec["ref"]])
            return ModelRef(path=spec["path"])
        if set(value) == {"__bytes__"}:
            return base64.b64decode(value["__bytes__"])
        return {k: decode(v, models, lenient=lenient) for k, v in value.items()}
    if isinstance(value, list):
        return [decode(v, models, lenient=lenient) for v in value]
    return value


def _decode_array(spec) -> np.ndarray:
    if not isinstance(spec, dict) or "dtype" not in spec or "shape" not in spec:
        raise EditError("an array is {'dtype': ..., 'shape': [...], 'base64' or 'values': ...}")
    shape = tuple(int(s) for s in spec["shape"])
    if any(s < 0 for s in shape):
        raise EditError(f"negative dim in array shape {shape}")
    dt = _np_dtype(str(spec["dtype"]))
    n = int(np.prod(shape)) if shape else 1
    if "values" in spec:
        vals = list(spec["values"])
        if len(vals) != n:
            raise EditError(f"array of shape {shape} needs {n} values, got {len(vals)}")
        return np.asarray(vals, dtype=object if dt == np.dtype(object) else dt).reshape(shape)
    raw = base64.b64decode(spec.get("base64", ""), validate=True)
    if len(raw) != n * dt.itemsize:
        raise EditError(f"array of shape {shape} and dtype {spec['dtype']} needs "
                        f"{n * dt.itemsize} bytes, got {len(raw)}")
    return np.frombuffer(raw, dtype=dt.newbyteorder("<")).astype(dt).reshape(shape).copy()


class ModelRef:
    """Another model an edit uses (compose): a path, or a ModelProto the session holds."""

    def __init__(self, path: str | None = None, ref: str | None = None, proto=None):
        self.path, self.ref, self.proto = path, ref, proto

    def spec(self) -> dict:
        return {"path": self.path} if self.path is not None else {"ref": self.ref}

    def load(self):
        """The ModelProto (loaded through the workbench's loader: checked, external data kept
        inside the model's folder)."""
        from workbench.errors import ModelLoadError  # noqa: PLC0415
        from workbench.graph.load import load  # noqa: PLC0415
        src = self.proto if self.proto is not None else self.path
        try:
            return load(src, check=True, shape_inference=False).proto
        except ModelLoadError as e:
            raise EditError(f"cannot use the other model: {e}") from None


# ---------------------------------------------------------------------------- scripts
_IDENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def literal(value, refs: dict, short: bool = False) -> str:
    """Python source for a decoded argument value: literals only, strings through repr."""
    if isinstance(value, ModelRef):
        if value.path is not None:
            return repr(value.path)
        name = refs.get(value.ref, value.ref)
        if not _IDENT.match(name):   # refs are made by the session; never trust them anyway
            raise EditError(f"model reference {name!r} is not a Python name")
        return name
    if isinstance(value, np.ndarray):
        if short and value.size > 16:   # for display: what it is, not its data
            return f"<{dtype_of(value)} array {list(value.shape)}>"
        return _array_literal(value)
    if isinstance(value, bool) or value is None:
        return repr(value)
    if isinstance(value, int):
        return repr(int(value))
    if isinstance(value, float):
        if math.isnan(value):
            return "float('nan')"
        if math.isinf(value):
            return "float('inf')" if value > 0 else "-float('inf')"
        return repr(float(value))
    if isinstance(value, (str, bytes)):
        return repr(value)
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(literal(v, refs, short) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{literal(str(k), refs)}: {literal(v, refs, short)}"
                               for k, v in value.items()) + "}"
    raise EditError(f"cannot write a {type(value).__name__} into a script")


def _array_literal(a: np.ndarray) -> str:
    dt = dtype_of(a)
    if dt == "string":
        vals = [str(x) for x in a.ravel()]
        return (f"np.array({literal(vals, {})}, dtype=object).reshape({list(a.shape)!r})")
    if a.size <= INLINE_ELEMENTS and a.dtype.kind in "biuf" and a.dtype.itemsize <= 8 \
            and a.dtype in (np.float32, np.float64, np.float16, np.int8, np.int16, np.int32,
                            np.int64, np.uint8, np.uint16, np.uint32, np.uint64, np.bool_):
        vals = [literal(x.item() if hasattr(x, "item") else x, {}) for x in a.ravel()]
        return (f"np.array([{', '.join(vals)}], dtype={str(a.dtype)!r})"
                f".reshape({list(a.shape)!r})")
    enc = encode(a)["__array__"]
    return f"edit.array({enc['dtype']!r}, {enc['shape']!r}, {enc['base64']!r})"


def array(dtype: str, shape, b64: str) -> np.ndarray:
    """An array from the base64 form scripts use for big arrays."""
    return _decode_array({"dtype": dtype, "shape": list(shape), "base64": b64})


def call_line(var: str, record: dict, refs: dict, models: dict | None = None,
              short: bool = False) -> str:
    """The record as one line of Python (``short``: big arrays summarised, for display)."""
    args = decode(record.get("args", {}), models, lenient=True)
    parts = [f"{k}={literal(v, refs, short)}" for k, v in args.items() if _IDENT.match(k)]
    if len(parts) != len(args):
        raise EditError(f"record arguments must be Python names: {sorted(args)}")
    if record.get("check") is not None:
        parts.append(f"check={literal(record['check'], refs)}")
    name = record["edit"]
    if not _IDENT.match(name):
        raise EditError(f"unknown edit {name!r}")
    return f"{var}.{name}({', '.join(parts)})"
