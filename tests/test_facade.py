"""The Pythonic facade: wb.load / show / inspect / fit / netron and lazy submodules."""

from __future__ import annotations

import numpy as np
import pytest

import workbench as wb
from workbench.cli import default_model_path
from workbench.errors import WorkbenchError


def _digits():
    d = np.load(default_model_path().replace("default_model.onnx", "digits_sample.npz"))
    return d["images"], d["labels"]


def test_load_run_cut_export(tmp_path):
    m = wb.load(default_model_path())
    x, y = _digits()
    out = m.forward(wb.tensor.from_numpy(x))
    logits = (out[0] if isinstance(out, (list, tuple)) else out).numpy()
    assert logits.shape == (len(x), 10)
    assert (logits.argmax(1) == y).mean() > 0.9
    head = m.cut(-3)
    assert head is not m
    p = tmp_path / "out.onnx"
    m.export(str(p))
    with pytest.raises(FileExistsError):
        m.export(str(p))


def test_load_unknown_zoo_name_suggests():
    with pytest.raises(WorkbenchError, match="did you mean 'resnet18'"):
        wb.load("resnet-18x")


def test_load_zoo_twin_offline(monkeypatch, tmp_path, capsys):
    monkeypatch.setenv("WORKBENCH_OFFLINE", "1")
    monkeypatch.setenv("WORKBENCH_HOME", str(tmp_path))
    m = wb.load("emotion_ferplus", allow_twin=True)
    assert "meaningless" in capsys.readouterr().err
    assert m.input_names == ["Input3"]


def test_lazy_submodules_and_singa_import():
    from workbench import autograd, device, layer, opt, sonnx, tensor  # noqa: F401
    assert wb.zoo.get("gpt2").opset == 10
    assert "sonnx" in dir(wb)
    with pytest.raises(AttributeError):
        wb.nonexistent_thing  # noqa: B018
