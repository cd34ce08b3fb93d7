"""Loading: path, bytes or ModelProto -> validated ModelProto + Graph IR.

Checks, in order: the file exists and parses as an ONNX protobuf; the IR version and the
opsets are ones the installed onnx package knows; external data stays inside the model's
folder; ``onnx.checker`` accepts the model; shape inference runs (a failure there is a
warning, not an error). Input shapes can be overridden (``tensor.PlaceHolder`` batch size).
"""

from __future__ import annotations

import os
import warnings
from dataclasses import dataclass, field
from typing import Any

import onnx
import onnx.checker
import onnx.defs
import onnx.shape_inference
from google.protobuf.message import DecodeError

from workbench.errors import ModelLoadError
from workbench.graph.ir import Graph
from workbench.graph.toposort import fix_quirks


@dataclass
class LoadedModel:
    proto: onnx.ModelProto
    graph: Graph
    path: str | None = None
    notes: list = field(default_factory=list)  # exporter quirks repaired / noticed at load

    @property
    def opsets(self) -> dict:
        return dict(self.graph.opsets)


def _read_proto(src, path: str | None) -> onnx.ModelProto:
    if isinstance(src, onnx.ModelProto):
        return src
    if isinstance(src, (bytes, bytearray, memoryview)):
        data = bytes(src)
    else:
        if not os.path.exists(path):
            raise ModelLoadError("file not found", path=path)
        if os.path.isdir(path):
            raise ModelLoadError("is a folder, not an .onnx file", path=path)
        with open(path, "rb") as f:
            data = f.read()
    if not data:
        raise ModelLoadError("the file is empty (0 bytes), not an ONNX model", path=path)
    m = onnx.ModelProto()
    try:
        m.ParseFromString(data)
    except (DecodeError, RuntimeError, ValueError) as e:
        raise ModelLoadError(
            f"not a valid ONNX model: the protobuf could not be parsed ({e}); the file may be "
            f"truncated, corrupt, or not an .onnx file ({len(data):,} bytes read)",
            path=path) from None
    if not m.HasField("graph") or m.ir_version == 0:
        raise ModelLoadError(
            "not an ONNX model: the data parsed but has no graph or no IR version (is this "
            "really an .onnx file? truncated files often look like this)", path=path)
    return m


def check_versions(m: onnx.ModelProto, path: str | None = None) -> None:
    if m.ir_version > onnx.IR_VERSION:
        raise ModelLoadError(
            f"IR version {m.ir_version} is newer than this onnx package supports "
            f"(IR {onnx.IR_VERSION}, onnx {onnx.__version__}); upgrade onnx or re-export the "
            f"model with an older IR version", path=path)
    newest = onnx.defs.onnx_opset_version()
    for imp in m.opset_import:
        dom = imp.domain or ""
        if dom in ("", "ai.onnx") and imp.version > newest:
            raise ModelLoadError(
                f"opset {imp.version} of domain ai.onnx is newer than the newest supported "
                f"({newest}, onnx {onnx.__version__}); re-export with opset <= {newest}",
                path=path)
        if dom in ("", "ai.onnx") and imp.version < 1:
            raise ModelLoadError(f"invalid ai.onnx opset version {imp.version}", path=path)


def _iter_tensors(g: onnx.GraphProto):
    yield from g.initializer
    for st in g.sparse_initializer:
        yield st.values
        yield st.indices
    for n in g.node:
        for a in n.attribute:
            if a.type == onnx.AttributeProto.TENSOR:
                yield a.t
            elif a.type == onnx.AttributeProto.TENSORS:
                yield from a.tensors
            elif a.type == onnx.AttributeProto.GRAPH:
                yield from _iter_tensors(a.g)
            elif a.type == onnx.AttributeProto.GRAPHS:
                for sg in a.graphs:
                    yield from _iter_tensors(sg)


def load_external_data(m: onnx.ModelProto, base_dir: str | None, path: str | None) -> None:
    """Read external tensor data, refusing any location outside ``base_dir``."""
    ext = [t for t in _iter_tensors(m.graph)
           if t.data_location == onnx.TensorProto.EXTERNAL]
    if not ext:
        return
    if base_dir is None:
        raise ModelLoadError(
            f"{len(ext)} tensor(s) (e.g. {ext[0].name!r}) keep their data in external files, "
            f"but the model was given as bytes/proto: load it from its path so the data can be "
            f"found", path=path)
    root = os.path.realpath(base_dir)
    for t in ext:
        info = {e.key: e.value for e in t.external_data}
        loc = info.get("location")
        if not loc:
            raise ModelLoadError(f"tensor {t.name!r} is external but has no location", path=path)
        full = os.path.realpath(os.path.join(root, loc))
        if os.path.isabs(loc) or os.path.commonpath([root, full]) != root:
            raise ModelLoadError(
                f"tensor {t.name!r}: external data location {loc!r} points outside the model's "
                f"folder {root!r}; refusing to read it (locations must be relative paths inside "
                f"the folder)", path=path)
        if not os.path.isfile(full):
            raise ModelLoadError(
                f"tensor {t.name!r}: external data file {loc!r} not found in {root!r}", path=path)
        offset = int(info.get("offset", 0) or 0)
        length = info.get("length")
        with open(full, "rb") as f:
            f.seek(offset)
            data = f.read(int(length)) if length else f.read()
        if length and len(data) != int(length):
            raise ModelLoadError(
                f"tensor {t.name!r}: external file {loc!r} is truncated (wanted {length} bytes "
                f"at offset {offset}, got {len(data)})", path=path)
        t.raw_data = data
        del t.external_data[:]
        t.data_location = onnx.TensorProto.DEFAULT


