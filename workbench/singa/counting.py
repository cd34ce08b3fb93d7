"""SINGA's counting of an integer ``last_layers`` (what SINGA's code does, ``SingaRep.run``).

With N layers (the nodes in topological order without Constants), an integer L >= 0 is the
index of the last node run and a negative L the index ``(L + 1) % N``; index N-1 means the
whole graph (its outputs), any other index that node's outputs. So -1 is the *first* node, -2
the whole graph, -3 drops the last node. (The engine's own counting, ``"workbench"``, follows
SINGA's documentation page instead: -1 the whole graph, -k all but the last k-1 layers.)

Importing this module registers it as ``resolve_cut(..., counting="singa")``
(:func:`workbench.runtime.cut.register_counting`); ``sonnx.prepare``/``SingaRep`` and a
``SONNXModel`` built for SINGA code use it (``docs/singa-compat.md``).
"""

from __future__ import annotations

from collections.abc import Sequence

from workbench.errors import InputError
from workbench.graph.ir import Node
from workbench.runtime.cut import register_counting


def singa_counting(layers: Sequence[Node], k: int) -> Node | None:
    """The node whose outputs end a cut at ``last_layers=k`` in SINGA's counting (None: the
    whole graph)."""
    n = len(layers)
    if n == 0:
        return None
    if k >= n:
        raise InputError(f"last_layers={k} is past the last node (SINGA counting: "
                         f"0 ... {n - 1} or a negative number; the graph has {n} "
                         f"nodes besides Constants)")
    idx = k if k >= 0 else (k + 1) % n
    if idx == n - 1:
        return None
    return layers[idx]


register_counting("singa", singa_counting)
