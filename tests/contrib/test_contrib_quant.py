"""com.microsoft quantization kernels, one hand-built node at a time.

Two oracles, so the tests hold on every x86 CPU:

* onnxruntime, with the workbench in the integer arithmetic onnxruntime uses on this machine
  (``compare``: exact with VNNI, uint8 x int8 pairs saturated to int16 without; probed once,
  ``workbench.quantization.onnxruntime_arithmetic``). Requantized (8-bit) outputs may differ
  by one quantization step (``int_step=1``: the spec fixes the real-valued result, not
  onnxruntime's float32 rounding path); float outputs of integer products match to float32
  rounding.
* the specification: the workbench's default (exact) arithmetic against an independent exact
  computation in int64/float64 (``tests/contrib/_exact.py``; onnx.reference does not run these
  ops), or, for QAttention, onnxruntime's float Attention on the dequantized tensors.
"""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("onnxruntime")

from tests.contrib import _exact as X  # noqa: E402
from tests.contrib._single import (
    TensorProto,
    compare,
    f32,
    q8,
    run_ort,
    run_wb,
    scalar,
    single_node,  # noqa: E402
)
from workbench.errors import WorkbenchError  # noqa: E402

U8, I8 = TensorProto.UINT8, TensorProto.INT8
SAT = "saturating-u8s8"


def _rng(seed=0):
    return np.random.default_rng(seed)


@pytest.mark.parametrize("op", ["QLinearAdd", "QLinearMul"])
@pytest.mark.parametrize("dt", [np.uint8, np.int8])
@pytest.mark.parametrize("bshape", [(2, 3, 4), (4,), (1, 3, 1)])
def test_qlinear_binary(op, dt, bshape):
    r = _rng()
    zp = dt(128 if dt == np.uint8 else 3)
    m, feeds = single_node(op, [
        ("A", q8(r, (2, 3, 4), dt)), ("As", scalar(0.05)), ("Az", np.array(zp)),
        ("B", q8(r, bshape, dt)), ("Bs", scalar(0.03)), ("Bz", np.array(dt(7))),
        ("Cs", scalar(0.11 if op == "QLinearAdd" else 1.7)), ("Cz", np.array(zp))],
        out_types=[U8 if dt == np.uint8 else I8])
    compare(m, feeds, int_step=1)


def test_qlinear_add_without_output_zero_point():
    r = _rng(1)
    m, feeds = single_node("QLinearAdd", [
        ("A", q8(r, (5, 6))), ("As", scalar(0.02)), ("Az", np.array(np.uint8(100))),
        ("B", q8(r, (5, 6))), ("Bs", scalar(0.04)), ("Bz", np.array(np.uint8(90))),
        ("Cs", scalar(0.05))], out_types=[U8])
    compare(m, feeds, int_step=1)


@pytest.mark.parametrize("dt", [np.uint8, np.int8])
def test_qlinear_sigmoid_and_leaky_relu(dt):
    r = _rng(2)
    t = U8 if dt == np.uint8 else I8
    x = q8(r, (3, 50), dt)
    z = np.array(dt(120 if dt == np.uint8 else -5))
    m, feeds = single_node("QLinearSigmoid", [("X", x), ("Xs", scalar(0.07)), ("Xz", z),
                                              ("Ys", scalar(1 / 256)), ("Yz", np.array(dt(0)))],
                           out_types=[t])
    compare(m, feeds, int_step=1)
    m, feeds = single_node("QLinearLeakyRelu", [("X", x), ("Xs", scalar(0.07)), ("Xz", z),
                                                ("Ys", scalar(0.05)), ("Yz", z)],
                           {"alpha": 0.2}, out_types=[t])
    compare(m, feeds, int_step=1)


@pytest.mark.parametrize("opset,axis,shape", [(13, -1, (2, 3, 7)), (13, 1, (2, 3, 7)),
                                              (12, 1, (2, 3, 7))])
@pytest.mark.parametrize("dt", [np.uint8, np.int8])
def test_qlinear_softmax(opset, axis, shape, dt):
    r = _rng(3)
    t = U8 if dt == np.uint8 else I8
    yz = dt(0) if dt == np.uint8 else dt(-128)
    m, feeds = single_node("QLinearSoftmax", [
        ("X", q8(r, shape, dt)), ("Xs", scalar(0.05)),
        ("Xz", np.array(dt(128 if dt == np.uint8 else 0))), ("Ys", scalar(1 / 256)),
        ("Yz", np.array(yz))], {"axis": axis, "opset": opset}, out_types=[t],
        const=("Xs", "Xz", "Ys", "Yz"))
    compare(m, feeds, int_step=1)


