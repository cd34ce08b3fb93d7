"""Inference-only graph rewrites. Each pass returns a new Graph and leaves outputs unchanged.

- :func:`fold_constants`: ``Constant`` nodes and nodes whose inputs are all constants become
  initializers (deterministic ops only; no random ops, no control flow); ``Shape`` of a value
  whose shape is fully static is folded too when every graph input is fully static (so the
  executor's input checks guarantee the shape cannot change). With static inputs, a node
  ONNX's load-time shape inference left without a static output shape (a Reshape whose target
  is computed in the graph: torch exports with a dynamic batch prepared for a given one) gets
  it from ONNX's per-node inference fed the values folded so far (:func:`_infer_node_shapes`),
  so whole ``Shape -> Gather -> Unsqueeze -> Concat -> Reshape`` chains fold.
- :func:`fold_batchnorm`: ``Conv`` followed by inference-mode ``BatchNormalization`` becomes
  one ``Conv`` whose weights and bias are computed by an internal ``FoldBatchNormWeights``
  node (folded by the next constant-folding pass unless the weights are trainable variables).
- :func:`remove_identities`: ``Identity`` and inference ``Dropout`` nodes are bypassed.
- :func:`fuse_conv_activation`: ``Conv`` followed by a residual ``Add`` and/or an activation
  (Relu, LeakyRelu, Clip with constant bounds, Sigmoid, HardSigmoid, Tanh) becomes one internal
  ``com.workbench::FusedConv`` node (the epilogue runs in the convolution's output pass; on
  the GPU in the same kernel as the bias). Internal: optimized graphs are never exported.
- :func:`fuse_matmul_epilogue`: ``MatMul`` by a weight, ``Add`` of a bias, then optionally
  a GELU (any pointwise chain computing the erf form or the tanh approximation) or Relu, and
  a residual ``Add``, becomes one internal ``com.workbench::FusedMatMul`` node.
- :func:`fuse_attention`: ``MatMul -> scale -> mask -> Softmax -> MatMul`` (scaled
  dot-product attention) becomes one internal ``com.workbench::FusedAttention`` node.
- :func:`eliminate_dead_code`: nodes and initializers no output depends on are dropped.
- :func:`set_integer_arithmetic` (not an optimisation, not run by :func:`optimize`): the nodes
  whose kernels compute 8-bit integer products run in the chosen arithmetic (exact, the spec,
  or onnxruntime's saturating u8 x s8 pairs on x86 without VNNI: ``ops/_integer.py``).

:func:`optimize` runs them in a sensible order. Passes never touch the caller's graph.
"""

from __future__ import annotations

import functools
import inspect
import warnings

import numpy as np

from workbench.errors import ModelLoadError, WorkbenchError
from workbench.graph.ir import Graph, Node
from workbench.graph.toposort import needed_nodes, topological_order
from workbench.limits import temporary_budget
from workbench.ops._integer import ATTRIBUTE as _INTEGER_ATTRIBUTE
from workbench.ops._integer import parse_arithmetic
from workbench.ops.conv import EPILOGUE_ACTIVATIONS
from workbench.ops.registry import FUSED_DOMAIN, facts, lookup

MAX_FOLDED_BYTES = 64 << 20


def _uses_in_subgraphs(graph: Graph) -> set:
    names = set()
    for n in graph.nodes:
        for sg in n.subgraphs:
            names |= sg.free_variables()
    return names


def _rename_inputs(graph: Graph, mapping: dict) -> None:
    if not mapping:
        return
    for n in graph.nodes:
        n.inputs = [mapping.get(i, i) for i in n.inputs]


def remove_identities(graph: Graph) -> Graph:
    """Bypass Identity nodes and inference-mode Dropout nodes (whose mask nobody reads)."""
    g = graph.copy()
    outputs = {v.name for v in g.outputs}
    consumed = {i for n in g.nodes for i in n.inputs if i}
    sub_used = _uses_in_subgraphs(g)
    mapping: dict = {}
    keep = []
    for n in g.nodes:
        src = mapping.get(n.inputs[0], n.inputs[0]) if n.inputs else None
        removable = False
        if n.op_type == "Identity" and len(n.outputs) == 1:
            removable = src is not None
        elif n.op_type == "Dropout" and n.inputs:
            mask_used = len(n.outputs) > 1 and n.outputs[1] and (
                n.outputs[1] in consumed or n.outputs[1] in outputs or n.outputs[1] in sub_used)
            training = len(n.inputs) > 2 and n.inputs[2]
            removable = not mask_used and not training and not n.attrs.get("is_test") == 0
        if removable and src and n.outputs[0] not in outputs and n.outputs[0] not in sub_used:
            value_type = g.value(n.outputs[0])
            if value_type is None or value_type.is_tensor:
                mapping[n.outputs[0]] = src
                continue
        keep.append(n)
    g.nodes = keep
    _rename_inputs(g, mapping)
    return g


def eliminate_dead_code(graph: Graph) -> Graph:
    """Drop nodes no graph output depends on, and unused initializers."""
    g = graph.copy()
    order = topological_order(g)
    keep = needed_nodes(order, [v.name for v in g.outputs])
    keep_ids = {id(n) for n in keep}
    g.nodes = [n for n in g.nodes if id(n) in keep_ids]
    used = {i for n in g.nodes for i in n.inputs if i} | {v.name for v in g.outputs}
    used |= _uses_in_subgraphs(g)
    g.initializers = {k: v for k, v in g.initializers.items() if k in used}
    return g


def _static_shape(info):
    if info is None or info.shape is None:
        return None
    if all(isinstance(d, int) for d in info.shape):
        return info.shape
    return None


