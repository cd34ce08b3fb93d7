"""Pre-processing for the zoo demos: images to model inputs, text to SQuAD features.

Images may be a path, a PIL image or an array (HxW, HxWxC or CxHxW; uint8 0-255 or float 0-1);
any mode (grayscale, RGBA, palette, ...) and any size is converted to what the model needs, so
a valid image never raises.

>>> import numpy as np
>>> x = imagenet(np.zeros((50, 80, 4), np.uint8))        # RGBA, any size
>>> x.shape, x.dtype
((1, 3, 224, 224), dtype('float32'))
>>> [round(float(v), 4) for v in x[0, :, 0, 0]]            # black, normalised
[-2.1179, -2.0357, -1.8044]
"""

from __future__ import annotations

import os
import warnings
from dataclasses import dataclass, field

import numpy as np

from workbench.errors import InputError

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)


# --------------------------------------------------------------------------- images
def load_image(image, mode: str = "RGB"):
    """A PIL image in ``mode`` ("RGB" or "L") from a path, a PIL image or an array.

    Arrays: HxW (gray), HxWx1/3/4, or CxHxW with C in (1, 3, 4); uint8, or floats in [0, 1]
    (scaled by 255) or [0, 255]. Alpha is composited onto black by dropping it, as PIL does for
    ``convert("RGB")``.
    """
    from PIL import Image

    if isinstance(image, (str, os.PathLike)):
        if not os.path.exists(image):
            raise InputError(f"image file {os.fspath(image)!r} does not exist")
        with Image.open(image) as im:
            im.load()
            img = im.copy()
    elif isinstance(image, Image.Image):
        img = image
    else:
        img = Image.fromarray(_as_uint8_hwc(np.asarray(image)))
    if img.mode != mode:
        img = _convert(img, mode)
    return img


def _convert(img, mode: str):
    """``img.convert(mode)`` for every PIL mode: high-range gray (16/32-bit, float) is scaled
    to 0-255 rather than clipped, LAB goes through ImageCms, alpha is dropped."""
    from PIL import Image

    if img.mode in ("I", "F") or img.mode.startswith("I;16"):
        a = np.asarray(img, dtype=np.float64)
        top = float(np.nanmax(a)) if a.size else 0.0
        if img.mode.startswith("I;16") or (img.mode == "I" and 255 < top <= 65535):
            a = a / 257.0
        elif img.mode == "I" and top > 65535:
            a = a * (255.0 / top)
        elif img.mode == "F" and top <= 1.0:
            a = a * 255.0
        img = Image.fromarray(np.clip(np.rint(np.nan_to_num(a)), 0, 255).astype(np.uint8), "L")
        return img if mode == "L" else img.convert(mode)
    if img.mode == "LAB":
        from PIL import ImageCms

        t = ImageCms.buildTransformFromOpenProfiles(ImageCms.createProfile("LAB"),
                                                    ImageCms.createProfile("sRGB"), "LAB", "RGB")
        img = ImageCms.applyTransform(img, t)
        return img if mode == "RGB" else img.convert(mode)
    try:
        if img.mode in ("RGBA", "LA", "PA", "RGBa") or \
                (img.mode == "P" and "transparency" in img.info):
            img = img.convert("RGBA")
        return img.convert(mode)
    except ValueError:          # a mode PIL cannot convert (La, ...): its first band as gray
        return img.getchannel(0).convert("L").convert(mode)


def _as_uint8_hwc(a: np.ndarray) -> np.ndarray:
    if a.ndim == 3 and a.shape[0] in (1, 3, 4) and a.shape[-1] not in (1, 3, 4):
        a = np.transpose(a, (1, 2, 0))
    if a.ndim == 3 and a.shape[-1] == 1:
        a = a[..., 0]
    if a.ndim not in (2, 3) or (a.ndim == 3 and a.shape[-1] not in (3, 4)):
        raise InputError(f"an image array must be HxW, HxWxC or CxHxW with C in 1, 3, 4; got "
                         f"shape {list(a.shape)}")
    if a.dtype == np.uint8:
        return np.ascontiguousarray(a)
    a = a.astype(np.float64)
    if a.size and np.nanmax(a) <= 1.0:
        a = a * 255.0
    return np.ascontiguousarray(np.clip(np.rint(np.nan_to_num(a)), 0, 255).astype(np.uint8))


