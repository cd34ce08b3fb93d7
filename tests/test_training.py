"""Training for real, offline: a CNN of ``layer``s on scikit-learn's digits, transfer learning
(digits 0-4 -> 5-9 via ``Model.cut`` + a new head), a light zoo model taking SGD steps, graph
mode equal to eager mode, optimizers against PyTorch, mixed precision, checkpoints, and the
errors a user meets (no parameters, NaN loss, bad labels)."""

from __future__ import annotations

import os

import numpy as np
import pytest

from workbench import autograd, layer, model, opt, sonnx, tensor
from workbench.errors import GradientError, InputError, ShapeError, WorkbenchError


# --------------------------------------------------------------------------- data and models
@pytest.fixture(scope="module")
def digits():
    sk = pytest.importorskip("sklearn.datasets")
    d = sk.load_digits()
    x = (d.images / 16.0).astype(np.float32)[:, None]
    y = d.target.astype(np.int64)
    idx = np.random.default_rng(0).permutation(len(x))
    return x[idx], y[idx]


class CNN(model.Model):
    def __init__(self, n_classes=10, dropout=0.1):
        super().__init__()
        self.conv1 = layer.Conv2d(8, 3, padding=1)
        self.bn1 = layer.BatchNorm2d()
        self.conv2 = layer.Conv2d(16, 3, padding=1)
        self.bn2 = layer.BatchNorm2d()
        self.pool = layer.MaxPool2d(2)
        self.flat = layer.Flatten()
        self.fc1 = layer.Linear(64)
        self.drop = layer.Dropout(dropout)
        self.fc2 = layer.Linear(n_classes)

    def forward(self, x):
        x = self.pool(autograd.relu(self.bn1(self.conv1(x))))
        x = self.pool(autograd.relu(self.bn2(self.conv2(x))))
        return self.fc2(self.drop(autograd.relu(self.fc1(self.flat(x)))))

    def train_one_batch(self, x, y):
        out = self.forward(x)
        loss = autograd.softmax_cross_entropy(out, y)
        self.optimizer.backward_and_update(loss)
        return out, loss


def fit(m, x, y, epochs, bs=64, seed=0):
    rng = np.random.default_rng(seed)
    m.train()
    losses = []
    for _ in range(epochs):
        p = rng.permutation(len(x))
        for i in range(0, len(p) - bs + 1, bs):
            b = p[i:i + bs]
            _, loss = m(tensor.from_numpy(x[b]), tensor.from_numpy(y[b]))
            losses.append(loss.item())
    return losses


def accuracy(m, x, y):
    m.eval()
    pred = m(tensor.from_numpy(x))
    if isinstance(pred, list):
        pred = pred[0]
    return float((pred.numpy().argmax(1) == y).mean())


def seeded(s=0):
    tensor.seed(s)
    autograd.manual_seed(s)


# --------------------------------------------------------------------------- real training
@pytest.mark.slow
def test_cnn_from_scratch_on_digits_reaches_97_percent(digits):
    x, y = digits
    seeded(0)
    m = CNN()
    m.set_optimizer(opt.SGD(lr=0.05, momentum=0.9, weight_decay=1e-4))
    m.compile([tensor.PlaceHolder((64, 1, 8, 8))], is_train=True, use_graph=True)
    losses = fit(m, x[:1400], y[:1400], epochs=6)
    assert losses[-1] < losses[0] / 5
    acc = accuracy(m, x[1400:], y[1400:])
    assert acc >= 0.97, f"test accuracy {acc:.3f}"


class TransferModel(sonnx.SONNXModel):
    """The page's transfer-learning shape: imported graph cut by ``last_layers``, new head."""

    def __init__(self, onnx_model, n_classes, last_layers):
        super().__init__(onnx_model)
        self.head = layer.Linear(n_classes)
        self.last_layers = last_layers

    def forward(self, *x):
        feats = super().forward(*x, last_layers=self.last_layers)[0]
        return self.head(feats)

    def train_one_batch(self, x, y):
        out = self.forward(x)
        loss = autograd.softmax_cross_entropy(out, y)
        self.optimizer.backward_and_update(loss)
        return out, loss


