"""Architecture twins: small, untrained copies of the ten zoo networks, built locally.

Each twin is built with the workbench's own ``layer`` API, run once on example inputs and
exported with ``sonnx.to_onnx`` under the real model's input and output names (and dtypes and
layouts), with deterministic random weights (a fixed seed). They let every demo, notebook and
test run offline in seconds. **Their predictions are meaningless**: nothing here is trained.

>>> from workbench.zoo import twins
>>> m = twins.build("emotion_ferplus")
>>> [i.name for i in m.graph.input], [o.name for o in m.graph.output]
(['Input3'], ['Plus692_Output_0'])
>>> twins.twin_of(m)
'emotion_ferplus'

Scaled down where the real one is too big for CI (see each function): narrow channels, fewer
blocks, Tiny YOLOv2 on 160x160 images (grid 5x5, still 125 = 5 x (5 + 20) channels), BERT /
RoBERTa / GPT-2 with 2 layers of width 64 over the small vocabularies of the ``*_twin``
tokenisers. The real models' opsets (7-10) are not copied: twins use the exporter's opset.
"""

from __future__ import annotations

import math

import numpy as np
import onnx

from workbench import autograd, layer, tensor
from workbench import device as _device
from workbench.tensor import Tensor

SEED = 0
#: metadata keys written into every twin
META_TWIN_OF = "workbench.twin_of"
META_MAX_POSITIONS = "workbench.max_positions"
META_INPUT_SIZE = "workbench.input_size"


def _rng():
    return tensor.host_rng()


def _const(a) -> Tensor:
    return tensor.from_numpy(np.asarray(a))


def _i64(v) -> np.ndarray:
    return np.asarray(v, dtype=np.int64)


class _BN(layer.BatchNorm2d):
    """BatchNorm with random (but fixed) statistics and affine terms, so twins are not trivial."""

    def _create(self, like, dtype):
        super()._create(like, dtype)
        r, c = _rng(), self.channels
        self.scale.data = self.scale.device.put(r.uniform(0.5, 1.5, c).astype(dtype))
        self.bias.data = self.bias.device.put(r.normal(0, 0.1, c).astype(dtype))
        self.running_mean.data = self.running_mean.device.put(r.normal(0, 0.1, c).astype(dtype))
        self.running_var.data = self.running_var.device.put(r.uniform(0.5, 1.5, c).astype(dtype))


def _conv_bn(cin, cout, k, stride=1, group=1, act="relu"):
    return _ConvBN(cin, cout, k, stride, group, act)


class _ConvBN(layer.Layer):
    def __init__(self, cin, cout, k, stride=1, group=1, act="relu"):
        super().__init__()
        self.conv = layer.Conv2d(cin, cout, k, stride=stride, padding=k // 2, group=group,
                                 bias=False)
        self.bn = _BN(cout)
        self.act = act

    def forward(self, x):
        y = self.bn(self.conv(x))
        if self.act == "relu":
            return autograd.relu(y)
        if self.act == "relu6":
            return autograd.clip(y, np.float32(0), np.float32(6))  # float32 bounds
        if self.act == "leaky":
            return autograd.leakyrelu(y, 0.1)
        return y


def _export(model: layer.Layer, example: list, in_names: list, out_names: list,
            dynamic_axes: dict, twin_of: str, **meta) -> onnx.ModelProto:
    from workbench import sonnx

    model.eval()
    with autograd.no_grad():
        ys = model(*example)
    ys = list(ys) if isinstance(ys, (list, tuple)) else [ys]
    proto = sonnx.to_onnx(example, ys, input_names=in_names, output_names=out_names,
                          dynamic_axes=dynamic_axes, model_name=f"{twin_of}_twin",
                          doc_string=f"untrained architecture twin of the zoo model "
                                     f"{twin_of!r} (workbench.zoo.twins); predictions are "
                                     f"meaningless")
    proto.doc_string = proto.graph.doc_string
    _renumber(proto)
    meta = {META_TWIN_OF: twin_of, **{f"workbench.{k}": str(v) for k, v in meta.items()}}
    for k, v in meta.items():
        p = proto.metadata_props.add()
        p.key, p.value = k, v
    onnx.checker.check_model(proto)
    return proto


