"""Shape segments: the shape arithmetic of a plan run once per input shape, not once per run.

Exported transformers compute their Reshape targets, position ids and causal masks in the
graph from the dynamic batch and sequence length: ``Shape -> Gather -> Unsqueeze -> Concat``
chains, ``Range``, comparisons, casts -- about a third of the nodes of the BERT-like and
GPT-2-like models, each paying a kernel call per run although their results change only when
an input's shape does.

:func:`fast_schedule` finds the *shape-derived* steps of a CPU plan: a step reading only the
shape of its input (a kernel registered ``shape_only``: Shape, Size), or a deterministic step
(no ``random`` fact, no subgraph, one of the engine's own kernels: a user's custom operator
may have side effects) whose every input is shape-derived or an initializer and at least one
is shape-derived. The steps that depend on the same last step go where their first result
is needed (never before what they read, never after the last other reader of a value they
read: :func:`_placed_groups`); those that land at the same place form one
:class:`ShapeSegment` step,
which runs its members once per key -- the shapes of the tensors whose shape it reads, the
bytes of the small shape-derived values it reads from earlier steps (the identity of larger
ones); the initializers it reads are bound into it when the schedule is made, and a run given
other values for them (``execute(values=...)``) takes the plain schedule -- and hands out the
remembered outputs afterwards (read-only arrays, at most 1 MiB per key, at most
``MEMO_KEYS`` keys per segment, least recently used first out). Values that are graph outputs
are never remembered, and a graph output that is a read-only view of a remembered array is
handed to the caller as a copy (``plan._caller_owned``). A tensor read only for its shape is
remembered as a zero-byte stand-in of its shape and dtype, never the tensor itself: a
remembered result keeps no activation alive. ``WORKBENCH_SHAPE_MEMO=0`` (read when a plan is
made) or ``plan.shape_memo = False`` turns the segments off: every step runs every run.

Profiles that time the schedule a plain run takes (``workbench profile``,
``analysis.timing.time_plan``: ``PlanTimes.entries``; ``benchmarks/bench_inference.py
--profile``) show a segment as one step, "shape memo (N nodes: ...)" (``ShapeSegment.label``).

The schedule is used only by plain CPU runs (no hook, no step runner, no device): hooks see
every node, and the training runner records every node on its tape. Errors name the node: a
segment that fails records the member and its arguments (``ShapeSegment.failed``) for the run
loop. A remembered result is *stale* when something its key does not see has changed (an
initializer written in place); when a run fails after segments handed out
remembered results (``ShapeSegment.last_hit``), :meth:`ShapeSegment.is_stale` recomputes each of
them from the inputs they were computed from, and only a stale one makes the run loop forget it
and run again.
"""

from __future__ import annotations

import operator
import os
import threading
from collections import OrderedDict
from collections.abc import Callable
from typing import Any, NamedTuple

import numpy as np

from workbench.ops.registry import facts

#: bytes of outputs a segment remembers per key; bigger results are recomputed every run
MEMO_BYTES = 1 << 20
#: keys a segment remembers (least recently used first out): a model fed many sequence
#: lengths keeps at most this many results per segment
MEMO_KEYS = 16
#: shape-derived arrays up to this many elements are keyed by their bytes, larger by identity
KEY_ELEMENTS = 256
#: the switch: ``WORKBENCH_SHAPE_MEMO=0`` (or ``Plan.shape_memo = False``) runs every step of
#: the plan every run (no segments), for comparisons and for bisecting a suspected memo bug
ENV_SWITCH = "WORKBENCH_SHAPE_MEMO"


def memo_enabled() -> bool:
    """Whether new plans remember their shape arithmetic (``WORKBENCH_SHAPE_MEMO``: "0",
    "off", "false" or "no" turn it off)."""
    return os.environ.get(ENV_SWITCH, "1").strip().lower() not in ("0", "off", "false", "no")


def _tuple_getter(idx: tuple) -> Callable:
    """``vals -> tuple(vals[i] for i in idx)`` at C speed (a tuple also for one index)."""
    if not idx:
        return lambda vals: ()
    if len(idx) == 1:
        i = idx[0]
        return lambda vals: (vals[i],)
    return operator.itemgetter(*idx)


def _shape_part(v):
    return tuple(v.shape) if hasattr(v, "shape") and hasattr(v, "dtype") else id(v)


