"""Models for the graph-drawing tests and benchmark (tests/browser/test_graph_drawing.py,
benchmarks/bench_viewer.py): what exporters really emit, at small sizes.

- :func:`gpt2_like`: the GPT-2-like decoder of ``torch_models`` with 5 blocks, exported by
  torch.onnx (TorchScript exporter): ~440 nodes, ~140 of them Constant, Shape -> Gather ->
  Unsqueeze -> Concat -> Reshape chains in every attention block.
- :func:`densenet_like`: a DenseNet (torchvision's module names: features.denseblockN.
  denselayerM, transitionN, classifier) exported by torch.onnx with dynamic batch.
- :func:`paddle_ocr_like`: a PaddleOCR-style recognizer written with onnx.helper in
  paddle2onnx's naming (nodes ``p2o.Conv.3``, values ``conv2d_3.tmp_0``, every shape and
  scalar a Constant node): a MobileNet-ish backbone, a sequence neck (Reshape/Transpose +
  MatMul), a CTC head.
- :func:`big_graph`: a generated graph of ``n`` nodes (transformer-ish blocks with scoped
  names, shape chains and constants), for the scale benchmark.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper


def gpt2_like(layers: int = 5) -> onnx.ModelProto:
    import torch

    from tests.helpers import torch_models as tm

    torch.manual_seed(0)
    model = tm._CLASSES["gpt2"]()(layers=layers).eval()
    example = tuple(torch.from_numpy(a) for a in tm.example_inputs("gpt2", 1))
    return tm.export_onnx(model, example)


def densenet_like(growth: int = 8, blocks=(3, 4, 4), classes: int = 10) -> onnx.ModelProto:
    from collections import OrderedDict

    import torch
    from torch import nn

    from tests.helpers import torch_models as tm

    class DenseLayer(nn.Module):
        def __init__(self, cin):
            super().__init__()
            self.norm1 = nn.BatchNorm2d(cin)
            self.relu1 = nn.ReLU()
            self.conv1 = nn.Conv2d(cin, 4 * growth, 1, bias=False)
            self.norm2 = nn.BatchNorm2d(4 * growth)
            self.relu2 = nn.ReLU()
            self.conv2 = nn.Conv2d(4 * growth, growth, 3, padding=1, bias=False)

        def forward(self, feats):
            x = torch.cat(feats, 1)
            return self.conv2(self.relu2(self.norm2(self.conv1(self.relu1(self.norm1(x))))))

    class DenseBlock(nn.ModuleDict):
        def __init__(self, n, cin):
            super().__init__()
            for i in range(n):
                self.add_module(f"denselayer{i + 1}", DenseLayer(cin + i * growth))

        def forward(self, x):
            feats = [x]
            for layer in self.values():
                feats.append(layer(feats))
            return torch.cat(feats, 1)

    class Transition(nn.Sequential):
        def __init__(self, cin, cout):
            super().__init__()
            self.add_module("norm", nn.BatchNorm2d(cin))
            self.add_module("relu", nn.ReLU())
            self.add_module("conv", nn.Conv2d(cin, cout, 1, bias=False))
            self.add_module("pool", nn.AvgPool2d(2, 2))

    class DenseNet(nn.Module):
        def __init__(self):
            super().__init__()
            c = 2 * growth
            layers = [
                ("conv0", nn.Conv2d(3, c, 7, 2, 3, bias=False)),
                ("norm0", nn.BatchNorm2d(c)),
                ("relu0", nn.ReLU()),
                ("pool0", nn.MaxPool2d(3, 2, 1)),
            ]
            for b, n in enumerate(blocks):
                layers.append((f"denseblock{b + 1}", DenseBlock(n, c)))
                c += n * growth
                if b + 1 < len(blocks):
                    layers.append((f"transition{b + 1}", Transition(c, c // 2)))
                    c //= 2
            layers.append(("norm5", nn.BatchNorm2d(c)))
            self.features = nn.Sequential(OrderedDict(layers))
            self.classifier = nn.Linear(c, classes)

        def forward(self, x):
            f = torch.relu(self.features(x))
            f = nn.functional.adaptive_avg_pool2d(f, (1, 1))
            # the exporters' favourite: a shape computed in the graph (Shape, Gather, Concat,
            # ConstantOfShape...) for a reshape with a dynamic batch
            f = f.reshape(f.shape[0], -1) + torch.zeros(f.shape[0], f.shape[1])
            return self.classifier(f)

    torch.manual_seed(0)
    m = DenseNet().eval()
    x = torch.randn(1, 3, 64, 64)
    return tm.export_onnx(m, (x,), input_names=["image"], output_names=["logits"])


def paddle_ocr_like(stages: int = 4, blocks: int = 3, seed: int = 0) -> onnx.ModelProto:
    rng = np.random.default_rng(seed)
    nodes, inits = [], []
    counters: dict = {}

    def uid(kind):
        counters[kind] = counters.get(kind, -1) + 1
        return counters[kind]

    def const(arr):
        k = uid("Constant")
        out = f"p2o.Constant.{k}.out"
        nodes.append(
            helper.make_node(
                "Constant",
                [],
                [out],
                name=f"p2o.Constant.{k}",
                value=numpy_helper.from_array(np.asarray(arr)),
            )
        )
        return out

    def op(op_type, ins, layer, **attrs):
        k = uid(op_type)
        n = uid(layer)
        out = f"{layer}_{n}.tmp_0"
        nodes.append(helper.make_node(op_type, ins, [out], name=f"p2o.{op_type}.{k}", **attrs))
        return out

    def weight(layer, shape):
        name = f"{layer}_{uid(layer + '.w')}.w_0"
        inits.append(
            numpy_helper.from_array((rng.standard_normal(shape) * 0.1).astype(np.float32), name)
        )
        return name

    def conv_bn(x, cin, cout, k=3, stride=1, act=True):
        y = op(
            "Conv",
            [x, weight("conv2d", (cout, cin, k, k))],
            "conv2d",
            kernel_shape=[k, k],
            strides=[stride, stride],
            pads=[k // 2] * 4,
        )
        y = op(
            "BatchNormalization",
            [
                y,
                weight("batch_norm", (cout,)),
                weight("batch_norm", (cout,)),
                weight("batch_norm", (cout,)),
                const(np.ones(cout, np.float32)),
            ],
            "batch_norm",
        )
        if act:
            # hard-swish as paddle2onnx writes it: x * clip(x + 3, 0, 6) / 6, constants inline
            t = op("Add", [y, const(np.float32(3.0))], "elementwise_add")
            t = op("Clip", [t, const(np.float32(0.0)), const(np.float32(6.0))], "clip")
            t = op("Mul", [y, t], "elementwise_mul")
            y = op("Div", [t, const(np.float32(6.0))], "elementwise_div")
        return y

    x = conv_bn("x", 3, 8, stride=2)
    c = 8
    for s in range(stages):
        for b in range(blocks):
            stride = 2 if b == 0 and s else 1
            cout = c * 2 if b == 0 and s else c
            y = conv_bn(x, c, cout, k=1)
            y = conv_bn(y, cout, cout, k=3, stride=stride)
            y = conv_bn(y, cout, cout, k=1, act=False)
            x = op("Add", [x, y], "elementwise_add") if cout == c and stride == 1 else y
            c = cout
    # neck: [N, C, H, W] -> [N, W, C*H] with a shape computed in the graph
    shp = op("Shape", [x], "shape")
    n = op("Gather", [shp, const(np.int64(0))], "slice", axis=0)
    n = op("Unsqueeze", [n, const(np.array([0], np.int64))], "unsqueeze2")
    tgt = op(
        "Concat",
        [n, const(np.array([-1], np.int64)), const(np.array([c], np.int64))],
        "concat",
        axis=0,
    )
    t = op("Transpose", [x], "transpose2", perm=[0, 3, 1, 2])
    seq = op("Reshape", [t, tgt], "reshape2")
    h = op("MatMul", [seq, weight("linear", (c, 48))], "linear")
    h = op("Add", [h, weight("linear", (48,))], "linear")
    h = op("Relu", [h], "relu")
    logits = op("MatMul", [h, weight("linear", (48, 97))], "linear")
    logits = op("Add", [logits, weight("linear", (97,))], "linear")
    prob = op("Softmax", [logits], "softmax", axis=2)
    nodes.append(helper.make_node("Identity", [prob], ["softmax_out"], name="p2o.Identity.0"))
    g = helper.make_graph(
        nodes,
        "paddle_ocr_rec",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 3, 32, 320])],
        [helper.make_tensor_value_info("softmax_out", TensorProto.FLOAT, ["batch", None, 97])],
        inits,
    )
    m = helper.make_model(
        g, opset_imports=[helper.make_opsetid("", 13)], producer_name="PaddlePaddle"
    )
    m.ir_version = 8
    return m


def big_graph(n: int = 20_000, d: int = 8) -> onnx.ModelProto:
    """About ``n`` nodes in blocks of 40 (scoped names ``/blocks.K/attn/...``), a third of them
    constants and shape computations, as exporters write them. Not meant to run."""
    nodes, inits = [], []
    inits.append(numpy_helper.from_array(np.ones((d, d), np.float32), "w"))
    x = "x"
    blocks = max(1, n // 40)
    for b in range(blocks):
        p = f"/blocks.{b}"

        def node(op, ins, name, p=p, **kw):
            out = f"{p}/{name}_output_0"
            nodes.append(helper.make_node(op, ins, [out], name=f"{p}/{name}", **kw))
            return out

        def const(name, arr, node=node):
            return node("Constant", [], name, value=numpy_helper.from_array(np.asarray(arr)))

        h = node("LayerNormalization", [x, "ln_s", "ln_b"], "ln_1/LayerNormalization")
        branches = []
        for t in "qkv":
            mm = node("MatMul", [h, "w"], f"attn/{t}/MatMul")
            shp = node("Shape", [h], f"attn/{t}/Shape")
            g0 = node(
                "Gather",
                [shp, const(f"attn/{t}/Constant", np.int64(0))],
                f"attn/{t}/Gather",
                axis=0,
            )
            u0 = node(
                "Unsqueeze",
                [g0, const(f"attn/{t}/Constant_1", np.array([0], np.int64))],
                f"attn/{t}/Unsqueeze",
            )
            cat = node(
                "Concat",
                [u0, const(f"attn/{t}/Constant_2", np.array([-1, 2, d // 2], np.int64))],
                f"attn/{t}/Concat",
                axis=0,
            )
            branches.append(node("Reshape", [mm, cat], f"attn/{t}/Reshape"))
        s = node("MatMul", [branches[0], branches[1]], "attn/MatMul")
        s = node("Div", [s, const("attn/Constant_3", np.float32(2.0))], "attn/Div")
        s = node("Softmax", [s], "attn/Softmax", axis=-1)
        o = node("MatMul", [s, branches[2]], "attn/MatMul_1")
        o = node(
            "Reshape", [o, const("attn/Constant_4", np.array([1, -1, d], np.int64))], "attn/Reshape"
        )
        x1 = node("Add", [x, o], "Add")
        h = node("MatMul", [x1, "w"], "mlp/fc/MatMul")
        h = node("Relu", [h], "mlp/act/Relu")
        h = node("MatMul", [h, "w"], "mlp/proj/MatMul")
        x = node("Add", [x1, h], "Add_1")
    inits.append(numpy_helper.from_array(np.ones(d, np.float32), "ln_s"))
    inits.append(numpy_helper.from_array(np.zeros(d, np.float32), "ln_b"))
    nodes.append(helper.make_node("Identity", [x], ["y"], name="/head/Identity"))
    g = helper.make_graph(
        nodes,
        "big",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, d])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, d])],
        inits,
    )
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    return m
