"""The one external-data resolver, and safe TensorProto -> numpy conversion.

A model file may keep tensor bytes in other files ("external data"). Models come from
strangers, so every TensorProto a model can carry goes through :func:`resolve_external_data`
with the same rules, wherever it sits: initializers, sparse initializers, ``Constant``
``value``/``sparse_value``, tensor and sparse-tensor attributes of any node (lists included),
tensors inside subgraphs (If/Loop/Scan bodies, nested), training info and model-local functions.

Rules (a violation is a :class:`~workbench.errors.ModelLoadError` naming the tensor and file):

- the data is read relative to the model's folder (``base_dir``); a model given as bytes or a
  ModelProto needs an explicit ``base_dir``;
- ``location`` is a relative path with no ``..`` component and no NUL byte, that resolves
  (symlinks followed) to a regular file inside the folder;
- the keys are ``location``, ``offset``, ``length``, ``checksum``, each at most once;
  ``offset``/``length`` are non-negative decimal integers; ``checksum`` is a SHA-1 hex digest
  of the file and is verified;
- ``length`` (when given) equals what the tensor's dims and dtype need, and
  ``offset + length`` lies inside the file — all checked before a byte is read or allocated;
- files are memory-mapped and only the tensor's slice is copied.

After resolution every tensor is inline; :func:`tensor_to_array` (the only TensorProto ->
numpy conversion the loader uses) refuses any tensor still marked external, so no later step
can read a file on the model's behalf.

Structure only (``load(path, weights=False)``: the viewer): ``resolve_external_data(...,
read=False)`` checks the same rules except the checksum (which would read the file) and
reads nothing; it marks each external tensor *described* (as the structure reader marks big
inline tensors, :mod:`workbench.graph.structure`), and :func:`tensor_to_array`, inside
:func:`describing`, turns a described tensor into an :class:`UnreadTensor` (dtype, shape and
where its bytes are, no data). The mark carries a random per-load token after a NUL byte: a
file cannot forge it (a location with a NUL byte is refused).
"""

from __future__ import annotations

import contextlib
import contextvars
import hashlib
import mmap
import os
import secrets
import stat
from collections.abc import Iterator

import numpy as np
import onnx
from onnx import AttributeProto, TensorProto, numpy_helper

from workbench.errors import ModelLoadError
from workbench.limits import check_alloc

ALLOWED_KEYS = ("location", "offset", "length", "checksum")

# bits per element for the packed sub-byte types (stored ceil(n * bits / 8) bytes)
_PACKED_BITS = {}
for _n, _b in (("INT4", 4), ("UINT4", 4), ("FLOAT4E2M1", 4), ("INT2", 2), ("UINT2", 2),
               ("FLOAT6E2M3", 6), ("FLOAT6E3M2", 6)):
    if hasattr(TensorProto, _n):
        _PACKED_BITS[getattr(TensorProto, _n)] = _b


# --------------------------------------------------------------------------- walking
def _txt(v) -> str:
    """A name for messages (protobuf hands back undecodable text as bytes)."""
    return v if isinstance(v, str) else v.decode("utf-8", "replace")


def iter_graph_tensors(g: onnx.GraphProto, where: str = "graph") -> Iterator[tuple]:
    """(TensorProto, where) for every tensor a graph carries, subgraphs included."""
    for t in g.initializer:
        yield t, f"{where}: initializer {_txt(t.name)!r}"
    for st in g.sparse_initializer:
        nm = _txt(st.values.name)
        yield st.values, f"{where}: sparse initializer {nm!r} (values)"
        yield st.indices, f"{where}: sparse initializer {nm!r} (indices)"
    for i, n in enumerate(g.node):
        op = _txt(n.op_type)
        label = f"{where}: node {_txt(n.name) or op + '_' + str(i)!r} ({op})"
        yield from _iter_node_tensors(n, label)