def set_input_shapes(m: onnx.ModelProto, shapes: dict | None = None,
                     batch_size: int | None = None) -> None:
    """Override input shapes (whole shapes by name, or just the first dim of every input)."""
    inits = {t.name for t in m.graph.initializer}
    inputs = [i for i in m.graph.input if i.name not in inits]
    names = [i.name for i in inputs]
    for name in (shapes or {}):
        if name not in names:
            raise ModelLoadError(f"cannot set the shape of {name!r}: the model's inputs are "
                                 f"{names}")
    changed = False
    for vi in inputs:
        if not vi.type.HasField("tensor_type"):
            continue
        dims = vi.type.tensor_type.shape.dim
        if shapes and vi.name in shapes:
            new = list(shapes[vi.name])
            vi.type.tensor_type.shape.ClearField("dim")
            for d in new:
                dd = vi.type.tensor_type.shape.dim.add()
                if isinstance(d, str):
                    dd.dim_param = d
                elif d is not None and d >= 0:
                    dd.dim_value = int(d)
            changed = True
        elif batch_size is not None and len(dims) > 0:
            dims[0].Clear()
            dims[0].dim_value = int(batch_size)
            changed = True
    if changed:
        # stale intermediate shapes would contradict the new ones; inference recomputes them
        del m.graph.value_info[:]


def infer_shapes(m: onnx.ModelProto, path: str | None = None) -> onnx.ModelProto:
    try:
        return onnx.shape_inference.infer_shapes(m, check_type=False, strict_mode=False,
                                                 data_prop=True)
    except Exception as e:  # shape inference is a help, not a requirement
        warnings.warn(f"{path or 'model'}: ONNX shape inference failed ({e}); intermediate "
                      f"shapes will be unknown until the model runs", stacklevel=3)
        return m


def load(src: Any, *, check: bool = True, shape_inference: bool = True,
         input_shapes: dict | None = None, batch_size: int | None = None,
         base_dir: str | None = None) -> LoadedModel:
    """Load and validate a model from a path, bytes or a ModelProto.

    The caller's ModelProto is never modified: a copy is made when anything must change.
    """
    path = None
    if isinstance(src, (str, os.PathLike)):
        path = os.fspath(src)
        base_dir = base_dir or os.path.dirname(os.path.abspath(path))
    elif not isinstance(src, (bytes, bytearray, memoryview, onnx.ModelProto)):
        raise ModelLoadError(f"cannot load a model from a {type(src).__name__}; give a path, "
                             f"bytes or an onnx.ModelProto")
    m = _read_proto(src, path)
    check_versions(m, path)
    needs_copy = isinstance(src, onnx.ModelProto) and (
        input_shapes or batch_size is not None
        or any(t.data_location == onnx.TensorProto.EXTERNAL for t in _iter_tensors(m.graph)))
    if needs_copy:
        m2 = onnx.ModelProto()
        m2.CopyFrom(m)
        m = m2
    load_external_data(m, base_dir, path)
    m, notes = fix_quirks(m, path, owned=m is not src)
    if check:
        try:
            onnx.checker.check_model(m)
        except onnx.checker.ValidationError as e:
            msg = str(e).strip().splitlines()
            raise ModelLoadError("the model fails onnx.checker: " + " | ".join(msg[:6]),
                                 path=path) from None
        except ValueError as e:  # e.g. models over 2 GB
            warnings.warn(f"{path or 'model'}: onnx.checker skipped: {e}", stacklevel=2)
    if input_shapes or batch_size is not None:
        set_input_shapes(m, input_shapes, batch_size)
    if shape_inference:
        m = infer_shapes(m, path)
    opsets = {(o.domain or ""): int(o.version) for o in m.opset_import}
    if "ai.onnx" in opsets:
        opsets.setdefault("", opsets.pop("ai.onnx"))
    try:
        graph = Graph.from_proto(m.graph, opsets, base_dir)
    except Exception as e:
        raise ModelLoadError(f"could not read the graph: {type(e).__name__}: {e}",
                             path=path) from e
    return LoadedModel(m, graph, path, notes)
