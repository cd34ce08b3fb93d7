"""Taking a model apart and putting two together: extract, cut, compose.

``extract`` walks back once from the chosen outputs to the chosen inputs (a set lookup per
value, no copies of the model per step and no shape inference of the whole graph as
``onnx.utils.extract_model`` does), keeps the nodes on the way in their order, and types the
new inputs and outputs from shape inference or, where it has nothing, from a run. Graph inputs
that the part still needs are kept as inputs (and said so) instead of refusing the request.

``compose`` joins another model to this one: outputs of one feed inputs of the other, every
name of the other model gets a prefix (``onnx.compose.add_prefix``), name clashes that remain
are refused before anything changes, element types and fixed dims of each connection must
agree, and the other model is converted to this model's opset when it is older.
"""

from __future__ import annotations

import onnx
from onnx import helper

from workbench.edit.errors import EditError
from workbench.edit.registry import edit
from workbench.edit.state import (
    Draft,
    ModelState,
    _copy_vi,
    describe_type,
    elem_type,
    free_names,
    opset_of,
    shape_of,
    subgraphs,
)
from workbench.edit.verify import CHANGES, KEEPS, Intent


def _needed(d: Draft, outputs, stop: set) -> tuple[list, set]:
    """(nodes needed to compute ``outputs`` from ``stop``, the values read from outside)."""
    prod = {o: n for n in d.g.node for o in n.output if o}
    need_nodes, seen, reads = set(), set(), set()
    todo = list(outputs)
    while todo:
        v = todo.pop()
        if v in seen:
            continue
        seen.add(v)
        if v in stop:
            reads.add(v)
            continue
        n = prod.get(v)
        if n is None:
            reads.add(v)
            continue
        if id(n) in need_nodes:
            continue
        need_nodes.add(id(n))
        todo.extend(i for i in n.input if i)
        for sg in subgraphs(n):
            todo.extend(free_names(sg))
    return [n for n in d.g.node if id(n) in need_nodes], reads


def _extract(d: Draft, ctx, inputs: list | None, outputs: list, what: str) -> Intent:
    if not outputs:
        raise EditError(f"{what}: at least one output is needed")
    graph_inputs = d.input_names()
    for v in list(inputs or []) + list(outputs):
        d.require_value(v)
    dup = {v for v in outputs if list(outputs).count(v) > 1}
    if dup:
        raise EditError(f"{what}: output(s) {sorted(dup)} given twice")
    chosen = list(dict.fromkeys(inputs if inputs is not None else []))
    stop = set(chosen)
    nodes, reads = _needed(d, outputs, stop)
    consts = set(d.inits) | {n.output[0] for n in d.g.node
                             if n.op_type == "Constant" and n.output}
    loose = [v for v in reads if v not in stop and v not in consts]
    from_graph = [v for v in graph_inputs if v in loose]
    other = [v for v in loose if v not in graph_inputs]
    if other:
        raise EditError(f"{what}: the value(s) {sorted(other)} are read but neither computed "
                        f"from the chosen inputs nor constants")
    if inputs is not None and from_graph:
        d.notes.append("graph input(s) still needed, kept as inputs: "
                       + ", ".join(map(repr, from_graph)))
    new_inputs = chosen + [v for v in from_graph if v not in stop]
    unused = [v for v in chosen if v not in reads]
    if unused:
        raise EditError(f"{what}: the input(s) {unused} do not feed the chosen outputs "
                        f"{list(outputs)}")
    types = ctx.types(list(new_inputs) + list(outputs))
    untyped = [v for v in list(new_inputs) + list(outputs) if v not in types]
    if untyped:
        raise EditError(f"{what}: cannot tell the type of {untyped} (shape inference gives "
                        f"none and the model does not run on the sample inputs)")
    # build the new graph: kept nodes in order; constants the part reads; declarations
    keep_inits = {k: t for k, t in d.inits.items() if k in reads and k not in stop}
    node_copies = []
    for n in nodes:
        c = onnx.NodeProto()
        c.CopyFrom(n)
        node_copies.append(c)
    for n in d.g.node:   # Constant nodes the part reads, but that are before a cut input
        if n.op_type == "Constant" and n.output and n.output[0] in reads and \
                n.output[0] not in stop and not any(n.output[0] == c.output[0]
                                                     for c in node_copies if c.output):
            c = onnx.NodeProto()
            c.CopyFrom(n)
            node_copies.insert(0, c)
    removed = len(d.g.node) - len(node_copies)
    del d.g.node[:]
    d.g.node.extend(node_copies)
    old_in = {v.name: v for v in d.g.input}
    del d.g.input[:]
    for v in new_inputs:
        vi = _copy_vi(old_in[v]) if v in old_in and v not in d.inits else _copy_vi(types[v])
        vi.name = v
        d.g.input.append(vi)
    old_out = {v.name: v for v in d.g.output}
    del d.g.output[:]
    for v in outputs:
        vi = _copy_vi(old_out[v]) if v in old_out else _copy_vi(types[v])
        vi.name = v
        d.g.output.append(vi)
    d.inits = keep_inits
    known = {o for n in node_copies for o in n.output} | set(outputs)
    vis = [_copy_vi(v) for v in d.g.value_info if v.name in known and v.name not in outputs]
    del d.g.value_info[:]
    d.g.value_info.extend(vis)
    d.notes.append(f"kept {len(node_copies)} node(s), removed {removed}")
    in_map = {v: ("input" if v in graph_inputs else "value", v) for v in new_inputs}
    return Intent(KEEPS, "the part computes what it computed inside the model",
                  outputs={v: v for v in outputs}, inputs=in_map)


