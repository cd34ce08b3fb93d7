"""The C kernel module ``gemm_avx2`` (``kernels/gemm_avx2.c``): the channels-last 1x1
convolution's GEMM with its fused epilogue, against numpy (``A @ B + bias + Z`` clipped), its
tails, NaN/Inf, row ranges, the plan-level result and the numpy fallback."""

from __future__ import annotations

import sys

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from workbench import backend, compiled
from workbench.compiled import cache
from workbench.graph import layout
from workbench.ops import conv_nhwc
from workbench.ops.registry import FUSED_DOMAIN, lookup

RNG = np.random.default_rng(23)
INF = np.inf


@pytest.fixture(scope="module")
def gemm():
    why = compiled.c_unavailable("gemm_avx2")
    if why:
        pytest.skip(why)
    if not compiled.wait(["gemm_avx2"], timeout=300):
        pytest.skip(f"gemm_avx2 is not available: {compiled.status()['modules']}")
    return compiled.kernel("gemm_avx2.gemm")


def _run(k, a, w, b=None, z=None, lo=-INF, hi=INF, ranges=None, y=None):
    rows, K = a.shape
    M = w.shape[1]
    wp, bp = conv_nhwc.pack_panels(w, b)
    y = np.full((rows, M), 12345.0, np.float32) if y is None else y
    for r0, r1 in ranges or [(0, rows)]:
        k(a, wp, bp, a if z is None else z, y, K, M, r0, r1, int(z is not None), lo, hi)
    return y


def _ref(a, w, b=None, z=None, lo=-INF, hi=INF):
    y = a.astype(np.float64) @ w.astype(np.float64)
    if b is not None:
        y += b
    if z is not None:
        y += z
    return np.clip(y, lo, hi)


def _close(got, want, K):
    assert got.dtype == np.float32
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * max(1, K))


def test_every_tail_and_epilogue(gemm):
    """Rows 1..13 (whole 6-row tiles and every row tail), columns that end a panel anywhere
    (<= 8 columns: one vector; 9..15: a masked second), K from 1 up; with and without bias
    and residual; no clip, ReLU, ReLU6."""
    epilogues = [(False, False, -INF, INF), (True, False, 0.0, INF), (True, True, 0.0, 6.0),
                 (False, True, -1.5, 0.5)]
    i = 0
    for rows in (1, 5, 6, 7, 13):
        for K in (1, 5, 17, 33):
            for M in (1, 5, 8, 9, 16, 17, 23, 40):
                has_b, has_z, lo, hi = epilogues[i % len(epilogues)]
                i += 1
                a = RNG.standard_normal((rows, K)).astype(np.float32)
                w = RNG.standard_normal((K, M)).astype(np.float32)
                b = RNG.standard_normal(M).astype(np.float32) if has_b else None
                z = RNG.standard_normal((rows, M)).astype(np.float32) if has_z else None
                got = _run(gemm, a, w, b, z, lo, hi)
                _close(got, _ref(a, w, b, z, lo, hi), K)


def test_a_larger_k_than_one_row_block(gemm):
    """K large enough that the kernel takes its rows in several blocks."""
    a = RNG.standard_normal((61, 700)).astype(np.float32)
    w = RNG.standard_normal((700, 35)).astype(np.float32)
    b = RNG.standard_normal(35).astype(np.float32)
    _close(_run(gemm, a, w, b, lo=0.0, hi=INF), _ref(a, w, b, lo=0.0), 700)


def test_empty_rows_ranges_and_k0(gemm):
    a = np.zeros((0, 7), np.float32)
    w = RNG.standard_normal((7, 9)).astype(np.float32)
    assert _run(gemm, a, w).shape == (0, 9)
    a = RNG.standard_normal((4, 7)).astype(np.float32)
    y = _run(gemm, a, w, ranges=[(2, 2), (3, 1)])
    assert (y == 12345.0).all()   # empty and reversed ranges write nothing
    b = RNG.standard_normal(9).astype(np.float32)
    y = _run(gemm, np.zeros((3, 0), np.float32), np.zeros((0, 9), np.float32), b)
    np.testing.assert_array_equal(y, np.broadcast_to(b, (3, 9)))   # K = 0: the bias


def test_row_ranges_split_the_work_exactly(gemm):
    """Ranges as the engine's workers take them: each writes its rows only, together the
    same as one call, bit for bit."""
    a = RNG.standard_normal((50, 24)).astype(np.float32)
    w = RNG.standard_normal((24, 30)).astype(np.float32)
    b = RNG.standard_normal(30).astype(np.float32)
    z = RNG.standard_normal((50, 30)).astype(np.float32)
    whole = _run(gemm, a, w, b, z, 0.0, 6.0)
    part = _run(gemm, a, w, b, z, 0.0, 6.0, ranges=[(7, 19)])
    assert (part[:7] == 12345.0).all() and (part[19:] == 12345.0).all()
    np.testing.assert_array_equal(part[7:19], whole[7:19])
    split = _run(gemm, a, w, b, z, 0.0, 6.0, ranges=[(0, 7), (7, 19), (19, 44), (44, 50)])
    np.testing.assert_array_equal(split, whole)


