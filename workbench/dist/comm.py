"""Communicators: the collective operations data-parallel training needs.

A :class:`Communicator` offers in-place ``all_reduce`` (sum, float32 or float16 on the wire),
``all_gather``, in-place ``broadcast``, ``barrier`` and ``wait``, on numpy (CPU) or cupy (GPU)
arrays. Three engines:

* :class:`LocalCommunicator` - one process (world size 1): every operation is a no-op.
* :class:`MPICommunicator` - ``mpi4py`` over whatever MPI it was built with (the ``dist`` extra
  installs the ``mpich`` wheel). numpy arrays go through MPI; cupy arrays go through NCCL when
  ``cupy.cuda.nccl`` is there (its unique id broadcast over MPI, as SINGA does) and are staged
  through the host otherwise.
* :class:`NcclCommunicator` - ``cupy.cuda.nccl`` without MPI: the processes of one machine
  share a unique id made by the parent (:class:`NcclIdHolder`, SINGA's multiprocess style).

Failures: every collective waits with a deadline (``timeout`` seconds; default 300, or the
``WORKBENCH_DIST_TIMEOUT`` environment variable) while checking that the other ranks of this
machine are still alive; a dead or stuck peer raises :class:`DistributedError` naming the
operation, the step and the ranks, instead of hanging. Under ``mpiexec`` an uncaught exception
in one rank aborts the whole job (``MPI_Abort``) after printing it, so the other ranks stop too.
"""

from __future__ import annotations

import math
import os
import socket
import sys
import time
import traceback

import numpy as np

from workbench.errors import WorkbenchError

DEFAULT_TIMEOUT = 300.0

# environment variables set by MPI launchers (mpiexec/mpirun of MPICH, Open MPI, Intel MPI,
# Slurm's srun with PMI/PMIx)
_MPI_ENV = ("PMI_RANK", "PMI_SIZE", "PMIX_RANK", "OMPI_COMM_WORLD_SIZE", "MPI_LOCALNRANKS",
            "HYDRA_CONTROL_FD", "PMI_FD", "MV2_COMM_WORLD_SIZE")


class DistributedError(WorkbenchError):
    """A collective operation failed: a rank died, stopped participating, or timed out."""


def default_timeout() -> float:
    v = os.environ.get("WORKBENCH_DIST_TIMEOUT")
    if v:
        try:
            return float(v)
        except ValueError:
            raise WorkbenchError(f"WORKBENCH_DIST_TIMEOUT={v!r} is not a number of "
                                 f"seconds") from None
    return DEFAULT_TIMEOUT


def launched_by_mpi() -> bool:
    """Whether this process was started by an MPI launcher (mpiexec, mpirun, srun)."""
    return any(k in os.environ for k in _MPI_ENV)


def _launcher_size() -> int | None:
    """The number of processes the MPI launcher says it started (None if it does not say)."""
    for k in ("PMI_SIZE", "OMPI_COMM_WORLD_SIZE", "PMIX_SIZE", "MV2_COMM_WORLD_SIZE"):
        v = os.environ.get(k, "")
        if v.isdigit():
            return int(v)
    return None


def mpi4py_available() -> bool:
    try:
        import mpi4py  # noqa: F401, PLC0415
    except ImportError:
        return False
    return True


def _cupy():
    from workbench.arrays import cupy_module  # noqa: PLC0415
    return cupy_module()


def _is_cupy(a) -> bool:
    cp = _cupy()
    return cp is not None and isinstance(a, cp.ndarray)


def _check_array(a, what: str):
    if not (isinstance(a, np.ndarray) or _is_cupy(a)):
        raise WorkbenchError(f"{what}: expected a numpy or cupy array (or a Tensor), got "
                             f"{type(a).__name__}")
    if not a.flags.c_contiguous:
        raise WorkbenchError(f"{what}: the array must be C-contiguous for an in-place "
                             f"collective (got strides {a.strides} for shape {a.shape})")
    return a


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # a zombie (exited, not yet reaped) is dead for our purpose
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return True


