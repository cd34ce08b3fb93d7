"""The trainable model's inference cache: ``SONNXModel.run`` at ``backend.prepare``'s speed.

``SONNXModel.run(x)`` (and ``forward`` in eval mode with recording off,
``autograd.inference_mode``) runs a plan prepared exactly as ``backend.prepare`` prepares one:
the model's graph after the inference passes with **every weight a constant** (BatchNorm
folded into the convolution weights once, weights packed once by the kernels' first run, the
shape memo and pre-bound steps kept). It is the same graph, the same nodes, the same kernels as
``backend.prepare(<the model with its current weights>)``, so the results are bit for bit those
of ``backend.prepare(...).run`` (at any BLAS thread count: both pin BLAS to one thread).

Such a plan bakes the weights in, so it may only serve a run while nothing it was built from
has changed. The check before every run is **exact** (never a sample):

* **the graph** (nodes, their inputs/outputs/attributes, the graph's inputs/outputs/
  initializer names, subgraphs): :func:`track` turns the model's graph objects into
  *tracked* ones (``Graph``/``Node``/``ValueInfo`` get a ``__setattr__`` that counts, their
  lists and dicts become list/dict subclasses whose every mutating method counts) sharing one
  :class:`Version` counter. Any edit through Python (``g.nodes.remove(n)``,
  ``n.attrs["alpha"] = 0.2``, ``n.inputs[0] = "y"``, ``n.op_type = "Relu"``,
  ``g.outputs = [...]``) moves the counter: one integer comparison per run. List-valued
  attributes (``pads``, ``perm``...) are not wrapped (kernels receive them as they are): each
  is compared with a copy every run (a few µs for a whole network).
* **every array the plan was built from** (the weights and running statistics held by the
  model's Tensors, node attribute tensors such as Constant values, subgraph initializers):
  each Tensor's ``data`` must still be the same array object with the same shape and dtype,
  and its **bytes** must equal a snapshot taken when the plan was built: a byte comparison
  (``memcmp``) of the whole of it, so any in-place write — ``t.data[0, 1] = 5``, an optimizer
  step, ``copy_from``, a raw numpy write through a reference kept from long ago — is seen.
  The model keeps its initial weights and attribute arrays in one contiguous block
  (:class:`Arena`), so the common case is ONE ``memcmp`` over that block against its
  snapshot; arrays assigned later (``t.data = new``, ``copy_from_numpy``) are compared one
  ``memcmp`` each.

Decision (measured on the project's 2-core AMD EPYC, AVX2; see ``docs/architecture.md``,
"The trainable model's inference cache"): an exact byte comparison against a snapshot rather
than a 64-bit hash of the bytes. A hash reads the bytes once instead of twice (47 MB:
~4.9-5.7 ms vs ~6.6-7.5 ms; 1 MB: ~27 vs ~50-60 µs), but it is not exact (two contents may
collide) and a hash-only check would still need the plan to hold a frozen copy of the weights
it baked in. The snapshot IS that frozen copy: the plan is built from views into it, so the
weights the passes keep as they are (a transformer's MatMul weights) cost no memory beyond what
``backend.prepare`` holds; folded ones (a conv network's Conv+BatchNorm) cost one copy of the
weights (47 MB for ResNet-18). Generation counters on Tensor mutation paths were not used: a
raw numpy write into ``t.data`` passes no Python code, so only reading the bytes is exact;
write-protecting the weights' pages (``mprotect`` + a fault handler) would make the check free
but turns ``readinto``/``np.fromfile`` into a weight into an ``EFAULT`` error and fights
Python's ``faulthandler``: rejected.

A plan is rebuilt when a check fails. After a change of the weights alone (a training step)
the run that notices it runs on the model's variable-weight inference plan instead (the
``FoldBatchNormWeights`` graph that recomputes the folded weights every run; the same numbers)
and takes a new snapshot; the plan is rebuilt on the next run that finds the weights unchanged.
So alternating training steps and evaluations never pays a prepare per step, and a steady
series of evaluations runs at ``prepare``'s speed from its second run. CUDA models keep the
variable-weight path (the check is for host arrays).
"""

from __future__ import annotations

import ctypes
import ctypes.util
from dataclasses import fields
from operator import attrgetter, is_

