"""Data-parallel training across processes: communicators (MPI, NCCL), data partition,
process launch and progress display. ``opt.DistOpt`` (SINGA's API) is built on this package.

This package sits below the SINGA-compatible modules: it imports numpy, mpi4py/cupy (lazily)
and workbench.errors/arrays, never opt or model. See docs/distributed.md.
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
from workbench.dist.monitor import DistMonitor

__all__ = [
    "Communicator", "DistributedError", "LocalCommunicator", "MPICommunicator",
    "NcclCommunicator", "NcclIdHolder", "default_timeout", "get_communicator",
    "launched_by_mpi", "mpi4py_available", "partition", "batches_per_rank", "spawn",
    "find_mpiexec", "mpiexec_command", "one_thread_env",
    "DistMonitor",
]