class Communicator:
    """Interface. ``world_size``, ``global_rank``, ``local_rank`` (rank on this machine);
    ``bytes_sent`` counts the payload bytes this rank handed to collectives."""

    backend = "none"

    def __init__(self, timeout: float | None = None):
        self.timeout = float(timeout) if timeout is not None else default_timeout()
        self.world_size = 1
        self.global_rank = 0
        self.local_rank = 0
        self.bytes_sent = 0
        self.n_calls = 0
        self.step = 0           # set by DistOpt, quoted in errors
        self._peers: list = []  # (host, pid) of each rank, for liveness checks
        self.peer_failed = False  # set when the launcher signals a failed rank (MPICH)

    # ------------------------------------------------------------------ interface
    def all_reduce(self, a, *, half: bool = False):
        """Sum ``a`` over the ranks, in place (float16 on the wire with ``half``)."""
        raise NotImplementedError

    def all_gather(self, a):
        """A new array of shape ``(world_size, *a.shape)`` with every rank's ``a``."""
        raise NotImplementedError

    def broadcast(self, a, root: int = 0):
        """Overwrite ``a`` in place with rank ``root``'s values."""
        raise NotImplementedError

    def barrier(self) -> None:
        raise NotImplementedError

    def wait(self) -> None:
        """Wait for collectives started asynchronously (GPU streams) to finish."""

    def all_gather_object(self, obj) -> list:
        raise NotImplementedError

    def abort(self, code: int = 1) -> None:
        os._exit(code)

    def close(self) -> None:
        """Release the communicator (NCCL communicators); MPI itself stays initialised."""

    # ------------------------------------------------------------------ helpers
    def _count(self, a) -> None:
        self.bytes_sent += int(a.nbytes)
        self.n_calls += 1

    def _dead_peers(self) -> list:
        host = socket.gethostname()
        return [r for r, (h, pid) in enumerate(self._peers)
                if r != self.global_rank and h == host and not _pid_alive(pid)]

    def _fail(self, what: str, waited: float, dead: list):
        if dead:
            why = (f"rank(s) {dead} of this machine died (process gone) while rank "
                   f"{self.global_rank} waited {waited:.1f} s in {what}")
        elif self.peer_failed:
            dead = ["?"]
            why = (f"the MPI launcher reported that another rank's process failed while rank "
                   f"{self.global_rank} waited {waited:.1f} s in {what}")
        else:
            why = (f"rank {self.global_rank} waited {waited:.1f} s (the timeout) in {what}: "
                   f"another rank failed, stopped taking part (e.g. it ran fewer steps: "
                   f"partition the data so every rank runs the same number of steps) or is "
                   f"stuck")
        msg = (f"distributed training stopped at step {self.step} ({self.backend}, world size "
               f"{self.world_size}): {why}.")
        if not dead:
            msg += (" Raise the limit with DistOpt(..., timeout=s) or WORKBENCH_DIST_TIMEOUT "
                    "if a step can legitimately take longer.")
        print(f"[rank {self.global_rank}] DistributedError: {msg}", file=sys.stderr, flush=True)
        raise DistributedError(msg)

    def _poll(self, done, what: str) -> None:
        """Wait until ``done()`` is true, checking the deadline and the peers' liveness."""
        if done():
            return
        t0 = time.monotonic()
        nap = 2e-5
        next_check = t0 + 0.05
        while not done():
            time.sleep(nap)
            nap = min(nap * 1.5, 2e-3)
            now = time.monotonic()
            if now >= next_check or self.peer_failed:
                next_check = now + 0.1
                dead = self._dead_peers()
                if dead or self.peer_failed or now - t0 > self.timeout:
                    self._fail(what, now - t0, dead)


class LocalCommunicator(Communicator):
    """World size 1: every collective leaves its arguments as they are."""

    backend = "local"

    def all_reduce(self, a, *, half: bool = False):
        _check_array(a, "all_reduce")
        if half:  # the same rounding as a float16 wire, so results match N > 1 runs
            a[...] = a.astype(np.float16).astype(a.dtype)
        self.n_calls += 1
        return a

    def all_gather(self, a):
        return a[None].copy()

    def broadcast(self, a, root: int = 0):
        if root != 0:
            raise WorkbenchError(f"broadcast: root {root} does not exist (world size 1)")
        return a

    def barrier(self) -> None:
        return None

    def all_gather_object(self, obj) -> list:
        return [obj]


# ------------------------------------------------------------------ MPI
_F16_SUM = None


def _f16_sum_op(MPI):  # noqa: N803
    """An MPI reduction op summing float16 (MPI has no float16 type; sent as 16-bit words)."""
    global _F16_SUM
    if _F16_SUM is None:
        def fn(inbuf, inoutbuf, datatype):
            a = np.frombuffer(inbuf, dtype=np.float16)
            b = np.frombuffer(inoutbuf, dtype=np.float16)
            b += a

        _F16_SUM = MPI.Op.Create(fn, commute=True)
    return _F16_SUM


