"""The engine's devices: where arrays live and kernels run, and each device's random source.

A :class:`Device` is numpy on the CPU or cupy on a CUDA GPU; there is one Device object per
place (:func:`cpu`, :func:`cuda`, :func:`get_device` for a spec such as ``"CUDA:1"``). Arrays
move between devices only when asked (``put``/``get``, ``Tensor.to_device``). Every device
has one random source (``Device.rng``; :func:`host_rng` is the CPU's), seeded with
``Device.SetRandSeed`` / :func:`seed_host` / :func:`seed_all`.

SINGA's device module (``create_cpu``, ``create_cuda_gpu``, ``get_default_device``...) is
``workbench.singa.device``, over this one. A Device keeps SINGA's method names
(``SetRandSeed``, ``EnableGraph``, ``ResetGraph``, ``SetVerbosity``, ``PrintTimeProfiling``...)
because SINGA programs call them on the Device objects the engine hands out (``t.device``).
"""

from __future__ import annotations

import time

import numpy as np

from workbench.arrays import cupy_module, device_dtype_ok, is_array
from workbench.errors import DeviceError

#: each device's random source: (kind, index) -> numpy Generator. Reseeding replaces a
#: generator's state in place, so plans and contexts holding it see the new seed.
_GENERATORS: dict[tuple[str, int], np.random.Generator] = {}


def _reseed(gen: np.random.Generator, seed) -> None:
    gen.bit_generator.state = np.random.default_rng(seed).bit_generator.state


def host_rng() -> np.random.Generator:
    """The CPU's random source: parameter initialisers, ``Tensor.gaussian/uniform/bernoulli``,
    Dropout masks, random ops without a ``seed`` attribute (``cpu().rng``)."""
    return _CPU.rng


def seed_host(seed) -> None:
    """Reseed the CPU's random source (``tensor.seed``, ``cpu().SetRandSeed``)."""
    _CPU.SetRandSeed(seed)


def seed_all(seed) -> None:
    """Reseed the random source of the CPU and of every GPU in use (``autograd.manual_seed``)."""
    _CPU.SetRandSeed(seed)
    for dev in _CUDA.values():
        dev.SetRandSeed(seed)