import numpy as np

from workbench.graph.ir import Graph, Node, ValueInfo

# --------------------------------------------------------------------------- exact compare
_ALIGN = 64


def _libc_memcmp():
    for name in (None, ctypes.util.find_library("c"), "msvcrt"):
        try:
            fn = ctypes.CDLL(name).memcmp
        except (OSError, AttributeError, TypeError):
            continue
        fn.restype = ctypes.c_int
        fn.argtypes = (ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t)
        return fn
    return None


_MEMCMP = _libc_memcmp()


def bytes_equal(a: np.ndarray, b: np.ndarray) -> bool:
    """Whether two C-contiguous arrays of the same size hold the same bytes (exact; NaN
    payloads and -0.0 compared as bytes)."""
    n = a.nbytes
    if n != b.nbytes:
        return False
    if n == 0:
        return True
    if _MEMCMP is not None:
        return _MEMCMP(a.ctypes.data, b.ctypes.data, n) == 0
    return bool(np.array_equal(a.reshape(-1).view(np.uint8), b.reshape(-1).view(np.uint8)))


def _numeric(a) -> bool:
    """A host array whose bytes are its value (numeric, C-contiguous)."""
    return isinstance(a, np.ndarray) and a.dtype.kind in "biufcmM" and a.flags.c_contiguous


class Arena:
    """One contiguous block holding many arrays (each at a 64-byte aligned offset), so that
    their bytes are compared with their snapshot in one ``memcmp``."""

    def __init__(self, arrays: list):
        offs, n = [], 0
        for a in arrays:
            n = (n + _ALIGN - 1) // _ALIGN * _ALIGN
            offs.append(n)
            n += a.nbytes
        self.buf = np.zeros(max(n, 1), dtype=np.uint8)
        self.views = []
        for a, off in zip(arrays, offs):
            v = np.ndarray(a.shape, a.dtype, self.buf, off)
            v[...] = a
            if type(a) is not np.ndarray:
                v = v.view(type(a))
            self.views.append(v)
        #: {id(view): offset}: the views are held by ``views``, so their ids stay theirs
        self._offsets = dict(zip((id(v) for v in self.views), offs))

    def holds(self, a) -> bool:
        """Whether ``a`` is one of this block's arrays (the very object)."""
        return id(a) in self._offsets


def arena_for(weights: dict, graph: Graph) -> Arena | None:
    """Copy the model's initial weights (``{name: array}``, replaced in that dict) and the
    graph's node attribute arrays (replaced in the graph) into one :class:`Arena` (a fresh
    model: nobody holds them yet)."""
    holders = []   # (dict, key)
    for k, a in weights.items():
        if _numeric(a):
            holders.append((weights, k))
    for d in _attr_dicts(graph):
        for k, a in d.items():
            if _numeric(a):
                holders.append((d, k))
    if not holders:
        return None
    arena = Arena([d[k] for d, k in holders])
    for (d, k), v in zip(holders, arena.views):
        dict.__setitem__(d, k, v)
    return arena


def _attr_dicts(graph: Graph):
    """Every dict of arrays a plan reads from ``graph`` besides its top-level initializers:
    node attribute dicts (recursively through subgraphs) and subgraph initializer dicts."""
    for n in graph.nodes:
        yield n.attrs
        for sg in n.subgraphs:
            yield sg.initializers
            yield from _attr_dicts(sg)


# --------------------------------------------------------------------------- graph tracking
class Version:
    """A counter moved by every mutation of a tracked graph."""

    __slots__ = ("n",)

    def __init__(self):
        self.n = 0


def _bump(obj) -> None:
    v = obj.__dict__.get("_wb_version")
    if v is not None:
        v.n += 1


def _counting(base_type, name):
    base = getattr(base_type, name)

    def method(self, *args, **kwargs):
        _bump(self)
        return base(self, *args, **kwargs)
    method.__name__ = name
    return method


class TrackedList(list):
    """A list that counts its mutations on a :class:`Version`."""

    for _m in ("__setitem__", "__delitem__", "__iadd__", "__imul__", "append", "extend",
               "insert", "pop", "remove", "clear", "sort", "reverse"):
        locals()[_m] = _counting(list, _m)
    del _m

    def __reduce_ex__(self, protocol):      # pickles (and deep-copies) as a plain list
        return (list, (list(self),))


