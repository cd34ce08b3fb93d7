"""Post-processing for the zoo demos: top-k labels, YOLO decoding + NMS, face embeddings,
SQuAD answer spans.

>>> import numpy as np
>>> [(c, round(p, 3)) for c, p in top_k(np.log([[0.1, 0.6, 0.3]]), ["a", "b", "c"], k=2)]
[('b', 0.6), ('c', 0.3)]
"""

from __future__ import annotations

import collections
import colorsys
from dataclasses import dataclass

import numpy as np

from workbench.errors import InputError


def softmax(x, axis: int = -1) -> np.ndarray:
    x = np.asarray(x, dtype=np.float64)
    e = np.exp(x - np.max(x, axis=axis, keepdims=True))
    return e / np.sum(e, axis=axis, keepdims=True)


def sigmoid(x) -> np.ndarray:
    x = np.asarray(x, dtype=np.float64)
    return 0.5 * (1.0 + np.tanh(0.5 * x))


def top_k(logits, labels, k: int = 5, *, apply_softmax: bool = True) -> list:
    """``[(label, probability), ...]`` of the ``k`` best classes of one row of scores (a leading
    batch dimension of 1 is dropped). Ties keep the lower index first."""
    s = np.asarray(logits, dtype=np.float64).reshape(-1)
    if len(labels) != s.size:
        raise InputError(f"{s.size} scores but {len(labels)} labels")
    p = softmax(s) if apply_softmax else s
    order = np.argsort(-p, kind="stable")[:k]
    return [(labels[i], float(p[i])) for i in order]


def format_top_k(pairs) -> list[str]:
    """SINGA's log lines: ``class=<label> ; probability=<p>``."""
    return [f"class={label} ; probability={p:f}" for label, p in pairs]


# --------------------------------------------------------------------------- Tiny YOLOv2
#: anchor (width, height) pairs in grid cells, Tiny YOLOv2 VOC
YOLO_ANCHORS = ((1.08, 1.19), (3.42, 4.41), (6.63, 11.38), (9.42, 5.11), (16.62, 10.52))


@dataclass
class Detection:
    box: tuple           # (x1, y1, x2, y2) in input-image pixels
    class_id: int
    label: str
    score: float         # objectness x class probability

    def __str__(self) -> str:
        x1, y1, x2, y2 = (round(v, 1) for v in self.box)
        return f"{self.label} {self.score:.3f} at ({x1}, {y1}, {x2}, {y2})"


def decode_yolo(grid, labels, *, threshold: float = 0.5, anchors=YOLO_ANCHORS,
                cell_size: float | None = None, image_size: int | None = None) -> list:
    """Decode a Tiny YOLOv2 output grid [125, S, S] (or [1, 125, S, S]) into detections.

    Channel ``b * (5 + C) + k`` of box ``b`` holds tx, ty, tw, th, tc, then C class scores.
    Centre = (cell + sigmoid(t)) * cell_size, size = exp(t) * anchor * cell_size, objectness =
    sigmoid(tc), class probabilities = softmax over the C scores; kept where objectness x best
    class probability > ``threshold``. ``cell_size`` defaults to ``image_size / S`` or 32.
    No NMS here: see :func:`nms`.
    """
    g = np.asarray(grid, dtype=np.float64)
    if g.ndim == 4:
        if g.shape[0] != 1:
            raise InputError(f"decode_yolo takes one image's grid, got batch {g.shape[0]}")
        g = g[0]
    nb, nc = len(anchors), len(labels)
    if g.ndim != 3 or g.shape[0] != nb * (5 + nc):
        raise InputError(f"expected a grid of {nb * (5 + nc)} channels ({nb} boxes x (5 + {nc} "
                         f"classes)), got shape {list(g.shape)}")
    rows, cols = g.shape[1], g.shape[2]
    if cell_size is None:
        cell_size = image_size / cols if image_size else 32.0
    g = g.reshape(nb, 5 + nc, rows, cols)
    cy, cx = np.meshgrid(np.arange(rows), np.arange(cols), indexing="ij")
    out = []
    for b, (aw, ah) in enumerate(anchors):
        t = g[b]
        x = (cx + sigmoid(t[0])) * cell_size
        y = (cy + sigmoid(t[1])) * cell_size
        w = np.exp(t[2]) * aw * cell_size
        h = np.exp(t[3]) * ah * cell_size
        obj = sigmoid(t[4])
        probs = softmax(t[5:], axis=0)
        best = np.argmax(probs, axis=0)
        score = obj * np.take_along_axis(probs, best[None], 0)[0]
        for r, c in zip(*np.nonzero(score > threshold)):
            out.append(Detection((float(x[r, c] - w[r, c] / 2), float(y[r, c] - h[r, c] / 2),
                                  float(x[r, c] + w[r, c] / 2), float(y[r, c] + h[r, c] / 2)),
                                 int(best[r, c]), labels[int(best[r, c])],
                                 float(score[r, c])))
    out.sort(key=lambda d: -d.score)
    return out


