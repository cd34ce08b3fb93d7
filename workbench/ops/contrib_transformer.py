"""com.microsoft transformer kernels: what onnxruntime's transformer optimizer
(``onnxruntime.transformers.optimizer``) and its graph optimizer (saved optimized models) write.

Implemented from onnxruntime's published ContribOperators specification:

* Attention (packed QKV projection + multi-head attention, mask_index in its 1-D end / end+start,
  2-D, 3-D and 4-D forms, past/present state [2, B, N, T, H], unidirectional, attention_bias),
  MultiHeadAttention (separate / packed Q, K, V, key_padding_mask, past/present key and value),
  GroupQueryAttention (grouped K/V heads, past/present buffers, seqlens_k, causal, local window,
  softcap, rotary).
* SkipLayerNormalization, SkipSimplifiedLayerNormalization, SimplifiedLayerNormalization,
  EmbedLayerNormalization.
* Gelu, BiasGelu, FastGelu (tanh approximation), QuickGelu, BiasAdd, FusedMatMul (transposes of
  the matrices and of the batch dimension), FusedGemm, FusedConv (com.microsoft's: Conv + Z +
  activation; not the engine's internal com.workbench::FusedConv), RotaryEmbedding.

Float math runs in float32 for float16/bfloat16 inputs (float64 inputs stay float64).
"""

from __future__ import annotations

import math

import numpy as np

from workbench.arrays import xp_of
from workbench.errors import InputError, ShapeError
from workbench.ops import rowwise
from workbench.ops._common import ints
from workbench.ops.attention import attend
from workbench.ops.registry import kernel, lookup, register

MS = "com.microsoft"


def _up(x):
    return x if x.dtype in (np.float32, np.float64) else x.astype(np.float32)


def _erf(x):
    return lookup("Erf", "", 13).fn(x)


def _gelu_erf(x):
    xp = xp_of(x)
    return 0.5 * x * (1.0 + _erf(x / xp.asarray(math.sqrt(2.0), dtype=x.dtype)))


def _gelu_tanh(x):
    xp = xp_of(x)
    c = x.dtype.type(math.sqrt(2.0 / math.pi))
    return 0.5 * x * (1.0 + xp.tanh(c * (x + x.dtype.type(0.044715) * x * x * x)))


def _sigmoid(x):
    xp = xp_of(x)
    return 1.0 / (1.0 + xp.exp(-x))


# ---------------------------------------------------------------------------------- activations
def _compiled_gelu(x, activation, bias=None):
    """GELU of a float32 host array by the compiled kernel (``transformer.gelu``), or None."""
    if x.dtype != np.float32 or (bias is not None and bias.dtype != np.float32):
        return None
    return rowwise.gelu(x, activation, bias=bias)


@kernel("Gelu", since=1, domain=MS)
def ms_gelu(X):
    y = _compiled_gelu(X, "Gelu")
    return y if y is not None else _gelu_erf(_up(X)).astype(X.dtype)


@kernel("BiasGelu", since=1, domain=MS)
def bias_gelu(A, B):
    if B.ndim != 1 or A.shape[-1] != B.shape[0]:
        raise ShapeError(f"BiasGelu: bias B {tuple(B.shape)} must be 1-D with A's last "
                         f"dimension ({A.shape[-1]}); A is {tuple(A.shape)}")
    y = _compiled_gelu(A, "Gelu", B)
    return y if y is not None else _gelu_erf(_up(A) + _up(B)).astype(A.dtype)


@kernel("FastGelu", since=1, domain=MS, category="activation")
def fast_gelu(X, bias=None):
    if bias is not None and (bias.ndim != 1 or X.ndim == 0 or X.shape[-1] != bias.shape[0]):
        raise ShapeError(f"FastGelu: bias {tuple(bias.shape)} must be 1-D with X's last "
                         f"dimension; X is {tuple(X.shape)}")
    y = _compiled_gelu(X, "GeluTanh", bias)
    if y is not None:
        return y
    x = _up(X)
    if bias is not None:
        x = x + _up(bias)
    return _gelu_tanh(x).astype(X.dtype)


@kernel("QuickGelu", since=1, domain=MS, category="activation")
def quick_gelu(X, *, alpha=1.702):
    x = _up(X)
    return (x * _sigmoid(x * x.dtype.type(alpha))).astype(X.dtype)


@kernel("BiasAdd", since=1, domain=MS)
def bias_add(X, bias, skip):
    if X.ndim != 3 or bias.shape != (X.shape[2],) or skip.shape != X.shape:
        raise ShapeError(f"BiasAdd: X {tuple(X.shape)} must be [N, S, C], bias "
                         f"{tuple(bias.shape)} [C] and skip {tuple(skip.shape)} like X")
    return (_up(X) + _up(bias) + _up(skip)).astype(X.dtype)


