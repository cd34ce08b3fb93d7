"""com.microsoft transformer kernels, one hand-built node at a time, against onnxruntime:
attention (masks in every form, past/present, unidirectional, grouped heads, rotary, local
window, softcap), the layer norms, the GELU family, FusedMatMul / FusedGemm / FusedConv."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("onnxruntime")

from tests.contrib._single import (
    TensorProto,
    compare,
    f32,
    run_ort,
    run_wb,
    single_node,  # noqa: E402
)
from workbench.errors import WorkbenchError  # noqa: E402

F, I32 = TensorProto.FLOAT, TensorProto.INT32
TOL = dict(rtol=2e-5, atol=2e-5)


def _rng(seed=0):
    return np.random.default_rng(seed)


# ---------------------------------------------------------------------------------- Attention
def _attention_inputs(r, b=2, s=4, hid=8, mask=None, past=0, heads=2, sizes=None):
    width = sum(sizes) if sizes else 3 * hid
    ins = [("X", f32(r, (b, s, hid))), ("W", f32(r, (hid, width), 0.3)),
           ("bias", f32(r, (width,), 0.1)), ("M", mask)]
    if past:
        hk = (sizes[1] if sizes else hid) // heads
        ins.append(("past", f32(r, (2, b, heads, past, hk))))
    return ins


@pytest.mark.parametrize("mask_kind", [None, "1d-end", "1d-end-start", "2d", "3d", "4d"])
@pytest.mark.parametrize("unidirectional", [0, 1])
def test_attention_masks(mask_kind, unidirectional):
    r = _rng(1)
    b, s = 2, 4
    mask = {
        None: None,
        "1d-end": np.array([4, 2], np.int32),
        "1d-end-start": np.array([4, 3, 0, 1], np.int32),
        "2d": np.array([[1, 1, 1, 1], [1, 1, 0, 0]], np.int32),
        "3d": r.integers(0, 2, (b, s, s)).astype(np.int32) | np.eye(s, dtype=np.int32),
        "4d": np.tril(np.ones((6, 6), np.int32))[None, None].repeat(b, 0),
    }[mask_kind]
    attrs = {"num_heads": 2, "unidirectional": unidirectional}
    if mask_kind == "4d":
        # onnxruntime's CPU kernel has no 4-D mask: the same model with the equivalent 3-D
        # mask (the [past:past+S, :T] block of the max_seq x max_seq mask) is the oracle
        ins = _attention_inputs(r, b, s, mask=mask)
        m4, feeds4 = single_node("Attention", ins, attrs, outputs=2)
        m3, feeds3 = single_node("Attention", ins[:3] + [("M", mask[:, 0, :s, :s].copy())],
                                 attrs, outputs=2)
        ref = run_ort(m3, feeds3)
        got = run_wb(m4, feeds4, [3, 5])
        for g, rr in zip(got, ref):
            np.testing.assert_allclose(g, rr, **TOL)
        return
    m, feeds = single_node("Attention", _attention_inputs(r, b, s, mask=mask), attrs,
                           outputs=2)
    compare(m, feeds, **TOL)


@pytest.mark.parametrize("mask", [False, True])
def test_attention_past_present(mask):
    r = _rng(2)
    b, s, past = 2, 3, 5
    mk = np.ones((b, past + s), np.int32)
    mk[1, :2] = 0
    m, feeds = single_node("Attention", _attention_inputs(r, b, s, mask=mk if mask else None,
                                                          past=past),
                           {"num_heads": 2, "unidirectional": 1}, outputs=2)
    compare(m, feeds, **TOL)


def test_attention_qkv_hidden_sizes_scale_and_filter_value():
    r = _rng(3)
    sizes = [8, 8, 12]
    m, feeds = single_node("Attention", _attention_inputs(
        r, mask=np.array([[1, 1, 0, 0], [1, 1, 1, 0]], np.int32), sizes=sizes),
        {"num_heads": 2, "qkv_hidden_sizes": sizes, "scale": 0.3,
         "mask_filter_value": -1000.0})
    compare(m, feeds, **TOL)


def test_attention_bias_input():
    r = _rng(4)
    ins = _attention_inputs(r) + [("past", None), ("ab", f32(r, (2, 2, 4, 4)))]
    m, feeds = single_node("Attention", ins, {"num_heads": 2})
    compare(m, feeds, **TOL)


# ---------------------------------------------------------------------------------- MHA
def test_mha_separate_qkv_bias_mask_past():
    r = _rng(5)
    b, s, l, d, n, past = 2, 3, 3, 8, 2, 4
    mk = np.ones((b, past + l), np.int32)
    mk[0, -1] = 0
    ins = [("q", f32(r, (b, s, d))), ("k", f32(r, (b, l, d))), ("v", f32(r, (b, l, d))),
           ("bias", f32(r, (3 * d,), 0.1)), ("mask", mk), ("ab", None),
           ("pk", f32(r, (b, n, past, d // n))), ("pv", f32(r, (b, n, past, d // n)))]
    m, feeds = single_node("MultiHeadAttention", ins, {"num_heads": n}, outputs=3)
    compare(m, feeds, **TOL)


@pytest.mark.parametrize("unidirectional", [0, 1])
def test_mha_cross_attention_lengths(unidirectional):
    r = _rng(6)
    b, s, l, d, n = 2, 4, 6, 8, 2
    ins = [("q", f32(r, (b, s, d))), ("k", f32(r, (b, l, d))), ("v", f32(r, (b, l, d))),
           ("bias", None), ("mask", np.array([6, 3], np.int32))]
    m, feeds = single_node("MultiHeadAttention", ins, {"num_heads": n, "scale": 0.5})
    compare(m, feeds, **TOL)


def test_mha_packed_qkv_and_bnsh_kv():
    r = _rng(7)
    b, s, n, h = 2, 3, 2, 4
    qkv = f32(r, (b, s, n, 3, h))
    # onnxruntime's CPU kernel has no packed QKV: the unpacked model is the oracle
    m, feeds = single_node("MultiHeadAttention", [("qkv", qkv)], {"num_heads": n})
    q, k, v = (qkv[:, :, :, i].reshape(b, s, n * h).copy() for i in range(3))
    mu, feeds_u = single_node("MultiHeadAttention", [("q", q), ("k", k), ("v", v)],
                              {"num_heads": n})
    np.testing.assert_allclose(run_wb(m, feeds, [3])[0], run_ort(mu, feeds_u)[0], **TOL)
    m, feeds = single_node("MultiHeadAttention", [
        ("q", f32(r, (b, s, n * h))), ("k", f32(r, (b, n, 5, h))),
        ("v", f32(r, (b, n, 5, h)))], {"num_heads": n})
    compare(m, feeds, **TOL)
    q, kv = f32(r, (b, s, n * h)), f32(r, (b, 5, n, 2, h))
    m, feeds = single_node("MultiHeadAttention", [("q", q), ("kv", kv)], {"num_heads": n})
    mu, feeds_u = single_node("MultiHeadAttention", [
        ("q", q), ("k", kv[:, :, :, 0].reshape(b, 5, n * h).copy()),
        ("v", kv[:, :, :, 1].reshape(b, 5, n * h).copy())], {"num_heads": n})
    np.testing.assert_allclose(run_wb(m, feeds, [3])[0], run_ort(mu, feeds_u)[0], **TOL)


def test_mha_attention_bias():
    r = _rng(8)
    b, s, d, n = 2, 3, 8, 2
    m, feeds = single_node("MultiHeadAttention", [
        ("q", f32(r, (b, s, d))), ("k", f32(r, (b, s, d))), ("v", f32(r, (b, s, d))),
        ("bias", None), ("mask", None), ("ab", f32(r, (1, n, s, s)))], {"num_heads": n})
    compare(m, feeds, **TOL)


# ---------------------------------------------------------------------------------- GQA
def _cos_sin(max_pos, rot):
    inv = 1.0 / (10000 ** (np.arange(0, rot, 2) / rot))
    ang = np.arange(max_pos)[:, None] * inv[None, :]
    return np.cos(ang).astype(np.float32), np.sin(ang).astype(np.float32)


@pytest.mark.parametrize("rotary", [0, 1])
@pytest.mark.parametrize("extra", [{}, {"local_window_size": 3}, {"softcap": 2.0}])
def test_gqa_prompt(rotary, extra):
    r = _rng(9)
    b, s, n, nkv, h = 2, 5, 4, 2, 16
    cos, sin = _cos_sin(16, h)
    ins = [("q", f32(r, (b, s, n * h))), ("k", f32(r, (b, s, nkv * h))),
           ("v", f32(r, (b, s, nkv * h))), ("pk", None), ("pv", None),
           ("seqlens", np.array([s - 1, s - 1], np.int32)), ("total", np.array(s, np.int32)),
           ("cos", cos if rotary else None), ("sin", sin if rotary else None)]
    m, feeds = single_node("GroupQueryAttention", ins,
                           dict(num_heads=n, kv_num_heads=nkv, do_rotary=rotary, **extra),
                           outputs=3, const=("total",))
    compare(m, feeds, **TOL)


@pytest.mark.parametrize("rotary", [0, 1])
def test_gqa_token_generation_with_past(rotary):
    r = _rng(10)
    b, n, nkv, h, cap = 2, 4, 1, 16, 8
    past_len = 5
    cos, sin = _cos_sin(16, h)
    ins = [("q", f32(r, (b, 1, n * h))), ("k", f32(r, (b, 1, nkv * h))),
           ("v", f32(r, (b, 1, nkv * h))), ("pk", f32(r, (b, nkv, cap, h))),
           ("pv", f32(r, (b, nkv, cap, h))),
           ("seqlens", np.array([past_len, past_len], np.int32)),
           ("total", np.array(past_len + 1, np.int32)),
           ("cos", cos if rotary else None), ("sin", sin if rotary else None)]
    m, feeds = single_node("GroupQueryAttention", ins,
                           dict(num_heads=n, kv_num_heads=nkv, do_rotary=rotary), outputs=3,
                           const=("total",))
    compare(m, feeds, **TOL)


def test_gqa_packed_qkv_prompt():
    r = _rng(11)
    b, s, n, nkv, h = 1, 4, 2, 2, 16
    m, feeds = single_node("GroupQueryAttention", [
        ("qkv", f32(r, (b, s, (n + 2 * nkv) * h))), ("k", None), ("v", None), ("pk", None),
        ("pv", None), ("seqlens", np.array([s - 1], np.int32)),
        ("total", np.array(s, np.int32))], dict(num_heads=n, kv_num_heads=nkv), outputs=3,
        const=("total",))
    compare(m, feeds, **TOL)


# ---------------------------------------------------------------------------------- rotary
@pytest.mark.parametrize("interleaved", [0, 1])
@pytest.mark.parametrize("layout", ["bsd", "bnsh"])
@pytest.mark.parametrize("positions", ["ids", "offset"])
def test_rotary_embedding(interleaved, layout, positions):
    r = _rng(12)
    b, s, n, h = 2, 5, 2, 8
    cos, sin = _cos_sin(32, h)
    x = f32(r, (b, s, n * h)) if layout == "bsd" else f32(r, (b, n, s, h))
    pid = (r.integers(0, 20, (b, s)).astype(np.int64) if positions == "ids"
           else np.array([3], np.int64))
    attrs = {"interleaved": interleaved}
    if layout == "bsd":
        attrs["num_heads"] = n
    m, feeds = single_node("RotaryEmbedding", [("x", x), ("pos", pid), ("cos", cos),
                                               ("sin", sin)], attrs)
    compare(m, feeds, **TOL)


def test_rotary_embedding_partial_dim():
    r = _rng(13)
    b, s, n, h, rot = 1, 4, 2, 8, 4
    cos, sin = _cos_sin(16, rot)
    m, feeds = single_node("RotaryEmbedding", [
        ("x", f32(r, (b, s, n * h))), ("pos", np.arange(s, dtype=np.int64)[None]),
        ("cos", cos), ("sin", sin)], {"num_heads": n, "rotary_embedding_dim": rot})
    compare(m, feeds, **TOL)


# ---------------------------------------------------------------------------------- norms
@pytest.mark.parametrize("beta,bias", [(False, False), (True, False), (True, True)])
@pytest.mark.parametrize("skip_shape", ["same", "broadcast"])
def test_skip_layer_norm(beta, bias, skip_shape):
    r = _rng(14)
    x = f32(r, (2, 3, 16))
    ins = [("x", x), ("skip", f32(r, (2, 3, 16) if skip_shape == "same" else (3, 16))),
           ("gamma", f32(r, (16,))), ("beta", f32(r, (16,)) if beta else None),
           ("bias", f32(r, (16,)) if bias else None)]
    m, feeds = single_node("SkipLayerNormalization", ins, {"epsilon": 1e-5}, outputs=4)
    compare(m, feeds, **TOL)


def test_skip_simplified_layer_norm():
    r = _rng(15)
    ins = [("x", f32(r, (2, 3, 16))), ("skip", f32(r, (2, 3, 16))), ("gamma", f32(r, (16,))),
           ("bias", f32(r, (16,)))]
    m, feeds = single_node("SkipSimplifiedLayerNormalization", ins, {"epsilon": 1e-6},
                           outputs=1)
    compare(m, feeds, **TOL)
    m, feeds = single_node("SkipSimplifiedLayerNormalization", ins, {"epsilon": 1e-6},
                           outputs=4)
    ref = run_ort(m, feeds)
    got = run_wb(m, feeds, [r_.ndim for r_ in ref])
    for i in (0, 2, 3):  # output 1 (mean) has no meaning in the RMS form
        np.testing.assert_allclose(got[i], ref[i], **TOL)
    assert got[1].shape == ref[1].shape


@pytest.mark.parametrize("axis", [-1, 1])
def test_simplified_layer_norm(axis):
    r = _rng(16)
    x = f32(r, (2, 3, 8))
    scale = f32(r, (8,) if axis == -1 else (3, 8))
    m, feeds = single_node("SimplifiedLayerNormalization", [("x", x), ("scale", scale)],
                           {"axis": axis, "epsilon": 1e-5}, outputs=2, domain="")
    compare(m, feeds, **TOL)  # written in the ai.onnx domain, as onnxruntime's tools do


def test_layer_norm_below_opset_17_as_onnxruntime_writes_it():
    r = _rng(24)
    m, feeds = single_node("LayerNormalization", [("x", f32(r, (2, 3, 8))),
                                                  ("g", f32(r, (8,))), ("b", f32(r, (8,)))],
                           {"epsilon": 1e-5}, domain="", opset=13)
    compare(m, feeds, **TOL)


@pytest.mark.parametrize("with_mask,with_segment,with_pos", [
    (True, True, False), (False, True, False), (True, False, True)])
def test_embed_layer_norm(with_mask, with_segment, with_pos):
    r = _rng(17)
    b, s, hid = 2, 6, 16
    mask = np.ones((b, s), np.int32)
    mask[1, 4:] = 0
    ins = [("ids", r.integers(0, 50, (b, s)).astype(np.int32)),
           ("seg", r.integers(0, 2, (b, s)).astype(np.int32) if with_segment else None),
           ("wemb", f32(r, (50, hid))), ("pemb", f32(r, (16, hid))),
           ("semb", f32(r, (2, hid)) if with_segment else None),
           ("gamma", f32(r, (hid,))), ("beta", f32(r, (hid,))),
           ("mask", mask if with_mask else None),
           ("pos", r.integers(0, 16, (b, s)).astype(np.int32) if with_pos else None)]
    m, feeds = single_node("EmbedLayerNormalization", ins, {"epsilon": 1e-12}, outputs=3,
                           out_types=[F, I32, F])
    compare(m, feeds, **TOL)


# ---------------------------------------------------------------------------------- gelu family
def test_gelu_family():
    r = _rng(18)
    x = f32(r, (3, 4, 10), 2.0)
    b = f32(r, (10,))
    for op, ins, attrs in [("Gelu", [("x", x)], {}),
                           ("BiasGelu", [("x", x), ("b", b)], {}),
                           ("FastGelu", [("x", x)], {}),
                           ("FastGelu", [("x", x), ("b", b)], {}),
                           ("QuickGelu", [("x", x)], {}),
                           ("QuickGelu", [("x", x)], {"alpha": 1.3})]:
        m, feeds = single_node(op, ins, attrs)
        compare(m, feeds, rtol=1e-5, atol=1e-5)


def test_bias_add_reference():
    """onnxruntime has BiasAdd on CUDA only: checked against its formula X + bias + skip."""
    r = _rng(19)
    x, bias, skip = f32(r, (2, 3, 8)), f32(r, (8,)), f32(r, (2, 3, 8))
    m, feeds = single_node("BiasAdd", [("x", x), ("b", bias), ("s", skip)])
    np.testing.assert_allclose(run_wb(m, feeds, [3])[0], x + bias + skip, rtol=1e-6)
    m, feeds = single_node("BiasAdd", [("x", x), ("b", f32(r, (7,))), ("s", skip)])
    with pytest.raises(WorkbenchError, match=r"the_BiasAdd.*bias \(7,\)"):
        run_wb(m, feeds, [3])


# ---------------------------------------------------------------------------------- fused
@pytest.mark.parametrize("attrs,ashape,bshape", [
    ({}, (2, 3, 4), (4, 5)),
    ({"transA": 1, "alpha": 0.5}, (2, 4, 3), (4, 5)),
    ({"transB": 1}, (2, 3, 4), (2, 5, 4)),
    ({"transA": 1, "transB": 1}, (4, 3), (5, 4)),
    ({"transBatchA": 1}, (3, 2, 4), (2, 4, 5)),
    ({"transBatchB": 1, "transB": 1}, (2, 3, 4), (5, 2, 4)),
    ({"transBatchA": 1, "transA": 1}, (4, 2, 3), (2, 4, 5)),
])
def test_fused_matmul(attrs, ashape, bshape):
    r = _rng(20)
    m, feeds = single_node("FusedMatMul", [("a", f32(r, ashape)), ("b", f32(r, bshape))],
                           attrs)
    compare(m, feeds, **TOL)


@pytest.mark.parametrize("act,params", [("Relu", {}), ("LeakyRelu", {"activation_alpha": 0.2}),
                                        ("Sigmoid", {}), ("Tanh", {})])
def test_fused_gemm(act, params):
    r = _rng(21)
    m, feeds = single_node("FusedGemm", [("a", f32(r, (3, 4))), ("b", f32(r, (5, 4))),
                                         ("c", f32(r, (5,)))],
                           dict(transB=1, alpha=0.7, beta=0.5, activation=act, **params))
    compare(m, feeds, **TOL)


@pytest.mark.parametrize("act,params,with_z", [
    ("Relu", [], False), ("Relu", [], True), ("LeakyRelu", [0.1], True),
    ("Clip", [-0.5, 0.5], False), ("Sigmoid", [], False), ("HardSigmoid", [0.3, 0.4], True),
    ("Tanh", [], True)])
def test_ms_fused_conv(act, params, with_z):
    r = _rng(22)
    x, w, b = f32(r, (2, 3, 7, 7)), f32(r, (4, 3, 3, 3), 0.3), f32(r, (4,))
    ins = [("x", x), ("w", w), ("b", b), ("z", f32(r, (2, 4, 7, 7)) if with_z else None)]
    attrs = {"activation": act, "pads": [1, 1, 1, 1], "kernel_shape": [3, 3]}
    if params:
        attrs["activation_params"] = params
    m, feeds = single_node("FusedConv", ins, attrs, const=("w", "b"))
    compare(m, feeds, rtol=1e-4, atol=1e-5)


def test_ms_fused_conv_is_not_the_internal_one():
    """com.microsoft::FusedConv and the engine's internal com.workbench::FusedConv are two
    kernels under two domains."""
    from workbench.ops.registry import lookup

    assert lookup("FusedConv", "com.microsoft", 1).fn is not lookup("FusedConv",
                                                                     "com.workbench", 1).fn


def test_attention_bad_shapes_named():
    r = _rng(23)
    m, feeds = single_node("Attention", [("X", f32(r, (2, 4, 8))), ("W", f32(r, (6, 24))),
                                         ("bias", f32(r, (24,)))], {"num_heads": 2})
    with pytest.raises(WorkbenchError, match=r"the_Attention.*\(2, 4, 8\).*\(6, 24\)"):
        run_wb(m, feeds, [3])
    m, feeds = single_node("Attention", [("X", f32(r, (2, 4, 8))), ("W", f32(r, (8, 24))),
                                         ("bias", f32(r, (24,))),
                                         ("M", np.ones((2, 5), np.int32))], {"num_heads": 2})
    with pytest.raises(WorkbenchError, match=r"the_Attention.*mask_index.*\(2, 4\)"):
        run_wb(m, feeds, [3])
