"""Shared plumbing of the CUDA kernels: dtype preludes, compile cache, launch geometry.

Every family module keeps its CUDA C in one module-level string (``SOURCE``) written against a
type ``T`` and two conversions, ``ld(T) -> float`` and ``st(float) -> T``: arithmetic is always
float32, storage is float32 or float16 (``__half`` from ``<cuda_fp16.h>``). :func:`full_source`
prepends the prelude of a dtype; ``tests/gpu/test_cuda_sources.py`` compiles every family for
both dtypes with ``nvcc`` (no GPU needed), and cupy compiles the same text with NVRTC at first
use (``cupy.RawModule``), cached per (family, dtype).
"""

from __future__ import annotations

import numpy as np

from workbench.arrays import cupy_module

#: storage dtypes our RawKernels are written for (computation is float32)
DTYPES = ("float32", "float16")

_COMMON = r"""
#define WB_NEG_INF (__int_as_float((int)0xff800000u))
"""

_PRELUDE = {
    "float32": _COMMON + r"""
typedef float T;
__device__ __forceinline__ float ld(T v) { return v; }
__device__ __forceinline__ T st(float v) { return v; }
""",
    "float16": r"""
#include <cuda_fp16.h>
""" + _COMMON + r"""
typedef __half T;
__device__ __forceinline__ float ld(T v) { return __half2float(v); }
__device__ __forceinline__ T st(float v) { return __float2half(v); }
""",
}

#: the adjoint walk of a sliding window, shared by col2im and the pooling backward kernels:
#: the output index whose window reads input position ``i`` through kernel tap ``k`` (begin
#: pad ``p``, dilation ``d``, stride ``s``, ``O`` outputs), or -1
WINDOW_OF = r"""
__device__ __forceinline__ int window_of(int i, int p, int k, int d, int s, int O) {
    int t = i + p - k * d;
    if (t < 0 || t % s != 0) return -1;
    int o = t / s;
    return o < O ? o : -1;
}
"""

#: block-wide reductions (warp shuffles, then one float per warp in shared memory)
REDUCE = r"""
__device__ __forceinline__ float warp_sum(float v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}
__device__ __forceinline__ float warp_max(float v) {
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}
// blockDim.x must be a multiple of 32 (<= 1024); every thread gets the result
__device__ float block_sum(float v) {
    __shared__ float red_s[32];
    __syncthreads();
    int lane = threadIdx.x & 31, wid = threadIdx.x >> 5, nw = blockDim.x >> 5;
    v = warp_sum(v);
    if (lane == 0) red_s[wid] = v;
    __syncthreads();
    v = (threadIdx.x < nw) ? red_s[threadIdx.x] : 0.f;
    if (wid == 0) v = warp_sum(v);
    if (threadIdx.x == 0) red_s[0] = v;
    __syncthreads();
    return red_s[0];
}
__device__ float block_max(float v) {
    __shared__ float red_m[32];
    __syncthreads();
    int lane = threadIdx.x & 31, wid = threadIdx.x >> 5, nw = blockDim.x >> 5;
    v = warp_max(v);
    if (lane == 0) red_m[wid] = v;
    __syncthreads();
    v = (threadIdx.x < nw) ? red_m[threadIdx.x] : WB_NEG_INF;
    if (wid == 0) v = warp_max(v);
    if (threadIdx.x == 0) red_m[0] = v;
    __syncthreads();
    return red_m[0];
}
"""


def full_source(body: str, dtype: str) -> str:
    """The compilable text of a family ``body`` for storage ``dtype`` ('float32'/'float16')."""
    return _PRELUDE[np.dtype(dtype).name] + body


def supported(*arrays) -> bool:
    """True when every array is a C-contiguous-able cupy array of one supported dtype."""
    cp = cupy_module()
    if cp is None or not arrays:
        return False
    dt = arrays[0].dtype
    return dt.name in DTYPES and all(isinstance(a, cp.ndarray) and a.dtype == dt
                                     for a in arrays)


_MODULES: dict = {}
_FUNCTIONS: dict = {}


def function(family: str, body: str, name: str, dtype):
    """The compiled ``extern "C"`` kernel ``name`` of a family for ``dtype`` (cached)."""
    cp = cupy_module()
    dt = np.dtype(dtype).name
    fkey = (family, dt, name, cp.cuda.runtime.getDevice())  # a loaded function is per GPU
    fn = _FUNCTIONS.get(fkey)
    if fn is not None:
        return fn
    key = (family, dt)
    mod = _MODULES.get(key)
    if mod is None:
        mod = cp.RawModule(code=full_source(body, dt), options=("--std=c++14",))
        _MODULES[key] = mod
    fn = _FUNCTIONS[fkey] = mod.get_function(name)
    return fn


THREADS = 256


def grid(total: int, threads: int = THREADS) -> tuple:
    """A 1-D grid for a grid-stride loop over ``total`` items."""
    blocks = max(1, min((int(total) + threads - 1) // threads, 65535 * 8))
    return (blocks,), (threads,)


def grid2d(rows: int, cols: int, threads: int = THREADS) -> tuple:
    """A 2-D grid for kernels whose y walks ``rows`` (grid-stride) and x walks ``cols``:
    row decomposition once per block, 32-bit index math per element."""
    gx = max(1, min((int(cols) + threads - 1) // threads, 1024))
    gy = max(1, min(int(rows), 65535))
    return (gx, gy), (threads,)


def row_threads(cols: int) -> int:
    """Threads per block for one-block-per-row kernels: a multiple of 32 in [32, 1024]."""
    t = 32
    while t < cols and t < 1024:
        t *= 2
    return max(32, min(t, 1024))