def _iter_node_tensors(n: onnx.NodeProto, label: str) -> Iterator[tuple]:
    for a in n.attribute:
        at = f"{label} attribute {_txt(a.name)!r}"
        if a.type == AttributeProto.TENSOR or a.HasField("t"):
            yield a.t, at
        for k, t in enumerate(a.tensors):
            yield t, f"{at}[{k}]"
        if a.type == AttributeProto.SPARSE_TENSOR or a.HasField("sparse_tensor"):
            yield a.sparse_tensor.values, at + " (values)"
            yield a.sparse_tensor.indices, at + " (indices)"
        for k, st in enumerate(a.sparse_tensors):
            yield st.values, f"{at}[{k}] (values)"
            yield st.indices, f"{at}[{k}] (indices)"
        if a.type == AttributeProto.GRAPH or a.HasField("g"):
            yield from iter_graph_tensors(a.g, f"{at} subgraph")
        for k, sg in enumerate(a.graphs):
            yield from iter_graph_tensors(sg, f"{at}[{k}] subgraph")


def iter_model_tensors(m: onnx.ModelProto) -> Iterator[tuple]:
    """(TensorProto, where) for every tensor in a model: main graph, training info,
    model-local functions."""
    yield from iter_graph_tensors(m.graph, "graph")
    for k, ti in enumerate(m.training_info):
        yield from iter_graph_tensors(ti.initialization, f"training_info[{k}].initialization")
        yield from iter_graph_tensors(ti.algorithm, f"training_info[{k}].algorithm")
    for f in m.functions:
        for i, n in enumerate(f.node):
            yield from _iter_node_tensors(
                n, f"function {_txt(f.domain)}::{_txt(f.name)}: node "
                   f"{_txt(n.name) or _txt(n.op_type) + '_' + str(i)!r}")


def uses_external_data(t: TensorProto) -> bool:
    return t.data_location == TensorProto.EXTERNAL or len(t.external_data) > 0


def has_external_data(m: onnx.ModelProto) -> bool:
    return any(uses_external_data(t) for t, _ in iter_model_tensors(m))


# --------------------------------------------------------------------------- sizes
def expected_nbytes(t: TensorProto, where: str, path: str | None) -> int:
    """Bytes the tensor's dims and dtype need in raw form (Python ints: no overflow)."""
    n = 1
    for d in t.dims:
        if d < 0:
            raise ModelLoadError(f"{where}: negative dimension {d} in dims {list(t.dims)}",
                                 path=path)
        n *= int(d)
    dt = t.data_type
    if dt in _PACKED_BITS:
        return (n * _PACKED_BITS[dt] + 7) // 8
    if dt in (TensorProto.UNDEFINED, TensorProto.STRING):
        kind = "STRING" if dt == TensorProto.STRING else "UNDEFINED"
        raise ModelLoadError(f"{where}: a tensor of element type {kind} cannot be stored as "
                             f"external or raw data", path=path)
    try:
        np_dt = onnx.helper.tensor_dtype_to_np_dtype(dt)
    except (KeyError, ValueError, TypeError):
        raise ModelLoadError(f"{where}: unknown tensor element type {dt}", path=path) from None
    return n * np.dtype(np_dt).itemsize


# --------------------------------------------------------------------------- resolving
def _parse_entries(t: TensorProto, where: str, path: str | None) -> dict:
    info: dict = {}
    for e in t.external_data:
        key, value = e.key, e.value
        if "\x00" in key or "\x00" in value:
            raise ModelLoadError(f"{where}: external data entry {key!r} contains a NUL byte",
                                 path=path)
        if key not in ALLOWED_KEYS:
            raise ModelLoadError(f"{where}: unknown external data key {key!r} (allowed: "
                                 f"{', '.join(ALLOWED_KEYS)})", path=path)
        if key in info:
            raise ModelLoadError(f"{where}: external data key {key!r} given twice", path=path)
        info[key] = value
    for key in ("offset", "length"):
        if key in info:
            v = info[key]
            if not v.isascii() or not v.isdigit():
                raise ModelLoadError(f"{where}: external data {key} {v!r} is not a non-negative "
                                     f"integer", path=path)
            info[key] = int(v)
    if "checksum" in info:
        c = info["checksum"].lower()
        if len(c) != 40 or any(ch not in "0123456789abcdef" for ch in c):
            raise ModelLoadError(f"{where}: external data checksum {info['checksum']!r} is not "
                                 f"a SHA-1 hex digest", path=path)
        info["checksum"] = c
    return info


