"""Normalization: BatchNormalization, InstanceNormalization, LayerNormalization,
GroupNormalization, RMSNormalization, LRN, LpNormalization, MeanVarianceNormalization.

Statistics are computed in float32 for float16/bfloat16 inputs (float64 stays float64) and the
result is cast back to the input's type. Inference BatchNormalization folds its four
parameters into one per-channel scale and shift (two passes over X).
"""

from __future__ import annotations

import numpy as np  # dtype constants only

from workbench.arrays import np_dtype_of_onnx, xp_of
from workbench.errors import InputError, ShapeError
from workbench.ops import rowwise
from workbench.ops._common import compute_dtype, to_compute
from workbench.ops.parallel import run_blocks
from workbench.ops.registry import FUSED_DOMAIN, kernel


def _axis(op, axis, ndim, name="axis"):
    a = int(axis)
    if not -ndim <= a < ndim:
        raise InputError(f"{op}: {name}={axis} is out of range for an input of rank {ndim} "
                         f"(allowed [-{ndim}, {ndim - 1}])")
    return a % ndim


# --------------------------------------------------------------------------------------------
# BatchNormalization
# --------------------------------------------------------------------------------------------

def _bn_param(op, name, p, X, dt):
    """A BN parameter as an array broadcastable to X: (C,) per channel, or X.shape[1:]."""
    C = X.shape[1]
    nd = X.ndim - 2
    if p.ndim == 1 and p.shape[0] == C:
        return p.astype(dt, copy=False).reshape((1, C) + (1,) * nd)
    if tuple(p.shape) == tuple(X.shape[1:]):  # spatial=0 (per activation) parameters
        return p.astype(dt, copy=False)[None]
    raise ShapeError(f"{op}: input {name} must have shape ({C},) (one value per channel of X "
                     f"{tuple(X.shape)}), got {tuple(p.shape)}")


def _batch_norm(X, scale, B, mean, var, epsilon, momentum, training, spatial, n_outputs,
                legacy_outputs):
    op = "BatchNormalization"
    xp = xp_of(X)
    if X.ndim < 2:
        raise ShapeError(f"{op}: X must have shape (N, C, ...), got {tuple(X.shape)}")
    x = to_compute(X)
    dt = x.dtype
    s, b = _bn_param(op, "scale", scale, X, dt), _bn_param(op, "B", B, X, dt)
    m, v = _bn_param(op, "mean", mean, X, dt), _bn_param(op, "var", var, X, dt)
    eps = dt.type(epsilon)
    if not training:
        a = s / xp.sqrt(v + eps)
        shift = b - m * a
        y = xp.empty(x.shape, dtype=dt)

        def work(chunk):
            for n0, n1 in chunk:
                xp.multiply(x[n0:n1], a, out=y[n0:n1])
                y[n0:n1] += shift
        N = x.shape[0]
        run_blocks(xp, [(n, n + 1) for n in range(N)] if xp is np else [(0, N)], work, x.size)
        return y.astype(X.dtype, copy=False)
    axes = (0,) + (tuple(range(2, X.ndim)) if spatial else ())
    if s.shape[2:] != (1,) * (X.ndim - 2):  # per-activation parameters: batch statistics only
        axes = (0,)
    cur_mean = x.mean(axis=axes, keepdims=True)
    d = x - cur_mean
    cur_var = (d * d).mean(axis=axes, keepdims=True)
    y = d * (s / xp.sqrt(cur_var + eps))
    y += b
    y = y.astype(X.dtype, copy=False)
    mom = dt.type(momentum)
    out_dt = mean.dtype
    run_mean = (m * mom + cur_mean * (1 - mom)).reshape(mean.shape).astype(out_dt)
    run_var = (v * mom + cur_var * (1 - mom)).reshape(var.shape).astype(out_dt)
    outs = [y, run_mean, run_var]
    if legacy_outputs:
        outs += [cur_mean.reshape(mean.shape).astype(out_dt),
                 cur_var.reshape(var.shape).astype(out_dt)]
    return tuple(outs[:max(1, n_outputs)]) if n_outputs > 1 else y


