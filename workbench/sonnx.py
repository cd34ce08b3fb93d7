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

from collections import OrderedDict

import numpy as np
import onnx

from workbench import autograd
from workbench import device as _device
from workbench.errors import InputError, ShapeError
from workbench.graph.executor import (
    Plan,
    layer_nodes,
    needed_nodes,
    resolve_cut,
    topological_order,
)
from workbench.graph.export import to_onnx as _to_onnx
from workbench.graph.ir import ValueInfo
from workbench.graph.load import load
from workbench.model import Model
from workbench.tensor import Tensor

__all__ = ["SONNXModel", "SingaRep", "SingaBackend", "prepare", "to_onnx", "to_onnx_model"]


def to_onnx(inputs, outputs, *, input_names=None, output_names=None, dynamic_axes=None,
            opset_version=None, model_name: str = "sonnx", doc_string=None) -> onnx.ModelProto:
    """Export the computation from ``inputs`` to ``outputs`` (lists of Tensors) as ONNX.

    Walks back from the outputs over the recorded tape; see ``workbench.graph.export``.
    ``input_names``/``output_names``/``dynamic_axes`` as in ``torch.onnx.export``.
    """
    return _to_onnx(inputs, outputs, input_names=input_names, output_names=output_names,
                    dynamic_axes=dynamic_axes, opset_version=opset_version,
                    model_name=model_name, doc_string=doc_string)


to_onnx_model = to_onnx


# input slots that hold settings, not weights: a float initializer used only there is a
# constant (Dropout's ratio, Clip's bounds, Pad's value, Resize's scales...)
_CONSTANT_SLOTS = {
    "Dropout": (1, 2), "Clip": (1, 2), "Pad": (1, 2, 3), "Resize": (1, 2, 3),
    "Upsample": (1,), "ConstantOfShape": (0,), "Range": (0, 1, 2), "Expand": (1,),
    "Reshape": (1,), "Tile": (1,), "Slice": (1, 2, 3, 4), "OneHot": (1, 2),
    "BatchNormalization": (3, 4), "SoftmaxCrossEntropyLoss": (1, 2),
    "NegativeLogLikelihoodLoss": (1, 2),
}


def _is_float(a) -> bool:
    return a.dtype.kind == "f" or a.dtype.name == "bfloat16"


class _TensorPlan:
    """A Plan's steps prepared for running on Tensors."""

    def __init__(self, plan: Plan):
        self.plan = plan
        self.steps = []
        for st in plan.steps:
            n = st.node
            opset = plan.graph.opsets.get(n.domain or "", plan.graph.opsets.get("ai.onnx"))
            kw = dict(st.attrs)
            wants_ctx = kw.pop("ctx", None) is not None
            n_out = 0
            for i, o in enumerate(n.outputs):
                if o:
                    n_out = i + 1
            self.steps.append((st, n, opset, kw, wants_ctx, max(n_out, 1)))