class ShapeSegment:
    """Shape-derived steps run as one step, their results remembered per key.

    Called with the values of ``ext_in`` (slots), returns the values of ``ext_out`` (a
    tuple). ``shape_keyed[k]``: the k-th input is read only for its shape.

    One segment may be called from several threads at once (a plan run by a server's
    threads): a lookup is one atomic dict read, results are stored and dropped under a lock,
    and what a call leaves for the run loop (:attr:`last_hit`, :attr:`failed`) is kept per
    thread."""

    def __init__(self, members: list, ext_in: tuple, ext_out: tuple, shape_keyed: tuple,
                 value_keyed: tuple, bound: dict | None = None):
        self.members = members
        #: {slot: value} of the constants (initializers) the members read, bound when the
        #: schedule is made: not passed, not keyed (a run that gives other values for them
        #: takes the plan's plain schedule)
        self.bound = dict(bound or {})
        self.ext_in = ext_in
        self.ext_out = ext_out
        self.shape_keyed = shape_keyed
        self.value_keyed = value_keyed
        # the key's parts, split once: inputs read for their shape, small shape-derived values
        # read for their bytes, the rest (mostly initializers) by identity in one C-level map
        self._by_shape = _tuple_getter(tuple(i for i, s in enumerate(shape_keyed) if s))
        self._by_value = tuple(i for i, (s, v) in enumerate(zip(shape_keyed, value_keyed))
                               if v and not s)
        rest = tuple(i for i, (s, v) in enumerate(zip(shape_keyed, value_keyed))
                     if not s and not v)
        self._by_id = _tuple_getter(rest) if rest else None
        self.memo: OrderedDict = OrderedDict()
        self.memo_ok = True     # False once a result was too large or not an array
        self.hits = 0
        self._lock = threading.Lock()
        self._tls = threading.local()

    @property
    def label(self) -> str:
        """How profiles name this step: ``shape memo (N nodes: Shape, Gather, ...)``."""
        ops = list(dict.fromkeys(m.node.op_type for m in self.members))
        more = ", ..." if len(ops) > 4 else ""
        return f"shape memo ({len(self.members)} nodes: {', '.join(ops[:4])}{more})"

    # what the last call in this thread left for the run loop
    @property
    def last_hit(self):
        """The key of the remembered result the last call (in this thread) handed out; None
        when it computed."""
        return getattr(self._tls, "last_hit", None)

    @last_hit.setter
    def last_hit(self, k) -> None:
        self._tls.last_hit = k

    @property
    def failed(self) -> tuple | None:
        """(member step, its arguments) of the member that raised in the last call in this
        thread, for the run loop; None otherwise."""
        return getattr(self._tls, "failed", None)

    @failed.setter
    def failed(self, v) -> None:
        self._tls.failed = v

    def key(self, vals) -> tuple:
        parts = [v.shape if type(v) is np.ndarray else _shape_part(v)
                 for v in self._by_shape(vals)]
        for i in self._by_value:
            v = vals[i]
            if type(v) is np.ndarray and v.size <= KEY_ELEMENTS:
                parts.append((v.dtype.str, v.shape, v.tobytes()))
            else:
                parts.append(id(v))
        # identity; the memo entry keeps the objects alive, so the ids stay unique
        if self._by_id is not None:
            parts.append(tuple(map(id, self._by_id(vals))))
        return tuple(parts)

    def __call__(self, *vals):
        tls = self._tls
        if self.memo_ok:
            k = self.key(vals)
            memo = self.memo
            hit = memo.get(k)
            if hit is not None:
                try:
                    memo.move_to_end(k)     # most recently used
                except KeyError:            # another thread dropped it meanwhile: still valid
                    pass
                self.hits += 1
                tls.last_hit = k
                return hit[0]
        tls.last_hit = None
        out = self.compute(vals)
        if self.memo_ok:
            self._remember(k, vals, out)
        return out

    def compute(self, vals) -> tuple:
        """Run the members on ``vals`` (the values of ``ext_in``); the values of ``ext_out``.
        A member that raises is recorded in :attr:`failed` (with its arguments)."""
        local: dict[int, Any] = dict(self.bound)
        local.update(zip(self.ext_in, vals))
        local[-1] = None
        for st in self.members:
            args = [local[i] for i in st.ins]
            try:
                r = st.fn(*args, **st.attrs)
            except Exception:
                self.failed = (st, args)
                raise
            if type(r) is tuple:
                for s, v in zip(st.outs, r):
                    if s >= 0:      # an omitted output must not become slot -1's value
                        local[s] = v
            elif st.outs[0] >= 0:
                local[st.outs[0]] = r
        return tuple(local[s] for s in self.ext_out)

    def is_stale(self, k) -> bool:
        """Whether the result remembered under key ``k`` differs from what the members compute
        now from the inputs it was computed from (or cannot be computed any more)."""
        entry = self.memo.get(k)
        if entry is None:
            return False
        out, vals = entry
        try:
            fresh = self.compute(vals)
        except Exception:  # noqa: BLE001 - a result that cannot be recomputed is stale
            self.failed = None
            return True
        return any(type(a) is not type(b) or a.dtype != b.dtype or a.shape != b.shape
                   or not np.array_equal(a, b) for a, b in zip(out, fresh))

    def forget(self) -> None:
        """Drop every remembered result."""
        with self._lock:
            self.memo.clear()

    def _remember(self, k, vals, out) -> None:
        total = 0
        for v in out:
            if type(v) is not np.ndarray:
                self.memo_ok = False
                return
            total += v.nbytes
        if total > MEMO_BYTES:
            self.memo_ok = False
            self.forget()
            return
        inputs = {id(v) for v in vals}
        for v in out:   # handed out on every later run: nobody may write into them
            if id(v) not in inputs:
                v.flags.writeable = False
        # inputs read only for their shape are kept as zero-byte stand-ins of the same shape
        # and dtype (what is_stale recomputes from): a remembered result must not keep a
        # large activation alive
        kept = tuple(np.broadcast_to(np.zeros((), v.dtype), v.shape)
                     if s and type(v) is np.ndarray else v
                     for v, s in zip(vals, self.shape_keyed))
        with self._lock:
            self.memo[k] = (out, kept)
            self.memo.move_to_end(k)
            while len(self.memo) > MEMO_KEYS:
                self.memo.popitem(last=False)


