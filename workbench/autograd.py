"""Autograd: one primitive (:func:`apply`), a tape of ONNX nodes, and :func:`backward`.

Every differentiable computation goes through :func:`apply`, which runs the registered ONNX
kernel (``workbench.ops``) on the Tensors' arrays and records a :class:`TapeNode` holding the
op type, domain, opset and attributes: every tape node *is* an ONNX node. Backward applies the
per-op gradient rules of ``workbench.grad``; export (``sonnx.to_onnx``) is a plain walk back
from the output Tensors over the same nodes.

Recording, and the choice made for export
-----------------------------------------
The *structure* of every op is recorded always (a small node object: op, attributes, links to
the parent nodes or leaf Tensors, output shapes/dtypes); a node does not keep its inputs'
arrays, so intermediate arrays are freed as usual. That is what lets ``to_onnx`` export a
forward run in eval mode in which nothing requires a gradient (the SINGA page's
``y = model.forward(x); sonnx.to_onnx([x], [y])``). Arrays for the backward pass are saved only
when some input requires a gradient and gradients are enabled (not inside :func:`no_grad`).
:func:`inference_mode` switches recording off entirely (fastest; its results cannot be exported).

Training mode is explicit: ``model.train()`` / ``model.eval()`` (or ``training=`` in the
functions below); there is no global ``autograd.training`` flag.

Gradients: ``backward(loss)`` walks the tape in reverse topological order, accumulates the
gradients, stores them on the leaf Tensors that require one (``t.grad``, replaced - not
accumulated - by each backward), frees the saved arrays, and returns the list of
``(leaf, grad)`` pairs, so SINGA's ``for p, g in autograd.backward(loss)`` works.

>>> from workbench import tensor, autograd
>>> import numpy as np
>>> w = tensor.Tensor(data=np.array([1.0, -2.0], np.float32), requires_grad=True,
...                   stores_grad=True)
>>> loss = autograd.reduce_sum(autograd.relu(w) * 3.0)
>>> [g.numpy().tolist() for _, g in autograd.backward(loss)]
[[3.0, 0.0]]
"""

from __future__ import annotations

import builtins
import contextlib
import contextvars
import itertools
import math
from collections.abc import Callable, Sequence

import numpy as np

from workbench import device as _device
from workbench import grad as _grad
from workbench.arrays import cupy_module, is_array, xp_of
from workbench.arrays import to_numpy as _arr_to_numpy
from workbench.errors import (
    DeviceError,
    GradientError,
    InputError,
    KernelError,
    ShapeError,
    WorkbenchError,
)
from workbench.ops.registry import (
    NodeContext,
    _norm_domain,
    attribute_defaults,
    facts,
    lookup,
)

#: opset of the nodes that layers and the functions below record (ai.onnx domain)
DEFAULT_OPSET = 17

_grad_enabled = contextvars.ContextVar("workbench_grad_enabled", default=True)
_recording = contextvars.ContextVar("workbench_recording", default=True)
_node_ids = itertools.count()
_OPSET13 = DEFAULT_OPSET if DEFAULT_OPSET >= 13 else 13


# --------------------------------------------------------------------------- Tensor
def _device_of_array(a):
    cp = cupy_module()
    if cp is not None and isinstance(a, cp.ndarray):
        return _device.Device("CUDA", a.device.id)
    return _device.create_cpu()


