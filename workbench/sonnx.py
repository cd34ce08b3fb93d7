"""SINGA's ``sonnx`` API: imported ONNX graphs as trainable models, and ``to_onnx``.

>>> import onnx                                                     # doctest: +SKIP
>>> from workbench import device, tensor, sonnx
>>> class MyModel(sonnx.SONNXModel):                                 # doctest: +SKIP
...     def forward(self, *x):
...         return super().forward(*x)[0]
>>> model = MyModel(onnx.load("model.onnx"))                         # doctest: +SKIP
>>> x = tensor.PlaceHolder((8, 3, 224, 224), device=device.get_default_device())
>>> model.compile([x], is_train=False, use_graph=True, sequential=True)   # doctest: +SKIP
>>> y = model.forward(tensor.Tensor(data=images))                    # doctest: +SKIP

``SONNXModel(onnx_model)`` loads the model with ``workbench.graph.load`` (validation, shape
inference). Float initializers become trainable parameters (``get_params()``, named as in the
file), except BatchNormalization's running mean/variance, which are states (buffers), and
initializers used only as settings (Dropout's ratio, Clip's bounds, Resize's scales...), which
are constants like the non-float ones. ``imported_params()`` / ``freeze_imported()`` address
the imported weights apart from appended layers.
``forward(*x, last_layers=-1, aux_output=())`` runs the
graph's Plan on Tensors - every node through ``autograd`` - and returns a list of Tensors.

``last_layers`` follows the SINGA page: -1 keeps the whole graph, -k cuts after the k-th layer
from the end (all but the last k-1 nodes, counted in topological order without Constant
nodes); a node or value name is the robust choice. ``aux_output`` adds named values to the
returned list.

In training mode (``model.train()``) BatchNormalization uses the batch statistics and updates
the running ones, and Dropout drops; in eval mode both are the inference forms.
"""

from __future__ import annotations

import numpy as np
import onnx

from workbench import autograd
from workbench import device as _device
from workbench.graph.export import to_onnx as _to_onnx
from workbench.model import SONNXModel
from workbench.tensor import Tensor

__all__ = ["SONNXModel", "SingaRep", "SingaBackend", "prepare", "to_onnx", "to_onnx_model"]


def to_onnx(inputs, outputs, *, input_names=None, output_names=None, dynamic_axes=None,
            opset_version=None, model_name: str = "sonnx", doc_string=None) -> onnx.ModelProto:
    """Export the computation from ``inputs`` to ``outputs`` (lists of Tensors) as ONNX.

    Walks back from the outputs over the recorded tape; see ``workbench.graph.export``.
    ``input_names``/``output_names``/``dynamic_axes`` as in ``torch.onnx.export``.

    SINGA's rules for the ``inputs`` list, which its programs rely on: entries that are not
    Tensors (``to_onnx([x, (2, 3)], [y])``, ``to_onnx([x, 0.5, 1.0], [y])``: the settings an op
    took, already in the graph as constants) are skipped; BatchNormalization's running mean and
    variance become initializers even when listed (``to_onnx([x, s, b, mean, var], [y])`` has
    the graph inputs x, s, b); a data Tensor the graph reads but that is not listed is matched,
    in order, to a listed one of the same dtype and non-batch shape (see
    ``workbench.graph.export``).
    """
    ins = [inputs] if isinstance(inputs, Tensor) else [t for t in inputs
                                                        if isinstance(t, Tensor)]
    outs = [outputs] if isinstance(outputs, Tensor) else list(outputs)
    states = _running_statistics(outs)
    if states:
        ins = [t for t in ins if id(t) not in states]
    return _to_onnx(ins, outs, input_names=input_names, output_names=output_names,
                    dynamic_axes=dynamic_axes, opset_version=opset_version,
                    model_name=model_name, doc_string=doc_string)


def _running_statistics(outputs) -> set:
    """ids of the leaf Tensors the recorded graph of ``outputs`` uses as BatchNormalization
    running statistics (its inputs 3 and 4) or updates as state."""
    outs = [t for t in outputs if isinstance(t, Tensor)]
    found = set()
    for node in autograd.tape_order(outs):
        if node.op_type == "BatchNormalization" and node.domain in ("", "ai.onnx"):
            for p in node.parents[3:5]:
                if p is not None and type(p) is not tuple:
                    found.add(id(p))
        for t in (node.state_updates or {}).values():
            found.add(id(t))
    return found


to_onnx_model = to_onnx


# --------------------------------------------------------------------------- backend API
class SingaRep:
    """A prepared model (SINGA's ``SingaRep``): ``run(inputs, last_layers=-1, aux_output=())``
    returns a list of outputs - numpy arrays for array inputs, Tensors for Tensor inputs."""

    def __init__(self, model: SONNXModel):
        self.model = model
        self.model.eval()

    def run(self, inputs, last_layers=-1, aux_output=(), **kwargs) -> list:
        if isinstance(inputs, (np.ndarray, Tensor)):
            inputs = [inputs]
        if isinstance(inputs, dict):
            inputs = [inputs[n] for n in self.model.input_names]
        as_arrays = not any(isinstance(x, Tensor) for x in inputs)
        dev = self.model._dev
        xs = [x if isinstance(x, Tensor) else Tensor(device=dev, data=np.asarray(x))
              for x in inputs]
        with autograd.no_grad():
            outs = self.model.forward(*xs, last_layers=last_layers, aux_output=aux_output)
        return [o.numpy() for o in outs] if as_arrays else outs


def prepare(model, device="CPU", **kwargs) -> SingaRep:
    """Load ``model`` (ModelProto, path or bytes) for ``device`` (a Device or "CPU"/"CUDA")."""
    return SingaRep(SONNXModel(model, device=device))


class SingaBackend:
    """SINGA's backend class names, over :func:`prepare` and ``workbench.backend``."""

    @classmethod
    def prepare(cls, model, device="CPU", **kwargs) -> SingaRep:
        return prepare(model, device, **kwargs)

    @classmethod
    def run_model(cls, model, inputs, device="CPU", **kwargs):
        return prepare(model, device).run(inputs)

    @classmethod
    def run_node(cls, node, inputs, device="CPU", opset_version=None, **kwargs):
        from workbench import backend
        return backend.run_node(node, inputs, device, opset_version=opset_version)

    @classmethod
    def supports_device(cls, device) -> bool:
        return _device.supports(device)
