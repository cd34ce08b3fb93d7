"""Elementwise math: arithmetic, unary math, variadic Min/Max/Sum/Mean, bitwise ops, Clip, Identity.

Every kernel keeps the dtype of its input (float16 stays float16, integer ops stay integer) and
broadcasts like numpy (multidirectional broadcasting, opset 7+). The opset-6 forms of the binary
ops also accept the legacy ``broadcast``/``axis`` attributes.
"""

from __future__ import annotations

import functools
import math

import numpy as np  # dtype constants only

from workbench.arrays import xp_of
from workbench.compiled.kernels import _erf_series as _erf
from workbench.errors import InputError, ShapeError
from workbench.ops._common import check_broadcast, compute_dtype, ensure_array, is_float, quiet
from workbench.ops.registry import describe, kernel


def legacy_broadcast(op: str, a, b, broadcast, axis):
    """Opset < 7 binary ops: with ``broadcast=1`` B is aligned to A starting at ``axis``.
    Also where every binary op refuses a broadcast output over the memory budget."""
    if a.shape == b.shape:
        return b
    if not broadcast or b.ndim == 0:
        check_broadcast(op, a, b)
        return b
    if axis is None:
        axis = a.ndim - b.ndim
    axis = axis + a.ndim if axis < 0 else axis
    if axis < 0 or axis + b.ndim > a.ndim or any(
            db not in (1, a.shape[axis + i]) for i, db in enumerate(b.shape)):
        raise ShapeError(f"{op}: legacy broadcast of B {tuple(b.shape)} into A {tuple(a.shape)} "
                         f"at axis={axis} is impossible (B must match A's dims from axis on)")
    return b.reshape(tuple(b.shape) + (1,) * (a.ndim - axis - b.ndim))


# ----------------------------------------------------------------------------------------------
# binary arithmetic


@kernel("Add", since=6, category="math", elementwise=True, host_shape_math=True)
def add(a, b, *, broadcast=0, axis=None):
    b = legacy_broadcast("Add", a, b, broadcast, axis)
    return ensure_array(xp_of(a, b).add(a, b))


@kernel("Sub", since=6, category="math", elementwise=True, host_shape_math=True)
def sub(a, b, *, broadcast=0, axis=None):
    b = legacy_broadcast("Sub", a, b, broadcast, axis)
    return ensure_array(xp_of(a, b).subtract(a, b))


@kernel("Mul", since=6, category="math", elementwise=True, host_shape_math=True)
def mul(a, b, *, broadcast=0, axis=None):
    b = legacy_broadcast("Mul", a, b, broadcast, axis)
    return ensure_array(xp_of(a, b).multiply(a, b))


@kernel("Div", since=6, category="math", elementwise=True, host_shape_math=True)
def div(a, b, *, broadcast=0, axis=None):
    """Float division, or integer division truncating toward zero (C semantics)."""
    b = legacy_broadcast("Div", a, b, broadcast, axis)
    xp = xp_of(a, b)
    kind = a.dtype.kind
    with quiet():
        if kind not in "iu":
            return ensure_array(xp.true_divide(a, b), xp)
        if a.dtype.itemsize <= 4 or (a.size and -2**53 < int(a.min()) and int(a.max()) < 2**53):
            # |a| < 2**53: the double quotient truncates to the exact integer quotient (and is
            # much faster than integer division)
            q = ensure_array(xp.true_divide(a, b, dtype=np.float64), xp)
            xp.trunc(q, out=q)
            return q.astype(a.dtype)
        if kind == "u":
            return ensure_array(xp.floor_divide(a, b), xp)
        # a - fmod(a, b) is an exact multiple of b, so floor division of it truncates
        r = ensure_array(xp.fmod(a, b), xp)
        if r.ndim == 0:
            return ensure_array(xp.floor_divide(a - r, b), xp)
        xp.subtract(a, r, out=r)
        xp.floor_divide(r, b, out=r)
        return r


@kernel("Pow", since=6, category="math", elementwise=True)
def pow_(x, y, *, broadcast=0, axis=None):
    """x ** y with the output type of ``x``; the exponent may have another numeric type."""
    y = legacy_broadcast("Pow", x, y, broadcast, axis)
    xp = xp_of(x, y)
    with quiet():
        if is_float(x.dtype):
            if y.dtype == x.dtype:
                return ensure_array(xp.power(x, y))
            if is_float(y.dtype) and np.dtype(y.dtype).itemsize > np.dtype(x.dtype).itemsize:
                wide = compute_dtype(y.dtype)
                return ensure_array(xp.power(x.astype(wide), y.astype(wide))).astype(x.dtype)
            if not is_float(y.dtype):
                cdt = compute_dtype(x.dtype)
                return ensure_array(xp.power(x.astype(cdt, copy=False),
                                             y.astype(cdt))).astype(x.dtype, copy=False)
            return ensure_array(xp.power(x, y.astype(x.dtype)))
        if is_float(y.dtype):  # integer base, float exponent: compute in double, truncate
            r = xp.power(x.astype(np.float64), y.astype(np.float64))
            return ensure_array(r).astype(x.dtype)
        return _int_pow(xp, x, y)


