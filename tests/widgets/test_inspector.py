import json

import numpy as np
import pytest
import synth

from workbench.widgets import TensorInspector
from workbench.widgets.inspector import feature_maps, tensor_stats


def test_tensor_stats_match_numpy(rng):
    a = rng.standard_normal((4, 5, 6)).astype(np.float32)
    st = tensor_stats(a)
    assert st["shape"] == "[4, 5, 6]" and st["dtype"] == "float32"
    np.testing.assert_allclose([st["min"], st["max"], st["mean"], st["std"]],
                               [a.min(), a.max(), a.mean(dtype=np.float64),
                                a.std(dtype=np.float64)], rtol=1e-6)
    assert sum(st["hist"]["counts"]) == a.size and len(st["hist"]["edges"]) == 41
    b = a.copy()
    b[0, 0, :3] = [np.nan, np.inf, -np.inf]
    st = tensor_stats(b)
    assert (st["nan"], st["inf"]) == (1, 2)
    fin = b[np.isfinite(b)]
    np.testing.assert_allclose(st["mean"], fin.mean(dtype=np.float64), rtol=1e-6)
    json.dumps(st, allow_nan=False)                 # JSON-safe: no NaN/Inf leak out
    st = tensor_stats(np.full(3, np.nan, np.float32))
    assert st["min"] is None and st["nan"] == 3
    json.dumps(st, allow_nan=False)
    assert tensor_stats(np.array([1, 2, 3], np.int64))["mean"] == 2.0
    assert tensor_stats(np.array([True, False]))["max"] == 1.0
    assert tensor_stats(np.zeros((0, 3), np.float32))["min"] is None
    assert tensor_stats([np.ones(2)])["kind"] == "sequence"


def test_inspector_rows_vs_numpy_and_feature_maps(require_runnable, rng, record):
    m = synth.cnn()
    require_runnable(m)
    x = rng.standard_normal((2, 1, 8, 8)).astype(np.float32)
    insp = TensorInspector(m, {"x": x})
    assert [r["node"] for r in insp.rows] == ["conv1", "relu1", "pool1", "flatten", "fc"]
    assert all(r["status"] == "ok" for r in insp.rows)
    relu = insp.array("relu1")
    r = insp.row("relu1")
    assert r["shape"] == "[2, 4, 8, 8]"
    np.testing.assert_allclose([r["min"], r["max"], r["mean"], r["std"]],
                               [relu.min(), relu.max(), relu.mean(dtype=np.float64),
                                relu.std(dtype=np.float64)], rtol=1e-6)
    assert relu.min() >= 0
    rec = record(insp)
    insp.set_state({"selected": "relu1"})           # clicking a row
    assert insp.hist["value"] == "r1" and sum(insp.hist["counts"]) == relu.size
    info = insp.fmap_info
    assert info["shape"] == [4, 8, 8] and info["dtype"] == "float32"
    maps = np.frombuffer(insp.fmaps, dtype=info["dtype"]).reshape(info["shape"])
    np.testing.assert_array_equal(maps, relu[0])
    # feature maps travel as a binary buffer, not as JSON numbers
    fm = [(d, b) for d, b in rec.messages if "fmaps" in d["state"] or ["fmaps"] in
          d.get("buffer_paths", [])]
    assert fm and fm[0][1] and len(fm[0][1][0]) == relu[0].nbytes
    assert "text/plain" in insp._repr_mimebundle_()
    assert "5/5 values inspected" in repr(insp)
    print("\n" + insp.table(sort="std"))


def test_compare_with_onnxruntime(require_runnable, rng):
    pytest.importorskip("onnxruntime")
    m = synth.cnn()
    require_runnable(m)
    x = rng.standard_normal((2, 1, 8, 8)).astype(np.float32)
    insp = TensorInspector(m, [x], compare="onnxruntime")
    assert insp.compare_info["values"] == 5
    assert all(r["diff"] is not None and r["diff"] < 1e-4 for r in insp.rows)
    assert insp.first_diverging == ""
    # a strict tolerance makes some values diverge: the first one is named
    insp = TensorInspector(m, [x], compare="onnxruntime", rtol=0, atol=0)
    if insp.first_diverging:
        assert insp.row(insp.first_diverging)["diff_ok"] is False


def test_unsupported_ops_are_listed_and_the_rest_runs(rng):
    from workbench.ops.registry import registered_ops
    if not {("", "Relu"), ("", "Sigmoid")} <= set(registered_ops()):
        pytest.skip("Relu/Sigmoid kernels not there yet")
    x = rng.standard_normal((2, 3)).astype(np.float32)
    insp = TensorInspector(synth.custom_op_model(), [x])
    assert [u["node"] for u in insp.unsupported] == ["mystery"]
    assert "Mystery" in insp.unsupported[0]["reason"]
    status = {r["node"]: r["status"] for r in insp.rows}
    assert status == {"relu_a": "ok", "mystery": "unsupported", "relu_y": "not run",
                      "sig_z": "ok"}
    np.testing.assert_allclose(insp.row("sig_z")["max"], (1 / (1 + np.exp(-x))).max(),
                               rtol=1e-6)
    assert "cannot run (Mystery): mystery" in repr(insp)


def test_huge_tensor_stats_stay_in_python(require_runnable, rng):
    from onnx import TensorProto, helper
    g = helper.make_graph([helper.make_node("Relu", ["x"], ["y"], name="relu")], "big",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT,
                                                         [1, 64, 512, 512])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT,
                                                         [1, 64, 512, 512])])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    require_runnable(m)
    x = rng.standard_normal((1, 64, 512, 512), dtype=np.float32)     # 64 MiB
    insp = TensorInspector(m, [x], keep_bytes=1 << 20)
    assert insp.kept == []                          # over the budget: not kept
    assert insp.row("relu")["max"] == pytest.approx(float(x.max()))
    insp.selected = "relu"                          # recomputed on demand, downsampled
    assert insp.fmap_info["shape"] == [32, 40, 40] or insp.fmap_info["shape"][0] == 32
    assert len(insp.fmaps) < 300_000
    assert len(json.dumps(insp.rows)) < 2_000
    assert len(json.dumps(insp.hist)) < 3_000


def test_feature_maps_keep_dtype():
    a = np.arange(2 * 3 * 100 * 90, dtype=np.float16).reshape(2, 3, 100, 90)
    maps, info = feature_maps(a)
    assert maps.dtype == np.float16 and info["dtype"] == "float16"
    assert maps.shape[0] == 3 and max(maps.shape[1:]) <= 40
    assert feature_maps(np.zeros((2, 3)))[0] is None


def test_bad_inputs_give_a_message_not_a_crash(rng):
    insp = TensorInspector(synth.mlp(), [rng.standard_normal((3, 5)).astype(np.float32)])
    assert insp.error or insp.unsupported
    assert all(r["status"] != "ok" for r in insp.rows)


def test_graph_without_nodes():
    from onnx import TensorProto, helper
    g = helper.make_graph([], "passthrough",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])],
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])])
    insp = TensorInspector(helper.make_model(g), [np.ones(1, np.float32)])
    assert insp.rows == [] and not insp.error
    assert "0/0 values" in repr(insp)
