"""SINGA's Python API over the engine: ``autograd`` (its functions, ``Operator`` classes and
``training`` flag), ``tensor``, ``layer``, ``model`` (``Model``, ``SONNXModel``), ``opt``
(optimizers, ``DistOpt``), ``sonnx``, ``device`` and ``counting`` (SINGA's ``last_layers``
counting).

SINGA programs import them as ``from workbench import device, tensor, sonnx, opt, autograd,
layer`` (the old paths are the same module objects). The engine below
(``workbench.autodiff``, ``workbench.graph``, ``workbench.ops``, ``workbench.arrays``,
``workbench.dist``) never imports this package.
"""

import importlib

_MODULES = ("autograd", "counting", "device", "layer", "model", "opt", "sonnx", "tensor")


def __getattr__(name: str):
    if name in _MODULES:  # imported when first used: workbench.singa.autograd ...
        return importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | set(_MODULES))
