"""Memory over time: the live bytes of the engine's schedule, step by step, and a measured run.

The prediction walks the schedule our engine runs (``runtime.plan.Plan``: its ``steps``, each
with the slots it reads, writes and frees after its last use) and keeps, for every array the
run creates, how many values refer to it:

- a step's outputs are new arrays of their inferred size (shape x item size), except where the
  kernel returns a *view* of its first input (the op's ``output_view`` fact in the registry:
  Reshape, Transpose, Slice, Split...; a Reshape or Flatten of a value that is itself a
  strided view copies);
- an array is freed when the last value referring to it is freed (the Plan frees each value
  right after its last reader; graph outputs are kept);
- the weights (initializers) stay for the whole run: they are reported apart
  (``weights_bytes``), not in the live bytes; the graph inputs are held by the caller and
  counted live throughout.

Per step: ``live_before``, ``peak_during`` (what is live while the kernel runs: everything
before it plus its new outputs; a kernel's own scratch arrays are not in the schedule, see
below), ``live_after`` (after its frees). The peak is the largest ``peak_during``; the values
that make it are the arrays live at that step.

**A training step** (``training=True``): the schedule runs on Tensors that record the autodiff
tape (``autodiff.TapeRunner`` in training mode), every float initializer that is a parameter
requiring a gradient; the loss is the sum of the first output. A recorded node keeps its
inputs' and outputs' arrays for its backward (``TapeNode.saved_in`` / ``saved_out``) when one
of its inputs requires a gradient, so those arrays outlive the values' lifetimes, until the
backward pass has processed the node. The backward steps (the recorded nodes in reverse
order) each create the gradients of the inputs that need one (a view op's gradient is a view
of its output's gradient), drop the gradients of the node's outputs and release what the node
saved; the parameters' gradients accumulate and stay.

**Measuring** (:func:`measure`): the same schedule is run, after one warm-up run, under
``tracemalloc`` (numpy reports its data allocations to it), through a step runner that reads
the traced bytes before each kernel call, resets the peak, and reads the current and peak
bytes after it. So the measured ``live_before`` is what the run holds between steps, and the
measured ``peak_during`` includes the kernel's scratch arrays (an im2col block, a padded copy)
that no schedule shows: the difference is reported per step as ``scratch``. The feeds are
made after tracing starts (they count, as predicted); the weights were allocated before
(they do not, as predicted), and so were the workspaces some kernels keep between runs
(``ops.parallel.scratch``, made in the warm-up run). In a training step's backward pass every
gradient rule call (``autodiff.run_rule``, watched with ``sys.setprofile`` for that one pass)
is read the same way. The prediction's peak is compared with the measured peak of what the
run holds between steps (:meth:`MemoryTimeline.agreement`); the scratch arrays inside kernels
and rules come on top (``measured["peak_during"]``). tracemalloc counts Python objects too: in
a training step the tape's Tensors and nodes (about 0.8 KB per recorded node) are measured but
not predicted; one snapshot of numpy's own domain (array data) at the end of the forward tells
them apart (``measured["objects_forward_end"]``).
"""

from __future__ import annotations

import math
import tracemalloc
from dataclasses import dataclass, field

import numpy as np

from workbench.errors import InputError
from workbench.ops import registry

from ._units import human


def _output_view(node) -> str:
    """The registry's ``output_view`` fact of ``node``'s op ("" for a new array)."""
    if (node.domain or "") not in ("", "ai.onnx"):
        return ""
    return registry.facts(node.op_type).output_view


#: numpy's tracemalloc domain: its array data is traced there (everything else: Python objects)
NUMPY_DOMAIN = 389047
#: gradient rules that hand an input the output's gradient itself when the input has the
#: output's shape (no broadcast to undo): op -> the inputs concerned (None: all)
GRAD_PASSES = {"Add": None, "Sum": None, "Sub": (0,)}


