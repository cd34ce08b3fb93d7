"""Post-processing: top-k, YOLO decoding + NMS, embeddings, SQuAD answer spans."""

from __future__ import annotations

import math

import numpy as np
import pytest

from workbench.errors import InputError
from workbench.zoo import labels
from workbench.zoo import postprocess as post
from workbench.zoo import preprocess as pre
from workbench.zoo.tokenizers import BertTokenizer


def test_softmax_top_k_and_format():
    best = post.top_k(np.log([[0.1, 0.2, 0.7]]), ["a", "b", "c"], k=2)
    assert [b[0] for b in best] == ["c", "b"]
    assert best[0][1] == pytest.approx(0.7) and best[1][1] == pytest.approx(0.2)
    assert post.format_top_k(best)[0] == "class=c ; probability=0.700000"
    with pytest.raises(InputError, match="3 scores but 2 labels"):
        post.top_k([1, 2, 3], ["a", "b"])
    assert post.softmax([1000.0, 1000.0]).tolist() == [0.5, 0.5]       # no overflow


def test_labels_lists():
    assert len(labels.voc_classes()) == 20 and labels.voc_classes()[14] == "person"
    assert labels.ferplus_emotions() == ["neutral", "happiness", "surprise", "sadness", "anger",
                                         "disgust", "fear", "contempt"]


# --------------------------------------------------------------------------- YOLO
def _grid(s=13):
    g = np.zeros((125, s, s), np.float32)
    g[4::25] = -20.0            # objectness off everywhere
    return g


def _put(g, box, row, col, cls, tx=0.0, ty=0.0, tw=0.0, th=0.0, tc=10.0, logit=10.0):
    c = box * 25
    g[c:c + 5, row, col] = [tx, ty, tw, th, tc]
    g[c + 5 + cls, row, col] = logit


def test_decode_yolo_single_box_by_hand():
    g = _grid()
    _put(g, 1, 2, 3, cls=19, tw=math.log(2.0))                         # tvmonitor, last class
    (d,) = post.decode_yolo(g[None], labels.voc_classes())
    # centre ((3 + 0.5) * 32, (2 + 0.5) * 32) = (112, 80); size (2 * 3.42 * 32, 4.41 * 32)
    w, h = 2 * 3.42 * 32, 4.41 * 32
    np.testing.assert_allclose(d.box, (112 - w / 2, 80 - h / 2, 112 + w / 2, 80 + h / 2),
                               rtol=1e-6)
    assert d.label == "tvmonitor" and d.class_id == 19
    obj = 1 / (1 + math.exp(-10))
    prob = math.exp(10) / (math.exp(10) + 19)
    assert d.score == pytest.approx(obj * prob, rel=1e-9)


def test_decode_yolo_threshold_and_cell_size():
    g = _grid(5)
    _put(g, 0, 0, 0, cls=0, tc=0.0)          # objectness 0.5 -> score < 0.5: dropped
    _put(g, 4, 4, 4, cls=3, tx=100, ty=-100)
    dets = post.decode_yolo(g, labels.voc_classes(), image_size=160)   # 32 px cells
    assert [d.label for d in dets] == ["boat"]
    x1, y1, x2, y2 = dets[0].box
    assert (x1 + x2) / 2 == pytest.approx(5 * 32) and (y1 + y2) / 2 == pytest.approx(4 * 32)
    assert len(post.decode_yolo(g, labels.voc_classes(), threshold=0.3)) == 2
    with pytest.raises(InputError, match="125 channels"):
        post.decode_yolo(np.zeros((100, 13, 13)), labels.voc_classes())


def test_nms_per_class():
    D = post.Detection
    dets = [D((0, 0, 10, 10), 0, "a", 0.9), D((1, 1, 11, 11), 0, "a", 0.8),   # IoU 81/119
            D((1, 1, 11, 11), 1, "b", 0.7), D((50, 50, 60, 60), 0, "a", 0.6)]
    assert post.iou((0, 0, 10, 10), (1, 1, 11, 11)) == pytest.approx(81 / 119)
    assert post.iou((0, 0, 1, 1), (2, 2, 3, 3)) == 0.0
    kept = post.nms(dets, 0.45)
    assert [(d.label, d.score) for d in kept] == [("a", 0.9), ("b", 0.7), ("a", 0.6)]
    assert len(post.nms(dets, 0.45, per_class=False)) == 2
    assert len(post.nms(dets, 0.7)) == 4


def test_yolo_grid_decode_then_nms():
    g = _grid()
    _put(g, 2, 6, 6, cls=14)                                   # person
    _put(g, 2, 6, 7, cls=14, tc=8.0)                           # the same person, next cell
    _put(g, 0, 0, 0, cls=11)                                   # a dog far away
    dets = post.decode_yolo(g, labels.voc_classes())
    assert len(dets) == 3
    kept = post.nms(dets)
    assert sorted(d.label for d in kept) == ["dog", "person"]


