"""The compiled tree traversal (workbench/compiled/kernels/trees.py, used by
``workbench.ops.ml_trees.Forest.leaves``) against the numpy path: every comparison mode,
missing values with and without their true-branch track, float64 thresholds, thresholds
equal to the feature values, odd sizes, no rows, threads, and the cases left to numpy."""

from __future__ import annotations

import numpy as np
import pytest

from workbench import compiled
from workbench.compiled import image
from workbench.errors import InputError
from workbench.ops import ml_trees
from workbench.ops.ml_trees import Forest

pytestmark = pytest.mark.skipif(image.supported() is not None,
                                reason=f"compiled kernels: {image.supported()}")


@pytest.fixture(scope="module", autouse=True)
def trees_module():
    if not compiled.wait(["trees"], timeout=900) or \
            compiled.kernel("trees.leaves_f32") is None:
        pytest.skip(f"kernel module trees is not available: {compiled.status()}")


def random_forest(seed, trees=7, depth=6, features=5, modes=(ml_trees.LEQ,), track=0.3,
                  f64=False):
    """A forest of complete binary trees (nodes in a shuffled order), random features,
    thresholds, modes and NaN tracks."""
    rng = np.random.default_rng(seed)
    feat, thr, mode, tn, fn, trk, roots = [], [], [], [], [], [], []
    for _ in range(trees):
        n_nodes = 2 ** (depth + 1) - 1
        base = len(mode)
        roots.append(base)
        for i in range(n_nodes):
            leaf = i >= 2 ** depth - 1
            feat.append(0 if leaf else int(rng.integers(features)))
            v = rng.normal()
            thr.append(0.0 if leaf else (v + 1e-9 if f64 else float(np.float32(v))))
            mode.append(LEAF_CODE if leaf else int(rng.choice(modes)))
            tn.append(base + (i if leaf else 2 * i + 1))
            fn.append(base + (i if leaf else 2 * i + 2))
            trk.append(not leaf and rng.random() < track)
    g = len(mode)
    perm = rng.permutation(g)           # nodes stored in any order
    inv = np.argsort(perm)
    pick = lambda a: np.asarray(a)[perm]  # noqa: E731
    return Forest(pick(feat).astype(np.int64), pick(thr).astype(np.float64),
                  pick(mode).astype(np.int8), inv[pick(tn)].astype(np.int64),
                  inv[pick(fn)].astype(np.int64), pick(trk).astype(bool) if track else None,
                  inv[np.asarray(roots)].astype(np.int64), np.zeros(g, np.int64),
                  np.zeros(g, np.int64), np.zeros(0, np.int64), np.zeros(0), n_outputs=1)


LEAF_CODE = ml_trees.LEAF
ALL_MODES = (ml_trees.LEQ, ml_trees.LT, ml_trees.GTE, ml_trees.GT, ml_trees.EQ, ml_trees.NEQ)


def both_paths(forest, x):
    with compiled.disabled():
        want = forest.leaves(x, "T")
    calls = []
    real = forest._leaves_compiled

    def spy(*a):
        out = real(*a)
        calls.append(out is not None)
        return out
    forest._leaves_compiled = spy
    got = forest.leaves(x, "T")
    return got, want, calls


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("modes", [(ml_trees.LEQ,), ALL_MODES])
@pytest.mark.parametrize("f64", [False, True])
def test_compiled_leaves_match_numpy(seed, modes, f64):
    forest = random_forest(seed, modes=modes, f64=f64)
    rng = np.random.default_rng(100 + seed)
    x = rng.normal(size=(37, 5)).astype(np.float64 if f64 else np.float32)
    x[rng.random(x.shape) < 0.1] = np.nan                   # missing values
    thr = forest.threshold[forest.mode != LEAF_CODE]
    x[::5, 0] = thr[0]                                       # values equal to a threshold
    x[1::7, 1] = np.inf
    got, want, calls = both_paths(forest, x)
    assert calls == [True], "the compiled traversal did not run"
    np.testing.assert_array_equal(got, want)


def test_float32_input_with_thresholds_not_exact_in_float32_uses_float64():
    forest = random_forest(1, f64=True)
    x = np.random.default_rng(2).normal(size=(9, 5)).astype(np.float32)
    got, want, calls = both_paths(forest, x)
    assert calls == [True] and forest._thr32 is None
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("rows", [0, 1, 3])
def test_odd_sizes_and_threads(rows, monkeypatch):
    monkeypatch.setenv("WORKBENCH_NUM_THREADS", "2")
    forest = random_forest(3, trees=41, depth=3)
    x = np.random.default_rng(rows).normal(size=(rows, 5)).astype(np.float32)
    got, want, _ = both_paths(forest, x)
    assert got.shape == (rows, 41)
    np.testing.assert_array_equal(got, want)


