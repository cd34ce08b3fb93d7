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
a training step the autodiff tape's objects; one snapshot of numpy's own domain (array data)
at the end of the forward tells them apart (``measured["objects_forward_end"]``). The
training runner the measured step uses is the warm-up's (its per-step call records are made
once, as in a training loop).

**The tape's objects** (a training step): every forward step leaves one tape entry (the
node, its links to its parents, its outputs' metadata and, when an input requires a
gradient, the lists of arrays it saved for the backward and the output arrays' Python
objects). The prediction adds their bytes (``tape_bytes`` per step, ``peak_tape_bytes`` at
the peak, a "tape bookkeeping" line among the peak's values): the cost of one entry of each
form (inputs, inputs from recorded nodes, output ranks, saving or not) is measured in this
process by recording such entries through the tape's own recording code under
``tracemalloc`` (:func:`tape_entry_bytes`), not assumed; the backward releases each node's
saved part when it has processed the node and holds the list of nodes it walks
(:func:`tape_order_bytes`) and, per parameter gradient, the gradient's array object and its
entry in the table of leaf gradients (:func:`gradient_entry_bytes`). What is still not
predicted: the Python objects of the values live at a moment (a few hundred bytes per array
and Tensor) and the backward's transient bookkeeping (the gradients in flight).
"""

from __future__ import annotations

import contextlib
import math
import sys
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


# ---------------------------------------------------------------------- the tape's objects
#: measured costs, by key: (inputs, inputs made by a recorded node, outputs, saves) ->
#: (held, saved) bytes per tape entry (:func:`tape_entry_bytes`); ("array", ndim) -> bytes of
#: an array's object; ("leaf", 0) -> bytes of a leaf-gradient entry
_TAPE_COSTS: dict = {}
#: entries recorded per measurement (their mean is the cost); more average out the
#: allocator's over-allocation of the lists an entry holds
_TAPE_SAMPLE = 16


def tape_entry_bytes(n_inputs: int, linked: int, n_outputs: int, saves: bool) -> tuple:
    """(held, saved): the bytes of Python objects one entry of the autodiff tape holds, as
    recorded by the code that records it (``autodiff.tape.run_op``, what the training runner
    calls for every step), measured with ``tracemalloc`` in this process and remembered.

    The entry: a node with ``n_inputs`` inputs of which ``linked`` come from earlier
    recorded nodes (the rest leaf Tensors) and ``n_outputs`` outputs, saving its arrays for
    the backward when ``saves`` (an input requires a gradient). ``held``: what stays once the
    step's output Tensors are gone (the node, its parent links, its outputs' metadata, the
    lists of saved arrays), until the tape itself is dropped; ``saved``: the part the
    backward releases when it frees the node's saved arrays (their ``sys.getsizeof``).
    Measured with CPython's free lists drained (:func:`_tracing`). The arrays' own Python objects
    are apart (:func:`array_object_bytes`: an entry that saves keeps them alive), their data
    too (predicted from the shapes)."""
    key = (int(n_inputs), int(min(linked, n_inputs)), max(1, int(n_outputs)), bool(saves))
    got = _TAPE_COSTS.get(key)
    if got is None:
        got = _TAPE_COSTS[key] = _measure_tape_entry(*key)
    return got


def array_object_bytes(ndim: int) -> int:
    """Bytes of one numpy array's Python object of ``ndim`` dimensions without its data (the
    object, its shape and strides), measured with ``tracemalloc`` in this process."""
    key = ("array", int(ndim))
    got = _TAPE_COSTS.get(key)
    if got is None:
        base = np.zeros((1,) * int(ndim), np.float32)
        held: list = [None] * (2 * _TAPE_SAMPLE)

        def make(k0):
            for k in range(k0, k0 + _TAPE_SAMPLE):
                held[k] = base.view()           # a new object, no new data

        with _tracing():
            got = _TAPE_COSTS[key] = max(0, min(_per_item(make)))
    return got


def gradient_entry_bytes(ndim: int) -> int:
    """Bytes of Python objects the backward holds per parameter gradient until it returns:
    the gradient array's object (:func:`array_object_bytes`) and its entry in the
    backward's table of leaf gradients (``{id(leaf): (leaf, gradient)}``, measured)."""
    key = ("leaf", 0)
    got = _TAPE_COSTS.get(key)
    if got is None:
        leaves = [object() for _ in range(2 * _TAPE_SAMPLE)]
        grads = [np.zeros(1, np.float32) for _ in range(2 * _TAPE_SAMPLE)]
        table: dict = {}

        def add(k0):
            for k in range(k0, k0 + _TAPE_SAMPLE):
                table[id(leaves[k])] = (leaves[k], grads[k])

        with _tracing():
            got = _TAPE_COSTS[key] = max(0, min(_per_item(add)))
    return got + array_object_bytes(ndim)