@kernel("BatchNormalization", since=1, wants_ctx=True,
        category="normalization", state_inputs=(3, 4))
@kernel("BatchNormalization", since=6, wants_ctx=True)
def batch_norm_6(X, scale, B, mean, var, *, consumed_inputs=None, epsilon=1e-5, is_test=0,
                 momentum=0.9, spatial=1, ctx=None):
    """BatchNormalization-1/6: test mode when is_test or a single output is asked for."""
    n_out = ctx.n_outputs if ctx is not None else 1
    training = not is_test and (n_out > 1 or (ctx is not None and ctx.training))
    return _batch_norm(X, scale, B, mean, var, epsilon, momentum, training, spatial, n_out,
                       legacy_outputs=True)


@kernel("BatchNormalization", since=7, wants_ctx=True)
def batch_norm_7(X, scale, B, mean, var, *, epsilon=1e-5, momentum=0.9, spatial=1, ctx=None):
    """BatchNormalization-7/8: ``spatial=0`` takes per-activation (C, D1, ...) parameters;
    training statistics when the node asks for the optional outputs."""
    n_out = ctx.n_outputs if ctx is not None else 1
    training = n_out > 1 or (ctx is not None and ctx.training)
    return _batch_norm(X, scale, B, mean, var, epsilon, momentum, training, spatial, n_out,
                       legacy_outputs=True)


@kernel("BatchNormalization", since=9, wants_ctx=True)
def batch_norm_9(X, scale, B, mean, var, *, epsilon=1e-5, momentum=0.9, ctx=None):
    """BatchNormalization-9: always spatial; training statistics when outputs are asked for."""
    n_out = ctx.n_outputs if ctx is not None else 1
    training = n_out > 1 or (ctx is not None and ctx.training)
    return _batch_norm(X, scale, B, mean, var, epsilon, momentum, training, 1, n_out,
                       legacy_outputs=True)


@kernel("BatchNormalization", since=14, wants_ctx=True)
def batch_norm(X, scale, B, input_mean, input_var, *, epsilon=1e-5, momentum=0.9,
               training_mode=0, ctx=None):
    """BatchNormalization-14/15: ``training_mode`` uses batch statistics and returns the
    updated running mean/var (``running = input * momentum + current * (1 - momentum)``)."""
    n_out = ctx.n_outputs if ctx is not None else 1
    training = bool(training_mode) or (ctx is not None and ctx.training)
    return _batch_norm(X, scale, B, input_mean, input_var, epsilon, momentum, training, 1,
                       n_out, legacy_outputs=False)


# --------------------------------------------------------------------------------------------
# Instance / Layer / Group / RMS normalization
# --------------------------------------------------------------------------------------------

def _moments(x, axes):
    mean = x.mean(axis=axes, keepdims=True)
    d = x - mean
    var = (d * d).mean(axis=axes, keepdims=True)
    return mean, d, var


@kernel("InstanceNormalization", since=1, category="normalization")
def instance_norm(input, scale, B, *, consumed_inputs=None, epsilon=1e-5):
    """Per (instance, channel) normalization over the spatial axes, then scale and shift."""
    op = "InstanceNormalization"
    xp = xp_of(input)
    if input.ndim < 3:
        raise ShapeError(f"{op}: input must be (N, C, D1, ...), got {tuple(input.shape)}")
    C = input.shape[1]
    for name, p in (("scale", scale), ("B", B)):
        if tuple(p.shape) != (C,):
            raise ShapeError(f"{op}: {name} must have shape ({C},), got {tuple(p.shape)}")
    x = to_compute(input)
    dt = x.dtype
    _, d, var = _moments(x, tuple(range(2, x.ndim)))
    bshape = (1, C) + (1,) * (x.ndim - 2)
    y = d * (scale.astype(dt).reshape(bshape) / xp.sqrt(var + dt.type(epsilon)))
    y += B.astype(dt).reshape(bshape)
    return y.astype(input.dtype, copy=False)


