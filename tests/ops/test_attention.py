"""Attention family kernels against naive per-head / per-token loops written here."""

from __future__ import annotations

import math

import numpy as np
import pytest

from workbench.errors import InputError, ShapeError
from workbench.ops.registry import NodeContext, attribute_defaults, lookup

RNG = np.random.default_rng(0)


def run(op, *inputs, opset=24, n_outputs=1, domain="", **attrs):
    """Run the registered kernel of ``op`` as the executor would (spec defaults filled in)."""
    entry = lookup(op, domain, opset)
    kw = dict(attribute_defaults(op, domain, opset))
    kw.update(attrs)
    if entry.wants_ctx:
        kw["ctx"] = NodeContext(node_name="n", op_type=op, opset=opset, n_outputs=n_outputs)
    return entry.fn(*inputs, **kw)


def rand(*shape, dtype=np.float32):
    return RNG.standard_normal(shape).astype(dtype)


# --------------------------------------------------------------------------------------------
# Attention
# --------------------------------------------------------------------------------------------

def naive_attention(q, k, v, mask=None, past_k=None, past_v=None, nonpad=None, causal=False,
                    scale=None, softcap=0.0, left=-1, right=-1):
    """4-D inputs; loops over batch, head, query and key. Returns (Y, qk, capped, biased, P)."""
    if past_k is not None:
        k = np.concatenate([past_k, k], axis=2)
        v = np.concatenate([past_v, v], axis=2)
    b, hq, sq, d = q.shape
    hkv, total = k.shape[1], k.shape[2]
    scale = 1 / math.sqrt(d) if scale is None else scale
    past = 0 if past_k is None else past_k.shape[2]
    if mask is not None:
        if mask.dtype == bool:
            mask = np.where(mask, 0.0, -np.inf)
        short = total - mask.shape[-1]
        if short:
            mask = np.concatenate([mask, np.full(mask.shape[:-1] + (short,), -np.inf)], -1)
        mask = np.broadcast_to(mask, (b, hq, sq, total))
    y = np.zeros((b, hq, sq, v.shape[3]))
    raw = np.zeros((b, hq, sq, total))
    capped, biased, probs = raw.copy(), raw.copy(), raw.copy()
    for bi in range(b):
        offset = past if (past_k is not None or nonpad is None) else nonpad[bi] - sq
        for h in range(hq):
            kh = h // (hq // hkv)
            for i in range(sq):
                pos = offset + i
                row = np.zeros(total)
                allowed_any = False
                for j in range(total):
                    s = float(q[bi, h, i] @ k[bi, kh, j]) * scale
                    raw[bi, h, i, j] = s
                    if softcap > 0:
                        s = softcap * math.tanh(s / softcap)
                    capped[bi, h, i, j] = s
                    ok = True
                    if causal and j > pos:
                        ok = False
                    if nonpad is not None and j >= nonpad[bi]:
                        ok = False
                    if left >= 0 and j < pos - left:
                        ok = False
                    if right >= 0 and j > pos + right:
                        ok = False
                    bias = 0.0 if ok else -np.inf
                    if mask is not None:
                        bias += mask[bi, h, i, j]
                    allowed_any |= bias != -np.inf
                    row[j] = s + bias
                biased[bi, h, i] = row
                if not allowed_any:
                    continue  # fully masked row: zeros
                e = np.exp(row - row.max())
                p = e / e.sum()
                probs[bi, h, i] = p
                y[bi, h, i] = p @ v[bi, kh]
    return y, raw, capped, biased, probs


def to3d(x):
    b, h, s, d = x.shape
    return x.transpose(0, 2, 1, 3).reshape(b, s, h * d)


@pytest.mark.parametrize("hq,hkv", [(3, 3), (6, 2), (4, 1)])
@pytest.mark.parametrize("causal", [0, 1])
def test_attention_4d_heads_and_causal(hq, hkv, causal):
    q, k, v = rand(2, hq, 4, 8), rand(2, hkv, 6, 8), rand(2, hkv, 6, 5)
    y = run("Attention", q, k, v, is_causal=causal)
    exp = naive_attention(q, k, v, causal=bool(causal))[0]
    assert y.shape == (2, hq, 4, 5) and y.dtype == np.float32
    np.testing.assert_allclose(y, exp, rtol=1e-5, atol=1e-6)


def test_attention_3d_matches_4d():
    q, k, v = rand(2, 4, 3, 8), rand(2, 2, 5, 8), rand(2, 2, 5, 6)
    y3 = run("Attention", to3d(q), to3d(k), to3d(v), q_num_heads=4, kv_num_heads=2,
             scale=0.3, softcap=1.5)
    y4 = run("Attention", q, k, v, scale=0.3, softcap=1.5)
    assert y3.shape == (2, 3, 24)
    np.testing.assert_allclose(y3, to3d(y4), rtol=1e-6)
    with pytest.raises(ShapeError, match="q_num_heads"):
        run("Attention", to3d(q), to3d(k), to3d(v))


