"""The topological sort of the engine, and the graph queries built on it.

One algorithm, :func:`stable_order`, serves every caller: it takes what each node reads and
writes (value names) and returns the node indices in a *stable* topological order: among the
nodes whose inputs are ready, the one written first goes first, so an already sorted list comes
back unchanged and a node moves only behind the producers it needs. A node depends on every
node of the list that writes a name it reads (ONNX graphs write each name once; a graph loaded
unchecked that writes a name twice waits for both writers). Names no node writes (graph
inputs, initializers, outer-scope values) are available from the start.

- :func:`toposort_nodes`: NodeProtos, before the model is checked (the loader's exporter-quirk
  repairs, :mod:`workbench.graph.quirks`); a cycle is a :class:`ModelLoadError` naming its
  nodes.
- :func:`topological_order`: the nodes of an IR :class:`~workbench.graph.ir.Graph` (what the
  Plan, the passes and the widgets run or draw); a value read but defined nowhere, and a cycle,
  are :class:`ModelLoadError` naming the value and the nodes.
- :func:`needed_nodes`: the nodes (in order) that some output names depend on.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Sequence

import onnx

from workbench.errors import ModelLoadError
from workbench.graph.ir import Graph, Node


def stable_order(reads: Sequence[Iterable[str]], writes: Sequence[Iterable[str]], *,
                 break_cycles: bool = False) -> tuple[list[int], list[int]]:
    """``(order, stuck)``: node indices in a stable topological order (see the module
    docstring), and the indices left out because they wait on each other (a cycle).

    ``reads[i]`` / ``writes[i]``: the value names node ``i`` reads and writes (empty names are
    ignored). With ``break_cycles`` nothing is left out: when every remaining node waits, the
    first one written is released (a drawing of an invalid model still shows every node).
    """
    n = len(writes)
    producers: dict[str, list[int]] = {}
    for i, outs in enumerate(writes):
        for o in outs:
            if o:
                producers.setdefault(o, []).append(i)
    users: list[list[int]] = [[] for _ in range(n)]
    waiting = [0] * n
    for i, names in enumerate(reads):
        deps = set()
        for name in names:
            for p in producers.get(name, ()):
                if p != i:
                    deps.add(p)
        waiting[i] = len(deps)
        for p in deps:
            users[p].append(i)
    ready = [i for i in range(n) if waiting[i] == 0]
    heapq.heapify(ready)
    order: list[int] = []
    placed = [False] * n
    while True:
        while ready:
            i = heapq.heappop(ready)
            if placed[i]:
                continue
            placed[i] = True
            order.append(i)
            for u in users[i]:
                waiting[u] -= 1
                if waiting[u] == 0:
                    heapq.heappush(ready, u)
        if len(order) == n or not break_cycles:
            break
        first = next(k for k in range(n) if not placed[k])
        heapq.heappush(ready, first)
    stuck = [i for i in range(n) if not placed[i]]
    return order, stuck


# --------------------------------------------------------------------------- NodeProtos
def subgraphs_of(node):
    """The GraphProtos of a NodeProto's graph attributes (If/Loop/Scan bodies)."""
    for a in node.attribute:
        if a.type == onnx.AttributeProto.GRAPH:
            yield a.g
        elif a.type == onnx.AttributeProto.GRAPHS:
            yield from a.graphs


def graph_reads(g) -> set:
    """Every value name a (sub)GraphProto's nodes read, including nested subgraphs."""
    out = set()
    for n in g.node:
        out.update(i for i in n.input if i)
        for sg in subgraphs_of(n):
            out |= graph_reads(sg)
    return out


def toposort_nodes(nodes, what: str = "graph", path: str | None = None) -> list[int]:
    """The indices of ``nodes`` (NodeProtos) in a stable topological order.

    A node depends on the nodes of the same list producing its inputs (and the names its
    subgraphs read). Names produced by no node of the list (graph inputs, initializers, outer
    scope) are available from the start.
    """
    reads = []
    for n in nodes:
        r = {i for i in n.input if i}
        for sg in subgraphs_of(n):
            r |= graph_reads(sg)
        reads.append(r)
    order, stuck = stable_order(reads, [n.output for n in nodes])
    if stuck:
        names = [f"{nodes[i].name or '#' + str(i)} ({nodes[i].op_type})" for i in stuck[:8]]
        more = f" and {len(stuck) - 8} more" if len(stuck) > 8 else ""
        raise ModelLoadError(
            f"the {what}'s nodes form a dependency cycle (each waits for another's output), "
            f"so no execution order exists: {', '.join(names)}{more}", path=path)
    return order


# --------------------------------------------------------------------------- IR graphs
def node_reads(node: Node) -> list[str]:
    """The value names ``node`` reads: its inputs and its subgraphs' free variables."""
    names = [i for i in node.inputs if i]
    for sg in node.subgraphs:
        names.extend(sg.free_variables())
    return names


def topological_order(graph: Graph, *, outer: Sequence[str] = ()) -> list[Node]:
    """The nodes of ``graph`` in a stable topological order (the file's order wherever it is
    valid). ``outer``: names an enclosing graph provides (a subgraph's free variables).

    Raises ModelLoadError naming the value and node when an input is never defined, and the
    nodes involved when the graph has a cycle.
    """
    available = {v.name for v in graph.inputs} | set(graph.initializers) | set(outer)
    produced = {o for n in graph.nodes for o in n.outputs if o}
    reads = []
    for n in graph.nodes:
        names = node_reads(n)
        for name in names:
            if name not in available and name not in produced:
                raise ModelLoadError(
                    f"node {n.name!r} ({n.op_type}) reads {name!r}, which is neither a graph "
                    f"input, an initializer, nor the output of any node (missing initializer?)")
        # a name the graph provides is not waited for, even where a node also writes it
        reads.append([name for name in names if name not in available])
    order, stuck = stable_order(reads, [n.outputs for n in graph.nodes])
    if stuck:
        names = [graph.nodes[i].name for i in stuck]
        raise ModelLoadError(
            f"the graph has a cycle: nodes {names[:10]}{' ...' if len(names) > 10 else ''} "
            f"depend on each other; ONNX graphs must be acyclic")
    return [graph.nodes[i] for i in order]


def needed_nodes(order: list[Node], outputs: Sequence[str]) -> list[Node]:
    """The nodes (in ``order``) that the given output names depend on."""
    need = set(outputs)
    keep = []
    for n in reversed(order):
        if any(o in need for o in n.outputs if o):
            keep.append(n)
            need.update(i for i in n.inputs if i)
            for sg in n.subgraphs:
                need.update(sg.free_variables())
    keep.reverse()
    return keep
