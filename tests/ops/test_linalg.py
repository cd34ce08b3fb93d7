"""MatMul, Gemm, MatMulInteger, Einsum, Det against numpy expectations written here."""

from __future__ import annotations

import numpy as np
import pytest

from workbench.errors import InputError, ShapeError
from workbench.ops.registry import attribute_defaults, lookup

RNG = np.random.default_rng(3)


def run(op, *inputs, opset=22, **attrs):
    entry = lookup(op, "", opset)
    kw = dict(attribute_defaults(op, "", opset))
    kw.update(attrs)
    return entry.fn(*inputs, **kw)


# --------------------------------------------------------------------------------------------
# MatMul
# --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("sa,sb", [
    ((3,), (3,)), ((3,), (3, 4)), ((2, 3), (3,)), ((5, 2, 3), (3, 4)), ((3,), (5, 3, 4)),
    ((2, 1, 2, 3), (4, 3, 2)), ((0, 3), (3, 4)), ((2, 0), (0, 3)), ((1, 2, 3), (6, 3, 1)),
])
def test_matmul_shapes(sa, sb):
    a = RNG.standard_normal(sa).astype(np.float32)
    b = RNG.standard_normal(sb).astype(np.float32)
    y = run("MatMul", a, b)
    ref = np.matmul(a.astype(np.float64), b.astype(np.float64))
    assert y.shape == ref.shape and y.dtype == np.float32
    np.testing.assert_allclose(y, ref, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dtype", [np.float16, np.float64, np.int32, np.int64, np.uint32,
                                   np.uint64, "bfloat16"])
def test_matmul_dtypes(dtype):
    if dtype == "bfloat16":
        dtype = pytest.importorskip("ml_dtypes").bfloat16
    a = RNG.integers(0, 5, (2, 3, 4)).astype(dtype)
    b = RNG.integers(0, 5, (4, 5)).astype(dtype)
    y = run("MatMul", a, b)
    assert y.dtype == np.dtype(dtype)
    np.testing.assert_array_equal(y.astype(np.float64),
                                  a.astype(np.float64) @ b.astype(np.float64))


def test_matmul_errors():
    with pytest.raises(ShapeError, match="inner dimensions"):
        run("MatMul", np.zeros((2, 3), np.float32), np.zeros((4, 2), np.float32))
    with pytest.raises(ShapeError, match="broadcast"):
        run("MatMul", np.zeros((2, 2, 3), np.float32), np.zeros((3, 3, 2), np.float32))
    with pytest.raises(ShapeError, match="rank"):
        run("MatMul", np.zeros((), np.float32), np.zeros((3,), np.float32))


# --------------------------------------------------------------------------------------------
# Gemm
# --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("transA,transB", [(0, 0), (1, 0), (0, 1), (1, 1)])
@pytest.mark.parametrize("cshape", [None, (), (1,), (5,), (4, 1), (1, 5), (4, 5)])
def test_gemm(transA, transB, cshape):
    a = RNG.standard_normal((3, 4) if transA else (4, 3)).astype(np.float32)
    b = RNG.standard_normal((5, 3) if transB else (3, 5)).astype(np.float32)
    c = None if cshape is None else RNG.standard_normal(cshape).astype(np.float32)
    y = run("Gemm", a, b, c, opset=13, transA=transA, transB=transB, alpha=0.5, beta=-2.0)
    ref = 0.5 * (a.T if transA else a) @ (b.T if transB else b)
    if c is not None:
        ref = ref - 2.0 * c
    assert y.shape == (4, 5) and y.dtype == np.float32
    np.testing.assert_allclose(y, ref, rtol=1e-5, atol=1e-5)


def test_gemm_old_opsets_and_dtypes():
    a = RNG.standard_normal((2, 3)).astype(np.float64)
    b = RNG.standard_normal((3, 4)).astype(np.float64)
    c = RNG.standard_normal(4).astype(np.float64)
    for opset in (6, 7, 9, 11):
        np.testing.assert_allclose(run("Gemm", a, b, c, opset=opset, broadcast=1)
                                   if opset < 7 else run("Gemm", a, b, c, opset=opset),
                                   a @ b + c)
    ai = RNG.integers(-3, 3, (2, 3)).astype(np.int64)
    bi = RNG.integers(-3, 3, (3, 4)).astype(np.int64)
    yi = run("Gemm", ai, bi, None, opset=11)
    assert yi.dtype == np.int64
    np.testing.assert_array_equal(yi, ai @ bi)
    h = a.astype(np.float16)
    assert run("Gemm", h, b.astype(np.float16), opset=13).dtype == np.float16
    with pytest.raises(ShapeError, match="broadcast"):
        run("Gemm", a, b, np.zeros((3,)), opset=13)
    with pytest.raises(ShapeError, match="inner"):
        run("Gemm", a, b, None, opset=13, transA=1)


# --------------------------------------------------------------------------------------------
# MatMulInteger
# --------------------------------------------------------------------------------------------