# ---------------------------------------------------------------------------------- matmuls
def _trans_batch(x):
    """[d0, d1, ..., dk, M, K] -> [d1, ..., dk, d0, M, K]... as FusedMatMul's transBatch:
    the first dimension moves to just before the last one."""
    if x.ndim < 3:
        return x
    return x.transpose(tuple(range(1, x.ndim - 1)) + (0, x.ndim - 1))


@kernel("FusedMatMul", since=1, domain=MS)
def fused_matmul(A, B, *, alpha=1.0, transA=0, transB=0, transBatchA=0, transBatchB=0):
    xp = xp_of(A, B)
    a, b = A, B
    if transBatchA:
        a = _trans_batch(a)
    if transBatchB:
        b = _trans_batch(b)
    if transA and a.ndim >= 2:
        a = xp.swapaxes(a, -1, -2)
    if transB and b.ndim >= 2:
        b = xp.swapaxes(b, -1, -2)
    try:
        y = xp.matmul(_up(a), _up(b))
    except ValueError:
        raise ShapeError(f"FusedMatMul: cannot multiply A {tuple(A.shape)} and B "
                         f"{tuple(B.shape)} (transA={transA}, transB={transB}, transBatchA="
                         f"{transBatchA}, transBatchB={transBatchB})") from None
    if alpha != 1.0:
        y = y * y.dtype.type(alpha)
    return y.astype(A.dtype)


def _activation(op, name, params):
    """The fused activation of FusedConv/FusedGemm (name, float parameters)."""
    p = list(params or [])
    key = (name or "").lower()

    def need(n, defaults):
        return (p + list(defaults))[n] if len(p) <= n else p[n]

    if key in ("", "identity"):
        return lambda x: x
    if key == "relu":
        return lambda x: xp_of(x).maximum(x, 0)
    if key == "sigmoid":
        return _sigmoid
    if key == "tanh":
        return lambda x: xp_of(x).tanh(x)
    if key == "leakyrelu":
        a = need(0, [0.01])
        return lambda x: xp_of(x).where(x >= 0, x, x * x.dtype.type(a))
    if key == "hardsigmoid":
        a, b = need(0, [0.2, 0.5]), need(1, [0.2, 0.5])
        return lambda x: xp_of(x).clip(x * x.dtype.type(a) + x.dtype.type(b), 0, 1)
    if key == "clip":
        lo, hi = need(0, [-np.inf, np.inf]), need(1, [-np.inf, np.inf])
        return lambda x: xp_of(x).clip(x, lo, hi)
    if key == "elu":
        a = need(0, [1.0])
        return lambda x: xp_of(x).where(x >= 0, x, x.dtype.type(a) * (xp_of(x).exp(x) - 1))
    raise InputError(f"{op}: activation {name!r} is not supported (Relu, Sigmoid, Tanh, "
                     f"LeakyRelu, HardSigmoid, Clip, Elu)")


@kernel("FusedConv", since=1, domain=MS)
def ms_fused_conv(X, W, B=None, Z=None, *, activation="", activation_params=None,
                  auto_pad="NOTSET", dilations=None, group=1, kernel_shape=None, pads=None,
                  strides=None):
    """Y = activation(Conv(X, W, B) + Z) (com.microsoft domain)."""
    conv = lookup("Conv", "", 11).fn
    y = conv(X, W, B, auto_pad=auto_pad, dilations=dilations, group=group,
             kernel_shape=kernel_shape, pads=pads, strides=strides)
    if Z is not None:
        if Z.shape != y.shape:
            raise ShapeError(f"FusedConv: Z {tuple(Z.shape)} must have the convolution's "
                             f"output shape {tuple(y.shape)}")
        y = y + Z
    return _activation("FusedConv", activation, activation_params)(y).astype(X.dtype)


@kernel("FusedGemm", since=1, domain=MS)
def fused_gemm(A, B, C=None, *, alpha=1.0, beta=1.0, transA=0, transB=0, activation="",
               activation_alpha=None, activation_beta=None, activation_gamma=None):
    gemm = lookup("Gemm", "", 13).fn
    y = gemm(A, B, C, alpha=alpha, beta=beta, transA=transA, transB=transB)
    params = [p for p in (activation_alpha, activation_beta, activation_gamma) if p is not None]
    return _activation("FusedGemm", activation, params)(y).astype(A.dtype)


