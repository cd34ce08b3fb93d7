"""A C kernel module: skinny float32 GEMM with a fused epilogue, AVX2 + FMA intrinsics.

The source is ``gemm_avx2.c`` beside this file; this module only describes it (it imports
nothing, so the engine reads it too). The builder compiles the source with the system C
compiler (``$CC``, else ``cc``/``gcc``) and :data:`CFLAGS` into a shared library in the
kernel cache; the engine loads it with ctypes. Used only when the CPU reports every flag of
:data:`REQUIRES` (``/proc/cpuinfo``); otherwise, or without a compiler, the numpy path runs.

- ``gemm``: ``Y[r] = clip(A[r] @ B + bias + Z[r], lo, hi)`` for rows ``r0 <= r < r1`` of a
  row-major A (rows, K), with B packed at prepare into column panels of :data:`PANEL`
  (:func:`workbench.ops.conv_nhwc.pack_panels`) and bias padded to the panels' width;
  ``Z`` is read only when ``has_z``; ``lo``/``hi`` = -inf/inf give no clip. The channels-last
  1x1 convolution's product and epilogue (``workbench/ops/conv_nhwc.py``).
- ``gemm_block``: ``gemm`` with its twelve arguments in one int64 block (the five addresses,
  K, M, r0, r1, has_z, then lo and hi as float64 bit patterns): what a node's pre-bound call
  uses, since a ctypes call costs ~0.4 µs per argument.
- ``fused_block``: ``gemm_block``'s twelve slots, then the addresses and arguments of the
  compiled GELU and LayerNorm kernels (``transformer.gelu``, ``transformer.layer_norm``; a
  zero address skips one) called from C after the product: a FusedMatMul / MatMul / Gemm
  node's whole step in one ctypes call (``workbench/ops/linalg.py``), the same kernels on the
  same arrays as separate calls, so the same bits.
- ``checked_block``: ``fused_block`` behind a pre-bound step's per-call checks done in C
  (slots 32-45): the weights' sampled elements and the bias against their bits at packing
  time (1 returned, nothing computed, when one differs), then the A, Z and Y data pointers
  read from the array objects (the data field's offset in numpy's array struct, as
  :data:`workbench.compiled.data_pointer` reads it) into their slots. It returns an int64
  (the loader's prototype says void; the caller that reads the code makes its own).
- ``checked_pieces``: ``checked_block``'s checks and addresses, then the step cut into row
  pieces run by the calling thread and the C block pool (blas_worker.par) (slot 46: the address
  of the function running a set of pieces, 47: its descriptor, 48: the piece table, see
  ``gemm_avx2.c``; :class:`workbench.ops.parallel.Pieces` makes the first two): each piece
  runs ``fused_block`` on its own rows (product, GELU and LayerNorm alike), and every row is
  computed from its own data in a fixed order, so the pieces give one call's bits.
- ``objects_call``: a kernel that takes one int64 block (the attention kernel's) called
  after the data pointers of the array objects named in the call's slots are written into
  that block's first slots: a pre-bound call hands over Python's ``id`` of its arrays
  instead of reading each data pointer in Python.
- ``iconv``: the channels-last group-1 convolution of any kernel size, stride, padding and
  dilation as an indirect GEMM: output pixels ``r0 <= r < r1`` of ``Y`` (N*OH*OW, M) =
  ``clip(sum over taps t, channels c of X[pixel(r, t), c] * W[t, c, :] + bias + Z[r], lo,
  hi)``, where ``pixel(r, t)`` comes from an indirection table of (OH*OW, taps) offsets into
  one image (negative: padding, read from the ``zero`` row), built once per plan
  (:func:`workbench.ops.conv_nhwc.indirection`); the weights ((taps*C, M), "HWIO" rows)
  packed as for ``gemm``. Arguments after the arrays: C, taps, M, OH*OW, H*W*C, r0, r1,
  has_z, lo, hi. The first tile over each slice of the packed weights prefetches the next
  slice into L2 (no change in arithmetic: the same bits).
- ``gemm_panels_block``: ``gemm_block``'s 12 slots, then the 16-column panels ``q0 <= q <
  q1`` it computes (a last panel of 8 columns or fewer goes with the full one before it: a
  range holds both or neither). The 1x1 layers with few rows (7x7 maps at batch 1) split
  over their output channels in the C block pool; every value has ``gemm``'s bits.
- ``iconv_block``: ``iconv`` with its arguments in one int64 block (X, ind, zero, Bp, bias,
  Z, Y, C, taps, M, OH*OW, H*W*C, r0, r1, has_z, lo and hi as float64 bit patterns), then
  the 16-column panels ``q0 <= q < q1`` of the output channels it computes: the unit of work
  the C block pool (``blas_worker.par``) runs, a layer cut into pixel ranges or, when it has
  few output pixels, into panel ranges (each thread then streams only its part of the packed
  weights). Every output value has the bits ``iconv`` gives it, whatever the ranges.
"""

#: the kernel's source file, in this folder
SOURCE = "gemm_avx2.c"
#: compiler flags: the instruction sets named here, never ``-march=native`` (the library
#: must run on any CPU with :data:`REQUIRES`)
CFLAGS = ("-O3", "-mavx2", "-mfma", "-fPIC", "-shared", "-fno-math-errno")
#: CPU flags (``/proc/cpuinfo``) without which the kernels are not used
REQUIRES = ("avx2", "fma")
#: columns per packed weight panel (the register tile's width)
PANEL = 16
#: kernel name -> argument string (:mod:`workbench.compiled.spec`)
EXPORTS = {
    "gemm": "f32[] f32[] f32[] f32[] f32[]! i64 i64 i64 i64 i64 f32 f32",
    "gemm_block": "i64[]",
    "fused_block": "i64[]",
    "checked_block": "i64[]!",
    "checked_pieces": "i64[]!",
    "objects_call": "i64[]",
    "iconv": "f32[] i64[] f32[] f32[] f32[] f32[] f32[]! i64 i64 i64 i64 i64 i64 i64 i64 f32 f32",
    "iconv_block": "i64[]",
    "gemm_panels_block": "i64[]",
}
