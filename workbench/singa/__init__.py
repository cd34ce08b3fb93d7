"""SINGA's Python API over the engine: ``autograd`` (its functions, ``Operator`` classes and
``training`` flag), ``tensor``, ``layer``, ``model`` (``Model``, ``SONNXModel``), ``opt``
(optimizers, ``DistOpt``), ``sonnx`` and ``device``.

SINGA programs import them as ``from workbench import device, tensor, sonnx, opt, autograd,
layer`` (the old paths are the same module objects). The engine below
(``workbench.autodiff``, ``workbench.graph``, ``workbench.ops``, ``workbench.arrays``,
``workbench.dist``) never imports this package.
"""
