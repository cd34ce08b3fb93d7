"""The Plan: lifetimes, hooks, cuts, determinism."""

from __future__ import annotations

import numpy as np
import pytest

from workbench.errors import InputError
from workbench.graph.executor import Plan, cut, layer_nodes, resolve_cut
from workbench.graph.load import load

from .models import conv_bn, mlp


def _ref_mlp(m, x):
    from onnx import numpy_helper
    w = {t.name: numpy_helper.to_array(t) for t in m.graph.initializer}
    return np.maximum(x @ w["w1"] + w["b1"], 0) @ w["w2"]


def test_runs_and_is_deterministic():
    m = mlp()
    plan = Plan(load(m).graph)
    x = np.random.default_rng(0).standard_normal((5, 4)).astype(np.float32)
    (y1,) = plan.run([x])
    (y2,) = plan.run({"x": x})
    np.testing.assert_allclose(y1, _ref_mlp(m, x), rtol=1e-5)
    assert np.array_equal(y1, y2)


def test_values_are_freed_after_last_use():
    plan = Plan(load(mlp()).graph)
    freed = {plan.nodes[i].name: [n for n, s in plan.slots.items() if s in step.free]
             for i, step in enumerate(plan.steps)}
    assert "h" in freed["bias1"]
    assert "hb" in freed["relu1"]
    # graph outputs are never freed
    assert all("y" not in v for v in freed.values())
    seen = []

    def hook(node, outs):
        seen.append((node.name, [o.shape for o in outs]))

    x = np.ones((2, 4), np.float32)
    plan.run([x], hook=hook)
    assert [s[0] for s in seen] == ["fc1", "bias1", "relu1", "ident", "fc2"]
    assert seen[0][1] == [(2, 8)]


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