def test_nan_and_inf_propagate_like_numpy(gemm):
    """NaN in a row makes that row's outputs NaN and the clip keeps NaN (as numpy's clip);
    Inf in A, the bias or the residual is clipped to the bounds or kept without a clip."""
    a = RNG.standard_normal((9, 11)).astype(np.float32)
    w = RNG.standard_normal((11, 19)).astype(np.float32)
    b = RNG.standard_normal(19).astype(np.float32)
    z = RNG.standard_normal((9, 19)).astype(np.float32)
    a[2, 4] = np.nan
    a[5, 0] = INF
    b[17] = -INF
    z[7, 3] = INF
    for lo, hi in ((-INF, INF), (0.0, 6.0), (0.0, INF)):
        with np.errstate(invalid="ignore"):
            want = _ref(a, w, b, z, lo, hi)
        got = _run(gemm, a, w, b, z, lo, hi)
        np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
        ok = np.isfinite(want)
        np.testing.assert_array_equal(got[~ok & ~np.isnan(want)], want[~ok & ~np.isnan(want)])
        _close(got[ok], want[ok], 11)


def _nhwc(x, w, b, z=None, activation="Clip", params=(0.0, 6.0), ctx=None):
    return lookup("NhwcConv", FUSED_DOMAIN, 1).fn(
        x, w, b, z, activation=activation, activation_params=list(params), ctx=ctx)


def test_packed_weights_are_kept_and_refreshed(gemm):
    """The node's packed weights are made once and reused; an updated weight (another
    array, or the same one changed in place) is packed again."""
    from workbench.ops.registry import NodeContext

    ctx = NodeContext("n", "NhwcConv", 1, 1)
    x = RNG.standard_normal((2, 5, 3, 12)).astype(np.float32)
    w = RNG.standard_normal((1, 1, 12, 20)).astype(np.float32)
    b = RNG.standard_normal(20).astype(np.float32)
    y1 = _nhwc(x, w, b, ctx=ctx)
    packed = ctx.extra["gemm_avx2_pack"][5]
    np.testing.assert_array_equal(_nhwc(x, w, b, ctx=ctx), y1)
    assert ctx.extra["gemm_avx2_pack"][5] is packed
    w *= -1.0   # in place, as an optimizer step
    with compiled.disabled():
        want = _nhwc(x, w, b)
    _close(_nhwc(x, w, b, ctx=ctx), want, 12)
    w2 = np.ascontiguousarray(w * 0.5)
    with compiled.disabled():
        want = _nhwc(x, w2, b)
    _close(_nhwc(x, w2, b, ctx=ctx), want, 12)


def _small_net():
    """Stem 3x3, 1x1 expand + ReLU6, depthwise 3x3, 1x1 project + bias + residual: a
    network the layout pass makes channels-last, with odd channel counts."""
    def t(shape, name):
        return numpy_helper.from_array(
            (RNG.standard_normal(shape) * 0.3).astype(np.float32), name)
    c, e = 13, 37
    inits = [t((c, 3, 3, 3), "w0"), t((c,), "b0"), t((e, c, 1, 1), "w1"), t((e,), "b1"),
             t((e, 1, 3, 3), "w2"), t((c, e, 1, 1), "w3"), t((c,), "b3"),
             numpy_helper.from_array(np.float32(0), "lo"),
             numpy_helper.from_array(np.float32(6), "hi")]
    nodes = [
        helper.make_node("Conv", ["x", "w0", "b0"], ["s"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["s"], ["s1"]),
        helper.make_node("Conv", ["s1", "w1", "b1"], ["e"]),
        helper.make_node("Clip", ["e", "lo", "hi"], ["e1"]),
        helper.make_node("Conv", ["e1", "w2"], ["d"], group=e, pads=[1, 1, 1, 1]),
        helper.make_node("Clip", ["d", "lo", "hi"], ["d1"]),
        helper.make_node("Conv", ["d1", "w3", "b3"], ["p"]),
        helper.make_node("Add", ["p", "s1"], ["y"]),
    ]
    g = helper.make_graph(
        nodes, "net", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3, 9, 11])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", c, 9, 11])], inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def test_a_channels_last_network_agrees_with_the_plain_path(gemm, monkeypatch):
    model = _small_net()
    x = RNG.standard_normal((3, 3, 9, 11)).astype(np.float32)
    # the layers one by one: without the layout pass' NhwcConvChain and the stem's own C
    # kernel (tests/compiled/test_conv_chain.py, test_fewc.py)
    monkeypatch.setattr(layout, "chain_convs", lambda g, nodes, *a, **k: nodes)
    monkeypatch.setattr(conv_nhwc, "_FEWC_MAX", 0)
    rep = backend.prepare(model)
    assert sum(n.op_type == "NhwcConv" for n in rep.plan.graph.nodes) == 4
    calls, packs = [], []
    run, pack = conv_nhwc._pointwise_compiled, conv_nhwc.pack_panels
    monkeypatch.setattr(conv_nhwc, "_pointwise_compiled", lambda *a: calls.append(1) or run(*a))
    monkeypatch.setattr(conv_nhwc, "pack_panels", lambda *a: packs.append(1) or pack(*a))
    got = [np.asarray(rep.run([x])[0]) for _ in range(2)]   # the second with packed weights
    assert len(calls) == 4 and len(packs) == 3   # the 1x1 layers and the 3x3 stem (indirect),
    # packed on the first run
    np.testing.assert_array_equal(got[0], got[1])
    with compiled.disabled():
        nhwc_numpy = np.asarray(rep.run([x])[0])
        plain = np.asarray(backend.prepare(model, layout=None).run([x])[0])
    for want in (nhwc_numpy, plain):
        np.testing.assert_allclose(got[1], want, rtol=0, atol=2e-5 * np.abs(want).max())


