"""com.microsoft quantization kernels: what onnxruntime's quantizer (QOperator format and
dynamic quantization), its graph optimizer (saved optimized models) and its 4-bit weight
quantizer write.

Implemented from onnxruntime's published ContribOperators specification:

* QLinearAdd, QLinearMul, QLinearSigmoid, QLinearLeakyRelu, QLinearSoftmax, QLinearAveragePool,
  QLinearGlobalAveragePool, QLinearConcat, QLinearWhere: ``y = quantize(f(dequantize(x...)))``
  with the per-tensor scales and zero points of the inputs and the output. Quantization rounds
  half to even and saturates to the zero point's integer type (uint8 or int8).
* QGemm: ``(A - a_zp) @ (B - b_zp)`` computed exactly (float64 through BLAS holds every 8-bit
  product sum), scaled by ``alpha * a_scale * b_scale`` (b per tensor or per output column),
  plus the int32 bias C (in the same scale); requantized with y_scale/y_zp, or float output
  when y_scale is absent.
* MatMulIntegerToFloat, DynamicQuantizeMatMul: integer matrix products with float output; the
  dynamic one quantizes A to uint8 as DynamicQuantizeLinear does.
* DynamicQuantizeLSTM: an LSTM whose W [dirs, input, 4H] and R [dirs, H, 4H] are int8/uint8
  with per-direction or per-output-column scales/zero points; the activations (the whole input
  X, the hidden state at each step) are quantized dynamically to uint8 before each product,
  like DynamicQuantizeMatMul.
* QAttention: Attention on uint8/int8 input and weights (dequantized), float output.
* MatMulNBits: blocked n-bit (2..8) weights packed along K, dequantized and multiplied.
"""

from __future__ import annotations

import numpy as np

from workbench.arrays import xp_of
from workbench.errors import InputError, ShapeError
from workbench.ops._integer import (
    IntegerArithmetic,
    arithmetic_of,
    saturated_product,
    saturates,
)
from workbench.ops.registry import kernel, lookup

EXACT = IntegerArithmetic.EXACT

MS = "com.microsoft"


# ---------------------------------------------------------------------------------- helpers
def _scalar_param(op, name, p):
    if p is None:
        return None
    if p.size != 1:
        raise ShapeError(f"{op}: {name} must be a scalar (per-tensor), got shape "
                         f"{tuple(p.shape)}")
    return p.reshape(())


def _deq(op, x, scale, zp, name="X"):
    """Per-tensor dequantization to float64."""
    s = _scalar_param(op, f"{name}_scale", scale)
    z = _scalar_param(op, f"{name}_zero_point", zp)
    if x.dtype.kind not in "iu":
        raise InputError(f"{op}: {name} must be an 8-bit integer tensor, got {x.dtype}")
    v = x.astype(np.float64)
    if z is not None:
        v = v - z.astype(np.float64)
    return v * s.astype(np.float64)


def _quant(op, real, scale, zp, default_dtype=np.uint8):
    """Per-tensor quantization of a float array: round half to even, add the zero point,
    saturate to the zero point's type (``default_dtype`` when the zero point is omitted)."""
    xp = xp_of(real)
    s = _scalar_param(op, "Y_scale", scale)
    z = _scalar_param(op, "Y_zero_point", zp)
    dt = np.dtype(default_dtype if z is None else z.dtype)
    if dt.kind not in "iu":
        raise InputError(f"{op}: output zero point must be an integer tensor, got {dt}")
    q = xp.rint(xp.asarray(real, dtype=np.float64) / float(s.astype(np.float64)))
    if z is not None:
        q = q + float(z)
    info = np.iinfo(dt)
    return xp.asarray(xp.clip(q, info.min, info.max)).astype(dt)


def _requant_dtype(zp, like):
    return like.dtype if zp is None else zp.dtype


def _dynamic_u8(x):
    """(q uint8, scale, zero_point) as DynamicQuantizeLinear computes them."""
    fn = lookup("DynamicQuantizeLinear", "", 11).fn
    q, s, z = fn(x.astype(np.float32))
    return q, float(s), float(z)


