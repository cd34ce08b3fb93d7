"""Miscellaneous kernels: NonMaxSuppression, Dropout, ImageDecoder."""

from __future__ import annotations

import io
import warnings

import numpy as np

from workbench.arrays import to_numpy, xp_of
from workbench.errors import InputError, ShapeError, UnsupportedOperatorError
from workbench.ops.registry import describe, kernel

# ---------------------------------------------------------------------------------------------
# NonMaxSuppression


def _scalar(v, default, cast):
    if v is None or getattr(v, "size", 1) == 0:
        return default
    return cast(v.reshape(-1)[0]) if hasattr(v, "reshape") else cast(v)


def _corners(boxes, center_point_box: int, xp):
    """(N, 4) boxes -> (y1, x1, y2, x2) with y1 <= y2 and x1 <= x2."""
    b = boxes.astype(np.float64)
    if center_point_box:
        xc, yc, w, h = b[:, 0], b[:, 1], b[:, 2], b[:, 3]
        return yc - h / 2, xc - w / 2, yc + h / 2, xc + w / 2
    y1, x1, y2, x2 = b[:, 0], b[:, 1], b[:, 2], b[:, 3]
    return xp.minimum(y1, y2), xp.minimum(x1, x2), xp.maximum(y1, y2), xp.maximum(x1, x2)


@kernel("NonMaxSuppression", since=10)
def non_max_suppression(boxes, scores, max_output_boxes_per_class=None, iou_threshold=None,
                        score_threshold=None, *, center_point_box=0):
    """Greedy per-(batch, class) selection by descending score (ties: lower box index first);
    a box is suppressed when its IoU with a selected box is strictly above iou_threshold, and
    dropped beforehand when its score is not above score_threshold. One kernel for 10 and 11."""
    op = "NonMaxSuppression"
    xp = xp_of(boxes, scores)
    if boxes.ndim != 3 or boxes.shape[2] != 4:
        raise ShapeError(f"{op}: boxes must have shape [batch, boxes, 4], got "
                         f"{tuple(boxes.shape)}")
    if scores.ndim != 3 or scores.shape[0] != boxes.shape[0] or scores.shape[2] != boxes.shape[1]:
        raise ShapeError(f"{op}: scores must have shape [batch, classes, boxes] = "
                         f"[{boxes.shape[0]}, C, {boxes.shape[1]}], got {tuple(scores.shape)}")
    if center_point_box not in (0, 1):
        raise InputError(f"{op}: center_point_box must be 0 or 1, got {center_point_box}")
    max_out = max(_scalar(max_output_boxes_per_class, 0, int), 0)
    iou_thr = _scalar(iou_threshold, 0.0, float)
    score_thr = _scalar(score_threshold, None, float)
    selected = []
    if max_out > 0:
        for b in range(boxes.shape[0]):
            y1, x1, y2, x2 = _corners(boxes[b], center_point_box, xp)
            area = (y2 - y1) * (x2 - x1)
            for c in range(scores.shape[1]):
                s = scores[b, c]
                order = xp.argsort(-s.astype(np.float64), kind="stable")
                if score_thr is not None:
                    order = order[s[order] > score_thr]
                kept = 0
                while order.size and kept < max_out:
                    i = int(order[0])
                    selected.append((b, c, i))
                    kept += 1
                    rest = order[1:]
                    if not rest.size:
                        break
                    ih = xp.maximum(xp.minimum(y2[i], y2[rest]) - xp.maximum(y1[i], y1[rest]), 0)
                    iw = xp.maximum(xp.minimum(x2[i], x2[rest]) - xp.maximum(x1[i], x1[rest]), 0)
                    inter = ih * iw
                    union = area[i] + area[rest] - inter
                    iou = xp.where(union > 0, inter / xp.where(union > 0, union, 1), 0)
                    order = rest[iou <= iou_thr]
    return xp.asarray(np.asarray(selected, dtype=np.int64).reshape(-1, 3))


# ---------------------------------------------------------------------------------------------
# Dropout


