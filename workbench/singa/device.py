"""SINGA's ``device`` module: ``create_cpu()``, ``create_cuda_gpu()``, ``get_default_device()``.

The Device objects are the engine's (``workbench.arrays.device``): one per place, numpy on the
CPU, cupy on a CUDA GPU, each with its random source and SINGA's methods (``SetRandSeed``,
``EnableGraph``, ``ResetGraph``, ``SetVerbosity``, ``PrintTimeProfiling``...). This module adds
SINGA's module-level functions over them.
"""

from __future__ import annotations

from workbench.arrays import cupy_module
from workbench.arrays.device import (  # noqa: F401 - SINGA's device API re-exports these
    Device,
    TimeProfile,
    cuda,
    cuda_available,
    get_device,
    gpu_count,
    host_rng,
    seed_all,
    seed_host,
    supports,
)
from workbench.arrays.device import cpu as create_cpu
from workbench.arrays.device import default_device as get_default_device
from workbench.errors import DeviceError

__all__ = [
    "Device", "TimeProfile", "create_cpu", "create_cpu_device", "create_cuda_gpu",
    "create_cuda_gpu_on", "create_cuda_gpus", "create_cuda_gpus_on", "create_opencl_device",
    "cuda_available", "device_query", "enable_lazy_alloc", "get_default_device", "get_device",
    "get_gpu_ids", "get_gpu_mem_size", "get_num_gpus", "get_num_opencl_devices",
    "get_num_opencl_platforms", "host_rng", "seed_all", "seed_host", "supports",
]


def create_cuda_gpu(id: int = 0) -> Device:  # noqa: A002 - SINGA's parameter name
    """The CUDA GPU ``id`` (needs cupy and a working GPU); one Device object per GPU."""
    return cuda(id)


create_cuda_gpu_on = create_cuda_gpu


def get_num_gpus() -> int:
    """How many CUDA GPUs cupy sees (0 without cupy or a GPU)."""
    return gpu_count()


def get_gpu_ids() -> list:
    return list(range(get_num_gpus()))


def get_gpu_mem_size(id: int) -> tuple:  # noqa: A002 - SINGA's parameter name
    """``(free, total)`` bytes of GPU ``id`` (SINGA's ``GetGPUMemSize``)."""
    dev = create_cuda_gpu(id)
    cp = cupy_module()
    with cp.cuda.Device(dev.index):
        free, total = cp.cuda.runtime.memGetInfo()
    return int(free), int(total)


def device_query(id: int, verbose: bool = False) -> str:  # noqa: A002 - SINGA's name
    """A description of GPU ``id``: name, compute capability and memory."""
    dev = create_cuda_gpu(id)
    cp = cupy_module()
    props = cp.cuda.runtime.getDeviceProperties(dev.index)
    name = props["name"].decode() if isinstance(props["name"], bytes) else str(props["name"])
    free, total = get_gpu_mem_size(id)
    text = (f"CUDA:{dev.index} {name}, compute capability {props['major']}.{props['minor']}, "
            f"{total / 2**30:.1f} GiB ({free / 2**30:.1f} GiB free)")
    if verbose:
        text += (f", {props['multiProcessorCount']} multiprocessors, "
                 f"{props['clockRate'] / 1e6:.2f} GHz")
    return text


def create_cpu_device() -> Device:
    """SINGA's name for :func:`create_cpu`."""
    return create_cpu()


def create_cuda_gpus(num: int) -> list:
    """The first ``num`` GPUs."""
    n = get_num_gpus()
    if num > n:
        raise DeviceError(f"create_cuda_gpus({num}): this machine has {n} GPU(s)")
    return [create_cuda_gpu(i) for i in range(num)]


def create_cuda_gpus_on(device_ids) -> list:
    return [create_cuda_gpu(i) for i in device_ids]


def get_num_opencl_platforms() -> int:
    """0: this engine has no OpenCL back end (CPU through numpy, CUDA through cupy)."""
    return 0


def get_num_opencl_devices() -> int:
    return 0


def create_opencl_device():
    raise DeviceError("OpenCL devices are not supported: use device.create_cpu() or "
                      "device.create_cuda_gpu() (CUDA through cupy)")


def enable_lazy_alloc(enable: bool) -> None:
    """SINGA's switch for allocating a tensor's memory on first write. Arrays here are
    numpy/cupy arrays created when a value is computed, which is what the switch asks for,
    so both settings behave the same; the argument is checked and otherwise unused."""
    if not isinstance(enable, (bool, int)):
        raise DeviceError(f"enable_lazy_alloc expects a bool, got {type(enable).__name__}")
