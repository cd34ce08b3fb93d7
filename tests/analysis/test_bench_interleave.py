"""benchmarks/bench_inference.py's one-process mode (``--interleave``): both engines run
alternately in blocks, paired ratios, the reference kernel; and the speed note."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper

pytest.importorskip("onnxruntime")

from benchmarks import bench_inference as bi  # noqa: E402


@pytest.fixture
def small_model(tmp_path):
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 8])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 4])
    w = helper.make_tensor("w", TensorProto.FLOAT, [8, 4],
                           np.arange(32, dtype=np.float32).tolist())
    g = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["t"]),
                           helper.make_node("Relu", ["t"], ["y"])], "g", [x], [y], [w])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    path = tmp_path / "m.onnx"
    path.write_bytes(m.SerializeToString())
    npz = tmp_path / "in.npz"
    np.savez(npz, np.linspace(-1, 1, 24, dtype=np.float32).reshape(3, 8))
    return str(path), str(npz)


def test_pair_worker_alternates_blocks_and_saves_both_outputs(small_model, tmp_path,
                                                              monkeypatch):
    monkeypatch.setitem(bi.MIN_SECONDS, "warmup", 0.0)
    monkeypatch.setitem(bi.MIN_SECONDS, "timed", 0.0)
    path, npz = small_model
    out = str(tmp_path / "pair")
    res = bi.pair_worker(path, npz, runs=4, warmup=1, threads=1, block=2, out_npz=out)
    assert res["engine"] == "pair"
    assert len(res["ours_ms"]) == len(res["ort_ms"]) == len(res["ratios"]) == 4
    assert len(res["ref_ms"]) == 4 and all(v > 0 for v in res["ref_ms"])
    assert res["ratios"] == [a / b for a, b in zip(res["ours_ms"], res["ort_ms"])]
    ours = bi._read_inputs(out + ".ours.npz")
    ort = bi._read_inputs(out + ".ort.npz")
    x = bi._read_inputs(npz)[0]
    want = np.maximum(x @ np.arange(32, dtype=np.float32).reshape(8, 4), 0)
    np.testing.assert_allclose(ours[0], want, rtol=1e-6)
    np.testing.assert_allclose(ort[0], want, rtol=1e-6)


def test_speed_note_only_when_the_reference_kernel_moved():
    row = bi.Row("m", 8, ref_ms=[1.30, 1.32, 1.35])
    bi._note_speed(row)
    assert row.notes == []
    row = bi.Row("m", 8, ref_ms=[1.30, 1.95])
    bi._note_speed(row)
    assert len(row.notes) == 1 and "1.50x" in row.notes[0] and "--interleave" in row.notes[0]