@pytest.mark.slow
def test_transfer_learning_digits_0_4_to_5_9(digits):
    x, y = digits
    lo, hi = y < 5, y >= 5
    x04, y04, x59, y59 = x[lo], y[lo], x[hi], y[hi] - 5
    seeded(1)
    base = CNN(n_classes=5)
    base.set_optimizer(opt.SGD(lr=0.05, momentum=0.9))
    base.compile([tensor.PlaceHolder((64, 1, 8, 8))], is_train=True)
    fit(base, x04, y04, epochs=4)
    assert accuracy(base, x04, y04) > 0.95

    # Model.cut: a NEW model ending at the 64-d features (drop Gemm -> the last 2 nodes)
    proto = base.to_onnx(dynamic_axes={"input": {0: "N"}, "output": {0: "N"}})
    feats = sonnx.SONNXModel(proto).cut(-2)
    f = feats.forward(tensor.from_numpy(x59[:5]))[0]
    assert f.shape == (5, 64)
    assert len(feats.onnx_graph.nodes) < len(sonnx.SONNXModel(proto).onnx_graph.nodes)

    # transfer: imported part trainable, new head for digits 5-9
    n = len(x59) * 3 // 4
    tl = TransferModel(proto, 5, last_layers=-2)
    tl.set_optimizer(opt.SGD(lr=0.03, momentum=0.9))
    tl.compile([tensor.PlaceHolder((64, 1, 8, 8))], is_train=True, use_graph=True)
    fit(tl, x59[:n], y59[:n], epochs=4)
    acc = accuracy(tl, x59[n:], y59[n:])
    assert acc >= 0.95, f"transfer accuracy {acc:.3f}"


def test_transfer_with_frozen_imported_part(digits):
    x, y = digits
    seeded(2)
    base = CNN(n_classes=10)
    base.compile([tensor.PlaceHolder((32, 1, 8, 8))], is_train=False)
    proto = base.to_onnx()
    tl = TransferModel(proto, 3, last_layers=-2)
    tl.freeze_imported()
    tl.set_optimizer(opt.SGD(lr=0.05))
    tl.compile([tensor.PlaceHolder((32, 1, 8, 8))], is_train=True)
    before = {k: t.numpy().copy() for k, t in tl.get_params().items()}
    fit(tl, x[:128], y[:128] % 3, epochs=1, bs=32)
    after = tl.get_params()
    changed = [k for k in before if not np.array_equal(before[k], after[k].numpy())]
    assert changed == ["head.W", "head.b"]


def test_light_zoo_model_sgd_steps_lower_the_loss():
    onnx = pytest.importorskip("onnx")
    from tests.helpers.light_models import light_path, with_dynamic_batch, with_random_weights
    proto = with_dynamic_batch(with_random_weights(onnx.load(str(light_path("squeezenet")))))
    m = sonnx.SONNXModel(proto)
    x = np.random.default_rng(0).standard_normal((2, 3, 48, 48)).astype(np.float32)
    m.compile([tensor.PlaceHolder(x.shape)], is_train=True)
    sgd = opt.SGD(lr=0.002, momentum=0.9)
    losses = []
    for _ in range(3):
        logits = autograd.flatten(m.forward(tensor.from_numpy(x), last_layers="r65")[0], 1)
        loss = autograd.softmax_cross_entropy(logits, np.array([1, 2]))
        losses.append(loss.item())
        sgd.backward_and_update(loss)
    assert losses[2] < losses[0], losses


# --------------------------------------------------------------------------- graph mode
def test_graph_mode_equals_eager_mode(digits):
    x, y = digits
    runs = []
    for use_graph in (False, True):
        seeded(5)
        m = CNN(dropout=0.3)
        m.set_optimizer(opt.SGD(lr=0.05, momentum=0.9))
        m.compile([tensor.PlaceHolder((32, 1, 8, 8))], is_train=True, use_graph=use_graph)
        losses = fit(m, x[:160], y[:160], epochs=1, bs=32, seed=3)
        out = m.eval().forward(tensor.from_numpy(x[:32])).numpy()
        runs.append((losses, out, {k: t.numpy() for k, t in m.get_states().items()}))
    (l0, o0, s0), (l1, o1, s1) = runs
    assert l0 == l1
    np.testing.assert_array_equal(o0, o1)
    for k in s0:
        np.testing.assert_array_equal(s0[k], s1[k], err_msg=k)


