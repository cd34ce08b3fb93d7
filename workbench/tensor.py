"""Tensors (SINGA-compatible): an array (numpy on CPU, cupy on GPU) plus autograd bookkeeping.

>>> import numpy as np
>>> from workbench import tensor
>>> t = tensor.from_numpy(np.arange(6, dtype=np.float32).reshape(2, 3))
>>> (t * 2 + 1).numpy().tolist()
[[1.0, 3.0, 5.0], [7.0, 9.0, 11.0]]
>>> tensor.to_numpy(t.reshape((3, 2))).shape
(3, 2)

A Tensor has ``data`` (the array), ``device``, ``dtype``, ``shape``, ``requires_grad``,
``stores_grad`` (a parameter: exported as an initializer, returned by ``get_params``), ``grad``
(set by ``autograd.backward``), ``name`` and ``creator`` (the tape node that produced it; None
for leaves). Operators (``+ - * / @ **``, ``reshape``, ``transpose``...) record ONNX nodes
through ``autograd.apply``.

Differences from SINGA, on purpose: ``requires_grad`` defaults to False (data tensors need no
gradient; parameters are created with ``requires_grad=True, stores_grad=True``), and a Tensor
created from a numpy array keeps the array's dtype.
"""

from __future__ import annotations

import numpy as np

from workbench import device as _device
from workbench.arrays import cupy_module, is_array
from workbench.arrays import to_numpy as _arr_to_numpy
from workbench.errors import InputError

float16 = np.dtype(np.float16)
float32 = np.dtype(np.float32)
float64 = np.dtype(np.float64)
int8 = np.dtype(np.int8)
int32 = np.dtype(np.int32)
int64 = np.dtype(np.int64)
uint8 = np.dtype(np.uint8)
bool_ = np.dtype(np.bool_)

_host_rng = np.random.default_rng()


def seed(s: int) -> None:
    """Seed the generator used by ``gaussian``/``uniform``/``random`` and layer initialisers."""
    global _host_rng
    _host_rng = np.random.default_rng(s)


def host_rng():
    return _host_rng


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
            data = dev.xp.zeros(shape, dtype=np.dtype(dtype) if dtype is not None else float32)
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
        """Wrap an array without copying or checking (used by autograd.apply)."""
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
        a = _host_rng.normal(mean, std, size=self.shape).astype(self.dtype)
        self.data = self.device.put(a)
        return self

    def uniform(self, low: float = 0.0, high: float = 1.0) -> Tensor:
        a = _host_rng.uniform(low, high, size=self.shape).astype(self.dtype)
        self.data = self.device.put(a)
        return self

    def bernoulli(self, p: float) -> Tensor:
        a = (_host_rng.random(self.shape) < p).astype(self.dtype)
        self.data = self.device.put(a)
        return self

    def as_type(self, dtype) -> Tensor:
        from workbench import autograd
        return autograd.cast(self, dtype)

    astype = as_type

    # ------------------------------------------------------------------ shape ops
    def reshape(self, shape) -> Tensor:
        from workbench import autograd
        if isinstance(shape, int):
            shape = (shape,)
        return autograd.reshape(self, shape)

    def transpose(self, axes=None) -> Tensor:
        from workbench import autograd
        return autograd.transpose(self, axes)

    @property
    def T(self) -> Tensor:  # noqa: N802
        return self.transpose()

    def flatten(self, axis: int = 1) -> Tensor:
        from workbench import autograd
        return autograd.flatten(self, axis)

    def sum(self, axis=None, keepdims: bool = False) -> Tensor:
        from workbench import autograd
        return autograd.reduce_sum(self, axis, int(keepdims))

    def mean(self, axis=None, keepdims: bool = False) -> Tensor:
        from workbench import autograd
        return autograd.reduce_mean(self, axis, int(keepdims))

    def l1(self) -> float:
        return float(abs(self.numpy()).mean())

    def l2(self) -> float:
        a = self.numpy().astype(np.float64)
        return float(np.sqrt((a * a).sum()) / max(a.size, 1))

    def __getitem__(self, key) -> Tensor:
        """Basic indexing (ints, slices with steps, ``None``, ``...``) as Slice/Squeeze/
        Unsqueeze nodes."""
        from workbench import autograd
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
            out = autograd.slice(out, starts, ends, axes, steps)
        if drop:
            out = autograd.squeeze(out, drop)
        if newaxes:
            out = autograd.unsqueeze(out, newaxes)
        return out

    # ------------------------------------------------------------------ arithmetic
    def _bin(self, op, other, reverse=False):
        from workbench import autograd
        other = other if isinstance(other, Tensor) else as_tensor(other, like=self)
        a, b = (other, self) if reverse else (self, other)
        return autograd.apply(op, [a, b])

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
        from workbench import autograd
        return autograd.negative(self)

    def __abs__(self):
        from workbench import autograd
        return autograd.abs(self)

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

    def __init__(self, shape, device=None, dtype=float32, name=None):
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


# --------------------------------------------------------------------------- module functions
def from_numpy(np_array, device=None) -> Tensor:
    """A Tensor holding ``np_array`` (its dtype kept)."""
    return Tensor(device=device, data=np.asarray(np_array), dtype=np.asarray(np_array).dtype)


def to_numpy(t: Tensor) -> np.ndarray:
    return t.numpy()


def to_host(t: Tensor) -> Tensor:
    return t.clone().to_host()


def zeros(shape, device=None, dtype=float32) -> Tensor:
    return Tensor(shape, device, dtype)


def ones(shape, device=None, dtype=float32) -> Tensor:
    return Tensor(shape, device, dtype).set_value(1)


def zeros_like(t: Tensor) -> Tensor:
    return Tensor(t.shape, t.device, t.dtype)


def ones_like(t: Tensor) -> Tensor:
    return zeros_like(t).set_value(1)


def random(shape, device=None) -> Tensor:
    """Uniform [0, 1) float32."""
    return Tensor(shape, device, float32).uniform(0.0, 1.0)


def gaussian(shape, device=None, mean: float = 0.0, std: float = 1.0, dtype=float32) -> Tensor:
    return Tensor(shape, device, dtype).gaussian(mean, std)


def uniform(shape, device=None, low: float = 0.0, high: float = 1.0, dtype=float32) -> Tensor:
    return Tensor(shape, device, dtype).uniform(low, high)


def reshape(t: Tensor, shape) -> Tensor:
    return t.reshape(shape)


def transpose(t: Tensor, axes=None) -> Tensor:
    return t.transpose(axes)


def sum(t: Tensor, axis=None, keepdims: bool = False) -> Tensor:  # noqa: A001 - SINGA's name
    return t.sum(axis, keepdims)


def average(t: Tensor, axis=None) -> Tensor:
    return t.mean(axis)


def softmax(t: Tensor, axis: int = 1) -> Tensor:
    from workbench import autograd
    return autograd.softmax(t, axis)


def relu(t: Tensor) -> Tensor:
    from workbench import autograd
    return autograd.relu(t)


def concatenate(ts, axis: int = 0) -> Tensor:
    from workbench import autograd
    return autograd.cat(ts, axis)


def copy_data_to_from(dst: Tensor, src: Tensor, size: int | None = None, dst_offset: int = 0,
                      src_offset: int = 0) -> None:
    a = src.numpy().reshape(-1)
    d = dst.numpy().reshape(-1).copy()
    n = a.size - src_offset if size is None else size
    d[dst_offset:dst_offset + n] = a[src_offset:src_offset + n]
    dst.copy_from_numpy(d)