class Tensor:
    """An n-d array on a device, with autograd bookkeeping.

    ``Tensor(shape=None, device=None, dtype=None, data=None, requires_grad=False,
    stores_grad=False, creator=None, name=None)`` - SINGA's positional order. With ``data``
    (numpy/cupy array, list or scalar) the Tensor wraps a copy on ``device`` keeping the
    array's dtype (lists/scalars take ``dtype``, float32 by default); otherwise it is filled
    with zeros of ``shape`` and ``dtype``.
    """

    __array_priority__ = 1000  # numpy_array + Tensor -> Tensor.__radd__

    def __init__(self, shape=None, device=None, dtype=None, data=None, requires_grad=False,
                 stores_grad=False, creator=None, name=None):
        if data is not None:
            if isinstance(data, Tensor):
                data = data.data
            if not is_array(data):
                data = np.asarray(data, dtype=np.dtype(dtype) if dtype is not None else None)
                if dtype is None and data.dtype == np.float64:
                    data = data.astype(np.float32)
            elif dtype is not None and data.dtype != np.dtype(dtype):
                data = data.astype(np.dtype(dtype))
            if shape is not None and tuple(shape) != tuple(data.shape):
                if int(np.prod(shape)) != data.size:
                    raise InputError(f"Tensor: data of shape {list(data.shape)} does not fit "
                                     f"shape {list(shape)}")
                data = data.reshape(tuple(shape))
            dev = device if device is not None else _device_of_array(data)
            src = data
            data = dev.put(data)
            if data is src:  # never alias the caller's array
                data = data.copy()
        else:
            dev = device if device is not None else _device.get_default_device()
            shape = () if shape is None else tuple(int(d) for d in shape)
            data = dev.xp.zeros(shape, dtype=np.dtype(dtype) if dtype is not None else np.float32)
        self.data = data
        self.device = dev
        self.requires_grad = bool(requires_grad)
        self.stores_grad = bool(stores_grad)
        self.creator = creator
        self._index = 0
        self.grad = None
        self.name = name

    @classmethod
    def _make(cls, data, device, requires_grad, creator, index, name):
        """Wrap an array without copying or checking (used by apply)."""
        t = cls.__new__(cls)
        t.data = data
        t.device = device
        t.requires_grad = requires_grad
        t.stores_grad = False
        t.creator = creator
        t._index = index
        t.grad = None
        t.name = name
        return t

    # ------------------------------------------------------------------ properties
    @property
    def shape(self) -> tuple:
        return tuple(self.data.shape)

    @property
    def dtype(self):
        return self.data.dtype

    def ndim(self) -> int:
        return self.data.ndim

    def size(self) -> int:
        return int(self.data.size)

    def memsize(self) -> int:
        return int(self.data.nbytes)

    def is_empty(self) -> bool:
        return self.size() == 0

    def is_leaf(self) -> bool:
        return self.creator is None

    def __len__(self) -> int:
        return self.shape[0] if self.shape else 0

    def __repr__(self) -> str:
        extra = ", requires_grad=True" if self.requires_grad else ""
        name = f", name={self.name!r}" if self.name else ""
        return (f"Tensor(shape={list(self.shape)}, dtype={self.dtype}, device={self.device}"
                f"{extra}{name})")

    def __array__(self, dtype=None, copy=None):
        a = self.numpy()
        return a if dtype is None else a.astype(dtype)

    # ------------------------------------------------------------------ conversion
    def numpy(self) -> np.ndarray:
        """A numpy copy on the host (a view for CPU tensors)."""
        return _arr_to_numpy(self.data)

    def item(self):
        return self.numpy().item()

    def to_device(self, device) -> Tensor:
        """Move this Tensor's data to ``device`` in place (SINGA semantics); returns self."""
        device = _device.get_device(device)
        if device != self.device:
            self.data = device.put(self.data)
            self.device = device
        return self

    def to_host(self) -> Tensor:
        return self.to_device(_device.create_cpu())

    def clone(self) -> Tensor:
        """A new leaf Tensor with a copy of the data (no tape link)."""
        t = Tensor._make(self.data.copy(), self.device, self.requires_grad, None, 0, self.name)
        t.stores_grad = self.stores_grad
        return t

    copy = clone

    def detach(self) -> Tensor:
        """A leaf sharing the data, cut from the tape."""
        return Tensor._make(self.data, self.device, False, None, 0, self.name)

    def copy_from_numpy(self, arr, offset: int = 0) -> None:
        arr = np.asarray(arr)
        if arr.size != self.size():
            raise InputError(f"copy_from_numpy: {arr.size} values for a tensor of "
                             f"{self.size()} elements")
        self.data = self.device.put(arr.astype(self.dtype, copy=False).reshape(self.shape))

    def copy_data(self, t: Tensor) -> None:
        self.copy_from_numpy(t.numpy())

    def set_value(self, x) -> Tensor:
        xp = self.device.xp
        self.data = xp.full(self.shape, x, dtype=self.dtype)
        return self

    def gaussian(self, mean: float = 0.0, std: float = 1.0) -> Tensor:
        a = _device.host_rng().normal(mean, std, size=self.shape).astype(self.dtype)
        self.data = self.device.put(a)
        return self

    def uniform(self, low: float = 0.0, high: float = 1.0) -> Tensor:
        a = _device.host_rng().uniform(low, high, size=self.shape).astype(self.dtype)
        self.data = self.device.put(a)
        return self

    def bernoulli(self, p: float) -> Tensor:
        a = (_device.host_rng().random(self.shape) < p).astype(self.dtype)
        self.data = self.device.put(a)
        return self

    def as_type(self, dtype) -> Tensor:
        return cast(self, dtype)

    astype = as_type

    # ------------------------------------------------------------------ shape ops
    def reshape(self, shape) -> Tensor:
        if isinstance(shape, int):
            shape = (shape,)
        return reshape(self, shape)

    def transpose(self, axes=None) -> Tensor:
        return transpose(self, axes)

    @property
    def T(self) -> Tensor:  # noqa: N802
        return self.transpose()

    def flatten(self, axis: int = 1) -> Tensor:
        return flatten(self, axis)

    def sum(self, axis=None, keepdims: bool = False) -> Tensor:
        return reduce_sum(self, axis, int(keepdims))

    def mean(self, axis=None, keepdims: bool = False) -> Tensor:
        return reduce_mean(self, axis, int(keepdims))

    def l1(self) -> float:
        return float(builtins.abs(self.numpy()).mean())

    def l2(self) -> float:
        a = self.numpy().astype(np.float64)
        return float(np.sqrt((a * a).sum()) / builtins.max(a.size, 1))

    def __getitem__(self, key) -> Tensor:
        """Basic indexing (ints, slices with steps, ``None``, ``...``) as Slice/Squeeze/
        Unsqueeze nodes."""
        if not isinstance(key, tuple):
            key = (key,)
        if any(k is Ellipsis for k in key):
            i = key.index(Ellipsis)
            fill = self.ndim() - (len(key) - 1 - len([k for k in key if k is None]))
            key = key[:i] + (builtins.slice(None),) * fill + key[i + 1:]
        starts, ends, axes, steps, drop, newaxes = [], [], [], [], [], []
        dim = 0
        out_dim = 0
        for k in key:
            if k is None:
                newaxes.append(out_dim)
                out_dim += 1
                continue
            if isinstance(k, (int, np.integer)):
                n = self.shape[dim]
                k = int(k)
                if not -n <= k < n:
                    raise IndexError(f"index {k} is out of range for axis {dim} of size {n}")
                k %= n
                starts.append(k), ends.append(k + 1), axes.append(dim), steps.append(1)
                drop.append(dim)
            elif isinstance(k, builtins.slice):
                if k != builtins.slice(None):
                    st = 1 if k.step is None else int(k.step)
                    big = np.iinfo(np.int64).max
                    s = (0 if st > 0 else -1) if k.start is None else int(k.start)
                    e = (big if st > 0 else -big) if k.stop is None else int(k.stop)
                    starts.append(s), ends.append(e), axes.append(dim), steps.append(st)
                out_dim += 1
            else:
                raise InputError(f"Tensor indexing supports ints, slices, None and ..., got "
                                 f"{type(k).__name__}")
            dim += 1
        out = self
        if axes:
            out = slice(out, starts, ends, axes, steps)
        if drop:
            out = squeeze(out, drop)
        if newaxes:
            out = unsqueeze(out, newaxes)
        return out

    # ------------------------------------------------------------------ arithmetic
    def _bin(self, op, other, reverse=False):
        other = other if isinstance(other, Tensor) else as_tensor(other, like=self)
        a, b = (other, self) if reverse else (self, other)
        return apply(op, [a, b])

    def __add__(self, o):
        return self._bin("Add", o)

    def __radd__(self, o):
        return self._bin("Add", o, True)

    def __sub__(self, o):
        return self._bin("Sub", o)

    def __rsub__(self, o):
        return self._bin("Sub", o, True)

    def __mul__(self, o):
        return self._bin("Mul", o)

    def __rmul__(self, o):
        return self._bin("Mul", o, True)

    def __truediv__(self, o):
        return self._bin("Div", o)

    def __rtruediv__(self, o):
        return self._bin("Div", o, True)

    def __pow__(self, o):
        return self._bin("Pow", o)

    def __rpow__(self, o):
        return self._bin("Pow", o, True)

    def __matmul__(self, o):
        return self._bin("MatMul", o)

    def __rmatmul__(self, o):
        return self._bin("MatMul", o, True)

    def __neg__(self):
        return negative(self)

    def __abs__(self):
        return abs(self)

    def __lt__(self, o):
        return self._bin("Less", o)

    def __le__(self, o):
        return self._bin("LessOrEqual", o)

    def __gt__(self, o):
        return self._bin("Greater", o)

    def __ge__(self, o):
        return self._bin("GreaterOrEqual", o)

    __hash__ = object.__hash__