def test_numpy_fallback_when_disabled_or_unavailable(monkeypatch):
    """Off (``compiled.disabled()``): no kernel, the numpy path gives the answer. Without a
    compiler or without AVX2/FMA the module is "unavailable" with a one-line reason."""
    with compiled.disabled():
        assert compiled.kernel("gemm_avx2.gemm") is None
        x = RNG.standard_normal((1, 4, 4, 6)).astype(np.float32)
        w = RNG.standard_normal((1, 1, 6, 10)).astype(np.float32)
        b = RNG.standard_normal(10).astype(np.float32)
        want = np.clip(x.reshape(-1, 6) @ w.reshape(6, 10) + b, 0, 6).reshape(1, 4, 4, 10)
        np.testing.assert_allclose(_nhwc(x, w, b), want, rtol=1e-5, atol=1e-5)
    monkeypatch.setattr(cache, "compiler", lambda: None)
    monkeypatch.setenv("CC", "no-such-cc")
    why = compiled.c_unavailable("gemm_avx2")
    assert why and "no C compiler" in why and "numpy" in why and "\n" not in why
    monkeypatch.setattr(cache, "cpu_flags", lambda: frozenset({"sse2", "avx"}))
    assert "lacks avx2, fma" in compiled.c_unavailable("gemm_avx2")
    assert compiled.cannot_build(["gemm_avx2"]) == compiled.c_unavailable("gemm_avx2")


def test_unavailable_module_is_never_built(fresh_home, monkeypatch):
    """A fresh engine state where the CPU lacks the flags: the module is reported
    unavailable, nothing is built or loaded, and the 1x1 path runs on numpy."""
    monkeypatch.setattr(cache, "cpu_flags", lambda: frozenset({"sse2"}))
    assert compiled.kernel("gemm_avx2.gemm") is None
    assert compiled.wait(["gemm_avx2"], timeout=30) is False
    st = compiled.status()["modules"]["gemm_avx2"]
    assert st["state"] == "unavailable" and "lacks avx2" in st["why"]
    assert not compiled._PROCS
    with pytest.raises(RuntimeError, match="lacks avx2"):
        compiled.warmup(["gemm_avx2"], progress=None)
    if compiled.can_build() is None:   # with numba: the other modules build, not it
        monkeypatch.setattr(compiled, "_builder", lambda *a, **k: [
            sys.executable, "-c", "pass"])
        r = compiled.warmup(["gemm_avx2", "conv_nhwc"], progress=None)
        assert r["modules"]["gemm_avx2"]["unavailable"]
        assert "lacks avx2" in r["modules"]["gemm_avx2"]["error"]


def test_the_engines_workers_split_the_rows(gemm, monkeypatch):
    """Several workers: row ranges of whole tiles, each a kernel call from the pool; the same
    result as numpy's path."""
    monkeypatch.setenv("WORKBENCH_NUM_THREADS", "3")
    assert len(conv_nhwc._tile_jobs(61)) > 3
    x = RNG.standard_normal((1, 61, 7, 10)).astype(np.float32)
    w = RNG.standard_normal((1, 1, 10, 21)).astype(np.float32)
    b = RNG.standard_normal(21).astype(np.float32)
    z = RNG.standard_normal((1, 61, 7, 21)).astype(np.float32)
    with compiled.disabled():
        want = _nhwc(x, w, b, z)
    _close(_nhwc(x, w, b, z), want, 10)
