"""Per-node capture and comparison: run a model once, keep (or look at) every value it
computes, compare the values with a reference and find where two computations part.

>>> from workbench import divergence                                  # doctest: +SKIP
>>> cap = divergence.capture("model.onnx", {"x": x})                  # doctest: +SKIP
>>> cap.values["/layer1/Relu_output_0"].shape                          # doctest: +SKIP
>>> ref = divergence.ArrayReference(ort_values, rtol=1e-3, atol=1e-4)  # doctest: +SKIP
>>> d = divergence.first_divergence(cap.order, ref.matches,
...                                 sources=cap.sources)              # doctest: +SKIP
>>> print(d.describe())                                                # doctest: +SKIP

The criterion: walk the nodes in execution (topological) order; the first node with an
output that does not match the reference is where the computations part. When all of that
node's inputs match (or are values both sides share: the same graph inputs and
initializers), the node itself computes something different — "inputs match, output
doesn't" (``Divergence.inputs_match``); when an input already differs, the cause is upstream
of the node, in that input (an initializer or a graph input of a student's graph, or a value
that was not compared).

Two users, two kinds of reference: the TensorInspector compares with onnxruntime's values
of the same graph, by value name and tolerance (:class:`ArrayReference`,
:func:`compare_arrays`); the classroom's model exercises compare a student's graph with a
reference known only by digests, where a value matches when it equals *any* value the
reference computes (``workbench/classroom/modelcheck.py`` passes its own ``matches``).
Both capture through :func:`capture`, which uses the engine's per-node hook
(``Plan.run(..., hook=...)``) on the graph as written (no inference rewrites: every node's
output exists).

This module sits with the front ends (layer 7, beside ``quantization.py``): it runs models
through the public Plan, and both the widgets and the classroom kit (layer 8) use it; the
engine never imports it.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

import numpy as np

from workbench.errors import WorkbenchError

__all__ = ["to_numpy", "Capture", "capture", "ValueDiff", "compare_arrays", "ArrayReference",
           "Divergence", "first_divergence"]


def to_numpy(a):
    """A host numpy array of ``a`` (numpy, cupy, a Tensor); other values (sequences, None,
    maps) are returned as they are."""
    if isinstance(a, np.ndarray):
        return a
    if hasattr(a, "get") and hasattr(a, "__cuda_array_interface__"):
        return a.get()
    if hasattr(a, "numpy") and callable(a.numpy):
        return a.numpy()
    if isinstance(a, (list, tuple, dict)) or a is None:
        return a
    return np.asarray(a)


# ----------------------------------------------------------------------------- capture
@dataclass
class Capture:
    """What one run computed.

    ``values``: {name: host array} of the graph inputs, the initializers and every node
    output (when ``keep``); ``outputs``: the graph outputs in order (None after a failure);
    ``order``: the nodes in the order they were planned to run; ``sources``: names of the
    graph inputs and initializers; ``failed``: the name of the node whose kernel raised (None
    when the feeds were refused), ``error``: the message of any failure."""

    values: dict = field(default_factory=dict)
    outputs: list | None = None
    order: list = field(default_factory=list)
    sources: set = field(default_factory=set)
    failed: str | None = None
    error: str = ""

    @property
    def ok(self) -> bool:
        return not self.error


def _as_plan(model, outputs, device):
    from workbench.runtime.plan import Plan
    if isinstance(model, Plan):
        return model
    from workbench.graph.ir import Graph
    graph = model if isinstance(model, Graph) else getattr(model, "graph", None)
    if not isinstance(graph, Graph):
        from workbench.graph.load import load
        graph = load(model).graph
    kw = {"device": device} if device is not None else {}
    return Plan(graph, outputs=outputs, **kw)


def capture(model, feeds, *, outputs=None, device=None, keep: bool = True,
            on_value: Callable | None = None, raise_errors: bool = True) -> Capture:
    """Run ``model`` once on ``feeds`` (a list in input order or a dict by name) and capture
    every node's outputs through the engine's per-node hook.

    ``model``: a ``Plan``, a Graph IR, a loaded model, or anything ``graph.load.load``
    reads (path, bytes, ModelProto); it runs as written (no inference rewrites), limited to
    what ``outputs`` need when given. ``on_value(node, name, value)`` sees each node output
    as a host array (sequences and maps as they are) when it is computed; ``keep=False``
    keeps nothing (a caller that only streams). ``raise_errors=False`` records a failure in
    ``Capture.failed`` / ``Capture.error`` and returns what ran before it.
    """
    plan = _as_plan(model, outputs, device)
    cap = Capture(order=list(plan.nodes))
    graph = plan.graph
    cap.sources = {v.name for v in plan.input_infos} | set(graph.initializers)
    if keep:
        if isinstance(feeds, dict):
            cap.values.update({k: to_numpy(v) for k, v in feeds.items()})
        else:
            cap.values.update({v.name: to_numpy(a) for v, a in zip(plan.input_infos, feeds)})
        for name, arr in graph.initializers.items():
            cap.values.setdefault(name, to_numpy(arr))

    done = [0]             # nodes finished: the one after them is the one that failed

    def hook(node, outs) -> None:
        done[0] += 1
        for name, value in zip(node.outputs, outs):
            if not name:
                continue
            host = to_numpy(value)
            if on_value is not None:
                on_value(node, name, host)
            if keep:
                cap.values[name] = host

    try:
        cap.outputs = [to_numpy(o) for o in plan.run(feeds, hook=hook)]
    except WorkbenchError as e:
        if raise_errors:
            raise
        cap.error = str(e)
        cap.failed = getattr(e, "node_name", None)
        if cap.failed is None and getattr(e, "_located", False) and done[0] < len(cap.order):
            cap.failed = cap.order[done[0]].name   # a kernel's own error, located by the run
    return cap


# ----------------------------------------------------------------------------- comparing
def _finite_or_none(v: float) -> float | None:
    return v if math.isfinite(v) else None


@dataclass
class ValueDiff:
    """One value against its reference: ``ok`` (within ``atol + rtol·|reference|`` everywhere;
    NaN where the reference has NaN counts as equal), ``max_abs`` (the largest absolute
    difference; None when not comparable or not finite), ``note`` (why not comparable)."""

    ok: bool
    max_abs: float | None = None
    note: str | None = None

    def to_dict(self) -> dict:
        """The TensorInspector's row fields: ``diff``, ``diff_ok`` (and ``diff_note``)."""
        d = {"diff": self.max_abs, "diff_ok": self.ok}
        if self.note:
            d["diff_note"] = self.note
        return d


