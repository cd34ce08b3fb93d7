"""How much arithmetic and data movement one node costs at known shapes.

Conventions (the same spirit as fvcore and thop, written down so the numbers can be checked):

- **MACs** count the multiply-accumulates of dense products only: convolutions (``Cout x
  Hout x Wout x Cin/groups x kh x kw`` per image), matrix products (``M x N x K``), the two
  products of attention (``Q K^T`` and ``scores V``), the gate products of RNN/LSTM/GRU, Einsum
  contractions, linear models. Quantized forms (QLinearConv, MatMulInteger, MatMulNBits...)
  count the same MACs as their float forms.
- **FLOPs** = 2 x MACs (1 MAC = 1 multiply + 1 add) **plus** every other arithmetic operation:
  a bias add or a residual add is 1 per output element, each fused activation 1 per output
  element.
- An **element-wise** op (Add, Mul, Relu, Sigmoid, Exp, Erf, Where, comparisons...) counts
  1 FLOP per output element whatever its function (transcendentals are not weighted: their
  cost depends on the math library); a variadic Sum/Max/Min counts (inputs - 1) per element,
  Mean one more.
- Softmax / LogSoftmax: 5 per element (max, subtract, exp, sum, divide).
- BatchNormalization (inference): 2 per element (a per-channel scale and shift; the
  per-channel constants are not counted); LayerNormalization, GroupNormalization,
  InstanceNormalization, MeanVarianceNormalization: 7 per element (mean, subtract, square,
  sum, normalise, scale, shift); RMSNormalization / SimplifiedLayerNormalization: 4; the
  Skip forms add 1 (residual) and 1 more with a bias.
- Pooling: one operation per window element per output (MaxPool compares, AveragePool adds,
  then 1 divide per output); global pooling: one per input element (+1 per output for the
  average).
- Reductions: one per input element (ReduceMean +1 per output; SumSquare, L2: 2; LogSumExp:
  3); ArgMax/ArgMin/CumSum: one per input element; TopK: ``n log2 k`` compares.
- Resize: nearest 0; linear ``2^r x 2 - 1`` per output element (``r`` resized axes); cubic
  ``4^r x 2 - 1``.
- Data movement (Reshape, Transpose, Concat, Gather, Slice, Pad, Cast...): 0 FLOPs; their
  bytes count. Views (Reshape, Flatten, Squeeze, Unsqueeze, Identity, inference Dropout) move
  no bytes.
- If: the larger branch; Loop: trip count x body when the trip count is a constant (else
  "per iteration" in the note and no total); Scan: sequence length x body.
- Tree ensembles: one comparison per node visited, estimated as the expected path length
  when each split sends half of the rows each way (``sum(depth * 2^-depth)`` over a tree's
  leaves), plus one add per (row, tree) to aggregate; MACs 0.
- **Bytes read** = every input tensor once (weights included), **bytes written** = every
  output once: the traffic of a kernel that streams its operands once, the usual roofline
  model. Gather-like ops and Slice read only what they select (output size, plus indices).

An op without a rule here and without registry facts that say it is element-wise, an
activation, math or shape op gets ``flops = None`` and a note: never a silent zero.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from workbench.ops import registry

from .shapes import elem_bits, is_known


class Unknown(Exception):
    """A shape or a constant the rule needs is not known (message: which)."""


@dataclass
class Cost:
    macs: int = 0
    flops: int = 0
    bytes_read: int | None = None      # None: the generic rule (all inputs once)
    bytes_written: int | None = None   # None: the generic rule (all outputs once)
    note: str = ""


def numel(shape) -> int:
    return int(np.prod([int(d) for d in shape], dtype=np.int64)) if shape is not None else 0


class NodeView:
    """What a cost rule sees of a node: its shapes, dtypes, attributes (with the spec's
    defaults) and the values of its constant inputs."""

    def __init__(self, node, shape_of, type_of, const_of, opset: int | None):
        self.node = node
        self._shape_of = shape_of
        self._type_of = type_of
        self._const_of = const_of
        defaults = {}
        if opset is not None:
            defaults = registry.attribute_defaults(node.op_type, node.domain or "", opset)
        self.attrs = {**defaults, **node.attrs}

    # -- inputs / outputs
    def has(self, i: int) -> bool:
        return i < len(self.node.inputs) and bool(self.node.inputs[i])

    def shape(self, i: int) -> tuple:
        """Shape of input ``i`` (raises Unknown)."""
        if not self.has(i):
            raise Unknown(f"input {i} is absent")
        s = self._shape_of(self.node.inputs[i])
        if not is_known(s):
            raise Unknown(f"the shape of input {self.node.inputs[i]!r} is unknown")
        return tuple(int(d) for d in s)

    def out_shape(self, i: int = 0) -> tuple:
        if i >= len(self.node.outputs) or not self.node.outputs[i]:
            raise Unknown(f"output {i} is absent")
        s = self._shape_of(self.node.outputs[i])
        if not is_known(s):
            raise Unknown(f"the shape of output {self.node.outputs[i]!r} is unknown")
        return tuple(int(d) for d in s)

    def n(self, i: int) -> int:
        return numel(self.shape(i))

    def out(self, i: int = 0) -> int:
        return numel(self.out_shape(i))

    def outs(self) -> int:
        return sum(numel(self.out_shape(i)) for i, o in enumerate(self.node.outputs) if o)

    def const(self, i: int):
        """The value of input ``i`` when it is a constant (None otherwise)."""
        return self._const_of(self.node.inputs[i]) if self.has(i) else None

    def nbytes(self, name: str) -> int:
        s = self._shape_of(name)
        bits = elem_bits(self._type_of(name))
        if not is_known(s):
            raise Unknown(f"the shape of {name!r} is unknown")
        if bits is None:
            raise Unknown(f"the element type of {name!r} is unknown")
        return (numel(s) * bits + 7) // 8

    def attr(self, name: str, default=None):
        v = self.attrs.get(name, default)
        return default if v is None else v


# ---------------------------------------------------------------------------- the rules
_RULES: dict = {}


def rule(*ops: str):
    """Register a cost rule for ops named ``"Op"`` (ai.onnx) or ``"domain::Op"``."""

    def deco(fn):
        for op in ops:
            dom, _, name = op.rpartition("::")
            _RULES[(dom, name)] = fn
        return fn

    return deco


def has_rule(op_type: str, domain: str = "") -> bool:
    return (domain if domain != "ai.onnx" else "", op_type) in _RULES


def node_cost(v: NodeView) -> Cost:
    """The cost of the node behind ``v``; raises Unknown when shapes are missing, returns
    ``Cost(flops=None)`` with a note for an op nobody wrote a rule for."""
    n = v.node
    dom = n.domain if n.domain != "ai.onnx" else ""
    fn = _RULES.get((dom or "", n.op_type))
    if fn is not None:
        return fn(v)
    f = registry.facts(n.op_type, dom)
    if f.shape_only:
        return Cost(0, 0, bytes_read=0)
    if f.category == "shape":
        return Cost(0, 0)
    if f.elementwise or f.category in ("activation", "math"):
        return Cost(0, v.outs())
    return Cost(0, None, note=f"no cost rule for {dom + '::' if dom else ''}{n.op_type}: "
                              f"FLOPs unknown, bytes counted")


# -- convolution ---------------------------------------------------------------------------
_ACT_FLOPS = 1   # each fused activation: 1 per output element


def _epilogue(v: NodeView, y: int, bias_input: int | None, residual_input: int | None) -> int:
    extra = 0
    if bias_input is not None and v.has(bias_input):
        extra += y
    if residual_input is not None and v.has(residual_input):
        extra += y
    act = v.attr("activation", "")
    if act:
        extra += _ACT_FLOPS * y
    return extra


@rule("Conv", "ConvInteger", "com.microsoft::FusedConv", "com.workbench::FusedConv",
      "com.microsoft::NhwcConv")
def conv_cost(v: NodeView) -> Cost:
    w = v.shape(1)
    y = v.out()
    macs = y * numel(w[1:])              # Cout*Hout*Wout * Cin/groups * kh * kw
    bias = 2 if v.node.op_type != "ConvInteger" else None
    z = 3 if v.node.op_type == "FusedConv" else None
    return Cost(macs, 2 * macs + _epilogue(v, y, bias, z))


@rule("com.workbench::NhwcConv")
def nhwc_conv_cost(v: NodeView) -> Cost:
    """The layout pass's channels-last FusedConv: weights (kh, kw, C/group, M)."""
    w = v.shape(1)
    y = v.out()
    macs = y * numel(w[:3])
    return Cost(macs, 2 * macs + _epilogue(v, y, 2, 3))