def test_graph_mode_retraces_on_new_shapes(digits):
    x, _ = digits
    seeded(0)
    m = CNN()
    m.compile([tensor.PlaceHolder((8, 1, 8, 8))], is_train=False, use_graph=True)
    a = m.forward(tensor.from_numpy(x[:8])).numpy()
    b = m.forward(tensor.from_numpy(x[:8])).numpy()  # replayed
    c = m.forward(tensor.from_numpy(x[:5])).numpy()  # new batch size: traced again
    np.testing.assert_array_equal(a, b)
    np.testing.assert_allclose(c, a[:5], rtol=1e-5, atol=1e-6)
    assert len(m._replays) == 2


# --------------------------------------------------------------------------- optimizers
@pytest.mark.parametrize("name", ["sgd", "sgd-nesterov", "sgd-dampening", "adam", "adamw"])
def test_optimizers_match_torch(name):
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(0)
    w0 = rng.standard_normal((4, 3))
    a = rng.standard_normal((5, 4))
    ours_w = tensor.Tensor(data=w0.copy(), requires_grad=True, stores_grad=True)
    tw = torch.tensor(w0.copy(), requires_grad=True)
    make = {
        "sgd": (lambda: opt.SGD(lr=0.1, momentum=0.9, weight_decay=0.01),
                lambda: torch.optim.SGD([tw], lr=0.1, momentum=0.9, weight_decay=0.01)),
        "sgd-nesterov": (lambda: opt.SGD(lr=0.1, momentum=0.8, nesterov=True),
                         lambda: torch.optim.SGD([tw], lr=0.1, momentum=0.8, nesterov=True)),
        "sgd-dampening": (lambda: opt.SGD(lr=0.1, momentum=0.8, dampening=0.3),
                          lambda: torch.optim.SGD([tw], lr=0.1, momentum=0.8, dampening=0.3)),
        "adam": (lambda: opt.Adam(lr=0.01, weight_decay=0.01),
                 lambda: torch.optim.Adam([tw], lr=0.01, weight_decay=0.01)),
        "adamw": (lambda: opt.AdamW(lr=0.01, weight_decay=0.1),
                  lambda: torch.optim.AdamW([tw], lr=0.01, weight_decay=0.1)),
    }[name]
    ours, theirs = make[0](), make[1]()
    for _ in range(5):
        loss = autograd.reduce_sum(autograd.tanh(tensor.from_numpy(a) @ ours_w))
        ours.backward_and_update(loss)
        theirs.zero_grad()
        torch.tanh(torch.from_numpy(a) @ tw).sum().backward()
        theirs.step()
    np.testing.assert_allclose(ours_w.numpy(), tw.detach().numpy(), rtol=1e-10, atol=1e-12)
    assert ours.steps == 5


def test_learning_rate_schedule():
    sched = opt.ExponentialDecay(0.1, decay_steps=2, decay_rate=0.5, staircase=True)
    sgd = opt.SGD(lr=sched)
    assert [sched(s) for s in range(5)] == [0.1, 0.1, 0.05, 0.05, 0.025]
    w = tensor.Tensor(data=np.ones(2), requires_grad=True, stores_grad=True)
    for _ in range(3):
        sgd.backward_and_update(autograd.reduce_sum(w))
    np.testing.assert_allclose(w.numpy(), 1 - 0.1 - 0.1 - 0.05)


