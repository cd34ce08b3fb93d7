"""SINGA's ten ONNX Colab demos, end to end: one function per demo.

Each function takes the model (a path, a ModelProto, or None for ``zoo.load_model``: the real
file, or offline its untrained twin with a printed note), runs the demo's pre-processing, the
model through ``workbench.backend`` and the post-processing, prints what the Colab demo prints
and returns the result. Without their bugs: images are converted to RGB / grayscale as the
model needs, YOLO gets NMS and a colour for each of the 20 classes, token ids stay int64.

>>> import numpy as np
>>> from workbench.zoo import demos, twins
>>> face = np.zeros((48, 48), np.uint8)
>>> r = demos.emotion_ferplus(twins.build("emotion_ferplus"), face, verbose=False)
>>> len(r["top"]), r["twin"]
(5, True)

Demo inputs (the kitten, the person, two faces, the "fear" face) are downloaded into the zoo
cache from the URLs the SINGA demos use; offline they are replaced by a drawn test picture,
with a note. Text inputs are the demos' own.
"""

from __future__ import annotations

import json
import os
import sys

import numpy as np

from workbench.errors import DownloadError
from workbench.zoo import labels as _labels
from workbench.zoo import postprocess as post
from workbench.zoo import preprocess as pre
from workbench.zoo import tokenizers as toks

DEMO_IMAGES = {
    "kitten.jpg": "https://s3.amazonaws.com/model-server/inputs/kitten.jpg",
    "person.jpg": "https://raw.githubusercontent.com/simo23/tinyYOLOv2/master/person.jpg",
    "aurelien.jpg": "https://angus-doc.readthedocs.io/en/latest/_images/aurelien.jpg",
    "gwenn.jpg": "https://angus-doc.readthedocs.io/en/latest/_images/gwenn.jpg",
    "fear.jpg": "https://microsoft.github.io/onnxjs-demo/img/fear.8d1417fa.jpg",
}

SQUAD_CONTEXT = (
    "In its early years, the new convention center failed to meet attendance and revenue "
    "expectations.[12] By 2002, many Silicon Valley businesses were choosing the much larger "
    "Moscone Center in San Francisco over the San Jose Convention Center due to the latter's "
    "limited space. A ballot measure to finance an expansion via a hotel tax failed to reach "
    "the required two-thirds majority to pass. In June 2005, Team San Jose built the South "
    "Hall, a $6.77 million, blue and white tent, adding 80,000 square feet (7,400 m2) of "
    "exhibit space")
#: the demo's inputs.json
SQUAD_INPUT = {"version": "1.4", "data": [{"paragraphs": [{"context": SQUAD_CONTEXT, "qas": [
    {"question": "where is the businesses choosing to go?", "id": "1"},
    {"question": "how may votes did the ballot measure need?", "id": "2"},
    {"question": "By what year many Silicon Valley businesses were choosing the Moscone "
                 "Center?", "id": "3"}]}], "title": "Conference Center"}]}

ROBERTA_TEXT = "This film is so good"
GPT2_PROMPT = "Here is some text to encode : Hello World"


# --------------------------------------------------------------------------- helpers
def _say(verbose: bool, *lines) -> None:
    if verbose:
        for line in lines:
            print(line)


def _note(msg: str) -> None:
    print(msg, file=sys.stderr)


class _Model:
    """A prepared model plus what the demos need to know about it."""

    def __init__(self, name: str, model, device: str = "CPU"):
        from workbench import backend
        from workbench.zoo import load_model, twins

        if model is None:
            model, _ = load_model(name)
        self.rep = backend.prepare(model, device=device)
        proto = self.rep.loaded.proto
        self.meta = {p.key: p.value for p in proto.metadata_props}
        self.twin_of = self.meta.get(twins.META_TWIN_OF)
        self.is_twin = self.twin_of is not None
        self.inputs = list(self.rep.plan.input_infos)
        self.output_names = list(self.rep.output_names)

    def input_hw(self, default: int) -> int:
        shape = self.inputs[0].shape or ()
        dim = shape[-1] if shape else None
        return int(dim) if isinstance(dim, (int, np.integer)) and dim > 0 else default

    def max_positions(self, default: int) -> int:
        return int(self.meta.get("workbench.max_positions", default))

    def run(self, feeds) -> dict:
        outs = self.rep.run(feeds)
        return dict(zip(self.output_names, outs))