@contextlib.contextmanager
def _tracing():
    """``tracemalloc`` on for the block (left as it was found), with CPython's free lists
    drained: a list or tuple taken from a free list is no new allocation (and one freed into
    it no free) for tracemalloc, so what a measurement saw would depend on what ran before;
    with them empty, every object the measured code makes is a new, traced allocation (what
    a training step's hundreds of entries, beyond any free list's length, are)."""
    started = not tracemalloc.is_tracing()
    drained = _drain_free_lists()               # before tracing starts: quicker
    if started:
        tracemalloc.start()
    try:
        yield
    finally:
        drained = None  # noqa: F841  (held through the block)
        if started:
            tracemalloc.stop()


def _drain_free_lists() -> list:
    """Objects that empty the free lists of lists, dicts, tuples (up to 8 items; CPython
    keeps up to 2000 of each length) and numpy's cache of small shape/stride blocks; the
    caller holds them while it measures."""
    held: list = [[] for _ in range(100)]
    held += [{} for _ in range(100)]
    held += [tuple(range(n)) for n in range(1, 9) for _ in range(2010)]
    for nd in range(8):
        base = np.zeros((1,) * nd, np.float32)
        held += [base.view() for _ in range(40)]
    return held


def _per_item(change) -> list:
    """The traced bytes per item that ``change(k0)`` (acting on :data:`_TAPE_SAMPLE` items
    from ``k0``) adds, for two batches (``k0`` = 0 and :data:`_TAPE_SAMPLE`): a one-time
    allocation (a free list, a cache filled) shows in one of them only."""
    got = []
    for k0 in (0, _TAPE_SAMPLE):
        before = tracemalloc.get_traced_memory()[0]
        change(k0)
        got.append(round((tracemalloc.get_traced_memory()[0] - before) / _TAPE_SAMPLE))
    return got


def _measure_tape_entry(n_inputs: int, linked: int, n_outputs: int, saves: bool) -> tuple:
    from workbench.autodiff.tape import (  # noqa: PLC0415
        Tensor,
        enable_grad,
        run_op,
        saving_all,
    )

    outs_fixed = tuple(np.zeros((1, 1), np.float32) for _ in range(n_outputs))
    one = np.zeros(1, np.float32)

    def kernel(*_args):             # arrays made once: their objects are not the entry's
        return outs_fixed if n_outputs > 1 else outs_fixed[0]

    def producer(*_args):
        return one

    kw: dict = {}
    names = ("out",) * n_outputs
    # saving_all(False): an entry saves exactly when ``saves`` says, whatever a SINGA program
    # left the tape's ``set_save_all`` at (its ``autograd.training = True`` turns it on)
    with enable_grad(), saving_all(False), _tracing():
        leaf = Tensor(data=np.zeros(1, np.float32), requires_grad=saves)
        ins = [run_op("Identity", "", 13, producer, False, kw, kw, [leaf], 1, "producer",
                      None)[0] if k < linked else
               Tensor(data=np.zeros(1, np.float32), requires_grad=saves)
               for k in range(n_inputs)]
        nodes: list = [None] * (2 * _TAPE_SAMPLE + 4)

        def record(k0, n=_TAPE_SAMPLE):
            for k in range(k0, k0 + n):
                outs = run_op("Op", "", 13, kernel, False, kw, kw, ins, n_outputs, "node",
                              names)
                nodes[k] = outs[0].creator      # the outputs' Tensors go, the node stays

        record(2 * _TAPE_SAMPLE, 4)             # caches settle
        held = min(_per_item(record))
        # what the backward frees: the two lists of saved arrays (a freed list may go to a
        # free list, invisible to tracemalloc: their sizes are read directly)
        node = nodes[0]
        saved = sys.getsizeof(node.saved_in) + sys.getsizeof(node.saved_out) \
            if node.saved_in is not None else 0
        nodes = ins = node = None
    return max(0, held), max(0, saved)


