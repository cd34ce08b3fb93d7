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
import math
import re
from collections import Counter, defaultdict

import numpy as np

from workbench.graph.ir import AttrArray, ValueInfo
from workbench.graph.scopes import scope_of
from workbench.graph.toposort import stable_order
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
# scope_of (the one rule of name scopes) lives in workbench.graph.scopes; imported above


_PADDLE_VALUE = re.compile(r"^(.+?)\.(tmp|w|b)_\d+$")


def _short(name: str) -> str:
    """A short label for a node name: the last scope component, a Paddle temporary's layer."""
    s = name.rstrip("/").split("/")[-1] if "/" in name else name
    m = _PADDLE_VALUE.match(s)
    return m.group(1) if m else s


# ---------------------------------------------------------------------------- order
def _order(nodes, available: set) -> list:
    """Topological order of ``nodes`` (stable with respect to the file order, the one sort of
    :func:`workbench.graph.toposort.stable_order`), tolerant of cycles and undefined inputs
    (an invalid model is still drawn)."""
    reads = []
    for n in nodes:
        names = list(n.inputs)
        for sg in n.subgraphs:
            names.extend(sg.free_variables())
        reads.append([x for x in names if x and x not in available])
    order, _ = stable_order(reads, [n.outputs for n in nodes], break_cycles=True)
    return [nodes[i] for i in order]


def _value_index(graph) -> dict:
    """name -> ValueInfo for every value :meth:`Graph.value` answers for, built once per graph
    (``Graph.value`` scans the input and output lists on every call: quadratic for a node
    reading 20,000 graph inputs). The same precedence: inputs, outputs, value_info,
    initializers."""
    from workbench.arrays.dtypes import onnx_dtype_of_np

    out = {}
    for name, a in graph.initializers.items():
        try:
            dt = onnx_dtype_of_np(a.dtype)
        except TypeError:
            dt = None
        out[name] = ValueInfo(name, dt, tuple(a.shape))
    out.update(graph.value_info)
    for vi in reversed(graph.outputs):
        out[vi.name] = vi
    for vi in reversed(graph.inputs):
        out[vi.name] = vi
    return out


