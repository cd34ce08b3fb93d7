"""SINGA's operator API over the tape: operator classes, per-operator backward, the global
training flag, SINGA's shape quirks (kept exportable), tensor functions and RNN layers."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from workbench import autograd, layer, sonnx, tensor
from workbench.errors import GradientError, SingaShapeError

R = np.random.default_rng(7)


@pytest.fixture
def singa_training():
    before = autograd.training
    autograd.training = True
    yield
    autograd.training = before


def _ort(model, *xs):
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    names = [i.name for i in sess.get_inputs()]
    return sess.run(None, dict(zip(names, xs)))


def test_the_flag_is_off_outside_singas_test_files():
    # SINGA's ported test modules set it at import; tests/singa/conftest.py keeps it there
    assert autograd.training is False


@pytest.mark.parametrize("flag", [False, True])
def test_export_and_cut_leave_singas_flag_as_it_was(tmp_path, flag):
    """``to_onnx``/``export``/``cut`` run the forward in eval mode for a moment: SINGA's
    global ``autograd.training`` comes back as it was, not as the model's own mode."""
    import workbench as wb
    from workbench.cli import default_model_path

    m = wb.load(default_model_path())
    before = autograd.training
    autograd.training = flag
    try:
        m.train(not flag)
        autograd.training = flag
        m.export(str(tmp_path / "m.onnx"))
        assert autograd.training is flag
        m.cut(-2)
        assert autograd.training is flag
        assert m.training is (not flag)
    finally:
        autograd.training = before


def test_operator_class_records_the_same_node_and_backward(singa_training):
    a = R.normal(size=(3, 4)).astype(np.float32)
    x = tensor.from_numpy(a)
    y = autograd.ReLU()(x)[0]
    assert y.creator.op_type == "Relu"
    np.testing.assert_array_equal(y.numpy(), np.maximum(a, 0))
    dy = R.normal(size=(3, 4)).astype(np.float32)
    dx = y.creator.backward(dy)
    assert isinstance(dx, autograd.RawTensor) and dx.shape() == (3, 4)
    np.testing.assert_allclose(tensor.from_raw_tensor(dx).numpy(), dy * (a > 0))
    # forward on raw arrays records nothing
    out = autograd.ReLU().forward(a)
    np.testing.assert_array_equal(out.numpy(), np.maximum(a, 0))


def test_per_operator_backward_needs_the_flag_or_a_gradient():
    x = tensor.from_numpy(R.normal(size=(2, 3)).astype(np.float32))
    y = autograd.exp(x)
    assert y.creator.saved_in is None  # nothing kept: no input needs a gradient
    with pytest.raises(GradientError, match="autograd.training = True"):
        y.creator.backward(np.ones((2, 3), np.float32))


def test_composite_operator_backward_spans_its_nodes(singa_training):
    a = R.normal(size=(3, 2)).astype(np.float32)
    t = R.normal(size=(3, 2)).astype(np.float32)
    loss = autograd.mse_loss(tensor.from_numpy(a), tensor.from_numpy(t))
    assert loss.shape == (1,)
    np.testing.assert_allclose(loss.numpy()[0], np.mean((a - t) ** 2), rtol=1e-6)
    dx = loss.creator.backward()
    np.testing.assert_allclose(dx.numpy(), 2 * (a - t) / a.size, rtol=1e-5)
    # the Tensor gradient path agrees
    x = tensor.Tensor(data=a, requires_grad=True, stores_grad=True)
    (g,) = [g for _, g in autograd.backward(autograd.mse_loss(x, tensor.from_numpy(t)))]
    np.testing.assert_allclose(g.numpy(), dx.numpy(), rtol=1e-6)


def test_operator_settings_are_checked():
    with pytest.raises(TypeError, match="missing the setting 'shape'"):
        autograd.Reshape()
    with pytest.raises(TypeError, match="unexpected setting"):
        autograd.SoftMax(dim=1)
    with pytest.raises(SingaShapeError):  # SINGA raises AssertionError here
        autograd.mse_loss(tensor.zeros((2, 3)), tensor.zeros((3, 2)))
    with pytest.raises(AssertionError):
        autograd.add_bias(tensor.zeros((2, 3)), tensor.zeros((3,)), 3)