def iou(a, b) -> float:
    """Intersection over union of two (x1, y1, x2, y2) boxes."""
    iw = min(a[2], b[2]) - max(a[0], b[0])
    ih = min(a[3], b[3]) - max(a[1], b[1])
    if iw <= 0 or ih <= 0:
        return 0.0
    inter = iw * ih
    union = (a[2] - a[0]) * (a[3] - a[1]) + (b[2] - b[0]) * (b[3] - b[1]) - inter
    return inter / union if union > 0 else 0.0


def nms(detections, iou_threshold: float = 0.45, *, per_class: bool = True) -> list:
    """Greedy non-maximum suppression: best score first, drop boxes overlapping a kept one by
    more than ``iou_threshold`` (only within the same class when ``per_class``)."""
    kept: list = []
    for d in sorted(detections, key=lambda d: -d.score):
        if all(iou(d.box, k.box) <= iou_threshold
               for k in kept if not per_class or k.class_id == d.class_id):
            kept.append(d)
    return kept


def class_colours(n: int) -> list:
    """``n`` distinct RGB colours (evenly spaced hues), one per class."""
    return [tuple(int(round(255 * v)) for v in colorsys.hsv_to_rgb(i / n, 0.9, 0.95))
            for i in range(n)]


def draw_detections(image, detections, n_classes: int = 20, width: int = 2):
    """A copy of ``image`` (PIL) with each box and ``label score`` drawn in its class colour."""
    from PIL import ImageDraw

    img = image.convert("RGB").copy()
    draw = ImageDraw.Draw(img)
    colours = class_colours(max(n_classes, 1 + max((d.class_id for d in detections),
                                                   default=0)))
    for d in detections:
        col = colours[d.class_id]
        x1, y1, x2, y2 = d.box
        draw.rectangle([x1, y1, x2, y2], outline=col, width=width)
        text = f"{d.label} {d.score:.2f}"
        tx, ty = max(x1, 0), max(y1 - 12, 0)
        bbox = draw.textbbox((tx, ty), text)
        draw.rectangle(bbox, fill=col)
        draw.text((tx, ty), text, fill=(0, 0, 0))
    return img


# --------------------------------------------------------------------------- ArcFace
def l2_normalize(x, axis: int = -1, eps: float = 1e-12) -> np.ndarray:
    """Rows scaled to unit L2 norm (``sklearn.preprocessing.normalize``)."""
    x = np.asarray(x, dtype=np.float64)
    n = np.sqrt(np.sum(x * x, axis=axis, keepdims=True))
    return x / np.maximum(n, eps)


def face_distance(e1, e2) -> tuple:
    """``(squared L2 distance, cosine similarity)`` of two embeddings (normalised first)."""
    a, b = l2_normalize(np.ravel(e1)), l2_normalize(np.ravel(e2))
    return float(np.sum((a - b) ** 2)), float(np.dot(a, b))


# --------------------------------------------------------------------------- SQuAD
def best_indexes(logits, n_best: int) -> list:
    """Indexes of the ``n_best`` largest logits (ties: lower index first)."""
    return [int(i) for i in np.argsort(-np.asarray(logits), kind="stable")[:n_best]]


def _strip_spaces(text: str):
    chars, mapping = [], {}
    for i, c in enumerate(text):
        if c == " ":
            continue
        mapping[len(chars)] = i
        chars.append(c)
    return "".join(chars), mapping


