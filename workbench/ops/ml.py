"""ai.onnx.ml kernels for data preparation: ArrayFeatureExtractor, Binarizer, CastMap,
CategoryMapper, DictVectorizer, FeatureVectorizer, Imputer, LabelEncoder (opsets 1, 2, 4),
Normalizer, OneHotEncoder, Scaler, ZipMap.

The models (linear, SVM) are in ``ml_linear.py``, the tree ensembles in ``ml_trees.py``.
Value kinds beyond tensors: string tensors are numpy object arrays; a map is a Python ``dict``
(DictVectorizer and CastMap read one); ZipMap returns a sequence of maps, a Python ``list`` of
dicts, as onnxruntime's Python API does.
"""

from __future__ import annotations

import math

import numpy as np

from workbench.arrays import xp_of
from workbench.errors import InputError, ShapeError
from workbench.ops.registry import kernel

ML = "ai.onnx.ml"


@kernel("ArrayFeatureExtractor", since=1, domain=ML)
def array_feature_extractor(X, Y):
    """Z = X[..., Y]: select the indexed elements along the last axis."""
    xp = xp_of(X)
    idx = Y.reshape(-1).astype(np.int64)
    last = X.shape[-1] if X.ndim else 0
    if idx.size and (int(idx.min()) < 0 or int(idx.max()) >= last):
        raise InputError(f"ArrayFeatureExtractor: indices {idx.tolist()} out of range "
                         f"[0, {last}) for X of shape {tuple(X.shape)}")
    if X.ndim == 1:
        return xp.take(X, idx, axis=0).reshape(1, -1)
    return xp.take(X, idx, axis=-1)


@kernel("Binarizer", since=1, domain=ML)
def binarizer(X, *, threshold=0.0):
    """Y = 1 where X > threshold, else 0 (same dtype as X)."""
    return xp_of(X).asarray(X > threshold).astype(X.dtype)


# ---------------------------------------------------------------------------------------------
# LabelEncoder


def _lookup(op, X, keys, values, default):
    """Map every element of X through keys -> values, default where absent."""
    xp = xp_of(X)
    keys = list(keys)
    if len(keys) != len(values):
        raise InputError(f"{op}: {len(keys)} keys but {len(values)} values")
    out_dtype = values.dtype
    if X.dtype == object or (keys and isinstance(keys[0], str)):
        table = dict(zip((str(k) for k in keys), values.tolist()))
        flat = [table.get(v if isinstance(v, str) else str(v), default)
                for v in X.reshape(-1).tolist()]
        out = np.empty(len(flat), dtype=out_dtype)
        out[:] = flat
        return out.reshape(X.shape)
    k = np.asarray(keys, dtype=X.dtype if X.dtype.kind == "f" else np.float64)
    if X.dtype.kind in "iu":
        k = np.asarray(keys, dtype=np.int64)
    order = np.argsort(k, kind="stable")
    ks, vs = xp.asarray(k[order]), xp.asarray(values[order])
    out = xp.full(X.shape, default, dtype=out_dtype)
    if ks.size:
        pos = xp.clip(xp.searchsorted(ks, X), 0, ks.size - 1)
        found = ks[pos] == X
        out = xp.where(found, vs[pos], out)
        if k.dtype.kind == "f" and np.isnan(k).any():
            nan_val = values[order][np.isnan(k[order])][0]
            out = xp.where(xp.isnan(X), nan_val, out)
    return out


def _default_for(values_dtype, default_int64, default_float, default_string):
    if np.dtype(values_dtype).kind == "O":
        return default_string
    if np.dtype(values_dtype).kind == "f":
        return default_float
    return default_int64


@kernel("LabelEncoder", since=1, domain=ML)
def label_encoder_1(X, *, classes_strings=None, default_int64=-1, default_string="_Unused"):
    """Opset 1: strings -> index in classes_strings, or int64 -> classes_strings[index]."""
    op = "LabelEncoder"
    classes = list(classes_strings or [])
    if X.dtype == object:
        table = {s: i for i, s in enumerate(classes)}
        out = [table.get(v, default_int64) for v in X.reshape(-1).tolist()]
        return np.asarray(out, dtype=np.int64).reshape(X.shape)
    if X.dtype.kind in "iu":
        flat = [classes[i] if 0 <= i < len(classes) else default_string
                for i in X.reshape(-1).tolist()]
        out = np.empty(len(flat), dtype=object)
        out[:] = flat
        return out.reshape(X.shape)
    raise InputError(f"{op}: opset-1 input must be string or int64, got {X.dtype}")