def _safe_location(loc: str, root: str, where: str, path: str | None) -> str:
    if not loc:
        raise ModelLoadError(f"{where}: external data has no location", path=path)
    norm = loc.replace("\\", "/")
    if os.path.isabs(loc) or norm.startswith("/") or (len(norm) > 1 and norm[1] == ":"):
        raise ModelLoadError(f"{where}: external data location {loc!r} is an absolute path, "
                             f"outside the model's folder; refusing it (locations must be "
                             f"relative paths inside it)",
                             path=path)
    if any(part == ".." for part in norm.split("/")):
        raise ModelLoadError(f"{where}: external data location {loc!r} contains '..'; refusing "
                             f"it: it may point outside the model's folder (locations must be "
                             f"relative paths inside it)", path=path)
    full = os.path.realpath(os.path.join(root, norm))
    if os.path.commonpath([root, full]) != root:
        # the message names no folder: it may be shown to someone who must not learn the
        # server's paths (the JupyterLab viewer); the model's own path is in ``path``
        raise ModelLoadError(f"{where}: external data location {loc!r} leads outside the "
                             f"model's folder (through a symbolic link); refusing it",
                             path=path)
    try:
        st = os.stat(full)
    except OSError:
        raise ModelLoadError(f"{where}: external data file {loc!r} not found in the model's "
                             f"folder", path=path) from None
    if not stat.S_ISREG(st.st_mode):
        raise ModelLoadError(f"{where}: external data location {loc!r} is not a regular file; "
                             f"refusing it", path=path)
    return full


class _Files:
    """Open, memory-mapped external files for one resolution pass."""

    def __init__(self):
        self.maps: dict = {}
        self.checked: set = set()

    def get(self, full: str):
        if full not in self.maps:
            with open(full, "rb") as f:
                size = os.fstat(f.fileno()).st_size
                mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) if size else None
            self.maps[full] = (mm, size)
        return self.maps[full]

    def close(self):
        for mm, _ in self.maps.values():
            if mm is not None:
                mm.close()
        self.maps.clear()