def _int_pow(xp, x, y):
    y = y.astype(x.dtype, copy=False)
    if y.dtype.kind == "i" and y.size and bool((y < 0).any()):
        # integer x ** negative n is 1 / x**n truncated: 0 unless |x| == 1
        neg = y < 0
        r = ensure_array(xp.power(x, xp.where(neg, 0, y).astype(y.dtype)))
        odd = (y % 2) != 0
        inv = xp.where(x == 1, 1, xp.where(x == -1, xp.where(odd, -1, 1), 0)).astype(x.dtype)
        return ensure_array(xp.where(neg, inv, r)).astype(x.dtype, copy=False)
    return ensure_array(xp.power(x, y)).astype(x.dtype, copy=False)


@kernel("Mod", since=10, category="math", host_shape_math=True)
def mod(a, b, *, fmod=0):
    """fmod=0: result has the sign of B (floor); fmod=1: sign of A (C fmod)."""
    xp = xp_of(a, b)
    check_broadcast("Mod", a, b)
    with quiet():
        if fmod:
            return ensure_array(xp.fmod(a, b))
        if xp is not np and a.dtype.kind == "f":
            # cupy's float mod computes a - floor(a/b)*b, which is NaN for an infinite
            # divisor; build the floored modulo from fmod as numpy does (inf divisor: a, or
            # b when the signs differ; a zero result takes the sign of b)
            r = xp.fmod(a, b)
            r = xp.where((r != 0) & ((r < 0) != (b < 0)), r + b, r)
            return xp.where(r == 0, xp.copysign(r, b), r).astype(a.dtype, copy=False)
        return ensure_array(xp.mod(a, b))


# ----------------------------------------------------------------------------------------------
# unary math


@kernel("Neg", since=6, category="math", elementwise=True, host_shape_math=True)
def neg(x):
    return ensure_array(xp_of(x).negative(x))


@kernel("Abs", since=6, category="math", elementwise=True, host_shape_math=True)
def abs_(x):
    return ensure_array(xp_of(x).absolute(x))


@kernel("Sqrt", since=6, category="math", elementwise=True)
def sqrt(x):
    with quiet():
        return ensure_array(xp_of(x).sqrt(x))


@kernel("Exp", since=6, category="math", elementwise=True)
def exp(x):
    with quiet():
        return ensure_array(xp_of(x).exp(x))


@kernel("Log", since=6, category="math", elementwise=True)
def log(x):
    with quiet():
        return ensure_array(xp_of(x).log(x))


@kernel("Reciprocal", since=6, category="math", elementwise=True)
def reciprocal(x):
    if not is_float(x.dtype):  # numpy's integer reciprocal would silently give 0s
        raise InputError(f"Reciprocal: input dtype {x.dtype} is not supported "
                         f"(float16, bfloat16, float, double)")
    with quiet():
        return ensure_array(xp_of(x).reciprocal(x))


@kernel("Floor", since=6, category="math", host_shape_math=True)
def floor(x):
    return ensure_array(xp_of(x).floor(x))


@kernel("Ceil", since=6, category="math", host_shape_math=True)
def ceil(x):
    return ensure_array(xp_of(x).ceil(x))


@kernel("Round", since=11, category="math")
def round_(x):
    """Round half to even; integral values, +-0, NaN and infinities are returned unchanged."""
    return ensure_array(xp_of(x).rint(x))


@kernel("Sign", since=9, category="math", host_shape_math=True)
def sign(x):
    return ensure_array(xp_of(x).sign(x))


@kernel("Sin", since=7, category="math")
def sin(x):
    return ensure_array(xp_of(x).sin(x))


@kernel("Cos", since=7, category="math")
def cos(x):
    return ensure_array(xp_of(x).cos(x))


@kernel("Tan", since=7, category="math")
def tan(x):
    return ensure_array(xp_of(x).tan(x))


@kernel("Asin", since=7)
def asin(x):
    with quiet():
        return ensure_array(xp_of(x).arcsin(x))


