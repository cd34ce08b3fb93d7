"""Stand-in for SINGA's SWIG module ``singa.singa_wrap`` (the C++ core), for the ported tests.

SINGA's Python tests import it as ``singa_wrap``, ``singa_api`` or ``singa``. What they reach
there is SINGA's C++ layer, not its Python API, so it is shimmed here, over the workbench's
public pieces (``autograd.RawTensor`` is the workbench's face of SINGA's C++ tensor: what
operator ``forward``/``backward`` take and return). Every name and why it is needed:

- ``USE_CUDA``: whether the build has CUDA. Here: cupy is installed and sees a GPU, so the tests
  SINGA marks ``skipIf(not singa_api.USE_CUDA)`` run exactly where a GPU is present.
- ``Tensor`` (SINGA's ``CTensor``): ``test_operation.py`` builds ``CTensor([2, 1, 2, 2])`` at
  import; here a zero-filled float32 ``autograd.RawTensor`` of that shape.
- ``Gaussian(mean, std, t)``: fills such a raw tensor in place with normal samples (the
  workbench's host random source, ``tensor.seed``), as SINGA's C++ function does.
- ``BatchNormHandle(factor, x)`` / ``CudnnBatchNormHandle(factor, x)``: SINGA's C++ handles
  that carry the batch-norm momentum (``factor``) to ``autograd.batchnorm_2d``; the workbench
  needs only that number (the kernels need no per-shape handle), so the handle keeps it.
- ``CudnnRNNHandle``: used only by GPU-only tests (``test_cudnn_rnn_operation``) through
  ``autograd._RNN``, SINGA's cuDNN RNN operator, which the workbench does not have (its
  ``layer.CudnnRNN`` runs ONNX RNN/LSTM/GRU nodes instead); calling it raises a clear error.
"""

from __future__ import annotations

import numpy as np

from workbench import autograd as _autograd
from workbench import device as _device

USE_CUDA: bool = bool(_device.cuda_available())


def Tensor(shape=(), device=None, dtype=np.float32):  # noqa: N802 - SINGA's C++ name
    """SINGA's ``CTensor(shape[, device])``: zeros of ``shape`` as a raw tensor."""
    arr = np.zeros(tuple(int(d) for d in shape), dtype=dtype)
    if device is not None:
        arr = device.put(arr)
    return _autograd.RawTensor(arr)


def Gaussian(mean, std, t):  # noqa: N802 - SINGA's C++ name
    """Fill raw tensor ``t`` in place with normal samples N(mean, std)."""
    a = _device.host_rng().normal(float(mean), float(std), size=t.shape()).astype(t.dtype)
    dev = t.device()
    t.data = dev.put(a)
    return t


class BatchNormHandle:
    """SINGA's ``BatchNormHandle(factor, input)``: here it carries the momentum ``factor``."""

    def __init__(self, factor, x=None):
        self.factor = float(factor)
        self.shape = None if x is None else tuple(np.shape(x))


class CudnnBatchNormHandle(BatchNormHandle):
    """SINGA's cuDNN variant; the same here (the kernels choose the device themselves)."""


class CudnnRNNHandle:
    """SINGA's cuDNN RNN handle: not available (see the module docstring)."""

    def __init__(self, *args, **kwargs):
        raise NotImplementedError(
            "CudnnRNNHandle is SINGA's cuDNN RNN handle; the workbench has no cuDNN RNN "
            "operator (autograd._RNN). Use layer.CudnnRNN / layer.RNN / layer.LSTM, which run "
            "ONNX RNN/LSTM/GRU nodes on any device.")
