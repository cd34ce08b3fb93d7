"""The tape: :class:`Tensor`, one recording primitive (:func:`apply` / :func:`run_op`) and the
:class:`TapeNode`s it records.

Every differentiable computation goes through :func:`run_op` (:func:`apply` looks the kernel
up first), which runs the registered ONNX kernel (``workbench.ops``) on the Tensors' arrays
and records a :class:`TapeNode` holding the op type, domain, opset and attributes: every tape
node *is* an ONNX node. ``workbench.autodiff.backprop.backward`` applies the per-op gradient
rules of ``workbench.autodiff.rules`` over the tape; ``workbench.autodiff.export.to_onnx`` is a
plain walk back from the output Tensors over the same nodes;
``workbench.autodiff.runner.TapeRunner`` runs a Plan's steps through :func:`run_op`.

Recording, and the choice made for export
-----------------------------------------
The *structure* of every op is recorded always (a small node object: op, attributes, links to
the parent nodes or leaf Tensors, output shapes/dtypes); a node does not keep its inputs'
arrays, so intermediate arrays are freed as usual. That is what lets ``to_onnx`` export a
forward run in eval mode in which nothing requires a gradient. Arrays for the backward pass
are saved only when some input requires a gradient and gradients are enabled (not inside
:func:`no_grad`), or, for every recorded op, while :func:`set_save_all` is on (a backward of
single nodes after the fact, on data that requires no gradient: SINGA's
``y.creator.backward(dy)``; ``workbench.singa.autograd.training`` switches it).
:func:`inference_mode` switches recording off entirely (fastest; its results cannot be
exported).

A Tensor's methods and operators keep SINGA's semantics where its programs depend on them
(an int index keeps its axis, an int Tensor with a Python float gives float32, ``t += x`` is
in place, ``a == b`` of two Tensors is identity); SINGA's module-level functions are
``workbench.singa.autograd`` and ``workbench.singa.tensor``.

>>> import numpy as np
>>> from workbench.autodiff import Tensor, backward
>>> w = Tensor(data=np.array([1.0, -2.0], np.float32), requires_grad=True, stores_grad=True)
>>> loss = ((w * w) * 3.0).sum()
>>> [g.numpy().tolist() for _, g in backward(loss)]
[[6.0, -12.0]]
"""

from __future__ import annotations

import contextlib
import contextvars
import itertools
from collections.abc import Callable, Sequence

import numpy as np

from workbench.arrays import is_array
from workbench.arrays import to_numpy as _arr_to_numpy
from workbench.arrays.device import (
    cpu,
    default_device,
    device_of_array,
    get_device,
    host_rng,
)
from workbench.arrays.dtypes import onnx_dtype_of_np
from workbench.errors import (
    DeviceError,
    InputError,
    KernelError,
    ShapeError,
)
from workbench.ops.registry import (
    NodeContext,
    _norm_domain,
    attribute_defaults,
    lookup,
)
from workbench.runtime.errors import node_error

#: opset of the ai.onnx nodes recorded by :func:`apply` without an explicit ``opset``
DEFAULT_OPSET = 17

_grad_enabled = contextvars.ContextVar("workbench_grad_enabled", default=True)
_recording = contextvars.ContextVar("workbench_recording", default=True)
_node_ids = itertools.count()

# --------------------------------------------------------------------------- settings
#: save every recorded op's arrays for its backward, even where no input requires a gradient
#: (read by run_op; see :func:`set_save_all`)
_save_all = False


def set_save_all(on: bool) -> bool:
    """Whether every op recorded from now on also saves the arrays its own backward needs
    when none of its inputs requires a gradient (so a node can be differentiated alone after
    the fact, e.g. ``y.creator.backward(dy)`` in SINGA's API). Off by default: only ops with
    an input requiring a gradient save arrays. Inside :func:`no_grad` / :func:`inference_mode`
    nothing is saved either way. Returns the previous setting. SINGA's global flag
    ``workbench.singa.autograd.training`` sets it."""
    global _save_all
    previous, _save_all = _save_all, bool(on)
    return previous


def save_all_enabled() -> bool:
    """The current :func:`set_save_all` setting."""
    return _save_all


