"""onnxruntime's profiler mapped onto our nodes: parsing (synthetic events) and a real run,
where one onnxruntime kernel covers a Conv, its BatchNormalization and its Relu."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from workbench.analysis import Peaks, analyze
from workbench.analysis.ort_profile import map_kernels, parse_events
from workbench.graph.load import load

F = TensorProto.FLOAT


def _conv_bn_relu_pool():
    rng = np.random.default_rng(0)
    c = 16
    inits = {"w": rng.standard_normal((c, 8, 3, 3)).astype(np.float32),
             "g": rng.uniform(0.5, 1.5, c).astype(np.float32),
             "b": rng.standard_normal(c).astype(np.float32),
             "m": rng.standard_normal(c).astype(np.float32),
             "v": rng.uniform(0.5, 1.5, c).astype(np.float32)}
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1], name="/conv/Conv"),
             helper.make_node("BatchNormalization", ["c", "g", "b", "m", "v"], ["n"],
                              name="/bn/BatchNormalization"),
             helper.make_node("Relu", ["n"], ["r"], name="/relu/Relu"),
             helper.make_node("GlobalAveragePool", ["r"], ["p"], name="/pool/Pool"),
             helper.make_node("Flatten", ["p"], ["y"], name="/flat/Flatten")]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", F, ["N", 8, 32, 32])],
                          [helper.make_tensor_value_info("y", F, ["N", c])],
                          [numpy_helper.from_array(a, k) for k, a in inits.items()])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def _event(name, ts, dur, op="Conv"):
    return {"cat": "Node", "name": f"{name}_kernel_time", "ts": ts, "dur": dur,
            "args": {"op_name": op, "provider": "CPUExecutionProvider", "node_index": "0"}}


def test_parse_events_median_per_run_and_warmup_skipped():
    events = [{"cat": "Session", "name": "model_run", "ts": 0, "dur": 100},
              _event("a", 10, 90),                       # warm-up run: skipped
              {"cat": "Session", "name": "model_run", "ts": 200, "dur": 100},
              _event("a", 210, 10), _event("b", 230, 20, "Relu"),
              {"cat": "Session", "name": "model_run", "ts": 400, "dur": 100},
              _event("a", 410, 30), _event("b", 430, 20, "Relu"),
              {"cat": "Session", "name": "model_run", "ts": 600, "dur": 100},
              _event("a", 610, 20), _event("b", 630, 40, "Relu")]
    kernels, total = parse_events(events, skip_runs=1)
    assert [k.name for k in kernels] == ["a", "b"]
    assert kernels[0].time_ms == pytest.approx(0.020)        # median of 10, 30, 20 us
    assert kernels[1].time_ms == pytest.approx(0.020)
    assert kernels[0].provider == "CPU" and total == pytest.approx(0.1)


def test_mapping_by_derived_names_and_fused_away_values():
    """A kernel named after the value it produces (onnxruntime's ``<value>_nchwc``) covers
    the nodes whose values it fused away; a kernel with a new name and no known outputs
    (a layout reorder) covers none."""
    graph = load(_conv_bn_relu_pool()).graph
    from workbench.analysis import OrtKernel

    ks = [OrtKernel("reorder_in", "ReorderInput"), OrtKernel("r_nchwc", "Conv"),
          OrtKernel("/pool/Pool", "GlobalAveragePool"), OrtKernel("/flat/Flatten", "Flatten")]
    left = map_kernels(ks, graph, None)
    assert ks[0].covers == []
    assert ks[1].covers == ["/conv/Conv", "/bn/BatchNormalization", "/relu/Relu"]
    assert ks[2].covers == ["/pool/Pool"]
    assert left == []


def test_profile_ort_covers_conv_bn_relu_with_one_kernel():
    pytest.importorskip("onnxruntime")
    a = analyze(_conv_bn_relu_pool(), dims={"N": 2}).roofline(Peaks(50e9, 10e9))
    # "extended": the fusions every CPU gets (BatchNorm into Conv, Conv + Relu)
    a.profile_ort(runs=2, warmup=1, optimization="extended", threads=1)
    prof = a.ort
    assert prof.version and prof.optimized_model is not None
    conv = next(k for k in prof.kernels if "/conv/Conv" in k.covers)
    assert {"/bn/BatchNormalization", "/relu/Relu"} <= set(conv.covers), conv
    rows = {r["node"]: r for r in a.records}
    # the time sits on the node with the most FLOPs; the others name the kernel
    assert rows["/conv/Conv"]["time_ort_ms"] is not None
    assert rows["/bn/BatchNormalization"]["time_ort_ms"] is None
    assert rows["/relu/Relu"]["ort_kernel"] == conv.name
    assert rows["/conv/Conv"]["pct_of_roof"] > 0
    assert set(a.fused("ort")["/conv/Conv"]) == set(conv.covers)
    covered = {n for k in prof.kernels for n in k.covers}
    assert covered | set(prof.uncovered) == set(rows)
    # every level maps every node somewhere (on x86 "all" adds NCHWc layout kernels)
    b = analyze(_conv_bn_relu_pool(), dims={"N": 2})
    b.profile_ort(runs=1, warmup=1, optimization="all", threads=1)
    assert not [n for n in b.ort.uncovered if n != "/flat/Flatten"]
    table = b.ort.table()
    assert len(table) == len(b.ort.kernels)


def test_mapping_follows_a_fused_residual_add_and_activation():
    """onnxruntime's NCHWc Conv named after the BatchNorm output it started from, with a Sum
    input and activation=Relu, covers the residual Add and the Relu too (not the next
    kernel); a Gemm between inserted reshapes takes what the output reshape produced."""
    graph = load(_conv_bn_relu_pool()).graph
    # our graph: conv -> bn -> relu -> pool -> flatten; make relu an Add + Relu residual
    from workbench.analysis import OrtKernel
    from workbench.graph.ir import Node

    g = graph.copy()
    g.nodes[2] = Node("Add", ["n", "skip"], ["s"], name="/add/Add")
    g.nodes.insert(3, Node("Relu", ["s"], ["r"], name="/relu/Relu"))
    g.nodes.insert(0, Node("Identity", ["x"], ["skip"], name="/skip/Identity"))
    opt = helper.make_model(helper.make_graph(
        [helper.make_node("Identity", ["x"], ["skip"], name="/skip/Identity"),
         helper.make_node("Conv", ["x", "w", "b", "skip"], ["tok0"], domain="com.microsoft.nchwc",
                          name="n_nchwc", activation="Relu"),
         helper.make_node("GlobalAveragePool", ["tok0"], ["tok1"], domain="com.microsoft.nchwc",
                          name="p_nchwc"),
         helper.make_node("ReorderOutput", ["tok1"], ["p"], domain="com.microsoft.nchwc",
                          name="ReorderOutput"),
         helper.make_node("Reshape", ["p", "shape"], ["tok2"], name="gemm_input_reshape"),
         helper.make_node("Gemm", ["tok2", "w2"], ["tok3"], name="Gemm_fused"),
         helper.make_node("Reshape", ["tok3", "shape2"], ["y"], name="gemm_output_reshape")],
        "opt", [], []))
    ks = [OrtKernel(n.name, n.op_type) for n in opt.graph.node]
    g.nodes[-1] = Node("MatMul", ["p", "w2"], ["y"], name="/fc/MatMul")
    left = map_kernels(ks, g, opt)
    cov = {k.name: k.covers for k in ks}
    assert cov["n_nchwc"] == ["/conv/Conv", "/bn/BatchNormalization", "/add/Add", "/relu/Relu"]
    assert cov["p_nchwc"] == ["/pool/Pool"]
    assert cov["ReorderOutput"] == [] and cov["gemm_output_reshape"] == []
    assert cov["Gemm_fused"] == ["/fc/MatMul"]
    assert cov["/skip/Identity"] == ["/skip/Identity"]
    assert left == []
