"""workbench.quantization: the probe of onnxruntime's integer arithmetic and its classifier
(on fabricated results for both kinds of CPU, and on the engine's own two arithmetics), the
saturation report, and the explanations in the inspector and the command line - written so
that they hold on an x86 CPU with VNNI and on one without."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from workbench import backend, quantization
from workbench.errors import InputError
from workbench.graph.load import load
from workbench.quantization import (
    EXACT,
    SATURATING_U8S8,
    ArithmeticUnknownError,
    classify_arithmetic,
    explain_onnxruntime_difference,
    probe_model,
    saturation_report,
)

EXPECTED_EXACT = [[64781, -65272]]
EXPECTED_SAT = [[32778, -32760]]


# ---------------------------------------------------------------------------------- probe
def test_probe_expectations_are_computed_independently():
    exact, sat = quantization._probe_expectations()
    assert exact.tolist() == EXPECTED_EXACT and sat.tolist() == EXPECTED_SAT


def test_classifier_on_fabricated_results_of_both_kinds_of_cpu():
    vnni = np.array(EXPECTED_EXACT, np.int32)        # what a VNNI (or ARM) machine computes
    avx2 = np.array(EXPECTED_SAT, np.int32)          # what an AVX2-only machine computes
    assert classify_arithmetic(vnni, EXPECTED_EXACT, EXPECTED_SAT) is EXACT
    assert classify_arithmetic(avx2, EXPECTED_EXACT, EXPECTED_SAT) is SATURATING_U8S8
    with pytest.raises(ArithmeticUnknownError, match="neither the exact"):
        classify_arithmetic([[1, 2]], EXPECTED_EXACT, EXPECTED_SAT)
    with pytest.raises(ArithmeticUnknownError, match="shape"):
        classify_arithmetic([1, 2, 3], EXPECTED_EXACT, EXPECTED_SAT)
    with pytest.raises(ValueError, match="does not distinguish"):
        classify_arithmetic([[1]], [[1]], [[1]])


@pytest.mark.parametrize("mode", [EXACT, SATURATING_U8S8])
def test_classifier_recognises_the_engine_in_each_arithmetic(mode):
    """The engine in each arithmetic stands in for onnxruntime on each kind of CPU: the probe
    tells them apart."""
    y = backend.prepare(probe_model(), integer_arithmetic=mode).run(
        [quantization.PROBE_INPUT])[0]
    assert classify_arithmetic(y, *quantization._probe_expectations()) is mode


def test_onnxruntime_arithmetic_matches_the_engine_on_the_probe():
    ort = pytest.importorskip("onnxruntime")
    mode = quantization.onnxruntime_arithmetic()
    assert mode in (EXACT, SATURATING_U8S8)
    sess = ort.InferenceSession(probe_model().SerializeToString(),
                                providers=["CPUExecutionProvider"])
    ref = sess.run(None, {"a": quantization.PROBE_INPUT})[0]
    got = backend.prepare(probe_model(), integer_arithmetic=mode).run(
        [quantization.PROBE_INPUT])[0]
    np.testing.assert_array_equal(got, ref)


# ---------------------------------------------------------------------------------- report
def _mm_model(weights: np.ndarray, n_in: int = 4) -> bytes:
    """y = Cast(MatMulInteger(a uint8, weights)) to float, plus a float branch."""
    g = helper.make_graph(
        [helper.make_node("MatMulInteger", ["a", "w"], ["acc"], name="mm"),
         helper.make_node("Cast", ["acc"], ["y"], to=TensorProto.FLOAT, name="cast")],
        "g", [helper.make_tensor_value_info("a", TensorProto.UINT8, ["n", n_in])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", weights.shape[1]])],
        [numpy_helper.from_array(weights, "w")])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])


def test_report_counts_the_saturating_pairs():
    w = np.array([[127, 1], [127, 1], [1, 1], [1, 1]], np.int8)
    batch1 = {"a": np.array([[255, 255, 1, 1], [1, 1, 1, 1]], np.uint8)}
    batch2 = {"a": np.array([[200, 200, 9, 9]], np.uint8)}
    rep = saturation_report(_mm_model(w), [batch1, batch2], inputs_note="two batches")
    (node,) = rep.nodes
    assert (node.node, node.op_type) == ("mm", "MatMulInteger")
    # batch 1: 2 rows x 2 pairs x 2 columns, one pair beyond int16 (255*127*2 = 64770);
    # batch 2: 1 x 2 x 2, one pair (200*127*2 = 50800)
    assert (node.pairs, node.saturated, node.dots, node.dots_affected) == (12, 2, 6, 2)
    assert node.output_change == 64770 - 32767
    assert rep.output_change["y"] == 64770 - 32767
    assert rep.output_scale["y"] == 64770 + 2
    assert rep.batches == 2 and rep.saturating_nodes == [node]
    text = str(rep)
    assert "two batches" in text and "reduce_range=True" in text and "mm" in text


def test_report_without_saturation_and_without_integer_products():
    w = np.array([[3], [3], [3], [3]], np.int8)
    rep = saturation_report(_mm_model(w), {"a": np.full((2, 4), 255, np.uint8)})
    assert rep.nodes[0].pairs == 4 and rep.nodes[0].saturated == 0
    assert rep.output_change["y"] == 0 and "no pair sum saturates" in rep.table()
    relu = helper.make_model(helper.make_graph(
        [helper.make_node("Relu", ["x"], ["y"])], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])]))
    rep = saturation_report(relu, [np.zeros(2, np.float32)])
    assert rep.nodes == [] and "nothing can saturate" in rep.table()


def test_report_refuses_unusable_inputs():
    with pytest.raises(InputError, match="arrays given"):
        saturation_report(_mm_model(np.ones((4, 1), np.int8)), [np.ones((1, 4), np.uint8)] * 2)
    with pytest.raises(InputError, match="no calibration batch"):
        saturation_report(_mm_model(np.ones((4, 1), np.int8)), [])


# ---------------------------------------------------------------------------------- explain
def test_explanation_names_the_cause_only_when_saturation_reproduces_it():
    w = np.array([[127, -128], [127, -128], [1, 1], [1, 1]], np.int8)
    graph = load(_mm_model(w)).graph
    node = graph.nodes[0]
    a = np.array([[255, 255, 1, 1]], np.uint8)
    sat_ref = np.array([[32767 + 2, -32768 + 2]], np.int32)
    line = explain_onnxruntime_difference(graph, node, {"a": a}, sat_ref)
    assert "mm (MatMulInteger)" in line and "saturated to int16" in line
    assert "integer_arithmetic='saturating-u8s8'" in line and "reduce_range=True" in line
    assert "\n" not in line
    exact_ref = (a.astype(np.int64) @ w.astype(np.int64)).astype(np.int32)
    assert explain_onnxruntime_difference(graph, node, {"a": a}, exact_ref) is None
    assert explain_onnxruntime_difference(graph, node, {"a": a}, exact_ref + 5) is None
    assert explain_onnxruntime_difference(graph, graph.nodes[1], {"acc": exact_ref},
                                          exact_ref.astype(np.float32)) is None


# ------------------------------------------------------------------ where users meet it
def _saturating_model(tmp_path):
    """A model whose u8 x s8 products saturate for the inputs written beside it."""
    w = np.array([[127, -128, 5], [127, -128, 6], [3, 2, 1], [1, 1, 1]], np.int8)
    path = tmp_path / "sat.onnx"
    path.write_bytes(_mm_model(w).SerializeToString())
    a = np.array([[255, 254, 3, 1], [250, 251, 0, 1]], np.uint8)
    np.save(tmp_path / "a.npy", a)
    return path, a


def test_cli_run_compare_explains_or_agrees(tmp_path, capsys):
    pytest.importorskip("onnxruntime")
    from workbench.cli import main
    path, _ = _saturating_model(tmp_path)
    rc = main(["run", str(path), "--input", f"a={tmp_path / 'a.npy'}", "--compare",
               "onnxruntime", "--repeat", "1"])
    out = capsys.readouterr().out
    assert rc == 0
    if quantization.onnxruntime_arithmetic() is SATURATING_U8S8:   # x86 without VNNI
        assert "note: onnxruntime on this CPU" in out and "reduce_range=True" in out
    else:                                                           # VNNI, ARM: exact
        assert "note:" not in out and "normalised 0)" in out
    rc = main(["run", str(path), "--input", f"a={tmp_path / 'a.npy'}", "--compare",
               "onnxruntime", "--repeat", "1", "--integer-arithmetic",
               quantization.onnxruntime_arithmetic().value])
    out = capsys.readouterr().out
    assert rc == 0 and "normalised 0)" in out


def test_cli_info_saturation(tmp_path, capsys):
    from workbench.cli import main
    path, _ = _saturating_model(tmp_path)
    assert main(["info", str(path), "--saturation", "--input",
                 f"a={tmp_path / 'a.npy'}"]) == 0
    out = capsys.readouterr().out
    assert "the inputs given" in out and "MatMulInteger" in out and "saturate;" in out
    assert main(["info", str(path), "--saturation"]) == 0
    assert "random calibration inputs" in capsys.readouterr().out
    assert main(["info", str(path), "--input", f"a={tmp_path / 'a.npy'}"]) == 2
    assert "--saturation" in capsys.readouterr().err


def test_inspector_explains_or_agrees(tmp_path):
    pytest.importorskip("onnxruntime")
    from workbench.widgets.inspector import TensorInspector
    path, a = _saturating_model(tmp_path)
    insp = TensorInspector(str(path), {"a": a}, compare="onnxruntime")
    if quantization.onnxruntime_arithmetic() is SATURATING_U8S8:
        assert insp.first_diverging == "acc"
        (note,) = [r["note"] for r in insp.rows if r.get("note")]
        assert note.startswith("mm (MatMulInteger): onnxruntime on this CPU")
        assert note in repr(insp) and note in insp.table()
    else:
        assert insp.first_diverging == "" and insp.notes == []


def _qdq_model(tmp_path):
    """x -> QuantizeLinear(uint8) -> DequantizeLinear -> MatMul(DequantizeLinear(int8 W)):
    the QDQ form onnxruntime fuses into an integer operator."""
    w = np.array([[127, -128, 3], [127, -128, 2], [120, 100, 1], [127, 90, 0]], np.int8)
    one = numpy_helper.from_array(np.array(1.0 / 255, np.float32), "xs")
    nodes = [helper.make_node("QuantizeLinear", ["x", "xs", "xz"], ["xq"], name="q"),
             helper.make_node("DequantizeLinear", ["xq", "xs", "xz"], ["xd"], name="dq"),
             helper.make_node("DequantizeLinear", ["w", "ws"], ["wd"], name="dqw"),
             helper.make_node("MatMul", ["xd", "wd"], ["y"], name="mm")]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT,
                                                                     ["n", 4])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 3])],
                          [one, numpy_helper.from_array(np.array(0, np.uint8), "xz"),
                           numpy_helper.from_array(w, "w"),
                           numpy_helper.from_array(np.array(0.01, np.float32), "ws")])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])
    path = tmp_path / "qdq.onnx"
    path.write_bytes(m.SerializeToString())
    x = np.array([[1.0, 0.99, 0.98, 1.0], [0.2, 0.1, 0.0, 0.3]], np.float32)
    np.save(tmp_path / "x.npy", x)
    return path, x


def test_qdq_nodes_are_named_and_their_fused_form_reported(tmp_path):
    pytest.importorskip("onnxruntime")
    path, x = _qdq_model(tmp_path)
    rep = saturation_report(str(path), {"x": x})
    assert rep.qdq_nodes == ["mm"] and rep.nodes == []
    assert "onnxruntime_optimized_model" in rep.table()
    fused = quantization.onnxruntime_optimized_model(str(path))
    rep = saturation_report(fused, {"x": x})
    assert rep.nodes and rep.nodes[0].saturated > 0       # 255 * 127 * 2 per pair
    assert not rep.qdq_nodes


def test_cli_run_compare_on_a_qdq_model(tmp_path, capsys):
    pytest.importorskip("onnxruntime")
    from workbench.cli import main
    path, _ = _qdq_model(tmp_path)
    rc = main(["run", str(path), "--input", f"x={tmp_path / 'x.npy'}", "--compare",
               "onnxruntime", "--repeat", "1"])
    out = capsys.readouterr().out
    assert rc == 0
    if quantization.onnxruntime_arithmetic() is SATURATING_U8S8:
        assert "optimized form of this QDQ model" in out
    else:
        assert "note:" not in out