@dataclass
class MemoryTimeline:
    """Live bytes over one run of a schedule (see the module docstring).

    ``steps``: one dict per step (``step``, ``phase`` "forward"/"backward", ``node``, ``op``,
    ``new_bytes``, ``freed_bytes``, ``live_before``, ``peak_during``, ``live_after``, and when
    measured ``measured_before``, ``measured_peak``, ``measured_after``, ``scratch``).
    ``weights_bytes``: initializers, held throughout and not counted in the live bytes;
    ``input_bytes``: the feeds (counted). ``peak_values``: the arrays live at the peak step,
    largest first (``value``, ``bytes``, ``kind``: input / activation / saved for backward /
    gradient / parameter gradient)."""

    steps: list
    training: bool
    weights_bytes: int
    input_bytes: int
    peak_bytes: int
    peak_step: int
    peak_values: list
    unknown: list = field(default_factory=list)     # values whose size is unknown (counted 0)
    label: str = ""
    measured: dict | None = None                    # see :func:`measure`

    # ------------------------------------------------------------------ views
    @property
    def peak_node(self) -> str:
        return self.steps[self.peak_step]["node"] if self.steps else ""

    def table(self):
        """The steps as a table (a DataFrame when pandas is there, else the list)."""
        try:
            import pandas as pd  # noqa: PLC0415
        except ImportError:
            return list(self.steps)
        return pd.DataFrame(self.steps)

    def peak_table(self, top: int = 10) -> list:
        return self.peak_values[:top]

    def live_after(self) -> dict:
        """{node: live bytes after its step} of the forward steps."""
        return {s["node"]: s["live_after"] for s in self.steps if s["phase"] == "forward"}

    def agreement(self) -> float | None:
        """Predicted peak / measured peak - 1 (None before :func:`measure`): the error of the
        schedule's prediction, as a fraction. Inference: against the peak of what the run
        holds between steps; a training step: against the peak of the whole run (see
        :func:`measure`)."""
        if not self.measured or not self.measured.get("peak"):
            return None
        return self.peak_bytes / self.measured["peak"] - 1.0

    def summary(self) -> str:
        what = "a training step (forward, loss = sum of the first output, backward)" \
            if self.training else "inference"
        at = self.steps[self.peak_step] if self.steps else None
        lines = [f"memory over {what}: {len(self.steps)} steps",
                 f"  peak {human(self.peak_bytes, 'B')} of arrays live"
                 + (f" at step {self.peak_step} ({at['phase']}, {at['op']} {at['node']!r})"
                    if at else "")
                 + f", plus {human(self.weights_bytes, 'B')} of weights held throughout; "
                   f"inputs {human(self.input_bytes, 'B')}"]
        if self.peak_values:
            top = ", ".join(f"{v['value']} {human(v['bytes'], 'B')} ({v['kind']})"
                            for v in self.peak_values[:5])
            lines.append(f"  largest at the peak: {top}")
        if self.unknown:
            lines.append(f"  note: {len(self.unknown)} value(s) of unknown size counted as 0 "
                         f"bytes: {', '.join(self.unknown[:5])}")
        m = self.measured
        if m and not self.training:
            lines.append(f"  measured (tracemalloc, after a warm-up run): peak held between steps "
                         f"{human(m['peak_between'], 'B')} (predicted "
                         f"{human(self.peak_bytes, 'B')}: {100 * self.agreement():+.1f} %); "
                         f"peak inside the kernels {human(m['peak_during'], 'B')}: their "
                         f"scratch arrays, up to {human(m['scratch_max'], 'B')} at "
                         f"{m['scratch_node']!r}, are no value of the schedule")
        elif m:
            lines.append(f"  measured (tracemalloc, after a warm-up step; around every kernel "
                         f"and every gradient rule): peak held between steps "
                         f"{human(m['peak'], 'B')} (predicted {human(self.peak_bytes, 'B')}: "
                         f"{100 * self.agreement():+.1f} %); peak inside kernels and rules "
                         f"{human(m['peak_during'], 'B')} (scratch arrays, up to "
                         f"{human(m['scratch_max'], 'B')} at {m['scratch_node']!r}); left "
                         f"after the step {human(m['after_backward'], 'B')} (parameter "
                         f"gradients, outputs)")
            if m.get("objects_forward_end"):
                lines.append(f"  of what the forward left, {human(m['objects_forward_end'], 'B')} "
                             f"are Python objects, not arrays (the autodiff tape's Tensors and "
                             f"nodes): tracemalloc counts them, the prediction does not")
        return "\n".join(lines)

    def __repr__(self) -> str:
        return (f"<MemoryTimeline {'training' if self.training else 'inference'}: "
                f"{len(self.steps)} steps, peak {human(self.peak_bytes, 'B')} at "
                f"{self.peak_node!r}>")

    def plot(self, ax=None, *, top: int = 3):
        """The timeline (matplotlib): live bytes after each step (filled), what a kernel holds
        while it runs (line), the measured bytes where :func:`measure` ran, the peak marked
        with the values that make it; the backward pass shaded. Returns the Axes."""
        try:
            import matplotlib.pyplot as plt  # noqa: PLC0415
        except ImportError:
            raise ImportError("MemoryTimeline.plot needs matplotlib (pip install matplotlib, "
                              "or the 'lab' extra)") from None
        if ax is None:
            _, ax = plt.subplots(figsize=(8, 3.6))
        mib = 2.0 ** 20
        x = [s["step"] for s in self.steps]
        after = [s["live_after"] / mib for s in self.steps]
        during = [s["peak_during"] / mib for s in self.steps]
        ax.fill_between(x, after, step="post", alpha=0.35, color="#4c78a8",
                        label="live after the step (predicted)")
        ax.plot(x, during, drawstyle="steps-post", color="#4c78a8", lw=1,
                label="while the step runs (predicted)")
        if self.measured:
            mx = [s["step"] for s in self.steps if s.get("measured_peak") is not None]
            if mx:
                ax.plot(mx, [s["measured_before"] / mib for s in self.steps
                             if s.get("measured_peak") is not None],
                        ".", ms=3, color="#e45756", label="measured between steps")
                ax.plot(mx, [s["measured_peak"] / mib for s in self.steps
                             if s.get("measured_peak") is not None],
                        "x", ms=3, color="#f58518", label="measured peak inside the kernel")
        back = [s["step"] for s in self.steps if s["phase"] == "backward"]
        if back:
            ax.axvspan(min(back), max(back) + 1, color="grey", alpha=0.08, label="backward")
        if self.steps:
            p = self.steps[self.peak_step]
            names = ", ".join(v["value"][-24:] for v in self.peak_values[:top])
            ax.annotate(f"peak {human(self.peak_bytes, 'B')}\n{names}",
                        (p["step"], p["peak_during"] / mib), textcoords="offset points",
                        xytext=(8, -4), fontsize=8, va="top")
        ax.set_xlabel("step of the schedule" + (" (forward, then backward)"
                                                if self.training else ""))
        ax.set_ylabel("MiB of arrays live")
        ax.set_title((self.label + ": " if self.label else "")
                     + ("training step" if self.training else "inference")
                     + f" (weights {human(self.weights_bytes, 'B')} not shown)", fontsize=10)
        ax.legend(fontsize=7, loc="upper right")
        ax.set_ylim(bottom=0)
        return ax