@contextlib.contextmanager
def saving_all(on: bool = True):
    """:func:`set_save_all` for the duration of a ``with`` block."""
    previous = set_save_all(on)
    try:
        yield
    finally:
        set_save_all(previous)


def next_node_id() -> int:
    """A fresh node number: every node recorded after this call has a larger ``uid`` (a front
    end finds the nodes one of its calls recorded this way)."""
    return next(_node_ids)
# --------------------------------------------------------------------------- Tensor
class Tensor:
    """An n-d array on a device, with autograd bookkeeping.

    ``Tensor(shape=None, device=None, dtype=None, data=None, requires_grad=False,
    stores_grad=False, creator=None, name=None)`` - SINGA's positional order. With ``data``
    (numpy/cupy array, list or scalar) the Tensor wraps a copy on ``device`` keeping the
    array's dtype (lists/scalars take ``dtype``, float32 by default); otherwise it is filled
    with zeros of ``shape`` and ``dtype``.
    """

    __array_priority__ = 1000  # numpy_array + Tensor -> Tensor.__radd__
    _const = False             # True for the constants as_tensor makes (attributes as inputs)

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
            dev = device if device is not None else device_of_array(data)
            src = data
            data = dev.put(data)
            if data is src:  # never alias the caller's array
                data = data.copy()
        else:
            dev = device if device is not None else default_device()
            shape = () if shape is None else tuple(int(d) for d in shape)
            data = dev.xp.zeros(shape, dtype=np.dtype(dtype) if dtype is not None else np.float32)
        self.data = data
        self.device = dev
        self.requires_grad = bool(requires_grad)
        self._stores_grad = bool(stores_grad)
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
        t._stores_grad = False
        t.creator = creator
        t._index = index
        t.grad = None
        t.name = name
        return t

    # ------------------------------------------------------------------ properties
    @property
    def stores_grad(self) -> bool:
        """A parameter: exported as an initializer, its gradient returned by ``backward``.
        Setting it True also sets ``requires_grad`` (SINGA's code marks parameters so)."""
        return self._stores_grad

    @stores_grad.setter
    def stores_grad(self, value) -> None:
        self._stores_grad = bool(value)
        if value:
            self.requires_grad = True

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
        device = get_device(device)
        if device != self.device:
            self.data = device.put(self.data)
            self.device = device
        return self

    def to_host(self) -> Tensor:
        return self.to_device(cpu())

    def clone(self) -> Tensor:
        """A new leaf Tensor with a copy of the data (no tape link)."""
        t = Tensor._make(self.data.copy(), self.device, self.requires_grad, None, 0, self.name)
        t._stores_grad = self._stores_grad
        return t

    def deepcopy(self) -> Tensor:
        """A new Tensor with a copy of the data (SINGA's ``deepcopy``; same as ``clone``)."""
        return self.clone()

    def copy(self) -> Tensor:
        """SINGA's shallow copy: a new Tensor object sharing this one's array (in-place
        operators on either show in both); ``clone``/``deepcopy`` copy the data."""
        t = Tensor._make(self.data, self.device, self.requires_grad, None, 0, self.name)
        t._stores_grad = self._stores_grad
        return t

    def copy_from(self, t, offset: int = 0) -> None:
        """Copy the values of a Tensor or numpy array into this one (SINGA's)."""
        a = t.numpy() if isinstance(t, Tensor) else np.asarray(t)
        if offset:
            flat = self.numpy().reshape(-1).copy()
            flat[offset:offset + a.size] = a.reshape(-1)
            a = flat
        self.copy_from_numpy(a)

    def reset_like(self, t) -> None:
        """Take ``t``'s shape, device and dtype (zeros; SINGA's ``reset_like``)."""
        self.device = t.device
        self.data = t.device.xp.zeros(t.shape, dtype=t.dtype)

    def to_type(self, dtype) -> Tensor:
        """Change this Tensor's dtype in place (SINGA's ``to_type``); returns self."""
        self.data = self.data.astype(parse_dtype(dtype))
        return self

    def _rowcol(self, v, op: str, axis: int) -> None:
        if self.ndim() != 2:
            raise ShapeError(f"{op}: needs a 2-d Tensor, got shape {list(self.shape)}")
        vv = v.data if isinstance(v, Tensor) else self.device.xp.asarray(v)
        vv = vv.reshape((-1, 1) if axis == 1 else (1, -1)).astype(self.dtype)
        fn = {"add": self.device.xp.add, "mult": self.device.xp.multiply,
              "div": self.device.xp.divide}[op.split("_")[0]]
        self.data = fn(self.data, vv)

    def add_column(self, v) -> None:
        """SINGA's deprecated in-place row/column helpers (``v`` broadcast over columns or
        rows): ``add_column``, ``add_row``, ``mult_column``, ``mult_row``, ``div_column``,
        ``div_row``."""
        self._rowcol(v, "add_column", 1)

    def add_row(self, v) -> None:
        self._rowcol(v, "add_row", 0)

    def mult_column(self, v) -> None:
        self._rowcol(v, "mult_column", 1)

    def mult_row(self, v) -> None:
        self._rowcol(v, "mult_row", 0)

    def div_column(self, v) -> None:
        self._rowcol(v, "div_column", 1)

    def div_row(self, v) -> None:
        self._rowcol(v, "div_row", 0)

    def is_dummy(self) -> bool:
        """False: SINGA's ``Dummy`` placeholder operators do not exist here."""
        return False

    def is_transpose(self) -> bool:
        """False: arrays here are never lazily transposed (SINGA's C++ strides can be)."""
        return False

    def contiguous(self) -> Tensor:
        return self.clone()

    def repeat(self, repeats, axis=None) -> Tensor:
        """``numpy.repeat`` (SINGA's ``Tensor.repeat``): each element ``repeats`` times along
        ``axis`` (the flattened tensor for None); an op without a gradient rule."""
        xp = self.device.xp
        reps = repeats if isinstance(repeats, (int, np.integer)) else list(repeats)
        return Tensor._make(xp.repeat(self.data, reps, axis=axis), self.device, False, None,
                            0, None)

    def __round__(self, ndigits=None):
        """``round(t)``: the one value rounded as Python rounds (numpy's half to even)."""
        if self.size() != 1:
            raise InputError(f"round(): needs a one-element Tensor, got shape "
                             f"{list(self.shape)}")
        v = self.numpy().reshape(()).item()
        return round(v) if ndigits is None else round(v, ndigits)

    def __float__(self) -> float:
        if self.size() != 1:
            raise InputError(f"float(): needs a one-element Tensor, got shape "
                             f"{list(self.shape)}")
        return float(self.numpy().reshape(()).item())

    def __int__(self) -> int:
        if self.size() != 1:
            raise InputError(f"int(): needs a one-element Tensor, got shape "
                             f"{list(self.shape)}")
        return int(self.numpy().reshape(()).item())

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
        a = host_rng().normal(mean, std, size=self.shape).astype(self.dtype)
        self.data = self.device.put(a)
        return self

    def uniform(self, low: float = 0.0, high: float = 1.0) -> Tensor:
        a = host_rng().uniform(low, high, size=self.shape).astype(self.dtype)
        self.data = self.device.put(a)
        return self

    def bernoulli(self, p: float) -> Tensor:
        a = (host_rng().random(self.shape) < p).astype(self.dtype)
        self.data = self.device.put(a)
        return self

    def as_type(self, dtype) -> Tensor:
        """A cast copy (a Cast node). ``dtype``: a numpy dtype, or SINGA's names ``'int'``
        (int32), ``'float'`` (float32) and type codes 0 (float32), 1 (float16), 2 (int32)."""
        return _cast(self, parse_dtype(dtype))

    astype = as_type

    # ------------------------------------------------------------------ shape ops
    def reshape(self, shape) -> Tensor:
        if isinstance(shape, int):
            shape = (shape,)
        return apply("Reshape", [self, _int64s(shape, self)])

    def transpose(self, axes=None) -> Tensor:
        """Permute the axes (reversed by default): a Transpose node."""
        return apply("Transpose", [self], {} if axes is None else {"perm": [int(a) for a in axes]})

    @property
    def T(self) -> Tensor:  # noqa: N802
        return self.transpose()

    def flatten(self, axis: int = 1) -> Tensor:
        return apply("Flatten", [self], {"axis": int(axis)})

    def sum(self, axis=None, keepdims: bool = False) -> Tensor:
        """Sum over ``axis`` (an int, a list, or None for all): a ReduceSum node."""
        axes = None if axis is None else _int64s(axis if isinstance(axis, (list, tuple))
                                                  else [axis], self)
        return apply("ReduceSum", [self, axes], {"keepdims": int(keepdims)})

    def mean(self, axis=None, keepdims: bool = False) -> Tensor:
        """Mean over ``axis`` (an int, a list, or None for all): a ReduceMean node."""
        attrs = {"keepdims": int(keepdims)}
        if axis is not None:
            attrs["axes"] = list(axis) if isinstance(axis, (list, tuple)) else [int(axis)]
        return apply("ReduceMean", [self], attrs)

    def l1(self) -> float:
        return float(np.abs(self.numpy()).mean())

    def l2(self) -> float:
        a = self.numpy().astype(np.float64)
        return float(np.sqrt((a * a).sum()) / max(a.size, 1))

    def __getitem__(self, key) -> Tensor:
        """Basic indexing (ints, slices with steps, ``None``, ``...``) as Slice/Unsqueeze
        nodes. An int index keeps its axis with size 1 (SINGA's rule: ``t[-1, :]`` of a
        [T, V] Tensor is [1, V]); squeeze it away with ``autograd.squeeze(y, axis)`` where
        numpy's rule is wanted."""
        if not isinstance(key, tuple):
            key = (key,)
        if any(k is Ellipsis for k in key):
            i = key.index(Ellipsis)
            fill = self.ndim() - (len(key) - 1 - len([k for k in key if k is None]))
            key = key[:i] + (slice(None),) * fill + key[i + 1:]
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
            elif isinstance(k, slice):
                if k != slice(None):
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
            out = apply("Slice", [out, _int64s(starts, out), _int64s(ends, out),
                                  _int64s(axes, out), _int64s(steps, out)])
        if newaxes:  # output positions, ascending: one ONNX Unsqueeze
            out = apply("Unsqueeze", [out, _int64s(newaxes, out)])
        return out

    # ------------------------------------------------------------------ arithmetic
    def _bin(self, op, other, reverse=False):
        me = self
        if not isinstance(other, Tensor):
            if isinstance(other, (float, np.floating)) and me.dtype.kind in "iub":
                me = _cast(me, np.float32)  # SINGA's rule: an int tensor and a float give float32
            other = as_tensor(other, like=me)
        a, b = (other, me) if reverse else (me, other)
        return apply(op, [a, b])

    def _inplace(self, op, other):
        """SINGA's in-place operators: the array changes in place (every Tensor sharing it,
        ``copy()``, sees it); nothing is recorded. A Tensor saved by a recorded op for its
        backward should not be changed before that backward runs."""
        with inference_mode():
            r = self._bin(op, other)  # the same kernel and broadcasting as the operator
        if r.dtype == self.dtype and tuple(r.shape) == tuple(self.shape):
            try:
                self.data[...] = r.data
                return self
            except ValueError:  # a read-only view (a broadcast result): rebind instead
                pass
        self.data = r.data
        return self

    def __iadd__(self, o):
        return self._inplace("Add", o)

    def __isub__(self, o):
        return self._inplace("Sub", o)

    def __imul__(self, o):
        return self._inplace("Mul", o)

    def __itruediv__(self, o):
        return self._inplace("Div", o)

    def __eq__(self, o):
        """Element-wise ``==`` against a number or array (SINGA's); against another Tensor it
        is identity, as for any Python object (Tensors are dict keys and list members): use
        ``autograd.equal(a, b)`` / ``tensor.eq(a, b)`` for element-wise."""
        if isinstance(o, Tensor) or o is None:
            return self is o
        return self._bin("Equal", o)

    def __ne__(self, o):
        if isinstance(o, Tensor) or o is None:
            return self is not o
        return apply("Not", [self._bin("Equal", o)])

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
        return apply("Neg", [self])

    def __abs__(self):
        return apply("Abs", [self])

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


