import json

import numpy as np
import onnx
import pytest
import synth
from onnx import TensorProto, helper

from workbench.graph.load import load
from workbench.widgets import GraphView


def test_accepts_proto_path_loaded_and_objects(tmp_path):
    m = synth.mlp()
    p = tmp_path / "mlp.onnx"
    onnx.save(m, p)
    lm = load(m)

    class HasGraph:  # like workbench.model.Model: anything with .graph / .proto
        graph = lm.graph
        proto = lm.proto

    for src in (m, str(p), p, lm, lm.graph, HasGraph(), m.SerializeToString()):
        gv = GraphView(src)
        assert gv.graph_data["name"][:2] == ["x", "fc1"]
        assert gv.graph_data["op"].count("MatMul") == 2
        assert "WB_DAGRE_SRC" in gv._esm and "wbRenderGraphView" in gv._esm
    assert GraphView(str(p)).title == "mlp.onnx"
    with pytest.raises(TypeError):
        GraphView(42)


def test_drawing_json_is_compact_and_has_colours_shapes_and_legend():
    gv = GraphView(synth.mlp())
    d = gv.graph_data
    s = json.dumps(d)
    assert len(s) < 4000
    assert set(d["colors"]) >= {"MatMul", "Add", "Relu", "Softmax", "Input", "Output"}
    assert d["op_counts"] == {"MatMul": 2, "Add": 2, "Relu": 1, "Softmax": 1}
    assert d["host"] == [-1] * 8 and d["folded"] == 0      # nothing to fold in an MLP
    edges = [tuple(d["edges"][k:k + 3]) for k in range(0, len(d["edges"]), 3)]
    assert (0, 1, d["labels"].index("float32 [N, 8]")) in edges     # x -> fc1, with its shape
    assert d["groups"]["label"] == ["graph"] and set(d["group"]) == {0}


def test_selected_is_observable_and_fills_details():
    gv = GraphView(synth.mlp())
    seen = []
    gv.observe(lambda ch: seen.append(ch["new"]), names="selected")
    gv.set_state({"selected": "fc1"})        # what a click in the browser does
    assert seen == ["fc1"]
    det = gv.details
    assert det["op"] == "MatMul"
    assert det["inputs"][1] == {"name": "W1", "shape": "[8, 16]", "dtype": "float32",
                                "param": True, "count": 128}
    assert det["outputs"][0]["shape"] == "[N, 16]"
    assert det["params"] == 128
    gv.selected = "softmax"
    assert gv.details["attrs"] == {"axis": "-1"}
    gv.selected = "x"                         # a graph input
    assert gv.details["op"] == "Input"
    gv.selected = ""
    assert gv.details == {}
    with pytest.raises(KeyError):
        gv.select("nope")


def test_messages_to_the_front_end(record):
    gv = GraphView(synth.mlp())
    rec = record(gv)
    gv.set_state({"selected": "relu1"})
    sent = {k for data, _ in rec.messages for k in data["state"]}
    assert "details" in sent                  # details go back to the browser
    rec.messages.clear()
    gv.search("add")
    (data, buffers), = rec.messages
    assert data["state"]["highlight"] == ["fc1_bias", "fc2_bias"]


def test_text_fallbacks():
    gv = GraphView(synth.mlp())
    r = repr(gv)
    assert r.startswith("GraphView('mlp': 6 nodes") and "MatMul×2" in r
    assert gv._repr_mimebundle_() == {"text/plain": r}


def test_no_nodes_and_unsupported_ops_still_draw():
    g = helper.make_graph([], "empty", [], [])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    gv = GraphView(m)
    assert gv.graph_data["name"] == [] and "0 nodes" in repr(gv)
    # identity graph: output is the input
    g = helper.make_graph([], "passthrough",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])],
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])])
    gv = GraphView(helper.make_model(g))
    assert gv.graph_data["op"] == ["Input", "Output"] and gv.graph_data["edges"][:2] == [0, 1]
    gv = GraphView(synth.custom_op_model())
    assert "Mystery" in gv.graph_data["op"]