class FastStep:
    """A step of the fast schedule: one original :class:`~workbench.runtime.plan.Step`
    (``step``) or a :class:`ShapeSegment` (``segment``), with the slots it reads and writes and
    those freed after it (the fields the run loop reads, as on a Step)."""

    __slots__ = ("fn", "ins", "outs", "attrs", "free", "subplans", "step", "segment")

    def __init__(self, *, fn, ins, outs, attrs, subplans=(), step=None, segment=None):
        self.fn, self.ins, self.outs, self.attrs = fn, ins, outs, attrs
        self.free, self.subplans, self.step, self.segment = (), subplans, step, segment

    @classmethod
    def of_step(cls, st) -> FastStep:
        return cls(fn=st.fn, ins=st.ins, outs=st.outs, attrs=st.attrs, subplans=st.subplans,
                   step=st)

    @classmethod
    def of_segment(cls, seg: ShapeSegment) -> FastStep:
        return cls(fn=seg, ins=seg.ext_in, outs=seg.ext_out, attrs={}, segment=seg)


def _pure_kernel(fn) -> bool:
    """Whether a kernel is known to be a pure function of its inputs and attributes: the
    engine's own kernels are (the random ones say so with the ``random`` fact); a kernel
    registered from elsewhere (a user's custom operator) may count its calls, log or keep
    state, so it runs every time."""
    mod = getattr(fn, "__module__", None) or ""
    return mod == "workbench" or mod.startswith("workbench.")


def _placed_groups(steps: list, member: dict, producer: dict, const_slots: set) -> dict:
    """{place: the shape-derived steps run as one segment right before step ``place``}.

    The steps that follow the same anchor (``member``: step -> the step it must follow) form a
    group; a group may run anywhere after its anchor and up to its *place*: where its first
    result is needed (before the first step outside it that reads one of its results, or
    before the group that does), but never after the last step outside it that reads what it
    reads (that would keep the value alive longer). Groups whose ranges overlap run as one
    segment at the latest place they share (members in their original order), so one key and
    one lookup serve them all."""
    n = len(steps)
    readers: dict[int, list[int]] = {}
    for i, st in enumerate(steps):
        for s in _reads(st):
            readers.setdefault(s, []).append(i)
    by_anchor: dict[int, list[int]] = {}
    for i, a in member.items():
        by_anchor.setdefault(a, []).append(i)
    place: dict[int, int] = {}
    # a group reading another's results has the later anchor: consumers are placed first
    for a in sorted(by_anchor, reverse=True):
        idx = by_anchor[a]
        outs = {s for i in idx for s in steps[i].outs if s >= 0}
        first = n
        for s in outs:
            for r in readers.get(s, ()):
                if r in member:
                    if member[r] != a:
                        first = min(first, place[member[r]])
                else:
                    first = min(first, r)
        cap = first
        for i in idx:
            for s in _reads(steps[i]):
                if s in outs or s in const_slots:
                    continue
                last = max((r for r in readers.get(s, ()) if member.get(r) != a),
                           default=producer.get(s, -1))
                cap = min(cap, last + 1)
        place[a] = max(a + 1, cap)
    # a group may run anywhere from right after its anchor to its place: the fewest places
    # that serve every group (the latest place of each run of groups whose ranges overlap)
    groups: dict[int, list[int]] = {}
    point = -1
    for a in sorted(by_anchor, key=lambda a: (place[a], a)):
        if a + 1 > point:
            point = place[a]
        groups.setdefault(point, []).extend(by_anchor[a])
    return {p: sorted(idx) for p, idx in groups.items()}


