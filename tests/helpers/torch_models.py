"""Small, self-written PyTorch models used as sources of real ONNX graphs (tests and benchmarks).

No torchvision: the architectures are written here from their papers / the well-known reference
layouts, with deterministic weights (``torch.manual_seed``). BatchNorm layers get non-trivial
affine parameters and running statistics (one calibration pass in train mode, plus random
gamma/beta), so that BatchNorm folding in the engine is really exercised.

``torch`` is imported lazily: importing this module never requires it; calling a builder does.
Tests use ``pytest.importorskip("torch", reason=...)`` before calling anything here.

>>> from tests.helpers.torch_models import build, export_onnx   # doctest: +SKIP
>>> model, inputs = build("resnet18")                             # doctest: +SKIP
>>> proto = export_onnx(model, inputs, None, opset=17)            # doctest: +SKIP
"""

from __future__ import annotations

import io
import math
import os
import warnings
from collections.abc import Callable
from typing import Any

import numpy as np

MODEL_NAMES = ("resnet18", "mobilenetv2", "shufflenetv2", "bert", "gpt2")
CNN_NAMES = ("resnet18", "mobilenetv2", "shufflenetv2")


def _torch():
    import torch  # noqa: PLC0415  (lazy on purpose)

    return torch


# ----------------------------------------------------------------------------- weight helpers
def _calibrate_batchnorm(model, example, *, seed: int = 0) -> None:
    """Give every BatchNorm layer non-trivial affine params and running statistics.

    gamma ~ U(0.5, 1.5), beta ~ N(0, 0.1); running stats come from one forward pass in train
    mode with momentum 1.0 (the stats of that batch), then the layer's momentum is restored.
    The model is left in eval mode.
    """
    torch = _torch()
    nn = torch.nn
    gen = torch.Generator().manual_seed(seed)
    bns = [m for m in model.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)]
    with torch.no_grad():
        for bn in bns:
            bn.weight.copy_(torch.rand(bn.weight.shape, generator=gen) + 0.5)
            bn.bias.copy_(torch.randn(bn.bias.shape, generator=gen) * 0.1)
        saved = [bn.momentum for bn in bns]
        for bn in bns:
            bn.momentum = 1.0
        model.train()
        model(example)
        for bn, mom in zip(bns, saved):
            bn.momentum = mom
            # keep variances away from the degenerate case and the means off zero
            bn.running_var.clamp_(min=1e-3)
    model.eval()


