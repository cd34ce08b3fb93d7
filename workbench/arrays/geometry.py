"""Sliding-window geometry: the one place for auto_pad (SAME_UPPER, SAME_LOWER, VALID,
explicit pads), ceil mode and the output size of convolutions and pools.

Used by the portable kernels (``ops/conv.py``, ``ops/pool.py``, ``ops/quant.py``), the CUDA
kernels (``arrays/cuda``), the gradient rules and the layers.
"""

from __future__ import annotations

import functools

from workbench.errors import InputError, ShapeError
from workbench.limits import check_alloc

_AUTO_PADS = ("NOTSET", "SAME_UPPER", "SAME_LOWER", "VALID")


def norm_auto_pad(op, auto_pad):
    ap = auto_pad or "NOTSET"
    if isinstance(ap, bytes):
        ap = ap.decode()
    ap = ap.upper()
    if ap not in _AUTO_PADS:
        raise InputError(f"{op}: auto_pad={auto_pad!r} is not supported "
                         f"(supported: {', '.join(_AUTO_PADS)})")
    return ap


def window_geometry(op, in_shape, kernel_shape, strides, dilations, pads, auto_pad,
                    ceil_mode=False):
    """Padding and output size of a sliding-window op (Conv, pools) per spatial axis.

    Returns ``(pads_begin, pads_end, out_shape, extra_end)`` (new lists): ``extra_end`` is the
    padding needed past ``pads_end`` so that the last (ceil mode) window fits; values there
    are not part of the op's padding (they never count as input or as explicit padding).
    Computed once per distinct geometry (kernels and gradient rules ask for the same ones on
    every step).
    """
    if isinstance(auto_pad, bytes):
        auto_pad = auto_pad.decode()
    key = (op, tuple(int(v) for v in in_shape), tuple(int(v) for v in kernel_shape),
           tuple(int(v) for v in strides), tuple(int(v) for v in dilations),
           None if pads is None else tuple(int(v) for v in pads), auto_pad, bool(ceil_mode))
    return [list(v) for v in _window_geometry(*key)]


@functools.lru_cache(maxsize=4096)
def _window_geometry(op, in_shape, kernel_shape, strides, dilations, pads, auto_pad, ceil_mode):
    n = len(in_shape)
    ap = norm_auto_pad(op, auto_pad)
    for name, vals in (("strides", strides), ("dilations", dilations),
                       ("kernel_shape", kernel_shape)):
        if any(v < 1 for v in vals):
            raise ShapeError(f"{op}: attribute {name}={list(vals)} must be positive")
    eff = [(k - 1) * d + 1 for k, d in zip(kernel_shape, dilations)]
    if ap in ("SAME_UPPER", "SAME_LOWER"):
        out = [-(-i // s) for i, s in zip(in_shape, strides)]
        total = [max(0, (o - 1) * s + e - i) for o, s, e, i in zip(out, strides, eff, in_shape)]
        if ap == "SAME_UPPER":
            pb = [t // 2 for t in total]
        else:
            pb = [t - t // 2 for t in total]
        pe = [t - b for t, b in zip(total, pb)]
    else:
        if ap == "VALID":
            pb, pe = [0] * n, [0] * n
        else:
            p = [0] * (2 * n) if pads is None or len(pads) == 0 else [int(v) for v in pads]
            if len(p) != 2 * n:
                raise ShapeError(f"{op}: attribute pads={p} needs {2 * n} values "
                                 f"(begin and end for {n} spatial axes)")
            pb, pe = p[:n], p[n:]
        out = []
        for i, b, e_, k, s in zip(in_shape, pb, pe, eff, strides):
            span = i + b + e_ - k
            if span < 0:
                raise ShapeError(
                    f"{op}: the kernel (extent {k} with dilation) is larger than the padded "
                    f"input (size {i} + pads {b}+{e_}) along a spatial axis; input spatial "
                    f"shape {list(in_shape)}, kernel_shape {list(kernel_shape)}")
            if ceil_mode:
                o = -(-span // s) + 1
                if (o - 1) * s >= i + b:  # the last window would start in the end padding
                    o -= 1
            else:
                o = span // s + 1
            out.append(o)
    extra = [max(0, (o - 1) * s + k - (i + b + e_))
             for o, s, k, i, b, e_ in zip(out, strides, eff, in_shape, pb, pe)]
    # a hostile geometry (pads or strides of 2**15 and more) must be refused before any kernel
    # allocates its padded input, columns or output: check one image's one channel here (the
    # kernels multiply by batch and channels)
    padded = [i + b + e_ + x for i, b, e_, x in zip(in_shape, pb, pe, extra)]
    check_alloc(padded, itemsize=4, what=f"{op}: one channel of the padded input")
    check_alloc(out, itemsize=4, what=f"{op}: one channel of the output")
    check_alloc([o * k for o, k in zip(out, kernel_shape)], itemsize=4,
                what=f"{op}: one channel of the unfolded input (output positions x kernel)")
    return tuple(pb), tuple(pe), tuple(out), tuple(extra)
