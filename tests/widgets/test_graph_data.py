"""What the graph drawing shows (workbench/widgets/graph_data.py): folding of constants and
shape computations, scope groups, split of big groups, subgraphs, details of folded inputs."""

import sys
import time
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import synth
from onnx import TensorProto, helper, numpy_helper

from workbench.graph.load import load
from workbench.widgets.graph_data import (
    SPLIT_AT,
    all_node_details,
    graph_payload,
    node_details,
    scope_of,
)

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from tests.helpers import viewer_models  # noqa: E402


def _graph(m):
    return load(m, check=False).graph


def _shown(d):
    return [i for i, h in enumerate(d["host"]) if h == -1]


def _chain(d, i):
    """Group labels from the root down to node i's group."""
    G, g, out = d["groups"], d["group"][i], []
    while g > 0:
        out.append(G["label"][g])
        g = G["parent"][g]
    return out[::-1]


def test_scope_of_names():
    assert scope_of("/layer1/layer1.0/conv1/Conv") == ["layer1", "layer1.0", "conv1"]
    assert scope_of("/h.2/attn/MatMul") == ["h.2", "attn"]
    assert scope_of("model.layers.0.self_attn.q_proj") == ["model", "layers.0", "self_attn"]
    assert scope_of("Conv_3") == [] and scope_of("conv2d_3.tmp_0") == []
    assert scope_of("p2o.Conv.3") == []


@pytest.fixture(scope="module")
def gpt2():
    pytest.importorskip("torch")
    return _graph(viewer_models.gpt2_like())


def test_gpt2_export_folds_constants_and_shape_chains(gpt2):
    ops = Counter(n.op_type for n in gpt2.nodes)
    assert len(gpt2.nodes) > 400 and ops["Constant"] > 130
    d = graph_payload(gpt2)
    shown = _shown(d)
    shown_ops = Counter(d["op"][i] for i in shown)
    # no constant and no shape computation is drawn by default ...
    for op in ("Constant", "Shape", "Concat", "Range", "Cast", "LessOrEqual", "Not"):
        assert shown_ops[op] == 0, (op, shown_ops)
    # ... the architecture is: embeddings, the attention reshapes, matmuls, norms
    assert shown_ops["MatMul"] == ops["MatMul"] and shown_ops["LayerNormalization"] == 11
    assert shown_ops["Reshape"] == ops["Reshape"]  # the reshape stays, its shape folds
    assert d["folded"] == len(d["name"]) - len(shown) > ops["Constant"]
    # every folded node is folded into a shown node; the badge counts add up
    for h in d["host"]:
        assert h == -1 or d["host"][h] == -1 or h == -2
    assert sum(d["nfold"]) == sum(1 for h in d["host"] if h >= 0)
    # the embedding lookups read weights: they stay
    names = [d["name"][i] for i in shown]
    assert "/wte/Gather" in names and "/wpe/Gather" in names
    # the reshape of each attention block gets its shape chain folded in
    r = d["name"].index("/h.0/attn/Reshape")
    assert d["nfold"][r] >= 3
    det = node_details(gpt2, "/h.0/attn/Reshape")
    # the folded shape, written down to the drawn node it reads (its shape)
    assert det["inputs"][1]["folded"] == (
        "Concat(Unsqueeze(Gather(Shape(ln_1/LayerNormalization), 0), [0]), "
        "Unsqueeze(Gather(Shape(ln_1/LayerNormalization), 1), [0]), [4], [16])"
    )


def test_gpt2_groups_by_scope(gpt2):
    d = graph_payload(gpt2)
    G = d["groups"]
    top = {G["label"][g] for g in range(1, len(G["label"])) if G["parent"][g] == 0}
    assert {"h.0", "h.1", "h.2", "h.3", "h.4"} <= top
    i = d["name"].index("/h.3/attn/c_attn/MatMul")
    assert _chain(d, i) == ["h.3", "attn", "c_attn"]
    # inputs and outputs stay at the top level
    assert d["group"][d["name"].index("input_ids")] == 0
    assert d["group"][d["name"].index("logits")] == 0
    # a root-level Constant feeding a block is put in the block of the node it folds into
    c = next(i for i, n in enumerate(d["name"]) if n.startswith("Constant_") and d["host"][i] >= 0)
    assert d["group"][c] == d["group"][d["host"][c]]