def _renumber(proto: onnx.ModelProto) -> None:
    """Name nodes ``<Op>_<i>`` by position (the tape numbers them per process), and their
    intermediate values after them, so that a twin's bytes depend only on its seed."""
    keep = {v.name for v in proto.graph.output} | {v.name for v in proto.graph.input} | \
        {t.name for t in proto.graph.initializer}
    rename = {}
    for i, n in enumerate(proto.graph.node):
        n.name = f"{n.op_type}_{i}"
        for k, o in enumerate(n.output):
            if o and o not in keep:
                rename[o] = f"{n.name}_out" if len(n.output) == 1 else f"{n.name}_out{k}"
    for n in proto.graph.node:
        for seq in (n.input, n.output):
            for j, v in enumerate(seq):
                if v in rename:
                    seq[j] = rename[v]
    for vi in proto.graph.value_info:
        if vi.name in rename:
            vi.name = rename[vi.name]


def _image(shape) -> Tensor:
    return tensor.from_numpy(_rng().uniform(0, 1, shape).astype(np.float32))


# --------------------------------------------------------------------------- MobileNetV2
class _InvertedResidual(layer.Layer):
    def __init__(self, cin, cout, stride, expand):
        super().__init__()
        hid = cin * expand
        self.expand = _conv_bn(cin, hid, 1, act="relu6")
        self.dw = _conv_bn(hid, hid, 3, stride, group=hid, act="relu6")
        self.project = _conv_bn(hid, cout, 1, act=None)
        self.residual = stride == 1 and cin == cout

    def forward(self, x):
        y = self.project(self.dw(self.expand(x)))
        return autograd.add(x, y) if self.residual else y


class _MobileNetV2(layer.Layer):
    """Width 0.25 and one block per stage (the real one: width 1.0, 17 blocks)."""

    def __init__(self, classes=1000):
        super().__init__()
        self.stem = _conv_bn(3, 8, 3, 2, act="relu6")
        cfg = [(1, 8, 1), (6, 8, 2), (6, 8, 2), (6, 16, 2), (6, 24, 1), (6, 40, 2), (6, 80, 1)]
        blocks, cin = [], 8
        for t, c, s in cfg:
            blocks.append(_InvertedResidual(cin, c, s, t))
            cin = c
        self.blocks = layer.Sequential(*blocks)
        self.head = _conv_bn(cin, 320, 1, act="relu6")
        self.pool = layer.GlobalAvgPool2d()
        self.pred = layer.Conv2d(320, classes, 1)
        self.classes = classes

    def forward(self, x):
        y = self.pred(self.pool(self.head(self.blocks(self.stem(x)))))
        return autograd.reshape(y, (-1, self.classes))


def mobilenetv2(seed: int = SEED) -> onnx.ModelProto:
    """MobileNetV2 twin: data [1,3,224,224] -> mobilenetv20_output_flatten0_reshape0 [1,1000]
    (inverted residuals with ReLU6, a 1x1-conv classifier then Reshape, as the MXNet export)."""
    tensor.seed(seed)
    return _export(_MobileNetV2(), [_image((1, 3, 224, 224))], ["data"],
                   ["mobilenetv20_output_flatten0_reshape0"], {}, "mobilenetv2")


# --------------------------------------------------------------------------- ResNet-18
class _BasicBlock(layer.Layer):
    def __init__(self, cin, cout, stride):
        super().__init__()
        self.c1 = _conv_bn(cin, cout, 3, stride)
        self.c2 = _conv_bn(cout, cout, 3, act=None)
        self.down = _conv_bn(cin, cout, 1, stride, act=None) if (stride != 1 or cin != cout) \
            else None

    def forward(self, x):
        short = self.down(x) if self.down is not None else x
        return autograd.relu(autograd.add(self.c2(self.c1(x)), short))


