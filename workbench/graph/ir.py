"""The Graph IR: nodes, values (name, dtype, shape), initializers and subgraphs.

A thin, mutable, Python-native view of an ONNX graph that passes rewrite and the executor plans
from. ``Graph.from_proto`` / ``Graph.to_proto`` convert both ways without losing information
the engine does not model (doc strings, metadata stay on the ModelProto kept by the loader).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import onnx
from onnx import AttributeProto, helper, numpy_helper

from workbench.graph.external import sparse_to_dense, tensor_to_array


@dataclass
class ValueInfo:
    """Name, element type and shape of a value; ``shape`` entries are int, str (symbolic) or
    None (unknown); ``shape`` itself is None when the rank is unknown. ``type_proto`` keeps
    non-tensor types (sequences, optionals)."""

    name: str
    dtype: int | None = None
    shape: tuple | None = None
    type_proto: Any = None

    @classmethod
    def from_proto(cls, vi: onnx.ValueInfoProto) -> ValueInfo:
        t = vi.type
        dtype, shape = None, None
        if t.HasField("tensor_type"):
            tt = t.tensor_type
            dtype = tt.elem_type or None
            if tt.HasField("shape"):
                dims = []
                for d in tt.shape.dim:
                    if d.HasField("dim_value"):
                        dims.append(int(d.dim_value))
                    elif d.HasField("dim_param"):
                        dims.append(d.dim_param)
                    else:
                        dims.append(None)
                shape = tuple(dims)
        return cls(vi.name, dtype, shape, t)

    def to_proto(self) -> onnx.ValueInfoProto:
        if self.type_proto is not None and not self.type_proto.HasField("tensor_type"):
            vi = onnx.ValueInfoProto(name=self.name)
            vi.type.CopyFrom(self.type_proto)
            return vi
        return helper.make_tensor_value_info(
            self.name, self.dtype or 0, None if self.shape is None else list(self.shape))

    @property
    def is_tensor(self) -> bool:
        return self.type_proto is None or self.type_proto.HasField("tensor_type")


@dataclass
class Node:
    op_type: str
    inputs: list
    outputs: list
    attrs: dict = field(default_factory=dict)
    name: str = ""
    domain: str = ""
    doc_string: str = ""

    def __repr__(self) -> str:
        return f"Node({self.name!r}, {self.op_type}, {self.inputs} -> {self.outputs})"

    @property
    def subgraphs(self) -> list:
        out = []
        for v in self.attrs.values():
            if isinstance(v, Graph):
                out.append(v)
            elif isinstance(v, list) and v and isinstance(v[0], Graph):
                out.extend(v)
        return out


class AttrArray(np.ndarray):
    """A repeated numeric attribute (ONNX ``FLOATS`` / ``INTS``) held as a 1-D numpy array
    (float32 / int64) instead of a Python list: the nodes of :data:`ARRAY_ATTRIBUTE_OPS`
    (tree ensembles: millions of entries, about 36 bytes each as a list of Python numbers,
    4 or 8 here, and read 20-60x faster; their long STRINGS, the node modes, are read as a
    list of shared str objects, see :func:`_few_strings`). It is written back as the same
    repeated attribute (:func:`python_to_attr`), never as a tensor; ``tolist()`` gives the
    list."""

    @classmethod
    def of(cls, values, dtype) -> AttrArray:
        return np.asarray(values, dtype=dtype).reshape(-1).view(cls)

    def __reduce__(self):       # pickles (worker processes, caches) as a plain array + type
        return (_attr_array, (np.asarray(self),))


def _attr_array(a) -> AttrArray:
    return np.asarray(a).view(AttrArray)


#: (domain, op) of the nodes whose FLOATS / INTS attributes are read as :class:`AttrArray`
ARRAY_ATTRIBUTE_OPS = frozenset({("ai.onnx.ml", "TreeEnsembleClassifier"),
                                 ("ai.onnx.ml", "TreeEnsembleRegressor"),
                                 ("ai.onnx.ml", "TreeEnsemble")})


#: a STRINGS attribute of an ARRAY_ATTRIBUTE_OPS node longer than this is read through
#: :func:`_few_strings` (a tree's node modes: millions of entries, a handful of names)
FEW_STRINGS_MIN = 4096
#: distinct strings :func:`_few_strings` handles (more: the general path)
FEW_STRINGS_MAX = 64
_STRING_TAG = 0x4A      # AttributeProto.strings (field 9, length-delimited): its wire tag


def _few_strings(a: onnx.AttributeProto):
    """The entries of a long STRINGS attribute made of a few distinct short strings (a
    tree ensemble's ``nodes_modes``), as a list of shared str objects (one per distinct
    name), read from the attribute's serialised bytes with numpy instead of making one
    Python object per entry; None when the bytes are not that simple (an entry longer than
    16 bytes, a tag byte inside an entry, many distinct values, one not UTF-8): the caller
    then reads them one by one.

    Each entry is encoded as the tag byte, its length (one byte below 128) and its bytes;
    the entries' chain (each starts where the previous ended) and their count are checked.
    An entry is told by its length and its bytes read as two little-endian 64-bit words."""
    n = len(a.strings)
    first = a.strings[0]
    if len(first) > 16:
        return None
    data = a.SerializeToString()
    start = data.find(bytes([_STRING_TAG, len(first)]) + first)
    if start < 0:
        return None
    raw = np.frombuffer(data, np.uint8)
    tags = np.flatnonzero(raw[start:] == _STRING_TAG)[:n] + start
    if tags.size != n:
        return None
    lens = raw[np.minimum(tags + 1, raw.size - 1)].astype(np.int64)
    if lens.max() > 16 or tags[-1] + 2 + lens[-1] > raw.size or \
            (n > 1 and not np.array_equal(tags[1:], tags[:-1] + 2 + lens[:-1])):
        return None
    # every 8 bytes from every offset, as one little-endian word (an unaligned view)
    padded = data + bytes(16)
    win = np.ndarray((len(padded) - 7,), "<u8", buffer=padded, strides=(1,))
    masks = np.array([(1 << (8 * k)) - 1 for k in range(9)], np.uint64)
    key = [lens, win[tags + 2] & masks[np.minimum(lens, 8)],
           win[tags + 10] & masks[np.clip(lens - 8, 0, 8)]]
    codes = np.full(n, -1, np.int32)
    names: list = []
    left = np.ones(n, bool)
    while left.any():
        if len(names) >= FEW_STRINGS_MAX:
            return None
        k = int(np.argmax(left))
        same = left & (key[0] == key[0][k]) & (key[1] == key[1][k]) & (key[2] == key[2][k])
        codes[same] = len(names)
        left &= ~same
        try:
            names.append(data[tags[k] + 2: tags[k] + 2 + lens[k]].decode("utf-8"))
        except UnicodeDecodeError:
            return None     # the general path decides how undecodable entries read
    return np.array(names, dtype=object)[codes].tolist()


def attr_to_python(a: onnx.AttributeProto, opsets: dict, where: str = "", *,
                   arrays: bool = False):
    """Python value of an attribute; tensors go through the checked conversion (external
    data must have been resolved by the loader: ``workbench.graph.external``). ``arrays``:
    FLOATS / INTS as an :class:`AttrArray` (float32 / int64), not a list."""
    t = a.type
    if arrays and t == AttributeProto.FLOATS:
        return AttrArray.of(a.floats, np.float32)
    if arrays and t == AttributeProto.INTS:
        return AttrArray.of(a.ints, np.int64)
    if arrays and t == AttributeProto.STRINGS and len(a.strings) > FEW_STRINGS_MIN:
        few = _few_strings(a)
        if few is not None:
            return few
    where = f"{where} attribute {a.name!r}".strip()
    if t == AttributeProto.FLOAT:
        return float(a.f)
    if t == AttributeProto.INT:
        return int(a.i)
    if t == AttributeProto.STRING:
        try:
            return a.s.decode("utf-8")
        except UnicodeDecodeError:
            return a.s
    if t == AttributeProto.TENSOR:
        return tensor_to_array(a.t, where)
    if t == AttributeProto.GRAPH:
        return Graph.from_proto(a.g, opsets)
    if t == AttributeProto.SPARSE_TENSOR:
        return sparse_to_dense(a.sparse_tensor, where)
    # (list() of a repeated field gives Python floats/ints 5x faster than a comprehension:
    # seconds for the millions of entries of a large tree ensemble's attributes)
    if t == AttributeProto.FLOATS:
        return list(a.floats)
    if t == AttributeProto.INTS:
        return list(a.ints)
    if t == AttributeProto.STRINGS:
        strs = a.strings
        if len(strs) > 64:   # one decode for all (a tree ensemble's millions of node modes)
            parts = b"\0".join(strs).decode("utf-8").split("\0")
            if len(parts) == len(strs):     # (else a string holds a NUL: one by one)
                return parts
        return [s.decode("utf-8") for s in strs]
    if t == AttributeProto.TENSORS:
        return [tensor_to_array(x, f"{where}[{k}]") for k, x in enumerate(a.tensors)]
    if t == AttributeProto.SPARSE_TENSORS:
        return [sparse_to_dense(x, f"{where}[{k}]") for k, x in enumerate(a.sparse_tensors)]
    if t == AttributeProto.GRAPHS:
        return [Graph.from_proto(g, opsets) for g in a.graphs]
    if t == AttributeProto.TYPE_PROTO:
        return a.tp
    if t == AttributeProto.TYPE_PROTOS:
        return list(a.type_protos)
    return helper.get_attribute_value(a)


def _empty_list_type(name: str, op_type: str | None, domain: str | None) -> int:
    """The AttributeProto type of an empty list attribute (onnx cannot infer it from no
    values): the op's schema's where it has one, else INTS (an empty list reads back as an
    empty list whatever the list type: the engine's own fused nodes, e.g. NhwcConv's
    ``activation_params``)."""
    if op_type:
        try:
            schema = onnx.defs.get_schema(op_type, domain=domain or "")
            attr = schema.attributes.get(name)
            if attr is not None and attr.type in _LIST_TYPES:
                return attr.type
        except Exception:  # noqa: BLE001 - no schema (a custom or the engine's own domain)
            pass
    return AttributeProto.INTS


_LIST_TYPES = {AttributeProto.INTS, AttributeProto.FLOATS, AttributeProto.STRINGS,
               AttributeProto.TENSORS, AttributeProto.GRAPHS, AttributeProto.TYPE_PROTOS}


def python_to_attr(name: str, value, op_type: str | None = None,
                   domain: str | None = None) -> onnx.AttributeProto:
    if isinstance(value, (list, tuple)) and not len(value):
        return AttributeProto(name=name, type=_empty_list_type(name, op_type, domain))
    if isinstance(value, AttrArray):
        floats = value.dtype.kind == "f"
        a = AttributeProto(name=name, type=AttributeProto.FLOATS if floats
                           else AttributeProto.INTS)
        (a.floats if floats else a.ints).extend(value.tolist())
        return a
    if isinstance(value, Graph):
        return helper.make_attribute(name, value.to_proto())
    if isinstance(value, list) and value and isinstance(value[0], Graph):
        return helper.make_attribute(name, [g.to_proto() for g in value])
    if isinstance(value, np.ndarray):
        return helper.make_attribute(name, numpy_helper.from_array(value))
    if isinstance(value, list) and value and isinstance(value[0], np.ndarray):
        return helper.make_attribute(name, [numpy_helper.from_array(v) for v in value])
    if isinstance(value, onnx.TypeProto):
        a = AttributeProto(name=name, type=AttributeProto.TYPE_PROTO)
        a.tp.CopyFrom(value)
        return a
    return helper.make_attribute(name, value)


@dataclass
class Graph:
    name: str = "graph"
    nodes: list = field(default_factory=list)
    inputs: list = field(default_factory=list)        # ValueInfo, graph inputs (not initializers)
    outputs: list = field(default_factory=list)       # ValueInfo
    initializers: dict = field(default_factory=dict)  # name -> numpy array
    value_info: dict = field(default_factory=dict)    # name -> ValueInfo (intermediates)
    opsets: dict = field(default_factory=lambda: {"": 17})
    doc_string: str = ""

    # ------------------------------------------------------------------ conversion
    @classmethod
    def from_proto(cls, g: onnx.GraphProto, opsets: dict) -> Graph:
        """Graph IR of a GraphProto whose external data is already resolved (the loader does
        that through ``workbench.graph.external``; anything still external is refused)."""
        inits = {}
        for t in g.initializer:
            inits[t.name] = tensor_to_array(t, f"graph {g.name!r}: initializer {t.name!r}")
        for st in g.sparse_initializer:
            inits[st.values.name] = sparse_to_dense(
                st, f"graph {g.name!r}: sparse initializer {st.values.name!r}")
        inputs = [ValueInfo.from_proto(v) for v in g.input if v.name not in inits]
        outputs = [ValueInfo.from_proto(v) for v in g.output]
        vinfo = {v.name: ValueInfo.from_proto(v) for v in g.value_info}
        for v in g.input:
            if v.name in inits:
                vinfo[v.name] = ValueInfo.from_proto(v)
        nodes = []
        for i, n in enumerate(g.node):
            label = f"node {n.name or n.op_type + '_' + str(i)!r} ({n.op_type})"
            arrays = (n.domain, n.op_type) in ARRAY_ATTRIBUTE_OPS
            attrs = {a.name: attr_to_python(a, opsets, label, arrays=arrays)
                     for a in n.attribute}
            nodes.append(Node(n.op_type, list(n.input), list(n.output), attrs,
                              n.name or f"{n.op_type}_{i}", n.domain, n.doc_string))
        return cls(g.name, nodes, inputs, outputs, inits, vinfo, dict(opsets), g.doc_string)

    def to_proto(self) -> onnx.GraphProto:
        nodes = []
        for n in self.nodes:
            pn = helper.make_node(n.op_type, n.inputs, n.outputs, name=n.name or None,
                                  domain=n.domain or None)
            if n.doc_string:
                pn.doc_string = n.doc_string
            pn.attribute.extend(python_to_attr(k, v, n.op_type, n.domain)
                                for k, v in n.attrs.items())
            nodes.append(pn)
        inits = [numpy_helper.from_array(np.asarray(v), k) for k, v in self.initializers.items()]
        g = helper.make_graph(nodes, self.name, [v.to_proto() for v in self.inputs],
                              [v.to_proto() for v in self.outputs], inits,
                              doc_string=self.doc_string or None)
        known = {v.name for v in self.inputs} | {v.name for v in self.outputs}
        g.value_info.extend(v.to_proto() for k, v in self.value_info.items()
                            if k not in known and k not in self.initializers
                            and (v.dtype or v.type_proto is not None))
        return g

    # ------------------------------------------------------------------ queries
    def producers(self) -> dict:
        """value name -> node that produces it."""
        return {o: n for n in self.nodes for o in n.outputs if o}

    def consumers(self) -> dict:
        out: dict = {}
        for n in self.nodes:
            for i in n.inputs:
                if i:
                    out.setdefault(i, []).append(n)
            for sg in n.subgraphs:
                for name in sg.free_variables():
                    out.setdefault(name, []).append(n)
        return out

    def free_variables(self) -> set:
        """Names this (sub)graph reads from an enclosing scope."""
        defined = {v.name for v in self.inputs} | set(self.initializers)
        used = set()
        for n in self.nodes:
            for i in n.inputs:
                if i and i not in defined:
                    used.add(i)
            for sg in n.subgraphs:
                used |= {x for x in sg.free_variables() if x not in defined}
            defined.update(o for o in n.outputs if o)
        for o in self.outputs:
            if o.name not in defined:
                used.add(o.name)
        return used

    def value_lookup(self):
        """A function ``name -> ValueInfo | None`` answering as :meth:`value` does, in
        constant time: an index of the inputs, outputs and value_info built once (``value``
        scans the inputs and outputs each call, quadratic over a graph's values when it has
        thousands of inputs). A snapshot: build a new one after editing the graph."""
        index = dict(self.value_info)
        index.update((v.name, v) for v in reversed(self.outputs))
        index.update((v.name, v) for v in reversed(self.inputs))

        def lookup(name: str) -> ValueInfo | None:
            v = index.get(name)
            return v if v is not None or name not in self.initializers else self.value(name)
        return lookup

    def value(self, name: str) -> ValueInfo | None:
        for v in self.inputs:
            if v.name == name:
                return v
        for v in self.outputs:
            if v.name == name:
                return v
        if name in self.value_info:
            return self.value_info[name]
        if name in self.initializers:
            a = self.initializers[name]
            from workbench.arrays.dtypes import onnx_dtype_of_np
            try:
                return ValueInfo(name, onnx_dtype_of_np(a.dtype), tuple(a.shape))
            except TypeError:
                return ValueInfo(name, None, tuple(a.shape))
        return None

    def node_by_name(self, name: str) -> Node | None:
        for n in self.nodes:
            if n.name == name:
                return n
        return None

    def copy(self) -> Graph:
        """Shallow-structural copy: new node/value lists, shared initializer arrays."""
        return Graph(self.name,
                     [Node(n.op_type, list(n.inputs), list(n.outputs), dict(n.attrs), n.name,
                           n.domain, n.doc_string) for n in self.nodes],
                     [ValueInfo(v.name, v.dtype, v.shape, v.type_proto) for v in self.inputs],
                     [ValueInfo(v.name, v.dtype, v.shape, v.type_proto) for v in self.outputs],
                     dict(self.initializers), dict(self.value_info), dict(self.opsets),
                     self.doc_string)

    def num_parameters(self) -> int:
        return int(sum(int(np.prod(a.shape)) for a in self.initializers.values()))