@pytest.mark.parametrize("make, expect", [
    (lambda x: autograd.gather(x, 0, [0, 1, 3]), lambda a: a[[0, 1, 0]]),
    (lambda x: autograd.tile(x, [2, 2]), lambda a: np.tile(a, [2, 2])),
    (lambda x: autograd.tile(x, 3), lambda a: np.tile(a, 3)),
    # list.insert: [3] -> [3, 1] -> [3, 1, 1] (4 is past the end) -> [3, 1, 1, 1]
    (lambda x: autograd.unsqueeze(x, [1, 4, 5]), lambda a: a.reshape(3, 1, 1, 1)),
    (lambda x: autograd.space_to_depth(autograd.reshape(x, (1, 1, 1, 3)), 1, "CRD"),
     lambda a: a.reshape(1, 1, 1, 3)),
])
def test_singa_quirks_export_valid_onnx(make, expect):
    a = np.array([0.5, 1.5, 2.5], np.float32)
    x = tensor.from_numpy(a)
    y = make(x)
    np.testing.assert_array_equal(y.numpy(), expect(a))
    model = sonnx.to_onnx([x], [y])
    onnx.checker.check_model(model, full_check=True)
    np.testing.assert_array_equal(_ort(model, a)[0], expect(a))


def test_int_index_keeps_the_axis_and_1d_softmax_is_one_row():
    a = R.normal(size=(4, 5)).astype(np.float32)
    t = tensor.from_numpy(a)
    assert t[-1, :].shape == (1, 5)
    v = tensor.from_numpy(a[0])
    s = tensor.softmax(v)
    assert s.shape == (5,)
    np.testing.assert_allclose(s.numpy(), np.exp(a[0]) / np.exp(a[0]).sum(), rtol=1e-6)