def fold_constants(graph: Graph, variables=frozenset()) -> Graph:
    """Evaluate nodes whose inputs are all constants and store their outputs as initializers.

    Initializers named in ``variables`` (a trainable model's parameters and running
    statistics) are not constants: nothing computed from them is folded."""
    from workbench.ops.registry import NodeContext, attribute_defaults, lookup
    g = graph.copy()
    outputs = {v.name for v in g.outputs}
    inputs_static = all(_static_shape(v) is not None for v in g.inputs)
    consts = {k: v for k, v in g.initializers.items() if k not in variables}
    #: values this pass knows more of than the load-time shape inference did (folded here, or
    #: their shapes inferred here): only their readers are worth inferring again
    learned: set = set()
    keep = []
    for n in g.nodes:
        folded = None
        if n.subgraphs or facts(n.op_type, n.domain).random \
                or n.domain not in ("", "ai.onnx", FUSED_DOMAIN):
            keep.append(n)
            continue
        if n.op_type == "Shape" and inputs_static and n.inputs[0] not in consts:
            shape = _static_shape(g.value(n.inputs[0]))
            if shape is not None:
                opset = g.opsets.get("", 1)
                s = np.array(shape, dtype=np.int64)
                if opset >= 15:
                    start = n.attrs.get("start", 0)
                    end = n.attrs.get("end", None)
                    s = s[start:end]
                folded = (s,)
        elif all((not i) or i in consts for i in n.inputs):
            opset = g.opsets.get(n.domain or "", None)
            try:
                entry = lookup(n.op_type, n.domain, opset, n.name)
                attrs = dict(attribute_defaults(n.op_type, n.domain or "", opset))
                attrs.update(n.attrs)
                if entry.wants_ctx:
                    attrs["ctx"] = NodeContext(n.name, n.op_type, opset, len(n.outputs),
                                               tuple(n.outputs), False, None)
                with np.errstate(all="ignore"), warnings.catch_warnings(), \
                        temporary_budget(MAX_FOLDED_BYTES):
                    warnings.simplefilter("ignore")
                    r = entry.fn(*[consts[i] if i else None for i in n.inputs], **attrs)
                folded = r if type(r) is tuple else (r,)
                if any(not isinstance(x, np.ndarray) and not isinstance(x, np.generic)
                       for x in folded[:len(n.outputs)]):
                    folded = None
                elif sum(np.asarray(x).nbytes for x in folded) > MAX_FOLDED_BYTES:
                    folded = None
            except Exception:
                folded = None
        if folded is None:
            keep.append(n)
            if inputs_static and any(i in learned for i in n.inputs if i):
                learned.update(_infer_node_shapes(g, n, consts))
            continue
        for name, val in zip(n.outputs, folded):
            if name:
                consts[name] = np.asarray(val)
                learned.add(name)
        # graph outputs that are constants still need a producer: keep an Identity-free form
        for name in n.outputs:
            if name in outputs:
                keep.append(Node("Constant", [], [name],
                                 {"value": np.asarray(consts[name])}, n.name, ""))
    g.nodes = keep
    g.initializers = {**{k: v for k, v in g.initializers.items() if k in variables}, **consts}
    return eliminate_dead_code(g)


#: constant inputs up to this many elements are handed to ONNX's per-node shape inference
_INFER_DATA_ELEMENTS = 1 << 12
#: nodes with an integer attribute beyond this are not inferred again (see below)
_INFER_MAX_INT = 1 << 24


def _infer_node_shapes(g: Graph, n: Node, consts: dict) -> list:
    """Static output shapes for node ``n`` of a graph with static inputs, where the load-time
    inference found none: ONNX's own per-node inference (``infer_node_outputs``) given the
    input types and the small constant inputs' values (a Reshape's target once its shape
    arithmetic is folded). Written into ``g.value_info`` (a copy made by the caller); returns
    the names it gave a shape. A node it cannot infer is left as it is, and so is a node with
    an integer attribute too large to be a shape (the load-time inference ran in a helper
    process with a memory limit; this one runs here)."""
    if n.domain not in ("", "ai.onnx") or n.subgraphs:
        return []
    if all(not o or _static_shape(g.value(o)) is not None for o in n.outputs):
        return []
    for v in n.attrs.values():
        vals = v if isinstance(v, (list, tuple)) else [v]
        if any(isinstance(x, (int, np.integer)) and abs(int(x)) > _INFER_MAX_INT
               for x in vals[:64]):
            return []
    import onnx
    from onnx import numpy_helper, shape_inference

    from workbench.graph.ir import ValueInfo, python_to_attr
    opset = g.opsets.get("", g.opsets.get("ai.onnx"))
    try:
        schema = onnx.defs.get_schema(n.op_type, opset, "")
        types, data = {}, {}
        for name in n.inputs:
            if not name or name in types:
                continue
            if name in consts:
                a = np.asarray(consts[name])
                types[name] = onnx.helper.make_tensor_type_proto(
                    onnx.helper.np_dtype_to_tensor_dtype(a.dtype), a.shape)
                if a.size <= _INFER_DATA_ELEMENTS:
                    data[name] = numpy_helper.from_array(a, name)
                continue
            v = g.value(name)
            shape = _static_shape(v)
            if shape is None or not v.dtype:
                return []
            types[name] = onnx.helper.make_tensor_type_proto(v.dtype, shape)
        proto = onnx.helper.make_node(n.op_type, list(n.inputs), list(n.outputs))
        proto.attribute.extend(python_to_attr(k, v, n.op_type, n.domain)
                               for k, v in n.attrs.items())
        out = shape_inference.infer_node_outputs(
            schema, proto, types, data,
            opset_imports=[onnx.helper.make_opsetid("", opset)])
    except Exception:   # noqa: BLE001 - no inference: the node keeps unknown shapes
        return []
    done = []
    for name in n.outputs:
        t = out.get(name) if name else None
        if t is None or not t.HasField("tensor_type") or not t.tensor_type.HasField("shape"):
            continue
        dims = t.tensor_type.shape.dim
        if all(d.HasField("dim_value") for d in dims):
            g.value_info[name] = ValueInfo(name, t.tensor_type.elem_type or None,
                                           tuple(int(d.dim_value) for d in dims))
            done.append(name)
    return done


