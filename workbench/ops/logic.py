"""Comparisons, boolean logic and Where, with numpy-style broadcasting; outputs are bool.

The opset-1 forms of the binary ops also accept the legacy ``broadcast``/``axis`` attributes.
"""

from __future__ import annotations

from workbench.arrays import xp_of
from workbench.ops._common import check_broadcast, ensure_array
from workbench.ops.elementwise import legacy_broadcast
from workbench.ops.registry import kernel


@kernel("Equal", since=1, category="math", host_shape_math=True)
def equal(a, b, *, broadcast=0, axis=None):
    """Elementwise ==, for numbers, bools and strings."""
    b = legacy_broadcast("Equal", a, b, broadcast, axis)
    xp = xp_of(a, b)
    return ensure_array(xp.equal(a, b), xp).astype(bool, copy=False)


@kernel("Less", since=1, category="math", host_shape_math=True)
def less(a, b, *, broadcast=0, axis=None):
    b = legacy_broadcast("Less", a, b, broadcast, axis)
    return ensure_array(xp_of(a, b).less(a, b))


@kernel("Greater", since=1, category="math", host_shape_math=True)
def greater(a, b, *, broadcast=0, axis=None):
    b = legacy_broadcast("Greater", a, b, broadcast, axis)
    return ensure_array(xp_of(a, b).greater(a, b))


@kernel("LessOrEqual", since=12, category="math", host_shape_math=True)
def less_or_equal(a, b):
    check_broadcast("LessOrEqual", a, b)
    return ensure_array(xp_of(a, b).less_equal(a, b))


@kernel("GreaterOrEqual", since=12, category="math", host_shape_math=True)
def greater_or_equal(a, b):
    check_broadcast("GreaterOrEqual", a, b)
    return ensure_array(xp_of(a, b).greater_equal(a, b))


@kernel("And", since=1, category="math", host_shape_math=True)
def and_(a, b, *, broadcast=0, axis=None):
    b = legacy_broadcast("And", a, b, broadcast, axis)
    return ensure_array(xp_of(a, b).logical_and(a, b))


@kernel("Or", since=1, category="math", host_shape_math=True)
def or_(a, b, *, broadcast=0, axis=None):
    b = legacy_broadcast("Or", a, b, broadcast, axis)
    return ensure_array(xp_of(a, b).logical_or(a, b))


@kernel("Xor", since=1, category="math")
def xor(a, b, *, broadcast=0, axis=None):
    b = legacy_broadcast("Xor", a, b, broadcast, axis)
    return ensure_array(xp_of(a, b).logical_xor(a, b))


@kernel("Not", since=1, category="math", host_shape_math=True)
def not_(x):
    return ensure_array(xp_of(x).logical_not(x))


@kernel("Where", since=9, category="math", host_shape_math=True)
def where(condition, x, y):
    """x where condition is true, else y; the three inputs broadcast together."""
    check_broadcast("Where", x, y, condition)
    xp = xp_of(condition, x, y)
    if condition.dtype != bool:
        condition = condition.astype(bool)
    r = ensure_array(xp.where(condition, x, y), xp)
    return r if r.dtype == x.dtype else r.astype(x.dtype)