def _chw(img, scale: float = 1.0) -> np.ndarray:
    a = np.asarray(img, dtype=np.float32)
    if a.ndim == 2:
        a = a[:, :, None]
    return np.transpose(a, (2, 0, 1)) * np.float32(scale)


def _resample():
    from PIL import Image
    return Image.Resampling.BILINEAR


def imagenet(image, size: int = 224, resize: int = 256) -> np.ndarray:
    """SINGA's ImageNet pipeline: resize to 256x256 (aspect not kept), crop the centre 224x224
    (box (16, 16, 240, 240)), /255, CHW, (x - mean) / std per channel, batch of one.

    ``size`` other than 224 scales the pipeline (resize ``size * 256 / 224``); returns
    float32 [1, 3, size, size].
    """
    if size != 224 and resize == 256:
        resize = int(round(size * 256 / 224))
    img = load_image(image, "RGB").resize((resize, resize), _resample())
    off = (resize - size) // 2
    img = img.crop((off, off, off + size, off + size))
    x = _chw(img, 1.0 / 255.0)
    mean = np.asarray(IMAGENET_MEAN, np.float32)[:, None, None]
    std = np.asarray(IMAGENET_STD, np.float32)[:, None, None]
    return ((x - mean) / std)[None].astype(np.float32)


def tiny_yolo(image, size: int = 416):
    """Tiny YOLOv2: plain resize to size x size, raw 0-255 float RGB, CHW, batch of one.

    Returns ``(array [1, 3, size, size], resized PIL image)``; the model scales the pixels
    itself (its ``scalerPreprocessor``). Boxes come back in the resized image's coordinates.
    """
    img = load_image(image, "RGB").resize((size, size), _resample())
    return _chw(img)[None].astype(np.float32), img


def arcface(images, size: int = 112) -> np.ndarray:
    """ArcFace: centre-crop each image to a square (the longer side is cut), resize to
    112x112, raw 0-255 float RGB, CHW; the images stacked into one batch [n, 3, 112, 112].

    Like SINGA's demo, there is no face detection or alignment (the zoo recommends MTCNN); give
    images that are already roughly face crops.
    """
    if not isinstance(images, (list, tuple)):
        images = [images]
    out = []
    for image in images:
        img = load_image(image, "RGB")
        w, h = img.size
        s = min(w, h)
        left, top = (w - s) // 2, (h - s) // 2
        img = img.crop((left, top, left + s, top + s)).resize((size, size), _resample())
        out.append(_chw(img))
    return np.stack(out).astype(np.float32)


def ferplus(image, size: int = 64) -> np.ndarray:
    """FER+: grayscale (``convert('L')``), resize to 64x64 (Lanczos, Pillow's former
    ANTIALIAS), raw 0-255 float32 [1, 1, 64, 64]."""
    from PIL import Image

    img = load_image(image, "L").resize((size, size), Image.Resampling.LANCZOS)
    return np.asarray(img, dtype=np.float32)[None, None]


# --------------------------------------------------------------------------- text
def truncate(ids: list, max_len: int, what: str, keep: str = "head") -> list:
    """Cut a token list to ``max_len`` with a warning naming both lengths."""
    if len(ids) <= max_len:
        return list(ids)
    warnings.warn(f"{what} has {len(ids)} tokens, more than the {max_len} the model takes; "
                  f"it is truncated to {max_len} tokens", stacklevel=3)
    return list(ids[:max_len]) if keep == "head" else list(ids[-max_len:])


