"""``wgrad_avx2.scatter_rows`` (the embedding gradient's scatter-add in C) against numpy's
``np.add.at`` (the reference: the same float32 sums in the same order), and the Gather
gradient through it against the numpy paths (``compiled.disabled()``)."""

from __future__ import annotations

import numpy as np
import pytest

from workbench import compiled
from workbench.autodiff.rules import GradContext, rule_for
from workbench.autodiff.rules import shape as gshape

RNG = np.random.default_rng(23)


@pytest.fixture
def scatter():
    why = compiled.c_unavailable("wgrad_avx2")
    if why:
        pytest.skip(why)
    if not compiled.wait(["wgrad_avx2"], timeout=300):
        pytest.skip(f"wgrad_avx2 is not available: {compiled.status()['modules']}")
    return compiled.kernel("wgrad_avx2.scatter_rows")


@pytest.mark.parametrize("rows,tail,n,distinct", [
    (1000, (64,), 256, 1000),   # word embeddings: a few repeats
    (2, (64,), 256, 2),         # segment ids: long runs of one index
    (64, (64,), 32, 64),        # positions: unique
    (7, (3, 5), 40, 3),         # rows of several dimensions
    (5, (), 9, 5),              # scalar rows
    (3, (4,), 0, 3),            # nothing to add
])
def test_scatter_rows_is_add_at(scatter, rows, tail, n, distinct):
    idx = RNG.integers(0, distinct, n)
    v = RNG.standard_normal((n,) + tail).astype(np.float32)
    if v.size:
        v.flat[::7] = -0.0          # a -0.0 sum becomes 0.0 (add.at adds to the zeros)
        v.flat[5::11] = np.inf
        v.flat[3::13] = np.nan
    for index, values in ((idx, v), (idx.astype(np.int32), np.asfortranarray(v))):
        want = np.zeros((rows,) + tail, np.float32)
        np.add.at(want, index, values)
        got = np.zeros((rows,) + tail, np.float32)
        assert gshape._scatter_rows_c(got, index, values)
        assert got.tobytes() == want.tobytes()


def test_scatter_rows_refuses_what_it_cannot_do(scatter):
    t = np.zeros((5, 4), np.float32)
    for idx in ([0, 5], [-1]):   # outside [0, rows): nothing written, numpy's path takes it
        assert not gshape._scatter_rows_c(t, np.array(idx), np.ones((len(idx), 4), np.float32))
        assert not t.any()
    with pytest.raises(IndexError):
        gshape._scatter_rows(t, np.array([0, 5]), np.ones((2, 4), np.float32))
    gshape._scatter_rows(t, np.array([-1]), np.ones((1, 4), np.float32))   # numpy's wrap
    assert t[4].tolist() == [1.0] * 4 and not t[:4].any()
    assert not gshape._scatter_rows_c(np.zeros((5, 4)), np.array([1]), np.ones((1, 4)))  # f64
    assert not gshape._scatter_rows_c(np.zeros((4, 5), np.float32).T, np.array([1]),
                                      np.ones((1, 4), np.float32))        # not C-contiguous


@pytest.mark.parametrize("axis,idx_shape", [(0, (8, 32)), (0, (1,)), (1, (3,))])
def test_gather_gradient_same_bits_with_and_without_the_kernel(scatter, axis, idx_shape):
    x = RNG.standard_normal((50, 6, 4)).astype(np.float32)
    idx = RNG.integers(-x.shape[axis], x.shape[axis], idx_shape)
    out_shape = x.shape[:axis] + idx_shape + x.shape[axis + 1:]
    g = RNG.standard_normal(out_shape).astype(np.float32)
    rule = rule_for("Gather")
    ctx = GradContext("Gather", 13, (True, False), np)
    got = rule(ctx, [g], [x, idx], [None], axis=axis)[0]
    with compiled.disabled():
        want = rule(ctx, [g], [x, idx], [None], axis=axis)[0]
    assert got.tobytes() == want.tobytes()