_HOOKED = False
#: set by the SIGUSR1 handler: the MPI launcher reported that a rank's process failed
_LAUNCHER_SIGNALLED = False


def _install_abort_hook(comm) -> None:
    """Under mpiexec with several ranks, an uncaught exception prints and aborts the job, so
    the other ranks stop at once instead of waiting for this one in a collective."""
    global _HOOKED
    if _HOOKED:
        return
    _HOOKED = True
    previous = sys.excepthook

    def hook(etype, value, tb):
        try:
            sys.stderr.write(f"[rank {comm.Get_rank()}] uncaught exception; aborting all "
                             f"{comm.Get_size()} ranks (MPI_Abort):\n")
            traceback.print_exception(etype, value, tb)
            sys.stderr.flush()
            sys.stdout.flush()
        finally:
            if etype is KeyboardInterrupt:
                previous(etype, value, tb)
            comm.Abort(1)

    sys.excepthook = hook


class MPICommunicator(Communicator):
    """MPI through mpi4py: over ``comm`` when given, else over a duplicate of
    ``MPI.COMM_WORLD`` of its own (freed by :meth:`close`), so that collectives of two
    communicators never mix. Creating one is collective: every rank creates its
    communicators in the same order."""

    backend = "mpi"

    def __init__(self, comm=None, timeout: float | None = None, abort_on_error: bool = True):
        self._peer_failed = False
        super().__init__(timeout)
        try:
            from mpi4py import MPI  # noqa: PLC0415
        except ImportError as e:
            raise WorkbenchError(
                "distributed training over MPI needs mpi4py and an MPI: pip install "
                "'onnx-workbench[dist]' (mpi4py and the mpich wheel), then start the script "
                f"with mpiexec -n N python train.py ({e})") from None
        self.MPI = MPI
        self._owns_comm = comm is None
        self.comm = comm if comm is not None else MPI.COMM_WORLD.Dup()
        self.world_size = self.comm.Get_size()
        self.global_rank = self.comm.Get_rank()
        node = self.comm.Split_type(MPI.COMM_TYPE_SHARED, key=self.global_rank)
        self.local_rank = node.Get_rank()
        self.local_size = node.Get_size()
        node.Free()
        self._peers = self.comm.allgather((socket.gethostname(), os.getpid()))
        self._nccl = None
        self.nccl_fallback_reason = None
        if abort_on_error and self.world_size > 1:
            _install_abort_hook(MPI.COMM_WORLD)
        if self.world_size > 1:
            self._watch_launcher()

    def _watch_launcher(self) -> None:
        """MPICH's hydra tells the surviving ranks that a rank's process failed with SIGUSR1
        (when it does not kill them all: ``mpiexec -disable-auto-cleanup``); SIGUSR1's default
        action would end this process without a word. Turn it into a DistributedError at the
        collective that waits."""
        import signal  # noqa: PLC0415
        import threading  # noqa: PLC0415
        if threading.current_thread() is not threading.main_thread():
            return
        try:
            if signal.getsignal(signal.SIGUSR1) is not signal.SIG_DFL:
                return  # ours already (another communicator), or the program's own
            signal.signal(signal.SIGUSR1, _on_usr1)
        except (ValueError, OSError, AttributeError):  # not on this platform / thread
            pass

    @property
    def peer_failed(self) -> bool:
        """Set when the launcher signalled a failed rank (for every communicator of this
        process) or by hand."""
        return self._peer_failed or _LAUNCHER_SIGNALLED

    @peer_failed.setter
    def peer_failed(self, value: bool) -> None:
        self._peer_failed = bool(value)

    def _wait(self, req, what: str) -> None:
        def test():
            try:
                return req.Test()
            except self.MPI.Exception as e:  # e.g. a peer's connection closed (it died)
                dead = self._dead_peers()
                msg = (f"distributed training stopped at step {self.step} (mpi, world size "
                       f"{self.world_size}): {what} failed on rank {self.global_rank}"
                       f"{f'; rank(s) {dead} of this machine died' if dead else ''}: "
                       f"{e.Get_error_string()}")
                print(f"[rank {self.global_rank}] DistributedError: {msg}", file=sys.stderr,
                      flush=True)
                raise DistributedError(msg) from None

        self._poll(test, what)

    # cupy arrays: NCCL (created lazily, id shared over MPI) or staged through the host
    def _gpu(self, a):
        if self._nccl is None:
            try:
                from cupy.cuda import nccl  # noqa: PLC0415, F401
                ok = nccl.available if hasattr(nccl, "available") else True
            except Exception as e:  # noqa: BLE001
                ok, self.nccl_fallback_reason = False, f"cupy.cuda.nccl unavailable ({e})"
            if ok:
                uid = nccl.get_unique_id() if self.global_rank == 0 else None
                uid = self.comm.bcast(uid, root=0)
                self._nccl = NcclCommunicator(uid, self.global_rank, self.world_size,
                                              device_id=a.device.id,
                                              timeout=self.timeout)
                self._nccl._peers = self._peers
                self._nccl.local_rank = self.local_rank
            else:
                self._nccl = False
        return self._nccl or None

    def all_reduce(self, a, *, half: bool = False):
        _check_array(a, "all_reduce")
        if self.world_size == 1:
            return LocalCommunicator.all_reduce(self, a, half=half)
        if _is_cupy(a):
            g = self._gpu(a)
            if g is not None:
                g.step = self.step
                r = g.all_reduce(a, half=half)
                self.bytes_sent, self.n_calls = (self.bytes_sent + g.bytes_sent,
                                                 self.n_calls + 1)
                g.bytes_sent = 0
                return r
            h = _cupy().asnumpy(a)
            self.all_reduce(h, half=half)
            a.set(h)
            return a
        MPI = self.MPI  # noqa: N806
        if half or a.dtype == np.float16:  # MPI has no float16: our op on 16-bit words
            buf = a.astype(np.float16)
            self._count(buf)
            req = self.comm.Iallreduce(MPI.IN_PLACE, [buf.view(np.uint16), MPI.UINT16_T],
                                       op=_f16_sum_op(MPI))
            self._wait(req, f"all_reduce_half of {a.size} values")
            a[...] = buf.astype(a.dtype)
            return a
        self._count(a)
        req = self.comm.Iallreduce(MPI.IN_PLACE, a, op=MPI.SUM)
        self._wait(req, f"all_reduce of {a.size} {a.dtype} values")
        return a

    def all_gather(self, a):
        _check_array(a, "all_gather")
        if _is_cupy(a):
            g = self._gpu(a)
            if g is not None:
                g.step = self.step
                return g.all_gather(a)
            return _cupy().asarray(self.all_gather(_cupy().asnumpy(a)))
        out = np.empty((self.world_size, *a.shape), a.dtype)
        self._count(a)
        req = self.comm.Iallgather(a, out)
        self._wait(req, f"all_gather of {a.size} {a.dtype} values")
        return out

    def broadcast(self, a, root: int = 0):
        _check_array(a, "broadcast")
        if self.world_size == 1:
            return a
        if _is_cupy(a):
            g = self._gpu(a)
            if g is not None:
                return g.broadcast(a, root)
            h = _cupy().asnumpy(a)
            self.broadcast(h, root)
            a.set(h)
            return a
        if self.global_rank == root:
            self._count(a)
        req = self.comm.Ibcast(a, root=root)
        self._wait(req, f"broadcast of {a.size} {a.dtype} values from rank {root}")
        return a

    def barrier(self) -> None:
        if self.world_size == 1:
            return
        req = self.comm.Ibarrier()
        self._wait(req, "barrier")

    def wait(self) -> None:
        if self._nccl:
            self._nccl.wait()

    def all_gather_object(self, obj) -> list:
        # small objects: gather their pickles' lengths, then the bytes (both with deadlines)
        import pickle  # noqa: PLC0415
        data = np.frombuffer(pickle.dumps(obj), np.uint8)
        n = self.all_gather(np.array([data.size], np.int64))[:, 0]
        buf = np.zeros(int(n.max()), np.uint8)
        buf[:data.size] = data
        allb = self.all_gather(buf)
        return [pickle.loads(allb[r, :n[r]].tobytes()) for r in range(self.world_size)]

    def abort(self, code: int = 1) -> None:
        self.comm.Abort(code)

    def close(self) -> None:
        if self._nccl:
            self._nccl.close()
            self._nccl = None
        if self._owns_comm and self.comm is not None:
            self.comm.Free()
            self.comm = None