# ---------------------------------------------------------------------------------- binary
def _qlinear_binary(op, fn, A, A_scale, A_zp, B, B_scale, B_zp, C_scale, C_zp):
    a = _deq(op, A, A_scale, A_zp, "A")
    b = _deq(op, B, B_scale, B_zp, "B")
    try:
        r = fn(a, b)
    except ValueError:
        raise ShapeError(f"{op}: A {tuple(A.shape)} and B {tuple(B.shape)} do not "
                         f"broadcast") from None
    return _quant(op, r, C_scale, C_zp, _requant_dtype(C_zp, A))


@kernel("QLinearAdd", since=1, domain=MS)
def qlinear_add(A, A_scale, A_zero_point, B, B_scale, B_zero_point, C_scale, C_zero_point=None):
    return _qlinear_binary("QLinearAdd", lambda a, b: a + b, A, A_scale, A_zero_point, B,
                           B_scale, B_zero_point, C_scale, C_zero_point)


@kernel("QLinearMul", since=1, domain=MS)
def qlinear_mul(A, A_scale, A_zero_point, B, B_scale, B_zero_point, C_scale, C_zero_point=None):
    return _qlinear_binary("QLinearMul", lambda a, b: a * b, A, A_scale, A_zero_point, B,
                           B_scale, B_zero_point, C_scale, C_zero_point)


@kernel("QLinearWhere", since=1, domain=MS)
def qlinear_where(condition, X, x_scale, x_zero_point, Y, y_scale, y_zero_point, z_scale,
                  z_zero_point):
    op = "QLinearWhere"
    xp = xp_of(X, Y)
    x = _deq(op, X, x_scale, x_zero_point, "X")
    y = _deq(op, Y, y_scale, y_zero_point, "Y")
    try:
        r = xp.where(condition.astype(bool), x, y)
    except ValueError:
        raise ShapeError(f"{op}: condition {tuple(condition.shape)}, X {tuple(X.shape)} and "
                         f"Y {tuple(Y.shape)} do not broadcast") from None
    return _quant(op, r, z_scale, z_zero_point, X.dtype)


# ---------------------------------------------------------------------------------- unary
def _qlinear_unary(op, fn, X, X_scale, X_zp, Y_scale, Y_zp):
    return _quant(op, fn(_deq(op, X, X_scale, X_zp)), Y_scale, Y_zp, _requant_dtype(Y_zp, X))


@kernel("QLinearSigmoid", since=1, domain=MS)
def qlinear_sigmoid(X, X_scale, X_zero_point, Y_scale, Y_zero_point=None):
    xp = xp_of(X)
    return _qlinear_unary("QLinearSigmoid", lambda v: 1.0 / (1.0 + xp.exp(-v)), X, X_scale,
                          X_zero_point, Y_scale, Y_zero_point)


@kernel("QLinearLeakyRelu", since=1, domain=MS)
def qlinear_leaky_relu(X, X_scale, X_zero_point, Y_scale, Y_zero_point=None, *, alpha=0.01):
    xp = xp_of(X)
    return _qlinear_unary("QLinearLeakyRelu", lambda v: xp.where(v >= 0, v, v * float(alpha)),
                          X, X_scale, X_zero_point, Y_scale, Y_zero_point)


@kernel("QLinearSoftmax", since=1, domain=MS)
def qlinear_softmax(X, X_scale, x_zero_point, y_scale, y_zero_point, *, axis=-1, opset=13):
    """``opset`` is the ONNX opset of the Softmax it replaced: below 13 the input is coerced to
    2-D at ``axis``, from 13 the softmax runs along ``axis`` only."""
    op = "QLinearSoftmax"
    if not -X.ndim <= axis < max(X.ndim, 1):
        raise ShapeError(f"{op}: axis {axis} is out of range for input of shape "
                         f"{tuple(X.shape)}")
    sm = lookup("Softmax", "", 13 if opset >= 13 else 1).fn
    return _qlinear_unary(op, lambda v: sm(v, axis=axis), X, X_scale, x_zero_point, y_scale,
                          y_zero_point)