@rule("com.workbench::NhwcConvChain")
def nhwc_conv_chain_cost(v: NodeView) -> Cost:
    """The layout pass's inverted-residual chain (``ops/conv_nhwc.py``): an optional 1x1
    expand (weights input 1, bias 2), the depthwise 3x3 (3, bias 4), an optional 1x1 project
    (5, bias 6, residual 7), the other half it is interleaved with (8); each stage's bias
    and activation 1 FLOP per output."""
    x, y = v.shape(0), v.out_shape()
    c1 = v.shape(3)[3]
    pix_in, pix_out = numel(x[:3]), numel(y[:3])

    def epi(n, bias, act, z=None):
        return n * (v.has(bias) + bool(v.attr(act, "")) + (z is not None and v.has(z)))
    macs = pix_out * 9 * c1
    extra = epi(pix_out * c1, 4, "dw_activation")
    if v.has(1):
        macs += pix_in * x[3] * c1
        extra += epi(pix_in * c1, 2, "expand_activation")
    if v.has(5):   # (with input 8, ShuffleNet's other half, Y holds both halves)
        m = v.shape(5)[3]
        macs += pix_out * c1 * m
        extra += epi(pix_out * m, 6, "project_activation", 7)
    return Cost(macs, 2 * macs + extra)


@rule("QLinearConv")
def qlinear_conv_cost(v: NodeView) -> Cost:
    w = v.shape(3)
    y = v.out()
    macs = y * numel(w[1:])
    # bias (input 8) and the requantisation (scale, round, zero point: 3 per output)
    return Cost(macs, 2 * macs + (y if v.has(8) else 0) + 3 * y)


