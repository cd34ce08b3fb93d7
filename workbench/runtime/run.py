"""The run loop: one loop runs every schedule of a Plan.

:func:`loop` walks a list of steps over a list of slots (``env``): it gathers each step's
arguments (slot -1 reads None), binds its subgraph bodies, calls it, stores its outputs and
frees the slots whose last reader it was. How a step is called is decided once per run (per-node
hooks and device memory sampling wrap the call):

- :func:`run_steps` - the plan's own steps: plain kernel calls on the CPU, a device step on a
  GPU (:func:`workbench.runtime.placement.run_device_step`), or a step runner's call
  (:class:`~workbench.runtime.plan.StepRunner`, e.g. ``autograd.TapeRunner``: Tensors
  recording the tape);
- :func:`run_fast` - plain CPU runs without a hook take the fast schedule, where the shape
  arithmetic is grouped in remembered segments (:mod:`workbench.runtime.segments`).

Whatever a step raises leaves the loop through :func:`workbench.runtime.errors.node_error`,
which names the node (the member of a segment that failed included). A run of the fast
schedule is retried only when its failure may come from a stale remembered segment result
(one that no longer matches what its members compute): those results are forgotten and the
run starts again, once. Any other failure is raised at once, so a failing model runs once and
an unseeded random op draws once.
"""

from __future__ import annotations

from collections.abc import Callable

from workbench.runtime import placement
from workbench.runtime.errors import node_error


def bind_arrays(plan, scope: dict) -> Callable:
    """A subgraph body over arrays: ``body(*inputs)`` runs ``plan`` with ``scope`` bound."""
    def body(*inputs):
        return plan.run_positional(inputs, scope)
    body.plan = plan
    return body


def loop(schedule, env: list, call: Callable | None, bind: Callable, device=None) -> None:
    """Run ``schedule`` (steps with ``fn, ins, outs, attrs, free, subplans``) over ``env``.

    ``call(step, args, kw)`` runs a step (None: ``step.fn(*args, **kw)``); ``bind(plan,
    scope)`` makes a subgraph body. Errors are named by
    :func:`~workbench.runtime.errors.node_error` (``device``: where the kernels ran)."""
    env.append(None)    # slot -1: omitted optional inputs read None
    st = args = None
    try:
        for st in schedule:
            args = [env[i] for i in st.ins]
            if st.subplans:
                kw = dict(st.attrs)
                for sub in st.subplans:
                    kw[sub.attr] = bind(sub.plan, {f: env[s] for f, s in sub.free})
            else:
                kw = st.attrs
            r = st.fn(*args, **kw) if call is None else call(st, args, kw)
            outs = st.outs
            if type(r) is tuple:
                for s, v in zip(outs, r):
                    if s >= 0:
                        env[s] = v
            elif outs[0] >= 0:
                env[outs[0]] = r
            for s in st.free:
                env[s] = None
    except Exception as e:
        if st is None:
            raise
        _raise_named(e, st, args, device)


# --------------------------------------------------------------------------- pre-bound steps
#: how a pre-bound step gathers its arguments: one input, two, any number, or (with
#: subgraph bodies to bind) through the general path of :func:`_call_general`
_ONE, _TWO, _ANY, _GENERAL = 1, 2, 0, 3


def bind_steps(schedule) -> list[tuple]:
    """The pre-bound form of ``schedule`` that :func:`run_bound` runs: one flat tuple per step,
    ``(how, fn, in0, in1, ins, out, attrs, free, entry)``, everything the loop needs decided
    once (how many arguments, which slot a single output goes to: -2 when the step has several
    outputs or omits its first one)."""
    prog = []
    for st in schedule:
        ins, outs = tuple(st.ins), tuple(st.outs)
        how = _GENERAL if st.subplans else _ONE if len(ins) == 1 else \
            _TWO if len(ins) == 2 else _ANY
        out = outs[0] if len(outs) == 1 and outs[0] >= 0 else -2
        prog.append((how, st.fn, ins[0] if ins else -1, ins[1] if len(ins) > 1 else -1, ins,
                     out, st.attrs, tuple(st.free), st))
    return prog


def run_bound(prog: list, env: list, device=None) -> None:
    """Run a pre-bound schedule (:func:`bind_steps`) of plain kernel calls over ``env``: the
    lean loop of plain CPU runs (no hook, no runner, no memory sampling). Errors are named as
    in :func:`loop`."""
    env.append(None)    # slot -1: omitted optional inputs read None
    entry = None
    try:
        for how, fn, i0, i1, ins, out, kw, free, entry in prog:
            if how == 2:
                r = fn(env[i0], env[i1], **kw)
            elif how == 1:
                r = fn(env[i0], **kw)
            elif how == 0:
                r = fn(*[env[i] for i in ins], **kw)
            else:
                r = _call_general(entry, env)
            if out >= 0 and type(r) is not tuple:
                env[out] = r
            else:
                _store(entry.outs, r, env)
            for s in free:
                env[s] = None
    except Exception as e:
        if entry is None:
            raise
        _raise_named(e, entry, [env[i] for i in entry.ins], device)