def test_tensor_functions_match_numpy():
    a = R.normal(size=(2, 3, 4)).astype(np.float32)
    b = R.normal(size=(4, 3, 5)).astype(np.float32)
    ta, tb = tensor.from_numpy(a), tensor.from_numpy(b)
    np.testing.assert_allclose(tensor.tensordot(ta, tb, ([1, 2], [1, 0])).numpy(),
                               np.tensordot(a, b, ([1, 2], [1, 0])), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(tensor.einsum("ijk,kjl->il", ta, tb).numpy(),
                               np.einsum("ijk,kjl->il", a, b), rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(tensor.repeat(ta, 2, 1).numpy(), np.repeat(a, 2, 1))
    assert tensor.sizeof(tensor.float32) == 4 and tensor.sizeof("int") == 4
    assert tensor.product((2, 3, 4)) == 24
    assert isinstance(tensor.average(ta), float)


def test_tensordot_is_differentiable():
    a = tensor.Tensor(data=R.normal(size=(3, 4)).astype(np.float32), requires_grad=True,
                      stores_grad=True)
    b = R.normal(size=(4, 2)).astype(np.float32)
    loss = autograd.reduce_sum(tensor.tensordot(a, tensor.from_numpy(b), 1))
    (g,) = [g for _, g in autograd.backward(loss)]
    np.testing.assert_allclose(g.numpy(), np.ones((3, 2)) @ b.T, rtol=1e-5)


def test_inplace_ops_copy_and_equality():
    t = tensor.zeros((2, 2))
    shallow, deep = t.copy(), t.deepcopy()
    t += 1.5
    assert shallow.numpy()[0, 0] == 1.5 and deep.numpy()[0, 0] == 0.0
    eq = t == 1.5
    assert eq.numpy().all()
    assert (t == shallow) is False and (t == t) is True  # Tensors compare by identity
    assert t in [shallow, t]
    n = tensor.from_numpy(np.array([1, 2], np.int64)) + 0.5  # int tensor + float: float32
    assert n.dtype == np.float32 and n.numpy().tolist() == [1.5, 2.5]


def test_gradients_can_be_looked_up_by_id():
    w = tensor.Tensor(data=np.ones(3, np.float32))
    w.stores_grad = True  # SINGA's way of marking a parameter: it then needs a gradient
    assert w.requires_grad
    g = autograd.gradients(autograd.reduce_sum(w * 2.0))
    np.testing.assert_array_equal(g[id(w)].numpy(), [2, 2, 2])
    np.testing.assert_array_equal(g[w].numpy(), [2, 2, 2])


def test_to_onnx_skips_settings_and_keeps_bn_statistics_as_initializers():
    x = tensor.from_numpy(R.normal(size=(2, 3, 4, 4)).astype(np.float32))
    s, b = tensor.ones((3,)), tensor.zeros((3,))
    mean, var = tensor.zeros((3,)), tensor.ones((3,))
    y = autograd.batchnorm_2d(0.9, x, s, b, mean, var, training=False)
    r = autograd.reshape(y, (2, -1))
    model = sonnx.to_onnx([x, s, b, mean, var, (2, -1), 0.5], [r])
    assert [i.name for i in model.graph.input] == ["input_0", "input_1", "input_2"]
    assert len(model.graph.initializer) >= 2
    out = _ort(model, x.numpy(), s.numpy(), b.numpy())[0]
    np.testing.assert_allclose(out, r.numpy(), rtol=1e-5, atol=1e-5)


def test_rnn_and_lstm_steps_and_gradients():
    xs = [tensor.from_numpy(R.random((2, 3)).astype(np.float32)) for _ in range(3)]
    h0 = tensor.zeros((2, 4))
    rnn = layer.RNN(3, 4)
    hs, h = rnn(xs, h0)
    assert len(hs) == 3 and h is hs[-1]
    p = rnn.get_params()
    ref = np.zeros((2, 4), np.float32)
    for x in xs:
        ref = np.tanh(x.numpy() @ p["Wx"].numpy() + ref @ p["Wh"].numpy() + p["b"].numpy())
    np.testing.assert_allclose(h.numpy(), ref, rtol=1e-5, atol=1e-6)
    lstm = layer.LSTM(3, 4)
    hs, h, c = lstm(xs, (h0, tensor.zeros((2, 4))))
    grads = autograd.gradients(autograd.reduce_sum(h))
    assert set(lstm.get_params()) == {f"{k}_{g}" for k in ("Wx", "Wh", "Bx", "Bh")
                                      for g in "ifog"}
    assert all(id(t) in grads for t in lstm.get_params().values())


@pytest.mark.parametrize("mode", ["vanilla", "relu", "lstm", "gru"])
@pytest.mark.parametrize("bidirectional", [False, True])
def test_cudnn_rnn_on_cpu_matches_torch(mode, bidirectional):
    torch = pytest.importorskip("torch")
    seq, n, f, hid, layers = 4, 2, 3, 5, 2
    x = R.normal(size=(seq, n, f)).astype(np.float32)
    rnn = layer.CudnnRNN(hid, num_layers=layers, batch_first=False, rnn_mode=mode,
                         bidirectional=bidirectional, return_sequences=True)
    y = rnn(tensor.from_numpy(x))
    dirs = 2 if bidirectional else 1
    assert y.shape == (seq, n, dirs * hid)
    cls = {"lstm": torch.nn.LSTM, "gru": torch.nn.GRU}.get(mode, torch.nn.RNN)
    kw = {} if mode in ("lstm", "gru") else {"nonlinearity": "relu" if mode == "relu"
                                             else "tanh"}
    ref = cls(f, hid, num_layers=layers, bidirectional=bidirectional, **kw)
    p = rnn.get_params()
    with torch.no_grad():
        for k in range(layers):
            for d in range(dirs):
                sfx = f"l{k}" + ("_reverse" if d else "")
                tag = f"l{k}_d{d}"
                getattr(ref, f"weight_ih_{sfx}").copy_(torch.from_numpy(p[f"Wx_{tag}"].numpy().T))
                getattr(ref, f"weight_hh_{sfx}").copy_(torch.from_numpy(p[f"Wh_{tag}"].numpy().T))
                getattr(ref, f"bias_ih_{sfx}").copy_(torch.from_numpy(p[f"Bx_{tag}"].numpy()))
                getattr(ref, f"bias_hh_{sfx}").copy_(torch.from_numpy(p[f"Bh_{tag}"].numpy()))
        want = ref(torch.from_numpy(x))[0].numpy()
    np.testing.assert_allclose(y.numpy(), want, rtol=1e-4, atol=1e-5)
    last = layer.CudnnRNN(hid, rnn_mode=mode, batch_first=True, return_sequences=False)
    assert last(tensor.from_numpy(x)).shape == (seq, hid)


def test_separable_conv2d_is_depthwise_then_pointwise_and_exports():
    x = tensor.from_numpy(R.normal(size=(2, 3, 8, 8)).astype(np.float32))
    sep = layer.SeparableConv2d(6, 3, padding=1)
    y = sep(x)
    assert y.shape == (2, 6, 8, 8)
    assert sep.depthwise_conv.W.shape == (3, 1, 3, 3) and sep.point_conv.W.shape == (6, 3, 1, 1)
    model = sonnx.to_onnx([x], [y])
    np.testing.assert_allclose(_ort(model, x.numpy())[0], y.numpy(), rtol=1e-4, atol=1e-5)


def test_gather_with_a_scalar_index_records_int64_indices():
    """``gather(x, 1, 0)`` (an int, or a 0-d array) records int64 indices, not x's float
    dtype: the exported Gather is valid ONNX."""
    from workbench import autograd as ag
    from workbench.tensor import Tensor
    x = Tensor(data=np.arange(24, dtype=np.float32).reshape(2, 3, 4))
    for idx in (0, np.asarray(0, dtype=np.int64), -1, [0, 4]):
        y = ag.gather(x, 1, idx)
        node = y.creator
        ind = node.parents[1]
        assert np.asarray(ind.data).dtype == np.int64, idx