def test_member_nodes_stay_on_numpy():
    forest = random_forest(0)
    node = int(np.flatnonzero(forest.mode != LEAF_CODE)[0])
    forest.mode[node] = ml_trees.MEMBER
    forest.members = {node: np.asarray([0.5, 1.5])}
    x = np.random.default_rng(0).normal(size=(6, 5)).astype(np.float32)
    _, _, calls = both_paths(forest, x)
    assert calls == [False]


def test_a_cycle_is_an_error_on_both_paths():
    forest = random_forest(0, trees=1, depth=2, track=0)
    root = int(forest.roots[0])
    forest.true_next[root] = forest.false_next[root] = root    # the root points to itself
    x = np.zeros((2, 5), np.float32)
    with pytest.raises(InputError, match="cycle"):
        forest.leaves(x, "T")
    with compiled.disabled(), pytest.raises(InputError, match="cycle"):
        forest.leaves(x, "T")


def test_a_model_runs_the_same_with_and_without_compiled_kernels():
    pytest.importorskip("skl2onnx")
    from skl2onnx import to_onnx
    from sklearn.ensemble import RandomForestClassifier

    import workbench.backend as backend

    rng = np.random.default_rng(0)
    X = rng.normal(size=(200, 4)).astype(np.float32)
    est = RandomForestClassifier(n_estimators=5, max_depth=5, random_state=0).fit(
        X, (X[:, 0] > X[:, 1]).astype(np.int64))
    m = to_onnx(est, X[:1], options={id(est): {"zipmap": False}})
    X[::4, 2] = np.nan
    a = backend.prepare(m).run(X)
    with compiled.disabled():
        b = backend.prepare(m).run(X)
    np.testing.assert_array_equal(a[0], b[0])
    np.testing.assert_array_equal(a[1], b[1])


def with_pairs(forest, seed, k=3):
    """The forest with 0-3 (target, weight) pairs per leaf (a target may repeat in a leaf)."""
    rng = np.random.default_rng(seed)
    g = forest.mode.size
    count = np.where(forest.mode == LEAF_CODE, rng.integers(0, 4, g), 0).astype(np.int64)
    forest.leaf_count = count
    forest.leaf_start = np.cumsum(count) - count
    forest.targets = rng.integers(0, k, int(count.sum())).astype(np.int64)
    forest.weights = rng.normal(size=int(count.sum()))
    forest.n_outputs = k
    return forest


def both_evaluations(forest, x, how):
    with compiled.disabled():
        want = forest.evaluate(x, how, "T", need_hits=True)
    calls = []
    real = forest._sum_compiled

    def spy(*a):
        out = real(*a)
        calls.append(out is not None)
        return out
    forest._sum_compiled = spy
    got = forest.evaluate(x, how, "T", need_hits=True)
    return got, want, calls


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("how", ["SUM", "AVERAGE"])
@pytest.mark.parametrize("f64", [False, True])
def test_fused_sums_match_the_numpy_aggregation(seed, how, f64, monkeypatch):
    monkeypatch.setenv("WORKBENCH_NUM_THREADS", "2")
    forest = with_pairs(random_forest(seed, trees=9, modes=ALL_MODES, f64=f64), seed)
    x = np.random.default_rng(seed).normal(size=(23, 5)).astype(np.float32)
    x[::3, 1] = np.nan
    (s, h), (s0, h0), calls = both_evaluations(forest, x, how)
    assert calls == [True], "the compiled sums did not run"
    np.testing.assert_allclose(s, s0, rtol=1e-12, atol=1e-12)
    np.testing.assert_array_equal(h, h0)


def test_fused_sums_without_the_dense_tables(monkeypatch):
    """Above DENSE_MAX the numpy path aggregates with bincount: the same sums."""
    monkeypatch.setattr(Forest, "DENSE_MAX", 1)
    forest = with_pairs(random_forest(5, trees=6), 5)
    x = np.random.default_rng(5).normal(size=(11, 5)).astype(np.float32)
    (s, h), (s0, h0), calls = both_evaluations(forest, x, "SUM")
    assert calls == [True]
    np.testing.assert_allclose(s, s0, rtol=1e-12, atol=1e-12)
    np.testing.assert_array_equal(h, h0)


def test_min_max_and_members_keep_the_numpy_aggregation():
    forest = with_pairs(random_forest(1), 1)
    x = np.random.default_rng(1).normal(size=(4, 5)).astype(np.float32)
    for how in ("MIN", "MAX"):
        _, _, calls = both_evaluations(forest, x, how)
        assert calls == []
    node = int(np.flatnonzero(forest.mode != LEAF_CODE)[0])
    forest.mode[node] = ml_trees.MEMBER
    forest.members = {node: np.asarray([0.5])}
    forest._child = None                                    # tables made again
    _, _, calls = both_evaluations(forest, x, "SUM")
    assert calls == [False]


def test_fused_sums_name_a_cycle():
    forest = with_pairs(random_forest(0, trees=1, depth=2, track=0), 0)
    root = int(forest.roots[0])
    forest.true_next[root] = forest.false_next[root] = root
    with pytest.raises(InputError, match="cycle"):
        forest.evaluate(np.zeros((3, 5), np.float32), "SUM", "T")
