"""The ten demos end to end on their twins, offline, plus ``zoo.load_model`` and bad input."""

from __future__ import annotations

import json

import numpy as np
import pytest
from PIL import Image

from workbench import zoo
from workbench.errors import DownloadError, WorkbenchError
from workbench.zoo import demos, labels, twins


@pytest.fixture(autouse=True)
def offline(monkeypatch, tmp_path):
    monkeypatch.setenv("WORKBENCH_OFFLINE", "1")
    monkeypatch.setenv("WORKBENCH_HOME", str(tmp_path / "cache"))


# --------------------------------------------------------------------------- load_model
def test_load_model_offline_gives_the_twin_with_a_note(capsys):
    m, is_twin = zoo.load_model("ResNet18")
    assert is_twin and twins.twin_of(m) == "resnet18"
    err = capsys.readouterr().err
    assert "using the untrained architecture twin of resnet18: predictions are meaningless" \
        in err
    with pytest.raises(DownloadError, match="offline"):
        zoo.load_model("resnet18", allow_twin=False)


def test_load_model_prefers_the_real_file(monkeypatch, tmp_path):
    fake = tmp_path / "real.onnx"
    fake.write_bytes(b"x")
    monkeypatch.setattr(zoo, "fetch", lambda name, **kw: str(fake))
    assert zoo.load_model("vgg16") == (str(fake), False)


def test_unknown_names_suggest():
    with pytest.raises(WorkbenchError, match="did you mean 'gpt2'"):
        zoo.load_model("gtp2")
    with pytest.raises(WorkbenchError, match="did you mean"):
        demos.run("mobilenet_v3")
    with pytest.raises(WorkbenchError, match="no extra file 'vocab.txt'"):
        zoo.extra_path("gpt2", "vocab.txt")


def test_extra_files_are_recorded():
    assert set(zoo.get("bertsquad").extra_files) == {"vocab.txt"}
    assert set(zoo.get("gpt2").extra_files) == {"vocab.json", "merges.txt"}
    assert set(zoo.get("roberta").extra_files) == {"vocab.json", "merges.txt"}
    assert "synset.txt" in zoo.get("mobilenetv2").extra_files
    assert zoo.extra_path("resnet18", "synset.txt").endswith("resnet18/synset.txt")


# --------------------------------------------------------------------------- labels
def test_imagenet_labels_offline_and_cached(capsys):
    names = labels.imagenet_labels()
    assert names[:2] == ["class_0", "class_1"] and len(names) == 1000
    assert "class_<i>" in capsys.readouterr().err
    path = zoo.extra_path("resnet18", "synset.txt")
    import os
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        f.write("".join(f"n{i:08d} thing {i}\n" for i in range(1000)))
    assert labels.imagenet_labels()[3] == "n00000003 thing 3"


# --------------------------------------------------------------------------- demos on twins
@pytest.mark.parametrize("name", ["mobilenetv2", "resnet18", "vgg16", "shufflenetv2"])
def test_imagenet_demos(name, capsys):
    r = demos.run(name)
    assert r["twin"] and len(r["top"]) == 5
    out = capsys.readouterr().out.splitlines()
    assert len(out) == 5 and all(line.startswith("class=class_") for line in out)
    assert " ; probability=" in out[0]
    probs = [p for _, p in r["top"]]
    assert probs == sorted(probs, reverse=True)


def test_imagenet_demo_any_image_size_and_mode(capsys):
    m = twins.build("resnet18")
    for img in (Image.new("L", (31, 77), 90), Image.new("RGBA", (500, 20)),
                np.zeros((10, 10, 3), np.uint8)):
        assert len(demos.resnet18(m, img, verbose=False)["top"]) == 5


def test_tiny_yolo_demo(tmp_path, capsys):
    out = tmp_path / "result.png"
    r = demos.tiny_yolov2(threshold=0.0, save=str(out))       # threshold 0: boxes everywhere
    assert r["twin"] and r["before_nms"] >= len(r["detections"]) > 0
    assert out.exists() and Image.open(out).size == (160, 160)
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("bounding box: (") and lines[1].startswith("class=")
    assert len(lines) == 2 * len(r["detections"])


def test_arcface_demo(capsys):
    r = demos.arcface()
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("Distance = ") and out[1].startswith("Similarity = ")
    assert r["distance"] == pytest.approx(2 - 2 * r["similarity"])
    np.testing.assert_allclose(np.linalg.norm(r["embeddings"], axis=1), 1.0)
    same = demos.arcface(images=[Image.new("RGB", (90, 120), (9, 99, 199))] * 2, verbose=False)
    assert same["distance"] == pytest.approx(0.0, abs=1e-9)
    assert same["similarity"] == pytest.approx(1.0)
    with pytest.raises(ValueError, match="two images"):
        demos.arcface(images=[Image.new("RGB", (5, 5))], verbose=False)


