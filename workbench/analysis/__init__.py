"""Where the time and memory go: per-node FLOPs, parameters, bytes and times, with a roofline.

>>> from workbench.analysis import analyze, measure_peaks, plot_roofline   # doctest: +SKIP
>>> a = analyze("mobilenetv2.onnx", shapes={"input": (1, 3, 224, 224)})    # doctest: +SKIP
>>> print(a.summary()); a.table(); a.groups()                              # doctest: +SKIP
>>> a.roofline()                  # this machine's peaks, measured once and cached
>>> a.with_ort(profile_ort("mobilenetv2.onnx", a.input_shapes))  # onnxruntime's kernel times
>>> a.profile_ours()              # our kernels' times per node, the run loop's cost left out
>>> a.memory(measure=True).plot() # live bytes over the schedule (training=True: a step)
>>> plot_roofline(a)                                                       # doctest: +SKIP
>>> GraphView(model).show_analysis(a)   # the same on the graph, with group totals

- :mod:`.analysis`: :func:`analyze` and :class:`Analysis` (the per-node table, group sums,
  totals, CSV / Markdown);
- :mod:`.costs`: the counting conventions and one rule per op family;
- :mod:`.weights`: parameters and buffers, in initializers and in Constant nodes;
- :mod:`.shapes`: binding symbolic dims, shape inference, running for the rest;
- :mod:`.roofline`: this machine's peaks (cached), placing nodes, the plot;
- :mod:`.ort_profile`: onnxruntime's profiler, its kernels mapped onto our nodes;
- :mod:`.timing`: our per-node kernel times (a timing step runner);
- :mod:`.memory`: live bytes over the engine's schedule, inference and a training step, and a
  measured run (tracemalloc) beside the prediction;
- :mod:`.overlay`: the analysis as a graph overlay (GraphView, the JupyterLab viewer).

The engine is used only through its public API (``graph.load``, ``backend.prepare``, the
Plan's steps and its ``execute(runner=)``, the autodiff tape); this package never imports
onnxruntime at import time (only :func:`profile_ort` does).
"""

from __future__ import annotations

from .analysis import COLUMNS, Analysis, analyze, human, markdown_table
from .costs import Cost, NodeView, rule
from .memory import MemoryTimeline
from .ort_profile import OrtKernel, OrtProfile, profile_ort
from .overlay import overlay_payload
from .roofline import Peaks, cached_peaks, measure_peaks, place, plot_roofline
from .timing import PlanTimes, TimingRunner, time_plan
from .weights import Weight, find_weights, weight_summary

__all__ = ["analyze", "Analysis", "COLUMNS", "human", "markdown_table", "Cost", "NodeView",
           "rule", "OrtKernel", "OrtProfile", "profile_ort", "Peaks", "measure_peaks",
           "cached_peaks", "place", "plot_roofline", "Weight", "find_weights",
           "weight_summary", "MemoryTimeline", "PlanTimes", "TimingRunner", "time_plan",
           "overlay_payload"]