def test_qlinear_softmax_saturated_row():
    """A huge input scale leaves one visible element per row: softmax 1.0 is 254.99998 steps of
    the float32 1/255, which rounds to 255 (ours); onnxruntime writes 254 - the known one-step
    difference the tool-model test for gpt2-static-qdq allows for."""
    x = np.array([[255, 0, 0, 0], [255, 255, 0, 0]], dtype=np.uint8)
    m, feeds = single_node("QLinearSoftmax", [
        ("X", x), ("Xs", scalar(1.3344406e36)), ("Xz", np.array(np.uint8(255))),
        ("Ys", scalar(np.float32(1 / 255))), ("Yz", np.array(np.uint8(0)))],
        {"axis": -1, "opset": 13}, out_types=[U8], const=("Xs", "Xz", "Ys", "Yz"))
    got = run_wb(m, feeds)[0]
    ref = run_ort(m, feeds)[0]
    step = float(np.float32(1 / 255))
    exact = np.rint(np.array([[1.0, 0, 0, 0], [0.5, 0.5, 0, 0]]) / step)
    np.testing.assert_array_equal(got, exact.astype(np.uint8))
    assert got[0, 0] == 255 and ref[0, 0] == 254  # the documented difference
    assert np.abs(got.astype(int) - ref.astype(int)).max() <= 1


@pytest.mark.parametrize("attrs", [
    {"kernel_shape": [2, 2], "strides": [2, 2]},
    {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1], "count_include_pad": 1},
    {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1], "count_include_pad": 0},
    {"kernel_shape": [3, 2], "strides": [2, 2], "ceil_mode": 1},
    {"kernel_shape": [2, 2], "auto_pad": "SAME_UPPER"},
])
@pytest.mark.parametrize("channels_last", [0, 1])
def test_qlinear_average_pool(attrs, channels_last):
    r = _rng(4)
    shape = (2, 7, 7, 3) if channels_last else (2, 3, 7, 7)
    m, feeds = single_node("QLinearAveragePool", [
        ("X", q8(r, shape)), ("Xs", scalar(0.1)), ("Xz", np.array(np.uint8(128))),
        ("Ys", scalar(0.05)), ("Yz", np.array(np.uint8(120)))],
        dict(attrs, channels_last=channels_last), out_types=[U8])
    compare(m, feeds, int_step=1)


@pytest.mark.parametrize("channels_last", [0, 1])
@pytest.mark.parametrize("dt", [np.uint8, np.int8])
def test_qlinear_global_average_pool(channels_last, dt):
    r = _rng(5)
    t = U8 if dt == np.uint8 else I8
    shape = (2, 5, 6, 4) if channels_last else (2, 4, 5, 6)
    m, feeds = single_node("QLinearGlobalAveragePool", [
        ("X", q8(r, shape, dt)), ("Xs", scalar(0.1)), ("Xz", np.array(dt(3))),
        ("Ys", scalar(0.02)), ("Yz", np.array(dt(1)))], {"channels_last": channels_last},
        out_types=[t])
    compare(m, feeds, int_step=1)


def test_qlinear_concat():
    r = _rng(6)
    ins = [("Ys", scalar(0.08)), ("Yz", np.array(np.uint8(128)))]
    for i, (c, s, z) in enumerate([(2, 0.05, 100), (3, 0.1, 128), (1, 0.2, 0)]):
        ins += [(f"X{i}", q8(r, (2, c, 4))), (f"S{i}", scalar(s)),
                (f"Z{i}", np.array(np.uint8(z)))]
    m, feeds = single_node("QLinearConcat", ins, {"axis": 1}, out_types=[U8],
                           const=tuple(n for n, _ in ins if not n.startswith("X")))
    compare(m, feeds, int_step=1)


def test_qlinear_where():
    r = _rng(7)
    m, feeds = single_node("QLinearWhere", [
        ("C", r.integers(0, 2, (3, 4)).astype(bool)), ("X", q8(r, (3, 4))),
        ("Xs", scalar(0.1)), ("Xz", np.array(np.uint8(128))), ("Y", q8(r, (4,))),
        ("Ys", scalar(0.3)), ("Yz", np.array(np.uint8(10))), ("Zs", scalar(0.2)),
        ("Zz", np.array(np.uint8(128)))], out_types=[U8],
        const=("Xs", "Xz", "Ys", "Yz", "Zs", "Zz"))
    compare(m, feeds, int_step=1)