def _on_usr1(signum, frame) -> None:
    global _LAUNCHER_SIGNALLED
    _LAUNCHER_SIGNALLED = True


# ------------------------------------------------------------------ NCCL
def _nccl_dtype(nccl, dtype) -> int:
    table = {"float32": "NCCL_FLOAT32", "float16": "NCCL_FLOAT16", "float64": "NCCL_FLOAT64",
             "int32": "NCCL_INT32", "int64": "NCCL_INT64", "uint8": "NCCL_UINT8",
             "int8": "NCCL_INT8"}
    name = table.get(np.dtype(dtype).name)
    if name is None:
        raise WorkbenchError(f"NCCL: no collective for dtype {np.dtype(dtype).name}")
    return getattr(nccl, name)


class NcclIdHolder:
    """SINGA's ``singa.NcclIdHolder``: a NCCL unique id made in the parent process and passed
    (pickled) to the child processes of one machine, which give it to
    ``opt.DistOpt(sgd, nccl_id=holder, local_rank=i, world_size=n)``."""

    def __init__(self):
        try:
            from cupy.cuda import nccl  # noqa: PLC0415
        except Exception as e:  # noqa: BLE001
            raise WorkbenchError(
                "NcclIdHolder needs cupy with NCCL (pip install 'onnx-workbench[gpu-cuda12]'; "
                "cupy.cuda.nccl); multi-process training without MPI is for GPUs. On CPUs "
                f"start the processes with mpiexec -n N python train.py instead ({e})") from None
        self.id = tuple(nccl.get_unique_id())

    def __repr__(self) -> str:
        return f"NcclIdHolder(id=<{len(self.id)} bytes>)"


