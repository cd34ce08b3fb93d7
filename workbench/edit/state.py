"""The model an edit session holds, and the working copy an edit changes.

A :class:`ModelState` is one version of the model: the ``ModelProto`` without its initializers
(the *skeleton*: nodes, inputs, outputs, metadata, Constant nodes) and the initializers by
name. States are never changed after they are made, so the states of an undo history share
every initializer that an edit did not touch: a hundred edits of a 500 MB model hold one copy
of its weights, not a hundred.

An edit works on a :class:`Draft`: a copy of the skeleton plus a copy of the initializer dict
(the TensorProtos themselves are shared and replaced, never changed in place). ``Draft`` has
the lookups every edit needs (nodes by name or by output, producers, consumers, fresh names)
and the clean-up after it (nodes and initializers nothing reads any more).
"""

from __future__ import annotations

import difflib

import numpy as np
import onnx
from onnx import AttributeProto, numpy_helper

from workbench.arrays.dtypes import dtype_name, np_dtype_of_onnx
from workbench.edit.errors import EditError
from workbench.graph.external import tensor_to_array

#: initializers up to this size stay in ``ModelState.light()`` (shape constants)
LIGHT_BYTES = 4096


def subgraphs(node: onnx.NodeProto):
    """The GraphProtos in ``node``'s attributes (If branches, Loop/Scan bodies)."""
    for a in node.attribute:
        if a.type == AttributeProto.GRAPH:
            yield a.g
        elif a.type == AttributeProto.GRAPHS:
            yield from a.graphs


def graph_reads(g: onnx.GraphProto) -> set:
    """Every name the nodes of ``g`` (and of its subgraphs) read."""
    out = set()
    for n in g.node:
        out.update(i for i in n.input if i)
        for sg in subgraphs(n):
            out |= graph_reads(sg)
    return out


def free_names(g: onnx.GraphProto) -> set:
    """Names a subgraph reads from the scope around it."""
    defined = {v.name for v in g.input} | {t.name for t in g.initializer}
    defined |= {t.values.name for t in g.sparse_initializer}
    used = set()
    for n in g.node:
        used.update(i for i in n.input if i and i not in defined)
        for sg in subgraphs(n):
            used |= free_names(sg) - defined
        defined.update(o for o in n.output if o)
    used.update(o.name for o in g.output if o.name not in defined)
    return used


def all_names(g: onnx.GraphProto, out: set | None = None) -> set:
    """Every value and node name in ``g`` and its subgraphs (what a new name must avoid)."""
    out = set() if out is None else out
    out.update(v.name for v in g.input)
    out.update(v.name for v in g.output)
    out.update(v.name for v in g.value_info)
    out.update(t.name for t in g.initializer)
    for n in g.node:
        out.update(n.input)
        out.update(n.output)
        out.add(n.name)
        for sg in subgraphs(n):
            all_names(sg, out)
    out.discard("")
    return out


def node_label(n: onnx.NodeProto, index: int) -> str:
    """How a node is named in messages and records: its name, or ``<op>(<first output>)``."""
    return n.name or f"{n.op_type}({n.output[0] if n.output else index})"


def shape_of(vi: onnx.ValueInfoProto) -> list | None:
    """Dims of a tensor ValueInfo (int, str or None each), or None when the rank is unknown."""
    t = vi.type
    if not t.HasField("tensor_type") or not t.tensor_type.HasField("shape"):
        return None
    dims = []
    for d in t.tensor_type.shape.dim:
        if d.HasField("dim_value"):
            dims.append(int(d.dim_value))
        elif d.HasField("dim_param"):
            dims.append(d.dim_param)
        else:
            dims.append(None)
    return dims


def set_shape(vi: onnx.ValueInfoProto, dims) -> None:
    """Replace the dims of a tensor ValueInfo (int, str or None each; None dims = unknown)."""
    tt = vi.type.tensor_type
    tt.shape.ClearField("dim")
    tt.shape.SetInParent()
    for d in dims:
        dd = tt.shape.dim.add()
        if isinstance(d, str):
            dd.dim_param = d
        elif d is not None:
            dd.dim_value = int(d)


def elem_type(vi: onnx.ValueInfoProto) -> int:
    t = vi.type
    return t.tensor_type.elem_type if t.HasField("tensor_type") else 0


