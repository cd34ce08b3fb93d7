"""Checking an ONNX model a student built or edited against a reference known only by digests.

The reference is run once, when the instructor's notebook is recorded: the digests of its
outputs on the exercise's feeds, and of every value it computes on the first feed (graph
inputs, initializers, every node output; a fixed sample of at most ``VALUE_SAMPLE``
elements each) are stored. The reference model itself is not stored anywhere a student
sees.

A student's model is run through the public engine API (``workbench.graph.load``, a
``Plan`` of the graph as written, every node's output captured by the engine's per-node
hook) and compared: outputs first (shape, dtype, values), and when they differ, node by node in the
graph's topological order: the first node whose inputs all match values of the reference
but whose output matches none is where the student's graph goes wrong. The capture
and the criterion are the TensorInspector's (``workbench.divergence``); only what "matches"
means differs: here a value matches when it equals, by digest, any value the reference
computes.
"""

from __future__ import annotations

import os

import numpy as np
import onnx

from workbench.classroom import digest as dg
from workbench.classroom.encoding import ClassroomError
from workbench.errors import WorkbenchError

VALUE_SAMPLE = 64          # elements digested per intermediate value
OUTPUT_SAMPLE = 4096       # elements digested per output
MAX_VALUES = 400           # intermediate values recorded at most
MAX_MODEL_BYTES = 256 << 20


# ----------------------------------------------------------------------------- the answer
def model_bytes(answer, example_feed: dict | None = None) -> bytes:
    """An answer as serialized ONNX: a ``ModelProto``, bytes, a path to an ``.onnx`` file, or
    a workbench model (``SONNXModel`` / ``Model``: exported with ``to_onnx`` on the exercise's
    first inputs)."""
    if isinstance(answer, onnx.ModelProto):
        data = answer.SerializeToString()
    elif isinstance(answer, (bytes, bytearray)):
        data = bytes(answer)
    elif isinstance(answer, (str, os.PathLike)):
        path = os.fspath(answer)
        if not os.path.isfile(path):
            raise ClassroomError(f"{path!r} is not a file; give your ONNX model (a ModelProto, "
                                 f"or the path of an .onnx file)")
        if os.path.getsize(path) > MAX_MODEL_BYTES:
            raise ClassroomError(f"{path} is larger than {MAX_MODEL_BYTES >> 20} MiB")
        with open(path, "rb") as f:
            data = f.read()
    elif isinstance(answer, onnx.GraphProto):
        raise ClassroomError("this is a GraphProto; wrap it in a model first: "
                             "onnx.helper.make_model(graph, opset_imports=[...])")
    elif hasattr(answer, "to_onnx") and callable(answer.to_onnx):
        from workbench import tensor
        if example_feed is None:
            raise ClassroomError("this exercise has no example inputs to export your model with")
        xs = [tensor.from_numpy(np.asarray(v)) for v in example_feed.values()]
        try:
            proto = answer.to_onnx(xs)
        except WorkbenchError as e:
            raise ClassroomError(f"your model could not be exported to ONNX: {e}") from None
        data = proto.SerializeToString()
    else:
        raise ClassroomError(f"expected an ONNX model (onnx.ModelProto, bytes, a path to an "
                             f".onnx file, or a workbench model), got a {type(answer).__name__}")
    if len(data) > MAX_MODEL_BYTES:
        raise ClassroomError(f"the model is larger than {MAX_MODEL_BYTES >> 20} MiB")
    return data


def parse(data: bytes) -> onnx.ModelProto:
    m = onnx.ModelProto()
    try:
        m.ParseFromString(data)
    except Exception as e:
        raise ClassroomError(f"this is not an ONNX model ({type(e).__name__})") from None
    return m


def topo_order(graph: onnx.GraphProto) -> list:
    """The graph's nodes in a topological order (file order where it is one)."""
    nodes = list(graph.node)
    known = {i.name for i in graph.input} | {t.name for t in graph.initializer} | {""}
    done, order, pending = set(known), [], nodes
    while pending:
        rest = []
        for n in pending:
            if all(i in done for i in n.input):
                order.append(n)
                done.update(o for o in n.output if o)
            else:
                rest.append(n)
        if len(rest) == len(pending):      # a cycle or a missing input: keep file order
            order.extend(rest)
            break
        pending = rest
    return order


