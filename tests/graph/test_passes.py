"""Each inference pass leaves the outputs unchanged (and actually rewrites)."""

from __future__ import annotations

import numpy as np
import pytest

from workbench.graph import passes
from workbench.graph.executor import Plan
from workbench.graph.load import load

from .models import conv_bn, mlp


def _run(graph, x):
    return Plan(graph).run([x])[0]


@pytest.mark.parametrize("name", ["remove_identities", "fold_constants", "fold_batchnorm",
                                  "eliminate_dead_code", "optimize"])
@pytest.mark.parametrize("model", [mlp, conv_bn])
def test_pass_preserves_outputs(name, model):
    g = load(model()).graph
    x = np.random.default_rng(0).standard_normal(
        (2, 4) if model is mlp else (2, 3, 5, 5)).astype(np.float32)
    before = _run(g, x)
    g2 = getattr(passes, name)(g)
    np.testing.assert_allclose(_run(g2, x), before, rtol=1e-5, atol=1e-5)
    # the caller's graph is untouched
    np.testing.assert_allclose(_run(g, x), before, rtol=0, atol=0)


def test_passes_really_rewrite():
    g = load(conv_bn()).graph
    ops = [n.op_type for n in passes.optimize(g).nodes]
    assert "BatchNormalization" not in ops and "Dropout" not in ops
    assert "Constant" not in ops and ops.count("Conv") == 1
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