def describe_type(vi: onnx.ValueInfoProto) -> str:
    if not vi.type.HasField("tensor_type"):
        return vi.type.WhichOneof("value") or "unknown type"
    et = elem_type(vi)
    shp = shape_of(vi)
    dims = "?" if shp is None else "[" + ", ".join("?" if d is None else str(d) for d in shp) + "]"
    return f"{dtype_name(et) if et else 'unknown'}{dims}"


class ModelState:
    """One version of the model (never changed once made). ``model()`` builds the full
    ModelProto (a new copy each call)."""

    __slots__ = ("skeleton", "initializers")

    def __init__(self, skeleton: onnx.ModelProto, initializers: dict):
        self.skeleton = skeleton
        self.initializers = initializers

    @classmethod
    def of(cls, m: onnx.ModelProto) -> ModelState:
        sk = onnx.ModelProto()
        saved = list(m.graph.initializer)
        try:
            del m.graph.initializer[:]
            sk.CopyFrom(m)
        finally:
            m.graph.initializer.extend(saved)
        inits = {}
        for t in saved:
            c = onnx.TensorProto()
            c.CopyFrom(t)
            inits[t.name] = c
        return cls(sk, inits)

    def model(self) -> onnx.ModelProto:
        m = onnx.ModelProto()
        m.CopyFrom(self.skeleton)
        m.graph.initializer.extend(self.initializers.values())
        return m

    def light(self) -> onnx.ModelProto:
        """What onnx.checker and shape inference need, cheaply: the skeleton with the small
        initializers (shape constants, for data propagation) and the big ones declared as
        graph inputs of the same type and shape (``workbench.graph.isolated`` does the same
        before its checks)."""
        m = onnx.ModelProto()
        m.CopyFrom(self.skeleton)
        declared = {v.name for v in m.graph.input}
        for name, t in self.initializers.items():
            if t.ByteSize() <= LIGHT_BYTES:
                m.graph.initializer.append(t)
            elif name not in declared:
                m.graph.input.append(onnx.helper.make_tensor_value_info(
                    name, t.data_type, list(t.dims)))
        return m

    def stub(self) -> onnx.ModelProto:
        """The skeleton with every initializer's name, type and dims but no data (what sample
        inputs are generated from)."""
        m = onnx.ModelProto()
        m.CopyFrom(self.skeleton)
        for name, t in self.initializers.items():
            m.graph.initializer.add(name=name, data_type=t.data_type, dims=list(t.dims))
        return m

    def draft(self) -> Draft:
        sk = onnx.ModelProto()
        sk.CopyFrom(self.skeleton)
        return Draft(sk, dict(self.initializers))

    def nbytes(self) -> int:
        return sum(t.ByteSize() for t in self.initializers.values())


