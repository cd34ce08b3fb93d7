"""Integer products of 8-bit operands: exact (the ONNX specification), or as onnxruntime computes
u8 x s8 products on x86 CPUs without AVX-512 VNNI (not a family: it registers no kernel).

The specification of every integer product (MatMulInteger, ConvInteger, QLinearMatMul,
QLinearConv and the com.microsoft ops built on them) is exact: each product of two 8-bit values
is summed in 32 bits. That is what the engine computes by default, and what onnx.reference and
onnxruntime on CPUs with AVX-512 VNNI or AVX-VNNI (``vpdpbusd``: four u8 x s8 products summed
straight into int32) compute.

On x86 CPUs without VNNI (AVX2, or AVX-512 without VNNI), onnxruntime multiplies uint8
activations by int8 weights with ``vpmaddubsw``: two adjacent products along the reduction axis
are added in a *16-bit* register, which saturates::

    sum over k of clip(a[2k] * b[2k] + a[2k+1] * b[2k+1], -32768, 32767)

on the raw stored values (the zero points are subtracted afterwards, exactly). Two large
activations (near 255) meeting two large weights of the same sign (near +-127) give up to
2 * 255 * 127 = 64770 and are cut to 32767. :class:`IntegerArithmetic` names the two ways;
``SATURATING_U8S8`` reproduces what such a deployment computes.

The mode reaches a kernel as its keyword ``integer_arithmetic``: an :class:`IntegerArithmetic`
set on the nodes by ``graph.passes.set_integer_arithmetic`` (``backend.prepare(m,
integer_arithmetic=...)``); a value read from a model file (a plain string) is refused.

>>> import numpy as np
>>> a = np.array([[255, 255]], np.uint8); b = np.array([[127], [127]], np.int8)
>>> int(pair_saturated_matmul(a, b)[0, 0]), int((a.astype(int) @ b.astype(int))[0, 0])
(32767, 64770)
"""

from __future__ import annotations

import contextlib
import contextvars
import enum
from dataclasses import dataclass

import numpy as np  # dtype constants and host-side shape arithmetic only

from workbench.arrays import xp_of
from workbench.errors import InputError, ShapeError

#: the kernel keyword (and internal node attribute) that carries the mode
ATTRIBUTE = "integer_arithmetic"

_I16_MIN, _I16_MAX = -32768, 32767
# pair products held at once by the saturating product (int32: 16 MiB)
_CHUNK = 1 << 22


class IntegerArithmetic(str, enum.Enum):
    """How 8-bit integer products are accumulated."""

    #: the ONNX specification: every product summed exactly in 32 bits
    EXACT = "exact"
    #: onnxruntime on x86 without VNNI: u8 x s8 products added in adjacent pairs, each pair
    #: saturated to int16, before the 32-bit sum
    SATURATING_U8S8 = "saturating-u8s8"

    def __str__(self) -> str:
        return self.value


def parse_arithmetic(value) -> IntegerArithmetic:
    """A user's choice (``"exact"``, ``"saturating-u8s8"`` or the enum) as the enum."""
    if isinstance(value, IntegerArithmetic):
        return value
    for mode in IntegerArithmetic:
        if value == mode.value:
            return mode
    choices = ", ".join(repr(m.value) for m in IntegerArithmetic)
    raise InputError(f"integer_arithmetic={value!r} is not one of {choices}")


def arithmetic_of(op: str, value) -> IntegerArithmetic:
    """The mode a kernel received. Only the engine sets it: a string (from a model file's
    attribute of the same name) is refused rather than obeyed."""
    if isinstance(value, IntegerArithmetic):
        return value
    raise InputError(f"{op}: attribute {ATTRIBUTE}={value!r} is not an ONNX attribute; the "
                     f"engine sets it itself (backend.prepare(model, {ATTRIBUTE}=...))")


def saturates(mode: IntegerArithmetic, a_dtype, b_dtype) -> bool:
    """True when ``mode`` saturates the product of an ``a_dtype`` left operand (activations)
    by a ``b_dtype`` right operand (weights): uint8 x int8 under SATURATING_U8S8."""
    return (mode is IntegerArithmetic.SATURATING_U8S8 and np.dtype(a_dtype) == np.uint8
            and np.dtype(b_dtype) == np.int8)


@dataclass
class SaturationCount:
    """What :func:`pair_saturated_matmul` computed inside :func:`counting_saturation`."""

    #: pair sums computed
    pairs: int = 0
    #: pair sums outside int16 (cut to -32768 or 32767)
    saturated: int = 0
    #: dot products (output accumulators) computed
    dots: int = 0
    #: dot products with at least one saturated pair
    dots_affected: int = 0


_COUNTING: contextvars.ContextVar = contextvars.ContextVar("workbench_saturation_count",
                                                           default=None)


@contextlib.contextmanager
def counting_saturation():
    """Count, in this context, the pair sums the saturating products compute and cut.

    >>> import numpy as np
    >>> with counting_saturation() as c:
    ...     _ = pair_saturated_matmul(np.array([[255, 255, 1, 1]], np.uint8),
    ...                               np.array([[127], [127], [1], [1]], np.int8))
    >>> (c.pairs, c.saturated, c.dots, c.dots_affected)
    (2, 1, 1, 1)
    """
    count = SaturationCount()
    token = _COUNTING.set(count)
    try:
        yield count
    finally:
        _COUNTING.reset(token)