def test_attention_past_present_and_all_outputs():
    q, k, v = rand(2, 4, 3, 8), rand(2, 2, 2, 8), rand(2, 2, 2, 8)
    pk, pv = rand(2, 2, 5, 8), rand(2, 2, 5, 8)
    mask = rand(3, 6)  # shorter than total (7): padded with -inf
    for mode in range(4):
        out = run("Attention", q, k, v, mask, pk, pv, n_outputs=4, is_causal=1, softcap=3.0,
                  qk_matmul_output_mode=mode)
        assert len(out) == 4
        exp = naive_attention(q, k, v, mask, pk, pv, causal=True, softcap=3.0)
        np.testing.assert_allclose(out[0], exp[0], rtol=1e-5, atol=1e-6)
        np.testing.assert_array_equal(out[1], np.concatenate([pk, k], 2))
        np.testing.assert_array_equal(out[2], np.concatenate([pv, v], 2))
        np.testing.assert_allclose(out[3], exp[1 + mode], rtol=1e-5, atol=1e-6)
    assert len(run("Attention", q, k, v, None, pk, pv, n_outputs=3)) == 3


def test_attention_bool_and_int_masks():
    q, k, v = rand(1, 2, 3, 4), rand(1, 2, 5, 4), rand(1, 2, 5, 4)
    bmask = RNG.random((2, 3, 5)) > 0.4
    bmask[..., 0] = True
    np.testing.assert_allclose(run("Attention", q, k, v, bmask),
                               naive_attention(q, k, v, bmask)[0], rtol=1e-5, atol=1e-6)
    imask = RNG.integers(-2, 3, (3, 5)).astype(np.int32)
    np.testing.assert_allclose(run("Attention", q, k, v, imask),
                               naive_attention(q, k, v, imask.astype(np.float64))[0],
                               rtol=1e-5, atol=1e-6)
    with pytest.raises(ShapeError, match="attn_mask"):
        run("Attention", q, k, v, np.zeros((4, 5), np.float32))


def test_attention_fully_masked_rows_are_zero():
    q, k, v = rand(1, 1, 3, 4), rand(1, 1, 4, 4), rand(1, 1, 4, 4)
    mask = np.ones((3, 4), bool)
    mask[1] = False
    y, _, _, p = run("Attention", q, k, v, mask, n_outputs=4, qk_matmul_output_mode=3)
    assert np.all(y[0, 0, 1] == 0) and np.all(p[0, 0, 1] == 0)
    assert np.isfinite(y).all()
    np.testing.assert_allclose(p.sum(-1)[0, 0, [0, 2]], 1, rtol=1e-6)


def test_attention_nonpad_kv_seqlen_and_windows():
    q, k, v = rand(2, 2, 3, 4), rand(2, 2, 8, 4), rand(2, 2, 8, 4)
    nonpad = np.array([5, 2], np.int64)  # batch 1: negative offset, leading rows empty
    y = run("Attention", q, k, v, None, None, None, nonpad, is_causal=1)
    np.testing.assert_allclose(y, naive_attention(q, k, v, nonpad=nonpad, causal=True)[0],
                               rtol=1e-5, atol=1e-6)
    assert np.all(y[1, :, 0] == 0)
    for left, right, causal in [(2, -1, 1), (1, 1, 0), (-1, 0, 0), (0, 2, 0)]:
        y = run("Attention", q, k, v, None, None, None, nonpad, opset=25, is_causal=causal,
                left_window_size=left, right_window_size=right)
        exp = naive_attention(q, k, v, nonpad=nonpad, causal=bool(causal), left=left,
                              right=right)[0]
        np.testing.assert_allclose(y, exp, rtol=1e-5, atol=1e-6)


def test_attention_dtypes_and_softmax_precision():
    q, k, v = rand(1, 2, 3, 8), rand(1, 2, 4, 8), rand(1, 2, 4, 8)
    exp = naive_attention(q, k, v)[0]
    y16 = run("Attention", q.astype(np.float16), k.astype(np.float16), v.astype(np.float16))
    assert y16.dtype == np.float16
    np.testing.assert_allclose(y16, exp, rtol=1e-2, atol=2e-3)
    y64 = run("Attention", q.astype(np.float64), k.astype(np.float64), v.astype(np.float64))
    assert y64.dtype == np.float64
    np.testing.assert_allclose(y64, exp, rtol=1e-5)
    y = run("Attention", q, k, v, softmax_precision=11)
    np.testing.assert_allclose(y, exp, rtol=1e-5, atol=1e-6)
    with pytest.raises(InputError, match="softmax_precision"):
        run("Attention", q, k, v, softmax_precision=7)