def _make_divisible(v: float, divisor: int = 8, min_value: int | None = None) -> int:
    min_value = min_value or divisor
    new_v = max(min_value, int(v + divisor / 2) // divisor * divisor)
    if new_v < 0.9 * v:
        new_v += divisor
    return new_v


# ----------------------------------------------------------------------------- ResNet-18
def _resnet18_cls():
    torch = _torch()
    nn = torch.nn

    class BasicBlock(nn.Module):
        expansion = 1

        def __init__(self, inplanes, planes, stride=1, downsample=None):
            super().__init__()
            self.conv1 = nn.Conv2d(inplanes, planes, 3, stride, 1, bias=False)
            self.bn1 = nn.BatchNorm2d(planes)
            self.relu = nn.ReLU(inplace=True)
            self.conv2 = nn.Conv2d(planes, planes, 3, 1, 1, bias=False)
            self.bn2 = nn.BatchNorm2d(planes)
            self.downsample = downsample

        def forward(self, x):
            identity = x
            out = self.relu(self.bn1(self.conv1(x)))
            out = self.bn2(self.conv2(out))
            if self.downsample is not None:
                identity = self.downsample(x)
            return self.relu(out + identity)

    class ResNet18(nn.Module):
        """ResNet-18 (He et al. 2015), torchvision layout: BasicBlock x [2, 2, 2, 2]."""

        onnx_input_names = ("input",)
        onnx_output_names = ("logits",)
        onnx_dynamic_axes = {"input": {0: "batch"}, "logits": {0: "batch"}}

        def __init__(self, num_classes=1000):
            super().__init__()
            self.inplanes = 64
            self.conv1 = nn.Conv2d(3, 64, 7, 2, 3, bias=False)
            self.bn1 = nn.BatchNorm2d(64)
            self.relu = nn.ReLU(inplace=True)
            self.maxpool = nn.MaxPool2d(3, 2, 1)
            self.layer1 = self._make_layer(64, 2)
            self.layer2 = self._make_layer(128, 2, stride=2)
            self.layer3 = self._make_layer(256, 2, stride=2)
            self.layer4 = self._make_layer(512, 2, stride=2)
            self.avgpool = nn.AdaptiveAvgPool2d((1, 1))
            self.fc = nn.Linear(512, num_classes)
            for m in self.modules():
                if isinstance(m, nn.Conv2d):
                    nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")

        def _make_layer(self, planes, blocks, stride=1):
            downsample = None
            if stride != 1 or self.inplanes != planes:
                downsample = nn.Sequential(
                    nn.Conv2d(self.inplanes, planes, 1, stride, bias=False),
                    nn.BatchNorm2d(planes))
            layers = [BasicBlock(self.inplanes, planes, stride, downsample)]
            self.inplanes = planes
            layers += [BasicBlock(planes, planes) for _ in range(1, blocks)]
            return nn.Sequential(*layers)

        def forward(self, x):
            x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
            x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
            x = torch.flatten(self.avgpool(x), 1)
            return self.fc(x)

    return ResNet18


# ----------------------------------------------------------------------------- MobileNetV2
def _mobilenetv2_cls():
    torch = _torch()
    nn = torch.nn

    class ConvBNReLU6(nn.Sequential):
        def __init__(self, inp, out, kernel=3, stride=1, groups=1):
            super().__init__(
                nn.Conv2d(inp, out, kernel, stride, (kernel - 1) // 2, groups=groups, bias=False),
                nn.BatchNorm2d(out),
                nn.ReLU6(inplace=True))

    class InvertedResidual(nn.Module):
        def __init__(self, inp, oup, stride, expand_ratio):
            super().__init__()
            hidden = int(round(inp * expand_ratio))
            self.use_res_connect = stride == 1 and inp == oup
            layers = []
            if expand_ratio != 1:
                layers.append(ConvBNReLU6(inp, hidden, kernel=1))
            layers += [
                ConvBNReLU6(hidden, hidden, stride=stride, groups=hidden),  # depthwise
                nn.Conv2d(hidden, oup, 1, 1, 0, bias=False),                # linear bottleneck
                nn.BatchNorm2d(oup),
            ]
            self.conv = nn.Sequential(*layers)

        def forward(self, x):
            if self.use_res_connect:
                return x + self.conv(x)
            return self.conv(x)

    class MobileNetV2(nn.Module):
        """MobileNetV2 (Sandler et al. 2018), width multiplier 1.0, 1000 classes."""

        onnx_input_names = ("input",)
        onnx_output_names = ("logits",)
        onnx_dynamic_axes = {"input": {0: "batch"}, "logits": {0: "batch"}}

        def __init__(self, num_classes=1000, width_mult=1.0):
            super().__init__()
            setting = [  # t, c, n, s
                [1, 16, 1, 1], [6, 24, 2, 2], [6, 32, 3, 2], [6, 64, 4, 2],
                [6, 96, 3, 1], [6, 160, 3, 2], [6, 320, 1, 1],
            ]
            inp = _make_divisible(32 * width_mult)
            self.last_channel = _make_divisible(1280 * max(1.0, width_mult))
            features = [ConvBNReLU6(3, inp, stride=2)]
            for t, c, n, s in setting:
                out = _make_divisible(c * width_mult)
                for i in range(n):
                    features.append(InvertedResidual(inp, out, s if i == 0 else 1, t))
                    inp = out
            features.append(ConvBNReLU6(inp, self.last_channel, kernel=1))
            self.features = nn.Sequential(*features)
            self.classifier = nn.Sequential(nn.Dropout(0.2),
                                            nn.Linear(self.last_channel, num_classes))
            for m in self.modules():
                if isinstance(m, nn.Conv2d):
                    nn.init.kaiming_normal_(m.weight, mode="fan_out")
                elif isinstance(m, nn.Linear):
                    nn.init.normal_(m.weight, 0, 0.01)
                    nn.init.normal_(m.bias, 0, 0.01)

        def forward(self, x):
            x = self.features(x)
            x = nn.functional.adaptive_avg_pool2d(x, (1, 1))
            return self.classifier(torch.flatten(x, 1))

    return MobileNetV2


# ----------------------------------------------------------------------------- ShuffleNetV2
def _shufflenetv2_cls():
    torch = _torch()
    nn = torch.nn

    def channel_shuffle(x, groups: int):
        b, c, h, w = x.size()
        x = x.view(b, groups, c // groups, h, w)
        x = torch.transpose(x, 1, 2).contiguous()
        return x.view(b, -1, h, w)

    class ShuffleUnit(nn.Module):
        def __init__(self, inp, oup, stride):
            super().__init__()
            self.stride = stride
            bf = oup // 2
            if stride > 1:
                self.branch1 = nn.Sequential(
                    nn.Conv2d(inp, inp, 3, stride, 1, groups=inp, bias=False),
                    nn.BatchNorm2d(inp),
                    nn.Conv2d(inp, bf, 1, 1, 0, bias=False),
                    nn.BatchNorm2d(bf),
                    nn.ReLU(inplace=True))
            else:
                self.branch1 = nn.Sequential()
            self.branch2 = nn.Sequential(
                nn.Conv2d(inp if stride > 1 else bf, bf, 1, 1, 0, bias=False),
                nn.BatchNorm2d(bf),
                nn.ReLU(inplace=True),
                nn.Conv2d(bf, bf, 3, stride, 1, groups=bf, bias=False),
                nn.BatchNorm2d(bf),
                nn.Conv2d(bf, bf, 1, 1, 0, bias=False),
                nn.BatchNorm2d(bf),
                nn.ReLU(inplace=True))

        def forward(self, x):
            if self.stride == 1:
                x1, x2 = x.chunk(2, dim=1)
                out = torch.cat((x1, self.branch2(x2)), dim=1)
            else:
                out = torch.cat((self.branch1(x), self.branch2(x)), dim=1)
            return channel_shuffle(out, 2)

    class ShuffleNetV2(nn.Module):
        """ShuffleNetV2 x1.0 (Ma et al. 2018): repeats [4, 8, 4], channels [24,116,232,464,1024]."""

        onnx_input_names = ("input",)
        onnx_output_names = ("logits",)
        onnx_dynamic_axes = {"input": {0: "batch"}, "logits": {0: "batch"}}

        def __init__(self, num_classes=1000):
            super().__init__()
            repeats, chans = (4, 8, 4), (24, 116, 232, 464, 1024)
            self.conv1 = nn.Sequential(nn.Conv2d(3, chans[0], 3, 2, 1, bias=False),
                                       nn.BatchNorm2d(chans[0]), nn.ReLU(inplace=True))
            self.maxpool = nn.MaxPool2d(3, 2, 1)
            inp = chans[0]
            stages = []
            for n, out in zip(repeats, chans[1:4]):
                units = [ShuffleUnit(inp, out, 2)]
                units += [ShuffleUnit(out, out, 1) for _ in range(n - 1)]
                stages.append(nn.Sequential(*units))
                inp = out
            self.stage2, self.stage3, self.stage4 = stages
            self.conv5 = nn.Sequential(nn.Conv2d(inp, chans[-1], 1, 1, 0, bias=False),
                                       nn.BatchNorm2d(chans[-1]), nn.ReLU(inplace=True))
            self.fc = nn.Linear(chans[-1], num_classes)

        def forward(self, x):
            x = self.maxpool(self.conv1(x))
            x = self.stage4(self.stage3(self.stage2(x)))
            x = self.conv5(x).mean([2, 3])  # global average pool as ReduceMean
            return self.fc(x)

    return ShuffleNetV2


# ----------------------------------------------------------------------------- BERT-like
def _bert_cls():
    torch = _torch()
    nn = torch.nn

    class SelfAttention(nn.Module):
        def __init__(self, hidden, heads):
            super().__init__()
            self.heads, self.head_dim = heads, hidden // heads
            self.query = nn.Linear(hidden, hidden)
            self.key = nn.Linear(hidden, hidden)
            self.value = nn.Linear(hidden, hidden)
            self.out = nn.Linear(hidden, hidden)

        def _split(self, x):
            b, s, _ = x.shape
            return x.view(b, s, self.heads, self.head_dim).permute(0, 2, 1, 3)

        def forward(self, h, ext_mask):
            q, k, v = (self._split(lin(h)) for lin in (self.query, self.key, self.value))
            scores = torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(self.head_dim)
            probs = torch.softmax(scores + ext_mask, dim=-1)
            ctx = torch.matmul(probs, v).permute(0, 2, 1, 3).contiguous()
            b, s = ctx.shape[0], ctx.shape[1]
            return self.out(ctx.view(b, s, self.heads * self.head_dim))

    class EncoderLayer(nn.Module):
        def __init__(self, hidden, heads, inter, eps):
            super().__init__()
            self.attn = SelfAttention(hidden, heads)
            self.ln1 = nn.LayerNorm(hidden, eps=eps)
            self.ffn_in = nn.Linear(hidden, inter)
            self.act = nn.GELU()  # erf form
            self.ffn_out = nn.Linear(inter, hidden)
            self.ln2 = nn.LayerNorm(hidden, eps=eps)
            self.drop = nn.Dropout(0.1)

        def forward(self, h, ext_mask):
            h = self.ln1(h + self.drop(self.attn(h, ext_mask)))
            return self.ln2(h + self.drop(self.ffn_out(self.act(self.ffn_in(h)))))

    class TinyBert(nn.Module):
        """BERT-like encoder: 2 post-LN layers, hidden 64, 4 heads, pooler + classifier."""

        onnx_input_names = ("input_ids", "token_type_ids", "attention_mask")
        onnx_output_names = ("sequence_output", "logits")
        onnx_dynamic_axes = {
            "input_ids": {0: "batch", 1: "seq"},
            "token_type_ids": {0: "batch", 1: "seq"},
            "attention_mask": {0: "batch", 1: "seq"},
            "sequence_output": {0: "batch", 1: "seq"},
            "logits": {0: "batch"},
        }

        def __init__(self, vocab=1000, hidden=64, layers=2, heads=4, inter=256, max_pos=64,
                     type_vocab=2, num_labels=3, eps=1e-12):
            super().__init__()
            self.vocab, self.max_pos = vocab, max_pos
            self.word = nn.Embedding(vocab, hidden)
            self.position = nn.Embedding(max_pos, hidden)
            self.segment = nn.Embedding(type_vocab, hidden)
            self.emb_ln = nn.LayerNorm(hidden, eps=eps)
            self.emb_drop = nn.Dropout(0.1)
            self.layers = nn.ModuleList(EncoderLayer(hidden, heads, inter, eps)
                                        for _ in range(layers))
            self.pooler = nn.Linear(hidden, hidden)
            self.classifier = nn.Linear(hidden, num_labels)

        def forward(self, input_ids, token_type_ids, attention_mask):
            seq = input_ids.shape[1]
            pos = torch.arange(seq, dtype=torch.long, device=input_ids.device).unsqueeze(0)
            h = self.word(input_ids) + self.position(pos) + self.segment(token_type_ids)
            h = self.emb_drop(self.emb_ln(h))
            ext = (1.0 - attention_mask[:, None, None, :].to(h.dtype)) * -10000.0
            for layer in self.layers:
                h = layer(h, ext)
            pooled = torch.tanh(self.pooler(h[:, 0]))
            return h, self.classifier(pooled)

    return TinyBert


# ----------------------------------------------------------------------------- GPT-2-like
def _gpt2_cls():
    torch = _torch()
    nn = torch.nn

    class CausalSelfAttention(nn.Module):
        def __init__(self, hidden, heads):
            super().__init__()
            self.heads, self.head_dim, self.hidden = heads, hidden // heads, hidden
            self.c_attn = nn.Linear(hidden, 3 * hidden)
            self.c_proj = nn.Linear(hidden, hidden)

        def forward(self, x):
            b, s, _ = x.shape
            q, k, v = self.c_attn(x).split(self.hidden, dim=2)
            q, k, v = (t.view(b, s, self.heads, self.head_dim).transpose(1, 2) for t in (q, k, v))
            att = torch.matmul(q, k.transpose(-2, -1)) * (1.0 / math.sqrt(self.head_dim))
            # causal mask built in the graph from the (dynamic) sequence length
            idx = torch.arange(s, device=x.device)
            causal = idx[None, :] <= idx[:, None]
            att = att.masked_fill(~causal, torch.finfo(att.dtype).min)
            att = torch.softmax(att, dim=-1)
            y = torch.matmul(att, v).transpose(1, 2).contiguous().view(b, s, self.hidden)
            return self.c_proj(y)

    class Block(nn.Module):
        def __init__(self, hidden, heads, eps):
            super().__init__()
            self.ln_1 = nn.LayerNorm(hidden, eps=eps)
            self.attn = CausalSelfAttention(hidden, heads)
            self.ln_2 = nn.LayerNorm(hidden, eps=eps)
            self.fc = nn.Linear(hidden, 4 * hidden)
            self.act = nn.GELU(approximate="tanh")
            self.proj = nn.Linear(4 * hidden, hidden)

        def forward(self, x):
            x = x + self.attn(self.ln_1(x))
            return x + self.proj(self.act(self.fc(self.ln_2(x))))

    class TinyGPT2(nn.Module):
        """GPT-2-like decoder: 2 pre-LN blocks, hidden 64, 4 heads, LM head tied to wte."""

        onnx_input_names = ("input_ids",)
        onnx_output_names = ("logits",)
        onnx_dynamic_axes = {"input_ids": {0: "batch", 1: "seq"},
                             "logits": {0: "batch", 1: "seq"}}

        def __init__(self, vocab=1000, hidden=64, layers=2, heads=4, n_positions=64, eps=1e-5):
            super().__init__()
            self.vocab, self.max_pos = vocab, n_positions
            self.wte = nn.Embedding(vocab, hidden)
            self.wpe = nn.Embedding(n_positions, hidden)
            self.h = nn.ModuleList(Block(hidden, heads, eps) for _ in range(layers))
            self.ln_f = nn.LayerNorm(hidden, eps=eps)
            self.lm_head = nn.Linear(hidden, vocab, bias=False)
            self.lm_head.weight = self.wte.weight  # tied
            for m in self.modules():
                if isinstance(m, (nn.Linear, nn.Embedding)):
                    nn.init.normal_(m.weight, 0.0, 0.02 if isinstance(m, nn.Linear) else 0.1)
                    if getattr(m, "bias", None) is not None:
                        nn.init.normal_(m.bias, 0.0, 0.02)
                elif isinstance(m, nn.LayerNorm):
                    with torch.no_grad():
                        m.weight.uniform_(0.8, 1.2)
                        m.bias.normal_(0.0, 0.05)

        def forward(self, input_ids):
            s = input_ids.shape[1]
            pos = torch.arange(s, dtype=torch.long, device=input_ids.device)
            x = self.wte(input_ids) + self.wpe(pos)[None]
            for block in self.h:
                x = block(x)
            return self.lm_head(self.ln_f(x))

    return TinyGPT2


_CLASSES: dict[str, Callable[[], Any]] = {
    "resnet18": _resnet18_cls,
    "mobilenetv2": _mobilenetv2_cls,
    "shufflenetv2": _shufflenetv2_cls,
    "bert": _bert_cls,
    "gpt2": _gpt2_cls,
}


# ----------------------------------------------------------------------------- inputs
def example_inputs(name: str, batch: int = 1, *, seq: int = 8, image: int = 224,
                   seed: int = 0) -> tuple[np.ndarray, ...]:
    """Deterministic numpy inputs for model ``name`` (images NCHW float32, token ids int64)."""
    rng = np.random.default_rng(seed + 1000 * batch + seq)
    if name in CNN_NAMES:
        return (rng.standard_normal((batch, 3, image, image)).astype(np.float32),)
    if name == "bert":
        ids = rng.integers(0, 1000, size=(batch, seq), dtype=np.int64)
        types = np.zeros((batch, seq), dtype=np.int64)
        types[:, seq // 2:] = 1
        mask = np.ones((batch, seq), dtype=np.int64)
        for b in range(batch):  # right padding of varying length (row 0 unpadded)
            pad = b % max(seq // 2, 1)
            if pad:
                mask[b, seq - pad:] = 0
        return ids, types, mask
    if name == "gpt2":
        return (rng.integers(0, 1000, size=(batch, seq), dtype=np.int64),)
    raise KeyError(f"unknown model {name!r}; known: {', '.join(MODEL_NAMES)}")


def build(name: str, *, seed: int = 0):
    """Build model ``name`` in eval mode with deterministic weights.

    Returns ``(model, example)`` where ``example`` is a tuple of torch tensors (batch 1) suitable
    for ``export_onnx``.
    """
    torch = _torch()
    if name not in _CLASSES:
        raise KeyError(f"unknown model {name!r}; known: {', '.join(MODEL_NAMES)}")
    torch.manual_seed(seed)
    model = _CLASSES[name]()()
    if name in CNN_NAMES:
        # calibration batch at a reduced resolution keeps this cheap on 2 cores
        calib = torch.from_numpy(example_inputs(name, 4, image=96, seed=seed + 1)[0])
        _calibrate_batchnorm(model, calib, seed=seed)
    model.eval()
    example = tuple(torch.from_numpy(a) for a in example_inputs(name, 1, seed=seed))
    return model, example


def torch_forward(model, inputs) -> list[np.ndarray]:
    """Run ``model`` on numpy ``inputs`` (no grad) and return numpy outputs as a list."""
    torch = _torch()
    with torch.no_grad():
        out = model(*(torch.from_numpy(np.ascontiguousarray(a)) for a in inputs))
    if not isinstance(out, (tuple, list)):
        out = (out,)
    return [o.detach().cpu().numpy() for o in out]


# ----------------------------------------------------------------------------- export
def export_onnx(model, example_inputs, path_or_None=None, opset: int = 17,
                dynamic_batch: bool = True, *, dynamic_seq: bool = True,
                input_names=None, output_names=None, external_data: bool = False,
                keep_batchnorm: bool = True):
    """Export ``model`` with the TorchScript exporter (``dynamo=False``) and return the proto.

    * ``example_inputs``: tuple of torch tensors (or numpy arrays) used for tracing.
    * ``path_or_None``: also write the model there (atomically, via a temporary file).
    * ``dynamic_batch``: axis 0 of every input/output is symbolic (``batch``); for sequence
      models axis 1 is symbolic too unless ``dynamic_seq=False``.
    * Weights are stored as initializers inside the proto; with ``external_data=True`` (and a
      path) they are written to ``<name>.data`` beside the file instead.
    * ``keep_batchnorm``: export with ``TrainingMode.PRESERVE`` on the eval-mode model, so that
      BatchNormalization nodes are kept (the exporter would otherwise fold them into Conv);
      the engine's own folding is then what gets tested.

    The torch.export-based exporter (the default since torch 2.9) needs ``onnxscript``; the
    legacy exporter works offline with torch alone, hence ``dynamo=False``.
    """
    torch = _torch()
    import onnx  # noqa: PLC0415

    example = tuple(torch.from_numpy(a) if isinstance(a, np.ndarray) else a
                    for a in example_inputs)
    in_names = list(input_names or getattr(model, "onnx_input_names", None)
                    or [f"input_{i}" for i in range(len(example))])
    out_names = list(output_names or getattr(model, "onnx_output_names", None) or ["output"])
    dyn = None
    if dynamic_batch:
        spec = getattr(model, "onnx_dynamic_axes", None)
        if spec:
            dyn = {k: {ax: nm for ax, nm in v.items() if nm == "batch" or dynamic_seq}
                   for k, v in spec.items()}
        else:
            dyn = {n: {0: "batch"} for n in in_names + out_names}
    kwargs = dict(opset_version=opset, input_names=in_names, output_names=out_names,
                  dynamic_axes=dyn, do_constant_folding=True, dynamo=False)
    if keep_batchnorm:
        kwargs["training"] = torch.onnx.TrainingMode.PRESERVE
    model.eval()
    buf = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with torch.no_grad():
            torch.onnx.export(model, example, buf, **kwargs)
    proto = onnx.load_from_string(buf.getvalue())
    for t in proto.graph.initializer:
        if t.data_location == onnx.TensorProto.EXTERNAL:
            raise AssertionError(f"exporter wrote initializer {t.name!r} as external data")
    if path_or_None is not None:
        path = os.fspath(path_or_None)
        folder = os.path.dirname(os.path.abspath(path))
        tmp = os.path.join(folder, f".{os.path.basename(path)}.tmp-{os.getpid()}")
        if external_data:
            onnx.save_model(proto, tmp, save_as_external_data=True, all_tensors_to_one_file=True,
                            location=os.path.basename(path) + ".data", size_threshold=0)
        else:
            onnx.save_model(proto, tmp)
        os.replace(tmp, path)
        if external_data:  # the returned proto references the data file
            proto = onnx.load_model(path, load_external_data=False)
    return proto


def build_and_export(name: str, opset: int = 17, *, seed: int = 0, dynamic_batch: bool = True):
    """``(model, proto)`` for model ``name`` exported at ``opset``."""
    model, example = build(name, seed=seed)
    return model, export_onnx(model, example, None, opset=opset, dynamic_batch=dynamic_batch)