def _dropout(x, ratio: float, training: bool, seed, ctx, mask_dtype):
    xp = xp_of(x)
    n_out = ctx.n_outputs if ctx is not None else 1
    if not training or ratio == 0:
        if n_out < 2:
            return x
        return x, xp.ones(x.shape, dtype=mask_dtype)
    if not 0 <= ratio <= 1:
        raise InputError(f"Dropout: ratio {ratio} must be in [0, 1)")
    if seed is not None:
        # legacy RandomState: the same seed gives the same mask as numpy.random.seed(seed)
        u = np.random.RandomState(int(seed)).uniform(0.0, 1.0, x.shape)
    elif ctx is not None and ctx.rng is not None:
        u = ctx.rng.random(size=x.shape)
    else:
        u = np.random.default_rng().random(x.shape)
    keep = xp.asarray(u >= ratio)
    if ratio >= 1:
        y = xp.zeros_like(x)
    else:
        # bfloat16 / float8 data is scaled in float32 and cast back
        cdt = x.dtype if x.dtype.name in ("float16", "float32", "float64") else np.dtype("float32")
        y = xp.asarray(x.astype(cdt) * keep / cdt.type(1 - ratio)).astype(x.dtype)
    if n_out < 2:
        return y
    return y, keep.astype(mask_dtype)


@kernel("Dropout", since=7, wants_ctx=True,
        category="normalization", host_read_inputs=(1, 2), settings=(1, 2), random=True)
def dropout_7(data, *, ratio=0.5, ctx):
    """Opsets 7-9: ratio attribute, mask of the data's type; random only in training mode."""
    return _dropout(data, float(ratio), bool(ctx.training), None, ctx, data.dtype)


@kernel("Dropout", since=10, wants_ctx=True)
def dropout_10(data, *, ratio=0.5, ctx):
    """Opsets 10-11: as 7 with a bool mask."""
    return _dropout(data, float(ratio), bool(ctx.training), None, ctx, np.bool_)


@kernel("Dropout", since=12, wants_ctx=True)
def dropout_12(data, ratio=None, training_mode=None, *, seed=None, ctx):
    """Opsets 12+: ratio and training_mode inputs (ratio defaults to 0.5), seed attribute.

    An omitted training_mode means "not training" in the spec; here it follows the engine's
    training flag (false unless a model is being trained), so inference is as specified."""
    r = _scalar(ratio, 0.5, float)
    training = _scalar(training_mode, bool(ctx.training), bool)
    return _dropout(data, r, training, seed, ctx, np.bool_)


# ---------------------------------------------------------------------------------------------
# ImageDecoder


@kernel("ImageDecoder", since=20)
def image_decoder(encoded_stream, *, pixel_format="RGB"):
    """Decode an encoded image (BMP, JPEG, JPEG2000, TIFF, PNG, WebP, PNM) with Pillow into
    uint8 (H, W, C): C = 3 for RGB/BGR, 1 for Grayscale. An undecodable stream gives an empty
    (0, 0, C) image, as the spec asks (with a warning)."""
    op = "ImageDecoder"
    if pixel_format not in ("RGB", "BGR", "Grayscale"):
        raise InputError(f"{op}: pixel_format {pixel_format!r} must be RGB, BGR or Grayscale")
    try:
        from PIL import Image
    except ImportError:
        raise UnsupportedOperatorError(
            op, "", None, reason="decoding images needs Pillow (pip install pillow)") from None
    xp = xp_of(encoded_stream)
    channels = 1 if pixel_format == "Grayscale" else 3
    data = to_numpy(encoded_stream).astype(np.uint8).tobytes()
    try:
        with Image.open(io.BytesIO(data)) as img:
            img = img.convert("L" if channels == 1 else "RGB")
            arr = np.asarray(img, dtype=np.uint8)
    except Exception as e:  # noqa: BLE001 - any decoder failure means "cannot decode"
        warnings.warn(f"{op}: cannot decode the image stream ({type(e).__name__}: {e}); "
                      f"returning an empty image", RuntimeWarning, stacklevel=2)
        return xp.zeros((0, 0, channels), dtype=np.uint8)
    if channels == 1:
        arr = arr[:, :, None]
    elif pixel_format == "BGR":
        arr = arr[:, :, ::-1]
    return xp.asarray(np.ascontiguousarray(arr))


describe("Dropout", output_view="view")    # inference: its input itself (a mask is new)