def graph_inputs(m: onnx.ModelProto) -> list:
    inits = {t.name for t in m.graph.initializer}
    return [i.name for i in m.graph.input if i.name not in inits]


def map_feed(m: onnx.ModelProto, feed: dict, *, by_name: bool) -> dict:
    """The exercise's feed for the student's inputs: by name when asked or when the names
    agree, else by position."""
    names = graph_inputs(m)
    if set(names) == set(feed):
        return dict(feed)
    if by_name:
        raise ClassroomError(f"your model's inputs are {names}, the exercise asks for "
                             f"{list(feed)}")
    if len(names) != len(feed):
        raise ClassroomError(f"your model has {len(names)} input(s) {names}, the exercise "
                             f"feeds {len(feed)} ({', '.join(feed)})")
    return dict(zip(names, feed.values()))


def run(m: onnx.ModelProto, feeds: list, *, capture: bool = False):
    """Outputs for each feed, and (``capture``) every value of the first feed's run:
    ``(outputs_per_feed, values)``; ``values`` maps value names to arrays (graph inputs,
    initializers and node outputs). The graph runs as written (no inference rewrites, so
    every node's output exists), captured by ``workbench.divergence.capture``."""
    from workbench.divergence import capture as capture_values
    from workbench.graph.load import load
    from workbench.runtime.plan import Plan
    try:
        loaded = load(m)
    except WorkbenchError as e:
        raise ClassroomError(f"the workbench cannot load your model: {e}") from None
    try:
        plan = Plan(loaded.graph)
    except WorkbenchError as e:
        raise ClassroomError(f"the workbench cannot run your model: {e}") from None
    except Exception as e:  # never a raw error from planning a malformed graph
        raise ClassroomError(f"the workbench cannot plan your model: {type(e).__name__}: "
                             f"{e}") from None
    try:
        outs, values = [], {}
        for k, feed in enumerate(feeds):
            if capture and k == 0:
                cap = capture_values(plan, feed)
                res = cap.outputs
                values = {name: v for name, v in cap.values.items()
                          if isinstance(v, np.ndarray)}
            else:
                res = plan.run(feed)
            outs.append([np.asarray(r) for r in res])
    except WorkbenchError as e:
        raise ClassroomError(f"the workbench cannot run your model: {e}") from None
    return outs, values


# ----------------------------------------------------------------------------- reference
def reference_data(data: bytes, feeds: list, salt: str, *, atol: float, rtol: float,
                   nodes: bool = True) -> dict:
    m = parse(data)
    outs, values = run(m, feeds, capture=nodes)
    ref = {"inputs": graph_inputs(m), "outputs": [o.name for o in m.graph.output],
           "results": [[dg.array_digest(a, f"{salt}/out{k}/{j}", atol=atol, rtol=rtol,
                                        limit=OUTPUT_SAMPLE) for j, a in enumerate(out)]
                       for k, out in enumerate(outs)]}
    if nodes:
        vals = []
        for a in list(values.values())[:MAX_VALUES]:
            if a.dtype.hasobject or a.dtype.kind not in "biuf":
                continue
            vals.append(dg.array_digest(a, f"{salt}/value/{a.shape}", atol=atol, rtol=rtol,
                                        limit=VALUE_SAMPLE, levels=1))
        ref["values"] = vals
    return ref


def _matches(a: np.ndarray, d: dict, salt: str) -> bool:
    if list(a.shape) != d["shape"] or a.dtype.kind not in "biuf":
        return False
    if dg.is_exact_dtype(a.dtype) != d["exact"]:
        return False
    return bool(np.all(dg.match_levels(a, d, salt) == 0))


