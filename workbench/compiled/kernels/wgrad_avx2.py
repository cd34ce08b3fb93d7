"""The weight gradient of a group-1 convolution on channels-last float32 arrays, in C (AVX2 +
FMA): the training step's dL/dW without an im2col copy (``wgrad_avx2.c``).

- ``wgrad``: ``dW[t, m, c] = sum over pixels p of dY[p, m] * X[image(p), pixel(p, t), c]``
  for taps ``t0 <= t < t1`` and output channels ``m0 <= m < m1`` (all C): X (N, H, W, C), dY
  (N*OH*OW, M), dW (taps, M, C), all C-contiguous; ``pixel(p, t)`` from the (OH*OW, taps)
  indirection table of :func:`workbench.ops.conv_nhwc.indirection` (negative: padding, read
  from ``zero``, C zeros). Each dW element is one float32 sum over the pixels in increasing
  order: the result does not depend on how (t, m) ranges are split over threads. After dW,
  two work buffers of the calling thread: ``yk`` (ceil((m1 - m0)/6) * 6 * bp floats: a block
  of bp pixels of dY as 6-row tiles) and ``xk`` (ceil(C/16) * 16 * bp floats: the block's X
  for one tap as 16-channel panels), so that the register tile reads both contiguously (read
  in place, rows of X and dY lie C or M floats apart and thrash the L1 sets: 1.5-2.7x slower
  at 256-512 channels, measured). Then C, taps, M, OH*OW, H*W*C, rows (N*OH*OW), bp (<= 512),
  t0, t1, m0, m1.
- ``scatter_rows``: an embedding table's gradient, ``target[index[k]] += values[k]`` for k in
  order (``np.add.at`` on a (rows, m) float32 target, the same sums in the same order): target,
  index (n,) int64, values (n, m), bad (1,) int64 (set to 1, nothing written, when an index
  lies outside [0, rows)), n, m, rows.
"""

#: the kernel's source file, in this folder
SOURCE = "wgrad_avx2.c"
#: compiler flags: the instruction sets named here, never ``-march=native``
CFLAGS = ("-O3", "-mavx2", "-mfma", "-fPIC", "-shared", "-fno-math-errno")
#: CPU flags (``/proc/cpuinfo``) without which the kernel is not used
REQUIRES = ("avx2", "fma")
#: kernel name -> argument string (:mod:`workbench.compiled.spec`)
EXPORTS = {
    "wgrad": "f32[] i64[] f32[] f32[] f32[]! f32[]! f32[]! i64 i64 i64 i64 i64 i64 i64 i64 i64 i64 "
             "i64",
    "scatter_rows": "f32[]! i64[] f32[] i64[]! i64 i64 i64",
}