# ---------------------------------------------------------------------------- builder
class _Builder:
    """Collects the drawing's parallel lists while walking a graph and its subgraphs, then
    settles the groups (:meth:`finish`): folded nodes join their host's scope, single-child
    scopes merge, big groups split. Linear in nodes + edges (times the depth of the name
    scopes, which the names' own length bounds)."""

    def __init__(self):
        self._root = 0
        self.name, self.op, self.kind, self.group = [], [], [], []
        self.host, self.sources, self.root_of, self.first_out = [], set(), [], []
        self.node, self.owner_graph = [], []      # the IR node (None for inputs/outputs)
        self.edges: list = []          # (src, dst, label index)
        self.edge_value: list = []     # the value each edge carries (parallel to edges)
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

    def add(self, name, op, kind, group, node=None, graph=None) -> int:
        self.name.append(name)
        self.op.append(op)
        self.kind.append(kind)
        self.group.append(group)
        self.host.append(-1)
        self.root_of.append(self._root)
        self.first_out.append(name)
        self.node.append(node)
        self.owner_graph.append(graph)
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
                  if np.issubdtype(a.dtype, np.floating) and a.size > 1}
        values = _value_index(graph)
        shapes = {}

        def shape_label(v):
            if v not in shapes:
                vi = values.get(v)
                shapes[v] = self.label(
                    "" if vi is None or vi.shape is None else
                    f"{dtype_str(vi.dtype)} {fmt_shape(vi.shape)}" if vi.dtype else
                    fmt_shape(vi.shape))
            return shapes[v]

        for vi in graph.inputs:
            prod[vi.name] = self.add(vi.name, "Input", 1, root, graph=graph)
        order = _order(graph.nodes, {v.name for v in graph.inputs} | set(graph.initializers)
                       | set(outer))
        out_names = {v.name for v in graph.outputs}
        scopes: dict = {}              # (parent group, scope component) -> group
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
            g = root
            for part in scope_of(n.name):
                sub = scopes.get((g, part))
                if sub is None:
                    sub = scopes[(g, part)] = self.new_group(part, g, "scope")
                g = sub
            i = self.add(n.name, n.op_type, 0, g, n, graph)
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
                    self.edge_value.append(x)
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
            j = self.add(vi.name, "Output", 2, root, graph=graph)
            if vi.name in prod:
                self.edges.append((prod[vi.name], j, shape_label(vi.name)))
                self.edge_value.append(vi.name)
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

    def folded_values(self) -> dict:
        """id(graph) -> the values of that (sub)graph its folded nodes compute."""
        out: dict = defaultdict(set)
        for i, h in enumerate(self.host):
            if h != -1 and self.kind[i] == 0:
                out[id(self.owner_graph[i])].update(o for o in self.node[i].outputs if o)
        return out

    # -- structure
    def finish(self) -> None:
        n_g = len(self.g_label)
        # a folded node without a scope of its own goes into its host's group
        for i, h in enumerate(self.host):
            if h >= 0 and self.group[i] == self.root_of[i] == self.root_of[h]:
                self.group[i] = self.group[h]
        self._sizes()
        # a scope holding nothing but one other scope: one group labelled a/b (groups are
        # numbered parents first, so a chain a/b/c merges from the top)
        children = defaultdict(list)
        for g in range(1, n_g):
            children[self.g_parent[g]].append(g)
        members = defaultdict(list)
        for i, g in enumerate(self.group):
            members[g].append(i)
        direct = Counter(self.group[i] for i in range(len(self.name)) if self.host[i] == -1)
        merged_from = {}            # group -> the group merged into it (its label's prefix)
        for g in range(1, n_g):
            if self.g_kind[g] != "scope" or direct[g]:
                continue
            kids = [c for c in children[g] if self.vsize[c]]
            if len(kids) == 1 and self.g_kind[kids[0]] == "scope":
                c = kids[0]
                merged_from[c] = g
                self.g_parent[c] = self.g_parent[g]
                children[self.g_parent[g]].append(c)
                for i in members.pop(g, ()):
                    self.group[i] = c
                    members[c].append(i)
                for other in children[g]:
                    if other != c:
                        self.g_parent[other] = c
                        children[c].append(other)
                children[g] = []
        # labels a/b/c, each built once (building them merge by merge is quadratic in the
        # depth of a chain: a hostile name can be 100,000 scopes deep)
        inner = set(merged_from.values())
        for c in merged_from:
            if c in inner:
                continue                        # merged further down: not a survivor
            chain, x = [], c
            while x in merged_from:
                x = merged_from[x]
                chain.append(self.g_label[x])
            self.g_label[c] = "/".join(chain[::-1] + [self.g_label[c]])
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
        """Split every group with more than SPLIT_AT direct items into consecutive parts.

        Each group's work is proportional to what it holds: the shown nodes of its subtree
        (listed through the group tree, not by scanning every node) and their edges."""
        pos = list(range(len(self.name)))          # nodes are in topological order
        todo = list(range(len(self.g_label)))
        direct = defaultdict(list)                 # shown op nodes directly in a group
        shown_in = defaultdict(list)               # shown nodes of any kind directly in it
        hidden_in = defaultdict(list)              # folded nodes whose group it is
        for i in range(len(self.name)):
            if self.host[i] == -1:
                shown_in[self.group[i]].append(i)
                if self.kind[i] == 0:
                    direct[self.group[i]].append(i)
            else:
                hidden_in[self.group[i]].append(i)
        kids_of = defaultdict(list)                # non-subgraph child groups
        all_kids = defaultdict(list)               # every child group (subgraphs too)
        for c in range(len(self.g_label)):
            if self.g_parent[c] >= 0:
                all_kids[self.g_parent[c]].append(c)
                if self.g_kind[c] != "subgraph":
                    kids_of[self.g_parent[c]].append(c)
        succ = defaultdict(list)
        for s, d, _ in self.edges:
            succ[s].append(d)

        def subtree_nodes(c) -> list:
            out, stack = [], [c]
            while stack:
                x = stack.pop()
                out.extend(shown_in[x])
                stack.extend(k for k in all_kids[x] if self.g_parent[k] == x)
            return out

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
            under = {}
            for c in kid_groups:
                under[c] = subtree_nodes(c)
                for i in under[c]:
                    item_of[i] = ("g", c)
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
            for s, a in item_of.items():
                for d in succ.get(s, ()):
                    b = item_of.get(d)
                    if b is None or a == b:
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
                all_kids[g].append(pg)
                for it in chunk:
                    if it[0] == "n":
                        self.group[it[1]] = pg
                        direct[pg].append(it[1])
                        shown_in[pg].append(it[1])
                    else:
                        self.g_parent[it[1]] = pg
                        kids_of[pg].append(it[1])
                        all_kids[pg].append(it[1])
                todo.append(pg)
            shown_in[g] = [i for i in shown_in[g] if self.group[i] == g]
            # hidden (folded) nodes follow their host into its part
            stay = []
            for i in hidden_in.pop(g, ()):
                x = self.group[self.host[i]]
                while x >= 0 and self.g_parent[x] != g:
                    x = self.g_parent[x]
                if x >= 0:
                    self.group[i] = x
                    hidden_in[x].append(i)
                else:
                    stay.append(i)
            hidden_in[g] = stay

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


