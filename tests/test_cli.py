"""The command line: info, run (with inputs and --compare), demo, and its error messages."""

from __future__ import annotations

import numpy as np
import onnx
import pytest

from workbench.cli import default_model_path, main


def test_info_default_model(capsys):
    assert main(["info", default_model_path()]) == 0
    out = capsys.readouterr().out
    assert "image: float [batch, 1, 8, 8]" in out
    assert "logits: float [batch, 10]" in out
    assert "Conv" in out and "parameters: 14,378" in out
    assert "the engine has kernels for every op" in out


def test_info_reports_missing_ops(tmp_path, capsys):
    from onnx import TensorProto, helper
    g = helper.make_graph([helper.make_node("Relu", ["x"], ["r"], name="a"),
                           helper.make_node("Quux", ["r"], ["y"], name="b", domain="my.ops")],
                          "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17),
                                            helper.make_opsetid("my.ops", 1)])
    p = tmp_path / "m.onnx"
    onnx.save(m, p)
    assert main(["info", str(p), "--no-check"]) == 0
    out = capsys.readouterr().out
    assert "my.ops::Quux" in out and "no kernel" in out


def test_run_with_input_and_compare(tmp_path, capsys):
    pytest.importorskip("onnxruntime")
    x = np.load(default_model_path().replace("default_model.onnx", "digits_sample.npz"))["images"]
    np.save(tmp_path / "x.npy", x[:4])
    rc = main(["run", default_model_path(), "--input", f"image={tmp_path / 'x.npy'}",
               "--compare", "onnxruntime", "--repeat", "2"])
    out = capsys.readouterr().out
    assert rc == 0, out
    assert "ms per run" in out and "max abs difference" in out


def test_run_random_inputs(capsys):
    assert main(["run", default_model_path(), "--repeat", "1"]) == 0
    assert "random values" in capsys.readouterr().out


def test_run_bad_input_spec(tmp_path, capsys):
    rc = main(["run", default_model_path(), "--input", "nope=x.npy"])
    assert rc == 2
    assert "has no input 'nope'" in capsys.readouterr().err
    rc = main(["run", default_model_path(), "--input", f"image={tmp_path / 'missing.npy'}"])
    assert rc == 2
    assert "not found" in capsys.readouterr().err


def test_run_bad_file(tmp_path, capsys):
    p = tmp_path / "bad.onnx"
    p.write_bytes(b"garbage" * 3)
    assert main(["run", str(p)]) == 2
    err = capsys.readouterr().err
    assert "bad.onnx" in err and "ONNX" in err


def test_demo(capsys):
    assert main(["demo"]) == 0
    out = capsys.readouterr().out
    assert "accuracy" in out and "digits" in out


def test_info_and_compare_with_a_zipmap_model(tmp_path, capsys):
    """A scikit-learn classifier (LinearClassifier + ZipMap): info names the sequence-of-maps
    output's type, and --compare onnxruntime compares the dicts' values."""
    pytest.importorskip("onnxruntime")
    skl2onnx = pytest.importorskip("skl2onnx")
    from sklearn.linear_model import LogisticRegression
    rng = np.random.default_rng(0)
    X = rng.normal(size=(40, 3)).astype(np.float32)
    clf = LogisticRegression().fit(X, (X[:, 0] > 0).astype(int))
    onx = skl2onnx.to_onnx(clf, X[:1], target_opset={"": 17, "ai.onnx.ml": 3})
    p = tmp_path / "lr.onnx"
    p.write_bytes(onx.SerializeToString())
    np.save(tmp_path / "x.npy", X[:4])
    assert main(["info", str(p)]) == 0
    assert "seq(map(int64, tensor(float)))" in capsys.readouterr().out
    assert main(["run", str(p), "--input", f"X={tmp_path / 'x.npy'}", "--compare",
                 "onnxruntime", "--repeat", "1"]) == 0
    out = capsys.readouterr().out
    assert "output_label: identical" in out
    assert "output_probability: max abs difference" in out