def demo_image(file_name: str, *, offline: bool | None = None):
    """A demo's input image from the zoo cache (downloaded there once); offline, a drawn
    test picture (a PIL image) with a note."""
    from workbench.zoo import cache_dir, download

    dest = os.path.join(cache_dir(), "demo_inputs", file_name)
    try:
        return download(DEMO_IMAGES[file_name], dest, offline=offline, progress=False)
    except DownloadError:
        _note(f"{file_name} is not available offline; using a drawn test picture instead")
        return test_picture(seed=sum(map(ord, file_name)))


def test_picture(size=(320, 240), seed: int = 0):
    """A deterministic RGB picture (gradient, a few filled shapes) for offline demos."""
    from PIL import Image, ImageDraw

    w, h = size
    r = np.random.default_rng(seed)
    yy, xx = np.mgrid[0:h, 0:w]
    a = np.stack([xx * 255 // max(w - 1, 1), yy * 255 // max(h - 1, 1),
                  np.full_like(xx, int(r.integers(0, 256)))], -1).astype(np.uint8)
    img = Image.fromarray(a, "RGB")
    d = ImageDraw.Draw(img)
    for _ in range(4):
        x0, y0 = int(r.integers(0, w - 40)), int(r.integers(0, h - 40))
        x1, y1 = x0 + int(r.integers(20, 120)), y0 + int(r.integers(20, 120))
        col = tuple(int(c) for c in r.integers(0, 256, 3))
        (d.ellipse if r.random() < 0.5 else d.rectangle)([x0, y0, x1, y1], fill=col)
    return img


# --------------------------------------------------------------------------- ImageNet
def _classify(name: str, model, image, top: int, verbose: bool, device: str) -> dict:
    m = _Model(name, model, device)
    size = m.input_hw(224)
    x = pre.imagenet(image if image is not None else demo_image("kitten.jpg"), size=size)
    logits = next(iter(m.run({m.inputs[0].name: x}).values()))
    labels = _labels.imagenet_labels()
    best = post.top_k(logits, labels, k=top)
    _say(verbose, *post.format_top_k(best))
    return {"top": best, "twin": m.is_twin}


def mobilenet(model=None, image=None, *, top: int = 5, verbose: bool = True,
              device: str = "CPU") -> dict:
    """MobileNetV2: the ImageNet pipeline, softmax, top-5 ``class=... ; probability=...``."""
    return _classify("mobilenetv2", model, image, top, verbose, device)


def resnet18(model=None, image=None, *, top: int = 5, verbose: bool = True,
             device: str = "CPU") -> dict:
    """ResNet-18 v1: as :func:`mobilenet`."""
    return _classify("resnet18", model, image, top, verbose, device)


def vgg16(model=None, image=None, *, top: int = 5, verbose: bool = True,
          device: str = "CPU") -> dict:
    """VGG-16: as :func:`mobilenet`."""
    return _classify("vgg16", model, image, top, verbose, device)


def shufflenetv2(model=None, image=None, *, top: int = 5, verbose: bool = True,
                 device: str = "CPU") -> dict:
    """ShuffleNetV2: as :func:`mobilenet`."""
    return _classify("shufflenetv2", model, image, top, verbose, device)


# --------------------------------------------------------------------------- Tiny YOLOv2
def tiny_yolov2(model=None, image=None, *, threshold: float = 0.5, iou: float = 0.45,
                save: str | None = None, verbose: bool = True, device: str = "CPU") -> dict:
    """Tiny YOLOv2: resize, decode the grid, NMS, draw the boxes (``save`` writes the PNG).

    Prints ``bounding box: (x1, y1, x2, y2)`` and ``class=... ; probability=...`` per kept box
    (coordinates in the resized image). Returns the detections and the drawn image.
    """
    m = _Model("tinyyolov2", model, device)
    size = m.input_hw(int(m.meta.get("workbench.input_size", 416)))
    x, resized = pre.tiny_yolo(image if image is not None else demo_image("person.jpg"), size)
    grid = next(iter(m.run({m.inputs[0].name: x}).values()))
    classes = _labels.voc_classes()
    found = post.decode_yolo(grid, classes, threshold=threshold, image_size=size)
    kept = post.nms(found, iou)
    for d in kept:
        x1, y1, x2, y2 = (int(round(v)) for v in d.box)
        _say(verbose, f"bounding box: ({x1}, {y1}, {x2}, {y2})",
             f"class={d.label} ; probability={d.score:f}")
    drawn = post.draw_detections(resized, kept, len(classes))
    if save:
        drawn.save(save)
    return {"detections": kept, "before_nms": len(found), "image": drawn, "twin": m.is_twin}


