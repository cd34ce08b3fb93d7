"""The compiled transformer kernels (workbench/compiled/kernels/transformer.py, called through
workbench/ops/rowwise.py) against the numpy paths of the ops that use them: LayerNormalization
and com.microsoft's Skip/Simplified forms, Softmax, the attention cores (FusedAttention, the
contrib ``attend``), GELU in its erf and tanh forms (ai.onnx Gelu, com.microsoft Gelu /
BiasGelu / FastGelu, FusedMatMul's epilogue). Edge cases: negative and non-last axes (numpy),
broadcast scale/bias/masks, empty tensors, NaN/Inf, large magnitudes, epsilon, float16 (numpy
through the compute dtype). Then a BERT-like and a GPT-2-like model: compiled, numpy and
onnxruntime agree."""

from __future__ import annotations

import math
from types import SimpleNamespace

import numpy as np
import pytest

from workbench import compiled
from workbench.compiled import image
from workbench.ops import activation, attention, contrib_transformer, linalg, norm, rowwise

pytestmark = pytest.mark.skipif(image.supported() is not None,
                                reason=f"compiled kernels: {image.supported()}")

CTX1 = SimpleNamespace(n_outputs=1, training=False)


@pytest.fixture(scope="module", autouse=True)
def transformer_module():
    if not compiled.wait(["transformer"], timeout=900) or \
            compiled.kernel("transformer.softmax") is None:
        pytest.skip(f"kernel module transformer is not available: {compiled.status()}")


def both(fn, *args, **kwargs):
    """(compiled result, numpy result) of ``fn``."""
    got = fn(*args, **kwargs)
    with compiled.disabled():
        ref = fn(*args, **kwargs)
    return got, ref


def close(got, ref, rtol=2e-6, atol=2e-6):
    got, ref = (got, ref) if isinstance(got, tuple) else ((got,), (ref,))
    assert len(got) == len(ref)
    for g, r in zip(got, ref):
        assert g.dtype == r.dtype and g.shape == r.shape
        scale = max(1.0, float(np.nanmax(np.abs(np.where(np.isinf(r), 0, r))))) if r.size else 1
        np.testing.assert_allclose(g, r, rtol=rtol, atol=atol * scale)


def rnd(*shape, seed=0, scale=1.0, offset=0.0):
    return (np.random.default_rng(seed).standard_normal(shape) * scale + offset).astype(
        np.float32)


# ------------------------------------------------------------------------------ LayerNorm
@pytest.mark.parametrize("shape", [(2, 5, 64), (3, 7), (1, 1, 33)])
def test_layer_norm_matches_numpy(shape):
    n = shape[-1]
    x, g, b = rnd(*shape), rnd(n, seed=1), rnd(n, seed=2)
    for axis in (-1, len(shape) - 1):
        close(*both(norm.layer_norm, x, g, b, axis=axis, epsilon=1e-5, ctx=CTX1))
    close(*both(norm.layer_norm, x, g.reshape(1, n), None, axis=-1, epsilon=0.5, ctx=CTX1))
    assert rowwise.layer_norm(x, g, b, 1e-5) is not None     # the compiled path ran


