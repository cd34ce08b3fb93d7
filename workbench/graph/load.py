"""Loading: path, bytes or ModelProto -> validated ModelProto + Graph IR.

Checks, in order: the file exists and parses as an ONNX protobuf; the IR version and the
opsets are ones the installed onnx package knows; external data stays inside the model's
folder; ``onnx.checker`` accepts the model; shape inference runs (a failure there is a
warning, not an error). Input shapes can be overridden (``tensor.PlaceHolder`` batch size).

``weights=False`` reads the structure only (the viewer): tensors holding more than a few KiB,
inline or in external files, are described (dtype, shape, where their bytes are:
``external.UnreadTensor``), never read (``workbench.graph.structure``).
"""

from __future__ import annotations

import contextlib
import os
import stat
import warnings
from dataclasses import dataclass, field
from typing import Any

import onnx
import onnx.defs
from google.protobuf.message import DecodeError

from workbench.errors import ModelLoadError, WorkbenchError
from workbench.graph import isolated
from workbench.graph.external import (
    describing,
    has_external_data,
    resolve_external_data,
    unread_mark,
)
from workbench.graph.formats import identify, identify_folder
from workbench.graph.functions import inline_functions
from workbench.graph.ir import Graph
from workbench.graph.quirks import fix_quirks
from workbench.graph.structure import read_structure, read_structure_file

# protobuf's hard limit on one serialised message
MAX_PROTO_BYTES = 2**31 - 1


@dataclass
class LoadedModel:
    proto: onnx.ModelProto
    graph: Graph
    path: str | None = None
    notes: list = field(default_factory=list)  # exporter quirks repaired / noticed at load
    weights: bool = True      # False: big tensors described (UnreadTensor), not read

    @property
    def opsets(self) -> dict:
        return dict(self.graph.opsets)


def _read_proto(src, path: str | None, mark: str | None = None) -> onnx.ModelProto:
    """The parsed model; with ``mark`` (structure only) big tensors are left out, marked."""
    if isinstance(src, onnx.ModelProto):
        return src
    if isinstance(src, (bytes, bytearray, memoryview)):
        data = bytes(src)
    else:
        if not os.path.exists(path):
            raise ModelLoadError("file not found", path=path)
        if os.path.isdir(path):
            raise ModelLoadError(identify_folder(path) or "is a folder, not an .onnx file",
                                 path=path)
        st = os.stat(path)
        if not stat.S_ISREG(st.st_mode):
            raise ModelLoadError("is not a regular file (a device, FIFO or socket); refusing to "
                                 "read it as a model", path=path)
        if st.st_size > MAX_PROTO_BYTES:
            raise ModelLoadError(
                f"the file has {st.st_size:,} bytes, more than the 2 GiB a protobuf ONNX file can "
                f"hold; models this big keep their weights in external data files next to the "
                f".onnx file", path=path)
        if mark is not None and st.st_size:
            with _naming_other_formats(path, None):
                return _check_parsed(read_structure_file(path, mark, st.st_size)[0], path)
        with open(path, "rb") as f:
            # the file's size (+1 to see a file that grew), not the 2 GiB limit: read(n)
            # reserves n bytes first, which fails under an address-space limit
            data = f.read(st.st_size + 1)
    if not data:
        raise ModelLoadError("the file is empty (0 bytes), not an ONNX model", path=path)
    with _naming_other_formats(path, data):
        if mark is not None:
            return _structure(data, mark, path)
        m = onnx.ModelProto()
        try:
            m.ParseFromString(data)
        except (DecodeError, RuntimeError, ValueError) as e:
            raise ModelLoadError(
                f"not a valid ONNX model: the protobuf could not be parsed ({e}); the file may "
                f"be truncated, corrupt, or not an .onnx file ({len(data):,} bytes read)",
                path=path) from None
        return _check_parsed(m, path)


@contextlib.contextmanager
def _naming_other_formats(path: str | None, data: bytes | None):
    """A file that does not parse as ONNX: say what it is when it is a known other format
    (a PyTorch checkpoint, a TensorFlow or Keras model, a web page...) and how to export it
    to ONNX (``workbench.graph.formats``); otherwise the parser's error stands."""
    try:
        yield
    except ModelLoadError:
        what = identify(path, data if path is None else None)
        if what is None:
            raise
        raise ModelLoadError(f"this is {what}", path=path) from None


def _structure(buf, mark: str, path: str | None) -> onnx.ModelProto:
    m, _, _ = read_structure(buf, mark, path=path)
    return _check_parsed(m, path)


def _check_parsed(m: onnx.ModelProto, path: str | None) -> onnx.ModelProto:
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