# ---------------------------------------------------------------------------------- pooling
def _nhwc_to_nchw(x):
    return x.transpose((0, x.ndim - 1) + tuple(range(1, x.ndim - 1)))


def _nchw_to_nhwc(x):
    return x.transpose((0,) + tuple(range(2, x.ndim)) + (1,))


@kernel("QLinearAveragePool", since=1, domain=MS)
def qlinear_average_pool(X, x_scale, x_zero_point, y_scale, y_zero_point=None, *,
                         auto_pad="NOTSET", ceil_mode=0, channels_last=0, count_include_pad=0,
                         kernel_shape=None, pads=None, strides=None):
    op = "QLinearAveragePool"
    if X.ndim < 3:
        raise ShapeError(f"{op}: X must be (N, C, spatial...), got shape {tuple(X.shape)}")
    v = _deq(op, X, x_scale, x_zero_point)
    if channels_last:
        v = _nhwc_to_nchw(v)
    pool = lookup("AveragePool", "", 19).fn
    r = pool(v, auto_pad=auto_pad, ceil_mode=ceil_mode, count_include_pad=count_include_pad,
             kernel_shape=kernel_shape, pads=pads, strides=strides)
    if channels_last:
        r = _nchw_to_nhwc(r)
    return _quant(op, r, y_scale, y_zero_point, _requant_dtype(y_zero_point, X))


@kernel("QLinearGlobalAveragePool", since=1, domain=MS)
def qlinear_global_average_pool(X, x_scale, x_zero_point, y_scale, y_zero_point, *,
                                channels_last=0):
    op = "QLinearGlobalAveragePool"
    if X.ndim < 3:
        raise ShapeError(f"{op}: X must be (N, C, spatial...), got shape {tuple(X.shape)}")
    v = _deq(op, X, x_scale, x_zero_point)
    axes = tuple(range(1, X.ndim - 1)) if channels_last else tuple(range(2, X.ndim))
    return _quant(op, v.mean(axis=axes, keepdims=True), y_scale, y_zero_point,
                  _requant_dtype(y_zero_point, X))


@kernel("QLinearConcat", since=1, domain=MS)
def qlinear_concat(Y_scale, Y_zero_point, *inputs, axis):
    """inputs: (X, X_scale, X_zero_point) triples."""
    op = "QLinearConcat"
    xp = xp_of(Y_scale)
    if len(inputs) % 3 or not inputs:
        raise InputError(f"{op}: expected (tensor, scale, zero_point) triples after Y_scale "
                         f"and Y_zero_point, got {len(inputs)} inputs")
    parts = [_deq(op, inputs[i], inputs[i + 1], inputs[i + 2], f"input {i // 3}")
             for i in range(0, len(inputs), 3)]
    rank = parts[0].ndim
    if not -rank <= axis < rank:
        raise ShapeError(f"{op}: axis {axis} is out of range for rank {rank}")
    try:
        r = xp.concatenate(parts, axis=axis)
    except ValueError:
        raise ShapeError(f"{op}: cannot concatenate shapes "
                         f"{[tuple(p.shape) for p in parts]} along axis {axis}") from None
    return _quant(op, r, Y_scale, Y_zero_point, inputs[0].dtype)


# ---------------------------------------------------------------------------------- matmuls
def _centered(op, name, x, zp, axis_len=None, per_col=False):
    """x - zp in float64; zp per tensor, or per column (length = last dim) when per_col."""
    if x.dtype.kind not in "iu":
        raise InputError(f"{op}: {name} must be an integer tensor, got {x.dtype}")
    v = x.astype(np.float64)
    if zp is None:
        return v
    z = zp.astype(np.float64)
    if z.size == 1:
        return v - z.reshape(())
    if not per_col or z.ndim != 1 or z.shape[0] != x.shape[-1]:
        raise ShapeError(f"{op}: {name}_zero_point of shape {tuple(zp.shape)} does not fit "
                         f"{name} of shape {tuple(x.shape)} (scalar or one per column)")
    return v - z


