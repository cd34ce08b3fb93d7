"""The tape: recording, backward (accumulation, shared inputs, freeing), modes, Tensor API,
layers' parameter bookkeeping."""

from __future__ import annotations

import numpy as np
import pytest

from workbench import autograd, layer, model, tensor
from workbench.errors import DeviceError, GradientError, InputError, ShapeError
from workbench.tensor import Tensor


def param(a):
    return Tensor(data=np.asarray(a, dtype=np.float64), requires_grad=True, stores_grad=True)


def test_every_op_is_an_onnx_node_on_the_tape():
    w = param([[1.0, 2.0], [3.0, 4.0]])
    x = tensor.from_numpy(np.ones((1, 2)))
    y = autograd.relu(x @ w + 1.0)
    node = y.creator
    assert (node.op_type, node.domain, node.opset) == ("Relu", "", autograd.DEFAULT_OPSET)
    add = node.parents[0][0]
    assert add.op_type == "Add"
    mm = add.parents[0][0]
    assert mm.op_type == "MatMul" and mm.parents[1] is w
    assert y.requires_grad and not x.requires_grad


def test_structure_is_recorded_without_grad_but_nothing_is_saved():
    w = param([1.0, 2.0])
    with autograd.no_grad():
        y = w * 2.0
    assert y.creator is not None and y.creator.saved_in is None and not y.requires_grad
    with autograd.inference_mode():
        z = w * 2.0
    assert z.creator is None and z._untraced


def test_backward_accumulates_over_shared_uses_and_sets_grad():
    w = param([1.0, -2.0, 3.0])
    loss = autograd.reduce_sum(w * w + w * 3.0 + autograd.relu(w))
    pairs = autograd.backward(loss)
    assert len(pairs) == 1 and pairs[0][0] is w
    np.testing.assert_allclose(w.grad.numpy(), 2 * w.numpy() + 3 + (w.numpy() > 0))


def test_backward_with_dy_and_gradients_dict():
    w = param([[1.0, 2.0]])
    y = w * 3.0
    g = autograd.gradients(y, np.array([[1.0, 10.0]]))
    np.testing.assert_allclose(g[w].numpy(), [[3.0, 30.0]])


def test_second_backward_through_freed_tape_raises_unless_retained():
    w = param([1.0, 2.0])
    loss = autograd.reduce_sum(w * w)
    autograd.backward(loss, retain_graph=True)
    autograd.backward(loss)
    with pytest.raises(GradientError, match="freed"):
        autograd.backward(loss)


def test_backward_of_a_constant_raises():
    x = tensor.from_numpy(np.ones(3))
    with pytest.raises(GradientError, match="does not depend"):
        autograd.backward(autograd.reduce_sum(x))


def test_frozen_parameters_get_no_gradient():
    a, b = param([1.0]), param([2.0])
    b.requires_grad = False
    pairs = autograd.backward(autograd.reduce_sum(a * b))
    assert [p for p, _ in pairs] == [a]


def test_integer_outputs_stop_gradients():
    w = param([[0.2, 0.9], [0.7, 0.1]])
    idx = autograd.apply("ArgMax", [w], {"axis": 1})
    assert idx.dtype == np.int64 and not idx.requires_grad


def test_kernel_failure_names_the_op_and_shapes():
    from workbench.errors import KernelError
    a = tensor.from_numpy(np.ones((2, 3)))
    b = tensor.from_numpy(np.ones((4, 5)))
    with pytest.raises((KernelError, ShapeError), match="MatMul"):
        autograd.matmul(a, b)


def test_device_mismatch_is_reported(monkeypatch):
    from workbench import device
    fake = device.Device("CUDA", 3)
    a = tensor.from_numpy(np.ones(2))
    b = tensor.from_numpy(np.ones(2))
    b.device = fake  # pretend; the check happens before any kernel runs
    b.name = "bias"
    with pytest.raises(DeviceError, match=r"different devices: input 0 on CPU, input 1 "
                                          r"\('bias'\) on CUDA:3"):
        autograd.add(a, b)


