"""GPU test fixtures: ``device`` runs a test on the CPU and on CUDA:0; the CUDA half skips
cleanly ("no CUDA GPU/cupy") when cupy or a GPU is missing."""

from __future__ import annotations

import pytest

from workbench import device as wbdevice
from workbench.arrays import cupy_module


def cuda_skip_reason() -> str | None:
    if cupy_module() is None:
        return "no CUDA GPU/cupy: cupy is not installed (pip install '.[gpu-cuda12]')"
    if not wbdevice.cuda_available():
        return "no CUDA GPU/cupy: cupy sees no CUDA GPU"
    return None


@pytest.fixture(params=["CPU", pytest.param("CUDA:0", marks=pytest.mark.gpu)])
def device(request):
    """A workbench Device: 'CPU', then 'CUDA:0' (skipped without cupy and a GPU)."""
    if request.param != "CPU":
        reason = cuda_skip_reason()
        if reason:
            pytest.skip(reason)
    return wbdevice.get_device(request.param)


@pytest.fixture
def cuda():
    """The CUDA:0 Device (skipped without cupy and a GPU)."""
    reason = cuda_skip_reason()
    if reason:
        pytest.skip(reason)
    return wbdevice.get_device("CUDA:0")


#: comparison tolerance (rtol, atol) of a device result against the numpy path, per dtype
TOL = {"float32": (1e-4, 1e-5), "float16": (1e-2, 1e-2), "float64": (1e-10, 1e-12)}