def _col_scale(op, name, s, n):
    s = s.astype(np.float64)
    if s.size == 1:
        return s.reshape(())
    if s.ndim != 1 or s.shape[0] != n:
        raise ShapeError(f"{op}: {name} of shape {tuple(s.shape)} must be a scalar or have "
                         f"one value per output column ({n})")
    return s


def _imatmul(op, a, b):
    xp = xp_of(a, b)
    try:
        return xp.matmul(a, b)
    except ValueError:
        raise ShapeError(f"{op}: cannot multiply shapes {tuple(a.shape)} and "
                         f"{tuple(b.shape)}") from None


def _product(op, A, a_zp, B, b_zp, mode, a_name="A", b_name="B"):
    """(A - a_zp) @ (B - b_zp) in float64: exact, or as onnxruntime sums uint8 x int8 products
    without VNNI (``mode``: ops/_integer.py). a_zp per tensor; b_zp per tensor or column."""
    if saturates(arithmetic_of(op, mode), A.dtype, B.dtype):
        _centered(op, b_name, B, b_zp, per_col=True)  # the same checks as the exact path
        az = None if a_zp is None else _scalar_param(op, f"{a_name}_zero_point", a_zp)
        bz = None if b_zp is None else (b_zp.reshape(()) if b_zp.size == 1 else b_zp)
        return saturated_product(op, A, az, B, bz)
    a = _centered(op, a_name, A, _scalar_param(op, f"{a_name}_zero_point", a_zp)
                  if a_zp is not None else None)
    return _imatmul(op, a, _centered(op, b_name, B, b_zp, per_col=True))


@kernel("MatMulIntegerToFloat", since=1, domain=MS)
def matmul_integer_to_float(A, B, a_scale, b_scale, a_zero_point=None, b_zero_point=None,
                            bias=None, *, integer_arithmetic=EXACT):
    op = "MatMulIntegerToFloat"
    acc = _product(op, A, a_zero_point, B, b_zero_point, integer_arithmetic)
    n = B.shape[-1]
    y = acc * (float(_scalar_param(op, "a_scale", a_scale))
               * _col_scale(op, "b_scale", b_scale, n))
    if bias is not None:
        y = y + bias.astype(np.float64)
    return y.astype(a_scale.dtype)


@kernel("DynamicQuantizeMatMul", since=1, domain=MS)
def dynamic_quantize_matmul(A, B, b_scale, b_zero_point=None, bias=None, *,
                            integer_arithmetic=EXACT):
    op = "DynamicQuantizeMatMul"
    xp = xp_of(A)
    qa, sa, za = _dynamic_u8(A)
    acc = _product(op, qa, xp.asarray(za, dtype=np.float64), B, b_zero_point,
                   integer_arithmetic)
    y = acc * (sa * _col_scale(op, "b_scale", b_scale, B.shape[-1]))
    if bias is not None:
        y = y + bias.astype(np.float64)
    return y.astype(A.dtype)


@kernel("QGemm", since=1, domain=MS)
def qgemm(A, a_scale, a_zero_point, B, b_scale, b_zero_point, C=None, y_scale=None,
          y_zero_point=None, *, alpha=1.0, transA=0, transB=0, integer_arithmetic=EXACT):
    """Y = alpha * (A' - a_zp)(B' - b_zp) * a_scale * b_scale + C * a_scale * b_scale; C is
    int32 in the product's scale. b_scale/b_zero_point: scalar or one per column N."""
    op = "QGemm"
    if A.ndim != 2 or B.ndim != 2:
        raise ShapeError(f"{op}: A {tuple(A.shape)} and B {tuple(B.shape)} must be 2-D")
    a = A.T if transA else A
    b = B.T if transB else B
    if a.shape[1] != b.shape[0]:
        raise ShapeError(f"{op}: A' {tuple(a.shape)} and B' {tuple(b.shape)} do not multiply "
                         f"(transA={transA}, transB={transB})")
    acc = _product(op, a, a_zero_point, b, b_zero_point, integer_arithmetic, "a", "b")
    scale = float(_scalar_param(op, "a_scale", a_scale)) * _col_scale(op, "b_scale", b_scale,
                                                                       b.shape[1])
    y = acc * (float(alpha) * scale)
    if C is not None:
        y = y + C.astype(np.float64) * scale
    if y_scale is None:
        return y.astype(np.float32)
    return _quant(op, y, y_scale, y_zero_point, A.dtype)