def test_attention_empty_sequences():
    q, k, v = rand(1, 2, 0, 4), rand(1, 2, 3, 4), rand(1, 2, 3, 5)
    assert run("Attention", q, k, v).shape == (1, 2, 0, 5)
    y = run("Attention", rand(1, 2, 2, 4), rand(1, 2, 0, 4), rand(1, 2, 0, 5))
    assert y.shape == (1, 2, 2, 5) and np.all(y == 0)


def test_attention_errors():
    with pytest.raises(ShapeError, match="multiple"):
        run("Attention", rand(1, 3, 2, 4), rand(1, 2, 2, 4), rand(1, 2, 2, 4))
    with pytest.raises(InputError, match="together"):
        run("Attention", rand(1, 2, 2, 4), rand(1, 2, 2, 4), rand(1, 2, 2, 4), None,
            rand(1, 2, 1, 4), None)


# --------------------------------------------------------------------------------------------
# RotaryEmbedding
# --------------------------------------------------------------------------------------------

def naive_rope(x4, cos, sin, pos, interleaved, rd):
    """x4: (B, H, S, D); cos/sin already gathered to (B, S, rd/2)."""
    out = x4.astype(np.float64).copy()
    b, h, s, d = x4.shape
    half = rd // 2
    for bi, hi, si, i in np.ndindex(b, h, s, half):
        if interleaved:
            a, c = 2 * i, 2 * i + 1
        else:
            a, c = i, i + half
        x1, x2 = x4[bi, hi, si, a], x4[bi, hi, si, c]
        out[bi, hi, si, a] = cos[bi, si, i] * x1 - sin[bi, si, i] * x2
        out[bi, hi, si, c] = sin[bi, si, i] * x1 + cos[bi, si, i] * x2
    return out


@pytest.mark.parametrize("interleaved", [0, 1])
@pytest.mark.parametrize("rd", [0, 4])
@pytest.mark.parametrize("with_pos", [True, False])
def test_rotary_embedding(interleaved, rd, with_pos):
    x = rand(2, 3, 5, 8)
    half = (rd or 8) // 2
    if with_pos:
        pos = RNG.integers(0, 20, (2, 5)).astype(np.int64)
        cos_c, sin_c = rand(20, half), rand(20, half)
        cos, sin = cos_c[pos], sin_c[pos]
        args = (cos_c, sin_c, pos)
    else:
        cos, sin = rand(2, 5, half), rand(2, 5, half)
        args = (cos, sin)
    y = run("RotaryEmbedding", x, *args, opset=23, interleaved=interleaved,
            rotary_embedding_dim=rd)
    exp = naive_rope(x, cos, sin, None, interleaved, rd or 8)
    np.testing.assert_allclose(y, exp, rtol=1e-5, atol=1e-6)
    y3 = run("RotaryEmbedding", to3d(x), *args, opset=23, interleaved=interleaved,
             rotary_embedding_dim=rd, num_heads=3)
    np.testing.assert_allclose(y3, to3d(y), rtol=1e-6)


def test_rotary_embedding_errors_and_dtype():
    x = rand(1, 2, 3, 8).astype(np.float16)
    y = run("RotaryEmbedding", x, rand(1, 3, 4), rand(1, 3, 4), opset=23)
    assert y.dtype == np.float16
    with pytest.raises(ShapeError, match="rotary_embedding_dim/2"):
        run("RotaryEmbedding", x, rand(1, 3, 3), rand(1, 3, 3), opset=23)
    with pytest.raises(ShapeError, match="num_heads"):
        run("RotaryEmbedding", rand(1, 3, 8), rand(1, 3, 4), rand(1, 3, 4), opset=23)


# --------------------------------------------------------------------------------------------
# LinearAttention
# --------------------------------------------------------------------------------------------

def naive_linear_attention(q, k, v, state, decay, beta, hq, hk, rule, scale):
    b, t, _ = q.shape
    dk = q.shape[2] // hq
    dv = v.shape[2] // hk
    s = np.zeros((b, hk, dk, dv)) if state is None else state.astype(np.float64).copy()
    out = np.zeros((b, t, hq * dv))
    for bi in range(b):
        for step in range(t):
            for h in range(hk):
                kt = k[bi, step, h * dk:(h + 1) * dk].astype(np.float64)
                vt = v[bi, step, h * dv:(h + 1) * dv].astype(np.float64)
                sh = s[bi, h]
                if rule in ("gated", "gated_delta"):
                    g = decay[bi, step]
                    g = g[h * dk:(h + 1) * dk] if g.shape[0] == hk * dk else g[h]
                    sh = np.exp(g).reshape(-1, 1) * sh if np.ndim(g) else np.exp(g) * sh
                if rule in ("delta", "gated_delta"):
                    bt = beta[bi, step, h if beta.shape[2] > 1 else 0]
                    sh = sh + bt * np.outer(kt, vt - sh.T @ kt)
                else:
                    sh = sh + np.outer(kt, vt)
                s[bi, h] = sh
            for h in range(hq):
                kh = h // (hq // hk)
                qt = q[bi, step, h * dk:(h + 1) * dk].astype(np.float64)
                out[bi, step, h * dv:(h + 1) * dv] = scale * (qt @ s[bi, kh])
    return out, s