def build_drawing(graph) -> _Builder:
    """Walk ``graph`` once for the drawing (:func:`graph_payload`) and the details
    (:class:`Details`), which can share it."""
    b = _Builder()
    b.graph(graph, 0, {})
    b.finish()
    return b


def graph_payload(graph, *, builder: _Builder | None = None) -> dict:
    """The drawing's data for ``graph``: parallel lists ``name``/``op``/``kind`` (0 node,
    1 graph input, 2 graph output)/``group`` (index into ``groups``)/``host`` (-1 shown; the
    index of the node it is folded into; -2 folded and unused)/``nfold`` (nodes folded into
    each), ``edges`` (flat ``[src, dst, label, ...]``, ``labels`` holding dtype and shape),
    ``groups`` (``label``, ``parent``, ``kind`` root/scope/part/subgraph, ``owner``, ``size``
    shown nodes, ``size_all``), ``colors`` (op type -> colour), ``op_counts`` (op type -> count
    over the shown nodes, most common first), ``folded`` (how many nodes are folded) and
    ``params`` (parameter count). ``builder``: :func:`build_drawing` of ``graph``, when the
    caller also wants the details (:class:`Details`) without walking the graph twice."""
    b = builder or build_drawing(graph)
    data = b.payload()
    counts = Counter(op for op, k, h in zip(b.op, b.kind, b.host) if k == 0 and h == -1)
    data["colors"] = op_colors(b.op, b.sources - {op for op, h in zip(b.op, b.host) if h == -1})
    data["op_counts"] = dict(counts.most_common())
    data["folded"] = sum(1 for h in b.host if h != -1)
    data["params"] = graph.num_parameters()
    return data


# ---------------------------------------------------------------------------- details
def _attr_repr(v, limit: int = 80) -> str:
    if isinstance(v, AttrArray):                 # a repeated attribute held as an array
        v = v[:limit + 1].tolist()
    elif isinstance(v, np.ndarray):
        if v.size <= 8:
            return f"tensor {v.dtype}{list(v.shape)} = {np.array2string(v.ravel(), separator=', ')}"
        return f"tensor {v.dtype}{list(v.shape)}"
    if hasattr(v, "nodes") and hasattr(v, "initializers"):
        return f"graph ({len(v.nodes)} nodes)"
    if hasattr(v, "dtype") and hasattr(v, "shape"):          # a tensor described, not read
        return f"tensor {v.dtype}{list(v.shape)}"
    if isinstance(v, bytes):
        v = v[:limit]
    elif isinstance(v, str):
        v = v[:limit]
    elif isinstance(v, (list, tuple)) and len(v) > limit:
        v = type(v)(v[:limit])
    s = repr(v)
    return s if len(s) <= limit else s[: limit - 1] + "…"