def _call_general(st, env: list):
    """A step with subgraph bodies: the bodies bound to the outer values they read."""
    kw = dict(st.attrs)
    for sub in st.subplans:
        kw[sub.attr] = bind_arrays(sub.plan, {f: env[s] for f, s in sub.free})
    return st.fn(*[env[i] for i in st.ins], **kw)


def _store(outs, r, env: list) -> None:
    if type(r) is tuple:
        for s, v in zip(outs, r):
            if s >= 0:
                env[s] = v
    elif outs[0] >= 0:
        env[outs[0]] = r


def _raise_named(e: Exception, st, args, device) -> None:
    """Raise ``e`` named after the node of schedule entry ``st`` (called with ``args``)."""
    step, args = _failing(st, args)
    if step is None:    # a segment's own bookkeeping, not one of its members
        raise e
    err = node_error(e, node_name=step.node.name, op_type=step.node.op_type,
                     opset=getattr(step, "opset", 0), args=args or (),
                     input_names=step.node.inputs, device=device)
    # no local may keep the error: error -> traceback -> this frame -> error would be a
    # cycle holding every value of the run (env) until the garbage collector runs
    try:
        if err is e:
            raise e
        raise err from e
    finally:
        err = step = args = e = None


def _failing(entry, args) -> tuple:
    """(the Step that failed, its arguments) for a schedule entry that raised: the member of a
    shape segment that raised (None when no member did), or the entry's step."""
    seg = getattr(entry, "segment", None)
    if seg is not None:
        failed, seg.failed = seg.failed, None
        return failed if failed is not None else (None, None)
    return getattr(entry, "step", None) or entry, args


def run_steps(plan, env: list, hook: Callable | None, runner) -> list:
    """Run ``plan.steps`` over ``env`` with ``runner`` (None: kernels on arrays, on the plan's
    device); ``hook(node, outputs)`` after every step. Returns the outputs."""
    device = plan.device
    if runner is not None:
        call, bind = runner, runner.bind
    elif plan._on_cuda:
        xp = device.xp
        run_device_step = placement.run_device_step

        def call(st, args, kw):
            return run_device_step(st, args, kw, xp)
        bind = bind_arrays
    else:
        call, bind = None, bind_arrays
    mem = placement.pool_sampler(device) if plan.track_memory else None
    peak = [mem()] if mem is not None else None
    if mem is not None:
        call = _sampling(call, mem, peak)
    if hook is not None:
        call = _hooked(call, hook)
    if call is None and bind is bind_arrays:
        run_bound(plan.bound_steps, env, device)
    else:
        loop(plan.steps, env, call, bind, device)
    if mem is not None:
        plan.last_peak_bytes = max(peak[0], mem())
        if device is not None:
            device._note_peak(plan.last_peak_bytes)
    return plan._outputs(env)


def _hooked(call, hook) -> Callable:
    """``call`` (None: the plain kernel call) followed by ``hook(node, outputs)``."""
    if call is None:
        def hooked(st, args, kw):
            r = st.fn(*args, **kw)
            hook(st.node, r if type(r) is tuple else (r,))
            return r
    else:
        def hooked(st, args, kw):
            r = call(st, args, kw)
            hook(st.node, r if type(r) is tuple else (r,))
            return r
    return hooked


def _sampling(call, mem, peak: list) -> Callable:
    """``call`` preceded by a sample of the device memory in use (what the previous step left
    after freeing its inputs), the highest kept in ``peak[0]``."""
    def sampling(st, args, kw):
        used = mem()
        if used > peak[0]:
            peak[0] = used
        return st.fn(*args, **kw) if call is None else call(st, args, kw)
    return sampling


def run_fast(plan, fast: list, make_env: Callable[[], list], bound: list | None = None,
             ) -> list:
    """Run the fast schedule ``fast`` of a CPU plan (pre-bound: ``bound``, see
    :func:`bind_steps`) over a fresh ``make_env()``; on a failure after remembered segment
    results were handed out, the stale ones among them are forgotten and the run is made again
    (once) when there was one."""
    if bound is None:
        bound = bind_steps(fast)
    env = make_env()
    try:
        run_bound(bound, env, plan.device)
    except Exception:
        env = None
        # a segment whose last call handed out a remembered result (in this run, or in an
        # earlier one if the run failed before reaching it: then it is rarely stale, and
        # checking costs a recomputation of its shape arithmetic)
        stale = [f.segment for f in fast if f.segment is not None
                 and f.segment.last_hit is not None and f.segment.is_stale(f.segment.last_hit)]
        if not stale:
            raise
        for seg in stale:
            seg.forget()
        env = make_env()
        run_bound(bound, env, plan.device)
    return plan._outputs(env)