class TrackedDict(dict):
    """A dict that counts its mutations on a :class:`Version`."""

    for _m in ("__setitem__", "__delitem__", "__ior__", "clear", "pop", "popitem",
               "setdefault", "update"):
        locals()[_m] = _counting(dict, _m)
    del _m

    def __reduce_ex__(self, protocol):
        return (dict, (dict(self),))


def _tracked_class(base):
    names = [f.name for f in fields(base)]

    def __setattr__(self, name, value):  # noqa: N807
        _bump(self)
        object.__setattr__(self, name, value)

    def __eq__(self, other):  # noqa: N807
        if not isinstance(other, base):
            return NotImplemented
        return all(getattr(self, k) == getattr(other, k) for k in names)

    def __reduce_ex__(self, protocol):  # noqa: N807
        return (base, tuple(getattr(self, k) for k in names))

    return type(f"Tracked{base.__name__}", (base,),
                {"__setattr__": __setattr__, "__eq__": __eq__, "__hash__": None,
                 "__reduce_ex__": __reduce_ex__, "__module__": __name__})


TrackedGraph = _tracked_class(Graph)
TrackedNode = _tracked_class(Node)
TrackedValueInfo = _tracked_class(ValueInfo)
_TRACKED = {Graph: TrackedGraph, Node: TrackedNode, ValueInfo: TrackedValueInfo}


def _adopt(obj, version: Version) -> None:
    cls = type(obj)
    if cls in _TRACKED:
        obj.__class__ = _TRACKED[cls]
    if obj.__dict__.get("_wb_version") is not version:
        object.__setattr__(obj, "_wb_version", version)


def _tracked(container, version: Version):
    if type(container) is list or type(container) is TrackedList:
        out = container if type(container) is TrackedList else TrackedList(container)
    elif isinstance(container, dict):
        out = container if type(container) is TrackedDict else TrackedDict(container)
    else:
        return container
    if out.__dict__.get("_wb_version") is not version:
        out.__dict__["_wb_version"] = version
    return out


def track(graph: Graph, version: Version) -> None:
    """Make ``graph`` (recursively) count its mutations on ``version``; idempotent. The
    objects keep their types' behaviour (``isinstance(n, Node)``; equality, pickling and
    copies as the untracked types)."""
    if type(graph) not in (Graph, TrackedGraph):
        return
    _adopt(graph, version)
    for name in ("nodes", "inputs", "outputs", "initializers", "value_info", "opsets"):
        value = getattr(graph, name)
        new = _tracked(value, version)
        if new is not value:
            object.__setattr__(graph, name, new)
    for v in list(graph.inputs) + list(graph.outputs) + list(graph.value_info.values()):
        if type(v) in (ValueInfo, TrackedValueInfo):
            _adopt(v, version)
    for n in graph.nodes:
        if type(n) not in (Node, TrackedNode):
            continue
        _adopt(n, version)
        for name in ("inputs", "outputs", "attrs"):
            value = getattr(n, name)
            new = _tracked(value, version)
            if new is not value:
                object.__setattr__(n, name, new)
        for sg in n.subgraphs:
            track(sg, version)


def tracked_by(graph, version) -> bool:
    """Whether ``graph`` counts its edits on ``version`` (a copy or a pickle of a tracked
    graph is a plain one; a graph taken from another model counts on that model's)."""
    return version is not None and getattr(graph, "__dict__", {}).get("_wb_version") is version


def list_attrs(graph: Graph) -> list:
    """``[(list, copy)]`` for every list-valued attribute (recursively): compared each run."""
    out = []
    for n in graph.nodes:
        for v in n.attrs.values():
            if isinstance(v, list) and not (v and isinstance(v[0], Graph)):
                out.append((v, list(v)))
        for sg in n.subgraphs:
            out.extend(list_attrs(sg))
    return out


# --------------------------------------------------------------------------- the snapshot
_DATA, _SHAPE, _DTYPE = attrgetter("data"), attrgetter("shape"), attrgetter("dtype")