def pair_saturated_matmul(a, b):
    """``sum_k clip(a[.., 2k] b[2k, ..] + a[.., 2k+1] b[2k+1, ..], int16)`` as int64.

    ``a`` (..., M, K) and ``b`` (..., K, N) hold integer values (uint8-range and int8-range
    for the instruction it models); the batch dimensions broadcast like ``matmul``. An odd K
    is padded with a zero product (the last pair has one term, which never saturates).

    The exact product runs on BLAS (float64 holds every such sum exactly); only the pairs
    that can leave int16 are formed: pair k of row m can saturate only when
    ``|a[m,2k]| max|b[2k,:]| + |a[m,2k+1]| max|b[2k+1,:]|`` exceeds 32767, and for those the
    cut part ``clip(p) - p`` is added to the exact result."""
    xp = xp_of(a, b)
    a = a.astype(np.int32)
    b = b.astype(np.int32)
    k = a.shape[-1]
    if k % 2:
        a = xp.concatenate([a, xp.zeros(a.shape[:-1] + (1,), np.int32)], axis=-1)
        b = xp.concatenate([b, xp.zeros(b.shape[:-2] + (1, b.shape[-1]), np.int32)], axis=-2)
    m, n, k2 = a.shape[-2], b.shape[-1], a.shape[-1] // 2
    batch = tuple(np.broadcast_shapes(a.shape[:-2], b.shape[:-2]))
    nb = int(np.prod(batch)) if batch else 1
    a = xp.broadcast_to(a, batch + a.shape[-2:]).reshape(nb, m, 2 * k2)
    b = xp.broadcast_to(b, batch + b.shape[-2:]).reshape(nb, 2 * k2, n)
    out = xp.rint(xp.matmul(a.astype(np.float64), b.astype(np.float64))).astype(np.int64)
    count = _COUNTING.get()
    if count is not None:
        count.pairs += nb * m * k2 * n
        count.dots += nb * m * n
    if not (m and n and k2):
        return out.reshape(batch + (m, n))
    per = max(1, _CHUNK // n)             # candidate pairs formed at once
    for i in range(nb):
        a0, a1 = a[i, :, 0::2], a[i, :, 1::2]
        b0, b1 = b[i, 0::2], b[i, 1::2]
        bound = xp.abs(a0) * xp.abs(b0).max(axis=1) + xp.abs(a1) * xp.abs(b1).max(axis=1)
        rows, pairs = xp.nonzero(bound > _I16_MAX)       # row-major: rows ascending
        hit = xp.zeros((m, n), dtype=bool) if count is not None else None
        for c in range(0, int(rows.shape[0]), per):
            r, q = rows[c:c + per], pairs[c:c + per]
            p = a0[r, q][:, None] * b0[q] + a1[r, q][:, None] * b1[q]     # (c, N)
            cut = xp.clip(p, _I16_MIN, _I16_MAX) - p
            first, total = _segments(xp, r, cut.astype(np.int64))
            out[i, r[first]] += total
            if count is not None:
                over = cut != 0
                count.saturated += int(over.sum())
                _, n_over = _segments(xp, r, over.astype(np.int64))
                hit[r[first]] |= n_over > 0
        if count is not None:
            count.dots_affected += int(hit.sum())
    return out.reshape(batch + (m, n))


def _segments(xp, keys, values):
    """For ascending ``keys`` (c,), the index of each run's first element and each run's sum
    of ``values`` (c, N) rows (cumulative sums: no scatter, the same on numpy and cupy)."""
    first = xp.concatenate([xp.zeros(1, dtype=np.int64),
                            xp.nonzero(keys[1:] != keys[:-1])[0].astype(np.int64) + 1])
    last = xp.concatenate([first[1:], xp.asarray([keys.shape[0]], dtype=np.int64)]) - 1
    cs = xp.cumsum(values, axis=0)
    before = xp.concatenate([xp.zeros((1,) + values.shape[1:], values.dtype), cs])[first]
    return first, cs[last] - before


def saturated_product(op: str, a, a_zero_point, b, b_zero_point):
    """``(a - a_zp) @ (b - b_zp)`` (float64) with the raw ``a @ b`` pair-saturated and the
    zero points taken out exactly afterwards, as onnxruntime's u8 x s8 kernels do.

    ``a`` (..., M, K) or (K,), ``b`` (..., K, N) or (K,), like ``matmul``; ``a_zero_point``:
    None, a scalar or per row (broadcasting as (..., M, 1)); ``b_zero_point``: None, a scalar
    or per column (N,)."""
    a_vec, b_vec = a.ndim == 1, b.ndim == 1
    a2 = a.reshape(1, -1) if a_vec else a
    b2 = b.reshape(-1, 1) if b_vec else b
    if a.ndim == 0 or b.ndim == 0 or a2.shape[-1] != b2.shape[-2]:
        raise ShapeError(f"{op}: cannot multiply shapes {tuple(a.shape)} and "
                         f"{tuple(b.shape)}")
    try:
        np.broadcast_shapes(a2.shape[:-2], b2.shape[:-2])
    except ValueError:
        raise ShapeError(f"{op}: shapes {tuple(a.shape)} and {tuple(b.shape)} do not "
                         f"broadcast over their batch dimensions") from None
    raw = pair_saturated_matmul(a2, b2).astype(np.float64)
    k = a2.shape[-1]
    az = None if a_zero_point is None else a_zero_point.astype(np.float64)
    bz = None if b_zero_point is None else b_zero_point.astype(np.float64)
    if az is not None:
        raw -= az * b2.astype(np.float64).sum(axis=-2, keepdims=True)
    if bz is not None:
        raw -= a2.astype(np.float64).sum(axis=-1, keepdims=True) * bz
    if az is not None and bz is not None:
        raw += k * az * bz
    if b_vec:
        raw = raw[..., 0]
    if a_vec:
        raw = raw[..., 0, :] if not b_vec else raw[..., 0]
    return raw
