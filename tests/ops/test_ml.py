"""ai.onnx.ml kernels: ArrayFeatureExtractor, Binarizer, LabelEncoder, TreeEnsemble."""

from __future__ import annotations

import math

import numpy as np
import pytest

from workbench.errors import InputError, ShapeError
from workbench.ops.registry import attribute_defaults, lookup

ML = "ai.onnx.ml"


def run(op, *inputs, opset=5, **attrs):
    entry = lookup(op, ML, opset)
    kw = dict(attribute_defaults(op, ML, opset))
    kw.update(attrs)
    return entry.fn(*inputs, **kw)


def S(*values):
    a = np.empty(len(values), dtype=object)
    a[:] = list(values)
    return a


# ----------------------------------------------------------------- ArrayFeatureExtractor


def test_array_feature_extractor_last_axis():
    x = np.arange(24, dtype=np.float32).reshape(2, 3, 4)
    z = run("ArrayFeatureExtractor", x, np.array([[3, 0]], np.int64), opset=1)
    np.testing.assert_array_equal(z, x[..., [3, 0]])
    z = run("ArrayFeatureExtractor", S("a", "b", "c"), np.array([2]), opset=1)
    assert z.shape == (1, 1) and z.tolist() == [["c"]]
    with pytest.raises(InputError, match="out of range"):
        run("ArrayFeatureExtractor", x, np.array([4]), opset=1)


def test_binarizer_keeps_dtype():
    y = run("Binarizer", np.array([-1, 0, 1, 2], np.int64), opset=1, threshold=0.5)
    assert y.dtype == np.int64 and y.tolist() == [0, 0, 1, 1]
    y = run("Binarizer", np.array([0.0, 0.1], np.float64), opset=1)
    assert y.dtype == np.float64 and y.tolist() == [0, 1]


# --------------------------------------------------------------------------- LabelEncoder


def test_label_encoder_opset1_both_directions():
    classes = ["a", "b", "c"]
    y = run("LabelEncoder", S("b", "z"), opset=1, classes_strings=classes, default_int64=-7)
    assert y.dtype == np.int64 and y.tolist() == [1, -7]
    y = run("LabelEncoder", np.array([[2, 5]], np.int64), opset=1, classes_strings=classes)
    assert y.dtype == object and y.tolist() == [["c", "_Unused"]]


def test_label_encoder_float_keys_with_nan_to_strings():
    x = np.array([1.5, np.nan, 2.0, 7.0], np.float32)
    y = run("LabelEncoder", x, opset=2, keys_floats=[2.0, 1.5, float("nan")],
            values_strings=["two", "one-and-half", "missing"], default_string="?")
    assert y.dtype == object and y.tolist() == ["one-and-half", "missing", "two", "?"]


def test_label_encoder_int_to_float_default():
    y = run("LabelEncoder", np.array([[3, 4], [9, 3]], np.int64), opset=2, keys_int64s=[3, 4],
            values_floats=[0.5, 1.5])
    assert y.dtype == np.float32 and y.shape == (2, 2)
    assert y.tolist() == [[0.5, 1.5], [-0.0, 0.5]]


def test_label_encoder_tensors_opset4():
    y = run("LabelEncoder", np.array([10, 20, 30], np.int32), opset=4,
            keys_tensor=np.array([10, 30], np.int32),
            values_tensor=np.array([1.25, 2.5], np.float64),
            default_tensor=np.array([9.0], np.float64))
    assert y.dtype == np.float64 and y.tolist() == [1.25, 9.0, 2.5]
    y = run("LabelEncoder", S("x", "q"), opset=4, keys_strings=["x"],
            values_tensor=np.array([5], np.int16))
    assert y.dtype == np.int16 and y.tolist() == [5, -1]


def test_label_encoder_needs_one_key_and_value_set():
    with pytest.raises(InputError, match="exactly one"):
        run("LabelEncoder", S("a"), opset=2, keys_strings=["a"])


# --------------------------------------------------------------------------- TreeEnsemble

# tree 0: x0 <= 0.5 ? (x1 < 2 ? leaf0 : leaf1) : leaf2 ; tree 1: single leaf3
TREES = dict(
    tree_roots=[0, 2],
    nodes_featureids=[0, 1, 0],
    nodes_modes=np.array([0, 1, 0], np.uint8),
    nodes_splits=np.array([0.5, 2.0, 0.0], np.float32),
    nodes_truenodeids=[1, 0, 3],
    nodes_trueleafs=[0, 1, 1],
    nodes_falsenodeids=[2, 1, 3],
    nodes_falseleafs=[1, 1, 1],
    leaf_targetids=[0, 1, 0, 1],
    leaf_weights=np.array([1.0, 2.0, 3.0, 10.0], np.float32),
    n_targets=2,
)
XT = np.array([[0.0, 1.0], [0.0, 5.0], [1.0, 0.0], [np.nan, 0.0]], np.float32)