def snapshot_budget() -> int:
    """Bytes the inference cache may spend on its snapshot of a model's weights:
    ``WORKBENCH_INFERENCE_CACHE_MB`` (default 1024; 0 = no cache), and no more than a quarter
    of ``MemAvailable`` in ``/proc/meminfo`` where that is readable."""
    import os  # noqa: PLC0415

    try:
        mb = float(os.environ.get("WORKBENCH_INFERENCE_CACHE_MB", "1024"))
    except ValueError:
        mb = 1024.0
    budget = int(max(mb, 0.0) * 2 ** 20)
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    budget = min(budget, int(line.split()[1]) * 1024 // 4)
                    break
    except (OSError, ValueError, IndexError):
        pass
    return budget


class Snapshot:
    """The exact state a cached plan was built from, and the arrays to build it from.

    ``weights``: ``{name: Tensor}``; ``arena``: the model's :class:`Arena` (or None);
    ``graph``: the (tracked) graph. :meth:`unchanged` is the per-run check."""

    def __init__(self, weights: dict, names, arena: Arena | None, graph: Graph):
        in_arena = {id(v) for v in arena.views} if arena is not None else set()
        self.arena_live = arena.buf if arena is not None else None
        self.arena_snap = arena.buf.copy() if arena is not None else None
        # the block and its copy are never resized: their addresses are taken once
        self._arena_args = None if arena is None else \
            (self.arena_live.ctypes.data, self.arena_snap.ctypes.data, self.arena_live.nbytes)
        base = self.arena_snap
        offs = arena._offsets if arena is not None else {}
        #: {id(live array): frozen array}: what the plan is built from
        self.frozen: dict[int, np.ndarray] = {}
        self.tensors = []     # (Tensor, array, shape, dtype)
        self.foreign = []     # (live, frozen) compared one by one
        for k in names:
            t = weights[k]
            self.tensors.append((t, t.data, t.data.shape, t.data.dtype))
            self._freeze(t.data, in_arena, offs, base)
        self.arrays = []      # (array, shape, dtype): attribute arrays / subgraph initializers
        for d in _attr_dicts(graph):
            for a in d.values():
                if isinstance(a, np.ndarray):
                    self.arrays.append((a, a.shape, a.dtype))
                    self._freeze(a, in_arena, offs, base)
        self.lists = list_attrs(graph)
        # the per-run identity/shape/dtype checks as C-level maps over flat lists
        self._objs = [t for t, _, _, _ in self.tensors]
        self._datas = [a for _, a, _, _ in self.tensors]
        every = self._datas + [a for a, _, _ in self.arrays]
        self._attr_arrays = [a for a, _, _ in self.arrays]
        self._shapes = [a.shape for a in every]
        self._dtypes = [a.dtype for a in every]

    def _freeze(self, a, in_arena, offs, base) -> None:
        if id(a) in self.frozen:
            return
        if id(a) in in_arena:
            f = np.ndarray(a.shape, a.dtype, base, offs[id(a)])
            if type(a) is not np.ndarray:
                f = f.view(type(a))
            f.flags.writeable = False
        else:
            f = np.array(a, copy=True, order="C")
            if type(a) is not np.ndarray:
                f = f.view(type(a))
            self.foreign.append((a, f))
        self.frozen[id(a)] = f

    def unchanged(self) -> bool:
        """True when every array still holds the bytes it held at the snapshot (exact)."""
        datas = list(map(_DATA, self._objs))
        if not all(map(is_, datas, self._datas)):
            return False
        every = datas + self._attr_arrays
        if list(map(_SHAPE, every)) != self._shapes or \
                not all(map(is_, map(_DTYPE, every), self._dtypes)):
            return False
        for lst, copy in self.lists:
            if lst != copy:
                return False
        args = self._arena_args
        if args is not None:
            if _MEMCMP is not None:
                if _MEMCMP(*args) != 0:
                    return False
            elif not bytes_equal(self.arena_live, self.arena_snap):
                return False
        for live, frozen in self.foreign:
            if live.dtype.hasobject:        # strings: the objects compared
                if not np.array_equal(live, frozen):
                    return False
            elif not bytes_equal(live if live.flags.c_contiguous
                                 else np.ascontiguousarray(live), frozen):
                return False
        return True

    def frozen_of(self, a):
        """The frozen copy of the live array ``a`` (``a`` itself if not snapshotted)."""
        return self.frozen.get(id(a), a)
