"""DFT / STFT / window / MelWeightMatrix kernels against numpy.fft and loops written here."""

from __future__ import annotations

import math

import numpy as np
import pytest
from onnx import TensorProto

from workbench.errors import InputError, ShapeError
from workbench.ops.registry import attribute_defaults, lookup

RNG = np.random.default_rng(0)


def run(op, *inputs, opset=20, **attrs):
    entry = lookup(op, "", opset)
    kw = dict(attribute_defaults(op, "", opset))
    kw.update(attrs)
    return entry.fn(*inputs, **kw)


def as_complex(x):
    return x[..., 0] + 1j * x[..., 1] if x.shape[-1] == 2 else x[..., 0]


def naive_dft(c, axis, n, inverse):
    """Direct O(n^2) DFT of a complex array along ``axis`` (zero-padded / truncated to n)."""
    c = np.moveaxis(c, axis, -1)
    m = c.shape[-1]
    if m < n:
        c = np.concatenate([c, np.zeros(c.shape[:-1] + (n - m,))], -1)
    c = c[..., :n]
    sign = 1 if inverse else -1
    k = np.arange(n)
    w = np.exp(sign * 2j * np.pi * np.outer(k, k) / n)
    y = c @ w.T
    if inverse:
        y = y / n
    return np.moveaxis(y, -1, axis)


@pytest.mark.parametrize("axis", [1, 2, -2, -3])
@pytest.mark.parametrize("n", [None, 5, 12])
def test_dft_forward_real_and_complex(axis, n):
    x = RNG.standard_normal((2, 7, 8, 1)).astype(np.float32)
    y = run("DFT", x, None if n is None else np.array(n, np.int64), np.array(axis, np.int64))
    length = n or x.shape[axis]
    exp = naive_dft(as_complex(x.astype(np.float64)), axis % 4, length, False)
    assert y.dtype == np.float32 and y.shape[-1] == 2
    np.testing.assert_allclose(as_complex(y), exp, rtol=1e-4, atol=1e-4)
    xc = RNG.standard_normal((2, 7, 8, 2))
    yc = run("DFT", xc, None, np.array(axis, np.int64), inverse=1)
    np.testing.assert_allclose(as_complex(yc), naive_dft(as_complex(xc), axis % 4,
                                                         xc.shape[axis], True), atol=1e-12)


def test_dft_onesided_roundtrip_and_opset17():
    x = RNG.standard_normal((3, 10, 1))
    spec = run("DFT", x, None, np.array(1, np.int64), onesided=1)
    assert spec.shape == (3, 6, 2)
    np.testing.assert_allclose(as_complex(spec), np.fft.rfft(x[..., 0], axis=1), atol=1e-12)
    back = run("DFT", spec, None, np.array(1, np.int64), inverse=1, onesided=1)
    assert back.shape == (3, 10, 1)
    np.testing.assert_allclose(back, x, atol=1e-12)
    # onesided forward of a complex input keeps the first n//2 + 1 bins of the full DFT
    xc = RNG.standard_normal((3, 9, 2))
    one = run("DFT", xc, None, np.array(-2, np.int64), onesided=1)
    np.testing.assert_allclose(as_complex(one), np.fft.fft(as_complex(xc), axis=1)[:, :5],
                               atol=1e-12)
    # DFT-17: axis attribute (default 1); DFT-20: axis input (default -2)
    x4 = RNG.standard_normal((2, 4, 5, 1))
    y17 = run("DFT", x4, opset=17)
    np.testing.assert_allclose(as_complex(y17), np.fft.fft(x4[..., 0], axis=1), atol=1e-12)
    y20 = run("DFT", x4, opset=20)
    np.testing.assert_allclose(as_complex(y20), np.fft.fft(x4[..., 0], axis=2), atol=1e-12)


def test_dft_dtypes_and_errors():
    x = RNG.standard_normal((2, 8, 1)).astype(np.float16)
    y = run("DFT", x, None, np.array(1, np.int64))
    assert y.dtype == np.float16
    assert run("DFT", np.zeros((0, 4, 1), np.float32)).shape == (0, 4, 2)
    with pytest.raises(ShapeError, match="axis"):
        run("DFT", x, None, np.array(2, np.int64))
    with pytest.raises(ShapeError, match="last dimension"):
        run("DFT", np.zeros((2, 4, 3), np.float32))


