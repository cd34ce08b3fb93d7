"""Gradients of activations (Relu family, Sigmoid/Tanh, Softplus, HardSigmoid/HardSwish, PRelu,
Gelu, Mish) and of Softmax / LogSoftmax (both the opset-1..12 "coerce to 2-D" form and the
per-axis form of opset 13)."""

from __future__ import annotations

import math

from workbench.autodiff.rules import gradient, unbroadcast
from workbench.ops._common import stable_sigmoid


def _g(grads_out):
    return grads_out[0]


@gradient("Relu")
def relu_grad(ctx, grads_out, inputs, outputs, **attrs):
    return (_g(grads_out) * (inputs[0] > 0),)


@gradient("LeakyRelu")
def leaky_relu_grad(ctx, grads_out, inputs, outputs, *, alpha=0.01, **attrs):
    xp = ctx.xp
    x, g = inputs[0], _g(grads_out)
    return (xp.where(x > 0, g, g * x.dtype.type(alpha)),)


@gradient("ThresholdedRelu")
def thresholded_relu_grad(ctx, grads_out, inputs, outputs, *, alpha=1.0, **attrs):
    return (_g(grads_out) * (inputs[0] > alpha),)


@gradient("Elu")
def elu_grad(ctx, grads_out, inputs, outputs, *, alpha=1.0, **attrs):
    xp = ctx.xp
    x, y, g = inputs[0], outputs[0], _g(grads_out)
    return (xp.where(x > 0, g, g * (y + x.dtype.type(alpha))),)


@gradient("Selu")
def selu_grad(ctx, grads_out, inputs, outputs, *, alpha=1.67326319217681884765625,
              gamma=1.05070102214813232421875, **attrs):
    xp = ctx.xp
    x, y, g = inputs[0], outputs[0], _g(grads_out)
    t = x.dtype.type
    return (xp.where(x > 0, g * t(gamma), g * (y + t(alpha * gamma))),)


@gradient("Celu")
def celu_grad(ctx, grads_out, inputs, outputs, *, alpha=1.0, **attrs):
    xp = ctx.xp
    x, g = inputs[0], _g(grads_out)
    return (xp.where(x > 0, g, g * xp.exp(x / x.dtype.type(alpha))),)


@gradient("Sigmoid")
def sigmoid_grad(ctx, grads_out, inputs, outputs, **attrs):
    y = outputs[0]
    return (_g(grads_out) * y * (1 - y),)


@gradient("Tanh")
def tanh_grad(ctx, grads_out, inputs, outputs, **attrs):
    y = outputs[0]
    return (_g(grads_out) * (1 - y * y),)


def _sigmoid(xp, x):
    return stable_sigmoid(xp, x)


@gradient("Softplus")
def softplus_grad(ctx, grads_out, inputs, outputs, **attrs):
    return (_g(grads_out) * _sigmoid(ctx.xp, inputs[0]),)


@gradient("Softsign")
def softsign_grad(ctx, grads_out, inputs, outputs, **attrs):
    d = 1 + ctx.xp.abs(inputs[0])
    return (_g(grads_out) / (d * d),)


@gradient("HardSigmoid")
def hard_sigmoid_grad(ctx, grads_out, inputs, outputs, *, alpha=0.2, beta=0.5, **attrs):
    x = inputs[0]
    z = x * x.dtype.type(alpha) + x.dtype.type(beta)
    return (_g(grads_out) * ((z > 0) & (z < 1)) * x.dtype.type(alpha),)


@gradient("HardSwish")
def hard_swish_grad(ctx, grads_out, inputs, outputs, **attrs):
    xp = ctx.xp
    x, g = inputs[0], _g(grads_out)
    mid = (x > -3) & (x < 3)
    d = xp.where(x >= 3, x.dtype.type(1), xp.where(mid, (2 * x + 3) / 6, x.dtype.type(0)))
    return (g * d,)


@gradient("PRelu")
def prelu_grad(ctx, grads_out, inputs, outputs, **attrs):
    xp = ctx.xp
    x, slope = inputs
    g = _g(grads_out)
    pos = x > 0
    gx = xp.where(pos, g, g * slope) if ctx.needs_input_grad[0] else None
    gs = None
    if len(ctx.needs_input_grad) > 1 and ctx.needs_input_grad[1]:
        gs = unbroadcast(xp.where(pos, 0, g * x).astype(slope.dtype), slope.shape)
    return gx, gs


@gradient("Gelu")
def gelu_grad(ctx, grads_out, inputs, outputs, *, approximate="none", **attrs):
    xp = ctx.xp
    x, g = inputs[0], _g(grads_out)
    if approximate == "tanh":
        k = math.sqrt(2.0 / math.pi)
        t = xp.tanh(k * (x + 0.044715 * x * x * x))
        d = 0.5 * (1 + t) + 0.5 * x * (1 - t * t) * k * (1 + 3 * 0.044715 * x * x)
    else:
        from workbench.ops.registry import lookup
        erf = lookup("Erf").fn
        d = 0.5 * (1 + erf(x / math.sqrt(2.0))) + x * xp.exp(-0.5 * x * x) / math.sqrt(
            2 * math.pi)
    return (g * d.astype(x.dtype),)


@gradient("Mish")
def mish_grad(ctx, grads_out, inputs, outputs, **attrs):
    xp = ctx.xp
    x, g = inputs[0], _g(grads_out)
    sp = xp.logaddexp(x, 0)
    t = xp.tanh(sp)
    return (g * (t + x * (1 - t * t) * _sigmoid(xp, x)),)


@gradient("Swish")
def swish_grad(ctx, grads_out, inputs, outputs, *, alpha=1.0, **attrs):
    xp = ctx.xp
    x, g = inputs[0], _g(grads_out)
    s = _sigmoid(xp, x * x.dtype.type(alpha))
    return (g * (s + x * x.dtype.type(alpha) * s * (1 - s)),)


def _softmax_view(ctx, x, axis):
    """(2-D reshape target or None, axis to reduce) for the opset's Softmax semantics."""
    axis = axis % x.ndim if x.ndim else 0
    if ctx.opset < 13:
        lead = int(math.prod(x.shape[:axis]))
        return (lead, -1), -1
    return None, axis


@gradient("Softmax")
def softmax_grad(ctx, grads_out, inputs, outputs, *, axis=None, **attrs):
    x, y, g = inputs[0], outputs[0], _g(grads_out)
    if axis is None:
        axis = 1 if ctx.opset < 13 else -1
    shape2, ax = _softmax_view(ctx, x, axis)
    if shape2 is not None:
        y2, g2 = y.reshape(shape2), g.reshape(shape2)
        return ((y2 * (g2 - (g2 * y2).sum(axis=-1, keepdims=True))).reshape(x.shape),)
    return (y * (g - (g * y).sum(axis=ax, keepdims=True)),)


@gradient("LogSoftmax")
def log_softmax_grad(ctx, grads_out, inputs, outputs, *, axis=None, **attrs):
    xp = ctx.xp
    x, y, g = inputs[0], outputs[0], _g(grads_out)
    if axis is None:
        axis = 1 if ctx.opset < 13 else -1
    shape2, ax = _softmax_view(ctx, x, axis)
    if shape2 is not None:
        y2, g2 = y.reshape(shape2), g.reshape(shape2)
        return ((g2 - xp.exp(y2) * g2.sum(axis=-1, keepdims=True)).reshape(x.shape),)
    return (g - xp.exp(y) * g.sum(axis=ax, keepdims=True),)
