"""Export: walk back from output Tensors over the tape and write an ONNX ModelProto.

Every tape node is an ONNX node (op type, domain, opset, attributes), so export is a walk from
the outputs to the inputs (``tape.tape_order``) plus naming:

* **inputs**: the Tensors given as ``inputs`` (by identity). A leaf data Tensor that is not among
  them is matched, in order, to a given input it could stand for (same dtype, rank and
  non-batch dimensions) - the SINGA page exports ``to_onnx([x], [y])`` with ``x`` the
  ``PlaceHolder`` of ``compile`` and ``y`` computed from another Tensor with real data.
* **initializers**: parameters (``stores_grad``) and every other leaf (constants).
* **opset**: ``opset_version`` or the newest opset among the recorded nodes; a node recorded at
  an older opset whose schema changed since is converted with ``onnx.version_converter``.
* **names** follow torch.onnx: ``input_names`` / ``output_names`` (partial lists allowed),
  ``dynamic_axes={name: {axis: "dim_name"} or [axes]}`` makes those dimensions symbolic.

The result passes ``onnx.checker``; what ONNX cannot express raises :class:`ExportError`.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence

import numpy as np
import onnx
import onnx.checker
import onnx.defs
import onnx.version_converter
from onnx import helper, numpy_helper

from workbench.arrays import to_numpy
from workbench.arrays.dtypes import onnx_dtype_of_np
from workbench.autodiff.tape import DEFAULT_OPSET, Tensor, tape_order
from workbench.errors import ExportError
from workbench.graph.ir import python_to_attr


class _Names:
    def __init__(self):
        self.used: set = set()

    def take(self, want: str) -> str:
        name = want or "v"
        k = 1
        while name in self.used:
            name = f"{want}_{k}"
            k += 1
        self.used.add(name)
        return name


def _elem(dtype, what: str) -> int:
    try:
        return onnx_dtype_of_np(dtype)
    except TypeError:
        raise ExportError(f"{what} has dtype {dtype}, which ONNX has no element type for") \
            from None


def _value_info(name: str, shape, dtype, dyn, what: str) -> onnx.ValueInfoProto:
    dims = list(shape) if shape is not None else None
    if dims is not None and dyn:
        axes = dyn.items() if isinstance(dyn, dict) else ((a, f"{name}_dynamic_axes_{a}")
                                                         for a in dyn)
        for a, label in axes:
            a = int(a)
            if not -len(dims) <= a < len(dims):
                raise ExportError(f"dynamic_axes for {name!r}: axis {a} does not exist in "
                                  f"shape {list(shape)}")
            dims[a] = str(label)
    return helper.make_tensor_value_info(name, _elem(dtype, what), dims)


def _key(t):
    return ("n", id(t.creator), t._index) if t.creator is not None else ("l", id(t))


def _could_be(leaf, inp) -> bool:
    if leaf.dtype != inp.dtype or leaf.ndim() != inp.ndim():
        return False
    return tuple(leaf.shape[1:]) == tuple(inp.shape[1:])


def to_onnx(inputs: Sequence, outputs: Sequence, *, input_names: Sequence[str] | None = None,
            output_names: Sequence[str] | None = None, dynamic_axes: dict | None = None,
            opset_version: int | None = None, model_name: str = "workbench_model",
            doc_string: str | None = None, check: bool = True) -> onnx.ModelProto:
    """The ONNX model computing ``outputs`` from ``inputs`` (lists of Tensors)."""
    inputs = [inputs] if isinstance(inputs, Tensor) else list(inputs)
    outputs = [outputs] if isinstance(outputs, Tensor) else list(outputs)
    if not outputs:
        raise ExportError("to_onnx: no outputs given")
    for i, t in enumerate(list(inputs) + list(outputs)):
        if not isinstance(t, Tensor):
            raise ExportError(f"to_onnx: inputs and outputs must be Tensors, got "
                              f"{type(t).__name__} at position {i}")
    input_names = list(input_names or [])
    output_names = list(output_names or [])
    dynamic_axes = dict(dynamic_axes or {})
    names = _Names()

    # ---------------------------------------------------------------- inputs
    in_keys: dict = {}
    in_name: list = []
    for i, t in enumerate(inputs):
        want = input_names[i] if i < len(input_names) else (
            t.name if t.name and not t.stores_grad else ("input" if len(inputs) == 1
                                                         else f"input_{i}"))
        nm = names.take(want)
        in_name.append(nm)
        in_keys.setdefault(_key(t), nm)
    stop = {(k[1], k[2]) for k in in_keys if k[0] == "n"}
    nodes = tape_order(outputs, stop)

    # ---------------------------------------------------------------- leaves
    value_name: dict = dict(in_keys)       # key -> name
    initializers: list = []
    unmatched = [i for i in range(len(inputs))]
    reached_inputs: set = set()

    def leaf_name(t) -> str:
        k = ("l", id(t))
        if k in value_name:
            if k in in_keys:
                reached_inputs.add(value_name[k])
            return value_name[k]
        if getattr(t, "_untraced", False):
            raise ExportError(
                f"a Tensor of shape {list(t.shape)} feeding the exported graph was computed "
                f"without recording (inside inference_mode()); run the forward "
                f"outside inference_mode to export it")
        if not t.stores_grad:
            for j in unmatched:
                cand = inputs[j]
                if cand.creator is None and in_name[j] not in reached_inputs and \
                        _could_be(t, cand):
                    unmatched.remove(j)
                    value_name[k] = in_name[j]
                    reached_inputs.add(in_name[j])
                    return in_name[j]
        base = t.name if t.name else ("param" if t.stores_grad else "const")
        nm = names.take(base)
        value_name[k] = nm
        try:
            arr = to_numpy(t.data)
            initializers.append(numpy_helper.from_array(np.asarray(arr), nm))
        except Exception as e:
            raise ExportError(f"initializer {nm!r} (dtype {t.dtype}) cannot be stored in ONNX: "
                              f"{e}") from e
        return nm

    # output names wished for the values that are graph outputs
    out_want: dict = {}
    for j, t in enumerate(outputs):
        want = output_names[j] if j < len(output_names) else None
        if want is None and t.name and t.creator is not None:
            want = t.name
        out_want.setdefault(_key(t), []).append(want or (
            "output" if len(outputs) == 1 else f"output_{j}"))

    # ---------------------------------------------------------------- nodes
    domains: dict = {}
    for n in nodes:
        domains[n.domain] = max(domains.get(n.domain, 0), n.opset)
    if opset_version is not None:
        domains[""] = int(opset_version)
    domains.setdefault("", 0)
    if domains[""] == 0:
        domains[""] = DEFAULT_OPSET

    node_protos: list = []
    node_names = _Names()
    for n in nodes:
        ins = []
        for p in n.parents:
            if p is None:
                ins.append("")
            elif type(p) is tuple:
                k = ("n", id(p[0]), p[1])
                if k in in_keys:
                    reached_inputs.add(in_keys[k])
                ins.append(value_name[k])
            else:
                ins.append(leaf_name(p))
        outs = []
        for i in range(n.n_outputs):
            k = ("n", id(n), i)
            wants = out_want.get(k)
            if wants:
                nm = names.take(wants[0])
            else:
                base = n.out_names[i] if n.out_names and i < len(n.out_names) and \
                    n.out_names[i] else (f"{n.name}_out{i}" if n.n_outputs > 1
                                         else f"{n.name}_out")
                nm = names.take(base)
            value_name[k] = nm
            outs.append(nm)
        proto = helper.make_node(n.op_type, ins, outs, name=node_names.take(n.name),
                                 domain=n.domain or None)
        try:
            proto.attribute.extend(python_to_attr(a, v, n.op_type, n.domain)
                                   for a, v in n.attrs.items())
        except Exception as e:
            raise ExportError(f"node {n.name!r} ({n.op_type}): an attribute cannot be written "
                              f"to ONNX: {e}") from e
        target = domains[n.domain]
        if n.opset != target:
            node_protos.extend(_convert(proto, n, target, value_name, initializers))
        else:
            node_protos.append(proto)

    # ---------------------------------------------------------------- graph inputs/outputs
    graph_inputs = []
    for i, t in enumerate(inputs):
        nm = in_name[i]
        if nm not in reached_inputs and i in unmatched and _key(t) not in out_want:
            warnings.warn(f"to_onnx: input {i} ({nm!r}) is not used by the outputs; it is "
                          f"kept as a graph input", stacklevel=2)
        graph_inputs.append(_value_info(nm, t.shape, t.dtype, dynamic_axes.get(nm),
                                        f"input {nm!r}"))
    graph_outputs = []
    done: set = set()
    for j, t in enumerate(outputs):
        k = _key(t)
        if k not in value_name:  # a leaf that no node reads
            leaf_name(t)
        src = value_name[k]
        want = output_names[j] if j < len(output_names) else None
        nm = src
        if src in done or k in in_keys or t.creator is None or (want and want != src):
            nm = names.take(want or f"output_{j}")
            node_protos.append(helper.make_node("Identity", [src], [nm],
                                                name=node_names.take(f"Identity_output_{j}")))
        done.add(nm)
        graph_outputs.append(_value_info(nm, t.shape, t.dtype, dynamic_axes.get(nm),
                                         f"output {nm!r}"))

    unknown = set(dynamic_axes) - {v.name for v in graph_inputs} - {v.name for v in
                                                                    graph_outputs}
    if unknown:
        raise ExportError(f"dynamic_axes names {sorted(unknown)} are neither inputs nor "
                          f"outputs of the exported graph (inputs "
                          f"{[v.name for v in graph_inputs]}, outputs "
                          f"{[v.name for v in graph_outputs]})")

    graph = helper.make_graph(node_protos, model_name, graph_inputs, graph_outputs,
                              initializers, doc_string=doc_string)
    opset_imports = [helper.make_opsetid(d, v) for d, v in sorted(domains.items())
                     if d == "" or v > 0]
    model = helper.make_model(graph, opset_imports=opset_imports,
                              producer_name="onnx-workbench")
    try:
        model.ir_version = max(7, helper.find_min_ir_version_for(opset_imports,
                                                                 ignore_unknown=True))
    except Exception:  # pragma: no cover - old onnx
        pass
    if check:
        try:
            onnx.checker.check_model(model)
        except onnx.checker.ValidationError as e:
            raise ExportError("the exported model fails onnx.checker: "
                              + " | ".join(str(e).strip().splitlines()[:6])) from None
    return model


def _convert(proto, n, target: int, value_name: dict, initializers: list) -> list:
    """``proto`` (recorded at ``n.opset``) as node(s) of opset ``target``."""
    dom = n.domain or ""
    try:
        s_from = onnx.defs.get_schema(n.op_type, n.opset, dom)
        s_to = onnx.defs.get_schema(n.op_type, target, dom)
    except Exception:
        raise ExportError(f"node {n.name!r}: {n.op_type} is not defined at opset {target} of "
                          f"domain {dom or 'ai.onnx'}") from None
    if s_from.since_version == s_to.since_version:
        return [proto]
    # the op changed between the two opsets: let onnx's version converter rewrite it
    ins = []
    const = {}
    for i, (name, p) in enumerate(zip(proto.input, n.parents)):
        if not name:
            continue
        meta = n.parent_meta(i)
        ins.append(helper.make_tensor_value_info(name, onnx_dtype_of_np(meta[1]),
                                                 list(meta[0]) if meta[0] is not None
                                                 else None))
        if p is not None and type(p) is not tuple and not p.stores_grad:
            const[name] = to_numpy(p.data)
    outs = [helper.make_tensor_value_info(o, onnx_dtype_of_np(m[1]), list(m[0]))
            for o, m in zip(proto.output, n.out_meta) if m[1] is not None]
    inits = [numpy_helper.from_array(np.asarray(v), k) for k, v in const.items()]
    g = helper.make_graph([proto], "convert", ins, outs, inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid(dom, n.opset)])
    try:
        m2 = onnx.version_converter.convert_version(m, target)
    except Exception as e:
        raise ExportError(
            f"node {n.name!r} ({n.op_type}) was recorded at opset {n.opset}, but the model is "
            f"exported at opset {target} and {n.op_type} changed in between "
            f"(versions {s_from.since_version} and {s_to.since_version}); onnx's version "
            f"converter could not rewrite it ({type(e).__name__}: {e}). Export with "
            f"opset_version={n.opset} or record the model at one opset") from None
    have = {t.name for t in initializers}
    for t in m2.graph.initializer:
        if t.name not in have and t.name not in const:
            initializers.append(t)
    return list(m2.graph.node)