class Draft:
    """A working copy an edit changes: ``m`` (the skeleton, changed freely) and ``inits``
    (name -> TensorProto; replace entries, never change a TensorProto in place)."""

    def __init__(self, m: onnx.ModelProto, inits: dict):
        self.m = m
        self.inits = inits
        self.notes: list[str] = []   # what the edit did besides the obvious (for the step)

    @property
    def g(self) -> onnx.GraphProto:
        return self.m.graph

    def state(self) -> ModelState:
        return ModelState(self.m, self.inits)

    def model(self) -> onnx.ModelProto:
        return self.state().model()

    # ------------------------------------------------------------------ opsets and names
    def opset(self, domain: str = "") -> int | None:
        """The model's opset for ``domain`` ("" = ai.onnx), None when it imports none."""
        return opset_of(self.m, domain)

    def names(self) -> set:
        return all_names(self.g) | set(self.inits)

    def fresh(self, base: str, taken: set | None = None) -> str:
        """A name not used anywhere in the model, made from ``base``."""
        taken = self.names() if taken is None else taken
        name, k = base, 1
        while name in taken:
            name = f"{base}_{k}"
            k += 1
        taken.add(name)
        return name

    def input_names(self) -> list:
        return [v.name for v in self.g.input if v.name not in self.inits]

    def output_names(self) -> list:
        return [v.name for v in self.g.output]

    def is_constant(self, name: str) -> bool:
        return name in self.inits or self.constant_node(name) is not None

    def constant_node(self, name: str) -> onnx.NodeProto | None:
        for n in self.g.node:
            if n.op_type == "Constant" and n.domain in ("", "ai.onnx") and name in n.output:
                return n
        return None

    def constant_value(self, name: str) -> np.ndarray | None:
        """The value of an initializer or a Constant node's output (None otherwise)."""
        if name in self.inits:
            return tensor_to_array(self.inits[name], f"initializer {name!r}")
        n = self.constant_node(name)
        if n is None:
            return None
        for a in n.attribute:
            if a.name == "value":
                return tensor_to_array(a.t, f"Constant {name!r}")
            if a.name in ("value_float", "value_int"):
                return np.asarray(a.f if a.name == "value_float" else a.i,
                                  np.float32 if a.name == "value_float" else np.int64)
            if a.name in ("value_floats", "value_ints"):
                return np.asarray(list(a.floats) if a.name == "value_floats" else list(a.ints),
                                  np.float32 if a.name == "value_floats" else np.int64)
        return None

    def add_initializer(self, base: str, array: np.ndarray, *, exact: bool = False) -> str:
        name = base if exact else self.fresh(base)
        self.inits[name] = numpy_helper.from_array(np.asarray(array), name)
        return name

    # ------------------------------------------------------------------ graph queries
    def producers(self) -> dict:
        return {o: n for n in self.g.node for o in n.output if o}

    def consumers(self) -> dict:
        """value name -> nodes that read it (a node whose subgraph reads it counts)."""
        out: dict = {}
        for n in self.g.node:
            seen = set()
            for i in n.input:
                if i and i not in seen:
                    out.setdefault(i, []).append(n)
                    seen.add(i)
            for sg in subgraphs(n):
                for i in free_names(sg):
                    if i not in seen:
                        out.setdefault(i, []).append(n)
                        seen.add(i)
        return out

    def value_info(self, name: str) -> onnx.ValueInfoProto | None:
        for seq in (self.g.input, self.g.output, self.g.value_info):
            for v in seq:
                if v.name == name:
                    return v
        if name in self.inits:
            t = self.inits[name]
            return onnx.helper.make_tensor_value_info(name, t.data_type, list(t.dims))
        return None

    def value_exists(self, name: str) -> bool:
        return (name in self.inits or name in self.input_names()
                or any(name in n.output for n in self.g.node))

    def find_node(self, ref: str) -> onnx.NodeProto:
        """The node called ``ref``, else the node that produces value ``ref``."""
        if not isinstance(ref, str) or not ref:
            raise EditError(f"a node is named by a non-empty string, got {ref!r}")
        named = [n for n in self.g.node if n.name == ref]
        if len(named) == 1:
            return named[0]
        if len(named) > 1:
            raise EditError(f"{len(named)} nodes are named {ref!r}; name the node by one of its "
                            f"outputs instead: "
                            + ", ".join(repr(n.output[0]) for n in named if n.output))
        for n in self.g.node:
            if ref in n.output:
                return n
        raise EditError(f"no node named {ref!r} and no node produces a value {ref!r}"
                        + _close(ref, [n.name for n in self.g.node if n.name]
                                 + [o for n in self.g.node for o in n.output]))

    def require_value(self, name: str, what: str = "value") -> None:
        if not isinstance(name, str) or not name:
            raise EditError(f"a {what} is named by a non-empty string, got {name!r}")
        if not self.value_exists(name):
            known = self.input_names() + list(self.inits) + [o for n in self.g.node
                                                             for o in n.output]
            raise EditError(f"the model has no {what} {name!r}" + _close(name, known))

    def topo_nodes(self, names_needed: set) -> list:
        return [n for n in self.g.node if any(o in names_needed for o in n.output)]

    # ------------------------------------------------------------------ changes
    def rename_everywhere(self, old: str, new: str) -> None:
        """Rename value ``old`` to ``new`` in the graph, its subgraphs (where not shadowed),
        the initializers and the declared inputs/outputs/value_info."""
        _rename_in_graph(self.g, old, new)
        if old in self.inits:
            t = onnx.TensorProto()
            t.CopyFrom(self.inits.pop(old))
            t.name = new
            self.inits = _replace_key(self.inits, old, new, t)

    def remove_nodes(self, nodes) -> None:
        ids = {id(n) for n in nodes}
        keep = [n for n in self.g.node if id(n) not in ids]
        copies = []
        for n in keep:
            c = onnx.NodeProto()
            c.CopyFrom(n)
            copies.append(c)
        del self.g.node[:]
        self.g.node.extend(copies)

    def live(self) -> set:
        """Keys (output tuples) of the nodes that contribute to a graph output."""
        prod = {}
        for n in self.g.node:
            for o in n.output:
                if o:
                    prod[o] = n
        todo = list(self.output_names())
        seen_vals, live = set(), set()
        while todo:
            v = todo.pop()
            if v in seen_vals:
                continue
            seen_vals.add(v)
            n = prod.get(v)
            if n is None:
                continue
            key = tuple(n.output)
            if key in live:
                continue
            live.add(key)
            todo.extend(i for i in n.input if i)
            for sg in subgraphs(n):
                todo.extend(free_names(sg))
        return live

    def used(self) -> set:
        return graph_reads_with_free(self.g) | set(self.output_names())

    def snapshot_liveness(self) -> tuple:
        return self.live(), self.used()

    def prune(self, before: tuple) -> list:
        """Remove what the edit left dead: nodes that fed a graph output before (``before`` =
        ``snapshot_liveness()`` taken before the edit) and feed none now, and initializers that
        something read before and nothing reads now. Dead parts the model already had stay.
        Returns the labels of the removed nodes."""
        live_before, used_before = before
        labels = []
        while True:
            used_now = self.used()
            dead = [n for n in self.g.node
                    if not any(o in used_now for o in n.output if o)
                    and (tuple(n.output) in live_before
                         or any(o in used_before for o in n.output if o))]
            if not dead:
                break
            labels.extend(node_label(n, 0) for n in dead)
            self.remove_nodes(dead)
        dead = labels
        used_now = self.used()
        gone = {k for k in self.inits if k in used_before and k not in used_now}
        for name in gone:
            del self.inits[name]
        if any(v.name in gone for v in self.g.input):   # IR < 4: initializers listed as inputs
            keep = [_copy_vi(v) for v in self.g.input if v.name not in gone]
            del self.g.input[:]
            self.g.input.extend(keep)
        if dead or gone:
            known = used_now | {o for n in self.g.node for o in n.output}
            vis = [_copy_vi(v) for v in self.g.value_info if v.name in known]
            del self.g.value_info[:]
            self.g.value_info.extend(vis)
        return labels

    def clear_value_info(self) -> None:
        """Drop intermediate shapes (stale after a shape change; inference recomputes them)."""
        del self.g.value_info[:]