#: SINGA's dtype names and type codes (``core.proto``: kFloat32 0, kFloat16 1, kInt 2), which
#: ``Tensor.as_type`` / ``to_type`` accept beside numpy dtypes
_SINGA_DTYPES = {"int": np.int32, "float": np.float32, "singa.kInt": np.int32,
                 "singa.kFloat32": np.float32, 0: np.float32, 1: np.float16, 2: np.int32}


def parse_dtype(dtype) -> np.dtype:
    """A numpy dtype from a numpy dtype (or its name) or SINGA's ``'int'``, ``'float'`` and
    type codes 0 (float32), 1 (float16), 2 (int32)."""
    if isinstance(dtype, (str, int)) and not isinstance(dtype, bool) and \
            dtype in _SINGA_DTYPES:
        return np.dtype(_SINGA_DTYPES[dtype])
    try:
        return np.dtype(dtype)
    except TypeError:
        raise InputError(f"unknown dtype {dtype!r}: give a numpy dtype or one of SINGA's "
                         f"'int', 'float', 0 (float32), 1 (float16), 2 (int32)") from None


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
        dev = device_of_array(arr)
    t = Tensor._make(dev.put(arr), dev, False, None, 0, None)
    t._const = True
    return t


def _int64s(values, like: Tensor) -> Tensor | None:
    """A constant int64 vector (an op's shape/axes input) on ``like``'s device; None for None."""
    if values is None:
        return None
    return as_tensor(np.asarray(list(values), dtype=np.int64), like=like)