# --------------------------------------------------------------------------- mixed precision
def test_backward_and_update_half_trains_a_float16_model(digits):
    x, y = digits
    seeded(3)
    m = CNN(dropout=0.0)
    m.compile([tensor.PlaceHolder((32, 1, 8, 8))], is_train=True)
    m.half()
    sgd = opt.SGD(lr=0.05, momentum=0.9)
    xb = tensor.from_numpy(x[:32].astype(np.float16))
    losses, applied = [], []
    for _ in range(25):
        out = m.forward(xb)
        loss = autograd.softmax_cross_entropy(out, y[:32])
        losses.append(loss.item())
        applied.append(sgd.backward_and_update_half(loss))
    # the first steps may overflow float16 at the initial scale 2^15: skipped, scale halved
    assert sum(applied) >= 15 and applied[-10:] == [True] * 10
    assert sgd.skipped_steps == applied.count(False)
    assert sgd.loss_scale == 2.0 ** 15 * 0.5 ** sgd.skipped_steps
    assert losses[-1] < losses[0] / 2
    params = m.get_params()
    assert all(p.dtype == np.float16 for p in params.values())
    # master weights are float32 and the parameters are their rounding
    w = params["fc2.W"]
    np.testing.assert_array_equal(sgd._master[w].astype(np.float16), w.numpy())


def test_half_overflow_skips_the_step_and_backs_off_then_grows():
    w = tensor.Tensor(data=np.array([1.0, 2.0], np.float16), requires_grad=True,
                      stores_grad=True)
    sgd = opt.SGD(lr=0.1, init_scale=2.0 ** 15, growth_interval=2)
    loss = autograd.reduce_sum(w * w) * 100.0  # scaled gradients 2^15 * 400 overflow fp16
    assert sgd.backward_and_update_half(loss) is False
    np.testing.assert_array_equal(w.numpy(), [1.0, 2.0])
    assert sgd.loss_scale == 2.0 ** 14 and sgd.skipped_steps == 1 and sgd.steps == 0
    sgd.loss_scale = 4.0
    for _ in range(2):
        assert sgd.backward_and_update_half(autograd.reduce_sum(w * w))
    assert sgd.loss_scale == 8.0 and sgd.steps == 2
    np.testing.assert_allclose(w.numpy(), np.array([1.0, 2.0]) * 0.8 ** 2, rtol=1e-3)


# --------------------------------------------------------------------------- errors
def test_optimizer_without_parameters_raises():
    m = CNN()
    m.compile([tensor.PlaceHolder((4, 1, 8, 8))], is_train=True)
    m.freeze()
    sgd = opt.SGD(lr=0.1)
    loss = autograd.softmax_cross_entropy(m.forward(tensor.from_numpy(
        np.zeros((4, 1, 8, 8), np.float32))), np.array([0, 1, 2, 3]))
    with pytest.raises(GradientError, match="does not depend on any Tensor"):
        sgd.backward_and_update(loss)
    data = tensor.Tensor(data=np.ones(3, np.float32), requires_grad=True)  # not a parameter
    with pytest.raises(WorkbenchError, match="no parameters"):
        sgd.backward_and_update(autograd.reduce_sum(data * data))


def test_nan_loss_raises_naming_the_step():
    w = tensor.Tensor(data=np.array([1.0, -1.0], np.float32), requires_grad=True,
                      stores_grad=True)
    sgd = opt.SGD(lr=0.1)
    sgd.backward_and_update(autograd.reduce_sum(w * w))
    bad = autograd.reduce_sum(autograd.log(w))  # log(-1) = nan
    with pytest.raises(WorkbenchError, match=r"loss is nan at optimizer step 1"):
        sgd.backward_and_update(bad)
    np.testing.assert_allclose(w.numpy(), [0.8, -0.8])  # untouched by the failed step


@pytest.mark.parametrize("labels, error, match", [
    (np.zeros((4, 2), np.int64), ShapeError, r"integer labels must have shape \(4,\)"),
    (np.zeros(4, np.float32), ShapeError, r"look like class indices"),
    (np.array([0, 1, 5, 2]), InputError, r"class indices must lie in \[0, 4\]"),
    (np.array(["a", "b", "c", "d"]), InputError, r"labels must be integer"),
    (np.zeros((3,), np.int64), ShapeError, r"shape \(4,\)"),
])
def test_bad_labels_give_clear_errors(labels, error, match):
    logits = tensor.Tensor(data=np.zeros((4, 5), np.float32), requires_grad=True)
    with pytest.raises(error, match=match):
        autograd.softmax_cross_entropy(logits, labels)


