"""ONNX Workbench: see, run, re-train, transfer-learn and export ONNX models in Jupyter.

The Pythonic facade (a few obvious names); everything else lives in the submodules::

    import workbench as wb
    model = wb.load("model.onnx")          # a path, bytes, an onnx.ModelProto or a zoo name
    model.summary(); wb.show(model)        # parameters; the graph (GraphView in a notebook)
    y = model.run(x)                       # numpy in, numpy out
    head = model.cut(-3)                   # SINGA's last_layers, or a node/value name
    wb.inspect(model, {"data": x})         # per-node tensor statistics (TensorInspector)
    wb.fit(model, x, y, epochs=3)          # training loop with a live monitor
    model.export("out.onnx")               # to_onnx, atomically, never over a file

SINGA's API, with only the import line changed::

    from workbench import device, tensor, sonnx, opt, autograd, layer
"""

from __future__ import annotations

import importlib
import os

__version__ = "0.1.0"

_SUBMODULES = {"analysis", "arrays", "autodiff", "autograd", "backend", "classroom", "cli",
               "conformance", "device", "dist", "edit", "errors", "graph", "layer", "model",
               "ops", "opt", "quantization", "singa", "sonnx", "tensor", "training", "widgets",
               "zoo"}


def load(src, *, device=None, allow_twin: bool = False, **kwargs):
    """Load a model as a trainable :class:`workbench.sonnx.SONNXModel`.

    ``src`` is a path, bytes, an ``onnx.ModelProto`` or a zoo name (``"resnet18"``; downloaded
    into the cache; with ``allow_twin=True`` an offline machine gets the model's untrained
    architecture twin, with a printed note). ``kwargs`` go to the loader (``batch_size=``...).
    """
    from workbench.singa.sonnx import SONNXModel
    if isinstance(src, str) and not os.path.exists(src) and not src.endswith(".onnx"):
        from workbench import zoo
        zoo.get(src)  # unknown names raise with suggestions
        src, _is_twin = zoo.load_model(src, allow_twin=allow_twin)
    return SONNXModel(src, device=device, **kwargs) if kwargs else SONNXModel(src, device=device)


def show(model, **kwargs):
    """The model's graph: a GraphView widget in a notebook (a text summary elsewhere)."""
    from workbench.widgets import GraphView
    return GraphView(model, **kwargs)


def inspect(model, inputs, **kwargs):
    """Run ``model`` on ``inputs`` capturing every node's output statistics."""
    from workbench.widgets import TensorInspector
    return TensorInspector(model, inputs, **kwargs)


def fit(model, x, y, **kwargs):
    """Train ``model`` on arrays ``x``/``y`` (see :func:`workbench.training.fit`)."""
    from workbench.training import fit as _fit
    return _fit(model, x, y, **kwargs)


def netron(model, **kwargs):
    """Netron's own UI for ``model``, served on 127.0.0.1 and shown in an IFrame."""
    from workbench.widgets.netron_view import netron as _netron
    return _netron(model, **kwargs)


def _jupyter_server_extension_points():
    """The jupyter_server extension (``jupyter server extension enable workbench``): the
    ``ONNX Graph`` viewer's API, in :mod:`workbench.labext`."""
    return [{"module": "workbench.labext"}]


def _jupyter_labextension_paths():
    """The prebuilt JupyterLab extension (``jupyter labextension develop --overwrite .``)."""
    return [{"src": "labextension", "dest": "@onnx-workbench/jupyterlab-onnx"}]


def __getattr__(name: str):
    if name in _SUBMODULES:
        return importlib.import_module(f"workbench.{name}")
    raise AttributeError(f"module 'workbench' has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | _SUBMODULES)
