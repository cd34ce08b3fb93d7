"""Our engine's time per node, without the run loop's own cost.

A plain run of a Plan (``plan.run``) spends its time in the kernels and in the run loop around
them (gathering each step's arguments, storing its outputs, freeing values: about a
microsecond a step).

:func:`time_plan` times, like for like, what a plain run runs: the plan's pre-bound schedule
of plain CPU runs (the *fast* schedule, shape arithmetic grouped in remembered segments,
when the plan has one; ``runtime.run.run_bound``), through a copy of that loop that reads
``time.perf_counter`` (wall clock: the engine's kernels split large products over their own
threads, which a thread's CPU clock would not see) on both sides of each kernel call; the
cost of reading the clock (measured once, a few tens of nanoseconds) is subtracted. Same
entries, same argument gathering, same BLAS thread setting (one thread, held around the
run as a plain run holds it), same compiled kernels, same inputs. A shape segment's time
is shared by its member nodes; a subgraph body (If / Loop / Scan) runs inside its node's
kernel call and counts for that node.

Timed runs alternate with plain runs (``plan.execute``, which they are compared with), after
warm-up runs (kernel caches, the segments' remembered results), with Python's garbage
collector paused so that no collection lands in one run only. A node's time is its mean over
the *middle* pairs of neighbouring (timed, plain) runs (the half whose pair totals lie
between the quartiles), a plain run's time the mean of the plain runs of the same pairs:
like for like, robust to a busy machine's delays, still additive (per-node medians are not:
each run's delays hit other nodes, and the medians' sum falls below every real run).

``clock="cpu"`` reads the process' CPU time (``time.process_time``: every thread of the
process, the kernels' workers included) instead of the wall clock, on both sides. On a
machine shared with other jobs a run of a few milliseconds is either clean or loses a whole
time slice (3-4 ms here) waiting for a core, and the wall-clock comparison becomes a coin
toss; CPU time does not count the waits. It counts a kernel split over two threads twice,
though: use it to check the accounting on a busy machine, the wall clock for times to read
against the roofline. ``paired_ratio`` is the median over neighbouring pairs of runs of
(sum of the nodes) / (the plain run): both runs of a pair see the same load. The difference
between the plain run and the sum of the nodes is the loop's own cost (``overhead_ms``).

:class:`TimingRunner` is the same clock as a step runner (``runtime.plan.StepRunner``) for
``plan.execute(inputs, runner=...)``: it times the plan's steps one by one (shape arithmetic
included), a slower schedule than a plain run's.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass

import numpy as np

from workbench.errors import InputError

_clock = time.perf_counter
#: the clocks :func:`time_plan` reads: wall time, or the CPU time of the whole process (all
#: its threads: the kernels' workers included; a busy machine's waits for a core not in it)
CLOCKS = {"wall": time.perf_counter, "cpu": time.process_time}


def clock_cost(n: int = 2000, read=None) -> float:
    """Seconds between two back-to-back clock reads (``read``: ``time.perf_counter`` by
    default) around an empty call (the median of ``n``): what each timed step adds that is
    not the kernel's."""
    read = read or _clock

    def empty():
        return None

    d = []
    for _ in range(n):
        t0 = read()
        empty()
        d.append(read() - t0)
    return float(statistics.median(d))


class TimingRunner:
    """A step runner that times each kernel call (seconds, summed into :attr:`seconds` by step
    index); ``clock`` is subtracted once per call. Use with ``plan.execute(inputs,
    runner=timer)``."""

    def __init__(self, plan, clock: float = 0.0):
        self.index = {id(st): k for k, st in enumerate(plan.steps)}
        self.seconds = np.zeros(len(plan.steps))
        self.calls = np.zeros(len(plan.steps), np.int64)
        self.clock = clock

    def reset(self) -> None:
        self.seconds[:] = 0.0
        self.calls[:] = 0

    def __call__(self, step, args, kw):
        t0 = _clock()
        r = step.fn(*args, **kw)
        t1 = _clock()
        k = self.index.get(id(step))
        if k is not None:
            self.seconds[k] += max(0.0, t1 - t0 - self.clock)
            self.calls[k] += 1
        return r

    def bind(self, plan, scope):
        from workbench.runtime.run import bind_arrays  # noqa: PLC0415

        return bind_arrays(plan, scope)


