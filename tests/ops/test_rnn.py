"""RNN / GRU / LSTM kernels against per-sample loop references written here from the spec
equations (one batch row and one time step at a time)."""

from __future__ import annotations

import numpy as np
import pytest

from workbench.arrays import cupy_module
from workbench.errors import InputError, ShapeError
from workbench.ops.registry import NodeContext, attribute_defaults, lookup

RNG = np.random.default_rng(0)


def run(op, *inputs, opset=22, n_outputs=3, **attrs):
    entry = lookup(op, "", opset)
    kw = dict(attribute_defaults(op, "", opset))
    kw.update(attrs)
    if entry.wants_ctx:
        kw["ctx"] = NodeContext(node_name="n", op_type=op, opset=opset, n_outputs=n_outputs)
    return entry.fn(*inputs, **kw)


def sig(x):
    return 1 / (1 + np.exp(-x))


def naive(kind, X, W, R, B, lens, h0, c0, P, direction, lbr=0, input_forget=0,
          f=sig, g=np.tanh, h=np.tanh):
    """Reference: loops over directions, batch rows and time steps."""
    T, N, _ = X.shape
    D = W.shape[0]
    H = R.shape[-1]
    G = {"rnn": 1, "gru": 3, "lstm": 4}[kind]
    Y = np.zeros((T, D, N, H))
    Yh = np.zeros((D, N, H))
    Yc = np.zeros((D, N, H))
    for d in range(D):
        Wb = B[d, :G * H] if B is not None else np.zeros(G * H)
        Rb = B[d, G * H:] if B is not None else np.zeros(G * H)
        rev = direction == "reverse" or d == 1
        for n in range(N):
            L = T if lens is None else int(lens[n])
            hs = np.zeros(H) if h0 is None else h0[d, n].astype(np.float64)
            cs = np.zeros(H) if c0 is None else c0[d, n].astype(np.float64)
            for t in (range(L - 1, -1, -1) if rev else range(L)):
                x = X[t, n].astype(np.float64)
                if kind == "rnn":
                    hs = g(W[d] @ x + R[d] @ hs + Wb + Rb)
                elif kind == "gru":
                    Wz, Wr, Wh = np.split(W[d], 3)
                    Rz, Rr, Rh = np.split(R[d], 3)
                    bz, br, bh = np.split(Wb, 3)
                    rz, rr, rh = np.split(Rb, 3)
                    z = f(Wz @ x + Rz @ hs + bz + rz)
                    r = f(Wr @ x + Rr @ hs + br + rr)
                    if lbr:
                        cand = g(Wh @ x + r * (Rh @ hs + rh) + bh)
                    else:
                        cand = g(Wh @ x + Rh @ (r * hs) + rh + bh)
                    hs = (1 - z) * cand + z * hs
                else:
                    Wi, Wo, Wf, Wc = np.split(W[d], 4)
                    Ri, Ro, Rf, Rc = np.split(R[d], 4)
                    bi, bo, bf, bc = np.split(Wb + Rb, 4)
                    pi, po, pf = np.split(P[d], 3) if P is not None else (0, 0, 0)
                    i = f(Wi @ x + Ri @ hs + pi * cs + bi)
                    fg = 1 - i if input_forget else f(Wf @ x + Rf @ hs + pf * cs + bf)
                    cs = fg * cs + i * g(Wc @ x + Rc @ hs + bc)
                    o = f(Wo @ x + Ro @ hs + po * cs + bo)
                    hs = o * h(cs)
                Y[t, d, n] = hs
            Yh[d, n] = hs
            Yc[d, n] = cs
    return Y, Yh, Yc


def weights(kind, D, I, H, with_b=True):
    G = {"rnn": 1, "gru": 3, "lstm": 4}[kind]
    W = RNG.normal(scale=0.5, size=(D, G * H, I)).astype(np.float32)
    R = RNG.normal(scale=0.5, size=(D, G * H, H)).astype(np.float32)
    B = RNG.normal(scale=0.5, size=(D, 2 * G * H)).astype(np.float32) if with_b else None
    return W, R, B


