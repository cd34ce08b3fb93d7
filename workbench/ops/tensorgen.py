"""Tensor generators: Constant, ConstantOfShape, Range, EyeLike and the random ops (RandomNormal,
RandomUniform, their *Like forms, Multinomial, Bernoulli).

Ops without an array input (Constant, RandomNormal, RandomUniform) build their output with the
array module the executor names in ``ctx.extra["xp"]`` (numpy when it names none); the others
follow their input. Random ops with a ``seed`` attribute are reproducible: the seed picks a
``default_rng`` of the array module; without one they draw from ``ctx.rng`` (numpy) or a fresh
generator.
"""

from __future__ import annotations

import numpy as np

from workbench.arrays import np_dtype_of_onnx, xp_of
from workbench.errors import InputError, ShapeError
from workbench.limits import check_alloc
from workbench.ops._common import ints, scalar_of
from workbench.ops.registry import kernel


def _ctx_xp(ctx):
    """The array module asked for by the executor for input-less ops (numpy by default)."""
    xp = ctx.extra.get("xp") if ctx is not None and ctx.extra else None
    return xp if xp is not None else np


def _dtype(op, onnx_type):
    try:
        return np_dtype_of_onnx(int(onnx_type))
    except TypeError as e:
        raise InputError(f"{op}: dtype {onnx_type}: {e}") from None


def _shape_of(op, shape) -> tuple:
    dims = ints(shape)
    if any(d < 0 for d in dims):
        raise ShapeError(f"{op}: shape {dims} has negative dimensions")
    return tuple(dims)


# Constant ----------------------------------------------------------------------------------------

@kernel("Constant", since=1, wants_ctx=True)
def constant(*, value=None, sparse_value=None, value_float=None, value_floats=None,
             value_int=None, value_ints=None, value_string=None, value_strings=None, ctx=None):
    """The tensor held by exactly one of the ``value*`` attributes (``value_*`` from opset 12,
    ``sparse_value`` from 11, delivered densified)."""
    given = {k: v for k, v in dict(value=value, sparse_value=sparse_value,
                                   value_float=value_float, value_floats=value_floats,
                                   value_int=value_int, value_ints=value_ints,
                                   value_string=value_string,
                                   value_strings=value_strings).items() if v is not None}
    if len(given) != 1:
        raise InputError(f"Constant: exactly one value attribute must be set, got "
                         f"{sorted(given) or 'none'}")
    (name, v), = given.items()
    if name in ("value", "sparse_value"):
        arr = v
    elif name == "value_float":
        arr = np.asarray(v, dtype=np.float32)
    elif name == "value_floats":
        arr = np.asarray(list(v), dtype=np.float32).reshape(-1)
    elif name == "value_int":
        arr = np.asarray(v, dtype=np.int64)
    elif name == "value_ints":
        arr = np.asarray(list(v), dtype=np.int64).reshape(-1)
    elif name == "value_string":
        arr = np.asarray(v.decode() if isinstance(v, bytes) else v, dtype=object)
    else:
        arr = np.asarray([s.decode() if isinstance(s, bytes) else s for s in v],
                         dtype=object).reshape(-1)
    xp = _ctx_xp(ctx)
    if xp is not np and arr.dtype != object:
        return xp.asarray(arr)
    return np.asarray(arr)


@kernel("ConstantOfShape", since=9, wants_ctx=True,
        category="shape", host_read_inputs=(0,), settings=(0,))
def constant_of_shape(input, *, value=None, ctx=None):
    """A tensor of shape ``input`` filled with the one-element ``value`` (float32 0 by
    default). The shape is read on the host; the tensor is built where the executor runs
    (``ctx.extra["xp"]``: on the GPU even when the shape is a host value), else beside its
    input."""
    xp = ctx.extra.get("xp") if ctx is not None and ctx.extra.get("xp") is not None else \
        xp_of(input)
    shape = _shape_of("ConstantOfShape", input)
    check_alloc(shape, np.float32 if value is None else np.asarray(value).dtype,
                what="ConstantOfShape: the output")
    if value is None:
        return xp.zeros(shape, dtype=np.float32)
    val = np.asarray(value)
    if val.size != 1:
        raise ShapeError(f"ConstantOfShape: value must have exactly one element, got shape "
                         f"{val.shape}")
    fill = val.reshape(())
    if xp is not np:
        fill = fill.item()
    out = xp.empty(shape, dtype=val.dtype)
    out[...] = fill
    return out