@pytest.mark.parametrize("trans_a,trans_b", [(0, 0), (0, 1), (1, 0)])
@pytest.mark.parametrize("per_channel", [False, True])
@pytest.mark.parametrize("quantized_out", [True, False])
def test_qgemm(trans_a, trans_b, per_channel, quantized_out):
    r = _rng(8)
    mm, k, n = 3, 5, 4
    a = q8(r, (k, mm) if trans_a else (mm, k))
    b = q8(r, (n, k) if trans_b else (k, n), np.int8)
    bs = (r.random(n) * 0.05 + 0.01).astype(np.float32) if per_channel else scalar(0.03)
    bz = np.zeros(n, np.int8) if per_channel else np.array(np.int8(0))
    ins = [("A", a), ("As", scalar(0.05)), ("Az", np.array(np.uint8(128))), ("B", b),
           ("Bs", bs), ("Bz", bz), ("C", r.integers(-500, 500, n).astype(np.int32))]
    if quantized_out:
        ins += [("Ys", scalar(0.2)), ("Yz", np.array(np.uint8(128)))]
    m, feeds = single_node("QGemm", ins, {"transA": trans_a, "transB": trans_b, "alpha": 1.0},
                           out_types=[U8 if quantized_out else TensorProto.FLOAT],
                           const=("B", "Bs", "Bz", "C"))
    compare(m, feeds, int_step=1, rtol=1e-5, atol=1e-5)
    _check_exact(m, feeds, X.qgemm(dict(ins), trans_a, trans_b))
    _check_exact(m, feeds, X.qgemm(dict(ins), trans_a, trans_b, saturate=True),
                 arithmetic=SAT)


def _check_exact(model, feeds, expected, *, rtol=1e-5, atol=1e-5, int_step=1,
                 arithmetic="exact"):
    """The workbench's default (exact) arithmetic - or ``arithmetic`` - against the
    independent reference (quantized outputs within one step: float64 here vs the kernel's
    rounding path)."""
    got = run_wb(model, feeds, integer_arithmetic=arithmetic)
    expected = expected if isinstance(expected, list) else [expected]
    for g, e in zip(got, expected):
        e = np.asarray(e)
        if g.dtype.kind in "iu":
            assert np.abs(g.astype(np.int64) - e.astype(np.int64)).max() <= int_step
        else:
            np.testing.assert_allclose(g, e, rtol=rtol, atol=atol)


def test_qgemm_alpha_without_bias():
    r = _rng(9)
    ins = [("A", q8(r, (4, 6))), ("As", scalar(0.05)), ("Az", np.array(np.uint8(128))),
           ("B", q8(r, (6, 3))), ("Bs", scalar(0.04)), ("Bz", np.array(np.uint8(120))),
           ("C", None), ("Ys", scalar(0.3)), ("Yz", np.array(np.uint8(100)))]
    m, feeds = single_node("QGemm", ins, {"alpha": 0.5}, out_types=[U8],
                           const=("B", "Bs", "Bz"))
    compare(m, feeds, int_step=1)
    _check_exact(m, feeds, X.qgemm(dict(ins), 0, 0, alpha=0.5))


@pytest.mark.parametrize("per_column", [False, True])
@pytest.mark.parametrize("bias", [False, True])
def test_matmul_integer_to_float(per_column, bias):
    r = _rng(10)
    n = 6
    ins = [("A", q8(r, (2, 3, 5))), ("B", q8(r, (5, n), np.int8)), ("As", scalar(0.04)),
           ("Bs", (r.random(n) * 0.05 + 0.01).astype(np.float32) if per_column
            else scalar(0.02)),
           ("Az", np.array(np.uint8(128))),
           ("Bz", np.zeros(n, np.int8) if per_column else np.array(np.int8(0))),
           ("bias", f32(r, (n,)) if bias else None)]
    m, feeds = single_node("MatMulIntegerToFloat", ins, const=("B", "Bs", "Bz", "bias"))
    compare(m, feeds, rtol=1e-5, atol=1e-5)
    _check_exact(m, feeds, X.matmul_integer_to_float(dict(ins)))
    _check_exact(m, feeds, X.matmul_integer_to_float(dict(ins), saturate=True),
                 arithmetic=SAT)