# ---------------------------------------------------------------------------------- norms
def _layer_norm(x, gamma, beta, eps, simplified):
    xp = xp_of(x)
    if simplified:
        ms = (x * x).mean(axis=-1, keepdims=True)
        inv = 1.0 / xp.sqrt(ms + x.dtype.type(eps))
        mean = xp.zeros_like(ms)
        y = x * inv
    else:
        mean = x.mean(axis=-1, keepdims=True)
        d = x - mean
        inv = 1.0 / xp.sqrt((d * d).mean(axis=-1, keepdims=True) + x.dtype.type(eps))
        y = d * inv
    y = y * _up(gamma)
    if beta is not None:
        y = y + _up(beta)
    return y, mean, inv


def _skip_ln(op, input, skip, gamma, beta, bias, epsilon, n_outputs, simplified):
    if input.ndim not in (2, 3):
        raise ShapeError(f"{op}: input must be [batch, seq, hidden] or [tokens, hidden], got "
                         f"{tuple(input.shape)}")
    h = input.shape[-1]
    if skip.shape != input.shape and skip.shape[-2:] != input.shape[-2:] and \
            skip.shape[-1:] != (h,):
        raise ShapeError(f"{op}: skip {tuple(skip.shape)} does not broadcast to input "
                         f"{tuple(input.shape)}")
    for name, p in (("gamma", gamma), ("beta", beta), ("bias", bias)):
        if p is not None and p.shape[-1:] != (h,):
            raise ShapeError(f"{op}: {name} {tuple(p.shape)} must have hidden size {h}")
    n = max(n_outputs, 1)
    if input.dtype == np.float32 and skip.ndim <= input.ndim and n in (1, 4):
        done = rowwise.layer_norm(input, gamma, beta, epsilon, skip=skip, bias=bias,
                                  simplified=simplified, want_sum=n == 4)
        if done is not None:
            if n == 1:
                return done
            y, s = done     # mean and inv_std_var from the sum, as below
            _, mean, inv = _layer_norm(s, gamma, None, epsilon, simplified)
            return y, mean.astype(np.float32), inv.astype(np.float32), s
    s = _up(input) + _up(skip)
    if bias is not None:
        s = s + _up(bias)
    y, mean, inv = _layer_norm(s, gamma, beta, epsilon, simplified)
    dt = input.dtype
    outs = [y.astype(dt), mean.astype(np.float32), inv.astype(np.float32), s.astype(dt)]
    return outs[0] if n == 1 else tuple(outs[:n])


@kernel("SkipLayerNormalization", since=1, domain=MS, wants_ctx=True, category="normalization")
def skip_layer_norm(input, skip, gamma, beta=None, bias=None, *, epsilon=1e-12, ctx):
    """Outputs: output, mean, inv_std_var, input_skip_bias_sum."""
    return _skip_ln("SkipLayerNormalization", input, skip, gamma, beta, bias, epsilon,
                    ctx.n_outputs, False)


def skip_layer_norm_output(input, skip, gamma, beta, bias, epsilon):
    """SkipLayerNormalization's first output alone (FusedMatMul's ``skip_norm`` form)."""
    return _skip_ln("SkipLayerNormalization", input, skip, gamma, beta, bias, epsilon, 1, False)


@kernel("SkipSimplifiedLayerNormalization", since=1, domain=MS, wants_ctx=True)
def skip_simplified_layer_norm(input, skip, gamma, bias=None, *, epsilon=1e-12, ctx):
    """Outputs: output, mean (the RMS form has none: zeros), inv_std_var,
    input_skip_bias_sum."""
    return _skip_ln("SkipSimplifiedLayerNormalization", input, skip, gamma, None, bias,
                    epsilon, ctx.n_outputs, True)


@kernel("SimplifiedLayerNormalization", since=1, domain=MS, wants_ctx=True,
        category="normalization")
def simplified_layer_norm(X, scale, *, axis=-1, epsilon=1e-5, stash_type=1, ctx):
    """RMS normalization over the axes from ``axis``: Y = X / sqrt(mean(X^2) + eps) * scale.
    Outputs Y and inv_std_var. onnxruntime writes it in the ONNX domain, which onnx does not
    define: the loader reads such nodes as com.microsoft (workbench/graph/quirks.py)."""
    op = "SimplifiedLayerNormalization"
    xp = xp_of(X)
    r = X.ndim
    if not -r <= axis < r:
        raise ShapeError(f"{op}: axis {axis} out of range for input of shape {tuple(X.shape)}")
    ax = axis % r
    if ax == r - 1 and ctx.n_outputs <= 1 and X.dtype == np.float32:
        y = rowwise.layer_norm(X, scale, None, epsilon, simplified=True)
        if y is not None:
            return y
    axes = tuple(range(ax, r))
    x = X.astype(np.float64) if X.dtype == np.float64 else X.astype(np.float32)
    inv = 1.0 / xp.sqrt((x * x).mean(axis=axes, keepdims=True) + x.dtype.type(epsilon))
    try:
        y = (x * inv) * _up(scale)
    except ValueError:
        raise ShapeError(f"{op}: scale {tuple(scale.shape)} does not broadcast to "
                         f"{tuple(X.shape)[ax:]}") from None
    y = y.astype(X.dtype)
    return y if ctx.n_outputs <= 1 else (y, inv.astype(np.float32))