def fold_batchnorm(graph: Graph, variables=frozenset()) -> Graph:
    """Fold inference BatchNormalization into the Conv that feeds it.

    The Conv's new weights are the outputs of an internal ``FoldBatchNormWeights`` node (see
    :mod:`workbench.ops.norm`): :func:`fold_constants` evaluates it once when the weights are
    constants; when some are ``variables`` (a trainable model's parameters) it stays in the
    graph and runs on the current weights."""
    g = graph.copy()
    producers = g.producers()
    consumers = g.consumers()
    outputs = {v.name for v in g.outputs}
    inits = g.initializers
    removed = set()
    taken = set(inits) | {o for n in g.nodes for o in n.outputs}
    prep = {}                       # id(conv) -> the FoldBatchNormWeights node before it
    for bn in g.nodes:
        if bn.op_type != "BatchNormalization" or bn.domain not in ("", "ai.onnx") \
                or not bn.outputs or not bn.outputs[0] or any(bn.outputs[1:]):
            continue
        if bn.attrs.get("training_mode", 0) or bn.attrs.get("spatial", 1) != 1 \
                or bn.attrs.get("is_test", 1) == 0:
            continue
        x = bn.inputs[0]
        conv = producers.get(x)
        if conv is None or conv.op_type != "Conv" or conv.domain not in ("", "ai.onnx") \
                or id(conv) in removed or id(conv) in prep:
            continue
        if len(consumers.get(x, [])) != 1 or x in outputs:
            continue
        params = bn.inputs[1:5]
        if len(params) != 4 or not all(p in inits for p in params):
            continue
        has_bias = len(conv.inputs) > 2 and bool(conv.inputs[2])
        if len(conv.inputs) < 2 or conv.inputs[1] not in inits or (
                has_bias and conv.inputs[2] not in inits):
            continue
        w = np.asarray(inits[conv.inputs[1]])
        if w.dtype.kind != "f" or w.ndim < 3:
            continue
        # validate before folding: every BN parameter (and the Conv bias) must be one value
        # per output channel; anything else is left to the BatchNormalization kernel, which
        # reports it naming the node
        c_out = w.shape[0]
        arrays = [np.asarray(inits[p]) for p in params]
        if has_bias:
            arrays.append(np.asarray(inits[conv.inputs[2]]))
        if any(a.shape != (c_out,) or a.dtype.kind != "f" for a in arrays):
            continue
        eps = float(bn.attrs.get("epsilon", 1e-5))
        if params[3] not in variables:
            var = arrays[3].astype(np.float64)
            if not (np.all(np.isfinite(var)) and np.all(var + eps > 0)):
                continue
        wname = _fresh(taken, conv.inputs[1] + "_bnfolded")
        taken.add(wname)
        bname = _fresh(taken, (conv.inputs[2] if has_bias else conv.name + "_bias")
                       + "_bnfolded")
        taken.add(bname)
        prep[id(conv)] = Node("FoldBatchNormWeights",
                              [conv.inputs[1], *params, conv.inputs[2] if has_bias else ""],
                              [wname, bname], {"epsilon": eps}, f"{bn.name}/fold_weights",
                              FUSED_DOMAIN)
        conv.inputs = [conv.inputs[0], wname, bname]
        conv.outputs = [bn.outputs[0]]
        removed.add(id(bn))
    if not removed:
        return g
    nodes = []
    for n in g.nodes:
        if id(n) in removed:
            continue
        if id(n) in prep:
            nodes.append(prep[id(n)])
        nodes.append(n)
    g.nodes = nodes
    g.opsets = dict(g.opsets)
    g.opsets.setdefault(FUSED_DOMAIN, 1)
    return eliminate_dead_code(g)


def _activation_params(node: Node, inits: dict, opset: int):
    """(name, params) of a fusable activation node, or None (e.g. Clip with dynamic bounds)."""
    op = node.op_type
    if op == "LeakyRelu":
        return op, [float(node.attrs.get("alpha", 0.01))]
    if op == "HardSigmoid":
        return op, [float(node.attrs.get("alpha", 0.2)), float(node.attrs.get("beta", 0.5))]
    if op == "Clip":
        if opset < 11:
            return op, [float(node.attrs.get("min", -3.4028234663852886e38)),
                        float(node.attrs.get("max", 3.4028234663852886e38))]
        bounds = []
        for k, default in ((1, -np.inf), (2, np.inf)):
            name = node.inputs[k] if len(node.inputs) > k else ""
            if not name:
                bounds.append(default)
            elif name in inits and np.asarray(inits[name]).size == 1:
                bounds.append(float(np.asarray(inits[name]).reshape(-1)[0]))
            else:
                return None
        return op, bounds
    return op, []


def _sole_reader(consumers: dict, outputs: set, sub_used: set):
    """``reader(value)``: the one node reading ``value`` when nothing else does (not a graph
    output, not read by a subgraph), else None - when a fusion may fold ``value`` away."""

    def reader(value):
        users = consumers.get(value, [])
        if len(users) != 1 or value in outputs or value in sub_used:
            return None
        return users[0]

    return reader


