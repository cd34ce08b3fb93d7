"""GraphCompare / match_graphs: two graphs side by side, matched nodes paired."""

import warnings

import synth
from onnx import helper

from workbench.graph.load import load
from workbench.widgets import GraphCompare, match_graphs
from workbench.widgets.cutter import cut_graph


def test_cut_with_a_new_head():
    g = load(synth.mlp(), check=False).graph
    cut = cut_graph(g, -3, head_classes=5)          # keeps fc1 .. fc2, adds Flatten + Gemm
    cmp = GraphCompare(synth.mlp(), cut.graph)
    assert cmp.matches == [("fc1", "fc1"), ("fc1_bias", "fc1_bias"), ("relu1", "relu1"),
                           ("fc2", "fc2")]
    assert cmp.only_left == ["fc2_bias", "softmax"]
    assert cmp.only_right == ["head_flatten", "head_fc"]
    assert cmp.left.overlay["flagged"] == ["fc2_bias", "softmax"]
    assert cmp.right.overlay["flagged"] == ["head_flatten", "head_fc"]
    assert "4 matched" in repr(cmp)
    # selecting a node selects its match on the other side (and nothing for the unmatched)
    cmp.left.set_state({"selected": "relu1"})
    assert cmp.right.selected == "relu1" and cmp.right.details["op"] == "Relu"
    cmp.left.set_state({"selected": "softmax"})
    assert cmp.right.selected == ""
    cmp.right.set_state({"selected": "fc1"})
    assert cmp.left.selected == "fc1"


def test_renamed_nodes_are_matched_by_their_op_sequence():
    m = synth.cnn()
    renamed = synth.cnn()
    for k, n in enumerate(renamed.graph.node):
        n.name = f"node_{k}"
    pairs = match_graphs(load(m, check=False).graph, load(renamed, check=False).graph)
    assert pairs == [("conv1", "node_0"), ("relu1", "node_1"), ("pool1", "node_2"),
                     ("flatten", "node_3"), ("fc", "node_4")]


def test_a_fused_graph_pairs_what_is_left():
    """The engine's inference passes fuse Conv + Relu: the rest still pairs up."""
    m = synth.cnn()
    fused = synth.cnn()
    nodes = list(fused.graph.node)
    conv, relu = nodes[0], nodes[1]
    fused_conv = helper.make_node("FusedConv", list(conv.input), list(relu.output),
                                  name="conv1_relu", domain="com.workbench")
    del fused.graph.node[:]
    fused.graph.node.extend([fused_conv] + nodes[2:])
    fused.opset_import.append(helper.make_opsetid("com.workbench", 1))
    del fused.graph.value_info[:]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")       # onnx cannot infer shapes through FusedConv
        fused_graph = load(fused, check=False).graph
    pairs = match_graphs(load(m, check=False).graph, fused_graph)
    assert pairs == [("pool1", "pool1"), ("flatten", "flatten"), ("fc", "fc")]


def test_arrangement_side_by_side_or_stacked():
    """Half-width panes are cramped in a narrow notebook: "auto" lets the right drawing wrap
    under the left one below MIN_PANE_PX each; "rows" stacks them; "columns" keeps halves."""
    import pytest
    m = synth.mlp()
    box = lambda c: c.children[1]                       # noqa: E731 - [info, panes]
    auto = GraphCompare(m, m)
    assert box(auto).layout.flex_flow == "row wrap"
    assert {p.layout.flex for p in (auto.left, auto.right)} == \
        {f"1 1 {GraphCompare.MIN_PANE_PX}px"}
    rows = GraphCompare(m, m, arrange="rows")
    assert box(rows).layout.flex_flow == "column nowrap"
    assert rows.left.layout.width == rows.right.layout.width == "100%"
    cols = GraphCompare(m, m, arrange="columns")
    assert box(cols).layout.flex_flow == "row nowrap" and cols.left.layout.width == "50%"
    with pytest.raises(ValueError, match="'auto', 'columns', 'rows'"):
        GraphCompare(m, m, arrange="grid")