def test_layer_norm_edges():
    # large common offset (the two-pass variance), huge magnitude, NaN/Inf rows, empty
    x = rnd(4, 16, scale=1e-2, offset=1e4)
    x[1] = rnd(16, seed=3, scale=1e30)
    x[2, 3] = np.nan
    x[3, 5] = np.inf
    g, b = rnd(16, seed=1), rnd(16, seed=2)
    got, ref = both(norm.layer_norm, x, g, b, axis=-1, epsilon=1e-5, ctx=CTX1)
    np.testing.assert_array_equal(np.isnan(got[2:]), np.isnan(ref[2:]))
    # rows 0 and 1 against float64: the kernel's statistics are float64, numpy's float32 mean
    # of a 1e4 offset is off by a tenth of the spread and its squares of 1e30 overflow
    for i in (0, 1):
        r = x[i].astype(np.float64)
        want = (r - r.mean()) / np.sqrt(r.var() + 1e-5) * g + b
        np.testing.assert_allclose(got[i], want, rtol=1e-5, atol=1e-5)
    e = np.zeros((0, 16), np.float32)
    close(*both(norm.layer_norm, e, g, b, axis=-1, epsilon=1e-5, ctx=CTX1))
    # axis not last, float16, a Scale of higher rank: the numpy path (same results)
    x3 = rnd(2, 3, 4)
    close(*both(norm.layer_norm, x3, rnd(3, 4), None, axis=1, epsilon=1e-5, ctx=CTX1))
    h = x3.astype(np.float16)
    close(*both(norm.layer_norm, h, rnd(4).astype(np.float16), None, axis=-1, epsilon=1e-5,
                ctx=CTX1), rtol=1e-3, atol=1e-3)
    assert rowwise.layer_norm(rnd(4), rnd(1, 1, 4), None, 1e-5) is None


def test_skip_layer_norms():
    x, g, b, bias = rnd(2, 6, 32), rnd(32, seed=1), rnd(32, seed=2), rnd(32, seed=3)
    for skip in (rnd(2, 6, 32, seed=4), rnd(6, 32, seed=5), rnd(32, seed=6)):
        for n_out in (1, 4):
            ctx = SimpleNamespace(n_outputs=n_out)
            close(*both(contrib_transformer.skip_layer_norm, x, skip, g, b, bias,
                        epsilon=1e-6, ctx=ctx))
            close(*both(contrib_transformer.skip_simplified_layer_norm, x, skip, g, bias,
                        epsilon=1e-6, ctx=ctx))
    close(*both(contrib_transformer.skip_layer_norm, x, x, g, None, None, epsilon=1e-6,
                ctx=CTX1))
    close(*both(contrib_transformer.simplified_layer_norm, x, g, axis=-1, epsilon=1e-6,
                ctx=CTX1))
    close(*both(contrib_transformer.simplified_layer_norm, x, rnd(6, 32), axis=1,
                epsilon=1e-6, ctx=CTX1))


def test_embed_layer_norm():
    ids = np.array([[1, 4, 2], [0, 3, 3]], np.int32)
    seg = np.array([[0, 1, 1], [1, 0, 0]], np.int32)
    words, pos, segs = rnd(5, 16), rnd(4, 16, seed=1), rnd(2, 16, seed=2)
    ctx = SimpleNamespace(n_outputs=3)
    close(*both(contrib_transformer.embed_layer_norm, ids, seg, words, pos, segs,
                rnd(16, seed=3), rnd(16, seed=4), np.array([[1, 1, 0], [1, 1, 1]], np.int32),
                epsilon=1e-5, ctx=ctx))


# ------------------------------------------------------------------------------ softmax
def test_softmax_op():
    x = rnd(3, 4, 37, scale=5)
    x[0, 1] = -np.inf                   # all -inf: NaN in both
    x[0, 2, 3] = np.nan
    x[1, 0, :5] = -np.inf
    x[2, 1] = rnd(37, seed=2, scale=1e30)
    got, ref = both(activation.softmax, x, axis=-1)
    np.testing.assert_array_equal(np.isnan(got), np.isnan(ref))
    close(np.nan_to_num(got), np.nan_to_num(ref))
    assert np.allclose(got[1, 0, :5], 0)
    close(*both(activation.softmax, x[:, :, :3].copy(), axis=1))     # not the last axis
    close(*both(activation.softmax_1, x[1:], axis=2))
    close(*both(activation.softmax, np.zeros((2, 0, 5), np.float32), axis=-1))
    close(*both(activation.softmax, x.astype(np.float16)[1:], axis=-1), rtol=1e-3, atol=1e-3)


