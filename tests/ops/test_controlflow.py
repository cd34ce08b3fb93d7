"""Control-flow kernels (If, Loop, Scan) with Python callables as bodies, and through the
backend with real ONNX subgraphs."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from workbench.arrays import cupy_module
from workbench.errors import InputError, ShapeError
from workbench.ops.registry import NodeContext, attribute_defaults, lookup
from workbench.ops.sequence import NONE_OPTIONAL


def run(op, *inputs, opset=21, n_outputs=1, **attrs):
    entry = lookup(op, "", opset)
    kw = dict(attribute_defaults(op, "", opset))
    kw.update(attrs)
    if entry.wants_ctx:
        kw["ctx"] = NodeContext(node_name="n", op_type=op, opset=opset, n_outputs=n_outputs)
    return entry.fn(*inputs, **kw)


# ------------------------------------------------------------------------------------- If


def test_if_picks_branch_and_returns_one_value():
    a, b = np.array([1.0]), np.array([2.0])
    assert run("If", np.array(True), then_branch=lambda: [a], else_branch=lambda: [b]) is a
    assert run("If", np.array([False]), then_branch=lambda: [a], else_branch=lambda: [b]) is b


def test_if_several_outputs_and_sequences():
    then = lambda: [np.zeros(2), [np.ones(1), np.ones(2)]]  # noqa: E731
    out = run("If", np.array(True), n_outputs=2, then_branch=then, else_branch=then)
    assert isinstance(out, tuple) and len(out) == 2
    assert isinstance(out[1], list) and len(out[1]) == 2


def test_if_optional_output_passes_through():
    out = run("If", np.array(True), then_branch=lambda: [NONE_OPTIONAL],
              else_branch=lambda: [np.ones(1)])
    assert out is NONE_OPTIONAL


def test_if_cond_must_be_single_element():
    with pytest.raises(InputError, match="exactly one element"):
        run("If", np.array([True, False]), then_branch=lambda: [1], else_branch=lambda: [2])


# ----------------------------------------------------------------------------------- Loop


def test_loop_for_with_scan_output():
    seen = []

    def body(i, cond, y):
        seen.append((i.dtype, i.shape, cond.dtype))
        y = y + np.float32(i)
        return [cond, y, y * 2]

    y, scan = run("Loop", np.array(4, dtype=np.int64), None, np.zeros(2, np.float32),
                  n_outputs=2, body=body)
    np.testing.assert_array_equal(y, [6, 6])
    assert scan.shape == (4, 2)
    np.testing.assert_array_equal(scan[:, 0], [0, 2, 6, 12])
    assert seen[0] == (np.dtype(np.int64), (), np.dtype(bool))


def test_loop_while_stops_on_cond():
    def body(i, cond, x):
        x = x + 1
        return [np.array(x[0] < 5), x]

    out = run("Loop", None, np.array(True), np.array([0]), body=body)
    np.testing.assert_array_equal(out, [5])


def test_loop_trip_count_and_cond_both_limit():
    body = lambda i, c, x: [np.array(True), x + 1]  # noqa: E731
    assert run("Loop", np.array(3), np.array(True), np.array(0), body=body) == 3
    # cond false at entry: no iteration at all
    assert run("Loop", np.array(3), np.array(False), np.array(0), body=body) == 0


def test_loop_zero_iterations_gives_empty_scan_outputs():
    body = lambda i, c, x: [c, x, x]  # noqa: E731
    x, scan = run("Loop", np.array(0), None, np.ones(3), n_outputs=2, body=body)
    np.testing.assert_array_equal(x, np.ones(3))
    assert scan.shape[0] == 0


def test_loop_carries_sequences_and_optionals():
    def body(i, cond, seq, opt):
        return [cond, seq + [i], opt]

    seq, opt = run("Loop", np.array(3), None, [], NONE_OPTIONAL, n_outputs=2, body=body)
    assert [int(v) for v in seq] == [0, 1, 2]
    assert opt is NONE_OPTIONAL


def test_loop_scan_output_shape_change_is_reported():
    body = lambda i, c: [c, np.zeros(int(i) + 1)]  # noqa: E731
    with pytest.raises(ShapeError, match="changed shape"):
        run("Loop", np.array(3), None, body=body)


# ----------------------------------------------------------------------------------- Scan


def test_scan9_cumulative_sum_state_and_output():
    body = lambda s, x: [s + x, s + x]  # noqa: E731
    xs = np.arange(12, dtype=np.float32).reshape(4, 3)
    s, ys = run("Scan", np.zeros(3, np.float32), xs, n_outputs=2, num_scan_inputs=1, body=body)
    np.testing.assert_array_equal(s, xs.sum(0))
    np.testing.assert_array_equal(ys, np.cumsum(xs, 0))


def test_scan9_axes_and_directions():
    xs = np.arange(12, dtype=np.float32).reshape(3, 4)
    body = lambda s, x: [s + x, x * 10]  # noqa: E731
    s, ys = run("Scan", np.zeros(3, np.float32), xs, n_outputs=2, num_scan_inputs=1,
                body=body, scan_input_axes=[-1], scan_input_directions=[1],
                scan_output_axes=[1], scan_output_directions=[0])
    np.testing.assert_array_equal(s, xs.sum(1))
    # elements taken from the back (reverse input), stacked along output axis 1
    np.testing.assert_array_equal(ys, xs[:, ::-1] * 10)
    _, ys2 = run("Scan", np.zeros(3, np.float32), xs, n_outputs=2, num_scan_inputs=1,
                 body=body, scan_input_axes=[1], scan_output_directions=[1])
    # forward input, prepended output: reversed along output axis 0
    np.testing.assert_array_equal(ys2, (xs.T * 10)[::-1])


def test_scan9_two_inputs_must_share_length():
    body = lambda a, b: [a + b]  # noqa: E731
    with pytest.raises(ShapeError, match="different lengths"):
        run("Scan", np.zeros(3), np.zeros(4), n_outputs=1, num_scan_inputs=2, body=body)


def test_scan8_batch_and_sequence_lens():
    xs = np.arange(2 * 3 * 2, dtype=np.float32).reshape(2, 3, 2)  # batch 2, seq 3
    init = np.zeros((2, 2), np.float32)
    body = lambda s, x: [s + x, s + x]  # noqa: E731
    s, ys = run("Scan", np.array([3, 2], dtype=np.int64), init, xs, opset=8, n_outputs=2,
                num_scan_inputs=1, body=body)
    np.testing.assert_array_equal(s[0], xs[0].sum(0))
    np.testing.assert_array_equal(s[1], xs[1, :2].sum(0))
    assert ys.shape == (2, 3, 2)
    np.testing.assert_array_equal(ys[1, :2], np.cumsum(xs[1, :2], 0))
    np.testing.assert_array_equal(ys[1, 2], 0)  # padding


def test_scan8_reverse_direction_without_lens():
    xs = np.arange(6, dtype=np.float32).reshape(1, 3, 2)
    body = lambda s, x: [x, x]  # noqa: E731
    last, ys = run("Scan", None, np.zeros((1, 2), np.float32), xs, opset=8, n_outputs=2,
                   num_scan_inputs=1, body=body, directions=[1])
    np.testing.assert_array_equal(last[0], xs[0, 0])
    np.testing.assert_array_equal(ys[0], xs[0, ::-1])


# --------------------------------------------------------------- through the real backend


def _loop_model():
    # body: y_out = y_in + iter (as float), scan = y_out; cond passes through
    body = helper.make_graph(
        [helper.make_node("Identity", ["cond_in"], ["cond_out"]),
         helper.make_node("Cast", ["i"], ["fi"], to=TensorProto.FLOAT),
         helper.make_node("Add", ["y_in", "fi"], ["y_out"]),
         helper.make_node("Mul", ["y_out", "k"], ["scan"])],
        "body",
        [helper.make_tensor_value_info("i", TensorProto.INT64, []),
         helper.make_tensor_value_info("cond_in", TensorProto.BOOL, []),
         helper.make_tensor_value_info("y_in", TensorProto.FLOAT, [1])],
        [helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []),
         helper.make_tensor_value_info("y_out", TensorProto.FLOAT, [1]),
         helper.make_tensor_value_info("scan", TensorProto.FLOAT, [1])])
    node = helper.make_node("Loop", ["M", "", "y"], ["y_final", "scans"], body=body)
    graph = helper.make_graph(
        [node], "g",
        [helper.make_tensor_value_info("M", TensorProto.INT64, []),
         helper.make_tensor_value_info("y", TensorProto.FLOAT, [1]),
         helper.make_tensor_value_info("k", TensorProto.FLOAT, [1])],
        [helper.make_tensor_value_info("y_final", TensorProto.FLOAT, [1]),
         helper.make_tensor_value_info("scans", TensorProto.FLOAT, [None, 1])])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_loop_model_through_backend_reads_outer_scope():
    from workbench import backend

    model = _loop_model()
    onnx.checker.check_model(model)
    rep = backend.prepare(model)
    y, scans = rep.run([np.array(4, dtype=np.int64), np.array([1.0], np.float32),
                        np.array([10.0], np.float32)])
    np.testing.assert_allclose(y, [7.0])
    np.testing.assert_allclose(scans[:, 0], [10, 20, 40, 70])


# ----------------------------------------------------------------------------------- GPU

def _has_gpu() -> bool:
    cp = cupy_module()
    try:
        return cp is not None and cp.cuda.runtime.getDeviceCount() > 0
    except Exception:  # noqa: BLE001 - no driver or no device
        return False


requires_gpu = pytest.mark.skipif(not _has_gpu(), reason="needs cupy and a CUDA GPU")


@pytest.mark.gpu
@requires_gpu
def test_loop_and_scan_keep_cupy_arrays():
    cp = cupy_module()

    def body(i, cond, y):
        assert isinstance(i, cp.ndarray) and i.dtype == np.int64
        y = y + i.astype(np.float32)
        return [cond, y, y]

    y, scan = run("Loop", cp.asarray(np.array(3)), None, cp.zeros(2, np.float32), n_outputs=2,
                  body=body)
    assert isinstance(scan, cp.ndarray) and scan.shape == (3, 2)
    np.testing.assert_array_equal(cp.asnumpy(y), [3, 3])
    s, ys = run("Scan", cp.zeros(3, np.float32), cp.ones((4, 3), np.float32), n_outputs=2,
                num_scan_inputs=1, body=lambda s, x: [s + x, s + x])
    assert isinstance(ys, cp.ndarray)
    np.testing.assert_array_equal(cp.asnumpy(ys)[:, 0], [1, 2, 3, 4])