# ----------------------------------------------------------------------------- comparing
def compare_model(data: bytes, params: dict, ref: dict, salt: str, describe_array):
    """``(passed, fraction, messages)`` of a student's model against reference digests.
    ``describe_array(a, d, salt)`` -> (ok, text) compares one output."""
    m = parse(data)
    msgs = []
    try:
        onnx.checker.check_model(m)
    except Exception as e:
        first = str(e).strip().splitlines()
        return False, 0.0, [f"onnx.checker rejects your model: {' '.join(first[:2])[:300]}"]
    if params.get("input_names") and graph_inputs(m) != ref["inputs"]:
        msgs.append(f"your model's inputs are named {graph_inputs(m)}, the exercise asks for "
                    f"{ref['inputs']}")
    for op in params.get("forbidden_ops") or ():
        found = [n.name or "(unnamed)" for n in m.graph.node if n.op_type == op]
        if found:
            msgs.append(f"your model still has {len(found)} {op} node(s): "
                        f"{', '.join(repr(f) for f in found[:5])}")
    out_names = [o.name for o in m.graph.output]
    if params.get("output_names") and out_names != ref["outputs"]:
        msgs.append(f"your model's outputs are named {out_names}, the exercise asks for "
                    f"{ref['outputs']}")
    feeds = params["feeds"]
    try:
        mapped = [map_feed(m, f, by_name=bool(params.get("input_names"))) for f in feeds]
        outs, values = run(m, mapped, capture=bool(params.get("nodes", True)))
    except ClassroomError as e:
        return False, 0.0, msgs + [str(e)]
    n_ref = len(ref["outputs"])
    if len(out_names) != n_ref:
        msgs.append(f"your model has {len(out_names)} output(s) {out_names}, the exercise "
                    f"expects {n_ref}")
        return False, 0.0, msgs
    named_ok = not msgs
    good = 0
    for k, (out, refs) in enumerate(zip(outs, ref["results"])):
        feed_ok = True
        for j, (a, d) in enumerate(zip(out, refs)):
            ok, text = describe_array(a, d, f"{salt}/out{k}/{j}")
            if not ok:
                feed_ok = False
                where = f"output {j} ({out_names[j]!r})" + \
                    (f" for input set {k + 1}" if len(feeds) > 1 else "")
                msgs.append(f"{where}: {text}")
        good += feed_ok
    if good < len(feeds) and "values" in ref and values:
        msgs.append(first_difference(m, values, ref["values"], salt))
    passed = named_ok and good == len(feeds)
    return passed, (good / len(feeds) if named_ok else 0.0), msgs


def first_difference(m: onnx.ModelProto, values: dict, ref_values: list, salt: str) -> str:
    """Where the student's graph first computes something the reference never does: the
    first node whose inputs all match values of the reference and whose output matches none
    (``workbench.divergence.first_divergence``, the TensorInspector's criterion), a value
    matching when it equals *any* value the reference computes (names differ between the
    student's graph and the reference)."""
    from workbench.divergence import first_divergence
    by_shape: dict = {}
    for d in ref_values:
        by_shape.setdefault(tuple(d["shape"]), []).append(d)

    cache: dict = {}

    def known(name: str) -> bool | None:
        if name not in values:
            return None
        if name not in cache:
            a = values[name]
            cache[name] = any(_matches(a, d, f"{salt}/value/{tuple(d['shape'])}")
                              for d in by_shape.get(tuple(a.shape), ()))
        return cache[name]

    div = first_divergence(topo_order(m.graph), known, graph_inputs=graph_inputs(m),
                           initializers=[t.name for t in m.graph.initializer])
    if div is None:
        return ("every value your graph computes also appears in the reference's "
                "computation: your output may be a value the reference computes on the way "
                "(a node missing at the end?), or the right values in the wrong output slot")
    if div.inputs_match:
        return (f"the first node of your graph that goes wrong is {div.label}: its inputs "
                f"({', '.join(repr(i) for i in div.inputs)}) all match values the reference "
                f"computes, its output {div.value!r} (shape {list(values[div.value].shape)}) "
                f"matches none. Check its op type, its attributes and the order of its "
                f"inputs.")
    return (f"the first node of your graph whose output matches nothing the reference "
            f"computes is {div.label}; its input(s) "
            + ", ".join(f"{i!r} ({k})" for i, k in div.differing)
            + " already match no value of the reference: check those first")
