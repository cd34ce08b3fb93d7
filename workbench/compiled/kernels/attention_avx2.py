"""A C kernel module: attention (scores, scale, mask, softmax, product with V) in one call,
AVX2 + FMA intrinsics.

The source is ``attention_avx2.c`` beside this file; this module only describes it (it imports
nothing, so the engine reads it too). Built like ``gemm_avx2`` (the system C compiler, the
flags below, a shared library in the kernel cache loaded with ctypes) and used only when the
CPU reports every flag of :data:`REQUIRES`; otherwise, or without a compiler, FusedAttention
runs its numpy / BLAS path (``workbench/ops/linalg.py``).

- ``attention``: for the (batch, head) pairs ``p0 <= p < p1`` (``p = b * H + h``),
  ``Y[b, h] = softmax(mask(scale(Q[b, h] @ K[b, h]))) @ V[b, h]`` with Q (Sq, D), K (D, Sk)
  (already transposed, as FusedAttention's K), V (Sk, Dv) and Y (Sq, Dv) each read or written
  through element strides (batch, head, row, column; 0 broadcasts), so the graph's head split
  and merge cost no copy. ``scale_mode`` 0 none, 1 ``* scale``, 2 ``/ scale``; ``mask_mode``
  0 none, 1 ``+ M`` (float32), 2 ``fill`` where M (uint8) is non-zero, 3 ``fill`` where it is
  zero; M read through its own element strides. The softmax has the semantics of the engine's
  compiled softmax (``kernels/transformer.py``): a row holding NaN or +inf, or of only -inf,
  gives NaN. ``work`` is scratch of :func:`work_floats` float32 values per call block (blocks
  run at the same time need their own). One argument: an int64 block of :data:`BLOCK` slots
  (addresses, then integers, then ``scale`` and ``fill`` as float64 bit patterns), so a node
  keeps its blocks and rewrites only the array addresses (``ops/linalg.py``).
"""

#: the kernel's source file, in this folder
SOURCE = "attention_avx2.c"
#: compiler flags: the instruction sets named here, never ``-march=native``
CFLAGS = ("-O3", "-mavx2", "-mfma", "-fPIC", "-shared", "-fno-math-errno")
#: CPU flags (``/proc/cpuinfo``) without which the kernel is not used
REQUIRES = ("avx2", "fma")
#: the slots of a call block (the C struct ``call_t``)
BLOCK = ("q", "k", "v", "m", "y", "work", "H", "Sq", "Sk", "D", "Dv",
         "qb", "qh", "qi", "qd", "kb", "kh", "kd", "kj", "vb", "vh", "vj", "ve",
         "yb", "yh", "yi", "ye", "mb", "mh", "mi", "mj",
         "scale_mode", "mask_mode", "p0", "p1", "rows", "scale", "fill")
#: query rows whose scores are held at once (the scratch's first part)
ROWS = 64
#: kernel name -> argument string (:mod:`workbench.compiled.spec`)
EXPORTS = {
    "attention": "i64[]",
}


def work_floats(Sq, Sk, D, Dv):
    """The scratch (float32 values) one call block needs: ROWS rows of scores, K packed as
    (D, Sk rounded up to 8), V packed as (Sk, Dv rounded up to 8)."""
    skp, dvp = -(-Sk // 8) * 8, -(-Dv // 8) * 8
    return min(Sq, ROWS) * skp + D * skp + Sk * dvp