def test_tensor_api():
    a = np.arange(24, dtype=np.float32).reshape(2, 3, 4)
    t = tensor.from_numpy(a)
    a[0, 0, 0] = 100  # from_numpy copies
    assert t.numpy()[0, 0, 0] == 0
    # an int index keeps its axis with size 1 (SINGA's rule: t[-1, :] of [T, V] is [1, V])
    np.testing.assert_array_equal(t[1, :, ::2].numpy(), t.numpy()[1:2, :, ::2])
    np.testing.assert_array_equal(t[..., -1].numpy(), t.numpy()[..., -1:])
    np.testing.assert_array_equal(t[:, None, 1].numpy(), t.numpy()[:, None, 1:2])
    np.testing.assert_array_equal(t.reshape((6, 4)).numpy(), t.numpy().reshape(6, 4))
    np.testing.assert_array_equal(t.transpose((2, 0, 1)).numpy(), t.numpy().transpose(2, 0, 1))
    np.testing.assert_array_equal((2 - t).numpy(), 2 - t.numpy())
    np.testing.assert_array_equal((t / 2).numpy(), t.numpy() / 2)
    np.testing.assert_array_equal((t ** 2).numpy(), t.numpy() ** 2)
    np.testing.assert_array_equal((-t).numpy(), -t.numpy())
    np.testing.assert_array_equal((t > 5).numpy(), t.numpy() > 5)
    assert (t + 1).dtype == np.float32 and (t * 2.5).dtype == np.float32
    assert t.sum().numpy() == t.numpy().sum()
    np.testing.assert_allclose(t.mean(axis=1).numpy(), t.numpy().mean(axis=1))
    assert tensor.zeros((2, 2)).numpy().sum() == 0 and tensor.ones((2, 2)).numpy().sum() == 4
    assert t.astype(np.int64).dtype == np.int64
    c = t.clone()
    assert c.creator is None and np.array_equal(c.numpy(), t.numpy())
    ph = tensor.PlaceHolder((3, 4))
    assert ph.shape == (3, 4) and ph.dtype == np.float32
    assert np.asarray(t).shape == (2, 3, 4)
    with pytest.raises(InputError):
        tensor.Tensor((3,), data=np.ones(4))


def test_layers_create_parameters_lazily_and_name_them():
    class M(model.Model):
        def __init__(self):
            super().__init__()
            self.body = layer.Sequential(layer.Conv2d(4, 3, padding=1), layer.BatchNorm2d(),
                                         layer.ReLU(), layer.Flatten(), layer.Linear(5))

        def forward(self, x):
            return self.body(x)

    m = M()
    assert m.get_params() == {}
    m.compile([tensor.PlaceHolder((2, 3, 6, 6))], is_train=True)
    names = list(m.get_params())
    assert names == ["body.0.W", "body.0.b", "body.1.scale", "body.1.bias", "body.4.W",
                     "body.4.b"]
    states = m.get_states()
    assert "body.1.running_mean" in states and not states["body.1.running_mean"].stores_grad
    assert m.get_params()["body.4.W"].shape == (4 * 36, 5)
    # compile's initialising forward does not touch the running statistics
    np.testing.assert_array_equal(states["body.1.running_mean"].numpy(), np.zeros(4))
    with pytest.raises(ShapeError, match="expects"):
        m.forward(tensor.from_numpy(np.ones((2, 5, 6, 6), np.float32)))
    with pytest.raises(ShapeError, match="expected shape"):
        m.set_params({"body.4.W": np.zeros((3, 3))})
    with pytest.raises(InputError, match="unknown"):
        m.set_params({"nope": np.zeros(1)})
    m.set_params({"body.4.b": np.arange(5)})
    np.testing.assert_array_equal(m.get_params()["body.4.b"].numpy(), np.arange(5))


def test_model_call_dispatches_on_training_flag():
    class M(model.Model):
        def __init__(self):
            super().__init__()
            self.fc = layer.Linear(2, 2)

        def forward(self, x):
            return self.fc(x)

        def train_one_batch(self, x, y):
            return "trained"

    m = M()
    x = tensor.from_numpy(np.ones((1, 2), np.float32))
    assert m.train()(x, None) == "trained"
    assert isinstance(m.eval()(x), Tensor)