@rule("ConvTranspose")
def conv_transpose_cost(v: NodeView) -> Cost:
    x = v.n(0)
    w = v.shape(1)                        # [Cin, Cout/groups, kh, kw]
    macs = x * numel(w[1:])               # every input element scatters into Cout/g*kh*kw
    return Cost(macs, 2 * macs + (v.out() if v.has(2) else 0))


@rule("DeformConv")
def deform_conv_cost(v: NodeView) -> Cost:
    x, w = v.shape(0), v.shape(1)
    y = v.out_shape()
    macs = numel(y) * numel(w[1:])
    # bilinear sampling: 4 neighbours (7 FLOPs) per sampled value, N*Cin*k*Hout*Wout of them
    samples = y[0] * x[1] * numel(w[2:]) * numel(y[2:])
    extra = 7 * samples + (numel(y) if v.has(2) else 0) + (samples if v.has(4) else 0)
    return Cost(macs, 2 * macs + extra)


# -- matrix products -----------------------------------------------------------------------
def _inner(a_shape, trans: bool = False) -> int:
    if len(a_shape) == 1:
        return a_shape[0]
    return a_shape[-2] if trans else a_shape[-1]


@rule("MatMul", "MatMulInteger", "com.microsoft::MatMulIntegerToFloat",
      "com.microsoft::DynamicQuantizeMatMul")
def matmul_cost(v: NodeView) -> Cost:
    y = v.out()
    macs = y * _inner(v.shape(0))
    extra = 0
    if v.node.op_type == "MatMulIntegerToFloat":     # scales, zero points, bias
        extra = 2 * y + (y if v.has(6) else 0)
    elif v.node.op_type == "DynamicQuantizeMatMul":
        extra = 4 * v.n(0) + 2 * y + (y if v.has(4) else 0)
    return Cost(macs, 2 * macs + extra)


@rule("QLinearMatMul")
def qlinear_matmul_cost(v: NodeView) -> Cost:
    y = v.out()
    macs = y * _inner(v.shape(0))
    return Cost(macs, 2 * macs + 3 * y)


@rule("com.microsoft::FusedMatMul")
def ms_fused_matmul_cost(v: NodeView) -> Cost:
    y = v.out()
    a = v.shape(0)
    if v.attr("transBatchA", 0) and len(a) > 2:
        a = a[1:-1] + (a[0], a[-1])
    macs = y * _inner(a, bool(v.attr("transA", 0)))
    return Cost(macs, 2 * macs + (y if float(v.attr("alpha", 1.0)) != 1.0 else 0))


@rule("com.workbench::FusedMatMul")
def wb_fused_matmul_cost(v: NodeView) -> Cost:
    y = v.out()
    macs = y * _inner(v.shape(0))
    norm = 5 * y if v.has(4) else 0   # a LayerNormalization epilogue (Scale is input 4)
    return Cost(macs, 2 * macs + _epilogue(v, y, 2, 3) + norm)


@rule("Gemm", "com.microsoft::FusedGemm", "com.microsoft::QGemm")
def gemm_cost(v: NodeView) -> Cost:
    a = v.shape(0)
    y = v.out()
    macs = y * (a[0] if v.attr("transA", 0) else a[-1])
    q = v.node.op_type == "QGemm"
    c_in = 6 if q else 2
    extra = y if v.has(c_in) else 0
    if float(v.attr("alpha", 1.0)) != 1.0:
        extra += y
    if v.has(c_in) and float(v.attr("beta", 1.0)) != 1.0 and not q:
        extra += y
    if v.attr("activation", ""):
        extra += y
    if q:
        extra += 3 * y
    return Cost(macs, 2 * macs + extra)


@rule("com.microsoft::MatMulNBits")
def matmul_nbits_cost(v: NodeView) -> Cost:
    y = v.out()
    k = int(v.attr("K", 0)) or _inner(v.shape(0))
    macs = y * k
    n = int(v.attr("N", 0)) or v.out_shape()[-1]
    dequant = 2 * n * k                   # scale and zero point per weight element
    return Cost(macs, 2 * macs + dequant + (y if v.has(5) else 0))


