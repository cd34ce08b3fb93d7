"""A worker thread for queued float32 GEMMs and a pool of threads for inference's split kernels,
in C (``blas_worker.c``; plain C, no vector ISA).

The training backward hands it the weight-gradient products (``X^T @ dY``) of MatMul/Gemm and
goes on with the rest of the backward on the calling thread: the job is a call of OpenBLAS'
own ``cblas_sgemm`` (its address found in numpy's BLAS library through ctypes,
``workbench.ops.parallel.defer_matmul``) with exactly the arguments numpy's ``matmul``
passes, so the product has the bits numpy gives it on the calling thread, whichever thread
runs it. The worker never touches Python objects (no GIL).

- ``submit``: one job of 13 int64 values (sgemm address, 1 for the ILP64 interface, transA,
  transB (111/112), M, N, K, A, lda, B, ldb, C, ldc: row-major, alpha 1, beta 0) followed by a
  slot that receives the job's ticket. Starts the worker thread at the first job.
- ``wait_for``: returns once every job with a ticket <= the given one has finished; meanwhile
  the caller runs the queued jobs nobody has claimed (so nothing ever waits on a worker the OS
  has not scheduled, and a process forked with jobs queued still completes them).
- ``poll``: 1 while a backward runs (after a job the idle worker then polls up to 30 us for the
  next one before it sleeps: jobs that come close together need no wake-up), 0 after.
- ``stats``: jobs run by the worker, by waiters, submitted, and the worker's state (0 not
  started, 1 running, -1 could not be started).
- ``par``: the block pool of inference's one-block kernels (``dwconv_avx2.chain`` / ``dw3x3``
  / ``fewc`` / ``maxpool`` / ``interleave2``, ``gemm_avx2.gemm_block`` /
  ``gemm_panels_block`` / ``iconv_block``, the row pieces of a MatMul/Gemm product with its
  epilogue (``gemm_avx2.checked_pieces`` calls it from C) and the (batch, head) pieces of
  ``attention_avx2``: a function taking one int64 call block). Its
  argument: the kernel's address, n blocks, the thread count (the caller included), then
  the n blocks' addresses. Up to 7 pool threads (started on demand, never more than the
  thread count asks for) and the caller claim the blocks one at a time from a shared counter
  (a compare-and-swap on a word holding the task's generation, so a pool thread late for a
  finished task never claims a block of the next); the call returns when every block has
  run. The caller claims blocks too, so nothing waits on a pool thread the OS has not
  scheduled. A thread count of 1, one block, or a second Python thread calling while a task
  runs: the blocks run one after another on the calling thread. Each block is computed
  whole by one thread: the output does not depend on which thread ran which block, nor on
  how many there are (``workbench.ops.parallel.BlockTask``). An idle pool thread polls
  200 us (yielding its core every ~1-2 us to any other runnable thread), then sleeps on a
  condition variable: an inference run's layers come tens of microseconds apart, so the
  hand-off costs ~3-5 us (the Python pool's: 50-70 us). Reset in a forked child.
- ``par_stats``: blocks run by each pool thread and by callers, pool threads started.

Outside a backward the idle worker polls ~1-2 us, then sleeps on a condition variable.
Polling through a whole backward instead (no sleep at all) would burn a core for the ~6 ms of a
BERT-like backward, and on a busy machine share a core with the main thread; polling ~50-100
us after every job, whether in a backward or not, cost ~2.5 ms CPU per step, 150 us after each
job in a backward ~2.7 ms (load ~3): a BERT-like backward's 12 jobs come ~0.5 ms apart.
"""

#: the kernel's source file, in this folder
SOURCE = "blas_worker.c"
#: compiler flags: no vector instruction set is needed
CFLAGS = ("-O2", "-fPIC", "-shared", "-pthread")
#: CPU flags (``/proc/cpuinfo``) without which the kernel is not used
REQUIRES = ()
#: kernel name -> argument string (:mod:`workbench.compiled.spec`)
EXPORTS = {
    "submit": "i64[]!",
    "wait_for": "i64",
    "stats": "i64[]!",
    "poll": "i64",
    "par": "i64[]",
    "par_stats": "i64[]!",
}
