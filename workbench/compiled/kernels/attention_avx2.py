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
- ``attention_probs`` (training's fused attention core, ``autodiff/fuse_attention.py``): the
  same call, its block followed by one slot: the address of a C-contiguous float32 array that
  receives the probabilities of the pairs ``p0 <= p < p1`` ((p1 - p0, Sq, Sk), the softmax's
  output the backward needs). Y and P are exactly what ``attention`` computes.
- ``attention_grad``: the backward of ``Y = softmax(scale(Q @ K) + M) @ V`` for the pairs
  ``p0 <= p < p1`` from the saved probabilities P (contiguous (pairs, Sq, Sk)) and dY: dV =
  P^T dY, dP = dY V^T, dS = P * (dP - rowsum(dP * P)) then ``* scale`` or ``/ scale``, dQ =
  dS K^T, dK = Q^T dS (K as the (D, Sk) operand). dY, Q, K, V read through element strides
  (batch, head, row, column); dQ (pairs, Sq, D), dK (pairs, D, Sk), dV (pairs, Sk, Dv) written
  C-contiguous. Each sum runs in a fixed order (over e, over i, over j; the row dot product
  in 8 lanes), so results do not depend on how the pairs are split. With a fill mask
  (``mask_mode`` 2: filled where the uint8 mask is non-zero, 3: where it is zero; read through
  its element strides) dS is 0 at the filled scores, as the gradient of ONNX Where is.
  ``work``:
  :func:`grad_work_floats` values per call block. One argument: an int64 block of
  :data:`GRAD_BLOCK` slots.
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
#: the slots of ``attention_grad``'s block (the C struct ``grad_t``)
GRAD_BLOCK = ("p", "g", "q", "k", "v", "dq", "dk", "dv", "work", "H", "Sq", "Sk", "D", "Dv",
              "gb", "gh", "gi", "ge", "qb", "qh", "qi", "qd", "kb", "kh", "kd", "kj",
              "vb", "vh", "vj", "ve", "scale_mode", "p0", "p1", "scale",
              "m", "mb", "mh", "mi", "mj", "mask_mode")
#: query rows whose scores are held at once (the scratch's first part)
ROWS = 64
#: kernel name -> argument string (:mod:`workbench.compiled.spec`)
EXPORTS = {
    "attention": "i64[]",
    "attention_probs": "i64[]",
    "attention_grad": "i64[]",
}


def work_floats(Sq, Sk, D, Dv):
    """The scratch (float32 values) one call block needs: ROWS rows of scores, K packed as
    (D, Sk rounded up to 8), V packed as (Sk, Dv rounded up to 8)."""
    skp, dvp = -(-Sk // 8) * 8, -(-Dv // 8) * 8
    return min(Sq, ROWS) * skp + D * skp + Sk * dvp


def grad_work_floats(Sq, Sk, D, Dv):
    """The scratch (float32 values) one ``attention_grad`` block needs: V transposed (Dv,
    Sk8), K (Sk, D8), dY (Sq, Dv8) and dP / dS (Sq, Sk8) (n8: n rounded up to 8)."""
    skp, dp, dvp = (-(-n // 8) * 8 for n in (Sk, D, Dv))
    return Dv * skp + Sk * dp + Sq * dvp + Sq * skp