@rule("Einsum")
def einsum_cost(v: NodeView) -> Cost:
    eq = str(v.attr("equation", "")).replace(" ", "")
    lhs = eq.split("->")[0].split(",")
    sizes: dict = {}
    n_in = len([x for x in v.node.inputs if x])
    for k, term in enumerate(lhs[:n_in]):
        s = v.shape(k)
        if "..." in term:
            head, tail = term.split("...")
            nb = len(s) - len(head) - len(tail)
            # broadcast ellipsis dims align from the right
            letters = list(head) + [f"@{nb - 1 - i}" for i in range(nb)][::-1] + list(tail)
        else:
            letters = list(term)
        for ch, d in zip(letters, s):
            sizes[ch] = max(sizes.get(ch, 1), int(d))
    total = int(np.prod(list(sizes.values()), dtype=np.int64)) if sizes else 0
    if n_in <= 1:
        return Cost(0, v.n(0))
    # a naive contraction: one multiply per operand pair per point of the joint index space
    macs = total * (n_in - 1)
    return Cost(macs, 2 * macs)


# -- attention -----------------------------------------------------------------------------
def _softmax_flops(scores: int) -> int:
    return 5 * scores


def _attention(batch_heads_sq_sk: int, d: int, dv: int, *, scale=True, mask=False) -> Cost:
    s = batch_heads_sq_sk
    macs = s * d + s * dv
    extra = _softmax_flops(s) + (s if scale else 0) + (s if mask else 0)
    return Cost(macs, 2 * macs + extra)


@rule("Attention")
def onnx_attention_cost(v: NodeView) -> Cost:
    q, k, val = v.shape(0), v.shape(1), v.shape(2)
    if len(q) == 4:                        # [B, Hq, Sq, d]
        b, h, sq, d = q
        sk, dv = k[2], val[3]
    else:                                  # [B, Sq, Hq*d]
        h = int(v.attr("q_num_heads", 0)) or 1
        b, sq, hid = q
        d = hid // h
        sk = k[1]
        kv_heads = int(v.attr("kv_num_heads", 0)) or h
        dv = val[2] // kv_heads
    if v.has(4):                           # past_key: [B, Hkv, P, d]
        sk += v.shape(4)[2]
    return _attention(b * h * sq * sk, d, dv, mask=v.has(3))