def resolve_external_data(m: onnx.ModelProto, base_dir: str | None,
                          path: str | None = None, *, read: bool = True,
                          mark: str | None = None) -> int:
    """Read every external tensor of ``m`` into its ``raw_data`` (in place), refusing anything
    the rules above forbid. Returns the number of tensors resolved.

    ``read=False``: check the same rules but the checksum, read nothing, and mark each tensor
    described with ``mark`` (:func:`unread_mark`; tensors the structure reader already marked
    with it are left as they are)."""
    ext = [(t, w) for t, w in iter_model_tensors(m)
           if uses_external_data(t) and not (mark and _marked(t, mark))]
    if not ext:
        return 0
    if base_dir is None:
        raise ModelLoadError(
            f"{len(ext)} tensor(s) ({ext[0][1]}) keep their data in external files, but the "
            f"model was given as bytes/ModelProto: load it from its path, or pass "
            f"base_dir= (the folder that holds the data files)", path=path)
    root = os.path.realpath(base_dir)
    if not os.path.isdir(root):
        raise ModelLoadError(f"external data folder {base_dir!r} is not a folder", path=path)
    files = _Files()
    plans = []
    try:
        # validate everything before reading anything
        for t, where in ext:
            if t.data_location != TensorProto.EXTERNAL:
                raise ModelLoadError(f"{where}: has external_data entries but its data_location "
                                     f"is not EXTERNAL", path=path)
            info = _parse_entries(t, where, path)
            full = _safe_location(info.get("location", ""), root, where, path)
            need = expected_nbytes(t, where, path)
            offset = info.get("offset", 0)
            length = info.get("length", need)
            if length != need:
                raise ModelLoadError(
                    f"{where}: external data length {length:,} does not match the "
                    f"{need:,} bytes its dims {list(t.dims)} and type "
                    f"{TensorProto.DataType.Name(t.data_type)} need", path=path)
            size = os.stat(full).st_size if not read else files.get(full)[1]
            if offset + length > size:
                raise ModelLoadError(
                    f"{where}: external data asks for bytes {offset:,}..{offset + length:,} of "
                    f"{info['location']!r}, which has only {size:,} bytes", path=path)
            if not read:
                plans.append((t, info["location"], offset, length))
                continue
            if "checksum" in info and full not in files.checked:
                mm, _ = files.get(full)
                digest = hashlib.sha1(mm if mm is not None else b"").hexdigest()
                if digest != info["checksum"]:
                    raise ModelLoadError(
                        f"{where}: external data file {info['location']!r} fails its SHA-1 "
                        f"checksum (model says {info['checksum']}, file is {digest})",
                        path=path)
                files.checked.add(full)
            check_alloc((length,), itemsize=1, what=f"{where}: external data")
            plans.append((t, full, offset, length))
        if not read:
            for t, loc, offset, length in plans:
                set_mark(t, mark, f"external file {loc!r}", offset, length)
            return len(plans)
        for t, full, offset, length in plans:
            mm, _ = files.get(full)
            t.raw_data = mm[offset:offset + length] if length else b""
            del t.external_data[:]
            t.data_location = TensorProto.DEFAULT
    finally:
        files.close()
    return len(plans)


# --------------------------------------------------------------------------- described tensors
_UNREAD = "\x00workbench-unread:"
_DESCRIBING: contextvars.ContextVar = contextvars.ContextVar("workbench_describing",
                                                             default=None)


def unread_mark() -> str:
    """A fresh mark for one structure-only load (a file cannot contain it: NUL byte)."""
    return _UNREAD + secrets.token_hex(8)


def set_mark(t: TensorProto, mark: str, source: str, offset: int, length: int) -> None:
    """Mark ``t`` (its data already left out) as described, not read: its bytes are
    ``length`` bytes at ``offset`` of ``source``."""
    del t.external_data[:]
    t.data_location = TensorProto.EXTERNAL
    for k, v in (("location", mark), ("source", source), ("offset", str(offset)),
                 ("length", str(length))):
        e = t.external_data.add()
        e.key, e.value = k, v


def _marked(t: TensorProto, mark: str) -> dict | None:
    ed = t.external_data
    if not ed or ed[0].key != "location" or ed[0].value != mark:
        return None
    return {e.key: e.value for e in ed}


def is_described(t: TensorProto) -> bool:
    """True for a tensor marked described by a structure-only load."""
    ed = t.external_data
    return bool(ed) and ed[0].key == "location" and ed[0].value.startswith(_UNREAD)


@contextlib.contextmanager
def describing(mark: str):
    """Within it, :func:`tensor_to_array` answers tensors marked with ``mark`` with an
    :class:`UnreadTensor` instead of refusing them."""
    token = _DESCRIBING.set(mark)
    try:
        yield
    finally:
        _DESCRIBING.reset(token)


