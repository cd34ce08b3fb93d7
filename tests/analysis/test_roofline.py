"""The roofline: classification on synthetic peaks, the cached measurement (never timed),
% of roof from given times, and the plot."""

from __future__ import annotations

import json

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from workbench.analysis import Peaks, analyze, measure_peaks, place
from workbench.analysis import roofline as rl
from workbench.errors import InputError

PEAKS = Peaks(100e9, 10e9)          # ridge at 10 FLOP/B


def test_place_memory_and_compute_bound():
    assert PEAKS.ridge == 10
    mem = place(1e6, 1e6, PEAKS)                 # 1 FLOP/B: under the slope
    assert mem.bound == "memory"
    assert mem.roof_flops_per_s == pytest.approx(10e9)
    assert mem.time_s == pytest.approx(1e6 / 10e9)
    comp = place(1e9, 1e6, PEAKS)                # 1000 FLOP/B: under the flat roof
    assert comp.bound == "compute"
    assert comp.roof_flops_per_s == pytest.approx(100e9)
    assert comp.time_s == pytest.approx(1e9 / 100e9)
    ridge = place(10e6, 1e6, PEAKS)
    assert ridge.bound == "compute" and ridge.roof_flops_per_s == pytest.approx(100e9)
    copy = place(0, 4e6, PEAKS)                  # a Transpose: all memory
    assert copy.bound == "memory" and copy.time_s == pytest.approx(4e-4)
    assert place(0, 0, PEAKS).bound is None
    with pytest.raises(InputError):
        Peaks(0, 1)


def _gemm_and_add():
    w = np.zeros((256, 256), np.float32)
    nodes = [helper.make_node("MatMul", ["x", "w"], ["h"], name="mm"),
             helper.make_node("Add", ["h", "h"], ["y"], name="add")]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT,
                                                                     [256, 256])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                          [numpy_helper.from_array(w, "w")])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def test_nodes_placed_and_pct_of_roof_from_times():
    a = analyze(_gemm_and_add(), {}).roofline(PEAKS)
    rows = {r["node"]: r for r in a.records}
    assert rows["mm"]["bound"] == "compute"      # 2*256^3 FLOPs over 768 KiB: ~43 FLOP/B
    assert rows["add"]["bound"] == "memory"      # 1 FLOP per 8 bytes
    mm_roof = rows["mm"]["roof_time_ms"]
    assert mm_roof == pytest.approx(2 * 256 ** 3 / 100e9 * 1e3)
    a.set_times({"mm": mm_roof * 4, "add": rows["add"]["roof_time_ms"] * 2})
    assert rows["mm"]["pct_of_roof"] == pytest.approx(25.0)
    assert rows["add"]["pct_of_roof"] == pytest.approx(50.0)
    assert [r["node"] for r in a.slowest(2)] == ["mm", "add"]
    with pytest.raises(InputError, match="no node named"):
        a.set_times({"nope": 1.0})
    assert "roofline:" in a.summary()


def test_measure_peaks_cached_per_cpu(tmp_path, monkeypatch):
    """Tiny sizes and budget: the measurement runs, is cached, is read back and redone on
    request. Only that the numbers are positive is checked, never how fast."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.setattr(rl, "GEMM_SIZES", (64, 128))
    monkeypatch.setattr(rl, "COPY_BYTES", 4 * 1024 * 1024)
    p = measure_peaks(budget_s=0.3)
    assert p.source == "measured" and p.flops_per_s > 0 and p.bytes_per_s > 0
    path = tmp_path / "onnx-workbench" / "peaks.json"
    stored = json.loads(path.read_text())
    cpu, flags = rl.cpu_identity()
    key = next(iter(stored))
    assert cpu in key and flags in key
    again = measure_peaks(budget_s=0.3)
    assert again.source == "cache" and again.flops_per_s == p.flops_per_s
    assert measure_peaks(budget_s=0.3, recalibrate=True).source == "measured"
    path.write_text("{not json")                  # a damaged cache is measured over
    assert measure_peaks(budget_s=0.3).source == "measured"
    # measured on the threads our timed runs use (the engine's workers, BLAS on one thread
    # in each) and saying so; another thread count is another entry
    from workbench.ops.parallel import n_workers

    assert p.threads == n_workers() and "x 1 BLAS thread" in key
    assert "as the engine's timed runs" in measure_peaks(budget_s=0.3).describe()
    one = measure_peaks(budget_s=0.3, threads=1)
    assert one.threads == 1 and one.source == "measured"
    assert measure_peaks(budget_s=0.3, threads=1).source == "cache"
    assert len(json.loads(path.read_text())) == (1 if n_workers() == 1 else 2)


def test_plot_roofline_draws_points_per_op():
    mpl = pytest.importorskip("matplotlib")
    mpl.use("Agg")
    from workbench.analysis import plot_roofline

    a = analyze(_gemm_and_add(), {})
    ax = plot_roofline(a, peaks=PEAKS)
    labels = [t.get_text() for t in ax.get_legend().get_texts()]
    assert "MatMul" in labels and "Add" in labels
    assert ax.get_xscale() == "log" and ax.get_yscale() == "log"
    assert "attainable" in ax.get_ylabel()
    a.set_times({"mm": 1.0, "add": 1.0})
    ax = plot_roofline(a, peaks=PEAKS)
    assert "measured" in ax.get_ylabel()
    import matplotlib.pyplot as plt

    plt.close("all")


def test_measured_columns_slot_in():
    """Phase 2's columns (our per-node times, live memory) join through set_values."""
    a = analyze(_gemm_and_add(), {}).roofline(PEAKS)
    a.set_values("live_bytes_after", {"mm": 1024, "add": 512})
    a.set_values("time_ours_ms", {"mm": 1.0})
    rows = {r["node"]: r for r in a.records}
    assert rows["mm"]["live_bytes_after"] == 1024 and rows["add"]["time_ours_ms"] is None
    assert rows["mm"]["pct_of_roof"] == pytest.approx(100 * rows["mm"]["roof_time_ms"] / 1.0)
    with pytest.raises(InputError, match="not a measured column"):
        a.set_values("flops", {"mm": 1})