@edit("extract")
def extract(d: Draft, ctx, inputs: list, outputs: list) -> Intent:
    """Keep the part of the graph between the values ``inputs`` (they become the graph
    inputs) and ``outputs`` (the graph outputs). Graph inputs the part still needs stay
    inputs; a chosen input that does not feed the outputs is refused."""
    return _extract(d, ctx, list(inputs), list(outputs), "extract")


@edit("cut_after")
def cut_after(d: Draft, ctx, values: list) -> Intent:
    """Cut off what comes after ``values`` (a classifier's head, post-processing): they
    become the graph outputs; graph inputs they do not need are dropped."""
    values = [values] if isinstance(values, str) else list(values)
    before = d.input_names()
    intent = _extract(d, ctx, None, values, "cut_after")
    dropped = [v for v in before if v not in d.input_names()]
    if dropped:
        d.notes.append("graph input(s) no longer needed, dropped: " + ", ".join(dropped))
    return intent


@edit("cut_before")
def cut_before(d: Draft, ctx, values: list) -> Intent:
    """Cut off what comes before ``values`` (pre-processing): they become graph inputs
    (with the graph inputs the rest still needs); the graph outputs stay."""
    values = [values] if isinstance(values, str) else list(values)
    return _extract(d, ctx, values, d.output_names(), "cut_before")


# ---------------------------------------------------------------------------- compose
def _prefixed(other: onnx.ModelProto, prefix: str) -> onnx.ModelProto:
    from onnx import compose as oc  # noqa: PLC0415
    m = onnx.ModelProto()
    m.CopyFrom(other)
    if prefix:
        oc.add_prefix(m, prefix, inplace=True)
    return m


def _compatible(a: onnx.ValueInfoProto, b: onnx.ValueInfoProto) -> str | None:
    """Why ``a`` (an output) cannot feed ``b`` (an input), or None."""
    if a.type.WhichOneof("value") != b.type.WhichOneof("value"):
        return f"{describe_type(a)} cannot feed {describe_type(b)}"
    if not a.type.HasField("tensor_type"):
        return None
    ea, eb = elem_type(a), elem_type(b)
    if ea and eb and ea != eb:
        return f"element types differ: {describe_type(a)} vs {describe_type(b)}"
    sa, sb = shape_of(a), shape_of(b)
    if sa is not None and sb is not None:
        if len(sa) != len(sb):
            return f"ranks differ: {describe_type(a)} vs {describe_type(b)}"
        for x, y in zip(sa, sb):
            if isinstance(x, int) and isinstance(y, int) and x != y:
                return f"dims differ: {describe_type(a)} vs {describe_type(b)}"
    return None