class PlaceHolder(Tensor):
    """A Tensor of zeros that stands for a model input (``model.compile``, ``to_onnx``)."""

    def __init__(self, shape, device=None, dtype=np.float32, name=None):
        super().__init__(shape, device, dtype, name=name)


def as_tensor(x, like: Tensor | None = None) -> Tensor:
    """``x`` as a Tensor: Tensors pass through; arrays and scalars become constant leaves on
    ``like``'s device (a Python float takes ``like``'s float dtype, a Python int stays int64
    unless ``like`` is a float tensor)."""
    if isinstance(x, Tensor):
        return x
    dev = like.device if like is not None else None
    if is_array(x):
        arr = x
    elif isinstance(x, (bool, np.bool_)):
        arr = np.asarray(x)
    elif isinstance(x, (int, float, np.number)) and like is not None:
        arr = np.asarray(x, dtype=like.dtype)
    elif isinstance(x, float):
        arr = np.asarray(x, dtype=np.float32)
    else:
        arr = np.asarray(x)
    if dev is None:
        dev = _device_of_array(arr)
    return Tensor._make(dev.put(arr), dev, False, None, 0, None)


# --------------------------------------------------------------------------- modes
@contextlib.contextmanager
def no_grad():
    """Ops record their structure (exportable) but save nothing for backward."""
    tok = _grad_enabled.set(False)
    try:
        yield
    finally:
        _grad_enabled.reset(tok)


@contextlib.contextmanager
def enable_grad():
    tok = _grad_enabled.set(True)
    try:
        yield
    finally:
        _grad_enabled.reset(tok)


@contextlib.contextmanager
def inference_mode():
    """No tape at all: fastest, but results can neither be differentiated nor exported."""
    tok = _recording.set(False)
    tok2 = _grad_enabled.set(False)
    try:
        yield
    finally:
        _grad_enabled.reset(tok2)
        _recording.reset(tok)


def is_grad_enabled() -> bool:
    return _grad_enabled.get()


def manual_seed(seed: int) -> None:
    """Seed the random source of every device in use (``Device.SetRandSeed``): Dropout masks
    in training, random ops without a ``seed`` attribute, initialisers."""
    _device.seed_all(seed)


# --------------------------------------------------------------------------- the tape
class TapeNode:
    """One recorded ONNX node.

    ``parents[i]`` is ``None`` (omitted optional input), a ``(TapeNode, output_index)`` tuple
    (the input was produced by that node) or a leaf :class:`Tensor` (a parameter, a constant,
    or a data input). ``attrs`` are the attributes as given (what export writes); ``kw`` the
    attributes merged with the spec defaults (what the kernel and the gradient rule receive).
    """

    __slots__ = ("op_type", "domain", "opset", "attrs", "kw", "fn", "wants_ctx", "parents",
                 "needs_input_grad", "n_outputs", "out_meta", "out_names", "name",
                 "requires_grad", "saved_in", "saved_out", "state_updates", "freed", "uid",
                 "training", "__weakref__")

    def __repr__(self) -> str:
        return f"TapeNode({self.name!r}, {self.op_type}, opset {self.opset})"

    def parent_meta(self, i):
        """(shape, dtype) of input ``i``."""
        p = self.parents[i]
        if p is None:
            return None
        if type(p) is tuple:
            return p[0].out_meta[p[1]]
        return tuple(p.shape), p.dtype


def _is_float(dtype) -> bool:
    return dtype.kind == "f" or dtype.name == "bfloat16"