def compare_arrays(a, ref, *, rtol: float, atol: float, ref_name: str = "the reference") \
        -> ValueDiff:
    """Compare an array with its reference (shapes first; non-numeric arrays exactly)."""
    try:
        a, ref = to_numpy(a), to_numpy(ref)
        if not isinstance(a, np.ndarray) or not isinstance(ref, np.ndarray):
            same = type(a) is type(ref) and _same_structure(a, ref)
            return ValueDiff(same, 0.0 if same else None,
                             None if same else "not an array on both sides")
        if a.shape != ref.shape:
            return ValueDiff(False, None, f"shape {list(a.shape)} vs {ref_name} "
                                          f"{list(ref.shape)}")
        if a.dtype.kind not in "biuf" or ref.dtype.kind not in "biuf":
            same = bool(np.array_equal(a, ref))
            return ValueDiff(same, 0.0 if same else None)
        af, rf = a.astype(np.float64), ref.astype(np.float64)
        both_nan = np.isnan(af) & np.isnan(rf)
        d = np.where(both_nan, 0.0, np.abs(af - rf))
        md = float(np.max(d)) if d.size else 0.0
        ok = bool(np.all(d <= atol + rtol * np.abs(np.nan_to_num(rf))))
        return ValueDiff(ok, _finite_or_none(md))
    except Exception as e:  # never let a comparison break its caller
        return ValueDiff(False, None, f"{type(e).__name__}: {e}")


def _same_structure(a, b) -> bool:
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(
            bool(np.array_equal(to_numpy(x), to_numpy(y))) for x, y in zip(a, b))
    return a == b