@edit("compose")
def compose(d: Draft, ctx, other, connect: dict, prefix: str = "", before: bool = False,
            keep_outputs: bool = False) -> Intent:
    """Join ``other`` (a path or a ModelProto) to this model. ``before=False``: this model's
    outputs feed the other's inputs (``connect = {this_output: other_input}``); ``before=True``:
    the other model runs first (``connect = {other_output: this_input}``, e.g. a
    pre-processing model). ``prefix`` is put before every name of the other model; names in
    ``connect`` are the other model's names without it. Connected outputs stop being graph
    outputs unless ``keep_outputs``; the other model's unconnected inputs become inputs."""
    if not isinstance(connect, dict) or not connect:
        raise EditError("compose needs connect={output: input, ...} (at least one pair)")
    if not isinstance(prefix, str):
        raise EditError("prefix is a string")
    o = other.load() if hasattr(other, "load") else other
    if not isinstance(o, onnx.ModelProto):
        raise EditError("the other model is a path or an onnx.ModelProto")
    o = _match_opset(d, o)
    o = _prefixed(o, prefix)
    og = o.graph
    o_inits = {t.name for t in og.initializer}
    o_inputs = [v.name for v in og.input if v.name not in o_inits]
    o_outputs = [v.name for v in og.output]
    pairs = {}
    for src, dst in connect.items():
        if before:
            s, t = prefix + src, dst
            if s not in o_outputs:
                raise EditError(f"the other model has no output {src!r} (outputs: "
                                f"{[x[len(prefix):] for x in o_outputs]})")
            if t not in d.input_names():
                raise EditError(f"this model has no input {dst!r} (inputs: {d.input_names()})")
        else:
            s, t = src, prefix + dst
            if s not in d.output_names():
                raise EditError(f"this model has no output {src!r} (outputs: "
                                f"{d.output_names()})")
            if t not in o_inputs:
                raise EditError(f"the other model has no input {dst!r} (inputs: "
                                f"{[x[len(prefix):] for x in o_inputs]})")
        pairs[s] = t
    if len(set(pairs.values())) != len(pairs):
        raise EditError("each input can be fed by one output only")
    # names of both models must not clash (except where an input is replaced)
    mine = d.names()
    theirs = _model_names(o)
    fed = set(pairs.values())
    clash = sorted((mine & theirs) - fed)   # a fed input disappears: its name may repeat
    if clash:
        raise EditError(f"name clash between the models: {clash[:8]}"
                        + (" ..." if len(clash) > 8 else "")
                        + "; give a prefix (compose(..., prefix='pre_'))")
    # check the connections' types
    this_vi = {v.name: v for v in list(d.g.input) + list(d.g.output)}
    other_vi = {v.name: v for v in list(og.input) + list(og.output)}
    for s, t in pairs.items():
        a = (other_vi if before else this_vi)[s]
        b = (this_vi if before else other_vi)[t]
        why = _compatible(a, b)
        if why:
            raise EditError(f"cannot connect {s!r} to {t!r}: {why}")
    first_nodes, second_nodes = (list(og.node), list(d.g.node)) if before else \
        (list(d.g.node), list(og.node))
    first_g, second_g = (og, d.g) if before else (d.g, og)
    # rewire: readers of each fed input read the output feeding it
    second = onnx.GraphProto()
    second.CopyFrom(second_g)
    for s, t in pairs.items():
        _rename_reads(second, t, s)
    new_nodes = [_copy(n) for n in first_nodes] + list(second.node)
    first_inputs = [_copy_vi(v) for v in first_g.input]
    second_inputs = [_copy_vi(v) for v in second.input if v.name not in fed]
    first_outputs = [_copy_vi(v) for v in first_g.output
                     if keep_outputs or v.name not in pairs]
    second_outputs = [_copy_vi(v) for v in second.output]
    inits = dict(d.inits)
    for t in og.initializer:
        inits[t.name] = t
    vis = [_copy_vi(v) for v in list(first_g.value_info) + list(second.value_info)]
    g = d.g
    del g.node[:]
    g.node.extend(new_nodes)
    del g.input[:]
    g.input.extend(first_inputs + second_inputs)
    del g.output[:]
    g.output.extend(first_outputs + second_outputs)
    del g.value_info[:]
    g.value_info.extend(vis)
    g.sparse_initializer.extend(og.sparse_initializer)
    d.inits = inits
    _merge_opsets(d, o)
    d.m.ir_version = max(d.m.ir_version, o.ir_version)
    for f in o.functions:
        d.m.functions.append(f)
    d.notes.append(f"{len(og.node)} node(s) of the other model joined "
                   f"{'before' if before else 'after'} this one")
    return Intent(CHANGES, "composed with another model")


def _copy(n):
    c = onnx.NodeProto()
    c.CopyFrom(n)
    return c


def _model_names(m: onnx.ModelProto) -> set:
    from workbench.edit.state import all_names  # noqa: PLC0415
    return all_names(m.graph)


def _rename_reads(g: onnx.GraphProto, old: str, new: str) -> None:
    for n in g.node:
        for k, i in enumerate(n.input):
            if i == old:
                n.input[k] = new
        for sg in subgraphs(n):
            shadow = {v.name for v in sg.input} | {o for m in sg.node for o in m.output}
            if old not in shadow:
                _rename_reads(sg, old, new)
    for v in g.output:
        if v.name == old:   # a fed input passed straight through to an output
            g.node.append(helper.make_node("Identity", [new], [old]))


def _match_opset(d: Draft, o: onnx.ModelProto) -> onnx.ModelProto:
    mine, theirs = d.opset(""), opset_of(o, "")
    if mine is None or theirs is None or mine == theirs:
        return o
    if theirs > mine:
        raise EditError(f"the other model uses opset {theirs}, newer than this model's "
                        f"{mine}; set_opset({theirs}) on this model first")
    from workbench.edit.opset import convert  # noqa: PLC0415
    converted = convert(o, mine)
    d.notes.append(f"the other model was converted from opset {theirs} to {mine}")
    return converted


def _merge_opsets(d: Draft, o: onnx.ModelProto) -> None:
    have = {("" if x.domain == "ai.onnx" else x.domain): x for x in d.m.opset_import}
    for x in o.opset_import:
        dom = "" if x.domain == "ai.onnx" else x.domain
        if dom in have:
            if have[dom].version != x.version:
                d.notes.append(f"domain {dom or 'ai.onnx'!r}: version {have[dom].version} and "
                               f"{x.version}; using {max(have[dom].version, x.version)}")
                have[dom].version = max(have[dom].version, x.version)
        else:
            d.m.opset_import.append(helper.make_opsetid(x.domain, x.version))


__all__ = ["ModelState"]
