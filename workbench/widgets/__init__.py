"""Jupyter widgets for ONNX models (anywidget on ipywidgets; front-end files in ``static/``).

- :class:`GraphView` — interactive graph: pan/zoom, search, op colours, node details.
- :class:`GraphCompare` — two graphs side by side, matched nodes paired, the rest ringed.
- :class:`ModelEditor` — model surgery in the drawing: menus on nodes and values, undo/redo,
  the replay script, compare before/after, save.
- :class:`LayerCutter` — choose ``last_layers`` with a slider or a click; optional new head.
- :class:`TensorInspector` — per-node output statistics, histograms, feature maps, compare.
- :class:`TrainingMonitor` — live curves, progress/ETA, Stop button; text bar in scripts;
  :class:`DistMonitor` — the same for a data-parallel job (rank 0 shows, global throughput).
- :func:`netron` — Netron's own viewer served on 127.0.0.1, shown in an IFrame.

Imports are lazy: ``import workbench.widgets`` does not import anywidget until a widget is
used, and TrainingMonitor / netron work without it.
"""

from __future__ import annotations

import importlib

_EXPORTS = {
    "GraphView": "workbench.widgets.graph_view",
    "LayerCutter": "workbench.widgets.cutter",
    "CutModel": "workbench.widgets.cutter",
    "cut_graph": "workbench.widgets.cutter",
    "TensorInspector": "workbench.widgets.inspector",
    "tensor_stats": "workbench.widgets.inspector",
    "TrainingMonitor": "workbench.widgets.monitor",
    "DistMonitor": "workbench.widgets.monitor",
    "netron": "workbench.widgets.netron_view",
    "NetronView": "workbench.widgets.netron_view",
    "view_main": "workbench.widgets.netron_view",
    "graph_payload": "workbench.widgets.graph_data",
    "GraphCompare": "workbench.widgets.compare",
    "ModelEditor": "workbench.widgets.editor",
    "match_graphs": "workbench.widgets.compare",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    mod = _EXPORTS.get(name)
    if mod is None:
        raise AttributeError(f"module 'workbench.widgets' has no attribute {name!r}")
    value = getattr(importlib.import_module(mod), name)
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(__all__))
