"""Sliding-window helpers shared by the conv and pool kernel families (no kernels).

Geometry (pads, auto_pad, ceil mode, output size) is ``workbench.arrays.geometry`` (shared with
the CUDA kernels, the gradients and the layers); here: padding
(:func:`pad_spatial`), strided window views (:func:`sliding_windows`, :func:`tap_view`, via
``numpy``/``cupy`` ``lib.stride_tricks``), and :class:`WideTaps`, which lays an input out so
that every kernel tap is a contiguous slice. The compute dtype of half floats is
``ops._common.compute_dtype`` (the one half-precision policy).
"""

from __future__ import annotations

import itertools
import math

import numpy as np  # dtype constants and host-side shape arithmetic only

from workbench.arrays import xp_of
from workbench.errors import ShapeError
from workbench.ops.parallel import run_blocks, scratch

# --------------------------------------------------------------------------------------------
# shared window helpers (also used by workbench.ops.pool)
# --------------------------------------------------------------------------------------------

def stride_tricks(xp):
    """``numpy.lib.stride_tricks`` or ``cupy.lib.stride_tricks``, matching the array module."""
    return xp.lib.stride_tricks


def spatial_ints(op, name, value, n, default):
    """An INTS attribute with one value per spatial axis (``default`` when absent)."""
    if value is None or len(value) == 0:
        return [default] * n
    vals = [int(v) for v in value]
    if len(vals) != n:
        raise ShapeError(f"{op}: attribute {name}={vals} has {len(vals)} values but the input "
                         f"has {n} spatial axes")
    return vals


def pad_spatial(x, begin, end, value=0):
    """Pad the spatial axes (2..) of ``x``; negative amounts crop. Returns ``x`` if no-op."""
    xp = xp_of(x)
    if not any(begin) and not any(end):
        return x
    if any(b < 0 for b in begin) or any(e < 0 for e in end):
        sl = [slice(None), slice(None)]
        for b, e, size in zip(begin, end, x.shape[2:]):
            sl.append(slice(max(0, -b), size - max(0, -e)))
        x = x[tuple(sl)]
        begin = [max(0, b) for b in begin]
        end = [max(0, e) for e in end]
    shape = list(x.shape[:2]) + [s + b + e for s, b, e in zip(x.shape[2:], begin, end)]
    out = xp.empty(shape, dtype=x.dtype)
    out.fill(value)
    inner = (slice(None), slice(None)) + tuple(
        slice(b, b + s) for b, s in zip(begin, x.shape[2:]))
    out[inner] = x
    return out


def sliding_windows(xpad, kernel_shape, strides, dilations, out_shape):
    """A strided view of shape ``(N, C, *kernel_shape, *out_shape)`` over a padded input."""
    xp = xp_of(xpad)
    st = xpad.strides
    sp = st[2:]
    shape = tuple(xpad.shape[:2]) + tuple(kernel_shape) + tuple(out_shape)
    strides_b = tuple(st[:2]) + tuple(s * d for s, d in zip(sp, dilations)) + \
        tuple(s * t for s, t in zip(sp, strides))
    return stride_tricks(xp).as_strided(xpad, shape=shape, strides=strides_b)


def tap_view(xpad, tap, strides, dilations, out_shape):
    """The ``(N, C, *out_shape)`` view of ``xpad`` seen by one kernel tap (a multi-index)."""
    sl = (slice(None), slice(None)) + tuple(
        slice(t * d, t * d + (o - 1) * s + 1, s)
        for t, d, o, s in zip(tap, dilations, out_shape, strides))
    return xpad[sl]


class WideTaps:
    """Kernel taps as contiguous slices of a flattened, phase-split, padded copy of the input.

    Tap-by-tap ops (depthwise conv) read one shifted window per kernel tap. Viewed directly
    those windows are strided in every axis and loops crawl along their short rows. Here the
    input is copied once, padded, into ``prod(strides)`` phase images (``phase[r][p] =
    xpad[p * stride + r]``) of shape ``P`` and flattened, so that every tap becomes one
    contiguous slice of length ``L = out[0] * P[1] * ... * P[-1]`` at some offset: the "wide"
    output, whose rows carry ``P[a] - out[a]`` junk columns that :meth:`valid` drops.
    ``flat`` has shape (phases, N, C, prod(P)).
    """

    def __init__(self, x, pb, pe, pad_value, kernel_shape, strides, dilations, out_shape):
        xp = xp_of(x)
        N, C = (int(v) for v in x.shape[:2])
        S = [int(v) for v in x.shape[2:]]
        nd = len(S)
        Sp = [s_ + b + e for s_, b, e in zip(S, pb, pe)]
        self.out_shape = [int(o) for o in out_shape]
        P = [-(-sp // st) for sp, st in zip(Sp, strides)]
        P[0] += 1  # a spare row so that the last tap's slice stays inside the buffer
        self.P = P
        nph = int(math.prod(strides))
        flat = scratch(xp, (nph, N, C) + tuple(P), x.dtype, "taps")
        parts = []  # (phase, destination slices, source slices)
        for ph, r in enumerate(itertools.product(*[range(st) for st in strides])):
            dst, src = [], []
            for a in range(nd):
                st = strides[a]
                p0 = max(0, -(-(pb[a] - r[a]) // st))
                i0 = p0 * st + r[a] - pb[a]
                cnt = min((S[a] - 1 - i0) // st + 1, -(-(Sp[a] - r[a]) // st) - p0)
                if i0 >= S[a] or cnt <= 0:
                    break
                dst.append(slice(p0, p0 + cnt))
                src.append(slice(i0, i0 + (cnt - 1) * st + 1, st))
            else:
                parts.append((ph, tuple(dst), tuple(src)))

        def fill(chunk):
            for n0, n1 in chunk:
                flat[:, n0:n1].fill(pad_value)
                for ph, dst, src in parts:
                    flat[(ph, slice(n0, n1), slice(None)) + dst] = \
                        x[(slice(n0, n1), slice(None)) + src]
        jobs = [(n, n + 1) for n in range(N)] if xp is np else [(0, N)]
        run_blocks(xp, jobs, fill, flat.size)
        self.flat = flat.reshape(nph, N, C, int(math.prod(P)))
        rowlen = [int(math.prod(P[a + 1:])) for a in range(nd)]
        self.rowlen = rowlen[0]
        self.L = self.out_shape[0] * rowlen[0]
        self.taps = []
        for tap in itertools.product(*[range(k) for k in kernel_shape]):
            pos = [t * d for t, d in zip(tap, dilations)]
            phase = 0
            for a in range(nd):
                phase = phase * strides[a] + pos[a] % strides[a]
            off = sum((p // st) * rl for p, st, rl in zip(pos, strides, rowlen))
            self.taps.append((phase, off))

    def views(self):
        """One (N, C, L) view per tap, in tap order."""
        return [self.flat[ph, :, :, off:off + self.L] for ph, off in self.taps]

    def valid(self, wide):
        """The (A, B, rows, *out_shape[1:]) view of the valid outputs of an (A, B, rows * rowlen)
        wide array (``rows`` whole output rows; all of them when the last axis is ``L``)."""
        A, B_ = wide.shape[:2]
        w = wide.reshape((A, B_, -1) + tuple(self.P[1:]))
        return w[(slice(None), slice(None), slice(None)) +
                 tuple(slice(0, o) for o in self.out_shape[1:])]