@kernel("EmbedLayerNormalization", since=1, domain=MS, wants_ctx=True)
def embed_layer_norm(input_ids, segment_ids, word_embedding, position_embedding,
                     segment_embedding=None, gamma=None, beta=None, mask=None,
                     position_ids=None, *, epsilon=1e-12, mask_index_type=1, ctx):
    """output = LayerNorm(word[ids] + position[position_ids or 0..S-1] + segment[segment_ids]);
    mask_index = number of non-zero mask entries per row (int32 [B], zeros without a mask);
    embedding_sum = the sum before normalization."""
    op = "EmbedLayerNormalization"
    xp = xp_of(word_embedding)
    if input_ids.ndim != 2:
        raise ShapeError(f"{op}: input_ids must be [batch, seq], got {tuple(input_ids.shape)}")
    b, s = input_ids.shape
    ids = input_ids.astype(np.int64)
    vocab = word_embedding.shape[0]
    if ids.size and (ids.min() < 0 or ids.max() >= vocab):
        raise InputError(f"{op}: input_ids must be in [0, {vocab}); got values in "
                         f"[{int(ids.min())}, {int(ids.max())}]")
    emb = _up(word_embedding)[ids]
    if position_ids is None:
        pos = xp.broadcast_to(xp.arange(s)[None, :], (b, s))
    else:
        pos = xp.broadcast_to(position_ids.astype(np.int64), (b, s))
    if s > position_embedding.shape[0] or (pos.size and int(pos.max()) >=
                                            position_embedding.shape[0]):
        raise ShapeError(f"{op}: sequence length {s} exceeds the position embedding table "
                         f"({position_embedding.shape[0]} positions)")
    emb = emb + _up(position_embedding)[pos]
    if segment_ids is not None and segment_embedding is not None:
        seg = segment_ids.astype(np.int64)
        if seg.size and (seg.min() < 0 or seg.max() >= segment_embedding.shape[0]):
            raise InputError(f"{op}: segment_ids must be in [0, "
                             f"{segment_embedding.shape[0]})")
        emb = emb + _up(segment_embedding)[seg]
    y = None
    if emb.dtype == np.float32 and gamma is not None:
        y = rowwise.layer_norm(emb, gamma, beta, epsilon)    # compiled when loaded
    if y is None:
        y, _, _ = _layer_norm(emb, gamma, beta, epsilon, False)
    dt = word_embedding.dtype
    if mask is None:
        mask_index = xp.zeros((b,), dtype=np.int32)
    else:
        mask_index = (mask != 0).sum(axis=1).astype(np.int32)
    outs = [y.astype(dt), mask_index, emb.astype(dt)]
    n = max(ctx.n_outputs, 1)
    return outs[0] if n == 1 else tuple(outs[:n])


def _ms_layer_norm(X, Scale, B=None, *, axis=-1, epsilon=1e-5, stash_type=1, ctx):
    """LayerNormalization as onnxruntime writes it below ONNX opset 17 (its own ONNX-domain
    contrib op, read as com.microsoft by the loader): the opset-17 semantics."""
    return lookup("LayerNormalization", "", 17).fn(X, Scale, B, axis=axis, epsilon=epsilon,
                                                   stash_type=stash_type, ctx=ctx)


register("LayerNormalization", _ms_layer_norm, domain=MS, wants_ctx=True)