class NcclCommunicator(Communicator):
    """NCCL through ``cupy.cuda.nccl``, one process per GPU. ``nccl_id``: a
    :class:`NcclIdHolder` (or the raw id tuple); ``rank`` doubles as the local rank and GPU
    index (one machine) unless ``device_id`` is given."""

    backend = "nccl"

    def __init__(self, nccl_id, rank: int, world_size: int, device_id: int | None = None,
                 timeout: float | None = None):
        super().__init__(timeout)
        cp = _cupy()
        if cp is None:
            raise WorkbenchError("the NCCL engine needs cupy (pip install "
                                 "'onnx-workbench[gpu-cuda12]') and a CUDA GPU")
        from cupy.cuda import nccl  # noqa: PLC0415
        self.nccl = nccl
        uid = nccl_id.id if isinstance(nccl_id, NcclIdHolder) else tuple(nccl_id)
        if not 0 <= int(rank) < int(world_size):
            raise WorkbenchError(f"NCCL: rank {rank} is outside world size {world_size}")
        self.world_size, self.global_rank = int(world_size), int(rank)
        self.local_rank = self.global_rank
        self.device_id = self.global_rank if device_id is None else int(device_id)
        n_gpu = cp.cuda.runtime.getDeviceCount()
        if self.device_id >= n_gpu:
            raise WorkbenchError(
                f"NCCL: rank {rank} wants GPU {self.device_id} but this machine has {n_gpu}; "
                f"NCCL allows one process per GPU (world size <= number of GPUs)")
        self.cp = cp
        with cp.cuda.Device(self.device_id):
            self.comm = nccl.NcclCommunicator(self.world_size, uid, self.global_rank)
            self.stream = cp.cuda.Stream(non_blocking=True)
        self._peers = []

    def _sync_in(self) -> None:
        """The communication stream waits for the work queued so far on the current stream
        (the computation of the arrays about to be sent)."""
        self.stream.wait_event(self.cp.cuda.get_current_stream().record())

    def _sync_out(self) -> None:
        """Work queued later on the current stream waits for the communication (the host
        does not: :meth:`wait` blocks, with the deadline)."""
        self.cp.cuda.get_current_stream().wait_event(self.stream.record())

    def all_reduce(self, a, *, half: bool = False):
        _check_array(a, "all_reduce")
        if not _is_cupy(a):
            raise WorkbenchError("the NCCL engine reduces cupy (GPU) arrays; got a numpy "
                                 "array (use the MPI engine for CPU training)")
        nccl = self.nccl
        with self.cp.cuda.Device(self.device_id):
            buf = a.astype(self.cp.float16) if half else a   # on the current stream
            self._sync_in()
            self._count(buf)
            self.comm.allReduce(buf.data.ptr, buf.data.ptr, buf.size,
                                _nccl_dtype(nccl, buf.dtype), nccl.NCCL_SUM, self.stream.ptr)
            if half:
                with self.stream:
                    a[...] = buf.astype(a.dtype)
            self._sync_out()
        return a

    def all_gather(self, a):
        _check_array(a, "all_gather")
        with self.cp.cuda.Device(self.device_id):
            out = self.cp.empty((self.world_size, *a.shape), a.dtype)
            self._sync_in()
            self._count(a)
            self.comm.allGather(a.data.ptr, out.data.ptr, a.size,
                                _nccl_dtype(self.nccl, a.dtype), self.stream.ptr)
            self.wait()
        return out

    def broadcast(self, a, root: int = 0):
        _check_array(a, "broadcast")
        with self.cp.cuda.Device(self.device_id):
            self._sync_in()
            if self.global_rank == root:
                self._count(a)
            self.comm.broadcast(a.data.ptr, a.data.ptr, a.size,
                                _nccl_dtype(self.nccl, a.dtype), root, self.stream.ptr)
            self.wait()
        return a

    def barrier(self) -> None:
        with self.cp.cuda.Device(self.device_id):
            x = self.cp.zeros(1, self.cp.float32)
            self.all_reduce(x)
            self.wait()

    def wait(self) -> None:
        ev = self.stream.record()
        try:
            self._poll(lambda: ev.done, "a NCCL collective")
        except DistributedError:
            try:
                self.comm.abort()
            finally:
                raise
        # the default stream waits for the results too
        self.cp.cuda.get_current_stream().wait_event(ev)

    def all_gather_object(self, obj) -> list:
        import pickle  # noqa: PLC0415
        cp = self.cp
        data = np.frombuffer(pickle.dumps(obj), np.uint8)
        n = cp.asnumpy(self.all_gather(cp.asarray([data.size], cp.int64)))[:, 0]
        buf = np.zeros(int(n.max()), np.uint8)
        buf[:data.size] = data
        allb = cp.asnumpy(self.all_gather(cp.asarray(buf)))
        return [pickle.loads(allb[r, :n[r]].tobytes()) for r in range(self.world_size)]

    def exchange_peers(self) -> None:
        """Learn the other ranks' (host, pid) for the liveness checks."""
        self._peers = self.all_gather_object((socket.gethostname(), os.getpid()))

    def abort(self, code: int = 1) -> None:
        try:
            self.comm.abort()
        finally:
            os._exit(code)

    def close(self) -> None:
        if self.comm is not None:
            self.comm.destroy()
            self.comm = None


