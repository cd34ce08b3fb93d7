"""Cutting at ``last_layers`` (workbench/runtime/cut.py): the engine's counting, names, the cut
graph, countings given as functions or registered by name (SINGA's: workbench/singa/counting.py).
"""

from __future__ import annotations

import numpy as np
import pytest

from tests.graph.models import conv_bn, mlp
from workbench.errors import InputError
from workbench.graph.load import load
from workbench.runtime import (
    COUNTINGS,
    Plan,
    count_from_end,
    layer_nodes,
    register_counting,
    resolve_cut,
)
from workbench.runtime.cut import cut


def test_cut_by_int_and_name():
    g = load(mlp()).graph
    names = [n.name for n in layer_nodes(g)]
    assert names == ["fc1", "bias1", "relu1", "ident", "fc2"]
    assert resolve_cut(g, -1) == ["y"]
    assert resolve_cut(g, -2) == ["ri"]        # cut after the second-to-last node
    assert resolve_cut(g, -3) == ["r"]
    assert resolve_cut(g, "relu1") == ["r"]    # a node name
    assert resolve_cut(g, "hb") == ["hb"]      # a value name
    plan = Plan(g, outputs=resolve_cut(g, -3))
    assert [n.name for n in plan.nodes] == ["fc1", "bias1", "relu1"]
    (r,) = plan.run([np.ones((1, 4), np.float32)])
    assert r.shape == (1, 8) and (r >= 0).all()


def test_cut_graph_keeps_what_the_outputs_need():
    g = load(mlp()).graph
    c = cut(g, "relu1")
    assert [n.name for n in c.nodes] == ["fc1", "bias1", "relu1"]
    assert sorted(c.initializers) == ["b1", "w1"] and [v.name for v in c.outputs] == ["r"]
    assert [v.name for v in c.inputs] == ["x"] and c.name == f"{g.name}_cut"
    # nodes are copies; initializer values can come from elsewhere (trained weights)
    c.nodes[0].attrs["x"] = 1
    assert "x" not in g.nodes[0].attrs
    w1 = np.zeros((4, 8), np.float32)
    c2 = cut(g, -3, initializers={"w1": w1, "b1": g.initializers["b1"], "w2": None})
    assert c2.initializers["w1"] is w1 and "w2" not in c2.initializers
    (r,) = Plan(c2).run([np.ones((2, 4), np.float32)])
    np.testing.assert_allclose(r, np.maximum(np.broadcast_to(g.initializers["b1"], (2, 8)), 0))
    # the whole graph, cut at -1, computes the same outputs
    x = np.ones((2, 4), np.float32)
    np.testing.assert_array_equal(Plan(cut(g, -1)).run([x])[0], Plan(g).run([x])[0])


def test_cut_ignores_constant_nodes():
    g = load(conv_bn()).graph
    names = [n.name for n in layer_nodes(g)]
    assert "shape_const" not in names
    assert resolve_cut(g, -2) == ["d"]


@pytest.mark.parametrize("bad", [0, 1, 5, -99])
def test_cut_bad_ints(bad):
    g = load(mlp()).graph
    with pytest.raises(InputError, match="last_layers"):
        resolve_cut(g, bad)


def test_cut_unknown_name_suggests():
    g = load(mlp()).graph
    with pytest.raises(InputError, match="did you mean 'relu1'"):
        resolve_cut(g, "relu")


def test_a_counting_is_a_function_or_a_registered_name():
    g = load(mlp()).graph                      # layers: fc1 bias1 relu1 ident fc2

    def from_start(layers, k):                 # 0 is the first layer, None the whole graph
        return None if k >= len(layers) - 1 else layers[k]

    assert resolve_cut(g, 0, from_start) == ["h"]
    assert resolve_cut(g, [1, "relu1"], from_start) == ["hb", "r"]
    assert resolve_cut(g, 9, from_start) == ["y"]
    register_counting("test_from_start", from_start)
    try:
        assert "test_from_start" in COUNTINGS
        assert resolve_cut(g, 2, "test_from_start") == ["r"]
        register_counting("test_from_start", from_start)       # the same function again: fine
        with pytest.raises(ValueError, match="already registered"):
            register_counting("test_from_start", lambda layers, k: None)
        register_counting("test_from_start", count_from_end, replace=True)
        assert resolve_cut(g, -3, "test_from_start") == ["r"]
    finally:
        del COUNTINGS["test_from_start"]
    with pytest.raises(InputError, match=r"counting must be one of \('workbench'"):
        resolve_cut(g, -1, "test_from_start")


def test_singas_counting_lives_in_the_singa_package():
    from workbench.singa.counting import singa_counting
    assert COUNTINGS["singa"] is singa_counting
    g = load(mlp()).graph
    assert resolve_cut(g, -1, singa_counting) == ["h"]          # SINGA: -1 is the first node
    assert resolve_cut(g, -2, "singa") == ["y"]                 # and -2 the whole graph
    assert repr(COUNTINGS) == "('workbench', 'singa')"


def test_the_old_executor_module_re_exports_the_runtime():
    from workbench.graph import executor, toposort
    from workbench.runtime import cut as cut_module
    from workbench.runtime import plan as plan_module
    assert executor.Plan is plan_module.Plan and executor.Step is plan_module.Step
    assert executor.resolve_cut is cut_module.resolve_cut and executor.cut is cut_module.cut
    assert executor.COUNTINGS is cut_module.COUNTINGS
    assert executor.layer_nodes is cut_module.layer_nodes
    assert executor.topological_order is toposort.topological_order
    assert executor.needed_nodes is toposort.needed_nodes
