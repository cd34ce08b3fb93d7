"""Signal processing: DFT, STFT, Hann/Hamming/Blackman windows, MelWeightMatrix.

Complex values travel as a trailing dimension of size 2 (real, imaginary); real inputs have a
trailing dimension of size 1. Transforms run through the array module's FFT (``numpy.fft`` or
``cupy.fft``); float16/bfloat16 inputs are transformed in float32 and cast back.

DFT-17 takes ``axis`` as an attribute (default 1, the first axis after the batch axis); DFT-20
takes it as an optional scalar input (default -2, the last signal axis). Both count tensor axes
and refuse the trailing real/imaginary axis.
"""

from __future__ import annotations

import math

import numpy as np

from workbench.arrays import np_dtype_of_onnx, xp_of
from workbench.errors import InputError, ShapeError
from workbench.ops._common import scalar_of, work_dtype
from workbench.ops.registry import kernel


def _scalar_int(x, op, name):
    if x is None:
        return None
    return int(scalar_of(op, name, x) if hasattr(x, "size") else x)


def _scalar_float(x, op, name):
    return float(scalar_of(op, name, x) if hasattr(x, "size") else x)


def _to_complex(xp, x, op):
    """(..., 1|2) real/imag layout -> complex array (...); also says whether it was real."""
    if x.ndim < 1 or x.shape[-1] not in (1, 2):
        raise ShapeError(f"{op}: the last dimension of the input must be 1 (real) or 2 (complex: "
                         f"real, imaginary), got shape {x.shape}")
    w = x.astype(work_dtype(x.dtype))
    if x.shape[-1] == 1:
        return w[..., 0], True
    return w[..., 0] + 1j * w[..., 1], False


def _from_complex(xp, c, dtype):
    return xp.stack([c.real, c.imag], axis=-1).astype(dtype)


