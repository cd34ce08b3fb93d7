"""Our CUDA kernels (cupy ``RawKernel``/``RawModule`` and ``ElementwiseKernel``).

Raw kernels only: nothing here knows the op registry or the gradient rules. The ops layer
registers them as *cupy overrides* of the portable ONNX kernels (``workbench/ops/cuda.py``,
imported by the registry on the first ``lookup(..., xp="cupy")``), so a Plan built for a CUDA
device uses them and a CPU plan never sees them. Importing this package needs neither cupy nor
a GPU; calling a kernel needs both.

Families (each keeps its CUDA C in one ``SOURCE`` string):

- ``conv``: im2col / col2im / depthwise; ``conv2d``, ``conv2d_backward_data``,
  ``conv2d_backward_weight``, ``conv_transpose2d`` (GEMMs through ``cupy.matmul``/cuBLAS)
- ``pool``: ``maxpool2d`` (+ argmax), ``maxpool2d_backward``, ``avgpool2d``,
  ``avgpool2d_backward``
- ``norm``: ``batchnorm_inference`` (+ fused ReLU), ``batchnorm_stats``/``batchnorm_training``,
  ``layernorm``
- ``softmax``: ``softmax_lastdim`` (Softmax/LogSoftmax), ``softmax_cross_entropy`` and
  ``softmax_cross_entropy_backward``
- ``elementwise``: ``gelu``, ``erf`` and ``fuse_elementwise(chain)``
"""

from __future__ import annotations

RAW_FAMILIES = ("conv", "pool", "norm", "softmax")


def raw_sources() -> dict:
    """{family: CUDA source body} of the RawKernel families (before the dtype prelude)."""
    import importlib  # noqa: PLC0415
    return {f: importlib.import_module(f"workbench.arrays.cuda.{f}").SOURCE
            for f in RAW_FAMILIES}


def all_sources(dtype: str = "float32") -> dict:
    """{name: complete compilable CUDA source} of every kernel text we ship, for ``dtype``."""
    from workbench.arrays.cuda import _base, elementwise  # noqa: PLC0415
    out = {f"{f}[{dtype}]": _base.full_source(s, dtype) for f, s in raw_sources().items()}
    out.update({f"elementwise.{k}[{dtype}]": v for k, v in elementwise.sources(dtype).items()})
    return out
