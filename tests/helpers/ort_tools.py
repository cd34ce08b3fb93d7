"""Models rewritten at test time by onnxruntime's own tools (quantizer, transformer optimizer,
float16 converter, 4-bit weight quantizer), starting from tiny PyTorch exports.

Everything is built into a caller-given folder (``tmp_path``); torch and onnxruntime are
imported lazily so that importing this module needs neither.
"""

from __future__ import annotations

import os

import numpy as np


def _torch():
    import torch  # noqa: PLC0415

    return torch


# ----------------------------------------------------------------------------- tiny sources
def tiny_cnn():
    """A small CNN with the ops QOperator quantization turns into com.microsoft nodes:
    Conv, Sigmoid, LeakyRelu, Add, Mul, AveragePool, Concat, GlobalAveragePool, Gemm, Softmax."""
    torch = _torch()
    nn = torch.nn

    class TinyCNN(nn.Module):
        onnx_input_names = ("image",)
        onnx_output_names = ("probs",)

        def __init__(self):
            super().__init__()
            self.c1 = nn.Conv2d(3, 8, 3, padding=1)
            self.c2 = nn.Conv2d(8, 8, 3, padding=1)
            self.c3 = nn.Conv2d(8, 8, 1)
            self.act = nn.LeakyReLU(0.1)
            self.pool = nn.AvgPool2d(2)
            self.fc = nn.Linear(16, 5)

        def forward(self, x):
            a = self.act(self.c1(x))
            b = torch.sigmoid(self.c2(a))
            c = a + b
            d = c * self.c3(c)
            d = self.pool(d)
            e = torch.cat([d, self.pool(c)], dim=1)
            g = torch.nn.functional.adaptive_avg_pool2d(e, 1).flatten(1)  # GlobalAveragePool
            return torch.softmax(self.fc(g), dim=-1)

    torch.manual_seed(0)
    return TinyCNN().eval(), (torch.randn(1, 3, 16, 16),)


def tiny_mlp():
    torch = _torch()
    nn = torch.nn

    class TinyMLP(nn.Module):
        onnx_input_names = ("x",)
        onnx_output_names = ("y",)

        def __init__(self):
            super().__init__()
            self.l1 = nn.Linear(20, 32)
            self.l2 = nn.Linear(32, 32)
            self.l3 = nn.Linear(32, 4)

        def forward(self, x):
            h = torch.relu(self.l1(x))
            h = torch.nn.functional.gelu(self.l2(h))
            return self.l3(h) @ torch.ones(4, 4) + torch.matmul(h, h.new_ones(32, 4))

    torch.manual_seed(0)
    return TinyMLP().eval(), (torch.randn(2, 20),)


def tiny_lstm():
    torch = _torch()
    nn = torch.nn

    class TinyLSTM(nn.Module):
        onnx_input_names = ("x",)
        onnx_output_names = ("y",)
        onnx_dynamic_axes = {"x": {0: "batch"}, "y": {0: "batch"}}

        def __init__(self):
            super().__init__()
            self.lstm = nn.LSTM(6, 12, batch_first=True, bidirectional=True)
            self.fc = nn.Linear(24, 3)

        def forward(self, x):
            y, _ = self.lstm(x)
            return self.fc(y)

    torch.manual_seed(0)
    return TinyLSTM().eval(), (torch.randn(2, 5, 6),)


def tiny_rmsnet():
    """RMSNorm blocks with residuals and a QuickGELU (x * sigmoid(1.702 x)), the patterns the
    transformer optimizer fuses into SimplifiedLayerNormalization,
    SkipSimplifiedLayerNormalization and QuickGelu (T5 / LLaMA / CLIP style)."""
    torch = _torch()
    nn = torch.nn

    class RMSNorm(nn.Module):
        def __init__(self, h):
            super().__init__()
            self.weight = nn.Parameter(torch.rand(h) + 0.5)

        def forward(self, x):
            return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * self.weight

    class TinyRMSNet(nn.Module):
        onnx_input_names = ("x",)
        onnx_output_names = ("y",)
        onnx_dynamic_axes = {"x": {0: "batch"}, "y": {0: "batch"}}

        def __init__(self):
            super().__init__()
            self.n1, self.l1 = RMSNorm(32), nn.Linear(32, 32)
            self.n2, self.l2 = RMSNorm(32), nn.Linear(32, 32)

        def forward(self, x):
            h = x + self.l1(self.n1(x))
            h2 = h * torch.sigmoid(1.702 * h)
            return self.n2(h2 + self.l2(h2))

    torch.manual_seed(0)
    return TinyRMSNet().eval(), (torch.randn(2, 4, 32),)