@kernel("Acos", since=7)
def acos(x):
    with quiet():
        return ensure_array(xp_of(x).arccos(x))


@kernel("Atan", since=7)
def atan(x):
    return ensure_array(xp_of(x).arctan(x))


@kernel("Sinh", since=9)
def sinh(x):
    with quiet():
        return ensure_array(xp_of(x).sinh(x))


@kernel("Cosh", since=9)
def cosh(x):
    with quiet():
        return ensure_array(xp_of(x).cosh(x))


@kernel("Asinh", since=9)
def asinh(x):
    return ensure_array(xp_of(x).arcsinh(x))


@kernel("Acosh", since=9)
def acosh(x):
    with quiet():
        return ensure_array(xp_of(x).arccosh(x))


@kernel("Atanh", since=9)
def atanh(x):
    with quiet():
        return ensure_array(xp_of(x).arctanh(x))


def special_module(xp):
    """cupyx.scipy.special for cupy arrays, or None (numpy: the engine never imports scipy
    for its kernels; see :func:`erf_array`)."""
    if xp is np:
        return None
    try:  # pragma: no cover - GPU only
        import cupyx.scipy.special as special
        return special
    except ImportError:  # pragma: no cover - depends on the machine
        return None


@functools.cache
def erf_coefficients(f32: bool):
    """``(small, large)`` float64 coefficient arrays (:mod:`~workbench.compiled.kernels.
    _erf_series`) for a float32 (the leading terms) or a float64 result."""
    ns, nl = _erf.TERMS_F32 if f32 else (len(_erf.SMALL), len(_erf.LARGE))
    return (np.array(_erf.SMALL[:ns], np.float64), np.array(_erf.LARGE[:nl], np.float64))


def _clenshaw(xp, u, c):
    """sum c_k T_k(u), one whole-array operation at a time in the order the kernel uses."""
    u2 = u * 2.0
    b1 = xp.zeros_like(u)
    b2 = xp.zeros_like(u)
    for ck in c[:0:-1]:
        t = u2 * b1
        t -= b2
        t += ck
        b2 = b1
        b1 = t
    r = u * b1
    r -= b2
    r += c[0]
    return r


def _exp_tail(xp, t):
    """exp(t) for float64 ``t`` in [-36, -4] (``_erf_series.EXP_TAYLOR``)."""
    k = xp.floor(t * _erf.LOG2E + 0.5)
    r = t - k * _erf.LN2_HI
    r -= k * _erf.LN2_LO
    p = r * _erf.EXP_TAYLOR[12]
    for c in _erf.EXP_TAYLOR[11:0:-1]:
        p += c
        p *= r
    p += _erf.EXP_TAYLOR[0]
    return xp.ldexp(p, k.astype(np.int32))


def _erf_f64(x, f32: bool):
    """erf of a float64 array (float32 accuracy when ``f32``): the numpy (or cupy) path,
    the reference of the compiled kernel ``transformer.erf``, which makes the same float64
    operations in the same order (so both give the same bits)."""
    xp = xp_of(x)
    small_c, large_c = erf_coefficients(f32)
    a = xp.absolute(x)
    out = xp.empty_like(x)
    small = a < 2
    xs = x[small]
    out[small] = xs * _clenshaw(xp, xs * xs * 0.5 - 1.0, small_c)
    big = ~small                     # also NaN
    xb = x[big]
    if xb.size:
        y = xp.minimum(a[big], 6.0)  # erf(6) is 1 - 2e-17: 1 in float64
        nan = y != y
        y[nan] = 6.0
        tail = _exp_tail(xp, -(y * y)) * _clenshaw(xp, y * 0.5 - 2.0, large_c)
        r = xp.copysign(1.0 - tail, xb)
        r[nan] = xb[nan]
        out[big] = r
    return out


def _erf_fallback(x):
    """erf in x's dtype (float32 or float64) without scipy or compiled code."""
    with np.errstate(invalid="ignore"):   # a signalling NaN's cast
        r = _erf_f64(x.astype(np.float64), x.dtype == np.float32)
    return r.astype(x.dtype, copy=False)