def fuse_conv_activation(graph: Graph, variables=frozenset()) -> Graph:
    """Fuse ``Conv [-> Add(residual)] [-> activation]`` chains into ``FusedConv`` nodes.

    Only float convolutions whose intermediate values have a single consumer and are not
    graph outputs (or read by subgraphs) are fused; the fused node keeps the Conv's name and
    produces the chain's last value, so every other value keeps its name."""
    g = graph.copy()
    consumers = g.consumers()
    outputs = {v.name for v in g.outputs}
    sub_used = _uses_in_subgraphs(g)
    inits = g.initializers
    consts = {k: v for k, v in inits.items() if k not in variables}  # values read
    opset = g.opsets.get("", g.opsets.get("ai.onnx", 1))

    only_consumer = _sole_reader(consumers, outputs, sub_used)

    removed = set()
    position = {id(n): i for i, n in enumerate(g.nodes)}  # (list.index compares by value)
    for conv in list(g.nodes):
        if conv.op_type != "Conv" or conv.domain or len(conv.outputs) != 1:
            continue
        w = inits.get(conv.inputs[1]) if len(conv.inputs) > 1 else None
        if w is not None and np.asarray(w).dtype.kind != "f":
            continue
        out, z, act, chain = conv.outputs[0], "", None, []
        nxt = only_consumer(out)
        if nxt is not None and nxt.op_type == "Add" and not nxt.domain \
                and len(nxt.inputs) == 2 and len(nxt.outputs) == 1 and id(nxt) not in removed:
            other = nxt.inputs[1] if nxt.inputs[0] == out else nxt.inputs[0]
            if other and other != out:
                z, out = other, nxt.outputs[0]
                chain.append(nxt)
                nxt = only_consumer(out)
        if nxt is not None and nxt.op_type in EPILOGUE_ACTIVATIONS and not nxt.domain \
                and len(nxt.outputs) == 1 and id(nxt) not in removed:
            act = _activation_params(nxt, consts, opset)
            if act is not None:
                out = nxt.outputs[0]
                chain.append(nxt)
        if not chain:
            continue
        attrs = dict(conv.attrs)
        attrs["activation"] = act[0] if act else ""
        attrs["activation_params"] = [float(v) for v in act[1]] if act else []
        b = conv.inputs[2] if len(conv.inputs) > 2 else ""
        fused = Node("FusedConv", [conv.inputs[0], conv.inputs[1], b, z], [out], attrs,
                     conv.name, FUSED_DOMAIN)
        g.nodes[position[id(conv)]] = fused
        removed.update(id(n) for n in chain)
    if not removed:
        return g
    g.nodes = [n for n in g.nodes if id(n) not in removed]
    g.opsets = dict(g.opsets)
    g.opsets[FUSED_DOMAIN] = 1
    return g


def _scalar_const(inits: dict, name: str):
    """The value of a one-element float/int initializer, else None."""
    v = inits.get(name)
    if v is None:
        return None
    a = np.asarray(v)
    if a.size != 1 or a.dtype.kind not in "fiu":
        return None
    return a


def _gelu_forms():
    from workbench.ops.linalg import _epilogue_inplace
    probe = np.concatenate([np.linspace(-12, 12, 481), [-40.0, -20.0, 20.0, 40.0, 0.0]])
    out = {}
    for form in ("Gelu", "GeluTanh"):
        y = probe.copy()
        _epilogue_inplace(y, form)
        out[form] = y
    return probe, out


def _elementwise_region(position: dict, start: str, consumers: dict, inits: dict,
                        outputs: set, sub_used: set):
    """The chain of pointwise nodes computing a function of the value ``start`` alone (their
    other inputs one-element constants) up to the one value leaving it: ``(nodes in order,
    output)``, or None. Every value inside, ``start`` included, is read only inside."""
    region, values, order = set(), {start}, []
    frontier = [start]
    while frontier:
        v = frontier.pop()
        for n in consumers.get(v, []):
            if id(n) in region:
                continue
            f = facts(n.op_type, n.domain)
            if not f.elementwise or n.domain or len(n.outputs) != 1 or not n.outputs[0] \
                    or n.subgraphs:
                continue
            if not all(i in values or _scalar_const(inits, i) is not None
                       for i in n.inputs if i) or not any(i in values for i in n.inputs):
                continue
            region.add(id(n))
            order.append(n)
            values.add(n.outputs[0])
            frontier.append(n.outputs[0])
    if not order:
        return None
    leaving = [v for v in values
               if v in outputs or v in sub_used
               or any(id(c) not in region for c in consumers.get(v, []))]
    if len(leaving) != 1 or leaving[0] == start or leaving[0] in sub_used:
        return None
    order.sort(key=lambda n: position[id(n)])
    return order, leaving[0]


def _region_activation(nodes, start: str, out: str, inits: dict, opset: int):
    """Which FusedMatMul activation the region computes ("Gelu", "GeluTanh"), found by running
    it on a probe of points in [-12, 12] and a few large ones; None for anything else."""
    from workbench.ops.registry import NodeContext, attribute_defaults, lookup
    probe, forms = _gelu_forms()
    for dtype in (np.float64, np.float32):
        env = {start: probe.astype(dtype)}
        try:
            with np.errstate(all="ignore"), warnings.catch_warnings():
                warnings.simplefilter("ignore")
                for n in nodes:
                    entry = lookup(n.op_type, n.domain, opset, n.name)
                    attrs = dict(attribute_defaults(n.op_type, n.domain or "", opset))
                    attrs.update(n.attrs)
                    if entry.wants_ctx:
                        attrs["ctx"] = NodeContext(n.name, n.op_type, opset, 1,
                                                   tuple(n.outputs), False, None)
                    args = [env[i] if i in env else np.asarray(inits[i]).astype(dtype)
                            if i else None for i in n.inputs]
                    env[n.outputs[0]] = np.asarray(entry.fn(*args, **attrs))
        except Exception:  # noqa: BLE001 - a region the probe cannot run is not fused
            return None
        y = env.get(out)
        if y is None or y.shape != probe.shape:
            return None
        found = None   # float32 constants: agreement to float32 rounding, not better
        for form, ref in forms.items():
            if np.allclose(y.astype(np.float64), ref, rtol=1e-5, atol=1e-6):
                found = form
        if found is None:
            return None
    return found


def _norm_epilogue(ln, value: str, consts: dict, w):
    """``(node, gamma, beta, epsilon)`` when ``ln`` is a LayerNormalization of ``value`` over
    its last axis that a FusedMatMul by ``w`` may end with: Scale (and B, if any) constant
    rows of the product's width and dtype, the default stash type, no Mean/InvStdDev outputs.
    Else None."""
    if ln is None or ln.op_type != "LayerNormalization" or ln.domain \
            or not 2 <= len(ln.inputs) <= 3 or ln.inputs[0] != value \
            or ln.attrs.get("axis", -1) != -1 or ln.attrs.get("stash_type", 1) != 1 \
            or not ln.outputs or not ln.outputs[0] or any(ln.outputs[1:]):
        return None
    rows = [ln.inputs[1], ln.inputs[2] if len(ln.inputs) == 3 else ""]
    for name in rows:
        if not name:
            continue
        c = consts.get(name)
        if c is None or np.asarray(c).dtype != w.dtype or np.asarray(c).shape != w.shape[1:]:
            return None
    if not rows[0]:
        return None
    return ln, rows[0], rows[1], float(ln.attrs.get("epsilon", 1e-5))


