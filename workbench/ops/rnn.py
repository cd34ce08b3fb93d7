"""Recurrent kernels: RNN, GRU, LSTM (opsets 7, 14 (layout), 22 (bfloat16)).

The input projection of all time steps is one GEMM; the recurrence does one GEMM per step and
direction, vectorised over the batch. ``sequence_lens`` masks the state update per batch row
(the reverse direction of a short row starts at its last valid step); outputs past a row's
length are zero. float16/bfloat16 inputs are computed in float32 and cast back.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from workbench.arrays import xp_of
from workbench.errors import InputError, ShapeError
from workbench.ops._common import stable_sigmoid, work_dtype
from workbench.ops.registry import kernel

# name -> (takes alpha, takes beta, default alpha, default beta)
_ACT_PARAMS = {
    "affine": (True, True, 1.0, 0.0),
    "leakyrelu": (True, False, 0.01, None),
    "thresholdedrelu": (True, False, 1.0, None),
    "scaledtanh": (True, True, 1.0, 1.0),
    "hardsigmoid": (True, True, 0.2, 0.5),
    "elu": (True, False, 1.0, None),
}
_NO_PARAMS = ("relu", "tanh", "sigmoid", "softsign", "softplus")


def _activation(op: str, name: str, alpha, beta, xp):
    key = name.lower()
    if key == "relu":
        return lambda x: xp.maximum(x, 0)
    if key == "tanh":
        return xp.tanh
    if key == "sigmoid":
        return lambda x: stable_sigmoid(xp, x)
    if key == "softsign":
        return lambda x: x / (1 + xp.abs(x))
    if key == "softplus":
        return lambda x: xp.logaddexp(0, x)
    if key == "affine":
        return lambda x: alpha * x + beta
    if key == "leakyrelu":
        return lambda x: xp.where(x >= 0, x, alpha * x)
    if key == "thresholdedrelu":
        return lambda x: xp.where(x > alpha, x, 0)
    if key == "scaledtanh":
        return lambda x: alpha * xp.tanh(beta * x)
    if key == "hardsigmoid":
        return lambda x: xp.clip(alpha * x + beta, 0, 1)
    if key == "elu":
        return lambda x: xp.where(x >= 0, x, alpha * xp.expm1(xp.minimum(x, 0)))
    raise InputError(f"{op}: unknown activation {name!r}; supported: Relu, Tanh, Sigmoid, "
                     f"Affine, LeakyRelu, ThresholdedRelu, ScaledTanh, HardSigmoid, Elu, "
                     f"Softsign, Softplus")


def _activations(op, names, defaults, num_dirs, alphas, betas, xp):
    """Per direction, the list of activation callables. Alphas/betas are consumed in order by
    the activations that take them; a missing one takes the ONNX default."""
    k = len(defaults)
    names = list(names) if names else list(defaults) * num_dirs
    if len(names) < k:
        raise InputError(f"{op}: activations {names} must list {k} functions per direction")
    alphas = list(alphas or [])
    betas = list(betas or [])
    fns = []
    for name in names:
        takes_a, takes_b, da, db = _ACT_PARAMS.get(name.lower(), (False, False, None, None))
        a = (alphas.pop(0) if alphas else da) if takes_a else None
        b = (betas.pop(0) if betas else db) if takes_b else None
        fns.append(_activation(op, name, a, b, xp))
    per_dir = []
    for d in range(num_dirs):
        chunk = fns[d * k:(d + 1) * k]
        per_dir.append(chunk if len(chunk) == k else fns[:k])
    return per_dir


class _Prepared(NamedTuple):
    """A recurrent node's inputs checked and in (seq, batch, ...) layout, with its sizes:
    ``num_dirs`` directions, ``seq`` steps, ``batch`` rows, ``hs`` hidden units, ``lens`` the
    per-row sequence lengths (int64) or None."""
    X: object
    initial_h: object
    initial_c: object
    num_dirs: int
    seq: int
    batch: int
    hs: int
    lens: object


def _prepare(op, X, W, R, B, sequence_lens, initial_h, initial_c, n_gates, hidden_size,
             direction, layout) -> _Prepared:
    if direction not in ("forward", "reverse", "bidirectional"):
        raise InputError(f"{op}: direction {direction!r} must be forward, reverse or "
                         f"bidirectional")
    num_dirs = 2 if direction == "bidirectional" else 1
    if X.ndim != 3:
        raise ShapeError(f"{op}: X must be 3-D, got shape {tuple(X.shape)}")
    if layout:
        X = X.transpose(1, 0, 2)
        initial_h = None if initial_h is None else initial_h.transpose(1, 0, 2)
        initial_c = None if initial_c is None else initial_c.transpose(1, 0, 2)
    seq, batch, inp = X.shape
    hs = int(hidden_size) if hidden_size else R.shape[-1]
    if W.shape != (num_dirs, n_gates * hs, inp):
        raise ShapeError(f"{op}: W has shape {tuple(W.shape)}, expected "
                         f"{(num_dirs, n_gates * hs, inp)} (num_directions, {n_gates}*"
                         f"hidden_size, input_size)")
    if R.shape != (num_dirs, n_gates * hs, hs):
        raise ShapeError(f"{op}: R has shape {tuple(R.shape)}, expected "
                         f"{(num_dirs, n_gates * hs, hs)}")
    if B is not None and B.shape != (num_dirs, 2 * n_gates * hs):
        raise ShapeError(f"{op}: B has shape {tuple(B.shape)}, expected "
                         f"{(num_dirs, 2 * n_gates * hs)}")
    for name, v in (("initial_h", initial_h), ("initial_c", initial_c)):
        if v is not None and v.shape != (num_dirs, batch, hs):
            raise ShapeError(f"{op}: {name} has shape {tuple(v.shape)} (after layout), "
                             f"expected {(num_dirs, batch, hs)}")
    lens = None
    if sequence_lens is not None:
        if sequence_lens.shape != (batch,):
            raise ShapeError(f"{op}: sequence_lens has shape {tuple(sequence_lens.shape)}, "
                             f"expected ({batch},)")
        lens = sequence_lens.astype(np.int64)
    return _Prepared(X, initial_h, initial_c, num_dirs, seq, batch, hs, lens)


def _finish(Y, Y_h, Y_c, layout, out_dtype, n_outputs):
    # Y: (seq, dirs, batch, hidden); Y_h / Y_c: (dirs, batch, hidden)
    if layout:
        Y = Y.transpose(2, 0, 1, 3)
        Y_h = Y_h.transpose(1, 0, 2)
        Y_c = None if Y_c is None else Y_c.transpose(1, 0, 2)
    outs = [Y, Y_h] + ([] if Y_c is None else [Y_c])
    outs = [o.astype(out_dtype) for o in outs[:max(n_outputs, 1)]]
    return outs[0] if len(outs) == 1 else tuple(outs)


def _steps(seq, reverse):
    return range(seq - 1, -1, -1) if reverse else range(seq)


def _run(op, n_gates, step, X, W, R, B, sequence_lens, initial_h, initial_c, *, hidden_size,
         direction, layout, clip, with_cell, bias_split, ctx_outputs):
    xp = xp_of(X)
    X, initial_h, initial_c, num_dirs, seq, batch, hs, lens = _prepare(
        op, X, W, R, B, sequence_lens, initial_h, initial_c, n_gates, hidden_size, direction,
        layout)
    cdt = work_dtype(X.dtype)
    Xc = X.astype(cdt)
    Y = xp.zeros((seq, num_dirs, batch, hs), dtype=cdt)
    Y_h = xp.zeros((num_dirs, batch, hs), dtype=cdt)
    Y_c = xp.zeros((num_dirs, batch, hs), dtype=cdt) if with_cell else None
    lens_col = None if lens is None else xp.asarray(lens).reshape(-1, 1)
    for d in range(num_dirs):
        Wd, Rd = W[d].astype(cdt), R[d].astype(cdt)
        if B is not None:
            wb, rb = B[d, :n_gates * hs].astype(cdt), B[d, n_gates * hs:].astype(cdt)
        else:
            wb = rb = xp.zeros((n_gates * hs,), dtype=cdt)
        in_bias, rec_bias = bias_split(wb, rb)
        xw = (Xc.reshape(seq * batch, -1) @ Wd.T + in_bias).reshape(seq, batch, -1)
        h = (xp.zeros((batch, hs), dtype=cdt) if initial_h is None
             else initial_h[d].astype(cdt))
        c = None
        if with_cell:
            c = (xp.zeros((batch, hs), dtype=cdt) if initial_c is None
                 else initial_c[d].astype(cdt))
        reverse = direction == "reverse" or d == 1
        for t in _steps(seq, reverse):
            h_new, c_new = step(d, xw[t], h, c, Rd, rec_bias, clip)
            if lens_col is None:
                h, c = h_new, c_new
                Y[t, d] = h
            else:
                valid = t < lens_col
                h = xp.where(valid, h_new, h)
                if with_cell:
                    c = xp.where(valid, c_new, c)
                Y[t, d] = xp.where(valid, h_new, 0)
        Y_h[d] = h
        if with_cell:
            Y_c[d] = c
    return _finish(Y, Y_h, Y_c, layout, X.dtype, ctx_outputs)


def _clip(x, clip, xp):
    return x if clip is None else xp.clip(x, -clip, clip)


@kernel("RNN", since=7, wants_ctx=True, category="layer")
@kernel("RNN", since=14, wants_ctx=True)
def rnn(X, W, R, B=None, sequence_lens=None, initial_h=None, *, activation_alpha=None,
        activation_beta=None, activations=None, clip=None, direction="forward",
        hidden_size=None, layout=0, ctx):
    """Ht = f(Xt*(Wi^T) + Ht-1*(Ri^T) + Wbi + Rbi); layout attribute from opset 14."""
    xp = xp_of(X)
    num_dirs = 2 if direction == "bidirectional" else 1
    acts = _activations("RNN", activations, ["Tanh"], num_dirs, activation_alpha,
                        activation_beta, xp)

    def step(d, gx, h, c, Rd, rec_bias, clip):
        return acts[d][0](_clip(gx + h @ Rd.T, clip, xp)), None

    return _run("RNN", 1, step, X, W, R, B, sequence_lens, initial_h, None,
                hidden_size=hidden_size, direction=direction, layout=layout, clip=clip,
                with_cell=False, bias_split=lambda wb, rb: (wb + rb, None),
                ctx_outputs=ctx.n_outputs)


@kernel("GRU", since=7, wants_ctx=True, category="layer")
@kernel("GRU", since=14, wants_ctx=True)
def gru(X, W, R, B=None, sequence_lens=None, initial_h=None, *, activation_alpha=None,
        activation_beta=None, activations=None, clip=None, direction="forward",
        hidden_size=None, layout=0, linear_before_reset=0, ctx):
    """GRU with gates z, r, h (f=Sigmoid, g=Tanh by default); layout from opset 14."""
    xp = xp_of(X)
    num_dirs = 2 if direction == "bidirectional" else 1
    acts = _activations("GRU", activations, ["Sigmoid", "Tanh"], num_dirs, activation_alpha,
                        activation_beta, xp)
    lbr = bool(linear_before_reset)

    def bias_split(wb, rb):
        hs = wb.shape[0] // 3
        if lbr:  # Rbh stays inside r * (H Rh^T + Rbh)
            return wb + xp.concatenate([rb[:2 * hs], xp.zeros_like(rb[2 * hs:])]), rb[2 * hs:]
        return wb + rb, None

    def step(d, gx, h, c, Rd, rbh, clip):
        f, g = acts[d]
        hs = h.shape[1]
        hr = h @ Rd[:2 * hs].T
        z = f(_clip(gx[:, :hs] + hr[:, :hs], clip, xp))
        r = f(_clip(gx[:, hs:2 * hs] + hr[:, hs:], clip, xp))
        rh = Rd[2 * hs:]
        if lbr:
            cand = g(_clip(gx[:, 2 * hs:] + r * (h @ rh.T + rbh), clip, xp))
        else:
            cand = g(_clip(gx[:, 2 * hs:] + (r * h) @ rh.T, clip, xp))
        return (1 - z) * cand + z * h, None

    return _run("GRU", 3, step, X, W, R, B, sequence_lens, initial_h, None,
                hidden_size=hidden_size, direction=direction, layout=layout, clip=clip,
                with_cell=False, bias_split=bias_split, ctx_outputs=ctx.n_outputs)


@kernel("LSTM", since=7, wants_ctx=True, category="layer")
@kernel("LSTM", since=14, wants_ctx=True)
def lstm(X, W, R, B=None, sequence_lens=None, initial_h=None, initial_c=None, P=None, *,
         activation_alpha=None, activation_beta=None, activations=None, clip=None,
         direction="forward", hidden_size=None, input_forget=0, layout=0, ctx):
    """LSTM with gates i, o, f, c (f=Sigmoid, g=h=Tanh by default), peepholes P[iof],
    input_forget coupling (f = 1 - i); layout from opset 14."""
    xp = xp_of(X)
    num_dirs = 2 if direction == "bidirectional" else 1
    acts = _activations("LSTM", activations, ["Sigmoid", "Tanh", "Tanh"], num_dirs,
                        activation_alpha, activation_beta, xp)
    hs_attr = int(hidden_size) if hidden_size else R.shape[-1]
    if P is not None and P.shape != (num_dirs, 3 * hs_attr):
        raise ShapeError(f"LSTM: P has shape {tuple(P.shape)}, expected "
                         f"{(num_dirs, 3 * hs_attr)}")
    cdt = work_dtype(X.dtype)
    peep = None if P is None else P.astype(cdt)
    couple = bool(input_forget)

    def step(d, gx, h, c, Rd, _unused, clip):
        f, g, hfn = acts[d]
        hs = h.shape[1]
        gates = gx + h @ Rd.T
        gi, go, gf, gc = (gates[:, k * hs:(k + 1) * hs] for k in range(4))
        if peep is not None:
            pi, po, pf = peep[d, :hs], peep[d, hs:2 * hs], peep[d, 2 * hs:]
            gi = gi + pi * c
            gf = gf + pf * c
        i = f(_clip(gi, clip, xp))
        fg = 1 - i if couple else f(_clip(gf, clip, xp))
        cand = g(_clip(gc, clip, xp))
        c_new = fg * c + i * cand
        if peep is not None:
            go = go + po * c_new
        o = f(_clip(go, clip, xp))
        return o * hfn(c_new), c_new

    return _run("LSTM", 4, step, X, W, R, B, sequence_lens, initial_h, initial_c,
                hidden_size=hidden_size, direction=direction, layout=layout, clip=clip,
                with_cell=True, bias_split=lambda wb, rb: (wb + rb, None),
                ctx_outputs=ctx.n_outputs)