@kernel("LabelEncoder", since=2, domain=ML)
def label_encoder(X, *, default_float=-0.0, default_int64=-1, default_string="_Unused",
                  default_tensor=None, keys_floats=None, keys_int64s=None, keys_strings=None,
                  keys_tensor=None, values_floats=None, values_int64s=None,
                  values_strings=None, values_tensor=None):
    """Opsets 2 and 4 (4 adds the *_tensor attributes): a key -> value map with a default."""
    op = "LabelEncoder"
    key_sets = [k for k in (keys_floats, keys_int64s, keys_strings, keys_tensor) if k is not None]
    val_sets = [v for v in (values_floats, values_int64s, values_strings, values_tensor)
                if v is not None]
    if len(key_sets) != 1 or len(val_sets) != 1:
        raise InputError(f"{op}: exactly one keys_* and one values_* attribute must be set "
                         f"(got {len(key_sets)} and {len(val_sets)})")
    if keys_tensor is not None:
        keys = keys_tensor.reshape(-1).tolist()
    else:
        keys = list(key_sets[0])
    if values_tensor is not None:
        values = np.asarray(values_tensor).reshape(-1)
    elif values_strings is not None:
        values = np.empty(len(values_strings), dtype=object)
        values[:] = list(values_strings)
    elif values_int64s is not None:
        values = np.asarray(values_int64s, dtype=np.int64)
    else:
        values = np.asarray(values_floats, dtype=np.float32)
    if default_tensor is not None:
        default = np.asarray(default_tensor).reshape(-1)[0]
        default = default.item() if hasattr(default, "item") and values.dtype != object \
            else default
    else:
        default = _default_for(values.dtype, default_int64, default_float, default_string)
    if values.dtype == object and not isinstance(default, str):
        default = str(default)
    return _lookup(op, X, keys, values, default)


# ---------------------------------------------------------------------------------------------
# Maps, categories, feature preparation (opset 1)


def _as_str(v) -> str:
    return v.decode("utf-8") if isinstance(v, bytes) else str(v)


def _string_tensor(values, shape) -> np.ndarray:
    out = np.empty(len(values), dtype=object)
    out[:] = list(values)
    return out.reshape(shape)


def _host(X):
    return np.asarray(X.get() if hasattr(X, "get") and not isinstance(X, np.ndarray) else X)


def _back(out, X):
    """Numeric results go back to X's array module (cupy stays cupy); strings stay host."""
    if isinstance(X, np.ndarray) or not hasattr(X, "shape") or out.dtype == object:
        return out
    return xp_of(X).asarray(out)


def _is_string_tensor(x) -> bool:
    return isinstance(x, np.ndarray) and x.dtype.kind in "OUS"


def _check_map(op: str, X, key_kind: str | None = None) -> dict:
    if not isinstance(X, dict):
        raise InputError(f"{op}: input must be a map (a Python dict), got "
                         f"{type(X).__name__}")
    if key_kind is not None:
        for k in X:
            ok = isinstance(k, str) if key_kind == "string" else \
                isinstance(k, (int, np.integer)) and not isinstance(k, bool)
            if not ok:
                raise InputError(f"{op}: map keys must be {key_kind}s, got key {k!r} of type "
                                 f"{type(k).__name__}")
    return X


_CAST_TO = {"TO_FLOAT": np.float32, "TO_STRING": object, "TO_INT64": np.int64}


def _cast_scalar(op, v, to):
    try:
        if to is object:
            if isinstance(v, str):
                return v
            return f"{float(v):f}"  # C++ std::to_string formatting of a float
        if isinstance(v, str):
            return to(float(v)) if to is np.float32 else to(int(float(v)))
        return to(v)
    except (TypeError, ValueError) as e:
        raise InputError(f"{op}: cannot cast map value {v!r} with {op}: {e}") from None