def _skip_norm_epilogue(sln, value: str, consts: dict, w):
    """``([bias, skip, gamma, beta], epsilon)``, FusedMatMul's inputs after A and W, when
    ``sln`` is a com.microsoft SkipLayerNormalization of ``value`` (as its input or its skip)
    that a FusedMatMul by ``w`` may end with: gamma, beta and bias constant rows of the
    product's width and dtype, only the first output used. Else None. float32/float64 only:
    the op sums in float32 where FusedMatMul's float16 epilogue would round each add."""
    if sln is None or w.dtype not in (np.float32, np.float64) \
            or sln.op_type != "SkipLayerNormalization" or sln.domain != "com.microsoft" \
            or not 3 <= len(sln.inputs) <= 5 or value not in sln.inputs[:2] \
            or sln.inputs[0] == sln.inputs[1] or not sln.outputs or not sln.outputs[0] \
            or any(sln.outputs[1:]):
        return None
    rows = list(sln.inputs[2:]) + [""] * (5 - len(sln.inputs))   # gamma, beta, bias
    if not rows[0]:
        return None
    for name in rows:
        c = consts.get(name) if name else None
        if name and (c is None or np.asarray(c).dtype != w.dtype
                     or np.asarray(c).shape != w.shape[1:]):
            return None
    skip = sln.inputs[1] if sln.inputs[0] == value else sln.inputs[0]
    return [rows[2], skip, rows[0], rows[1]], float(sln.attrs.get("epsilon", 1e-12))


def fuse_matmul_epilogue(graph: Graph, variables=frozenset()) -> Graph:
    """Fuse ``MatMul(A, W) -> Add(bias) [-> GELU or Relu] [-> Add(residual)]`` into internal
    ``com.workbench::FusedMatMul`` nodes (PyTorch's Linear layers export as MatMul + Add).

    ``W`` and ``bias`` must be float initializers (the bias one value per output column); the
    GELU may be any chain of pointwise ops of the biased value alone that computes the erf
    form or the tanh approximation (checked by running the chain on a probe); intermediate
    values must have a single consumer and must not be graph outputs. A LayerNormalization
    over the last axis reading the chain's value (Scale and B constant rows, no Mean /
    InvStdDev output) becomes the node's last step (inputs 4 and 5, attribute ``epsilon``):
    with no activation its bias and residual adds run in the compiled LayerNorm's pass; so
    does a com.microsoft ``SkipLayerNormalization`` read straight from ``MatMul(A, W)`` (its
    bias and skip become the node's bias and residual, only its first output used). The
    fused node keeps the MatMul's name and produces the chain's last value."""
    g = graph.copy()
    consumers = g.consumers()
    outputs = {v.name for v in g.outputs}
    sub_used = _uses_in_subgraphs(g)
    inits = g.initializers
    consts = {k: v for k, v in inits.items() if k not in variables}  # values read
    opset = g.opsets.get("", g.opsets.get("ai.onnx", 1))

    only_consumer = _sole_reader(consumers, outputs, sub_used)

    removed = set()
    position = {id(n): i for i, n in enumerate(g.nodes)}
    for mm in list(g.nodes):
        if mm.op_type != "MatMul" or mm.domain or len(mm.inputs) != 2 or id(mm) in removed:
            continue
        w = inits.get(mm.inputs[1])
        if w is None or np.asarray(w).dtype.kind != "f" or np.asarray(w).ndim != 2:
            continue
        n_out = np.asarray(w).shape[1]
        add = only_consumer(mm.outputs[0])
        skip_ln = _skip_norm_epilogue(add, mm.outputs[0], consts, np.asarray(w))
        if skip_ln is not None and id(add) not in removed:
            fused = Node("FusedMatMul", [mm.inputs[0], mm.inputs[1], *skip_ln[0]],
                         [add.outputs[0]],
                         {"activation": "", "epsilon": skip_ln[1], "skip_norm": 1}, mm.name,
                         FUSED_DOMAIN)
            g.nodes[position[id(mm)]] = fused
            position[id(fused)] = position.pop(id(mm))
            removed.add(id(add))
            continue
        if add is None or add.op_type != "Add" or add.domain or len(add.inputs) != 2 \
                or id(add) in removed:
            continue
        bname = add.inputs[1] if add.inputs[0] == mm.outputs[0] else add.inputs[0]
        b = inits.get(bname)
        if b is None or np.asarray(b).dtype != np.asarray(w).dtype \
                or np.asarray(b).shape not in ((n_out,), (1, n_out)):
            continue
        chain, out, act, z = [add], add.outputs[0], "", ""
        nxt = only_consumer(out)
        if nxt is not None and nxt.op_type == "Relu" and not nxt.domain \
                and id(nxt) not in removed:
            chain.append(nxt)
            out, act = nxt.outputs[0], "Relu"
        elif out not in outputs and out not in sub_used and consumers.get(out) and all(
                facts(c.op_type, c.domain).elementwise for c in consumers[out]):
            region = _elementwise_region(position, out, consumers, consts, outputs, sub_used)
            if region is not None and not any(id(n) in removed for n in region[0]):
                form = _region_activation(region[0], out, region[1], consts, opset)
                if form is not None:
                    chain.extend(region[0])
                    out, act = region[1], form
        nxt = only_consumer(out)
        if nxt is not None and nxt.op_type == "Add" and not nxt.domain \
                and len(nxt.inputs) == 2 and id(nxt) not in removed:
            other = nxt.inputs[1] if nxt.inputs[0] == out else nxt.inputs[0]
            if other and other != out:
                chain.append(nxt)
                out, z = nxt.outputs[0], other
        ins, attrs = [mm.inputs[0], mm.inputs[1], bname, z], {"activation": act}
        norm = _norm_epilogue(only_consumer(out), out, consts, np.asarray(w))
        if norm is not None and id(norm[0]) not in removed:
            ln, gamma, beta, eps = norm
            chain.append(ln)
            out = ln.outputs[0]
            ins += [gamma, beta]
            attrs["epsilon"] = eps
        fused = Node("FusedMatMul", ins, [out], attrs, mm.name, FUSED_DOMAIN)
        g.nodes[position[id(mm)]] = fused
        position[id(fused)] = position.pop(id(mm))
        removed.update(id(n) for n in chain)
    if not removed:
        return g
    g.nodes = [n for n in g.nodes if id(n) not in removed]
    g.opsets = dict(g.opsets)
    g.opsets[FUSED_DOMAIN] = 1
    return g


