"""The cupy overrides of the portable ONNX kernels: our CUDA kernels registered for ``xp="cupy"``.

The raw kernels (CUDA C in cupy ``RawKernel``/``ElementwiseKernel``s) live in
``workbench/arrays/cuda/``; this module, in the ops layer, registers them as overrides. The
registry imports it on the first ``lookup(..., xp="cupy")`` (a Plan built for a CUDA device),
never for a CPU plan; importing it needs neither cupy nor a GPU. Each override has the portable
kernel's signature; it handles float32/float16 cupy inputs of the common 2-D / last-axis cases
and hands everything else (other ranks, dtypes, attribute combinations, or inputs that are not
cupy arrays) to the portable kernel (``registry.portable``).
"""

from __future__ import annotations

import numpy as np

from workbench.arrays.cuda import _base
from workbench.arrays.cuda import conv as _conv
from workbench.arrays.cuda import elementwise as _ew
from workbench.arrays.cuda import norm as _norm
from workbench.arrays.cuda import pool as _pool
from workbench.arrays.cuda import softmax as _sm
from workbench.ops.registry import FUSED_DOMAIN, kernel, portable

CUPY = "cupy"


def _ints(v, n, default):
    return [int(a) for a in v] if v is not None and len(v) else [default] * n


def _attr_str(v):
    return v.decode() if isinstance(v, bytes) else (v or "NOTSET")


# ----------------------------------------------------------------------------- Conv
@kernel("Conv", since=1, xp=CUPY)
def conv_cuda(X, W, B=None, *, auto_pad="NOTSET", dilations=None, group=1, kernel_shape=None,
              pads=None, strides=None):
    kw = dict(auto_pad=auto_pad, dilations=dilations, group=group, kernel_shape=kernel_shape,
              pads=pads, strides=strides)
    ok = (X.ndim == 4 and W.ndim == 4 and _base.supported(X, W) and
          (B is None or _base.supported(X, B)) and int(group) >= 1 and
          X.shape[1] == W.shape[1] * int(group) and W.shape[0] % int(group) == 0 and
          (kernel_shape is None or list(kernel_shape) == list(W.shape[2:])) and
          (B is None or tuple(B.shape) == (W.shape[0],)))
    geo = _conv.conv_geometry(X.shape[2:], W.shape[2:], _ints(strides, 2, 1),
                              _ints(dilations, 2, 1), pads, _attr_str(auto_pad)) if ok else None
    if geo is None or min(geo[2]) < 1:
        return portable("Conv", 1)(X, W, B, **kw)
    pb, pe, _ = geo
    return _conv.conv2d(X, W, B, strides=_ints(strides, 2, 1), pads=pb + pe,
                        dilations=_ints(dilations, 2, 1), group=int(group))


@kernel("FusedConv", since=1, domain=FUSED_DOMAIN, xp=CUPY)
def fused_conv_cuda(X, W, B=None, Z=None, *, activation="", activation_params=(),
                    auto_pad="NOTSET", dilations=None, group=1, kernel_shape=None, pads=None,
                    strides=None):
    """Conv with the residual add and the activation in the GEMM's epilogue pass."""
    kw = dict(auto_pad=auto_pad, dilations=dilations, group=group, kernel_shape=kernel_shape,
              pads=pads, strides=strides)
    act = activation.decode() if isinstance(activation, bytes) else (activation or "")
    ok = (X.ndim == 4 and W.ndim == 4 and _base.supported(X, W) and
          (B is None or _base.supported(X, B)) and (Z is None or _base.supported(X, Z)) and
          int(group) >= 1 and X.shape[1] == W.shape[1] * int(group) and
          W.shape[0] % int(group) == 0 and act in _conv.ACTIVATIONS and
          (kernel_shape is None or list(kernel_shape) == list(W.shape[2:])) and
          (B is None or tuple(B.shape) == (W.shape[0],)))
    geo = _conv.conv_geometry(X.shape[2:], W.shape[2:], _ints(strides, 2, 1),
                              _ints(dilations, 2, 1), pads, _attr_str(auto_pad)) if ok else None
    if geo is None or min(geo[2]) < 1 or (
            Z is not None and tuple(Z.shape) != (X.shape[0], W.shape[0], *geo[2])):
        return portable("FusedConv", 1, FUSED_DOMAIN)(
            X, W, B, Z, activation=act, activation_params=activation_params, **kw)
    pb, pe, _ = geo
    p = [float(v) for v in (activation_params or ())] + [0.0, 0.0]
    return _conv.conv2d(X, W, B, strides=_ints(strides, 2, 1), pads=pb + pe,
                        dilations=_ints(dilations, 2, 1), group=int(group), z=Z,
                        activation=act, alpha=p[0], beta=p[1])