class Device:
    """A place where arrays live and kernels run."""

    def __init__(self, kind: str = "CPU", index: int = 0):
        self.kind = kind.upper()
        self.index = int(index)
        self._peak_bytes = 0
        self._graph_enabled = False
        self._verbosity = 0
        self._skip_iteration = 5
        self.profile = TimeProfile()

    @property
    def is_cuda(self) -> bool:
        return self.kind == "CUDA"

    @property
    def xp(self):
        return cupy_module() if self.is_cuda else np

    def __repr__(self) -> str:
        return "Device('CPU')" if not self.is_cuda else f"Device('CUDA:{self.index}')"

    def __str__(self) -> str:
        return "CPU" if not self.is_cuda else f"CUDA:{self.index}"

    def __eq__(self, other) -> bool:
        return isinstance(other, Device) and (self.kind, self.index) == (other.kind, other.index)

    def __hash__(self) -> int:
        return hash((self.kind, self.index))

    # ------------------------------------------------------------------ SINGA's Device API
    def id(self) -> int:  # noqa: A003 - SINGA's name
        """SINGA's device id: -1 for the CPU, the GPU's index for CUDA."""
        return -1 if self.kind == "CPU" else self.index

    id_ = id

    def lang(self) -> str:
        """SINGA's language of the device: ``"kCpp"`` (CPU) or ``"kCuda"``."""
        return "kCuda" if self.is_cuda else "kCpp"

    def EnableGraph(self, enable: bool) -> None:  # noqa: N802 - SINGA's name
        """SINGA's switch for buffering operations into a graph on this device.

        Here graph mode belongs to a ``model.Model`` (``compile(..., use_graph=True)`` records
        one forward and replays it): the flag is kept, reported by :meth:`graph_enabled`
        and set by ``Model`` while it records; operations always run when called."""
        self._graph_enabled = bool(enable)

    def graph_enabled(self) -> bool:
        return self._graph_enabled

    def ResetGraph(self) -> None:  # noqa: N802 - SINGA's name
        """Forget what was buffered for graph mode: a new graph generation begins
        (:func:`graph_generation`), so the replays recorded before it (``Model`` graph
        mode) are not used again - the next call records anew; models are not tied to one
        device, so every model's - and this device's time profile is cleared. The
        ``EnableGraph`` flag is left as it is."""
        global _graph_generation
        _graph_generation += 1
        self.profile.reset()

    def RunGraph(self, sequential: bool = False) -> None:  # noqa: N802 - SINGA's name
        """SINGA runs the buffered graph here; recorded replays run when the model is
        called, in order, so this only waits for the device (:meth:`Sync`)."""
        self.Sync()

    def Sync(self) -> None:  # noqa: N802 - SINGA's name
        """Wait until the work queued on this device is done (a no-op on the CPU)."""
        self.synchronize()

    def SetVerbosity(self, verbosity: int) -> None:  # noqa: N802 - SINGA's name
        """Verbosity > 0 turns on the per-operator time profile (:meth:`PrintTimeProfiling`):
        every plan run on this device (imported models, graph-mode replays, SingaRep) times
        each node through the executor's per-node hook, after the first
        ``SetSkipIteration`` runs (warm-up)."""
        v = int(verbosity)
        if v < 0:
            raise DeviceError(f"SetVerbosity: verbosity must be >= 0, got {verbosity!r}")
        self._verbosity = v

    def verbosity(self) -> int:
        return self._verbosity

    def SetSkipIteration(self, n: int) -> None:  # noqa: N802 - SINGA's name
        """Runs left out of the time profile at the start (warm-up; SINGA's default is 5)."""
        n = int(n)
        if n < 0:
            raise DeviceError(f"SetSkipIteration: expected >= 0, got {n}")
        self._skip_iteration = n

    def profile_hook(self):
        """The executor hook timing one run, or None when profiling is off (verbosity 0).
        Callers pass it as ``Plan.execute(..., hook=...)``."""
        if self._verbosity <= 0:
            return None
        return self.profile.run_hook(self, self._skip_iteration)

    def PrintTimeProfiling(self, file=None) -> str:  # noqa: N802 - SINGA's name
        """Print (and return) the per-operator time table collected since profiling was
        turned on with ``SetVerbosity(1)``: for each node, its op type, how many runs were
        timed, the mean and total time and its share of the total."""
        text = self.profile.table(str(self))
        print(text, file=file)
        return text

    @property
    def rng(self) -> np.random.Generator:
        """This device's random source (one per device): Dropout masks in training, the random
        ops (Random*, Bernoulli, Multinomial) without a ``seed`` attribute, and, on the CPU,
        parameter initialisers. Seed it with :meth:`SetRandSeed`."""
        key = (self.kind, self.index)
        gen = _GENERATORS.get(key)
        if gen is None:
            gen = _GENERATORS[key] = np.random.default_rng()
        return gen

    def SetRandSeed(self, seed: int) -> None:  # noqa: N802 - SINGA's name
        """Reseed this device's random source (SINGA's ``Device.SetRandSeed``); on a GPU also
        cupy's generator, which draws the device-side Dropout masks."""
        _reseed(self.rng, seed)
        if self.is_cuda:
            cp = cupy_module()
            with cp.cuda.Device(self.index):
                cp.random.seed(seed)

    def put(self, a):
        """Move an array (or a list of arrays, for sequence values) onto this device.

        On CUDA, arrays of dtypes cupy has no counterpart for (bfloat16, float8, int4 and the
        other ml_dtypes types, strings) stay on the host: the executor runs the nodes that
        touch them on the host (see ``workbench.runtime.placement``)."""
        if isinstance(a, list):
            return [self.put(x) for x in a]
        if a is None or isinstance(a, dict):  # maps (ai.onnx.ml) are host Python values
            return a
        if self.is_cuda:
            cp = cupy_module()
            if isinstance(a, (np.ndarray, np.generic)) and not device_dtype_ok(a.dtype):
                return np.asarray(a)
            with cp.cuda.Device(self.index):
                return cp.asarray(a)
        if is_array(a) and not isinstance(a, np.ndarray):
            return cupy_module().asnumpy(a)
        if isinstance(a, np.ndarray):
            return a
        return np.asarray(a)

    def get(self, a):
        """Copy an array back to the host as numpy (lists element-wise)."""
        if isinstance(a, list):
            return [self.get(x) for x in a]
        cp = cupy_module()
        if cp is not None and isinstance(a, cp.ndarray):
            return cp.asnumpy(a)
        return a

    def move_plan(self, plan, keep=frozenset()):
        """Put a plan's constant arrays (initializers) on this device, except the slots in
        ``keep`` (values the plan reads on the host)."""
        plan._template = [self.put(v) if is_array(v) and i not in keep else v
                          for i, v in enumerate(plan._template)]
        return plan

    def _note_peak(self, nbytes: int) -> None:
        if nbytes > self._peak_bytes:
            self._peak_bytes = int(nbytes)

    def reset_peak(self) -> None:
        """Forget the peak recorded so far (``memory_info()['peak_bytes']``)."""
        self._peak_bytes = 0

    def memory_info(self) -> dict:
        """Memory of this device's array pool, in bytes.

        On CUDA (cupy's default memory pool): ``used_bytes`` (held by live arrays),
        ``pool_bytes`` (reserved by the pool, used + cached free blocks), ``peak_bytes`` (the
        highest ``used_bytes`` seen by a Plan run with ``plan.track_memory = True``, or by
        this call) and ``free_bytes``/``total_bytes`` of the GPU. On the CPU arrays are plain
        numpy allocations that are not tracked: every field is 0.
        """
        info = {"device": str(self), "used_bytes": 0, "pool_bytes": 0,
                "peak_bytes": self._peak_bytes, "free_bytes": 0, "total_bytes": 0}
        if not self.is_cuda:
            return info
        cp = cupy_module()
        with cp.cuda.Device(self.index):
            pool = cp.get_default_memory_pool()
            used = int(pool.used_bytes())
            self._note_peak(used)
            free, total = cp.cuda.runtime.memGetInfo()
        info.update(used_bytes=used, pool_bytes=int(pool.total_bytes()),
                    peak_bytes=self._peak_bytes, free_bytes=int(free), total_bytes=int(total))
        return info

    def synchronize(self) -> None:
        if self.is_cuda:
            cupy_module().cuda.Device(self.index).synchronize()