# ---------------------------------------------------------------------------------- LSTM
def _step_times(xp, seq, lens):
    """(seq, batch) time index of step s of each row of a reverse direction: len_b - 1 - s
    within the row's length, s itself beyond it (ReverseSequence's order; an involution)."""
    s = xp.arange(seq)[:, None]
    return xp.where(s < lens[None, :], lens[None, :] - 1 - s, s)


@kernel("DynamicQuantizeLSTM", since=1, domain=MS, wants_ctx=True)
def dynamic_quantize_lstm(X, W, R, B=None, sequence_lens=None, initial_h=None, initial_c=None,
                          P=None, W_scale=None, W_zero_point=None, R_scale=None,
                          R_zero_point=None, *, activation_alpha=None, activation_beta=None,
                          activations=None, clip=None, direction="forward", hidden_size=None,
                          input_forget=0, integer_arithmetic=EXACT, ctx):
    """W: [dirs, input, 4H], R: [dirs, H, 4H] (transposed against ONNX LSTM), 8-bit, with
    scales/zero points of shape [dirs] or [dirs, 4H]. The products X@W and h@R run on
    dynamically quantized (uint8) activations; the gates follow ONNX LSTM (i, o, f, c)."""
    op = "DynamicQuantizeLSTM"
    if W_scale is None or R_scale is None:
        raise InputError(f"{op}: W_scale and R_scale are required")
    if W.ndim != 3 or R.ndim != 3:
        raise ShapeError(f"{op}: W {tuple(W.shape)} and R {tuple(R.shape)} must be 3-D")
    dirs = W.shape[0]
    xp = xp_of(X)
    if X.ndim != 3 or X.shape[2] != W.shape[1]:
        raise ShapeError(f"{op}: X {tuple(X.shape)} must be [seq, batch, {W.shape[1]}] for W "
                         f"of shape {tuple(W.shape)}")
    hs = int(hidden_size) if hidden_size else R.shape[1]
    if W.shape[2] != 4 * hs or R.shape != (dirs, hs, 4 * hs):
        raise ShapeError(f"{op}: W {tuple(W.shape)} / R {tuple(R.shape)} do not fit "
                         f"hidden_size {hs} and {dirs} direction(s)")

    mode = arithmetic_of(op, integer_arithmetic)

    def params(name, s, z, mat):
        s = s.astype(np.float64).reshape(dirs, -1)
        if s.shape[1] not in (1, 4 * hs):
            raise ShapeError(f"{op}: {name}_scale must have shape [{dirs}] or "
                             f"[{dirs}, {4 * hs}], got {tuple(s.shape)}")
        z = (xp.zeros((dirs, 1), dtype=mat.dtype) if z is None else z.reshape(dirs, -1))
        return [(mat[d], z[d], s[d][None, :]) for d in range(dirs)]

    wq = params("W", W_scale, W_zero_point, W)
    rq = params("R", R_scale, R_zero_point, R)

    def qmm(x, mats):
        """x @ (mat - zp) * scale with x quantized dynamically to uint8 (per call)."""
        q, s, z = _dynamic_u8(x)
        mat, zp, scale = mats
        zq = xp.asarray(z, dtype=np.float64)
        if saturates(mode, q.dtype, mat.dtype):
            acc = saturated_product(op, q, zq, mat, zp if zp.size > 1 else zp.reshape(()))
        else:
            acc = (q.astype(np.float64) - zq) @ (mat.astype(np.float64) - zp.astype(np.float64))
        return acc * (s * scale)

    seq, batch, _ = X.shape
    lens = None if sequence_lens is None else xp.asarray(sequence_lens).astype(np.int64)
    acts = (activations or ["Sigmoid", "Tanh", "Tanh"] * dirs)
    alphas = list(activation_alpha or [])
    betas = list(activation_beta or [])
    from workbench.ops import rnn as _rnn
    fns = _rnn._activations(op, acts, ["Sigmoid", "Tanh", "Tanh"], dirs, alphas or None,
                            betas or None, xp)
    bias = (xp.zeros((dirs, 8 * hs)) if B is None else B.astype(np.float64))
    peep = None if P is None else P.astype(np.float64)
    Y = xp.zeros((seq, dirs, batch, hs), dtype=np.float64)
    Yh = xp.zeros((dirs, batch, hs))
    Yc = xp.zeros((dirs, batch, hs))
    reverse_dirs = {"forward": [False], "reverse": [True],
                    "bidirectional": [False, True]}.get(direction)
    if reverse_dirs is None or len(reverse_dirs) != dirs:
        raise InputError(f"{op}: direction {direction!r} does not fit W with {dirs} "
                         f"direction(s)")

    def clipped(v):
        return v if not clip else xp.clip(v, -clip, clip)

    # the steps run as onnxruntime runs them (its documented quantized LSTM): up to the
    # longest sequence only, a reverse direction on each row reversed within its own length
    # (row b's step s is time len_b - 1 - s), and a row past its length feeding zeros (its
    # zeroed output) to the next step's dynamically quantized hidden-state product
    full = xp.full((batch,), seq, dtype=np.int64)
    lens_ = full if lens is None else lens
    steps = int(lens_.max()) if batch else 0
    rows = xp.arange(batch)
    for d, rev in enumerate(reverse_dirs):
        f, g, hfn = fns[d]
        order = _step_times(xp, seq, lens_) if rev else None   # (seq, batch) time of step s
        xd = X if order is None else X[order, rows[None, :]]
        gx = qmm(xd[:steps].reshape(steps * batch, -1), wq[d]).reshape(steps, batch, 4 * hs)
        gx = gx + bias[d, :4 * hs] + bias[d, 4 * hs:]
        h = (xp.zeros((batch, hs)) if initial_h is None
             else initial_h[d].astype(np.float64))
        c = (xp.zeros((batch, hs)) if initial_c is None
             else initial_c[d].astype(np.float64))
        h_in = h
        for t in range(steps):
            gates = gx[t] + qmm(h_in, rq[d])
            gi, go, gf, gc = (gates[:, k * hs:(k + 1) * hs] for k in range(4))
            if peep is not None:
                gi = gi + peep[d, :hs] * c
                gf = gf + peep[d, 2 * hs:] * c
            i = f(clipped(gi))
            fg = 1 - i if input_forget else f(clipped(gf))
            c_new = fg * c + i * g(clipped(gc))
            if peep is not None:
                go = go + peep[d, hs:2 * hs] * c_new
            h_new = f(clipped(go)) * hfn(c_new)
            alive = (t < lens_)[:, None]
            h = xp.where(alive, h_new, h)
            c = xp.where(alive, c_new, c)
            h_in = xp.where(alive, h_new, 0.0)
            if order is None:
                Y[t, d] = h_in
            else:
                Y[order[t], d, rows] = h_in
        Yh[d], Yc[d] = h, c
    outs = [Y.astype(X.dtype), Yh.astype(X.dtype), Yc.astype(X.dtype)]
    n = max(ctx.n_outputs, 1)
    return outs[0] if n == 1 else tuple(outs[:n])