@dataclass
class PlanTimes:
    """What :func:`time_plan` measured: ``node_ms`` {node name: ms per run}, ``steps`` (node
    names in schedule order), ``plain_ms`` (a plain run), ``timed_run_ms`` (a timed run, wall
    clock), ``runs``, ``overhead_ms`` (plain run - sum of the nodes), ``sum_ms``."""

    node_ms: dict
    steps: list
    plain_ms: float
    timed_run_ms: float
    runs: int
    clock_ns: float
    #: per pair of neighbouring runs: (sum of the nodes in the timed run) / (the plain run);
    #: its median is robust on a busy machine (both runs of a pair see the same load)
    paired: list = None
    #: the clock both sides were read on: "wall" or "cpu" (the process' CPU time)
    clock: str = "wall"
    #: per entry of the schedule a plain run takes: (label, node names it covers, ms); a
    #: shape segment is one entry labelled "shape memo (N nodes: ...)"
    entries: list = None

    @property
    def sum_ms(self) -> float:
        return float(sum(self.node_ms.values()))

    @property
    def overhead_ms(self) -> float:
        return self.plain_ms - self.sum_ms

    @property
    def ratio(self) -> float:
        """The sum of the per-node times / a plain run's time."""
        return self.sum_ms / self.plain_ms if self.plain_ms else float("nan")

    @property
    def paired_ratio(self) -> float:
        """The median over neighbouring (timed, plain) run pairs of the nodes' sum / the plain
        run."""
        return float(np.median(self.paired)) if self.paired else float("nan")

    def describe(self) -> str:
        return (f"per-node times sum to {self.sum_ms:.3f} ms, a plain run takes "
                f"{self.plain_ms:.3f} ms ({100 * (self.ratio - 1):+.1f} %; run by run "
                f"{100 * (self.paired_ratio - 1):+.1f} %; the run loop's own cost about "
                f"{self.overhead_ms:.3f} ms over {len(self.steps)} steps); means over the "
                f"middle half of {self.runs} pairs of runs, "
                + ("wall clock" if self.clock == "wall" else "the process' CPU time"))


def _entries(plan) -> tuple:
    """(the pre-bound schedule a plain run of ``plan`` runs, per entry the node names it
    covers): the fast schedule (shape arithmetic grouped in remembered segments, a segment
    covering its members) when the plan has one, else its steps."""
    fast = plan.fast_schedule
    prog = plan._bound_fast if fast is not None else plan.bound_steps
    names = []
    for entry in prog:
        e = entry[-1]
        seg = getattr(e, "segment", None)
        if seg is not None:
            names.append([m.node.name for m in seg.members])
        else:
            st = getattr(e, "step", None) or e
            names.append([st.node.name])
    return prog, names


def _run_timed(prog, env: list, seconds: np.ndarray, clock: float, device=None,
               _clock=_clock) -> None:
    """:func:`workbench.runtime.run.run_bound` with each kernel call timed (added into
    ``seconds[k]`` for entry ``k``, less ``clock``): the same pre-bound entries, argument
    gathering, stores and frees as a plain run, so the only difference is the clock reads."""
    from workbench.runtime import run as _run  # noqa: PLC0415

    env.append(None)
    entry = None
    k = -1
    try:
        for k, (how, fn, i0, i1, ins, out, kw, free, entry) in enumerate(prog):
            if how == 2:
                a0, a1 = env[i0], env[i1]
                t0 = _clock()
                r = fn(a0, a1, **kw)
                t1 = _clock()
            elif how == 1:
                a0 = env[i0]
                t0 = _clock()
                r = fn(a0, **kw)
                t1 = _clock()
            elif how == 0:
                args = [env[i] for i in ins]
                t0 = _clock()
                r = fn(*args, **kw)
                t1 = _clock()
            else:
                t0 = _clock()
                r = _run._call_general(entry, env)
                t1 = _clock()
            d = t1 - t0 - clock
            if d > 0.0:
                seconds[k] += d
            if out >= 0 and type(r) is not tuple:
                env[out] = r
            else:
                _run._store(entry.outs, r, env)
            for s in free:
                env[s] = None
    except Exception as e:
        if entry is None:
            raise
        _run._raise_named(e, entry, [env[i] for i in entry.ins], device)


