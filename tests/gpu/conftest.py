"""GPU test helpers. The ``device`` and ``cuda`` fixtures live in ``tests/conftest.py`` (every
test package parametrises over devices with them); the CUDA half skips cleanly ("no CUDA
GPU/cupy") when cupy or a GPU is missing."""

from __future__ import annotations

from tests.conftest import cuda_skip_reason  # noqa: F401 - re-exported for the GPU tests

#: comparison tolerance (rtol, atol) of a device result against the numpy path, per dtype
TOL = {"float32": (1e-4, 1e-5), "float16": (1e-2, 1e-2), "float64": (1e-10, 1e-12)}
