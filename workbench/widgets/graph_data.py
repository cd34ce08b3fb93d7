"""What a graph drawing needs, as JSON-ready data: the nodes with their scope groups and what is
folded into what, the edges with tensor shapes, op colours and counts, and the per-node details
shown when a node is clicked.

Shared by the GraphView widget (which sends details one node at a time, on selection) and the
JupyterLab extension's server handler (:mod:`workbench.labext`, which sends them all at once).
The layout itself is computed in the browser (dagre, one group at a time, in a Web Worker:
``static/graph_core.js``); this module decides *what* is drawn. No widget libraries are
imported here.

Folding (what is not architecture). A value is *static* when it does not depend on the data
of a graph input: initializers, outputs of nodes without inputs (``Constant``), outputs of
ops that read only their input's shape (registry fact ``shape_only``: Shape, Size), and
outputs of nodes all of whose inputs are static. A node whose inputs are all static is folded
into the node that consumes it (its *host*), unless it reads a parameter (a floating-point
initializer outside the op's ``settings`` inputs: an embedding lookup stays), produces a graph
output, is random or carries subgraphs. This folds Constant nodes, the exporters'
Shape -> Gather -> Unsqueeze -> Concat -> Reshape side chains, ConstantOfShape, Range... from
graph structure and registry facts, without a table of op names.

Groups. Node names give nested scopes (``/layer1/layer1.0/conv1/Conv``, ``/h.2/attn/MatMul``,
``model.layers.0.self_attn.q_proj``); a group with more than :data:`SPLIT_AT` direct items is
split into consecutive parts, cut where the fewest edges cross (a flat Paddle export becomes a
handful of stages; a 20,000-node graph a few levels of parts); the body graphs of
If/Loop/Scan are groups owned by their node.
"""

from __future__ import annotations

import colorsys
import hashlib
import heapq
import math
import re
from collections import Counter, defaultdict

import numpy as np

from workbench.ops import registry
from workbench.widgets._model import dtype_str, fmt_shape

#: a group with more direct items than this is split into parts
SPLIT_AT = 60
#: ... into about this many items per part (between 2 and MAX_PARTS parts)
PART_SIZE = 40
MAX_PARTS = 12

#: the hue of each op category (categories are declared where the ops are registered:
#: ``@kernel(..., category=...)``, queried with ``registry.category``)
_HUES = {"layer": 215, "activation": 5, "normalization": 140, "pooling": 275, "math": 35,
         "shape": 200, "reduction": 55, "control": 320}
_FIXED = {"Input": "#2f3b4c", "Output": "#2f3b4c"}
_NO_INPUT_GREY = "#9aa3ad"          # nodes without inputs (constants): grey


def op_category(op: str, domain: str | None = None) -> str:
    if op in ("Input", "Output"):
        return op.lower()
    return registry.category(op, domain)


def op_colors(ops, sources=()) -> dict:
    """A colour per op type: the category's hue, lightness varied within the category.
    ``sources``: op types seen only on nodes without inputs (drawn grey)."""
    out = {}
    seen = defaultdict(int)
    for op in sorted(set(ops)):
        if op in _FIXED:
            out[op] = _FIXED[op]
            continue
        if op in sources:
            out[op] = _NO_INPUT_GREY
            continue
        cat = registry.category(op)
        hue = _HUES.get(cat)
        if hue is None:
            hue = int(hashlib.md5(op.encode()).hexdigest()[:4], 16) % 360
            light, sat = 0.42, 0.35
        else:
            k = seen[cat]
            seen[cat] += 1
            light, sat = (0.40, 0.48, 0.34, 0.45, 0.37)[k % 5], 0.55 - 0.06 * (k % 3)
        r, g, b = colorsys.hls_to_rgb(hue / 360.0, light, sat)
        out[op] = f"#{int(r * 255):02x}{int(g * 255):02x}{int(b * 255):02x}"
    return out


# ---------------------------------------------------------------------------- scopes
_NUM = re.compile(r"^\d+$")


