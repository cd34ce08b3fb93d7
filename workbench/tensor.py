"""Tensors (SINGA-compatible): an array (numpy on CPU, cupy on GPU) plus autograd bookkeeping.

This is SINGA's ``tensor`` module: the ``Tensor`` class itself is defined in
``workbench.autograd`` next to the tape it records on (so the two never import each other);
this module adds the module-level functions (``from_numpy``, ``zeros``, ``gaussian``...).

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

from workbench import autograd
from workbench import device as _device
from workbench.autograd import PlaceHolder, Tensor, as_tensor  # noqa: F401 - SINGA's tensor API

float16 = np.dtype(np.float16)
float32 = np.dtype(np.float32)
float64 = np.dtype(np.float64)
int8 = np.dtype(np.int8)
int32 = np.dtype(np.int32)
int64 = np.dtype(np.int64)
uint8 = np.dtype(np.uint8)
bool_ = np.dtype(np.bool_)


def seed(s: int) -> None:
    """Seed the generator used by ``gaussian``/``uniform``/``random`` and layer initialisers
    (``device.seed_host``)."""
    _device.seed_host(s)


def host_rng():
    return _device.host_rng()


# --------------------------------------------------------------------------- module functions
def from_numpy(np_array, device=None) -> Tensor:
    """A Tensor holding ``np_array`` (its dtype kept)."""
    return Tensor(device=device, data=np.asarray(np_array), dtype=np.asarray(np_array).dtype)


def to_numpy(t: Tensor) -> np.ndarray:
    """A numpy copy of ``t``'s values (SINGA's: later in-place updates of ``t`` do not show
    in it; ``t.numpy()`` is a view for CPU tensors)."""
    a = t.numpy()
    return a.copy() if isinstance(t.data, np.ndarray) else a


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
    return autograd.softmax(t, axis)


def relu(t: Tensor) -> Tensor:
    return autograd.relu(t)


def concatenate(ts, axis: int = 0) -> Tensor:
    return autograd.cat(ts, axis)


def copy_data_to_from(dst: Tensor, src: Tensor, size: int | None = None, dst_offset: int = 0,
                      src_offset: int = 0) -> None:
    a = src.numpy().reshape(-1)
    d = dst.numpy().reshape(-1).copy()
    n = a.size - src_offset if size is None else size
    d[dst_offset:dst_offset + n] = a[src_offset:src_offset + n]
    dst.copy_from_numpy(d)