@pytest.mark.parametrize("bdt", [np.uint8, np.int8])
@pytest.mark.parametrize("per_column", [False, True])
def test_dynamic_quantize_matmul(bdt, per_column):
    r = _rng(11)
    n = 7
    z0 = 3 if bdt == np.uint8 else 0
    zp = np.full(n, z0, bdt) if per_column else np.array(bdt(z0))
    ins = [("A", f32(r, (2, 4, 9))), ("B", q8(r, (9, n), bdt)),
           ("Bs", (r.random(n) * 0.05 + 0.01).astype(np.float32) if per_column
            else scalar(0.02)), ("Bz", zp), ("bias", f32(r, (n,)))]
    m, feeds = single_node("DynamicQuantizeMatMul", ins, const=("B", "Bs", "Bz", "bias"))
    compare(m, feeds, rtol=1e-5, atol=1e-5)
    _check_exact(m, feeds, X.dynamic_quantize_matmul(dict(ins)))
    _check_exact(m, feeds, X.dynamic_quantize_matmul(dict(ins), saturate=True),
                 arithmetic=SAT)


def _lstm_inputs(r, dirs, inp=4, hs=5, seq=6, batch=3, wdt=np.int8, per_col=False,
                 states=False, peephole=False, lens=None):
    w = q8(r, (dirs, inp, 4 * hs), wdt)
    rr = q8(r, (dirs, hs, 4 * hs), wdt)
    shp = (dirs, 4 * hs) if per_col else (dirs,)
    zero = 0 if wdt == np.int8 else 128
    return [("X", f32(r, (seq, batch, inp))), ("W", w), ("R", rr),
            ("B", f32(r, (dirs, 8 * hs), 0.1)), ("L", lens),
            ("H0", f32(r, (dirs, batch, hs), 0.5) if states else None),
            ("C0", f32(r, (dirs, batch, hs), 0.5) if states else None),
            ("P", f32(r, (dirs, 3 * hs), 0.1) if peephole else None),
            ("Ws", (r.random(shp) * 0.01 + 0.005).astype(np.float32)),
            ("Wz", np.full(shp, zero, wdt)),
            ("Rs", (r.random(shp) * 0.01 + 0.005).astype(np.float32)),
            ("Rz", np.full(shp, zero, wdt))]


@pytest.mark.parametrize("direction", ["forward", "reverse", "bidirectional"])
@pytest.mark.parametrize("per_col,states,wdt", [(False, False, np.int8),
                                                (True, True, np.int8),
                                                (False, True, np.uint8)])
def test_dynamic_quantize_lstm(direction, per_col, states, wdt):
    """The activations are quantized inside the recurrence (the whole X, then h at each step,
    as DynamicQuantizeLinear does). onnxruntime evaluates the gates in float32 with polynomial
    approximations of the logistic and tanh functions, the engine in float64: h differs by
    ~1e-7, which can flip one uint8 rounding of h; that moves a gate by at most one step of h
    (2/255, h is in [-1, 1]) times the largest |R| entry: the tolerance (``_lstm_tol``). (One
    such flip, amplified over 160 steps, is what a 3-layer speaker embedder shows.)"""
    r = _rng(12)
    dirs = 2 if direction == "bidirectional" else 1
    ins = _lstm_inputs(r, dirs, wdt=wdt, per_col=per_col, states=states)
    m, feeds = single_node("DynamicQuantizeLSTM", ins, {"direction": direction,
                                                         "hidden_size": 5}, outputs=3,
                           const=("W", "R", "B", "Ws", "Wz", "Rs", "Rz"))
    got, _ = compare(m, feeds, rtol=0, atol=_lstm_tol(ins))
    for sat in (False, True):
        _check_exact(m, feeds, X.dynamic_quantize_lstm(dict(ins), direction, 5, sat),
                     rtol=1e-9, atol=1e-6, arithmetic=SAT if sat else "exact")


@pytest.mark.parametrize("direction", ["forward", "bidirectional"])
def test_dynamic_quantize_lstm_sequence_lens_and_peepholes(direction):
    r = _rng(30)
    dirs = 2 if direction == "bidirectional" else 1
    ins = _lstm_inputs(r, dirs, states=True, peephole=True,
                       lens=np.array([6, 3, 5], np.int32))
    m, feeds = single_node("DynamicQuantizeLSTM", ins, {"direction": direction,
                                                         "hidden_size": 5}, outputs=3,
                           const=("W", "R", "B", "P", "Ws", "Wz", "Rs", "Rz"))
    got, _ = compare(m, feeds, rtol=0, atol=_lstm_tol(ins))
    assert not got[0][3:, :, 1].any()  # past its length, batch 1 writes zeros
    for sat in (False, True):
        _check_exact(m, feeds, X.dynamic_quantize_lstm(dict(ins), direction, 5, sat),
                     rtol=1e-9, atol=1e-6, arithmetic=SAT if sat else "exact")


