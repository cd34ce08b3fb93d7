"""Tree-ensemble attributes read straight into numpy (graph/ir.py: ``AttrArray`` for the
FLOATS / INTS of TreeEnsemble* nodes, shared str objects for their long node-mode lists):
the values, the run, the export back to ONNX, the checker, pickling and the viewer's text."""

from __future__ import annotations

import pickle

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from workbench.graph.ir import AttrArray, _few_strings, attr_to_python, python_to_attr
from workbench.graph.load import load


def _stumps(trees=1400, features=6, seed=0):
    """``trees`` one-split trees (4,200 nodes: past the long-strings threshold)."""
    rng = np.random.default_rng(seed)
    feat = rng.integers(0, features, trees)
    thr = rng.normal(size=trees).astype(np.float32)
    w = rng.normal(size=(trees, 2)).astype(np.float32)
    t3 = np.repeat(np.arange(trees), 3)
    attrs = dict(
        nodes_treeids=t3.tolist(), nodes_nodeids=[0, 1, 2] * trees,
        nodes_featureids=np.stack([feat, np.zeros(trees, int), np.zeros(trees, int)], 1)
        .reshape(-1).tolist(),
        nodes_values=np.stack([thr, np.zeros(trees), np.zeros(trees)], 1).reshape(-1).tolist(),
        nodes_modes=["BRANCH_LEQ", "LEAF", "LEAF"] * trees,
        nodes_truenodeids=[1, 0, 0] * trees, nodes_falsenodeids=[2, 0, 0] * trees,
        target_treeids=np.repeat(np.arange(trees), 2).tolist(), target_nodeids=[1, 2] * trees,
        target_ids=[0] * (2 * trees), target_weights=w.reshape(-1).tolist(), n_targets=1)
    node = helper.make_node("TreeEnsembleRegressor", ["x"], ["y"], name="forest",
                            domain="ai.onnx.ml", **attrs)
    g = helper.make_graph([node], "stumps",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [None, features])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [None, 1])])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17),
                                            helper.make_opsetid("ai.onnx.ml", 3)])
    m.ir_version = 8
    return m, (feat, thr, w)


def test_tree_tables_load_as_arrays_run_and_export_back():
    import workbench.backend as backend

    m, (feat, thr, w) = _stumps()
    node = load(m).graph.nodes[0]
    a = node.attrs
    assert type(a["nodes_values"]) is AttrArray and a["nodes_values"].dtype == np.float32
    assert type(a["nodes_treeids"]) is AttrArray and a["nodes_treeids"].dtype == np.int64
    modes = a["nodes_modes"]
    assert isinstance(modes, list) and modes[:3] == ["BRANCH_LEQ", "LEAF", "LEAF"]
    assert len({id(s) for s in modes}) == 2                    # shared, not 4,200 objects
    assert a["nodes_featureids"][::3].tolist() == feat.tolist()
    assert a["n_targets"] == 1                                 # scalars stay scalars
    # runs as the tree tables say
    x = np.random.default_rng(1).normal(size=(50, 6)).astype(np.float32)
    want = np.where(x[:, feat] <= thr, w[:, 0], w[:, 1]).sum(axis=1, dtype=np.float64)
    got = backend.prepare(m).run({"x": x})[0]
    np.testing.assert_allclose(got[:, 0], want, rtol=1e-5, atol=1e-4)
    # export: the same repeated attributes (not tensors), the checker accepts the model
    back = {at.name: at for at in load(m).graph.to_proto().node[0].attribute}
    for orig in m.graph.node[0].attribute:
        b = back[orig.name]
        assert b.type == orig.type, orig.name
        assert helper.get_attribute_value(b) == pytest.approx(helper.get_attribute_value(orig)) \
            if orig.type == onnx.AttributeProto.FLOATS else \
            helper.get_attribute_value(b) == helper.get_attribute_value(orig), orig.name
    m2 = helper.make_model(load(m).graph.to_proto(), opset_imports=list(m.opset_import))
    m2.ir_version = 8
    onnx.checker.check_model(m2)
    # pickled (worker processes) it stays an attribute array
    p = pickle.loads(pickle.dumps(a["nodes_values"]))
    assert type(p) is AttrArray and np.array_equal(p, a["nodes_values"])
    # the viewer shows the entries, as for a list
    from workbench.widgets.graph_data import _attr_repr

    assert _attr_repr(a["nodes_treeids"]).startswith("[0, 0, 0, 1")
    assert python_to_attr("v", AttrArray.of([1.5], np.float32)).floats == [1.5]


@pytest.mark.parametrize("values", [
    ["BRANCH_LT", "BRANCH_LTQ"] * 2100,                   # one name a prefix of another
    ["abcdefghABCDEFGH", "abcdefghABCDEFGI"] * 2100,      # differ in the 16th byte
    ["", "a\0b", "a\0c"] * 1400,                          # empty, NULs inside
    ["é", "LEAF"] * 2100,                                 # UTF-8
])
def test_long_string_lists_read_exactly(values):
    a = helper.make_attribute("nodes_modes", values)
    assert _few_strings(a) == values
    assert attr_to_python(a, {}, arrays=True) == values


@pytest.mark.parametrize("values", [
    ["J" + "x", "LEAF"] * 2100,                           # the tag byte inside an entry
    ["x" * 20, "y"] * 2100,                               # longer than 16 bytes
    [str(i) for i in range(4200)],                        # many distinct values
])
def test_string_lists_it_cannot_read_go_the_general_way(values):
    a = helper.make_attribute("nodes_modes", values)
    assert _few_strings(a) is None
    assert attr_to_python(a, {}, arrays=True) == values