def opset_of(m: onnx.ModelProto, domain: str = "") -> int | None:
    want = "" if domain in ("", "ai.onnx") else domain
    for o in m.opset_import:
        if ("" if o.domain in ("", "ai.onnx") else o.domain) == want:
            return int(o.version)
    return None


def graph_reads_with_free(g: onnx.GraphProto) -> set:
    out = set()
    for n in g.node:
        out.update(i for i in n.input if i)
        for sg in subgraphs(n):
            out |= free_names(sg)
    return out


def _copy_vi(v):
    c = onnx.ValueInfoProto()
    c.CopyFrom(v)
    return c


def _replace_key(d: dict, old, new, value) -> dict:
    out = {}
    for k, v in d.items():
        out[new if k == old else k] = value if k == old else v
    if new not in out:
        out[new] = value
    return out


def _rename_in_graph(g: onnx.GraphProto, old: str, new: str, top: bool = True) -> None:
    for seq in (g.input, g.output, g.value_info):
        for v in seq:
            if v.name == old:
                v.name = new
    for t in g.initializer:
        if t.name == old:
            t.name = new
    for n in g.node:
        for k, i in enumerate(n.input):
            if i == old:
                n.input[k] = new
        for k, o in enumerate(n.output):
            if o == old:
                n.output[k] = new
        for sg in subgraphs(n):
            shadowed = ({v.name for v in sg.input} | {t.name for t in sg.initializer}
                        | {o for m in sg.node for o in m.output})
            if old not in shadowed:
                _rename_in_graph(sg, old, new, top=False)


def _close(name: str, known) -> str:
    near = difflib.get_close_matches(str(name), list(dict.fromkeys(known)), n=3, cutoff=0.6)
    return f"; did you mean {', '.join(repr(x) for x in near)}?" if near else ""


def array_of_tensor(t: onnx.TensorProto, where: str) -> np.ndarray:
    return tensor_to_array(t, where)


def np_dtype(elem: int) -> np.dtype:
    return np_dtype_of_onnx(elem)