# ---------------------------------------------------------------------------------- attention
def _heads(x, n, name, op):
    """[B, S, N*H] -> [B, N, S, H]."""
    b, s, d = x.shape
    if d % n:
        raise ShapeError(f"{op}: {name} hidden size {d} is not divisible by num_heads {n}")
    return x.reshape(b, s, n, d // n).transpose(0, 2, 1, 3)


def _key_mask(op, xp, mask_index, b, s, t, past_len):
    """Boolean [B, 1 or S, T] of the key positions a query may NOT see, from mask_index."""
    if mask_index is None:
        return None
    m = mask_index
    j = xp.arange(t)
    if m.ndim == 1:
        if m.shape[0] == b:
            end = m.astype(np.int64)
            return (j[None, :] >= end[:, None])[:, None, :]
        if m.shape[0] == 2 * b:
            end = m[:b].astype(np.int64)
            start = m[b:].astype(np.int64)
            return ((j[None, :] >= end[:, None]) | (j[None, :] < start[:, None]))[:, None, :]
        raise ShapeError(f"{op}: 1-D mask_index must have {b} or {2 * b} values, got "
                         f"{m.shape[0]}")
    if m.ndim == 2:
        if m.shape != (b, t):
            raise ShapeError(f"{op}: 2-D mask_index must be [batch, total_seq] = {(b, t)}, got "
                             f"{tuple(m.shape)}")
        return (m == 0)[:, None, :]
    if m.ndim == 3:
        if m.shape != (b, s, t):
            raise ShapeError(f"{op}: 3-D mask_index must be {(b, s, t)}, got "
                             f"{tuple(m.shape)}")
        return m == 0
    if m.ndim == 4:
        if m.shape[0] != b or m.shape[2] < t or m.shape[3] < t:
            raise ShapeError(f"{op}: 4-D mask_index {tuple(m.shape)} must be [batch, 1, "
                             f"max_seq, max_seq] with max_seq >= {t}")
        return m[:, 0, past_len:past_len + s, :t] == 0
    raise ShapeError(f"{op}: mask_index of rank {m.ndim} is not supported (1 to 4)")


def _attend(op, xp, q, k, v, *, scale, key_mask, causal_offset, mask_filter_value,
            attention_bias=None, softcap=0.0, window=-1):
    """q [B, N, S, H], k/v [B, Nkv, T, H] (N a multiple of Nkv: grouped heads) -> [B, N, S, Hv],
    through the engine's attention core (:func:`workbench.ops.attention.attend`): the
    attention bias and the key mask (``mask_filter_value`` where masked) are added, the
    causal frontier and the local window are blocked with -1e30, as onnxruntime does."""
    h = q.shape[-1]
    sc = float(scale) if scale else 1.0 / math.sqrt(h)
    s, t = q.shape[2], k.shape[2]
    dt = q.dtype.type
    biases = []
    if attention_bias is not None:
        biases.append(("attention_bias", _up(attention_bias)))
    if key_mask is not None:
        biases.append(("mask", xp.where(key_mask[:, None], dt(mask_filter_value), dt(0))))
    blocked = None
    if causal_offset is not None:
        i = xp.arange(s)[:, None]
        j = xp.arange(t)[None, :]
        off = xp.asarray(causal_offset).reshape(-1, 1, 1, 1)  # per batch or scalar
        blocked = j[None, None] > (i[None, None] + off)
        if window is not None and window > 0:
            blocked = blocked | (j[None, None] <= (i[None, None] + off - window))
    return attend(xp, q, k, v, scale=sc, softcap=softcap, biases=biases, blocked=blocked,
                  blocked_value=-1e30, op=op)


def _merge(x):
    b, n, s, h = x.shape
    return x.transpose(0, 2, 1, 3).reshape(b, s, n * h)


def attention_from_qkv(op, proj, qkv_sizes, mask_index, past, attention_bias,
                       past_sequence_length, *, num_heads, unidirectional, qkv_hidden_sizes,
                       mask_filter_value, scale, n_outputs, out_dtype=None):
    """The part of (Q)Attention after the input projection: proj [B, S, Dq + Dk + Dv]."""
    xp = xp_of(proj)
    b, s, total = proj.shape
    if qkv_hidden_sizes:
        dq, dk, dv = (int(v) for v in qkv_hidden_sizes)
    else:
        if total % 3:
            raise ShapeError(f"{op}: the projection width {total} is not 3 * hidden")
        dq = dk = dv = total // 3
    if dq + dk + dv != total:
        raise ShapeError(f"{op}: qkv_hidden_sizes {list(qkv_hidden_sizes)} do not add up to the "
                         f"projection width {total}")
    x = _up(proj)
    q = _heads(x[..., :dq], num_heads, "Q", op)
    k = _heads(x[..., dq:dq + dk], num_heads, "K", op)
    v = _heads(x[..., dq + dk:], num_heads, "V", op)
    past_len = 0
    if past is not None:
        if past.ndim != 5 or past.shape[0] != 2 or past.shape[1] != b or \
                past.shape[2] != num_heads or past.shape[4] != k.shape[-1]:
            raise ShapeError(f"{op}: past must be [2, {b}, {num_heads}, past_seq, "
                             f"{k.shape[-1]}], got {tuple(past.shape)}")
        past_len = past.shape[3]
        k = xp.concatenate([_up(past[0]), k], axis=2)
        v = xp.concatenate([_up(past[1]), v], axis=2)
    t = k.shape[2]
    km = _key_mask(op, xp, mask_index, b, s, t, past_len)
    ctx = _attend(op, xp, q, k, v, scale=scale, key_mask=km,
                  causal_offset=past_len if unidirectional else None,
                  mask_filter_value=mask_filter_value, attention_bias=attention_bias)
    dt = out_dtype or proj.dtype
    out = _merge(ctx).astype(dt)
    if n_outputs <= 1:
        return out
    present = xp.stack([k, v]).astype(dt)
    return out, present


@kernel("Attention", since=1, domain=MS, wants_ctx=True)
def ms_attention(input, weights, bias=None, mask_index=None, past=None, attention_bias=None,
                 past_sequence_length=None, *, num_heads, unidirectional=0,
                 qkv_hidden_sizes=None, mask_filter_value=-10000.0, scale=0.0, do_rotary=0,
                 past_present_share_buffer=0, rotary_embedding_dim=0, ctx):
    op = "Attention"
    if do_rotary:
        raise InputError(f"{op}: do_rotary=1 is not supported by this kernel")
    if past_present_share_buffer:
        raise InputError(f"{op}: past_present_share_buffer=1 is not supported by this kernel")
    if input.ndim != 3 or weights.ndim != 2 or weights.shape[0] != input.shape[2]:
        raise ShapeError(f"{op}: input {tuple(input.shape)} must be [batch, seq, hidden] and "
                         f"weights {tuple(weights.shape)} [hidden, Dq + Dk + Dv]")
    xp = xp_of(input)
    proj = xp.matmul(_up(input), _up(weights))
    if bias is not None:
        proj = proj + _up(bias)
    return attention_from_qkv(op, proj, None, mask_index, past, attention_bias,
                              past_sequence_length, num_heads=num_heads,
                              unidirectional=unidirectional, qkv_hidden_sizes=qkv_hidden_sizes,
                              mask_filter_value=mask_filter_value, scale=scale,
                              n_outputs=ctx.n_outputs, out_dtype=input.dtype)


@kernel("MultiHeadAttention", since=1, domain=MS, wants_ctx=True, category="layer")
def multi_head_attention(query, key=None, value=None, bias=None, key_padding_mask=None,
                         attention_bias=None, past_key=None, past_value=None,
                         past_sequence_length=None, cache_indirection=None, *, num_heads,
                         unidirectional=0, mask_filter_value=-10000.0, scale=0.0,
                         output_qk=0, ctx):
    """query [B, S, D] (or packed QKV [B, S, N, 3, H] without key/value); key/value
    [B, L, D] (or key as packed KV [B, L, N, 2, H], or both [B, N, L, H]: used as they are)."""
    op = "MultiHeadAttention"
    xp = xp_of(query)
    n = int(num_heads)
    if cache_indirection is not None:
        raise InputError(f"{op}: cache_indirection (beam search) is not supported")
    if query.ndim == 5:
        if key is not None or query.shape[3] != 3:
            raise ShapeError(f"{op}: packed QKV query must be [B, S, N, 3, H] with no key, got "
                             f"{tuple(query.shape)}")
        qf = _up(query)
        q, k, v = (qf[:, :, :, i].transpose(0, 2, 1, 3) for i in range(3))
        if bias is not None:
            bb = _up(bias).reshape(3, n, -1)
            q, k, v = (t + bb[i][None, :, None, :] for i, t in enumerate((q, k, v)))
        kv_bnsh = False
    else:
        if query.ndim != 3:
            raise ShapeError(f"{op}: query must be [B, S, D], got {tuple(query.shape)}")
        b_, s_, d = query.shape
        qf = _up(query)
        bq = bk = bv = None
        if bias is not None:
            bf = _up(bias)
            dv = bf.shape[0] - 2 * d
            bq, bk, bv = bf[:d], bf[d:2 * d], bf[2 * d:2 * d + dv]
        if bq is not None:
            qf = qf + bq
        q = _heads(qf, n, "query", op)
        if key is None:
            raise InputError(f"{op}: key is required unless query is packed QKV")
        kv_bnsh = key.ndim == 4
        if key.ndim == 5:
            if value is not None or key.shape[3] != 2:
                raise ShapeError(f"{op}: packed KV key must be [B, L, N, 2, H] with no value, "
                                 f"got {tuple(key.shape)}")
            kf = _up(key)
            k = kf[:, :, :, 0].transpose(0, 2, 1, 3)
            v = kf[:, :, :, 1].transpose(0, 2, 1, 3)
        elif kv_bnsh:
            k, v = _up(key), _up(value)
        else:
            kf, vf = _up(key), _up(value)
            if bk is not None:
                kf = kf + bk
                vf = vf + bv
            k = _heads(kf, n, "key", op)
            v = _heads(vf, n, "value", op)
    b, _, s, _ = q.shape
    past_len = 0
    if past_key is not None and past_value is not None and not kv_bnsh:
        past_len = past_key.shape[2]
        k = xp.concatenate([_up(past_key), k], axis=2)
        v = xp.concatenate([_up(past_value), v], axis=2)
    t = k.shape[2]
    km = None
    if key_padding_mask is not None:
        m = key_padding_mask
        if m.ndim == 1 and m.shape[0] == 3 * b + 2:
            raise InputError(f"{op}: the [3*B+2] key_padding_mask form is not supported")
        km = _key_mask(op, xp, m, b, s, t, past_len)
    ctxv = _attend(op, xp, q, k, v, scale=scale, key_mask=km,
                   causal_offset=past_len if unidirectional else None,
                   mask_filter_value=mask_filter_value, attention_bias=attention_bias)
    dt = query.dtype
    outs = [_merge(ctxv).astype(dt), k.astype(dt), v.astype(dt)]
    nout = max(ctx.n_outputs, 1)
    return outs[0] if nout == 1 else tuple(outs[:nout])


# ---------------------------------------------------------------------------------- rotary
def _rotate(x, cos, sin, interleaved, rot):
    """x [..., S, H] with cos/sin [..., S, rot/2] broadcastable; rotates the first ``rot``."""
    xp = xp_of(x)
    xr, rest = x[..., :rot], x[..., rot:]
    if interleaved:
        x1, x2 = xr[..., 0::2], xr[..., 1::2]
        o1 = x1 * cos - x2 * sin
        o2 = x2 * cos + x1 * sin
        out = xp.stack([o1, o2], axis=-1).reshape(xr.shape)
    else:
        half = rot // 2
        x1, x2 = xr[..., :half], xr[..., half:]
        out = xp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)
    return xp.concatenate([out, rest], axis=-1) if rest.shape[-1] else out