def test_draw_detections_colours_all_20_classes():
    from PIL import Image

    cols = post.class_colours(20)
    assert len(set(cols)) == 20
    img = Image.new("L", (100, 100))
    dets = [post.Detection((10, 10, 60, 60), c, labels.voc_classes()[c], 0.9)
            for c in (0, 19)]
    out = post.draw_detections(img, dets)
    assert out.mode == "RGB" and out.size == (100, 100)
    assert out.getpixel((10, 35)) == cols[19]                  # drawn last, on top
    assert img.getpixel((10, 35)) == 0                         # the input is untouched


# --------------------------------------------------------------------------- ArcFace
def test_embeddings_distance_and_similarity():
    a, b = np.array([3.0, 4.0]), np.array([4.0, 3.0])
    np.testing.assert_allclose(post.l2_normalize(a), [0.6, 0.8])
    dist, sim = post.face_distance(a, b)
    assert sim == pytest.approx(0.96) and dist == pytest.approx(2 - 2 * 0.96)
    assert post.face_distance(a, 2 * a) == pytest.approx((0.0, 1.0))
    np.testing.assert_allclose(post.l2_normalize(np.zeros(3)), 0)


# --------------------------------------------------------------------------- SQuAD
VOCAB = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "where", "does", "he", "live", "?", "john",
         "smith", "lives", "in", "paris", ",", "france", ".", "new", "york", "##s"]


def _example(context="John Smith lives in Paris, France.", seq=24):
    tok = BertTokenizer(VOCAB)
    return pre.squad_features(tok, "Where does he live?", context, max_seq_length=seq)


def _logits(n, hot: dict):
    x = np.full(n, -5.0)
    for i, v in hot.items():
        x[i] = v
    return x


def test_squad_answer_maps_back_to_original_text():
    ex = _example()
    f = ex.features[0]
    # tokens: [CLS] where does he live ? [SEP] john smith lives in paris , france . [SEP]
    p = f.tokens.index("paris")
    start = _logits(24, {p: 8.0, 1: 9.0})                     # 1 is in the question: ignored
    end = _logits(24, {p + 2: 8.0, p - 1: 9.5})               # end before start: ignored
    answers = post.squad_answers(ex, [start], [end])
    assert answers[0].text == "Paris, France"                  # case and comma kept
    assert answers[0].start_logit == 8.0 and answers[0].end_logit == 8.0
    assert sum(a.probability for a in answers) == pytest.approx(1.0)
    assert len(answers) <= 20


def test_squad_max_answer_length_and_n_best():
    ex = _example()
    f = ex.features[0]
    s, e = f.tokens.index("john"), f.tokens.index(".")
    start, end = _logits(24, {s: 9.0}), _logits(24, {e: 9.0})
    best = post.squad_answers(ex, [start], [end], max_answer_length=30)[0]
    assert best.text == "John Smith lives in Paris, France."
    short = post.squad_answers(ex, [start], [end], max_answer_length=3)[0]
    assert short.text != best.text and len(short.text.split()) <= 3
    assert len(post.squad_answers(ex, [start], [end], n_best=2)) <= 2


def test_squad_answers_over_several_windows():
    tok = BertTokenizer(VOCAB)
    ctx = "john lives in paris . " * 3 + "john lives in new york ."
    ex = pre.squad_features(tok, "where?", ctx, max_seq_length=14, doc_stride=4)
    assert len(ex.features) > 2
    starts, ends = [], []
    for f in ex.features:
        st, en = np.full(14, -5.0), np.full(14, -5.0)
        for i, t in enumerate(f.tokens):
            if t == "new" and i in f.token_to_orig_map:
                st[i] = 7.0
            if t == "york" and i in f.token_to_orig_map:
                en[i] = 7.0
        starts.append(st)
        ends.append(en)
    best = post.squad_answers(ex, starts, ends)[0]
    assert best.text == "new york"
    with pytest.raises(InputError, match="features"):
        post.squad_answers(ex, starts[:1], ends[:1])


def test_final_text_projection():
    assert post.final_text("steve smith", "Steve Smith's") == "Steve Smith"
    assert post.final_text("6 . 77 million", "$6.77 million,") == "6.77 million"
    assert post.final_text("zzz", "Steve") == "Steve"


def test_predictions_json_and_sentiment_and_greedy():
    ex = _example()
    preds, nbest = post.predictions_json([(ex, [post.Answer("x", 1.0, 1.0, 2.0)])])
    assert preds == {"1": "x"} and nbest["1"][0]["end_logit"] == 2.0
    assert post.sentiment([0.1, 2.0])[0] == "positive"
    assert post.sentiment(np.array([[3.0, -1.0]]))[0] == "negative"
    logits = np.zeros((1, 1, 3, 5))
    logits[0, 0, 2, 4] = 1.0
    logits[0, 0, 0, 1] = 9.0                                  # an earlier position: ignored
    assert post.greedy_next(logits) == 4