def scope_of(name: str) -> list:
    """The scope path a node name gives: ``/h.2/attn/MatMul`` -> ``['h.2', 'attn']``,
    ``model.layers.0.self_attn.q_proj`` -> ``['model', 'layers.0', 'self_attn']``; [] when the
    name has no scope (``Conv_3``, Paddle's ``conv2d_3.tmp_0``-style generated names)."""
    if "/" in name:
        parts = [p for p in name.split("/") if p]
        return parts[:-1]
    if "." in name and " " not in name:
        raw = [p for p in name.split(".") if p]
        parts: list = []
        for p in raw:               # "layers", "0" -> "layers.0"
            if parts and _NUM.match(p):
                parts[-1] += "." + p
            else:
                parts.append(p)
        # generated names (Paddle's ``conv2d_3.tmp_0``, paddle2onnx's ``p2o.Conv.3``) carry a
        # counter, not a scope: two components are a name, not a path
        if len(parts) >= 3:
            return parts[:-1]
    return []


_PADDLE_VALUE = re.compile(r"^(.+?)\.(tmp|w|b)_\d+$")


def _short(name: str) -> str:
    """A short label for a node name: the last scope component, a Paddle temporary's layer."""
    s = name.rstrip("/").split("/")[-1] if "/" in name else name
    m = _PADDLE_VALUE.match(s)
    return m.group(1) if m else s


# ---------------------------------------------------------------------------- order
def _order(nodes, available: set) -> list:
    """Topological order of ``nodes`` (stable with respect to the file order), tolerant of
    cycles and undefined inputs (an invalid model is still drawn)."""
    producers = {}
    for i, n in enumerate(nodes):
        for o in n.outputs:
            if o:
                producers.setdefault(o, i)
    preds = []
    for i, n in enumerate(nodes):
        names = list(n.inputs)
        for sg in n.subgraphs:
            names.extend(sg.free_variables())
        preds.append({producers[x] for x in names
                      if x and x not in available and x in producers and producers[x] != i})
    succs = defaultdict(list)
    indeg = [len(p) for p in preds]
    for i, p in enumerate(preds):
        for j in p:
            succs[j].append(i)
    ready = [i for i in range(len(nodes)) if indeg[i] == 0]
    heapq.heapify(ready)
    out, placed = [], [False] * len(nodes)
    while len(out) < len(nodes):
        if not ready:                       # a cycle: break it at the first unplaced node
            i = next(k for k in range(len(nodes)) if not placed[k])
            indeg[i] = 0
            heapq.heappush(ready, i)
        while ready:
            i = heapq.heappop(ready)
            if placed[i]:
                continue
            placed[i] = True
            out.append(nodes[i])
            for j in succs[i]:
                indeg[j] -= 1
                if indeg[j] == 0:
                    heapq.heappush(ready, j)
    return out