def apply(op_type: str, inputs: Sequence, attrs: dict | None = None, *, n_outputs: int = 1,
          opset: int | None = None, domain: str = "", name: str | None = None,
          out_names: Sequence[str] | None = None, fn: Callable | None = None,
          training: bool = False, state_updates: dict | None = None):
    """Run ONNX op ``op_type`` on Tensors and record it on the tape.

    ``inputs``: Tensors, ``None`` for omitted optional inputs, or arrays / Python scalars (made
    constant Tensors; a Python float takes the dtype of the first float input). ``attrs``: the
    node's attributes (spec defaults of ``opset`` are filled in). ``fn`` overrides the kernel
    (used for the training-mode forms of BatchNormalization and Dropout). ``state_updates``
    ``{output_index: Tensor}`` copies that output into the Tensor after the run (running
    statistics). Returns a Tensor, or a tuple of ``n_outputs`` Tensors.
    """
    domain = _norm_domain(domain)
    if opset is None:
        opset = DEFAULT_OPSET if domain == "" else 1
    attrs = {} if attrs is None else attrs
    wants_ctx = False
    if fn is None:
        on_cuda = any(isinstance(t, Tensor) and t.device.is_cuda for t in inputs)
        entry = lookup(op_type, domain, opset, name, xp="cupy" if on_cuda else None)
        fn, wants_ctx = entry.fn, entry.wants_ctx
    kw = attribute_defaults(op_type, domain, opset)
    if attrs:
        kw = {**kw, **attrs}
    outs = run_op(op_type, domain, opset, fn, wants_ctx, kw, attrs, inputs, n_outputs, name,
                  out_names, training, state_updates)
    return outs[0] if n_outputs == 1 else tuple(outs)


def _tensors_of(inputs: Sequence) -> list:
    ref = None
    for x in inputs:
        if isinstance(x, Tensor):
            ref = x
            break
    out = []
    for x in inputs:
        if x is None or isinstance(x, Tensor):
            out.append(x)
        else:
            out.append(as_tensor(x, like=ref))
    return out


def run_op(op_type: str, domain: str, opset: int, fn: Callable, wants_ctx: bool, kw: dict,
           attrs: dict, inputs: Sequence, n_outputs: int, name: str | None,
           out_names: Sequence[str] | None, training: bool = False,
           state_updates: dict | None = None, device=None) -> list:
    """The engine of :func:`apply` with the kernel and merged attributes already resolved
    (``SONNXModel`` calls it directly with a Plan step's prepared kernel). Returns a list.
    ``device``: where an op without Tensor inputs (Constant, RandomNormal, ...) runs; the
    default device when None."""
    ts = _tensors_of(inputs)
    dev = None
    first = None
    arrays = []
    any_grad = False
    for k, t in enumerate(ts):
        if t is None:
            arrays.append(None)
            continue
        if dev is None:
            dev, first = t.device, k
        elif t.device is not dev and t.device != dev:
            def who(i, tt):
                return f"input {i}" + (f" ({tt.name!r})" if tt.name else "")
            raise DeviceError(
                f"{op_type}{f' (node {name!r})' if name else ''}: inputs live on different "
                f"devices: {who(first, ts[first])} on {dev}, {who(k, t)} on {t.device}; "
                f"move them to one device with Tensor.to_device(dev)")
        arrays.append(t.data)
        if t.requires_grad:
            any_grad = True
    if dev is None:
        if device is None:
            from workbench import device as _device
            device = _device.get_default_device()
        dev = device
    try:
        if wants_ctx:
            ctx = NodeContext(name or op_type, op_type, opset, n_outputs,
                              tuple(out_names or ()), training, dev.rng,
                              extra={"xp": dev.xp} if dev.is_cuda else {})
            r = fn(*arrays, **kw, ctx=ctx)
        else:
            r = fn(*arrays, **kw)
    except WorkbenchError as e:
        if name and not getattr(e, "_located", False):
            e.args = (f"node {name!r} ({op_type}): {e}",) + e.args[1:]
            e._located = True
        raise
    except Exception as e:
        shapes = ", ".join("None" if a is None else f"{a.dtype}{list(a.shape)}"
                           if is_array(a) else type(a).__name__ for a in arrays)
        raise KernelError(f"{op_type}{f' (node {name!r})' if name else ''} failed: "
                          f"{type(e).__name__}: {e}; inputs: {shapes}", node_name=name,
                          op_type=op_type) from e
    if type(r) is not tuple:
        r = (r,)
    if len(r) < n_outputs:
        raise KernelError(f"{op_type}{f' (node {name!r})' if name else ''}: the kernel "
                          f"returned {len(r)} output(s), {n_outputs} were asked for",
                          node_name=name, op_type=op_type)
    extra = r[n_outputs:]  # training forms may return statistics for their gradient rule
    r = [np.asarray(a) if isinstance(a, np.generic) else a for a in r[:n_outputs]]

    recording = _recording.get()
    grad_on = any_grad and recording and _grad_enabled.get()
    node = None
    if recording:
        node = TapeNode()
        node.op_type, node.domain, node.opset = op_type, domain, opset
        node.attrs, node.kw, node.fn, node.wants_ctx = attrs, kw, fn, wants_ctx
        node.n_outputs = n_outputs
        node.uid = next(_node_ids)
        node.name = name or f"{op_type}_{node.uid}"
        node.out_names = out_names
        node.training = training
        parents = []
        for t in ts:
            if t is None:
                parents.append(None)
            elif t.creator is not None:
                parents.append((t.creator, t._index))
            else:
                parents.append(t)
        node.parents = parents
        node.out_meta = [(tuple(a.shape), a.dtype) if is_array(a) else (None, None)
                         for a in r]
        node.requires_grad = grad_on
        node.state_updates = state_updates
        node.freed = False
        if grad_on:
            node.needs_input_grad = tuple(t is not None and t.requires_grad for t in ts)
            node.saved_in = arrays
            node.saved_out = r + list(extra) if extra else r
        else:
            node.needs_input_grad = None
            node.saved_in = node.saved_out = None
    outs = []
    names = out_names or ()
    for i, a in enumerate(r):
        rg = grad_on and is_array(a) and _is_float(a.dtype)
        t = Tensor._make(a, dev, rg, node, i, names[i] if i < len(names) else None)
        if node is None:
            t._untraced = True
        outs.append(t)
    if state_updates:
        for i, st in state_updates.items():
            st.data = r[i]
    return outs


