"""Loss kernels: NegativeLogLikelihoodLoss and SoftmaxCrossEntropyLoss."""

from __future__ import annotations

import numpy as np
import pytest

from workbench.arrays import cupy_module, to_numpy
from workbench.errors import InputError, ShapeError
from workbench.ops.registry import NodeContext, attribute_defaults, lookup


@pytest.fixture(params=["numpy", "cupy"])
def xp(request):
    """The array module the kernels run on (cupy only where it is installed)."""
    if request.param == "numpy":
        return np
    cp = cupy_module()
    if cp is None:
        pytest.skip("cupy is not installed")
    return cp


def run(op, *inputs, opset=22, n_outputs=1, **attrs):
    entry = lookup(op, "", opset)
    kw = dict(attribute_defaults(op, "", opset))
    kw.update(attrs)
    if entry.wants_ctx:
        kw["ctx"] = NodeContext("n", op, opset, n_outputs)
    return entry.fn(*inputs, **kw)


def nll_reference(logp, target, weight, reduction, ignore_index):
    """Loop form of the spec: loss = -logp[n, c, d...] * weight[c], ignored -> 0."""
    n, c = logp.shape[:2]
    lp = logp.reshape(n, c, -1)
    t = target.reshape(n, -1)
    loss = np.zeros(t.shape)
    wsum = 0.0
    for i in range(n):
        for d in range(t.shape[1]):
            k = t[i, d]
            if ignore_index is not None and k == ignore_index:
                continue
            w = 1.0 if weight is None else weight[k]
            loss[i, d] = -lp[i, k, d] * w
            wsum += w
    loss = loss.reshape(target.shape)
    if reduction == "none":
        return loss
    if reduction == "sum":
        return loss.sum()
    return loss.sum() / wsum


def log_softmax(x):
    m = x.max(axis=1, keepdims=True)
    return x - m - np.log(np.exp(x - m).sum(axis=1, keepdims=True))


@pytest.mark.parametrize("op", ["NegativeLogLikelihoodLoss", "SoftmaxCrossEntropyLoss"])
def test_every_opset_from_12_has_a_kernel(op):
    for opset in range(12, 29):
        assert lookup(op, "", opset) is not None


CASES = [
    ((3, 5), (3,)),
    ((2, 4, 3), (2, 3)),
    ((2, 3, 2, 4, 2), (2, 2, 4, 2)),
]


