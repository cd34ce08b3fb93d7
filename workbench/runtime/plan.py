"""The Plan: parse once, run many times.

A :class:`Plan` is built from a :class:`~workbench.graph.ir.Graph` in named phases
(:func:`plan_graph`), each a function of its own:

1. **order** - the nodes in topological order, only those the outputs need
   (:mod:`workbench.graph.toposort`);
2. **slots** - every value gets an integer slot (:func:`assign_slots`);
3. **lifetimes** - each value is freed right after its last use (:func:`lifetimes`);
4. **kernels** - each node's kernel is looked up once for the model's opset (and the plan's
   array module), attributes merged with the spec's defaults once, subgraphs planned
   (:func:`bind_kernels`);
5. **errors** - every node without a kernel is reported at once (:func:`raise_missing`);
6. **device placement** - a device plan's host values (:mod:`workbench.runtime.placement`).

The phases produce a :class:`Schedule`, and the one constructor, ``Plan(schedule)``, turns any
Schedule into a Plan: ``Plan(graph, ...)`` plans the graph first, :meth:`Plan.of_steps` wraps a
schedule made elsewhere (a recorded tape). ``Plan.run`` / ``Plan.execute`` then hand the steps
to the one run loop (:mod:`workbench.runtime.run`). Per-node hooks see every node's outputs
(the widgets' tensor inspector uses them); a Plan built with ``outputs=[...]`` keeps only the
nodes those outputs need (cutting at ``last_layers``: :mod:`workbench.runtime.cut`).

A Plan built for a device (``Plan(graph, device="CUDA:0")``) looks its kernels up for that
device's array module (the cupy overrides of ``workbench/ops/cuda.py`` first, the portable
kernel otherwise), gives input-less kernels the module in ``ctx.extra["xp"]``, keeps its
initializers on the device, refuses feeds that live elsewhere, and turns an out-of-memory
failure into a ``DeviceError`` naming the device, the node and the bytes requested; what stays
on the host, and why, is described in :mod:`workbench.runtime.placement`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple, Protocol

import numpy as np

from workbench.arrays import is_array
from workbench.arrays.device import host_rng as _host_rng
from workbench.arrays.dtypes import dtype_name, np_dtype_of_onnx
from workbench.errors import InputError, ModelLoadError, ShapeError, UnsupportedOperatorError
from workbench.graph.ir import Graph, Node, ValueInfo
from workbench.graph.toposort import needed_nodes, node_reads, topological_order
from workbench.graph.values import check_feed
from workbench.ops.parallel import one_blas_thread
from workbench.ops.registry import NodeContext, attribute_defaults, lookup
from workbench.runtime import placement, run
from workbench.runtime.segments import fast_schedule, memo_enabled


# --------------------------------------------------------------------------- records
class SubPlan(NamedTuple):
    """A graph attribute of a step (an If/Loop/Scan body): the attribute's name, the body's
    Plan, and the outer values it reads as ``((name, slot), ...)``."""
    attr: str
    plan: Plan
    free: tuple


@dataclass
class Step:
    """One kernel call of a schedule: ``fn(*[env[i] for i in ins], **attrs)`` writing ``outs``,
    then freeing the slots in ``free`` (slot -1: an omitted input or output)."""
    fn: Callable
    ins: tuple
    outs: tuple
    attrs: dict
    free: tuple
    node: Node
    subplans: tuple = ()     # SubPlan records
    #: device plans: the node runs on the host because it reads or produces a value of a dtype
    #: the device cannot hold (found on its first run)
    host_dtype: bool = False
    #: device plans: a shape computation on host shape values (numpy in, numpy out)
    shape_on_host: bool = False
    #: device plans: input positions the kernel reads on the host as Python numbers
    host_read_inputs: frozenset = frozenset()
    opset: int = 0           # the opset of the node's domain


class StepRunner(Protocol):
    """How :meth:`Plan.execute` runs a step on values other than plain arrays."""

    def __call__(self, step: Step, args: list, kw: dict):
        """The step's output (a tuple for several outputs)."""

    def bind(self, plan: Plan, scope: dict) -> Callable:
        """A subgraph body ``body(*inputs) -> list`` with ``scope``'s outer values bound."""


