"""workbench.dist.Reducer in one process: bucketing, staging, averaging, sparsification, the
partial update's round robin and the start-equal check, through a recording communicator (world
size 2 as far as the reducer can tell, every collective an identity that is logged)."""

from __future__ import annotations

import numpy as np
import pytest

from workbench import opt
from workbench.dist import LocalCommunicator, Reducer, buckets
from workbench.errors import WorkbenchError


class Recording(LocalCommunicator):
    """World size 2; all_reduce doubles (as two equal ranks would), all_gather repeats."""

    def __init__(self):
        super().__init__()
        self.world_size = 2
        self.calls = []

    def all_reduce(self, a, *, half=False):
        self.calls.append(("all_reduce", int(a.size), half))
        a *= 2
        return a

    def all_gather(self, a):
        self.calls.append(("all_gather", int(a.size), False))
        return np.stack([a, a])

    def broadcast(self, a, root=0):
        self.calls.append(("broadcast", int(a.size), False))
        return a


def test_buckets_big_alone_small_gathered_in_closing_order():
    assert buckets([5, 100, 3, 4, 1, 2], threshold=6) == [[1], [0, 2], [3, 4, 5]]
    assert buckets([], 10) == []
    assert buckets([7], 6) == [[0]]


def test_reduce_sums_bucket_by_bucket():
    c = Recording()
    r = Reducer(c)
    grads = [np.ones(5, np.float32), np.ones((10, 10), np.float32), np.ones(3, np.float32)]
    r.reduce(grads, threshold=6)
    assert [g.max() for g in grads] == [2, 2, 2]
    assert [k[:2] for k in c.calls] == [("all_reduce", 100), ("all_reduce", 8)]
    r.average(grads)
    assert [g.max() for g in grads] == [1, 1, 1]


def test_staging_is_bounded_and_checked():
    r = Reducer(Recording(), buffer_size=6)
    a, b = np.ones(4, np.float32), np.ones(2, np.float32)
    r.stage([a])
    r.stage([b])
    r.send([a, b])
    assert a.max() == 2 and b.max() == 2
    with pytest.raises(WorkbenchError, match="buffSize=6"):
        r.stage([np.ones(7, np.float32)])
    r.stage([a])
    with pytest.raises(WorkbenchError, match="were buffered with send=False"):
        r.send([b])
    with pytest.raises(WorkbenchError, match="buffSize=6"):
        Reducer(Recording(), buffer_size=6).reduce([a, b, np.ones(3, np.float32)], 100)


def test_partial_update_averages_one_bucket_per_call():
    r = Reducer(Recording())
    ps = [np.full(5, 3.0, np.float32), np.full(100, 3.0, np.float32), np.full(3, 3.0, np.float32)]
    assert r.average_bucket(ps, 6, 1) is False      # bucket 1: the big one alone
    assert ps[1].max() == 3 and ps[0].max() == 3      # (x2 then /2: averaged in place)
    assert r.average_bucket(ps, 6, 2) is True       # bucket 2 closes the cycle
    assert r.average_bucket(ps, 6, 5) is True       # past the end: a new cycle begins


def test_sparse_all_reduce_keeps_the_residual():
    c = Recording()
    r = Reducer(c)
    g = np.array([0.5, -0.01, 0.2, 0.0], np.float32)
    acc = np.zeros(4, np.float32)
    out = r.sparse_all_reduce(g, acc, 0.1, False)
    np.testing.assert_allclose(out, [1.0, 0.0, 0.4, 0.0])      # two equal ranks
    np.testing.assert_allclose(acc, [0.0, -0.01, 0.0, 0.0])
    top = r.sparse_all_reduce(g, None, 0.25, True)              # ceil(0.25 * 4) = 1
    np.testing.assert_allclose(top, [1.0, 0.0, 0.0, 0.0])
    with pytest.raises(WorkbenchError, match="float32"):
        r.sparse_all_reduce(g.astype(np.float64), None, 0.1, False)


def test_start_check_broadcasts_only_when_values_differ_and_once():
    c = Recording()
    r = Reducer(c)
    assert r.check_start([np.ones(3, np.float32)]) is False   # equal ranks: no broadcast
    assert r.checked and r.synced
    assert not [k for k in c.calls if k[0] == "broadcast"]


def test_each_distopt_has_its_own_communicator():
    d1, d2 = opt.DistOpt(opt.SGD()), opt.DistOpt(opt.SGD(), timeout=7)
    assert d1.communicator is not d2.communicator
    assert d2.communicator.timeout == 7 and d1.communicator.timeout != 7
    assert d1.reducer.communicator is d1.communicator