# ---------------------------------------------------------------------------- builder
class _Builder:
    """Collects the drawing's parallel lists while walking a graph and its subgraphs, then
    settles the groups (:meth:`finish`): folded nodes join their host's scope, single-child
    scopes merge, big groups split."""

    def __init__(self):
        self._root = 0
        self.name, self.op, self.kind, self.group = [], [], [], []
        self.host, self.sources, self.root_of, self.first_out = [], set(), [], []
        self.edges: list = []          # (src, dst, label index)
        self.labels: list = []
        self._label_ix: dict = {}
        self.g_label, self.g_parent, self.g_kind, self.g_owner = ["graph"], [-1], ["root"], [-1]

    def label(self, text: str) -> int:
        i = self._label_ix.get(text)
        if i is None:
            i = self._label_ix[text] = len(self.labels)
            self.labels.append(text)
        return i

    def new_group(self, label, parent, kind, owner=-1) -> int:
        self.g_label.append(label)
        self.g_parent.append(parent)
        self.g_kind.append(kind)
        self.g_owner.append(owner)
        return len(self.g_label) - 1

    def add(self, name, op, kind, group) -> int:
        self.name.append(name)
        self.op.append(op)
        self.kind.append(kind)
        self.group.append(group)
        self.host.append(-1)
        self.root_of.append(self._root)
        self.first_out.append(name)
        return len(self.name) - 1

    # -- one (sub)graph
    def graph(self, graph, root: int, outer: dict) -> None:
        """Add ``graph``'s inputs, nodes and outputs under group ``root``. ``outer``: value
        name -> producing node index in enclosing graphs."""
        self._root = root
        prod = dict(outer)
        static = set(graph.initializers)
        # weights: floating-point initializers with more than one value (a scalar is a
        # constant such as a scale or an epsilon)
        params = {k for k, a in graph.initializers.items()
                  if np.issubdtype(np.asarray(a).dtype, np.floating) and np.asarray(a).size > 1}
        shapes = {}

        def shape_label(v):
            if v not in shapes:
                vi = graph.value(v)
                shapes[v] = self.label(
                    "" if vi is None or vi.shape is None else
                    f"{dtype_str(vi.dtype)} {fmt_shape(vi.shape)}" if vi.dtype else
                    fmt_shape(vi.shape))
            return shapes[v]

        for vi in graph.inputs:
            prod[vi.name] = self.add(vi.name, "Input", 1, root)
        order = _order(graph.nodes, {v.name for v in graph.inputs} | set(graph.initializers)
                       | set(outer))
        out_names = {v.name for v in graph.outputs}
        scopes: dict = {(): root}
        first = len(self.name)
        consumers = defaultdict(list)
        for n in order:
            facts = registry.facts(n.op_type, n.domain)
            ins = [x for x in n.inputs if x]
            subs = n.subgraphs
            # a layer reading a weight stays (an embedding lookup); a shape op applied to a
            # weight alone (Identity, Transpose, Cast of a parameter) is weight preparation
            reads_param = any(x in params and k not in facts.settings
                              for k, x in enumerate(n.inputs))
            weight_prep = len(ins) == 1 and facts.category == "shape"
            folded = (not subs and not facts.random
                      and not any(o in out_names for o in n.outputs)
                      and (facts.shape_only or all(x in static for x in ins))
                      and (not reads_param or weight_prep))
            path = tuple(scope_of(n.name))
            g = scopes.get(path)
            if g is None:
                g = root
                for k in range(1, len(path) + 1):
                    sub = scopes.get(path[:k])
                    if sub is None:
                        sub = scopes[path[:k]] = self.new_group(path[k - 1], g, "scope")
                    g = sub
            i = self.add(n.name, n.op_type, 0, g)
            self.first_out[i] = next((o for o in n.outputs if o), n.name)
            if not ins:
                self.sources.add(n.op_type)
            if folded:
                self.host[i] = -2           # decided below
                static.update(o for o in n.outputs if o)
            seen = set()
            for x in n.inputs:
                if x and x in prod and x not in seen:
                    seen.add(x)
                    self.edges.append((prod[x], i, shape_label(x)))
                    consumers[prod[x]].append(i)
            for sg_i, sg in enumerate(subs):
                attr = next((k for k, v in n.attrs.items()
                             if v is sg or (isinstance(v, list) and any(s is sg for s in v))),
                            f"body{sg_i}")
                sgg = self.new_group(f"{n.name} · {attr}", g, "subgraph", owner=i)
                inner_outer = dict(prod)
                self.graph(sg, sgg, inner_outer)
                self._root = root
            for o in n.outputs:
                if o:
                    prod[o] = i
        for vi in graph.outputs:
            j = self.add(vi.name, "Output", 2, root)
            if vi.name in prod:
                self.edges.append((prod[vi.name], j, shape_label(vi.name)))
                consumers[prod[vi.name]].append(j)
        # hosts: a folded node goes into the first shown node its value reaches
        for i in range(len(self.name) - 1, first - 1, -1):
            if self.host[i] != -2:
                continue
            best = -2
            for c in consumers.get(i, ()):
                h = c if self.host[c] == -1 else self.host[c]
                if h >= 0 and (best < 0 or h < best):
                    best = h
            self.host[i] = best

    # -- structure
    def finish(self) -> None:
        n_g = len(self.g_label)
        # a folded node without a scope of its own goes into its host's group
        for i, h in enumerate(self.host):
            if h >= 0 and self.group[i] == self.root_of[i] == self.root_of[h]:
                self.group[i] = self.group[h]
        self._sizes()
        # a scope holding nothing but one other scope: one group labelled a/b
        children = defaultdict(list)
        for g in range(1, n_g):
            children[self.g_parent[g]].append(g)
        direct = Counter(self.group[i] for i in range(len(self.name)) if self.host[i] == -1)
        for g in range(1, n_g):
            if self.g_kind[g] != "scope" or direct[g]:
                continue
            kids = [c for c in children[g] if self.vsize[c]]
            if len(kids) == 1 and self.g_kind[kids[0]] == "scope":
                c = kids[0]
                self.g_label[c] = f"{self.g_label[g]}/{self.g_label[c]}"
                self.g_parent[c] = self.g_parent[g]
                children[self.g_parent[g]].append(c)
                for i in range(len(self.name)):
                    if self.group[i] == g:
                        self.group[i] = c
                for other in children[g]:
                    if other != c:
                        self.g_parent[other] = c
                        children[c].append(other)
                children[g] = []
        self._split()
        self._sizes()

    def _sizes(self) -> None:
        n_g = len(self.g_label)
        self.vsize = [0] * n_g
        self.asize = [0] * n_g
        for i in range(len(self.name)):
            g = self.group[i]
            vis = self.host[i] == -1
            while g >= 0:
                self.asize[g] += 1
                if vis:
                    self.vsize[g] += 1
                g = self.g_parent[g]

    def _split(self) -> None:
        """Split every group with more than SPLIT_AT direct items into consecutive parts."""
        pos = list(range(len(self.name)))          # nodes are in topological order
        todo = list(range(len(self.g_label)))
        direct = defaultdict(list)
        for i in range(len(self.name)):
            if self.host[i] == -1 and self.kind[i] == 0:
                direct[self.group[i]].append(i)
        kids_of = defaultdict(list)
        for c in range(len(self.g_label)):
            if self.g_kind[c] != "subgraph" and self.g_parent[c] >= 0:
                kids_of[self.g_parent[c]].append(c)
        while todo:
            g = todo.pop()
            kid_groups = [c for c in kids_of[g] if self.g_parent[c] == g]
            # graph inputs and outputs stay where they are (the first screen shows them)
            members = [i for i in direct[g] if self.group[i] == g]
            if len(members) + len(kid_groups) <= SPLIT_AT:
                continue
            # items: direct shown nodes and child groups, with the nodes each one holds
            item_of: dict = {}
            for i in members:
                item_of[i] = ("n", i)
            under = defaultdict(list)
            if kid_groups:
                top = {}
                for c in kid_groups:
                    top[c] = c
                for i in range(len(self.name)):
                    if self.host[i] != -1:
                        continue
                    x = self.group[i]
                    chain = []
                    while x >= 0 and x != g and x not in top:
                        chain.append(x)
                        x = self.g_parent[x]
                    if x in top:
                        under[top[x]].append(i)
                        item_of[i] = ("g", top[x])
            items = [("n", i) for i in members] + [("g", c) for c in kid_groups if under[c]]
            if len(items) <= SPLIT_AT:
                continue
            first = {("n", i): pos[i] for i in members}
            for c in kid_groups:
                if under[c]:
                    first[("g", c)] = min(pos[i] for i in under[c])
            items.sort(key=lambda it: first[it])
            index = {it: k for k, it in enumerate(items)}
            n = len(items)
            cross = [0] * (n + 1)
            for s, d, _ in self.edges:
                a, b = item_of.get(s), item_of.get(d)
                if a is None or b is None or a == b:
                    continue
                lo, hi = sorted((index[a], index[b]))
                cross[lo] += 1              # crosses every cut after lo, up to hi
                cross[hi] -= 1
            for k in range(1, n):
                cross[k] += cross[k - 1]
            parts = max(2, min(MAX_PARTS, math.ceil(n / PART_SIZE)))
            cuts, prev = [], 0
            for p in range(1, parts):
                ideal = round(n * p / parts)
                win = max(1, n // (3 * parts))
                lo, hi = max(prev + 1, ideal - win), min(n - 1, ideal + win)
                if lo > hi:
                    continue
                best = min(range(lo, hi + 1), key=lambda k: (cross[k - 1], abs(k - ideal)))
                cuts.append(best)
                prev = best
            bounds = [0] + cuts + [n]
            for p in range(len(bounds) - 1):
                chunk = items[bounds[p]:bounds[p + 1]]
                if not chunk:
                    continue

                def name_of(it):
                    if it[0] == "g":
                        return self.g_label[it[1]]
                    out = self.first_out[it[1]]       # Paddle: the layer is in the value name
                    return _short(out if _PADDLE_VALUE.match(out) else self.name[it[1]])
                text = (name_of(chunk[0]) if len(chunk) == 1 else
                        f"{name_of(chunk[0])} … {name_of(chunk[-1])}")
                pg = self.new_group(f"{p + 1}/{len(bounds) - 1} · {text}", g, "part")
                kids_of[g].append(pg)
                for it in chunk:
                    if it[0] == "n":
                        self.group[it[1]] = pg
                        direct[pg].append(it[1])
                    else:
                        self.g_parent[it[1]] = pg
                        kids_of[pg].append(it[1])
                todo.append(pg)
            # hidden (folded) nodes follow their host into its part
            for i in range(len(self.name)):
                if self.group[i] == g and self.host[i] >= 0:
                    x = self.group[self.host[i]]
                    while x >= 0 and self.g_parent[x] != g:
                        x = self.g_parent[x]
                    if x >= 0:
                        self.group[i] = x

    def payload(self) -> dict:
        flat = []
        for s, d, lab in self.edges:
            flat.extend((s, d, lab))
        nfold = [0] * len(self.name)
        for h in self.host:
            if h >= 0:
                nfold[h] += 1
        return {"name": self.name, "op": self.op, "kind": self.kind, "group": self.group,
                "host": self.host, "nfold": nfold, "edges": flat, "labels": self.labels,
                "groups": {"label": self.g_label, "parent": self.g_parent,
                           "kind": self.g_kind, "owner": self.g_owner,
                           "size": self.vsize, "size_all": self.asize}}


def graph_payload(graph) -> dict:
    """The drawing's data for ``graph``: parallel lists ``name``/``op``/``kind`` (0 node,
    1 graph input, 2 graph output)/``group`` (index into ``groups``)/``host`` (-1 shown; the
    index of the node it is folded into; -2 folded and unused)/``nfold`` (nodes folded into
    each), ``edges`` (flat ``[src, dst, label, ...]``, ``labels`` holding dtype and shape),
    ``groups`` (``label``, ``parent``, ``kind`` root/scope/part/subgraph, ``owner``, ``size``
    shown nodes, ``size_all``), ``colors`` (op type -> colour), ``op_counts`` (op type -> count
    over the shown nodes, most common first), ``folded`` (how many nodes are folded) and
    ``params`` (parameter count)."""
    b = _Builder()
    b.graph(graph, 0, {})
    b.finish()
    data = b.payload()
    counts = Counter(op for op, k, h in zip(b.op, b.kind, b.host) if k == 0 and h == -1)
    data["colors"] = op_colors(b.op, b.sources - {op for op, h in zip(b.op, b.host) if h == -1})
    data["op_counts"] = dict(counts.most_common())
    data["folded"] = sum(1 for h in b.host if h != -1)
    data["params"] = graph.num_parameters()
    return data


# ---------------------------------------------------------------------------- details
def _attr_repr(v, limit: int = 80) -> str:
    if isinstance(v, np.ndarray):
        if v.size <= 8:
            return f"tensor {v.dtype}{list(v.shape)} = {np.array2string(v.ravel(), separator=', ')}"
        return f"tensor {v.dtype}{list(v.shape)}"
    if hasattr(v, "nodes") and hasattr(v, "initializers"):
        return f"graph ({len(v.nodes)} nodes)"
    if isinstance(v, bytes):
        v = v[:limit]
    s = repr(v)
    return s if len(s) <= limit else s[: limit - 1] + "…"


def _array_repr(a) -> str:
    a = np.asarray(a)
    if a.ndim == 0:
        return repr(a.item())
    if a.size <= 6:
        body = repr(a.ravel().tolist())
        return body if a.ndim == 1 else f"{body}.reshape{tuple(a.shape)}"
    return f"{a.dtype}{list(a.shape)}"


class _Folds:
    """How a folded value is computed, as a short expression down to the drawn nodes it reads:
    ``Concat(Unsqueeze(Gather(Shape(ln_1/LayerNormalization), 0), [0]), [-1], [64])``."""

    def __init__(self, graph, folded: set = frozenset()):
        self.graph = graph
        self.prod = graph.producers()
        self.folded = folded       # values computed by folded nodes; others are named

    def expr(self, v: str, depth: int = 5, limit: int = 160) -> str:
        s = self._expr(v, depth)
        return s if len(s) <= limit else s[: limit - 1] + "…"

    def _expr(self, v, depth) -> str:
        if v in self.graph.initializers:
            a = self.graph.initializers[v]
            return _array_repr(a) if np.asarray(a).size <= 6 else f"{_short(v)}:{_array_repr(a)}"
        n = self.prod.get(v)
        if n is None:
            return _short(v)
        if v not in self.folded:               # a node that is drawn: its name, not its formula
            return "/".join(n.name.strip("/").split("/")[-2:]) if "/" in n.name else n.name
        if not n.inputs:
            val = n.attrs.get("value")
            if isinstance(val, np.ndarray):
                return _array_repr(val)
            vals = [x for x in n.attrs.values()]
            return _attr_repr(vals[0], 40) if vals else n.op_type
        if depth <= 0:
            return f"{n.op_type}(…)"
        args = ", ".join(self._expr(x, depth - 1) if x else "∅" for x in n.inputs)
        return f"{n.op_type}({args})"


def _value_details(graph, v: str, folds=None, folded=()) -> dict:
    if not v:
        return {"name": "", "shape": "", "dtype": "", "param": False, "omitted": True}
    if v in graph.initializers:
        a = graph.initializers[v]
        return {"name": v, "shape": fmt_shape(a.shape), "dtype": str(a.dtype),
                "param": True, "count": int(np.prod(a.shape, dtype=np.int64))}
    vi = graph.value(v)
    out = {"name": v, "shape": fmt_shape(vi.shape if vi else None),
           "dtype": dtype_str(vi.dtype if vi else None), "param": False}
    if folds is not None and v in folded:
        out["folded"] = folds.expr(v)
    return out


def _static_values(graph) -> set:
    """Values the drawing folds (computed from constants and shapes), as in graph_payload."""
    b = _Builder()
    b.graph(graph, 0, {})
    produced = {}
    for n in graph.nodes:
        for o in n.outputs:
            produced[o] = n.name
    folded_nodes = {b.name[i] for i, h in enumerate(b.host) if h != -1 and b.kind[i] == 0}
    return {o for o, nm in produced.items() if nm in folded_nodes}


def _op_node_details(graph, node, folds=None, folded=()) -> dict:
    ins = [_value_details(graph, v, folds, folded) for v in node.inputs]
    return {
        "name": node.name, "op": node.op_type, "domain": node.domain or "ai.onnx",
        "category": op_category(node.op_type, node.domain),
        "attrs": {k: _attr_repr(v) for k, v in sorted(node.attrs.items())},
        "inputs": ins, "outputs": [_value_details(graph, v) for v in node.outputs],
        "params": int(sum(i.get("count", 0) for i in ins)),
        "doc": (node.doc_string or "")[:300],
    }


def _io_details(graph, vi, kind: str) -> dict:
    return {"name": vi.name, "op": kind, "attrs": {}, "params": 0,
            "inputs": [], "outputs": [{"name": vi.name, "shape": fmt_shape(vi.shape),
                                       "dtype": dtype_str(vi.dtype), "param": False}]}


def _walk(graph):
    """(graph, node) for every node, subgraphs included (depth first, outer graph first)."""
    for n in graph.nodes:
        yield graph, n
    for n in graph.nodes:
        for sg in n.subgraphs:
            yield from _walk(sg)


def folded_values(graph) -> set:
    """The values of ``graph`` (not its subgraphs) that the drawing folds; pass it to
    :func:`node_details` to answer many selections without recomputing it."""
    return _static_values(graph)


def node_details(graph, name: str, folded: set | None = None) -> dict:
    """What the details panel shows for a node (or a graph input/output value) ``name``;
    inputs computed from constants and shapes carry ``folded``, the expression they fold.
    ``folded``: :func:`folded_values` of ``graph``, when the caller keeps it."""
    for g, node in _walk(graph):
        if node.name == name:
            static = folded if (folded is not None and g is graph) else _static_values(g)
            return _op_node_details(g, node, _Folds(g, static), static)
    vi = graph.value(name)
    if vi is None:
        return {"name": name, "missing": True}
    kind = "Input" if any(v.name == name for v in graph.inputs) else "Output"
    return _io_details(graph, vi, kind)


def all_node_details(graph) -> dict:
    """``node_details`` for every name the drawing shows (graph inputs, nodes, graph outputs,
    the nodes of subgraphs), keyed by name; the first node wins where names repeat (as in
    :func:`node_details`). Linear in the graph size (no per-name search)."""
    out: dict[str, dict] = {}
    for vi in graph.inputs:
        out.setdefault(vi.name, _io_details(graph, vi, "Input"))
    nodes: dict[str, dict] = {}
    cache: dict = {}
    for g, node in _walk(graph):
        if node.name not in nodes:
            if id(g) not in cache:
                static = _static_values(g)
                cache[id(g)] = (_Folds(g, static), static)
            nodes[node.name] = _op_node_details(g, node, *cache[id(g)])
    out.update(nodes)            # a node named like an input: node_by_name finds the node
    for vi in graph.outputs:
        out.setdefault(vi.name, _io_details(graph, vi, "Output"))
    return out