@pytest.mark.parametrize("rule", ["linear", "gated", "delta", "gated_delta"])
@pytest.mark.parametrize("hq,hk", [(2, 2), (4, 2), (3, 1)])
def test_linear_attention(rule, hq, hk):
    b, t, dk, dv = 2, 5, 4, 3
    q, k, v = rand(b, t, hq * dk), rand(b, t, hk * dk) * 0.5, rand(b, t, hk * dv)
    decay = -np.abs(rand(b, t, hk * dk))
    beta = RNG.random((b, t, hk)).astype(np.float32)
    past = rand(b, hk, dk, dv)
    y, st = run("LinearAttention", q, k, v, past, decay, beta, opset=27, q_num_heads=hq,
                kv_num_heads=hk, update_rule=rule)
    ey, es = naive_linear_attention(q, k, v, past, decay, beta, hq, hk, rule, 1 / math.sqrt(dk))
    np.testing.assert_allclose(y, ey, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(st, es, rtol=1e-4, atol=1e-5)


def test_linear_attention_per_head_decay_scalar_beta_no_past():
    b, t, h, dk = 1, 4, 2, 3
    q, k, v = rand(b, t, h * dk), rand(b, t, h * dk), rand(b, t, h * dk)
    decay = -np.abs(rand(b, t, h))
    beta = RNG.random((b, t, 1)).astype(np.float32)
    y, st = run("LinearAttention", q, k, v, None, decay, beta, opset=27, q_num_heads=h,
                kv_num_heads=h, scale=0.5)
    ey, es = naive_linear_attention(q, k, v, None, decay, beta, h, h, "gated_delta", 0.5)
    np.testing.assert_allclose(y, ey, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(st, es, rtol=1e-4, atol=1e-5)
    with pytest.raises(InputError, match="decay"):
        run("LinearAttention", q, k, v, opset=27, q_num_heads=h, kv_num_heads=h)
    with pytest.raises(InputError, match="update_rule"):
        run("LinearAttention", q, k, v, opset=27, q_num_heads=h, kv_num_heads=h,
            update_rule="mamba")
    y16, s16 = run("LinearAttention", q.astype(np.float16), k.astype(np.float16),
                   v.astype(np.float16), opset=27, q_num_heads=h, kv_num_heads=h,
                   update_rule="linear")
    assert y16.dtype == np.float16 and s16.dtype == np.float16


# --------------------------------------------------------------------------------------------
# FlexAttention (ai.onnx.preview)
# --------------------------------------------------------------------------------------------

def flex(*inputs, **attrs):
    return run("FlexAttention", *inputs, opset=1, domain="ai.onnx.preview", **attrs)


def test_flex_attention_plain_gqa_and_mods():
    q, k, v = rand(2, 4, 3, 8), rand(2, 2, 5, 8), rand(2, 2, 5, 6)
    np.testing.assert_allclose(flex(q, k, v), naive_attention(q, k, v)[0], rtol=1e-5,
                               atol=1e-6)
    np.testing.assert_allclose(flex(q, k, v, scale=0.2),
                               naive_attention(q, k, v, scale=0.2)[0], rtol=1e-5, atol=1e-6)

    def causal_mod(scores):
        i = np.arange(scores.shape[2])[:, None]
        j = np.arange(scores.shape[3])[None, :]
        return [np.where(j <= i, scores, -np.inf).astype(scores.dtype)]

    np.testing.assert_allclose(flex(q, k, v, score_mod=causal_mod),
                               naive_attention(q, k, v, causal=True)[0], rtol=1e-5, atol=1e-6)
    seen = {}

    def prob_mod(p):
        seen["dtype"] = p.dtype
        return [p * 2]

    np.testing.assert_allclose(flex(q, k, v, prob_mod=prob_mod),
                               2 * naive_attention(q, k, v)[0], rtol=1e-5, atol=1e-6)
    assert seen["dtype"] == np.float32
    flex(q.astype(np.float64), k.astype(np.float64), v.astype(np.float64), prob_mod=prob_mod)
    assert seen["dtype"] == np.float64
    assert flex(q.astype(np.float16), k.astype(np.float16), v.astype(np.float16)).dtype \
        == np.float16
    with pytest.raises(ShapeError):
        flex(rand(1, 3, 2, 4), rand(1, 2, 2, 4), rand(1, 2, 2, 4))