# --------------------------------------------------------------------------- ArcFace
def arcface(model=None, images=None, *, verbose: bool = True, device: str = "CPU") -> dict:
    """ArcFace: two face images -> L2-normalised embeddings -> ``Distance = ...`` (squared L2)
    and ``Similarity = ...`` (cosine)."""
    m = _Model("arcface", model, device)
    if images is None:
        images = [demo_image("aurelien.jpg"), demo_image("gwenn.jpg")]
    if len(images) != 2:
        raise ValueError(f"arcface compares two images, got {len(images)}")
    x = pre.arcface(images, m.input_hw(112))
    # one image at a time: the model's batch dimension is fixed at 1
    embs = [next(iter(m.run({m.inputs[0].name: x[i:i + 1]}).values()))[0] for i in range(2)]
    dist, sim = post.face_distance(embs[0], embs[1])
    _say(verbose, f"Distance = {dist:f}", f"Similarity = {sim:f}")
    return {"distance": dist, "similarity": sim, "embeddings": post.l2_normalize(np.stack(embs)),
            "twin": m.is_twin}


# --------------------------------------------------------------------------- FER+
def emotion_ferplus(model=None, image=None, *, top: int = 5, verbose: bool = True,
                    device: str = "CPU") -> dict:
    """FER+: grayscale 64x64 raw pixels -> softmax over 8 emotions, top 5."""
    m = _Model("emotion_ferplus", model, device)
    x = pre.ferplus(image if image is not None else demo_image("fear.jpg"))
    scores = next(iter(m.run({m.inputs[0].name: x}).values()))
    best = post.top_k(scores, _labels.ferplus_emotions(), k=top)
    _say(verbose, *post.format_top_k(best))
    return {"top": best, "twin": m.is_twin}


# --------------------------------------------------------------------------- text models
def _file_or_twin(name: str, files: list, twin: bool):
    """Paths of the tokeniser files (downloaded into the zoo cache), or None for the twin."""
    if twin:
        return None
    from workbench.zoo import fetch_extra
    return [fetch_extra(name, f, progress=False) for f in files]


def bert_squad(model=None, inputs: dict | None = None, *, vocab: str | None = None,
               n_best: int = 20, max_answer_length: int = 30, verbose: bool = True,
               device: str = "CPU") -> dict:
    """BERT-Squad: SQuAD-style ``inputs`` (default: the demo's inputs.json) -> answers.

    Prints ``The input is:`` + the input JSON and ``The result is:`` + the predictions JSON;
    returns ``{"predictions": {id: text}, "nbest": {id: [...]}}``. The tokeniser uses BERT's
    uncased ``vocab.txt`` (zoo cache) or, for the twin, the twin's character vocabulary.
    """
    m = _Model("bertsquad", model, device)
    inputs = SQUAD_INPUT if inputs is None else inputs
    if vocab is None:
        files = _file_or_twin("bertsquad", ["vocab.txt"], m.is_twin)
        vocab = files[0] if files else toks.bert_twin_vocab()
    tokenizer = toks.BertTokenizer(vocab, do_lower_case=True)
    by_name = {i.name.split(":")[0]: i.name for i in m.inputs}
    ids_info = next(i for i in m.inputs if i.name == by_name["input_ids"])
    seq = ids_info.shape[-1] if ids_info.shape else 256
    seq = int(seq) if isinstance(seq, (int, np.integer)) else 256
    results = []
    for article in inputs["data"]:
        for para in article["paragraphs"]:
            for qa in para["qas"]:
                ex = pre.squad_features(tokenizer, qa["question"], para["context"],
                                        qas_id=str(qa["id"]), max_seq_length=seq)
                starts, ends = [], []
                for f in ex.features:
                    feeds = {by_name["unique_ids_raw_output___9"]: np.asarray([f.unique_id],
                                                                             np.int64),
                             by_name["segment_ids"]: f.segment_ids[None],
                             by_name["input_mask"]: f.input_mask[None],
                             by_name["input_ids"]: f.input_ids[None]}
                    out = m.run(feeds)
                    starts.append(out["unstack:0"][0])
                    ends.append(out["unstack:1"][0])
                results.append((ex, post.squad_answers(ex, starts, ends, n_best=n_best,
                                                       max_answer_length=max_answer_length)))
    preds, nbest = post.predictions_json(results)
    _say(verbose, "The input is:", json.dumps(inputs, indent=2), "The result is:",
         json.dumps(preds, indent=2))
    return {"predictions": preds, "nbest": nbest, "twin": m.is_twin}