#: bumped by every ``Device.ResetGraph``: graph-mode replays remember the generation they
#: were recorded in and are dropped by their owner when it has changed
_graph_generation = 0


def graph_generation() -> int:
    """The number of ``Device.ResetGraph`` calls so far (on any device)."""
    return _graph_generation


class TimeProfile:
    """Per-node wall time of plan runs, measured by the executor's per-node hook: the time
    from the previous node's end (or the run's start) to this node's end, per node name.
    On a GPU the device is synchronized at each node so the time is the node's own."""

    def __init__(self):
        self.reset()

    def reset(self) -> None:
        self.runs_seen = 0
        self.runs_timed = 0
        self._rows: dict = {}  # (node name, op type) -> [count, total seconds]

    def run_hook(self, device: Device, skip: int):
        self.runs_seen += 1
        if self.runs_seen <= skip:
            return None
        self.runs_timed += 1
        sync = device.synchronize if device.is_cuda else None
        if sync is not None:
            sync()
        last = [time.perf_counter()]
        rows = self._rows

        def hook(node, outputs):
            if sync is not None:
                sync()
            now = time.perf_counter()
            key = (node.name, node.op_type)
            r = rows.get(key)
            if r is None:
                r = rows[key] = [0, 0.0]
            r[0] += 1
            r[1] += now - last[0]
            last[0] = now

        return hook

    def rows(self) -> list:
        """[(node name, op type, count, total seconds)] in the order first seen."""
        return [(n, op, c, t) for (n, op), (c, t) in self._rows.items()]

    def table(self, where: str = "") -> str:
        rows = self.rows()
        if not rows:
            return (f"Time profiling{' on ' + where if where else ''}: nothing timed yet "
                    f"(runs seen: {self.runs_seen}); call SetVerbosity(1) on the device, then "
                    f"run the model more than SetSkipIteration times")
        total = sum(t for *_, t in rows) or 1e-12
        w = max(12, max(len(n) for n, *_ in rows))
        lines = [f"Time profiling{' on ' + where if where else ''}: {self.runs_timed} run(s) "
                 f"timed, {len(rows)} node(s), {total * 1e3:.3f} ms in all",
                 f"{'#':>4}  {'node':<{w}}  {'op':<18} {'runs':>6} {'mean ms':>10} "
                 f"{'total ms':>10} {'share':>7}"]
        for i, (n, op, c, t) in enumerate(rows):
            lines.append(f"{i:>4}  {n:<{w}}  {op:<18} {c:>6} {t / c * 1e3:>10.4f} "
                         f"{t * 1e3:>10.3f} {t / total:>7.1%}")
        return "\n".join(lines)