@pytest.mark.parametrize("shape, tshape", CASES)
@pytest.mark.parametrize("reduction", ["none", "sum", "mean"])
@pytest.mark.parametrize("weighted", [False, True])
@pytest.mark.parametrize("ignore_index", [None, 1, -5])
def test_nll_matches_the_spec_loop(xp, shape, tshape, reduction, weighted, ignore_index):
    rng = np.random.default_rng(5)
    logp = rng.normal(size=shape).astype(np.float32)
    target = rng.integers(0, shape[1], tshape).astype(np.int64)
    if ignore_index is not None:
        target.reshape(-1)[::3] = ignore_index
    weight = rng.uniform(0.1, 1.0, shape[1]).astype(np.float32) if weighted else None
    got = run("NegativeLogLikelihoodLoss", xp.asarray(logp), xp.asarray(target),
              None if weight is None else xp.asarray(weight), reduction=reduction,
              ignore_index=ignore_index)
    want = nll_reference(logp.astype(np.float64), target, weight, reduction, ignore_index)
    assert got.dtype == np.float32 and got.shape == np.shape(want)
    np.testing.assert_allclose(to_numpy(got), want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("shape, tshape", CASES)
@pytest.mark.parametrize("reduction", ["none", "sum", "mean"])
def test_softmax_cross_entropy_and_log_prob(xp, shape, tshape, reduction):
    rng = np.random.default_rng(6)
    scores = rng.normal(size=shape).astype(np.float64)
    labels = rng.integers(0, shape[1], tshape).astype(np.int32)
    weights = rng.uniform(0.1, 1.0, shape[1])
    loss, logp = run("SoftmaxCrossEntropyLoss", xp.asarray(scores), xp.asarray(labels),
                     xp.asarray(weights), reduction=reduction, n_outputs=2, opset=13)
    want_logp = log_softmax(scores)
    np.testing.assert_allclose(to_numpy(logp), want_logp, rtol=1e-10)
    np.testing.assert_allclose(to_numpy(loss), nll_reference(want_logp, labels, weights,
                                                             reduction, None), rtol=1e-10)
    single = run("SoftmaxCrossEntropyLoss", xp.asarray(scores), xp.asarray(labels),
                 reduction=reduction)
    assert not isinstance(single, tuple) and single.dtype == np.float64


def test_softmax_cross_entropy_is_stable_and_keeps_float16():
    scores = np.array([[1000.0, 0.0], [0.0, -1000.0]], np.float16)
    loss = run("SoftmaxCrossEntropyLoss", scores, np.array([0, 0]), reduction="none")
    assert loss.dtype == np.float16 and np.isfinite(loss).all()


def test_loss_errors():
    with pytest.raises(InputError, match="out of range"):
        run("NegativeLogLikelihoodLoss", np.zeros((2, 3)), np.array([0, 3]))
    with pytest.raises(ShapeError, match="labels shape"):
        run("NegativeLogLikelihoodLoss", np.zeros((2, 3)), np.array([0, 1, 2]))
    with pytest.raises(InputError, match="reduction"):
        run("NegativeLogLikelihoodLoss", np.zeros((2, 3)), np.array([0, 1]), reduction="avg")
    with pytest.raises(ShapeError, match="weights"):
        run("SoftmaxCrossEntropyLoss", np.zeros((2, 3)), np.array([0, 1]), np.ones(2))


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_softmax_cross_entropy_mean_fast_paths_keep_the_general_bits(dtype):
    """The usual training loss (mean, no weights, no ignore_index; 2-D scores) takes short
    ways in the kernel (one fancy index for take_along_axis) and in its gradient rule (no
    one-hot matrix, no weights of ones): the same bits as the general paths, reached here by
    class weights of ones, an ignore_index no label has and a trailing axis of 1."""
    from workbench.autodiff.rules import GradContext, rule_for
    rng = np.random.default_rng(5)
    rule = rule_for("SoftmaxCrossEntropyLoss")
    ctx = GradContext("SoftmaxCrossEntropyLoss", 13, (True, False, False), np)
    for n, c, scale in ((8, 3, 1.0), (1, 1, 1.0), (5, 7, 1e4), (33, 10, 30.0)):
        x = (rng.standard_normal((n, c)) * scale).astype(dtype)
        x[0, 0] = -np.inf if n > 1 else x[0, 0]     # a probability of exactly 0: -0.0 terms
        lab = rng.integers(0, c, n)
        fast = run("SoftmaxCrossEntropyLoss", x, lab, reduction="mean")
        ones = np.ones(c, dtype)
        for general in (run("SoftmaxCrossEntropyLoss", x, lab, ones, reduction="mean"),
                        run("SoftmaxCrossEntropyLoss", x, lab, reduction="mean",
                            ignore_index=-100),
                        run("SoftmaxCrossEntropyLoss", x[..., None], lab[:, None],
                            reduction="mean")):
            assert general.tobytes() == fast.tobytes()
        for g in (np.array(1.0, dtype), np.array(-0.0, dtype), np.array(-2.5, dtype)):
            got = rule(ctx, [g], [x, lab], [fast], reduction="mean")[0]
            want = rule(ctx, [g], [x, lab, ones], [fast], reduction="mean")[0]
            assert got.tobytes() == want.tobytes()
            want = rule(ctx, [g], [x, lab], [fast], reduction="mean", ignore_index=-100)[0]
            assert got.tobytes() == want.tobytes()


def test_label_range_checks_small_and_large_label_arrays():
    from workbench.ops.loss import label_range
    for size in (3, 256, 257, 5000):
        lab = np.arange(size) % 7
        assert label_range(lab) == (0, min(6, size - 1))
        lab[size // 2] = 9
        with pytest.raises(InputError, match="label 9 is out of range"):
            run("SoftmaxCrossEntropyLoss", np.zeros((size, 7), np.float32), lab)
        lab[size // 2] = -3
        assert label_range(lab.astype(np.int32))[0] == -3