def roberta(model=None, text: str = ROBERTA_TEXT, *, verbose: bool = True,
            device: str = "CPU") -> dict:
    """RoBERTa SST-2: byte-level BPE with ``<s>``/``</s>``, int64 ids [1, L], argmax over the
    two logits; prints ``Prediction: positive`` or ``Prediction: negative``."""
    m = _Model("roberta", model, device)
    files = _file_or_twin("roberta", ["vocab.json", "merges.txt"], m.is_twin)
    tok = toks.roberta_tokenizer(*files) if files else toks.roberta_twin_tokenizer()
    ids = tok.encode(text)
    limit = m.max_positions(512)
    if len(ids) > limit:
        ids = pre.truncate(ids[:-1], limit - 1, "the text (with <s>)") + ids[-1:]
    logits = next(iter(m.run({m.inputs[0].name: np.asarray([ids], np.int64)}).values()))
    label, p = post.sentiment(logits[0])
    _say(verbose, f"Prediction: {label}")
    return {"label": label, "probability": p, "ids": ids, "twin": m.is_twin}


def gpt2(model=None, prompt: str = GPT2_PROMPT, *, new_tokens: int = 20, verbose: bool = True,
         device: str = "CPU") -> dict:
    """GPT-2: BPE-encode the prompt, then greedily append ``new_tokens`` tokens, re-running the
    whole sequence each step (ids int64 shaped [1, 1, L], as the model declares); prints only
    the decoded new tokens."""
    m = _Model("gpt2", model, device)
    files = _file_or_twin("gpt2", ["vocab.json", "merges.txt"], m.is_twin)
    tok = toks.gpt2_tokenizer(*files) if files else toks.gpt2_twin_tokenizer()
    ids = tok.encode(prompt)
    limit = m.max_positions(1024)
    if new_tokens >= limit:
        raise ValueError(f"new_tokens={new_tokens} leaves no room for the prompt in the model's "
                         f"{limit} positions")
    ids = pre.truncate(ids, limit - new_tokens, "the prompt", keep="tail")
    name = m.inputs[0].name
    out_ids: list = []
    for _ in range(new_tokens):
        seq = np.asarray(ids + out_ids, np.int64)[None, None]
        logits = next(iter(m.run({name: seq}).values()))
        out_ids.append(post.greedy_next(logits))
    text = tok.decode(out_ids)
    _say(verbose, text)
    return {"text": text, "ids": out_ids, "prompt_ids": ids, "twin": m.is_twin}


DEMOS = {"mobilenetv2": mobilenet, "resnet18": resnet18, "vgg16": vgg16,
         "shufflenetv2": shufflenetv2, "tinyyolov2": tiny_yolov2, "arcface": arcface,
         "emotion_ferplus": emotion_ferplus, "bertsquad": bert_squad, "roberta": roberta,
         "gpt2": gpt2}


def run(name: str, model=None, **kwargs) -> dict:
    """Run the demo of zoo model ``name`` (aliases accepted)."""
    from workbench.zoo.registry import get
    return DEMOS[get(name).name](model, **kwargs)


__all__ = ["DEMOS", "run", "demo_image", "test_picture"] + [f.__name__ for f in DEMOS.values()]