@kernel("CastMap", since=1, domain=ML)
def cast_map(X, *, cast_to="TO_FLOAT", map_form="DENSE", max_map=1):
    """map(int64 -> string|float) to a [1, C] tensor: the values ordered by key (DENSE), or
    placed at their key in a tensor of max_map entries (SPARSE, missing keys are 0)."""
    op = "CastMap"
    m = _check_map(op, X, "int64")
    to = _CAST_TO.get(_as_str(cast_to))
    if to is None:
        raise InputError(f"{op}: cast_to {cast_to!r} must be TO_FLOAT, TO_STRING or TO_INT64")
    form = _as_str(map_form)
    keys = sorted(int(k) for k in m)
    if form == "DENSE":
        vals = [_cast_scalar(op, m[k], to) for k in keys]
    elif form == "SPARSE":
        size = int(max_map)
        bad = [k for k in keys if k < 0 or k >= size]
        if bad:
            raise InputError(f"{op}: SPARSE map keys must be in [0, max_map={size}), got "
                             f"{bad[:5]}")
        vals = ["0" if to is object else to(0)] * size
        for k in keys:
            vals[k] = _cast_scalar(op, m[k], to)
    else:
        raise InputError(f"{op}: map_form {map_form!r} must be DENSE or SPARSE")
    if to is object:
        return _string_tensor(vals, (1, len(vals)))
    return np.asarray(vals, dtype=to).reshape(1, len(vals))


@kernel("CategoryMapper", since=1, domain=ML)
def category_mapper(X, *, cats_int64s=None, cats_strings=None, default_int64=-1,
                    default_string="_Unused"):
    """strings -> int64 (or int64 -> strings) through the pairs (cats_strings[i],
    cats_int64s[i]); unknown values give the default."""
    op = "CategoryMapper"
    ints = list(cats_int64s or [])
    strs = [_as_str(s) for s in (cats_strings or [])]
    if len(ints) != len(strs):
        raise InputError(f"{op}: cats_int64s ({len(ints)}) and cats_strings ({len(strs)}) "
                         f"must have the same length")
    x = _host(X)
    if _is_string_tensor(x):
        table = dict(zip(strs, ints))
        flat = [table.get(_as_str(v), int(default_int64)) for v in x.reshape(-1).tolist()]
        return np.asarray(flat, dtype=np.int64).reshape(x.shape)
    if x.dtype.kind in "iu":
        table = dict(zip(ints, strs))
        flat = [table.get(int(v), _as_str(default_string)) for v in x.reshape(-1).tolist()]
        return _string_tensor(flat, x.shape)
    raise InputError(f"{op}: X must be a string or int64 tensor, got {x.dtype}")


_DV_TYPES = {float: np.float32, np.float32: np.float32, np.float64: np.float64}


@kernel("DictVectorizer", since=1, domain=ML)
def dict_vectorizer(X, *, int64_vocabulary=None, string_vocabulary=None):
    """A map (or a list of maps, one row each) to a [rows, len(vocabulary)] tensor: each value
    at its key's index in the vocabulary; absent keys are 0 (keys outside it are ignored, as
    onnxruntime does)."""
    op = "DictVectorizer"
    svoc = [_as_str(s) for s in (string_vocabulary or [])]
    ivoc = [int(i) for i in (int64_vocabulary or [])]
    if bool(svoc) == bool(ivoc):
        raise InputError(f"{op}: exactly one of string_vocabulary and int64_vocabulary must be "
                         f"set")
    kind = "string" if svoc else "int64"
    index = {k: i for i, k in enumerate(svoc or ivoc)}
    maps = X if isinstance(X, list) else [X]
    rows = [_check_map(op, m, kind) for m in maps]
    values = [v for m in rows for v in m.values()]
    if any(isinstance(v, str) for v in values):
        dtype = object
    elif any(isinstance(v, (np.float64,)) for v in values):
        dtype = np.float64
    elif values and all(isinstance(v, (int, np.integer)) and not isinstance(v, bool)
                        for v in values):
        dtype = np.int64
    elif any(isinstance(v, float) for v in values):
        dtype = np.float32 if not any(isinstance(v, np.float64) for v in values) else np.float64
    else:
        dtype = np.float32
    width = len(index)
    if dtype is object:
        out = np.empty((len(rows), width), dtype=object)
        out[:] = ""
    else:
        out = np.zeros((len(rows), width), dtype=dtype)
    for r, m in enumerate(rows):
        for k, v in m.items():
            i = index.get(k if kind == "string" else int(k))
            if i is not None:
                out[r, i] = v
    return out