class _ResNet18(layer.Layer):
    """ResNet-18 v1 layout (7x7 stem, max-pool, 4 stages x 2 basic blocks) at 1/8 width."""

    def __init__(self, classes=1000, widths=(8, 16, 32, 64)):
        super().__init__()
        self.stem = _conv_bn(3, widths[0], 7, 2)
        self.pool = layer.MaxPool2d(3, 2, padding=1)
        blocks, cin = [], widths[0]
        for i, w in enumerate(widths):
            blocks += [_BasicBlock(cin, w, 1 if i == 0 else 2), _BasicBlock(w, w, 1)]
            cin = w
        self.blocks = layer.Sequential(*blocks)
        self.gap = layer.GlobalAvgPool2d()
        self.flat = layer.Flatten()
        self.fc = layer.Linear(cin, classes)

    def forward(self, x):
        return self.fc(self.flat(self.gap(self.blocks(self.pool(self.stem(x))))))


def resnet18(seed: int = SEED, *, features: int = 64) -> onnx.ModelProto:
    """ResNet-18 twin: data [N,3,224,224] -> resnetv15_dense0_fwd [N,1000]
    (GlobalAveragePool -> Flatten -> Gemm tail, so SINGA's ``last_layers=-3`` gives the
    features). ``features``: the width of the last stage (the real model's is 512, which
    SINGA's transfer-learning example expects; 64 keeps the twin small)."""
    tensor.seed(seed)
    return _export(_ResNet18(widths=(8, 16, 32, int(features))), [_image((1, 3, 224, 224))],
                   ["data"], ["resnetv15_dense0_fwd"],
                   {"data": {0: "N"}, "resnetv15_dense0_fwd": {0: "N"}}, "resnet18")


# --------------------------------------------------------------------------- VGG16
class _VGG16(layer.Layer):
    """VGG-16's 13 3x3 convolutions in 5 max-pooled stages and 3 dense layers, narrow."""

    def __init__(self, classes=1000, widths=(4, 8, 16, 32, 32), dense=64):
        super().__init__()
        layers, cin = [], 3
        for w, n in zip(widths, (2, 2, 3, 3, 3)):
            for _ in range(n):
                layers += [layer.Conv2d(cin, w, 3, padding=1), layer.ReLU()]
                cin = w
            layers.append(layer.MaxPool2d(2, 2))
        self.features = layer.Sequential(*layers)
        self.flat = layer.Flatten()
        self.fc1 = layer.Linear(cin * 7 * 7, dense)
        self.fc2 = layer.Linear(dense, dense)
        self.fc3 = layer.Linear(dense, classes)

    def forward(self, x):
        y = self.flat(self.features(x))
        return self.fc3(autograd.relu(self.fc2(autograd.relu(self.fc1(y)))))


def vgg16(seed: int = SEED) -> onnx.ModelProto:
    """VGG-16 twin: data [1,3,224,224] -> vgg0_dense2_fwd [1,1000] (channels 4..32, dense 64)."""
    tensor.seed(seed)
    return _export(_VGG16(), [_image((1, 3, 224, 224))], ["data"], ["vgg0_dense2_fwd"], {},
                   "vgg16")