@kernel("RotaryEmbedding", since=1, domain=MS)
def ms_rotary_embedding(input, position_ids, cos_cache, sin_cache, *, interleaved=0,
                        is_packed_batching=0, num_heads=0, rotary_embedding_dim=0, scale=1.0):
    """input [B, S, N*H] or [B, N, S, H]; position_ids [B, S], or [1] (an offset: positions
    offset + 0..S-1); caches [max_pos, rot/2]."""
    op = "RotaryEmbedding"
    xp = xp_of(input)
    if is_packed_batching:
        raise InputError(f"{op}: is_packed_batching=1 is not supported")
    x = _up(input)
    if x.ndim == 4:
        b, nh, s, h = x.shape
        xb = x
    elif x.ndim == 3:
        b, s, d = x.shape
        half = cos_cache.shape[1]
        if num_heads:
            nh = int(num_heads)
        elif rotary_embedding_dim:
            raise InputError(f"{op}: num_heads is needed with rotary_embedding_dim for a 3-D "
                             f"input")
        else:
            nh = d // (2 * half)
        if nh <= 0 or d % nh:
            raise ShapeError(f"{op}: hidden size {d} does not split into {nh} heads")
        h = d // nh
        xb = x.reshape(b, s, nh, h).transpose(0, 2, 1, 3)
    else:
        raise ShapeError(f"{op}: input must be 3-D or 4-D, got {tuple(input.shape)}")
    rot = int(rotary_embedding_dim) or 2 * cos_cache.shape[1]
    if rot > h or rot % 2 or cos_cache.shape[1] * 2 < rot:
        raise ShapeError(f"{op}: rotary dim {rot} does not fit head size {h} and cache "
                         f"{tuple(cos_cache.shape)}")
    pid = position_ids.astype(np.int64)
    if pid.size == 1 and not (b == 1 and s == 1 and pid.ndim == 2):
        pos = int(pid.reshape(())) + xp.arange(s)[None, :]
        pos = xp.broadcast_to(pos, (b, s))
    else:
        pos = xp.broadcast_to(pid.reshape(-1, s), (b, s))
    if int(pos.max()) >= cos_cache.shape[0]:
        raise ShapeError(f"{op}: position {int(pos.max())} is beyond the cache "
                         f"({cos_cache.shape[0]} positions)")
    cos = _up(cos_cache)[pos][:, None, :, :rot // 2]
    sin = _up(sin_cache)[pos][:, None, :, :rot // 2]
    y = _rotate(xb, cos, sin, interleaved, rot)
    if x.ndim == 3:
        y = y.transpose(0, 2, 1, 3).reshape(b, s, nh * h)
    return y.astype(input.dtype)


@kernel("GroupQueryAttention", since=1, domain=MS, wants_ctx=True)
def group_query_attention(query, key=None, value=None, past_key=None, past_value=None,
                          seqlens_k=None, total_sequence_length=None, cos_cache=None,
                          sin_cache=None, position_ids=None, attention_bias=None, head_sink=None,
                          *, num_heads, kv_num_heads, scale=0.0, do_rotary=0,
                          rotary_interleaved=0, local_window_size=-1, softcap=0.0,
                          smooth_softmax=0, qk_output=0, ctx):
    """Grouped-query causal attention with a past/present KV buffer [B, Nkv, T, H].
    seqlens_k[b] is the total length of batch b minus 1; the past length of batch b is
    seqlens_k[b] + 1 - S (0 for a first prompt, whose rows may be right-padded)."""
    op = "GroupQueryAttention"
    xp = xp_of(query)
    n, nkv = int(num_heads), int(kv_num_heads)
    if n % nkv:
        raise ShapeError(f"{op}: num_heads {n} is not a multiple of kv_num_heads {nkv}")
    if smooth_softmax or head_sink is not None:
        raise InputError(f"{op}: smooth_softmax / head_sink are not supported")
    if seqlens_k is None or total_sequence_length is None:
        raise InputError(f"{op}: seqlens_k and total_sequence_length are required")
    qf = _up(query)
    b, s, d = qf.shape
    if key is None:
        h = d // (n + 2 * nkv)
        q_ = qf[..., :n * h]
        k_ = qf[..., n * h:(n + nkv) * h]
        v_ = qf[..., (n + nkv) * h:]
    else:
        h = d // n
        q_, k_, v_ = qf, _up(key), _up(value)
    q = _heads(q_, n, "query", op)
    k = _heads(k_, nkv, "key", op)
    v = _heads(v_, nkv, "value", op)
    total = ints(total_sequence_length)[0]
    lens = np.array(ints(seqlens_k), dtype=np.int64).reshape(b) + 1  # valid keys per batch
    past_cap = 0 if past_key is None else past_key.shape[2]
    first_prompt = past_key is None or past_cap == 0 or (s == total and s > 1)
    if first_prompt:
        past_lens = np.zeros(b, dtype=np.int64)
    else:
        past_lens = lens - s
    if do_rotary:
        if cos_cache is None or sin_cache is None:
            raise InputError(f"{op}: do_rotary needs cos_cache and sin_cache")
        if position_ids is not None:
            pos = xp.broadcast_to(position_ids.astype(np.int64).reshape(-1, s), (b, s))
        else:
            pos = xp.asarray(past_lens)[:, None] + xp.arange(s)[None, :]
        rot = 2 * cos_cache.shape[1]
        cos = _up(cos_cache)[pos][:, None]
        sin = _up(sin_cache)[pos][:, None]
        q = _rotate(q, cos, sin, rotary_interleaved, rot)
        k = _rotate(k, cos, sin, rotary_interleaved, rot)
    cap = max(past_cap, total)
    pk = xp.zeros((b, nkv, cap, h), dtype=qf.dtype)
    pv = xp.zeros((b, nkv, cap, h), dtype=qf.dtype)
    for bi in range(b):
        pl = int(past_lens[bi])
        if pl:
            pk[bi, :, :pl] = _up(past_key[bi, :, :pl])
            pv[bi, :, :pl] = _up(past_value[bi, :, :pl])
        if pl + s > cap:
            raise ShapeError(f"{op}: batch {bi}: past {pl} + new {s} tokens exceed the "
                             f"present buffer ({cap})")
        pk[bi, :, pl:pl + s] = k[bi]
        pv[bi, :, pl:pl + s] = v[bi]
    j = xp.arange(cap)
    key_dead = (j[None, :] >= xp.asarray(lens)[:, None])[:, None, :]
    out = _attend(op, xp, q, pk, pv, scale=scale, key_mask=key_dead,
                  causal_offset=xp.asarray(past_lens), mask_filter_value=-1e30,
                  attention_bias=attention_bias, softcap=softcap, window=local_window_size)
    dt = query.dtype
    outs = [_merge(out).astype(dt), pk.astype(dt), pv.astype(dt)]
    nout = max(ctx.n_outputs, 1)
    return outs[0] if nout == 1 else tuple(outs[:nout])
