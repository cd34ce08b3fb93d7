"""The Tensor runner: a Plan's steps run on Tensors through the tape.

``plan.execute(xs, runner=TapeRunner(device, training_mode=...))`` runs an imported graph (or a
recorded tape replayed as a schedule) so that every node is recorded, as a model written with
layers is: gradients reach the graph's weights and ``to_onnx`` exports what ran.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import numpy as np

from workbench.arrays.device import default_device
from workbench.autodiff import fusion, rules
from workbench.autodiff import tape as _tape
from workbench.autodiff.tape import Tensor, run_op
from workbench.ops.registry import facts
from workbench.runtime.segments import _pure_kernel


def _constant_once(fn, wants_ctx):
    """A host Constant's kernel run once, its array handed out on every later run (an
    exported transformer has ~60 Constants a step; the kernel's attribute checks and context
    were ~8 us of each). The kernel gives the ``value`` attribute's own array: it is handed
    out as a read-only view, as the inference plans hand out their constant outputs, so a
    caller writing into a Constant that is a graph output (``c.data *= 2``) gets an error
    instead of changing the model's Constant for every later run and every other output
    that reads it (kernels never write their inputs)."""
    made = []

    def constant(**kw):
        if not made:
            a = fn(**kw, ctx=None) if wants_ctx else fn(**kw)
            if type(a) is np.ndarray and a.flags.writeable:
                a = a.view()
                a.flags.writeable = False
            made.append(a)
        return made[0]

    constant.__name__ = getattr(fn, "__name__", "constant")
    return constant


class _Memo:
    """The remembered outputs of one shape-arithmetic step of a Tensor runner's plan.

    An exported transformer computes its Reshape targets and position ids in the graph
    (``Shape -> Gather -> Unsqueeze -> Concat``, ``Range``, ``Cast`` ...: ~90 nodes of the
    BERT-like step) and a training step ran each kernel every step. A step whose kernel is
    one of the engine's own and deterministic (no ``random`` fact, no subgraph, no training
    form or state, host arrays) remembers its outputs under a key made of

    - the *shapes* of its inputs, for an op that reads only shapes (Shape, Size);
    - else the dtype, shape and *bytes* of every input, each at most ``KEY_ELEMENTS``
      elements of a bool, integer or float dtype and none requiring a gradient (otherwise
      the step just runs; an object array's bytes would be addresses, not values).

    The key is the whole of what the kernel reads, so a changed input shape, an edited
    Constant or weight (in place or replaced) never hands out a stale value: it makes another
    key. A hit still records the node on the tape through :func:`run_op` (its real kernel
    kept as the node's ``fn``, its inputs and attributes as they are: ``to_onnx``, graph-mode
    replays and ``creator.backward`` see the original nodes); only the kernel call is
    skipped. Remembered outputs are private read-only copies of at most ``MEMO_BYTES`` each
    (a consumer cannot write into them, and they alias no input); at most ``MEMO_KEYS`` keys
    per step (all dropped when a new one would exceed it). Results are bit for bit the
    kernel's: the same kernel computed them from the same bytes.
    """

    __slots__ = ("shape_only", "entries", "off")

    KEY_ELEMENTS = 256
    MEMO_BYTES = 1 << 16
    MEMO_KEYS = 8

    def __init__(self, shape_only: bool):
        self.shape_only = shape_only
        self.entries: dict = {}
        self.off = False          # an output that cannot be remembered: the step just runs

    def key(self, args) -> tuple | None:
        """The key of these inputs, or None when the step must run (see the class)."""
        key = []
        for t in args:
            if t is None:
                key.append(None)
                continue
            if not isinstance(t, Tensor):
                return None
            a = t.data
            if type(a) is not np.ndarray:
                return None
            if self.shape_only:
                key.append(a.shape)
            elif t.requires_grad or a.size > self.KEY_ELEMENTS or a.dtype.kind not in "biuf":
                return None     # (an object array's bytes are addresses, not values)
            else:
                key.append((a.dtype, a.shape, a.tobytes()))
        return tuple(key)

    def store(self, key, r) -> None:
        """Remember the outputs ``r`` (a Tensor or a tuple of Tensors) under ``key``."""
        arrays = []
        for t in (r if type(r) is tuple else (r,)):
            a = t.data if isinstance(t, Tensor) else None
            if type(a) is not np.ndarray or a.nbytes > self.MEMO_BYTES \
                    or a.dtype.kind not in "biuf":
                self.off = True
                self.entries.clear()
                return
            a = a.copy()
            a.flags.writeable = False
            arrays.append(a)
        arrays = tuple(arrays)
        if len(self.entries) >= self.MEMO_KEYS:
            self.entries.clear()
        self.entries[key] = lambda *a, **k: arrays


class _Reused:
    """A host Constant's recorded output Tensor (and so its tape node), made at the step's
    first run and handed out again on later runs while the settings that shape a recorded
    node are the same (recording on/off, gradients enabled, ``set_save_all``, the node class,
    the device).
    A Constant has no inputs and its kernel ran once anyway (:func:`_constant_once`): what
    this saves is recording ~60 identical nodes a step of an exported transformer, and freeing
    them after. The node is the one ``to_onnx`` exports (a walk meets it once), and a
    backward never frees or changes it (it requires no gradient). A Tensor handed to the
    caller (a Constant that is a graph output) and then moved or given other data or
    ``requires_grad`` is not handed out again: the step records afresh."""

    __slots__ = ("made_under", "out", "data")

    def __init__(self):
        self.made_under = self.out = self.data = None


def _memo_for(step, fn, state, device) -> _Memo | None:
    """A :class:`_Memo` for ``step`` when its outputs may be remembered, else None."""
    n = step.node
    if state or fn is not step.fn or step.subplans or n.op_type == "Constant" \
            or (device is not None and device.is_cuda):
        return None
    f = facts(n.op_type, n.domain)
    if f.random or not _pure_kernel(step.fn):
        return None
    return _Memo(bool(f.shape_only))


def memo_enabled() -> bool:
    """Whether Tensor runners remember their shape arithmetic (``WORKBENCH_SHAPE_MEMO``, as
    the inference plans' segments: "0", "off", "false" or "no" turn it off)."""
    from workbench.runtime.segments import memo_enabled as on
    return on()


def _training_chains(found: dict, calls: dict) -> dict:
    """The entries of ``found`` (``fusion.find_chains``: ``{id(step): (role, chain)}``)
    whose chain's steps all run in training mode. A training runner's steps all do; a
    replayed tape (graph mode) holds the nodes a training runner recorded (fused there from
    its second run) beside nodes of layers written in Python (SINGA's autograd functions,
    recorded out of training mode), which eager training never fuses: neither does the
    replay, so a replay fuses exactly what eager training fuses, with the same bits."""
    off = {id(chain) for sid, (_, chain) in found.items() if not calls[sid].training_mode}
    if not off:
        return found
    return {sid: v for sid, v in found.items() if id(v[1]) not in off}


# --------------------------------------------------------------------------- the Tensor runner
class StepCall(NamedTuple):
    """How the Tensor runner calls one Plan step (prepared once per step)."""

    kw: dict                  #: the attributes merged with the spec defaults
    wants_ctx: bool           #: the kernel takes ``ctx=NodeContext(...)``
    n_outputs: int
    fn: Callable              #: the kernel, or the op's training form
    state_outputs: tuple      #: ((output, stateful input), ...) written back after the run
    training_mode: bool       #: run in training mode (``NodeContext.training``, the rule)
    state_updates: dict | None  #: {output: Tensor} fixed updates (a replayed tape node)
    out_names: tuple | None


class TapeRunner:
    """Runs the steps of a ``runtime.plan.Plan`` on Tensors (``plan.execute(xs,
    runner=TapeRunner(device, training_mode=...))``): every node through :func:`run_op`, so
    the tape records it. In training mode every node runs with ``NodeContext.training`` set
    and an op's registered training form (``@kernel(..., train=True)``: BatchNormalization
    with batch statistics, Dropout with a mask) replaces its kernel; the outputs its
    ``state_outputs`` name are written back into the stateful inputs (running statistics
    held by buffers). A recorded tape replayed in graph mode uses
    the same runner with each step's call given by :meth:`preset`.
    """

    def __init__(self, device=None, *, training_mode: bool = False):
        self.device = device
        self.training_mode = bool(training_mode)
        self._calls: dict[int, StepCall] = {}
        # training: the steps in the order of their first run, and the fused chains found in
        # them when the second run starts ({id(step): (role, chain)}; None: not looked yet)
        self._order: list = []
        self._fused: dict | None = None if self.training_mode and fusion.enabled() else {}
        # {id(step): _Memo or _Reused}: the steps whose outputs are remembered (_Memo) and
        # the host Constants whose recorded output is reused (_Reused)
        self._special: dict = {}
        self._memo_on = memo_enabled()
        #: ``slot -> Tensor or None``: the Tensor a plan input slot (an initializer, a
        #: replay's leaf) holds in this runner's runs, set by the plan's owner; the fusions
        #: read the scalar constants held there (``fusion.find_chains``), None: none
        self.leaf_source: Callable | None = None

    def preset(self, step, *, kw: dict, wants_ctx: bool, n_outputs: int, fn: Callable,
               training_mode: bool, state_updates: dict | None, out_names=None) -> None:
        """Give ``step`` a fixed call (a replayed tape node)."""
        self._calls[id(step)] = StepCall(kw, wants_ctx, n_outputs, fn, (), training_mode,
                                         state_updates, out_names)
        if not self.training_mode and fusion.enabled():
            # a replayed training tape fuses as the training runner that recorded it did:
            # its chains are looked for at the first replay, among the steps of nodes that
            # ran in training mode (:func:`_training_chains`)
            self._order.append(step)
            if training_mode:
                self._fused = None
        if self._memo_on and not state_updates:   # a replay remembers its shape steps too
            n = step.node
            if n.op_type == "Constant" and not n.domain:
                if self.device is None or not self.device.is_cuda:
                    self._special[id(step)] = _Reused()
            else:
                m = _memo_for(step, fn, (), self.device)
                if m is not None:
                    self._special[id(step)] = m

    def _prepare(self, step) -> StepCall:
        n = step.node
        kw = dict(step.attrs)
        wants_ctx = kw.pop("ctx", None) is not None
        n_out = 1
        for i, o in enumerate(n.outputs):
            if o:
                n_out = i + 1
        fn, state = step.fn, ()
        if self.training_mode:
            xp = "cupy" if self.device is not None and self.device.is_cuda else None
            form = rules.train_form(n.op_type, n.domain, step.opset, xp=xp)
            if form is not None:
                fn, wants_ctx = form.fn, form.wants_ctx
                state = facts(n.op_type, n.domain).state_outputs
                for o, _ in state:
                    n_out = max(n_out, o + 1)
        if n.op_type == "Constant" and not n.domain and fn is step.fn and not state \
                and (self.device is None or not self.device.is_cuda):
            fn, wants_ctx = _constant_once(fn, wants_ctx), False
            if self._memo_on:
                self._special[id(step)] = _Reused()
        call = StepCall(kw, wants_ctx, n_out, fn, state, self.training_mode, None,
                        tuple(n.outputs))
        self._calls[id(step)] = call
        if self._memo_on:
            m = _memo_for(step, fn, state, self.device)
            if m is not None:
                self._special[id(step)] = m
        if self._fused is None:
            self._order.append(step)
        return call

    def __call__(self, step, args: list, kw: dict) -> tuple:
        call = self._calls.get(id(step))
        if call is None:
            call = self._prepare(step)
        else:
            fused = self._fused
            if fused is None:   # a second run (a replay's first): find the chains once
                fused = self._fused = _training_chains(
                    fusion.find_chains(self._order, self._calls, self.leaf_source),
                    self._calls)
                self._order = []
            if fused:
                f = fused.get(id(step))
                if f is not None and kw is step.attrs:
                    r = fusion.run_step(self, f[0], f[1], step, call, args)
                    if r is not None:
                        return r
        sp = self._special.get(id(step))
        if sp is not None and kw is step.attrs:
            if type(sp) is _Reused:
                # a host Constant: its node and output made once, while the settings that
                # shape a recorded node are the same
                now = (_tape._recording.get(), _tape._grad_enabled.get(), _tape._save_all,
                       _tape._node_class,
                       self.device if self.device is not None else default_device())
                out = sp.out
                if sp.made_under == now and out.data is sp.data and not out.requires_grad:
                    return out
                r = self._run(step, call, args, kw)
                sp.made_under, sp.out, sp.data = now, r, r.data
                return r
            if not sp.off:
                key = sp.key(args)
                if key is not None:
                    given = sp.entries.get(key)
                    if given is not None:   # the kernel's outputs for these inputs
                        n = step.node
                        r = run_op(n.op_type, n.domain, step.opset, given, False, call.kw,
                                   n.attrs, args, call.n_outputs, n.name, call.out_names,
                                   call.training_mode, None, device=self.device)
                        node = r[0].creator
                        if node is not None:   # the node keeps its real kernel (replays)
                            node.fn, node.wants_ctx = call.fn, call.wants_ctx
                        return r[0] if call.n_outputs == 1 else tuple(r)
                    r = self._run(step, call, args, kw)
                    sp.store(key, r)
                    return r
        return self._run(step, call, args, kw)

    def _run(self, step, call: StepCall, args: list, kw: dict):
        """Run ``step``'s kernel through :func:`run_op` (recorded on the tape)."""
        kw0, wants_ctx, n_out, fn, state, training_mode, ups, out_names = call
        if kw is not step.attrs:  # subgraph bodies bound for this run
            kw = {k: v for k, v in kw.items() if k != "ctx"}
        else:
            kw = kw0
        if state:
            ups = {}
            for o, i in state:
                t = args[i] if i < len(args) else None
                if t is not None and t.creator is None and not t.stores_grad:
                    ups[o] = t
            ups = ups or None
        n = step.node
        r = run_op(n.op_type, n.domain, step.opset, fn, wants_ctx, kw, n.attrs, args, n_out,
                   n.name, out_names, training_mode, ups, device=self.device)
        return r[0] if n_out == 1 else tuple(r)   # (the run loop stores a lone output as is)

    def bind(self, plan, scope: dict) -> Callable:
        """A subgraph body over arrays (control flow is run, not differentiated)."""
        arrays = {k: (v.data if isinstance(v, Tensor) else v) for k, v in scope.items()}

        def body(*inputs):
            return plan.run_positional(inputs, arrays)

        body.plan = plan
        return body
