"""SINGA-compatible behaviour of ``device``, ``model``, ``opt`` and ``sonnx`` that SINGA's own
programs and tests rely on (docs/singa-compat.md): the two ``last_layers`` countings,
``SingaRep`` (differentiable, sequences as lists, input dtypes), the optimizers' SINGA interface
and the device's graph switches and time profile."""

from __future__ import annotations

import warnings

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from workbench import autograd, device, layer, model, opt, sonnx, tensor
from workbench.errors import DeviceError, InputError
from workbench.graph.load import load
from workbench.runtime.cut import resolve_cut
from workbench.singa import counting as _singa_counting  # noqa: F401 - registers "singa"


def _chain(n: int = 4, int_input: bool = False) -> onnx.ModelProto:
    """x -> Relu r0 -> Neg r1 -> Relu r2 -> Neg r3 ... (n nodes, a Constant in between)."""
    nodes = [helper.make_node("Constant", [], ["c"], value=helper.make_tensor(
        "c", TensorProto.FLOAT, [1], [1.0]), name="const")]
    prev = "x"
    if int_input:
        nodes.append(helper.make_node("Cast", ["x"], ["xf"], to=TensorProto.FLOAT, name="cast"))
        prev = "xf"
    for k in range(n):
        op = "Relu" if k % 2 == 0 else "Neg"
        nodes.append(helper.make_node(op, [prev], [f"v{k}"], name=f"n{k}"))
        prev = f"v{k}"
    nodes.append(helper.make_node("Add", [prev, "c"], ["y"], name="last"))
    g = helper.make_graph(nodes, "chain", [helper.make_tensor_value_info(
        "x", TensorProto.INT64 if int_input else TensorProto.FLOAT, [2, 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


# --------------------------------------------------------------------------- last_layers
def test_the_two_countings_of_last_layers():
    g = load(_chain(4)).graph          # layers: n0 n1 n2 n3 last (the Constant is not one)
    assert resolve_cut(g, -1) == ["y"] and resolve_cut(g, -2) == ["v3"]
    assert resolve_cut(g, -5) == ["v0"]
    with pytest.raises(InputError, match="not valid"):
        resolve_cut(g, 0)
    singa = [resolve_cut(g, k, "singa") for k in (-1, -2, -3, -4, 0, 2, 4)]
    assert singa == [["v0"], ["y"], ["v3"], ["v2"], ["v0"], ["v2"], ["y"]]
    assert resolve_cut(g, None, "singa") == ["y"] and resolve_cut(g, "n1", "singa") == ["v1"]
    with pytest.raises(InputError, match="past the last node"):
        resolve_cut(g, 5, "singa")
    with pytest.raises(InputError, match="counting must be"):
        resolve_cut(g, -1, "torch")


def test_sonnx_model_counting_is_chosen_explicitly(monkeypatch):
    x = np.arange(-3, 3, dtype=np.float32).reshape(2, 3)
    monkeypatch.delenv("WORKBENCH_LAST_LAYERS", raising=False)
    m = sonnx.SONNXModel(_chain(4))
    assert m.last_layers_counting == "workbench"
    whole = np.ones((2, 3), np.float32)        # -relu(-relu(x)) + 1 with relu(-relu(x)) = 0
    np.testing.assert_array_equal(m.run(x, last_layers=-1)[0], whole)
    np.testing.assert_array_equal(m.run(x)[0], whole)
    np.testing.assert_array_equal(m.run(x, last_layers=-5)[0], np.maximum(x, 0))
    s = sonnx.SONNXModel(_chain(4), last_layers_counting="singa")
    np.testing.assert_array_equal(s.run(x, last_layers=-1)[0], np.maximum(x, 0))  # first node
    np.testing.assert_array_equal(s.run(x)[0], m.run(x)[0])                      # default: all

    class SingaCode(sonnx.SONNXModel):
        last_layers_counting = "singa"
    assert SingaCode(_chain(4)).last_layers_counting == "singa"
    monkeypatch.setenv("WORKBENCH_LAST_LAYERS", "singa")
    assert sonnx.SONNXModel(_chain(4)).last_layers_counting == "singa"
    assert sonnx.SONNXModel(_chain(4)).cut(-3).output_names == ["v3"]   # drops the last node
    monkeypatch.setenv("WORKBENCH_LAST_LAYERS", "keras")
    with pytest.raises(InputError, match="WORKBENCH_LAST_LAYERS"):
        sonnx.SONNXModel(_chain(4))


# --------------------------------------------------------------------------- SingaRep
def _two_convs():
    x = tensor.Tensor(shape=(2, 3, 3, 3))
    x.gaussian(0.0, 1.0)
    conv1, conv2 = layer.Conv2d(1, 2), layer.Conv2d(1, 2)

    class Two(layer.Layer):
        def __init__(self):
            super().__init__()
            self.conv1, self.conv2 = conv1, conv2

        def forward(self, inputs):
            return self.conv2(self.conv1(inputs))

    y = Two()(x)
    return x, conv1(x), sonnx.to_onnx([x], [y])


def test_singa_rep_counts_as_singa_and_returns_numpy_or_tensors():
    x, x1, proto = _two_convs()
    rep = sonnx.prepare(proto)
    got = rep.run([x.numpy()], last_layers=-1)          # SINGA: -1 is the first node
    assert isinstance(got[0], np.ndarray)
    np.testing.assert_allclose(got[0], x1.numpy(), rtol=1e-5, atol=1e-6)
    assert rep.run([x.numpy()], last_layers=-2)[0].shape == (2, 1, 1, 1)   # whole graph
    rep.is_graph = True
    assert isinstance(rep.run([x.numpy()])[0], tensor.Tensor)
    assert [n.name for n, _ in rep.layers] == [n.name for n in load(proto).graph.nodes]
    node, conv = rep.layers[0]                           # SINGA's (node, operator) pairs
    assert node.op_type == "Conv"
    np.testing.assert_allclose(conv(x).numpy(), x1.numpy(), rtol=1e-5, atol=1e-6)
    with pytest.raises(InputError, match="takes 1 input"):
        conv(x, x)
    assert sonnx.SingaBackend.prepare(proto).run(x)[0].shape == (2, 1, 1, 1)


def test_retraining_through_a_prepared_model():
    x, _, proto = _two_convs()
    rep = sonnx.prepare(proto)
    y_t = tensor.Tensor(shape=(2, 1, 1, 1)).gaussian(0.0, 1.0)
    sgd = opt.SGD(lr=0.002)
    losses = []
    for _ in range(3):
        y = rep.run([x])[0]                              # Tensor in: the tape is recorded
        d = y - y_t
        loss = autograd.reduce_sum(d * d)
        losses.append(loss.item())
        pairs = list(autograd.backward(loss))
        assert {p.name for p, _ in pairs} == set(rep.model.get_params())
        for p, g in pairs:
            sgd.apply(p.name, p, g)
        sgd.step()
    assert losses[-1] < losses[0]


def test_singa_rep_returns_sequences_as_lists():
    node = helper.make_node("SplitToSequence", ["x"], ["s"], axis=0)
    g = helper.make_graph([node], "seq", [helper.make_tensor_value_info(
        "x", TensorProto.FLOAT, [3, 2])], [helper.make_tensor_sequence_value_info(
            "s", TensorProto.FLOAT, None)])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    x = np.arange(6, dtype=np.float32).reshape(3, 2)
    out = sonnx.prepare(m).run([x])[0]
    assert isinstance(out, list) and len(out) == 3
    np.testing.assert_array_equal(out[1], x[1:2])


def test_integer_inputs_converted_only_when_exact():
    m = sonnx.prepare(_chain(2, int_input=True))
    with pytest.warns(UserWarning, match="converted"):
        a = m.run([np.array([[1, -2, 3], [4, 5, -6]], np.int32)])[0]
    with pytest.warns(UserWarning, match="converted"):
        b = m.run([np.array([[1, -2, 3], [4, 5, -6]], np.float32)])[0]
    np.testing.assert_array_equal(a, b)
    with pytest.raises(InputError, match=r"'x'.*int64 cannot hold exactly \(1.5"):
        m.run([np.array([[1.5, 0, 0], [0, 0, 0]], np.float32)])
    with pytest.raises(InputError, match="cannot hold exactly"):
        m.run([np.array([[np.nan, 0, 0], [0, 0, 0]], np.float32)])
    with warnings.catch_warnings():
        warnings.simplefilter("error")                  # int64 itself: no conversion
        m.run([np.zeros((2, 3), np.int64)])


def test_rename_operators_are_singa_names_for_our_kernels():
    ops = sonnx.SingaBackend._rename_operators
    assert ops["Relu"] == "ReLU" and ops["Conv"] == "layer.Conv2d" and ops["Neg"] == "Negative"
    from workbench.ops.registry import has_kernel
    assert all(has_kernel(k) for k in ops) and len(ops) >= 80


# --------------------------------------------------------------------------- opt
def test_schedulers_on_numbers_and_step_tensors():
    ed = opt.ExponentialDecay(0.1, 2, 0.5, staircase=True)
    assert [ed(s) for s in range(5)] == pytest.approx([0.1, 0.1, 0.05, 0.05, 0.025])
    step = tensor.Tensor((1,)).set_value(3)
    v = ed(step)
    assert isinstance(v, tensor.Tensor) and v.shape == (1,)
    np.testing.assert_allclose(v.numpy(), [0.05])
    assert opt.ExponentialDecay(0.1, 2, 0.5)(1) == pytest.approx(0.1 * 0.5 ** 0.5)
    with pytest.raises(Exception, match="decay_steps"):
        opt.ExponentialDecay(0.1, 0, 0.5)
    with pytest.raises(TypeError, match="learning rate"):
        opt.SGD(lr="0.1")
    with pytest.raises(ValueError, match="momentum"):
        opt.SGD(momentum=-1)


def test_optimizer_step_counter_lr_value_and_states():
    sgd = opt.SGD(lr=opt.ExponentialDecay(1.0, 1, 0.5), momentum=0.9)
    w = tensor.Tensor((2,), data=np.array([1.0, 2.0], np.float32), name="w")
    g = np.array([0.5, 0.5], np.float32)
    sgd.apply("w", w, g)
    sgd.step()
    assert sgd.steps == 1 and tensor.to_numpy(sgd.step_counter).tolist() == [1.0]
    np.testing.assert_allclose(tensor.to_numpy(sgd.lr_value), [0.5])
    sgd.apply("w", w, g)                               # buf = 0.9 * g + g, lr 0.5
    np.testing.assert_allclose(w.numpy(), [1 - 0.5 - 0.5 * 0.95, 2 - 0.5 - 0.5 * 0.95],
                               rtol=1e-6)
    st = sgd.get_states()
    assert st["step_counter"] == 1 and set(st["moments"]) == {"w"}
    np.testing.assert_allclose(st["moments"]["w"].numpy(), [0.95, 0.95])
    other = opt.SGD(lr=opt.ExponentialDecay(1.0, 1, 0.5), momentum=0.9)
    other.set_states(st)
    assert other.steps == 1 and float(other.lr_value.numpy()[0]) == 0.5
    w2 = tensor.Tensor((2,), data=np.array([1.0, 2.0], np.float32))
    other.apply("w", w2, g)                            # continues from the saved momentum
    np.testing.assert_allclose(w2.numpy(), [1 - 0.5 * (0.95 * 0.9 + 0.5),
                                            2 - 0.5 * (0.95 * 0.9 + 0.5)], rtol=1e-6)
    with pytest.raises(Exception, match="step_counter"):
        other.set_states({})


def test_adam_states_are_singas_m_and_v():
    adam = opt.Adam(lr=0.1)
    w = tensor.Tensor((3,), data=np.ones(3, np.float32))
    adam.apply("w", w, np.full(3, 0.1, np.float32))
    st = adam.get_states()
    np.testing.assert_allclose(st["m"]["w"].numpy(), 0.01, rtol=1e-6)
    np.testing.assert_allclose(st["v"]["w"].numpy(), 1e-5, rtol=1e-5)
    np.testing.assert_allclose(w.numpy(), 1 - 0.1, rtol=1e-5)     # first Adam step: lr * sign


# --------------------------------------------------------------------------- device / model
def test_device_graph_switches_and_ids():
    cpu = device.get_default_device()
    assert cpu.id() == -1 and cpu.lang() == "kCpp"
    cpu.EnableGraph(True)
    cpu.ResetGraph()
    assert cpu.graph_enabled()
    cpu.EnableGraph(False)
    assert not cpu.graph_enabled()
    cpu.Sync()
    assert device.create_cpu_device() is cpu
    assert device.get_num_gpus() == len(device.get_gpu_ids())
    with pytest.raises(DeviceError, match="OpenCL"):
        device.create_opencl_device()
    with pytest.raises(DeviceError):
        cpu.SetVerbosity(-1)


def test_time_profile_is_measured_per_node(capsys):
    cpu = device.get_default_device()
    m = sonnx.SONNXModel(_chain(4))
    x = tensor.from_numpy(np.ones((2, 3), np.float32))
    cpu.ResetGraph()
    cpu.SetVerbosity(1)
    cpu.SetSkipIteration(1)
    try:
        for _ in range(4):
            m.forward(x)
        rows = cpu.profile.rows()
        assert [r[0] for r in rows] == ["const", "n0", "n1", "n2", "n3", "last"]
        assert all(c == 3 for _, _, c, _ in rows)          # 4 runs, the first skipped
        assert all(t > 0 for *_, t in rows)
        text = cpu.PrintTimeProfiling()
        assert "3 run(s) timed" in text and "Relu" in text and text in capsys.readouterr().out
    finally:
        cpu.SetVerbosity(0)
        cpu.SetSkipIteration(5)
        cpu.ResetGraph()
    assert "nothing timed yet" in cpu.PrintTimeProfiling()


class _MLP(model.Model):
    def __init__(self):
        super().__init__()
        self.fc = layer.Linear(3)

    def forward(self, x):
        return self.fc(x)


def test_reset_graph_drops_recorded_replays(tmp_path):
    m = _MLP()
    x = tensor.PlaceHolder((2, 4))
    m.compile([x], is_train=False, use_graph=True)
    m(tensor.from_numpy(np.ones((2, 4), np.float32)))
    assert m._replays
    device.get_default_device().ResetGraph()
    assert not m._replays
    m.save_states(tmp_path / "s.npz", {"epoch": tensor.from_numpy(np.array([3.0]))})
    aux = m.load_states(tmp_path / "s.npz")
    assert isinstance(aux["epoch"], tensor.Tensor) and aux["epoch"].numpy().tolist() == [3.0]


def test_two_parameters_with_one_name_keep_their_own_state():
    """Layers name their parameters "W"/"b" until a model gives them dotted names: one
    optimizer updating two such parameters must not mix their momentum."""
    sgd = opt.SGD(lr=1.0, momentum=0.5)
    a = tensor.Tensor((1,), data=np.zeros(1, np.float32), name="W")
    b = tensor.Tensor((1,), data=np.zeros(1, np.float32), name="W")
    for _ in range(2):
        sgd.update(a, np.ones(1, np.float32))
        sgd.update(b, -np.ones(1, np.float32))
        sgd.step()
    assert a.numpy().tolist() == [-2.5] and b.numpy().tolist() == [2.5]


def test_state_of_an_unnamed_parameter_goes_with_it():
    import gc
    sgd = opt.SGD(lr=0.1, momentum=0.9)
    w = tensor.Tensor((2,), data=np.ones(2, np.float32))
    sgd.update(w, np.ones(2, np.float32))
    assert len(sgd._state) == 1
    del w
    gc.collect()
    assert sgd._state == {}
