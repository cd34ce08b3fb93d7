"""Compatibility module: the executor now lives in :mod:`workbench.runtime` (the Plan and its
phases in ``runtime/plan.py``, the run loop in ``runtime/run.py``, cutting in
``runtime/cut.py``, device placement in ``runtime/placement.py``); the graph queries in
:mod:`workbench.graph.toposort`. Import from there; this module re-exports the names code
imported from here until every caller has moved.
"""

from workbench.graph.toposort import needed_nodes, topological_order  # noqa: F401
from workbench.runtime.cut import (  # noqa: F401
    COUNTINGS,
    count_from_end,
    cut,
    layer_nodes,
    register_counting,
    resolve_cut,
)
from workbench.runtime.plan import Plan, Schedule, Step, StepRunner, SubPlan  # noqa: F401

__all__ = ["COUNTINGS", "Plan", "Schedule", "Step", "StepRunner", "SubPlan", "count_from_end",
           "cut", "layer_nodes", "needed_nodes", "register_counting", "resolve_cut",
           "topological_order"]