# Range / EyeLike ---------------------------------------------------------------------------------

@kernel("Range", since=11,
        category="shape", host_read_inputs=(0, 1, 2), host_shape_math=True, settings=(0, 1, 2))
def range_(start, limit, delta, *, stash_type=1):
    """``start + i * delta`` for i in [0, max(ceil((limit - start) / delta), 0)); float16 and
    bfloat16 are computed in float32 unless ``stash_type`` is 0 (opset 27)."""
    xp = xp_of(start, limit, delta)
    dtype = start.dtype
    s = scalar_of("Range", "start", start)
    lim = scalar_of("Range", "limit", limit)
    d = scalar_of("Range", "delta", delta)
    if dtype.kind in "iu":
        s, lim, d = int(s), int(lim), int(d)
        if d == 0:
            raise InputError("Range: delta cannot be 0")
        n = max(-((s - lim) // d), 0)  # exact ceil((lim - s) / d) for ints
        check_alloc((n,), np.int64, what=f"Range({s}, {lim}, {d}): the output")
        return (xp.arange(n, dtype=np.int64) * d + s).astype(dtype)
    s, lim, d = float(s), float(lim), float(d)
    if d == 0:
        raise InputError("Range: delta cannot be 0")
    if not all(np.isfinite((s, lim, d))):
        raise InputError(f"Range: start {s}, limit {lim} and delta {d} must be finite")
    n_f = np.ceil((lim - s) / d)
    if not np.isfinite(n_f):
        raise InputError(f"Range({s}, {lim}, {d}): the number of elements is not finite")
    n = max(int(n_f), 0)
    check_alloc((n,), np.float64, what=f"Range({s}, {lim}, {d}): the output")
    if dtype.name in ("float16", "bfloat16") and not stash_type:
        i = xp.arange(n).astype(dtype)
        return i * xp.asarray(d).astype(dtype) + xp.asarray(s).astype(dtype)
    return (xp.arange(n, dtype=np.float64) * d + s).astype(dtype)


@kernel("EyeLike", since=9)
def eye_like(input, *, dtype=None, k=0):
    """A 2-D tensor of the input's shape with ones on diagonal ``k``, in ``dtype`` (or the
    input's dtype)."""
    xp = xp_of(input)
    if input.ndim != 2:
        raise ShapeError(f"EyeLike: input must be 2-D, got shape {tuple(input.shape)}")
    dt = input.dtype if dtype is None else _dtype("EyeLike", dtype)
    return xp.eye(input.shape[0], input.shape[1], k=int(k), dtype=dt)


# Random ------------------------------------------------------------------------------------------

def _seed_int(seed: float) -> int:
    f = float(seed)
    if f.is_integer():
        return int(f) & 0xFFFFFFFFFFFFFFFF
    return int(np.float64(f).view(np.uint64))


def _generator(xp, seed, ctx):
    if seed is not None:
        return xp.random.default_rng(_seed_int(seed))
    if xp is np and ctx is not None and ctx.rng is not None:
        return ctx.rng
    return xp.random.default_rng()


def _normal(xp, shape, dtype, mean, scale, seed, ctx):
    check_alloc(shape, np.float64, what="the random output")
    rng = _generator(xp, seed, ctx)
    out = rng.standard_normal(shape, dtype=np.float64) * float(scale) + float(mean)
    return out.astype(dtype)


def _uniform(xp, shape, dtype, low, high, seed, ctx):
    check_alloc(shape, np.float64, what="the random output")
    rng = _generator(xp, seed, ctx)
    out = rng.random(shape, dtype=np.float64) * (float(high) - float(low)) + float(low)
    return out.astype(dtype)


@kernel("RandomNormal", since=1, wants_ctx=True, random=True)
def random_normal(*, shape, dtype=1, mean=0.0, scale=1.0, seed=None, ctx=None):
    """Samples of N(mean, scale^2) with the ``shape`` attribute, in ``dtype``."""
    return _normal(_ctx_xp(ctx), _shape_of("RandomNormal", shape),
                   _dtype("RandomNormal", dtype), mean, scale, seed, ctx)


@kernel("RandomUniform", since=1, wants_ctx=True, random=True)
def random_uniform(*, shape, dtype=1, low=0.0, high=1.0, seed=None, ctx=None):
    """Samples of U[low, high) with the ``shape`` attribute, in ``dtype``."""
    return _uniform(_ctx_xp(ctx), _shape_of("RandomUniform", shape),
                    _dtype("RandomUniform", dtype), low, high, seed, ctx)


@kernel("RandomNormalLike", since=1, wants_ctx=True, random=True)
def random_normal_like(input, *, dtype=None, mean=0.0, scale=1.0, seed=None, ctx=None):
    """Samples of N(mean, scale^2) with the input's shape, in ``dtype`` (or the input's)."""
    dt = input.dtype if dtype is None else _dtype("RandomNormalLike", dtype)
    return _normal(xp_of(input), tuple(input.shape), dt, mean, scale, seed, ctx)


@kernel("RandomUniformLike", since=1, wants_ctx=True, random=True)
def random_uniform_like(input, *, dtype=None, low=0.0, high=1.0, seed=None, ctx=None):
    """Samples of U[low, high) with the input's shape, in ``dtype`` (or the input's)."""
    dt = input.dtype if dtype is None else _dtype("RandomUniformLike", dtype)
    return _uniform(xp_of(input), tuple(input.shape), dt, low, high, seed, ctx)


@kernel("Multinomial", since=7, wants_ctx=True, random=True)
def multinomial(input, *, dtype=6, sample_size=1, seed=None, ctx=None):
    """``sample_size`` class indices per batch row drawn from softmax(input) (unnormalised
    log-probabilities); int32 by default."""
    xp = xp_of(input)
    if input.ndim != 2:
        raise ShapeError(f"Multinomial: input must be [batch_size, class_size], got shape "
                         f"{tuple(input.shape)}")
    out_dt = _dtype("Multinomial", dtype)
    if out_dt not in (np.dtype(np.int32), np.dtype(np.int64)):
        raise InputError(f"Multinomial: dtype must be int32 or int64, got {out_dt}")
    batch, classes = input.shape
    if int(sample_size) < 0:
        raise InputError(f"Multinomial: sample_size must be >= 0, got {sample_size}")
    check_alloc((batch, int(sample_size)), np.float64, what="Multinomial: the samples")
    logits = input.astype(np.float64)
    logits = logits - logits.max(axis=1, keepdims=True)
    p = xp.exp(logits)
    cdf = xp.cumsum(p, axis=1)
    cdf = cdf / cdf[:, -1:]
    rng = _generator(xp, seed, ctx)
    u = rng.random((batch, int(sample_size)), dtype=np.float64)
    # one sorted search over all rows: row r's cdf and draws are shifted into [r, r + 1]
    shift = xp.arange(batch, dtype=np.float64)[:, None]
    pos = xp.searchsorted((cdf + shift).reshape(-1), (u + shift).reshape(-1), side="right")
    idx = pos.reshape(batch, -1) - xp.arange(batch, dtype=pos.dtype)[:, None] * classes
    return xp.clip(idx, 0, classes - 1).astype(out_dt)


@kernel("Bernoulli", since=15, wants_ctx=True, random=True)
def bernoulli(input, *, dtype=None, seed=None, ctx=None):
    """1 with probability ``input``, else 0, in ``dtype`` (or the input's dtype)."""
    xp = xp_of(input)
    dt = input.dtype if dtype is None else _dtype("Bernoulli", dtype)
    rng = _generator(xp, seed, ctx)
    u = rng.random(tuple(input.shape), dtype=np.float64)
    return (u < input.astype(np.float64)).astype(dt)