def set_input_shapes(m: onnx.ModelProto, shapes: dict | None = None,
                     batch_size: int | None = None) -> None:
    """Override input shapes (whole shapes by name, or just the first dim of every input)."""
    inits = {t.name for t in m.graph.initializer}
    inputs = [i for i in m.graph.input if i.name not in inits]
    names = [i.name for i in inputs]
    known = set(names)
    for name in (shapes or {}):
        if name not in known:
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


def check_attributes(m: onnx.ModelProto, path: str | None = None) -> None:
    """Refuse attribute values no valid model has, and names that are not text, before any
    C++ code sees them.

    Axis-like attributes (``axis``, ``axes``, ``*_axis``) must be small: ONNX ranks are far
    below 2**16, and huge values have crashed onnx's shape inference.
    """
    def text(v, what):
        # protobuf hands back undecodable string fields as bytes
        if not isinstance(v, str):
            raise ModelLoadError(f"{where_now[0]}{what} {v[:40]!r} is not valid UTF-8 text; the "
                                 f"file is corrupt", path=path)

    where_now = [""]

    def walk(g: onnx.GraphProto, where: str):
        where_now[0] = where
        text(g.name, "graph name")
        for v in (*g.input, *g.output, *g.value_info, *g.initializer):
            text(v.name, "value name")
        for st in g.sparse_initializer:
            text(st.values.name, "value name")
        walk_nodes(g.node, where)

    def walk_nodes(nodes, where: str):
        where_now[0] = where
        for i, n in enumerate(nodes):
            for fld in ("name", "op_type", "domain"):
                text(getattr(n, fld), f"node #{i} {fld}")
            for v in (*n.input, *n.output):
                text(v, f"node {n.name or n.op_type!r} input/output name")
            for a in n.attribute:
                text(a.name, f"node {n.name or n.op_type!r} attribute name")
                name = a.name.lower()
                if name == "axis" or name.endswith("_axis") or name == "axes":
                    vals = [a.i] if a.type == onnx.AttributeProto.INT else list(a.ints)
                    bad = [v for v in vals if abs(v) > _MAX_AXIS]
                    if bad:
                        raise ModelLoadError(
                            f"{where}node {n.name or n.op_type + '_' + str(i)!r} "
                            f"({n.op_type}): attribute {a.name}={bad[0]} is not a valid axis "
                            f"(|axis| must be below the tensor's rank)", path=path)
                if n.op_type == "Einsum" and a.name == "equation" and not n.domain:
                    eq = a.s.decode("utf-8", "replace") if isinstance(a.s, bytes) else a.s
                    if not _EINSUM_CHARS.issuperset(eq):
                        raise ModelLoadError(
                            f"{where}node {n.name or n.op_type!r} (Einsum): equation {eq[:80]!r} "
                            f"holds characters an einsum equation cannot (letters, ',', '->', "
                            f"'...' and spaces only)", path=path)
                if a.type == onnx.AttributeProto.GRAPH:
                    walk(a.g, f"{where}node {n.name or n.op_type!r} subgraph {a.name!r}: ")
                for sg in a.graphs:
                    walk(sg, f"{where}node {n.name or n.op_type!r} subgraph {a.name!r}: ")
                where_now[0] = where
    walk(m.graph, "")
    for k, ti in enumerate(m.training_info):
        walk(ti.initialization, f"training_info[{k}].initialization: ")
        walk(ti.algorithm, f"training_info[{k}].algorithm: ")
    for f in m.functions:
        where_now[0] = ""
        text(f.domain, "function domain")
        text(f.name, "function name")
        for v in (*f.input, *f.output, *f.attribute):
            text(v, f"function {f.name!r} input/output/attribute name")
        walk_nodes(f.node, f"function {f.domain}::{f.name}: ")
        for o in f.opset_import:
            text(o.domain, "opset domain")
    for o in m.opset_import:
        text(o.domain, "opset domain")


_MAX_AXIS = 1 << 16
_EINSUM_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ,->. ")


def check_function_calls(m: onnx.ModelProto, path: str | None = None) -> None:
    """Model-local functions must not call themselves, directly or through others (onnx's
    inliner would recurse without end); refused before any C++ code sees them."""
    funcs = {(f.domain, f.name): f for f in m.functions}

    def callees(nodes):
        out = set()
        for n in nodes:
            if (n.domain, n.op_type) in funcs:
                out.add((n.domain, n.op_type))
            for a in n.attribute:
                if a.type == onnx.AttributeProto.GRAPH:
                    out |= callees(a.g.node)
                for g in a.graphs:
                    out |= callees(g.node)
        return out

    calls = {k: callees(f.node) for k, f in funcs.items()}
    state: dict = {}

    def visit(k, chain):
        if state.get(k) == 1:
            cyc = chain[chain.index(k):] + [k]
            raise ModelLoadError("model-local functions call themselves: "
                                 + " -> ".join(f"{d}::{n}" for d, n in cyc)
                                 + "; recursive functions are not allowed", path=path)
        if state.get(k) == 2:
            return
        state[k] = 1
        for c in sorted(calls[k]):
            visit(c, chain + [k])
        state[k] = 2

    for k in sorted(funcs):
        visit(k, [])