def test_2500_node_graph_view():
    import time
    m = synth.transformer_like(blocks=100)
    t0 = time.perf_counter()
    gv = GraphView(m)
    dt = time.perf_counter() - t0
    size = len(json.dumps(gv.graph_data))
    print(f"\nGraphView of {len(gv.graph.nodes)} nodes: {dt:.2f} s (drawing data "
          f"{gv.payload_seconds:.2f} s), {size / 1e3:.0f} kB of JSON")
    assert size < 2_000_000


def test_profile_colours_nodes_by_time_and_memory(require_runnable, rng):
    """profile() is the analysis: our kernel times (the fused Conv+Relu step's time on the
    Conv), the live bytes after each step, every metric in the overlay."""
    m = synth.cnn()
    require_runnable(m)
    gv = GraphView(m)
    x = rng.standard_normal((2, 1, 8, 8)).astype(np.float32)
    prof = gv.profile([x], repeat=2)
    assert set(prof) == {"conv1", "relu1", "pool1", "flatten", "fc"}
    assert prof["conv1"]["ms"] > 0 and prof["fc"]["ms"] > 0
    assert prof["relu1"]["ms"] is None            # run inside the conv's fused step
    # the caller's input (2x1x8x8 float32) and the conv's output (2x4x8x8) are live after it
    assert prof["conv1"]["bytes"] == 2 * 8 * 8 * 4 + 2 * 4 * 8 * 8 * 4
    assert gv.overlay["metric"] == gv.overlay_metric == "time_ours_ms"
    assert gv.overlay["unit"] == "ms" and set(gv.overlay["values"]) == \
        {k for k, p in prof.items() if p["ms"] is not None}
    keys = {m["key"] for m in gv.overlay["metrics"]}
    assert {"flops", "params", "activation_bytes", "live_bytes_after", "time_ours_ms",
            "pct_of_roof", "bound"} <= keys
    gv.show_profile("memory")
    assert gv.overlay_metric == "live_bytes_after"
    assert gv.overlay["values"]["conv1"] == prof["conv1"]["bytes"]
    gv.show_profile("flops")
    assert gv.overlay["values"]["conv1"] == 2 * (2 * 4 * 8 * 8 * 9) + 2 * 4 * 8 * 8
    with pytest.raises(ValueError):
        gv.show_profile("speed")
    with pytest.raises(RuntimeError):
        GraphView(m).show_profile()


def test_show_differences_rings_the_nodes_that_differ():
    class FakeInspector:          # the rows a TensorInspector(compare=...) holds
        rows = [{"node": "fc1", "value": "h1", "diff": 0.0, "diff_ok": True},
                {"node": "relu1", "value": "h3", "diff": 0.5, "diff_ok": False},
                {"node": "fc2", "value": "h4", "diff": 0.7, "diff_ok": False}]
    gv = GraphView(synth.mlp())
    assert gv.show_differences(FakeInspector()) == ["relu1", "fc2"]
    assert gv.overlay["values"] == {"fc1": 0.0, "relu1": 0.5, "fc2": 0.7}

    class NoCompare:
        rows = [{"node": "fc1", "value": "h1"}]
    with pytest.raises(ValueError, match="compare="):
        gv.show_differences(NoCompare())


def test_show_differences_from_a_real_comparison(require_runnable, rng):
    pytest.importorskip("onnxruntime")
    from workbench.widgets import TensorInspector
    m = synth.cnn()
    require_runnable(m)
    x = rng.standard_normal((2, 1, 8, 8)).astype(np.float32)
    insp = TensorInspector(m, [x], compare="onnxruntime")
    gv = GraphView(m)
    assert gv.show_differences(insp) == []              # our kernels agree with onnxruntime
    assert set(gv.overlay["values"]) == {"conv1", "relu1", "pool1", "flatten", "fc"}
    assert max(gv.overlay["values"].values()) < 1e-4
