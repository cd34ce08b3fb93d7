"""Name scopes: the nesting a node's name gives (``/layer1/layer1.0/conv1/Conv`` lies in
``layer1`` / ``layer1.0`` / ``conv1``).

One rule for everything that groups nodes by scope: the graph drawing's groups
(:mod:`workbench.widgets.graph_data`) and the analysis' group sums
(:mod:`workbench.analysis`), so that the totals of a collapsed group in the viewer are the
analysis' totals of that scope.
"""

from __future__ import annotations

import re

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
        groups: list = []           # "layers", "0" -> "layers.0"
        for p in raw:
            if groups and _NUM.match(p):
                groups[-1].append(p)
            else:
                groups.append([p])
        parts = [".".join(g) for g in groups]
        # generated names (Paddle's ``conv2d_3.tmp_0``, paddle2onnx's ``p2o.Conv.3``) carry a
        # counter, not a scope: two components are a name, not a path
        if len(parts) >= 3:
            return parts[:-1]
    return []


__all__ = ["scope_of"]
