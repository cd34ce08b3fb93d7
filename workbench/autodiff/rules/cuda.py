"""GPU fast paths of gradient rules and training forms, registered as overrides for cupy.

A cupy-only module: ``rules.rule_for(op, xp=cupy)`` imports it on the first request for arrays
on a GPU (``autodiff.backward``), and gets the rules below; a Tensor run in training mode on a
GPU gets the training forms below (``rules.train_form(..., xp=cupy)``). The CUDA kernels they
call are ``workbench.arrays.cuda``'s. Each falls back to the portable rule or form for the
cases its CUDA kernels do not handle (dtypes other than float32/float16, ranks other than
2-D images, weights...). Nothing here is picked by a device flag inside a portable rule.
"""

from __future__ import annotations

import numpy as np

from workbench.arrays.cuda import conv as _conv
from workbench.arrays.cuda import norm as _norm
from workbench.arrays.cuda import pool as _pool
from workbench.arrays.cuda import softmax as _softmax
from workbench.autodiff.rules import cuda_dtypes, gradient, portable_rule
from workbench.autodiff.rules.conv import _geometry, conv_bias_grad
from workbench.autodiff.rules.norm import _bn_axes_shape, batchnorm_train
from workbench.autodiff.rules.pool import _pool_geometry
from workbench.ops.registry import kernel


@gradient("Conv", xp="cupy")
def conv_grad_cuda(ctx, grads_out, inputs, outputs, *, group=1, **attrs):
    """im2col/col2im kernels + cuBLAS."""
    x, w = inputs[0], inputs[1]
    b = inputs[2] if len(inputs) > 2 else None
    g = grads_out[0]
    if x.ndim != 4 or not cuda_dtypes(x, w, g):
        return portable_rule("Conv")(ctx, grads_out, inputs, outputs, group=group, **attrs)
    k, s, d, pb, pe = _geometry(x, w, outputs[0], attrs)
    need = ctx.needs_input_grad
    geo = {"strides": s, "pads": pb + pe, "dilations": d, "group": group}
    gx = _conv.conv2d_backward_data(g, w, x.shape, **geo) if need[0] else None
    gw = _conv.conv2d_backward_weight(g, x, w.shape, **geo) if need[1] else None
    return gx, gw, conv_bias_grad(g, b, need)


@gradient("MaxPool", xp="cupy")
def max_pool_grad_cuda(ctx, grads_out, inputs, outputs, **attrs):
    """Argmax from the forward kernel, then one gather kernel."""
    x, g = inputs[0], grads_out[0]
    if g is None or x.ndim != 4 or not cuda_dtypes(x):
        return portable_rule("MaxPool")(ctx, grads_out, inputs, outputs, **attrs)
    k, s, d, pb, _ = _pool_geometry(x, outputs[0], attrs)
    _, arg = _pool.maxpool2d(x, k, s, pb, d, tuple(g.shape[2:]), return_argmax=True)
    return (_pool.maxpool2d_backward(g, arg, x.shape, k, s, pb, d),)


@gradient("AveragePool", xp="cupy")
def average_pool_grad_cuda(ctx, grads_out, inputs, outputs, *, count_include_pad=0, **attrs):
    x, g = inputs[0], grads_out[0]
    if x.ndim != 4 or not cuda_dtypes(x):
        return portable_rule("AveragePool")(ctx, grads_out, inputs, outputs,
                                            count_include_pad=count_include_pad, **attrs)
    k, s, d, pb, pe = _pool_geometry(x, outputs[0], attrs)
    return (_pool.avgpool2d_backward(g, x.shape, k, s, pb, pe, d,
                                     count_include_pad=bool(count_include_pad)),)


@gradient("SoftmaxCrossEntropyLoss", xp="cupy")
def softmax_cross_entropy_grad_cuda(ctx, grads_out, inputs, outputs, *, reduction="mean",
                                    ignore_index=None, **attrs):
    x, labels = inputs[0], inputs[1]
    weights = inputs[2] if len(inputs) > 2 else None
    if (x.ndim != 2 or weights is not None or not cuda_dtypes(x) or grads_out[0] is None
            or (len(grads_out) > 1 and grads_out[1] is not None)):
        return portable_rule("SoftmaxCrossEntropyLoss")(
            ctx, grads_out, inputs, outputs, reduction=reduction, ignore_index=ignore_index,
            **attrs)
    return (_softmax.softmax_cross_entropy_backward(x, labels, grads_out[0],
                                                    reduction=reduction,
                                                    ignore_index=ignore_index), None, None)


@gradient("BatchNormalization", xp="cupy")
def batch_norm_grad_cuda(ctx, grads_out, inputs, outputs, *, epsilon=1e-5, training_mode=0,
                         spatial=1, **attrs):
    """Training mode: one reduction kernel + one elementwise kernel."""
    x, scale, bias = inputs[:3]
    g = grads_out[0]
    training = bool(training_mode) or attrs.get("training", False)
    axes, bshape = _bn_axes_shape(x, scale, spatial)
    per_channel = len(bshape) >= 2 and bshape[1] == x.shape[1] and all(
        d == 1 for i, d in enumerate(bshape) if i != 1)
    if g is None or not training or not per_channel or not cuda_dtypes(x, g):
        return portable_rule("BatchNormalization")(
            ctx, grads_out, inputs, outputs, epsilon=epsilon, training_mode=training_mode,
            spatial=spatial, **attrs)
    if len(outputs) >= 5:  # statistics kept by the training form
        bm, inv = outputs[3].reshape(bshape), outputs[4].reshape(bshape)
    else:
        bm = x.mean(axis=axes).reshape(bshape)
        inv = 1.0 / (x.var(axis=axes).reshape(bshape) + epsilon) ** 0.5
    need = ctx.needs_input_grad
    gx, sgx, sg = _norm.batchnorm_backward(g, x, bm, inv, scale, need_dx=need[0])
    return (gx, sgx.astype(scale.dtype).reshape(scale.shape) if need[1] else None,
            sg.astype(bias.dtype).reshape(bias.shape) if need[2] else None, None, None)


@kernel("BatchNormalization", since=1, train=True, xp="cupy")
def batchnorm_train_cuda(x, scale, bias, input_mean, input_var, *, epsilon=1e-5, momentum=0.9,
                         training_mode=1, spatial=1, **unused):
    """Training-mode BatchNormalization: one statistics kernel + one apply kernel; outputs as
    the portable form's (Y, running mean, running var, batch mean, 1/std)."""
    if not (spatial and x.ndim >= 2 and tuple(scale.shape) == (x.shape[1],)
            and cuda_dtypes(x)):
        return batchnorm_train(x, scale, bias, input_mean, input_var, epsilon=epsilon,
                               momentum=momentum, training_mode=training_mode,
                               spatial=spatial, **unused)
    y, mean, var = _norm.batchnorm_training(x, scale, bias, float(epsilon))
    inv = 1.0 / _norm.cupy_module().sqrt(var + np.float32(epsilon))
    m = np.float32(momentum)
    run_mean = (input_mean * m + mean.astype(input_mean.dtype) * (1 - m)).astype(
        input_mean.dtype)
    run_var = (input_var * m + var.astype(input_var.dtype) * (1 - m)).astype(input_var.dtype)
    return (y, run_mean.reshape(input_mean.shape), run_var.reshape(input_var.shape), mean, inv)
