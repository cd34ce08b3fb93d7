import time

import synth

from workbench.graph.load import load
from workbench.widgets.layout import graph_elements, layout_graph


def _graph(m):
    return load(m, check=False, shape_inference=False).graph


def _check_layout(L, g):
    n = len(L["name"])
    assert n == len(g.inputs) + len(g.nodes) + len(g.outputs)
    for key in ("op", "kind", "x", "y", "w", "layer"):
        assert len(L[key]) == n
    # every edge goes downwards (layered top-to-bottom)
    for s, d in L["edges"]:
        assert L["y"][d] > L["y"][s]
    # no two nodes overlap within a layer
    by_layer = {}
    for i in range(n):
        by_layer.setdefault(L["y"][i], []).append(i)
    for nodes in by_layer.values():
        nodes.sort(key=lambda i: L["x"][i])
        for a, b in zip(nodes, nodes[1:]):
            assert L["x"][a] + L["w"][a] / 2 <= L["x"][b] - L["w"][b] / 2 + 1


def test_small_mlp_layout():
    g = _graph(synth.mlp())
    L = layout_graph(g)
    _check_layout(L, g)
    # a chain is drawn as one straight column
    assert len(set(L["x"][: len(g.nodes) + 2])) <= 2


def test_transformer_like_2500_nodes_layout_is_fast():
    g = _graph(synth.transformer_like(blocks=100))
    assert len(g.nodes) >= 2500
    t0 = time.perf_counter()
    L = layout_graph(g)
    dt = time.perf_counter() - t0
    print(f"\nlayout of {len(g.nodes)} nodes (+{L['n_dummies']} dummies): {dt:.3f} s")
    _check_layout(L, g)
    assert dt < 10  # generous; typically ~0.2 s


def test_chain_2500_nodes_layout():
    g = _graph(synth.chain(2500))
    t0 = time.perf_counter()
    L = layout_graph(g)
    print(f"\nlayout of a 2,500-node chain: {time.perf_counter() - t0:.3f} s")
    _check_layout(L, g)
    assert len(set(L["x"])) == 1


def test_empty_graph_and_cycles_do_not_crash():
    from workbench.graph.ir import Graph, Node, ValueInfo
    L = layout_graph(Graph())
    assert L["name"] == [] and L["edges"] == []
    # an (invalid) cycle is broken rather than looping forever
    g = Graph(nodes=[Node("Relu", ["b"], ["a"], name="n1"), Node("Relu", ["a"], ["b"], name="n2")],
              outputs=[ValueInfo("b")])
    L = layout_graph(g)
    assert len(L["name"]) == 3
    names, ops, kinds, edges, _ = graph_elements(g)
    assert ops == ["Relu", "Relu", "Output"]