def fuse_attention(graph: Graph, variables=frozenset()) -> Graph:
    """Fuse ``MatMul(Q, K) [-> Mul|Div(scalar)] [-> Add(mask) | Where(cond, fill, .) |
    Where(cond, ., fill)] -> Softmax(axis=-1) -> MatMul(., V)`` (scaled dot-product attention
    as PyTorch exports it) into an internal ``com.workbench::FusedAttention`` node. Every
    intermediate value must have a single consumer and not be a graph output; the scale and
    the fill value must be one-element float constants; Softmax must be opset 13 or newer
    (normalising the last axis only). The fused node keeps the last MatMul's name."""
    g = graph.copy()
    if g.opsets.get("", g.opsets.get("ai.onnx", 1)) < 13:
        return g
    consumers = g.consumers()
    producers = g.producers()
    outputs = {v.name for v in g.outputs}
    sub_used = _uses_in_subgraphs(g)
    inits = g.initializers
    consts = {k: v for k, v in inits.items() if k not in variables}  # values read

    only_consumer = _sole_reader(consumers, outputs, sub_used)

    def single(value):
        return only_consumer(value) is not None

    def prod(value, op):
        n = producers.get(value)
        if n is None or n.op_type != op or n.domain or not single(value):
            return None
        return n

    def float_scalar(name):
        a = _scalar_const(consts, name)
        return None if a is None or a.dtype.kind != "f" else float(a.reshape(-1)[0])

    removed = set()
    position = {id(n): i for i, n in enumerate(g.nodes)}
    for sm in list(g.nodes):
        if sm.op_type != "Softmax" or sm.domain or sm.attrs.get("axis", -1) != -1 \
                or len(sm.outputs) != 1 or id(sm) in removed:
            continue
        p = sm.outputs[0]
        if not single(p):
            continue
        mm2 = consumers[p][0]
        if mm2.op_type != "MatMul" or mm2.domain or mm2.inputs[0] != p or mm2.inputs[1] == p:
            continue
        chain, cur = [sm], sm.inputs[0]
        mask, m_in, fill = "", "", 0.0
        for op in ("Add", "Where"):
            n = prod(cur, op)
            if n is None:
                continue
            if op == "Add" and len(n.inputs) == 2:
                for a, b in ((0, 1), (1, 0)):
                    src = producers.get(n.inputs[a])
                    if src is not None and src.op_type in ("Mul", "Div", "MatMul") \
                            and n.inputs[b] and n.inputs[b] != n.inputs[a]:
                        mask, m_in, cur = "add", n.inputs[b], n.inputs[a]
                        chain.append(n)
                        break
            elif op == "Where" and len(n.inputs) == 3:
                c, x, y = n.inputs
                if float_scalar(x) is not None and y != c:
                    mask, m_in, fill, cur = "fill_where_true", c, float_scalar(x), y
                    chain.append(n)
                elif float_scalar(y) is not None and x != c:
                    mask, m_in, fill, cur = "fill_where_false", c, float_scalar(y), x
                    chain.append(n)
            break
        scale_op, scale = "", 1.0
        for op in ("Mul", "Div"):
            n = prod(cur, op)
            if n is None or len(n.inputs) != 2:
                continue
            pairs = ((0, 1), (1, 0)) if op == "Mul" else ((0, 1),)
            for a, b in pairs:
                c = float_scalar(n.inputs[b])
                if c is not None and producers.get(n.inputs[a]) is not None:
                    scale_op, scale, cur = op.lower(), c, n.inputs[a]
                    chain.append(n)
                    break
            break
        mm1 = prod(cur, "MatMul")
        if mm1 is None or len(mm1.inputs) != 2 or any(id(n) in removed for n in chain):
            continue
        chain.append(mm1)
        fused = Node("FusedAttention", [mm1.inputs[0], mm1.inputs[1], mm2.inputs[1], m_in],
                     list(mm2.outputs),
                     {"scale": float(scale), "scale_op": scale_op, "mask": mask,
                      "fill": float(fill)}, mm2.name, FUSED_DOMAIN)
        g.nodes[position[id(mm2)]] = fused
        position[id(fused)] = position.pop(id(mm2))
        removed.update(id(n) for n in chain)
    if not removed:
        return g
    g.nodes = [n for n in g.nodes if id(n) not in removed]
    g.opsets = dict(g.opsets)
    g.opsets[FUSED_DOMAIN] = 1
    return g