# ---------------------------------------------------------------------- the schedule
class _Sched:
    """What the prediction reads of a Plan: per step the node and the input / output / freed
    value names (slot -1, an omitted value: None)."""

    def __init__(self, plan):
        name_of = {s: n for n, s in plan.slots.items()}
        self.steps = []
        for st in plan.steps:
            self.steps.append((st.node, [name_of.get(s) if s >= 0 else None for s in st.ins],
                               [name_of.get(s) if s >= 0 else None for s in st.outs],
                               [name_of.get(s) for s in st.free]))
        self.inputs = [v.name for v in plan.input_infos]
        self.outputs = list(plan.output_names)


def plan_for(graph):
    """The engine's Plan of ``graph`` (the schedule the prediction walks)."""
    from workbench.runtime.plan import Plan  # noqa: PLC0415

    return Plan(graph)


class _Buffers:
    """Arrays, the references that keep each alive, and views (zero-size buffers holding a
    reference to their base)."""

    def __init__(self):
        self.size: list = []
        self.label: list = []
        self.kind: list = []
        self.refs: list = []
        self.strided: list = []
        self.base: dict = {}
        self.live = 0
        self.alive: set = set()

    def new(self, nbytes: int, label: str, kind: str) -> int:
        b = len(self.size)
        self.size.append(int(nbytes))
        self.label.append(label)
        self.kind.append(kind)
        self.refs.append(0)
        self.strided.append(False)
        self.alive.add(b)
        self.live += int(nbytes)
        return b

    def view(self, src: int, strided: bool) -> int:
        """A view of ``src``: ``src`` itself when contiguous, else a zero-size strided alias
        that keeps ``src`` alive."""
        if not strided and not self.strided[src]:
            return src
        b = self.new(0, self.label[src], self.kind[src])
        self.strided[b] = True
        self.base[b] = src
        self.ref(src)
        return b

    def root(self, b: int) -> int:
        while b in self.base:
            b = self.base[b]
        return b

    def ref(self, b: int) -> None:
        self.refs[b] += 1

    def unref(self, b: int) -> int:
        """Drop one reference; the bytes freed."""
        self.refs[b] -= 1
        if self.refs[b] > 0 or b not in self.alive:
            return 0
        self.alive.discard(b)
        self.live -= self.size[b]
        freed = self.size[b]
        base = self.base.pop(b, None)
        if base is not None:
            freed += self.unref(base)
        return freed

    def snapshot(self) -> list:
        out = [{"value": self.label[b], "bytes": self.size[b], "kind": self.kind[b]}
               for b in self.alive if self.size[b]]
        return sorted(out, key=lambda v: (-v["bytes"], v["value"]))