def _stash_dtype(op, stash_type, x_dtype):
    """(compute dtype, statistics dtype) for a stash_type; float64 inputs stay float64."""
    try:
        st = np.dtype(np_dtype_of_onnx(int(stash_type)))
    except TypeError:
        raise InputError(f"{op}: stash_type={stash_type} is not a known element type") from None
    if np.dtype(x_dtype) == np.float64:
        return np.dtype(np.float64), st
    return compute_dtype(st) if st.name == "bfloat16" else st, st


#: dtypes of the host fast path of LayerNormalization (computed in their own precision)
_LN_FAST = (np.dtype(np.float32), np.dtype(np.float64))


def _layer_norm_last(X, Scale, B, epsilon):
    """LayerNormalization over the last axis of a float32/float64 host array in its own dtype:
    the general path's arithmetic (mean, centred values, mean of squares, ``1 / sqrt(var +
    eps)``, times Scale plus B), each step in place on the arrays it makes. float32 runs the
    compiled kernel (``transformer.layer_norm``) when it is loaded and Scale/B are one row."""
    if X.dtype == np.float32:
        y = rowwise.layer_norm(X, Scale, B, epsilon)
        if y is not None:
            return y
    n = X.shape[-1]
    mean = np.add.reduce(X, axis=-1, keepdims=True)
    np.true_divide(mean, n, out=mean)
    d = X - mean
    var = np.add.reduce(d * d, axis=-1, keepdims=True)
    np.true_divide(var, n, out=var)
    var += X.dtype.type(epsilon)
    np.sqrt(var, out=var)
    np.true_divide(1, var, out=var)
    d *= var
    d *= Scale
    if B is not None:
        d += B
    return d


_LN_BOUND = "layer_norm_bound"   # ctx.extra: an inference node's pre-bound kernel call


@kernel("LayerNormalization", since=17, wants_ctx=True, category="normalization")
def layer_norm(X, Scale, B=None, *, axis=-1, epsilon=1e-5, stash_type=1, ctx=None):
    """Normalize over axes [axis, rank); outputs Y and optionally Mean and InvStdDev."""
    op = "LayerNormalization"
    n_out = ctx.n_outputs if ctx is not None else 1
    extra = getattr(ctx, "extra", None)   # a plan's NodeContext (callers may pass less)
    bindable = extra is not None and not getattr(ctx, "training", True)
    if bindable:
        bound = extra.get(_LN_BOUND)
        if bound is not None:   # a pre-bound kernel call (rowwise.bind_layer_norm)
            y = bound(X, Scale, B)
            if y is not None:
                return y
    if n_out <= 1 and type(X) is np.ndarray and X.dtype in _LN_FAST and X.ndim \
            and stash_type == 1 and (axis == -1 or axis == X.ndim - 1) and X.shape[-1] \
            and type(Scale) is np.ndarray and Scale.dtype == X.dtype \
            and (B is None or (type(B) is np.ndarray and B.dtype == X.dtype)):
        y = _layer_norm_last(X, Scale, B, epsilon)
        if bindable:
            rowwise.bind_layer_norm(extra, _LN_BOUND, X, Scale, B, epsilon)
        return y
    xp = xp_of(X)
    if X.ndim == 0:
        raise ShapeError(f"{op}: X must have rank >= 1")
    a = _axis(op, axis, X.ndim)
    cd, sd = _stash_dtype(op, stash_type, X.dtype)
    x = X.astype(cd, copy=False)
    mean, d, var = _moments(x, tuple(range(a, X.ndim)))
    inv = 1 / xp.sqrt(var + cd.type(epsilon))
    ydt = compute_dtype(X.dtype) if X.dtype != np.float64 else X.dtype
    y = (d * inv).astype(ydt, copy=False) * Scale.astype(ydt, copy=False)
    if B is not None:
        y += B.astype(ydt, copy=False)
    y = y.astype(X.dtype, copy=False)
    n_out = ctx.n_outputs if ctx is not None else 1
    if n_out <= 1:
        return y
    return (y, mean.astype(sd), inv.astype(sd))[:n_out]