def _array_repr(a) -> str:
    if a.ndim == 0:
        return repr(np.asarray(a).item())
    if a.size <= 6:
        a = np.asarray(a)
        body = repr(a.ravel().tolist())
        return body if a.ndim == 1 else f"{body}.reshape{tuple(a.shape)}"
    return f"{a.dtype}{list(a.shape)}"


class _Folds:
    """How a folded value is computed, as a short expression down to the drawn nodes it reads:
    ``Concat(Unsqueeze(Gather(Shape(ln_1/LayerNormalization), 0), [0]), [-1], [64])``.

    The expression stops at ``limit`` characters: a folded node that reads the same folded
    value many times, levels deep, would otherwise spell out exponentially many terms."""

    def __init__(self, graph, folded: set = frozenset()):
        self.graph = graph
        self.prod = graph.producers()
        self.folded = folded       # values computed by folded nodes; others are named

    def expr(self, v: str, depth: int = 5, limit: int = 160) -> str:
        out: list = []
        self._left = limit + 1
        self._expr(v, depth, out)
        s = "".join(out)
        return s if len(s) <= limit else s[: limit - 1] + "…"

    def _put(self, out: list, text: str) -> bool:
        """Append ``text``; False once the expression is long enough."""
        if self._left <= 0:
            return False
        text = text[: self._left]
        out.append(text)
        self._left -= len(text)
        return self._left > 0

    def _expr(self, v, depth, out) -> bool:
        if v in self.graph.initializers:
            a = self.graph.initializers[v]
            return self._put(out, _array_repr(a) if a.size <= 6 else
                             f"{_short(v)}:{_array_repr(a)}")
        n = self.prod.get(v)
        if n is None:
            return self._put(out, _short(v))
        if v not in self.folded:               # a node that is drawn: its name, not its formula
            return self._put(out, "/".join(n.name.strip("/").split("/")[-2:])
                             if "/" in n.name else n.name)
        if not n.inputs:
            val = n.attrs.get("value")
            if isinstance(val, np.ndarray):
                return self._put(out, _array_repr(val))
            vals = [x for x in n.attrs.values()]
            return self._put(out, _attr_repr(vals[0], 40) if vals else n.op_type)
        if depth <= 0:
            return self._put(out, f"{n.op_type}(…)")
        if not self._put(out, f"{n.op_type}("):
            return False
        for k, x in enumerate(n.inputs):
            if (k and not self._put(out, ", ")) or not (
                    self._expr(x, depth - 1, out) if x else self._put(out, "∅")):
                return False
        return self._put(out, ")")


def _walk(graph):
    """(graph, node) for every node, subgraphs included (depth first, outer graph first)."""
    for n in graph.nodes:
        yield graph, n
    for n in graph.nodes:
        for sg in n.subgraphs:
            yield from _walk(sg)