_CPU = Device("CPU")
_CUDA: dict[int, Device] = {}


def cuda_available() -> bool:
    """Whether cupy is installed and sees at least one CUDA GPU."""
    return gpu_count() > 0


def gpu_count() -> int:
    """How many CUDA GPUs cupy sees (0 without cupy or a GPU)."""
    cp = cupy_module()
    if cp is None:
        return 0
    try:
        return int(cp.cuda.runtime.getDeviceCount())
    except Exception:
        return 0


def cpu() -> Device:
    """The CPU (numpy arrays)."""
    return _CPU


def default_device() -> Device:
    """Where Tensors and ops without a device go: the CPU."""
    return _CPU


def cuda(index: int = 0) -> Device:
    """The CUDA GPU ``index`` (needs cupy and a working GPU); one Device object per GPU."""
    cp = cupy_module()
    if cp is None:
        raise DeviceError("CUDA was asked for but cupy is not installed; install the GPU extra "
                          "(pip install 'onnx-workbench[gpu-cuda12]' or [gpu-cuda13]) or use "
                          "the CPU")
    n = gpu_count()
    if n == 0:
        raise DeviceError("CUDA was asked for but no CUDA GPU is visible to cupy "
                          "(cupy.cuda.runtime.getDeviceCount() is 0 or failed); use the CPU")
    if not 0 <= index < n:
        raise DeviceError(f"CUDA:{index} does not exist: this machine has {n} GPU(s) "
                          f"(CUDA:0..CUDA:{n - 1})")
    if index not in _CUDA:
        _CUDA[index] = Device("CUDA", index)
    return _CUDA[index]


def get_device(spec=None) -> Device:
    """A Device from a Device, 'CPU', 'CUDA', 'CUDA:1', or an onnx.backend Device string
    (None: :func:`default_device`)."""
    if spec is None:
        return default_device()
    if isinstance(spec, Device):
        return spec
    s = str(spec).strip().upper()
    if s == "CPU":
        return _CPU
    if s.startswith("CUDA") or s.startswith("GPU"):
        idx = 0
        if ":" in s:
            idx = int(s.split(":", 1)[1] or 0)
        return cuda(idx)
    raise DeviceError(f"unknown device {spec!r}; use 'CPU' or 'CUDA:<n>'")


def supports(spec) -> bool:
    """Whether ``spec`` ('CPU', 'CUDA', 'CUDA:n') can run here."""
    s = str(spec).strip().upper()
    if s == "CPU":
        return True
    if s.startswith("CUDA"):
        return cuda_available()
    return False


def device_of_array(a) -> Device:
    """The Device an array lives on (a cupy array: its GPU; anything else: the CPU)."""
    cp = cupy_module()
    if cp is not None and isinstance(a, cp.ndarray):
        return Device("CUDA", a.device.id)
    return _CPU