def fuse_attention_layout(graph: Graph, variables=frozenset()) -> Graph:
    """Fold the head split before a ``com.workbench::FusedAttention`` node and the head merge
    after it into the node: ``Reshape(x, shape) -> Transpose(perm)`` (either one alone too)
    feeding its Q, K or V, and ``Transpose(perm) [-> Reshape(shape)]`` reading its output
    (exported multi-head attention: ``[B, S, H*D] -> [B, H, S, D]`` and back), so that an
    attention block runs as one step. The shapes stay inputs of the node (computed in the
    graph from the dynamic batch and sequence length), so nothing is read from a value;
    Reshape must be opset 5+ without ``allowzero`` and Transpose must give ``perm``. Every
    value folded away must have a single consumer and not be a graph output; the fused node
    keeps the attention's name and produces the last folded value."""
    g = graph.copy()
    consumers = g.consumers()
    producers = g.producers()
    outputs = {v.name for v in g.outputs}
    sub_used = _uses_in_subgraphs(g)

    only_consumer = _sole_reader(consumers, outputs, sub_used)

    def single(value):
        return only_consumer(value) is not None

    def is_transpose(n):
        return n is not None and n.op_type == "Transpose" and not n.domain \
            and len(n.inputs) == 1 and len(n.outputs) == 1 and bool(n.attrs.get("perm"))

    def is_reshape(n):
        return n is not None and n.op_type == "Reshape" and not n.domain \
            and len(n.inputs) == 2 and all(n.inputs) and len(n.outputs) == 1 \
            and not n.attrs.get("allowzero", 0)

    removed = set()
    position = {id(n): i for i, n in enumerate(g.nodes)}
    for fa in list(g.nodes):
        if fa.op_type != "FusedAttention" or fa.domain != FUSED_DOMAIN or len(fa.inputs) > 4 \
                or len(fa.outputs) != 1:
            continue
        ins = list(fa.inputs) + [""] * (4 - len(fa.inputs))
        attrs = dict(fa.attrs)
        shapes, absorbed = ["", "", "", ""], []
        for k, key in enumerate("qkv"):
            cur = ins[k]
            t = producers.get(cur)
            if ins.count(cur) == 1 and single(cur) and is_transpose(t):
                attrs[f"{key}_perm"] = [int(p) for p in t.attrs["perm"]]
                absorbed.append(t)
                cur = t.inputs[0]
            r = producers.get(cur)
            if ins.count(cur) <= 1 and single(cur) and is_reshape(r):
                shapes[k] = r.inputs[1]
                absorbed.append(r)
                cur = r.inputs[0]
            ins[k] = cur
        out = fa.outputs[0]
        users = consumers.get(out, [])
        if single(out) and is_transpose(users[0]):
            t = users[0]
            attrs["out_perm"] = [int(p) for p in t.attrs["perm"]]
            absorbed.append(t)
            out = t.outputs[0]
            users = consumers.get(out, [])
            if single(out) and is_reshape(users[0]) and users[0].inputs[0] == out:
                shapes[3] = users[0].inputs[1]
                absorbed.append(users[0])
                out = users[0].outputs[0]
        if not absorbed or any(id(n) in removed for n in absorbed):
            continue
        last = max([fa] + absorbed, key=lambda n: position[id(n)])
        fused = Node("FusedAttention", ins + shapes, [out], attrs, fa.name, FUSED_DOMAIN)
        removed.update(id(n) for n in absorbed)
        removed.add(id(fa))
        g.nodes[position[id(last)]] = fused   # after every value it reads
        position[id(fused)] = position.pop(id(last))
    if not removed:
        return g
    g.nodes = [n for n in g.nodes if id(n) not in removed]
    return g


def fuse_scalar_chains(graph: Graph, variables=frozenset()) -> Graph:
    """Fuse chains of ``Unsqueeze`` (constant axes), ``Cast`` and ``Add``/``Sub``/``Mul``/
    ``Div`` with a one-element constant (either side) into one internal
    ``com.workbench::ScalarChain`` node (``ops/chain.py``): the attention-mask chain of
    exported transformers, ``Unsqueeze -> Unsqueeze -> Cast -> Sub(1, .) -> Mul(., c)``, is
    five steps of a few dozen elements each. Every intermediate value must have a single
    consumer and not be a graph output; constants must not be ``variables``; two nodes at
    least. The fused node keeps the last node's name and output, and computes the same
    operations in the same order (bit for bit the chain). Runs after the product and
    attention fusions, so it never takes a node they would have folded."""
    g = graph.copy()
    opset = g.opsets.get("", g.opsets.get("ai.onnx", 1))
    consumers = g.consumers()
    outputs = {v.name for v in g.outputs}
    only_consumer = _sole_reader(consumers, outputs, _uses_in_subgraphs(g))
    consts = {k: v for k, v in g.initializers.items() if k not in variables}
    new_inits: dict = {}
    names = set(g.initializers) | {v for n in g.nodes for v in n.outputs} | \
        {v.name for v in g.inputs}

    def link(n, value):
        """(param name, swap, cast_to) when ``n`` can be a link reading ``value``, else None."""
        if n.domain or len(n.outputs) != 1 or not n.outputs[0] or n.subgraphs:
            return None
        if n.op_type == "Unsqueeze":
            if opset >= 13:
                if len(n.inputs) != 2 or n.inputs[0] != value or n.attrs \
                        or n.inputs[1] not in consts:
                    return None
                return n.inputs[1], 0, 0
            axes = n.attrs.get("axes")
            if len(n.inputs) != 1 or n.inputs[0] != value or not isinstance(axes, list) \
                    or set(n.attrs) != {"axes"}:
                return None
            return tuple(int(a) for a in axes), 0, 0   # made an initializer when fused
        if n.op_type == "Cast":
            if len(n.inputs) != 1 or n.inputs[0] != value or set(n.attrs) != {"to"} \
                    or opset < 6:
                return None
            return "", 0, int(n.attrs["to"])
        if n.op_type in ("Add", "Sub", "Mul", "Div"):
            if len(n.inputs) != 2 or n.attrs or opset < 7 or n.inputs[0] == n.inputs[1]:
                return None
            side = 0 if n.inputs[0] == value else 1 if n.inputs[1] == value else None
            other = n.inputs[1 - side] if side is not None else None
            if other is None or _scalar_const(consts, other) is None:
                return None
            return other, side, 0
        return None

    taken: set = set()
    fused_at: dict = {}
    for n in g.nodes:
        if id(n) in taken or not n.inputs:
            continue
        first = link(n, n.inputs[0]) or (link(n, n.inputs[1]) if len(n.inputs) == 2 else None)
        if first is None:
            continue
        x = n.inputs[0] if first[1] == 0 or n.op_type in ("Unsqueeze", "Cast") \
            else n.inputs[1]
        chain, links = [n], [first]
        while True:
            nxt = only_consumer(chain[-1].outputs[0])
            lk = None if nxt is None or id(nxt) in taken else link(nxt, chain[-1].outputs[0])
            if lk is None:
                break
            chain.append(nxt)
            links.append(lk)
        if len(chain) < 2:
            continue
        last = chain[-1]
        params = []
        for c, (p, _, _) in zip(chain, links):
            if isinstance(p, tuple):   # Unsqueeze-1..12's axes attribute
                p_name = _fresh(names, f"{c.name or 'unsqueeze'}_axes")
                names.add(p_name)
                new_inits[p_name] = np.asarray(p, dtype=np.int64)
                p = p_name
            params.append(p)
        fused = Node("ScalarChain", [x] + params, list(last.outputs),
                     {"ops": [c.op_type for c in chain], "swap": [s for _, s, _ in links],
                      "cast_to": [t for _, _, t in links]}, last.name, FUSED_DOMAIN)
        taken.update(id(c) for c in chain)
        fused_at[id(last)] = fused
    if not fused_at:
        return g
    g.nodes = [fused_at.get(id(n), n) for n in g.nodes
               if id(n) not in taken or id(n) in fused_at]
    if new_inits:
        g.initializers = {**g.initializers, **new_inits}
    g.opsets = dict(g.opsets)
    g.opsets[FUSED_DOMAIN] = 1
    return g


