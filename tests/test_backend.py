"""onnx.backend.test.BackendTest runs against workbench.backend (docs/architecture.md, "Backend
and conformance").

The node cases are covered by test_conformance.py (with its expected failures), so here the
standard runner is exercised on a representative subset, plus the API itself.
"""

from __future__ import annotations

import numpy as np
import onnx.backend.test
from onnx import TensorProto, helper

import workbench.backend as backend

pytest_plugins: list = []

_bt = onnx.backend.test.BackendTest(backend, __name__)
for _pattern in [r"test_relu_cpu", r"test_add_bcast_cpu", r"test_conv_with_strides_padding_cpu",
                 r"test_maxpool_2d_pads_cpu", r"test_gemm_default_no_bias_cpu",
                 r"test_softmax_axis_1_cpu", r"test_transpose_default_cpu",
                 r"test_slice_neg_steps_cpu", r"test_reduce_sum_keepdims_example_cpu",
                 r"test_concat_3d_axis_negative_1_cpu", r"test_if_cpu", r"test_loop11_cpu",
                 r"test_batchnorm_epsilon_cpu", r"test_gather_negative_indices_cpu"]:
    _bt.include(_pattern)
globals().update(_bt.enable_report().test_cases)


def test_supports_device():
    assert backend.supports_device("CPU")
    assert backend.supports_device("CUDA") in (True, False)


def test_run_node_and_run_model():
    node = helper.make_node("Add", ["a", "b"], ["c"])
    a = np.arange(6, dtype=np.float32).reshape(2, 3)
    (c,) = backend.run_node(node, [a, a])
    np.testing.assert_array_equal(c, a + a)
    vi = helper.make_tensor_value_info
    g = helper.make_graph([node], "g", [vi("a", TensorProto.FLOAT, [2, 3]),
                                        vi("b", TensorProto.FLOAT, [2, 3])],
                          [vi("c", TensorProto.FLOAT, [2, 3])])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    out = backend.run_model(m, {"a": a, "b": a})
    np.testing.assert_array_equal(out[0], 2 * a)
    assert out.c is out[0]
