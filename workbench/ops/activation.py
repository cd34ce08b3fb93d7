"""Activations: Relu family, sigmoids, Gelu/Swish/Mish/SwiGLU and Softmax/LogSoftmax/Hardmax.

float16 and bfloat16 inputs are computed in float32 and rounded back once at the end, so the
result has the input's dtype with a single rounding; float32/float64 are computed in place on
one fresh buffer where possible.
"""

from __future__ import annotations

import math

import numpy as np  # dtype constants only

from workbench.arrays import xp_of
from workbench.errors import InputError, ShapeError
from workbench.ops import rowwise
from workbench.ops._common import compute_dtype, ensure_array, is_float, quiet
from workbench.ops._common import softmax as softmax_core
from workbench.ops.elementwise import erf_array
from workbench.ops.registry import kernel


def _up(x):
    """x in the dtype to compute in (float32 for half types), never copied when already there."""
    return x.astype(compute_dtype(x.dtype), copy=False)


def _down(r, dtype):
    return r.astype(dtype, copy=False)


def _fresh(xp, x):
    """A writable float buffer computed from x: upcast (a new array) or a copy."""
    cdt = compute_dtype(x.dtype)
    return x.astype(cdt) if x.dtype != cdt else xp.array(x, copy=True)


def _sigmoid_inplace(xp, t):
    """t <- 1 / (1 + exp(-t)); exact limits at +-inf and no NaN for large |t|."""
    with quiet():
        xp.negative(t, out=t)
        xp.exp(t, out=t)
        t += 1
        xp.reciprocal(t, out=t)
    return t


# ----------------------------------------------------------------------------------------------
# Relu family


@kernel("Relu", since=6, category="activation", elementwise=True)
def relu(x):
    xp = xp_of(x)
    if xp is np and x.dtype.kind == "f" and x.itemsize >= 4:
        # numpy's clip with an infinite top bound is faster than maximum(x, 0) for
        # float32/64; NaN stays NaN as in maximum
        return ensure_array(np.clip(x, x.dtype.type(0), x.dtype.type(np.inf)), xp)
    return ensure_array(xp.maximum(x, xp.zeros((), dtype=x.dtype)), xp)


@kernel("LeakyRelu", since=6, category="activation", elementwise=True)
def leaky_relu(x, *, alpha=0.01):
    xp = xp_of(x)
    t = _fresh(xp, x)
    xc = _up(x)
    t *= alpha
    if 0.0 <= alpha <= 1.0:
        xp.maximum(t, xc, out=t)  # max(x, alpha*x) == LeakyRelu when 0 <= alpha <= 1
    else:
        t = xp.where(xc < 0, t, xc)
    return _down(ensure_array(t, xp), x.dtype)


@kernel("PRelu", since=6, category="activation")
def prelu(x, slope):
    """x where x >= 0 else slope * x; slope broadcasts to x (unidirectional)."""
    xp = xp_of(x, slope)
    try:
        shape = np.broadcast_shapes(x.shape, slope.shape)
    except ValueError:
        shape = None
    if shape != tuple(x.shape):
        raise ShapeError(f"PRelu: slope of shape {tuple(slope.shape)} does not broadcast to X "
                         f"of shape {tuple(x.shape)} (unidirectional broadcasting)")
    if slope.dtype != x.dtype:
        slope = slope.astype(x.dtype)
    return ensure_array(xp.where(x < 0, x * slope, x), xp)


@kernel("ThresholdedRelu", since=10, category="activation", elementwise=True)
def thresholded_relu(x, *, alpha=1.0):
    xp = xp_of(x)
    xc = _up(x)
    return _down(ensure_array(xp.where(xc > alpha, xc, xp.zeros((), xc.dtype)), xp), x.dtype)


@kernel("Elu", since=6, category="activation", elementwise=True)
def elu(x, *, alpha=1.0):
    xp = xp_of(x)
    xc = _up(x)
    with quiet():
        t = ensure_array(xp.minimum(xc, 0), xp)
        xp.expm1(t, out=t)
        t *= alpha
    return _down(ensure_array(xp.where(xc > 0, xc, t), xp), x.dtype)


@kernel("Selu", since=6, category="activation", elementwise=True)
def selu(x, *, alpha=1.6732632423543772, gamma=1.0507009873554805):
    xp = xp_of(x)
    xc = _up(x)
    with quiet():
        t = ensure_array(xp.minimum(xc, 0), xp)
        xp.expm1(t, out=t)
        t *= alpha
        t = ensure_array(xp.where(xc > 0, xc, t), xp)
        t *= gamma
    return _down(ensure_array(t, xp), x.dtype)


