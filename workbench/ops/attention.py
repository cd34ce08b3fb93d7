"""Attention family: Attention, RotaryEmbedding, LinearAttention, FlexAttention (preview).

(The KV-cache helper TensorScatter lives in ``indexing``, CausalConvWithState in ``conv``.)

Low-precision inputs (float16, bfloat16) are computed in float32 and cast back at the end;
double stays double.

Attention opset differences are all additive, so one kernel serves every version:
Attention-23 (past/present cache, masks, causal, softcap, qk_matmul_output modes), -24 adds the
``nonpad_kv_seqlen`` input (external cache, bottom-right causal alignment per batch), -25 adds
``left_window_size``/``right_window_size`` (sliding window).
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

import numpy as np

from workbench.arrays import np_dtype_of_onnx, xp_of
from workbench.errors import InputError, ShapeError
from workbench.ops import rowwise
from workbench.ops._common import softmax, work_dtype
from workbench.ops.registry import kernel

_SOFTMAX_PRECISIONS = {1: "float", 10: "float16", 11: "double", 16: "bfloat16"}


def _softmax_dtype(softmax_precision, default):
    if softmax_precision is None:
        return default
    if softmax_precision not in _SOFTMAX_PRECISIONS:
        raise InputError(f"softmax_precision {softmax_precision} is not supported (supported: "
                         + ", ".join(f"{k} ({v})" for k, v in _SOFTMAX_PRECISIONS.items()) + ")")
    return np_dtype_of_onnx(softmax_precision)


def _masked_softmax(xp, scores, dtype, dead=None):
    """Softmax over the last axis computed in ``dtype``; rows whose maximum is -inf (every key
    masked), and rows flagged in ``dead``, give all-zero probabilities instead of NaN."""
    return softmax(xp, scores, -1, dtype=dtype, zero_empty_rows=True, dead=dead)


# --------------------------------------------------------------------------------------------
# the attention core


class Scores(NamedTuple):
    """The intermediate score tensors of :func:`attend` (``keep_scores=True``): the product
    ``raw``, after the soft cap ``capped``, after the biases and the blocked positions
    ``biased``, and the probabilities ``probs`` (all [B, Hq, S, T])."""
    raw: Any
    capped: Any
    biased: Any
    probs: Any


def attend(xp, q, k, v, *, scale: float, split_scale: bool = False, softcap: float = 0.0,
           biases=(), blocked=None, blocked_value: float = -1e30, softmax_dtype=None,
           zero_empty_rows: bool = False, dead=None, keep_scores: bool = False, op="Attention"):
    """Scaled dot-product attention, the one core of the engine's attention kernels: ai.onnx
    Attention, com.microsoft Attention / MultiHeadAttention / GroupQueryAttention / QAttention.

    ``q`` [B, Hq, S, D], ``k`` [B, Hkv, T, D], ``v`` [B, Hkv, T, Dv], all in the precision to
    compute in, with Hq a multiple of Hkv: each group of Hq / Hkv query heads attends to one
    K/V head (grouped-query attention; nothing is copied per query head). Returns [B, Hq, S,
    Dv] in that precision, and the :class:`Scores` too with ``keep_scores``.

    The scores are ``q @ k^T`` scaled by ``scale`` (``split_scale``: ``q`` and ``k`` are each
    multiplied by ``sqrt(scale)`` first, as ONNX's Attention specifies), soft-capped
    (``softcap * tanh(s / softcap)`` when ``softcap > 0``), plus each ``(name, bias)`` of
    ``biases`` in turn (additive masks broadcastable to [B, Hq, S, T]; ``name`` is used in the
    error when one does not broadcast), with ``blocked_value`` where ``blocked`` is true
    (structural masks: causal, windows, padding). Then the engine's one softmax
    (:func:`workbench.ops._common.softmax`) in ``softmax_dtype`` (default: the scores'),
    ``zero_empty_rows`` / ``dead`` as there, and the product with ``v``.
    """
    b, hq, sq, d = q.shape
    hkv, total = k.shape[1], k.shape[2]
    group = hq // hkv
    if split_scale:
        root = q.dtype.type(math.sqrt(scale))
        q, k = q * root, k * root
    qg = q.reshape(b, hkv, group, sq, d)
    raw = xp.matmul(qg, xp.swapaxes(k[:, :, None], -1, -2)).reshape(b, hq, sq, total)
    if not (keep_scores or (softcap and softcap > 0)) and (
            softmax_dtype is None or np.dtype(softmax_dtype) == raw.dtype):
        # (split_scale: q and k were scaled above, as the numpy path does)
        probs = _compiled_probs(raw, None if split_scale else scale, biases, blocked,
                                blocked_value, zero_empty_rows, dead)
        if probs is not None:
            y = xp.matmul(probs.reshape(b, hkv, group, sq, total), v[:, :, None])
            return y.reshape(b, hq, sq, v.shape[3])
    if not split_scale:
        raw = raw * raw.dtype.type(scale)
    s = raw
    if softcap and softcap > 0:
        cap = s.dtype.type(softcap)
        s = cap * xp.tanh(s / cap)
    capped = s
    for name, bias in biases:
        try:
            s = s + bias
        except ValueError:
            raise ShapeError(f"{op}: {name} of shape {tuple(bias.shape)} does not broadcast to "
                             f"the scores (batch, q_heads, q_len, total_len) = "
                             f"{(b, hq, sq, total)}") from None
    if blocked is not None:
        s = xp.where(blocked, s.dtype.type(blocked_value), s)
    probs = softmax(xp, s, -1, dtype=s.dtype if softmax_dtype is None else softmax_dtype,
                    zero_empty_rows=zero_empty_rows, dead=dead)
    if probs.dtype != s.dtype:
        probs = probs.astype(s.dtype)
    y = xp.matmul(probs.reshape(b, hkv, group, sq, total), v[:, :, None])
    y = y.reshape(b, hq, sq, v.shape[3])
    return (y, Scores(raw, capped, s, probs)) if keep_scores else y


def _compiled_probs(raw, scale, biases, blocked, blocked_value, zero_empty_rows=False,
                    dead=None):
    """:func:`attend`'s scale, biases, blocked positions and softmax in place on the fresh
    float32 scores ``raw`` by the compiled kernel (``transformer.softmax``): the biases are
    summed into one additive mask first (numpy broadcasting; they are small); rows flagged in
    ``dead`` are zeroed after. None when it does not apply (the scores are then untouched)."""
    if not rowwise.is_f32(raw) or not raw.size or not raw.flags.c_contiguous:
        return None
    if dead is not None and (type(dead) is not np.ndarray or dead.dtype != np.bool_
                             or dead.ndim > raw.ndim or any(
                                 d not in (1, r) for d, r in zip(dead.shape[::-1],
                                                                 raw.shape[::-1]))):
        return None
    add = None
    for _name, bias in biases:
        if not rowwise.is_f32(bias) or bias.ndim > raw.ndim:
            return None
        try:
            add = bias if add is None else add + bias
        except ValueError:   # numpy's path names the bias that does not broadcast
            return None
    if blocked is not None and (type(blocked) is not np.ndarray or blocked.dtype != np.bool_
                                or blocked.ndim > raw.ndim):
        return None
    probs = rowwise.softmax(raw, out=raw, scale=scale, add=add, fill_where=blocked,
                            fill=blocked_value, zero_empty_rows=zero_empty_rows)
    if probs is not None and dead is not None:
        np.copyto(probs, np.float32(0), where=dead)
    return probs


# --------------------------------------------------------------------------------------------
# Attention


def _split_heads(x, heads, name):
    """(B, S, H*D) -> (B, H, S, D)."""
    b, s, hidden = x.shape
    if heads is None or heads <= 0 or hidden % heads:
        raise ShapeError(f"Attention: 3-D input {name} of shape {x.shape} needs "
                         f"{'q' if name == 'Q' else 'kv'}_num_heads dividing its last dimension "
                         f"{hidden}, got {heads}")
    return x.reshape(b, s, heads, hidden // heads).transpose(0, 2, 1, 3)


def _mask_bias(xp, attn_mask, total_len, wdt):
    """Additive bias from a boolean or numeric mask, padded with -inf up to total_len keys."""
    if attn_mask.dtype == np.bool_:
        bias = xp.where(attn_mask, xp.zeros((), wdt), xp.asarray(-np.inf, dtype=wdt))
    else:
        bias = attn_mask.astype(wdt)
    if bias.ndim == 0:
        bias = bias.reshape(1, 1)
    short = total_len - bias.shape[-1]
    if short > 0:
        pad = xp.full(bias.shape[:-1] + (short,), -np.inf, dtype=wdt)
        bias = xp.concatenate([bias, pad], axis=-1)
    elif short < 0:
        raise ShapeError(f"Attention: attn_mask of shape {attn_mask.shape} has more keys "
                         f"({attn_mask.shape[-1]}) than the total sequence length {total_len}")
    return bias


@kernel("Attention", since=23, wants_ctx=True, category="layer")
def attention(Q, K, V, attn_mask=None, past_key=None, past_value=None, nonpad_kv_seqlen=None,
              *, is_causal, qk_matmul_output_mode, softcap, kv_num_heads=None, q_num_heads=None,
              scale=None, softmax_precision=None, left_window_size=-1, right_window_size=-1,
              ctx):
    """Scaled dot-product attention (MHA/GQA/MQA) with cache, masks, causal and windows."""
    xp = xp_of(Q, K, V)
    out_dtype = Q.dtype
    wdt = work_dtype(out_dtype)
    if Q.ndim not in (3, 4) or K.ndim != Q.ndim or V.ndim != Q.ndim:
        raise ShapeError(f"Attention: Q, K and V must all be 3-D or all 4-D, got shapes "
                         f"{Q.shape}, {K.shape}, {V.shape}")
    is3d = Q.ndim == 3
    if is3d:
        q = _split_heads(Q, q_num_heads, "Q")
        k = _split_heads(K, kv_num_heads, "K")
        v = _split_heads(V, kv_num_heads, "V")
    else:
        q, k, v = Q, K, V
    b, hq, sq, d = q.shape
    hkv = k.shape[1]
    if k.shape[0] != b or v.shape[0] != b or v.shape[1] != hkv or k.shape[3] != d \
            or v.shape[2] != k.shape[2]:
        raise ShapeError(f"Attention: inconsistent shapes Q {Q.shape}, K {K.shape}, V {V.shape} "
                         f"(per head: Q {q.shape}, K {k.shape}, V {v.shape})")
    if hkv == 0 or hq % hkv:
        raise ShapeError(f"Attention: q_num_heads ({hq}) must be a multiple of kv_num_heads "
                         f"({hkv})")
    if (past_key is None) != (past_value is None):
        raise InputError("Attention: past_key and past_value must be given together")
    past_len = 0
    if past_key is not None:
        past_len = past_key.shape[2]
        if past_key.shape[:2] != (b, hkv) or past_key.shape[3] != d:
            raise ShapeError(f"Attention: past_key of shape {past_key.shape} does not match "
                             f"(batch {b}, kv heads {hkv}, *, head size {d})")
        k = xp.concatenate([past_key.astype(k.dtype), k], axis=2)
        v = xp.concatenate([past_value.astype(v.dtype), v], axis=2)
    present_k, present_v = k, v
    total = k.shape[2]
    dv = v.shape[3]
    scale_f = float(scale) if scale is not None else 1.0 / math.sqrt(d)

    # structural mask: causal frontier, external-cache padding, sliding window
    allowed = None
    if nonpad_kv_seqlen is not None:
        nonpad = xp.asarray(nonpad_kv_seqlen).reshape(-1).astype(np.int64)
        if nonpad.shape[0] != b:
            raise ShapeError(f"Attention: nonpad_kv_seqlen has {nonpad.shape[0]} values, "
                             f"expected one per batch ({b})")
    else:
        nonpad = None
    j = xp.arange(total, dtype=np.int64)
    i = xp.arange(sq, dtype=np.int64)
    if past_key is not None or nonpad is None:
        offset = xp.full((b,), past_len, dtype=np.int64)
    else:
        offset = nonpad - sq
    pos = offset[:, None, None, None] + i[None, None, :, None]  # (B,1,S,1) absolute position
    jj = j[None, None, None, :]
    if nonpad is not None:
        allowed = jj < nonpad[:, None, None, None]
    if is_causal:
        c = jj <= pos
        allowed = c if allowed is None else allowed & c
    if left_window_size is not None and left_window_size >= 0:
        c = jj >= pos - left_window_size
        allowed = c if allowed is None else allowed & c
    if right_window_size is not None and right_window_size >= 0:
        c = jj <= pos + right_window_size
        allowed = c if allowed is None else allowed & c

    bias = None
    if attn_mask is not None:
        bias = _mask_bias(xp, attn_mask, total, wdt)
    if allowed is not None:
        sb = xp.where(allowed, xp.zeros((), wdt), xp.asarray(-np.inf, dtype=wdt))
        bias = sb if bias is None else bias + sb
    dead = None
    if bias is not None:
        # a query row whose additive bias is -inf for every key attends nothing: zero row
        dead = (xp.max(bias, axis=-1, keepdims=True) == -np.inf) if total else None
    n_out = ctx.n_outputs if ctx is not None else 1
    # softmax in float32/double unless softmax_precision asks for another type; the scores
    # are kept only when the fourth output asks for them (else float32 may run compiled)
    r = attend(xp, q.astype(wdt), k.astype(wdt), v.astype(wdt), scale=scale_f,
               split_scale=True, softcap=softcap,
               biases=() if bias is None else (("attn_mask", bias),),
               softmax_dtype=_softmax_dtype(softmax_precision, wdt), zero_empty_rows=True,
               dead=dead, keep_scores=n_out > 3)
    y, sc = r if n_out > 3 else (r, None)
    if is3d:
        y = y.transpose(0, 2, 1, 3).reshape(b, sq, hq * dv)
    outputs = [y.astype(out_dtype), present_k.astype(K.dtype), present_v.astype(V.dtype)]
    if n_out > 3:
        chosen = {0: sc.raw, 1: sc.capped, 2: sc.biased, 3: sc.probs}.get(qk_matmul_output_mode)
        if chosen is None:
            raise InputError(f"Attention: qk_matmul_output_mode {qk_matmul_output_mode} is not "
                             f"supported (supported: 0, 1, 2, 3)")
        outputs.append(chosen.astype(out_dtype))
    if n_out <= 1:
        return outputs[0]
    return tuple(outputs[:n_out])


# --------------------------------------------------------------------------------------------
# RotaryEmbedding


@kernel("RotaryEmbedding", since=23)
def rotary_embedding(X, cos_cache, sin_cache, position_ids=None, *, interleaved,
                     rotary_embedding_dim, num_heads=None):
    """Rotary positional embedding (half split or interleaved pairs, partial rotation)."""
    xp = xp_of(X)
    out_dtype = X.dtype
    wdt = work_dtype(out_dtype)
    if X.ndim == 4:
        x = X.transpose(0, 2, 1, 3)  # (B, S, H, D)
    elif X.ndim == 3:
        bsz, seq, hidden = X.shape
        if not num_heads or hidden % num_heads:
            raise ShapeError(f"RotaryEmbedding: a 3-D input of shape {X.shape} needs the "
                             f"num_heads attribute dividing {hidden}, got {num_heads}")
        x = X.reshape(bsz, seq, num_heads, hidden // num_heads)
    else:
        raise ShapeError(f"RotaryEmbedding: input must be 3-D (B, S, hidden) or 4-D "
                         f"(B, H, S, D), got shape {X.shape}")
    head = x.shape[3]
    rd = rotary_embedding_dim if rotary_embedding_dim else head
    if rd > head or rd % 2:
        raise ShapeError(f"RotaryEmbedding: rotary_embedding_dim {rd} must be even and at most "
                         f"the head size {head}")
    cos = cos_cache
    sin = sin_cache
    if position_ids is not None:
        pid = position_ids.astype(np.int64)
        cos = xp.take(cos, pid, axis=0)
        sin = xp.take(sin, pid, axis=0)
    half = rd // 2
    if cos.shape[-1] != half or sin.shape[-1] != half:
        raise ShapeError(f"RotaryEmbedding: the last dimension of cos_cache/sin_cache "
                         f"({cos.shape[-1]}/{sin.shape[-1]}) must be rotary_embedding_dim/2 = "
                         f"{half}")
    cos = cos.astype(wdt)[:, :, None, :]
    sin = sin.astype(wdt)[:, :, None, :]
    xr = x[..., :rd].astype(wdt)
    if interleaved:
        x1, x2 = xr[..., 0::2], xr[..., 1::2]
    else:
        x1, x2 = xr[..., :half], xr[..., half:]
    real = cos * x1 - sin * x2
    imag = sin * x1 + cos * x2
    if interleaved:
        rot = xp.stack([real, imag], axis=-1).reshape(xr.shape)
    else:
        rot = xp.concatenate([real, imag], axis=-1)
    out = xp.concatenate([rot.astype(out_dtype), x[..., rd:]], axis=-1)
    if X.ndim == 4:
        return out.transpose(0, 2, 1, 3)
    return out.reshape(X.shape)


# --------------------------------------------------------------------------------------------
# LinearAttention

_UPDATE_RULES = ("linear", "gated", "delta", "gated_delta")


@kernel("LinearAttention", since=27)
def linear_attention(query, key, value, past_state=None, decay=None, beta=None, *, chunk_size,
                     kv_num_heads, q_num_heads, scale, update_rule):
    """Recurrent linear attention (linear / gated / delta / gated_delta rules), GQA aware.

    Runs the recurrence token by token, vectorised over batch and heads.
    """
    xp = xp_of(query, key, value)
    if update_rule not in _UPDATE_RULES:
        raise InputError(f"LinearAttention: update_rule {update_rule!r} is not supported "
                         f"(supported: {', '.join(_UPDATE_RULES)})")
    if query.ndim != 3 or key.ndim != 3 or value.ndim != 3:
        raise ShapeError(f"LinearAttention: query, key and value must be 3-D (B, T, H*D), got "
                         f"{query.shape}, {key.shape}, {value.shape}")
    hq, hk = int(q_num_heads), int(kv_num_heads)
    if hk <= 0 or hq <= 0 or hq % hk:
        raise ShapeError(f"LinearAttention: q_num_heads ({hq}) must be a positive multiple of "
                         f"kv_num_heads ({hk})")
    b, t, qh = query.shape
    if qh % hq or key.shape[2] % hk or value.shape[2] % hk:
        raise ShapeError(f"LinearAttention: the last dimensions of query {query.shape}, key "
                         f"{key.shape}, value {value.shape} must divide by the head counts "
                         f"({hq}, {hk})")
    dk = qh // hq
    dv = value.shape[2] // hk
    if key.shape[2] // hk != dk:
        raise ShapeError(f"LinearAttention: query head size {dk} differs from key head size "
                         f"{key.shape[2] // hk}")
    gated = update_rule in ("gated", "gated_delta")
    delta = update_rule in ("delta", "gated_delta")
    if gated and decay is None:
        raise InputError(f"LinearAttention: update_rule {update_rule!r} needs the decay input")
    if delta and beta is None:
        raise InputError(f"LinearAttention: update_rule {update_rule!r} needs the beta input")
    out_dtype = query.dtype
    state_dtype = past_state.dtype if past_state is not None else query.dtype
    wdt = work_dtype(out_dtype)
    group = hq // hk
    q = query.astype(wdt).reshape(b, t, hk, group, dk)
    k = key.astype(wdt).reshape(b, t, hk, dk)
    v = value.astype(wdt).reshape(b, t, hk, dv)
    if gated:
        g = decay.astype(wdt)
        if g.shape[2] == hk * dk:
            g = xp.exp(g.reshape(b, t, hk, dk, 1))
        elif g.shape[2] == hk:
            g = xp.exp(g.reshape(b, t, hk, 1, 1))
        else:
            raise ShapeError(f"LinearAttention: decay of shape {decay.shape} must be (B, T, "
                             f"{hk * dk}) or (B, T, {hk})")
    if delta:
        bt = beta.astype(wdt)
        if bt.shape[2] not in (hk, 1):
            raise ShapeError(f"LinearAttention: beta of shape {beta.shape} must be (B, T, {hk}) "
                             f"or (B, T, 1)")
        bt = xp.broadcast_to(bt, (b, t, hk))[..., None]  # (B, T, Hk, 1)
    if past_state is not None:
        if past_state.shape != (b, hk, dk, dv):
            raise ShapeError(f"LinearAttention: past_state of shape {past_state.shape} must be "
                             f"{(b, hk, dk, dv)}")
        s = past_state.astype(wdt)
    else:
        s = xp.zeros((b, hk, dk, dv), dtype=wdt)
    sc = wdt.type(scale if scale else 1.0 / math.sqrt(dk))
    out = xp.empty((b, t, hk, group, dv), dtype=wdt)
    for step in range(t):
        kt = k[:, step]  # (B, Hk, dk)
        vt = v[:, step]  # (B, Hk, dv)
        if gated:
            s = g[:, step] * s
        if delta:
            pred = xp.matmul(kt[:, :, None, :], s)[:, :, 0, :]  # S^T k: (B, Hk, dv)
            vt = bt[:, step] * (vt - pred)
        s = s + kt[:, :, :, None] * vt[:, :, None, :]
        out[:, step] = xp.matmul(q[:, step], s) * sc  # (B, Hk, group, dv)
    y = out.reshape(b, t, hq * dv).astype(out_dtype)
    return y, s.astype(state_dtype)


# --------------------------------------------------------------------------------------------
# FlexAttention (ai.onnx.preview)


@kernel("FlexAttention", since=1, domain="ai.onnx.preview")
def flex_attention(Q, K, V, *, prob_mod=None, score_mod=None, scale=None,
                   softmax_precision=None):
    """Attention with optional score_mod / prob_mod subgraphs (PyTorch flex_attention)."""
    xp = xp_of(Q, K, V)
    if Q.ndim != 4 or K.ndim != 4 or V.ndim != 4:
        raise ShapeError(f"FlexAttention: Q, K and V must be 4-D (B, H, L, D), got "
                         f"{Q.shape}, {K.shape}, {V.shape}")
    b, hq, lq, d = Q.shape
    hkv = K.shape[1]
    if hkv == 0 or hq % hkv or V.shape[1] != hkv or K.shape[3] != d or V.shape[2] != K.shape[2]:
        raise ShapeError(f"FlexAttention: inconsistent shapes Q {Q.shape}, K {K.shape}, "
                         f"V {V.shape} (q heads must be a multiple of kv heads)")
    sdt = _softmax_dtype(softmax_precision, work_dtype(Q.dtype))
    group = hq // hkv
    skv = K.shape[2]
    scale_f = float(scale) if scale is not None else 1.0 / math.sqrt(d)
    qg = Q.astype(sdt).reshape(b, hkv, group, lq, d)
    scores = xp.matmul(qg, xp.swapaxes(K.astype(sdt), -1, -2)[:, :, None])
    scores = scores.reshape(b, hq, lq, skv) * sdt.type(scale_f)
    if score_mod is not None:
        scores = xp.asarray(score_mod(scores)[0]).astype(sdt)
    probs = _masked_softmax(xp, scores, sdt)
    if prob_mod is not None:
        probs = xp.asarray(prob_mod(probs)[0]).astype(sdt)
    y = xp.matmul(probs.reshape(b, hkv, group, lq, skv), V.astype(sdt)[:, :, None])
    return y.reshape(b, hq, lq, V.shape[3]).astype(Q.dtype)