# ---------------------------------------------------------------------------------- 4-bit
def _unpack_bits(packed, bits, count):
    """uint8 [..., nbytes] -> uint8 [..., count] values of ``bits`` bits, low bits first."""
    xp = xp_of(packed)
    if 8 % bits:
        raise InputError(f"MatMulNBits: bits={bits} is not supported (2, 4 or 8)")
    per = 8 // bits
    shifts = xp.arange(per, dtype=np.uint8) * bits
    vals = (packed[..., None] >> shifts) & ((1 << bits) - 1)
    vals = vals.reshape(packed.shape[:-1] + (packed.shape[-1] * per,))
    return vals[..., :count]


@kernel("MatMulNBits", since=1, domain=MS)
def matmul_nbits(A, B, scales, zero_points=None, g_idx=None, bias=None, *, K, N, bits=4,
                 block_size, accuracy_level=0, weight_prepacked=0):
    """Y = A @ dequant(B)^T + bias, B: uint8 [N, n_blocks, blob] holding ``bits``-bit values
    along K (low bits first), scales [N * n_blocks] (or [N, n_blocks]); zero points packed
    like B (uint8, [N, ceil(n_blocks * bits / 8)]) or of the scales' type; the default zero
    point is 2^(bits-1). ``g_idx`` (act-order) maps each k to its block."""
    op = "MatMulNBits"
    xp = xp_of(A)
    K, N, bits, bs = int(K), int(N), int(bits), int(block_size)
    if weight_prepacked:
        raise InputError(f"{op}: weight_prepacked=1 (B in onnxruntime's internal packed "
                         f"layout) is not supported; save the model without prepacking")
    if bs < 16 or bs & (bs - 1):
        raise InputError(f"{op}: block_size {bs} must be a power of 2 and >= 16")
    nb = (K + bs - 1) // bs
    if A.shape[-1] != K:
        raise ShapeError(f"{op}: A {tuple(A.shape)} has {A.shape[-1]} columns, K is {K}")
    blob = bs * bits // 8
    if B.size != N * nb * blob:
        raise ShapeError(f"{op}: B {tuple(B.shape)} does not hold [N={N}, blocks={nb}, "
                         f"{blob} bytes]")
    q = _unpack_bits(B.reshape(N, nb, blob), bits, bs).astype(np.float32)  # [N, nb, bs]
    s = scales.astype(np.float32).reshape(N, nb)
    if zero_points is None:
        z = np.float32(2 ** (bits - 1))
        zf = xp.full((N, nb), z, dtype=np.float32)
    elif zero_points.dtype == np.uint8:
        zf = _unpack_bits(zero_points.reshape(N, -1), bits, nb).astype(np.float32)
    else:
        zf = zero_points.astype(np.float32).reshape(N, nb)
    if g_idx is not None and g_idx.size == K:
        # act-order: value k of row n belongs to block g_idx[k] (values stay in k order)
        qk = q.reshape(N, nb * bs)[:, :K]
        gi = g_idx.astype(np.int64)
        w = (qk - zf[:, gi]) * s[:, gi]
    else:
        w = ((q - zf[:, :, None]) * s[:, :, None]).reshape(N, nb * bs)[:, :K]
    y = xp.matmul(A.astype(np.float32), w.T)
    if bias is not None:
        y = y + bias.astype(np.float32)
    return y.astype(A.dtype)