def test_softmax_keeps_subnormal_probabilities():
    """exp is evaluated in the kernel: results below float32's smallest normal (1.2e-38) stay
    subnormal as numpy's are, not flushed to zero; below the smallest subnormal they are 0."""
    x = np.zeros((4, 64), np.float32)
    x[0] = -np.linspace(0, 110, 64, dtype=np.float32)        # exp down to e^-110
    x[1] = -np.linspace(80, 104, 64, dtype=np.float32)
    x[1, 0] = 0
    x[2, :] = rnd(64, seed=5, scale=30)
    x[3] = -np.linspace(0, 200, 64, dtype=np.float32)
    got, ref = both(activation.softmax, x, axis=-1)
    tiny = np.finfo(np.float32).smallest_subnormal
    normal = ref >= np.finfo(np.float32).tiny
    np.testing.assert_allclose(got[normal], ref[normal], rtol=2e-6)
    # a subnormal carries fewer mantissa bits: within a few units of the last place
    np.testing.assert_allclose(got[~normal], ref[~normal], rtol=0, atol=8 * tiny)
    assert (got[~normal & (ref > 64 * tiny)] > 0).all()


@pytest.mark.parametrize("mask", ["", "add", "fill_where_true", "fill_where_false"])
def test_fused_attention(mask):
    b, h, s, d = 2, 3, 5, 8
    q, k, v = rnd(b, s, h * d), rnd(b, s, h * d, seed=1), rnd(b, s, h * d, seed=2)
    shape = np.array([0, 0, h, d], np.int64)
    m = None
    if mask == "add":
        m = np.where(rnd(b, 1, 1, s, seed=3) > 0, 0, -1e4).astype(np.float32)
    elif mask:
        m = np.triu(np.ones((s, s), bool), 1)[None, None]
    kw = dict(scale=math.sqrt(d), scale_op="div", mask=mask, fill=-np.inf,
              q_perm=(0, 2, 1, 3), k_perm=(0, 2, 3, 1), v_perm=(0, 2, 1, 3),
              out_perm=(0, 2, 1, 3))
    args = (q, k, v, m, shape, shape, shape, np.array([0, 0, h * d], np.int64))
    got, ref = both(linalg.fused_attention, *args, **kw)
    np.testing.assert_array_equal(np.isnan(got), np.isnan(ref))
    close(np.nan_to_num(got), np.nan_to_num(ref))
    kw.update(scale=0.3, scale_op="mul", out_perm=())
    close(*both(linalg.fused_attention, q.reshape(b, s, h, d).transpose(0, 2, 1, 3).copy(),
                k.reshape(b, s, h, d).transpose(0, 2, 3, 1).copy(),
                v.reshape(b, s, h, d).transpose(0, 2, 1, 3).copy(),
                None if mask == "add" else m, mask="" if mask == "add" else mask,
                **{k_: v_ for k_, v_ in kw.items() if k_ not in ("mask", "q_perm", "k_perm",
                                                                  "v_perm")}))