class UnreadTensor:
    """A tensor described by a structure-only load (``load(path, weights=False)``): its
    ``dtype``, ``shape``, ``size`` and ``nbytes`` (what the dims need), and where its bytes
    are (``source``, ``offset``, ``stored`` bytes), never its values. Any attempt to read it
    as an array raises :class:`~workbench.errors.ModelLoadError`: load the model with its
    weights to run it."""

    __slots__ = ("shape", "dtype", "source", "offset", "stored", "where")

    def __init__(self, shape, dtype, source: str, offset: int, stored: int, where: str):
        self.shape = tuple(int(d) for d in shape)
        self.dtype = np.dtype(dtype)
        self.source, self.offset, self.stored, self.where = source, offset, stored, where

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def size(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n

    @property
    def nbytes(self) -> int:
        return self.size * self.dtype.itemsize

    def __array__(self, *args, **kwargs):
        raise ModelLoadError(f"{self.where}: the model was loaded without its weights "
                             f"(structure only); its {self.nbytes:,} bytes in {self.source} "
                             f"were not read: load it with weights to compute with it")

    def __len__(self) -> int:
        if not self.shape:
            raise TypeError("len() of a 0-d tensor")
        return self.shape[0]

    def __repr__(self) -> str:
        return (f"UnreadTensor({self.dtype}{list(self.shape)}, {self.stored:,} bytes in "
                f"{self.source}, not read)")


def _described(t: TensorProto, info: dict, where: str, path: str | None) -> UnreadTensor:
    for d in t.dims:
        if d < 0:
            raise ModelLoadError(f"{where}: negative dimension {d} in dims {list(t.dims)}",
                                 path=path)
    if t.data_type == TensorProto.UNDEFINED:
        raise ModelLoadError(f"{where}: element type is UNDEFINED", path=path)
    try:
        np_dt = np.dtype(onnx.helper.tensor_dtype_to_np_dtype(t.data_type))
    except (KeyError, ValueError, TypeError):
        raise ModelLoadError(f"{where}: unknown element type {t.data_type}", path=path) from None
    source = info.get("source", "")
    stored = int(info.get("length", "0"))
    if source.startswith("external file") or source == "raw_data":
        need = expected_nbytes(t, where, path)
        if stored != need:
            raise ModelLoadError(
                f"{where}: {source} has {stored:,} bytes, dims {list(t.dims)} of "
                f"{TensorProto.DataType.Name(t.data_type)} need {need:,}", path=path)
    return UnreadTensor(t.dims, np_dt, source, int(info.get("offset", "0")), stored, where)


# --------------------------------------------------------------------------- conversion
_TYPED_FIELDS = ("float_data", "int32_data", "string_data", "int64_data", "double_data",
                 "uint64_data")


def tensor_to_array(t: TensorProto, where: str | None = None,
                    path: str | None = None) -> np.ndarray:
    """TensorProto -> numpy, with the checks ``numpy_helper.to_array`` lacks: never external,
    data size equal to what dims and dtype need, size within the memory budget."""
    where = where or f"tensor {t.name!r}"
    if uses_external_data(t):
        mark = _DESCRIBING.get()
        info = _marked(t, mark) if mark else None
        if info is not None:
            return _described(t, info, where, path)
        raise ModelLoadError(f"{where}: external data was not resolved through the model's "
                             f"folder; refusing to read it", path=path)
    if t.HasField("segment"):
        raise ModelLoadError(f"{where}: segmented tensors are not supported", path=path)
    if t.data_type == TensorProto.UNDEFINED:
        raise ModelLoadError(f"{where}: element type is UNDEFINED", path=path)
    n = 1
    for d in t.dims:
        if d < 0:
            raise ModelLoadError(f"{where}: negative dimension {d} in dims {list(t.dims)}",
                                 path=path)
        n *= int(d)
    if t.data_type == TensorProto.STRING:
        if len(t.string_data) != n:
            raise ModelLoadError(f"{where}: {len(t.string_data)} strings stored, dims "
                                 f"{list(t.dims)} need {n}", path=path)
    elif t.HasField("raw_data"):
        need = expected_nbytes(t, where, path)
        if len(t.raw_data) != need:
            raise ModelLoadError(
                f"{where}: raw_data has {len(t.raw_data):,} bytes, dims {list(t.dims)} of "
                f"{TensorProto.DataType.Name(t.data_type)} need {need:,}", path=path)
    else:
        stored = sum(len(getattr(t, f)) for f in _TYPED_FIELDS)
        if stored and n:
            try:
                field = onnx.helper.tensor_dtype_to_field(t.data_type)
            except (KeyError, ValueError, TypeError):
                raise ModelLoadError(f"{where}: unknown element type {t.data_type}",
                                     path=path) from None
            have = len(getattr(t, field))
            bits = _PACKED_BITS.get(t.data_type)
            if bits is not None:   # packed types: one byte of packed values per entry
                want = (n * bits + 7) // 8
                ok = (n * bits + 31) // 32 <= have <= n
            else:                  # complex values take two entries each
                want = n * (2 if t.data_type in (TensorProto.COMPLEX64,
                                                 TensorProto.COMPLEX128) else 1)
                ok = have == want
            if not ok:
                raise ModelLoadError(f"{where}: {have} values stored in {field}, dims "
                                     f"{list(t.dims)} need {want}", path=path)
        elif n:
            raise ModelLoadError(f"{where}: dims {list(t.dims)} need {n:,} elements but the "
                                 f"tensor holds no data", path=path)
    try:
        itemsize = np.dtype(onnx.helper.tensor_dtype_to_np_dtype(t.data_type)).itemsize
    except (KeyError, ValueError, TypeError):
        raise ModelLoadError(f"{where}: unknown element type {t.data_type}", path=path) from None
    check_alloc(tuple(t.dims), itemsize=itemsize, what=where)
    try:
        return numpy_helper.to_array(t)
    except (ValueError, TypeError, KeyError) as e:
        raise ModelLoadError(f"{where}: cannot convert to an array: {e}", path=path) from None


def sparse_to_dense(sp: onnx.SparseTensorProto, where: str | None = None,
                    path: str | None = None) -> np.ndarray:
    """SparseTensorProto -> dense numpy array, validating indices and size first."""
    where = where or f"sparse tensor {sp.values.name!r}"
    values = tensor_to_array(sp.values, where + " (values)", path)
    indices = tensor_to_array(sp.indices, where + " (indices)", path)
    dims = tuple(int(d) for d in sp.dims)
    if isinstance(values, UnreadTensor) or isinstance(indices, UnreadTensor):
        if any(d < 0 for d in dims):
            raise ModelLoadError(f"{where}: negative dimension in dims {list(dims)}",
                                 path=path)
        big = values if isinstance(values, UnreadTensor) else indices
        return UnreadTensor(dims, values.dtype, big.source, big.offset, big.stored, where)
    if any(d < 0 for d in dims):
        raise ModelLoadError(f"{where}: negative dimension in dims {list(dims)}", path=path)
    if values.ndim != 1:
        raise ModelLoadError(f"{where}: values must be 1-D, got shape {list(values.shape)}",
                             path=path)
    if indices.dtype.kind not in "iu":
        raise ModelLoadError(f"{where}: indices must be integers, got {indices.dtype}",
                             path=path)
    nnz = values.shape[0]
    total = 1
    for d in dims:
        total *= d
    if indices.ndim == 1:
        ok_shape = indices.shape[0] == nnz
        bounds = [total]
    elif indices.ndim == 2:
        ok_shape = indices.shape == (nnz, len(dims))
        bounds = list(dims)
    else:
        ok_shape = False
        bounds = []
    if not ok_shape:
        raise ModelLoadError(f"{where}: indices of shape {list(indices.shape)} do not fit "
                             f"{nnz} values in dims {list(dims)} (need [{nnz}] or "
                             f"[{nnz}, {len(dims)}])", path=path)
    idx = indices.astype(np.int64)
    if nnz:
        hi = np.asarray(bounds, dtype=object)
        if int(idx.min()) < 0 or (idx.max(axis=0).astype(object) >= hi).any():
            raise ModelLoadError(f"{where}: indices out of range for dims {list(dims)}",
                                 path=path)
    check_alloc(dims, values.dtype, what=where)
    dense = np.zeros(dims, dtype=values.dtype)
    if idx.ndim == 1:
        dense.reshape(-1)[idx] = values
    else:
        dense[tuple(idx.T)] = values
    return dense