def _strided(op: str, in_shape, out_shape) -> bool:
    """Whether a view op's output is a strided (non-contiguous) view of a contiguous input."""
    if op == "Transpose":
        return True
    if op == "Expand":
        return in_shape is None or out_shape is None or tuple(in_shape) != tuple(out_shape)
    if op in ("Slice", "Split"):
        if in_shape is None or out_shape is None or len(in_shape) != len(out_shape):
            return True
        changed = [k for k, (a, b) in enumerate(zip(in_shape, out_shape)) if a != b]
        return bool(changed) and (len(changed) > 1 or math.prod(in_shape[:changed[0]]) != 1)
    return False


class _Simulation:
    """One walk of a schedule (see :func:`predict`)."""

    def __init__(self, plan, nbytes, shape_of, weights: set, params: set, training: bool):
        self.sched = _Sched(plan)
        self.nbytes, self.shape_of = nbytes, shape_of
        self.weights = weights
        self.params = set(params)
        self.training = training
        self.B = _Buffers()
        self.buf: dict = {}
        self.rows: list = []
        self.unknown: list = []
        self.best = -1
        self.snap: list = []
        self.rg = set(self.params)
        self.pinned: dict = {}
        self.recorded: list = []

    def size(self, name) -> int:
        n = self.nbytes(name)
        if n is None:
            if name not in self.unknown:
                self.unknown.append(name)
            return 0
        return int(n)

    def buffer_of(self, name):
        b = self.buf.get(name)
        if b is None and name in self.weights:
            b = self.buf[name] = self.B.new(0, name, "weight")   # counted apart
            self.B.ref(b)                                         # the Plan holds it
        return b

    def mark(self, during: int) -> None:
        """Called while a step runs (its new arrays made, nothing freed yet)."""
        if during > self.best:
            self.best = during
            self.snap = self.B.snapshot()

    def record(self, phase, node, op, before, new, freed, extra: int = 0) -> None:
        """One row; ``extra``: bytes briefly live after the kernel returned (a gradient
        accumulated: ``prev + g``)."""
        self.rows.append({"step": len(self.rows), "phase": phase, "node": node, "op": op,
                          "new_bytes": new, "freed_bytes": freed, "live_before": before,
                          "after_call": before + new, "peak_during": before + new + extra,
                          "live_after": self.B.live})

    def run(self) -> None:
        B = self.B
        for name in self.sched.inputs:
            b = self.buf[name] = B.new(self.size(name), name, "input")
            B.ref(b)                                              # the caller's feed
            B.ref(b)                                              # the run's value
        for node, ins, outs, frees in self.sched.steps:
            self.forward_step(node, ins, outs, frees)
        if self.training:
            self.backward()

    def forward_step(self, node, ins, outs, frees) -> None:
        B = self.B
        before, new, op = B.live, 0, node.op_type
        src = self.buffer_of(ins[0]) if ins and ins[0] is not None else None
        kind = _output_view(node)
        view = (kind != "" and src is not None
                and not (kind == "view-unless-strided" and B.strided[src])
                and not (op == "Dropout" and sum(1 for o in outs if o) > 1))
        made = []
        for o in outs:
            if o is None:
                continue
            if view:
                b = B.view(src, _strided(op, self.shape_of(ins[0]), self.shape_of(o)))
            else:
                n = self.size(o)
                b = B.new(n, o, "activation")
                new += n
            self.buf[o] = b
            B.ref(b)
            made.append(o)
        if self.training and any(x in self.rg for x in ins if x):
            self.rg.update(made)
            keep = {self.buffer_of(x) for x in ins if x} | {self.buf[o] for o in made}
            keep.discard(None)
            for b in keep:
                B.ref(b)
                r = B.root(b)
                if B.kind[r] == "activation":
                    B.kind[r] = "saved for backward"
            self.pinned[id(node)] = keep
            self.recorded.append((node, ins, outs))
        self.mark(before + new)
        freed = 0
        for f in frees:
            if f is None or f in self.weights:
                continue
            b = self.buf.pop(f, None)
            if b is not None:
                freed += B.unref(b)
        self.record("forward", node.name, op, before, new, freed)

    def backward_order(self, out0) -> list:
        """The recorded nodes in the order back-propagation visits them: the reverse of the
        tape's topological order from the loss (``autodiff.tape_order``: depth first through
        each node's inputs in order, a node after its parents)."""
        made_by = {}
        for rec in self.recorded:
            for o in rec[2]:
                if o:
                    made_by[o] = rec
        root = made_by.get(out0)
        if root is None:
            return []
        order, seen = [], {id(root[0])}
        stack = [(root, iter(root[1]))]
        while stack:
            rec, it = stack[-1]
            for x in it:
                p = made_by.get(x) if x else None
                if p is None or id(p[0]) in seen:
                    continue
                seen.add(id(p[0]))
                stack.append((p, iter(p[1])))
                break
            else:
                stack.pop()
                order.append(rec)
        return order[::-1]

    def backward(self) -> None:
        B = self.B
        out0 = self.sched.outputs[0]
        # the loss: the sum of the first output, a scalar recorded last
        before = B.live
        loss = B.new(4, "loss", "activation")
        B.ref(loss)
        self.mark(B.live)
        self.record("forward", "(loss)", "ReduceSum", before, B.live - before, 0)
        grads: dict = {}
        param_grads: dict = {}
        # its gradient: ones of the first output's shape
        before = B.live
        g = B.new(self.size(out0), f"d {out0}", "gradient")
        B.ref(g)
        grads[out0] = g
        self.mark(B.live)
        self.record("backward", "(loss)", "ReduceSum", before, B.live - before, 0)
        for node, ins, outs in self.backward_order(out0):
            before, new = B.live, 0
            gouts = [grads.get(o) if o else None for o in outs]
            made = []
            if any(x is not None for x in gouts):
                is_view = _output_view(node) != "" and gouts[0] is not None
                passes = GRAD_PASSES.get(node.op_type, ()) if gouts[0] is not None else ()
                out_shape = self.shape_of(outs[0]) if outs and outs[0] else None
                for k, x in enumerate(ins):
                    if x is None or x not in self.rg:
                        continue
                    if (is_view and k == 0) or ((passes is None or k in passes)
                                                and out_shape is not None
                                                and self.shape_of(x) == out_shape):
                        gb = B.view(gouts[0], False)
                    else:
                        n = self.size(x)
                        gb = B.new(n, f"d {x}", "parameter gradient" if x in self.params
                                   else "gradient")
                        new += n
                    B.ref(gb)
                    made.append((x, gb))
            extra = 0
            for x, gb in made:          # accumulation: prev + g is one more array
                target = param_grads if x in self.params else grads
                prev = target.get(x)
                if prev is not None:
                    extra = max(extra, B.size[B.root(gb)])
            self.mark(before + new + extra)
            freed = 0
            for x, gb in made:
                target = param_grads if x in self.params else grads
                prev = target.get(x)
                if prev is None:
                    target[x] = gb
                else:
                    n = B.size[B.root(gb)]
                    acc = B.new(n, f"d {x}", B.kind[B.root(prev)])
                    B.ref(acc)
                    freed += B.unref(prev) + B.unref(gb)
                    target[x] = acc
            for o in outs:
                if o and o in grads:
                    freed += B.unref(grads.pop(o))
            for b in self.pinned.pop(id(node), ()):
                freed += B.unref(b)
            self.record("backward", node.name, node.op_type, before, new, freed, extra)