def test_softmax_rows_split_anywhere():
    """The rows split over threads start anywhere in the (a, b, c) grid of the masks."""
    x = rnd(3, 4, 5, 16, scale=3)
    add, where = rnd(3, 1, 5, 16, seed=1), rnd(1, 4, 1, 16, seed=2) > 1
    whole = rowwise.softmax(x, scale=0.5, add=add, fill_where=where, fill=-1e9)
    with compiled.disabled():
        ref = activation.softmax(np.where(where, np.float32(-1e9), x * np.float32(0.5) + add))
    close(whole, ref)
    k = compiled.kernel("transformer.softmax")
    st_add, st_fill = rowwise._mask_strides(add, x.shape)[1], \
        rowwise._mask_strides(where.view(np.uint8), x.shape)[1]
    y = np.empty_like(x)
    for r0, r1 in ((0, 7), (7, 33), (33, 60)):
        params = np.array((60, 16, 5, 4, *st_add, *st_fill, add.size, where.size, 1, 1, 1, 1,
                           0), np.int64)
        k(x, y, add, np.ascontiguousarray(where).view(np.uint8), params, r0, r1, 0.5, -1e9)
    np.testing.assert_array_equal(y, whole)
    for shape, mshape in (((2, 3, 4, 5, 8), (2, 3, 1, 5, 8)), ((2, 3, 4, 5, 8), (4, 5, 8)),
                          ((6, 8), (6, 1)), ((2, 3, 4, 5, 8), (2, 1, 4, 1, 8)),
                          ((2, 3, 4, 5, 8), (3, 1, 1, 8))):
        x, m = rnd(*shape, seed=4), rnd(*mshape, seed=5)
        got = rowwise.softmax(x, add=m)
        with compiled.disabled():
            ref = activation.softmax(x + m)
        if mshape in ((2, 1, 4, 1, 8), (3, 1, 1, 8)):   # leading dims that do not merge
            assert got is None
        else:
            close(got, ref)
    big = rnd(2, 8, 64, 128, seed=3)                 # large enough for the engine's threads
    got = rowwise.softmax(big, add=add[:1, :1, :1, :1].reshape(1))
    with compiled.disabled():
        close(got, activation.softmax(big + add[0, 0, 0, 0]))


def test_contrib_attention_core():
    b, n, s, t, hd = 2, 4, 3, 6, 8
    q, k, v = rnd(b, n, s, hd), rnd(b, 2, t, hd, seed=1), rnd(b, 2, t, hd, seed=2)
    bias = rnd(1, n, s, t, seed=3)
    key = np.where(rnd(b, 1, 1, t, seed=4) > 0.5, np.float32(-1e4), np.float32(0))
    blocked = np.arange(t)[None, None, None, :] > np.arange(s)[None, None, :, None] + 3
    kw = dict(scale=0.35, biases=(("bias", bias), ("mask", key)), blocked=blocked,
              blocked_value=-1e30)
    close(*both(attention.attend, np, q, k, v, **kw))
    close(*both(attention.attend, np, q, k, v, scale=0.35))
    out = SimpleNamespace(n_outputs=1)
    x, w = rnd(b, s, 24), rnd(24, 72, seed=5, scale=0.2)
    close(*both(contrib_transformer.ms_attention, x, w, rnd(72, seed=6),
                np.array([3, 2], np.int32), num_heads=4, unidirectional=1, ctx=out))


@pytest.mark.parametrize("case", ["bool_causal", "float_past", "3d_window", "scores"])
def test_onnx_attention(case, monkeypatch):
    """ai.onnx Attention (opset 23): compiled unless the scores are asked for (4 outputs)."""
    ran = []
    real = rowwise.softmax
    monkeypatch.setattr(attention.rowwise, "softmax",
                        lambda *a, **k: ran.append(real(*a, **k)) or ran[-1])
    b, h, s, d = 2, 4, 5, 8
    q, k, v = rnd(b, h, s, d), rnd(b, h, s, d, seed=1), rnd(b, h, s, d, seed=2)
    kw = dict(is_causal=0, qk_matmul_output_mode=0, softcap=0.0)
    args = [q, k, v]
    n_out = 1
    if case == "bool_causal":
        mask = rnd(b, 1, s, s, seed=3) > -0.5
        mask[0, 0, 2] = False                      # a query row that attends nothing: zeros
        args.append(mask)
        kw["is_causal"] = 1
    elif case == "float_past":
        args += [rnd(1, 1, s, s + 3, seed=3), rnd(b, h, 3, d, seed=4), rnd(b, h, 3, d, seed=5)]
        n_out = 3
    elif case == "3d_window":
        args = [x.transpose(0, 2, 1, 3).reshape(b, s, h * d) for x in (q, k, v)]
        kw.update(q_num_heads=h, kv_num_heads=h, left_window_size=1, scale=0.2)
    else:
        kw["qk_matmul_output_mode"] = 3
        n_out = 4
    ctx = SimpleNamespace(n_outputs=n_out)
    got, ref = both(attention.attention, *args, **kw, ctx=ctx)
    close(got, ref)
    assert (ran and ran[0] is not None) if n_out < 4 else not ran   # compiled, then numpy