def time_plan(plan, inputs, *, runs: int = 20, warmup: int = 3,
              clock: str = "wall") -> PlanTimes:
    """Per-node kernel times of ``plan`` (a CPU Plan) on ``inputs`` (a list in input order)
    and a plain run's time, both on ``clock`` ("wall" or "cpu"); see the module
    docstring."""
    if clock not in CLOCKS:
        raise InputError(f"clock is one of {sorted(CLOCKS)}, not {clock!r}")
    if getattr(plan, "device", None) is not None and plan.device.is_cuda:
        raise InputError("time_plan times CPU plans (a GPU kernel returns before it is done)")
    if runs < 1:
        raise InputError(f"runs must be at least 1, not {runs}")
    import gc  # noqa: PLC0415

    from workbench.ops.parallel import one_blas_thread  # noqa: PLC0415

    read = CLOCKS[clock]
    cost = clock_cost(read=read)
    plan.execute(inputs)                  # builds the fast schedule the plain runs take
    prog, covers = _entries(plan)
    seconds = np.zeros(len(prog))
    per = np.zeros((runs, len(prog)))
    plain, timed = [], []
    blas = one_blas_thread()              # what a plain CPU run holds around its steps

    def timed_run():
        seconds[:] = 0.0
        t0 = read()
        with blas:
            env = plan._env(inputs, None, None)
            _run_timed(prog, env, seconds, cost, plan.device, read)
            plan._outputs(env)
        return read() - t0

    def plain_run():
        t0 = read()
        plan.execute(inputs)
        return read() - t0

    for _ in range(max(0, warmup)):
        plain_run()
        timed_run()
    gc.collect()
    was_enabled = gc.isenabled()
    gc.disable()                          # no collector pause lands in one run only
    try:
        for r in range(runs):
            # alternate which goes first: a slow phase of a busy machine hits both alike
            if r % 2:
                plain.append(plain_run())
                timed.append(timed_run())
            else:
                timed.append(timed_run())
                plain.append(plain_run())
            per[r] = seconds
    finally:
        if was_enabled:
            gc.enable()
    paired = [float(per[r].sum() / plain[r]) if plain[r] else float("nan")
              for r in range(runs)]
    # the middle pairs of runs (by the pair's total time: the same pairs on both sides); per
    # entry the mean over them, so that the nodes add up to a typical run (medians per node
    # would not: a busy machine's delays hit a different node in every run, and the sum of
    # the medians falls below any real run)
    plain_a, timed_a = np.asarray(plain), np.asarray(timed)
    mid = _middle(per.sum(axis=1) + plain_a)
    med = per[mid].mean(axis=0) * 1e3
    names = [st.node.name for st in plan.steps]
    node_ms: dict = {n: 0.0 for n in names}
    for ms, members in zip(med, covers):
        for name in members:              # a shape segment: its time shared by its members
            node_ms[name] = node_ms.get(name, 0.0) + float(ms) / len(members)
    labels = [getattr(getattr(e[-1], "segment", None), "label", None) or members[0]
              for e, members in zip(prog, covers)]
    entries = [(lab, members, float(ms)) for lab, members, ms in zip(labels, covers, med)]
    return PlanTimes(node_ms, names, float(plain_a[mid].mean()) * 1e3,
                     float(timed_a[mid].mean()) * 1e3, runs, cost * 1e9, paired, clock,
                     entries)


def _middle(totals) -> np.ndarray:
    """Indices of the runs whose total is in the middle half (the interquartile runs; all of
    them for fewer than 4 runs)."""
    totals = np.asarray(totals)
    n = len(totals)
    if n < 4:
        return np.arange(n)
    order = np.argsort(totals, kind="stable")
    return order[n // 4: n - n // 4]


__all__ = ["TimingRunner", "PlanTimes", "time_plan", "clock_cost"]
