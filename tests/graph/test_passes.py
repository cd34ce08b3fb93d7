"""Each inference pass leaves the outputs unchanged (and actually rewrites)."""

from __future__ import annotations

import numpy as np
import pytest

from workbench.graph import passes
from workbench.graph.load import load
from workbench.runtime import Plan

from .models import conv_bn, mlp, residual_block


def _run(graph, x):
    return Plan(graph).run([x])[0]


@pytest.mark.parametrize("name", ["remove_identities", "fold_constants", "fold_batchnorm",
                                  "fuse_conv_activation", "eliminate_dead_code", "optimize"])
@pytest.mark.parametrize("model", [mlp, conv_bn, residual_block])
def test_pass_preserves_outputs(name, model):
    g = load(model()).graph
    shape = {mlp: (2, 4), conv_bn: (2, 3, 5, 5), residual_block: (2, 4, 6, 6)}[model]
    x = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
    before = _run(g, x)
    g2 = getattr(passes, name)(g)
    np.testing.assert_allclose(_run(g2, x), before, rtol=1e-5, atol=1e-5)
    # the caller's graph is untouched
    np.testing.assert_allclose(_run(g, x), before, rtol=0, atol=0)


def test_passes_really_rewrite():
    g = load(conv_bn()).graph
    ops = [n.op_type for n in passes.optimize(g).nodes]
    assert "BatchNormalization" not in ops and "Dropout" not in ops
    assert "Constant" not in ops and ops == ["FusedConv", "Reshape"]  # Conv+BN+Relu
    g = load(mlp()).graph
    assert "Identity" not in [n.op_type for n in passes.remove_identities(g).nodes]


def test_constant_subgraph_folded():
    from onnx import helper, numpy_helper

    from .models import make_model, vi
    c = numpy_helper.from_array(np.array([1.0, 2.0], np.float32), "c")
    nodes = [helper.make_node("Mul", ["c", "c"], ["c2"], name="sq"),
             helper.make_node("Add", ["x", "c2"], ["y"], name="add")]
    g = load(make_model(nodes, [vi("x", [2])], [vi("y", [2])], [c])).graph
    g2 = passes.fold_constants(g)
    assert [n.name for n in g2.nodes] == ["add"]
    np.testing.assert_allclose(g2.initializers["c2"], [1, 4])


def test_dead_code_removed():
    from onnx import helper

    from .models import make_model, vi
    nodes = [helper.make_node("Relu", ["x"], ["unused"], name="dead"),
             helper.make_node("Neg", ["x"], ["y"], name="live")]
    g = load(make_model(nodes, [vi("x", [2])], [vi("y", [2])])).graph
    assert [n.name for n in passes.eliminate_dead_code(g).nodes] == ["live"]


@pytest.mark.parametrize("act", ["Relu", "LeakyRelu", "Sigmoid", "Tanh", "HardSigmoid"])
def test_conv_add_activation_fused(act):
    g = load(residual_block(act=act)).graph
    g2 = passes.fuse_conv_activation(g)
    by_name = {n.name: n for n in g2.nodes}
    assert by_name["c1"].op_type == "FusedConv" and by_name["c1"].attrs["activation"] == act
    assert by_name["c1"].outputs == ["a1"]
    c2 = by_name["c2"]                      # Conv -> Add(residual) -> act
    assert c2.op_type == "FusedConv" and c2.inputs[3] == "x" and c2.outputs == ["a2"]
    assert by_name["c3"].op_type == "Conv"  # its output is read twice: not fused
    c4 = by_name["c4"]                      # Clip with constant bounds
    assert c4.op_type == "FusedConv" and c4.attrs["activation"] == "Clip"
    assert c4.attrs["activation_params"] == [0.0, 0.5]
    assert not {"a1", "add", "a2", "clip"} & set(by_name)
    assert g2.opsets["com.workbench"] == 1
    x = np.random.default_rng(5).standard_normal((3, 4, 6, 6)).astype(np.float32)
    np.testing.assert_allclose(_run(g2, x), _run(g, x), rtol=1e-5, atol=1e-6)


def test_clip_with_dynamic_bounds_is_not_fused():
    from onnx import helper, numpy_helper

    from .models import make_model, vi
    w = numpy_helper.from_array(np.ones((2, 2, 1, 1), np.float32), "w")
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], name="conv"),
             helper.make_node("Clip", ["c", "lo"], ["y"], name="clip")]
    g = load(make_model(nodes, [vi("x", [1, 2, 3, 3]), vi("lo", [])],
                        [vi("y", [1, 2, 3, 3])], [w])).graph
    assert [n.op_type for n in passes.fuse_conv_activation(g).nodes] == ["Conv", "Clip"]
