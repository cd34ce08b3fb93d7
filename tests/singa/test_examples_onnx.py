"""SINGA's ``examples/onnx`` programs (ported under ``examples/singa_onnx``, their imports and
download folder changed) run offline on the zoo's architecture twins.

Each program downloads its model (a ``.tar.gz``), images and label files into its download
folder through ``utils.check_exist_or_download``, which skips files that exist: SINGA's
``/tmp/``, or the folder ``SINGA_ONNX_DOWNLOAD_DIR`` names. The test gives every program a fresh
temporary folder (pytest's ``tmp_path``) and puts stand-ins there first - the twin of the zoo
model packed as the program expects (SINGA's paths inside the archives), a synthetic image for
each photo, placeholder ImageNet labels, a BERT vocabulary archive - then runs the program
unchanged in a fresh process through ``example_shims/run_singa_example.py`` (see there for
what it adapts: no network, the CPU when there is no GPU, Pillow's removed ``ANTIALIAS``
alias, stand-ins for ``transformers``' tokenizers and for SINGA's CIFAR-10 loader, SINGA's
``last_layers`` counting).

Nothing is written where the programs look for real downloads, and the programs say so when
they meet a stand-in (``utils.py`` prints a NOTE for a twin model or a file with a
``.workbench-twin`` marker, which earlier versions of this test left in ``/tmp``). Twins'
predictions are meaningless; the test checks that each program completes and prints what it
prints, with finite numbers.
"""

from __future__ import annotations

import functools
import io
import os
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import numpy as np
import onnx
import pytest

pytest.importorskip("PIL")
pytest.importorskip("onnxruntime")

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples" / "singa_onnx"
RUNNER = Path(__file__).resolve().parent / "example_shims" / "run_singa_example.py"


@pytest.fixture
def downloads(tmp_path) -> Path:
    """The programs' download folder for one test (SINGA_ONNX_DOWNLOAD_DIR)."""
    folder = tmp_path / "downloads"
    folder.mkdir()
    return folder


# --------------------------------------------------------------------------- stand-in files
def _place(folder: Path, name: str, data: bytes) -> Path:
    path = folder / name
    path.write_bytes(data)
    return path


def _tar(member: str, payload: bytes) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz", compresslevel=1) as t:
        info = tarfile.TarInfo(member)
        info.size = len(payload)
        info.mtime = 0
        t.addfile(info, io.BytesIO(payload))
    return buf.getvalue()


