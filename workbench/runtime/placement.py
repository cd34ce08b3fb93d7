"""Device placement: what of a device plan lives and runs on the host, and device failures.

A Plan built for a CUDA device keeps its data on the device, with two kinds of *host values*
(numpy arrays in host memory), named for why they are there:

- **host shape values** (``Plan.host_shape_values``; the graph inputs among them are
  ``Plan.host_shape_inputs``, fed as numpy): the outputs of Shape/Size, small integer constants
  and integer graph inputs read only as shapes, and what the cheap integer ops compute from
  them. They are found when the plan is built (:func:`plan_host_values`) from the ops'
  registered facts: ``host_read_inputs`` (input positions a kernel reads as Python numbers:
  the ``shape`` of Reshape, the ``axes`` of Unsqueeze, ...) and ``host_shape_math`` (cheap
  integer arithmetic run on the host when every input is a host value: Gather, Concat,
  Unsqueeze, Add, ...). A step computing them has ``Step.shape_on_host`` set; every step
  knows its ``Step.host_read_inputs``, which it reads without a device-to-host copy.
- **host-dtype values**: values of dtypes cupy cannot hold (bfloat16, float8, float4, int4,
  int2 -- the ml_dtypes types -- and strings). A node that reads or produces one runs on the
  host (its other inputs copied there, its outputs of GPU dtypes copied back); it is found on
  its first run and remembered in ``Step.host_dtype``.

Nothing else is copied between host and device during a run. Feeds must already live on the
plan's device (:func:`check_feed_device`), and an out-of-memory failure on the device becomes a
``DeviceError`` naming the device, the node and the bytes requested (:func:`oom_error`).
"""

from __future__ import annotations

import dataclasses
import re

import numpy as np

from workbench.arrays import device_dtype_ok, is_array, to_numpy
from workbench.errors import DeviceError
from workbench.ops.registry import facts

#: integer constants up to this many elements may stay on the host
HOST_CONST_MAX = 64
_INT_TYPES = frozenset({2, 3, 4, 5, 6, 7, 12, 13})  # TensorProto (u)int8..64


# --------------------------------------------------------------------------- planning
def plan_host_values(graph, nodes, steps) -> tuple[frozenset, frozenset]:
    """``(host_shape_values, host_shape_inputs)`` of a device plan over ``nodes`` (the kept
    nodes of ``graph``, in order, one per step of ``steps``); marks the steps that compute
    them (``shape_on_host``) and gives every step its ``host_read_inputs``.

    A candidate constant that some device kernel reads as data (not at one of its
    ``host_read_inputs``) goes to the device; a host value that a device kernel needs as data
    is uploaded when it is used."""
    consumers: dict[str, list] = {}
    for n in nodes:
        for k, i in enumerate(n.inputs):
            if i:
                consumers.setdefault(i, []).append((n, k))

    def small_int(arr) -> bool:
        a = np.asarray(arr) if not is_array(arr) else arr
        return a.dtype.kind in "iu" and a.size <= HOST_CONST_MAX

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
            elif (f.host_shape_math and not n.subgraphs
                  and any(n.inputs) and all(i in host for i in n.inputs if i)):
                host.update(o for o in n.outputs if o)
                host_nodes.add(id(n))
        bad = set()
        for name in cand:
            for n, k in consumers.get(name, ()):
                if id(n) not in host_nodes and \
                        k not in facts(n.op_type, n.domain).host_read_inputs:
                    bad.add(name)
                    break
        if not bad:
            break
        cand -= bad
    for st in steps:
        n = st.node
        if id(n) in host_nodes:
            st.shape_on_host = True
        st.host_read_inputs = frozenset(facts(n.op_type, n.domain).host_read_inputs)
    return frozenset(host), frozenset(v.name for v in graph.inputs if v.name in host)


# --------------------------------------------------------------------------- feeds
def _array_place(v):
    """(kind, index) of where an array lives: ("CPU", 0) or ("CUDA", n); None for non-arrays."""
    if isinstance(v, np.ndarray) or isinstance(v, np.generic):
        return ("CPU", 0)
    dev = getattr(v, "device", None)
    if is_array(v) and dev is not None:
        return ("CUDA", int(getattr(dev, "id", 0)))
    return None