@dataclass
class Schedule:
    """What a Plan runs: ``steps`` over ``n_slots`` integer slots. ``slots`` names them
    (value name -> slot), ``constants`` gives the values of some slots (initializers, a tape's
    leaf Tensors), ``input_infos``/``output_names`` the declared inputs and outputs (their
    slots ``in_slots``/``out_slots``), ``outer`` the outer-scope values of a subgraph
    (``(name, slot)``). ``graph``/``nodes``: the planned graph and its kept nodes (None / empty
    for a schedule made elsewhere)."""
    steps: list
    n_slots: int
    slots: dict
    constants: dict
    input_infos: list
    output_names: list
    in_slots: list
    out_slots: list
    outer: list = field(default_factory=list)
    graph: Graph | None = None
    nodes: list = field(default_factory=list)


# --------------------------------------------------------------------------- phases
def assign_slots(graph: Graph, outer: Sequence[str], nodes: Sequence[Node]) -> dict[str, int]:
    """Phase 2: an integer slot per value: inputs, outer values, initializers, node outputs."""
    slots: dict[str, int] = {}
    for name in [v.name for v in graph.inputs] + list(outer) + list(graph.initializers):
        slots.setdefault(name, len(slots))
    for n in nodes:
        for o in n.outputs:
            if o:
                slots.setdefault(o, len(slots))
    return slots


def lifetimes(nodes: Sequence[Node], slots: dict, keep: set) -> list[list[int]]:
    """Phase 3: the slots freed after each node: every value right after its last reader, an
    output nobody reads right after its producer; never the slots in ``keep`` (outputs)."""
    last_use: dict[int, int] = {}
    for si, n in enumerate(nodes):
        for name in node_reads(n):
            s = slots.get(name)
            if s is None:
                raise ModelLoadError(f"node {n.name!r} ({n.op_type}) reads undefined value "
                                     f"{name!r}")
            last_use[s] = si
    frees: list[list[int]] = [[] for _ in nodes]
    for s, si in last_use.items():
        if s not in keep:
            frees[si].append(s)
    for si, n in enumerate(nodes):
        for o in n.outputs:
            if o and slots[o] not in last_use and slots[o] not in keep:
                frees[si].append(slots[o])
    return frees


def bind_kernels(graph: Graph, nodes: Sequence[Node], slots: dict, frees: list, *,
                 training: bool, rng, device, move_initializers: bool,
                 ) -> tuple[list[Step], list[UnsupportedOperatorError]]:
    """Phase 4: one :class:`Step` per node (its kernel looked up once for the node's opset and
    the device's array module, attributes merged with the spec's defaults, subgraphs planned),
    and the errors of the nodes without a kernel."""
    on_cuda = device is not None and device.is_cuda
    xp_key = "cupy" if on_cuda else None
    extra = {"xp": device.xp} if device is not None else {}
    steps: list[Step] = []
    errors: list[UnsupportedOperatorError] = []
    for si, n in enumerate(nodes):
        opset = graph.opsets.get(n.domain or "", graph.opsets.get("ai.onnx"))
        if opset is None:
            errors.append(UnsupportedOperatorError(
                n.op_type, n.domain, None, n.name,
                reason=f"the model imports no opset for domain {n.domain or 'ai.onnx'!r}"))
            continue
        try:
            entry = lookup(n.op_type, n.domain, opset, n.name, xp=xp_key)
        except UnsupportedOperatorError as e:
            errors.append(e)
            continue
        attrs = dict(attribute_defaults(n.op_type, n.domain or "", opset))
        subplans = []
        for k, v in n.attrs.items():
            if isinstance(v, Graph):
                free = sorted(v.free_variables())
                sub = Plan(v, outer=free, training=training, check_inputs=False,
                           device=device, move_initializers=move_initializers)
                subplans.append(SubPlan(k, sub, tuple((f, slots[f]) for f in free)))
            else:
                attrs[k] = v
        if entry.wants_ctx:
            attrs["ctx"] = NodeContext(n.name, n.op_type, opset, len(n.outputs),
                                       tuple(n.outputs), training, rng, extra=dict(extra))
        prepare = getattr(entry.fn, "prepare", None)
        if prepare is not None:
            _prepare_node(prepare, attrs)
        steps.append(Step(
            entry.fn,
            tuple(slots[i] if i else -1 for i in n.inputs),
            tuple(slots[o] if o else -1 for o in n.outputs),
            attrs, tuple(frees[si]), n, tuple(subplans), opset=opset))
    return steps, errors


