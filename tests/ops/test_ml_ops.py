"""The ai.onnx.ml operators added for issue 12: one-node models run by the workbench and by
onnxruntime on the same file (the binary-class conventions, post-transforms, value kinds:
maps in, sequences of maps out, string tensors), and the errors for bad input."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import workbench.backend as backend
from workbench.errors import InputError, WorkbenchError

ort = pytest.importorskip("onnxruntime")
ML = "ai.onnx.ml"
RNG = np.random.default_rng(7)


def model(op, inputs, outputs, ml_opset=3, **attrs):
    node = helper.make_node(op, [i.name for i in inputs], [o.name for o in outputs],
                            domain=ML, name=f"my_{op.lower()}", **attrs)
    g = helper.make_graph([node], "g", inputs, outputs)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17),
                                            helper.make_opsetid(ML, ml_opset)])
    m.ir_version = 8
    return m


def T(name, elem, shape):
    return helper.make_tensor_value_info(name, elem, shape)


def both(m, feeds):
    sess = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
    return list(backend.prepare(m).run(feeds)), sess.run(None, feeds)


def assert_same(ours, ref, rtol=1e-5, atol=1e-6):
    for a, b in zip(ours, ref):
        if isinstance(b, list):
            assert a == pytest.approx(b) if not b or not isinstance(b[0], dict) else \
                [list(d) for d in a] == [list(d) for d in b]
            if b and isinstance(b[0], dict):
                for da, db in zip(a, b):
                    assert [da[k] for k in db] == pytest.approx([db[k] for k in db], rel=rtol)
            continue
        b = np.asarray(b)
        assert a.shape == b.shape
        if b.dtype.kind in "OUSi":
            np.testing.assert_array_equal(a, b)
        else:
            assert a.dtype == b.dtype
            np.testing.assert_allclose(a, b, rtol=rtol, atol=atol)


X4 = RNG.normal(size=(16, 4)).astype(np.float32)
POST = ["NONE", "LOGISTIC", "SOFTMAX", "SOFTMAX_ZERO"]


# --------------------------------------------------------------------------- linear


@pytest.mark.parametrize("post", POST)
@pytest.mark.parametrize("classes", [[0, 1], [5, 9, 11], ["no", "yes"]])
@pytest.mark.parametrize("one_column", [True, False])
def test_linear_classifier_vs_onnxruntime(post, classes, one_column):
    k = 1 if one_column and len(classes) == 2 else len(classes)
    coef = RNG.normal(size=(k, 4)).astype(np.float32)
    key = "classlabels_strings" if isinstance(classes[0], str) else "classlabels_ints"
    ytype = TensorProto.STRING if isinstance(classes[0], str) else TensorProto.INT64
    m = model("LinearClassifier", [T("X", TensorProto.FLOAT, [None, 4])],
              [T("Y", ytype, [None]), T("Z", TensorProto.FLOAT, [None, None])],
              coefficients=coef.ravel().tolist(), intercepts=[0.1] * k,
              post_transform=post, **{key: classes})
    ours, ref = both(m, {"X": X4})
    assert_same(ours, ref)


@pytest.mark.parametrize("post", ["NONE", "LOGISTIC"])
def test_linear_regressor_targets(post):
    m = model("LinearRegressor", [T("X", TensorProto.FLOAT, [None, 4])],
              [T("Y", TensorProto.FLOAT, [None, 2])],
              coefficients=RNG.normal(size=8).tolist(), intercepts=[0.5, -1.0], targets=2,
              post_transform=post)
    ours, ref = both(m, {"X": X4})
    assert_same(ours, ref)


# --------------------------------------------------------------------------- SVM


@pytest.mark.parametrize("kernel", ["LINEAR", "RBF", "POLY", "SIGMOID"])
@pytest.mark.parametrize("k", [2, 3])
@pytest.mark.parametrize("proba", [False, True])
def test_svm_classifier_vs_onnxruntime(kernel, k, proba):
    vpc = [3, 2, 4][:k]
    n_sv = sum(vpc)
    pairs = k * (k - 1) // 2
    attrs = dict(kernel_type=kernel, kernel_params=[0.3, 0.5, 2.0], vectors_per_class=vpc,
                 support_vectors=RNG.normal(size=n_sv * 4).tolist(),
                 coefficients=RNG.normal(size=(k - 1) * n_sv).tolist(),
                 rho=RNG.normal(size=pairs).tolist(), classlabels_ints=list(range(k)))
    if proba:
        attrs.update(prob_a=(-RNG.random(pairs) - 0.5).tolist(),
                     prob_b=(0.1 * RNG.normal(size=pairs)).tolist())
    m = model("SVMClassifier", [T("X", TensorProto.FLOAT, [None, 4])],
              [T("Y", TensorProto.INT64, [None]), T("Z", TensorProto.FLOAT, [None, None])],
              **attrs)
    ours, ref = both(m, {"X": X4})
    assert_same(ours, ref, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("post", ["NONE", "LOGISTIC", "SOFTMAX", "SOFTMAX_ZERO"])
def test_svm_classifier_binary_scores_vs_onnxruntime(post):
    m = model("SVMClassifier", [T("X", TensorProto.FLOAT, [None, 4])],
              [T("Y", TensorProto.INT64, [None]), T("Z", TensorProto.FLOAT, [None, None])],
              kernel_type="RBF", kernel_params=[0.3, 0.0, 0.0], vectors_per_class=[2, 3],
              support_vectors=RNG.normal(size=20).tolist(),
              coefficients=RNG.normal(size=5).tolist(), rho=[0.2], classlabels_ints=[4, 7],
              post_transform=post)
    assert_same(*both(m, {"X": X4}))


@pytest.mark.parametrize("kernel", ["LINEAR", "RBF"])
@pytest.mark.parametrize("post", ["NONE", "LOGISTIC", "SOFTMAX"])
def test_svm_classifier_linear_mode_vs_onnxruntime(kernel, post):
    """No vectors_per_class: one weight row per class, x . w + rho[0] (onnxruntime ignores
    kernel_type there)."""
    m = model("SVMClassifier", [T("X", TensorProto.FLOAT, [None, 4])],
              [T("Y", TensorProto.INT64, [None]), T("Z", TensorProto.FLOAT, [None, None])],
              kernel_type=kernel, kernel_params=[0.3, 0.1, 2.0],
              coefficients=RNG.normal(size=12).tolist(), rho=RNG.normal(size=3).tolist(),
              classlabels_ints=[0, 1, 2], post_transform=post)
    assert_same(*both(m, {"X": X4}))


@pytest.mark.parametrize("kernel", ["LINEAR", "RBF"])
@pytest.mark.parametrize("one_class", [0, 1])
def test_svm_regressor_vs_onnxruntime(kernel, one_class):
    m = model("SVMRegressor", [T("X", TensorProto.FLOAT, [None, 4])],
              [T("Y", TensorProto.FLOAT, [None, 1])], kernel_type=kernel,
              kernel_params=[0.2, 0.0, 3.0], n_supports=5,
              support_vectors=RNG.normal(size=20).tolist(),
              coefficients=RNG.normal(size=5).tolist(), rho=[0.25], one_class=one_class)
    ours, ref = both(m, {"X": X4})
    assert_same(ours, ref)


# --------------------------------------------------------------------------- trees

#: two small trees (tree 0: x0 <= 0 ? (x1 < 0.5 ? L : L) : L ; tree 1: x2 > 0 ? L : L)
TREE_NODES = dict(
    nodes_treeids=[0, 0, 0, 0, 0, 1, 1, 1],
    nodes_nodeids=[0, 1, 2, 3, 4, 0, 1, 2],
    nodes_featureids=[0, 1, 0, 0, 0, 2, 0, 0],
    nodes_modes=["BRANCH_LEQ", "BRANCH_LT", "LEAF", "LEAF", "LEAF", "BRANCH_GT", "LEAF",
                 "LEAF"],
    nodes_values=[0.0, 0.5, 0, 0, 0, 0.0, 0, 0],
    nodes_truenodeids=[1, 3, 0, 0, 0, 1, 0, 0],
    nodes_falsenodeids=[2, 4, 0, 0, 0, 2, 0, 0],
    nodes_missing_value_tracks_true=[1, 0, 0, 0, 0, 0, 0, 0],
)
LEAVES = [(0, 2), (0, 3), (0, 4), (1, 1), (1, 2)]


@pytest.mark.parametrize("agg", ["SUM", "AVERAGE", "MIN", "MAX"])
@pytest.mark.parametrize("as_tensor", [False, True])
def test_tree_regressor_vs_onnxruntime(agg, as_tensor):
    w = RNG.normal(size=2 * len(LEAVES))
    attrs = dict(TREE_NODES, n_targets=2, aggregate_function=agg,
                 target_treeids=[t for t, _ in LEAVES] * 2,
                 target_nodeids=[n for _, n in LEAVES] * 2,
                 target_ids=[0] * len(LEAVES) + [1] * len(LEAVES))
    if as_tensor:
        attrs["target_weights_as_tensor"] = helper.make_tensor("w", TensorProto.DOUBLE,
                                                               [w.size], w.tolist())
        attrs["base_values_as_tensor"] = helper.make_tensor("b", TensorProto.DOUBLE, [2],
                                                            [0.5, -0.5])
    else:
        attrs["target_weights"] = w.tolist()
        attrs["base_values"] = [0.5, -0.5]
    dtype = TensorProto.FLOAT
    if as_tensor:  # onnxruntime reads the double attributes with a double input
        dtype = TensorProto.DOUBLE
        vals = attrs.pop("nodes_values")
        attrs["nodes_values_as_tensor"] = helper.make_tensor("v", TensorProto.DOUBLE,
                                                             [len(vals)], vals)
    m = model("TreeEnsembleRegressor", [T("X", dtype, [None, 4])],
              [T("Y", TensorProto.FLOAT, [None, 2])], **attrs)
    x = X4.copy() if not as_tensor else X4.astype(np.float64)
    x[3, 0] = np.nan
    ours, ref = both(m, {"X": x})
    assert_same(ours, ref)


@pytest.mark.parametrize("post", ["NONE", "LOGISTIC", "SOFTMAX"])
@pytest.mark.parametrize("layout", ["binary-one-class-positive", "binary-one-class-margin",
                                    "binary-two-classes", "three-classes"])
def test_tree_classifier_vs_onnxruntime(post, layout):
    n = len(LEAVES)
    if layout.startswith("binary-one"):
        labels, ids = ["a", "b"], [1] * n
        w = RNG.random(n) if layout.endswith("positive") else RNG.normal(size=n)
        base = None
    elif layout == "binary-two-classes":
        labels, ids = ["a", "b"], [0] * n + [1] * n
        w = RNG.random(2 * n)
        base = [0.1, 0.2]
    else:
        labels, ids = ["a", "b", "c"], [0] * n + [1] * n + [2] * n
        w = RNG.random(3 * n)
        base = [0.0, 0.1, -0.1]
    reps = len(ids) // n
    attrs = dict(TREE_NODES, classlabels_strings=labels, class_ids=ids,
                 class_treeids=[t for t, _ in LEAVES] * reps,
                 class_nodeids=[nd for _, nd in LEAVES] * reps, class_weights=w.tolist(),
                 post_transform=post)
    if base:
        attrs["base_values"] = base
    m = model("TreeEnsembleClassifier", [T("X", TensorProto.FLOAT, [None, 4])],
              [T("Y", TensorProto.STRING, [None]), T("Z", TensorProto.FLOAT, [None, None])],
              **attrs)
    ours, ref = both(m, {"X": X4})
    assert_same(ours, ref)


def test_tree_ensemble_many_trees_matches_loop():
    """The vectorised traversal against a plain per-row walk on a random forest."""
    t, depth, f = 30, 5, 6
    tree_ids, node_ids, feats, modes, vals, tl, fl = [], [], [], [], [], [], []
    leaves = []
    for tree in range(t):
        for nd in range(2 ** (depth + 1) - 1):
            tree_ids.append(tree)
            node_ids.append(nd)
            if nd < 2 ** depth - 1:
                feats.append(int(RNG.integers(f)))
                modes.append("BRANCH_LEQ")
                vals.append(float(RNG.normal()))
                tl.append(2 * nd + 1)
                fl.append(2 * nd + 2)
            else:
                feats.append(0)
                modes.append("LEAF")
                vals.append(0.0)
                tl.append(0)
                fl.append(0)
                leaves.append((tree, nd))
    w = RNG.normal(size=len(leaves))
    m = model("TreeEnsembleRegressor", [T("X", TensorProto.FLOAT, [None, f])],
              [T("Y", TensorProto.FLOAT, [None, 1])], n_targets=1,
              nodes_treeids=tree_ids, nodes_nodeids=node_ids, nodes_featureids=feats,
              nodes_modes=modes, nodes_values=vals, nodes_truenodeids=tl,
              nodes_falsenodeids=fl, target_treeids=[a for a, _ in leaves],
              target_nodeids=[b for _, b in leaves], target_ids=[0] * len(leaves),
              target_weights=w.tolist())
    x = RNG.normal(size=(300, f)).astype(np.float32)
    ours = backend.prepare(m).run({"X": x})[0][:, 0]
    per = 2 ** (depth + 1) - 1
    wmap = {lf: wi for lf, wi in zip(leaves, w)}
    expect = np.zeros(len(x))
    for r in range(len(x)):
        for tree in range(t):
            nd = 0
            while modes[tree * per + nd] == "BRANCH_LEQ":
                i = tree * per + nd
                nd = tl[i] if x[r, feats[i]] <= np.float32(vals[i]) else fl[i]
            expect[r] += wmap[(tree, nd)]
    np.testing.assert_allclose(ours, expect, rtol=1e-5, atol=1e-5)


# --------------------------------------------------------------------------- preparation


def test_scaler_normalizer_imputer_binarizer_vs_onnxruntime():
    x = RNG.normal(size=(6, 3)).astype(np.float32)
    x[1, 2] = np.nan
    cases = [
        ("Scaler", dict(offset=[0.5, -1.0, 2.0], scale=[2.0, 0.5, 1.5]), TensorProto.FLOAT),
        ("Normalizer", dict(norm="L1"), TensorProto.FLOAT),
        ("Normalizer", dict(norm="L2"), TensorProto.FLOAT),
        ("Normalizer", dict(norm="MAX"), TensorProto.FLOAT),
        ("Imputer", dict(imputed_value_floats=[1.0, 2.0, 3.0],
                         replaced_value_float=float("nan")), TensorProto.FLOAT),
        ("Binarizer", dict(threshold=0.1), TensorProto.FLOAT),
    ]
    for op, attrs, out in cases:
        xin = x if op == "Imputer" else np.nan_to_num(x)
        m = model(op, [T("X", TensorProto.FLOAT, [None, 3])], [T("Y", out, [None, 3])],
                  **attrs)
        ours, ref = both(m, {"X": xin})
        assert_same(ours, ref)


def test_one_hot_category_mapper_feature_vectorizer_vs_onnxruntime():
    s = np.array([["a", "b"], ["c", "zz"]], dtype=object)
    m = model("OneHotEncoder", [T("X", TensorProto.STRING, [None, 2])],
              [T("Y", TensorProto.FLOAT, [None, 2, 3])], cats_strings=["a", "b", "c"])
    assert_same(*both(m, {"X": s}))
    m = model("OneHotEncoder", [T("X", TensorProto.INT64, [None, 2])],
              [T("Y", TensorProto.FLOAT, [None, 2, 3])], cats_int64s=[3, 1, 7])
    assert_same(*both(m, {"X": np.array([[1, 7], [5, 3]], np.int64)}))
    m = model("CategoryMapper", [T("X", TensorProto.STRING, [None])],
              [T("Y", TensorProto.INT64, [None])], cats_strings=["x", "y"],
              cats_int64s=[10, 20], default_int64=-3)
    assert_same(*both(m, {"X": np.array(["y", "q", "x"], dtype=object)}))
    m = model("CategoryMapper", [T("X", TensorProto.INT64, [None])],
              [T("Y", TensorProto.STRING, [None])], cats_strings=["x", "y"],
              cats_int64s=[10, 20])
    assert_same(*both(m, {"X": np.array([20, 5], np.int64)}))
    m = model("FeatureVectorizer", [T("A", TensorProto.FLOAT, [None, 2]),
                                    T("B", TensorProto.FLOAT, [None, 3])],
              [T("Y", TensorProto.FLOAT, [None, 4])], inputdimensions=[2, 2])
    assert_same(*both(m, {"A": X4[:5, :2], "B": np.arange(15, dtype=np.float32).reshape(5, 3)}))


def test_numpy_unicode_string_feeds_are_accepted():
    m = model("CategoryMapper", [T("X", TensorProto.STRING, [None])],
              [T("Y", TensorProto.INT64, [None])], cats_strings=["x", "y"], cats_int64s=[1, 2])
    y, = backend.prepare(m).run({"X": np.array(["y", "x", "?"])})
    assert y.tolist() == [2, 1, -1]


# --------------------------------------------------------------------------- value kinds


def _map_type(key, value):
    return helper.make_map_type_proto(key, helper.make_tensor_type_proto(value, None))


def test_dict_vectorizer_takes_a_dict_like_onnxruntime():
    inp = helper.make_value_info("X", _map_type(TensorProto.STRING, TensorProto.FLOAT))
    m = model("DictVectorizer", [inp], [T("Y", TensorProto.FLOAT, [1, 3])],
              string_vocabulary=["a", "b", "c"])
    feeds = {"X": {"c": 2.0, "a": 1.5}}
    assert_same(*both(m, feeds))
    rep = backend.prepare(m)
    np.testing.assert_array_equal(rep.run({"c": 2.0, "a": 1.5})[0], [[1.5, 0, 2.0]])


def test_cast_map_dense_and_sparse_vs_onnxruntime():
    inp = helper.make_value_info("X", _map_type(TensorProto.INT64, TensorProto.FLOAT))
    for attrs, out in ((dict(cast_to="TO_FLOAT"), TensorProto.FLOAT),
                       (dict(cast_to="TO_INT64", map_form="SPARSE", max_map=6),
                        TensorProto.INT64)):
        m = model("CastMap", [inp], [T("Y", out, [1, None])], **attrs)
        assert_same(*both(m, {"X": {4: 2.5, 1: 7.0, 2: -1.0}}))


def test_zipmap_returns_a_list_of_dicts_like_onnxruntime():
    seq = helper.make_sequence_type_proto(_map_type(TensorProto.STRING, TensorProto.FLOAT))
    m = model("ZipMap", [T("X", TensorProto.FLOAT, [None, 3])],
              [helper.make_value_info("Z", seq)], classlabels_strings=["x", "y", "z"])
    ours, ref = both(m, {"X": X4[:4, :3]})
    assert isinstance(ours[0], list) and isinstance(ours[0][0], dict)
    assert_same(ours, ref)
    seq = helper.make_sequence_type_proto(_map_type(TensorProto.INT64, TensorProto.FLOAT))
    m = model("ZipMap", [T("X", TensorProto.FLOAT, [None, 2])],
              [helper.make_value_info("Z", seq)], classlabels_int64s=[3, 8])
    ours, ref = both(m, {"X": X4[:2, :2]})
    assert list(ours[0][0]) == [3, 8]
    assert_same(ours, ref)


# --------------------------------------------------------------------------- errors


def test_wrong_map_key_type_is_a_clear_error():
    inp = helper.make_value_info("X", _map_type(TensorProto.STRING, TensorProto.FLOAT))
    m = model("DictVectorizer", [inp], [T("Y", TensorProto.FLOAT, [1, 2])],
              string_vocabulary=["a", "b"])
    rep = backend.prepare(m)
    with pytest.raises(InputError, match=r"input 'X'.*map key 3 is a int.*map\(string, "
                                         r"tensor\(float\)\)"):
        rep.run({"X": {3: 1.0}})
    with pytest.raises(InputError, match="must be a map"):
        rep.run({"X": np.zeros(2, np.float32)})


def test_unknown_category_names_node_and_op():
    m = model("OneHotEncoder", [T("X", TensorProto.STRING, [None])],
              [T("Y", TensorProto.FLOAT, [None, 2])], cats_strings=["a", "b"], zeros=0)
    with pytest.raises(WorkbenchError, match=r"node 'my_onehotencoder' \(OneHotEncoder\).*"
                                             r"unknown category 'q'"):
        backend.prepare(m).run({"X": np.array(["a", "q"], dtype=object)})


def test_bad_feature_count_names_node():
    m = model("LinearRegressor", [T("X", TensorProto.FLOAT, [None, None])],
              [T("Y", TensorProto.FLOAT, [None, 1])], coefficients=[1.0, 2.0])
    with pytest.raises(WorkbenchError, match=r"node 'my_linearregressor'.*3 features.*for 2"):
        backend.prepare(m).run({"X": np.zeros((2, 3), np.float32)})


def test_every_ml_operator_version_has_a_kernel():
    from workbench.ops.registry import has_kernel
    missing = []
    for s in onnx.defs.get_all_schemas_with_history():
        if s.domain == ML and not has_kernel(s.name, ML, s.since_version):
            missing.append((s.name, s.since_version))
    assert not missing


@pytest.mark.parametrize("agg", [0, 1, 2, 3])
@pytest.mark.parametrize("post", [0, 1, 2, 3])
def test_tree_ensemble_opset5_vs_onnxruntime(agg, post):
    """TreeEnsemble (ai.onnx.ml 5): every branch mode including set membership, NaN tracks,
    two trees, two targets."""
    # tree 0: node0 x0 <= 0.2 ? node1 : node2 ; node1 x1 in {1, 3} ? leaf0 : leaf1 ;
    #         node2 x2 != 0.5 ? leaf2 : leaf3 ; tree 1: node3 x3 > -0.1 ? leaf4 : node4 ;
    #         node4 x0 == 1 ? leaf5 : leaf6
    attrs = dict(
        tree_roots=[0, 3], nodes_featureids=[0, 1, 2, 3, 0],
        nodes_modes=helper.make_tensor("m", TensorProto.UINT8, [5], [0, 6, 5, 3, 4]),
        nodes_splits=helper.make_tensor("s", TensorProto.FLOAT, [5], [0.2, 0, 0.5, -0.1, 1]),
        nodes_truenodeids=[1, 0, 2, 4, 5], nodes_trueleafs=[0, 1, 1, 1, 1],
        nodes_falsenodeids=[2, 1, 3, 4, 6], nodes_falseleafs=[0, 1, 1, 0, 1],
        nodes_missing_value_tracks_true=[1, 0, 0, 1, 0],
        membership_values=helper.make_tensor("mv", TensorProto.FLOAT, [3],
                                             [1.0, 3.0, float("nan")]),
        leaf_targetids=[0, 1, 0, 1, 0, 1, 1],
        leaf_weights=helper.make_tensor("w", TensorProto.FLOAT, [7],
                                        RNG.normal(size=7).tolist()),
        n_targets=2, aggregate_function=agg, post_transform=post)
    m = model("TreeEnsemble", [T("X", TensorProto.FLOAT, [None, 4])],
              [T("Y", TensorProto.FLOAT, [None, 2])], ml_opset=5, **attrs)
    x = np.round(RNG.normal(size=(40, 4)) * 2, 0).astype(np.float32)
    x[::7, 0] = np.nan
    x[::5, 3] = np.nan
    x[::3, 2] = 0.5
    ours = backend.prepare(m).run({"X": x})
    # onnxruntime (1.2x-1.32) reads post_transform 1 as LOGISTIC and 2 as SOFTMAX (its own
    # enum), the schema says 1 = SOFTMAX, 2 = LOGISTIC: the workbench follows the schema, so
    # onnxruntime is given the other code for the same transform
    attrs["post_transform"] = {1: 2, 2: 1}.get(post, post)
    m_ort = model("TreeEnsemble", [T("X", TensorProto.FLOAT, [None, 4])],
                  [T("Y", TensorProto.FLOAT, [None, 2])], ml_opset=5, **attrs)
    sess = ort.InferenceSession(m_ort.SerializeToString(), providers=["CPUExecutionProvider"])
    assert_same(list(ours), sess.run(None, {"X": x}))


@pytest.mark.parametrize("agg", ["SUM", "AVERAGE", "MIN", "MAX"])
def test_tree_aggregation_without_dense_tables(agg, monkeypatch):
    """Large ensembles (nodes x targets above Forest.DENSE_MAX) aggregate with a bincount /
    ufunc.at over (row, target) instead of dense leaf tables: same results."""
    from workbench.ops import ml_trees
    w = RNG.normal(size=2 * len(LEAVES))
    attrs = dict(TREE_NODES, n_targets=2, aggregate_function=agg, target_weights=w.tolist(),
                 target_treeids=[t for t, _ in LEAVES] * 2,
                 target_nodeids=[n for _, n in LEAVES] * 2,
                 target_ids=[0] * len(LEAVES) + [1] * len(LEAVES))
    m = model("TreeEnsembleRegressor", [T("X", TensorProto.FLOAT, [None, 4])],
              [T("Y", TensorProto.FLOAT, [None, 2])], **attrs)
    dense = backend.prepare(m).run({"X": X4})[0]
    monkeypatch.setattr(ml_trees.Forest, "DENSE_MAX", 0)
    sparse = backend.prepare(m).run({"X": X4})[0]
    np.testing.assert_array_equal(dense, sparse)