def _lstm_tol(ins):
    d = dict(ins)
    r = (d["R"].astype(np.float64) - d["Rz"].astype(np.float64).reshape(d["R"].shape[0], 1, -1)
         ) * d["Rs"].astype(np.float64).reshape(d["R"].shape[0], 1, -1)
    return 2 / 255 * float(np.abs(r).max())


def _pack_nbits(q, bits):
    """uint8 values [N, nb, bs] -> bytes [N, nb, bs*bits/8], low bits first (the spec's
    layout), written independently of the kernel's unpacking."""
    per = 8 // bits
    n, nb, bs = q.shape
    q = q.reshape(n, nb, bs // per, per).astype(np.uint16)
    out = np.zeros((n, nb, bs // per), np.uint16)
    for i in range(per):
        out |= q[..., i] << (i * bits)
    return out.astype(np.uint8)


@pytest.mark.parametrize("k,n,bs", [(64, 8, 16), (40, 5, 16), (96, 12, 32), (128, 4, 128)])
@pytest.mark.parametrize("zero_points", ["none", "packed", "float"])
@pytest.mark.parametrize("bias", [False, True])
def test_matmul_nbits_4bit(k, n, bs, zero_points, bias):
    r = _rng(13)
    nb = -(-k // bs)
    q = r.integers(0, 16, (n, nb, bs)).astype(np.uint8)
    scales = (r.random((n, nb)) * 0.1 + 0.01).astype(np.float32)
    ins = [("A", f32(r, (2, 3, k))), ("B", _pack_nbits(q, 4)), ("S", scales.reshape(-1))]
    if zero_points == "packed":
        zq = r.integers(0, 16, (n, nb + (nb % 2))).astype(np.uint8)
        zb = (zq[:, 0::2] | (zq[:, 1::2] << 4)).astype(np.uint8)
        ins.append(("Z", zb.reshape(-1)))
    elif zero_points == "float":
        ins.append(("Z", (r.random((n, nb)) * 15).astype(np.float32).reshape(-1)))
    else:
        ins.append(("Z", None))
    ins += [("G", None), ("bias", f32(r, (n,)) if bias else None)]
    m, feeds = single_node("MatMulNBits", ins, {"K": k, "N": n, "bits": 4, "block_size": bs},
                           const=("B", "S", "Z", "bias"))
    compare(m, feeds, rtol=1e-4, atol=1e-4)


def test_matmul_nbits_8bit():
    r = _rng(14)
    k, n, bs = 48, 6, 16
    nb = k // bs
    q = r.integers(0, 256, (n, nb, bs)).astype(np.uint8)
    m, feeds = single_node("MatMulNBits", [
        ("A", f32(r, (5, k))), ("B", q), ("S", (r.random(n * nb) * 0.01).astype(np.float32))],
        {"K": k, "N": n, "bits": 8, "block_size": bs}, const=("B", "S"))
    compare(m, feeds, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("mask", [None, "1d", "2d"])
@pytest.mark.parametrize("unidirectional", [0, 1])
def test_qattention(mask, unidirectional):
    r = _rng(15)
    b, s, hid, heads = 2, 5, 8, 2
    mask_arr = None
    if mask == "1d":
        mask_arr = np.array([5, 3], np.int32)
    elif mask == "2d":
        mask_arr = np.array([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0]], np.int32)
    ins = [("X", q8(r, (b, s, hid))), ("W", q8(r, (hid, 3 * hid), np.int8)),
           ("bias", f32(r, (3 * hid,), 0.1)), ("Xs", scalar(0.02)), ("Ws", scalar(0.01)),
           ("M", mask_arr), ("Xz", np.array(np.uint8(128))), ("Wz", np.array(np.int8(0)))]
    attrs = {"num_heads": heads, "unidirectional": unidirectional}
    m, feeds = single_node("QAttention", ins, attrs, outputs=2,
                           const=("W", "bias", "Ws", "Wz"))
    compare(m, feeds, rtol=1e-4, atol=1e-5)
    _check_exact(m, feeds, _float_attention(ins, attrs), rtol=1e-4, atol=1e-5)


def _float_attention(ins, attrs):
    """The spec's QAttention: onnxruntime's float Attention on the dequantized input and
    weight (float products, no integer arithmetic involved)."""
    d = dict(ins)
    x = ((d["X"].astype(np.float64) - d["Xz"].astype(np.float64)) * d["Xs"]).astype(np.float32)
    w = ((d["W"].astype(np.float64) - d["Wz"].astype(np.float64)) * d["Ws"]).astype(np.float32)
    rest = [("M", d["M"])] + ([("past", d["past"])] if "past" in d else [])
    m, feeds = single_node("Attention", [("X", x), ("W", w), ("bias", d["bias"])] + rest,
                           attrs, outputs=2, const=("W", "bias"))
    return run_ort(m, feeds)


def test_qattention_with_past():
    r = _rng(16)
    b, s, hid, heads, past = 2, 3, 8, 2, 4
    ins = [("X", q8(r, (b, s, hid))), ("W", q8(r, (hid, 3 * hid), np.int8)),
           ("bias", f32(r, (3 * hid,), 0.1)), ("Xs", scalar(0.02)), ("Ws", scalar(0.01)),
           ("M", None), ("Xz", np.array(np.uint8(128))), ("Wz", np.array(np.int8(0))),
           ("past", f32(r, (2, b, heads, past, hid // heads)))]
    attrs = {"num_heads": heads, "unidirectional": 1}
    m, feeds = single_node("QAttention", ins, attrs, outputs=2,
                           const=("W", "bias", "Ws", "Wz"))
    compare(m, feeds, rtol=1e-4, atol=1e-5)
    _check_exact(m, feeds, _float_attention(ins, attrs), rtol=1e-4, atol=1e-5)


def test_bad_inputs_name_node_and_shapes():
    r = _rng(17)
    m, feeds = single_node("QLinearAdd", [
        ("A", q8(r, (2, 3))), ("As", scalar(0.1)), ("Az", np.array(np.uint8(1))),
        ("B", q8(r, (4,))), ("Bs", scalar(0.1)), ("Bz", np.array(np.uint8(1))),
        ("Cs", scalar(0.1)), ("Cz", np.array(np.uint8(1)))], out_types=[U8])
    with pytest.raises(WorkbenchError, match=r"the_QLinearAdd.*\(2, 3\).*\(4,\)"):
        run_wb(m, feeds, [2])
    m, feeds = single_node("QGemm", [
        ("A", q8(r, (2, 3))), ("As", scalar(0.1)), ("Az", np.array(np.uint8(1))),
        ("B", q8(r, (4, 5))), ("Bs", scalar(0.1)), ("Bz", np.array(np.uint8(1)))])
    with pytest.raises(WorkbenchError, match=r"the_QGemm.*do not multiply"):
        run_wb(m, feeds, [2])
    m, feeds = single_node("MatMulNBits", [
        ("A", f32(r, (2, 30))), ("B", np.zeros((4, 2, 8), np.uint8)),
        ("S", np.ones(8, np.float32))], {"K": 32, "N": 4, "bits": 4, "block_size": 16})
    with pytest.raises(WorkbenchError, match=r"the_MatMulNBits.*K is 32"):
        run_wb(m, feeds, [2])


@pytest.mark.parametrize("dt,per_axis", [(np.uint16, False), (np.int16, True),
                                         (np.int8, True), (np.uint8, False)])
def test_ms_quantize_dequantize_linear(dt, per_axis):
    r = _rng(31)
    x = f32(r, (2, 4, 3), 3.0)
    scale = (r.random(4) * 0.01 + 0.001).astype(np.float32) if per_axis else scalar(0.002)
    info = np.iinfo(dt)
    zp = (np.full(4, (info.max + info.min + 1) // 2 + 3, dt) if per_axis
          else np.array(dt((info.max + info.min + 1) // 2 + 3)))
    t = {np.uint16: TensorProto.UINT16, np.int16: TensorProto.INT16, np.int8: I8,
         np.uint8: U8}[dt]
    m, feeds = single_node("QuantizeLinear", [("x", x), ("s", scale), ("z", zp)], {"axis": 1},
                           out_types=[t], const=("s", "z"))
    q, _ = compare(m, feeds, int_step=1)
    m, feeds = single_node("DequantizeLinear", [("q", q[0]), ("s", scale), ("z", zp)],
                           {"axis": 1}, const=("s", "z"))
    compare(m, feeds, rtol=1e-6, atol=1e-7)
