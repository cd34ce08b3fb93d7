"""``workbench.backend``: the standard ONNX backend API (``onnx.backend.base``).

>>> import workbench.backend as backend                      # doctest: +SKIP
>>> rep = backend.prepare(model, device="CPU")                # doctest: +SKIP
>>> outputs = rep.run([x])                                    # doctest: +SKIP
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import onnx
from onnx.backend.base import Backend, BackendRep, Device, DeviceType, namedtupledict

from workbench.arrays import device as _device
from workbench.errors import ModelLoadError, WorkbenchError
from workbench.graph import passes as _passes
from workbench.graph.load import load
from workbench.ops._integer import IntegerArithmetic, parse_arithmetic
from workbench.runtime.plan import Plan


class WorkbenchRep(BackendRep):
    """A prepared model: ``run(inputs)`` returns the outputs in graph-output order."""

    def __init__(self, loaded, plan: Plan, dev, general=None):
        self.loaded = loaded
        self.plan = plan
        self.device = dev
        self.output_names = list(plan.output_names)
        # the result type, made once: namedtupledict builds a class (~0.1 ms) on every call
        self._outputs_type = namedtupledict("Outputs", self.output_names)
        #: a plan prepared for given input shapes: how to prepare the model as written (for
        #: feeds of other shapes), and that prepared model once made
        self._general = general
        self._general_rep: WorkbenchRep | None = None

    def run(self, inputs: Any, **kwargs) -> tuple:
        if self._general is not None and not self._fits(inputs):
            rep = self._general_rep
            if rep is None:
                rep = self._general_rep = self._general()
            return rep.run(inputs, **kwargs)
        if not self.device.is_cuda:     # host arrays need no moving: the plan checks them
            t = type(inputs)
            if t is np.ndarray:
                return self._outputs_type(*self.plan.run([inputs]))
            if (t is list or t is tuple) and all(type(v) is np.ndarray for v in inputs) or \
                    t is dict and all(type(v) is np.ndarray for v in inputs.values()) \
                    and not self._is_one_map(inputs):
                return self._outputs_type(*self.plan.run(inputs))
        if isinstance(inputs, np.ndarray) or not isinstance(inputs, (list, tuple, dict)):
            inputs = [inputs]
        elif isinstance(inputs, dict) and self._is_one_map(inputs):
            inputs = [inputs]   # the value of a model's single map input, not feeds by name
        host = self.plan.host_shape_inputs  # shape-like inputs a device plan reads on the host
        if isinstance(inputs, dict):
            feeds = {k: v if k in host else self.device.put(v) for k, v in inputs.items()}
        else:
            names = [v.name for v in self.plan.input_infos]
            feeds = [v if i < len(names) and names[i] in host else self.device.put(v)
                     for i, v in enumerate(inputs)]
        outs = self.plan.run(feeds)
        outs = [self.device.get(o) for o in outs]
        return self._outputs_type(*outs)

    def _fits(self, inputs) -> bool:
        """Whether the feeds' shapes are those the plan was prepared for (``input_shapes`` /
        ``batch_size`` of :func:`prepare`); what is not an array is left to the plan."""
        infos = self.plan.input_infos
        if type(inputs) is dict:
            values = [inputs.get(v.name) for v in infos]
        elif type(inputs) is list or type(inputs) is tuple:
            values = inputs
        else:
            values = [inputs]
        for info, v in zip(infos, values):
            want, got = info.shape, getattr(v, "shape", None)
            if want is None or type(got) is not tuple:
                continue
            if len(got) != len(want) or any(type(d) is int and d != e
                                            for d, e in zip(want, got)):
                return False
        return True

    def _is_one_map(self, inputs: dict) -> bool:
        """A dict given to a model whose one input is a map (DictVectorizer, CastMap) is that
        map unless its keys are the input's name."""
        infos = self.plan.input_infos
        if len(infos) != 1 or infos[0].name in inputs:
            return False
        tp = infos[0].type_proto
        return tp is not None and tp.HasField("map_type")


def _dev(device) -> _device.Device:
    return _device.get_device(device)


