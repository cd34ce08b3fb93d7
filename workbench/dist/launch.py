"""Starting the processes of one machine without MPI (GPUs, SINGA's ``train_multiprocess``)."""

from __future__ import annotations

import multiprocessing

from workbench.errors import WorkbenchError


def spawn(target, world_size: int, args=(), *, timeout: float | None = None):
    """Run ``target(local_rank, world_size, nccl_id, *args)`` in ``world_size`` fresh
    processes (``spawn`` start method: forked children cannot use CUDA and forking after BLAS
    threads started can hang) with one :class:`NcclIdHolder` made here. Waits for all; a
    process that fails makes the others stop (they are terminated) and raises
    :class:`WorkbenchError` with the exit codes."""
    from workbench.dist.comm import NcclIdHolder  # noqa: PLC0415
    nccl_id = NcclIdHolder()
    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=target, args=(r, world_size, nccl_id, *args))
             for r in range(world_size)]
    for p in procs:
        p.start()
    import time  # noqa: PLC0415
    t0 = time.monotonic()
    try:
        while any(p.is_alive() for p in procs):
            bad = [(r, p.exitcode) for r, p in enumerate(procs)
                   if p.exitcode not in (None, 0)]
            if bad:
                raise WorkbenchError(f"process(es) {bad} (rank, exit code) failed; the other "
                                     f"ranks were stopped")
            if timeout is not None and time.monotonic() - t0 > timeout:
                raise WorkbenchError(f"the {world_size} processes did not finish within "
                                     f"{timeout} s; they were stopped")
            time.sleep(0.1)
        bad = [(r, p.exitcode) for r, p in enumerate(procs) if p.exitcode != 0]
        if bad:
            raise WorkbenchError(f"process(es) {bad} (rank, exit code) failed")
    finally:
        for p in procs:
            if p.is_alive():
                p.terminate()
        for p in procs:
            p.join(5)
