"""Whole-model gradients against PyTorch (CPU, float64).

The torch models of ``tests/helpers/torch_models.py`` are exported to ONNX in float64, imported
with ``sonnx.SONNXModel``, and trained one step on both sides with the same loss; every
parameter's gradient must match within 1e-4 (max abs difference relative to the largest torch
gradient of that parameter). ONNX initializers are matched to torch parameters by value (the
exporter renames and transposes some), so every parameter is first perturbed to be unique.
"""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="PyTorch CPU is the gradient oracle")

from tests.helpers.torch_models import build, example_inputs, export_onnx  # noqa: E402
from workbench import autograd, sonnx, tensor  # noqa: E402


def _export_double(name, example_np, train):
    model, _ = build(name)
    model = model.double()
    gen = torch.Generator().manual_seed(7)
    with torch.no_grad():
        for p in model.parameters():  # make every parameter distinct (no initializer dedup)
            p.add_(torch.randn(p.shape, generator=gen, dtype=p.dtype) * 1e-2)
    ex = tuple(torch.from_numpy(a) for a in example_np)
    proto = export_onnx(model, ex, None, opset=17)
    model.train(train)
    return model, proto


def _match(proto_params, torch_params):
    """{initializer name: (torch name, transposed?)} matched by value."""
    out = {}
    for name, a in proto_params.items():
        for tn, p in torch_params.items():
            pv = p.detach().numpy()
            if pv.shape == a.shape and np.allclose(pv, a, rtol=0, atol=1e-12):
                out[name] = (tn, False)
                break
            if pv.ndim == 2 and pv.T.shape == a.shape and np.allclose(pv.T, a, rtol=0,
                                                                    atol=1e-12):
                out[name] = (tn, True)
                break
    return out


def _put(device, a):
    return tensor.Tensor(data=a, device=device)


def _compare(model, m, loss_t, loss_w, ours_pairs, floor=0.0):
    """``floor``: relative to the largest gradient of the whole model, the magnitude under
    which a parameter's gradient is numerically zero (BatchNorm biases followed by a conv and
    another training-mode BatchNorm have an exactly-zero true gradient)."""
    loss_t.backward()
    tparams = dict(model.named_parameters())
    ours = {p.name: tensor.to_numpy(g) for p, g in ours_pairs}
    mapping = _match({k: tensor.to_numpy(v) for k, v in m.imported_params().items()}, tparams)
    assert len(mapping) == len(m.imported_params()), \
        f"unmatched initializers: {set(m.imported_params()) - set(mapping)}"
    assert {v[0] for v in mapping.values()} == set(tparams), "torch params not all covered"
    assert abs(np.asarray(loss_w).item() - loss_t.item()) <= 1e-9 * max(1.0, abs(loss_t.item()))
    worst = 0.0
    overall = max(float(np.abs(p.grad.numpy()).max()) for p in tparams.values())
    for name, (tn, transposed) in mapping.items():
        gt = tparams[tn].grad.numpy()
        if transposed:
            gt = gt.T
        go = ours[name]
        scale = max(float(np.abs(gt).max()), floor * overall, 1e-12)
        err = float(np.abs(go - gt).max()) / scale
        worst = max(worst, err)
        assert err <= 1e-4, f"{name} ({tn}): relative error {err:.2e}"
    return worst


@pytest.mark.slow
def test_resnet18_training_gradients_match_torch(device):
    """On the CPU, and on CUDA:0 where a GPU is present (``device`` fixture), in float64."""
    x = example_inputs("resnet18", 2, image=64, seed=3)[0].astype(np.float64)
    labels = np.array([3, 917])
    model, proto = _export_double("resnet18", (x,), train=True)
    out_t = model(torch.from_numpy(x))
    loss_t = torch.nn.functional.cross_entropy(out_t, torch.from_numpy(labels))

    m = sonnx.SONNXModel(proto, device=device)
    m.train()
    out = m.forward(_put(device, x))[0]
    loss = autograd.softmax_cross_entropy(out, _put(device, labels))
    pairs = autograd.backward(loss)
    _compare(model, m, loss_t, tensor.to_numpy(loss), pairs)
    # train-mode BatchNorm updated the running mean exactly as torch did (ONNX momentum 0.9 =
    # torch momentum 0.1; the variances differ on purpose: ONNX uses the biased batch variance)
    for bn in ("bn1", "layer3.1.bn2"):
        ours = tensor.to_numpy(m.get_states()[f"{bn}.running_mean"])
        theirs = dict(model.named_buffers())[f"{bn}.running_mean"].detach().numpy()
        # (the momentum attribute is a float32 in ONNX: 0.9f differs from 0.9 by 2e-8)
        np.testing.assert_allclose(ours, theirs, rtol=1e-6, atol=1e-8)


@pytest.mark.slow
def test_bert_gradients_match_torch(device):
    """On the CPU, and on CUDA:0 where a GPU is present (``device`` fixture), in float64."""
    ids, types, mask = example_inputs("bert", 2, seq=8, seed=5)
    labels = np.array([2, 0])
    model, proto = _export_double("bert", (ids, types, mask), train=False)
    seq_t, logits_t = model(*(torch.from_numpy(a) for a in (ids, types, mask)))
    w = np.random.default_rng(0).standard_normal(seq_t.shape)
    loss_t = torch.nn.functional.cross_entropy(logits_t, torch.from_numpy(labels)) + (
        seq_t * torch.from_numpy(w)).sum() * 0.01

    m = sonnx.SONNXModel(proto, device=device)
    m.eval()
    seq, logits = m.forward(*(_put(device, a) for a in (ids, types, mask)))
    loss = autograd.softmax_cross_entropy(logits, _put(device, labels)) + autograd.reduce_sum(
        seq * _put(device, w)) * 0.01
    pairs = autograd.backward(loss)
    _compare(model, m, loss_t, tensor.to_numpy(loss), pairs)


@pytest.mark.slow
@pytest.mark.parametrize("name, train", [("mobilenetv2", False), ("shufflenetv2", True)])
def test_light_cnns_gradients_match_torch(name, train):
    """Depthwise convolutions, ReLU6 as Clip, channel shuffle (Reshape/Transpose), Slice."""
    x = example_inputs(name, 2, image=64, seed=4)[0].astype(np.float64)
    labels = np.array([5, 999])
    model, proto = _export_double(name, (x,), train=train)
    loss_t = torch.nn.functional.cross_entropy(model(torch.from_numpy(x)),
                                               torch.from_numpy(labels))
    m = sonnx.SONNXModel(proto)
    m.train(train)
    loss = autograd.softmax_cross_entropy(m.forward(tensor.from_numpy(x))[0], labels)
    _compare(model, m, loss_t, loss.numpy(), autograd.backward(loss), floor=1e-9)