@kernel("Celu", since=12, category="activation", elementwise=True)
def celu(x, *, alpha=1.0):
    """max(0, x) + min(0, alpha * (exp(x / alpha) - 1))."""
    xp = xp_of(x)
    xc = _up(x)
    with quiet():
        t = ensure_array(xp.minimum(xc, 0), xp)
        t /= alpha
        xp.expm1(t, out=t)
        t *= alpha
        t += xp.maximum(xc, 0)
    return _down(ensure_array(t, xp), x.dtype)


@kernel("Shrink", since=9)
def shrink(x, *, bias=0.0, lambd=0.5):
    """x - bias if x > lambd, x + bias if x < -lambd, else 0 (any numeric type)."""
    xp = xp_of(x)
    xc = x.astype(np.float64) if not is_float(x.dtype) else _up(x)
    r = xp.where(xc > lambd, xc - bias, xp.where(xc < -lambd, xc + bias, 0))
    return ensure_array(r, xp).astype(x.dtype, copy=False)


# ----------------------------------------------------------------------------------------------
# sigmoid family


@kernel("Sigmoid", since=6, category="activation", elementwise=True)
def sigmoid(x):
    xp = xp_of(x)
    return _down(ensure_array(_sigmoid_inplace(xp, _fresh(xp, x)), xp), x.dtype)


@kernel("HardSigmoid", since=6, category="activation", elementwise=True)
def hard_sigmoid(x, *, alpha=0.2, beta=0.5):
    """max(0, min(1, alpha * x + beta))."""
    xp = xp_of(x)
    t = _fresh(xp, x)
    t *= alpha
    t += beta
    xp.clip(t, 0, 1, out=t)
    return _down(ensure_array(t, xp), x.dtype)


@kernel("HardSwish", since=14, category="activation", elementwise=True)
def hard_swish(x):
    """x * max(0, min(1, x / 6 + 1 / 2))."""
    xp = xp_of(x)
    t = _fresh(xp, x)
    t *= 1.0 / 6.0
    t += 0.5
    xp.clip(t, 0, 1, out=t)
    t *= _up(x)
    return _down(ensure_array(t, xp), x.dtype)


@kernel("Tanh", since=6, category="activation", elementwise=True)
def tanh(x):
    return ensure_array(xp_of(x).tanh(x))


def _softplus(xp, xc):
    """log(1 + exp(x)) = max(x, 0) + log1p(exp(-|x|)): no overflow, exact tails; a new array."""
    with quiet():
        t = ensure_array(xp.absolute(xc), xp)
        xp.negative(t, out=t)
        xp.exp(t, out=t)
        xp.log1p(t, out=t)
        t += xp.maximum(xc, 0)
    return ensure_array(t, xp)


@kernel("Softplus", since=1, category="activation", elementwise=True)
def softplus(x):
    xp = xp_of(x)
    return _down(_softplus(xp, _up(x)), x.dtype)


@kernel("Softsign", since=1, category="activation", elementwise=True)
def softsign(x):
    """x / (1 + |x|)."""
    xp = xp_of(x)
    xc = _up(x)
    t = ensure_array(xp.absolute(xc), xp)
    t += 1
    xp.divide(xc, t, out=t)
    return _down(ensure_array(t, xp), x.dtype)


@kernel("Mish", since=18, category="activation")
def mish(x):
    """x * tanh(softplus(x))."""
    xp = xp_of(x)
    xc = _up(x)
    t = _softplus(xp, xc)
    with quiet():  # -inf * 0 -> NaN, as the formula says
        xp.tanh(t, out=t)
        t *= xc
    return _down(ensure_array(t, xp), x.dtype)


@kernel("Gelu", since=20, category="activation")
def gelu(x, *, approximate="none"):
    """0.5 x (1 + erf(x / sqrt 2)), or the tanh approximation with ``approximate='tanh'``
    (float32: the compiled ``transformer.gelu`` when loaded)."""
    if x.dtype == np.float32 and approximate in ("none", "tanh"):
        y = rowwise.gelu(x, "Gelu" if approximate == "none" else "GeluTanh")
        if y is not None:
            return y
    xp = xp_of(x)
    xc = _up(x)
    if approximate == "tanh":
        t = ensure_array(xc * xc, xp)
        t *= 0.044715
        t += 1
        t *= xc
        t *= math.sqrt(2.0 / math.pi)
        xp.tanh(t, out=t)
    elif approximate == "none":
        t = erf_array(ensure_array(xc * (1.0 / math.sqrt(2.0)), xp))
    else:
        raise InputError(f"Gelu: approximate must be 'none' or 'tanh', got {approximate!r}")
    t += 1
    t *= xc
    t *= 0.5
    return _down(ensure_array(t, xp), x.dtype)


