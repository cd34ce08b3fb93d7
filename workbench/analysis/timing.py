"""Our engine's time per node, without the run loop's own cost.

A plain run of a Plan (``plan.run``) spends its time in the kernels and in the run loop around
them (gathering each step's arguments, storing its outputs, freeing values: about a
microsecond a step). :class:`TimingRunner` is a step runner (``runtime.plan.StepRunner``): the
run loop hands it each step and it times only the kernel call, ``step.fn(*args, **kw)``, with
``time.perf_counter`` on both sides; the cost of reading the clock itself (measured once, a
few tens of nanoseconds) is subtracted. A subgraph body (If / Loop / Scan) runs inside its
node's kernel call and counts for that node.

:func:`time_plan` alternates timed runs with plain runs (``plan.run`` without a hook: the
schedule the engine really uses, shape arithmetic remembered) on the same inputs, after
warm-up runs. A node's time is its mean over the *middle* timed runs (the half whose totals
lie between the quartiles), a plain run's time the mean of the middle plain runs: robust to
a busy machine's delays and still additive (per-node medians are not: each run's delays hit
other nodes, and the medians' sum falls below every real run). The difference between the
plain run and the sum of the nodes is the loop's own cost (``overhead_ms``; the plain
schedule also skips remembered shape arithmetic that the timed runs compute, so it can be
below zero on tiny models). Timed runs use BLAS on one thread, as plain CPU runs do (the
engine's kernels split large products over their own threads).
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass

import numpy as np

from workbench.errors import InputError

_clock = time.perf_counter


def clock_cost(n: int = 2000) -> float:
    """Seconds between two back-to-back clock reads around an empty call (the median of
    ``n``): what each timed step adds that is not the kernel's."""
    def empty():
        return None

    d = []
    for _ in range(n):
        t0 = _clock()
        empty()
        d.append(_clock() - t0)
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
                f"{self.overhead_ms:.3f} ms over {len(self.steps)} steps); means of the "
                f"middle half of {self.runs} runs each")


def time_plan(plan, inputs, *, runs: int = 20, warmup: int = 3) -> PlanTimes:
    """Per-node kernel times of ``plan`` (a CPU Plan) on ``inputs`` (a list in input order)
    and a plain run's time; see the module docstring."""
    if getattr(plan, "device", None) is not None and plan.device.is_cuda:
        raise InputError("time_plan times CPU plans (a GPU kernel returns before it is done)")
    if runs < 1:
        raise InputError(f"runs must be at least 1, not {runs}")
    from workbench.ops.parallel import blas_controller, single_threaded_blas  # noqa: PLC0415

    timer = TimingRunner(plan, clock_cost())
    names = [st.node.name for st in plan.steps]
    per = np.zeros((runs, len(names)))
    plain, timed = [], []
    blas = blas_controller()

    def timed_run():
        timer.reset()
        t0 = _clock()
        with single_threaded_blas(blas):
            plan.execute(inputs, runner=timer)
        return _clock() - t0

    def plain_run():
        t0 = _clock()
        plan.execute(inputs)
        return _clock() - t0

    for _ in range(max(0, warmup)):
        plain_run()
        timed_run()
    for r in range(runs):
        # alternate which goes first: a slow phase of a busy machine hits both alike
        if r % 2:
            plain.append(plain_run())
            timed.append(timed_run())
        else:
            timed.append(timed_run())
            plain.append(plain_run())
        per[r] = timer.seconds
    paired = [float(per[r].sum() / plain[r]) if plain[r] else float("nan")
              for r in range(runs)]
    # per node: the mean over the middle runs (by their total), so that the nodes add up to a
    # typical run (medians per node would not: a busy machine's delays hit a different node
    # in every run, and the sum of the medians falls below any real run)
    med = per[_middle(per.sum(axis=1))].mean(axis=0) * 1e3
    node_ms: dict = {}
    for name, ms in zip(names, med):
        node_ms[name] = node_ms.get(name, 0.0) + float(ms)
    plain_a, timed_a = np.asarray(plain), np.asarray(timed)
    return PlanTimes(node_ms, names, float(plain_a[_middle(plain_a)].mean()) * 1e3,
                     float(timed_a[_middle(timed_a)].mean()) * 1e3, runs, timer.clock * 1e9,
                     paired)


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