# ------------------------------------------------------------------------------ GELU
def test_gelu_forms():
    x = rnd(3, 8, 20, scale=4)
    x[0, 0, :6] = [np.nan, np.inf, -np.inf, 1e30, -1e30, 0]
    bias = rnd(20, seed=1)
    for fn, args in ((activation.gelu, dict(approximate="none")),
                     (activation.gelu, dict(approximate="tanh")),
                     (contrib_transformer.ms_gelu, {}),
                     (contrib_transformer.fast_gelu, {})):
        got, ref = both(fn, x, **args)
        np.testing.assert_array_equal(np.isnan(got), np.isnan(ref))
        close(np.nan_to_num(got), np.nan_to_num(ref), atol=1e-6)
    close(*both(contrib_transformer.bias_gelu, x[1:], bias))
    close(*both(contrib_transformer.fast_gelu, x[1:], bias))
    close(*both(activation.gelu, np.zeros((0, 4), np.float32)))
    close(*both(activation.gelu, x.astype(np.float16)), rtol=1e-3, atol=1e-3)


@pytest.mark.parametrize("act", ["Gelu", "GeluTanh"])
def test_fused_matmul_gelu(act):
    a, w = rnd(2, 9, 16), rnd(16, 40, seed=1, scale=0.5)
    bias, z = rnd(40, seed=2), rnd(2, 9, 40, seed=3)
    close(*both(linalg.fused_matmul_epilogue, a, w, bias, z, activation=act))
    close(*both(linalg.fused_matmul_epilogue, a, w, None, rnd(9, 40), activation=act))
    close(*both(linalg.fused_matmul_epilogue, a, w, bias.reshape(1, 1, 1, 40), None,
                activation=act))


# ------------------------------------------------------------------------------ whole models
@pytest.mark.parametrize("name", ["bert", "gpt2"])
def test_tiny_transformer_models(name):
    pytest.importorskip("torch")
    ort = pytest.importorskip("onnxruntime")
    from tests.helpers import torch_models
    from workbench.backend import prepare

    model, example = torch_models.build(name)
    proto = torch_models.export_onnx(model, example, None, opset=17)
    inputs = list(torch_models.example_inputs(name, 2, seq=16))
    rep = prepare(proto)
    got = rep.run(inputs)[0]
    with compiled.disabled():
        ref = rep.run(inputs)[0]
    sess = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])
    want = sess.run(None, {i.name: a for i, a in zip(sess.get_inputs(), inputs)})[0]
    tol = 1e-5 * float(np.abs(want).max())
    np.testing.assert_allclose(got, ref, atol=tol, rtol=0)
    np.testing.assert_allclose(got, want, atol=tol, rtol=0)


def test_packed_parameters_table(monkeypatch):
    """The kernels' packed int64 parameters are made once per distinct set of values and
    reused; a full table is cleared, and calls after that still compute the right rows."""
    monkeypatch.setattr(rowwise, "_PACKED", {})
    monkeypatch.setattr(rowwise, "_PACKED_MAX", 3)
    g, b = rnd(16, seed=1), rnd(16, seed=2)
    for rows in (1, 2, 3, 5, 2, 7):
        x = rnd(rows, 16, seed=rows, scale=2)
        close(*both(norm.layer_norm, x, g, b, epsilon=1e-5, ctx=CTX1))
        with compiled.disabled():
            ref = linalg.fused_matmul_epilogue(x, np.eye(16, dtype=np.float32), b,
                                               activation="Gelu")
        close(rowwise.gelu(x, "Gelu", bias=b), ref, rtol=1e-5, atol=1e-6)
        assert len(rowwise._PACKED) <= 3
    key = next(iter(rowwise._PACKED))
    p = rowwise._packed(key)
    assert rowwise._packed(key) is p and p.dtype == np.int64 and tuple(p) == key