def _prepare_node(prepare: Callable, attrs: dict) -> None:
    """A kernel's own preparation of its node, ``fn.prepare(**attrs)`` (a tree ensemble
    builds its node table from the attributes and keeps it in the node's context): done when
    the plan is made, so the first run does not pay for it. A failure is left to the first
    run, which makes the same work again and raises the error naming the node."""
    try:
        prepare(**attrs)
    except Exception:   # noqa: BLE001 - raised again, with the node named, by the run
        pass


def raise_missing(errors: list[UnsupportedOperatorError]) -> None:
    """Phase 5: one error for every node without a kernel (all of them named)."""
    if not errors:
        return
    if len(errors) == 1:
        raise errors[0]
    ops = sorted({f"{e.domain}::{e.op_type}" + (f" (opset {e.opset})" if e.opset else "")
                  for e in errors})
    err = UnsupportedOperatorError(
        errors[0].op_type, errors[0].domain, errors[0].opset, errors[0].node_name,
        reason=f"{len(errors)} nodes use operators the engine lacks: {', '.join(ops)}")
    err.missing = errors
    raise err


def plan_graph(graph: Graph, *, outputs: Sequence[str] | None = None,
               outer: Sequence[str] = (), training: bool = False, rng=None, device=None,
               move_initializers: bool = True) -> Schedule:
    """The schedule of ``graph`` (phases 1 to 5 of the module docstring)."""
    output_names = list(outputs) if outputs is not None else [v.name for v in graph.outputs]
    nodes = needed_nodes(topological_order(graph, outer=outer), output_names)
    slots = assign_slots(graph, outer, nodes)
    for name in output_names:
        if name not in slots:
            raise ModelLoadError(f"graph {graph.name!r} has no value named {name!r} to output")
    out_slots = [slots[n] for n in output_names]
    frees = lifetimes(nodes, slots, set(out_slots))
    steps, errors = bind_kernels(graph, nodes, slots, frees, training=training, rng=rng,
                                 device=device, move_initializers=move_initializers)
    raise_missing(errors)
    return Schedule(
        steps=steps, n_slots=len(slots), slots=slots,
        constants={slots[k]: v for k, v in graph.initializers.items()},
        input_infos=list(graph.inputs), output_names=output_names,
        in_slots=[slots[v.name] for v in graph.inputs], out_slots=out_slots,
        outer=[(name, slots[name]) for name in outer], graph=graph, nodes=nodes)