class Details:
    """What the details panel shows for the nodes of ``graph`` (and of its subgraphs), with
    what that needs (folded values, value lookups) computed once; linear in the graph size.

    ``builder``: the drawing's :func:`_build` of ``graph`` when the caller has one."""

    def __init__(self, graph, builder: _Builder | None = None):
        self.graph = graph
        self._builder = builder
        self._per_graph: dict = {}          # id(graph) -> (values, folds, folded)

    def _of(self, g):
        got = self._per_graph.get(id(g))
        if got is None:
            if self._builder is None:         # what is folded is decided while walking the
                self._builder = _Builder()    # graph; the groups (finish) are not needed
                self._builder.graph(self.graph, 0, {})
                self._folded = self._builder.folded_values()
            elif not hasattr(self, "_folded"):
                self._folded = self._builder.folded_values()
            folded = self._folded.get(id(g), set())
            got = self._per_graph[id(g)] = (_value_index(g), _Folds(g, folded), folded)
        return got

    def folded(self, g=None) -> set:
        """The values of ``g`` (default: the top graph) that the drawing folds."""
        return self._of(g if g is not None else self.graph)[2]

    def value(self, g, v: str, with_folds: bool = True) -> dict:
        if not v:
            return {"name": "", "shape": "", "dtype": "", "param": False, "omitted": True}
        values, folds, folded = self._of(g)
        if v in g.initializers:
            a = g.initializers[v]
            return {"name": v, "shape": fmt_shape(a.shape), "dtype": str(a.dtype),
                    "param": True, "count": int(np.prod(a.shape, dtype=np.int64))}
        vi = values.get(v)
        out = {"name": v, "shape": fmt_shape(vi.shape if vi else None),
               "dtype": dtype_str(vi.dtype if vi else None), "param": False}
        if with_folds and v in folded:
            out["folded"] = folds.expr(v)
        return out

    def node(self, g, node) -> dict:
        ins = [self.value(g, v) for v in node.inputs]
        return {
            "name": node.name, "op": node.op_type, "domain": node.domain or "ai.onnx",
            "category": op_category(node.op_type, node.domain),
            "attrs": {k: _attr_repr(v) for k, v in sorted(node.attrs.items())},
            "inputs": ins, "outputs": [self.value(g, v, False) for v in node.outputs],
            "params": int(sum(i.get("count", 0) for i in ins)),
            "doc": (node.doc_string or "")[:300],
        }

    def of(self, name: str) -> dict:
        """The details of node (or graph input/output value) ``name``; the first node of that
        name wins, as in the drawing."""
        for g, node in _walk(self.graph):
            if node.name == name:
                return self.node(g, node)
        vi = self._of(self.graph)[0].get(name)
        if vi is None:
            return {"name": name, "missing": True}
        kind = "Input" if any(v.name == name for v in self.graph.inputs) else "Output"
        return _io_details(vi, kind)

    def all(self) -> dict:
        """:meth:`of` for every name the drawing shows, keyed by name."""
        graph = self.graph
        out: dict[str, dict] = {}
        for vi in graph.inputs:
            out.setdefault(vi.name, _io_details(vi, "Input"))
        nodes: dict[str, dict] = {}
        for g, node in _walk(graph):
            if node.name not in nodes:
                nodes[node.name] = self.node(g, node)
        out.update(nodes)            # a node named like an input: node_by_name finds the node
        for vi in graph.outputs:
            out.setdefault(vi.name, _io_details(vi, "Output"))
        return out


def _io_details(vi, kind: str) -> dict:
    return {"name": vi.name, "op": kind, "attrs": {}, "params": 0,
            "inputs": [], "outputs": [{"name": vi.name, "shape": fmt_shape(vi.shape),
                                       "dtype": dtype_str(vi.dtype), "param": False}]}


def folded_values(graph) -> set:
    """The values of ``graph`` (not its subgraphs) that the drawing folds."""
    return Details(graph).folded()


def node_details(graph, name: str) -> dict:
    """What the details panel shows for a node (or a graph input/output value) ``name``;
    inputs computed from constants and shapes carry ``folded``, the expression they fold.
    One question; :class:`Details` answers many without recomputing what they share."""
    return Details(graph).of(name)


def all_node_details(graph, builder: _Builder | None = None) -> dict:
    """``node_details`` for every name the drawing shows (graph inputs, nodes, graph outputs,
    the nodes of subgraphs), keyed by name; the first node wins where names repeat (as in
    :func:`node_details`). Linear in the graph size (no per-name search)."""
    return Details(graph, builder).all()