def test_tree_ensemble_sum_and_average():
    y = run("TreeEnsemble", XT, **TREES)
    assert y.dtype == np.float32
    np.testing.assert_array_equal(y, [[1, 10], [0, 12], [3, 10], [3, 10]])
    y = run("TreeEnsemble", XT, aggregate_function=0, **TREES)
    np.testing.assert_array_equal(y, np.array([[1, 10], [0, 12], [3, 10], [3, 10]]) / 2)


def test_tree_ensemble_min_max_missing_targets_are_zero():
    y = run("TreeEnsemble", XT, aggregate_function=2, **{**TREES, "tree_roots": [0]})
    np.testing.assert_array_equal(y, [[1, 0], [0, 2], [3, 0], [3, 0]])
    y = run("TreeEnsemble", XT, aggregate_function=3, **TREES)
    np.testing.assert_array_equal(y, [[1, 10], [0, 10], [3, 10], [3, 10]])


def test_tree_ensemble_nan_tracks_true():
    y = run("TreeEnsemble", XT[3:], nodes_missing_value_tracks_true=[1, 0, 0], **TREES)
    np.testing.assert_array_equal(y, [[1, 10]])  # NaN goes left, then 0 < 2 -> leaf0


def test_tree_ensemble_modes_and_membership():
    base = dict(tree_roots=[0], nodes_featureids=[0], nodes_truenodeids=[0],
                nodes_trueleafs=[1], nodes_falsenodeids=[1], nodes_falseleafs=[1],
                leaf_targetids=[0, 0], leaf_weights=np.array([1.0, 0.0]), n_targets=1)
    x = np.array([[1.0], [2.0], [3.0]])
    expect = {0: [1, 1, 0], 1: [1, 0, 0], 2: [0, 1, 1], 3: [0, 0, 1], 4: [0, 1, 0],
              5: [1, 0, 1]}
    for mode, exp in expect.items():
        y = run("TreeEnsemble", x, nodes_modes=np.array([mode], np.uint8),
                nodes_splits=np.array([2.0]), **base)
        assert y[:, 0].tolist() == exp, mode
    y = run("TreeEnsemble", x, nodes_modes=np.array([6], np.uint8),
            nodes_splits=np.array([0.0]), membership_values=np.array([3.0, 1.0, np.nan]),
            **base)
    assert y[:, 0].tolist() == [1, 0, 1] and y.dtype == np.float64


def test_tree_ensemble_post_transforms():
    raw = run("TreeEnsemble", XT, **TREES).astype(np.float64)
    soft = run("TreeEnsemble", XT, post_transform=1, **TREES)
    e = np.exp(raw - raw.max(1, keepdims=True))
    np.testing.assert_allclose(soft, e / e.sum(1, keepdims=True), rtol=1e-6)
    logi = run("TreeEnsemble", XT, post_transform=2, **TREES)
    np.testing.assert_allclose(logi, 1 / (1 + np.exp(-raw)), rtol=1e-6)
    sz = run("TreeEnsemble", XT, post_transform=3, **TREES)
    assert sz[1, 0] == 0 and np.isclose(sz[1, 1], 1.0)
    probs = np.array([[0.1], [0.5], [0.975]])
    leaf = dict(tree_roots=[0], nodes_featureids=[0], nodes_modes=np.array([0], np.uint8),
                nodes_splits=np.array([0.0]), nodes_truenodeids=[0], nodes_trueleafs=[1],
                nodes_falsenodeids=[0], nodes_falseleafs=[1], leaf_targetids=[0], n_targets=1)
    for p in probs[:, 0]:
        y = run("TreeEnsemble", np.zeros((1, 1)), post_transform=4,
                leaf_weights=np.array([p]), **leaf)
        # probit(p) = sqrt(2) * erfinv(2p - 1): check through erf
        assert math.isclose(0.5 * (1 + math.erf(y[0, 0] / math.sqrt(2))), p, rel_tol=1e-9)


def test_tree_ensemble_errors():
    with pytest.raises(InputError, match="required attributes"):
        run("TreeEnsemble", XT, n_targets=1)
    with pytest.raises(ShapeError, match="2-D"):
        run("TreeEnsemble", XT[0], **TREES)
    with pytest.raises(ShapeError, match="feature"):
        run("TreeEnsemble", XT[:, :1], **TREES)
