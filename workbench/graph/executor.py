"""The Plan: parse once, run many times.

A :class:`Plan` is built from a :class:`~workbench.graph.ir.Graph`: nodes are put in topological
order, each node's kernel is looked up once for the model's opset, attributes are merged with
the spec's defaults once, values get integer slots and each value is freed right after its last
use. ``Plan.run`` is then a lean loop over prepared steps. Per-node hooks see every node's
outputs (the widgets' tensor inspector uses them); a Plan built with ``outputs=[...]`` keeps only
the nodes those outputs need (cutting at ``last_layers``).

A Plan built for a device (``Plan(graph, device="CUDA:0")``) looks its kernels up for that
device's array module (cupy overrides from ``workbench/arrays/cuda`` first, the portable kernel
otherwise), gives input-less kernels the module in ``ctx.extra["xp"]``, keeps its initializers
on the device, refuses feeds that live elsewhere, and turns an out-of-memory failure into a
``DeviceError`` naming the device, the node and the bytes requested. Nothing is copied back to
the host during a run, with one exception: values of dtypes that cupy cannot hold (bfloat16,
float8, float4, int4, int2 -- the ml_dtypes types -- and strings) live on the host, and a node
that reads or produces such a value runs on the host (its other inputs copied there, its
outputs of GPU dtypes copied back). Such a node is found on its first run and goes straight
to the host afterwards.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from workbench.arrays import device_dtype_ok, is_array, to_numpy
from workbench.arrays.dtypes import dtype_name, np_dtype_of_onnx
from workbench.device import host_rng as _host_rng
from workbench.errors import (
    DeviceError,
    InputError,
    KernelError,
    ModelLoadError,
    ResourceError,
    ShapeError,
    UnsupportedOperatorError,
    WorkbenchError,
)
from workbench.graph.ir import Graph, Node, ValueInfo
from workbench.graph.segments import fast_schedule
from workbench.graph.values import check_feed
from workbench.ops.parallel import blas_controller, single_threaded_blas
from workbench.ops.registry import NodeContext, attribute_defaults, facts, lookup


# --------------------------------------------------------------------------- ordering
def topological_order(graph: Graph, *, outer: Sequence[str] = ()) -> list[Node]:
    """Nodes in a topological order, stable with respect to the file's order.

    Raises ModelLoadError naming the value and node when an input is never defined, and the
    nodes involved when the graph has a cycle.
    """
    available = {v.name for v in graph.inputs} | set(graph.initializers) | set(outer) | {""}
    producers: dict[str, int] = {}
    for i, n in enumerate(graph.nodes):
        for o in n.outputs:
            if o:
                producers[o] = i
    deps: list[set] = []
    for i, n in enumerate(graph.nodes):
        needs = set()
        names = list(n.inputs)
        for sg in n.subgraphs:
            names.extend(sg.free_variables())
        for name in names:
            if name in available:
                continue
            if name not in producers:
                raise ModelLoadError(
                    f"node {n.name!r} ({n.op_type}) reads {name!r}, which is neither a graph "
                    f"input, an initializer, nor the output of any node (missing initializer?)")
            if producers[name] != i:
                needs.add(producers[name])
        deps.append(needs)
    users: dict[int, list[int]] = {i: [] for i in range(len(graph.nodes))}
    for i, d in enumerate(deps):
        for j in d:
            users[j].append(i)
    remaining = [len(d) for d in deps]
    import heapq
    ready = [i for i, r in enumerate(remaining) if r == 0]
    heapq.heapify(ready)
    order = []
    while ready:
        i = heapq.heappop(ready)
        order.append(i)
        for u in users[i]:
            remaining[u] -= 1
            if remaining[u] == 0:
                heapq.heappush(ready, u)
    if len(order) != len(graph.nodes):
        stuck = [graph.nodes[i].name for i, r in enumerate(remaining) if r > 0]
        raise ModelLoadError(
            f"the graph has a cycle: nodes {stuck[:10]}{' ...' if len(stuck) > 10 else ''} "
            f"depend on each other; ONNX graphs must be acyclic")
    return [graph.nodes[i] for i in order]


def needed_nodes(order: list[Node], outputs: Sequence[str]) -> list[Node]:
    """The nodes (in order) that the given output names depend on."""
    need = set(outputs)
    keep = []
    for n in reversed(order):
        if any(o in need for o in n.outputs if o):
            keep.append(n)
            need.update(i for i in n.inputs if i)
            for sg in n.subgraphs:
                need.update(sg.free_variables())
    keep.reverse()
    return keep


def layer_nodes(graph: Graph) -> list[Node]:
    """The nodes counted by ``last_layers``: topological order, ``Constant`` nodes excluded."""
    return [n for n in topological_order(graph) if n.op_type != "Constant"]


#: the two ways of counting an integer ``last_layers`` (see :func:`resolve_cut`)
COUNTINGS = ("workbench", "singa")


def resolve_cut(graph: Graph, last_layers, counting: str = "workbench") -> list[str]:
    """Output names for a cut at ``last_layers``.

    ``counting="workbench"`` (the default, DESIGN 2.2 and SINGA's documentation page): -1
    keeps the whole graph (its outputs); -k keeps all but the last k-1 layers and returns the
    outputs of the last kept node, counted in topological order without Constant nodes.

    ``counting="singa"`` (what SINGA's code does, ``SingaRep.run``): with N such nodes, an
    integer L >= 0 is the index of the last node run and a negative L the index
    ``(L + 1) % N``; index N-1 means the whole graph (its outputs), any other index that
    node's outputs. So -1 is the *first* node, -2 the whole graph, -3 drops the last node.

    A string names a node (its outputs) or a value; a list gathers several cuts.
    """
    if counting not in COUNTINGS:
        raise InputError(f"counting must be one of {COUNTINGS}, got {counting!r}")
    if last_layers is None:
        return [v.name for v in graph.outputs]
    if isinstance(last_layers, (list, tuple)):
        out = []
        for x in last_layers:
            out.extend(resolve_cut(graph, x, counting))
        return out
    if isinstance(last_layers, (int, np.integer)) and not isinstance(last_layers, bool):
        k = int(last_layers)
        nodes = layer_nodes(graph)
        if counting == "singa":
            n = len(nodes)
            if n == 0:
                return [v.name for v in graph.outputs]
            if k >= n:
                raise InputError(f"last_layers={k} is past the last node (SINGA counting: "
                                 f"0 ... {n - 1} or a negative number; the graph has {n} "
                                 f"nodes besides Constants)")
            idx = k if k >= 0 else (k + 1) % n
            if idx == n - 1:
                return [v.name for v in graph.outputs]
            return [o for o in nodes[idx].outputs if o]
        if k >= 0:
            raise InputError(
                f"last_layers={k} is not valid: use -1 to keep the whole graph, -k to cut off "
                f"the last k-1 layers (-2 ... -{len(nodes)}), or a node/value name")
        if k == -1:
            return [v.name for v in graph.outputs]
        if -k > len(nodes):
            raise InputError(f"last_layers={k} cuts more layers than the graph has "
                             f"({len(nodes)} layers, so the smallest value is -{len(nodes)})")
        node = nodes[len(nodes) + k]
        return [o for o in node.outputs if o]
    if isinstance(last_layers, str):
        node = graph.node_by_name(last_layers)
        if node is not None:
            return [o for o in node.outputs if o]
        values = {o for n in graph.nodes for o in n.outputs if o}
        values |= {v.name for v in graph.inputs}
        if last_layers in values:
            return [last_layers]
        names = [n.name for n in graph.nodes] + sorted(values)
        close = difflib.get_close_matches(last_layers, names, n=5)
        hint = f"; did you mean {', '.join(repr(c) for c in close)}?" if close else ""
        raise InputError(f"last_layers={last_layers!r} is neither a node nor a value name of "
                         f"graph {graph.name!r}{hint}")
    raise InputError(f"last_layers must be a negative int or a node/value name, "
                     f"got {type(last_layers).__name__}")


def cut(graph: Graph, last_layers, *, initializers: dict | None = None,
        prune_inputs: bool = True, name: str | None = None) -> Graph:
    """The graph cut at ``last_layers`` (the one place for cutting: ``SONNXModel.cut``,
    ``Model.cut`` and the cutter widget use it): a new Graph of the nodes (copied) that the
    outputs of :func:`resolve_cut` need, the initializers they read (values taken from
    ``initializers`` when given, e.g. a trained model's current weights), the graph inputs they
    read (all of them with ``prune_inputs=False``) and those outputs."""
    outputs = resolve_cut(graph, last_layers)
    keep = needed_nodes(topological_order(graph), outputs)
    used = {i for n in keep for i in n.inputs if i} | set(outputs)
    for n in keep:
        for sg in n.subgraphs:
            used |= sg.free_variables()
    values = graph.initializers if initializers is None else initializers
    return Graph(
        name=f"{graph.name}_cut" if name is None else name,
        nodes=[Node(n.op_type, list(n.inputs), list(n.outputs), dict(n.attrs), n.name,
                    n.domain, n.doc_string) for n in keep],
        inputs=[v for v in graph.inputs if not prune_inputs or v.name in used],
        outputs=[graph.value(o) or ValueInfo(o) for o in outputs],
        initializers={k: values[k] for k in graph.initializers if k in used},
        value_info={k: v for k, v in graph.value_info.items() if k in used},
        opsets=dict(graph.opsets), doc_string=graph.doc_string)


# --------------------------------------------------------------------------- plan
@dataclass
class Step:
    fn: Callable
    ins: tuple
    outs: tuple
    attrs: dict
    free: tuple
    node: Node
    subplans: tuple = ()     # (attr name, Plan, ((name, slot), ...))
    host: bool = False       # device plans: this node runs on the host (host-only dtypes)
    host_op: bool = False    # device plans: a shape computation on host values (numpy)
    host_read: frozenset = frozenset()  # device plans: input positions read on the host
    opset: int = 0           # the opset of the node's domain


class Plan:
    """An executable schedule of a graph.

    >>> plan = Plan(graph)                       # doctest: +SKIP
    >>> y, = plan.run({"x": x})                  # doctest: +SKIP
    """

    def __init__(self, graph: Graph, *, outputs: Sequence[str] | None = None,
                 outer: Sequence[str] = (), training: bool = False, seed: int | None = None,
                 check_inputs: bool = True, device=None, move_initializers: bool = True):
        self.graph = graph
        if device is not None:
            from workbench.device import get_device
            device = get_device(device)
        self.device = device
        on_cuda = device is not None and device.is_cuda
        self._on_cuda = on_cuda
        xp_mod = device.xp if device is not None else None
        xp_key = "cupy" if on_cuda else None
        #: sample the device memory pool after every node (peak in ``last_peak_bytes``)
        self.track_memory = False
        self.last_peak_bytes = None
        self.training = training
        self.check_inputs = check_inputs
        self.output_names = list(outputs) if outputs is not None else \
            [v.name for v in graph.outputs]
        # random ops without a seed attribute draw from the device's random source (seedable
        # with Device.SetRandSeed); a Plan built with ``seed=`` has its own generator
        self._rng = np.random.default_rng(seed) if seed is not None else \
            (device.rng if device is not None else _host_rng())
        order = topological_order(graph, outer=outer)
        self.nodes = needed_nodes(order, self.output_names)
        self.input_infos = list(graph.inputs)
        self.outer_names = list(outer)

        slots: dict[str, int] = {}

        def slot(name: str) -> int:
            if name not in slots:
                slots[name] = len(slots)
            return slots[name]

        for v in graph.inputs:
            slot(v.name)
        for name in outer:
            slot(name)
        for name in graph.initializers:
            slot(name)
        for n in self.nodes:
            for o in n.outputs:
                if o:
                    slot(o)
        self.slots = slots
        produced = {o for n in self.nodes for o in n.outputs if o}
        defined = produced | set(slots)
        for name in self.output_names:
            if name not in defined:
                raise ModelLoadError(f"graph {graph.name!r} has no value named {name!r} to output")

        # last use of every slot
        last_use: dict[int, int] = {}
        keep = {slots[n] for n in self.output_names}
        missing = []
        for si, n in enumerate(self.nodes):
            names = [i for i in n.inputs if i]
            for sg in n.subgraphs:
                names.extend(sg.free_variables())
            for name in names:
                if name not in slots:
                    missing.append((n, name))
                    continue
                last_use[slots[name]] = si
        if missing:
            n, name = missing[0]
            raise ModelLoadError(f"node {n.name!r} ({n.op_type}) reads undefined value {name!r}")
        frees: list[list[int]] = [[] for _ in self.nodes]
        for s, si in last_use.items():
            if s not in keep:
                frees[si].append(s)
        # outputs nobody reads are freed right after they are produced
        for si, n in enumerate(self.nodes):
            for o in n.outputs:
                if o and slots[o] not in last_use and slots[o] not in keep:
                    frees[si].append(slots[o])

        errors = []
        self.steps: list[Step] = []
        for si, n in enumerate(self.nodes):
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
                    subplans.append((k, sub, tuple((f, slots[f]) for f in free)))
                else:
                    attrs[k] = v
            if entry.wants_ctx:
                attrs["ctx"] = NodeContext(n.name, n.op_type, opset, len(n.outputs),
                                           tuple(n.outputs), training, self._rng,
                                           extra={"xp": xp_mod} if xp_mod is not None else {})
            self.steps.append(Step(
                entry.fn,
                tuple(slots[i] if i else -1 for i in n.inputs),
                tuple(slots[o] if o else -1 for o in n.outputs),
                attrs, tuple(frees[si]), n, tuple(subplans), opset=opset))
        if errors:
            if len(errors) == 1:
                raise errors[0]
            ops = sorted({f"{e.domain}::{e.op_type}" + (f" (opset {e.opset})" if e.opset else "")
                          for e in errors})
            err = UnsupportedOperatorError(
                errors[0].op_type, errors[0].domain, errors[0].opset, errors[0].node_name,
                reason=f"{len(errors)} nodes use operators the engine lacks: {', '.join(ops)}")
            err.missing = errors
            raise err

        #: device plans: names of values kept on the host (shape computations)
        self.host_values: frozenset = frozenset()
        #: device plans: graph inputs the plan reads on the host (feed them as numpy)
        self.host_inputs: frozenset = frozenset()
        if on_cuda:
            self._plan_host_values()

        self._template: list[Any] = [None] * len(slots)
        for name, arr in graph.initializers.items():
            self._template[slots[name]] = arr
        self._in_slots = [slots[v.name] for v in graph.inputs]
        self._out_slots = [slots[n] for n in self.output_names]
        self._outer_slots = [(name, slots[name]) for name in outer]
        if on_cuda and move_initializers:   # shape constants stay on the host
            device.move_plan(self, keep={slots[v] for v in self.host_values if v in slots})
        #: the schedule of plain CPU runs: shape arithmetic in remembered segments
        #: (:mod:`workbench.graph.segments`); None when the plan has none
        self._fast = None if on_cuda else fast_schedule(
            self.steps, {slots[k] for k in graph.initializers}, set(self._out_slots))

    def _plan_host_values(self) -> None:
        """Device plans: find the values to keep on the host.

        Shape logic runs on the host, from the shapes the host already knows: the outputs of
        Shape/Size, small integer constants and graph inputs read only as shapes (the
        ``shape`` of Reshape, the ``axes`` of Unsqueeze, ...: the ops' registered
        ``host_inputs``), and the cheap integer ops computed from them (registered
        ``host_compute``: Gather, Concat, Unsqueeze, Add, ...) stay numpy arrays, so that a
        Reshape with a dynamic target reads it without a device-to-host copy. A host value
        that a device kernel needs as data is uploaded when it is used."""
        graph = self.graph
        nodes = self.nodes
        consumers: dict[str, list] = {}
        for n in nodes:
            for k, i in enumerate(n.inputs):
                if i:
                    consumers.setdefault(i, []).append((n, k))

        def small_int(arr) -> bool:
            a = np.asarray(arr) if not is_array(arr) else arr
            return a.dtype.kind in "iu" and a.size <= _HOST_CONST_MAX

        cand = {k for k, v in graph.initializers.items() if small_int(v)}
        const_nodes = {}
        for n in nodes:
            if n.op_type == "Constant" and not n.domain and n.outputs and n.outputs[0]:
                v = n.attrs.get("value")
                if v is None:
                    v = n.attrs.get("value_ints", n.attrs.get("value_int"))
                    v = None if v is None else np.asarray(v, dtype=np.int64)
                if v is not None and is_array(v) and small_int(v):
                    cand.add(n.outputs[0])
                    const_nodes[n.outputs[0]] = n
        for v in graph.inputs:
            if v.dtype in _INT_TYPES and v.shape is not None and len(v.shape) <= 1:
                cand.add(v.name)
        while True:
            host = set(cand)
            host_nodes = set()
            for n in nodes:
                f = facts(n.op_type, n.domain)
                if f.shape_only:
                    host.update(o for o in n.outputs if o)
                    host_nodes.add(id(n))
                elif n.outputs and n.outputs[0] in const_nodes and n.outputs[0] in cand:
                    host_nodes.add(id(n))
                elif (f.host_compute and not n.subgraphs
                      and any(n.inputs) and all(i in host for i in n.inputs if i)):
                    host.update(o for o in n.outputs if o)
                    host_nodes.add(id(n))
            # a candidate constant that some device kernel reads as data goes to the device
            bad = set()
            for name in cand:
                for n, k in consumers.get(name, ()):
                    if id(n) not in host_nodes and k not in facts(n.op_type, n.domain).host_inputs:
                        bad.add(name)
                        break
            if not bad:
                break
            cand -= bad
        self.host_values = frozenset(host)
        self.host_inputs = frozenset(v.name for v in graph.inputs if v.name in host)
        for st in self.steps:
            n = st.node
            if id(n) in host_nodes:
                st.host_op = True
            st.host_read = frozenset(facts(n.op_type, n.domain).host_inputs)

    # ------------------------------------------------------------------ running
    def _feeds_to_slots(self, feeds) -> list:
        infos = self.input_infos
        if isinstance(feeds, dict):
            unknown = [k for k in feeds if k not in self.slots or k in self.graph.initializers
                       and k not in {v.name for v in infos}]
            names = [v.name for v in infos]
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
                if info.name not in self.host_inputs:
                    _check_device(self.device, info.name, v)
        return values

    def run(self, feeds, *, hook: Callable | None = None, outer: dict | None = None) -> list:
        """Run the plan; ``feeds`` is a list in input order or a dict by name.

        ``hook(node, outputs)`` is called after every node with the tuple of its outputs.
        Returns the outputs (a list, in ``output_names`` order).
        """
        return self.execute(self._feeds_to_slots(feeds), outer=outer, hook=hook)

    def run_positional(self, values: Sequence, outer: dict | None = None) -> list:
        """Run with inputs in order and no checks (subgraph bodies)."""
        env = self._env(values, None, outer)
        return self._execute(env, None, None)

    def execute(self, inputs: Sequence, *, runner: StepRunner | None = None,
                values: dict | None = None, outer: dict | None = None,
                hook: Callable | None = None) -> list:
        """Run the schedule on ``inputs`` (in input order, not checked): the one run loop.

        ``runner`` decides how a step runs: None runs the kernels on arrays (on the plan's
        device); a :class:`StepRunner` (``autograd.TapeRunner``: Tensors recording the tape)
        is called as ``runner(step, args, kw)`` and binds subgraph bodies with
        ``runner.bind(plan, scope)``. ``values`` ({name: value}) replaces initializers (a
        trainable model's parameters); ``outer`` gives the outer-scope values of a subgraph.
        """
        env = self._env(inputs, values, outer)
        if self.device is not None and self.device.is_cuda:
            with self.device.xp.cuda.Device(self.device.index):
                return self._execute(env, hook, runner)
        return self._execute(env, hook, runner)

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

    @classmethod
    def of_steps(cls, steps: Sequence[Step], *, n_slots: int, inputs: Sequence[int],
                 outputs: Sequence[int], constants: dict[int, Any]) -> Plan:
        """A schedule made elsewhere (a recorded tape replayed by ``model.Model`` in graph
        mode): ``steps`` over ``n_slots`` integer slots, the input and output slots, and the
        constant values of some slots. Run it with :meth:`execute` and a runner."""
        plan = cls.__new__(cls)
        plan.graph = None
        plan.device = None
        plan._on_cuda = False
        plan.track_memory = False
        plan.last_peak_bytes = None
        plan.steps = list(steps)
        plan.slots = {}
        plan._template = [None] * n_slots
        for s, v in constants.items():
            plan._template[s] = v
        plan._in_slots = list(inputs)
        plan._out_slots = list(outputs)
        plan._outer_slots = []
        plan._fast = None
        return plan

    def _execute(self, env: list, hook, runner=None) -> list:
        if runner is not None or self._on_cuda:
            return self._execute_steps(env, hook, runner)
        # CPU kernels split their large products and loops over the engine's own threads
        # (workbench.ops.parallel); BLAS' own threads would only add to them, and on a busy
        # machine they stall every small product of a transformer by whole time slices
        with single_threaded_blas(blas_controller()):
            if hook is None and self._fast is not None:
                try:
                    return self._execute_fast(list(env))
                except Exception:  # noqa: BLE001 - the plain schedule reports it by node
                    pass
            return self._execute_steps(env, hook, runner)

    def _execute_steps(self, env: list, hook, runner=None) -> list:
        step = None
        mem = _pool_sampler(self.device) if self.track_memory else None
        peak = mem() if mem is not None else 0
        try:
            on_cuda = self._on_cuda
            dxp = self.device.xp if on_cuda else None
            bind = _bind if runner is None else runner.bind
            for step in self.steps:
                args = [env[i] if i >= 0 else None for i in step.ins]
                if step.subplans:
                    kw = dict(step.attrs)
                    for name, sub, free in step.subplans:
                        kw[name] = bind(sub, {f: env[s] for f, s in free})
                else:
                    kw = step.attrs
                if runner is not None:
                    r = runner(step, args, kw)
                elif on_cuda:
                    r = _run_device_step(step, args, kw, dxp)
                else:
                    r = step.fn(*args, **kw)
                outs = step.outs
                if type(r) is tuple:
                    for s, v in zip(outs, r):
                        if s >= 0:
                            env[s] = v
                    if hook is not None:
                        hook(step.node, r)
                else:
                    if outs[0] >= 0:
                        env[outs[0]] = r
                    if hook is not None:
                        hook(step.node, (r,))
                for s in step.free:
                    env[s] = None
                if mem is not None:
                    used = mem()
                    if used > peak:
                        peak = used
        except WorkbenchError as e:
            if step is not None and "node " not in str(e)[:6] and not getattr(e, "_located", 0):
                e.args = (f"node {step.node.name!r} ({step.node.op_type}): {e}",) + e.args[1:]
                e._located = True
            raise
        except Exception as e:
            if step is None:
                raise
            if _is_oom(e):
                raise _oom_error(e, self.device, step) from e
            if isinstance(e, MemoryError):
                raise ResourceError(
                    f"node {step.node.name!r} ({step.node.op_type}): out of memory ({e}); "
                    f"inputs: {_describe_args(step, env, args)}. The model asks for more memory "
                    f"than this machine has") from e
            raise KernelError(
                f"node {step.node.name!r} ({step.node.op_type}, opset "
                f"{step.opset or '?'}) failed: "
                f"{type(e).__name__}: {e}; inputs: {_describe_args(step, env, args)}",
                node_name=step.node.name, op_type=step.node.op_type) from e
        if mem is not None:
            self.last_peak_bytes = peak
            if self.device is not None:
                self.device._note_peak(peak)
        return self._outputs(env)

    def _outputs(self, env: list) -> list:
        """The output slots' values (numpy scalars as 0-d arrays)."""
        return [np.asarray(v) if isinstance(v, np.generic) else v
                for v in (env[s] for s in self._out_slots)]

    def _execute_fast(self, env: list) -> list:
        """The plain CPU run over the fast schedule (shape segments); any failure is
        retried by the caller on the plain schedule, which names the node."""
        env.append(None)    # slot -1: omitted optional inputs read None
        for st in self._fast:
            args = [env[i] for i in st.ins]
            if st.subplans:
                kw = dict(st.attrs)
                for name, sub, free in st.subplans:
                    kw[name] = _bind(sub, {f: env[s] for f, s in free})
                r = st.fn(*args, **kw)
            else:
                r = st.fn(*args, **st.attrs)
            if type(r) is tuple:
                for s, v in zip(st.outs, r):
                    if s >= 0:
                        env[s] = v
            elif st.outs[0] >= 0:
                env[st.outs[0]] = r
            for s in st.free:
                env[s] = None
        return self._outputs(env)


class StepRunner(Protocol):
    """How :meth:`Plan.execute` runs a step on values other than plain arrays."""

    def __call__(self, step: Step, args: list, kw: dict):
        """The step's output (a tuple for several outputs)."""

    def bind(self, plan: Plan, scope: dict) -> Callable:
        """A subgraph body ``body(*inputs) -> list`` with ``scope``'s outer values bound."""


def _bind(plan: Plan, scope: dict) -> Callable:
    def body(*inputs):
        return plan.run_positional(inputs, scope)
    body.plan = plan
    return body


def _describe_args(step: Step, env, args) -> str:
    parts = []
    for name, a in zip(step.node.inputs, args):
        if a is None:
            parts.append(f"{name or '<omitted>'}=None")
        elif is_array(a):
            parts.append(f"{name}: {a.dtype}{list(a.shape)}")
        else:
            parts.append(f"{name}: {type(a).__name__}")
    return ", ".join(parts) or "(none)"


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


# --------------------------------------------------------------------------- devices
def _array_place(v):
    """(kind, index) of where an array lives: ("CPU", 0) or ("CUDA", n); None for non-arrays."""
    if isinstance(v, np.ndarray) or isinstance(v, np.generic):
        return ("CPU", 0)
    dev = getattr(v, "device", None)
    if is_array(v) and dev is not None:
        return ("CUDA", int(getattr(dev, "id", 0)))
    return None


def _check_device(device, name: str, v) -> None:
    """Feeds must already live on the plan's device (they move only when asked); values of
    dtypes the device cannot hold (bfloat16, float8, strings, ...) live on the host."""
    items = v if isinstance(v, list) else [v]
    for a in items:
        place = _array_place(a)
        if place is None or place == (device.kind, device.index):
            continue
        if device.is_cuda and _host_only(a):
            continue
        where = "CPU" if place[0] == "CPU" else f"CUDA:{place[1]}"
        raise DeviceError(
            f"input {name!r} is on {where} but the plan runs on {device}; arrays of two devices "
            f"cannot be mixed in one run: move the input with device.put(array) (or "
            f"Tensor.to_device) first")


def _host_only(a) -> bool:
    """A value that must live on the host in a device plan (a numpy array of a dtype cupy lacks,
    or a sequence holding one)."""
    if isinstance(a, list):
        return any(_host_only(x) for x in a)
    return isinstance(a, (np.ndarray, np.generic)) and not device_dtype_ok(a.dtype)


def _is_dtype_refusal(e: BaseException) -> bool:
    """cupy (or a kernel) refusing a dtype it cannot hold on the device."""
    if getattr(e, "host_dtype", False):
        return True
    text = str(e)
    return isinstance(e, (ValueError, TypeError)) and (
        "Unsupported dtype" in text or "Unsupported type" in text or "has no device" in text)


#: integer constants up to this many elements may stay on the host
_HOST_CONST_MAX = 64
_INT_TYPES = frozenset({2, 3, 4, 5, 6, 7, 12, 13})  # TensorProto (u)int8..64


def _run_device_step(step: Step, args: list, kw: dict, xp):
    """Run one step of a device plan: on the device (host values it reads as data uploaded),
    as a host shape computation (``step.host_op``), or on the host when the node reads or
    produces a value of a dtype the device cannot hold (remembered in ``step.host``)."""
    if step.host_op:
        return _run_host_op(step, args, kw)
    if not step.host:
        mixed = False
        for i, a in enumerate(args):
            if type(a) is np.ndarray:
                if not device_dtype_ok(a.dtype):
                    break
                mixed = True
                if i not in step.host_read:
                    args[i] = xp.asarray(a)
        else:
            try:
                r = step.fn(*args, **kw)
            except Exception as e:  # noqa: BLE001 - only dtype refusals are retried
                if not _is_dtype_refusal(e):
                    raise
            else:
                if mixed:  # a kernel that took its array module from a host input
                    r = tuple(_to_device(v, xp) for v in r) if type(r) is tuple else \
                        _to_device(r, xp)
                return r
        step.host = True
    return _run_on_host(step, args, kw, xp)


def _to_device(v, xp):
    """A host array (or a sequence of them) of a GPU dtype moved to the device; others as is."""
    if isinstance(v, list):
        return [_to_device(x, xp) for x in v]
    if isinstance(v, (np.ndarray, np.generic)) and device_dtype_ok(v.dtype):
        return xp.asarray(v)
    return v


def _host_kw(kw):
    """Keyword arguments for running a step on the host: a ``ctx`` that names the device's
    array module loses it (input-less kernels then build numpy arrays)."""
    ctx = kw.get("ctx") if isinstance(kw, dict) else None
    if ctx is None or ctx.extra.get("xp") is None:
        return kw
    import dataclasses  # noqa: PLC0415
    kw = dict(kw)
    kw["ctx"] = dataclasses.replace(ctx, extra={k: v for k, v in ctx.extra.items()
                                                if k != "xp"})
    return kw


def _run_host_op(step: Step, args: list, kw: dict):
    """A shape computation on host values: numpy in, numpy out."""
    if facts(step.node.op_type, step.node.domain).shape_only:
        # only the metadata is read: a zero-stride host view of the device array's shape
        d = args[0]
        if d is not None and not isinstance(d, (np.ndarray, list)):
            args = [np.broadcast_to(np.empty((), np.int8), tuple(d.shape))] + list(args[1:])
    else:
        args = [to_numpy(a) if a is not None and not isinstance(a, (np.ndarray, list)) else a
                for a in args]
    r = step.fn(*args, **_host_kw(kw))
    if type(r) is tuple:
        return tuple(np.asarray(v) if isinstance(v, np.generic) else v for v in r)
    return np.asarray(r) if isinstance(r, np.generic) else r


def _run_on_host(step: Step, args: list, kw: dict, xp):
    def down(a):
        if isinstance(a, list):
            return [down(x) for x in a]
        return a if a is None or isinstance(a, (np.ndarray, np.generic)) else to_numpy(a)

    r = step.fn(*[down(a) for a in args], **_host_kw(kw))
    if type(r) is tuple:
        return tuple(_to_device(v, xp) for v in r)
    return _to_device(r, xp)


# cupy's out-of-memory exception types (filled lazily; tests may add their own)
_OOM_TYPES: list = []


def _is_oom(e: BaseException) -> bool:
    if not _OOM_TYPES:
        try:
            import cupy  # noqa: PLC0415
            _OOM_TYPES.append(cupy.cuda.memory.OutOfMemoryError)
        except Exception:
            _OOM_TYPES.append(type(None))
    if isinstance(e, tuple(t for t in _OOM_TYPES if t is not type(None))):
        return True
    # cuBLAS / cuDNN / runtime allocation failures surface with these names
    text = str(e)
    return "CUBLAS_STATUS_ALLOC_FAILED" in text or "cudaErrorMemoryAllocation" in text


def _oom_error(e: BaseException, device, step) -> DeviceError:
    import re  # noqa: PLC0415
    size = getattr(e, "_size", None)
    if size is None:
        m = re.search(r"allocating ([\d,]+) bytes", str(e))
        size = int(m.group(1).replace(",", "")) if m else None
    req = f"{size:,} bytes" if size is not None else "an unknown number of bytes"
    where = str(device) if device is not None else "the GPU"
    err = DeviceError(
        f"out of memory on {where} in node {step.node.name!r} ({step.node.op_type}): it "
        f"requested {req} ({e}); use a smaller batch, free other arrays, or run on the CPU")
    err.bytes_requested = size
    err.node_name = step.node.name
    err.device = where
    return err


def _pool_sampler(device):
    """A zero-argument function returning the bytes in use on ``device`` (None on the CPU)."""
    if device is None or not device.is_cuda:
        return None
    pool = device.xp.get_default_memory_pool()
    return pool.used_bytes