def naive_stft(sig, step, window, fl, onesided):
    c = as_complex(sig)
    frames = (c.shape[1] - fl) // step + 1
    bins = fl // 2 + 1 if onesided else fl
    out = np.zeros((c.shape[0], frames, bins), complex)
    for f in range(frames):
        seg = c[:, f * step:f * step + fl]
        if window is not None:
            seg = seg * window
        out[:, f] = naive_dft(seg, 1, fl, False)[:, :bins]
    return out


@pytest.mark.parametrize("onesided", [0, 1])
@pytest.mark.parametrize("use_window", [False, True])
def test_stft(onesided, use_window):
    sig = RNG.standard_normal((2, 50, 1)).astype(np.float32)
    win = np.hanning(12).astype(np.float32) if use_window else None
    fl = None if use_window else np.array(12, np.int64)
    y = run("STFT", sig, np.array(5, np.int64), win, fl, opset=17, onesided=onesided)
    exp = naive_stft(sig.astype(np.float64), 5, win, 12, onesided)
    assert y.shape == exp.shape + (2,) and y.dtype == np.float32
    np.testing.assert_allclose(as_complex(y), exp, rtol=1e-4, atol=1e-4)


def test_stft_complex_and_errors():
    sig = RNG.standard_normal((1, 20, 2))
    y = run("STFT", sig, np.array(4, np.int64), None, np.array(8, np.int64), opset=17,
            onesided=0)
    np.testing.assert_allclose(as_complex(y), naive_stft(sig, 4, None, 8, 0), atol=1e-12)
    with pytest.raises(InputError, match="onesided"):
        run("STFT", sig, np.array(4, np.int64), None, np.array(8, np.int64), opset=17)
    with pytest.raises(ShapeError, match="window length"):
        run("STFT", sig, np.array(4, np.int64), np.ones(5), np.array(8, np.int64), opset=17,
            onesided=0)
    short = run("STFT", np.zeros((1, 4, 1)), np.array(1, np.int64), None,
                np.array(8, np.int64), opset=17)
    assert short.shape == (1, 0, 5, 2)


@pytest.mark.parametrize("op,np_fn", [("HannWindow", np.hanning), ("HammingWindow", None),
                                      ("BlackmanWindow", np.blackman)])
@pytest.mark.parametrize("size", [0, 1, 2, 10, 11])
def test_windows(op, np_fn, size):
    def expected(n):  # symmetric window of length n
        if np_fn is not None:
            return np_fn(n)
        if n == 1:
            return np.ones(1)
        k = np.arange(n)
        return 25 / 46 - 21 / 46 * np.cos(2 * np.pi * k / (n - 1))

    sym = run(op, np.array(size, np.int32), opset=17, periodic=0)
    assert sym.dtype == np.float32 and sym.shape == (size,)
    np.testing.assert_allclose(sym, expected(size), atol=1e-6)
    per = run(op, np.array(size, np.int64), opset=17, output_datatype=TensorProto.DOUBLE)
    assert per.dtype == np.float64
    # periodic: the first `size` points of the symmetric window of length size + 1
    np.testing.assert_allclose(per, expected(size + 1)[:size], atol=1e-12)


def naive_mel(mels, n_fft, rate, lo, hi):
    def mel(f):
        return 2595 * math.log10(1 + f / 700)

    step = (mel(hi) - mel(lo)) / (mels + 2)
    edges = [int((n_fft + 1) * 700 * (10 ** ((mel(lo) + i * step) / 2595) - 1) // rate)
             for i in range(mels + 2)]
    out = np.zeros((n_fft // 2 + 1, mels))
    for m in range(mels):
        left, center, right = edges[m:m + 3]
        for j in range(out.shape[0]):
            if center <= j < right:
                out[j, m] = (right - j) / (right - center)
            elif left <= j <= center:
                out[j, m] = 1.0 if center == left else (j - left) / (center - left)
    return out


@pytest.mark.parametrize("args", [(8, 16, 8192, 0.0, 4096.0), (10, 64, 16000, 20.0, 7600.0),
                                  (4, 512, 22050, 300.0, 3000.0)])
def test_mel_weight_matrix(args):
    mels, n_fft, rate, lo, hi = args
    y = run("MelWeightMatrix", np.array(mels, np.int32), np.array(n_fft, np.int32),
            np.array(rate, np.int32), np.array(lo, np.float32), np.array(hi, np.float32),
            opset=17)
    assert y.shape == (n_fft // 2 + 1, mels) and y.dtype == np.float32
    np.testing.assert_allclose(y, naive_mel(*args), atol=1e-6)
    assert y.max() == 1.0
