"""One seedable random source per device (``Device.SetRandSeed``) behind Dropout, the random
ops, Bernoulli and the initialisers."""

from __future__ import annotations

import numpy as np
from onnx import TensorProto, helper

from workbench import autograd, backend, device, layer, tensor
from workbench.tensor import Tensor


def _random_normal_model():
    node = helper.make_node("RandomNormal", [], ["y"], shape=[4, 3])
    g = helper.make_graph([node], "r", [], [helper.make_tensor_value_info(
        "y", TensorProto.FLOAT, [4, 3])])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def _draws():
    cpu = device.create_cpu()
    lin = layer.Linear(3)
    lin(Tensor(data=np.ones((2, 4), np.float32)))
    x = Tensor(data=np.ones((64,), np.float32))
    drop = autograd.dropout(x, ratio=0.5, training=True).numpy()
    rep = backend.prepare(_random_normal_model(), optimize=False)
    (rn,) = rep.run([])
    bern = Tensor((32,), cpu).bernoulli(0.5).numpy()
    return lin.W.numpy(), drop, rn, bern


def test_set_rand_seed_makes_every_draw_reproducible():
    cpu = device.create_cpu()
    cpu.SetRandSeed(7)
    first = _draws()
    cpu.SetRandSeed(7)
    again = _draws()
    for a, b in zip(first, again):
        np.testing.assert_array_equal(a, b)
    cpu.SetRandSeed(8)
    other = _draws()
    assert not all(np.array_equal(a, b) for a, b in zip(first, other))


def test_one_source_reseeded_in_place():
    cpu = device.create_cpu()
    gen = cpu.rng
    assert device.host_rng() is gen and tensor.host_rng() is gen
    tensor.seed(3)
    a = gen.random(3)
    autograd.manual_seed(3)          # every device in use, the CPU among them
    assert cpu.rng is gen
    np.testing.assert_array_equal(gen.random(3), a)
    # a plan built without a seed draws from its device's source
    m = _random_normal_model()
    cpu.SetRandSeed(11)
    (y1,) = backend.prepare(m, optimize=False).run([])
    cpu.SetRandSeed(11)
    (y2,) = backend.prepare(m, optimize=False).run([])
    np.testing.assert_array_equal(y1, y2)
