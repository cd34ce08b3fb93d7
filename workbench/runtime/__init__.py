"""Running graphs: the Plan and its run loop (layer 4, above ``graph/``, below the tape).

- ``plan.py``: :class:`Plan` built in named phases (order, slots, lifetimes, kernels, errors,
  device placement) into a :class:`Schedule`; ``Step``, ``SubPlan``, the ``StepRunner``
  protocol; feed checks.
- ``run.py``: the one run loop (plain, device and StepRunner calls; the fast schedule and
  its retry of stale shape segments).
- ``errors.py``: :func:`node_error`, the one wrapper that names the node in an error.
- ``cut.py``: cutting at ``last_layers`` (``resolve_cut``, ``cut``, ``layer_nodes``) and the
  engine's counting; other countings register themselves (``register_counting``).
- ``placement.py``: device placement (host shape values, host-dtype nodes, feeds on the wrong
  device, out-of-memory errors).
- ``segments.py``: the fast schedule of plain CPU runs (shape arithmetic remembered).
"""

# (the function ``cut`` is not re-exported: ``workbench.runtime.cut`` is the module)
from workbench.runtime.cut import (  # noqa: F401
    COUNTINGS,
    count_from_end,
    layer_nodes,
    register_counting,
    resolve_cut,
)
from workbench.runtime.errors import node_error  # noqa: F401
from workbench.runtime.plan import Plan, Schedule, Step, StepRunner, SubPlan  # noqa: F401
