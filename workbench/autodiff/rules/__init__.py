"""Gradient rules (``workbench.autodiff.rules``), one file per op family, registered per ONNX
op type.

A rule receives the forward node's arrays and returns the gradients of its inputs::

    @gradient("Relu")
    def relu_grad(ctx, grads_out, inputs, outputs, **attrs):
        (gy,), (x,) = grads_out, inputs
        return (gy * (x > 0),)

* ``ctx`` is a :class:`GradContext`: ``ctx.needs_input_grad[i]`` says whether input ``i`` needs
  a gradient (skip expensive work where it does not), ``ctx.opset`` the opset the forward ran
  at, ``ctx.xp`` the array module (numpy or cupy) of the arrays.
* ``grads_out`` holds one array per forward output, ``None`` for outputs that received no
  gradient (at least one is not None).
* ``inputs`` / ``outputs`` are the forward arrays (``None`` for omitted optional inputs);
  ``outputs`` may hold more arrays than the node has outputs when the forward function
  returned extra ones for its rule (training-mode BatchNormalization: batch mean, 1/std).
* ``attrs`` are the node's attributes merged with the spec defaults of ``ctx.opset``.
* It returns a tuple with one entry per input (shorter tuples are padded with ``None``);
  ``None`` where the input is not differentiable or needs no gradient. Each gradient has the
  input's shape (rules un-broadcast with :func:`unbroadcast`).

Rules never import numpy for array work; they use ``ctx.xp`` (or ``xp_of``) so that they run on
cupy as well. Ops composed of primitives need no rule: the tape records the primitives.

Device-specific fast paths are *overrides* registered for an array module, as kernels are::

    @gradient("Conv", xp="cupy")          # workbench/autodiff/rules/cuda.py
    def conv_grad_cuda(ctx, grads_out, inputs, outputs, **attrs): ...

``rule_for(op, domain, xp=cupy)`` (what ``autodiff.backward`` asks for arrays on a GPU) returns
the override, else the portable rule; an override falls back to ``portable_rule(op)`` for the
cases its CUDA kernels do not handle (``cuda_dtypes``: they store float32 or float16 only).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from workbench.ops import registry as _registry
from workbench.ops._common import ints  # noqa: F401 - re-exported for the rules
from workbench.ops.registry import _norm_domain

_RULES: dict[tuple[str, str], Callable] = {}
# array-module name ("cupy") -> (domain, op_type) -> rule
_OVERRIDES: dict[str, dict[tuple[str, str], Callable]] = {}
# modules that register the gradient overrides (and training forms) of an array module
_OVERRIDE_MODULES = {"cupy": "workbench.autodiff.rules.cuda"}
_overrides_loaded: set = set()

_FAMILIES = ("elementwise", "activation", "linalg", "conv", "pool", "norm", "shape", "reduce",
             "loss", "nn")
_loaded = False


def gradient(op_type: str, *, domain: str = "", xp=None):
    """Register the decorated function as the gradient rule of ``op_type``.

    Stack decorators to register one function for several ops. ``xp="cupy"`` registers a
    device-specific override (see the module docstring).
    """

    def deco(fn: Callable) -> Callable:
        if fn.__name__ in ("_", "<lambda>"):
            raise ValueError(f"gradient rule for {op_type} must be a named function")
        xname = _registry._xp_name(xp)
        table = _RULES if xname is None else _OVERRIDES.setdefault(xname, {})
        table[(_norm_domain(domain), op_type)] = fn
        return fn

    return deco


def _ensure_overrides(xname: str) -> None:
    if xname in _overrides_loaded:
        return
    _overrides_loaded.add(xname)
    mod = _OVERRIDE_MODULES.get(xname)
    if mod:
        importlib.import_module(mod)


def _ensure_loaded() -> None:
    global _loaded
    if _loaded:
        return
    _loaded = True
    for name in _FAMILIES:
        importlib.import_module(f"workbench.autodiff.rules.{name}")


def rule_for(op_type: str, domain: str = "", xp=None) -> Callable | None:
    """The gradient rule of ``op_type`` or None; with ``xp`` (an array module or its name) the
    override registered for that module when there is one."""
    _ensure_loaded()
    key = (_norm_domain(domain), op_type)
    xname = _registry._xp_name(xp)
    if xname is not None:
        _ensure_overrides(xname)
        rule = _OVERRIDES.get(xname, {}).get(key)
        if rule is not None:
            return rule
    return _RULES.get(key)


def portable_rule(op_type: str, domain: str = "") -> Callable:
    """The portable rule of ``op_type`` (what an override falls back to)."""
    _ensure_loaded()
    return _RULES[(_norm_domain(domain), op_type)]


def train_form(op_type: str, domain: str = "", opset: int | None = None, xp=None):
    """The registered training-mode kernel entry of ``op_type`` (BatchNormalization's batch
    statistics, Dropout's mask: registered ``@kernel(..., train=True)`` beside their gradient
    rules; with ``xp`` the override for that array module first), or None when the op has
    none. A form with ``same_results`` set computes the same function, only faster for a
    training step (Conv's): :func:`train_form_differs` says whether training changes what
    the op computes."""
    _ensure_loaded()
    xname = _registry._xp_name(xp)
    if xname is not None:
        _ensure_overrides(xname)
    return _registry.train_form(op_type, domain, opset, xp=xname)


def train_form_differs(op_type: str, domain: str = "", opset: int | None = None,
                       xp=None) -> bool:
    """Whether ``op_type`` computes something else in training than in inference (a training
    form not registered ``same_results=True``: BatchNormalization, Dropout)."""
    form = train_form(op_type, domain, opset, xp=xp)
    return form is not None and not form.same_results


def registered_rules() -> list[tuple[str, str]]:
    """[(domain, op_type)] of every registered rule, sorted."""
    _ensure_loaded()
    return sorted(_RULES)


@dataclass
class GradContext:
    """What a gradient rule may know about the forward node."""

    op_type: str
    opset: int
    needs_input_grad: tuple
    xp: Any
    node_name: str = ""
    n_outputs: int = 1
    #: the node's parents as the tape holds them (a leaf Tensor, a (node, index) pair or
    #: None per input; empty when unknown): a rule may treat a leaf's gradient differently
    parents: tuple = ()


def unbroadcast(g, shape):
    """Sum ``g`` over the axes that numpy broadcasting added or stretched to reach ``shape``."""
    shape = tuple(shape)
    if g.shape == shape:
        return g
    nd = g.ndim - len(shape)
    if nd > 0:
        g = g.sum(axis=tuple(range(nd)))
    axes = tuple(i for i, d in enumerate(shape) if d == 1 and g.shape[i] != 1)
    if axes:
        g = g.sum(axis=axes, keepdims=True)
    return g.reshape(shape)


def cuda_dtypes(*arrays) -> bool:
    """True when every array is float32 or float16, the dtypes the CUDA kernels store (float64
    for gradient checks, bfloat16 and ints take the portable path)."""
    return all(a is None or a.dtype.name in ("float32", "float16") for a in arrays)
