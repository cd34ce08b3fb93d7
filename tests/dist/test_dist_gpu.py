"""NCCL engine on a GPU (world size 1: NCCL allows one process per GPU, and a lent machine has
one). Skipped without cupy and a GPU."""

from __future__ import annotations

import numpy as np
import pytest

from tests.conftest import cuda_skip_reason

pytestmark = [pytest.mark.gpu, pytest.mark.dist]


@pytest.fixture
def cp():
    reason = cuda_skip_reason()
    if reason:
        pytest.skip(reason)
    import cupy
    try:
        from cupy.cuda import nccl
    except Exception as e:  # noqa: BLE001
        pytest.skip(f"cupy has no NCCL ({e})")
    if not getattr(nccl, "available", True):
        pytest.skip("cupy was built without NCCL")
    return cupy


def test_nccl_communicator_world_size_1(cp):
    from workbench.dist import NcclCommunicator, NcclIdHolder
    c = NcclCommunicator(NcclIdHolder(), 0, 1)
    a = cp.arange(10, dtype=cp.float32)
    c.all_reduce(a)
    c.wait()
    np.testing.assert_array_equal(cp.asnumpy(a), np.arange(10))
    h = cp.asarray([0.1, 1 / 3], cp.float32)
    c.all_reduce(h, half=True)
    c.wait()
    np.testing.assert_array_equal(cp.asnumpy(h),
                                  np.array([0.1, 1 / 3], np.float16).astype(np.float32))
    g = c.all_gather(cp.ones(3, cp.int32))
    assert g.shape == (1, 3) and int(g.sum()) == 3
    c.broadcast(a, 0)
    c.barrier()
    assert c.bytes_sent > 0
    c.close()


def test_distopt_with_nccl_id_trains_like_sgd_on_the_gpu(cp):
    from workbench import autograd, device, layer, model, opt, tensor
    from workbench.dist import NcclIdHolder

    class Net(model.Model):
        def __init__(self):
            super().__init__()
            self.fc = layer.Linear(3)

        def forward(self, x):
            return self.fc(x)

        def train_one_batch(self, x, y, how):
            loss = autograd.softmax_cross_entropy(self.forward(x), y)
            getattr(self.optimizer, how)(loss)
            return loss

    dev = device.create_cuda_gpu_on(0)
    rng = np.random.default_rng(0)
    x = tensor.Tensor(data=rng.standard_normal((8, 5)).astype(np.float32), device=dev)
    y = rng.integers(0, 3, 8).astype(np.int32)
    results = {}
    for how in ["backward_and_update", "backward_and_update_half",
                "backward_and_partial_update", "backward_and_sparse_update"]:
        d = opt.DistOpt(opt.SGD(lr=0.1), nccl_id=NcclIdHolder(), local_rank=0, world_size=1)
        assert d.communicator.backend == "nccl"
        tensor.seed(0)
        m = Net()
        m.set_optimizer(d)
        m.compile([tensor.PlaceHolder((8, 5), device=dev)], is_train=True)
        for _ in range(3):
            m(x, y, how)
        results[how] = {k: p.numpy() for k, p in m.get_params().items()}
        d.communicator.close()
    tensor.seed(0)
    ref = Net()
    ref.set_optimizer(opt.SGD(lr=0.1))
    ref.compile([tensor.PlaceHolder((8, 5), device=dev)], is_train=True)
    for _ in range(3):
        ref(x, y, "backward_and_update")
    for k, p in ref.get_params().items():
        np.testing.assert_allclose(results["backward_and_update"][k], p.numpy(), rtol=1e-6)
        np.testing.assert_allclose(results["backward_and_partial_update"][k], p.numpy(),
                                   rtol=1e-6)
        np.testing.assert_allclose(results["backward_and_update_half"][k], p.numpy(),
                                   rtol=2e-3, atol=1e-3)
