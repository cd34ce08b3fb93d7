"""The edits of single nodes, values, outputs, initializers, metadata and declared dims.

Each function is one edit (registered under its name; the session's method of the same name
calls it through a record). Nodes are named by their name or by one of their outputs (unnamed
nodes are common in exported models; value names are unique). What an edit leaves dead (the
weights of a deleted node, the shape subgraph of a bypassed Reshape) is removed with it; dead
parts the model already had stay.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import helper, numpy_helper

from workbench.arrays.dtypes import dtype_name, np_dtype_of_onnx, onnx_dtype_of_np
from workbench.edit.errors import EditError
from workbench.edit.registry import edit
from workbench.edit.state import (
    Draft,
    _copy_vi,
    describe_type,
    elem_type,
    node_label,
    set_shape,
    shape_of,
)
from workbench.edit.verify import APPROX, CHANGES, KEEPS, Intent

#: ops whose bypass keeps the function (inference: Dropout passes its input through)
NO_OPS = {"Identity", "Dropout"}


def _label(n: onnx.NodeProto) -> str:
    return f"{node_label(n, 0)!r} ({n.op_type})"


def _users(d: Draft, values) -> tuple[list, list]:
    """(nodes reading any of ``values``, those of ``values`` that are graph outputs)."""
    values = [v for v in values if v]
    cons = d.consumers()
    nodes, seen = [], set()
    for v in values:
        for n in cons.get(v, []):
            if id(n) not in seen:
                seen.add(id(n))
                nodes.append(n)
    outs = [v for v in values if v in set(d.output_names())]
    return nodes, outs


def _downstream(d: Draft, start: onnx.NodeProto) -> list:
    """``start`` and every node that reads, directly or not, one of its outputs."""
    cons = d.consumers()
    todo, seen, out = [start], set(), []
    while todo:
        n = todo.pop()
        if id(n) in seen:
            continue
        seen.add(id(n))
        out.append(n)
        for o in n.output:
            todo.extend(cons.get(o, []))
    return out


def _as_input(d: Draft, value, base: str) -> str:
    """A node input: an existing value name, '' (omitted optional input) or an array (made an
    initializer)."""
    if value is None or value == "":
        return ""
    if isinstance(value, str):
        d.require_value(value)
        return value
    a = np.asarray(value)
    if a.dtype.kind in "OUS":
        a = a.astype(object)
    return d.add_initializer(base, a)


def _attrs(attrs: dict | None, where: str) -> list:
    out = []
    for k, v in (attrs or {}).items():
        if not isinstance(k, str) or not k:
            raise EditError(f"{where}: attribute names are non-empty strings, got {k!r}")
        if isinstance(v, np.ndarray):
            v = numpy_helper.from_array(v)
        try:
            out.append(helper.make_attribute(k, v))
        except (TypeError, ValueError) as e:
            raise EditError(f"{where}: attribute {k!r} = {v!r} cannot be stored: {e}") from None
    return out


def _ensure_domain(d: Draft, domain: str) -> None:
    if domain in ("", "ai.onnx"):
        return
    if d.opset(domain) is None:
        d.m.opset_import.append(helper.make_opsetid(domain, 1))
        d.notes.append(f"imported domain {domain!r} at version 1")


def _check_name(name, what: str) -> str:
    if not isinstance(name, str) or not name.strip():
        raise EditError(f"{what} must be a non-empty string, got {name!r}")
    if "\x00" in name:
        raise EditError(f"{what} must not contain a NUL character")
    return name


# ---------------------------------------------------------------------------- nodes
@edit("delete_node")
def delete_node(d: Draft, ctx, node: str, downstream: bool = False) -> Intent:
    """Delete a node. Refused when other nodes or graph outputs read its outputs, unless
    ``downstream=True``: then everything that depends on it goes too (and the graph outputs
    it computed). What only fed the deleted nodes (their weights, shape subgraphs) goes with
    them."""
    n = d.find_node(node)
    before = d.snapshot_liveness()
    users, outs = _users(d, n.output)
    if (users or outs) and not downstream:
        what = []
        if users:
            what.append("read by " + ", ".join(_label(u) for u in users[:6])
                        + (f" and {len(users) - 6} more" if len(users) > 6 else ""))
        if outs:
            what.append("graph output " + ", ".join(map(repr, outs)))
        raise EditError(f"node {_label(n)} cannot be deleted: its output is {'; '.join(what)}. "
                        f"bypass_node({node!r}) wires its input to its readers instead; "
                        f"delete_node({node!r}, downstream=True) deletes them too")
    gone = _downstream(d, n) if downstream else [n]
    produced = {o for m in gone for o in m.output}
    lost = [o for o in d.output_names() if o in produced]
    if lost and len(lost) == len(d.output_names()):
        raise EditError(f"deleting node {_label(n)} with everything downstream would remove "
                        f"every graph output ({', '.join(map(repr, lost))}); a model needs at "
                        f"least one output")
    if lost:
        keep = [_copy_vi(v) for v in d.g.output if v.name not in produced]
        del d.g.output[:]
        d.g.output.extend(keep)
        d.notes.append("removed graph output(s) " + ", ".join(map(repr, lost)))
    d.remove_nodes(gone)
    if len(gone) > 1:
        d.notes.append(f"deleted {len(gone) - 1} node(s) downstream: "
                       + ", ".join(node_label(m, 0) for m in gone[1:8])
                       + (" ..." if len(gone) > 8 else ""))
    pruned = d.prune(before)
    if pruned:
        d.notes.append(f"removed {len(pruned)} node(s) that only fed it: "
                       + ", ".join(pruned[:8]) + (" ..." if len(pruned) > 8 else ""))
    if not users and not outs:
        return Intent(KEEPS, "the node fed nothing")
    return Intent(CHANGES, f"deleted {_label(n)}" + (" and what depends on it"
                                                     if downstream else ""))


@edit("bypass_node")
def bypass_node(d: Draft, ctx, node: str, input: int = 0, output: int = 0) -> Intent:
    """Remove a node and wire its input ``input`` to the readers of its output ``output``
    (an Identity, a Dropout, a Cast you do not want...). When that output is a graph output,
    the input's producer takes over the output's name."""
    n = d.find_node(node)
    if not (0 <= input < len(n.input)) or not n.input[input]:
        raise EditError(f"node {_label(n)} has no input {input} (it has {len(n.input)}: "
                        f"{list(n.input)})")
    if not (0 <= output < len(n.output)) or not n.output[output]:
        raise EditError(f"node {_label(n)} has no output {output} (outputs: {list(n.output)})")
    src, dst = n.input[input], n.output[output]
    others = [o for k, o in enumerate(n.output) if k != output and o]
    o_users, o_outs = _users(d, others)
    if o_users or o_outs:
        raise EditError(f"node {_label(n)} cannot be bypassed: its other output(s) "
                        f"{', '.join(map(repr, others))} are still read")
    before = d.snapshot_liveness()
    outputs = d.output_names()
    if dst in outputs:
        if src in outputs:
            raise EditError(f"cannot bypass {_label(n)}: its input {src!r} and its output "
                            f"{dst!r} are both graph outputs")
        if src in d.input_names() or d.is_constant(src):
            raise EditError(f"cannot bypass {_label(n)}: it connects "
                            f"{'graph input' if src in d.input_names() else 'constant'} "
                            f"{src!r} to graph output {dst!r}; a graph output must be computed "
                            f"by a node")
        d.remove_nodes([n])
        _drop_value_info(d, src)
        d.rename_everywhere(src, dst)
        d.notes.append(f"{src!r} now carries the graph output's name {dst!r}")
    else:
        d.remove_nodes([n])
        _drop_value_info(d, dst)
        d.rename_everywhere(dst, src)
    pruned = d.prune(before)
    if pruned:
        d.notes.append("removed what only fed it: " + ", ".join(pruned[:8]))
    if n.op_type in NO_OPS and n.domain in ("", "ai.onnx"):
        return Intent(KEEPS, f"{n.op_type} passes its input through at inference",
                      outputs={o: o for o in d.output_names()})
    return Intent(CHANGES, f"bypassed {_label(n)}")


def _drop_value_info(d: Draft, name: str) -> None:
    keep = [_copy_vi(v) for v in d.g.value_info if v.name != name]
    del d.g.value_info[:]
    d.g.value_info.extend(keep)


@edit("insert_node")
def insert_node(d: Draft, ctx, value: str, op_type: str, inputs: list | None = None,
                attrs: dict | None = None, name: str | None = None, domain: str = "",
                position: int = 0, readers: list | None = None,
                output: str | None = None) -> Intent:
    """Insert a node on the edge ``value``: the new node reads ``value`` (at input
    ``position``; ``inputs`` are its other inputs: value names, numpy arrays that become
    initializers, or None for an omitted optional input), and the readers of ``value`` (all,
    or the nodes listed in ``readers``) read the new node's output instead. When ``value`` is
    a graph output, the graph output keeps its name and now comes from the new node."""
    _check_name(op_type, "op_type")
    d.require_value(value)
    if name is not None:
        _check_name(name, "the node name")
        if any(n.name == name for n in d.g.node):
            raise EditError(f"a node named {name!r} exists already")
    if output is not None:
        _check_name(output, "the output name")
        if output in d.names():
            raise EditError(f"the name {output!r} is used already in the model")
    extra = list(inputs or [])
    if not (0 <= position <= len(extra)):
        raise EditError(f"position {position} is outside 0..{len(extra)}")
    node_name = name or d.fresh(f"{value}/{op_type}")
    ins = [_as_input(d, v, f"{node_name}/input{k + 1}") for k, v in enumerate(extra)]
    cons = d.consumers()
    if readers is not None:
        chosen = [d.find_node(r) for r in readers]
        for r in chosen:
            if value not in r.input:
                raise EditError(f"node {_label(r)} does not read {value!r}")
    else:
        chosen = list(cons.get(value, []))
    is_out = value in d.output_names() and readers is None
    if is_out and value in d.input_names():
        raise EditError(f"{value!r} is both a graph input and a graph output; insert the node "
                        f"on one of its readers instead (readers=[...])")
    if is_out:
        # the graph output keeps its name: the edge's producer gets a new name for its value
        inner = d.fresh(f"{value}_before_{op_type}")
        d.rename_everywhere(value, inner)
        _restore_output_name(d, inner, value)
        ins.insert(position, inner)
        new_out = value
        for c in d.g.node:   # every reader of the old value reads the new node's output
            for k, i in enumerate(c.input):
                if i == inner:
                    c.input[k] = value
        d.notes.append(f"the value before the new node is now called {inner!r}")
    else:
        new_out = output or d.fresh(f"{value}_{op_type.lower()}")
        ins.insert(position, value)
        for c in chosen:
            for k, i in enumerate(c.input):
                if i == value:
                    c.input[k] = new_out
    _ensure_domain(d, domain)
    new = helper.make_node(op_type, ins, [new_out], name=node_name, domain=domain or None)
    new.attribute.extend(_attrs(attrs, f"node {node_name!r}"))
    d.g.node.append(new)
    order_fix(d)
    if op_type == "Identity" and not domain:
        return Intent(KEEPS, "an Identity passes its input through")
    return Intent(CHANGES, f"inserted a {op_type} node on {value!r}")


def _restore_output_name(d: Draft, inner: str, name: str) -> None:
    for v in d.g.output:
        if v.name == inner:
            v.name = name


@edit("replace_node")
def replace_node(d: Draft, ctx, node: str, op_type: str | None = None,
                 attrs: dict | None = None, remove_attrs: list | None = None,
                 domain: str | None = None, inputs: list | None = None) -> Intent:
    """Change a node's op type, domain, attributes (``attrs`` set or replace, ``remove_attrs``
    remove) or inputs (a full new input list: value names, arrays, None)."""
    n = d.find_node(node)
    what = []
    if op_type is not None:
        _check_name(op_type, "op_type")
        what.append(f"op {n.op_type} -> {op_type}")
        n.op_type = op_type
    if domain is not None:
        _ensure_domain(d, domain)
        n.domain = domain
    for k in remove_attrs or []:
        if not any(a.name == k for a in n.attribute):
            raise EditError(f"node {_label(n)} has no attribute {k!r} (it has "
                            f"{[a.name for a in n.attribute]})")
        keep = [a for a in n.attribute if a.name != k]
        del n.attribute[:]
        n.attribute.extend(keep)
        what.append(f"removed attribute {k}")
    if attrs:
        new = _attrs(attrs, f"node {node_label(n, 0)!r}")
        names = {a.name for a in new}
        keep = [a for a in n.attribute if a.name not in names]
        del n.attribute[:]
        n.attribute.extend(keep + new)
        what.append("attributes " + ", ".join(sorted(names)))
    if inputs is not None:
        before = d.snapshot_liveness()
        label = node_label(n, 0)
        ins = [_as_input(d, v, f"{label}/input{k}") for k, v in enumerate(inputs)]
        if set(ins) & set(n.output):
            raise EditError(f"node {_label(n)} cannot read its own output")
        del n.input[:]
        n.input.extend(ins)
        order_fix(d)
        d.prune(before)
        what.append("inputs")
    if not what:
        raise EditError("replace_node needs op_type, attrs, remove_attrs, domain or inputs")
    return Intent(CHANGES, f"{_label(n)}: " + ", ".join(what))


def order_fix(d: Draft) -> None:
    """Put the nodes back in a topological order after inputs were rewired."""
    from workbench.errors import ModelLoadError  # noqa: PLC0415
    from workbench.graph.toposort import toposort_nodes  # noqa: PLC0415
    try:
        order = toposort_nodes(list(d.g.node), "edited graph")
    except ModelLoadError as e:
        raise EditError(f"the edit would make a cycle: {e}") from None
    if list(order) != list(range(len(d.g.node))):
        nodes = [d.g.node[i] for i in order]
        copies = []
        for n in nodes:
            c = onnx.NodeProto()
            c.CopyFrom(n)
            copies.append(c)
        del d.g.node[:]
        d.g.node.extend(copies)


# ---------------------------------------------------------------------------- names
@edit("rename_node")
def rename_node(d: Draft, ctx, node: str, new: str) -> Intent:
    """Give a node a new name (node names are not value names; the function is the same)."""
    _check_name(new, "the new node name")
    n = d.find_node(node)
    clash = [m for m in d.g.node if m.name == new and m is not n]
    if clash:
        raise EditError(f"a node named {new!r} exists already ({clash[0].op_type})")
    n.name = new
    return Intent(KEEPS, "a node name is only a label", outputs={o: o for o in d.output_names()})


@edit("rename_value")
def rename_value(d: Draft, ctx, old: str, new: str) -> Intent:
    """Rename a value everywhere (its producer, readers, subgraphs, declarations): an
    intermediate value, an initializer, a graph input or a graph output."""
    _check_name(new, "the new name")
    inputs, outputs = d.input_names(), d.output_names()
    if not (d.value_exists(old) or old in outputs):
        d.require_value(old)
    if new == old:
        raise EditError(f"{old!r} already has that name")
    if new in d.names():
        raise EditError(f"cannot rename {old!r} to {new!r}: the model uses the name {new!r} "
                        f"already (name clash)")
    d.rename_everywhere(old, new)
    out_map = {(new if o == old else o): o for o in outputs}
    in_map = {new: ("input", old)} if old in inputs else {}
    return Intent(KEEPS, "a rename", outputs=out_map, inputs=in_map)


@edit("rename_input")
def rename_input(d: Draft, ctx, old: str, new: str) -> Intent:
    """Rename a graph input (refused for anything else)."""
    if old not in d.input_names():
        raise EditError(f"{old!r} is not a graph input; the inputs are {d.input_names()}")
    return rename_value(d, ctx, old, new)


@edit("rename_output")
def rename_output(d: Draft, ctx, old: str, new: str) -> Intent:
    """Rename a graph output (refused for anything else)."""
    if old not in d.output_names():
        raise EditError(f"{old!r} is not a graph output; the outputs are {d.output_names()}")
    return rename_value(d, ctx, old, new)


# ---------------------------------------------------------------------------- outputs
@edit("add_output")
def add_output(d: Draft, ctx, value: str, name: str | None = None) -> Intent:
    """Make any value a graph output (to inspect an inner tensor). ``name``: expose it under
    another name (through an Identity node)."""
    d.require_value(value)
    if value in d.output_names() and name is None:
        raise EditError(f"{value!r} is a graph output already")
    target = value
    if name is not None and name != value:
        _check_name(name, "the output name")
        if name in d.names():
            raise EditError(f"the name {name!r} is used already in the model")
        ident = helper.make_node("Identity", [value], [name], name=d.fresh(f"{name}/Identity"))
        d.g.node.append(ident)
        target = name
    vi = ctx.types([value]).get(value)
    out = d.g.output.add()
    if vi is not None:
        out.CopyFrom(vi)
    out.name = target
    if vi is None or not out.type.HasField("tensor_type") and not out.type.WhichOneof("value"):
        raise EditError(f"the type of {value!r} is unknown (shape inference did not find it "
                        f"and the model did not run on the sample inputs)")
    outs = {o: o for o in d.output_names() if o != target}
    outs[target] = value
    return Intent(KEEPS, "an extra output", outputs=outs)


@edit("remove_output")
def remove_output(d: Draft, ctx, name: str) -> Intent:
    """Remove a graph output; what only computed it goes too."""
    outs = d.output_names()
    if name not in outs:
        raise EditError(f"{name!r} is not a graph output; the outputs are {outs}")
    if len(outs) == 1:
        raise EditError(f"{name!r} is the model's only output; a model needs at least one")
    before = d.snapshot_liveness()
    keep = [_copy_vi(v) for v in d.g.output if v.name != name]
    del d.g.output[:]
    d.g.output.extend(keep)
    pruned = d.prune(before)
    if pruned:
        d.notes.append(f"removed {len(pruned)} node(s) that only computed it: "
                       + ", ".join(pruned[:8]) + (" ..." if len(pruned) > 8 else ""))
    return Intent(KEEPS, "the other outputs stay", outputs={o: o for o in d.output_names()})


# ---------------------------------------------------------------------------- initializers
def _constant_target(d: Draft, name: str):
    if name in d.inits:
        return "init", None
    n = d.constant_node(name)
    if n is not None:
        return "const", n
    raise EditError(f"{name!r} is neither an initializer nor a Constant node's output"
                    + ("" if not d.value_exists(name) else
                       " (it is computed by a node; insert_node or replace_node change those)"))


def _store(d: Draft, name: str, a: np.ndarray) -> None:
    kind, node = _constant_target(d, name)
    t = numpy_helper.from_array(a, name)
    if kind == "init":
        d.inits[name] = t
        for v in d.g.input:   # IR < 4: the initializer's declaration as an input
            if v.name == name:
                v.type.tensor_type.elem_type = t.data_type
                set_shape(v, list(a.shape))
    else:
        keep = [x for x in node.attribute if x.name not in (
            "value", "value_float", "value_floats", "value_int", "value_ints", "value_string",
            "value_strings", "sparse_value")]
        del node.attribute[:]
        node.attribute.extend(keep + [helper.make_attribute("value", t)])


@edit("set_initializer")
def set_initializer(d: Draft, ctx, name: str, value) -> Intent:
    """Replace an initializer's (or a Constant node's) value with a numpy array; dtype and
    shape may change (the checks say whether the model still works)."""
    old = d.constant_value(name) if d.is_constant(name) else None
    _constant_target(d, name)
    a = np.asarray(value)
    if a.dtype.kind in "US":
        a = a.astype(object)
    try:
        onnx_dtype_of_np(a.dtype)
    except TypeError:
        raise EditError(f"arrays of dtype {a.dtype} cannot be stored in an ONNX model") from None
    _store(d, name, a)
    if old is not None and (old.shape != a.shape or old.dtype != a.dtype):
        d.notes.append(f"{name!r}: {old.dtype}{list(old.shape)} -> {a.dtype}{list(a.shape)}")
        d.clear_value_info()
    if old is not None and old.shape == a.shape and old.dtype == a.dtype and \
            np.array_equal(old, a):
        return Intent(KEEPS, "the same value")
    return Intent(CHANGES, f"new value for {name!r}")


_FLOATS = {"float16", "bfloat16", "float32", "float64"}
_QUANT = {"int8", "uint8"}


@edit("convert_initializers")
def convert_initializers(d: Draft, ctx, dtype: str, names: list | None = None,
                         keep_type: bool = True, axis: int | None = None,
                         min_elements: int = 16) -> Intent:
    """Store initializers in another dtype, to shrink a model or prepare it for quantization.

    ``dtype``: float16 / bfloat16 (a Cast back to the old type is inserted after each, with
    ``keep_type``), int8 / uint8 (quantized, symmetric for int8 and affine for uint8, per
    tensor or per ``axis``, with a DequantizeLinear after each), or any dtype without
    ``keep_type`` (the value is converted and its readers get the new dtype). ``names``: the
    initializers (default: every float initializer with at least ``min_elements`` elements).
    The edited model computes approximately what it did; the check reports the error."""
    if names is None:
        names = [k for k, t in d.inits.items()
                 if t.data_type in (onnx.TensorProto.FLOAT, onnx.TensorProto.DOUBLE)
                 and int(np.prod(t.dims)) >= min_elements]
        if not names:
            raise EditError(f"no float initializer with at least {min_elements} elements")
    elif isinstance(names, str):
        names = [names]
    target = _onnx_type(dtype)
    if keep_type and dtype not in _FLOATS | _QUANT:
        raise EditError(f"keep_type works for float16, bfloat16, float32, float64, int8 and "
                        f"uint8; for {dtype!r} pass keep_type=False")
    if dtype in _QUANT and keep_type:
        need = 13 if axis is not None else 10
        if (d.opset("") or 0) < need:
            raise EditError(f"DequantizeLinear{' per axis' if axis is not None else ''} needs "
                            f"opset {need}; the model has opset {d.opset('')} "
                            f"(set_opset({need}) first)")
    saved = 0
    for name in names:
        _constant_target(d, name)
        a = d.constant_value(name)
        if keep_type and a.dtype.kind != "f":
            raise EditError(f"{name!r} is {a.dtype}, not a float initializer")
        new_name = d.fresh(f"{name}_{dtype}") if keep_type else name
        if not keep_type:
            b = a.astype(np_dtype_of_onnx(target))
            _store(d, name, b)
            saved += a.nbytes - b.nbytes
            continue
        if dtype in _QUANT:
            q, scale, zp = _quantize(a, dtype, axis, name)
            qn = d.add_initializer(new_name, q)
            sn = d.add_initializer(f"{name}_scale", scale.astype(a.dtype))
            zn = d.add_initializer(f"{name}_zero_point", zp)
            node = helper.make_node("DequantizeLinear", [qn, sn, zn], [name],
                                    name=d.fresh(f"{name}/DequantizeLinear"))
            if axis is not None:
                node.attribute.extend([helper.make_attribute("axis", int(axis))])
            stored = q.nbytes + scale.nbytes + zp.nbytes
        else:
            b = a.astype(np_dtype_of_onnx(target))
            if not np.isfinite(b[np.isfinite(a)]).all():
                raise EditError(f"{name!r} has values outside the {dtype} range "
                                f"(max |x| = {float(np.abs(a).max()):.3g})")
            qn = d.add_initializer(new_name, b)
            node = helper.make_node("Cast", [qn], [name], name=d.fresh(f"{name}/Cast"),
                                    to=int(_onnx_type(_np_name(a.dtype))))
            stored = b.nbytes
        if name in d.inits:
            del d.inits[name]
            keep = [_copy_vi(v) for v in d.g.input if v.name != name]
            if len(keep) != len(d.g.input):
                del d.g.input[:]
                d.g.input.extend(keep)
        else:
            d.remove_nodes([d.constant_node(name)])
        d.g.node.append(node)
        saved += a.nbytes - stored
    order_fix(d)
    d.clear_value_info()
    d.notes.append(f"{len(names)} initializer(s) stored as {dtype}: {saved:,} bytes smaller")
    return Intent(APPROX if keep_type else CHANGES,
                  f"weights rounded to {dtype}" if keep_type else f"values converted to {dtype}")


def _np_name(dt: np.dtype) -> str:
    return {"float32": "float32", "float64": "float64", "float16": "float16"}.get(
        str(dt), "bfloat16" if "bfloat16" in str(dt) else str(dt))


def _onnx_type(dtype: str) -> int:
    key = {"float32": "FLOAT", "float64": "DOUBLE", "bool": "BOOL"}.get(dtype, str(dtype).upper())
    if not hasattr(onnx.TensorProto, key):
        raise EditError(f"unknown dtype {dtype!r}")
    return int(getattr(onnx.TensorProto, key))


def _quantize(a: np.ndarray, dtype: str, axis, name: str):
    x = a.astype(np.float64)
    if axis is not None:
        if not (-x.ndim <= axis < x.ndim):
            raise EditError(f"axis {axis} is outside the rank {x.ndim} of {name!r}")
        ax = axis % x.ndim
        red = tuple(i for i in range(x.ndim) if i != ax)
        lo, hi = x.min(axis=red, keepdims=True), x.max(axis=red, keepdims=True)
    else:
        lo, hi = x.min(), x.max()
    lo, hi = np.minimum(lo, 0.0), np.maximum(hi, 0.0)
    if dtype == "int8":
        scale = np.maximum(np.maximum(-lo, hi) / 127.0, 1e-12)
        zp = np.zeros_like(scale, dtype=np.int8)
        q = np.clip(np.rint(x / scale), -127, 127).astype(np.int8)
    else:
        scale = np.maximum((hi - lo) / 255.0, 1e-12)
        zpf = np.clip(np.rint(-lo / scale), 0, 255)
        zp = zpf.astype(np.uint8)
        q = np.clip(np.rint(x / scale) + zpf, 0, 255).astype(np.uint8)
    if axis is not None:
        scale, zp = scale.reshape(-1), zp.reshape(-1)
    else:
        scale, zp = np.asarray(scale).reshape(()), np.asarray(zp).reshape(())
    return q, scale, zp


# ---------------------------------------------------------------------------- metadata
@edit("set_metadata")
def set_metadata(d: Draft, ctx, key: str, value: str) -> Intent:
    """Set a metadata entry (``metadata_props``) of the model."""
    _check_name(key, "the metadata key")
    if not isinstance(value, str):
        raise EditError(f"metadata values are strings, got {type(value).__name__}")
    for p in d.m.metadata_props:
        if p.key == key:
            p.value = value
            break
    else:
        d.m.metadata_props.add(key=key, value=value)
    return Intent(KEEPS, "metadata only", outputs=None)


@edit("remove_metadata")
def remove_metadata(d: Draft, ctx, key: str) -> Intent:
    """Remove a metadata entry."""
    keys = [p.key for p in d.m.metadata_props]
    if key not in keys:
        raise EditError(f"the model has no metadata {key!r} (it has {keys})")
    keep = [(p.key, p.value) for p in d.m.metadata_props if p.key != key]
    del d.m.metadata_props[:]
    for k, v in keep:
        d.m.metadata_props.add(key=k, value=v)
    return Intent(KEEPS, "metadata only")


# ---------------------------------------------------------------------------- dims
@edit("set_dims")
def set_dims(d: Draft, ctx, value: str, dims: list) -> Intent:
    """Declare the dims of a graph input or output: ints fix them, strings make them symbolic
    (named), None leaves them unknown. Only the declaration changes: constants baked from the
    old shape stay (``reshape_inputs`` / ``rebatch`` rewrite those)."""
    vi = next((v for v in d.g.input if v.name == value and v.name not in d.inits), None)
    where = "input"
    if vi is None:
        vi = next((v for v in d.g.output if v.name == value), None)
        where = "output"
    if vi is None:
        raise EditError(f"{value!r} is not a graph input or output (inputs "
                        f"{d.input_names()}, outputs {d.output_names()})")
    if not vi.type.HasField("tensor_type"):
        raise EditError(f"{value!r} is not a tensor ({describe_type(vi)})")
    dims = _dims(dims, value)
    old = shape_of(vi)
    if old is not None and len(old) != len(dims):
        raise EditError(f"{where} {value!r} has rank {len(old)} ({describe_type(vi)}); "
                        f"{len(dims)} dims given")
    set_shape(vi, dims)
    d.clear_value_info()
    if elem_type(vi) == 0:
        raise EditError(f"{value!r} has no element type")
    return Intent(CHANGES if where == "input" else KEEPS,
                  f"{where} {value!r} declared {_fmt_dims(dims)} (was {_fmt_dims(old)})",
                  outputs=None)


def _dims(dims, value) -> list:
    if not isinstance(dims, (list, tuple)):
        raise EditError(f"dims of {value!r} are a list (ints, strings or None), got {dims!r}")
    out = []
    for x in dims:
        if x is None or isinstance(x, str):
            if isinstance(x, str) and not x.strip():
                raise EditError("a symbolic dim needs a non-empty name")
            out.append(x)
        elif isinstance(x, (int, np.integer)) and not isinstance(x, bool) and int(x) >= 0:
            out.append(int(x))
        else:
            raise EditError(f"a dim is a non-negative int, a name or None; got {x!r} for "
                            f"{value!r}")
    return out


def _fmt_dims(dims) -> str:
    if dims is None:
        return "rank unknown"
    return "[" + ", ".join("?" if x is None else str(x) for x in dims) + "]"


__all__ = ["dtype_name"]