def check_feed_device(device, name: str, v) -> None:
    """Feeds must already live on the plan's device (they move only when asked); values of
    dtypes the device cannot hold (bfloat16, float8, strings, ...) live on the host."""
    items = v if isinstance(v, list) else [v]
    for a in items:
        place = _array_place(a)
        if place is None or place == (device.kind, device.index):
            continue
        if device.is_cuda and host_dtype_value(a):
            continue
        where = "CPU" if place[0] == "CPU" else f"CUDA:{place[1]}"
        raise DeviceError(
            f"input {name!r} is on {where} but the plan runs on {device}; arrays of two devices "
            f"cannot be mixed in one run: move the input with device.put(array) (or "
            f"Tensor.to_device) first")


def host_dtype_value(a) -> bool:
    """A value that must live on the host in a device plan (a numpy array of a dtype cupy lacks,
    or a sequence holding one)."""
    if isinstance(a, list):
        return any(host_dtype_value(x) for x in a)
    return isinstance(a, (np.ndarray, np.generic)) and not device_dtype_ok(a.dtype)


# --------------------------------------------------------------------------- running a step
def _is_dtype_refusal(e: BaseException) -> bool:
    """cupy (or a kernel) refusing a dtype it cannot hold on the device."""
    if getattr(e, "host_dtype", False):
        return True
    text = str(e)
    return isinstance(e, (ValueError, TypeError)) and (
        "Unsupported dtype" in text or "Unsupported type" in text or "has no device" in text)


def run_device_step(step, args: list, kw: dict, xp):
    """Run one step of a device plan: on the device (host values it reads as data uploaded),
    as a host shape computation (``step.shape_on_host``), or on the host when the node reads
    or produces a value of a dtype the device cannot hold (remembered in ``step.host_dtype``)."""
    if step.shape_on_host:
        return _run_shape_on_host(step, args, kw)
    if not step.host_dtype:
        mixed = False
        for i, a in enumerate(args):
            if type(a) is np.ndarray:
                if not device_dtype_ok(a.dtype):
                    break
                mixed = True
                if i not in step.host_read_inputs:
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
        step.host_dtype = True
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
    kw = dict(kw)
    kw["ctx"] = dataclasses.replace(ctx, extra={k: v for k, v in ctx.extra.items()
                                                if k != "xp"})
    return kw


def _run_shape_on_host(step, args: list, kw: dict):
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


def _run_on_host(step, args: list, kw: dict, xp):
    def down(a):
        if isinstance(a, list):
            return [down(x) for x in a]
        return a if a is None or isinstance(a, (np.ndarray, np.generic)) else to_numpy(a)

    r = step.fn(*[down(a) for a in args], **_host_kw(kw))
    if type(r) is tuple:
        return tuple(_to_device(v, xp) for v in r)
    return _to_device(r, xp)


# --------------------------------------------------------------------------- memory
# cupy's out-of-memory exception types (filled lazily; tests may add their own)
_OOM_TYPES: list = []


def is_oom(e: BaseException) -> bool:
    """A device (cupy, cuBLAS, cuDNN, CUDA runtime) allocation failure."""
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


def oom_error(e: BaseException, device, node_name: str | None, op_type: str) -> DeviceError:
    """The ``DeviceError`` for an out-of-memory failure ``e`` of a node on ``device``."""
    size = getattr(e, "_size", None)
    if size is None:
        m = re.search(r"allocating ([\d,]+) bytes", str(e))
        size = int(m.group(1).replace(",", "")) if m else None
    req = f"{size:,} bytes" if size is not None else "an unknown number of bytes"
    where = str(device) if device is not None else "the GPU"
    err = DeviceError(
        f"out of memory on {where} in node {node_name!r} ({op_type}): it requested {req} "
        f"({e}); use a smaller batch, free other arrays, or run on the CPU")
    err.bytes_requested = size
    err.node_name = node_name
    err.device = where
    return err


def pool_sampler(device):
    """A zero-argument function returning the bytes in use on ``device`` (None on the CPU)."""
    if device is None or not device.is_cuda:
        return None
    pool = device.xp.get_default_memory_pool()
    return pool.used_bytes
