"""Changing a model's opset with onnx's version converter, and saying per node where it cannot.

onnx's converter is C++ code that can crash on malformed models, so it runs in a child process
on the model's skeleton (large initializers replaced by inputs of the same type, as for the
loader's checks: ``workbench.graph.isolated.skeleton``); the weights are put back afterwards.
When the whole model does not convert, every node is tried alone (typed from shape inference,
small constant inputs included) and the nodes that fail are listed with the converter's reason.
"""

from __future__ import annotations

import json
import subprocess
import sys

import onnx
from onnx import helper

from workbench.edit.errors import EditError
from workbench.edit.registry import edit
from workbench.edit.state import Draft, opset_of
from workbench.edit.verify import KEEPS, Intent

#: seconds the converter may take (whole model plus the per-node report)
TIMEOUT = 300

_WORKER = r"""
import json, sys
import onnx
from onnx import helper, shape_inference, version_converter
data = sys.stdin.buffer.read()
target = int(sys.argv[1])
m = onnx.ModelProto()
m.ParseFromString(data)
def convert(model):
    return version_converter.convert_version(model, target)
try:
    out = convert(m)
    sys.stdout.buffer.write(b"OK" + out.SerializeToString())
    sys.exit(0)
except Exception as e:
    whole = f"{type(e).__name__}: {e}"
# per node: a one-node model typed from shape inference
try:
    inferred = shape_inference.infer_shapes(m, strict_mode=False)
except Exception:
    inferred = m
g = inferred.graph
types = {v.name: v for v in list(g.value_info) + list(g.input) + list(g.output)}
inits = {t.name: t for t in g.initializer}
consts = {n.output[0]: n for n in g.node if n.op_type == "Constant" and n.output}
failures, seen = [], {}
for k, n in enumerate(g.node):
    if n.domain not in ("", "ai.onnx") or n.op_type == "Constant":
        continue
    label = n.name or f"{n.op_type}({n.output[0] if n.output else k})"
    key = (n.op_type, len(n.input), tuple(sorted(a.SerializeToString() for a in n.attribute)))
    if key in seen:
        if seen[key] is not None:
            failures.append({"node": label, "op": n.op_type, "error": seen[key]})
        continue
    ins, init, nodes = [], [], []
    for i in n.input:
        if not i:
            continue
        if i in inits:
            init.append(inits[i])
        elif i in consts:
            nodes.append(consts[i])
        elif i in types:
            ins.append(types[i])
        else:
            ins.append(helper.make_tensor_value_info(i, onnx.TensorProto.FLOAT, None))
    outs = [types[o] if o in types else
            helper.make_tensor_value_info(o, onnx.TensorProto.FLOAT, None)
            for o in n.output if o]
    one = helper.make_model(helper.make_graph(nodes + [n], "one", ins, outs, init),
                            opset_imports=list(m.opset_import))
    one.ir_version = m.ir_version
    try:
        convert(one)
        seen[key] = None
    except Exception as e:
        msg = str(e)
        msg = msg.split("failed: ", 1)[-1].strip()
        seen[key] = msg[:300]
        failures.append({"node": label, "op": n.op_type, "error": seen[key]})
sys.stdout.buffer.write(b"NO" + json.dumps({"whole": whole[:1000],
                                            "nodes": failures}).encode())
"""


def convert(m: onnx.ModelProto, target: int) -> onnx.ModelProto:
    """``m`` converted to ai.onnx opset ``target`` (a new ModelProto). Raises EditError with a
    per-node report when onnx's converter cannot do it."""
    from workbench.graph.isolated import skeleton  # noqa: PLC0415

    sk = skeleton(m)
    moved = {t.name: t for t in m.graph.initializer}
    kept = {t.name for t in sk.graph.initializer}
    moved = {k: t for k, t in moved.items() if k not in kept}
    try:
        proc = subprocess.run([sys.executable, "-I", "-c", _WORKER, str(int(target))],
                              input=sk.SerializeToString(), capture_output=True,
                              timeout=TIMEOUT)
    except subprocess.TimeoutExpired:
        raise EditError(f"onnx's version converter did not finish in {TIMEOUT} s") from None
    out = proc.stdout
    if proc.returncode != 0 or out[:2] not in (b"OK", b"NO"):
        err = proc.stderr.decode("utf-8", "replace").strip().splitlines()[-3:]
        raise EditError("onnx's version converter crashed on this model (it ran in a child "
                        f"process; this session is unharmed): exit status {proc.returncode}"
                        + (": " + " | ".join(err) if err else ""))
    if out[:2] == b"NO":
        rep = json.loads(out[2:].decode())
        raise EditError(f"onnx's version converter cannot take this model from opset "
                        f"{opset_of(m, '')} to {target}: "
                        f"{rep['whole'].split('failed: ', 1)[-1].strip()}\n"
                        + _report(rep["nodes"]))
    conv = onnx.ModelProto()
    conv.ParseFromString(out[2:])
    # put the weights back: the skeleton had them as inputs
    keep_inputs = [v for v in conv.graph.input if v.name not in moved]
    was_input = {v.name for v in m.graph.input}
    restore = [v for v in conv.graph.input if v.name in moved and v.name in was_input]
    del conv.graph.input[:]
    conv.graph.input.extend(keep_inputs + restore)
    conv.graph.initializer.extend(moved.values())
    try:
        need = helper.find_min_ir_version_for(list(conv.opset_import), True)
        conv.ir_version = max(conv.ir_version, need)
    except Exception:  # noqa: BLE001 - older onnx: keep the converter's choice
        pass
    return conv


def _report(failures: list) -> str:
    """The nodes the converter cannot take, grouped by op and reason."""
    if not failures:
        return ("no node fails alone; the failure comes from how the nodes are connected")
    groups: dict = {}
    for f in failures:
        groups.setdefault((f["op"], f["error"]), []).append(f["node"])
    lines = [f"{len(failures)} node(s) it cannot convert, by op:"]
    for (op, err), nodes in sorted(groups.items(), key=lambda kv: -len(kv[1])):
        shown = ", ".join(repr(x) for x in nodes[:3]) + (f" and {len(nodes) - 3} more"
                                                         if len(nodes) > 3 else "")
        lines.append(f"  {op} ({len(nodes)}: {shown}): {err}")
    return "\n".join(lines)


@edit("set_opset")
def set_opset(d: Draft, ctx, version: int) -> Intent:
    """Convert the model to ai.onnx opset ``version`` with onnx's version converter (checked
    by running before and after); when it cannot, the error lists each node that does not
    convert and why."""
    if not isinstance(version, int) or isinstance(version, bool):
        raise EditError(f"an opset version is an int, got {version!r}")
    newest = onnx.defs.onnx_opset_version()
    if not (1 <= version <= newest):
        raise EditError(f"opset {version} is outside 1..{newest} (onnx {onnx.__version__})")
    old = d.opset("")
    if old is None:
        raise EditError("the model imports no ai.onnx opset")
    if old == version:
        raise EditError(f"the model is at opset {version} already")
    conv = convert(d.model(), version)
    inits = {t.name: t for t in conv.graph.initializer}
    del conv.graph.initializer[:]
    d.m.CopyFrom(conv)
    d.inits = inits
    d.notes.append(f"opset {old} -> {version}")
    return Intent(KEEPS, f"opset {old} -> {version}")