class ArrayReference:
    """A reference known by its arrays, by value name: ``matches(name)`` is True/False, or
    None for a value it does not hold (not compared). Each comparison is remembered
    (``diffs``)."""

    def __init__(self, arrays: dict, *, rtol: float, atol: float, values: dict | None = None,
                 name: str = "the reference"):
        self.arrays = arrays
        self.rtol, self.atol = rtol, atol
        self.values = values if values is not None else {}
        self.name = name
        self.diffs: dict[str, ValueDiff] = {}

    def compare(self, name: str, value) -> ValueDiff | None:
        """Compare ``value`` (ours) with the reference's value of that name."""
        if name not in self.arrays:
            return None
        d = compare_arrays(value, self.arrays[name], rtol=self.rtol, atol=self.atol,
                           ref_name=self.name)
        self.diffs[name] = d
        return d

    def matches(self, name: str) -> bool | None:
        if name in self.diffs:
            return self.diffs[name].ok
        if name not in self.values:
            return None
        d = self.compare(name, self.values[name])
        return None if d is None else d.ok


# ----------------------------------------------------------------------------- divergence
def _io(node) -> tuple[list, list]:
    if hasattr(node, "inputs"):
        return list(node.inputs), list(node.outputs)
    return list(node.input), list(node.output)      # an onnx.NodeProto


@dataclass
class Divergence:
    """Where a computation first parts from its reference.

    ``node``/``op_type``: the first node with an output that matches nothing; ``value``: that
    output; ``inputs``: the node's inputs; ``differing``: [(input, kind)] of the inputs that
    already do not match (kind: "an initializer", "a graph input" or "computed"); empty when
    every input matches — the node itself computes something different. ``unchecked``: inputs
    nobody compared."""

    node: str
    op_type: str
    value: str
    inputs: list
    differing: list = field(default_factory=list)
    unchecked: list = field(default_factory=list)

    @property
    def inputs_match(self) -> bool:
        """True when the inputs match and the output does not: this node is where it goes
        wrong."""
        return not self.differing

    @property
    def label(self) -> str:
        return f"{self.node or '(unnamed)'!r} ({self.op_type})"

    def describe(self) -> str:
        if self.inputs_match:
            text = (f"{self.label} is the first node whose inputs match and whose output "
                    f"{self.value!r} does not")
        else:
            text = (f"{self.label} is the first node whose output {self.value!r} does not "
                    f"match; its input(s) "
                    + ", ".join(f"{i!r} ({k})" for i, k in self.differing)
                    + " already differ")
        if self.unchecked:
            text += " (not compared: " + ", ".join(map(repr, self.unchecked)) + ")"
        return text


def first_divergence(nodes: Iterable, matches: Callable[[str], bool | None], *,
                     sources: Iterable[str] = (), graph_inputs: Iterable[str] = (),
                     initializers: Iterable[str] = ()) -> Divergence | None:
    """The first node of ``nodes`` (in execution order; IR nodes or ``onnx.NodeProto``s)
    with an output for which ``matches(name)`` is False, as a :class:`Divergence`; None when
    no compared output differs.

    ``matches(name)``: True (the value matches the reference), False (it does not), None
    (not compared). ``sources``: names both sides are known to share (the same graph inputs
    and initializers), counted as matching without asking. ``graph_inputs`` and
    ``initializers`` name what a differing input is, in the result."""
    shared = set(sources)
    g_in, inits = set(graph_inputs), set(initializers)
    for node in nodes:
        ins, outs = _io(node)
        bad_out = next((o for o in outs if o and matches(o) is False), None)
        if bad_out is None:
            continue
        differing, unchecked = [], []
        for i in ins:
            if not i or i in shared:
                continue
            m = matches(i)
            if m is False:
                kind = ("an initializer" if i in inits else "a graph input" if i in g_in
                        else "computed")
                differing.append((i, kind))
            elif m is None:
                unchecked.append(i)
        return Divergence(getattr(node, "name", "") or "", node.op_type, bad_out,
                          [i for i in ins if i], differing, unchecked)
    return None