def predict(plan, nbytes, shape_of, *, training: bool = False, params=(), weights=(),
            label: str = "") -> MemoryTimeline:
    """The live bytes over one run of ``plan`` (see the module docstring).

    ``nbytes(name)``: a value's size in bytes (None when unknown: counted 0 and listed in
    ``unknown``); ``shape_of(name)``: its shape (for views). ``weights``: the initializer
    names (held throughout, reported apart); ``training``: a training step, ``params`` the
    initializers that require a gradient."""
    weights = set(weights)
    sim = _Simulation(plan, nbytes, shape_of, weights, set(params) & weights, training)
    sim.run()
    rows = sim.rows
    k = max(range(len(rows)), key=lambda i: rows[i]["peak_during"]) if rows else 0
    wb = sum(nbytes(w) or 0 for w in weights)
    ib = sum(sim.size(n) for n in sim.sched.inputs)
    return MemoryTimeline(rows, training, int(wb), int(ib),
                          rows[k]["peak_during"] if rows else 0, k, sim.snap, sim.unknown,
                          label)


# ---------------------------------------------------------------------- measuring
class _RuleMeter:
    """Reads ``tracemalloc`` around every gradient rule the backward pass runs
    (``autodiff.run_rule``, seen with ``sys.setprofile`` for the one measured pass): the
    bytes before the rule, the peak during it and right after it, by node name."""

    def __init__(self, n: int):
        self.rec = np.zeros((n, 3), np.int64)
        self.names: list = [None] * n
        self.k = 0

    def run(self, backward, loss):
        import sys  # noqa: PLC0415

        from workbench.autodiff import run_rule  # noqa: PLC0415

        code = run_rule.__code__
        rec, names = self.rec, self.names
        depth = [0]

        def prof(frame, event, arg):
            if frame.f_code is not code or event not in ("call", "return"):
                return
            if event == "call":
                depth[0] += 1
                if depth[0] == 1 and self.k < len(rec):
                    node = frame.f_locals.get("node")
                    names[self.k] = getattr(node, "name", None)
                    rec[self.k, 0] = tracemalloc.get_traced_memory()[0]
                    tracemalloc.reset_peak()
            else:
                depth[0] -= 1
                if depth[0] == 0 and self.k < len(rec):
                    cur, peak = tracemalloc.get_traced_memory()
                    rec[self.k, 1] = max(peak, cur, rec[self.k, 0])
                    rec[self.k, 2] = cur
                    self.k += 1

        old = sys.getprofile()
        sys.setprofile(prof)
        try:
            backward(loss)
        finally:
            sys.setprofile(old)
        self.names = [nm for nm in names[:self.k]]