# ---------------------------------------------------------------------------------- QAttention
@kernel("QAttention", since=1, domain=MS, wants_ctx=True)
def qattention(input, weight, bias, input_scale, weight_scale, mask_index=None,
               input_zero_point=None, weight_zero_point=None, past=None, *, num_heads,
               unidirectional=0, do_rotary=0, past_present_share_buffer=0,
               mask_filter_value=-10000.0, scale=0.0, integer_arithmetic=EXACT, ctx):
    """Attention (contrib_transformer.ms_attention, through the engine's attention core
    ops.attention.attend) on 8-bit input and weights: the QKV projection is the exact integer
    product scaled by input_scale * weight_scale (weight per tensor or per column)."""
    op = "QAttention"
    if input.ndim != 3 or weight.ndim != 2 or weight.shape[0] != input.shape[2]:
        raise ShapeError(f"{op}: input {tuple(input.shape)} must be [batch, seq, hidden] and "
                         f"weight {tuple(weight.shape)} [hidden, 3*hidden]")
    acc = _product(op, input, input_zero_point, weight, weight_zero_point, integer_arithmetic,
                   "input", "weight")
    proj = acc * (float(_scalar_param(op, "input_scale", input_scale))
                      * _col_scale(op, "weight_scale", weight_scale, weight.shape[1]))
    proj = (proj + bias.astype(np.float64)).astype(bias.dtype)
    from workbench.ops.contrib_transformer import attention_from_qkv
    return attention_from_qkv(op, proj, None, mask_index, past, None, None,
                              num_heads=num_heads, unidirectional=unidirectional,
                              qkv_hidden_sizes=None, mask_filter_value=mask_filter_value,
                              scale=scale, n_outputs=ctx.n_outputs)