# --------------------------------------------------------------------------- the Plan
class Plan:
    """An executable schedule of a graph.

    >>> plan = Plan(graph)                       # doctest: +SKIP
    >>> y, = plan.run({"x": x})                  # doctest: +SKIP

    ``Plan(graph, outputs=, outer=, training=, seed=, check_inputs=, device=,
    move_initializers=)`` plans a graph; ``Plan(schedule)`` wraps a :class:`Schedule` (the
    graph-only arguments do not apply then).
    """

    def __init__(self, graph: Graph | Schedule, *, outputs: Sequence[str] | None = None,
                 outer: Sequence[str] = (), training: bool = False, seed: int | None = None,
                 check_inputs: bool = True, device=None, move_initializers: bool = True):
        if device is not None:
            from workbench.arrays.device import get_device
            device = get_device(device)
        self.device = device
        self._on_cuda = device is not None and device.is_cuda
        self.training = training
        self.check_inputs = check_inputs
        #: sample the device memory pool after every node (peak in ``last_peak_bytes``)
        self.track_memory = False
        self.last_peak_bytes = None
        # random ops without a seed attribute draw from the device's random source (seedable
        # with Device.SetRandSeed); a Plan built with ``seed=`` has its own generator
        self._rng = np.random.default_rng(seed) if seed is not None else \
            (device.rng if device is not None else _host_rng())
        if isinstance(graph, Schedule):
            schedule = graph
        else:
            schedule = plan_graph(graph, outputs=outputs, outer=outer, training=training,
                                  rng=self._rng, device=device,
                                  move_initializers=move_initializers)
        self.graph = schedule.graph
        self.nodes = schedule.nodes
        self.steps: list[Step] = schedule.steps
        self.slots = schedule.slots
        self.output_names = schedule.output_names
        self.input_infos = schedule.input_infos
        self.outer_names = [name for name, _ in schedule.outer]
        self._in_slots = schedule.in_slots
        self._out_slots = schedule.out_slots
        self._outer_slots = schedule.outer
        self._constant_names = frozenset(
            name for name, s in schedule.slots.items() if s in schedule.constants)
        self._template: list[Any] = [None] * schedule.n_slots
        for s, v in schedule.constants.items():
            self._template[s] = v
        # phase 6, device placement: shape logic on the host, the rest on the device
        #: device plans: names of the host shape values (shape logic kept on the host)
        self.host_shape_values: frozenset = frozenset()
        #: device plans: graph inputs read on the host as shapes (feed them as numpy)
        self.host_shape_inputs: frozenset = frozenset()
        if self._on_cuda and self.graph is not None:    # (a tape's schedule is not placed)
            self.host_shape_values, self.host_shape_inputs = placement.plan_host_values(
                self.graph, self.nodes, self.steps)
            if move_initializers:   # host shape values stay on the host
                device.move_plan(self, keep={self.slots[v] for v in self.host_shape_values
                                             if v in self.slots})
        #: the schedule of plain CPU runs (:mod:`workbench.runtime.segments`), built on the
        #: first such run; None when the plan has no shape segment
        self._fast: list | None = None
        self._fast_built = False
        self._shape_memo = memo_enabled()
        #: names of the initializers bound into the shape segments (a run given other values
        #: for one of them takes the plain schedule)
        self._memo_consts: frozenset = frozenset()
        #: the pre-bound forms of ``steps`` and of the fast schedule (``run.bind_steps``)
        self._bound: list | None = None
        self._bound_fast: list | None = None
        #: per input, what a feed that needs no conversion looks like (built on first use)
        self._feed_patterns: list | None = None
        self._feed_shapes: list = []    # per input, the shapes that matched its pattern

    @classmethod
    def of_steps(cls, steps: Sequence[Step], *, n_slots: int, inputs: Sequence[int],
                 outputs: Sequence[int], constants: dict[int, Any],
                 input_names: Sequence[str] | None = None,
                 output_names: Sequence[str] | None = None) -> Plan:
        """A schedule made elsewhere (a recorded tape replayed by ``model.Model`` in graph
        mode): ``steps`` over ``n_slots`` integer slots, the input and output slots, and the
        constant values of some slots. Run it with :meth:`execute` and a runner. Inputs and
        outputs are named ``input_0, ...`` / ``output_0, ...`` unless names are given."""
        inputs, outputs = list(inputs), list(outputs)
        in_names = list(input_names) if input_names is not None else \
            [f"input_{k}" for k in range(len(inputs))]
        out_names = list(output_names) if output_names is not None else \
            [f"output_{k}" for k in range(len(outputs))]
        slots = dict(zip(in_names, inputs))
        for name, s in zip(out_names, outputs):
            slots.setdefault(name, s)
        return cls(Schedule(
            steps=list(steps), n_slots=n_slots, slots=slots, constants=dict(constants),
            input_infos=[ValueInfo(n) for n in in_names], output_names=out_names,
            in_slots=inputs, out_slots=outputs), check_inputs=False)

    # ------------------------------------------------------------------ compatibility names
    @property
    def host_values(self) -> frozenset:
        """Old name of :attr:`host_shape_values`."""
        return self.host_shape_values

    @property
    def host_inputs(self) -> frozenset:
        """Old name of :attr:`host_shape_inputs`."""
        return self.host_shape_inputs

    # ------------------------------------------------------------------ running
    def run(self, feeds, *, hook: Callable | None = None, outer: dict | None = None) -> list:
        """Run the plan; ``feeds`` is a list in input order or a dict by name.

        ``hook(node, outputs)`` is called after every node with the tuple of its outputs.
        Returns the outputs (a list, in ``output_names`` order).
        """
        return self.execute(self._feeds_to_slots(feeds), outer=outer, hook=hook)

    def run_positional(self, values: Sequence, outer: dict | None = None) -> list:
        """Run with inputs in order and no checks (subgraph bodies)."""
        return self._execute(values, None, outer, None, None)

    def execute(self, inputs: Sequence, *, runner: StepRunner | None = None,
                values: dict | None = None, outer: dict | None = None,
                hook: Callable | None = None) -> list:
        """Run the schedule on ``inputs`` (in input order, not checked).

        ``runner`` decides how a step runs: None runs the kernels on arrays (on the plan's
        device); a :class:`StepRunner` (``autograd.TapeRunner``:
        Tensors recording the tape) is called as ``runner(step, args, kw)`` and binds subgraph
        bodies with ``runner.bind(plan, scope)``. ``values`` ({name: value}) replaces
        initializers (a trainable model's parameters); ``outer`` gives the outer-scope values
        of a subgraph.
        """
        if self._on_cuda:
            with self.device.xp.cuda.Device(self.device.index):
                return self._execute(inputs, values, outer, hook, runner)
        return self._execute(inputs, values, outer, hook, runner)

    def _execute(self, inputs, values, outer, hook, runner) -> list:
        if self._on_cuda:
            return run.run_steps(self, self._env(inputs, values, outer), hook, runner)
        if runner is not None:   # the tape's steps (training) hold one BLAS thread too
            with one_blas_thread():
                return run.run_steps(self, self._env(inputs, values, outer), hook, runner)
        # CPU kernels split their large products and loops over the engine's own threads
        # (workbench.ops.parallel); BLAS' own threads would only add to them, and on a busy
        # machine they stall every small product of a transformer by whole time slices
        with one_blas_thread():
            if hook is None:
                fast = self.fast_schedule
                if fast is not None and not (values and
                                             self._memo_consts.intersection(values)):
                    return _caller_owned(run.run_fast(
                        self, fast, lambda: self._env(inputs, values, outer),
                        self._bound_fast))
                env = self._env(inputs, values, outer)
                run.run_bound(self.bound_steps, env, self.device)
                return self._outputs(env)
            return run.run_steps(self, self._env(inputs, values, outer), hook, None)

    @property
    def bound_steps(self) -> list:
        """``steps`` pre-bound for the lean run loop (:func:`workbench.runtime.run.bind_steps`),
        made on first use."""
        b = self._bound
        if b is None:
            b = self._bound = run.bind_steps(self.steps)
        return b

    @property
    def shape_memo(self) -> bool:
        """Whether plain CPU runs remember the plan's shape arithmetic per input shape (the
        fast schedule, :mod:`workbench.runtime.segments`); False runs every step every run.
        Defaults to the ``WORKBENCH_SHAPE_MEMO`` switch (on unless "0")."""
        return self._shape_memo

    @shape_memo.setter
    def shape_memo(self, on: bool) -> None:
        self._shape_memo = bool(on)
        self._fast, self._bound_fast, self._fast_built = None, None, False
        self._memo_consts = frozenset()

    @property
    def fast_schedule(self) -> list | None:
        """The schedule of plain CPU runs (shape arithmetic in remembered segments,
        :mod:`workbench.runtime.segments`), built on first use; None when the plan has no
        shape segment, for device plans and with :attr:`shape_memo` off."""
        if not self._fast_built:
            self._fast_built = True
            if not self._on_cuda and self._shape_memo:
                consts = {self.slots[k] for k in self._constant_names}
                self._fast = fast_schedule(
                    self.steps, {s: self._template[s] for s in consts}, set(self._out_slots))
                if self._fast is not None:
                    self._bound_fast = run.bind_steps(self._fast)
                    bound = {s for f in self._fast if f.segment is not None
                             for s in f.segment.bound}
                    self._memo_consts = frozenset(
                        k for k in self._constant_names if self.slots[k] in bound)
        return self._fast

    def _env(self, inputs: Sequence, values: dict | None, outer: dict | None) -> list:
        env = self._template.copy()
        if values:
            slots = self.slots
            for name, v in values.items():
                s = slots.get(name)
                if s is not None:
                    env[s] = v
        for s, v in zip(self._in_slots, inputs):
            env[s] = v
        if outer:
            for name, s in self._outer_slots:
                env[s] = outer[name]
        return env

    def _outputs(self, env: list) -> list:
        """The output slots' values (numpy scalars as 0-d arrays)."""
        return [np.asarray(v) if isinstance(v, np.generic) else v
                for v in [env[s] for s in self._out_slots]]

    def _feeds_to_slots(self, feeds) -> list:
        pats = self._feed_patterns
        if pats is None:
            pats = self._feed_patterns = _feed_patterns(self)
            self._feed_shapes = [set() for _ in pats]
        if pats:    # the common case first: arrays of the declared dtype, rank and sizes
            values = feeds if type(feeds) is list else \
                list(feeds) if type(feeds) is tuple else None
            if values is None and type(feeds) is dict and len(feeds) == len(pats):
                try:
                    values = [feeds[name] for name, *_ in pats]
                except KeyError:
                    values = None
            if values is not None and len(values) == len(pats) \
                    and _match_feeds(values, pats, self._feed_shapes):
                return values
        infos = self.input_infos
        if isinstance(feeds, dict):
            names = [v.name for v in infos]
            unknown = [k for k in feeds if k not in self.slots or k in self._constant_names
                       and k not in names]
            if unknown:
                raise InputError(f"unknown input name(s) {unknown}; the model's inputs are "
                                 f"{names}")
            missing = [n for n in names if n not in feeds]
            if missing:
                raise InputError(f"missing input(s) {missing}; the model's inputs are {names}")
            values = [feeds[n] for n in names]
        else:
            values = list(feeds)
            if len(values) != len(infos):
                raise InputError(
                    f"the model takes {len(infos)} input(s) {[v.name for v in infos]}, "
                    f"got {len(values)}")
        if self.check_inputs:
            values = [check_feed(info, v) for info, v in zip(infos, values)]  # maps, strings
            for info, v in zip(infos, values):
                _check_input(info, v)
        if self.device is not None:
            for info, v in zip(infos, values):
                if info.name not in self.host_shape_inputs:
                    placement.check_feed_device(self.device, info.name, v)
        return values