def tape_order_bytes(n: int) -> int:
    """Bytes of the list of the ``n`` nodes a backward pass walks (``autodiff.tape_order``,
    grown one node at a time), held through the backward."""
    order: list = []
    for _ in range(int(n)):
        order.append(None)
    return sys.getsizeof(order)


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
    #: of ``peak_bytes``: the autodiff tape's Python objects (a training step; 0 otherwise)
    peak_tape_bytes: int = 0
    #: tape entries a training step records (its forward steps and the loss)
    tape_nodes: int = 0

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
        tape = (f" (arrays {human(self.peak_bytes - self.peak_tape_bytes, 'B')}, tape "
                f"bookkeeping {human(self.peak_tape_bytes, 'B')}: {self.tape_nodes} nodes' "
                f"Python objects)" if self.peak_tape_bytes else " of arrays")
        lines = [f"memory over {what}: {len(self.steps)} steps",
                 f"  peak {human(self.peak_bytes, 'B')}{tape} live"
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
                fwd = [s for s in self.steps if s["phase"] == "forward"]
                pred = fwd[-1]["tape_bytes"] if fwd else 0
                lines.append(f"  of what the forward left, {human(m['objects_forward_end'], 'B')} "
                             f"are Python objects, not arrays (the autodiff tape's nodes, "
                             f"Tensors); predicted tape bookkeeping {human(pred, 'B')}")
        return "\n".join(lines)

    def __repr__(self) -> str:
        return (f"<MemoryTimeline {'training' if self.training else 'inference'}: "
                f"{len(self.steps)} steps, peak {human(self.peak_bytes, 'B')} at "
                f"{self.peak_node!r}>")

    def plot(self, ax=None, *, top: int = 3):
        """The timeline (matplotlib): live bytes after each step (filled; in a training step
        the tape's objects among them, shaded apart), what a kernel holds while it runs
        (line), the measured bytes where :func:`measure` ran, the peak marked
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
        tape = [s.get("tape_bytes", 0) / mib for s in self.steps]
        if any(tape):
            ax.fill_between(x, tape, step="post", alpha=0.5, color="#b279a2",
                            label="of it: tape bookkeeping (Python objects)")
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
        ax.set_ylabel("MiB live" if any(tape) else "MiB of arrays live")
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

    def __init__(self, plan, nbytes, shape_of, weights: set, params: set, training: bool,
                 is_float=None):
        self.sched = _Sched(plan)
        self.nbytes, self.shape_of = nbytes, shape_of
        self.is_float = is_float or (lambda name: True)
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
        self.tape = 0               # bytes of the tape's Python objects (training)
        self.tape_nodes = 0
        self.tape_saved: dict = {}  # id(node) -> the part of them the backward releases
        self.made: set = set()      # values made by a step (their Tensors have a creator)
        self.objects_kept: set = set()  # values whose array object a saving entry keeps

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
        """Called while a step runs (its new arrays made, nothing freed yet; ``during``
        counts the tape's objects too)."""
        if during > self.best:
            self.best = during
            self.snap = self.B.snapshot()
            if self.tape:
                self.snap.append({"value": f"(autodiff tape: {self.tape_nodes} nodes)",
                                  "bytes": self.tape, "kind": "tape bookkeeping"})
                self.snap.sort(key=lambda v: (-v["bytes"], v["value"]))

    def record(self, phase, node, op, before, new, freed, extra: int = 0,
               tape_before: int | None = None) -> None:
        """One row; ``before``, ``new``, ``freed``: array bytes; ``extra``: bytes briefly
        live after the kernel returned (a gradient accumulated: ``prev + g``). The live
        columns add the tape's objects (``tape_before``: before the step, default: as
        after it); ``tape_bytes``: those after the step."""
        t0 = self.tape if tape_before is None else tape_before
        self.rows.append({"step": len(self.rows), "phase": phase, "node": node, "op": op,
                          "new_bytes": new, "freed_bytes": freed, "live_before": before + t0,
                          "after_call": before + new + self.tape,
                          "peak_during": before + new + extra + max(t0, self.tape),
                          "live_after": self.B.live + self.tape, "tape_bytes": self.tape})

    def record_tape(self, node, ins, outs, saves: bool) -> None:
        """The tape entry a training step's node leaves (:func:`tape_entry_bytes`) and, when
        it saves its arrays, their Python objects not yet kept by an earlier entry
        (:func:`array_object_bytes`); both released when the backward has processed it."""
        linked = sum(1 for x in ins if x and x in self.made)
        n_out = max([k + 1 for k, o in enumerate(outs) if o] or [1])
        held, saved = tape_entry_bytes(len(ins), linked, n_out, saves)
        if saves:
            for x in list(ins) + list(outs[:n_out]):
                if not x or x in self.weights or x in self.objects_kept:
                    continue
                self.objects_kept.add(x)
                shape = self.shape_of(x)
                n = array_object_bytes(len(shape) if shape is not None else 0)
                held += n
                saved += n
            self.tape_saved[id(node)] = saved
        self.tape += held
        self.tape_nodes += 1

    def run(self) -> None:
        B = self.B
        for name in self.sched.inputs:
            b = self.buf[name] = B.new(self.size(name), name, "input")
            B.ref(b)                                              # the caller's feed
            B.ref(b)                                              # the run's value
        for node, ins, outs, frees in self.sched.steps:
            self.forward_step(node, ins, outs, frees)
            self.made.update(o for o in outs if o)
        if self.training:
            self.backward()

    def forward_step(self, node, ins, outs, frees) -> None:
        B = self.B
        before, new, op = B.live, 0, node.op_type
        tape_before = self.tape
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
        saves = self.training and any(x in self.rg for x in ins if x)
        if self.training:
            self.record_tape(node, ins, outs, saves)
        if saves:
            self.rg.update(o for o in made if self.is_float(o))
            keep = {self.buffer_of(x) for x in ins if x} | {self.buf[o] for o in made}
            keep.discard(None)
            for b in keep:
                B.ref(b)
                r = B.root(b)
                if B.kind[r] == "activation":
                    B.kind[r] = "saved for backward"
            self.pinned[id(node)] = keep
            self.recorded.append((node, ins, outs))
        self.mark(before + new + self.tape)
        freed = 0
        for f in frees:
            if f is None or f in self.weights:
                continue
            b = self.buf.pop(f, None)
            if b is not None:
                freed += B.unref(b)
        self.record("forward", node.name, op, before, new, freed, tape_before=tape_before)

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
        before, tape_before = B.live, self.tape
        loss = B.new(4, "loss", "activation")
        B.ref(loss)
        held, _ = tape_entry_bytes(1, 1, 1, True)
        self.tape += held
        self.tape_nodes += 1
        self.mark(B.live + self.tape)
        self.record("forward", "(loss)", "ReduceSum", before, B.live - before, 0,
                    tape_before=tape_before)
        grads: dict = {}
        param_grads: dict = {}
        order = self.backward_order(out0)
        # its gradient: ones of the first output's shape; the list of nodes to visit
        before, tape_before = B.live, self.tape
        g = B.new(self.size(out0), f"d {out0}", "gradient")
        B.ref(g)
        grads[out0] = g
        self.tape += tape_order_bytes(len(order) + 1)
        self.mark(B.live + self.tape)
        self.record("backward", "(loss)", "ReduceSum", before, B.live - before, 0,
                    tape_before=tape_before)
        for node, ins, outs in order:
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
            self.mark(before + new + extra + self.tape)
            tape_before = self.tape
            freed = 0
            for x, gb in made:
                target = param_grads if x in self.params else grads
                prev = target.get(x)
                if prev is None:
                    target[x] = gb
                    if x in self.params:    # the backward's own entry for it
                        shape = self.shape_of(x)
                        self.tape += gradient_entry_bytes(len(shape) if shape else 0)
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
            self.tape -= self.tape_saved.pop(id(node), 0)
            self.record("backward", node.name, node.op_type, before, new, freed, extra,
                        tape_before=tape_before)


def predict(plan, nbytes, shape_of, *, training: bool = False, params=(), weights=(),
            label: str = "", is_float=None) -> MemoryTimeline:
    """The live bytes over one run of ``plan`` (see the module docstring).

    ``nbytes(name)``: a value's size in bytes (None when unknown: counted 0 and listed in
    ``unknown``); ``shape_of(name)``: its shape (for views). ``weights``: the initializer
    names (held throughout, reported apart); ``training``: a training step, ``params`` the
    initializers that require a gradient; ``is_float(name)``: whether a value is a float
    tensor (only those carry a gradient on; None: all are).
    """
    weights = set(weights)
    sim = _Simulation(plan, nbytes, shape_of, weights, set(params) & weights, training,
                      is_float)
    sim.run()
    rows = sim.rows
    k = max(range(len(rows)), key=lambda i: rows[i]["peak_during"]) if rows else 0
    wb = sum(nbytes(w) or 0 for w in weights)
    ib = sum(sim.size(n) for n in sim.sched.inputs)
    return MemoryTimeline(rows, training, int(wb), int(ib),
                          rows[k]["peak_during"] if rows else 0, k, sim.snap, sim.unknown,
                          label, peak_tape_bytes=max((rows[k]["tape_bytes"],
                                                      rows[k - 1]["tape_bytes"] if k else 0))
                          if rows else 0, tape_nodes=sim.tape_nodes)


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
        from workbench.autodiff.backprop import _run_rule  # noqa: PLC0415

        code = _run_rule.__code__   # what backward() calls for each node (run_rule's body)
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

    # warm-up: caches of kernels, of the plan and of the training runner (its per-step call
    # records, kept between steps as a training loop keeps them) are made here, outside the
    # measurement. Two training steps: the runner analyses its steps for fusion
    # (``autodiff.fusion``) at the start of its second run, so the measured (third) step is a
    # steady one, as a training loop's are, and that one-time analysis's temporaries do not
    # refill the drained free lists inside the measurement
    tape_runner = TapeRunner(training_mode=True) if training else None
    if training:
        for _ in range(2):
            values = _training_values(graph, params)
            feeds = feeds_fn()
            outs, loss, backward = _training_step(plan, feeds, names, values, tape_runner)
            backward(loss)
            del outs, loss, values, feeds
    else:
        # twice: the engine's worker threads keep per-thread workspaces (ops.parallel.scratch)
        # made the first time a thread gets work, which on a busy machine one run may not give
        # every thread; made in the measured run, one would count as held between steps
        one_run(_MeasuringRunner(n))
        one_run(_MeasuringRunner(n))
    # a training step: CPython's free lists emptied before tracing starts (and kept empty by
    # holding what emptied them), so that the tape's objects are traced allocations, not
    # objects recycled unseen from a free list (see _tracing); inference predicts arrays only
    drained = _drain_free_lists() if training else None
    was_tracing = tracemalloc.is_tracing()
    if not was_tracing:
        tracemalloc.start()
    try:
        runner = _MeasuringRunner(n, tape_runner)
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
        drained = None  # noqa: F841
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