def test_matmul_integer_zero_points():
    a = RNG.integers(0, 256, (2, 4, 3)).astype(np.uint8)
    b = RNG.integers(-128, 128, (3, 5)).astype(np.int8)
    azp = np.array([3, 200, 0, 17], np.uint8)  # per row of A
    bzp = np.array([1, -1, 0, 5, -128], np.int8)  # per column of B
    y = run("MatMulInteger", a, b, azp, bzp, opset=10)
    ref = (a.astype(np.int64) - azp.reshape(4, 1).astype(np.int64)) @ \
        (b.astype(np.int64) - bzp.astype(np.int64))
    assert y.dtype == np.int32
    np.testing.assert_array_equal(y, ref)
    y2 = run("MatMulInteger", a, b, np.array(7, np.uint8), None, opset=10)
    np.testing.assert_array_equal(y2, (a.astype(np.int64) - 7) @ b.astype(np.int64))
    y3 = run("MatMulInteger", a, b, opset=10)
    np.testing.assert_array_equal(y3, a.astype(np.int64) @ b.astype(np.int64))


# --------------------------------------------------------------------------------------------
# Einsum
# --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("eq,shapes", [
    ("ij,jk->ik", [(2, 3), (3, 4)]),
    ("ij,jk", [(2, 3), (3, 4)]),
    ("ii", [(3, 3)]),
    ("ii->i", [(3, 3)]),
    ("ij->ji", [(2, 3)]),
    ("bij, bjk -> bik", [(2, 3, 4), (2, 4, 5)]),
    ("...ij,...jk->...ik", [(2, 3, 4), (4, 5)]),
    ("...ij,...jk", [(2, 3, 4), (2, 4, 5)]),
    ("i,i", [(4,), (4,)]),
    ("i,j->ij", [(2,), (3,)]),
    ("Ba,aB", [(2, 3), (3, 2)]),
    ("bA,Ab", [(2, 3), (3, 2)]),
    ("ij...->...", [(2, 3, 4)]),
    ("abc,cd,de->abe", [(2, 3, 4), (4, 5), (5, 2)]),
])
def test_einsum_matches_numpy(eq, shapes):
    ops = [RNG.standard_normal(s).astype(np.float32) for s in shapes]
    y = run("Einsum", *ops, equation=eq)
    ref = np.einsum(eq.replace(" ", ""), *[o.astype(np.float64) for o in ops])
    assert y.dtype == np.float32 and y.shape == np.shape(ref)
    np.testing.assert_allclose(y, ref, rtol=1e-5, atol=1e-5)


def test_einsum_implicit_order_uppercase_first():
    a = RNG.standard_normal((2, 3)).astype(np.float32)
    # implicit output: indices appearing once, sorted by ASCII ('Z' < 'a')
    y = run("Einsum", a, equation="aZ")
    np.testing.assert_allclose(y, a.T)


def test_einsum_int_and_errors():
    a = RNG.integers(0, 5, (2, 3)).astype(np.int64)
    y = run("Einsum", a, a, equation="ij,ij->i")
    assert y.dtype == np.int64
    np.testing.assert_array_equal(y, (a * a).sum(1))
    f = np.zeros((2, 3), np.float32)
    with pytest.raises(InputError, match="2 input terms"):
        run("Einsum", f, equation="ij,jk->ik")
    with pytest.raises(ShapeError, match="rank"):
        run("Einsum", f, equation="ijk->i")
    with pytest.raises(ShapeError, match="size"):
        run("Einsum", f, f, equation="ij,ji->i")
    with pytest.raises(InputError, match="does not appear"):
        run("Einsum", f, equation="ij->k")
    with pytest.raises(InputError, match="only letters"):
        run("Einsum", f, equation="i1->i")


# --------------------------------------------------------------------------------------------
# Det
# --------------------------------------------------------------------------------------------

def test_det():
    x = RNG.standard_normal((2, 3, 4, 4)).astype(np.float32)
    y = run("Det", x)
    assert y.shape == (2, 3) and y.dtype == np.float32
    np.testing.assert_allclose(y, np.linalg.det(x.astype(np.float64)), rtol=1e-4, atol=1e-5)
    x2 = RNG.standard_normal((3, 3))
    assert run("Det", x2).shape == ()
    assert run("Det", x2.astype(np.float16)).dtype == np.float16
    with pytest.raises(ShapeError, match="M, M"):
        run("Det", np.zeros((2, 3), np.float32))


# --------------------------------------------------------------------------------------------
# the threaded GEMM helper (shared with the convolutions)
# --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("sa,sb", [((300, 400), (400, 500)), ((4, 200, 300), (4, 300, 200)),
                                   ((3, 1, 200, 300), (2, 300, 200)), ((200, 300), (5, 300, 64))])
def test_parallel_matmul_splits_match_matmul(monkeypatch, sa, sb):
    from workbench.ops import parallel

    monkeypatch.setenv("WORKBENCH_NUM_THREADS", "3")
    a = RNG.standard_normal(sa).astype(np.float32)
    b = RNG.standard_normal(sb).astype(np.float32)
    y = parallel.parallel_matmul(np, a, b)
    np.testing.assert_allclose(y, np.matmul(a, b), rtol=1e-4, atol=1e-3)
    np.testing.assert_allclose(run("MatMul", a, b), np.matmul(a, b), rtol=1e-4, atol=1e-3)


def test_single_threaded_blas_restores_thread_count():
    from workbench.ops import parallel

    ctls = parallel.blas_controller()
    if ctls is None:
        pytest.skip("threadpoolctl is not available")
    before = [c.get_num_threads() for c in ctls]
    with parallel.single_threaded_blas(ctls):
        assert all(c.get_num_threads() == 1 for c in ctls)
        with parallel.single_threaded_blas(ctls):
            assert all(c.get_num_threads() == 1 for c in ctls)
        assert all(c.get_num_threads() == 1 for c in ctls)
    assert [c.get_num_threads() for c in ctls] == before
