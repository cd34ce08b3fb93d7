"""Which constant tensors of a graph are weights, where they live, and which node owns each.

A *constant* is an initializer or the output of a ``Constant`` node (``value``,
``sparse_value``, ``value_float(s)``, ``value_int(s)``). A constant is a **weight** when

- it has more than one element (a scalar is a constant such as a scale, an epsilon or an
  exponent, not a learned weight),
- its element type is not int64, bool or string (those are indices, shapes and masks), and
- some node reads it at an input position that is not a shape-like input or a setting of the
  op (registry facts ``host_read_inputs`` and ``settings``: Reshape's shape, Clip's bounds...).

A weight read only at positions the op declares as running statistics (registry fact
``state_inputs``: BatchNormalization's mean and variance) is a **buffer**, as PyTorch calls
them; every other weight is a **parameter**. A constant is counted once however many nodes read
it (shared weights). It is *attributed* to one node: the first node, in graph order, that reads
it directly or through a chain of weight-preparation nodes (Transpose, Cast, DequantizeLinear of
constants: nodes whose inputs are all constant), so that the per-node counts add up to the
total.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from workbench.graph.external import UnreadTensor
from workbench.ops import registry

#: element types that hold indices, shapes, masks or text, never learned weights
_NOT_WEIGHT_KINDS = ("b", "O", "U", "S")


@dataclass
class Weight:
    """One weight tensor: ``name``, element count, bytes, dtype name, ``where`` it lives
    ("initializer" or "Constant node <name>"), ``kind`` ("parameter" or "buffer"), the nodes
    that read it and the node it is attributed to."""

    name: str
    size: int
    nbytes: int
    dtype: str
    where: str
    kind: str
    readers: list = field(default_factory=list)
    owner: str | None = None

    @property
    def in_constant_node(self) -> bool:
        return self.where.startswith("Constant node")

    @property
    def computed(self) -> bool:
        """Made at run time from constants (``ConstantOfShape``...), not stored."""
        return self.where.startswith("computed")


def constant_node_value(node):
    """The value of a ``Constant`` node as a numpy array, or None (a string scalar list...)."""
    a = node.attrs
    if "value" in a and isinstance(a["value"], (np.ndarray, UnreadTensor)):
        return a["value"]
    if "sparse_value" in a and isinstance(a["sparse_value"], (np.ndarray, UnreadTensor)):
        return a["sparse_value"]
    if "value_float" in a:
        return np.asarray(a["value_float"], np.float32)
    if "value_floats" in a:
        return np.asarray(a["value_floats"], np.float32)
    if "value_int" in a:
        return np.asarray(a["value_int"], np.int64)
    if "value_ints" in a:
        return np.asarray(a["value_ints"], np.int64)
    return None


def _array(v):
    """``v`` as an array, or as it is when a structure-only load described it without reading
    it (an ``UnreadTensor`` has the dtype, shape, size and nbytes the counts need)."""
    return v if isinstance(v, UnreadTensor) else np.asarray(v)


def constants(graph) -> dict:
    """{value name: (array, where)} for the initializers and the Constant nodes' outputs (an
    ``UnreadTensor`` in place of the array for a tensor a structure-only load left unread)."""
    out = {k: (_array(v), "initializer") for k, v in graph.initializers.items()}
    for n in graph.nodes:
        if n.op_type == "Constant" and (n.domain or "") in ("", "ai.onnx") and n.outputs:
            v = constant_node_value(n)
            if v is not None and n.outputs[0]:
                out[n.outputs[0]] = (_array(v), f"Constant node {n.name}")
    return out


def _use(node, k: int) -> str:
    """How ``node`` uses its input ``k``: "weight", "state" or "setting"."""
    f = registry.facts(node.op_type, node.domain)
    if k in f.host_read_inputs or k in f.settings:
        return "setting"
    if k in f.state_inputs:
        return "state"
    return "weight"


def static_nodes(graph, consts=None) -> set:
    """Names of the nodes whose inputs are all constant (or computed from constants only):
    weight preparation and shape arithmetic that an engine folds once at load. Nodes with
    subgraphs or random outputs are never static."""
    consts = constants(graph) if consts is None else consts
    static_vals = set(consts)
    out = set()
    for n in graph.nodes:
        if n.op_type == "Constant" and (n.domain or "") in ("", "ai.onnx"):
            out.add(n.name)
            static_vals.update(o for o in n.outputs if o)
            continue
        f = registry.facts(n.op_type, n.domain)
        ins = [x for x in n.inputs if x]
        if n.subgraphs or f.random or not ins:
            continue
        if all(x in static_vals for x in ins):
            out.add(n.name)
            static_vals.update(o for o in n.outputs if o)
    return out


def find_weights(graph, consts=None, static=None) -> dict:
    """{name: Weight} of the graph's weights (see the module docstring), in graph order."""
    consts = constants(graph) if consts is None else consts
    static = static_nodes(graph, consts) if static is None else static
    uses: dict = {}
    readers: dict = {}
    consumers: dict = {}
    for n in graph.nodes:
        for k, x in enumerate(n.inputs):
            if x:
                consumers.setdefault(x, []).append(n)
                if x in consts:
                    uses.setdefault(x, set()).add(_use(n, k))
                    readers.setdefault(x, []).append(n.name)
        for sg in n.subgraphs:     # a body reading an outer weight: the owning node reads it
            for x in sg.free_variables():
                if x in consts:
                    consumers.setdefault(x, []).append(n)
                    uses.setdefault(x, set()).add("weight")
                    readers.setdefault(x, []).append(n.name)
    order = {n.name: i for i, n in enumerate(graph.nodes)}
    out = {}
    for name, (a, where) in consts.items():
        u = uses.get(name, set())
        if a.size <= 1 or a.dtype.kind in _NOT_WEIGHT_KINDS or a.dtype == np.int64:
            continue
        if "weight" not in u and "state" not in u:
            continue
        kind = "parameter" if "weight" in u else "buffer"
        w = Weight(name, int(a.size), int(a.nbytes), str(a.dtype), where, kind,
                   readers.get(name, []))
        w.owner = _owner(name, consumers, static, order)
        out[name] = w
    _computed_weights(graph, consts, static, out, consumers, order)
    for n in graph.nodes:                  # weights stored inside If/Loop/Scan bodies
        for sg in n.subgraphs:
            for name, w in find_weights(sg).items():
                if name in out:            # the body reads an outer weight: counted there
                    continue
                w.where = f"{w.where} in the body of {n.name}"
                w.owner = n.name
                out[f"{n.name}/{name}"] = w
    return out


