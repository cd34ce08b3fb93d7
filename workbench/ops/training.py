"""Optimizers of the ``ai.onnx.preview.training`` domain (opset 1): Adagrad, Adam, Momentum.

Each op takes the learning rate ``R`` and update count ``T`` (scalars), then a variadic list
of tensor groups (the parameters, their gradients, then their optimizer states, group by group),
and returns the updated parameters followed by the updated states, in the same group order.
Several parameters may be optimised by one node; each is updated independently.
"""

from __future__ import annotations

import math

from workbench.arrays import xp_of
from workbench.errors import InputError, ShapeError
from workbench.ops._common import scalar_of
from workbench.ops.registry import kernel

_DOMAIN = "ai.onnx.preview.training"


def _scalar(x, op, name):
    return scalar_of(op, name, x).item() if hasattr(x, "size") else x


def _groups(inputs, n_groups, op, names):
    if not inputs or len(inputs) % n_groups:
        raise InputError(f"{op}: expected the inputs R, T, then {n_groups} equally long groups "
                         f"({', '.join(names)}), got {len(inputs)} tensors after R and T")
    n = len(inputs) // n_groups
    groups = [inputs[i * n:(i + 1) * n] for i in range(n_groups)]
    for k in range(n):
        shapes = [g[k].shape for g in groups]
        if any(s != shapes[0] for s in shapes):
            raise ShapeError(f"{op}: tensor {k} and its {', '.join(names[1:])} must have the "
                             f"same shape, got {shapes}")
    return groups


@kernel("Adagrad", since=1, domain=_DOMAIN)
def adagrad(R, T, *inputs, decay_factor, epsilon, norm_coefficient):
    """X_new = X - r * G' / (sqrt(H + G'^2) + eps) with r = R / (1 + T * decay_factor)."""
    xs, gs, hs = _groups(inputs, 3, "Adagrad", ("X", "gradient", "accumulated squared gradient"))
    r = float(_scalar(R, "Adagrad", "R")) / (1.0 + float(_scalar(T, "Adagrad", "T"))
                                             * decay_factor)
    new_x, new_h = [], []
    for x, g, h in zip(xs, gs, hs):
        xp = xp_of(x)
        dt = x.dtype
        g_reg = dt.type(norm_coefficient) * x + g
        h_new = h + g_reg * g_reg
        x_new = x - dt.type(r) * g_reg / (xp.sqrt(h_new) + dt.type(epsilon))
        new_x.append(x_new.astype(dt))
        new_h.append(h_new.astype(h.dtype))
    return tuple(new_x + new_h)


@kernel("Adam", since=1, domain=_DOMAIN)
def adam(R, T, *inputs, alpha, beta, epsilon, norm_coefficient, norm_coefficient_post):
    """Adam with bias-corrected learning rate and optional post-update decay."""
    xs, gs, vs, hs = _groups(inputs, 4, "Adam", ("X", "gradient", "accumulated gradient",
                                                  "accumulated squared gradient"))
    lr = float(_scalar(R, "Adam", "R"))
    t = float(_scalar(T, "Adam", "T"))
    if t > 0:
        lr = lr * math.sqrt(1.0 - beta ** t) / (1.0 - alpha ** t)
    new_x, new_v, new_h = [], [], []
    for x, g, v, h in zip(xs, gs, vs, hs):
        xp = xp_of(x)
        dt = x.dtype
        g_reg = dt.type(norm_coefficient) * x + g
        v_new = dt.type(alpha) * v + dt.type(1.0 - alpha) * g_reg
        h_new = dt.type(beta) * h + dt.type(1.0 - beta) * g_reg * g_reg
        x_new = x - dt.type(lr) * v_new / (xp.sqrt(h_new) + dt.type(epsilon))
        x_new = dt.type(1.0 - norm_coefficient_post) * x_new
        new_x.append(x_new.astype(dt))
        new_v.append(v_new.astype(v.dtype))
        new_h.append(h_new.astype(h.dtype))
    return tuple(new_x + new_v + new_h)


@kernel("Momentum", since=1, domain=_DOMAIN)
def momentum(R, T, *inputs, alpha, beta, mode, norm_coefficient):
    """SGD with standard or Nesterov momentum."""
    if mode not in ("standard", "nesterov"):
        raise InputError(f"Momentum: mode {mode!r} is not supported (supported: standard, "
                         f"nesterov)")
    xs, gs, vs = _groups(inputs, 3, "Momentum", ("X", "gradient", "momentum"))
    lr = float(_scalar(R, "Momentum", "R"))
    t = float(_scalar(T, "Momentum", "T"))
    beta_adj = beta if t > 0 else 1.0
    new_x, new_v = [], []
    for x, g, v in zip(xs, gs, vs):
        dt = x.dtype
        g_reg = dt.type(norm_coefficient) * x + g
        v_new = dt.type(alpha) * v + dt.type(beta_adj) * g_reg
        if mode == "standard":
            x_new = x - dt.type(lr) * v_new
        else:
            x_new = x - dt.type(lr) * (g_reg + dt.type(alpha) * v_new)
        new_x.append(x_new.astype(dt))
        new_v.append(v_new.astype(v.dtype))
    return tuple(new_x + new_v)
