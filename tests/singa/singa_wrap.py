"""Stand-in for SINGA's SWIG module ``singa.singa_wrap`` (the C++ core), for the ported tests.

SINGA's Python tests import it as ``singa_wrap``, ``singa_api`` or ``singa`` for:

- ``USE_CUDA``: whether the build has CUDA. Here: cupy is installed and sees a GPU, so the tests
  SINGA marks ``skipIf(not singa_api.USE_CUDA)`` run exactly where a GPU is present.

Every other name the tests reach is listed below with the reason it is needed.
"""

from __future__ import annotations

from workbench import device as _device

USE_CUDA: bool = bool(_device.cuda_available())
