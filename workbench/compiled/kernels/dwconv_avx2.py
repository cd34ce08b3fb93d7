"""A C kernel module: channels-last depthwise 3x3 convolution, AVX2 + FMA intrinsics.

The source is ``dwconv_avx2.c`` beside this file; this module only describes it (it imports
nothing, so the engine reads it too). Built like ``gemm_avx2`` (the system C compiler, the
flags below, a shared library in the kernel cache loaded with ctypes) and used only when the
CPU reports every flag of :data:`REQUIRES`; otherwise, or without a compiler, the engine runs
the numba kernel ``conv_nhwc.dw_k3s*`` or numpy.

- ``dw3x3``: ``Y = clip(depthwise3x3(X) + bias + Z, lo, hi)`` for output rows
  ``r0 <= n*OH + oh < r1`` of NHWC X (N, H, W, C) and Y, Z (N, OH, OW, C); stride 1 or 2,
  any top/left pads (the bottom/right ones follow from OH/OW), dilation 1, one channel per
  group. Its one argument is an int64 block of 19 slots (:data:`BLOCK`; a ctypes call costs
  ~0.4 µs per argument, so a node keeps its blocks and rewrites only the array pointers):
  the addresses of X, the packed weights, the padded bias, Z and Y, then N, H, W, C, OH, OW,
  stride, pad_top, pad_left, has_z, r0, r1, then lo and hi as float64 bit patterns
  (:func:`workbench.ops.conv_nhwc.dw_block`). The weights are packed at the node's first run
  into (9, Cp) and the bias into (Cp,), Cp = C rounded up to :data:`LANES`, zeros past C
  (:func:`workbench.ops.conv_nhwc.pack_depthwise`). ``Z`` is read only when ``has_z``;
  ``lo``/``hi`` = -inf/inf give no clip; NaN passes the clip (as numpy's).
- ``maxpool``: 2-D max pool of NHWC float32 X (N, H, W, C) into Y (N, OH, OW, C) for output
  rows ``r0 <= n*OH + oh < r1``; any kernel size, strides, dilations and top/left pads (the
  window's taps outside the input are skipped; a window with none gives -inf, ceil_mode's
  extra windows included). One int64 block of 18 slots (:data:`POOL_BLOCK`). A NaN tap makes
  the output NaN, as numpy's ``maximum``.
- ``interleave2``: ``Y[p, 2j] = A[p, j]``, ``Y[p, 2j+1] = B[p, j]`` for pixels
  ``p0 <= p < p1`` of 4-byte values, A and B rows of ``c`` values at element strides
  ``sa``/``sb``, Y (P, 2c) contiguous: ShuffleNet's NhwcConcatShuffle of two halves across 2
  groups. One int64 block: the addresses of A, B, Y, then c, sa, sb, p0, p1. Bits are copied
  as they are.
- ``chain``: an inverted-residual chain per band of output rows: ``E = clip(X @ We + be)``
  (a 1x1 expand, optional), ``D = clip(depthwise3x3(E) + bd)`` (as ``dw3x3``), ``Y = clip(D @
  Wp + bp + Z)`` (a 1x1 project, optional), ``band`` output rows at a time through two small
  scratch buffers, so the expanded tensor never goes to memory whole (MobileNetV2's 6x
  expansion at batch 8: 38.5 MB for its second block). The 1x1 stages call ``gemm_avx2.gemm``
  through its address (a slot of the block; that module's packed weights), the depthwise
  stage ``dw3x3``: the same bits as the three layers one after another. One int64 block of 35
  slots (:data:`CHAIN_BLOCK`): X, the packed expand weights and bias, the packed depthwise
  weights and bias, the packed project weights and bias, Z, Y, the two scratch buffers
  (``((band-1)*S + 3) * W * C1`` and ``band * OW * C1`` floats), the GEMM's address, N, H, W,
  C0 (X's channels), C1 (the expanded ones), M (Y's), OH, OW, stride, pad_top, pad_left,
  has_expand, has_project, has_z, band, r0, r1, then the three stages' lo/hi as float64 bit
  patterns (:func:`workbench.ops.conv_nhwc.nhwc_conv_chain`).
- ``fewc``: a group-1 convolution with at most 4 input channels (a network's stem on RGB
  images): ``Y = clip(conv(X) + bias + Z, lo, hi)`` for output rows ``r0 <= n*OH + oh < r1``,
  any kernel size, strides and top/left pads, dilation 1; X read through its element strides
  (the layout pass' NHWC view of an NCHW input, no copy), taps in the padding read as 0. The
  weights packed once into (KH*KW*C, Mp) and the bias into (Mp,), Mp = M rounded up to 8
  (:func:`workbench.ops.conv_nhwc.pack_fewc`). One int64 block of 27 slots
  (:data:`FEWC_BLOCK`).
"""

#: the kernel's source file, in this folder
SOURCE = "dwconv_avx2.c"
#: compiler flags: the instruction sets named here, never ``-march=native``
CFLAGS = ("-O3", "-mavx2", "-mfma", "-fPIC", "-shared", "-fno-math-errno")
#: CPU flags (``/proc/cpuinfo``) without which the kernel is not used
REQUIRES = ("avx2", "fma")
#: channels per vector (the packed weights' padding)
LANES = 8
#: the slots of a call block
BLOCK = ("x", "w", "b", "z", "y", "N", "H", "W", "C", "OH", "OW", "stride", "pad_top",
         "pad_left", "has_z", "r0", "r1", "lo", "hi")
#: kernel name -> argument string (:mod:`workbench.compiled.spec`)
EXPORTS = {
    "dw3x3": "i64[]",
    "maxpool": "i64[]",
    "interleave2": "i64[]",
    "chain": "i64[]",
    "fewc": "i64[]",
}
#: the slots of a ``maxpool`` call block
POOL_BLOCK = ("x", "y", "N", "H", "W", "C", "OH", "OW", "KH", "KW", "SH", "SW", "DH", "DW",
              "pad_top", "pad_left", "r0", "r1")
#: the slots of a ``chain`` call block
CHAIN_BLOCK = ("x", "ew", "eb", "dw", "db", "pw", "pb", "z", "y", "ebuf", "dbuf", "gemm", "N",
               "H", "W", "C0", "C1", "M", "OH", "OW", "stride", "pad_top", "pad_left",
               "has_expand", "has_project", "has_z", "band", "r0", "r1", "expand_lo",
               "expand_hi", "dw_lo", "dw_hi", "project_lo", "project_hi")
#: the slots of a ``fewc`` call block
FEWC_BLOCK = ("x", "w", "b", "z", "y", "N", "H", "W", "C", "OH", "OW", "M", "KH", "KW", "SH",
              "SW", "pad_top", "pad_left", "sn", "sh", "sw", "sc", "has_z", "r0", "r1", "lo",
              "hi")
