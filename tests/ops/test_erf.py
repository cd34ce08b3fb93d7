"""Erf without scipy (workbench/ops/elementwise.py ``erf_array``; the compiled kernel
``transformer.erf_f32``): accuracy on fixed dense samples against scipy and libm (test
oracles only), the special values, the compiled kernel against the numpy path bit for bit
(every tail of its 256-value chunks, the threaded split), and that preparing and running a
GELU model never imports scipy. The whole float32 range is swept by
``benchmarks/bench_erf.py``."""

from __future__ import annotations

import math
import subprocess
import sys

import numpy as np
import pytest

from workbench import compiled
from workbench.ops import elementwise as ew


def _ulps(got, ref):
    """|got - ref| in ulps of ref (in got's dtype); NaN must match NaN."""
    assert np.array_equal(np.isnan(got), np.isnan(ref))
    ok = ~np.isnan(ref)
    g = got[ok].astype(np.float64)
    r = ref[ok]
    return np.abs(g - r) / np.spacing(np.abs(r).astype(got.dtype)).astype(np.float64)


def _f32_sample():
    """Every 4,099th float32 bit pattern (a prime step: all exponents, mantissas spread),
    plus the edges."""
    bits = np.arange(0, 1 << 32, 4099, dtype=np.uint64).astype(np.uint32)
    x = bits.view(np.float32)
    edges = np.array([0.0, -0.0, 1e-45, -1e-45, 1.1754942e-38, 2.0, -2.0, np.nextafter(2, 0),
                      3.9192, 6.0, 1e30, np.inf, -np.inf, np.nan], np.float32)
    return np.concatenate([x, edges])


def test_erf_float32_within_one_ulp_of_the_rounded_erf():
    scipy_special = pytest.importorskip("scipy.special")
    x = _f32_sample()
    with np.errstate(invalid="ignore"):
        ref = scipy_special.erf(x.astype(np.float64)).astype(np.float32)
    got = ew._erf_fallback(x)
    assert got.dtype == np.float32
    u = _ulps(got, ref)
    assert u.max() <= 1.0
    assert (u > 0).mean() < 1e-3            # nearly always the correctly rounded value


def test_erf_float64_within_three_ulp():
    rng = np.random.default_rng(5)
    x = np.concatenate([rng.uniform(-6.5, 6.5, 6000), rng.standard_normal(2000) * 1e-3,
                        np.geomspace(1e-300, 6, 1500), -np.geomspace(1e-12, 6, 500),
                        [5e-324, -5e-324, 2.0, np.nextafter(2.0, 0), 6.0, 30.0]])
    ref = np.array([math.erf(v) for v in x])
    got = ew._erf_fallback(x)
    assert got.dtype == np.float64
    assert _ulps(got, ref).max() <= 3.0


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_erf_special_values(dtype):
    tiny = np.finfo(dtype).smallest_subnormal
    x = np.array([np.nan, np.inf, -np.inf, 0.0, -0.0, tiny, -tiny, 1e30], dtype)
    got = ew.erf_array(x)
    assert got.dtype == dtype
    assert np.isnan(got[0]) and got[1] == 1 and got[2] == -1 and got[7] == 1
    assert got[3] == 0 and not np.signbit(got[3]) and got[4] == 0 and np.signbit(got[4])
    if dtype == np.float64:   # 2/sqrt(pi) * tiny rounds to 1 subnormal step (float32: 1e-45)
        assert got[5] == tiny and got[6] == -tiny
    else:
        assert got[5] == np.float32(1.4e-45) and got[6] == -np.float32(1.4e-45)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_erf_keeps_0d_and_empty_shapes(dtype):
    for x in (np.asarray(dtype(0.75)), np.zeros((0, 3), dtype), np.ones((2, 0), dtype)):
        got = ew.erf_array(x)
        assert got.shape == x.shape and got.dtype == dtype
    assert abs(float(ew.erf_array(np.asarray(dtype(0.75)))) - math.erf(0.75)) < 1e-7


def test_erf_of_half_precision_goes_through_float32():
    x = np.array([-1.5, -0.25, 0.0, 0.5, 2.5], np.float16)
    got = ew.erf_array(x)
    assert got.dtype == np.float16
    np.testing.assert_array_equal(got, ew.erf_array(x.astype(np.float32)).astype(np.float16))


@pytest.fixture(scope="module")
def erf_kernel():
    from workbench.compiled import image
    if image.supported() is not None:
        pytest.skip(f"compiled kernels: {image.supported()}")
    if not compiled.wait(["transformer"], timeout=900) or \
            compiled.kernel("transformer.erf_f32") is None:
        pytest.skip(f"kernel transformer.erf_f32 is not available: {compiled.status()}")


