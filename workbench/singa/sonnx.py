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
file), except BatchNormalization's running mean/variance, which are states (buffers),
initializers used only as settings (Dropout's ratio, Clip's bounds, Resize's scales...) and 0-d
initializers (the scalar constants exporters write: torch.onnx's dynamo exporter writes every
one as an initializer), which are constants like the non-float ones. ``SONNXModel(...,
params=[names], constants=[names], scalar_params=True)`` overrides (``scalar_params``, the class
attribute or ``WORKBENCH_SCALAR_PARAMS=1``: every 0-d float initializer is a parameter, the
rule before they became constants). ``imported_params()`` / ``freeze_imported()`` address
the imported weights apart from appended layers.
``forward(*x, last_layers=None, aux_output=())`` runs the
graph's Plan on Tensors - every node through ``autograd`` - and returns a list of Tensors.

``last_layers`` (default None: the whole graph) follows the SINGA page by default: -1 keeps
the whole graph, -k cuts after the k-th layer from the end (all but the last k-1 nodes,
counted in topological order without Constant nodes); a node or value name is the robust
choice. ``aux_output`` adds named values to the returned list.

Two countings of an integer ``last_layers`` (``runtime.cut.resolve_cut``):

* ``"workbench"`` - the page's rule above: the default of ``SONNXModel``, ``Model.cut``,
  ``wb.load(...)``, the LayerCutter widget and ``workbench.backend``;
* ``"singa"`` - what SINGA's code does (``SingaRep.run``: node index ``(k+1) % N``, so -1 is
  the *first* node, -2 the whole graph, -3 drops the last node). SINGA's own entry points
  :func:`prepare`, :class:`SingaBackend` and :class:`SingaRep` always count this way, so
  SINGA's tests get it with only the import changed. A ``SONNXModel`` counts this way when
  built with ``last_layers_counting="singa"``, when a subclass sets the class attribute
  ``last_layers_counting = "singa"``, or when the environment variable
  ``WORKBENCH_LAST_LAYERS=singa`` is set - the way to run SINGA's programs (e.g.
  ``examples/onnx/training/train.py``, which cuts ResNet-18 at -3 to get Flatten's [N, 512])
  unchanged.

In training mode (``model.train()``) BatchNormalization uses the batch statistics and updates
the running ones, and Dropout drops; in eval mode both are the inference forms.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx.backend.base import Backend

from workbench.autodiff.export import to_onnx as _to_onnx
from workbench.autodiff.runner import TapeRunner
from workbench.autodiff.tape import tape_order
from workbench.errors import InputError
from workbench.singa import autograd
from workbench.singa import device as _device
from workbench.singa.model import SONNXModel
from workbench.singa.tensor import Tensor

__all__ = ["SONNXModel", "SingaRep", "SingaBackend", "prepare", "run_node", "to_onnx",
           "to_onnx_model", "save", "load"]


def to_onnx(inputs, outputs, *, input_names=None, output_names=None, dynamic_axes=None,
            opset_version=None, model_name: str = "sonnx", doc_string=None) -> onnx.ModelProto:
    """Export the computation from ``inputs`` to ``outputs`` (lists of Tensors) as ONNX.

    Walks back from the outputs over the recorded tape; see ``workbench.autodiff.export``.
    ``input_names``/``output_names``/``dynamic_axes`` as in ``torch.onnx.export``.

    SINGA's rules for the ``inputs`` list, which its programs rely on: entries that are not
    Tensors (``to_onnx([x, (2, 3)], [y])``, ``to_onnx([x, 0.5, 1.0], [y])``: the settings an op
    took, already in the graph as constants) are skipped; BatchNormalization's running mean and
    variance become initializers even when listed (``to_onnx([x, s, b, mean, var], [y])`` has
    the graph inputs x, s, b); a data Tensor the graph reads but that is not listed is matched,
    in order, to a listed one of the same dtype and non-batch shape (see
    ``workbench.autodiff.export``).
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
    for node in tape_order(outs):
        if node.op_type == "BatchNormalization" and node.domain in ("", "ai.onnx"):
            for p in node.parents[3:5]:
                if p is not None and type(p) is not tuple:
                    found.add(id(p))
        for t in (node.state_updates or {}).values():
            found.add(id(t))
    return found


to_onnx_model = to_onnx


# --------------------------------------------------------------------------- backend API
def _supported_singa_operators() -> dict:
    """SINGA's ``SingaBackend._rename_operators``: ONNX op type -> the SINGA operator its
    backend imports it as (an ``autograd`` operator class name, or ``layer.<Layer>``), for
    the ops this engine has kernels for. Made from the operators themselves: each
    ``autograd`` operator class declares its ``onnx_op`` and each layer its ``onnx_ops``."""
    from workbench.ops.registry import has_kernel  # noqa: PLC0415
    from workbench.singa import layer as _layer  # noqa: PLC0415
    found = {}
    for name in sorted(dir(autograd)):
        obj = getattr(autograd, name)
        if isinstance(obj, type) and issubclass(obj, autograd.Operator) and obj.onnx_op \
                and obj.__name__ == name:
            found[obj.onnx_op] = name
    for name in sorted(dir(_layer)):
        obj = getattr(_layer, name)
        if isinstance(obj, type) and obj.__name__ == name:
            for op in obj.__dict__.get("onnx_ops", ()):
                found[op] = f"layer.{name}"
    return {op: name for op, name in found.items() if has_kernel(op)}


def _to_numpy(v):
    """An output as numpy: Tensors converted, sequences as lists, optionals' None kept."""
    if v is None:
        return None
    if isinstance(v, (list, tuple)):
        return [_to_numpy(x) for x in v]
    if isinstance(v, Tensor):
        if v.data is None or isinstance(v.data, (list, tuple, dict)):
            return _to_numpy(v.data)
        return v.numpy()
    if isinstance(v, dict):
        return v
    return _device.create_cpu().get(v) if not isinstance(v, np.ndarray) else v