def _computed_weights(graph, consts, static, out, consumers, order) -> None:
    """Weights no file stores: values computed from constants alone (``ConstantOfShape`` of a
    stored shape, as onnx's light test models and some exporters write them) that a running
    node reads as a weight, unless they derive from a weight already counted (a
    DequantizeLinear of int8 weights is the same weight)."""
    from .shapes import elem_bits, is_known  # noqa: PLC0415

    producer = {o: n for n in graph.nodes if n.name in static for o in n.outputs if o}
    value = graph.value_lookup()
    for n in graph.nodes:
        if n.name in static:
            continue
        for k, x in enumerate(n.inputs):
            if not x or x in consts or x in out or x not in producer or _use(n, k) == "setting":
                continue
            sources, todo, seen = set(), [x], set()
            while todo:
                v = todo.pop()
                if v in seen:
                    continue
                seen.add(v)
                if v in consts:
                    sources.add(v)
                elif v in producer:
                    todo.extend(i for i in producer[v].inputs if i)
            if sources & set(out):
                continue
            vi = value(x)
            bits = elem_bits(vi.dtype) if vi is not None else None
            if vi is None or not is_known(vi.shape) or bits is None:
                continue
            size = int(np.prod(vi.shape, dtype=np.int64))
            if size <= 1 or vi.dtype in (7, 9, 8):          # int64, bool, string
                continue
            p = producer[x]
            out[x] = Weight(x, size, (size * bits + 7) // 8, _type_name(vi.dtype),
                            f"computed by {p.name} ({p.op_type})",
                            "buffer" if _use(n, k) == "state" else "parameter",
                            [c.name for c in consumers.get(x, [])],
                            _owner(x, consumers, static, order))


def _type_name(t) -> str:
    from workbench.arrays.dtypes import dtype_name  # noqa: PLC0415

    return dtype_name(t)


def _owner(name: str, consumers: dict, static: set, order: dict) -> str | None:
    """The first node in graph order that reads ``name`` directly or through static nodes and
    is not static itself (or the first direct reader when every path stays static)."""
    direct = consumers.get(name, [])
    if not direct:
        return None
    best, seen, todo = None, set(), list(direct)
    while todo:
        n = todo.pop()
        if n.name in seen:
            continue
        seen.add(n.name)
        if n.name not in static:
            if best is None or order.get(n.name, 1 << 60) < order.get(best, 1 << 60):
                best = n.name
            continue
        for o in n.outputs:
            if o:
                todo.extend(consumers.get(o, []))
    return best or min((n.name for n in direct), key=lambda s: order.get(s, 1 << 60))


def weight_summary(graph) -> dict:
    """Counts for a model summary: ``parameters`` and ``buffers`` (elements), and how many of
    each live in initializers and in Constant nodes (``workbench info`` prints these)."""
    ws = find_weights(graph)
    out = {"parameters": 0, "buffers": 0, "parameter_bytes": 0,
           "in_initializers": 0, "n_initializers": 0,
           "in_constants": 0, "n_constants": 0, "computed": 0, "n_computed": 0}
    for w in ws.values():
        out["parameters" if w.kind == "parameter" else "buffers"] += w.size
        out["parameter_bytes"] += w.nbytes
        if w.in_constant_node:
            out["in_constants"] += w.size
            out["n_constants"] += 1
        elif w.computed:
            out["computed"] += w.size
            out["n_computed"] += 1
        else:
            out["in_initializers"] += w.size
            out["n_initializers"] += 1
    return out