def _caller_owned(outs: list) -> list:
    """The outputs of a fast-schedule run with every read-only array replaced by a copy: a
    graph output that is a view of a remembered shape result (``Identity``, ``Squeeze``...
    of it) belongs to the caller, who may write into it."""
    for k, v in enumerate(outs):
        if type(v) is np.ndarray and not v.flags.writeable:
            outs[k] = v.copy()
    return outs


#: shapes remembered per input as matching its declared shape (``_match_feeds``)
_FEED_SHAPES_KEPT = 64


def _match_feeds(values: list, pats: list, shapes: list) -> bool:
    """Whether every feed is an array of its input's declared dtype and a shape that fits the
    declared one (``_feed_patterns``); shapes found to fit are remembered per input (a set
    lookup instead of the per-dimension comparison on every run of a free-dimension input)."""
    for v, (_, dt, shp, free), seen in zip(values, pats, shapes):
        if type(v) is not np.ndarray or v.dtype != dt:
            return False
        sh = v.shape
        if sh in seen:
            continue
        if shp is None or sh == shp or free and len(sh) == len(shp) \
                and all(w is None or w == d for w, d in zip(shp, sh)):
            if len(seen) < _FEED_SHAPES_KEPT:
                seen.add(sh)
            continue
        return False
    return True