def test_one_hot_labels_equal_index_labels():
    rng = np.random.default_rng(0)
    logits = rng.standard_normal((4, 5)).astype(np.float64)
    idx = np.array([0, 3, 2, 4])
    onehot = np.eye(5)[idx]
    a = autograd.softmax_cross_entropy(tensor.from_numpy(logits), idx).numpy()
    b = autograd.softmax_cross_entropy(tensor.from_numpy(logits), onehot).numpy()
    np.testing.assert_allclose(a, b, rtol=1e-12)


# --------------------------------------------------------------------------- states on disk
def test_save_and_load_states(tmp_path, digits):
    x, _ = digits
    seeded(0)
    m = CNN()
    m.compile([tensor.PlaceHolder((4, 1, 8, 8))], is_train=False)
    path = tmp_path / "ckpt.npz"
    m.save_states(path, aux_states={"epoch": np.array(3)})
    assert sorted(os.listdir(tmp_path)) == ["ckpt.npz"]  # no temp file left behind
    with pytest.raises(FileExistsError):
        m.save_states(path)
    ref = m.forward(tensor.from_numpy(x[:4])).numpy()
    seeded(9)
    m2 = CNN()
    m2.compile([tensor.PlaceHolder((4, 1, 8, 8))], is_train=False)
    aux = m2.load_states(path)
    assert int(aux["epoch"].numpy()) == 3   # aux states come back as Tensors (SINGA)
    np.testing.assert_array_equal(m2.forward(tensor.from_numpy(x[:4])).numpy(), ref)
    # the file is plain npz (no pickle)
    with np.load(path, allow_pickle=False) as z:
        assert "conv1.W" in z.files and "bn1.running_mean" in z.files
    m.save_states(path, overwrite=True)
    small = model.Model()
    small.fc = layer.Linear(2, 3)
    with pytest.raises(InputError, match="lacks"):
        small.load_states(path)


def test_batchnorm_running_statistics_follow_onnx_momentum():
    bn = layer.BatchNorm2d(3, momentum=0.8)
    x = np.random.default_rng(0).standard_normal((4, 3, 2, 2)).astype(np.float64)
    bn.scale.data = bn.scale.data.astype(np.float64)
    bn.bias.data = bn.bias.data.astype(np.float64)
    bn.running_mean.data = np.full(3, 0.5)
    bn.running_var.data = np.full(3, 2.0)
    bn.train()
    y = bn(tensor.from_numpy(x)).numpy()
    mean, var = x.mean(axis=(0, 2, 3)), x.var(axis=(0, 2, 3))
    np.testing.assert_allclose(bn.running_mean.numpy(), 0.5 * 0.8 + mean * 0.2)
    np.testing.assert_allclose(bn.running_var.numpy(), 2.0 * 0.8 + var * 0.2)
    ref = (x - mean[None, :, None, None]) / np.sqrt(var[None, :, None, None] + 1e-5)
    np.testing.assert_allclose(y, ref, rtol=1e-6, atol=1e-7)
    bn.eval()
    before = bn.running_mean.numpy().copy()
    bn(tensor.from_numpy(x))
    np.testing.assert_array_equal(bn.running_mean.numpy(), before)


def test_fit_helper_trains(digits):
    from workbench.training import fit as wb_fit
    x, y = digits
    seeded(0)
    m = CNN()
    hist = wb_fit(m, x[:256], y[:256], epochs=2, batch_size=32,
                  optimizer=opt.SGD(lr=0.05, momentum=0.9), validation=(x[256:400],
                                                                       y[256:400]))
    assert len(hist["loss"]) == 2 and hist["loss"][1] < hist["loss"][0]
    assert 0.0 <= hist["val_accuracy"][-1] <= 1.0