def _reads(step) -> list:
    out = [i for i in step.ins if i >= 0]
    for sub in step.subplans:
        out.extend(s for _, s in sub.free)
    return out


class _Unit(NamedTuple):
    """One entry of the new order: step indices (one step, or a segment's members), the slots
    it reads and those it produces."""
    idx: list
    reads: list
    produced: list


def fast_schedule(steps: list, constants: dict, keep_slots: set) -> list | None:
    """The fast schedule of a CPU plan's ``steps`` (see the module docstring), or None when it
    has no shape segment. ``constants``: {slot: value} of the initializers (bound into the
    segments that read them); ``keep_slots``: output slots."""
    const_slots = set(constants)
    producer: dict[int, int] = {}
    for i, st in enumerate(steps):
        for s in st.outs:
            if s >= 0:
                producer[s] = i
    derived: set[int] = set()          # shape-derived slots
    member: dict[int, int] = {}        # shape-derived step -> anchor (step it follows; -1)
    for i, st in enumerate(steps):
        n = st.node
        if st.subplans or any(s in keep_slots for s in st.outs):
            continue
        f = facts(n.op_type, n.domain)
        if f.random or not _pure_kernel(st.fn):
            continue
        ins = [s for s in st.ins if s >= 0]
        if f.shape_only:
            if not ins:
                continue
        elif not ins or not any(s in derived for s in ins) or \
                not all(s in derived or s in const_slots for s in ins):
            continue
        anchor = -1
        for s in ins:
            p = producer.get(s)
            if p is None:
                continue
            anchor = max(anchor, member[p] if p in member else p)
        member[i] = anchor
        derived.update(s for s in st.outs if s >= 0)
    if not member:
        return None
    groups = _placed_groups(steps, member, producer, const_slots)
    if not any(len(g) > 1 for g in groups.values()):
        return None
    # the order: every other step, each group right before the step at its place
    order: list[list[int]] = []
    for i in range(len(steps)):
        if i in groups:
            order.append(groups[i])
        if i not in member:
            order.append([i])
    if len(steps) in groups:
        order.append(groups[len(steps)])
    # who reads what, in the new order
    units: list[_Unit] = []
    for idx in order:
        if len(idx) == 1:
            units.append(_Unit(idx, _reads(steps[idx[0]]),
                               [s for s in steps[idx[0]].outs if s >= 0]))
            continue
        produced = {s for i in idx for s in steps[i].outs if s >= 0}
        reads = []
        for i in idx:
            reads.extend(s for s in _reads(steps[i]) if s not in produced and s not in reads)
        units.append(_Unit(idx, reads, sorted(produced)))
    read_outside: dict[int, set] = {}
    for u, unit in enumerate(units):
        for s in unit.reads:
            read_outside.setdefault(s, set()).add(u)
    fast: list[FastStep] = []
    last_use: dict[int, int] = {}
    for u, (idx, reads, produced) in enumerate(units):
        if len(idx) == 1:
            fast.append(FastStep.of_step(steps[idx[0]]))
        else:
            members = [steps[i] for i in idx]
            ext_out = tuple(s for s in produced
                            if any(v != u for v in read_outside.get(s, ())) or s in keep_slots)
            shape_keyed = []
            for s in reads:
                only_shape = all(
                    facts(m.node.op_type, m.node.domain).shape_only
                    for m in members if s in m.ins)
                shape_keyed.append(only_shape)
            ext = [k for k, s in enumerate(reads) if s not in const_slots]
            seg = ShapeSegment(members, tuple(reads[k] for k in ext), ext_out,
                               tuple(shape_keyed[k] for k in ext),
                               tuple(reads[k] in derived for k in ext),
                               {s: constants[s] for s in reads if s in const_slots})
            fast.append(FastStep.of_segment(seg))
            reads = list(seg.ext_in)
        for s in reads:
            last_use[s] = len(fast) - 1
    frees: list[list[int]] = [[] for _ in fast]
    for s, u in last_use.items():
        if s not in keep_slots:
            frees[u].append(s)
    for u, fs in enumerate(fast):   # outputs nobody reads are freed right away
        for s in fs.outs:
            if s >= 0 and s not in last_use and s not in keep_slots:
                frees[u].append(s)
    for fs, fr in zip(fast, frees):
        fs.free = tuple(fr)
    return fast