class _MeasuringRunner:
    """A step runner (``runtime.plan.StepRunner``) that reads ``tracemalloc`` around each
    kernel call: the bytes traced before it, the peak while it ran, and right after it (before
    the loop frees anything); ``inner``: the runner it wraps (None: plain kernel calls)."""

    def __init__(self, n: int, inner=None):
        self.inner = inner
        self.rec = np.zeros((n, 3), np.int64)      # allocated before the run: no drift
        self.k = 0

    def __call__(self, step, args, kw):
        before = tracemalloc.get_traced_memory()[0]
        tracemalloc.reset_peak()
        r = step.fn(*args, **kw) if self.inner is None else self.inner(step, args, kw)
        cur, peak = tracemalloc.get_traced_memory()
        k = self.k
        if k < len(self.rec):
            self.rec[k, 0] = before
            self.rec[k, 1] = max(peak, cur, before)
            self.rec[k, 2] = cur
        self.k = k + 1
        return r

    def bind(self, plan, scope):
        if self.inner is not None:
            return self.inner.bind(plan, scope)
        from workbench.runtime.run import bind_arrays  # noqa: PLC0415

        return bind_arrays(plan, scope)


def _array_bytes() -> int:
    """Bytes tracemalloc holds in numpy's domain now (array data only; one snapshot, whose
    own objects are freed before the caller reads the traced memory again)."""
    snap = tracemalloc.take_snapshot().filter_traces(
        [tracemalloc.DomainFilter(True, NUMPY_DOMAIN)])
    return int(sum(t.size for t in snap.traces))


