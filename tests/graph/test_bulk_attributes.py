"""Loading models with huge list attributes (a tree ensemble's node tables): the attribute
readers' fast paths against the one-by-one conversion, and the checker helper's skeleton that
sends a tree ensemble's node lists cut short (workbench/graph/isolated.py) against the check
and inference of the whole model in this process."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import helper

from workbench.graph import isolated
from workbench.graph.ir import attr_to_python
from workbench.graph.load import load


@pytest.mark.parametrize("values", [
    [b"BRANCH_LEQ"] * 99 + [b"LEAF"],
    [b"x\0y"] + [b"a"] * 100,                 # a NUL inside: decoded one by one
    ["é€".encode()] * 70 + [b""] * 5,
    [b"a", b"b"],
])
def test_string_lists_decode_as_one_by_one(values):
    got = attr_to_python(helper.make_attribute("s", values), {})
    assert got == [v.decode("utf-8") for v in values]


def test_invalid_utf8_still_fails_to_decode():
    with pytest.raises(UnicodeDecodeError):
        attr_to_python(helper.make_attribute("s", [b"ok"] * 70 + [b"\xff"]), {})


def test_number_lists_are_python_numbers():
    f = attr_to_python(helper.make_attribute("f", [0.1, 2.5, -3.0]), {})
    i = attr_to_python(helper.make_attribute("i", [1, -2, 2**40]), {})
    assert f == [float(np.float32(v)) for v in (0.1, 2.5, -3.0)]
    assert all(type(v) is float for v in f)
    assert i == [1, -2, 2**40] and all(type(v) is int for v in i)


def _big_forest():
    skl2onnx = pytest.importorskip("skl2onnx")
    from sklearn.ensemble import RandomForestClassifier

    rng = np.random.default_rng(0)
    X = rng.normal(size=(1500, 5)).astype(np.float32)
    y = (X[:, 0] + np.sin(3 * X[:, 1]) + 0.3 * rng.normal(size=1500) > 0).astype(np.int64) + \
        (X[:, 2] > 1)
    est = RandomForestClassifier(n_estimators=6, max_depth=8, random_state=0).fit(X, y)
    m = skl2onnx.to_onnx(est, X[:1], options={id(est): {"zipmap": False}},
                         target_opset={"": 17, "ai.onnx.ml": 3})
    return m, X


def test_the_skeleton_cuts_tree_tables_and_the_loaded_model_keeps_them(monkeypatch):
    monkeypatch.setattr(isolated, "BULK_ENTRIES", 256)     # a small forest is big enough
    m, X = _big_forest()
    node = next(n for n in m.graph.node if n.op_type == "TreeEnsembleClassifier")
    lengths = {a.name: len(a.ints) + len(a.floats) + len(a.strings) for a in node.attribute}
    assert lengths["nodes_treeids"] > isolated.BULK_ENTRIES     # the cut applies
    sk = isolated.skeleton(m)
    sk_node = next(n for n in sk.graph.node if n.op_type == "TreeEnsembleClassifier")
    for a in sk_node.attribute:
        n = len(a.ints) + len(a.floats) + len(a.strings)
        if a.name.startswith(("nodes_", "class_")) and lengths[a.name] > isolated.BULK_ENTRIES:
            assert n == 1, a.name
        else:
            assert n == lengths[a.name], a.name                  # class labels stay whole
    assert len(node.attribute[0].ints) + len(node.attribute[0].floats) + \
        len(node.attribute[0].strings) == lengths[node.attribute[0].name]   # m untouched

    helper_loaded = load(m.SerializeToString())
    monkeypatch.setenv("WORKBENCH_SHAPE_INFERENCE", "inprocess")
    whole = load(m.SerializeToString())
    a, b = helper_loaded.graph, whole.graph
    assert [(v.name, v.dtype, v.shape) for v in a.outputs] == \
        [(v.name, v.dtype, v.shape) for v in b.outputs]
    assert {k: (v.dtype, v.shape) for k, v in a.value_info.items()} == \
        {k: (v.dtype, v.shape) for k, v in b.value_info.items()}
    (na,), (nb,) = ([n for n in g.nodes if n.op_type == "TreeEnsembleClassifier"]
                    for g in (a, b))
    assert na.attrs.keys() == nb.attrs.keys()
    for k in na.attrs:          # repeated numbers of tree nodes are arrays (graph.ir.AttrArray)
        va, vb = na.attrs[k], nb.attrs[k]
        assert type(va) is type(vb), k
        assert (va.tolist() if isinstance(va, np.ndarray) else va) == \
            (vb.tolist() if isinstance(vb, np.ndarray) else vb), k


def test_a_forest_loaded_through_the_helper_runs_like_onnxruntime(monkeypatch):
    monkeypatch.setattr(isolated, "BULK_ENTRIES", 256)
    ort = pytest.importorskip("onnxruntime")
    import workbench.backend as backend

    m, X = _big_forest()
    sess = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
    want = sess.run(None, {sess.get_inputs()[0].name: X[:40]})
    got = backend.prepare(onnx.load_from_string(m.SerializeToString())).run(X[:40])
    np.testing.assert_array_equal(got[0], want[0])
    np.testing.assert_allclose(got[1], want[1], rtol=1e-5, atol=1e-6)


def test_empty_list_attributes_write_back_with_a_type():
    """An empty list attribute (no value to infer a type from) is written with the schema's
    type, or INTS for an op without a schema (the engine's own fused nodes, e.g. NhwcConv's
    empty ``activation_params``), and reads back as an empty list."""
    from workbench.graph.ir import Graph, Node, ValueInfo

    g = Graph(nodes=[Node("Conv", ["x", "w"], ["y"], {"dilations": [], "pads": []}, "c"),
                     Node("NhwcConv", ["y"], ["z"], {"activation_params": []}, "n",
                          "workbench.fused")],
              inputs=[ValueInfo("x", 1, (1, 1, 3, 3))],
              outputs=[ValueInfo("z", 1, None)],
              initializers={"w": np.ones((1, 1, 1, 1), np.float32)})
    proto = g.to_proto()
    conv, fused = proto.node
    assert [(a.name, a.type) for a in conv.attribute] == \
        [("dilations", onnx.AttributeProto.INTS), ("pads", onnx.AttributeProto.INTS)]
    assert [(a.name, a.type) for a in fused.attribute] == \
        [("activation_params", onnx.AttributeProto.INTS)]
    assert all(attr_to_python(a, {}) == [] for a in list(conv.attribute) + list(fused.attribute))