# ------------------------------------------------------------------ choosing one
def get_communicator(nccl_id=None, local_rank=None, world_size=None,
                     timeout: float | None = None) -> Communicator:
    """A new communicator for this process (each DistOpt has its own: its timeout, step and
    byte count are its own): NCCL with ``nccl_id`` (multiprocess on one machine), MPI when
    started by an MPI launcher (over a duplicate of ``MPI.COMM_WORLD``; every rank must ask
    in the same order), otherwise the world-size-1 :class:`LocalCommunicator`."""
    if nccl_id is not None:
        if local_rank is None or world_size is None:
            raise WorkbenchError("DistOpt(nccl_id=...) also needs local_rank and world_size "
                                 "(SINGA's multiprocess constructor)")
        c = NcclCommunicator(nccl_id, local_rank, world_size, timeout=timeout)
        c.exchange_peers()
        return c
    if world_size is not None and int(world_size) > 1 and not launched_by_mpi():
        raise WorkbenchError(
            f"DistOpt(world_size={world_size}) without nccl_id: start the {world_size} "
            f"processes with mpiexec -n {world_size} python train.py (MPI), or pass an "
            f"NcclIdHolder from the parent process (GPUs)")
    if launched_by_mpi() and mpi4py_available():
        return MPICommunicator(timeout=timeout)
    if launched_by_mpi() and not mpi4py_available():
        n = _launcher_size()
        if n is not None and n > 1:
            raise WorkbenchError(
                f"started by an MPI launcher with {n} processes but mpi4py is not installed: "
                f"each process would train alone on its data; pip install "
                f"'onnx-workbench[dist]' (mpi4py and the mpich wheel)")
        import warnings  # noqa: PLC0415
        warnings.warn("started by an MPI launcher but mpi4py is not installed: every process "
                      "trains alone (world size 1); pip install 'onnx-workbench[dist]'",
                      RuntimeWarning, stacklevel=3)
    return LocalCommunicator(timeout)


def fp16_tolerance(world_size: int) -> float:
    """A relative bound for sums of ``world_size`` float16 roundings (for tests and docs)."""
    return float(np.finfo(np.float16).eps) * (1 + math.log2(max(world_size, 1)))