def _training_values(graph, params):
    """{initializer: Tensor} for a training run: the parameters requiring a gradient, the
    other float initializers (running statistics) as plain Tensors."""
    from workbench.autodiff import Tensor  # noqa: PLC0415

    out = {}
    for name, a in graph.initializers.items():
        if not isinstance(a, np.ndarray) or a.dtype.kind != "f":
            continue
        out[name] = Tensor(data=a, requires_grad=name in params, stores_grad=name in params)
    return out


def _training_step(plan, feeds: dict, names, values, runner):
    """Forward on Tensors through ``runner`` (a measuring runner around a TapeRunner in
    training mode) and the loss (the sum of the first output); returns (outputs, loss,
    ``backward``). The feeds are taken out of ``feeds`` as they become Tensors (which copy
    them), so only one copy stays."""
    from workbench.autodiff import Tensor, apply, backward  # noqa: PLC0415

    xs = [Tensor(data=feeds.pop(k)) for k in names]
    outs = plan.execute(xs, runner=runner, values=values)
    y = outs[0]
    if not isinstance(y, Tensor) or y.data.dtype.kind != "f":
        raise InputError("a training step's memory needs a float first output (the loss is "
                         "its sum)")
    loss = apply("ReduceSum", [y], {"keepdims": 0}, opset=13)
    return outs, loss, backward