def _swish(xp, x, alpha):
    xc = _up(x)
    t = ensure_array(xc * alpha, xp) if alpha != 1.0 else xp.array(xc, copy=True)
    _sigmoid_inplace(xp, t)
    with quiet():
        t *= xc
    return t


@kernel("Swish", since=24, category="activation")
def swish(x, *, alpha=1.0):
    """x * sigmoid(alpha * x)."""
    xp = xp_of(x)
    return _down(ensure_array(_swish(xp, x, alpha), xp), x.dtype)


@kernel("SwiGLU", since=28)
def swiglu(a, b, *, alpha=1.0):
    """Swish_alpha(A) * B; A and B have the same shape (no broadcasting)."""
    xp = xp_of(a, b)
    if tuple(a.shape) != tuple(b.shape):
        raise ShapeError(f"SwiGLU: A {tuple(a.shape)} and B {tuple(b.shape)} must have the same "
                         f"shape (the op does not broadcast)")
    t = ensure_array(_swish(xp, a, alpha), xp)
    t *= _up(b)
    return _down(t, a.dtype)


# ----------------------------------------------------------------------------------------------
# Softmax family


def _norm_axis(op: str, axis: int, rank: int, coerce_2d: bool) -> int:
    top = rank if coerce_2d else rank - 1  # opset < 13 also takes axis == rank (1 column)
    if not -rank <= axis <= top or rank == 0:
        raise InputError(f"{op}: axis {axis} is out of range for an input of rank {rank} "
                         f"(accepted: [{-rank}, {top}])")
    return axis + rank if axis < 0 else axis


def _softmax(xp, x, axis, log):
    """Softmax / LogSoftmax in the input's dtype (the engine's one softmax, _common.softmax;
    float32 Softmax over the last axis: the compiled ``transformer.softmax`` when loaded)."""
    if not log and axis == x.ndim - 1 and x.dtype == np.float32:
        y = rowwise.softmax(x)
        if y is not None:
            return y
    return _down(ensure_array(softmax_core(xp, x, axis, log=log), xp), x.dtype)


def _hardmax(xp, x, axis):
    idx = xp.argmax(x, axis=axis, keepdims=True)  # the first maximum
    shape = [1] * x.ndim
    shape[axis] = x.shape[axis]
    return (xp.arange(x.shape[axis]).reshape(shape) == idx).astype(x.dtype)


def _apply(op, fn, x, axis, coerce_2d):
    """Run ``fn(x, axis)``; opset < 13 flattens to 2-D at ``axis`` and normalizes the tail."""
    xp = xp_of(x)
    axis = _norm_axis(op, axis, x.ndim, coerce_2d)
    if x.size == 0:
        return xp.empty_like(x)
    if not coerce_2d or axis == x.ndim - 1:
        return fn(xp, x, axis)
    rows = math.prod(x.shape[:axis])
    cols = math.prod(x.shape[axis:])
    return fn(xp, x.reshape(rows, cols), 1).reshape(x.shape)


@kernel("Softmax", since=1, category="activation")
def softmax_1(x, *, axis=1):
    """Softmax-1..12: the input is coerced to 2-D at ``axis`` (trailing dims normalized)."""
    return _apply("Softmax", lambda xp, v, a: _softmax(xp, v, a, False), x, axis, True)


@kernel("Softmax", since=13)
def softmax(x, *, axis=-1):
    return _apply("Softmax", lambda xp, v, a: _softmax(xp, v, a, False), x, axis, False)


@kernel("LogSoftmax", since=1, category="activation")
def log_softmax_1(x, *, axis=1):
    """LogSoftmax-1..12: coerced to 2-D at ``axis`` like Softmax-1."""
    return _apply("LogSoftmax", lambda xp, v, a: _softmax(xp, v, a, True), x, axis, True)


@kernel("LogSoftmax", since=13)
def log_softmax(x, *, axis=-1):
    return _apply("LogSoftmax", lambda xp, v, a: _softmax(xp, v, a, True), x, axis, False)


@kernel("Hardmax", since=1, category="activation")
def hardmax_1(x, *, axis=1):
    """Hardmax-1..12: coerced to 2-D at ``axis`` (one 1 per flattened row)."""
    return _apply("Hardmax", _hardmax, x, axis, True)


@kernel("Hardmax", since=13)
def hardmax(x, *, axis=-1):
    return _apply("Hardmax", _hardmax, x, axis, False)
