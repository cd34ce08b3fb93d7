"""opt.DistOpt and workbench.dist in one process (world size 1) and their errors."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest

from workbench import autograd, layer, model, opt, tensor
from workbench.dist import (
    DistributedError,
    LocalCommunicator,
    NcclIdHolder,
    batches_per_rank,
    get_communicator,
    partition,
)
from workbench.dist.comm import Communicator
from workbench.errors import WorkbenchError
from workbench.widgets import DistMonitor


class Net(model.Model):
    def __init__(self):
        super().__init__()
        self.fc1, self.fc2 = layer.Linear(6), layer.Linear(3)

    def forward(self, x):
        return self.fc2(autograd.relu(self.fc1(x)))

    def train_one_batch(self, x, y, how="plain"):
        loss = autograd.softmax_cross_entropy(self.forward(x), y)
        getattr(self.optimizer, {"plain": "backward_and_update",
                                 "half": "backward_and_update_half",
                                 "partial": "backward_and_partial_update",
                                 "sparse": "backward_and_sparse_update"}[how])(loss)
        return loss


def make(o, seed=0):
    tensor.seed(seed)
    m = Net()
    m.set_optimizer(o)
    m.compile([tensor.PlaceHolder((8, 5))], is_train=True)
    return m


def batch(seed=0):
    rng = np.random.default_rng(seed)
    return (tensor.from_numpy(rng.standard_normal((8, 5)).astype(np.float32)),
            rng.integers(0, 3, 8).astype(np.int32))


def test_world_size_1_is_the_plain_optimizer():
    d = opt.DistOpt(opt.Adam(lr=0.01))
    assert (d.world_size, d.global_rank, d.local_rank) == (1, 0, 0)
    assert isinstance(d.communicator, LocalCommunicator)
    m1, m2 = make(d), make(opt.Adam(lr=0.01))
    for s in range(3):
        x, y = batch(s)
        m1(x, y)
        m2(x, y)
    for k, p in m2.get_params().items():
        np.testing.assert_array_equal(m1.get_params()[k].numpy(), p.numpy())
    assert d.steps == 3 and d.get_lr() == 0.01   # the wrapped optimizer's attributes


@pytest.mark.parametrize("how", ["half", "partial", "sparse"])
def test_world_size_1_variants_train(how):
    d = opt.DistOpt(opt.SGD(lr=0.5))
    m = make(d)
    x, y = batch(1)
    losses = [m(x, y, how).item() for _ in range(15)]
    assert losses[-1] < losses[0]


def test_sparsification_keeps_the_residual():
    d = opt.DistOpt(opt.SGD())
    g = np.array([0.5, -3.0, 0.1, 2.0], np.float32)
    acc = np.array([0.0, 0.0, 1.0, 0.0], np.float32)
    d.sparsification(g, acc, 0.5, True)        # top ceil(0.5*4)=2 of g+acc = [.5,-3,1.1,2]
    np.testing.assert_array_equal(g, [0, -3.0, 0, 2.0])
    np.testing.assert_allclose(acc, [0.5, 0, 1.1, 0], rtol=1e-6)
    g = np.array([0.5, -3.0, 0.1, 2.0], np.float32)
    d.sparsification(g, None, 1.0, False)      # |g| >= 1
    np.testing.assert_array_equal(g, [0, -3.0, 0, 2.0])
    a, b = np.ones((2, 2), np.float32), np.full(3, 0.01, np.float32)
    acc = np.zeros(7, np.float32)
    d.fused_sparsification([a, b], acc, 0.5, False)
    np.testing.assert_array_equal(b, 0)
    np.testing.assert_array_equal(acc[4:], np.float32(0.01))


def test_fp16_wire_rounds_like_float16_at_world_size_1():
    d = opt.DistOpt(opt.SGD())
    a = np.array([0.1, 1 / 3], np.float32)
    d.all_reduce_half(a)
    np.testing.assert_array_equal(a, np.array([0.1, 1 / 3], np.float16).astype(np.float32))


def test_errors_are_clear():
    with pytest.raises(WorkbenchError, match="wraps a workbench optimizer"):
        opt.DistOpt(object())
    with pytest.raises(WorkbenchError, match="already a DistOpt"):
        opt.DistOpt(opt.DistOpt(opt.SGD()))
    d = opt.DistOpt(opt.SGD(), buffSize=4)
    with pytest.raises(WorkbenchError, match="buffSize=4"):
        d.fused_all_reduce([np.ones(5, np.float32)], send=False)
    d = opt.DistOpt(opt.SGD())
    d.fused_all_reduce([np.ones(5, np.float32)], send=False)
    with pytest.raises(WorkbenchError, match="were buffered with send=False"):
        d.fused_all_reduce([np.ones(2, np.float32)])
    with pytest.raises(WorkbenchError, match="float32 gradients"):
        d.sparsification(np.ones(3, np.float64), None, 0.1, True)
    if not os.environ.get("PMI_RANK") and not os.environ.get("OMPI_COMM_WORLD_SIZE"):
        with pytest.raises(WorkbenchError, match="mpiexec -n 2"):
            opt.DistOpt(opt.SGD(), world_size=2)
    m = make(opt.DistOpt(opt.SGD())).half()
    x, y = batch()
    with pytest.raises(WorkbenchError, match="sends float32 gradients as float16"):
        m(x.as_type(np.float16), y, "half")
    with pytest.raises(WorkbenchError, match="DistOpt"):
        opt.SGD().backward_and_partial_update(None)


def test_nccl_id_holder_without_cupy_says_what_to_do():
    try:
        import cupy  # noqa: F401
        pytest.skip("cupy is installed")
    except ImportError:
        pass
    with pytest.raises(WorkbenchError, match="mpiexec -n N"):
        NcclIdHolder()


def test_partition():
    x, y = np.arange(10), np.arange(10) * 10
    parts = [partition(x, y, rank=r, world_size=3) for r in range(3)]
    assert [p[0].tolist() for p in parts] == [[0, 1, 2], [3, 4, 5], [6, 7, 8]]
    assert parts[2][1].tolist() == [60, 70, 80]
    sh = [partition(x, rank=r, world_size=2, shuffle=True, seed=4) for r in range(2)]
    assert sorted(np.concatenate(sh).tolist()) == list(range(10))
    assert len(partition(x, rank=2, world_size=3, drop_last=False)) == 3
    assert batches_per_rank(100, 8, 2) == 6
    with pytest.raises(WorkbenchError, match="outside world size"):
        partition(x, rank=3, world_size=3)
    with pytest.raises(WorkbenchError, match="has 9 samples"):
        partition(x, x[:9], rank=0, world_size=2)


def test_dead_peer_and_timeout_are_detected():
    c = Communicator(timeout=0.6)
    c.world_size, c.global_rank, c.step = 2, 0, 7
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    import socket
    c._peers = [(socket.gethostname(), os.getpid()), (socket.gethostname(), child.pid)]
    with pytest.raises(DistributedError, match=r"step 7.*rank\(s\) \[1\] of this machine died"):
        c._poll(lambda: False, "all_reduce")
    c._peers = [(socket.gethostname(), os.getpid()), (socket.gethostname(), os.getpid())]
    with pytest.raises(DistributedError, match="the timeout"):
        c._poll(lambda: False, "all_reduce")


def test_rank_0_writes_files_other_ranks_do_not(tmp_path):
    class Rank1(LocalCommunicator):
        def __init__(self):
            super().__init__()
            self.global_rank = 1

    m = make(opt.DistOpt(opt.SGD(), communicator=Rank1()))
    assert m.save_states(tmp_path / "a.npz") == str(tmp_path / "a.npz")
    assert m.export(tmp_path / "a.onnx") == str(tmp_path / "a.onnx")
    assert os.listdir(tmp_path) == []
    m.to_onnx()                                  # in memory: fine on every rank
    m0 = make(opt.DistOpt(opt.SGD()))
    m0.save_states(tmp_path / "a.npz")
    assert os.listdir(tmp_path) == ["a.npz"]


def test_dist_monitor_shows_global_throughput():
    class Fake:
        world_size, global_rank = 4, 0

    mon = DistMonitor(Fake(), batch_size=8, total=3, display=False)
    for s in range(3):
        mon.update(loss=1.0 / (s + 1))
    h = mon.history["train"]
    assert h["loss"] == [1.0, 0.5, 1 / 3]
    assert h["samples_per_s"][0] is None and h["samples_per_s"][-1] > 0
    assert mon.samples == 2 * 8 * 4
    Fake.global_rank = 1
    other = DistMonitor(Fake(), batch_size=8)
    other.update(loss=1.0)
    assert other.monitor is None and other.history is None and not other.should_stop


def test_get_communicator_outside_mpi_is_local():
    if os.environ.get("PMI_RANK") or os.environ.get("OMPI_COMM_WORLD_SIZE"):
        pytest.skip("running under mpiexec")
    assert isinstance(get_communicator(), LocalCommunicator)


def test_a_launcher_without_mpi4py_is_an_error(monkeypatch):
    import workbench.dist.comm as comm
    monkeypatch.setenv("PMI_RANK", "0")
    monkeypatch.setenv("PMI_SIZE", "2")
    monkeypatch.setattr(comm, "mpi4py_available", lambda: False)
    with pytest.raises(WorkbenchError, match="mpi4py is not installed"):
        opt.DistOpt(opt.SGD())
    monkeypatch.setenv("PMI_SIZE", "1")
    with pytest.warns(RuntimeWarning, match="mpi4py is not installed"):
        assert opt.DistOpt(opt.SGD()).world_size == 1


def test_dist_monitor_moved_to_the_widgets_says_where():
    with pytest.raises(ImportError, match="from workbench.widgets import DistMonitor"):
        from workbench.dist import DistMonitor as _  # noqa: F401