class SingaRep:
    """A prepared model (SINGA's ``SingaRep``, from :func:`prepare`).

    ``run(inputs, last_layers=..., aux_output=())`` returns a list of outputs: numpy arrays
    for numpy inputs, Tensors for Tensor inputs or when ``is_graph`` is set (as SINGA's
    ``sg_ir.is_graph = True``). Sequence outputs come back as lists and an empty optional
    as None. With Tensor inputs the run records the tape, so a loss computed from its
    outputs back-propagates into the model's weights (re-training through a prepared
    model); with numpy inputs nothing is recorded.

    ``last_layers`` is counted as SINGA's code counts it (the ``"singa"`` counting of
    ``runtime.cut.resolve_cut``): the default runs the whole graph, -1 is the *first*
    node's output, -2 the whole graph, -3 everything but the last node, L >= 0 node L. This
    is SINGA's entry point, so SINGA's programs and tests get SINGA's counting; the
    workbench's own entry points (``workbench.backend``, ``wb.load``, ``Model.cut``, a
    ``SONNXModel`` by default) count -1 as the whole graph and -k as "cut after the k-th
    node from the end". A node or value name means the same in both.

    Integer inputs given as int32 or float32 (SINGA's programs feed token ids that way) are
    converted to the model's int64 when every value is exact, with a warning; otherwise an
    error names the input.
    """

    def __init__(self, model: SONNXModel):
        self.model = model
        self.model.eval()
        self.is_graph = False
        self.dev = model._dev
        self.has_initialized = True
        self.inputs = list(model.onnx_graph.inputs)
        self.outputs = list(model.onnx_graph.outputs)
        self.states = model._weights

    @property
    def layers(self) -> list:
        """SINGA's ``(node, operator)`` pairs, in the order ``last_layers`` counts them:
        ``node`` is the graph's node (``name``, ``op_type``, ``inputs``, ``outputs``,
        ``attrs``), ``operator`` runs that node alone on Tensors (its weights are the
        model's), recording the tape."""
        from workbench.runtime.cut import layer_nodes  # noqa: PLC0415
        ops = self.__dict__.setdefault("_operators", {})
        out = []
        for n in layer_nodes(self.model.onnx_graph):
            op = ops.get(id(n))
            if op is None or op.node is not n:
                op = ops[id(n)] = NodeOperator(self.model, n)
            out.append(_Layer(n, op))
        return out

    def run(self, inputs, last_layers=None, aux_output=(), **kwargs) -> list:
        if kwargs:
            raise TypeError(f"SingaRep.run: unexpected argument(s) {sorted(kwargs)}")
        if isinstance(inputs, (np.ndarray, Tensor)) or np.isscalar(inputs):
            inputs = [inputs]
        if isinstance(inputs, dict):
            missing = [n for n in self.model.input_names if n not in inputs]
            if missing:
                raise InputError(f"SingaRep.run: no value for input(s) {missing}")
            inputs = [inputs[n] for n in self.model.input_names]
        inputs = list(inputs)
        as_arrays = not self.is_graph and not any(isinstance(x, Tensor) for x in inputs)
        dev = self.model._dev
        xs = [x if isinstance(x, Tensor) else _input_tensor(x, dev) for x in inputs]
        if last_layers is None:
            outputs = self.model.output_names
        else:
            from workbench.runtime.cut import resolve_cut  # noqa: PLC0415
            outputs = resolve_cut(self.model.onnx_graph, last_layers, "singa")
        if as_arrays:   # numpy out: nothing recorded, so the model's cached prepared plan
            with autograd.inference_mode():
                outs = self.model.forward(*xs, last_layers=outputs, aux_output=aux_output)
            return [_to_numpy(o) for o in outs]
        outs = self.model.forward(*xs, last_layers=outputs, aux_output=aux_output)
        return [_unwrap(o) for o in outs]


