"""Run our CUDA kernels' C source on the CPU, to check their index math without a GPU.

The CUDA C of every family is compiled with g++ as host code: ``__global__``/``__device__``
become plain functions, ``blockDim.x == 1`` and the launcher loops ``blockIdx.x`` over the grid,
so grid-stride kernels cover every element and one-block-per-row kernels see one thread per row
(the warp-shuffle block reductions are replaced by the identity, which is what they compute for
a single thread). float16 storage uses g++'s ``_Float16``.

:func:`fake_cupy` returns a numpy-backed stand-in for the ``cupy`` module (``ElementwiseKernel``
emulated the same way) so that the kernel wrappers and the cupy overrides run unchanged.
What this does NOT check: the warp reductions, real concurrency (races, shared memory),
NVRTC-specific compilation, cuBLAS, or performance.
"""

from __future__ import annotations

import ctypes
import hashlib
import re
import shutil
import subprocess
import tempfile
import types
from pathlib import Path

import numpy as np

from workbench.arrays.cuda import _base

GXX = shutil.which("g++")

HEADER = r"""
#include <math.h>
#include <cmath>
#include <cstring>
#include <cstdint>
#define __global__
#define __device__
#define __forceinline__ inline
#define WB_NEG_INF (-INFINITY)
struct wb_dim3 { unsigned int x, y, z; };
static wb_dim3 blockIdx = {0, 0, 0}, threadIdx = {0, 0, 0}, blockDim = {1, 1, 1},
               gridDim = {1, 1, 1};
extern "C" void wb_emu_set(int bx, int gx, int by, int gy) {
    blockIdx.x = bx; gridDim.x = gx; blockIdx.y = by; gridDim.y = gy; }
static inline void __syncthreads() {}
static inline float rsqrtf(float x) { return 1.f / std::sqrt(x); }
static inline float __int_as_float(int i) { float f; std::memcpy(&f, &i, 4); return f; }
"""

EMU_REDUCE = r"""
static inline float block_sum(float v) { return v; }
static inline float block_max(float v) { return v; }
"""

PRELUDE = {
    "float32": "typedef float T; static inline float ld(T v) { return v; } "
               "static inline T st(float v) { return v; }\n",
    "float16": "typedef _Float16 T; static inline float ld(T v) { return (float)v; } "
               "static inline T st(float v) { return (T)v; }\n",
}

_LIBS: dict = {}
_DIR = Path(tempfile.mkdtemp(prefix="wb_cuda_emu_"))


def compile_host(body: str, dtype: str):
    """ctypes library of a family body (CUDA C) compiled as host C++ for storage ``dtype``."""
    dt = np.dtype(dtype).name
    src = HEADER + PRELUDE[dt] + body.replace(_base.REDUCE, EMU_REDUCE)
    # the elementwise check sources carry the CUDA prelude: swap it for ours
    for p in _base._PRELUDE.values():
        src = src.replace(p, "")
    key = hashlib.sha1(src.encode()).hexdigest()[:16]
    lib = _LIBS.get(key)
    if lib is None:
        f = _DIR / f"{key}.cpp"
        so = _DIR / f"{key}.so"
        f.write_text(src)
        r = subprocess.run([GXX, "-O1", "-std=c++17", "-shared", "-fPIC", "-o", str(so), str(f)],
                           capture_output=True, text=True)
        if r.returncode:
            raise RuntimeError(f"g++ failed:\n{r.stderr}\n{src}")
        lib = ctypes.CDLL(str(so))
        _LIBS[key] = lib
    return lib


def _carg(a):
    if isinstance(a, np.ndarray):
        assert a.flags.c_contiguous, "kernel argument must be C-contiguous"
        return ctypes.c_void_p(a.ctypes.data)
    if isinstance(a, np.int32):
        return ctypes.c_int(int(a))
    if isinstance(a, np.int64):
        return ctypes.c_longlong(int(a))
    if isinstance(a, np.float32):
        return ctypes.c_float(float(a))
    raise TypeError(f"unsupported kernel argument {type(a).__name__}")


class EmuFunction:
    def __init__(self, lib, name):
        self.fn = getattr(lib, name)
        self.fn.restype = None
        self.set = lib.wb_emu_set

    def __call__(self, grid, block, args):
        cargs = [_carg(a) for a in args]
        g = int(grid[0])
        gy = int(grid[1]) if len(grid) > 1 else 1
        for by in range(gy):
            for b in range(g):
                self.set(b, g, by, gy)
                self.fn(*cargs)


def function(family, body, name, dtype):
    """Drop-in for ``_base.function``: the emulated kernel."""
    return EmuFunction(compile_host(body, dtype), name)


class FakeElementwiseKernel:
    """cupy.ElementwiseKernel on numpy arrays (all inputs cast to input 0's dtype)."""

    def __init__(self, in_params, out_params, operation, name):
        params = [p.split() for p in (in_params + "," + out_params).split(",") if p.strip()]
        self.ins = [n for _, n in params[:-1]]
        op = operation
        for t in {t for t, _ in params if len(t) == 1 and t.isupper()}:  # type placeholders
            op = re.sub(rf"\b{t}\b", "T", op)
        self.operation = op
        self.name = name

    def __call__(self, *inputs):
        from workbench.arrays.cuda.elementwise import check_source  # noqa: PLC0415
        dt = inputs[0].dtype
        arrs = [np.ascontiguousarray(a, dtype=dt) for a in np.broadcast_arrays(*inputs)]
        src = check_source(", ".join(f"T {n}" for n in self.ins), "T y", self.operation,
                           dt.name, self.name)
        y = np.empty(arrs[0].shape, dtype=dt)
        fn = EmuFunction(compile_host(src, dt.name), self.name)
        g, b = _base.grid(y.size)
        fn(g, b, arrs + [y, np.int64(y.size)])
        return y


class _NullContext:
    def __init__(self, *a, **k):
        pass

    def __enter__(self):
        return self

    def __exit__(self, *a):
        return False


class _Pool:
    def used_bytes(self):
        return 0

    def total_bytes(self):
        return 0


def fake_cupy():
    """A numpy-backed stand-in for the cupy module (arrays are numpy arrays)."""
    m = types.ModuleType("cupy")
    for name in dir(np):
        if not name.startswith("__"):
            setattr(m, name, getattr(np, name))
    m.ElementwiseKernel = FakeElementwiseKernel
    m.asnumpy = np.asarray
    m.get_default_memory_pool = lambda: _Pool()
    m.cuda = types.SimpleNamespace(Device=_NullContext,
                                   memory=types.SimpleNamespace(OutOfMemoryError=MemoryError))
    return m


def install(monkeypatch):
    """Make the CUDA kernel modules run emulated on numpy (returns the fake module)."""
    from workbench.arrays.cuda import conv, elementwise, norm, pool, softmax  # noqa: PLC0415
    fake = fake_cupy()
    for mod in (_base, conv, elementwise, norm, pool, softmax):
        monkeypatch.setattr(mod, "cupy_module", lambda: fake)
    monkeypatch.setattr(_base, "function", function)
    monkeypatch.setattr(elementwise, "_COMPILED", {})
    return fake
