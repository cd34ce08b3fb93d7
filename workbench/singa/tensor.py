"""Tensors (SINGA-compatible): an array (numpy on CPU, cupy on GPU) plus autograd bookkeeping.

This is SINGA's ``tensor`` module: the ``Tensor`` class itself is the engine's
(``workbench.autodiff.tape``, next to the tape it records on); this module adds SINGA's
module-level functions (``from_numpy``, ``zeros``, ``gaussian``...).

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
through the tape's ``apply``.

Differences from SINGA, on purpose: ``requires_grad`` defaults to False (data tensors need no
gradient; parameters are created with ``requires_grad=True, stores_grad=True``; SINGA's
per-operator ``creator.backward`` works on data anyway while ``autograd.training`` is True), a
Tensor created from a numpy array keeps the array's dtype, dtypes are numpy dtypes (SINGA's
names ``'int'``/``'float'`` and type codes 0/1/2 are accepted by ``as_type``/``cast``),
comparisons give bool Tensors (SINGA: float 0/1), and ``a == b`` of two Tensors is identity
(``eq(a, b)`` compares elements; ``t == 3.0`` compares elements as in SINGA).

SINGA's behaviour kept where its programs depend on it: an int index keeps its axis
(``t[-1, :]`` of [T, V] is [1, V]); ``softmax`` of a 1-D Tensor treats it as one row;
``t += x`` changes ``t`` in place (``copy()`` is a shallow copy that sees it, ``deepcopy()`` /
``clone()`` copy the data); an int Tensor with a Python float gives float32.
"""

from __future__ import annotations

import builtins as _builtins

import numpy as np

from workbench.arrays.device import device_of_array
from workbench.autodiff.tape import (  # noqa: F401 - SINGA's tensor API
    PlaceHolder,
    Tensor,
    as_tensor,
    parse_dtype,
)
from workbench.singa import autograd
from workbench.singa import device as _device

float16 = np.dtype(np.float16)
float = np.dtype(np.float32)  # noqa: A001 - SINGA's tensor.float
int = np.dtype(np.int32)  # noqa: A001 - SINGA's tensor.int
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
    """A new Tensor of normal samples; SINGA's ``gaussian(mean, std, t)`` (a Tensor third)
    fills ``t`` in place instead."""
    if isinstance(mean, Tensor) and not isinstance(shape, (tuple, list)):
        return mean.gaussian(shape, device)
    return Tensor(shape, device, dtype).gaussian(mean, std)


def uniform(shape, device=None, low: float = 0.0, high: float = 1.0, dtype=float32) -> Tensor:
    """A new Tensor of uniform samples; SINGA's ``uniform(low, high, t)`` (a Tensor third)
    fills ``t`` in place instead."""
    if isinstance(low, Tensor) and not isinstance(shape, (tuple, list)):
        return low.uniform(shape, device)
    return Tensor(shape, device, dtype).uniform(low, high)


def reshape(t: Tensor, shape) -> Tensor:
    return t.reshape(shape)


def transpose(t: Tensor, axes=None) -> Tensor:
    return t.transpose(axes)


def sum(t: Tensor, axis=None, out=None, keepdims: bool = False) -> Tensor:  # noqa: A001
    """The sum over ``axis`` (an int, a tuple, or None for all: a Tensor of shape ());
    SINGA's ``out=`` receives the result when given."""
    return _into(t.sum(list(axis) if isinstance(axis, tuple) else axis, keepdims), out)


def average(t: Tensor, axis=None):
    """The mean along ``axis`` (a Tensor), or of all elements as a Python float for
    ``axis=None`` (SINGA's)."""
    if axis is None:
        return _builtins.float(t.numpy().astype(np.float64).mean()) if t.size() else \
            _builtins.float("nan")
    return t.mean(axis)


def softmax(t: Tensor, out=None, axis: int = 1) -> Tensor:
    """Softmax of each row (over ``axis``); a 1-D Tensor is one row (SINGA's rule). ``out``
    (SINGA's) receives the result when given (an int there is taken as ``axis``)."""
    if isinstance(out, (_builtins.int, np.integer)):
        axis, out = out, None
    if t.ndim() == 1:
        y = autograd.reshape(autograd.softmax(autograd.reshape(t, (1, -1)), 1), t.shape)
    else:
        y = autograd.softmax(t, axis)
    return _into(y, out)


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


# --------------------------------------------------------------------------- SINGA's tensor API
def _into(y: Tensor, out: Tensor | None) -> Tensor:
    """``y``, or ``y`` written into ``out`` (SINGA's ``out=`` / ``ret=`` arguments)."""
    if out is None:
        return y
    if tuple(out.shape) != tuple(y.shape):
        raise autograd.ShapeError(f"out= has shape {list(out.shape)}, the result "
                                  f"{list(y.shape)}")
    out.data = out.device.put(y.data.astype(out.dtype, copy=False))
    return out


def from_raw_tensor(t) -> Tensor:
    """A Tensor over a raw tensor (``autograd.RawTensor``, what operator ``forward`` /
    ``backward`` return) or an array, sharing its data."""
    a = autograd._raw_array(t)
    return Tensor._make(a, device_of_array(a), False, None, 0, None)


def from_raw_tensors(tt) -> list:
    return [from_raw_tensor(t) for t in tt]


def product(shape) -> int:
    """The number of elements of ``shape``."""
    n = 1
    for d in shape:
        n *= _builtins.int(d)
    return n


def sizeof(dtype) -> int:
    """Bytes per element of ``dtype`` (numpy dtype or SINGA's name / type code)."""
    return parse_dtype(dtype).itemsize