def _feed_patterns(plan) -> list:
    """``(name, dtype, shape, has a free dimension)`` per input (None in ``shape`` for a free
    dimension; ``shape`` None for an unknown rank) when every input is a plain tensor of a
    known numeric dtype on a CPU plan that checks its inputs: a feed that matches needs no
    check or conversion. Empty otherwise."""
    if not plan.check_inputs or plan._on_cuda:
        return []
    pats = []
    for info in plan.input_infos:
        if (info.type_proto is not None and not info.is_tensor) or not info.dtype:
            return []
        try:
            dt = np_dtype_of_onnx(info.dtype)
        except TypeError:
            return []
        if dt.kind not in "biufc":
            return []
        shp = None if info.shape is None else \
            tuple(d if isinstance(d, int) else None for d in info.shape)
        pats.append((info.name, dt, shp, shp is not None and None in shp))
    return pats


def _check_input(info, v) -> None:
    if info.type_proto is not None and not info.is_tensor:
        return
    if not is_array(v):
        if isinstance(v, (list, tuple)) or v is None:
            raise InputError(f"input {info.name!r} must be an array, got {type(v).__name__}")
        return
    if info.dtype:
        try:
            want = np_dtype_of_onnx(info.dtype)
        except TypeError:
            want = None
        if want is not None and v.dtype != want and not (want.kind == "O"
                                                         and v.dtype.kind in "OU"):
            raise InputError(f"input {info.name!r} expects dtype {dtype_name(info.dtype)} "
                             f"({want}), got {v.dtype}; convert it with .astype({want.name!r})")
    if info.shape is not None:
        if len(info.shape) != v.ndim:
            raise ShapeError(f"input {info.name!r} expects rank {len(info.shape)} "
                             f"(shape {_fmt_shape(info.shape)}), got shape {list(v.shape)}")
        for d, (want, got) in enumerate(zip(info.shape, v.shape)):
            if isinstance(want, int) and want != got:
                raise ShapeError(f"input {info.name!r} expects shape {_fmt_shape(info.shape)}, "
                                 f"got {list(v.shape)} (dimension {d} differs)")


def _fmt_shape(shape) -> str:
    return "[" + ", ".join("?" if d is None else str(d) for d in shape) + "]"
