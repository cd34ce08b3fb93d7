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


# ------------------------------------------------------------------ a newcomer's first hour
def _symbolic_model(path):
    """x[batch, 3, h, w] -> Conv -> AveragePool(2x8): fails at the guessed 1x1 picture."""
    from onnx import TensorProto, helper, numpy_helper
    w = numpy_helper.from_array(np.full((4, 3, 3, 3), 0.1, np.float32), "W")
    nodes = [helper.make_node("Conv", ["x", "W"], ["c"], name="conv", pads=[1, 1, 1, 1]),
             helper.make_node("AveragePool", ["c"], ["y"], name="p2o.AveragePool.0",
                              kernel_shape=[2, 8], strides=[2, 8])]
    g = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 3, "h", "w"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 4, "a", "b"])], [w])
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), path)
    return str(path)


def test_run_says_when_a_shape_is_a_guess_and_takes_shape_and_dim(tmp_path, capsys):
    model = _symbolic_model(tmp_path / "ocr.onnx")
    assert main(["run", model, "--repeat", "1"]) == 2
    cap = capsys.readouterr()
    assert "symbolic dim(s) 'batch', 'h', 'w' were set to 1, a guess" in cap.out
    assert "--shape x=<batch>,3,<h>,<w>" in cap.out
    # the engine's error, then why: the shape was guessed, and how to give it
    assert "p2o.AveragePool.0" in cap.err and "were guessed" in cap.err
    assert "--shape NAME=D0,D1,..." in cap.err
    assert main(["run", model, "--shape", "x=1,3,48,320", "--repeat", "1"]) == 0
    out = capsys.readouterr().out
    assert "random values of shape [1, 3, 48, 320]" in out and "guess" not in out
    assert "y: float32 [1, 4, 24, 40]" in out
    assert main(["run", model, "--shape", "2,3,16,16", "--repeat", "1"]) == 0   # one input
    assert "y: float32 [2, 4, 8, 2]" in capsys.readouterr().out
    assert main(["run", model, "--dim", "h=48", "--dim", "w=320", "--repeat", "1"]) == 0
    out = capsys.readouterr().out
    assert "'batch' were set to 1, a guess" in out and "[1, 4, 24, 40]" in out
    for bad, said in ((["--shape", "x=1,3,48"], "rank 3"), (["--shape", "y=1,2"], "no input 'y'"),
                      (["--dim", "hh=3"], "symbolic dims are ['batch', 'h', 'w']"),
                      (["--shape", "x=1,4,8,8"], "dim 1 is 3 in the model")):
        assert main(["run", model, *bad]) == 2
        assert said in capsys.readouterr().err, bad


def test_compare_checks_onnxruntime_before_running(monkeypatch, capsys):
    import sys
    monkeypatch.setitem(sys.modules, "onnxruntime", None)      # import fails
    assert main(["run", default_model_path(), "--compare", "onnxruntime"]) == 2
    cap = capsys.readouterr()
    assert "needs the onnxruntime package" in cap.err
    assert "ms per run" not in cap.out                          # nothing was timed first


def _actions(parser, prefix="workbench"):
    import argparse
    for act in parser._actions:
        if isinstance(act, argparse._SubParsersAction):
            for name, sub in act.choices.items():
                yield from _actions(sub, f"{prefix} {name}")
        elif not isinstance(act, argparse._HelpAction):
            yield prefix, act


def test_every_option_of_every_command_has_help():
    from workbench.cli import build_parser
    missing = [f"{where} {a.dest}" for where, a in _actions(build_parser())
               if not (a.help or "").strip()]
    assert not missing, missing


def test_view_help_lists_its_own_options(capsys):
    with pytest.raises(SystemExit) as e:
        main(["view", "-h"])
    assert e.value.code == 0
    out = capsys.readouterr().out
    assert "--port" in out and "--no-browser" in out and "--timeout" in out
    assert main(["view", "/no/such/model.onnx", "--no-browser"]) == 2