class SONNXModel(Model):
    """An ONNX model as a trainable ``model.Model`` (SINGA's ``sonnx.SONNXModel``)."""

    def __init__(self, onnx_model, device=None):
        super().__init__()
        self._dev = _device.get_device(device)
        loaded = load(onnx_model)
        self._proto = loaded.proto
        self.onnx_graph = loaded.graph
        self._weights: OrderedDict[str, Tensor] = OrderedDict()
        self._tplans: dict = {}
        stats, trainable = set(), set()
        for n in self.onnx_graph.nodes:
            if n.op_type == "BatchNormalization":
                stats.update(i for i in n.inputs[3:5] if i)
            fixed = _CONSTANT_SLOTS.get(n.op_type, ())
            trainable.update(i for k, i in enumerate(n.inputs) if i and k not in fixed)
            for sg in n.subgraphs:
                trainable.update(sg.free_variables())
        for name, arr in self.onnx_graph.initializers.items():
            a = np.array(arr, copy=True)
            if _is_float(a) and name not in stats and name in trainable:
                t = Tensor(device=self._dev, data=a, requires_grad=True, stores_grad=True,
                           name=name)
                self._params[name] = t
            elif name in stats:
                t = Tensor(device=self._dev, data=a, name=name)
                self._buffers[name] = t
            else:
                t = Tensor(device=self._dev, data=a, name=name)
            self._weights[name] = t
        self._share_initializers()

    def _share_initializers(self) -> None:
        # the graph's initializer arrays are not used by the Tensor runner: share ours
        for k in list(self.onnx_graph.initializers):
            self.onnx_graph.initializers[k] = self._weights[k].data

    # ------------------------------------------------------------------ helpers
    @property
    def input_names(self) -> list:
        return [v.name for v in self.onnx_graph.inputs]

    @property
    def output_names(self) -> list:
        return [v.name for v in self.onnx_graph.outputs]

    def layer_names(self) -> list:
        """Node names in the order ``last_layers`` counts them (-1 is the last)."""
        return [n.name for n in layer_nodes(self.onnx_graph)]

    def imported_params(self) -> OrderedDict[str, Tensor]:
        """The parameters that came from the ONNX file (not appended layers)."""
        return OrderedDict((k, t) for k, t in self._params.items())

    def freeze_imported(self) -> SONNXModel:
        """Freeze the imported weights (transfer learning that trains only appended layers)."""
        for t in self._params.values():
            t.requires_grad = False
        return self

    def unfreeze_imported(self) -> SONNXModel:
        for t in self._params.values():
            t.requires_grad = True
        return self

    def run(self, *inputs, last_layers=-1, aux_output=()) -> list:
        """Numpy in, numpy out: the outputs (at ``last_layers``) without recording gradients."""
        xs = [x if isinstance(x, Tensor) else Tensor(device=self._dev, data=np.asarray(x))
              for x in inputs]
        was = self.training
        self.eval()
        try:
            with autograd.no_grad():
                outs = SONNXModel.forward(self, *xs, last_layers=last_layers,
                                          aux_output=aux_output)
        finally:
            super().train(was)
        return [o.numpy() for o in outs]

    def _example_inputs(self, inputs):
        if inputs is None and self._placeholders is None:
            from workbench.arrays.dtypes import np_dtype_of_onnx
            from workbench.tensor import PlaceHolder
            return [PlaceHolder(tuple(d if isinstance(d, int) else 1 for d in (v.shape or ())),
                                device=self._dev, dtype=np_dtype_of_onnx(v.dtype or 1),
                                name=v.name) for v in self.onnx_graph.inputs]
        return super()._example_inputs(inputs)

    def _export_defaults(self, inputs, outputs, kwargs) -> None:
        """Keep the file's input names and its symbolic (dynamic) dimensions."""
        names = self.input_names
        if "input_names" not in kwargs and len(inputs) == len(names):
            kwargs["input_names"] = names
        if "dynamic_axes" in kwargs:
            return
        declared = {}
        inits = {t.name for t in self._proto.graph.initializer}
        for vi in list(self._proto.graph.input) + list(self._proto.graph.output):
            if vi.name in inits or not vi.type.HasField("tensor_type"):
                continue
            dims = {i: d.dim_param for i, d in enumerate(vi.type.tensor_type.shape.dim)
                    if d.dim_param}
            if dims:
                declared[vi.name] = dims
        in_names = kwargs.get("input_names") or []
        out_names = list(kwargs.get("output_names") or []) + [
            t.name for t in outputs[len(kwargs.get("output_names") or []):]]
        dyn = {k: v for k, v in declared.items() if k in in_names or k in out_names}
        if dyn:
            kwargs["dynamic_axes"] = dyn

    def to_device(self, device) -> SONNXModel:
        """Move every imported weight (constants too) and appended layers to ``device``."""
        device = _device.get_device(device)
        for t in self._weights.values():
            t.to_device(device)
        super().to_device(device)
        self._dev = device
        self._share_initializers()
        return self

    def _prepare_inputs(self, inputs) -> None:
        """Re-load with the placeholders' shapes (SINGA: the batch size of the PlaceHolder)."""
        infos = self.onnx_graph.inputs
        if len(inputs) != len(infos):
            raise InputError(f"compile: the model takes {len(infos)} input(s) "
                             f"{[v.name for v in infos]}, got {len(inputs)} placeholder(s)")
        changed = {}
        for info, t in zip(infos, inputs):
            self._check_input(info, t, where="compile")
            if info.shape is None or tuple(info.shape) != tuple(t.shape):
                changed[info.name] = tuple(t.shape)
        if changed:
            loaded = load(self._proto, input_shapes=changed)
            loaded.graph.initializers = {k: self._weights[k].data
                                         for k in loaded.graph.initializers}
            self.onnx_graph = loaded.graph
            self._tplans = {}
        dev = inputs[0].device if inputs else None
        if dev is not None and dev != self._dev:
            self.to_device(dev)

    def _check_input(self, info, t, where="forward") -> None:
        """dtype and rank always; fixed non-batch dimensions in forward (compile re-declares
        the input shapes from its placeholders)."""
        if info.dtype:
            from workbench.arrays.dtypes import np_dtype_of_onnx
            want = np_dtype_of_onnx(info.dtype)
            if t.dtype != want and not (t.dtype.kind == want.kind == "f"):
                raise InputError(f"{where}: input {info.name!r} expects dtype {want}, got "
                                 f"{t.dtype}; convert it with .astype({want.name!r})")
        if info.shape is not None:
            if len(info.shape) != t.ndim():
                raise ShapeError(f"{where}: input {info.name!r} expects rank "
                                 f"{len(info.shape)} (shape {list(info.shape)}), got shape "
                                 f"{list(t.shape)}")
            for d, (want, got) in enumerate(zip(info.shape, t.shape)):
                if where == "forward" and d > 0 and isinstance(want, int) and want != got:
                    raise ShapeError(f"{where}: input {info.name!r} expects shape "
                                     f"{list(info.shape)}, got {list(t.shape)} (dimension {d} "
                                     f"differs)")

    def _outputs_for(self, last_layers, aux_output) -> tuple:
        try:
            key = (last_layers, tuple(aux_output))
            hash(key)
        except TypeError:
            return tuple(resolve_cut(self.onnx_graph, last_layers) + list(aux_output))
        cache = self.__dict__.setdefault("_cut_cache", {})
        if key not in cache or cache[key][0] is not self.onnx_graph:
            outs = tuple(resolve_cut(self.onnx_graph, last_layers) + list(aux_output))
            cache[key] = (self.onnx_graph, outs)
        return cache[key][1]

    def _tplan(self, outputs: tuple) -> _TensorPlan:
        key = (outputs, self.training)
        tp = self._tplans.get(key)
        if tp is None:
            # kernels looked up for the model's device (the CUDA overrides on a GPU); the
            # weights are this model's Tensors, so the plan's own copies stay where they are
            tp = _TensorPlan(Plan(self.onnx_graph, outputs=list(outputs), training=self.training,
                                  check_inputs=False, device=self._dev,
                                  move_initializers=False))
            self._tplans[key] = tp
        return tp

    # ------------------------------------------------------------------ forward
    def forward(self, *x, last_layers=-1, aux_output=()):
        """Run the graph on Tensors (or arrays); returns the list of output Tensors (the
        outputs at ``last_layers``, then the ``aux_output`` values)."""
        tp = self._tplan(self._outputs_for(last_layers, aux_output))
        infos = self.onnx_graph.inputs
        if len(x) != len(infos):
            raise InputError(f"the model takes {len(infos)} input(s) "
                             f"{[v.name for v in infos]}, got {len(x)}")
        xs = []
        for info, a in zip(infos, x):
            t = a if isinstance(a, Tensor) else Tensor(device=self._dev, data=np.asarray(a))
            if t.device != self._dev:
                raise InputError(f"input {info.name!r} lives on {t.device} but the model on "
                                 f"{self._dev}; move it with Tensor.to_device")
            self._check_input(info, t)
            xs.append(t)
        if self.inference_only:
            with autograd.no_grad():
                return self._run(tp, xs)
        return self._run(tp, xs)

    def _run(self, tp: _TensorPlan, xs: list) -> list:
        plan = tp.plan
        env = [None] * len(plan.slots)
        slots = plan.slots
        for name, t in self._weights.items():
            s = slots.get(name)
            if s is not None:
                env[s] = t
        for s, t in zip(plan._in_slots, xs):
            env[s] = t
        training = self.training
        run_op = autograd.run_op
        for st, n, opset, kw, wants_ctx, n_out in tp.steps:
            args = [env[i] if i >= 0 else None for i in st.ins]
            if training and n.op_type in ("BatchNormalization", "Dropout") and not n.domain:
                outs = self._train_form(n, args, kw)
            else:
                if st.subplans:
                    kw = dict(kw)
                    for aname, sub, free in st.subplans:
                        kw[aname] = _bind_tensors(sub, {f: env[s] for f, s in free})
                outs = run_op(n.op_type, n.domain, opset, st.fn, wants_ctx, kw, n.attrs, args,
                              n_out, n.name, n.outputs, training, device=self._dev)
            for s, v in zip(st.outs, outs):
                if s >= 0:
                    env[s] = v
            for s in st.free:
                env[s] = None
        return [env[s] for s in plan._out_slots]

    def _train_form(self, n, args, kw) -> list:
        """Training-mode BatchNormalization / Dropout of an imported node."""
        if n.op_type == "Dropout":
            ratio = kw.get("ratio", 0.5)
            if len(args) > 1 and args[1] is not None:
                ratio = float(args[1].numpy())
            y = autograd.dropout(args[0], ratio, training=True)
            y.name = n.outputs[0]
            return [y]
        x, scale, bias, mean, var = args[:5]
        ups = {}
        if mean.creator is None and not mean.stores_grad:
            ups[1] = mean
        if var.creator is None and not var.stores_grad:
            ups[2] = var
        attrs = {"epsilon": float(kw.get("epsilon", 1e-5)),
                 "momentum": float(kw.get("momentum", 0.9)), "training_mode": 1}
        from workbench.grad.norm import batchnorm_train
        spatial = kw.get("spatial", 1)
        fn = batchnorm_train if spatial == 1 else _bn_spatial0
        y = autograd.apply("BatchNormalization", [x, scale, bias, mean, var], attrs, opset=15,
                           n_outputs=3, fn=fn, training=True, state_updates=ups or None,
                           name=n.name, out_names=[n.outputs[0], "", ""])[0]
        return [y]

    # ------------------------------------------------------------------ cut
    def cut(self, last_layers, inputs=None) -> SONNXModel:
        """A NEW SONNXModel holding only the nodes the outputs at ``last_layers`` need, with
        a copy of the current weights (appended layers are not part of it)."""
        outs = resolve_cut(self.onnx_graph, last_layers)
        g = self.onnx_graph.copy()
        g.nodes = needed_nodes(topological_order(g), outs)
        used = {i for nd in g.nodes for i in nd.inputs if i}
        for nd in g.nodes:
            for sg in nd.subgraphs:
                used |= sg.free_variables()
        used |= set(outs)
        g.initializers = {k: np.array(self._weights[k].numpy(), copy=True)
                          for k in self.onnx_graph.initializers if k in used}
        g.inputs = [v for v in g.inputs if v.name in used]
        g.outputs = [self._value_info(nm) for nm in outs]
        proto = onnx.ModelProto()
        proto.CopyFrom(self._proto)
        proto.graph.CopyFrom(g.to_proto())
        for vi in list(proto.graph.output):
            if not vi.type.tensor_type.elem_type:
                self._type_outputs(proto)
                break
        return SONNXModel(proto, device=self._dev)

    def _value_info(self, name: str) -> ValueInfo:
        v = self.onnx_graph.value(name)
        if v is not None and v.dtype:
            return ValueInfo(name, v.dtype, v.shape)
        return ValueInfo(name, None, None)

    def _type_outputs(self, proto) -> None:
        """Give untyped graph outputs an element type (run the cut graph once)."""
        from workbench.arrays.dtypes import np_dtype_of_onnx, onnx_dtype_of_np
        from workbench.backend import prepare as _prepare
        del proto.graph.value_info[:]
        tmp = onnx.ModelProto()
        tmp.CopyFrom(proto)
        for vi in tmp.graph.output:
            vi.type.tensor_type.elem_type = onnx.TensorProto.FLOAT
        feeds = []
        for v in self.onnx_graph.inputs:
            if v.name not in {i.name for i in proto.graph.input}:
                continue
            shape = [d if isinstance(d, int) else 1 for d in (v.shape or ())]
            feeds.append(np.zeros(shape, dtype=np_dtype_of_onnx(v.dtype or 1)))
        outs = _prepare(tmp, optimize=False, check=False).run(feeds)
        for vi, o in zip(proto.graph.output, outs):
            vi.type.tensor_type.elem_type = onnx_dtype_of_np(np.asarray(o).dtype)


def _bn_spatial0(x, scale, bias, mean, var, **kw):
    from workbench.grad.norm import batchnorm_train
    return batchnorm_train(x, scale, bias, mean, var, spatial=0, **kw)


def _bind_tensors(plan: Plan, scope: dict):
    """A subgraph body over arrays (control flow is run, not differentiated)."""
    arrays = {k: (v.data if isinstance(v, Tensor) else v) for k, v in scope.items()}

    def body(*inputs):
        return plan.run_positional(inputs, arrays)

    body.plan = plan
    return body


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