@dataclass
class SquadFeature:
    """One window of (question, context) for BERT-SQuAD, as Google's ``run_squad.py`` makes."""

    unique_id: int
    doc_span_index: int
    tokens: list
    input_ids: np.ndarray
    input_mask: np.ndarray
    segment_ids: np.ndarray
    token_to_orig_map: dict = field(default_factory=dict)
    token_is_max_context: dict = field(default_factory=dict)


@dataclass
class SquadExample:
    """A question and its context split into whitespace words (``doc_tokens``)."""

    qas_id: str
    question: str
    context: str
    doc_tokens: list
    features: list = field(default_factory=list)


def _is_whitespace(c: str) -> bool:
    return c in " \t\r\n" or ord(c) == 0x202F


def squad_example(question: str, context: str, qas_id: str = "1") -> SquadExample:
    doc_tokens: list = []
    prev_ws = True
    for c in context:
        if _is_whitespace(c):
            prev_ws = True
        else:
            if prev_ws:
                doc_tokens.append(c)
            else:
                doc_tokens[-1] += c
            prev_ws = False
    return SquadExample(qas_id, question, context, doc_tokens)


def _max_context(spans: list, cur: int, position: int) -> bool:
    """Is ``position`` best centred in span ``cur`` (run_squad's ``_check_is_max_context``)."""
    best_score, best = None, None
    for i, (start, length) in enumerate(spans):
        end = start + length - 1
        if position < start or position > end:
            continue
        score = min(position - start, end - position) + 0.01 * length
        if best_score is None or score > best_score:
            best_score, best = score, i
    return cur == best


def squad_features(tokenizer, question: str, context: str, *, qas_id: str = "1",
                   max_seq_length: int = 256, doc_stride: int = 128, max_query_length: int = 64,
                   unique_id_start: int = 1000000000) -> SquadExample:
    """Tokenise a question and a context into BERT-SQuAD features (windows of the context).

    ``[CLS] question [SEP] context-window [SEP]``, padded with 0 to ``max_seq_length``;
    segment ids 0 for the question part, 1 for the context part; mask 1 on real tokens. A
    question longer than ``max_query_length`` tokens is truncated (with a warning); a long
    context is covered by overlapping windows ``doc_stride`` tokens apart. Returns the
    :class:`SquadExample` with its ``features``.
    """
    ex = squad_example(question, context, qas_id)
    query = truncate(tokenizer.tokenize(question), max_query_length, "the question")
    tok_to_orig, all_doc_tokens = [], []
    for i, word in enumerate(ex.doc_tokens):
        for sub in tokenizer.tokenize(word):
            tok_to_orig.append(i)
            all_doc_tokens.append(sub)
    max_doc = max_seq_length - len(query) - 3
    if max_doc <= 0:
        raise InputError(f"max_seq_length {max_seq_length} leaves no room for the context after "
                         f"a {len(query)}-token question")
    spans, start = [], 0
    while start < len(all_doc_tokens) or not spans:
        length = min(len(all_doc_tokens) - start, max_doc)
        spans.append((start, length))
        if start + length >= len(all_doc_tokens):
            break
        start += min(length, doc_stride)
    uid = unique_id_start
    for si, (start, length) in enumerate(spans):
        tokens = ["[CLS]"] + query + ["[SEP]"]
        segment = [0] * len(tokens)
        t2o, is_max = {}, {}
        for i in range(length):
            pos = start + i
            t2o[len(tokens)] = tok_to_orig[pos]
            is_max[len(tokens)] = _max_context(spans, si, pos)
            tokens.append(all_doc_tokens[pos])
            segment.append(1)
        tokens.append("[SEP]")
        segment.append(1)
        ids = tokenizer.convert_tokens_to_ids(tokens)
        mask = [1] * len(ids)
        pad = max_seq_length - len(ids)
        ids, mask, segment = ids + [0] * pad, mask + [0] * pad, segment + [0] * pad
        ex.features.append(SquadFeature(uid, si, tokens, np.asarray(ids, np.int64),
                                        np.asarray(mask, np.int64),
                                        np.asarray(segment, np.int64), t2o, is_max))
        uid += 1
    return ex
