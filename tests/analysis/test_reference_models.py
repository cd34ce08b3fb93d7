"""Counts on full-size ResNet-18 / MobileNetV2 / a small BERT exported from PyTorch, against
PyTorch's own parameter counts, hand counts of MACs per layer taken with forward hooks, and the
published figures (ResNet-18: 1.82 GMACs, 11.69 M parameters at 224x224; MobileNetV2: 0.30
GMACs, 3.50 M). The architectures are plain torch.nn (``tests/helpers/torch_models.py``,
torchvision's layouts; torchvision does not install beside this torch)."""

from __future__ import annotations

import pytest

from workbench.analysis import analyze

PUBLISHED = {"resnet18": (1.82e9, 11.69e6), "mobilenetv2": (0.30e9, 3.50e6)}


def _hand_macs(model, example) -> int:
    """MACs of every Conv2d (Cout*Hout*Wout*Cin/groups*kh*kw) and Linear (in*out per token),
    counted from the shapes PyTorch itself sees."""
    import torch  # noqa: PLC0415

    total = [0]

    def conv(m, inp, out):
        kh, kw = m.kernel_size
        total[0] += out.numel() * (m.in_channels // m.groups) * kh * kw

    def linear(m, inp, out):
        total[0] += out.numel() * m.in_features

    hooks = []
    for m in model.modules():
        if isinstance(m, torch.nn.Conv2d):
            hooks.append(m.register_forward_hook(conv))
        elif isinstance(m, torch.nn.Linear):
            hooks.append(m.register_forward_hook(linear))
    with torch.no_grad():
        model(*example)
    for h in hooks:
        h.remove()
    return total[0]


@pytest.mark.parametrize("name", ["resnet18", "mobilenetv2"])
def test_cnn_counts_match_pytorch_and_published(torch_exports, name):
    model, example = torch_exports.model(name)
    proto = torch_exports.proto(name)
    a = analyze(proto, {"input": (1, 3, 224, 224)})
    t = a.totals()
    torch_params = sum(p.numel() for p in model.parameters())
    torch_buffers = sum(b.numel() for n, b in model.named_buffers()
                        if n.endswith(("running_mean", "running_var")))
    hand = _hand_macs(model, example)
    # BatchNormalization kept in the export: parameters and buffers exactly PyTorch's
    assert t["params"] == torch_params
    assert t["buffers"] == torch_buffers
    assert t["params_in_constants"] == 0
    assert abs(t["macs"] - hand) <= 0.01 * hand
    macs, params = PUBLISHED[name]
    assert abs(t["macs"] - macs) <= 0.01 * macs, t["macs"]
    assert abs(t["params"] - params) <= 0.01 * params, t["params"]
    # per layer: every Conv / Gemm row is the hand formula from its own shapes
    conv_rows = [r for r in a.records if r["op"] in ("Conv", "Gemm")]
    assert sum(r["macs"] for r in conv_rows) == t["macs"]
    # group sums add up to the totals
    groups = a.groups()
    assert int(groups["macs"].sum()) == t["macs"]


def test_resnet18_with_batchnorm_folded_by_the_engine(torch_exports):
    """The optimised graph (BatchNorm folded into FusedConv) keeps the MACs and moves fewer
    bytes; its parameters are within 1 % (BN's scale and shift become a conv bias)."""
    proto = torch_exports.proto("resnet18")
    plain = analyze(proto, {"input": (1, 3, 224, 224)})
    opt = analyze(proto, {"input": (1, 3, 224, 224)}, optimized=True)
    assert opt.totals()["macs"] == plain.totals()["macs"]
    p0, p1 = plain.totals()["params"], opt.totals()["params"]
    assert abs(p1 - p0) <= 0.01 * p0
    assert opt.totals()["bytes_written"] < plain.totals()["bytes_written"]
    # FusedConv, or its channels-last form when the layout pass runs ResNet channels-last
    assert {r["op"] for r in opt.records} & {"com.workbench::FusedConv",
                                              "com.workbench::NhwcConv"}


def test_bert_linear_layers_cost_in_times_out_per_token(torch_exports):
    import torch  # noqa: PLC0415

    model, _ = torch_exports.model("bert")
    proto = torch_exports.proto("bert")
    batch, seq = 2, 16
    a = analyze(proto, dims={"batch": batch, "seq": seq})
    linears = [m for m in model.modules() if isinstance(m, torch.nn.Linear)]
    # the exporter merges value-identical weights (the LayerNorms' fresh ones and zeros) into
    # one initializer, and a weight is counted once: PyTorch's count of distinct tensors
    distinct = {(tuple(p.shape), p.detach().numpy().tobytes()): p.numel()
                for p in model.parameters()}
    assert a.totals()["params"] == sum(distinct.values())
    # the exporter writes Linear as MatMul (+ Add) on [batch, seq, in]; the pooler's and the
    # classifier's Linear run on one token per sequence (Gemm)
    per_token = sum(m.in_features * m.out_features for m in linears
                    if m.in_features * m.out_features > 0)
    mm = sum(r["macs"] for r in a.records if r["op"] == "MatMul" and r["params"])
    gemm = sum(r["macs"] for r in a.records if r["op"] == "Gemm")
    tail = sum(m.in_features * m.out_features for m in linears[-2:])
    assert mm == batch * seq * (per_token - tail)
    assert gemm == batch * tail


def test_onnx_light_resnet50_matches_published_counts():
    """onnx's own light ResNet-50 (weights made by ConstantOfShape at run time): 25.56 M
    parameters (torchvision's 25,557,032) and 4.1 GMACs at 224x224."""
    import os

    import onnx.backend.test

    path = os.path.join(os.path.dirname(onnx.backend.test.__file__), "data", "light",
                        "light_resnet50.onnx")
    if not os.path.exists(path):
        pytest.skip("this onnx package ships no light models")
    t = analyze(path, default_dim=1).totals()
    assert t["params"] == 25_557_032
    assert abs(t["macs"] - 4.09e9) <= 0.01 * 4.09e9


def test_bert_optimised_graph_keeps_the_macs(torch_exports):
    """The engine's FusedAttention (head split and merge folded in, its head shapes computed
    from Shape ops at run time) and FusedMatMul count the MACs of the nodes they replace."""
    proto = torch_exports.proto("bert")
    plain = analyze(proto, dims={"batch": 2, "seq": 16})
    opt = analyze(proto, dims={"batch": 2, "seq": 16}, optimized=True)
    ops = {r["op"] for r in opt.records}
    assert "com.workbench::FusedAttention" in ops
    assert opt.totals()["nodes_without_flops"] == 0
    assert opt.totals()["macs"] == plain.totals()["macs"]