def _erf_compiled(x):
    """erf of a float32 host array by the compiled kernel, or None when it is not loaded.
    The same bits as :func:`_erf_fallback`; split over the engine's threads from 256k
    values (elementwise: the split changes no result; below that, measured on 2 loaded
    cores, the pool's hand-off cost more than the second core gave)."""
    from workbench import compiled
    from workbench.compiled import data_pointer
    from workbench.ops.parallel import n_workers, run_blocks

    k = compiled.kernel("transformer.erf_f32")
    if k is None:
        return None
    raw = k.raw
    xc = x if x.flags.c_contiguous else x.copy(order="C")   # (ascontiguousarray makes 0-d 1-d)
    y = np.empty_like(xc)
    n = xc.size
    px, py = data_pointer(xc), data_pointer(y)
    if n < (1 << 18) or n_workers() == 1:
        w = np.empty((2, 256))   # the kernel's gather rows (values, indices)
        raw(px, py, data_pointer(w[0]), data_pointer(w[1]), 0, n)
    else:
        step = -(-n // (4 * n_workers()))
        starts = range(0, n, step)
        w = np.empty((len(starts), 2, 256))
        run_blocks(np, list(enumerate(starts)),
                   lambda part: [raw(px, py, data_pointer(w[b, 0]), data_pointer(w[b, 1]), i,
                                     min(n, i + step)) for b, i in part], n * 8)
    return y


def erf_array(x):
    """The error function elementwise, in the dtype of ``x`` (float16/bfloat16 computed in
    float32). Host arrays never use scipy (its import alone cost ~28 MB of a BERT model's
    peak memory, and it computed float32 one value at a time in float64): float32 runs the
    compiled kernel ``transformer.erf_f32`` when it is loaded, else the numpy path
    (:func:`_erf_f64`), with the same bits either way; float64 runs the numpy path. Accuracy
    against the correctly rounded erf (``benchmarks/bench_erf.py``: every float32, and a
    float64 sweep against mpmath): float32 within 1 ulp, float64 within 3 ulp; NaN, +-Inf,
    -0.0 and subnormals as the math says. cupy arrays use cupyx.scipy.special."""
    xp = xp_of(x)
    xc = ensure_array(x, xp).astype(compute_dtype(x.dtype), copy=False)
    special = special_module(xp)
    if special is not None:  # pragma: no cover - GPU only
        r = special.erf(xc)
    elif xp is np and xc.dtype == np.float32:
        r = _erf_compiled(xc) if xc.size else None
        if r is None:
            r = _erf_fallback(xc)
    else:
        r = _erf_fallback(xc)
    return ensure_array(r, xp).astype(x.dtype, copy=False)


@kernel("Erf", since=9, category="math", elementwise=True)
def erf(x):
    if not is_float(x.dtype):  # Erf-9 also allows integer types
        return erf_array(x.astype(np.float64)).astype(x.dtype)
    return erf_array(x)


@kernel("IsNaN", since=9, category="math")
def isnan(x):
    return ensure_array(xp_of(x).isnan(x))


@kernel("IsInf", since=10, category="math")
def isinf(x, *, detect_negative=1, detect_positive=1):
    xp = xp_of(x)
    if detect_negative and detect_positive:
        return ensure_array(xp.isinf(x))
    xc = x.astype(compute_dtype(x.dtype), copy=False)
    if detect_positive:
        return ensure_array(xc == math.inf, xp)
    if detect_negative:
        return ensure_array(xc == -math.inf, xp)
    return xp.zeros(x.shape, dtype=bool)


# ----------------------------------------------------------------------------------------------
# variadic


def _variadic(op: str, ufunc_name: str, inputs, accumulate=False):
    """Fold ``ufunc`` over the inputs (broadcasting); half floats accumulate in float32."""
    if not inputs:
        raise InputError(f"{op} needs at least one input")
    if len(inputs) == 1:
        return inputs[0]
    xp = xp_of(*inputs)
    check_broadcast(op, *inputs)
    ufunc = getattr(xp, ufunc_name)
    dtype = inputs[0].dtype
    wide = compute_dtype(dtype) if accumulate and len(inputs) > 2 else dtype
    first = inputs[0] if wide == dtype else inputs[0].astype(wide)
    r = ensure_array(ufunc(first, inputs[1]), xp)
    for a in inputs[2:]:
        if r.shape == np.broadcast_shapes(r.shape, a.shape) and r.dtype == wide:
            ufunc(r, a, out=r)  # r is a fresh array: update it in place
        else:
            r = ensure_array(ufunc(r, a), xp)
    return r


@kernel("Sum", since=6, category="math")
def sum_(*inputs):
    if len(inputs) > 2:
        return _variadic("Sum", "add", inputs, accumulate=True).astype(inputs[0].dtype, copy=False)
    return _variadic("Sum", "add", inputs)


@kernel("Mean", since=6, category="math")
def mean(*inputs):
    if len(inputs) == 1:
        return inputs[0]
    r = _variadic("Mean", "add", inputs, accumulate=True)
    xp = xp_of(r)
    if r.ndim == 0:
        r = ensure_array(r / r.dtype.type(len(inputs)), xp)
    else:
        xp.divide(r, r.dtype.type(len(inputs)), out=r)
    return r.astype(inputs[0].dtype, copy=False)


@kernel("Max", since=6, category="math", host_shape_math=True)
def max_(*inputs):
    return _variadic("Max", "maximum", inputs)


@kernel("Min", since=6, category="math", host_shape_math=True)
def min_(*inputs):
    return _variadic("Min", "minimum", inputs)


# ----------------------------------------------------------------------------------------------
# bitwise


@kernel("BitShift", since=11, category="math")
def bitshift(x, y, *, direction):
    """Shifts that are negative or >= the bit width give 0 (or -1 right-shifting a negative)."""
    xp = xp_of(x, y)
    check_broadcast("BitShift", x, y)
    if direction not in ("LEFT", "RIGHT"):
        raise InputError(f"BitShift: direction must be 'LEFT' or 'RIGHT', got {direction!r}")
    shift = xp.left_shift if direction == "LEFT" else xp.right_shift
    nbits = x.dtype.itemsize * 8
    bad = y >= nbits
    if y.dtype.kind == "i":
        bad = bad | (y < 0)
    if not bad.any():
        return ensure_array(shift(x, y.astype(x.dtype, copy=False)), xp)
    r = ensure_array(shift(x, xp.where(bad, 0, y).astype(x.dtype)), xp)
    if direction == "RIGHT" and x.dtype.kind == "i":
        fill = xp.where(x < 0, -1, 0).astype(x.dtype)
    else:
        fill = xp.zeros((), dtype=x.dtype)
    return ensure_array(xp.where(bad, fill, r), xp).astype(x.dtype, copy=False)


@kernel("BitwiseAnd", since=18)
def bitwise_and(a, b):
    check_broadcast("BitwiseAnd", a, b)
    return ensure_array(xp_of(a, b).bitwise_and(a, b))


@kernel("BitwiseOr", since=18)
def bitwise_or(a, b):
    check_broadcast("BitwiseOr", a, b)
    return ensure_array(xp_of(a, b).bitwise_or(a, b))


@kernel("BitwiseXor", since=18)
def bitwise_xor(a, b):
    check_broadcast("BitwiseXor", a, b)
    return ensure_array(xp_of(a, b).bitwise_xor(a, b))


@kernel("BitwiseNot", since=18)
def bitwise_not(x):
    return ensure_array(xp_of(x).invert(x))


# ----------------------------------------------------------------------------------------------
# Clip, Identity


def _clip(xp, x, lo, hi):
    if lo is None and hi is None:
        return x
    if lo is not None and hi is not None:
        r = ensure_array(xp.maximum(x, lo), xp)
        return ensure_array(xp.minimum(r, hi, out=r if r.ndim else None), xp)
    if lo is not None:
        return ensure_array(xp.maximum(x, lo), xp)
    return ensure_array(xp.minimum(x, hi), xp)


def _attr_bound(xp, x, value):
    """A Clip-6 attribute bound as a 0-d array of x's dtype (out of range -> +-inf: no bound)."""
    with quiet():
        return xp.asarray(np.asarray(value, dtype=np.float64).astype(x.dtype))


@kernel("Clip", since=6, category="activation", settings=(1, 2), elementwise=True)
def clip_6(x, *, min=-3.4028234663852886e38, max=3.4028234663852886e38):  # noqa: A002
    """Clip-6..10: the bounds are float attributes (float types only)."""
    xp = xp_of(x)
    return _clip(xp, x, _attr_bound(xp, x, min), _attr_bound(xp, x, max))


@kernel("Clip", since=11)
def clip(x, lo=None, hi=None):
    """Clip to [min, max] (omitted bounds are open); min > max gives max everywhere."""
    xp = xp_of(x)
    for name, bound in (("min", lo), ("max", hi)):
        if bound is not None and bound.size != 1:
            raise ShapeError(f"Clip: '{name}' must be a scalar (or 1-element) tensor, "
                             f"got shape {tuple(bound.shape)}")
    lo = None if lo is None else lo.reshape(()).astype(x.dtype, copy=False)
    hi = None if hi is None else hi.reshape(()).astype(x.dtype, copy=False)
    return _clip(xp, x, lo, hi)


@kernel("Identity", since=1, category="shape", host_shape_math=True)
def identity(x):
    """Returns its input: a tensor, a sequence (list) or an optional value."""
    if isinstance(x, list):
        return list(x)
    return x


describe("Identity", output_view="view")   # returns its input itself