# --------------------------------------------------------------------------- ShuffleNetV2
def _shuffle(x, groups=2):
    n, c, h, w = x.shape
    y = autograd.reshape(x, (-1, groups, c // groups, h, w))
    y = autograd.transpose(y, (0, 2, 1, 3, 4))
    return autograd.reshape(y, (-1, c, h, w))


class _ShuffleUnit(layer.Layer):
    def __init__(self, cin, cout, stride):
        super().__init__()
        self.stride = stride
        half = cout // 2
        if stride == 2:
            self.left = layer.Sequential(_conv_bn(cin, cin, 3, 2, group=cin, act=None),
                                         _conv_bn(cin, half, 1))
            rin = cin
        else:
            rin = half
        self.right = layer.Sequential(_conv_bn(rin, half, 1), _conv_bn(half, half, 3, stride,
                                                                       group=half, act=None),
                                      _conv_bn(half, half, 1))

    def forward(self, x):
        if self.stride == 1:
            a, b = autograd.split(x, 1, [x.shape[1] // 2, x.shape[1] // 2])
            y = autograd.cat([a, self.right(b)], 1)
        else:
            y = autograd.cat([self.left(x), self.right(x)], 1)
        return _shuffle(y)


class _ShuffleNetV2(layer.Layer):
    """ShuffleNetV2 (channel split, depthwise convs, channel shuffle), narrow and shallow."""

    def __init__(self, classes=1000, widths=(16, 32, 64), repeats=(2, 2, 2)):
        super().__init__()
        self.stem = _conv_bn(3, 8, 3, 2)
        self.pool = layer.MaxPool2d(3, 2, padding=1)
        units, cin = [], 8
        for w, r in zip(widths, repeats):
            units.append(_ShuffleUnit(cin, w, 2))
            units += [_ShuffleUnit(w, w, 1) for _ in range(r - 1)]
            cin = w
        self.units = layer.Sequential(*units)
        self.conv5 = _conv_bn(cin, 128, 1)
        self.gap = layer.GlobalAvgPool2d()
        self.flat = layer.Flatten()
        self.fc = layer.Linear(128, classes)

    def forward(self, x):
        return self.fc(self.flat(self.gap(self.conv5(self.units(self.pool(self.stem(x)))))))


def shufflenetv2(seed: int = SEED) -> onnx.ModelProto:
    """ShuffleNetV2 twin: input [1,3,224,224] -> output [1,1000]."""
    tensor.seed(seed)
    return _export(_ShuffleNetV2(), [_image((1, 3, 224, 224))], ["input"], ["output"], {},
                   "shufflenetv2")


# --------------------------------------------------------------------------- Tiny YOLOv2
YOLO_TWIN_SIZE = 160


class _TinyYolo(layer.Layer):
    """Tiny YOLOv2: pixel scaling, 3x3 conv + BN + LeakyReLU(0.1) with 5 stride-2 max-pools,
    a 1x1 conv to 125 = 5 x (5 + 20) channels; narrow (4..64 channels instead of 16..1024)."""

    def __init__(self, widths=(4, 8, 16, 16, 32, 64)):
        super().__init__()
        layers, cin = [], 3
        for i, w in enumerate(widths):
            layers.append(_conv_bn(cin, w, 3, act="leaky"))
            if i < 5:
                layers.append(layer.MaxPool2d(2, 2))
            cin = w
        self.features = layer.Sequential(*layers)
        self.head = layer.Conv2d(cin, 125, 1)

    def forward(self, x):
        return self.head(self.features(autograd.mul(x, np.float32(1 / 255))))


def tinyyolov2(seed: int = SEED) -> onnx.ModelProto:
    """Tiny YOLOv2 twin: image [None,3,160,160] (raw 0-255) -> grid [None,125,5,5]."""
    tensor.seed(seed)
    s = YOLO_TWIN_SIZE
    return _export(_TinyYolo(), [_image((1, 3, s, s)) * 255.0], ["image"], ["grid"],
                   {"image": {0: "None"}, "grid": {0: "None"}}, "tinyyolov2", input_size=s)


# --------------------------------------------------------------------------- ArcFace
class _PReLU(layer.Layer):
    def __init__(self, c):
        super().__init__()
        self.slope = Tensor(data=np.full((c, 1, 1), 0.25, np.float32), requires_grad=True,
                            stores_grad=True)

    def forward(self, x):
        return autograd.apply("PRelu", [x, self.slope])


class _IRBlock(layer.Layer):
    """Improved residual unit: BN - conv3x3 - BN - PReLU - conv3x3(stride) - BN + shortcut."""

    def __init__(self, cin, cout, stride):
        super().__init__()
        self.bn0 = _BN(cin)
        self.c1 = layer.Conv2d(cin, cout, 3, padding=1, bias=False)
        self.bn1 = _BN(cout)
        self.act = _PReLU(cout)
        self.c2 = layer.Conv2d(cout, cout, 3, stride=stride, padding=1, bias=False)
        self.bn2 = _BN(cout)
        self.short = _conv_bn(cin, cout, 1, stride, act=None) if (stride != 1 or cin != cout) \
            else None

    def forward(self, x):
        y = self.bn2(self.c2(self.act(self.bn1(self.c1(self.bn0(x))))))
        return autograd.add(y, self.short(x) if self.short is not None else x)


class _ArcFace(layer.Layer):
    """LResNet-IR: (x - 127.5) / 128, conv + BN + PReLU, 4 stride-2 IR stages (1 unit each, 8..32
    channels instead of 64..512 with 50 units), BN, FC to the embedding, BN (the 'E' head)."""

    def __init__(self, dim=512, widths=(8, 16, 32, 32)):
        super().__init__()
        self.stem = _conv_bn(3, widths[0], 3, act=None)
        self.stem_act = _PReLU(widths[0])
        blocks, cin = [], widths[0]
        for w in widths:
            blocks.append(_IRBlock(cin, w, 2))
            cin = w
        self.blocks = layer.Sequential(*blocks)
        self.bn = _BN(cin)
        self.flat = layer.Flatten()
        self.fc = layer.Linear(cin * 7 * 7, dim)
        self.dim = dim

    def forward(self, x):
        x = autograd.mul(autograd.sub(x, np.float32(127.5)), np.float32(0.0078125))
        y = self.flat(self.bn(self.blocks(self.stem_act(self.stem(x)))))
        return self.fc(y)


def arcface(seed: int = SEED) -> onnx.ModelProto:
    """ArcFace twin: data [1,3,112,112] (raw 0-255) -> fc1 [1,512]."""
    tensor.seed(seed)
    return _export(_ArcFace(), [_image((1, 3, 112, 112)) * 255.0], ["data"], ["fc1"], {},
                   "arcface")


# --------------------------------------------------------------------------- FER+
class _FerPlus(layer.Layer):
    """FER+ CNN (CNTK): 3 conv blocks with max-pooling, then 2 dense layers; narrow."""

    def __init__(self, classes=8):
        super().__init__()
        self.features = layer.Sequential(
            layer.Conv2d(1, 8, 3, padding=1), layer.ReLU(), layer.MaxPool2d(2, 2),
            layer.Conv2d(8, 16, 3, padding=1), layer.ReLU(), layer.MaxPool2d(2, 2),
            layer.Conv2d(16, 32, 3, padding=1), layer.ReLU(), layer.MaxPool2d(2, 2))
        self.flat = layer.Flatten()
        self.fc1 = layer.Linear(32 * 8 * 8, 64)
        self.fc2 = layer.Linear(64, classes)

    def forward(self, x):
        x = autograd.mul(autograd.sub(x, np.float32(127.5)), np.float32(1 / 128))
        return self.fc2(autograd.relu(self.fc1(self.flat(self.features(x)))))


def emotion_ferplus(seed: int = SEED) -> onnx.ModelProto:
    """FER+ twin: Input3 [1,1,64,64] (raw 0-255 gray) -> Plus692_Output_0 [1,8]."""
    tensor.seed(seed)
    return _export(_FerPlus(), [_image((1, 1, 64, 64)) * 255.0], ["Input3"],
                   ["Plus692_Output_0"], {}, "emotion_ferplus")


# --------------------------------------------------------------------------- transformers
def _positions(ids, axis: int = -1):
    """0, 1, ..., L-1 along ``axis`` of an int64 id tensor, whatever L is (CumSum of ones)."""
    ones = autograd.add(autograd.mul(ids, _i64(0)), _i64(1))
    return autograd.sub(autograd.apply("CumSum", [ones, _i64(axis)]), _i64(1))


class _SelfAttention(layer.Layer):
    """Multi-head self-attention on [..., L, C]; the head split uses Reshape with 0s so any
    batch and sequence length works. ``causal`` masks the future with Trilu."""

    def __init__(self, dim, heads, causal=False):
        super().__init__()
        self.q, self.k, self.v, self.o = (layer.Linear(dim, dim) for _ in range(4))
        self.heads, self.dim, self.causal = heads, dim, causal

    def _split(self, x):
        r = x.ndim()
        shape = [0] * (r - 1) + [self.heads, self.dim // self.heads]
        perm = list(range(r - 2)) + [r - 1, r - 2, r]
        return autograd.transpose(autograd.reshape(x, shape), perm)   # [..., H, L, D]

    def forward(self, x, bias=None):
        r = x.ndim()
        q, k, v = self._split(self.q(x)), self._split(self.k(x)), self._split(self.v(x))
        perm = list(range(r - 1)) + [r, r - 1]
        s = autograd.matmul(q, autograd.transpose(k, perm))
        s = autograd.mul(s, np.float32(1 / math.sqrt(self.dim // self.heads)))
        if bias is not None:
            s = autograd.add(s, bias)
        if self.causal:
            keep = autograd.apply("Trilu", [autograd.add(autograd.mul(s, np.float32(0)),
                                                         np.float32(1))], {"upper": 0})
            s = autograd.add(autograd.mul(s, keep),
                             autograd.mul(autograd.sub(keep, np.float32(1)), np.float32(1e4)))
        p = autograd.softmax(s, -1)
        y = autograd.matmul(p, v)                                  # [..., H, L, D]
        y = autograd.transpose(y, list(range(r - 2)) + [r - 1, r - 2, r])
        y = autograd.reshape(y, [0] * (r - 1) + [self.dim])
        return self.o(y)


class _EncoderLayer(layer.Layer):
    """Post-LN transformer layer (BERT, RoBERTa): x = LN(x + attn(x)); x = LN(x + ffn(x))."""

    def __init__(self, dim, heads, ff):
        super().__init__()
        self.attn = _SelfAttention(dim, heads)
        self.ln1 = layer.LayerNorm(dim, eps=1e-12)
        self.ff1 = layer.Linear(dim, ff)
        self.ff2 = layer.Linear(ff, dim)
        self.ln2 = layer.LayerNorm(dim, eps=1e-12)

    def forward(self, x, bias=None):
        x = self.ln1(autograd.add(x, self.attn(x, bias)))
        return self.ln2(autograd.add(x, self.ff2(autograd.gelu(self.ff1(x)))))


def _embedding(n, dim, std=0.5):
    e = layer.Embedding(n, dim)
    e.W.data = e.W.device.put(_rng().normal(0, std, (n, dim)).astype(np.float32))
    return e


class _BertSquad(layer.Layer):
    """BERT (2 layers, hidden 64, 2 heads, FFN 128) with the SQuAD span head."""

    def __init__(self, vocab, max_pos=256, dim=64, heads=2, ff=128, n_layers=2):
        super().__init__()
        self.word = _embedding(vocab, dim)
        self.pos = _embedding(max_pos, dim)
        self.type = _embedding(2, dim)
        self.ln = layer.LayerNorm(dim, eps=1e-12)
        self.layers = [_EncoderLayer(dim, heads, ff) for _ in range(n_layers)]
        for i, lay in enumerate(self.layers):
            setattr(self, f"layer{i}", lay)
        self.qa = layer.Linear(dim, 2)

    def forward(self, unique_ids, segment_ids, input_mask, input_ids):
        uid = autograd.identity(unique_ids)
        x = autograd.add(autograd.add(self.word(input_ids), self.pos(_positions(input_ids))),
                         self.type(segment_ids))
        x = self.ln(x)
        m = autograd.cast(input_mask, np.float32)
        bias = autograd.mul(autograd.sub(np.float32(1), m), np.float32(-10000.0))
        bias = autograd.unsqueeze(bias, [1, 2])                       # [N, 1, 1, L]
        for lay in self.layers:
            x = lay(x, bias)
        logits = self.qa(x)                                          # [N, L, 2]
        start, end = autograd.split(logits, 2, [1, 1])
        # unique ids first: to_onnx walks the outputs in order and would otherwise take an
        # int64 [k] shape constant met earlier for this int64 [N] input (its leaf-matching
        # heuristic); bertsquad() puts the outputs back in the real model's order
        return uid, autograd.squeeze(end, 2), autograd.squeeze(start, 2)


def bertsquad(seed: int = SEED) -> onnx.ModelProto:
    """BERT-Squad twin with the real input/output names, dtypes and order:
    unique_ids_raw_output___9:0 i64[N], segment_ids:0 / input_mask:0 / input_ids:0 i64[N,256]
    -> unstack:1 (end logits) [N,256], unstack:0 (start logits) [N,256], unique_ids:0 i64[N].
    Its vocabulary is :func:`~workbench.zoo.tokenizers.bert_twin_vocab`."""
    from workbench.zoo.tokenizers import bert_twin_vocab

    tensor.seed(seed)
    vocab = len(bert_twin_vocab())
    n, L = 1, 256
    r = _rng()
    ids = _const(r.integers(0, vocab, (n, L)).astype(np.int64))
    seg = _const(np.concatenate([np.zeros((n, 20)), np.ones((n, L - 20))], 1).astype(np.int64))
    mask = _const(np.concatenate([np.ones((n, 200)), np.zeros((n, L - 200))], 1)
                  .astype(np.int64))
    uid = _const(np.arange(n, dtype=np.int64))
    names_in = ["unique_ids_raw_output___9:0", "segment_ids:0", "input_mask:0", "input_ids:0"]
    names_out = ["unique_ids:0", "unstack:1", "unstack:0"]
    dyn = {k: {0: "N"} for k in names_in + names_out}
    proto = _export(_BertSquad(vocab, L), [uid, seg, mask, ids], names_in, names_out, dyn,
                    "bertsquad", max_positions=L, seq_length=L)
    outs = list(proto.graph.output)
    del proto.graph.output[:]
    proto.graph.output.extend(outs[1:] + outs[:1])     # unstack:1, unstack:0, unique_ids:0
    onnx.checker.check_model(proto)
    return proto


class _RobertaCls(layer.Layer):
    """RoBERTa (2 layers, hidden 64) with the sequence-classification head on ``<s>``."""

    def __init__(self, vocab, max_pos=64, dim=64, heads=2, ff=128, n_layers=2, pad_id=1):
        super().__init__()
        self.word = _embedding(vocab, dim)
        self.pos = _embedding(max_pos + pad_id + 1, dim)
        self.ln = layer.LayerNorm(dim, eps=1e-5)
        self.layers = [_EncoderLayer(dim, heads, ff) for _ in range(n_layers)]
        for i, lay in enumerate(self.layers):
            setattr(self, f"layer{i}", lay)
        self.dense = layer.Linear(dim, dim)
        self.out = layer.Linear(dim, 2)
        self.pad_id = pad_id

    def forward(self, ids):
        # RoBERTa's position ids: padding_idx + cumsum(not pad) on real tokens
        keep = autograd.cast(autograd.apply("Not", [autograd.apply(
            "Equal", [ids, _i64(self.pad_id)])]), np.int64)
        pos = autograd.add(autograd.mul(autograd.apply("CumSum", [keep, _i64(1)]), keep),
                           _i64(self.pad_id))
        x = self.ln(autograd.add(self.word(ids), self.pos(pos)))
        for lay in self.layers:
            x = lay(x)
        cls = autograd.gather(x, 1, _i64(0))                          # [N, C]
        return self.out(autograd.tanh(self.dense(cls)))


def roberta(seed: int = SEED) -> onnx.ModelProto:
    """RoBERTa twin: input i64[batch, sentence_length] (up to 64 tokens) -> output [batch, 2].
    Its vocabulary is :func:`~workbench.zoo.tokenizers.roberta_twin_tokenizer`'s (260 ids)."""
    from workbench.zoo.tokenizers import roberta_twin_tokenizer

    tensor.seed(seed)
    vocab = len(roberta_twin_tokenizer())
    ids = _const(np.concatenate([[[0]], _rng().integers(4, vocab, (1, 10)), [[2]]], 1)
                 .astype(np.int64))
    return _export(_RobertaCls(vocab, 64), [ids], ["input"], ["output"],
                   {"input": {0: "batch", 1: "sentence_length"}, "output": {0: "batch"}},
                   "roberta", max_positions=64)


class _GPT2Block(layer.Layer):
    """Pre-LN transformer block: x + attn(LN(x)); x + mlp(LN(x)) with tanh-GELU."""

    def __init__(self, dim, heads):
        super().__init__()
        self.ln1 = layer.LayerNorm(dim)
        self.attn = _SelfAttention(dim, heads, causal=True)
        self.ln2 = layer.LayerNorm(dim)
        self.fc = layer.Linear(dim, 4 * dim)
        self.proj = layer.Linear(4 * dim, dim)

    def forward(self, x):
        x = autograd.add(x, self.attn(self.ln1(x)))
        return autograd.add(x, self.proj(autograd.gelu(self.fc(self.ln2(x)), "tanh")))


class _GPT2(layer.Layer):
    """GPT-2 (2 blocks, hidden 64, 2 heads) with the LM head tied to the token embedding."""

    def __init__(self, vocab, max_pos=64, dim=64, heads=2, n_layers=2):
        super().__init__()
        self.wte = _embedding(vocab, dim)
        self.wpe = _embedding(max_pos, dim, 0.1)
        self.blocks = layer.Sequential(*[_GPT2Block(dim, heads) for _ in range(n_layers)])
        self.ln_f = layer.LayerNorm(dim)

    def forward(self, ids):                                            # [B, 1, L]
        x = autograd.add(self.wte(ids), self.wpe(_positions(ids)))    # [B, 1, L, C]
        x = self.ln_f(self.blocks(x))
        return autograd.matmul(x, autograd.transpose(self.wte.W, (1, 0)))


def gpt2(seed: int = SEED) -> onnx.ModelProto:
    """GPT-2 twin: input1 i64[d1,d2,d3] (batch, 1, sequence; up to 64 tokens) -> output1
    [d1,d2,d3,257] logits (the real model also returns 12 past key/value tensors; the twin
    does not). Vocabulary: :func:`~workbench.zoo.tokenizers.gpt2_twin_tokenizer`."""
    from workbench.zoo.tokenizers import gpt2_twin_tokenizer

    tensor.seed(seed)
    vocab = len(gpt2_twin_tokenizer())
    ids = _const(_rng().integers(0, vocab, (1, 1, 8)).astype(np.int64))
    return _export(_GPT2(vocab, 64), [ids], ["input1"], ["output1"],
                   {"input1": {0: "d1", 1: "d2", 2: "d3"},
                    "output1": {0: "d1", 1: "d2", 2: "d3"}}, "gpt2", max_positions=64)


# --------------------------------------------------------------------------- lookup
BUILDERS = {
    "mobilenetv2": mobilenetv2, "resnet18": resnet18, "vgg16": vgg16,
    "shufflenetv2": shufflenetv2, "tinyyolov2": tinyyolov2, "arcface": arcface,
    "emotion_ferplus": emotion_ferplus, "bertsquad": bertsquad, "roberta": roberta,
    "gpt2": gpt2,
}

_cache: dict = {}


def build(name: str, seed: int = SEED) -> onnx.ModelProto:
    """The twin of zoo model ``name`` (aliases and case as in ``zoo.get``), as a ModelProto.
    Built once per process and seed; each call returns a fresh copy."""
    from workbench.zoo.registry import get

    key = (get(name).name, seed)
    if key not in _cache:
        saved = _device.host_rng().bit_generator.state  # building must not disturb the
        try:                                              # caller's stream
            _cache[key] = BUILDERS[key[0]](seed).SerializeToString()
        finally:
            _device.host_rng().bit_generator.state = saved
    m = onnx.ModelProto()
    m.ParseFromString(_cache[key])
    return m


def metadata(model) -> dict:
    """The ``metadata_props`` of a ModelProto (or .onnx path) as a dict."""
    if not isinstance(model, onnx.ModelProto):
        model = onnx.load(model, load_external_data=False)
    return {p.key: p.value for p in model.metadata_props}


def twin_of(model) -> str | None:
    """The zoo name a model is a twin of, or None for anything else."""
    return metadata(model).get(META_TWIN_OF)
