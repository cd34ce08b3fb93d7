"""The table around the counts: DataFrame or records, group sums, CSV and Markdown export,
and ``workbench profile``."""

from __future__ import annotations

import csv
import io
import sys

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from workbench.analysis import COLUMNS, analyze
from workbench.cli import main
from workbench.errors import InputError, OverwriteError

F = TensorProto.FLOAT


def _scoped():
    """Two scopes, and a node name that would break a Markdown table."""
    w = np.ones((8, 8), np.float32)
    nodes = [helper.make_node("MatMul", ["x", "w"], ["h1"], name="/enc/l1/MatMul"),
             helper.make_node("Relu", ["h1"], ["r1"], name="/enc/l1/Relu"),
             helper.make_node("MatMul", ["r1", "w"], ["h2"], name="/dec/l2/MatMul"),
             helper.make_node("Sigmoid", ["h2"], ["y"], name="evil|name\nwith <i>html")]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", F, ["B", 8])],
                          [helper.make_tensor_value_info("y", F, ["B", 8])],
                          [numpy_helper.from_array(w, "w")])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def test_table_dataframe_or_records(monkeypatch):
    a = analyze(_scoped(), dims={"B": 4})
    pd = pytest.importorskip("pandas")
    df = a.table()
    assert isinstance(df, pd.DataFrame) and tuple(df.columns) == COLUMNS
    assert list(a.table(["node", "macs"]).columns) == ["node", "macs"]
    with pytest.raises(InputError, match="unknown column"):
        a.table(["nope"])
    monkeypatch.setitem(sys.modules, "pandas", None)      # as if pandas were not installed
    rows = a.table()
    assert isinstance(rows, list) and rows[0]["node"] == "/enc/l1/MatMul"


def test_groups_add_up_to_totals():
    a = analyze(_scoped(), dims={"B": 4})
    t = a.totals()
    assert t["macs"] == 2 * 4 * 8 * 8 and t["params"] == 64          # the shared w once
    g = a.groups()
    rows = g.to_dict("records") if hasattr(g, "to_dict") else g
    by = {r["group"]: r for r in rows}
    assert set(by) == {"enc", "dec", "(top)"}
    assert sum(r["flops"] for r in rows) == t["flops"]
    deep = a.groups(None)
    deep = deep.to_dict("records") if hasattr(deep, "to_dict") else deep
    assert {r["group"] for r in deep} == {"enc/l1", "dec/l2", "(top)"}


def test_csv_and_markdown(tmp_path):
    a = analyze(_scoped(), dims={"B": 4})
    p = tmp_path / "out.csv"
    a.to_csv(p)
    rows = list(csv.DictReader(io.StringIO(p.read_text())))
    assert len(rows) == 4 and rows[0]["macs"] == str(4 * 8 * 8)
    assert rows[0]["output_shape"] == "4x8"
    assert rows[3]["node"] == "evil|name\nwith <i>html"     # CSV quotes it, intact
    with pytest.raises(OverwriteError):
        a.to_csv(p)
    a.to_csv(p, overwrite=True)
    md = a.to_markdown(top=2, sort="flops")
    lines = md.splitlines()
    assert len(lines) == 4 and lines[0].startswith("| node | op |")
    full = a.to_markdown()
    assert "evil\\|name with <i>html" in full            # one row, the pipe escaped
    assert all(line.count(" | ") == lines[0].count(" | ") for line in full.splitlines()
               if line.startswith("| ") and "\\|" not in line)


def test_cli_profile(tmp_path, capsys):
    p = tmp_path / "m.onnx"
    onnx.save(_scoped(), p)
    out_csv = tmp_path / "t.csv"
    assert main(["profile", str(p), "--dim", "B=4", "--csv", str(out_csv), "--top", "3"]) == 0
    text = capsys.readouterr().out
    assert "MACs 512" in text and "parameters 64" in text
    assert "per group" in text and "| enc |" in text
    assert out_csv.exists()
    # an existing CSV is kept unless --force
    assert main(["profile", str(p), "--shape", "x=4,8", "--csv", str(out_csv)]) == 2
    assert "already exists" in capsys.readouterr().err
    assert main(["profile", str(p), "--shape", "4,8", "--csv", str(out_csv), "--force",
                 "--markdown"]) == 0
    assert "every node:" in capsys.readouterr().out
    # unbound dims: a clear error naming them
    assert main(["profile", str(p)]) == 2
    err = capsys.readouterr().err
    assert "'x' dim 0 ('B')" in err and "--dim" in err
    assert main(["profile", str(p), "--shape", "x=4,a"]) == 2
    assert "integers" in capsys.readouterr().err


def test_cli_profile_ours_and_memory(tmp_path, capsys):
    """``--ours``: our per-node times (and the roofline); ``--memory --train``: the timelines
    of inference and of a training step with a measured run beside each."""
    p = tmp_path / "m.onnx"
    onnx.save(_scoped(), p)
    assert main(["profile", str(p), "--dim", "B=4", "--ours", "--ours-runs", "2",
                 "--memory", "--train"]) == 0
    text = capsys.readouterr().out
    assert "ours: per-node times sum to" in text and "time_ours_ms" in text
    assert "memory over inference" in text and "memory over a training step" in text
    assert text.count("measured (tracemalloc") == 2