def _input_tensor(x, dev) -> Tensor:
    """An input value as a Tensor: arrays copied onto ``dev``; a sequence (list) and an empty
    optional (None) are held as they are, for the sequence/optional ops."""
    if x is None or isinstance(x, (list, tuple)):
        data = None if x is None else [dev.put(np.asarray(
            e.numpy() if isinstance(e, Tensor) else e)) for e in x]
        return Tensor._make(data, dev, False, None, 0, None)
    return Tensor(device=dev, data=np.asarray(x))


def _unwrap(t):
    """A Tensor output as SINGA returns it; a sequence value (a Tensor holding a list) as a
    list of Tensors and an empty optional as None (these are not differentiable)."""
    if isinstance(t, Tensor) and (t.data is None or isinstance(t.data, (list, tuple))):
        if t.data is None:
            return None
        return [x if isinstance(x, Tensor) else Tensor(device=t.device, data=x)
                for x in t.data]
    return t


class _Layer(tuple):
    """``(node, operator)`` as SINGA's ``operator_tuple``."""

    def __new__(cls, node, operator):
        return super().__new__(cls, (node, operator))

    node = property(lambda self: self[0])
    operator = property(lambda self: self[1])


class NodeOperator:
    """One node of an imported model as a callable on Tensors (SINGA's per-node operator in
    ``SingaRep.layers``): ``op(*inputs)`` takes the node's non-weight inputs in order and
    returns its output Tensor (a tuple when it has several), recorded on the tape; weights
    are the model's parameters, so gradients reach them."""

    def __init__(self, model: SONNXModel, node):
        self.model, self.node = model, node
        self.name, self.op_type = node.name, node.op_type
        self._plans: dict = {}

    def __repr__(self) -> str:
        return f"NodeOperator({self.op_type} {self.name!r})"

    def _plan(self):
        from workbench.graph.ir import Graph, ValueInfo  # noqa: PLC0415
        from workbench.runtime.plan import Plan  # noqa: PLC0415
        m = self.model
        key = m.training
        plan = self._plans.get(key)
        if plan is None:
            names = [i for i in self.node.inputs if i]
            feeds = [i for i in names if i not in m._weights]
            g = Graph(f"{self.name}_alone", [self.node], [ValueInfo(n) for n in feeds],
                      [ValueInfo(o) for o in self.node.outputs if o],
                      {k: m._weights[k].data for k in names if k in m._weights}, {},
                      dict(m.onnx_graph.opsets))
            plan = self._plans[key] = (Plan(g, training=m.training, check_inputs=False,
                                            device=m._dev, move_initializers=False), feeds)
        return plan

    def __call__(self, *inputs):
        plan, feeds = self._plan()
        if len(inputs) != len(feeds):
            raise InputError(f"{self.op_type} node {self.name!r} takes {len(feeds)} input(s) "
                             f"{feeds} (its weights come from the model), got {len(inputs)}")
        m = self.model
        xs = [x if isinstance(x, Tensor) else Tensor(device=m._dev, data=np.asarray(x))
              for x in inputs]
        outs = plan.execute(xs, runner=TapeRunner(m._dev, training_mode=m.training),
                            values=m._weights)
        return outs[0] if len(outs) == 1 else tuple(outs)


def prepare(model, device="CPU", **kwargs) -> SingaRep:
    """Load ``model`` (ModelProto, path or bytes) for ``device`` (a Device or "CPU"/"CUDA")
    as SINGA's ``sonnx.prepare`` does: a :class:`SingaRep` (SINGA's ``last_layers``
    counting)."""
    return SingaRep(SONNXModel(model, device=device, last_layers_counting="singa"))


class SingaBackend(Backend):
    """SINGA's backend class (``onnx.backend.base.Backend``): ``prepare`` gives a
    :class:`SingaRep`; ``run_node`` runs one node through the op registry.

    ``_rename_operators`` is SINGA's map of ONNX op -> SINGA operator (``autograd`` class
    name, or ``layer.<Layer>``), limited to the ops this engine has kernels for; SINGA's
    ``test_onnx_backend.py`` picks its conformance cases from its keys."""

    _rename_operators = _supported_singa_operators()

    @classmethod
    def prepare(cls, model, device="CPU", **kwargs) -> SingaRep:
        return prepare(model, device, **kwargs)

    @classmethod
    def run_model(cls, model, inputs, device="CPU", **kwargs):
        return prepare(model, device).run(inputs, **kwargs)

    @classmethod
    def run_node(cls, node, inputs, device="CPU", outputs_info=None, **kwargs):
        from workbench import backend  # noqa: PLC0415
        return backend.run_node(node, inputs, device, **kwargs)

    @classmethod
    def supports_device(cls, device) -> bool:
        return _device.supports(device)

    @classmethod
    def is_compatible(cls, model, device="CPU", **kwargs) -> bool:
        return cls.supports_device(device)


run_node = SingaBackend.run_node
save = onnx.save
load = onnx.load