@kernel("ConvTranspose", since=11, xp=CUPY)
def conv_transpose_cuda(X, W, B=None, *, auto_pad="NOTSET", dilations=None, group=1,
                        kernel_shape=None, output_padding=None, output_shape=None, pads=None,
                        strides=None):
    kw = dict(auto_pad=auto_pad, dilations=dilations, group=group, kernel_shape=kernel_shape,
              output_padding=output_padding, output_shape=output_shape, pads=pads,
              strides=strides)
    G = int(group)
    ok = (X.ndim == 4 and W.ndim == 4 and _base.supported(X, W) and
          (B is None or _base.supported(X, B)) and _attr_str(auto_pad) in ("NOTSET", "VALID")
          and (output_shape is None or not len(output_shape)) and G >= 1 and
          X.shape[1] == W.shape[0] and W.shape[0] % G == 0 and
          (kernel_shape is None or list(kernel_shape) == list(W.shape[2:])) and
          (B is None or tuple(B.shape) == (W.shape[1] * G,)))
    if not ok:
        return portable("ConvTranspose", 11)(X, W, B, **kw)
    p = _ints(pads, 4, 0) if _attr_str(auto_pad) == "NOTSET" else [0, 0, 0, 0]
    return _conv.conv_transpose2d(X, W, B, strides=_ints(strides, 2, 1), pads=p,
                                  dilations=_ints(dilations, 2, 1), group=G,
                                  output_padding=_ints(output_padding, 2, 0))


# ----------------------------------------------------------------------------- pools
def _pool_args(X, kernel_shape, strides, dilations, pads, auto_pad, ceil_mode):
    if X.ndim != 4 or not _base.supported(X) or kernel_shape is None or len(kernel_shape) != 2:
        return None
    ks = [int(k) for k in kernel_shape]
    st, dl = _ints(strides, 2, 1), _ints(dilations, 2, 1)
    geo = _pool.pool_geometry(X.shape[2:], ks, st, dl, pads, _attr_str(auto_pad),
                              int(ceil_mode))
    if geo is None or min(geo[2]) < 1:
        return None
    return ks, st, dl, geo


@kernel("MaxPool", since=1, wants_ctx=True, xp=CUPY)
def max_pool_cuda(X, *, auto_pad="NOTSET", ceil_mode=0, dilations=None, kernel_shape=None,
                  pads=None, storage_order=0, strides=None, ctx=None):
    a = None if ctx is not None and ctx.n_outputs > 1 else \
        _pool_args(X, kernel_shape, strides, dilations, pads, auto_pad, ceil_mode)
    if a is None:
        return portable("MaxPool", 1)(X, auto_pad=auto_pad, ceil_mode=ceil_mode,
                                      dilations=dilations, kernel_shape=kernel_shape, pads=pads,
                                      storage_order=storage_order, strides=strides, ctx=ctx)
    ks, st, dl, (pb, pe, out) = a
    return _pool.maxpool2d(X, ks, st, pb, dl, out)


@kernel("AveragePool", since=1, xp=CUPY)
def average_pool_cuda(X, *, auto_pad="NOTSET", ceil_mode=0, count_include_pad=0,
                      dilations=None, kernel_shape=None, pads=None, strides=None):
    a = _pool_args(X, kernel_shape, strides, dilations, pads, auto_pad, ceil_mode)
    if a is None:
        return portable("AveragePool", 1)(X, auto_pad=auto_pad, ceil_mode=ceil_mode,
                                          count_include_pad=count_include_pad,
                                          dilations=dilations, kernel_shape=kernel_shape,
                                          pads=pads, strides=strides)
    ks, st, dl, (pb, pe, out) = a
    return _pool.avgpool2d(X, ks, st, pb, pe, dl, out,
                           count_include_pad=bool(count_include_pad))


# ----------------------------------------------------------------------------- BatchNorm
def _bn_ok(X, *params):
    return (X.ndim >= 2 and _base.supported(X) and
            all(p is not None and p.ndim == 1 and p.shape[0] == X.shape[1] and
                _base.cupy_module() is not None and isinstance(p, _base.cupy_module().ndarray)
                and p.dtype.kind == "f" for p in params))


def _bn_cuda(X, scale, B, mean, var, epsilon, momentum, training, n_out, legacy):
    if not training:
        return _norm.batchnorm_inference(X, scale, B, mean, var, epsilon)
    y, cur_mean, cur_var = _norm.batchnorm_training(X, scale, B, epsilon)
    mom = np.float32(momentum)
    run_mean = (mean.astype(np.float32) * mom + cur_mean * (1 - mom)).astype(mean.dtype)
    run_var = (var.astype(np.float32) * mom + cur_var * (1 - mom)).astype(var.dtype)
    outs = [y, run_mean, run_var]
    if legacy:
        outs += [cur_mean.astype(mean.dtype), cur_var.astype(var.dtype)]
    return tuple(outs[:max(1, n_out)]) if n_out > 1 else y


