"""Dropout: the training-mode forward (inverted dropout with a mask output) and its gradient.

In inference Dropout is the identity (the registered kernel); in training
:func:`dropout_train` keeps each element with probability ``1 - ratio`` and scales the kept
ones by ``1 / (1 - ratio)`` (ONNX Dropout-12+ semantics), returning ``(output, mask)``.
"""

from __future__ import annotations

import numpy as np

from workbench.arrays import xp_of
from workbench.arrays.device import host_rng
from workbench.autodiff.rules import gradient
from workbench.ops.registry import kernel


def _ratio(ratio, attrs_ratio=0.5) -> float:
    if ratio is None:
        return float(attrs_ratio)
    return float(ratio)


@kernel("Dropout", since=1, train=True)
def dropout_train(data, ratio=None, training_mode=None, *, seed=None, **attrs):
    """Training-mode Dropout (the op's registered training form): (output, bool mask)."""
    xp = xp_of(data)
    r = _ratio(ratio, attrs.get("ratio", 0.5))
    if r <= 0.0:
        return data, xp.ones(data.shape, dtype=bool)
    if r >= 1.0:
        return xp.zeros_like(data), xp.zeros(data.shape, dtype=bool)
    if xp is np:
        mask = host_rng().random(data.shape, dtype=np.float32) >= r
    else:  # pragma: no cover - GPU: cupy's generator, seeded by Device.SetRandSeed
        mask = xp.random.random(data.shape, dtype=xp.float32) >= r
    scale = data.dtype.type(1.0 / (1.0 - r))
    return data * mask * scale, mask


@gradient("Dropout")
def dropout_grad(ctx, grads_out, inputs, outputs, training=False, **attrs):
    g = grads_out[0]
    if g is None:
        return (None,) * len(inputs)
    mode = inputs[2] if len(inputs) > 2 else None
    is_training = training or (mode is not None and bool(mode))
    if ctx.opset < 12:
        is_training = training
    rest = (None,) * (len(inputs) - 1)
    if not is_training or len(outputs) < 2 or outputs[1] is None:
        return (g,) + rest
    r = _ratio(inputs[1] if len(inputs) > 1 else None, attrs.get("ratio", 0.5))
    if r >= 1.0:
        return (g * 0,) + rest
    return (g * outputs[1] * g.dtype.type(1.0 / (1.0 - r)),) + rest