def test_conformance_verbose_and_expanded_labels(capsys):
    from workbench import conformance
    by_name = conformance._cases_by_name()
    for name, op in (("test_sce_mean_weight_expanded", "SoftmaxCrossEntropyLoss (expanded)"),
                     ("test_affine_grid_2d_expanded", "AffineGrid (expanded)"),
                     ("test_layer_normalization_2d_axis0_expanded",
                      "LayerNormalization (expanded)"),
                     ("test_sce_mean_weight", "SoftmaxCrossEntropyLoss")):
        if name in by_name:
            assert conformance.primary_op(by_name[name]) == op
    # no expanded case is labelled by an op of its body (the old "Add (expanded)")
    for c in conformance.collect(["_expanded"]):
        twin = by_name[conformance._EXPANDED.sub("", c.name)]
        assert conformance.primary_op(c) == conformance.primary_op(twin) + " (expanded)"
    assert main(["conformance", "-k", "test_abs", "-v", "--no-per-op"]) == 0
    out = capsys.readouterr().out
    assert "PASS test_abs [Abs]" in out and "cases pass" in out


def test_conformance_k_imports_only_the_modules_it_needs(tmp_path):
    """With the index a full collection leaves in the cache, ``-k`` imports only the modules
    that make the matching cases (not the minute of pooling examples); an index that no
    longer matches what the modules make is not trusted."""
    import json
    import os
    import subprocess
    import sys

    code = r"""
import json, sys
from workbench import conformance as c
path = c._index_path()
import os; os.makedirs(os.path.dirname(path), exist_ok=True)
mod = "onnx.backend.test.case.node."
json.dump({"format": c._INDEX_FORMAT, "cases": {"test_abs": mod + "abs",
           "test_relu": mod + "abs"}}, open(path, "w"))
bad = c._some_cases(["test_relu"])          # abs does not make test_relu: not trusted
got = [x.name for x in c.collect(["test_abs"])]
print(json.dumps({"bad": bad, "got": got, "pool": mod + "averagepool" in sys.modules,
                  "full": c._all_cases.cache_info().currsize}))
"""
    env = dict(os.environ, WORKBENCH_HOME=str(tmp_path))
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert out == {"bad": None, "got": ["test_abs"], "pool": False, "full": 0}, out


def test_files_of_other_formats_are_named_with_how_to_export_them(tmp_path, capsys):
    import json
    import struct
    import zipfile

    def zip_of(path, names):
        with zipfile.ZipFile(path, "w") as z:
            for n in names:
                z.writestr(n, b"x")
        return path

    header = json.dumps({"w": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}}).encode()
    files = {
        "ckpt.pt": (zip_of(tmp_path / "ckpt.pt", ["archive/data.pkl", "archive/data/0"]),
                    "torch.save", "torch.onnx.export"),
        "script.pt": (zip_of(tmp_path / "script.pt", ["m/data.pkl", "m/code/__torch__/m.py",
                                                      "m/constants.pkl"]),
                      "TorchScript", "torch.jit.load"),
        "m.keras": (zip_of(tmp_path / "m.keras", ["config.json", "metadata.json",
                                                  "model.weights.h5"]),
                    "Keras 3", "tf2onnx"),
        "m.h5": (b"\x89HDF\r\n\x1a\n" + bytes(64), "HDF5", "--keras"),
        "m.tflite": (b"\x1c\0\0\0TFL3" + bytes(64), "TensorFlow Lite", "--tflite"),
        "old.pt": (b"\x80\x02\x8a\x0al\xfc\x9cF\xf9 j\xa8P\x19." + bytes(16), "pickle",
                   "torch.onnx.export"),
        "w.safetensors": (struct.pack("<Q", len(header)) + header + bytes(4), "safetensors",
                          "optimum-cli"),
        "page.onnx": (b"<!DOCTYPE html><html><body>model</body></html>", "web page", "raw"),
        "lfs.onnx": (b"version https://git-lfs.github.com/spec/v1\noid sha256:00\nsize 9\n",
                     "Git LFS pointer", "git lfs pull"),
    }
    for name, (content, what, how) in files.items():
        p = tmp_path / name
        if isinstance(content, bytes):
            p.write_bytes(content)
        assert main(["info", str(p)]) == 2, name
        err = capsys.readouterr().err
        assert what in err and how in err and "\n" not in err.strip(), (name, err)
    saved = tmp_path / "saved_model"
    saved.mkdir()
    (saved / "saved_model.pb").write_bytes(b"\x08\x01")
    assert main(["info", str(saved)]) == 2
    assert "TensorFlow SavedModel" in capsys.readouterr().err
    # the structure-only reader (the JupyterLab viewer) says the same
    from workbench.errors import ModelLoadError
    from workbench.graph.load import load
    with pytest.raises(ModelLoadError, match="TorchScript"):
        load(str(tmp_path / "script.pt"), weights=False)