@pytest.mark.parametrize("direction", ["forward", "reverse", "bidirectional"])
@pytest.mark.parametrize("kind", ["rnn", "gru", "lstm"])
def test_against_naive_with_sequence_lens(kind, direction):
    T, N, I, H = 5, 3, 4, 3
    D = 2 if direction == "bidirectional" else 1
    X = RNG.normal(size=(T, N, I)).astype(np.float32)
    W, R, B = weights(kind, D, I, H)
    lens = np.array([5, 2, 0], np.int32)
    h0 = RNG.normal(size=(D, N, H)).astype(np.float32)
    c0 = RNG.normal(size=(D, N, H)).astype(np.float32)
    P = RNG.normal(size=(D, 3 * H)).astype(np.float32) if kind == "lstm" else None
    ins = [X, W, R, B, lens, h0] + ([c0, P] if kind == "lstm" else [])
    outs = run(kind.upper(), *ins, hidden_size=H, direction=direction,
               n_outputs=3 if kind == "lstm" else 2)
    ref = naive(kind, X, W, R, B, lens, h0, c0 if kind == "lstm" else None, P, direction)
    for got, exp in zip(outs, ref):
        assert got.dtype == np.float32
        np.testing.assert_allclose(got, exp, rtol=1e-5, atol=1e-5)
    # rows shorter than T: zero outputs past their length, state kept from the last valid step
    assert not outs[0][2:, :, 1].any() and not outs[0][:, :, 2].any()
    np.testing.assert_array_equal(outs[1][:, 2], h0[:, 2])