def check_and_infer(m: onnx.ModelProto, *, check: bool, infer: bool,
                    path: str | None = None, described: bool = False) -> onnx.ModelProto:
    """onnx.checker (a refusal is a ModelLoadError) and shape inference (a failure there is a
    warning), both in a helper process so that a crash in onnx's C++ code cannot take this
    process down (``workbench.graph.isolated``). ``described``: ``m`` has tensors a
    structure-only load described without their data."""
    try:
        inferred = isolated.check_and_infer(m, check=check, infer=infer, path=path,
                                            described=described)
    except isolated.CheckFailed as e:
        msg = str(e).strip().splitlines()
        raise ModelLoadError("the model fails onnx.checker: " + " | ".join(msg[:6]),
                             path=path) from None
    except isolated.TypeRefused as e:
        msg = str(e).strip().splitlines()
        raise ModelLoadError(
            "a node's input or output type is not one its operator accepts (onnx's type "
            "check; onnxruntime refuses such a graph too): " + " | ".join(msg[:4]),
            path=path) from None
    except isolated.InferenceFailed as e:
        warnings.warn(f"{path or 'model'}: ONNX shape inference failed ({e}); intermediate "
                      f"shapes will be unknown until the model runs", stacklevel=3)
        return m
    except isolated.InferenceOutOfMemory:     # the checker, if asked, passed
        warnings.warn(f"{path or 'model'}: ONNX shape inference failed: it ran out of memory "
                      f"in its helper process (limit "
                      f"{isolated.helper_memory_limit() / 2**20:,.0f} MiB, "
                      f"WORKBENCH_HELPER_MEMORY); intermediate shapes will be unknown until "
                      f"the model runs", stacklevel=3)
        return m
    return inferred if inferred is not None else m


def load(src: Any, *, check: bool = True, shape_inference: bool = True,
         input_shapes: dict | None = None, batch_size: int | None = None,
         base_dir: str | None = None, weights: bool = True) -> LoadedModel:
    """Load and validate a model from a path, bytes or a ModelProto.

    The caller's ModelProto is never modified: a copy is made when anything must change.
    ``weights=False`` (a path or bytes): the structure only; tensors above a few KiB become
    ``UnreadTensor`` descriptions and no external data file is read (their locations and
    sizes are still checked). Such a model can be shown, not run.
    """
    path = None
    if isinstance(src, (str, os.PathLike)):
        path = os.fspath(src)
        base_dir = base_dir or os.path.dirname(os.path.abspath(path))
    elif not isinstance(src, (bytes, bytearray, memoryview, onnx.ModelProto)):
        raise ModelLoadError(f"cannot load a model from a {type(src).__name__}; give a path, "
                             f"bytes or an onnx.ModelProto")
    mark = None
    if not weights:
        if isinstance(src, onnx.ModelProto):
            raise ModelLoadError("weights=False reads a file or bytes without their weights; "
                                 "a ModelProto is already in memory: load it as it is")
        mark = unread_mark()
    m = _read_proto(src, path, mark)
    check_versions(m, path)
    check_attributes(m, path)
    needs_copy = isinstance(src, onnx.ModelProto) and (
        input_shapes or batch_size is not None or len(m.functions) > 0
        or has_external_data(m))
    if needs_copy:
        m2 = onnx.ModelProto()
        m2.CopyFrom(m)
        m = m2
    resolve_external_data(m, base_dir, path, read=weights, mark=mark)
    m, notes = fix_quirks(m, path, owned=m is not src)
    if input_shapes or batch_size is not None:
        set_input_shapes(m, input_shapes, batch_size)
    if m.functions:
        check_function_calls(m, path)
        inline_functions(m, path)
    if check or shape_inference:
        if check and not shape_inference:
            check_and_infer(m, check=True, infer=False, path=path, described=not weights)
        else:
            m = check_and_infer(m, check=check, infer=True, path=path, described=not weights)
    opsets = {(o.domain or ""): int(o.version) for o in m.opset_import}
    if "ai.onnx" in opsets:
        opsets.setdefault("", opsets.pop("ai.onnx"))
    try:
        if mark is None:
            graph = Graph.from_proto(m.graph, opsets)
        else:
            with describing(mark):
                graph = Graph.from_proto(m.graph, opsets)
    except WorkbenchError as e:
        if isinstance(e, ModelLoadError) and e.path is None and path:
            raise ModelLoadError(str(e), path=path) from None
        raise
    except Exception as e:
        raise ModelLoadError(f"could not read the graph: {type(e).__name__}: {e}",
                             path=path) from e
    return LoadedModel(m, graph, path, notes, weights)