def _fresh(names, base: str) -> str:
    name, i = base, 1
    while name in names:
        name = f"{base}_{i}"
        i += 1
    return name


def _takes_arithmetic(op_type: str, domain: str, opset) -> bool:
    """Whether the kernel of a node computes 8-bit integer products in a selectable
    arithmetic: it takes the keyword ``integer_arithmetic`` (``ops/_integer.py``)."""
    try:
        fn = lookup(op_type, domain, opset).fn
    except WorkbenchError:
        return False
    return _INTEGER_ATTRIBUTE in _keywords(fn)


@functools.cache
def _keywords(fn) -> frozenset:
    return frozenset(p.name for p in inspect.signature(fn).parameters.values()
                     if p.kind is inspect.Parameter.KEYWORD_ONLY)


def integer_product_nodes(graph: Graph) -> list:
    """The nodes of ``graph`` (not of its subgraphs) whose kernels compute 8-bit integer
    products in a selectable arithmetic (the nodes :func:`set_integer_arithmetic` marks)."""
    out = []
    for n in graph.nodes:
        opset = graph.opsets.get(n.domain or "", graph.opsets.get("ai.onnx"))
        if opset is not None and _takes_arithmetic(n.op_type, n.domain or "", opset):
            out.append(n)
    return out


def set_integer_arithmetic(graph: Graph, mode) -> Graph:
    """Every node whose kernel computes 8-bit integer products (MatMulInteger, QLinearConv,
    QGemm, DynamicQuantizeLSTM, ...: found from the kernels' signatures, no list of ops) runs in
    ``mode`` (an ``IntegerArithmetic`` or its name: ``"exact"``, the specification, or
    ``"saturating-u8s8"``, onnxruntime's arithmetic on x86 CPUs without VNNI). The mode is an
    internal node attribute the kernels read; subgraphs are marked too."""
    mode = parse_arithmetic(mode)
    g = graph.copy()
    for n in g.nodes:
        for k, v in n.attrs.items():
            if isinstance(v, Graph):
                n.attrs[k] = set_integer_arithmetic(v, mode)
            elif isinstance(v, list) and v and isinstance(v[0], Graph):
                n.attrs[k] = [set_integer_arithmetic(sg, mode) for sg in v]
    for n in integer_product_nodes(g):
        n.attrs[_INTEGER_ATTRIBUTE] = mode
    return g


def optimize(graph: Graph, *, fold: bool = True, bn: bool = True, identities: bool = True,
             fuse: bool = True, variables=frozenset(), layout: str | None = "auto") -> Graph:
    """Run the inference passes: identities, constant folding, Conv+BN folding, Conv+Add+
    activation fusion, MatMul+bias+activation+Add fusion, attention fusion, the attention's
    head split / merge folded into it, the activation layout (``layout``: "auto" lets
    ``graph/layout.py`` run depthwise networks channels-last, "nhwc" forces it, None keeps
    NCHW; CPU plans only: GPU callers pass None), DCE.

    The one pipeline behind both ``backend.prepare`` (every initializer a constant) and a
    trainable model's inference runs (``SONNXModel.run``: its parameters and running
    statistics are ``variables``, so nothing computed from them is baked in: the folded
    BatchNorm weights run in the plan on the current values, and the fusions read only
    constants' values). Both run the same nodes with the same kernels, so they give the
    same numbers."""
    variables = frozenset(variables)
    g = graph
    steps = [(identities, remove_identities), (fold, fold_constants), (bn, fold_batchnorm),
             (fold and bn, fold_constants), (fuse, fuse_conv_activation),
             (fuse, fuse_matmul_epilogue), (fuse, fuse_attention),
             (fuse, fuse_attention_layout),
             (fuse and layout is not None, _channels_last(layout)),
             (fuse and layout is not None, fuse_scalar_chains),
             (True, eliminate_dead_code)]
    for enabled, fn in steps:
        if not enabled:
            continue
        try:
            g = fn(g) if fn in (remove_identities, eliminate_dead_code) else fn(g, variables)
        except WorkbenchError:
            raise
        except Exception as e:  # a pass must never surface a raw numpy/Python error
            raise ModelLoadError(
                f"the inference pass {fn.__name__} failed on graph {graph.name!r}: "
                f"{type(e).__name__}: {e}; the model is probably malformed (prepare with "
                f"optimize=False to run it as written)") from e
    return g


def _channels_last(mode):
    """The layout pass (``workbench.graph.layout``) as an optimize step."""
    def to_channels_last(g: Graph, variables=frozenset()) -> Graph:
        from workbench.graph.layout import to_channels_last as rewrite  # noqa: PLC0415

        return rewrite(g, variables, mode=mode)
    return to_channels_last