def _group_norm(X, scale, bias, epsilon, num_groups, per_channel, cd=None):
    op = "GroupNormalization"
    xp = xp_of(X)
    if X.ndim < 2:
        raise ShapeError(f"{op}: X must have shape (N, C, ...), got {tuple(X.shape)}")
    if num_groups is None:
        raise InputError(f"{op}: attribute num_groups is required")
    N, C = X.shape[:2]
    G = int(num_groups)
    if G < 1 or C % G:
        raise ShapeError(f"{op}: num_groups={G} must divide the {C} channels of X")
    if not per_channel and scale.size == C and C != G:
        per_channel = True  # lenient: per-channel scale/bias written for opset 18
    want = C if per_channel else G
    for name, p in (("scale", scale), ("bias", bias)):
        if p.size != want:
            raise ShapeError(f"{op}: {name} must have {want} values (one per "
                             f"{'channel' if per_channel else 'group'}), got shape "
                             f"{tuple(p.shape)}")
    x = X.astype(cd or compute_dtype(X.dtype), copy=False)
    dt = x.dtype
    xg = x.reshape(N, G, -1)
    _, d, var = _moments(xg, (2,))
    y = (d / xp.sqrt(var + dt.type(epsilon))).reshape(N, C, -1)
    if per_channel:
        s, b = scale.astype(dt).reshape(1, C, 1), bias.astype(dt).reshape(1, C, 1)
    else:
        s = xp.repeat(scale.astype(dt).reshape(G), C // G).reshape(1, C, 1)
        b = xp.repeat(bias.astype(dt).reshape(G), C // G).reshape(1, C, 1)
    y = y * s + b
    return y.reshape(X.shape).astype(X.dtype, copy=False)


@kernel("GroupNormalization", since=18, category="normalization")
def group_norm_18(X, scale, bias, *, epsilon=1e-5, num_groups=None):
    """GroupNormalization-18: scale and bias have one value per *group*."""
    return _group_norm(X, scale, bias, epsilon, num_groups, per_channel=False)


@kernel("GroupNormalization", since=21)
def group_norm(X, scale, bias, *, epsilon=1e-5, num_groups=None, stash_type=1):
    """GroupNormalization-21: scale and bias have one value per *channel*."""
    cd, _ = _stash_dtype("GroupNormalization", stash_type, X.dtype)
    return _group_norm(X, scale, bias, epsilon, num_groups, per_channel=True, cd=cd)


@kernel("RMSNormalization", since=23, category="normalization")
def rms_norm(X, scale, *, axis=-1, epsilon=1e-5, stash_type=1):
    """X / sqrt(mean(X^2 over [axis, rank)) + epsilon) * scale (output has scale's type)."""
    op = "RMSNormalization"
    xp = xp_of(X)
    if X.ndim == 0:
        raise ShapeError(f"{op}: X must have rank >= 1")
    a = _axis(op, axis, X.ndim)
    cd, _ = _stash_dtype(op, stash_type, X.dtype)
    x = X.astype(cd, copy=False)
    ms = (x * x).mean(axis=tuple(range(a, X.ndim)), keepdims=True)
    norm = x / xp.sqrt(ms + cd.type(epsilon))
    out_dt = scale.dtype
    ydt = compute_dtype(out_dt) if out_dt != np.float64 else out_dt
    y = norm.astype(X.dtype, copy=False).astype(ydt, copy=False) * scale.astype(ydt)
    return y.astype(out_dt, copy=False)


# --------------------------------------------------------------------------------------------
# LRN, LpNormalization, MeanVarianceNormalization
# --------------------------------------------------------------------------------------------

@kernel("LRN", since=1, category="normalization")
def lrn(X, *, alpha=1e-4, beta=0.75, bias=1.0, size=None):
    """Local response normalization across channels (window [c - (size-1)//2, ...])."""
    op = "LRN"
    xp = xp_of(X)
    if size is None or int(size) < 1:
        raise InputError(f"{op}: attribute size must be a positive integer, got {size}")
    if X.ndim < 2:
        raise ShapeError(f"{op}: X must have shape (N, C, ...), got {tuple(X.shape)}")
    size = int(size)
    x = to_compute(X)
    dt = x.dtype
    C = x.shape[1]
    # channels further than C - 1 away add nothing: clamp the window (size stays in alpha/size)
    lo = min((size - 1) // 2, max(C - 1, 0))
    hi = min(size - 1 - (size - 1) // 2, max(C - 1, 0))
    sq = x * x
    pad = [(0, 0)] * x.ndim
    pad[1] = (lo, hi)
    sqp = xp.pad(sq, pad)
    s = sqp[:, 0:C].copy()
    for k in range(1, lo + hi + 1):
        s += sqp[:, k:k + C]
    denom = (s * dt.type(alpha / size) + dt.type(bias)) ** dt.type(beta)
    return (x / denom).astype(X.dtype, copy=False)


@kernel("LpNormalization", since=1, category="normalization")
def lp_normalization(input, *, axis=-1, p=2):
    """input / ||input||_p along axis (p in {1, 2}); zero vectors stay zero."""
    op = "LpNormalization"
    xp = xp_of(input)
    p = int(p)
    if p not in (1, 2):
        raise InputError(f"{op}: p={p} is not supported (the spec allows 1 or 2)")
    if input.ndim == 0:
        raise ShapeError(f"{op}: input must have rank >= 1")
    a = _axis(op, axis, input.ndim)
    x = to_compute(input)
    if p == 1:
        norm = xp.abs(x).sum(axis=a, keepdims=True)
    else:
        norm = xp.sqrt((x * x).sum(axis=a, keepdims=True))
    safe = xp.where(norm == 0, 1, norm)
    y = xp.where(norm == 0, 0, x / safe)
    return y.astype(input.dtype, copy=False)


@kernel("MeanVarianceNormalization", since=9, category="normalization")
def mean_variance_normalization(X, *, axes=(0, 2, 3)):
    """(X - E[X]) / (sqrt(Var[X]) + 1e-9) over ``axes``."""
    op = "MeanVarianceNormalization"
    xp = xp_of(X)
    ax = tuple(sorted({_axis(op, a, X.ndim, "axes") for a in axes}))
    x = to_compute(X)
    mean, d, var = _moments(x, ax)
    y = d / (xp.sqrt(var) + x.dtype.type(1e-9))
    return y.astype(X.dtype, copy=False)


# --------------------------------------------------------------------------------------------
# Internal: the weights of a Conv with an inference BatchNormalization folded in
@kernel("FoldBatchNormWeights", since=1, domain=FUSED_DOMAIN, category="normalization")
def fold_batchnorm_weights(W, scale, B, mean, var, conv_bias=None, *, epsilon=1e-5):
    """(W', B') of ``Conv(X, W', B') == BatchNormalization(Conv(X, W, conv_bias))`` in
    inference mode: ``s = scale / sqrt(var + epsilon)``, ``W' = W * s`` (per output channel),
    ``B' = (conv_bias - mean) * s + B``.

    Written by the ``fold_batchnorm`` pass. ``prepare`` folds it once (its inputs are
    constants); a trainable model's inference plan runs it on the current weights, so both
    give the same numbers by construction. The per-channel factors are computed in float64."""
    op = "FoldBatchNormWeights"
    xp = xp_of(W)
    c_out = W.shape[0] if W.ndim else 0
    for name, a in (("scale", scale), ("B", B), ("mean", mean), ("var", var),
                    ("conv_bias", conv_bias)):
        if a is not None and tuple(a.shape) != (c_out,):
            raise ShapeError(f"{op}: {name} must have shape [{c_out}] (one value per output "
                             f"channel of W {list(W.shape)}), got {list(a.shape)}")
    s = scale.astype(np.float64) / xp.sqrt(var.astype(np.float64) + float(epsilon))
    b0 = conv_bias.astype(np.float64) if conv_bias is not None else 0.0
    new_b = ((b0 - mean.astype(np.float64)) * s + B.astype(np.float64)).astype(W.dtype)
    wdt = np.result_type(W.dtype, np.float32)   # half weights scaled in float32
    new_w = (W.astype(wdt, copy=False) * s.astype(wdt).reshape((-1,) + (1,) * (W.ndim - 1)))
    return new_w.astype(W.dtype, copy=False), new_b
