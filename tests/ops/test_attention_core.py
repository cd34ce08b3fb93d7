"""The engine's one softmax (ops/_common.softmax) and one attention core (ops/attention.attend),
which Softmax/LogSoftmax, ai.onnx Attention, com.microsoft Attention / MultiHeadAttention /
GroupQueryAttention / QAttention and the fused attention all use."""

from __future__ import annotations

import numpy as np
import pytest

from workbench.errors import ShapeError
from workbench.ops import attention as attention_ops
from workbench.ops import contrib_transformer
from workbench.ops._common import softmax
from workbench.ops.attention import attend
from workbench.ops.registry import NodeContext, lookup


def _ref_softmax(x, axis=-1):
    x = x.astype(np.float64)
    e = np.exp(x - x.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)


def test_softmax_rows_axes_log_and_dtypes():
    x = np.random.default_rng(0).standard_normal((3, 4, 5)).astype(np.float32) * 4
    for axis in (0, 1, -1):
        np.testing.assert_allclose(softmax(np, x, axis), _ref_softmax(x, axis), rtol=1e-6)
        np.testing.assert_allclose(softmax(np, x, axis, log=True),
                                   np.log(_ref_softmax(x, axis)), rtol=1e-5, atol=1e-6)
    assert softmax(np, x.astype(np.float16)).dtype == np.float32      # half: in float32
    assert softmax(np, x, dtype=np.float64).dtype == np.float64
    assert softmax(np, x.astype(np.float16), dtype=np.float16).dtype == np.float16
    assert softmax(np, np.zeros((2, 0), np.float32)).shape == (2, 0)


def test_softmax_masked_rows_and_in_place():
    x = np.array([[0.0, 1.0, -np.inf], [-np.inf, -np.inf, -np.inf], [1.0, 1.0, 1.0]],
                 np.float32)
    plain = softmax(np, x)
    assert np.isnan(plain[1]).all()              # ONNX Softmax: an all -inf row is NaN
    zeroed = softmax(np, x, zero_empty_rows=True, dead=np.array([[False], [False], [True]]))
    assert (zeroed[1] == 0).all() and (zeroed[2] == 0).all()
    np.testing.assert_array_equal(zeroed[0], plain[0])
    own = x[[0, 2]].copy()
    out = softmax(np, own, overwrite=True)
    assert out is own and np.array_equal(out, plain[[0, 2]])
    kept = x.copy()
    softmax(np, kept)
    assert np.array_equal(kept, x, equal_nan=True)          # not overwritten unless asked


def _naive(q, k, v, scale, bias=None, blocked=None, fill=-1e30):
    group = q.shape[1] // k.shape[1]
    k = np.repeat(k, group, axis=1).astype(np.float64)
    v = np.repeat(v, group, axis=1).astype(np.float64)
    s = q.astype(np.float64) @ np.swapaxes(k, -1, -2) * scale
    if bias is not None:
        s = s + bias
    if blocked is not None:
        s = np.where(blocked, fill, s)
    return _ref_softmax(s) @ v


@pytest.mark.parametrize("hq,hkv", [(4, 4), (4, 2), (6, 1)])
@pytest.mark.parametrize("split", [False, True])
def test_attend_groups_heads_and_applies_masks_in_order(hq, hkv, split):
    rng = np.random.default_rng(hq * 10 + hkv)
    b, s, t, d = 2, 5, 7, 8
    q = rng.standard_normal((b, hq, s, d)).astype(np.float32)
    k = rng.standard_normal((b, hkv, t, d)).astype(np.float32)
    v = rng.standard_normal((b, hkv, t, 3)).astype(np.float32)
    bias = rng.standard_normal((s, t)).astype(np.float32)
    blocked = np.triu(np.ones((s, t), bool), 1)
    y, sc = attend(np, q, k, v, scale=0.3, split_scale=split, biases=[("bias", bias)],
                   blocked=blocked, keep_scores=True)
    assert y.shape == (b, hq, s, 3) and sc.probs.shape == (b, hq, s, t)
    np.testing.assert_allclose(y, _naive(q, k, v, 0.3, bias, blocked), rtol=2e-5, atol=2e-6)
    np.testing.assert_allclose(sc.raw * 1.0, _naive_scores(q, k, 0.3), rtol=2e-5, atol=2e-5)
    with pytest.raises(ShapeError, match=r"Op: bias of shape \(3,\) does not broadcast"):
        attend(np, q, k, v, scale=1.0, biases=[("bias", np.zeros(3, np.float32))], op="Op")


def _naive_scores(q, k, scale):
    group = q.shape[1] // k.shape[1]
    k = np.repeat(k, group, axis=1).astype(np.float64)
    return q.astype(np.float64) @ np.swapaxes(k, -1, -2) * scale


def test_attend_soft_cap_and_empty_rows():
    rng = np.random.default_rng(3)
    q, k, v = (rng.standard_normal((1, 2, 3, 4)).astype(np.float32) * 3 for _ in range(3))
    _, sc = attend(np, q, k, v, scale=1.0, softcap=2.0, keep_scores=True)
    np.testing.assert_allclose(sc.capped, 2.0 * np.tanh(sc.raw / 2.0), rtol=1e-6)
    bias = np.zeros((3, 3), np.float32)
    bias[1] = -np.inf
    y = attend(np, q, k, v, scale=1.0, biases=[("m", bias)], zero_empty_rows=True)
    assert (y[:, :, 1] == 0).all() and np.isfinite(y).all()


def test_the_attention_kernels_run_through_the_core(monkeypatch):
    """ai.onnx Attention, com.microsoft Attention / MultiHeadAttention / GroupQueryAttention
    and QAttention all call attend()."""
    calls = []

    def spy(*a, **k):
        calls.append(k.get("op", "Attention"))
        return attend(*a, **k)

    monkeypatch.setattr(attention_ops, "attend", spy)
    monkeypatch.setattr(contrib_transformer, "attend", spy)
    rng = np.random.default_rng(0)
    f32 = np.float32

    def run(op, dom, *args, n=1, **kw):
        e = lookup(op, dom, 24 if dom == "" else 1)
        return e.fn(*args, **kw, ctx=NodeContext("n", op, 1, n, (), False, None, {}))

    q4 = rng.standard_normal((1, 2, 3, 4)).astype(f32)
    run("Attention", "", q4, q4, q4, is_causal=0, qk_matmul_output_mode=0, softcap=0.0)
    x = rng.standard_normal((1, 3, 4)).astype(f32)
    w = rng.standard_normal((4, 12)).astype(f32)
    run("Attention", "com.microsoft", x, w, np.zeros(12, f32), num_heads=2)
    run("MultiHeadAttention", "com.microsoft", x, x, x, num_heads=2)
    run("GroupQueryAttention", "com.microsoft", x, x[..., :2], x[..., :2], None, None,
        np.array([2], np.int32), np.array([3], np.int32), num_heads=2, kv_num_heads=1)
    run("QAttention", "com.microsoft", x.astype(np.uint8), w.astype(np.int8),
        np.zeros(12, f32), np.array(0.1, f32), np.array(0.1, f32), num_heads=2)
    assert calls == ["Attention", "Attention", "MultiHeadAttention", "GroupQueryAttention",
                     "QAttention"]