def test_gru_linear_before_reset():
    T, N, I, H = 4, 2, 3, 5
    X = RNG.normal(size=(T, N, I)).astype(np.float32)
    W, R, B = weights("gru", 1, I, H)
    Y, Yh = run("GRU", X, W, R, B, hidden_size=H, linear_before_reset=1, n_outputs=2)
    ref = naive("gru", X, W, R, B, None, None, None, None, "forward", lbr=1)
    np.testing.assert_allclose(Y, ref[0], rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(Yh, ref[1], rtol=1e-5, atol=1e-5)


def test_lstm_input_forget_without_bias():
    T, N, I, H = 3, 2, 2, 4
    X = RNG.normal(size=(T, N, I)).astype(np.float32)
    W, R, _ = weights("lstm", 1, I, H)
    Y, Yh, Yc = run("LSTM", X, W, R, input_forget=1)
    ref = naive("lstm", X, W, R, None, None, None, None, None, "forward", input_forget=1)
    np.testing.assert_allclose(Yc, ref[2], rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(Y, ref[0], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("kind", ["rnn", "gru", "lstm"])
def test_layout_1_is_the_transpose_of_layout_0(kind):
    T, N, I, H = 4, 3, 2, 3
    X = RNG.normal(size=(T, N, I)).astype(np.float32)
    W, R, B = weights(kind, 2, I, H)
    h0 = RNG.normal(size=(2, N, H)).astype(np.float32)
    extra = [h0] + ([h0 * 0.5] if kind == "lstm" else [])
    a = run(kind.upper(), X, W, R, B, None, *extra, direction="bidirectional")
    extra1 = [e.transpose(1, 0, 2) for e in extra]
    b = run(kind.upper(), X.transpose(1, 0, 2), W, R, B, None, *extra1,
            direction="bidirectional", layout=1)
    np.testing.assert_allclose(b[0], a[0].transpose(2, 0, 1, 3), rtol=1e-6)
    np.testing.assert_allclose(b[1], a[1].transpose(1, 0, 2), rtol=1e-6)


def test_activations_with_alpha_beta_and_clip():
    T, N, I, H = 3, 2, 2, 3
    X = RNG.normal(size=(T, N, I)).astype(np.float64)
    W, R, B = (a.astype(np.float64) for a in weights("rnn", 1, I, H))
    Y = run("RNN", X, W, R, B, n_outputs=1, activations=["LeakyRelu"], activation_alpha=[0.2])
    ref = naive("rnn", X, W, R, B, None, None, None, None, "forward",
                g=lambda v: np.where(v >= 0, v, 0.2 * v))[0]
    assert Y.dtype == np.float64
    np.testing.assert_allclose(Y, ref, rtol=1e-12)
    Yc = run("RNN", X, W, R, B, n_outputs=1, activations=["Affine"], activation_alpha=[1.0],
             activation_beta=[0.0], clip=0.1)
    assert np.abs(Yc).max() <= 0.1 + 1e-12


def test_gru_hardsigmoid_default_parameters():
    T, N, I, H = 2, 1, 2, 2
    X = RNG.normal(size=(T, N, I)).astype(np.float32)
    W, R, B = weights("gru", 1, I, H)
    Y = run("GRU", X, W, R, B, n_outputs=1, activations=["HardSigmoid", "Tanh"])
    ref = naive("gru", X, W, R, B, None, None, None, None, "forward",
                f=lambda v: np.clip(0.2 * v + 0.5, 0, 1))[0]
    np.testing.assert_allclose(Y, ref, rtol=1e-5, atol=1e-6)


def test_float16_computes_in_float32_and_returns_float16():
    T, N, I, H = 3, 2, 2, 2
    X = RNG.normal(size=(T, N, I)).astype(np.float16)
    W, R, B = (a.astype(np.float16) for a in weights("lstm", 1, I, H))
    Y, Yh, Yc = run("LSTM", X, W, R, B)
    assert Y.dtype == Yh.dtype == Yc.dtype == np.float16
    ref = naive("lstm", X, W, R, B.astype(np.float64), None, None, None, None, "forward")
    np.testing.assert_allclose(Y.astype(np.float64), ref[0], atol=3e-3)


def test_only_requested_outputs_and_opset7():
    X = np.zeros((2, 1, 1), np.float32)
    W, R, B = weights("rnn", 1, 1, 2)
    Y = run("RNN", X, W, R, B, opset=7, n_outputs=1)
    assert isinstance(Y, np.ndarray) and Y.shape == (2, 1, 1, 2)


def test_shape_and_attribute_errors():
    X = np.zeros((2, 1, 3), np.float32)
    W, R, B = weights("gru", 1, 3, 2)
    with pytest.raises(ShapeError, match="W has shape"):
        run("GRU", X, W[:, :5], R, B)
    with pytest.raises(InputError, match="direction"):
        run("GRU", X, W, R, B, direction="sideways")
    with pytest.raises(InputError, match="unknown activation"):
        run("GRU", X, W, R, B, activations=["Sigmoid", "Gelu"])
    with pytest.raises(ShapeError, match="sequence_lens"):
        run("GRU", X, W, R, B, np.array([1, 2], np.int32))


# ----------------------------------------------------------------------------------- GPU

def _has_gpu() -> bool:
    cp = cupy_module()
    try:
        return cp is not None and cp.cuda.runtime.getDeviceCount() > 0
    except Exception:  # noqa: BLE001 - no driver or no device
        return False


requires_gpu = pytest.mark.skipif(not _has_gpu(), reason="needs cupy and a CUDA GPU")


@pytest.mark.gpu
@requires_gpu
@pytest.mark.parametrize("kind", ["rnn", "gru", "lstm"])
def test_recurrent_kernels_on_cupy_match_numpy(kind):
    cp = cupy_module()
    T, N, I, H = 4, 3, 2, 3
    X = RNG.normal(size=(T, N, I)).astype(np.float32)
    W, R, B = weights(kind, 2, I, H)
    lens = np.array([4, 1, 2], np.int32)
    ref = run(kind.upper(), X, W, R, B, lens, direction="bidirectional")
    got = run(kind.upper(), *(cp.asarray(v) for v in (X, W, R, B, lens)),
              direction="bidirectional")
    for g, r in zip(got, ref):
        assert isinstance(g, cp.ndarray)
        np.testing.assert_allclose(cp.asnumpy(g), r, rtol=1e-5, atol=1e-6)