# --------------------------------------------------------------------------- the Tensor runner
class TapeRunner:
    """Runs the steps of a ``graph.executor.Plan`` on Tensors (``plan.execute(xs,
    runner=TapeRunner(device, training))``): every node through :func:`run_op`, so the tape
    records it. In training mode an op's registered training form (``@kernel(...,
    train=True)``: BatchNormalization with batch statistics, Dropout with a mask) replaces its
    kernel, and the outputs its ``state_outputs`` name are written back into the stateful
    inputs (running statistics held by buffers). A recorded tape replayed in graph mode uses
    the same runner with each step's call given by :meth:`preset`.
    """

    def __init__(self, device=None, training: bool = False):
        self.device = device
        self.training = training
        self._calls: dict[int, tuple] = {}

    def preset(self, step, *, kw: dict, wants_ctx: bool, n_outputs: int, fn: Callable,
               training: bool, state_updates: dict | None, out_names=None) -> None:
        """Give ``step`` a fixed call (a replayed tape node)."""
        self._calls[id(step)] = (kw, wants_ctx, n_outputs, fn, (), training, state_updates,
                                 out_names)

    def _prepare(self, step) -> tuple:
        n = step.node
        kw = dict(step.attrs)
        wants_ctx = kw.pop("ctx", None) is not None
        n_out = 1
        for i, o in enumerate(n.outputs):
            if o:
                n_out = i + 1
        fn, state = step.fn, ()
        if self.training:
            xp = "cupy" if self.device is not None and self.device.is_cuda else None
            form = _grad.train_form(n.op_type, n.domain, step.opset, xp=xp)
            if form is not None:
                fn, wants_ctx = form.fn, form.wants_ctx
                state = facts(n.op_type, n.domain).state_outputs
                for o, _ in state:
                    n_out = builtins.max(n_out, o + 1)
        call = (kw, wants_ctx, n_out, fn, state, self.training, None, tuple(n.outputs))
        self._calls[id(step)] = call
        return call

    def __call__(self, step, args: list, kw: dict) -> tuple:
        call = self._calls.get(id(step))
        if call is None:
            call = self._prepare(step)
        kw0, wants_ctx, n_out, fn, state, training, ups, out_names = call
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
        return tuple(run_op(n.op_type, n.domain, step.opset, fn, wants_ctx, kw, n.attrs, args,
                            n_out, n.name, out_names, training, ups, device=self.device))

    def bind(self, plan, scope: dict) -> Callable:
        """A subgraph body over arrays (control flow is run, not differentiated)."""
        arrays = {k: (v.data if isinstance(v, Tensor) else v) for k, v in scope.items()}

        def body(*inputs):
            return plan.run_positional(inputs, arrays)

        body.plan = plan
        return body


# --------------------------------------------------------------------------- walking the tape
def tape_order(outputs: Sequence[Tensor], stop: set | None = None,
               only_grad: bool = False) -> list[TapeNode]:
    """Tape nodes the ``outputs`` depend on, in topological order (parents first).

    ``stop`` is a set of ``(id(node), index)`` edges not to walk through (inputs given as
    intermediate Tensors). ``only_grad`` follows only nodes that require a gradient.
    """
    stop = stop or set()
    order: list[TapeNode] = []
    seen: set = set()
    for out in outputs:
        root = out.creator
        if root is None or id(root) in seen or (id(root), out._index) in stop:
            continue
        if only_grad and not root.requires_grad:
            continue
        seen.add(id(root))
        stack = [(root, iter(root.parents))]
        while stack:
            node, it = stack[-1]
            for p in it:
                if type(p) is not tuple:
                    continue
                pn = p[0]
                if id(pn) in seen or (id(pn), p[1]) in stop:
                    continue
                if only_grad and not pn.requires_grad:
                    continue
                seen.add(id(pn))
                stack.append((pn, iter(pn.parents)))
                break
            else:
                stack.pop()
                order.append(node)
    return order


# --------------------------------------------------------------------------- backward
def backward(y: Tensor, dy=None, *, retain_graph: bool = False) -> list:
    """Back-propagate from ``y``; returns ``[(leaf Tensor, grad Tensor), ...]``.

    ``dy`` defaults to ones of ``y``'s shape (a scalar loss gives the usual gradient). Each leaf
    Tensor that requires a gradient gets ``.grad`` set. The saved arrays are freed unless
    ``retain_graph``; a second backward through freed nodes raises :class:`GradientError`.
    """
    if not isinstance(y, Tensor):
        raise InputError(f"backward() needs a Tensor, got {type(y).__name__}")
    if y.creator is None or not y.requires_grad:
        raise GradientError(
            "backward(): the loss does not depend on any Tensor that requires a gradient "
            "(all parameters frozen, computed inside no_grad()/inference_mode() or by a model "
            "compiled with is_train=False and not switched to model.train(), or the loss is "
            "a constant)")
    xp = xp_of(y.data)
    if dy is None:
        g0 = xp.ones(y.shape, dtype=y.dtype)
    else:
        g0 = dy.data if isinstance(dy, Tensor) else xp.asarray(dy, dtype=y.dtype)
        if g0.shape != tuple(y.shape):
            g0 = xp.broadcast_to(g0, y.shape)
    grads: dict = {(id(y.creator), y._index): g0}
    leaf: dict = {}
    order = tape_order([y], only_grad=True)
    for node in reversed(order):
        gouts = [grads.pop((id(node), i), None) for i in range(node.n_outputs)]
        if all(g is None for g in gouts):
            continue
        if node.saved_in is None:
            raise GradientError(
                f"node {node.name!r} ({node.op_type}): its saved arrays were freed by an earlier "
                f"backward(); run the forward again (or pass retain_graph=True)")
        gins = _run_rule(node, gouts)
        needs = node.needs_input_grad
        for i, p in enumerate(node.parents):
            if p is None or i >= len(gins) or not needs[i]:
                continue
            g = gins[i]
            if g is None:
                continue
            if type(p) is tuple:
                shape, dtype = p[0].out_meta[p[1]]
                key = (id(p[0]), p[1])
            else:
                shape, dtype = tuple(p.shape), p.dtype
                key = None
            if tuple(g.shape) != shape:
                raise GradientError(
                    f"node {node.name!r} ({node.op_type}): the gradient rule returned shape "
                    f"{list(g.shape)} for input {i}, which has shape {list(shape)}")
            if g.dtype != dtype:
                g = g.astype(dtype)
            if key is None:
                prev = leaf.get(id(p))
                leaf[id(p)] = (p, g if prev is None else prev[1] + g)
            else:
                prev = grads.get(key)
                grads[key] = g if prev is None else prev + g
        if not retain_graph:
            node.saved_in = node.saved_out = None
            node.freed = True
    out = []
    for t, g in leaf.values():
        gt = Tensor._make(g, t.device, False, None, 0, None)
        t.grad = gt
        out.append((t, gt))
    return out


