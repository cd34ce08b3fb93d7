"""Cutting a graph at ``last_layers`` (the one place: ``SONNXModel.cut``, ``Model.cut``, the
cutter widget and ``Plan(graph, outputs=resolve_cut(...))`` use it).

``last_layers`` is a node name (its outputs), a value name, a list of those, None (the whole
graph) or an integer counted over the *layers*: the nodes in topological order without
``Constant`` nodes (:func:`layer_nodes`). How an integer counts is a *counting*, a function
``counting(layers, k) -> Node | None`` (the node whose outputs end the cut; None: the whole
graph's outputs) that raises ``InputError`` for a ``k`` it does not accept. The engine's own,
:func:`count_from_end`, is ``"workbench"`` (see ``docs/architecture.md``, "The executor"); other
front ends add theirs with :func:`register_counting` (SINGA's ``(k + 1) % N`` is
``workbench/singa/counting.py``). ``resolve_cut`` takes a registered name or a counting
function.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable, Sequence

import numpy as np

from workbench.errors import InputError
from workbench.graph.ir import Graph, Node, ValueInfo
from workbench.graph.toposort import needed_nodes, topological_order

#: a counting: ``counting(layers, k) -> Node | None`` (None: the whole graph)
Counting = Callable[[Sequence[Node], int], "Node | None"]


def layer_nodes(graph: Graph) -> list[Node]:
    """The nodes counted by ``last_layers``: topological order, ``Constant`` nodes excluded."""
    return [n for n in topological_order(graph) if n.op_type != "Constant"]


def count_from_end(layers: Sequence[Node], k: int) -> Node | None:
    """The engine's counting (``"workbench"``, the meaning of SINGA's documentation page): -1
    keeps the whole graph; -k keeps all but the last k-1 layers (the last kept layer's
    outputs end the cut)."""
    if k >= 0:
        raise InputError(
            f"last_layers={k} is not valid: use -1 to keep the whole graph, -k to cut off "
            f"the last k-1 layers (-2 ... -{len(layers)}), or a node/value name")
    if k == -1:
        return None
    if -k > len(layers):
        raise InputError(f"last_layers={k} cuts more layers than the graph has "
                         f"({len(layers)} layers, so the smallest value is -{len(layers)})")
    return layers[len(layers) + k]


class Countings(dict):
    """The registered countings, by name (shown as the tuple of their names)."""

    def __repr__(self) -> str:
        return repr(tuple(self))


#: the countings an integer ``last_layers`` can be counted with, by name
COUNTINGS: Countings = Countings(workbench=count_from_end)


def register_counting(name: str, counting: Counting, *, replace: bool = False) -> None:
    """Make ``counting`` available as ``resolve_cut(..., counting=name)``; a name already
    registered is refused unless ``replace=True``."""
    if name in COUNTINGS and COUNTINGS[name] is not counting and not replace:
        raise ValueError(f"a last_layers counting named {name!r} is already registered "
                         f"(pass replace=True to replace it)")
    COUNTINGS[name] = counting


def resolve_cut(graph: Graph, last_layers, counting: str | Counting = "workbench") -> list[str]:
    """Output names for a cut at ``last_layers`` (see the module docstring).

    ``counting``: the name of a registered counting (``"workbench"``, the default: -1 keeps
    the whole graph, -k all but the last k-1 layers; ``"singa"`` once ``workbench.singa`` is
    imported: what SINGA's code does, ``(k + 1) % N``) or a counting function. A string
    ``last_layers`` names a node (its outputs) or a value; a list gathers several cuts.
    """
    if callable(counting):
        count = counting
    elif counting in COUNTINGS:
        count = COUNTINGS[counting]
    else:
        hint = (" (SINGA's counting registers itself when workbench.singa is imported: "
                "`from workbench import sonnx`)" if counting == "singa" else "")
        raise InputError(f"counting must be one of {COUNTINGS}, got {counting!r}{hint}")
    if last_layers is None:
        return [v.name for v in graph.outputs]
    if isinstance(last_layers, (list, tuple)):
        out = []
        for x in last_layers:
            out.extend(resolve_cut(graph, x, count))
        return out
    if isinstance(last_layers, (int, np.integer)) and not isinstance(last_layers, bool):
        node = count(layer_nodes(graph), int(last_layers))
        if node is None:
            return [v.name for v in graph.outputs]
        return [o for o in node.outputs if o]
    if isinstance(last_layers, str):
        node = graph.node_by_name(last_layers)
        if node is not None:
            return [o for o in node.outputs if o]
        values = {o for n in graph.nodes for o in n.outputs if o}
        values |= {v.name for v in graph.inputs}
        if last_layers in values:
            return [last_layers]
        names = [n.name for n in graph.nodes] + sorted(values)
        close = difflib.get_close_matches(last_layers, names, n=5)
        hint = f"; did you mean {', '.join(repr(c) for c in close)}?" if close else ""
        raise InputError(f"last_layers={last_layers!r} is neither a node nor a value name of "
                         f"graph {graph.name!r}{hint}")
    raise InputError(f"last_layers must be a negative int or a node/value name, "
                     f"got {type(last_layers).__name__}")


def cut(graph: Graph, last_layers, *, initializers: dict | None = None,
        prune_inputs: bool = True, name: str | None = None) -> Graph:
    """The graph cut at ``last_layers``: a new Graph of the nodes (copied) that the outputs of
    :func:`resolve_cut` need, the initializers they read (values taken from ``initializers``
    when given, e.g. a trained model's current weights), the graph inputs they read (all of
    them with ``prune_inputs=False``) and those outputs."""
    outputs = resolve_cut(graph, last_layers)
    keep = needed_nodes(topological_order(graph), outputs)
    used = {i for n in keep for i in n.inputs if i} | set(outputs)
    for n in keep:
        for sg in n.subgraphs:
            used |= sg.free_variables()
    values = graph.initializers if initializers is None else initializers
    return Graph(
        name=f"{graph.name}_cut" if name is None else name,
        nodes=[Node(n.op_type, list(n.inputs), list(n.outputs), dict(n.attrs), n.name,
                    n.domain, n.doc_string) for n in keep],
        inputs=[v for v in graph.inputs if not prune_inputs or v.name in used],
        outputs=[graph.value(o) or ValueInfo(o) for o in outputs],
        initializers={k: values[k] for k in graph.initializers if k in used},
        value_info={k: v for k, v in graph.value_info.items() if k in used},
        opsets=dict(graph.opsets), doc_string=graph.doc_string)