def _cast(x: Tensor, dtype) -> Tensor:
    return apply("Cast", [x], {"to": int(onnx_dtype_of_np(np.dtype(dtype)))})


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


# --------------------------------------------------------------------------- the tape
class TapeNode:
    """One recorded ONNX node.

    ``parents[i]`` is ``None`` (omitted optional input), a ``(TapeNode, output_index)`` tuple
    (the input was produced by that node) or a leaf :class:`Tensor` (a parameter, a constant,
    or a data input). ``attrs`` are the attributes as given (what export writes); ``kw`` the
    attributes merged with the spec defaults (what the kernel and the gradient rule receive).
    ``saved_in`` / ``saved_out`` hold the arrays the gradient rule needs (None when nothing
    was saved, or after a backward freed them); ``training_mode`` says the op ran in training
    mode (``NodeContext.training``; its rule is then called with ``training=True``);
    ``state_updates`` ``{output index: Tensor}`` the running statistics the run wrote back.
    ``origin`` is free for a front end to mark the nodes one of its calls recorded (SINGA's
    operator classes keep their call there); the engine never reads it. ``grad_rule``, when
    not None, replaces the op's registered gradient rule for this node (same signature; the
    fused GELU chain of a training step sets it: ``workbench.autodiff.fusion``).

    The tape creates nodes of the class given to :func:`set_node_class` (this one by
    default), so a front end may give them methods of its own.
    """

    __slots__ = ("op_type", "domain", "opset", "attrs", "kw", "fn", "wants_ctx", "parents",
                 "needs_input_grad", "n_outputs", "out_meta", "out_names", "name",
                 "requires_grad", "saved_in", "saved_out", "state_updates", "freed", "uid",
                 "training_mode", "origin", "grad_rule", "__weakref__")

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