def _jpeg(w: int, h: int, seed: int) -> bytes:
    from PIL import Image
    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[0:h, 0:w]
    img = np.stack([(xx * 255 // max(w - 1, 1)), (yy * 255 // max(h - 1, 1)),
                    rng.integers(0, 256, (h, w))], -1).astype(np.uint8)
    buf = io.BytesIO()
    Image.fromarray(img).save(buf, format="JPEG", quality=90)
    return buf.getvalue()


@functools.cache
def _model_bytes(name: str) -> bytes:
    from workbench.zoo import twins
    if name == "resnet18":
        # SINGA's transfer-learning example appends Linear(512, ...) to ResNet-18's features
        return twins.resnet18(features=512).SerializeToString()
    return twins.build(name).SerializeToString()


#: archive name SINGA downloads -> (path of the model inside it, twin)
ARCHIVES = {
    "resnet18v1.tar.gz": ("resnet18v1/resnet18v1.onnx", "resnet18"),
    "vgg16.tar.gz": ("vgg16/vgg16.onnx", "vgg16"),
    "mobilenetv2-1.0.tar.gz": ("mobilenetv2-1.0/mobilenetv2-1.0.onnx", "mobilenetv2"),
    "shufflenet-v2-10.tar.gz": ("model/test_shufflenetv2/model.onnx", "shufflenetv2"),
    "tiny_yolov2.tar.gz": ("tiny_yolov2/Model.onnx", "tinyyolov2"),
    "resnet100.tar.gz": ("resnet100/resnet100.onnx", "arcface"),
    "emotion_ferplus.tar.gz": ("emotion_ferplus/model.onnx", "emotion_ferplus"),
    "bertsquad-10.tar.gz": ("download_sample_10/bertsquad10.onnx", "bertsquad"),
    "roberta-sequence-classification-9.tar.gz": (
        "roberta-sequence-classification-9/roberta-sequence-classification-9.onnx", "roberta"),
    "gpt2-lm-head-10.tar.gz": ("GPT-2-LM-HEAD/model.onnx", "gpt2"),
}

IMAGES = {"kitten.jpg": (320, 240), "person.jpg": (500, 375), "aurelien.jpg": (240, 320),
          "gwenn.jpg": (260, 300), "fear.8d1417fa.jpg": (128, 128)}


def _provide(folder: Path, archive: str | None = None, images=(), synset=False,
             vocab=False) -> None:
    if archive is not None:
        member, twin = ARCHIVES[archive]
        _place(folder, archive, _tar(member, _model_bytes(twin)))
    for k, name in enumerate(images):
        _place(folder, name, _jpeg(*IMAGES[name], seed=k))
    if synset:
        from workbench.zoo.labels import placeholder_labels
        lines = [f"n{k:08d} {lab}" for k, lab in enumerate(placeholder_labels(1000))]
        _place(folder, "synset.txt", ("\n".join(lines) + "\n").encode())
    if vocab:
        from workbench.zoo.tokenizers import bert_twin_vocab
        buf = io.BytesIO()
        with zipfile.ZipFile(buf, "w") as z:
            info = zipfile.ZipInfo("uncased_L-12_H-768_A-12/vocab.txt", (1980, 1, 1, 0, 0, 0))
            z.writestr(info, "\n".join(bert_twin_vocab()) + "\n")
        _place(folder, "uncased_L-12_H-768_A-12.zip", buf.getvalue())


def _run(program: str, *args: str, cwd: Path, downloads: Path, timeout: int = 300) -> str:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT)] + [p for p in env.get(
        "PYTHONPATH", "").split(os.pathsep) if p])
    env["WORKBENCH_LAST_LAYERS"] = "singa"
    env["SINGA_ONNX_DOWNLOAD_DIR"] = str(downloads)
    env.setdefault("OMP_NUM_THREADS", "2")
    r = subprocess.run([sys.executable, str(RUNNER), str(EXAMPLES / program), *args],
                       cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    out = r.stdout + r.stderr
    assert r.returncode == 0, f"{program} failed (exit {r.returncode}):\n{out[-6000:]}"
    return out


def _probabilities(out: str, n: int) -> list:
    probs = [float(line.rsplit("probability=", 1)[1]) for line in out.splitlines()
             if "probability=" in line]
    assert len(probs) == n, out[-3000:]
    assert all(np.isfinite(p) and 0 <= p <= 1 for p in probs)
    assert probs == sorted(probs, reverse=True)
    return probs


def _says_stand_in(out: str, archive: str) -> None:
    """The program said that the model it ran is an untrained stand-in."""
    member, twin = ARCHIVES[archive]
    lines = [line for line in out.splitlines() if line.startswith("NOTE: ")]
    assert any(member in line and "stand-in" in line and repr(twin) in line for line in lines), \
        out[-3000:]


# --------------------------------------------------------------------------- programs
@pytest.mark.parametrize("program,archive", [
    ("resnet18.py", "resnet18v1.tar.gz"),
    ("vgg16.py", "vgg16.tar.gz"),
    ("mobilenet.py", "mobilenetv2-1.0.tar.gz"),
    ("shufflenetv2.py", "shufflenet-v2-10.tar.gz"),
])
def test_imagenet_classifiers(program, archive, tmp_path, downloads):
    _provide(downloads, archive, images=["kitten.jpg"], synset=True)
    out = _run(program, cwd=tmp_path, downloads=downloads)
    _probabilities(out, 5)
    assert "class=n000" in out
    _says_stand_in(out, archive)
    # SINGA's programs hard-code the GPU; the ports take what there is and say which
    from workbench import device
    said = "device: CUDA GPU 0" if device.cuda_available() else "device: the CPU (no GPU: "
    assert said in out, out[-3000:]


def test_tiny_yolov2(tmp_path, downloads):
    _provide(downloads, "tiny_yolov2.tar.gz", images=["person.jpg"])
    out = _run("tiny_yolov2.py", cwd=tmp_path, downloads=downloads)
    assert (tmp_path / "result.png").exists()   # the image with the boxes drawn
    assert "postprocessing" in out


def test_arcface(tmp_path, downloads):
    pytest.importorskip("sklearn")
    _provide(downloads, "resnet100.tar.gz", images=["aurelien.jpg", "gwenn.jpg"])
    out = _run("arcface.py", cwd=tmp_path, downloads=downloads)
    dist = float(out.split("Distance = ", 1)[1].split()[0])
    sim = float(out.split("Similarity = ", 1)[1].split()[0])
    # unit-length embeddings: |a - b|^2 = 2 - 2 a.b
    assert dist == pytest.approx(2 - 2 * sim, abs=1e-4)


def test_fer_emotion(tmp_path, downloads):
    _provide(downloads, "emotion_ferplus.tar.gz", images=["fear.8d1417fa.jpg"])
    out = _run("fer_emotion.py", cwd=tmp_path, downloads=downloads)
    _probabilities(out, 5)


def test_bert_squad(tmp_path, downloads):
    _provide(downloads, "bertsquad-10.tar.gz", vocab=True)
    out = _run("bert/bert-squad.py", cwd=tmp_path, downloads=downloads)
    assert "The result is:" in out
    import json
    preds = json.loads((tmp_path / "predictions" / "predictions.json").read_text())
    assert sorted(preds) == ["1", "2", "3"]   # one answer per question of inputs.json



def test_gpt2(tmp_path, downloads):
    _provide(downloads, "gpt2-lm-head-10.tar.gz")
    out = _run("gpt2/gpt2.py", cwd=tmp_path, downloads=downloads)
    assert out.strip()


def test_ro_bert_a(tmp_path, downloads):
    _provide(downloads, "roberta-sequence-classification-9.tar.gz")
    out = _run("ro_bert_a/ro_bert_a.py", cwd=tmp_path, downloads=downloads)
    assert "Prediction: " in out


@pytest.mark.slow
def test_training_transfer_learning(tmp_path, downloads):
    pytest.importorskip("tqdm")
    _provide(downloads, "resnet18v1.tar.gz")
    out = _run("training/train.py", "--epoch", "1", "--bs", "4", cwd=tmp_path,
               downloads=downloads)
    assert "Starting Epoch 0:" in out
    loss = float(out.split("Training loss = ", 1)[1].split(",")[0])
    assert np.isfinite(loss)
    assert "Evaluation accuracy = " in out
    assert "Time profiling" in out          # dev.PrintTimeProfiling() after SetVerbosity(1)


def test_training_program_steps(tmp_path, downloads, monkeypatch, capsys):
    """SINGA's training program's own pieces (its MyModel with ``last_layers=-3`` and
    ``Linear(512, classes)``, ``train_one_batch``, ``augmentation``, ``resize_dataset``, its
    ``model.json``) driven as its ``run()`` drives them, in this process: what the whole
    program does between its prints."""
    pytest.importorskip("tqdm")
    import json
    import runpy

    from workbench import device, opt, tensor
    _provide(downloads, "resnet18v1.tar.gz")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("WORKBENCH_LAST_LAYERS", "singa")
    monkeypatch.setenv("SINGA_ONNX_DOWNLOAD_DIR", str(downloads))
    monkeypatch.syspath_prepend(str(EXAMPLES))
    monkeypatch.syspath_prepend(str(RUNNER.parent))
    monkeypatch.delitem(sys.modules, "utils", raising=False)
    prog = runpy.run_path(str(EXAMPLES / "training" / "train.py"), run_name="singa_train")
    monkeypatch.delitem(sys.modules, "utils", raising=False)
    config = json.loads((EXAMPLES / "training" / "model.json").read_text())["resnet18v1"]
    assert config["last_layers"] == -3 and config["last_layers_dim"] == 512

    from data import cifar10  # the stand-in of SINGA's loader
    train_x, train_y, val_x, val_y = cifar10.load()
    prog["download_model"](config["url"])
    assert prog["DOWNLOAD_DIR"] == os.path.join(str(downloads), "")
    model = prog["MyModel"](onnx.load(str(downloads / config["path"])), num_channels=3,
                            num_classes=10, last_layers=config["last_layers"],
                            in_dim=config["last_layers_dim"])
    assert model.last_layers_counting == "singa"
    dev = device.get_default_device()
    bs = 4
    tx = tensor.Tensor((bs, 3, 224, 224), dev, tensor.float32)
    ty = tensor.Tensor((bs,), dev, tensor.int32)
    model.set_optimizer(opt.SGD(lr=0.005, momentum=0.9, weight_decay=1e-5))
    model.compile([tx], is_train=True, use_graph=True, sequential=False)
    dev.SetVerbosity(1)
    dev.SetSkipIteration(0)
    try:
        w0 = tensor.to_numpy(model.linear.W)
        model.train()
        x = prog["resize_dataset"](prog["augmentation"](train_x[:bs].copy(), bs), 224)
        tx.copy_from_numpy(x)
        ty.copy_from_numpy(train_y[:bs])
        out, loss = model(tx, ty, "fp32", None)
        assert out.shape == (bs, 10)
        assert np.isfinite(tensor.to_numpy(loss)).all()
        assert not np.allclose(tensor.to_numpy(model.linear.W), w0)   # the step updated it
        assert prog["accuracy"](tensor.to_numpy(out), train_y[:bs]) in range(bs + 1)
        model.eval()
        tx.copy_from_numpy(prog["resize_dataset"](val_x[:bs].copy(), 224))
        assert model(tx).shape == (bs, 10)
        text = dev.PrintTimeProfiling()
        assert "Flatten" in text and "Conv" in text
    finally:
        dev.SetVerbosity(0)
        dev.ResetGraph()


def test_utils_say_when_a_file_is_a_stand_in(tmp_path, downloads, monkeypatch, capsys):
    """utils.py (the programs' download helper) prints a NOTE for a twin model and for a file
    an earlier test run left with its '.workbench-twin' marker; a real model passes quietly."""
    import runpy
    monkeypatch.setenv("SINGA_ONNX_DOWNLOAD_DIR", str(downloads))
    utils = runpy.run_path(str(EXAMPLES / "utils.py"), run_name="singa_utils")
    assert utils["DOWNLOAD_DIR"] == os.path.join(str(downloads), "")
    url = "https://example.invalid/models/resnet18v1.tar.gz"
    _provide(downloads, "resnet18v1.tar.gz")
    utils["download_model"](url)
    out = capsys.readouterr().out
    assert "NOTE: " in out and "resnet18v1.onnx" in out and "'resnet18'" in out
    # a model that is not a twin: no note
    plain = onnx.helper.make_model(onnx.helper.make_graph(
        [onnx.helper.make_node("Relu", ["x"], ["y"])], "g",
        [onnx.helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1])],
        [onnx.helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [1])]))
    _place(downloads, "plain.tar.gz", _tar("plain/model.onnx", plain.SerializeToString()))
    utils["download_model"]("https://example.invalid/plain.tar.gz")
    assert "NOTE" not in capsys.readouterr().out
    # a file left by an earlier test run, marker beside it
    (downloads / "kitten.jpg").write_bytes(b"x")
    (downloads / "kitten.jpg.workbench-twin").write_text("0" * 64 + "\n")
    assert utils["check_exist_or_download"]("https://example.invalid/kitten.jpg") == \
        str(downloads / "kitten.jpg")
    out = capsys.readouterr().out
    assert "NOTE: " in out and "kitten.jpg" in out and "test run" in out
