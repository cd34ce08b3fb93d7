"""The tree-ensemble node table built vectorised, once, when the plan is made
(workbench/ops/ml_trees.py ``forest_from_v3``, the kernels' ``prepare``): against a plain
per-tree reference, against onnxruntime on forests made by skl2onnx and onnxmltools (fixed
small samples; the 5M-node scale is ``benchmarks/bench_trees.py --part scale``), and the
prepared path against the path that builds on the first run."""

from __future__ import annotations

import functools

import numpy as np
import onnx
import pytest
from onnx import helper

import workbench.backend as backend
from workbench.errors import InputError, ShapeError
from workbench.ops import ml_trees
from workbench.ops.ml_trees import LEAF, _mode_codes, forest_from_v3

ort = pytest.importorskip("onnxruntime")


def _data(n=300, f=6, seed=0):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, f)).astype(np.float32)
    s = X[:, 0] * X[:, 1] + np.sin(2 * X[:, 2]) + X[:, 3]
    return X, s


def _sk_forest(kind):
    skl2onnx = pytest.importorskip("skl2onnx")
    from sklearn.ensemble import (
        GradientBoostingClassifier,
        RandomForestClassifier,
        RandomForestRegressor,
    )
    X, s = _data()
    if kind == "rf_reg":
        est = RandomForestRegressor(n_estimators=12, max_depth=6, random_state=0).fit(X, s)
    elif kind == "rf_clf":
        est = RandomForestClassifier(n_estimators=12, max_depth=6, random_state=0).fit(
            X, np.digitize(s, [-1, 0, 1]))
    else:
        est = GradientBoostingClassifier(n_estimators=15, max_depth=3, random_state=0).fit(
            X, s > 0)
    opts = {id(est): {"zipmap": False}} if kind != "rf_reg" else None
    return skl2onnx.to_onnx(est, X[:1], options=opts, target_opset={"": 17, "ai.onnx.ml": 3})


def _lgbm(classes):
    lgb = pytest.importorskip("lightgbm")
    pytest.importorskip("onnxmltools")
    from onnxmltools import convert_lightgbm
    from onnxmltools.convert.common.data_types import FloatTensorType

    X, s = _data(n=400)
    y = np.digitize(s, np.quantile(s, np.linspace(0, 1, classes + 1)[1:-1]))
    est = lgb.LGBMClassifier(n_estimators=8, num_leaves=15, min_child_samples=5, n_jobs=1,
                             verbose=-1, random_state=0).fit(X, y)
    return convert_lightgbm(est, initial_types=[("X", FloatTensorType([None, X.shape[1]]))],
                            zipmap=False, target_opset=15)


def _tree_node(model):
    return next(n for n in model.graph.node if n.op_type.startswith("TreeEnsemble"))


MODELS = ["rf_reg", "rf_clf", "gb_binary", "lgbm_binary", "lgbm_4"]


@functools.cache
def _model_bytes(name) -> bytes:
    m = _lgbm(2 if name == "lgbm_binary" else 4) if name.startswith("lgbm") else \
        _sk_forest(name)
    return m.SerializeToString()


def _model(name):
    """A fresh copy of the named model (each is trained once per test session)."""
    return onnx.load_from_string(_model_bytes(name))


@pytest.mark.parametrize("name", MODELS)
def test_prepared_forests_match_onnxruntime(name):
    m = _model(name)
    X, _ = _data(n=64, seed=7)
    X[::9, 2] = np.nan                                      # missing values
    rep = backend.prepare(m)
    sess = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
    want = sess.run(None, {sess.get_inputs()[0].name: X})
    got = rep.run(X)
    assert len(got) == len(want)
    for g, w in zip(got, want):
        if w.dtype.kind == "f":
            np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-5)
        else:
            np.testing.assert_array_equal(g, w)


@pytest.mark.parametrize("name", ["rf_clf", "lgbm_4"])
def test_the_node_table_is_built_when_the_plan_is_made(name, monkeypatch):
    m = _model(name)
    rep = backend.prepare(m)
    step = next(s for s in rep.plan.steps if s.node.op_type.startswith("TreeEnsemble"))
    setup = step.attrs["ctx"].extra.get("setup")
    assert setup is not None and isinstance(setup["forest"], ml_trees.Forest)
    X, _ = _data(n=20, seed=3)

    def no_build(*a, **k):
        raise AssertionError("the forest was built again at run time")

    monkeypatch.setattr(ml_trees, "forest_from_v3", no_build)
    got = rep.run(X)
    monkeypatch.undo()
    # the plain path: the kernel called without a context builds its forest on the call
    attrs = {k: v for k, v in step.attrs.items() if k != "ctx"}
    plain = step.fn(X, **attrs)
    plain = plain if isinstance(plain, tuple) else (plain,)
    for g, p in zip(got, plain):
        np.testing.assert_array_equal(g, p)