#: the class the tape records nodes as (see set_node_class)
_node_class: type = TapeNode


def set_node_class(cls: type) -> type:
    """Record nodes as ``cls`` from now on (a subclass of :class:`TapeNode` that adds methods
    and no slots, and keeps object's identity comparison; like ``logging.setLoggerClass``).
    Returns the previous class.
    ``workbench.singa.autograd`` gives nodes SINGA's operator face (``y.creator.backward``)
    this way when it is imported."""
    global _node_class
    if not (isinstance(cls, type) and issubclass(cls, TapeNode)):
        raise TypeError(f"set_node_class: {cls!r} is not a subclass of TapeNode")
    if cls.__dict__.get("__slots__", None) != () and cls is not TapeNode:
        raise TypeError(f"set_node_class: {cls.__name__} must declare __slots__ = () (nodes "
                        f"are many and small)")
    if cls.__eq__ is not object.__eq__ or cls.__hash__ is not object.__hash__:
        raise TypeError(f"set_node_class: {cls.__name__} must keep object's __eq__ and "
                        f"__hash__ (a node is its own identity: backward keys gradients by "
                        f"(node, output index))")
    previous, _node_class = _node_class, cls
    return previous


def is_float_dtype(dtype) -> bool:
    """Whether values of ``dtype`` are differentiable: the float kinds and bfloat16."""
    # ml_dtypes' bfloat16 is kind "V"; ``dtype.name`` is Python code in numpy (~20 us a call,
    # paid for every integer output of a recorded op: Shape's)
    return dtype.kind == "f" or (dtype.kind == "V" and dtype.name == "bfloat16")