def _run_rule(node: TapeNode, gouts: list) -> tuple:
    xp = xp_of(*[a for a in node.saved_in if a is not None])
    rule = _grad.rule_for(node.op_type, node.domain, xp=xp)   # the device's override first
    if rule is None:
        dom = node.domain or "ai.onnx"
        raise GradientError(
            f"node {node.name!r} ({dom}::{node.op_type}, opset {node.opset}) has no gradient "
            f"rule, but a gradient flows through it to a trainable parameter; freeze the "
            f"parameters before it (Tensor.requires_grad = False / model.freeze()), cut the "
            f"model before it, or add a rule with @workbench.grad.gradient({node.op_type!r})")
    ctx = _grad.GradContext(node.op_type, node.opset, node.needs_input_grad, xp, node.name,
                            node.n_outputs)
    kw = node.kw
    if node.training:
        kw = dict(kw)
        kw["training"] = True
    try:
        gins = rule(ctx, gouts, node.saved_in, node.saved_out, **kw)
    except GradientError:
        raise
    except Exception as e:
        raise GradientError(f"node {node.name!r} ({node.op_type}): gradient rule failed: "
                            f"{type(e).__name__}: {e}") from e
    return tuple(gins) if gins is not None else ()


def gradients(y: Tensor, dy=None) -> dict:
    """``{leaf Tensor: grad Tensor}`` for every leaf requiring a gradient (SINGA's API)."""
    return dict(backward(y, dy))


# --------------------------------------------------------------------------- functional API
# SINGA names; each records ONNX ops. Unary/binary helpers first.
def _unary(op: str, x, **attrs):
    return apply(op, [x], attrs or None)


def relu(x):
    return _unary("Relu", x)


def sigmoid(x):
    return _unary("Sigmoid", x)


def tanh(x):
    return _unary("Tanh", x)


def exp(x):
    return _unary("Exp", x)


def log(x):
    return _unary("Log", x)


def sqrt(x):
    return _unary("Sqrt", x)


def abs(x):  # noqa: A001 - SINGA's name
    return _unary("Abs", x)


def erf(x):
    return _unary("Erf", x)


def sin(x):
    return _unary("Sin", x)


def cos(x):
    return _unary("Cos", x)


def negative(x):
    return _unary("Neg", x)


def reciprocal(x):
    return _unary("Reciprocal", x)


def softplus(x):
    return _unary("Softplus", x)


def softsign(x):
    return _unary("Softsign", x)


def leakyrelu(x, a: float = 0.01):
    return _unary("LeakyRelu", x, alpha=float(a))


def elu(x, alpha: float = 1.0):
    return _unary("Elu", x, alpha=float(alpha))


def selu(x, alpha: float = 1.67326, gamma: float = 1.0507):
    return _unary("Selu", x, alpha=float(alpha), gamma=float(gamma))


def hardsigmoid(x, alpha: float = 0.2, gamma: float = 0.5):
    return _unary("HardSigmoid", x, alpha=float(alpha), beta=float(gamma))


def gelu(x, approximate: str = "none"):
    """GELU composed of primitives (exportable at any opset >= 9):
    ``0.5 * x * (1 + erf(x / sqrt(2)))``, or the tanh approximation."""
    if approximate == "tanh":
        inner = (x + x * x * x * 0.044715) * math.sqrt(2.0 / math.pi)
        return x * 0.5 * (tanh(inner) + 1.0)
    return x * 0.5 * (erf(x * (1.0 / math.sqrt(2.0))) + 1.0)


def add(a, b):
    return apply("Add", [a, b])


def sub(a, b):
    return apply("Sub", [a, b])


def mul(a, b):
    return apply("Mul", [a, b])


def div(a, b):
    return apply("Div", [a, b])


def pow(a, b):  # noqa: A001 - SINGA's name
    return apply("Pow", [a, b])


def matmul(a, b):
    return apply("MatMul", [a, b])


def gemm(a, b, c=None, alpha: float = 1.0, beta: float = 1.0, transA: int = 0,  # noqa: N803
         transB: int = 0):
    attrs = {}
    if alpha != 1.0:
        attrs["alpha"] = float(alpha)
    if beta != 1.0:
        attrs["beta"] = float(beta)
    if transA:
        attrs["transA"] = 1
    if transB:
        attrs["transB"] = 1
    return apply("Gemm", [a, b, c], attrs)


def add_bias(x, b, axis: int = 0):
    """SINGA's add_bias: ``x + b`` with ``b`` broadcast along ``axis`` (0: rows, 1: columns)."""
    if axis == 0:
        return add(x, b)
    return add(x, reshape(b, (-1, 1)))


def clip(x, min=None, max=None):  # noqa: A002 - SINGA's names
    lo = None if min is None else as_tensor(np.asarray(min), like=x)
    hi = None if max is None else as_tensor(np.asarray(max), like=x)
    return apply("Clip", [x, lo, hi])