@rule("com.microsoft::Attention", "com.microsoft::QAttention")
def ms_attention_cost(v: NodeView) -> Cost:
    x, w = v.shape(0), v.shape(1)          # [B, S, in], [in, q+k+v hidden]
    b, s = x[0], x[1]
    h = int(v.attr("num_heads", 1))
    sizes = list(v.attr("qkv_hidden_sizes", []) or [])
    if not sizes:
        sizes = [w[1] // 3] * 3
    proj = b * s * x[2] * w[1]
    past = 0
    past_in = 4 if v.node.op_type == "Attention" else 8
    if v.has(past_in):                     # past: [2, B, H, P, d]
        past = v.shape(past_in)[3]
    sk = s + past
    att = _attention(b * h * s * sk, sizes[0] // h, sizes[2] // h, mask=v.has(3))
    macs = proj + att.macs
    extra = b * s * w[1] if v.has(2) else 0    # QKV bias
    if v.node.op_type == "QAttention":
        extra += 4 * v.n(0)
    return Cost(macs, 2 * proj + att.flops + extra)


@rule("com.microsoft::MultiHeadAttention")
def ms_mha_cost(v: NodeView) -> Cost:
    q = v.shape(0)
    h = int(v.attr("num_heads", 1))
    if len(q) == 5:                        # packed QKV [B, S, H, 3, d]
        b, sq, _, _, d = q
        return _attention(b * h * sq * sq, d, d)
    b, sq, hid = q
    d = hid // h
    if v.has(1):
        k = v.shape(1)
        sk = k[1] if len(k) == 3 else k[2]
        if len(k) == 5:                    # packed KV [B, S, H, 2, d]
            sk = k[1]
    else:
        sk = sq
    if v.has(6):                           # past_key [B, H, P, d]
        sk += v.shape(6)[2]
    dv = v.out_shape()[2] // h
    c = _attention(b * h * sq * sk, d, dv, mask=v.has(4) or v.has(5))
    if v.has(3):                           # bias of Q, K, V
        c.flops += b * sq * hid + 2 * b * sk * hid
    return c


@rule("com.microsoft::GroupQueryAttention")
def gqa_cost(v: NodeView) -> Cost:
    q = v.shape(0)
    h = int(v.attr("num_heads", 1))
    kvh = int(v.attr("kv_num_heads", h))
    b, s, hid = q
    if not v.has(1):                       # packed QKV: hidden = (h + 2 kvh) * d
        d = hid // (h + 2 * kvh)
    else:
        d = hid // h
    try:
        total = v.out_shape(1)[2]          # present_key [B, kvh, T, d]
    except Unknown:
        total = s + (v.shape(3)[2] if v.has(3) else 0)
    return _attention(b * h * s * total, d, d)


#: inputs whose *values* a rule reads, by op: where they are not constants (shape arithmetic
#: at the bound shapes), the analysis asks our engine's run for them
VALUE_INPUTS = {("com.workbench", "FusedAttention"): (4, 5, 6, 7)}


@rule("com.workbench::FusedAttention")
def wb_fused_attention_cost(v: NodeView) -> Cost:
    q = _laid_out(v, 0, 4, "q_perm")
    k = _laid_out(v, 1, 5, "k_perm")        # already transposed: [..., d, Sk]
    val = _laid_out(v, 2, 6, "v_perm")
    batch = numel(q[:-2]) if len(q) > 2 else 1
    sq, d = q[-2], q[-1]
    sk = k[-1]
    dv = val[-1]
    return _attention(batch * sq * sk, d, dv, scale=bool(v.attr("scale_op", "")),
                      mask=bool(v.attr("mask", "")))


def _laid_out(v: NodeView, i: int, shape_input: int, perm_attr: str) -> tuple:
    """The shape FusedAttention works on for operand ``i``: reshaped to its folded shape
    input, then transposed by its folded permutation (both optional)."""
    s = list(v.shape(i))
    if v.has(shape_input):
        target = v.const(shape_input)
        if target is None:
            raise Unknown(f"the folded head shape (input {shape_input}) is not known")
        target = [int(t) for t in np.asarray(target).reshape(-1)]
        new = [s[j] if t == 0 and j < len(s) else t for j, t in enumerate(target)]
        if -1 in new:
            known = int(np.prod([t for t in new if t != -1], dtype=np.int64)) or 1
            new[new.index(-1)] = numel(s) // known
        s = new
    perm = list(v.attr(perm_attr, ()) or ())
    if perm:
        s = [s[p] for p in perm]
    return tuple(s)


@rule("ai.onnx.preview::FlexAttention")
def flex_attention_cost(v: NodeView) -> Cost:
    q, k, val = v.shape(0), v.shape(1), v.shape(2)
    b, h, sq, d = q
    return _attention(b * h * sq * k[2], d, val[3])


# -- pooling -------------------------------------------------------------------------------
@rule("MaxPool", "AveragePool", "LpPool", "com.microsoft::QLinearAveragePool")
def pool_cost(v: NodeView) -> Cost:
    y = v.out()
    k = numel(v.attr("kernel_shape", []))
    extra = y if v.node.op_type in ("AveragePool", "QLinearAveragePool") else 0
    if v.node.op_type == "LpPool":
        extra = y + y * k                   # the powers, then the root
    return Cost(0, y * k + extra)


@rule("GlobalAveragePool", "GlobalMaxPool", "GlobalLpPool",
      "com.microsoft::QLinearGlobalAveragePool")
def global_pool_cost(v: NodeView) -> Cost:
    x = v.n(0)
    y = v.out()
    avg = v.node.op_type in ("GlobalAveragePool", "QLinearGlobalAveragePool")
    return Cost(0, x + (y if avg else 0) + (x + y if v.node.op_type == "GlobalLpPool" else 0))


@rule("MaxRoiPool")
def max_roi_pool_cost(v: NodeView) -> Cost:
    # every input element of each pooled region is compared once; regions cover the map
    return Cost(0, v.out() + v.n(0) * v.shape(1)[0] // max(1, v.shape(0)[0]))


@rule("RoiAlign")
def roi_align_cost(v: NodeView) -> Cost:
    sr = int(v.attr("sampling_ratio", 0)) or 2   # 0: adaptive; 2x2 samples is typical
    return Cost(0, v.out() * (sr * sr * 7 + 1))


@rule("MaxUnpool", "Col2Im")
def scatter_pool_cost(v: NodeView) -> Cost:
    return Cost(0, v.n(0) if v.node.op_type == "Col2Im" else 0)


# -- normalisation -------------------------------------------------------------------------
@rule("BatchNormalization")
def batchnorm_cost(v: NodeView) -> Cost:
    return Cost(0, 2 * v.out())


@rule("LayerNormalization", "GroupNormalization", "InstanceNormalization",
      "MeanVarianceNormalization", "com.microsoft::LayerNormalization")
def layernorm_cost(v: NodeView) -> Cost:
    return Cost(0, 7 * v.out())


@rule("RMSNormalization", "com.microsoft::SimplifiedLayerNormalization")
def rmsnorm_cost(v: NodeView) -> Cost:
    return Cost(0, 4 * v.out())


@rule("com.microsoft::SkipLayerNormalization", "com.microsoft::SkipSimplifiedLayerNormalization")
def skip_layernorm_cost(v: NodeView) -> Cost:
    y = v.out()
    per = 7 if v.node.op_type == "SkipLayerNormalization" else 4
    bias = 4 if v.node.op_type == "SkipLayerNormalization" else 3
    return Cost(0, (per + 1) * y + (y if v.has(bias) else 0))


@rule("com.microsoft::EmbedLayerNormalization", "com.microsoft::QEmbedLayerNormalization")
def embed_layernorm_cost(v: NodeView) -> Cost:
    y = v.out()
    return Cost(0, 9 * y)   # word + position (+ segment) embeddings added, then LayerNorm


@rule("LRN")
def lrn_cost(v: NodeView) -> Cost:
    return Cost(0, v.out() * (2 * int(v.attr("size", 1)) + 3))


@rule("LpNormalization")
def lp_norm_cost(v: NodeView) -> Cost:
    return Cost(0, 3 * v.out())


@rule("Dropout")
def dropout_cost(v: NodeView) -> Cost:
    # inference: the identity (a view); the mask output, when asked for, is written
    mask = v.nbytes(v.node.outputs[1]) if len(v.node.outputs) > 1 and v.node.outputs[1] else 0
    return Cost(0, 0, bytes_read=0, bytes_written=mask)


# -- element-wise with a fixed formula ------------------------------------------------------
@rule("Softmax", "LogSoftmax", "Hardmax", "com.microsoft::QLinearSoftmax")
def softmax_cost(v: NodeView) -> Cost:
    return Cost(0, _softmax_flops(v.out()))


@rule("Sum", "Max", "Min", "Mean")
def variadic_cost(v: NodeView) -> Cost:
    k = len([x for x in v.node.inputs if x])
    y = v.out()
    return Cost(0, max(k - 1, 1) * y + (y if v.node.op_type == "Mean" else 0))


@rule("com.microsoft::BiasAdd")
def bias_add_cost(v: NodeView) -> Cost:
    return Cost(0, 2 * v.out())


@rule("com.microsoft::BiasGelu", "com.microsoft::FastGelu")
def bias_gelu_cost(v: NodeView) -> Cost:
    return Cost(0, (2 if v.has(1) else 1) * v.out())


@rule("RotaryEmbedding", "com.microsoft::RotaryEmbedding")
def rotary_cost(v: NodeView) -> Cost:
    return Cost(0, 3 * v.out())          # x*cos + rotate(x)*sin


@rule("DequantizeLinear", "QuantizeLinear", "com.microsoft::DequantizeLinear",
      "com.microsoft::QuantizeLinear")
def quant_cost(v: NodeView) -> Cost:
    return Cost(0, 2 * v.out())


@rule("DynamicQuantizeLinear")
def dyn_quant_cost(v: NodeView) -> Cost:
    return Cost(0, 4 * v.n(0))           # min/max pass, then scale, round, shift


@rule("com.microsoft::QLinearAdd", "com.microsoft::QLinearMul")
def qlinear_binary_cost(v: NodeView) -> Cost:
    return Cost(0, 4 * v.out())           # dequantise both, the op, requantise


@rule("com.microsoft::QLinearSigmoid", "com.microsoft::QLinearLeakyRelu",
      "com.microsoft::QLinearWhere")
def qlinear_unary_cost(v: NodeView) -> Cost:
    return Cost(0, 3 * v.out())


# -- reductions ----------------------------------------------------------------------------
@rule("ReduceSum", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceL1", "ReduceMean",
      "ReduceSumSquare", "ReduceL2", "ReduceLogSum", "ReduceLogSumExp", "ArgMax", "ArgMin",
      "CumSum", "CumProd")
def reduce_cost(v: NodeView) -> Cost:
    x = v.n(0)
    y = v.out()
    per = {"ReduceSumSquare": 2, "ReduceL2": 2, "ReduceLogSumExp": 3}.get(v.node.op_type, 1)
    extra = y if v.node.op_type in ("ReduceMean", "ReduceL2", "ReduceLogSum",
                                    "ReduceLogSumExp") else 0
    return Cost(0, per * x + extra)


@rule("TopK")
def topk_cost(v: NodeView) -> Cost:
    x = v.n(0)
    k = max(v.out_shape(0)[int(v.attr("axis", -1))], 1)
    return Cost(0, int(x * max(1.0, math.log2(k + 1))))


# -- resampling ----------------------------------------------------------------------------
@rule("Resize", "Upsample")
def resize_cost(v: NodeView) -> Cost:
    y = v.out_shape()
    x = v.shape(0)
    r = sum(1 for a, b in zip(x, y) if a != b) or 1
    mode = str(v.attr("mode", "nearest"))
    if mode == "nearest":
        return Cost(0, 0)
    pts = 2 ** r if mode == "linear" else 4 ** r
    return Cost(0, numel(y) * (2 * pts - 1))


@rule("GridSample", "AffineGrid")
def grid_cost(v: NodeView) -> Cost:
    if v.node.op_type == "AffineGrid":
        y = v.out_shape()                  # [N, H, W, 2]: a 2x3 (3x4) product per point
        return Cost(numel(y) * (y[-1] + 1), 2 * numel(y) * (y[-1] + 1))
    y = v.out()
    return Cost(0, y * 7)


# -- data movement: views move no bytes; selections read what they select ---------------------
@rule("Reshape", "Flatten", "Squeeze", "Unsqueeze", "Identity")
def view_cost(v: NodeView) -> Cost:
    return Cost(0, 0, bytes_read=0, bytes_written=0)


@rule("Gather", "GatherElements", "GatherND", "Slice", "com.microsoft::GatherBlockQuantized")
def gather_cost(v: NodeView) -> Cost:
    out_b = v.nbytes(v.node.outputs[0])
    idx = sum(v.nbytes(v.node.inputs[i]) for i in range(1, len(v.node.inputs))
              if v.has(i) and v.node.op_type != "Slice")
    return Cost(0, 0, bytes_read=out_b + idx)


# -- recurrent -----------------------------------------------------------------------------
def _rnn(v: NodeView, gates: int, pointwise_per_hidden: int) -> Cost:
    x = v.shape(0)
    w = v.shape(1)                          # [D, gates*H, I]
    r = v.shape(2)                          # [D, gates*H, H]
    layout = int(v.attr("layout", 0))
    seq, batch = (x[1], x[0]) if layout else (x[0], x[1])
    dirs, gh, inp = w
    hidden = r[2]
    steps = dirs * seq * batch
    macs = steps * gh * (inp + hidden)
    bias = 2 * steps * gh if v.has(3) else 0
    pointwise = steps * hidden * pointwise_per_hidden
    peep = 2 * steps * 3 * hidden if v.node.op_type == "LSTM" and v.has(7) else 0
    return Cost(macs, 2 * macs + bias + pointwise + peep)


@rule("LSTM", "com.microsoft::DynamicQuantizeLSTM")
def lstm_cost(v: NodeView) -> Cost:
    # 3 sigmoids, 2 tanh, c = f*c + i*g (3), h = o*tanh(c) (1): 9 per hidden unit and step
    return _rnn(v, 4, 9)


@rule("GRU")
def gru_cost(v: NodeView) -> Cost:
    # 2 sigmoids, 1 tanh, r*h (1), h = (1-z)*n + z*h (4): 8 per hidden unit and step
    return _rnn(v, 3, 8)


@rule("RNN")
def rnn_cost(v: NodeView) -> Cost:
    return _rnn(v, 1, 1)


# -- classic ML ----------------------------------------------------------------------------
@rule("ai.onnx.ml::LinearClassifier", "ai.onnx.ml::LinearRegressor")
def linear_model_cost(v: NodeView) -> Cost:
    x = v.shape(0)
    rows = x[0] if len(x) > 1 else 1
    coef = len(v.attr("coefficients", []) or [])
    macs = rows * coef
    return Cost(macs, 2 * macs + rows * max(1, coef // max(1, x[-1])))


@rule("ai.onnx.ml::SVMClassifier", "ai.onnx.ml::SVMRegressor")
def svm_cost(v: NodeView) -> Cost:
    x = v.shape(0)
    rows, feats = (x[0], x[-1]) if len(x) > 1 else (1, x[0])
    sv = v.attr("support_vectors", []) or []
    n_sv = len(sv) // max(1, feats)
    coef = len(v.attr("coefficients", []) or [])
    if n_sv:
        kernel = rows * n_sv * feats
        return Cost(kernel + rows * coef, 2 * (kernel + rows * coef) + 3 * rows * n_sv)
    macs = rows * coef                        # linear SVM: coefficients per class
    return Cost(macs, 2 * macs)


@rule("ai.onnx.ml::TreeEnsembleClassifier", "ai.onnx.ml::TreeEnsembleRegressor",
      "ai.onnx.ml::TreeEnsemble")
def tree_ensemble_cost(v: NodeView) -> Cost:
    x = v.shape(0)
    rows = x[0] if len(x) > 1 else 1
    depths, trees, deepest = _expected_depths(v)
    visited = rows * depths
    return Cost(0, int(round(visited)) + rows * trees,
                note=f"{trees} trees, {depths:.1f} nodes visited per row on average (each "
                     f"split sending half the rows each way), deepest path {deepest}")


def _as_list(v) -> list:
    """An attribute's entries as a list (a tree node table may be a numpy array,
    ``graph.ir.AttrArray``: ``tolist`` gives Python numbers, fast)."""
    return v.tolist() if hasattr(v, "tolist") else list(v)


def _expected_depths(v: NodeView) -> tuple:
    """(sum over trees of the expected path length, number of trees, deepest path)."""
    a = v.attrs
    if "tree_roots" in a:                     # TreeEnsemble (ai.onnx.ml 5)
        true_ids = _as_list(a.get("nodes_truenodeids", []))
        false_ids = _as_list(a.get("nodes_falsenodeids", []))
        true_leaf = _as_list(a.get("nodes_trueleafs", [])) or [0] * len(true_ids)
        false_leaf = _as_list(a.get("nodes_falseleafs", [])) or [0] * len(false_ids)
        total, deepest = 0.0, 0
        for root in a["tree_roots"]:
            stack = [(int(root), 1)]
            while stack:
                node, d = stack.pop()
                deepest = max(deepest, d)
                for child, leaf in ((true_ids[node], true_leaf[node]),
                                    (false_ids[node], false_leaf[node])):
                    if leaf:
                        total += d * 2.0 ** -d
                    else:
                        stack.append((int(child), d + 1))
        return total, len(a["tree_roots"]), deepest
    tree_ids = _as_list(a.get("nodes_treeids", []))
    node_ids = _as_list(a.get("nodes_nodeids", []))
    modes = _as_list(a.get("nodes_modes", []))
    t_ids = _as_list(a.get("nodes_truenodeids", []))
    f_ids = _as_list(a.get("nodes_falsenodeids", []))
    if not tree_ids:
        raise Unknown("the tree ensemble has no nodes_treeids attribute")
    index = {(t, n): i for i, (t, n) in enumerate(zip(tree_ids, node_ids))}
    roots: dict = {}
    children = set()
    for i, t in enumerate(tree_ids):
        if str(modes[i]) != "LEAF":
            children.add((t, t_ids[i]))
            children.add((t, f_ids[i]))
    for i, t in enumerate(tree_ids):
        if (t, node_ids[i]) not in children and t not in roots:
            roots[t] = i
    total, deepest = 0.0, 0
    for t, root in roots.items():
        stack = [(root, 0)]
        seen = 0
        while stack and seen <= len(tree_ids):
            i, d = stack.pop()
            seen += 1
            if str(modes[i]) == "LEAF":
                total += d * 2.0 ** -d if d else 0.0
                deepest = max(deepest, d)
                continue
            for child in (t_ids[i], f_ids[i]):
                j = index.get((t, child))
                if j is not None:
                    stack.append((j, d + 1))
    return total, len(roots), deepest


# -- control flow ---------------------------------------------------------------------------
#: a trip count above this is a "run until the condition stops it" sentinel, not a count
_MAX_TRIPS = 1 << 40


def control_flow_cost(v: NodeView, body_cost) -> Cost:
    """If: the larger branch; Loop: trip count x body where the trip count is a constant;
    Scan: sequence length x body. ``body_cost(graph) -> (macs, flops, n_unknown)``."""
    n = v.node
    subs = n.subgraphs
    bodies = {k: g for k, g in n.attrs.items() if any(g is s for s in subs)}
    costs = {k: body_cost(g) for k, g in bodies.items()}
    unknown = sum(c[2] for c in costs.values())
    miss = f"; {unknown} body node(s) without a count" if unknown else ""
    if n.op_type == "If" and costs:
        big = max(costs, key=lambda k: costs[k][1])
        other = ", ".join(f"{k} {c[1]:,}" for k, c in costs.items() if k != big)
        return Cost(costs[big][0], costs[big][1],
                    note=f"If: the larger branch ({big}); {other} FLOPs{miss}")
    body = costs.get("body")
    if body is None:
        return Cost(0, None, note=f"{n.op_type}: its body graph is not counted")
    trips, how = None, ""
    if n.op_type == "Loop":
        m = v.const(0)
        if m is not None and np.asarray(m).size == 1 and 0 <= int(np.asarray(m).reshape(-1)[0]) \
                < _MAX_TRIPS:
            trips = int(np.asarray(m).reshape(-1)[0])
            how = (f"{trips} iterations (M; an upper bound: the condition may stop it "
                   f"earlier)" if v.has(1) else f"{trips} iterations (M)")
    elif n.op_type == "Scan":
        k = int(v.attr("num_scan_inputs", 1))
        ins = [i for i, x in enumerate(n.inputs) if x]
        first = len(n.inputs) - k
        axes = list(v.attr("scan_input_axes", []) or [])
        if first in ins:
            shape = v.shape(first)
            axis = int(axes[0]) if axes else 0
            trips = shape[axis % len(shape)]
            how = f"{trips} iterations (the scan axis)"
    if trips is None:
        return Cost(0, None, note=f"{n.op_type}: {body[1]:,} FLOPs per iteration; the number "
                                  f"of iterations is data-dependent{miss}")
    return Cost(trips * body[0], trips * body[1],
                note=f"{n.op_type}: {how} x {body[1]:,} FLOPs per iteration{miss}")