@kernel("FeatureVectorizer", since=1, domain=ML)
def feature_vectorizer(*X, inputdimensions=None):
    """Concatenate [N, C_i] inputs (1-D ones are [1, C]) along the columns as float32; input i
    contributes inputdimensions[i] columns (cut or zero-padded)."""
    op = "FeatureVectorizer"
    dims = [int(d) for d in (inputdimensions or [])]
    xs = [x for x in X if x is not None]
    if len(dims) != len(xs):
        raise InputError(f"{op}: inputdimensions has {len(dims)} entries for {len(xs)} inputs")
    if not xs:
        raise InputError(f"{op}: needs at least one input")
    mats = []
    for i, x in enumerate(xs):
        a = _host(x)
        if a.dtype.kind not in "iuf":
            raise InputError(f"{op}: input {i} must be int32/int64/float/double, got {a.dtype}")
        a = a.reshape(1, -1) if a.ndim <= 1 else a.reshape(a.shape[0], -1)
        mats.append(a)
    n = mats[0].shape[0]
    for i, a in enumerate(mats):
        if a.shape[0] != n:
            raise ShapeError(f"{op}: input {i} has {a.shape[0]} rows, input 0 has {n}")
    out = np.zeros((n, sum(dims)), dtype=np.float32)
    col = 0
    for a, d in zip(mats, dims):
        w = min(d, a.shape[1])
        out[:, col:col + w] = a[:, :w]
        col += d
    return _back(out, xs[0])


@kernel("Imputer", since=1, domain=ML)
def imputer(X, *, imputed_value_floats=None, imputed_value_int64s=None,
            replaced_value_float=0.0, replaced_value_int64=0):
    """Replace the elements equal to the replaced value (NaN matches NaN) by the imputed value
    of their feature (last axis), or by the single imputed value."""
    op = "Imputer"
    xp = xp_of(X)
    if X.dtype.kind == "f":
        vals, rep = imputed_value_floats, float(replaced_value_float)
    elif X.dtype.kind in "iu":
        vals, rep = imputed_value_int64s, int(replaced_value_int64)
    else:
        raise InputError(f"{op}: X must be float, double, int32 or int64, got {X.dtype}")
    if vals is None or len(vals) == 0:
        which = "imputed_value_floats" if X.dtype.kind == "f" else "imputed_value_int64s"
        raise InputError(f"{op}: {which} must be set for a {X.dtype} input")
    v = np.asarray(vals, dtype=np.float32 if X.dtype.kind == "f" else np.int64)
    last = X.shape[-1] if X.ndim else 1
    if v.size not in (1, last):
        raise ShapeError(f"{op}: {v.size} imputed values for {last} features (last axis of "
                         f"{list(X.shape)}): give 1 or {last}")
    v = xp.asarray(v.astype(X.dtype))
    if X.dtype.kind == "f" and math.isnan(rep):
        hit = xp.isnan(X)
    else:
        hit = X == X.dtype.type(rep)
    return xp.where(hit, v if v.size == 1 or X.ndim else v[0], X).astype(X.dtype)


@kernel("Normalizer", since=1, domain=ML)
def normalizer(X, *, norm="MAX"):
    """Each row divided by its MAX, L1 (sum of |x|) or L2 norm; rows whose divisor is 0 are
    left as they are. float32 output."""
    op = "Normalizer"
    x = _host(X)
    if x.dtype.kind not in "iuf":
        raise InputError(f"{op}: X must be numeric, got {x.dtype}")
    shape = x.shape
    a = x.reshape(1, -1) if x.ndim <= 1 else x.reshape(-1, x.shape[-1])
    a = a.astype(np.float64)
    kind = _as_str(norm)
    if kind == "MAX":
        d = a.max(axis=1, keepdims=True)
    elif kind == "L1":
        d = np.abs(a).sum(axis=1, keepdims=True)
    elif kind == "L2":
        d = np.sqrt((a * a).sum(axis=1, keepdims=True))
    else:
        raise InputError(f"{op}: norm {kind!r} must be MAX, L1 or L2")
    out = np.where(d != 0, a / np.where(d != 0, d, 1), a)
    return _back(out.astype(np.float32).reshape(shape), X)


