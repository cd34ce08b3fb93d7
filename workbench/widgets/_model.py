"""Turning whatever the user passes (path, bytes, ModelProto, LoadedModel, Graph, a model object
with ``.graph``/``.proto``) into a Graph IR, without running anything."""

from __future__ import annotations

import os
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import onnx

from workbench.graph.ir import Graph


@dataclass
class Source:
    graph: Graph
    proto: onnx.ModelProto | None
    name: str
    original: Any = None


def as_source(model: Any) -> Source:
    """Normalise ``model`` to (Graph, ModelProto or None, display name)."""
    from workbench.graph.load import LoadedModel, load

    if isinstance(model, Source):
        return model
    if isinstance(model, Graph):
        return Source(model, None, model.name or "graph", model)
    if isinstance(model, LoadedModel):
        name = os.path.basename(model.path) if model.path else model.proto.graph.name
        return Source(model.graph, model.proto, name or "model", model)
    if isinstance(model, (str, os.PathLike, bytes, bytearray, memoryview, onnx.ModelProto)):
        lm = load(model, check=False)
        if isinstance(model, (str, os.PathLike)):
            name = os.path.basename(os.fspath(model))
        else:
            name = lm.proto.graph.name or "model"
        return Source(lm.graph, lm.proto, name, model)
    # workbench models: SONNXModel keeps its Graph IR in ``onnx_graph`` (``graph`` is SINGA's
    # graph-mode switch, a method: never call it); other objects may offer ``graph``/``proto``
    g = getattr(model, "onnx_graph", None)
    if not isinstance(g, (Graph, LoadedModel)):
        g = getattr(model, "graph", None)
    if callable(g) and not isinstance(g, Graph):
        g = None
    proto = None
    for attr in ("proto", "_proto", "model_proto"):
        p = getattr(model, attr, None)
        if isinstance(p, onnx.ModelProto):
            proto = p
            break
    if g is None and proto is None and callable(getattr(model, "to_onnx", None)):
        try:
            proto = model.to_onnx()
        except Exception as e:  # a model that must be traced with example inputs first
            raise TypeError(f"cannot show this {type(model).__name__}: to_onnx() failed ({e}); "
                            f"export it first (model.to_onnx(inputs)) and pass the proto") from e
    if isinstance(g, LoadedModel):
        proto = proto or g.proto
        g = g.graph
    if isinstance(g, onnx.GraphProto) and isinstance(proto, onnx.ModelProto):
        g = None
    if isinstance(g, Graph):
        return Source(g, proto if isinstance(proto, onnx.ModelProto) else None,
                      g.name or type(model).__name__, model)
    if isinstance(proto, onnx.ModelProto):
        s = as_source(proto)
        s.original = model
        return s
    raise TypeError(f"cannot show a {type(model).__name__}: give a path to an .onnx file, an "
                    f"onnx.ModelProto, a workbench LoadedModel/Model, or a Graph")


def fmt_shape(shape) -> str:
    if shape is None:
        return "?"
    return "[" + ", ".join("?" if d is None else str(d) for d in shape) + "]"


@lru_cache(maxsize=256)
def dtype_str(dtype) -> str:
    """numpy's name for an ONNX element type (``1`` -> ``float32``); cached: numpy computes
    a dtype's name on every request, and a drawing asks once per value."""
    if not dtype:
        return "?"
    try:
        return onnx.helper.tensor_dtype_to_np_dtype(dtype).name
    except Exception:
        try:
            return onnx.TensorProto.DataType.Name(dtype).lower()
        except Exception:
            return str(dtype)