def final_text(pred_text: str, orig_text: str, do_lower_case: bool = True) -> str:
    """Project a normalised (tokenised, lower-cased) answer back onto the original words,
    keeping their case and punctuation (run_squad's ``get_final_text``)."""
    from workbench.zoo.tokenizers import basic_tokenize

    tok_text = " ".join(basic_tokenize(orig_text, do_lower_case))
    start = tok_text.find(pred_text)
    if start == -1:
        return orig_text
    end = start + len(pred_text) - 1
    orig_ns, orig_map = _strip_spaces(orig_text)
    tok_ns, tok_map = _strip_spaces(tok_text)
    if len(orig_ns) != len(tok_ns):
        return orig_text
    tok_to_ns = {v: k for k, v in tok_map.items()}
    ns_start, ns_end = tok_to_ns.get(start), tok_to_ns.get(end)
    if ns_start is None or ns_end is None:
        return orig_text
    s, e = orig_map.get(ns_start), orig_map.get(ns_end)
    if s is None or e is None:
        return orig_text
    return orig_text[s:e + 1]


@dataclass
class Answer:
    text: str
    probability: float
    start_logit: float
    end_logit: float


def squad_answers(example, start_logits, end_logits, *, n_best: int = 20,
                  max_answer_length: int = 30, do_lower_case: bool = True) -> list:
    """The n-best answers of one :class:`~workbench.zoo.preprocess.SquadExample`.

    ``start_logits``/``end_logits``: one row per feature (window), in ``example.features``
    order. A candidate span must lie in the context part of its window, in the window where
    its start token has its maximal context, end >= start and span <= ``max_answer_length``
    tokens. Answers are mapped back to the original context text; probabilities are a softmax
    over the n-best scores (start + end logit). Best first.
    """
    start_logits = np.atleast_2d(np.asarray(start_logits, dtype=np.float64))
    end_logits = np.atleast_2d(np.asarray(end_logits, dtype=np.float64))
    if len(start_logits) != len(example.features) or len(end_logits) != len(start_logits):
        raise InputError(f"{len(example.features)} features but {len(start_logits)} start and "
                         f"{len(end_logits)} end logit rows")
    cands = []
    for fi, feat in enumerate(example.features):
        # as run_squad: the n-best over the whole row (padding included), then filtered
        for s in best_indexes(start_logits[fi], n_best):
            for e in best_indexes(end_logits[fi], n_best):
                if s not in feat.token_to_orig_map or e not in feat.token_to_orig_map:
                    continue
                if not feat.token_is_max_context.get(s, False):
                    continue
                if e < s or e - s + 1 > max_answer_length:
                    continue
                cands.append((start_logits[fi][s] + end_logits[fi][e], fi, s, e))
    cands.sort(key=lambda c: -c[0])
    seen, out = set(), []
    for _score, fi, s, e in cands:
        if len(out) >= n_best:
            break
        feat = example.features[fi]
        tok_text = " ".join(feat.tokens[s:e + 1]).replace(" ##", "").replace("##", "")
        tok_text = " ".join(tok_text.strip().split())
        o1, o2 = feat.token_to_orig_map[s], feat.token_to_orig_map[e]
        orig = " ".join(example.doc_tokens[o1:o2 + 1])
        text = final_text(tok_text, orig, do_lower_case)
        if text in seen:
            continue
        seen.add(text)
        out.append(Answer(text, 0.0, float(start_logits[fi][s]), float(end_logits[fi][e])))
    if not out:
        return [Answer("", 1.0, 0.0, 0.0)]
    probs = softmax([a.start_logit + a.end_logit for a in out])
    for a, p in zip(out, probs):
        a.probability = float(p)
    return out


def predictions_json(examples_answers) -> tuple:
    """``(predictions, nbest)`` dicts like run_squad's predictions.json / nbest_predictions.json
    from ``[(example, answers), ...]``."""
    preds, nbest = collections.OrderedDict(), collections.OrderedDict()
    for ex, answers in examples_answers:
        preds[ex.qas_id] = answers[0].text
        nbest[ex.qas_id] = [{"text": a.text, "probability": a.probability,
                             "start_logit": a.start_logit, "end_logit": a.end_logit}
                            for a in answers]
    return preds, nbest


def greedy_next(logits) -> int:
    """The argmax token of the last position of [..., L, V] logits."""
    last = np.asarray(logits).reshape(-1, np.asarray(logits).shape[-1])[-1]
    if not np.all(np.isfinite(last)):
        raise InputError("the model produced non-finite logits")
    return int(np.argmax(last))


def sentiment(logits, labels=("negative", "positive")) -> tuple:
    """``(label, probability)`` by argmax over the 2 logits of one row (RoBERTa SST-2)."""
    p = softmax(np.asarray(logits, dtype=np.float64).reshape(-1))
    i = int(np.argmax(p))
    return labels[i], float(p[i])