def test_input_files_npy_npz_pb_and_what_else_is_said(tmp_path, capsys):
    from onnx import numpy_helper
    x = np.load(default_model_path().replace("default_model.onnx", "digits_sample.npz"))
    img = x["images"][:2]
    np.savez(tmp_path / "two.npz", image=img, other=img)
    (tmp_path / "x.pb").write_bytes(numpy_helper.from_array(img, "image").SerializeToString())
    for spec in (f"image={tmp_path / 'two.npz'}", f"image={tmp_path / 'two.npz'}:other",
                 f"image={tmp_path / 'x.pb'}"):
        assert main(["run", default_model_path(), "--input", spec, "--repeat", "1"]) == 0, spec
        assert "logits: float32 [2, 10]" in capsys.readouterr().out
    (tmp_path / "x.txt").write_text("0.1 0.2\n0.3 0.4\n")
    assert main(["run", default_model_path(), "--input", f"image={tmp_path / 'x.txt'}"]) == 2
    err = capsys.readouterr().err
    assert "is a text file" in err and ".npy" in err and ".npz" in err and ".pb" in err
    assert "allow_pickle" not in err
    np.savez(tmp_path / "many.npz", a=img, b=img)
    assert main(["run", default_model_path(), "--input", f"image={tmp_path / 'many.npz'}"]) == 2
    assert "holds the arrays ['a', 'b']" in capsys.readouterr().err


def test_demo_saves_its_model_and_digits_for_the_other_commands(tmp_path, capsys,
                                                                monkeypatch):
    """README's "Command line": the files `demo --save-model/--save-images` writes are what
    the other commands' examples read; an existing different file is kept unless --force."""
    monkeypatch.chdir(tmp_path)
    assert main(["demo", "--save-model", "model.onnx", "--save-images", "digits.npy"]) == 0
    with open(default_model_path(), "rb") as f:
        assert (tmp_path / "model.onnx").read_bytes() == f.read()
    digits = np.load(tmp_path / "digits.npy", allow_pickle=False)
    assert digits.shape == (32, 1, 8, 8) and digits.dtype == np.float32
    assert "wrote model.onnx" in capsys.readouterr().out
    assert main(["run", "model.onnx", "--input", "image=digits.npy"]) == 0
    # the same again: kept, said so
    assert main(["demo", "--save-model", "model.onnx"]) == 0
    assert "model.onnx: already there" in capsys.readouterr().out
    # a different file of the user's is not replaced...
    (tmp_path / "mine.onnx").write_bytes(b"the user's own model")
    assert main(["demo", "--save-model", "mine.onnx"]) == 2
    err = capsys.readouterr().err
    assert "mine.onnx exists" in err and "--force" in err
    assert (tmp_path / "mine.onnx").read_bytes() == b"the user's own model"
    # ...unless asked
    assert main(["demo", "--save-model", "mine.onnx", "--force"]) == 0
    assert (tmp_path / "mine.onnx").read_bytes() == (tmp_path / "model.onnx").read_bytes()