@kernel("BatchNormalization", since=9, wants_ctx=True, xp=CUPY)
def batch_norm_9_cuda(X, scale, B, mean, var, *, epsilon=1e-5, momentum=0.9, ctx=None):
    if not _bn_ok(X, scale, B, mean, var):
        return portable("BatchNormalization", 9)(X, scale, B, mean, var, epsilon=epsilon,
                                                 momentum=momentum, ctx=ctx)
    n_out = ctx.n_outputs if ctx is not None else 1
    training = n_out > 1 or (ctx is not None and ctx.training)
    return _bn_cuda(X, scale, B, mean, var, epsilon, momentum, training, n_out, True)


@kernel("BatchNormalization", since=14, wants_ctx=True, xp=CUPY)
def batch_norm_cuda(X, scale, B, input_mean, input_var, *, epsilon=1e-5, momentum=0.9,
                    training_mode=0, ctx=None):
    if not _bn_ok(X, scale, B, input_mean, input_var):
        return portable("BatchNormalization", 14)(X, scale, B, input_mean, input_var,
                                                  epsilon=epsilon, momentum=momentum,
                                                  training_mode=training_mode, ctx=ctx)
    n_out = ctx.n_outputs if ctx is not None else 1
    training = bool(training_mode) or (ctx is not None and ctx.training)
    return _bn_cuda(X, scale, B, input_mean, input_var, epsilon, momentum, training, n_out,
                    False)


# ----------------------------------------------------------------------------- LayerNorm
@kernel("LayerNormalization", since=17, wants_ctx=True, xp=CUPY)
def layer_norm_cuda(X, Scale, B=None, *, axis=-1, epsilon=1e-5, stash_type=1, ctx=None):
    a = int(axis) + (X.ndim if int(axis) < 0 else 0) if X.ndim else -1
    tail = tuple(X.shape[a:]) if 0 <= a < X.ndim else None
    ok = (tail is not None and int(stash_type) == 1 and _base.supported(X, Scale) and
          Scale.size == int(np.prod(tail)) and Scale.shape == tail[len(tail) - Scale.ndim:] and
          (B is None or (_base.supported(X, B) and B.shape == Scale.shape)))
    if not ok:
        return portable("LayerNormalization", 17)(X, Scale, B, axis=axis, epsilon=epsilon,
                                                  stash_type=stash_type, ctx=ctx)
    n_out = ctx.n_outputs if ctx is not None else 1
    if n_out <= 1:
        return _norm.layernorm(X, Scale, B, a, epsilon)
    return _norm.layernorm(X, Scale, B, a, epsilon, want_stats=True)[:n_out]


# ----------------------------------------------------------------------------- Softmax
def _softmax_override(op, since, log):
    def fn(x, *, axis=-1 if since >= 13 else 1):
        last = x.ndim >= 1 and int(axis) in (-1, x.ndim - 1)
        if not (last and _base.supported(x)):
            return portable(op, since)(x, axis=axis)
        return _sm.softmax_lastdim(x, log=log)
    fn.__name__ = f"{op.lower()}_{since}_cuda"
    return fn


for _op, _log in (("Softmax", False), ("LogSoftmax", True)):
    for _since in (1, 13):
        kernel(_op, since=_since, xp=CUPY)(_softmax_override(_op, _since, _log))


@kernel("SoftmaxCrossEntropyLoss", since=12, wants_ctx=True, xp=CUPY)
def softmax_cross_entropy_loss_cuda(scores, labels, weights=None, *, reduction="mean",
                                    ignore_index=None, ctx=None):
    red = reduction.decode() if isinstance(reduction, bytes) else reduction
    ok = (weights is None and scores.ndim == 2 and labels is not None and labels.ndim == 1 and
          labels.dtype.kind in "iu" and _base.supported(scores) and
          red in ("none", "sum", "mean") and
          isinstance(labels, _base.cupy_module().ndarray))
    if not ok:
        return portable("SoftmaxCrossEntropyLoss", 12)(scores, labels, weights,
                                                       reduction=reduction,
                                                       ignore_index=ignore_index, ctx=ctx)
    want = ctx is not None and ctx.n_outputs > 1
    return _sm.softmax_cross_entropy(scores, labels, reduction=red, ignore_index=ignore_index,
                                     want_log_prob=want)


# ----------------------------------------------------------------------------- GELU / Erf
@kernel("Gelu", since=20, xp=CUPY)
def gelu_cuda(x, *, approximate="none"):
    ap = approximate.decode() if isinstance(approximate, bytes) else approximate
    if not _base.supported(x) or ap not in ("none", "tanh"):
        return portable("Gelu", 20)(x, approximate=approximate)
    return _ew.gelu(x, ap)


@kernel("Erf", since=9, xp=CUPY)
def erf_cuda(x):
    if not _base.supported(x):
        return portable("Erf", 9)(x)
    return _ew.erf(x)