@pytest.mark.parametrize("n", [1, 255, 256, 257, 1000, 4099])
def test_erf_kernel_gives_the_numpy_paths_bits(erf_kernel, n):
    rng = np.random.default_rng(n)
    # every branch: |x| < 2, the tail, beyond 6, NaN and infinities, one chunk all-tail
    x = (rng.standard_normal(n) * rng.choice([0.01, 1, 3, 10], n)).astype(np.float32)
    if n > 8:
        x[:5] = [np.nan, np.inf, -np.inf, -0.0, 2.0]
    if n == 4099:
        x[512:768] = rng.uniform(2, 5, 256) * rng.choice([-1, 1], 256)
    got = ew._erf_compiled(x)
    ref = ew._erf_fallback(x)
    assert got is not None and got.dtype == np.float32
    ok = ~np.isnan(ref)
    assert np.array_equal(np.isnan(got), ~ok)
    np.testing.assert_array_equal(got[ok].view(np.uint32), ref[ok].view(np.uint32))
    assert np.signbit(got[3]) if n > 8 else True


def test_erf_kernel_threaded_split_changes_nothing(erf_kernel, monkeypatch):
    from workbench.ops import parallel
    x = (np.random.default_rng(1).standard_normal((1 << 18) + 3) * 2).astype(np.float32)
    monkeypatch.setattr(parallel, "n_workers", lambda: 1)
    one = ew._erf_compiled(x)
    monkeypatch.setattr(parallel, "n_workers", lambda: 3)
    three = ew._erf_compiled(x)
    np.testing.assert_array_equal(one.view(np.uint32), three.view(np.uint32))
    np.testing.assert_array_equal(one.view(np.uint32), ew._erf_fallback(x).view(np.uint32))


def test_erf_array_is_the_same_with_and_without_compiled_kernels(erf_kernel):
    x = np.linspace(-5, 5, 3000, dtype=np.float32).reshape(3, -1)[:, ::2]   # not contiguous
    got = ew.erf_array(x)
    with compiled.disabled():
        ref = ew.erf_array(x)
    assert got.shape == x.shape
    np.testing.assert_array_equal(got, ref)


def test_a_gelu_model_never_imports_scipy():
    """Preparing BERT-like GELU regions probes them through the Erf kernel; neither that
    nor a run may import scipy (~28 MB of peak memory)."""
    code = (
        "import sys, numpy as np, onnx\n"
        "from onnx import helper as h, TensorProto as T\n"
        "import workbench.backend as backend\n"
        "w = np.random.default_rng(0).standard_normal((4, 4)).astype(np.float32)\n"
        "nodes = [h.make_node('MatMul', ['x', 'w'], ['m']),\n"
        "         h.make_node('Div', ['m', 's'], ['d']), h.make_node('Erf', ['d'], ['e']),\n"
        "         h.make_node('Add', ['e', 'one'], ['a']), h.make_node('Mul', ['m', 'a'], ['p']),\n"
        "         h.make_node('Mul', ['p', 'half'], ['y'])]\n"
        "inits = [onnx.numpy_helper.from_array(w, 'w'),\n"
        "         onnx.numpy_helper.from_array(np.array(1.4142135, np.float32), 's'),\n"
        "         onnx.numpy_helper.from_array(np.array(1, np.float32), 'one'),\n"
        "         onnx.numpy_helper.from_array(np.array(0.5, np.float32), 'half')]\n"
        "g = h.make_graph(nodes, 'g', [h.make_tensor_value_info('x', T.FLOAT, [2, 4])],\n"
        "                 [h.make_tensor_value_info('y', T.FLOAT, [2, 4])], inits)\n"
        "m = h.make_model(g, opset_imports=[h.make_opsetid('', 17)])\n"
        "rep = backend.prepare(m)\n"
        "x = np.linspace(-3, 3, 8, dtype=np.float32).reshape(2, 4)\n"
        "y = rep.run([x])[0]\n"
        "t = x @ w\n"
        "import math\n"
        "ref = np.array([[v * 0.5 * (1 + math.erf(v / math.sqrt(2))) for v in r] for r in t])\n"
        "assert np.allclose(y, ref, rtol=1e-5, atol=1e-6), (y, ref)\n"
        "print(sorted(k for k in sys.modules if k.split('.')[0] == 'scipy'))\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.strip() == "[]"