def test_ferplus_demo(capsys):
    r = demos.emotion_ferplus(image=Image.new("RGB", (300, 200), (200, 10, 10)))
    assert [e for e, _ in r["top"]][0] in labels.ferplus_emotions()
    assert len(capsys.readouterr().out.splitlines()) == 5


def test_bert_squad_demo(capsys):
    r = demos.bert_squad()
    out = capsys.readouterr().out
    assert out.startswith("The input is:\n") and "The result is:" in out
    preds = json.loads(out.split("The result is:\n", 1)[1])
    assert set(preds) == {"1", "2", "3"} == set(r["predictions"])
    for text in preds.values():                                # spans of the context
        assert text and text in demos.SQUAD_CONTEXT
    assert all(len(v) <= 20 for v in r["nbest"].values())


def test_bert_squad_long_question_warns(capsys):
    inputs = {"data": [{"paragraphs": [{"context": "the center is in san jose",
                                        "qas": [{"question": "where " * 80, "id": "q"}]}]}]}
    with pytest.warns(UserWarning, match="80 tokens, more than the 64"):
        r = demos.bert_squad(inputs=inputs, verbose=False)
    assert r["predictions"]["q"] in "the center is in san jose"


def test_roberta_demo_and_truncation(capsys):
    r = demos.roberta()
    assert capsys.readouterr().out.strip() in ("Prediction: positive", "Prediction: negative")
    assert r["ids"][0] == 0 and r["ids"][-1] == 2
    with pytest.warns(UserWarning, match="more than the 63 the model takes"):
        long = demos.roberta(text="word " * 100, verbose=False)
    assert len(long["ids"]) == 64 and long["ids"][0] == 0 and long["ids"][-1] == 2


def test_gpt2_demo_and_truncation(capsys):
    r = demos.gpt2(new_tokens=5)
    assert len(r["ids"]) == 5
    assert capsys.readouterr().out.rstrip("\n") == r["text"]
    again = demos.gpt2(new_tokens=5, verbose=False)
    assert again["ids"] == r["ids"]                            # greedy: deterministic
    with pytest.warns(UserWarning, match="the prompt has 200 tokens, more than the 59"):
        long = demos.gpt2(prompt="ab" * 100, new_tokens=5, verbose=False)
    assert len(long["prompt_ids"]) == 59
    with pytest.raises(ValueError, match="no room"):
        demos.gpt2(new_tokens=64, verbose=False)


def test_demo_on_a_saved_twin_file(tmp_path, capsys):
    import onnx
    p = tmp_path / "fer.onnx"
    onnx.save(twins.build("emotion_ferplus"), p)
    r = demos.emotion_ferplus(str(p), image=np.zeros((64, 64), np.uint8), verbose=False)
    assert r["twin"]


# --------------------------------------------------------------------------- the real-model path
def _as_if_real(name, tmp_path):
    """A twin saved without its twin marker: the demos then take the real model's path
    (tokeniser files from the zoo cache), which these tests fill with small files."""
    import onnx
    m = twins.build(name)
    del m.metadata_props[:]
    p = tmp_path / f"{name}.onnx"
    onnx.save(m, p)
    return str(p)


def _place(name, file_name, text):
    import os
    path = zoo.extra_path(name, file_name)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)


def test_text_demos_use_the_cached_tokeniser_files_for_real_models(tmp_path, capsys):
    from workbench.zoo import tokenizers as T

    # RoBERTa: the twin's byte vocabulary plus one merged token; the merge must be used
    vocab = dict(T.roberta_twin_tokenizer().encoder)
    vocab["Ġgood"] = 7                          # reuse an id the twin's embedding has
    _place("roberta", "vocab.json", json.dumps(vocab))
    _place("roberta", "merges.txt", "#version: 0.2\nĠ g\no o\nĠg oo\nĠgoo d\n")
    r = demos.roberta(_as_if_real("roberta", tmp_path), text="so good", verbose=False)
    assert not r["twin"]
    assert r["ids"] == [0, vocab["s"], vocab["o"], 7, 2]

    # BERT: vocab.txt from the cache
    _place("bertsquad", "vocab.txt", "\n".join(T.bert_twin_vocab()) + "\n")
    r = demos.bert_squad(_as_if_real("bertsquad", tmp_path), verbose=False)
    assert not r["twin"] and set(r["predictions"]) == {"1", "2", "3"}

    # offline without the files: a clear download error naming the file
    with pytest.raises(DownloadError, match="vocab.json.*huggingface.co/gpt2"):
        demos.gpt2(_as_if_real("gpt2", tmp_path), verbose=False)
