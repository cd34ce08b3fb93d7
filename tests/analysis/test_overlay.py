"""The analysis as a graph overlay (workbench/analysis/overlay.py): one metric per column that
has numbers, how a group totals it, the summary panel. The drawing itself is checked in
Chromium (tests/browser/test_analysis_overlay.py)."""

from __future__ import annotations

import json

import pytest

from tests.analysis.test_memory import residual_cnn
from workbench.analysis import Peaks, analyze
from workbench.analysis.overlay import METRICS, overlay_payload


@pytest.fixture(scope="module")
def full():
    a = analyze(residual_cnn(n=2, c=8, hw=16))
    a.roofline(Peaks(40e9, 8e9))
    a.profile_ours(runs=2, warmup=1)
    a.memory()
    return a


def _metric(ov, key):
    return next(m for m in ov["metrics"] if m["key"] == key)


def test_static_analysis_has_the_counts_only():
    a = analyze(residual_cnn(n=1, c=4, hw=8))
    ov = overlay_payload(a)
    assert [m["key"] for m in ov["metrics"]] == ["flops", "params", "activation_bytes",
                                                 "intensity"]
    assert ov["metric"] == "flops" and ov["title"] == "FLOPs"
    assert ov["values"] == _metric(ov, "flops")["values"]
    assert sum(ov["values"].values()) == a.totals()["flops"]
    with pytest.raises(ValueError, match=r"run profile_ours\(\) first"):
        overlay_payload(a, "time_ours_ms")
    with pytest.raises(ValueError, match="unknown"):
        overlay_payload(a, "speed")


def test_every_metric_after_measuring(full):
    ov = full.overlay()
    keys = [m["key"] for m in ov["metrics"]]
    assert keys == ["flops", "params", "activation_bytes", "live_bytes_after", "time_ours_ms",
                    "pct_of_roof", "bound", "intensity"]
    assert ov["metric"] == "time_ours_ms"               # the measured time first
    assert {m[0] for m in METRICS} >= set(keys)
    pct = _metric(ov, "pct_of_roof")
    assert pct["kind"] == "ratio" and pct["reverse"] and pct["times"] == 100.0
    rows = {r["node"]: r for r in full.records}
    for k, v in pct["values"].items():
        assert v == pytest.approx(100 * pct["num"][k] / pct["den"][k])
        assert v == pytest.approx(rows[k]["pct_of_roof"])
    bound = _metric(ov, "bound")
    assert bound["ridge"] == pytest.approx(full.peaks.ridge)
    assert bound["categories"] == {r["node"]: r["bound"] for r in full.records
                                   if r["bound"] and not r["static"]}
    live = _metric(ov, "live_bytes_after")
    assert live["kind"] == "max"
    summary = dict(map(tuple, ov["summary"]))
    assert "peak memory" in summary and "a plain run" in summary["time, ours"]
    assert "roofline" in summary and "MACs / FLOPs" in summary
    json.dumps(ov)                                       # JSON-ready


def test_group_rules_are_declared(full):
    ov = full.overlay("flops")
    for m in ov["metrics"]:
        assert m["group_rule"] and m["kind"] in ("sum", "max", "ratio", "category")
    # the graph view's groups are the analysis' scopes: its sums per group are these
    g = full.groups(depth=1)
    flops = _metric(ov, "flops")["values"]
    for _, row in g.iterrows():
        members = [r["node"] for r in full.records if not r["static"]
                   and (r["group"].split("/")[0] if r["group"] else "(top)") == row["group"]]
        assert sum(flops.get(n, 0) for n in members) == row["flops"]