def contiguous(t: Tensor) -> Tensor:
    return t.contiguous()


# SINGA's element-wise tensor functions: the autograd functions themselves
abs = autograd.abs  # noqa: A001 - SINGA's name
exp = autograd.exp
ceil = autograd.ceil
floor = autograd.floor
log = autograd.log
sigmoid = autograd.sigmoid
sign = autograd.sign
sqrt = autograd.sqrt
tanh = autograd.tanh


def square(t: Tensor) -> Tensor:
    return autograd.mul(t, t)


def pow(t: Tensor, x, out=None) -> Tensor:  # noqa: A001 - SINGA's name
    return _into(t ** x, out)


def lt(t: Tensor, x) -> Tensor:
    return t < x


def le(t: Tensor, x) -> Tensor:
    return t <= x


def gt(t: Tensor, x) -> Tensor:
    return t > x


def ge(t: Tensor, x) -> Tensor:
    return t >= x


def eq(t: Tensor, x) -> Tensor:
    """Element-wise ``==`` (also of two Tensors)."""
    return autograd.equal(t, x) if isinstance(x, Tensor) else t == x


def add(lhs, rhs, ret=None) -> Tensor:
    return _into(lhs + rhs, ret)


def sub(lhs, rhs, ret=None) -> Tensor:
    return _into(lhs - rhs, ret)


def eltwise_mult(lhs, rhs, ret=None) -> Tensor:
    return _into(lhs * rhs, ret)


def div(lhs, rhs, ret=None) -> Tensor:
    return _into(lhs / rhs, ret)


def mult(A, B, C=None, alpha: float = 1.0, beta: float = 0.0) -> Tensor:  # noqa: N803
    """``alpha * A @ B + beta * C`` (matrix-vector, matrix-matrix or batched); with ``C`` the
    result is written into it, as SINGA's."""
    y = autograd.matmul(A, B)
    if alpha != 1.0:
        y = y * alpha
    if C is None:
        return y
    if beta != 0.0:
        y = y + C * beta
    return _into(y, C)


def axpy(alpha: float, x: Tensor, y: Tensor) -> Tensor:
    """``y += alpha * x`` in place."""
    y += x * alpha
    return y


def einsum(ops: str, *args) -> Tensor:
    """``numpy.einsum`` over Tensors (an ONNX Einsum node)."""
    return autograd.apply("Einsum", list(args), {"equation": str(ops)})


def repeat(t: Tensor, repeats, axis=None) -> Tensor:
    """``numpy.repeat``: each element ``repeats`` times along ``axis`` (flattened for None)."""
    return t.repeat(repeats, axis)


def tensordot(A: Tensor, B: Tensor, axes=2) -> Tensor:  # noqa: N803
    """``numpy.tensordot``: contract ``axes`` (an int: the last ones of A with the first ones
    of B; or two lists) - recorded as Transpose, Reshape and MatMul, so it is
    differentiable and exportable."""
    na, nb = A.ndim(), B.ndim()
    if isinstance(axes, (_builtins.int, np.integer)):
        k = axes
        a_ax, b_ax = list(range(na - k, na)), list(range(k))
    else:
        a_ax, b_ax = axes
        a_ax = [a_ax] if np.isscalar(a_ax) else list(a_ax)
        b_ax = [b_ax] if np.isscalar(b_ax) else list(b_ax)
    a_ax = [a % na for a in a_ax]
    b_ax = [b % nb for b in b_ax]
    if len(a_ax) != len(b_ax) or any(A.shape[i] != B.shape[j] for i, j in zip(a_ax, b_ax)):
        raise autograd.ShapeError(f"tensordot: axes {a_ax} of {list(A.shape)} and {b_ax} of "
                                  f"{list(B.shape)} do not match")
    free_a = [i for i in range(na) if i not in a_ax]
    free_b = [j for j in range(nb) if j not in b_ax]
    m = product(A.shape[i] for i in free_a)
    k = product(A.shape[i] for i in a_ax)
    n = product(B.shape[j] for j in free_b)
    a2 = autograd.reshape(autograd.transpose(A, free_a + a_ax), (m, k))
    b2 = autograd.reshape(autograd.transpose(B, b_ax + free_b), (k, n))
    out_shape = [A.shape[i] for i in free_a] + [B.shape[j] for j in free_b]
    return autograd.reshape(autograd.matmul(a2, b2), out_shape)


def bernoulli(p: float, t: Tensor) -> Tensor:
    """Fill ``t`` in place with Bernoulli(p) samples (SINGA's argument order)."""
    return t.bernoulli(p)


def add_column(alpha, v, beta, M) -> Tensor:
    """``M = beta * M + alpha * v`` with ``v`` added to every column (in place)."""
    M.data = (M * beta + autograd.reshape(v, (-1, 1)) * alpha).data
    return M


def add_row(alpha, v, beta, M) -> Tensor:
    """``M = beta * M + alpha * v`` with ``v`` added to every row (in place)."""
    M.data = (M * beta + autograd.reshape(v, (1, -1)) * alpha).data
    return M


def sum_columns(M: Tensor) -> Tensor:
    """The sum of the columns of a 2-D Tensor: shape (rows,)."""
    return M.sum(1)


def sum_rows(M: Tensor) -> Tensor:
    """The sum of the rows of a 2-D Tensor: shape (columns,)."""
    return M.sum(0)


def copy_from_numpy(data, np_array) -> None:
    """Write ``np_array`` into the Tensor ``data`` (SINGA's name)."""
    data.copy_from_numpy(np_array)
