"""The Tensor runner: a Plan's steps run on Tensors through the tape.

``plan.execute(xs, runner=TapeRunner(device, training_mode=...))`` runs an imported graph (or a
recorded tape replayed as a schedule) so that every node is recorded, as a model written with
layers is: gradients reach the graph's weights and ``to_onnx`` exports what ran.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

from workbench.autodiff import fusion, rules
from workbench.autodiff.tape import Tensor, run_op
from workbench.ops.registry import facts


def _constant_once(fn, wants_ctx):
    """A host Constant's kernel run once, its array handed out on every later run (an
    exported transformer has ~60 Constants a step; the kernel's attribute checks and context
    were ~8 us of each). The same array the kernel gives for a ``value`` attribute anyway;
    kernels never write their inputs."""
    made = []

    def constant(**kw):
        if not made:
            made.append(fn(**kw, ctx=None) if wants_ctx else fn(**kw))
        return made[0]

    constant.__name__ = getattr(fn, "__name__", "constant")
    return constant


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

    def preset(self, step, *, kw: dict, wants_ctx: bool, n_outputs: int, fn: Callable,
               training_mode: bool, state_updates: dict | None, out_names=None) -> None:
        """Give ``step`` a fixed call (a replayed tape node)."""
        self._calls[id(step)] = StepCall(kw, wants_ctx, n_outputs, fn, (), training_mode,
                                         state_updates, out_names)

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
        call = StepCall(kw, wants_ctx, n_out, fn, state, self.training_mode, None,
                        tuple(n.outputs))
        self._calls[id(step)] = call
        if self._fused is None:
            self._order.append(step)
        return call

    def __call__(self, step, args: list, kw: dict) -> tuple:
        call = self._calls.get(id(step))
        if call is None:
            call = self._prepare(step)
        else:
            fused = self._fused
            if fused is None:   # a second run: find the GELU chains once
                fused = self._fused = fusion.find_chains(self._order, self._calls)
                self._order = []
            if fused:
                f = fused.get(id(step))
                if f is not None and kw is step.attrs:
                    r = fusion.run_step(self, f[0], f[1], step, call, args)
                    if r is not None:
                        return r
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