# ---------------------------------------------------------------------------------- QEmbedLayerNorm
@kernel("QEmbedLayerNormalization", since=1, domain=MS, wants_ctx=True)
def qembed_layer_norm(input_ids, segment_ids, word_embedding_quant, position_embedding_quant,
                      segment_embedding=None, gamma_quant=None, beta_quant=None, mask=None,
                      word_embedding_scale=None, position_embedding_scale=None,
                      segment_embedding_scale=None, gamma_scale=None, beta_scale=None,
                      word_embedding_zero_point=None, position_embedding_zero_point=None,
                      segment_embedding_zero_point=None, gamma_zero_point=None,
                      beta_zero_point=None, *, epsilon=1e-12, ctx):
    """EmbedLayerNormalization with 8-bit tables, gamma and beta (per-tensor scale and zero
    point each), dequantized to float32; outputs layernorm_out and mask_index_out."""
    op = "QEmbedLayerNormalization"

    def deq(name, q, s, z):
        if q is None:
            return None
        if s is None:
            raise InputError(f"{op}: {name} has no scale")
        return _deq(op, q, s, z, name).astype(np.float32)

    from workbench.ops.contrib_transformer import embed_layer_norm
    return embed_layer_norm(
        input_ids, segment_ids,
        deq("word_embedding", word_embedding_quant, word_embedding_scale,
            word_embedding_zero_point),
        deq("position_embedding", position_embedding_quant, position_embedding_scale,
            position_embedding_zero_point),
        deq("segment_embedding", segment_embedding, segment_embedding_scale,
            segment_embedding_zero_point),
        deq("gamma", gamma_quant, gamma_scale, gamma_zero_point),
        deq("beta", beta_quant, beta_scale, beta_zero_point), mask, None,
        epsilon=epsilon, ctx=ctx)


# ---------------------------------------------------------------------------------- Q/DQ
@kernel("QuantizeLinear", since=1, domain=MS)
def ms_quantize_linear(x, y_scale, y_zero_point=None, *, axis=1, block_size=0,
                       output_dtype=0):
    """com.microsoft's QuantizeLinear (what the quantizer writes with UseQDQContribOps, e.g.
    for 16-bit or 4-bit QDQ): the ONNX operator's semantics, per tensor / per axis / blocked."""
    return lookup("QuantizeLinear", "", 21).fn(x, y_scale, y_zero_point, axis=axis, saturate=1,
                                               block_size=block_size,
                                               output_dtype=output_dtype, precision=0)


@kernel("DequantizeLinear", since=1, domain=MS)
def ms_dequantize_linear(x, x_scale, x_zero_point=None, *, axis=1, block_size=0):
    """com.microsoft's DequantizeLinear: the ONNX operator's semantics."""
    return lookup("DequantizeLinear", "", 21).fn(x, x_scale, x_zero_point, axis=axis,
                                                 block_size=block_size, output_dtype=0)
