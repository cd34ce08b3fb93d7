"""``NhwcConvChain`` (MobileNet's inverted residual: 1x1 expand -> depthwise 3x3 -> 1x1
project, written by the layout pass) and its C kernel ``dwconv_avx2.chain``: bit for bit the
three NhwcConv layers one after another on the C path, whatever the band size, the row ranges
split over the pool, the channel tails, strides, pads, residual, NaN/Inf; within float32
rounding of the numpy path; the empty batch; the node's kept call blocks; the fallbacks."""

from __future__ import annotations

import numpy as np
import pytest

from workbench import compiled
from workbench.ops import conv_nhwc
from workbench.ops.registry import FUSED_DOMAIN, NodeContext, lookup

RNG = np.random.default_rng(2323)
RELU6, NONE = ("Clip", [0.0, 6.0]), ("", [])


@pytest.fixture(scope="module")
def chain():
    why = compiled.c_unavailable("dwconv_avx2") or compiled.c_unavailable("gemm_avx2")
    if why:
        pytest.skip(why)
    if not compiled.wait(["dwconv_avx2", "gemm_avx2"], timeout=300):
        pytest.skip(f"C kernels not available: {compiled.status()['modules']}")
    return compiled.kernel("dwconv_avx2.chain")


def _case(n, h, w, c0, c1, m, stride, pads, has_e, has_p, has_z):
    def r(*shape):
        return RNG.standard_normal(shape).astype(np.float32)
    oh, ow = (h + pads[0] + pads[2] - 3) // stride + 1, (w + pads[1] + pads[3] - 3) // stride + 1
    return dict(X=r(n, h, w, c0 if has_e else c1),
                We=r(1, 1, c0, c1) if has_e else None, Be=r(c1) if has_e else None,
                Wd=r(3, 3, 1, c1), Bd=r(c1),
                Wp=r(1, 1, c1, m) if has_p else None, Bp=r(m) if has_p else None,
                Z=r(n, oh, ow, m) if has_z else None)


def _attrs(stride, pads, acts=(RELU6, RELU6, NONE)):
    return dict(strides=[stride, stride], pads=list(pads), expand_activation=acts[0][0],
                expand_params=acts[0][1], dw_activation=acts[1][0], dw_params=acts[1][1],
                project_activation=acts[2][0], project_params=acts[2][1])


def _chain(a, attrs, ctx=None, other=None, first=1):
    return lookup("NhwcConvChain", FUSED_DOMAIN, 1).fn(*a.values(), other, ctx=ctx,
                                                       interleave_first=first, **attrs)


def _layers(a, attrs):
    """The three NhwcConv layers one after another (the reference)."""
    return conv_nhwc._chain_stages(*a.values(), {**attrs, "auto_pad": "NOTSET"}, None)


def _same_bits(x, y):
    assert x.shape == y.shape and x.dtype == y.dtype == np.float32
    np.testing.assert_array_equal(x.view(np.int32), y.view(np.int32))


def _c_calls(monkeypatch):
    calls = []
    real = conv_nhwc._chain_blocks
    monkeypatch.setattr(conv_nhwc, "_chain_blocks",
                        lambda *a: calls.append(real(*a)) or calls[-1])
    return calls


# (n, h, w, c0, c1, m, stride, pads, has_e, has_p, has_z): every channel tail of the 8-lane
# blocks (c1 1, 7, 17, 58) and of the GEMM's 16-column panels (m 9, 24, 40), odd sizes,
# rows shorter than the kernel, pads of 0 and 2 (a whole kernel row outside), both strides,
# each stage left out in turn
CASES = [(1, 5, 7, 5, 17, 9, 1, (1, 1, 1, 1), 1, 1, 0),
         (2, 8, 8, 8, 58, 24, 1, (1, 1, 1, 1), 1, 1, 1),
         (2, 13, 6, 3, 7, 40, 2, (1, 1, 1, 1), 1, 1, 0),
         (1, 9, 11, 16, 32, 16, 2, (0, 1, 1, 0), 1, 1, 1),
         (1, 1, 1, 4, 7, 5, 1, (1, 1, 1, 1), 1, 1, 1),
         (2, 2, 3, 6, 1, 3, 2, (2, 0, 1, 2), 1, 1, 0),
         (1, 7, 5, 9, 17, 9, 1, (0, 0, 0, 0), 1, 0, 0),
         (2, 6, 9, 0, 24, 8, 2, (1, 1, 1, 1), 0, 1, 0),
         (1, 10, 4, 0, 17, 17, 1, (1, 1, 1, 1), 0, 1, 1)]


