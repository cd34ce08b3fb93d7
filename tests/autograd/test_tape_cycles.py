"""A training step's tape is freed by reference counting when the step's Tensors go: no
reference cycle keeps it (and its saved arrays) alive until the garbage collector runs.

SINGA's operators (``softmax_cross_entropy``, ``ReLU()(x)``...) used to hold their last call
strongly while the call held the operator: every step's whole tape hung off that cycle.
The collector is switched off inside these tests (and its state restored) so that only
reference counting can free anything.
"""

from __future__ import annotations

import gc
import tracemalloc
import weakref

import numpy as np
import pytest

from workbench import autograd, opt, tensor
from workbench.errors import GradientError

R = np.random.default_rng(3)


@pytest.fixture
def no_collector():
    was = gc.isenabled()
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


def _params():
    w1 = tensor.Tensor(data=R.normal(size=(32, 64)).astype(np.float32),
                       requires_grad=True, stores_grad=True)
    w2 = tensor.Tensor(data=R.normal(size=(64, 5)).astype(np.float32),
                       requires_grad=True, stores_grad=True)
    return w1, w2


def _step(x, labels, w1, w2, sgd):
    h = autograd.relu(autograd.matmul(x, w1))
    loss = autograd.softmax_cross_entropy(autograd.matmul(h, w2), labels)
    sgd.backward_and_update(loss)
    return weakref.ref(loss.creator), weakref.ref(h.creator), float(loss.numpy().reshape(-1)[0])


def test_a_training_step_tape_is_freed_by_reference_counting(no_collector):
    x = tensor.from_numpy(R.normal(size=(16, 32)).astype(np.float32))
    labels = R.integers(0, 5, size=16).astype(np.int64)
    w1, w2 = _params()
    sgd = opt.SGD(lr=1e-2, momentum=0.9)
    loss_node, inner_node, loss = _step(x, labels, w1, w2, sgd)
    assert np.isfinite(loss)
    assert loss_node() is None and inner_node() is None


def test_memory_stays_flat_over_training_steps(no_collector):
    x = tensor.from_numpy(R.normal(size=(16, 32)).astype(np.float32))
    labels = R.integers(0, 5, size=16).astype(np.int64)
    w1, w2 = _params()
    sgd = opt.SGD(lr=1e-2, momentum=0.9)
    for _ in range(3):
        _step(x, labels, w1, w2, sgd)
    tracemalloc.start()
    try:
        _step(x, labels, w1, w2, sgd)
        start = tracemalloc.get_traced_memory()[0]
        for _ in range(40):
            _step(x, labels, w1, w2, sgd)
        grown = tracemalloc.get_traced_memory()[0] - start
    finally:
        tracemalloc.stop()
    # a kept tape holds each step's saved arrays (~10 KiB here): 40 steps would be ~400 KiB
    assert grown < 64 * 1024, grown


def test_operator_backward_holds_its_last_call_while_the_outputs_live(no_collector):
    before = autograd.training
    autograd.training = True
    try:
        a = R.normal(size=(3, 4)).astype(np.float32)
        op = autograd.ReLU()
        y = op(tensor.from_numpy(a))[0]
        dy = np.ones((3, 4), np.float32)
        np.testing.assert_array_equal(tensor.from_raw_tensor(op.backward(dy)).numpy(),
                                      (a > 0).astype(np.float32))
        # a temporary operator stays reachable from its outputs' nodes (creator.backward)
        loss = autograd.softmax_cross_entropy(
            tensor.from_numpy(a), np.array([0, 1, 2], np.int64))
        assert loss.creator.backward() is not None
        node = weakref.ref(y.creator)
        del y
        assert node() is None
        with pytest.raises(GradientError, match="are gone"):
            op.backward(dy)
    finally:
        autograd.training = before


def test_training_step_raises_gen0_only_inside_and_restores_the_users_thresholds():
    from workbench.autodiff.collector import STEP_GEN0_THRESHOLD, training_step
    found, was = gc.get_threshold(), gc.isenabled()
    try:
        gc.enable()
        gc.set_threshold(700, 11, 12)
        with training_step():
            assert gc.get_threshold() == (STEP_GEN0_THRESHOLD, 11, 12)
            with training_step():  # nested: nothing more to do
                assert gc.get_threshold() == (STEP_GEN0_THRESHOLD, 11, 12)
            assert gc.get_threshold() == (STEP_GEN0_THRESHOLD, 11, 12)
        assert gc.get_threshold() == (700, 11, 12)
        with pytest.raises(ValueError), training_step():
            raise ValueError("a failing step")
        assert gc.get_threshold() == (700, 11, 12)
        gc.set_threshold(0, 11, 12)  # automatic collection off: left off
        with training_step():
            assert gc.get_threshold() == (0, 11, 12)
        gc.set_threshold(700, 11, 12)
        gc.disable()
        with training_step():
            assert gc.get_threshold() == (700, 11, 12) and not gc.isenabled()
    finally:
        gc.set_threshold(*found)
        if was:
            gc.enable()


def test_fit_leaves_the_collector_as_it_found_it():
    from workbench import layer, model, training

    class Net(model.Model):
        def __init__(self):
            super().__init__()
            self.fc = layer.Linear(3)

        def forward(self, x):
            return self.fc(x)

    x = R.normal(size=(32, 4)).astype(np.float32)
    y = R.integers(0, 3, size=32).astype(np.int64)
    found = gc.get_threshold()
    hist = training.fit(Net(), x, y, epochs=2, batch_size=8, optimizer=opt.SGD(lr=0.1))
    assert gc.get_threshold() == found
    assert len(hist["loss"]) == 2 and all(np.isfinite(hist["loss"]))