def _axes_tensor(axes, x):
    return as_tensor(np.asarray(axes if isinstance(axes, (list, tuple)) else [axes],
                                dtype=np.int64), like=x)


def reshape(x, shape):
    return apply("Reshape", [x, as_tensor(np.asarray(list(shape), dtype=np.int64), like=x)])


def flatten(x, axis: int = 1):
    return apply("Flatten", [x], {"axis": int(axis)})


def transpose(x, shape=None):
    """Permute axes (SINGA calls the permutation ``shape``); reversed axes by default."""
    attrs = {} if shape is None else {"perm": [int(a) for a in shape]}
    return apply("Transpose", [x], attrs)


def squeeze(x, axis=None):
    return apply("Squeeze", [x, None if axis is None else _axes_tensor(axis, x)])


def unsqueeze(x, axis):
    return apply("Unsqueeze", [x, _axes_tensor(axis, x)])


def cat(xs, axis: int = 0):
    return apply("Concat", list(xs), {"axis": int(axis)})


concat = cat


def split(x, axis: int, parts):
    """Split ``x`` along ``axis`` into pieces of the sizes in ``parts`` (a list)."""
    parts = [int(p) for p in parts]
    sizes = as_tensor(np.asarray(parts, dtype=np.int64), like=x)
    return list(apply("Split", [x, sizes], {"axis": int(axis)}, n_outputs=len(parts))) \
        if len(parts) > 1 else [apply("Split", [x, sizes], {"axis": int(axis)})]


def gather(x, axis: int, indices):
    idx = indices if isinstance(indices, Tensor) else as_tensor(
        np.asarray(indices, dtype=np.int64), like=x)
    return apply("Gather", [x, idx], {"axis": int(axis)})


def slice(x, starts, ends, axes=None, steps=None):  # noqa: A001 - SINGA's name
    def c(v):
        return None if v is None else as_tensor(np.asarray(list(v), dtype=np.int64), like=x)
    return apply("Slice", [x, c(starts), c(ends), c(axes), c(steps)])


def expand(x, shape):
    return apply("Expand", [x, as_tensor(np.asarray(list(shape), dtype=np.int64), like=x)])


def tile(x, repeats):
    return apply("Tile", [x, as_tensor(np.asarray(list(repeats), dtype=np.int64), like=x)])


def pad(x, mode: str = "constant", pads=(), constant=0.0):
    return apply("Pad", [x, as_tensor(np.asarray(list(pads), dtype=np.int64), like=x),
                         as_tensor(np.asarray(constant), like=x)], {"mode": mode})


def where(x, y, condition):
    """SINGA's argument order: ``where(x, y, condition)`` = ``condition ? x : y``."""
    return apply("Where", [condition, x, y])


def cast(x, to):
    from workbench.arrays.dtypes import onnx_dtype_of_np
    return apply("Cast", [x], {"to": int(onnx_dtype_of_np(np.dtype(to)))})


def identity(x):
    return apply("Identity", [x])


def reduce_sum(x, axes=None, keepdims: int = 0):
    ax = None if axes is None else _axes_tensor(axes, x)
    return apply("ReduceSum", [x, ax], {"keepdims": int(keepdims)})


def reduce_mean(x, axes=None, keepdims: int = 0):
    attrs = {"keepdims": int(keepdims)}
    if axes is not None:
        attrs["axes"] = list(axes) if isinstance(axes, (list, tuple)) else [int(axes)]
    return apply("ReduceMean", [x], attrs)


def reduce_max(x, axes=None, keepdims: int = 0):
    attrs = {"keepdims": int(keepdims)}
    if axes is not None:
        attrs["axes"] = list(axes) if isinstance(axes, (list, tuple)) else [int(axes)]
    return apply("ReduceMax", [x], attrs)


def sum(*xs):  # noqa: A001 - SINGA's name (variadic element-wise Sum)
    return apply("Sum", list(xs))


def mean(*xs):
    return apply("Mean", list(xs))


def max(*xs):  # noqa: A001
    return apply("Max", list(xs))


def min(*xs):  # noqa: A001
    return apply("Min", list(xs))


def softmax(x, axis: int = 1):
    return apply("Softmax", [x], {"axis": int(axis)})


def log_softmax(x, axis: int = 1):
    return apply("LogSoftmax", [x], {"axis": int(axis)})


def layer_norm(x, scale, bias=None, axis: int = -1, epsilon: float = 1e-5):
    return apply("LayerNormalization", [x, scale, bias],
                 {"axis": int(axis), "epsilon": float(epsilon)})


def dropout(x, ratio: float = 0.5, training: bool = True):
    """Inverted dropout; identity outside training (a Dropout node either way)."""
    r = as_tensor(np.asarray(ratio, dtype=x.dtype), like=x)
    if not training or ratio == 0.0:
        return apply("Dropout", [x, r], opset=_OPSET13)
    mode = as_tensor(np.asarray(True), like=x)
    return apply("Dropout", [x, r, mode], n_outputs=2, opset=_OPSET13,
                 fn=_train_fn("Dropout", _OPSET13, x), training=True)[0]


def _train_fn(op_type: str, opset: int, x: Tensor) -> Callable:
    """The registered training form of ``op_type`` for ``x``'s device."""
    return _grad.train_form(op_type, "", opset, xp="cupy" if x.device.is_cuda else None).fn