def test_a_broken_forest_fails_at_its_run_naming_the_node():
    m = _model("rf_reg")
    node = _tree_node(m)
    for a in node.attribute:
        if a.name == "nodes_modes":
            a.strings[0] = b"BRANCH_SOMETIMES"
    rep = backend.prepare(m)             # the failed build at prepare is left to the run
    X, _ = _data(n=4)
    with pytest.raises(InputError, match="unknown node mode 'BRANCH_SOMETIMES'"):
        rep.run(X)


# --------------------------------------------------------------------------- the build itself
def _attrs(model):
    node = _tree_node(model)
    return {a.name: helper.get_attribute_value(a) for a in node.attribute}


def _plain_roots(tree, child):
    """Per tree (in tree-id order), the first node in attribute order no branch points to."""
    return np.asarray([np.flatnonzero((tree == t) & ~child)[0] for t in np.unique(tree)])


def _build(a, perm=None):
    node_keys = [k for k in a if k.startswith("nodes_")]
    if perm is not None:
        a = dict(a)
        for k in node_keys:
            v = a[k]
            a[k] = [v[i] for i in perm]
    w = "class_" if "class_ids" in a else "target_"
    return forest_from_v3(
        "T", treeids=a["nodes_treeids"], nodeids=a["nodes_nodeids"],
        featureids=a["nodes_featureids"], modes=a["nodes_modes"],
        values=np.asarray(a["nodes_values"], np.float32).astype(np.float64),
        truenodeids=a["nodes_truenodeids"], falsenodeids=a["nodes_falsenodeids"],
        missing_tracks=a.get("nodes_missing_value_tracks_true"),
        w_treeids=a[w + "treeids"], w_nodeids=a[w + "nodeids"], w_ids=a[w + "ids"],
        w_weights=np.asarray(a[w + "weights"], np.float32).astype(np.float64),
        n_outputs=int(max(a[w + "ids"])) + 1)


@pytest.mark.parametrize("name", ["rf_clf", "lgbm_4"])
@pytest.mark.parametrize("shuffle", [False, True])
def test_vectorised_build_matches_a_plain_per_tree_walk(name, shuffle):
    a = _attrs(_model(name))
    g = len(a["nodes_treeids"])
    perm = np.random.default_rng(1).permutation(g) if shuffle else None
    f = _build(a, perm)
    tree = np.asarray(a["nodes_treeids"])[perm if shuffle else slice(None)]
    node = np.asarray(a["nodes_nodeids"])[perm if shuffle else slice(None)]
    child = np.zeros(g, bool)
    branch = f.mode != LEAF
    child[f.true_next[branch]] = child[f.false_next[branch]] = True
    np.testing.assert_array_equal(f.roots, _plain_roots(tree, child))
    # children: the node of the same tree whose id the attributes name
    where = {(int(t), int(n)): i for i, (t, n) in enumerate(zip(tree, node))}
    tn = np.asarray(a["nodes_truenodeids"])[perm if shuffle else slice(None)]
    fn = np.asarray(a["nodes_falsenodeids"])[perm if shuffle else slice(None)]
    for i in np.flatnonzero(branch):
        assert f.true_next[i] == where[int(tree[i]), int(tn[i])]
        assert f.false_next[i] == where[int(tree[i]), int(fn[i])]
    # and the order of the attributes does not change a prediction
    X, _ = _data(n=50, seed=5)
    s0, _ = _build(a).evaluate(X, "SUM", "T")
    s1, _ = f.evaluate(X, "SUM", "T")
    np.testing.assert_allclose(s1, s0, rtol=1e-12, atol=1e-12)


def test_mode_codes_from_str_bytes_and_arrays():
    names = ["BRANCH_LEQ", "LEAF", "BRANCH_MEMBER", "BRANCH_GT"]
    want = [ml_trees.LEQ, LEAF, ml_trees.MEMBER, ml_trees.GT]
    assert _mode_codes("T", names).tolist() == want
    assert _mode_codes("T", [n.encode() for n in names]).tolist() == want
    assert _mode_codes("T", np.asarray(names)).tolist() == want
    with pytest.raises(InputError, match=r"T: unknown node mode 'BRANCH_X'; expected one of"):
        _mode_codes("T", ["LEAF", b"BRANCH_X"])


def test_a_tree_without_a_root_is_named():
    # tree 1's two nodes point at each other
    with pytest.raises(InputError, match="tree 1 has no root"):
        forest_from_v3("T", treeids=[0, 1, 1], nodeids=[0, 0, 1], featureids=[0, 0, 0],
                       modes=["LEAF", "BRANCH_LEQ", "BRANCH_LEQ"], values=np.zeros(3),
                       truenodeids=[0, 1, 0], falsenodeids=[0, 1, 0], missing_tracks=None,
                       w_treeids=[0], w_nodeids=[0], w_ids=[0], w_weights=np.ones(1),
                       n_outputs=1)


def test_the_feature_check_holds_on_every_run():
    a = _attrs(_model("rf_reg"))
    f = _build(a)
    top = max(k for k, m in zip(a["nodes_featureids"], a["nodes_modes"]) if m != b"LEAF")
    f.validate("T", 6)
    f.validate("T", 6)                                      # found once, checked each time
    with pytest.raises(ShapeError, match=f"a node reads feature {top} but X has {top} "):
        f.validate("T", top)