def measure(timeline: MemoryTimeline, plan, graph, feeds_fn, *, params=()) -> MemoryTimeline:
    """Run ``plan`` once to warm up, then once under ``tracemalloc`` (see the module
    docstring), and put the measured bytes beside ``timeline``'s prediction (``measured``
    and per step ``measured_before`` / ``measured_peak`` / ``measured_after_call`` /
    ``scratch``; bytes above what tracing saw when it started). ``feeds_fn()`` makes the
    inputs (called after tracing starts, so they count)."""
    names = [v.name for v in plan.input_infos]
    n = len(plan.steps)
    training = timeline.training
    params = set(params)

    def one_run(runner):
        feeds = feeds_fn()
        plan.execute([feeds[k] for k in names], runner=runner)

    from workbench.autodiff import TapeRunner  # noqa: PLC0415

    # warm-up: caches of kernels and of the plan are made here, outside the measurement
    if training:
        values = _training_values(graph, params)
        feeds = feeds_fn()
        outs, loss, backward = _training_step(plan, feeds, names, values,
                                              TapeRunner(training_mode=True))
        backward(loss)
        del outs, loss, values, feeds
    else:
        one_run(_MeasuringRunner(n))
    was_tracing = tracemalloc.is_tracing()
    if not was_tracing:
        tracemalloc.start()
    try:
        runner = _MeasuringRunner(n, TapeRunner(training_mode=True) if training else None)
        base = tracemalloc.get_traced_memory()[0]
        extra = {}
        if not training:
            one_run(runner)
        else:
            values = _training_values(graph, params)
            arrays_base = _array_bytes()
            base = tracemalloc.get_traced_memory()[0]
            feeds = feeds_fn()
            outs, loss, backward = _training_step(plan, feeds, names, values, runner)
            forward_end = tracemalloc.get_traced_memory()[0]
            arrays_end = _array_bytes() - arrays_base
            tracemalloc.reset_peak()
            rules = _RuleMeter(len(plan.steps) + 2)
            rules.run(backward, loss)
            cur, peak = tracemalloc.get_traced_memory()     # peak: since the last rule
            top = int(rules.rec[:rules.k, 1].max()) if rules.k else 0
            # what the forward left that is no array: the tape's Tensors, nodes, tuples (the
            # prediction counts array bytes only); None where numpy traces nothing
            objects = forward_end - base - arrays_end if arrays_end > 0 else None
            extra = {"forward_end": forward_end - base, "objects_forward_end": objects,
                     "backward_peak": max(peak, top) - base, "after_backward": cur - base}
            del outs, loss, values, feeds
    finally:
        if not was_tracing:
            tracemalloc.stop()
    rec = runner.rec[:min(runner.k, n)] - base
    steps = [s for s in timeline.steps if s["phase"] == "forward"][:len(rec)]
    if training:                # the backward steps, matched by node (the loss: its own row)
        back = {s["node"]: s for s in timeline.steps if s["phase"] == "backward"}
        for name, (before, peak, after) in zip(rules.names, rules.rec[:len(rules.names)]):
            s = back.get(name if name in back else "(loss)")
            if s is not None and "measured_before" not in s:
                steps.append(s)
                rec = np.vstack([rec, np.array([[before - base, peak - base, after - base]])])
    scratch_max, scratch_node = 0, ""
    for s, (before, peak, after) in zip(steps, rec):
        s["measured_before"] = int(before)
        s["measured_peak"] = int(peak)
        s["measured_after_call"] = int(after)
        s["scratch"] = int(max(0, peak - max(before, after)))
        if s["scratch"] > scratch_max:
            scratch_max, scratch_node = s["scratch"], s["node"]
    between = int(max(rec[:, 2].max(), rec[:, 0].max())) if len(rec) else 0
    during = int(rec[:, 1].max()) if len(rec) else 0
    if training and extra:
        between = max(between, extra["forward_end"])
        during = max(during, extra["backward_peak"])
    # what the prediction's peak is compared with: the arrays held between the steps (before
    # a kernel or gradient rule and right after it); the scratch arrays inside them are no
    # value of the schedule and are reported apart
    timeline.measured = {"runs": 1, "peak": between, "peak_between": between,
                         "peak_during": during,
                         "scratch_max": scratch_max, "scratch_node": scratch_node,
                         "method": "tracemalloc (numpy's data allocations are traced), a step "
                                   "runner reading it around every kernel call", **extra}
    return timeline