def batch_norm(x, scale, bias, running_mean, running_var, *, momentum: float = 0.9,
               epsilon: float = 1e-5, training: bool = False):
    """BatchNormalization; in training it normalises with the batch statistics and updates
    ``running_mean``/``running_var`` in place (ONNX: ``running = running * momentum + batch *
    (1 - momentum)``, biased batch variance)."""
    attrs = {"epsilon": float(epsilon), "momentum": float(momentum)}
    if not training:
        return apply("BatchNormalization", [x, scale, bias, running_mean, running_var], attrs,
                     opset=15)
    attrs["training_mode"] = 1
    return apply("BatchNormalization", [x, scale, bias, running_mean, running_var], attrs,
                 opset=15, n_outputs=3, fn=_train_fn("BatchNormalization", 15, x), training=True,
                 state_updates={1: running_mean, 2: running_var})[0]


def conv2d(x, W, b=None, stride=1, padding=0, dilation=1, group: int = 1):
    """2-D convolution (an ONNX Conv node); ``padding``/``stride``/``dilation`` int or pair."""
    def pair(v):
        return [int(v), int(v)] if isinstance(v, (int, np.integer)) else [int(a) for a in v]
    ph, pw = pair(padding)
    attrs = {"strides": pair(stride), "dilations": pair(dilation), "group": int(group),
             "pads": [ph, pw, ph, pw], "kernel_shape": list(W.shape[2:])}
    return apply("Conv", [x, W, b], attrs)


# --------------------------------------------------------------------------- losses
def _labels(t, n: int, c: int, op: str, like=None):
    """(kind, Tensor) for labels: ('index', int tensor of shape (N,)) or ('onehot', float).
    Labels given as arrays go to the device of ``like`` (the scores)."""
    if not isinstance(t, Tensor):
        t = as_tensor(np.asarray(t) if not is_array(t) else t, like=like)
    shape, dtype = tuple(t.shape), t.dtype
    if dtype.kind in "iu":
        if shape == (n, 1):
            t = reshape(t, (n,))
            shape = (n,)
        if shape != (n,):
            raise ShapeError(f"{op}: integer labels must have shape ({n},) (one class index per "
                             f"row of the ({n}, {c}) scores), got {list(shape)}")
        data = t.data
        if data.size and (int(data.min()) < 0 or int(data.max()) >= c):
            raise InputError(f"{op}: class indices must lie in [0, {c - 1}] for {c} classes, "
                             f"got values in [{int(data.min())}, {int(data.max())}]")
        if dtype not in (np.int32, np.int64):
            t = cast(t, np.int64)
        return "index", t
    if _is_float(dtype):
        if shape != (n, c):
            hint = (" (float labels of shape (N,) look like class indices: convert them with "
                    ".astype(np.int64))" if shape == (n,) else "")
            raise ShapeError(f"{op}: one-hot/probability labels must have the scores' shape "
                             f"({n}, {c}), got {list(shape)}{hint}")
        return "onehot", t
    raise InputError(f"{op}: labels must be integer class indices or float one-hot rows, got "
                     f"dtype {dtype}")


def softmax_cross_entropy(x, t):
    """Mean cross-entropy of logits ``x`` (N, C) against ``t``: int class indices (N,) or
    one-hot / probability rows (N, C). Records SoftmaxCrossEntropyLoss (indices) or
    LogSoftmax/Mul/ReduceSum/ReduceMean (one-hot)."""
    if x.ndim() != 2:
        raise ShapeError(f"softmax_cross_entropy: scores must be 2-D (N, C), got shape "
                         f"{list(x.shape)}; flatten them first")
    n, c = x.shape
    kind, t = _labels(t, n, c, "softmax_cross_entropy", like=x)
    if kind == "index":
        return apply("SoftmaxCrossEntropyLoss", [x, t], {"reduction": "mean"},
                     opset=_OPSET13)
    if t.dtype != x.dtype:
        t = cast(t, x.dtype)
    logp = log_softmax(x, 1)
    return negative(reduce_mean(reduce_sum(logp * t, [1]), None))


def cross_entropy(y, t):
    """SINGA's CrossEntropy: ``-sum(t * log(y)) / N`` for probabilities ``y`` (N, C)."""
    n, c = y.shape
    kind, t = _labels(t, n, c, "cross_entropy", like=y)
    if kind == "index":
        onehot = np.zeros((n, c), dtype=y.dtype)
        onehot[np.arange(n), np.asarray(t.numpy())] = 1
        t = Tensor(device=y.device, data=onehot)
    return negative(reduce_sum(log(y) * t)) * (1.0 / n)


def mse_loss(x, t):
    """SINGA's MeanSquareError: ``sum((x - t)^2) / (2 * N)`` with N = ``x.shape[0]``."""
    if not isinstance(t, Tensor):
        t = as_tensor(np.asarray(t, dtype=x.dtype), like=x)
    if tuple(t.shape) != tuple(x.shape):
        raise ShapeError(f"mse_loss: target shape {list(t.shape)} differs from the prediction's "
                         f"{list(x.shape)}")
    d = x - t
    return reduce_sum(d * d) * (1.0 / (2.0 * x.shape[0]))


def nll_loss(logp, t):
    """Mean negative log-likelihood of log-probabilities (N, C) and int labels (N,)."""
    n, c = logp.shape
    kind, t = _labels(t, n, c, "nll_loss", like=logp)
    if kind != "index":
        raise InputError("nll_loss: labels must be integer class indices")
    return apply("NegativeLogLikelihoodLoss", [logp, t], {"reduction": "mean"},
                 opset=_OPSET13)


def binary_cross_entropy(x, t):
    """Mean binary cross-entropy of probabilities ``x`` and targets ``t`` (same shape)."""
    if not isinstance(t, Tensor):
        t = as_tensor(np.asarray(t, dtype=x.dtype), like=x)
    eps = 1e-7
    xc = clip(x, eps, 1.0 - eps)
    return negative(reduce_mean(t * log(xc) + (1.0 - t) * log(1.0 - xc), None))


__all__ = [n for n in dir() if not n.startswith("_") and n not in (
    "annotations", "contextlib", "contextvars", "itertools", "math", "np", "Any", "Callable",
    "Sequence")]
