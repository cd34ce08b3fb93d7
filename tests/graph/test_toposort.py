"""The one topological sort (workbench/graph/toposort.py) and the graph queries on it."""

from __future__ import annotations

import pytest
from onnx import helper

from tests.graph.models import make_model, mlp, vi
from workbench.errors import ModelLoadError
from workbench.graph.ir import Graph, Node, ValueInfo
from workbench.graph.load import load
from workbench.graph.toposort import needed_nodes, stable_order, topological_order


def test_stable_order_keeps_a_valid_order_and_moves_only_what_must():
    assert stable_order([[], ["a"], ["b"]], [["a"], ["b"], ["c"]]) == ([0, 1, 2], [])
    # node 0 reads what node 2 writes: it moves behind it, the others keep their order
    assert stable_order([["c"], [], []], [["a"], ["b"], ["c"]]) == ([1, 2, 0], [])
    # names nobody writes are available from the start; a node reading its own output waits
    # for nobody
    assert stable_order([["x", "a"], ["a"]], [["a"], ["y"]]) == ([0, 1], [])


def test_stable_order_reports_or_breaks_cycles():
    reads, writes = [["b"], ["a"], []], [["a"], ["b"], ["c"]]
    assert stable_order(reads, writes) == ([2], [0, 1])
    assert stable_order(reads, writes, break_cycles=True) == ([2, 0, 1], [])


def test_a_name_written_twice_waits_for_both_writers():
    assert stable_order([["y"], [], []], [["z"], ["y"], ["y"]]) == ([1, 2, 0], [])


def _graph(nodes, inputs=("x",), outputs=("y",)):
    return Graph("g", nodes, [ValueInfo(i) for i in inputs], [ValueInfo(o) for o in outputs],
                 {}, {}, {"": 17})


def test_topological_order_of_a_graph_and_its_errors():
    g = load(mlp()).graph
    assert [n.name for n in topological_order(g)] == ["fc1", "bias1", "relu1", "ident", "fc2"]
    late = _graph([Node("Relu", ["h"], ["y"], {}, "second"),
                   Node("Neg", ["x"], ["h"], {}, "first")])
    assert [n.name for n in topological_order(late)] == ["first", "second"]
    with pytest.raises(ModelLoadError, match=r"node 'n' \(Relu\) reads 'nowhere', which is "
                                             r"neither a graph input"):
        topological_order(_graph([Node("Relu", ["nowhere"], ["y"], {}, "n")]))
    cyc = _graph([Node("Relu", ["b"], ["a"], {}, "p"), Node("Relu", ["a"], ["b"], {}, "q"),
                  Node("Relu", ["x"], ["y"], {}, "r")])
    with pytest.raises(ModelLoadError, match=r"the graph has a cycle: nodes \['p', 'q'\]"):
        topological_order(cyc)
    # outer-scope names (a subgraph's free variables) are available
    assert len(topological_order(_graph([Node("Add", ["x", "o"], ["y"], {}, "n")]),
                                 outer=["o"])) == 1


def test_subgraph_reads_order_their_owner():
    body = helper.make_graph([helper.make_node("Add", ["v", "late"], ["out"])], "body", [],
                             [vi("out", [1])])
    m = make_model([helper.make_node("If", ["c"], ["y"], then_branch=body, else_branch=body,
                                     name="if"),
                    helper.make_node("Identity", ["x"], ["late"], name="late")],
                   [vi("c", [], 9), vi("x", [1]), vi("v", [1])], [vi("y", [1])])
    g = load(m, check=False).graph
    assert [n.name for n in topological_order(g)] == ["late", "if"]


def test_needed_nodes():
    order = topological_order(load(mlp()).graph)
    assert [n.name for n in needed_nodes(order, ["r"])] == ["fc1", "bias1", "relu1"]
    assert [n.name for n in needed_nodes(order, ["h", "y"])] == [n.name for n in order]
    assert needed_nodes(order, ["x"]) == []