@kernel("OneHotEncoder", since=1, domain=ML)
def one_hot_encoder(X, *, cats_int64s=None, cats_strings=None, zeros=1):
    """Append an axis of len(categories): 1.0 at the element's category. Numbers are cast to
    int64 and looked up in cats_int64s; strings in cats_strings. An unknown value gives all
    zeros, or an error when zeros=0."""
    op = "OneHotEncoder"
    x = _host(X)
    if _is_string_tensor(x):
        cats = [_as_str(s) for s in (cats_strings or [])]
        flat = [_as_str(v) for v in x.reshape(-1).tolist()]
    elif x.dtype.kind in "iuf":
        cats = [int(c) for c in (cats_int64s or [])]
        flat = x.reshape(-1).astype(np.int64).tolist()
    else:
        raise InputError(f"{op}: X must be a string or numeric tensor, got {x.dtype}")
    if not cats:
        raise InputError(f"{op}: {'cats_strings' if _is_string_tensor(x) else 'cats_int64s'} "
                         f"must be set for a {x.dtype} input")
    index = {c: i for i, c in enumerate(cats)}
    pos = np.fromiter((index.get(v, -1) for v in flat), dtype=np.int64, count=len(flat))
    if not int(zeros) and (pos < 0).any():
        bad = flat[int(np.flatnonzero(pos < 0)[0])]
        raise InputError(f"{op}: unknown category {bad!r} (zeros=0 forbids unknown values; "
                         f"categories are {cats[:10]}{' ...' if len(cats) > 10 else ''})")
    out = np.zeros((len(flat), len(cats)), dtype=np.float32)
    ok = pos >= 0
    out[np.flatnonzero(ok), pos[ok]] = 1.0
    return _back(out.reshape(x.shape + (len(cats),)), X)


@kernel("Scaler", since=1, domain=ML)
def scaler(X, *, offset=None, scale=None):
    """Y = (X - offset) * scale, per feature (last axis) or one value for all; float32."""
    op = "Scaler"
    x = _host(X)
    if x.dtype.kind not in "iuf":
        raise InputError(f"{op}: X must be numeric, got {x.dtype}")
    last = x.shape[-1] if x.ndim else 1
    off = np.asarray(offset if offset is not None else [0.0], dtype=np.float32).reshape(-1)
    sc = np.asarray(scale if scale is not None else [1.0], dtype=np.float32).reshape(-1)
    for name, v in (("offset", off), ("scale", sc)):
        if v.size not in (1, last):
            raise ShapeError(f"{op}: {name} has {v.size} values for {last} features (last "
                             f"axis of {list(x.shape)})")
    out = (x.astype(np.float32) - off) * sc
    return _back(out.astype(np.float32), X)


@kernel("ZipMap", since=1, domain=ML)
def zip_map(X, *, classlabels_int64s=None, classlabels_strings=None):
    """A [N, C] score tensor to a sequence of N maps {label: score} (a list of dicts)."""
    op = "ZipMap"
    x = _host(X)
    if classlabels_strings is not None and len(classlabels_strings) and \
            classlabels_int64s is not None and len(classlabels_int64s):
        raise InputError(f"{op}: set classlabels_strings or classlabels_int64s, not both")
    if classlabels_strings is not None and len(classlabels_strings):
        keys = [_as_str(s) for s in classlabels_strings]
    elif classlabels_int64s is not None and len(classlabels_int64s):
        keys = [int(i) for i in classlabels_int64s]
    else:
        raise InputError(f"{op}: classlabels_strings or classlabels_int64s must be set")
    a = x.reshape(1, -1) if x.ndim == 1 else x
    if a.ndim != 2 or a.shape[1] != len(keys):
        raise ShapeError(f"{op}: X has shape {list(x.shape)} but there are {len(keys)} labels "
                         f"(one column per label)")
    rows = a.astype(np.float32).tolist()
    return [dict(zip(keys, r)) for r in rows]