@pytest.mark.parametrize("case", CASES)
def test_the_chain_is_the_three_layers_bit_for_bit(chain, monkeypatch, case):
    """Bands of 1 row, of a few rows and of the default size, one call or row ranges split
    over the pool: the same bits as the layers one after another on the C path (the same
    instructions on the same values), and numpy's answer within float32 rounding."""
    *shape, stride, pads, has_e, has_p, has_z = case
    a = _case(*shape, stride, pads, has_e, has_p, has_z)
    attrs = _attrs(stride, pads)
    ref = _layers(a, attrs)
    rows = shape[0] * ((shape[1] + pads[0] + pads[2] - 3) // stride + 1)
    for band_bytes, split in ((1, False), (6000, True), (conv_nhwc._CHAIN_BYTES, False)):
        with monkeypatch.context() as mp:
            mp.setattr(conv_nhwc, "_CHAIN_BYTES", band_bytes)
            if split:
                mp.setattr(conv_nhwc, "n_workers", lambda: 2)
                mp.setattr(conv_nhwc, "_split_min", lambda: 0)
            calls = _c_calls(mp)
            _same_bits(_chain(a, attrs), ref)
            assert len(calls) == 1   # the C path ran: one call block per row range
            assert (len(calls[0]) > 1) == (split and rows > 1)
    with compiled.disabled():
        np.testing.assert_allclose(_chain(a, attrs), ref, rtol=1e-4, atol=1e-4)


def test_nan_inf_and_the_empty_batch(chain):
    a = _case(2, 6, 7, 5, 17, 9, 1, (1, 1, 1, 1), 1, 1, 1)
    a["X"][0, 0, 0, 1] = np.nan   # a border pixel
    a["X"][1, 3, 3, 2] = np.inf   # an interior one: inf - inf in the 1x1 sums gives NaN
    a["Wd"][1, 1, 0, 3] = -np.inf
    attrs = _attrs(1, (1, 1, 1, 1), (NONE, RELU6, NONE))
    ref = _layers(a, attrs)
    assert np.isnan(ref).any()
    _same_bits(_chain(a, attrs), ref)
    e = _case(0, 6, 7, 5, 17, 9, 2, (1, 1, 1, 1), 1, 1, 1)
    y = _chain(e, _attrs(2, (1, 1, 1, 1)))
    assert y.shape == (0, 3, 4, 9) and y.dtype == np.float32


def test_the_node_keeps_its_call_blocks_and_sees_new_weights(chain, monkeypatch):
    a = _case(2, 8, 8, 8, 24, 16, 1, (1, 1, 1, 1), 1, 1, 1)
    attrs = _attrs(1, (1, 1, 1, 1))
    ctx = NodeContext("n", "NhwcConvChain", 1, 1)
    calls = _c_calls(monkeypatch)
    first = _chain(a, attrs, ctx)
    blocks = ctx.extra["chain_bound"]
    _same_bits(_chain(a, attrs, ctx), first)
    assert len(calls) == 1 and ctx.extra["chain_bound"] is blocks   # kept, not rebuilt
    assert "chain_fast" in ctx.extra
    # X a channel slice of a wider array (ShuffleNet's branches): through the kept call too
    wide = dict(a, X=np.concatenate([a["X"], a["X"]], axis=3)[..., 8:])
    assert not wide["X"].flags.c_contiguous
    _same_bits(_chain(wide, attrs, ctx), first)
    assert len(calls) == 1
    # weights changed in place: packed again, new blocks
    a["We"] *= 0.5
    a["Wp"] += 1.0
    _same_bits(_chain(a, attrs, ctx), _layers(a, attrs))
    assert len(calls) == 2
    # another input shape: new blocks as well
    b = dict(a, X=a["X"][:1].copy(), Z=a["Z"][:1].copy())
    _same_bits(_chain(b, attrs, ctx), _layers(b, attrs))
    assert len(calls) == 3


def test_fallbacks_run_the_layers(chain, monkeypatch):
    """Kernels off, an activation that is no clip, float64: the layers one after another
    (no C chain call), with the same answers as those layers."""
    a = _case(1, 5, 6, 4, 9, 5, 2, (1, 1, 1, 1), 1, 1, 1)
    calls = _c_calls(monkeypatch)
    leaky = _attrs(2, (1, 1, 1, 1), (("LeakyRelu", [0.1]), RELU6, NONE))
    _same_bits(_chain(a, leaky), _layers(a, leaky))
    d = {k: None if v is None else v.astype(np.float64) for k, v in a.items()}
    attrs = _attrs(2, (1, 1, 1, 1))
    assert _chain(d, attrs).dtype == np.float64
    ctx = NodeContext("n", "NhwcConvChain", 1, 1)
    with compiled.disabled():
        y = _chain(a, attrs, ctx)
        assert "chain_bound" not in ctx.extra
        np.testing.assert_array_equal(y, _layers(a, attrs))
    assert not calls
    with pytest.raises(Exception, match="NhwcConvChain"):
        _chain(dict(a, Wd=None), attrs)


@pytest.mark.parametrize("case", [CASES[1], CASES[2], CASES[8]])
def test_interleaved_into_a_two_group_shuffle(chain, monkeypatch, case):
    """With the other half ``I`` (ShuffleNet's concat + channel shuffle after a branch): the
    bits of the layers then ``NhwcConcatShuffle(I, y)`` (or ``(y, I)``), ``I`` contiguous or
    a channel slice, one range or split over the pool; halves that do not match (or no
    project) run those steps."""
    *shape, stride, pads, has_e, has_p, has_z = case
    a = _case(*shape, stride, pads, has_e, has_p, has_z)
    attrs = _attrs(stride, pads)
    y = _layers(a, attrs)
    shuffle = lookup("NhwcConcatShuffle", FUSED_DOMAIN, 1).fn
    wide = RNG.standard_normal(y.shape[:3] + (2 * y.shape[3] + 3,)).astype(np.float32)
    for other in (RNG.standard_normal(y.shape).astype(np.float32), wide[..., 3:3 + y.shape[3]]):
        for first in (1, 0):
            want = shuffle(*((other, y) if first else (y, other)), groups=2)
            for split in (False, True):
                with monkeypatch.context() as mp:
                    calls = _c_calls(mp)
                    if split:
                        mp.setattr(conv_nhwc, "n_workers", lambda: 2)
                        mp.setattr(conv_nhwc, "_split_min", lambda: 0)
                        mp.setattr(conv_nhwc, "_CHAIN_BYTES", 6000)
                    _same_bits(_chain(a, attrs, other=other, first=first), want)
                    assert len(calls) == 1
    with monkeypatch.context() as mp:   # halves of different widths: the two steps
        calls = _c_calls(mp)
        odd = np.concatenate([other, other[..., :1]], axis=3)
        _same_bits(_chain(a, attrs, other=odd), shuffle(odd, y, groups=2))
        assert not calls
