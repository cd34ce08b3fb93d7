"""Data-parallel training across processes: communicators (MPI, NCCL), the gradient reducer
(bucketing, staging, sparsification, partial updates), data partition and process launch.
``opt.DistOpt`` (SINGA's API) is a thin adapter over :class:`Reducer`.

This package sits below the front ends: it imports numpy, mpi4py/cupy (lazily) and
workbench.errors/arrays, never SINGA's modules or the widgets (the progress display of a job,
``DistMonitor``, is ``workbench.widgets.DistMonitor``). See docs/distributed.md.
"""

from workbench.dist.comm import (
    Communicator,
    DistributedError,
    LocalCommunicator,
    MPICommunicator,
    NcclCommunicator,
    NcclIdHolder,
    default_timeout,
    get_communicator,
    launched_by_mpi,
    mpi4py_available,
)
from workbench.dist.data import batches_per_rank, partition
from workbench.dist.launch import find_mpiexec, mpiexec_command, one_thread_env, spawn
from workbench.dist.reducer import Reducer, buckets

__all__ = [
    "Communicator", "DistributedError", "LocalCommunicator", "MPICommunicator",
    "NcclCommunicator", "NcclIdHolder", "default_timeout", "get_communicator",
    "launched_by_mpi", "mpi4py_available", "partition", "batches_per_rank", "spawn",
    "find_mpiexec", "mpiexec_command", "one_thread_env", "Reducer", "buckets",
]


def __getattr__(name: str):
    if name == "DistMonitor":  # moved to the widgets (the UI); say where, not just "missing"
        raise ImportError("DistMonitor is a widget: from workbench.widgets import DistMonitor "
                          "(workbench.dist holds no display code)")
    raise AttributeError(f"module 'workbench.dist' has no attribute {name!r}")