def prepare(model, device: str = "CPU", *, optimize: bool = True,
            base_dir: str | None = None, integer_arithmetic: str = "exact",
            layout: str | None = "auto", input_shapes: dict | None = None,
            batch_size: int | None = None, **kwargs) -> WorkbenchRep:
    """Load, validate and plan ``model`` (path, bytes or ModelProto) for ``device``.

    ``base_dir``: the folder holding external data files of a model given as bytes or a
    ModelProto (a path's own folder is used otherwise; data never comes from elsewhere).
    ``integer_arithmetic``: ``"exact"`` (the ONNX specification, the default) or
    ``"saturating-u8s8"``: 8-bit integer products computed as onnxruntime computes them on
    x86 CPUs without VNNI (uint8 x int8 products added in pairs saturated to int16), to
    reproduce such a deployment's numbers on any machine (``workbench.quantization``).
    ``layout`` (CPU, with ``optimize``): ``"auto"`` runs networks with depthwise convolutions
    channels-last (``workbench.graph.layout``), ``"nhwc"`` any convolution network, None as
    written (NCHW).
    ``input_shapes`` ({input name: shape}) and ``batch_size`` (the first dimension of every
    input): plan for these shapes. The graph's shape arithmetic (``Shape -> Gather ->
    Unsqueeze -> Concat`` chains computing Reshape targets from a dynamic batch) is then folded
    into constants here and costs nothing per run. A run fed other shapes is not refused: it
    runs the model as written, prepared the first time it is needed and kept.
    """
    dev = _dev(device)
    check = kwargs.pop("check", True)
    general = None
    if input_shapes or batch_size is not None:
        def general():
            return prepare(model, device, optimize=optimize, base_dir=base_dir,
                           integer_arithmetic=integer_arithmetic, layout=layout, check=check,
                           **kwargs)
    loaded = load(model, check=check, base_dir=base_dir, input_shapes=input_shapes,
                  batch_size=batch_size)
    graph = loaded.graph
    if parse_arithmetic(integer_arithmetic) is not IntegerArithmetic.EXACT:
        # first, so that constant folding computes folded products in the same arithmetic
        graph = _passes.set_integer_arithmetic(graph, integer_arithmetic)
    if optimize:  # channels-last layout for CPU plans only (the GPU kernels are NCHW)
        graph = _passes.optimize(graph, layout=None if dev.is_cuda else layout)
    try:
        plan = Plan(graph, device=dev)   # kernels for the device's array module, weights on it
    except WorkbenchError:
        raise
    except Exception as e:  # never a raw error from planning a malformed graph
        raise ModelLoadError(f"could not plan the graph: {type(e).__name__}: {e}",
                             path=loaded.path) from e
    return WorkbenchRep(loaded, plan, dev, general)


def run_model(model, inputs, device: str = "CPU", **kwargs):
    return prepare(model, device, **kwargs).run(inputs)


def run_node(node: onnx.NodeProto, inputs: Sequence, device: str = "CPU",
             outputs_info=None, **kwargs):
    """Run a single node on inputs (numpy arrays) at the newest opset (or ``opset_version``)."""
    from workbench.graph.ir import Graph, Node, attr_to_python
    opset = kwargs.get("opset_version") or onnx.defs.onnx_opset_version()
    opsets = {node.domain or "": opset}
    attrs = {a.name: attr_to_python(a, opsets) for a in node.attribute}
    n = Node(node.op_type, list(node.input), list(node.output), attrs,
             node.name or node.op_type, node.domain)
    names = [i for i in node.input if i]
    from workbench.graph.ir import ValueInfo
    g = Graph("run_node", [n], [ValueInfo(x) for x in names],
              [ValueInfo(o) for o in node.output if o], {}, {}, opsets)
    dev = _dev(device)
    plan = Plan(g, check_inputs=False, device=dev)
    outs = plan.run([dev.put(x) for x in inputs[:len(names)]])
    return namedtupledict("Outputs", plan.output_names)(*[dev.get(o) for o in outs])


def supports_device(device: str) -> bool:
    return _device.supports(device)


def is_compatible(model, device: str = "CPU", **kwargs) -> bool:
    return supports_device(device)


class WorkbenchBackend(Backend):
    """Class form, for code that wants a ``Backend`` subclass."""

    @classmethod
    def prepare(cls, model, device="CPU", **kwargs):
        return prepare(model, device, **kwargs)

    @classmethod
    def run_model(cls, model, inputs, device="CPU", **kwargs):
        return run_model(model, inputs, device, **kwargs)

    @classmethod
    def run_node(cls, node, inputs, device="CPU", outputs_info=None, **kwargs):
        return run_node(node, inputs, device, outputs_info, **kwargs)

    @classmethod
    def supports_device(cls, device):
        return supports_device(device)

    @classmethod
    def is_compatible(cls, model, device="CPU", **kwargs):
        return is_compatible(model, device, **kwargs)


__all__ = ["prepare", "run_model", "run_node", "supports_device", "is_compatible",
           "WorkbenchRep", "WorkbenchBackend", "Device", "DeviceType"]