def _dft(x, dft_length, axis, inverse, onesided, op):
    xp = xp_of(x)
    r = x.ndim
    if not (-r <= axis <= -2 or 0 <= axis <= r - 2):
        raise ShapeError(f"{op}: axis {axis} is out of range for an input of rank {r} (accepted: "
                         f"[{-r}, -2] or [0, {r - 2}]; the last axis holds real/imaginary parts)")
    ax = axis % r
    c, is_real = _to_complex(xp, x, op)
    dim = c.shape[ax]
    n = _scalar_int(dft_length, op, "dft_length")
    if n is None:
        n = 2 * (dim - 1) if (inverse and onesided) else dim
    if n < 1:
        raise InputError(f"{op}: dft_length must be at least 1, got {n} (input shape {x.shape}, "
                         f"axis {ax})")
    if inverse and onesided:  # IRFFT: one-sided complex spectrum -> real signal of length n
        y = xp.fft.irfft(c, n=n, axis=ax)
        return y[..., None].astype(x.dtype)
    if inverse:
        y = xp.fft.ifft(c, n=n, axis=ax)
    elif onesided and is_real:
        y = xp.fft.rfft(c, n=n, axis=ax)
    else:
        y = xp.fft.fft(c, n=n, axis=ax)
        if onesided:
            y = xp.take(y, xp.arange(n // 2 + 1), axis=ax)
    return _from_complex(xp, y, x.dtype)


@kernel("DFT", since=17)
def dft_17(input, dft_length=None, *, axis, inverse, onesided):
    """DFT-17: axis attribute."""
    return _dft(input, dft_length, axis, inverse, onesided, "DFT")


@kernel("DFT", since=20)
def dft(input, dft_length=None, axis=None, *, inverse, onesided):
    """DFT-20: axis as an optional input (default -2)."""
    ax = _scalar_int(axis, "DFT", "axis")
    return _dft(input, dft_length, -2 if ax is None else ax, inverse, onesided, "DFT")


@kernel("STFT", since=17)
def stft(signal, frame_step, window=None, frame_length=None, *, onesided):
    """Short-time Fourier transform: output (batch, frames, bins, 2)."""
    xp = xp_of(signal)
    if signal.ndim != 3:
        raise ShapeError(f"STFT: signal must have rank 3 (batch, length, 1|2), got shape "
                         f"{signal.shape}")
    c, is_real = _to_complex(xp, signal, "STFT")
    length = c.shape[1]
    step = _scalar_int(frame_step, "STFT", "frame_step")
    fl = _scalar_int(frame_length, "STFT", "frame_length")
    if window is not None:
        if window.ndim != 1:
            raise ShapeError(f"STFT: window must be 1-D, got shape {window.shape}")
        if fl is None:
            fl = window.shape[0]
        elif window.shape[0] != fl:
            raise ShapeError(f"STFT: window length {window.shape[0]} differs from frame_length "
                             f"{fl}")
    if fl is None:
        fl = length
    if step is None or step < 1 or fl < 1:
        raise InputError(f"STFT: frame_step and frame_length must be positive, got {step} and "
                         f"{fl}")
    if onesided and not is_real:
        raise InputError("STFT: onesided=1 needs a real signal (last dimension 1); set "
                         "onesided=0 for a complex signal")
    frames = max((length - fl) // step + 1, 0) if length >= fl else 0
    idx = xp.arange(frames, dtype=np.int64)[:, None] * step + xp.arange(fl, dtype=np.int64)
    seg = c[:, idx]  # (batch, frames, fl)
    if window is not None:
        seg = seg * window.astype(c.real.dtype)
    if onesided:
        y = xp.fft.rfft(seg, n=fl, axis=2)
    else:
        y = xp.fft.fft(seg, n=fl, axis=2)
    return _from_complex(xp, y, signal.dtype)


# --------------------------------------------------------------------------------------------
# windows


def _window(size, periodic, output_datatype, terms, op):
    """Generalised cosine window sum_k a_k cos(2 pi k n / N) (signs alternate in ``terms``)."""
    xp = xp_of(size)
    n = _scalar_int(size, op, "size")
    if n < 0:
        raise InputError(f"{op}: size must be non-negative, got {n}")
    dtype = np_dtype_of_onnx(output_datatype)
    denom = n if periodic else n - 1
    if denom <= 0:
        return xp.ones((n,), dtype=np.float64).astype(dtype)
    k = xp.arange(n, dtype=np.float64)
    w = xp.zeros((n,), dtype=np.float64)
    for order, a in enumerate(terms):
        w = w + a * xp.cos(2.0 * math.pi * order * k / denom)
    return w.astype(dtype)


@kernel("HannWindow", since=17)
def hann_window(size, *, output_datatype, periodic):
    """Hann window 0.5 - 0.5 cos(2 pi n / N)."""
    return _window(size, periodic, output_datatype, (0.5, -0.5), "HannWindow")


@kernel("HammingWindow", since=17)
def hamming_window(size, *, output_datatype, periodic):
    """Hamming window 25/46 - 21/46 cos(2 pi n / N)."""
    return _window(size, periodic, output_datatype, (25.0 / 46.0, -21.0 / 46.0),
                   "HammingWindow")


@kernel("BlackmanWindow", since=17)
def blackman_window(size, *, output_datatype, periodic):
    """Blackman window 0.42 - 0.5 cos(2 pi n / N) + 0.08 cos(4 pi n / N)."""
    return _window(size, periodic, output_datatype, (0.42, -0.5, 0.08), "BlackmanWindow")


# --------------------------------------------------------------------------------------------
# MelWeightMatrix


@kernel("MelWeightMatrix", since=17)
def mel_weight_matrix(num_mel_bins, dft_length, sample_rate, lower_edge_hertz,
                      upper_edge_hertz, *, output_datatype):
    """Triangular mel filter bank of shape (dft_length // 2 + 1, num_mel_bins).

    The num_mel_bins + 2 band edges are evenly spaced on the mel scale
    ``mel(f) = 2595 log10(1 + f / 700)`` from lower_edge_hertz in steps of
    ``(mel(upper) - mel(lower)) / (num_mel_bins + 2)`` (as ONNX Runtime and the ONNX reference
    do, so the top edge falls one step below upper_edge_hertz) and mapped to
    spectrogram bins ``floor((dft_length + 1) * f / sample_rate)``; filter ``i`` rises linearly
    from edge ``i`` to a peak of 1 at edge ``i + 1`` and falls back to 0 at edge ``i + 2``.
    """
    xp = xp_of(num_mel_bins, dft_length, sample_rate)
    op = "MelWeightMatrix"
    mels = _scalar_int(num_mel_bins, op, "num_mel_bins")
    n_fft = _scalar_int(dft_length, op, "dft_length")
    rate = _scalar_int(sample_rate, op, "sample_rate")
    lo = _scalar_float(lower_edge_hertz, op, "lower_edge_hertz")
    hi = _scalar_float(upper_edge_hertz, op, "upper_edge_hertz")
    if mels < 0 or n_fft < 1 or rate <= 0:
        raise InputError(f"{op}: need num_mel_bins >= 0, dft_length >= 1 and sample_rate > 0, "
                         f"got {mels}, {n_fft}, {rate}")
    if not 0 <= lo <= hi:
        raise InputError(f"{op}: need 0 <= lower_edge_hertz <= upper_edge_hertz, got {lo} and "
                         f"{hi}")
    bins = n_fft // 2 + 1
    mel_lo = 2595.0 * math.log10(1.0 + lo / 700.0)
    mel_hi = 2595.0 * math.log10(1.0 + hi / 700.0)
    # (mels + 2) intervals, as the reference implementations do: the last edge stops one
    # step short of upper_edge_hertz
    step = (mel_hi - mel_lo) / (mels + 2)
    edges_mel = xp.arange(mels + 2, dtype=np.float64) * step + mel_lo
    edges_hz = 700.0 * (10.0 ** (edges_mel / 2595.0) - 1.0)
    edges = xp.floor((n_fft + 1) * edges_hz / rate).astype(np.int64)
    left = edges[:-2][None, :].astype(np.float64)
    center = edges[1:-1][None, :].astype(np.float64)
    right = edges[2:][None, :].astype(np.float64)
    j = xp.arange(bins, dtype=np.float64)[:, None]
    rise_w = xp.maximum(center - left, 1.0)
    rising = xp.where(center > left, (j - left) / rise_w, 1.0)
    rising = xp.where((j >= left) & (j <= center), rising, 0.0)
    fall_w = xp.maximum(right - center, 1.0)
    falling = xp.where((j >= center) & (j < right), (right - j) / fall_w, 0.0)
    out = xp.where((j >= center) & (j < right), falling, rising)
    return out.astype(np_dtype_of_onnx(output_datatype))