SOURCES = {"cnn": tiny_cnn, "mlp": tiny_mlp, "lstm": tiny_lstm, "rmsnet": tiny_rmsnet}


def export(name: str, folder, opset: int = 17) -> str:
    """Export tiny model ``name`` (cnn, mlp, lstm, rmsnet, bert, gpt2) to ``folder/name.onnx``."""
    from tests.helpers import torch_models as tm

    path = os.path.join(os.fspath(folder), f"{name}.onnx")
    if name in SOURCES:
        model, example = SOURCES[name]()
    else:
        model, example = tm.build(name)
    tm.export_onnx(model, example, path, opset=opset, keep_batchnorm=False)
    return path


def feeds_for(name: str, batch: int = 2, seed: int = 0) -> dict:
    rng = np.random.default_rng(seed)
    if name == "cnn":
        return {"image": rng.standard_normal((batch, 3, 16, 16)).astype(np.float32)}
    if name == "mlp":
        return {"x": rng.standard_normal((batch, 20)).astype(np.float32)}
    if name == "lstm":
        return {"x": rng.standard_normal((batch, 5, 6)).astype(np.float32)}
    if name == "rmsnet":
        return {"x": rng.standard_normal((batch, 4, 32)).astype(np.float32)}
    from tests.helpers import torch_models as tm

    arrays = tm.example_inputs(name, batch, seq=8, seed=seed)
    names = ("input_ids", "token_type_ids", "attention_mask") if name == "bert" else ("input_ids",)
    return dict(zip(names, arrays))


class _Reader:
    """A tiny onnxruntime CalibrationDataReader over a few random batches."""

    def __init__(self, name, n=4):
        self._it = iter([feeds_for(name, batch=1, seed=100 + i) for i in range(n)])

    def get_next(self):
        return next(self._it, None)


# ----------------------------------------------------------------------------- the tools
def quantize_dynamic(src: str, dst: str, *, weight_type="uint8", per_channel=False, **kw) -> str:
    from onnxruntime.quantization import QuantType
    from onnxruntime.quantization import quantize_dynamic as qd

    qt = QuantType.QUInt8 if weight_type == "uint8" else QuantType.QInt8
    qd(src, dst, weight_type=qt, per_channel=per_channel, **kw)
    return dst


def quantize_static(src: str, dst: str, name: str, *, fmt="QOperator", activation="uint8",
                    weight="int8", per_channel=False, **kw) -> str:
    from onnxruntime.quantization import QuantFormat, QuantType
    from onnxruntime.quantization import quantize_static as qs
    from onnxruntime.quantization.shape_inference import quant_pre_process

    pre = dst + ".pre.onnx"
    quant_pre_process(src, pre, skip_symbolic_shape=True)
    qt = {"uint8": QuantType.QUInt8, "int8": QuantType.QInt8, "uint16": QuantType.QUInt16,
          "int16": QuantType.QInt16}
    qs(pre, dst, _Reader(name), quant_format=getattr(QuantFormat, fmt),
       activation_type=qt[activation], weight_type=qt[weight], per_channel=per_channel, **kw)
    return dst


def optimize_transformer(src: str, dst: str, model_type: str, *, num_heads=4, hidden=64,
                         opt_level=1, use_gpu=False, **options) -> str:
    from onnxruntime.transformers.fusion_options import FusionOptions
    from onnxruntime.transformers.optimizer import optimize_model

    fo = FusionOptions(model_type)
    for k, v in options.items():
        setattr(fo, k, v)
    opt = optimize_model(src, model_type=model_type, num_heads=num_heads, hidden_size=hidden,
                         opt_level=opt_level, optimization_options=fo, use_gpu=use_gpu,
                         only_onnxruntime=False)
    opt.save_model_to_file(dst)
    return dst


def to_float16(src: str, dst: str, *, keep_io_types=True, **kw) -> str:
    import onnx
    from onnxruntime.transformers.float16 import convert_float_to_float16

    m = onnx.load(src)
    m16 = convert_float_to_float16(m, keep_io_types=keep_io_types, **kw)
    onnx.save(m16, dst)
    return dst


def quantize_4bit(src: str, dst: str, *, block_size=32, is_symmetric=True, **kw) -> str:
    import onnx
    from onnxruntime.quantization.matmul_nbits_quantizer import MatMulNBitsQuantizer

    q = MatMulNBitsQuantizer(onnx.load(src), block_size=block_size, is_symmetric=is_symmetric,
                             **kw)
    q.process()
    q.model.save_model_to_file(dst, use_external_data_format=False)
    return dst


def op_histogram(path: str) -> dict:
    import collections

    import onnx

    m = onnx.load(path)
    c = collections.Counter(f"{n.domain or 'ai.onnx'}::{n.op_type}" for n in m.graph.node)
    return dict(c)
