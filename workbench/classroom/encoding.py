"""Typed JSON for exercise data: arrays, ONNX models, tuples; the check-data blob; limits.

Everything an exercise stores (cases, feeds, reference digests) and everything a graded
notebook hands back (answers) goes through :func:`encode` / :func:`decode`: plain JSON with
tagged objects for what JSON lacks. Arrays travel as ``.npy`` bytes read with
``allow_pickle=False``; nothing is ever unpickled, so a hostile submission cannot make the
grader run code by handing back a crafted answer. Sizes are checked before anything is
decoded.
"""

from __future__ import annotations

import base64
import io
import json
import math
import zlib

import numpy as np

from workbench.errors import WorkbenchError

BLOB_PREFIX = "wbc1:"
# one answer or one exercise's data: bigger is refused before decoding
MAX_ITEM_BYTES = 64 << 20
MAX_BLOB_BYTES = 64 << 20


class ClassroomError(WorkbenchError):
    """An exercise, an assignment or a grading run is set up wrongly (message says how)."""


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def _unb64(text: str, limit: int) -> bytes:
    if not isinstance(text, str) or len(text) > limit * 4 // 3 + 8:
        raise ClassroomError(f"an encoded item is larger than the {limit:,}-byte limit")
    return base64.b64decode(text.encode("ascii"), validate=True)


def array_to_bytes(a: np.ndarray) -> bytes:
    if a.dtype.hasobject:
        raise ClassroomError("arrays of Python objects cannot be stored; use numbers or "
                             "strings")
    buf = io.BytesIO()
    np.save(buf, a, allow_pickle=False)
    return buf.getvalue()


def array_from_bytes(data: bytes) -> np.ndarray:
    try:
        a = np.load(io.BytesIO(data), allow_pickle=False)
    except Exception as e:
        raise ClassroomError(f"not a readable array ({type(e).__name__}: {e})") from None
    if not isinstance(a, np.ndarray):
        raise ClassroomError("not an array")
    return a


def encode(obj):
    """``obj`` as JSON-able data: numbers, strings, None, lists, str-keyed dicts, tuples,
    numpy arrays and scalars, bytes, ``onnx.ModelProto``; anything else raises
    ClassroomError naming its type."""
    if obj is None or isinstance(obj, (bool, str)):
        return obj
    if isinstance(obj, (int, np.integer)) and not isinstance(obj, np.bool_):
        return int(obj)
    if isinstance(obj, np.bool_):
        return bool(obj)
    if isinstance(obj, (float, np.floating)):
        f = float(obj)
        return f if math.isfinite(f) else {"__float__": repr(f)}
    if isinstance(obj, np.ndarray):
        return {"__nd__": _b64(array_to_bytes(obj))}
    if isinstance(obj, np.generic):          # complex, datetime, ...: as a 0-d array
        return {"__nd__": _b64(array_to_bytes(np.asarray(obj)))}
    if isinstance(obj, (bytes, bytearray, memoryview)):
        return {"__bytes__": _b64(bytes(obj))}
    if isinstance(obj, tuple):
        return {"__tuple__": [encode(x) for x in obj]}
    if isinstance(obj, list):
        return [encode(x) for x in obj]
    if isinstance(obj, dict):
        if not all(isinstance(k, str) for k in obj):
            raise ClassroomError("only dicts with string keys can be stored")
        return {"__map__": {k: encode(v) for k, v in obj.items()}}
    try:
        import onnx
    except ImportError:  # pragma: no cover - onnx is a dependency
        onnx = None
    if onnx is not None and isinstance(obj, onnx.ModelProto):
        return {"__onnx__": _b64(obj.SerializeToString())}
    raise ClassroomError(f"a {type(obj).__name__} cannot be stored in exercise data "
                         f"(numbers, strings, lists, tuples, dicts, numpy arrays and ONNX "
                         f"models can)")


def decode(data, *, limit: int = MAX_ITEM_BYTES):
    """The inverse of :func:`encode`; ``onnx`` models come back as ``onnx.ModelProto``."""
    if isinstance(data, list):
        return [decode(x, limit=limit) for x in data]
    if not isinstance(data, dict):
        return data
    if len(data) != 1:
        raise ClassroomError(f"malformed exercise data (an object with keys {sorted(data)[:5]})")
    (tag, v), = data.items()
    if tag == "__nd__":
        return array_from_bytes(_unb64(v, limit))
    if tag == "__float__":
        if v not in ("nan", "inf", "-inf"):
            raise ClassroomError(f"malformed float {v!r}")
        return float(v)
    if tag == "__bytes__":
        return _unb64(v, limit)
    if tag == "__tuple__":
        return tuple(decode(x, limit=limit) for x in v)
    if tag == "__map__":
        if not isinstance(v, dict):
            raise ClassroomError("malformed mapping in exercise data")
        return {str(k): decode(x, limit=limit) for k, x in v.items()}
    if tag == "__onnx__":
        import onnx
        m = onnx.ModelProto()
        try:
            m.ParseFromString(_unb64(v, limit))
        except Exception as e:
            raise ClassroomError(f"not a readable ONNX model ({type(e).__name__})") from None
        return m
    raise ClassroomError(f"malformed exercise data (unknown tag {tag[:40]!r})")


def pack(obj) -> str:
    """``obj`` (JSON-able) as one ASCII string: prefix, zlib, base64."""
    raw = json.dumps(obj, separators=(",", ":"), sort_keys=True).encode("utf-8")
    return BLOB_PREFIX + _b64(zlib.compress(raw, 9))


def unpack(blob: str, *, limit: int = MAX_BLOB_BYTES):
    """The inverse of :func:`pack`, refusing more than ``limit`` bytes once inflated."""
    if not isinstance(blob, str) or not blob.startswith(BLOB_PREFIX):
        raise ClassroomError("this is not check data made by `workbench assign` (it should "
                             f"start with {BLOB_PREFIX!r}); copy the whole string again")
    try:
        z = base64.b64decode("".join(blob[len(BLOB_PREFIX):].split()).encode("ascii"),
                             validate=True)
        d = zlib.decompressobj()
        raw = d.decompress(z, limit + 1)
        if len(raw) > limit or d.unconsumed_tail:
            raise ClassroomError(f"the check data inflates to more than {limit:,} bytes")
        return json.loads(raw.decode("utf-8"))
    except ClassroomError:
        raise
    except Exception as e:
        raise ClassroomError(f"the check data is damaged ({type(e).__name__}: {e}); copy the "
                             f"whole cell again from the original notebook") from None