def test_paddle_style_graph_is_split_into_stages():
    m = viewer_models.paddle_ocr_like()
    g = _graph(m)
    d = graph_payload(g)
    G = d["groups"]
    shown = _shown(d)
    assert Counter(d["op"][i] for i in shown)["Constant"] == 0
    assert d["folded"] >= 141
    parts = [k for k in range(len(G["label"])) if G["kind"][k] == "part" and G["parent"][k] == 0]
    assert 2 <= len(parts) <= 12
    # parts are labelled with Paddle's layer names, and hold the shown nodes in order
    assert all(" · " in G["label"][k] for k in parts)
    assert any("conv2d_" in G["label"][k] for k in parts)
    assert sum(G["size"][k] for k in parts) == len(shown) - 2  # all but x / softmax_out
    assert d["group"][d["name"].index("x")] == 0 and d["group"][d["name"].index("softmax_out")] == 0


def test_big_flat_graph_is_split_recursively():
    g = _graph(synth.chain(3000))
    t0 = time.perf_counter()
    d = graph_payload(g)
    dt = time.perf_counter() - t0
    print(f"\ndrawing data of a 3,000-node chain: {dt:.2f} s")
    G = d["groups"]
    children = Counter(d["group"][i] for i in _shown(d))
    for k in range(len(G["label"])):
        kids = sum(1 for c in range(len(G["label"])) if G["parent"][c] == k)
        assert children[k] + kids <= SPLIT_AT, (G["label"][k], children[k], kids)


def test_subgraphs_are_groups_owned_by_their_node():
    then_g = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["t"], name="then_relu")],
        "then",
        [],
        [helper.make_tensor_value_info("t", TensorProto.FLOAT, [2])],
    )
    else_g = helper.make_graph(
        [helper.make_node("Neg", ["x"], ["e"], name="else_neg")],
        "else",
        [],
        [helper.make_tensor_value_info("e", TensorProto.FLOAT, [2])],
    )
    nodes = [
        helper.make_node("ReduceSum", ["x"], ["s"], name="sum", keepdims=0),
        helper.make_node("Greater", ["s", "zero"], ["c"], name="gt"),
        helper.make_node("If", ["c"], ["y"], name="branch", then_branch=then_g, else_branch=else_g),
    ]
    g = helper.make_graph(
        nodes,
        "ifg",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])],
        [numpy_helper.from_array(np.float32(0), "zero")],
    )
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    d = graph_payload(_graph(m))
    G = d["groups"]
    owner = d["name"].index("branch")
    subs = [k for k in range(len(G["label"])) if G["kind"][k] == "subgraph"]
    assert sorted(G["label"][k] for k in subs) == ["branch · else_branch", "branch · then_branch"]
    assert all(G["owner"][k] == owner for k in subs)
    relu = d["name"].index("then_relu")
    assert G["label"][d["group"][relu]] == "branch · then_branch"
    edges = [tuple(d["edges"][k : k + 2]) for k in range(0, len(d["edges"]), 3)]
    assert (0, relu) in edges  # x (outer input) -> then_relu
    assert all_node_details(_graph(m))["else_neg"]["op"] == "Neg"


def test_folding_is_from_structure_not_op_names():
    """A Reshape whose shape input is computed from a Shape is kept; the shape computation is
    folded. A Mul of two initializers (constant arithmetic) folds; a Mul of the input stays."""
    nodes = [
        helper.make_node("Shape", ["x"], ["s"], name="shape"),
        helper.make_node("Mul", ["two", "three"], ["six"], name="const_mul"),
        helper.make_node("Reshape", ["x", "s"], ["r"], name="reshape"),
        helper.make_node("Mul", ["r", "six"], ["y"], name="scale"),
    ]
    g = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])],
        [
            numpy_helper.from_array(np.float32(2), "two"),
            numpy_helper.from_array(np.float32(3), "three"),
        ],
    )
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    d = graph_payload(_graph(m))
    host = dict(zip(d["name"], d["host"]))
    idx = d["name"].index
    assert host["shape"] == idx("reshape") and host["const_mul"] == idx("scale")
    assert host["reshape"] == -1 and host["scale"] == -1
    det = node_details(_graph(m), "scale")
    assert det["inputs"][1]["folded"] == "Mul(2.0, 3.0)"
