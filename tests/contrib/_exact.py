"""Independent references for the com.microsoft integer-product ops, in int64 and float64
numpy, written from the ContribOperators specification (onnx.reference does not run these
ops): what the engine must compute in its default (exact) arithmetic on any CPU, whatever
onnxruntime computes on the machine at hand - and, with ``saturate=True``, what onnxruntime
computes on x86 CPUs without VNNI (uint8 x int8 products added in adjacent pairs along the
reduction, each pair sum clipped to int16, the zero points taken out exactly afterwards), so
the emulation is checked on every CPU, not only against the onnxruntime at hand."""

from __future__ import annotations

import numpy as np


def int_product(a, a_zp, b, b_zp, saturate=False) -> np.ndarray:
    """(a - a_zp) @ (b - b_zp) in int64; b_zp scalar or per column. ``saturate``: onnxruntime's
    arithmetic without VNNI when a is uint8 and b int8 (other types are exact there too)."""
    az = 0 if a_zp is None else np.asarray(a_zp, np.int64)
    bz = 0 if b_zp is None else np.asarray(b_zp, np.int64).reshape(-1)
    if saturate and a.dtype == np.uint8 and b.dtype == np.int8:
        return pair_saturated(a, b) - az * b.astype(np.int64).sum(0) - \
            a.astype(np.int64).sum(-1, keepdims=True) * bz + a.shape[-1] * az * bz
    return (a.astype(np.int64) - az) @ (b.astype(np.int64) - bz)


def pair_saturated(a, b) -> np.ndarray:
    """sum over k of clip(a[..., 2k] b[2k] + a[..., 2k+1] b[2k+1], -32768, 32767), int64, for
    a (..., K) and b (K, N); an odd K's last product stands alone."""
    a = a.astype(np.int64)
    b = b.astype(np.int64)
    out = np.zeros(a.shape[:-1] + (b.shape[1],), np.int64)
    for k in range(0, a.shape[-1], 2):
        pair = a[..., k, None] * b[k]
        if k + 1 < a.shape[-1]:
            pair = pair + a[..., k + 1, None] * b[k + 1]
        out += np.clip(pair, -32768, 32767)
    return out


def requantize(real, scale, zp, dtype) -> np.ndarray:
    info = np.iinfo(dtype)
    q = np.rint(real / float(scale)) + (0 if zp is None else int(zp))
    return np.clip(q, info.min, info.max).astype(dtype)


def dynamic_u8(x):
    """DynamicQuantizeLinear's (q, scale, zero point) in float32, as the ONNX spec states."""
    x = x.astype(np.float32)
    lo, hi = min(float(x.min()), 0.0), max(float(x.max()), 0.0)
    scale = np.float32((np.float32(hi) - np.float32(lo)) / np.float32(255))
    if scale == 0:
        return np.zeros(x.shape, np.uint8), np.float32(0), 0
    zp = int(np.clip(np.rint(np.float32(0) - np.float32(lo) / scale), 0, 255))
    q = np.clip(np.rint(x / scale) + zp, 0, 255).astype(np.uint8)
    return q, scale, zp


def qgemm(d, trans_a, trans_b, alpha=1.0, saturate=False):
    a = d["A"].T if trans_a else d["A"]
    b = d["B"].T if trans_b else d["B"]
    scale = float(d["As"]) * np.asarray(d["Bs"], np.float64)
    y = int_product(a, d["Az"], b, d["Bz"], saturate) * alpha * scale
    if d.get("C") is not None:
        y = y + d["C"].astype(np.float64) * scale
    if d.get("Ys") is None:
        return y
    return requantize(y, d["Ys"], d["Yz"], d["Yz"].dtype)


def matmul_integer_to_float(d, saturate=False):
    y = int_product(d["A"], d["Az"], d["B"], d["Bz"], saturate) * (
        float(d["As"]) * np.asarray(d["Bs"], np.float64))
    return y if d.get("bias") is None else y + d["bias"]


def dynamic_quantize_matmul(d, saturate=False):
    q, s, z = dynamic_u8(d["A"])
    y = int_product(q, z, d["B"], d["Bz"], saturate) * (
        float(s) * np.asarray(d["Bs"], np.float64))
    return y if d.get("bias") is None else y + d["bias"]


def _sigmoid(v):
    return 1 / (1 + np.exp(-v))


def dynamic_quantize_lstm(d, direction, hs, saturate=False):
    """Y, Y_h, Y_c of DynamicQuantizeLSTM (default activations, no clip): X quantized to
    uint8 once (the steps up to the longest sequence), the hidden state at every step; a
    reverse direction runs each row reversed within its length; rows past their length keep
    their state and feed zeros to the next step's quantized product."""
    x = d["X"]
    seq, batch, _ = x.shape
    dirs = 2 if direction == "bidirectional" else 1
    lens = np.full(batch, seq) if d.get("L") is None else d["L"].astype(np.int64)
    steps = int(lens.max())
    y = np.zeros((seq, dirs, batch, hs))
    yh = np.zeros((dirs, batch, hs))
    yc = np.zeros((dirs, batch, hs))
    revs = {"forward": [False], "reverse": [True], "bidirectional": [False, True]}[direction]

    def weights(name, k):
        zp = d[f"{name}z"].reshape(dirs, -1)[k]
        sc = d[f"{name}s"].reshape(dirs, -1)[k].astype(np.float64)
        return d[name][k], zp, sc

    def qmm(v, w):
        q, s, z = dynamic_u8(v)
        mat, zp, sc = w
        return int_product(q, z, mat, zp, saturate) * (float(s) * sc)

    for k, rev in enumerate(revs):
        times = np.array([[lens[b] - 1 - t if rev and t < lens[b] else t for b in range(batch)]
                          for t in range(seq)])
        xs = x[times, np.arange(batch)[None, :]]
        gx = qmm(xs[:steps].reshape(steps * batch, -1), weights("W", k)).reshape(steps, batch,
                                                                                  -1)
        bias = d["B"][k, :4 * hs] + d["B"][k, 4 * hs:] if d.get("B") is not None else 0
        h = np.zeros((batch, hs)) if d.get("H0") is None else d["H0"][k].astype(np.float64)
        c = np.zeros((batch, hs)) if d.get("C0") is None else d["C0"][k].astype(np.float64)
        p = d.get("P")
        h_in = h
        for t in range(steps):
            g = gx[t] + bias + qmm(h_in, weights("R", k))
            gi, go, gf, gc = np.split(g, 4, axis=1)
            if p is not None:
                gi = gi + p[k, :hs] * c
                gf = gf + p[k, 2 * hs:] * c
            c_new = _sigmoid(gf) * c + _sigmoid(gi) * np.tanh(gc)
            if p is not None:
                go = go + p[k, hs:2 * hs] * c_new
            h_new = _sigmoid(go) * np.tanh(c_new)
            alive = (t < lens)[:, None]
            h, c = np.where(alive, h_new, h), np.where(alive, c_new, c)
            h_in = np.where(alive, h_new, 0.0)
            y[times[t], k, np.arange(batch)] = h_in
        yh[k], yc[k] = h, c
    return [y, yh, yc]