def apply(op_type: str, inputs: Sequence, attrs: dict | None = None, *, n_outputs: int = 1,
          opset: int | None = None, domain: str = "", name: str | None = None,
          out_names: Sequence[str] | None = None, fn: Callable | None = None,
          training_mode: bool = False, state_updates: dict | None = None):
    """Run ONNX op ``op_type`` on Tensors and record it on the tape.

    ``inputs``: Tensors, ``None`` for omitted optional inputs, or arrays / Python scalars (made
    constant Tensors; a Python float takes the dtype of the first float input). ``attrs``: the
    node's attributes (spec defaults of ``opset`` are filled in). ``fn`` overrides the kernel
    (the training forms of BatchNormalization and Dropout); ``training_mode`` runs the op in
    training mode (``NodeContext.training``; its gradient rule is told so). ``state_updates``
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
                  out_names, training_mode, state_updates)
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


def _device_clash(op_type, name, ts):
    """The DeviceError of inputs on different devices (run_op's slow path)."""
    first = dev = None
    for k, t in enumerate(ts):
        if t is None:
            continue
        if dev is None:
            dev, first = t.device, k
        elif t.device is not dev and t.device != dev:
            def who(i, tt):
                return f"input {i}" + (f" ({tt.name!r})" if tt.name else "")
            return DeviceError(
                f"{op_type}{f' (node {name!r})' if name else ''}: inputs live on different "
                f"devices: {who(first, ts[first])} on {dev}, {who(k, t)} on {t.device}; "
                f"move them to one device with Tensor.to_device(dev)")
    return None


def run_op(op_type: str, domain: str, opset: int, fn: Callable, wants_ctx: bool, kw: dict,
           attrs: dict, inputs: Sequence, n_outputs: int, name: str | None,
           out_names: Sequence[str] | None, training_mode: bool = False,
           state_updates: dict | None = None, device=None) -> list:
    """The engine of :func:`apply` with the kernel and merged attributes already resolved
    (the Tensor runner calls it with a Plan step's prepared kernel). Returns a list.
    ``training_mode``: run the op in training mode (``NodeContext.training``; its gradient
    rule gets ``training=True``). ``device``: where an op without Tensor inputs (Constant,
    RandomNormal, ...) runs; the default device when None."""
    # (one pass over the inputs and straight-line recording: a training step of a small
    # transformer records ~220 ops, so every microsecond here is ~0.2 ms a step)
    ts = inputs
    for t in inputs:
        if t is not None and not isinstance(t, Tensor):
            ts = _tensors_of(inputs)
            break
    dev = None
    arrays = []
    any_grad = False
    for t in ts:
        if t is None:
            arrays.append(None)
            continue
        d = t.device
        if dev is None:
            dev = d
        elif d is not dev and d != dev:
            raise _device_clash(op_type, name, ts)
        arrays.append(t.data)
        if t.requires_grad:
            any_grad = True
    if dev is None:
        dev = device if device is not None else default_device()
    try:
        if wants_ctx:
            ctx = NodeContext(name or op_type, op_type, opset, n_outputs,
                              tuple(out_names or ()), training_mode, dev.rng,
                              extra={"xp": dev.xp} if dev.is_cuda else {})
            r = fn(*arrays, **kw, ctx=ctx)
        else:
            r = fn(*arrays, **kw)
    except Exception as e:
        err = node_error(e, node_name=name, op_type=op_type, opset=opset, args=arrays,
                         device=dev if dev.is_cuda else None)
        if err is e:
            raise
        raise err from e
    if type(r) is not tuple and n_outputs == 1:   # the usual case: one array
        extra = ()
        r = [np.asarray(r) if isinstance(r, np.generic) else r]
    else:
        if type(r) is not tuple:
            r = (r,)
        if len(r) < n_outputs:
            raise KernelError(f"{op_type}{f' (node {name!r})' if name else ''}: the kernel "
                              f"returned {len(r)} output(s), {n_outputs} were asked for",
                              node_name=name, op_type=op_type)
        extra = r[n_outputs:]  # training forms may return statistics for their gradient rule
        r = [np.asarray(a) if isinstance(a, np.generic) else a for a in r[:n_outputs]]

    node = None
    grad_on = False
    if _recording.get():
        grad_enabled = _grad_enabled.get()
        grad_on = any_grad and grad_enabled
        node = _node_class()
        node.op_type, node.domain, node.opset = op_type, domain, opset
        node.attrs, node.kw, node.fn, node.wants_ctx = attrs, kw, fn, wants_ctx
        node.n_outputs = n_outputs
        uid = node.uid = next(_node_ids)
        node.name = name or f"{op_type}_{uid}"
        node.out_names = out_names
        node.training_mode = training_mode
        # (plain loops: a comprehension is a function call of its own in this Python)
        parents = []
        for t in ts:
            parents.append(t if t is None or t.creator is None else (t.creator, t._index))
        node.parents = parents
        meta = []
        for a in r:
            meta.append((a.shape, a.dtype) if type(a) is np.ndarray else
                        (tuple(a.shape), a.dtype) if is_array(a) else (None, None))
        node.out_meta = meta
        node.requires_grad = grad_on
        node.state_updates = state_updates
        node.freed = False
        node.origin = None
        node.grad_rule = None
        if grad_on or (_save_all and grad_enabled):
            needs = []
            for t in ts:
                needs.append(t is not None and t.requires_grad)
            node.needs_input_grad = tuple(needs)
            node.saved_in = arrays
            node.saved_out = r + list(extra) if extra else r
        else:
            node.needs_input_grad = None
            node.saved_in = node.saved_out = None
    outs = []
    names = out_names or ()
    new = Tensor.__new__
    i = 0
    for a in r:
        t = new(Tensor)      # Tensor._make, inlined
        t.data = a
        t.device = dev
        if grad_on and (type(a) is np.ndarray or is_array(a)):
            dt = a.dtype     # is_float_dtype, inlined
            t.requires_grad = dt.kind == "f" or (dt.kind == "V" and dt.name == "bfloat16")
        else:
            t.requires_grad = False
        t._stores_grad = False
        t.creator = node
        t._index = i
        t.grad = None
        t.name = names[i] if i < len(names) else None
        if node is None:
            t._untraced = True
        outs.append(t)
        i += 1
    if state_updates:
        for i, st in state_updates.items():
            st.data = r[i]
    return outs


# --------------------------------------------------------------------------- walking the tape

# --------------------------------------------------------------------------- walking the tape
def tape_order(outputs: Sequence[Tensor], stop: set | None = None,
               only_grad: bool = False) -> list[TapeNode]:
    """Tape nodes the ``outputs`` depend on, in topological order (parents first).

    ``stop`` is a set of ``(id(node), index)`` edges not to walk through (inputs given as
    intermediate Tensors). ``only_grad`` follows only nodes that require a gradient.
    """
    return walk_tape([(out.creator, out._index) for out in outputs], stop, only_grad)


def walk_tape(roots, stop: set | None = None, only_grad: bool = False) -> list[TapeNode]:
    """:func:`tape_order` from ``(node, output index)`` roots."""
    stop = stop or set()
    order: list[TapeNode] = []
    seen: set = set()
    for root, index in roots:
        if root is None or id(root) in seen or (id(root), index) in stop:
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
                if id(pn) in seen or (stop and (id(pn), p[1]) in stop):
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


def record_given(runner, step, call, args, value):
    """Record a runner ``step``'s node on the tape with ``value`` as its output, its real kernel
    (``call.fn``) kept as the node's ``fn`` for replays and exports: how the training fusions
    (:mod:`~workbench.autodiff.fusion`, :mod:`~workbench.autodiff.fuse_attention`) record the
    nodes they computed together."""
    n = step.node

    def given(*a, **k):
        return value
    out = run_op(n.op_type, n.domain, step.opset, given, False, call.kw, n.attrs, args,
                 1, n.name, call.out_names, call.training_mode, None, device=runner.device)[0]
    node = out.creator
    if node is not None:
        node.fn, node.wants_ctx = call.fn, call.wants_ctx
    return out
