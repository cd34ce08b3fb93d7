"""Model surgery in a drawing: the actions a viewer offers, and what answers them.

The notebook's :class:`~workbench.widgets.editor.ModelEditor` and the JupyterLab viewer's edit
sessions (:mod:`workbench.labext_edit`, in a worker process) share this module: the same
catalogue of actions (:data:`ACTIONS`, sent to the browser, which builds its menus from it),
the same translation of an action on a node or a value into an edit record
(``session.apply(record)``: the record is what the replay script shows), the same drawing of
the edited model (with what a viewer needs to act on it: the edit reference of every node and
the value every edge carries) and the same marks of what an edit changed.

A request is a JSON-able dict; :meth:`EditController.handle` answers one with a JSON-able
dict (``{"ok": True, ...}`` or ``{"ok": False, "error": message}``). Requests:

- ``{"op": "action", "action": id, "target": {...}, "params": {...}}``: an entry of
  :data:`ACTIONS` on a node (``{"kind": "node", "ref": ...}``), a value (``{"kind": "value"
  | "input" | "output", "value": name}``), two values (``{"kind": "values", "values": [a,
  b]}``) or the model (``{"kind": "model"}``); ``params`` are the form's fields as text;
- ``{"op": "apply", "record": {...}}``: any edit record (``workbench.edit.EDITS``);
- ``{"op": "undo"}``, ``{"op": "redo"}``, ``{"op": "script"}``, ``{"op": "state"}``;
- ``{"op": "compare", "against": "last" | "original" | int}``: the drawings before and after
  with their matched nodes (:func:`~workbench.widgets.compare.match_graphs`);
- ``{"op": "save", "path": ..., "overwrite": bool}``: atomic; an existing file is replaced
  only with ``overwrite`` (the answer says ``"exists": True`` and the viewer asks).

Every string in an answer (names, notes, errors) comes from a model or a user: viewers put
them in the page as text only.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, field

import numpy as np

from workbench.edit import EditError
from workbench.edit.state import node_label
from workbench.errors import WorkbenchError

__all__ = ["ACTIONS", "Drawing", "EditController", "drawing_of"]


def _f(name, label, placeholder="", *, kind="text", default=None, optional=False) -> dict:
    out = {"name": name, "label": label, "kind": kind, "placeholder": placeholder}
    if default is not None:
        out["default"] = default          # filled in by the viewer: "op", "name", "dims", ...
    if optional:
        out["optional"] = True
    return out


_ATTRS_HELP = "alpha=0.1; axes=[0, 1]   (or a JSON object)"

#: What a viewer offers. ``on``: the targets an action applies to (node, input, output,
#: value = an edge, values = two selected values, model); ``fields``: the form asked
#: before applying (text the server parses); ``group``: where the menu puts it.
ACTIONS = [
    # ---- a node
    {"id": "bypass", "label": "Bypass (wire its input to its readers)", "on": ["node"]},
    {"id": "delete", "label": "Delete", "on": ["node"], "danger": True},
    {"id": "delete_downstream", "label": "Delete with everything downstream", "on": ["node"],
     "danger": True},
    {"id": "replace", "label": "Replace op / attributes…", "on": ["node"],
     "fields": [_f("op_type", "op type", "Relu", default="op"),
                _f("attrs", "set attributes", _ATTRS_HELP, optional=True),
                _f("remove_attrs", "remove attributes", "name, name", optional=True)]},
    {"id": "rename_node", "label": "Rename node…", "on": ["node"],
     "fields": [_f("new", "new name", default="name")]},
    {"id": "add_output_node", "label": "Make its output a graph output", "on": ["node"]},
    {"id": "cut_after_node", "label": "Cut after (its outputs become the outputs)",
     "on": ["node"]},
    {"id": "cut_before_node", "label": "Cut before (its inputs become the inputs)",
     "on": ["node"]},
    # ---- a value (an edge), a graph input or output
    {"id": "insert", "label": "Insert a node here…", "on": ["value", "input", "output"],
     "fields": [_f("op_type", "op type", "Relu"),
                _f("attrs", "attributes", _ATTRS_HELP, optional=True),
                _f("name", "node name", "(automatic)", optional=True)]},
    {"id": "add_output", "label": "Make it a graph output…", "on": ["value"],
     "fields": [_f("name", "output name", "(the value's name)", optional=True)]},
    {"id": "rename_value", "label": "Rename…", "on": ["value", "input", "output"],
     "fields": [_f("new", "new name", default="value")]},
    {"id": "remove_output", "label": "Remove this output", "on": ["output"], "danger": True},
    {"id": "set_dims", "label": "Set dims…", "on": ["input", "output"],
     "fields": [_f("dims", "dims", "batch, 3, 224, 224   (? for unknown)", default="dims")]},
    {"id": "cut_after", "label": "Cut after this value (it becomes an output)",
     "on": ["value"]},
    {"id": "cut_before", "label": "Cut before this value (it becomes an input)",
     "on": ["value"]},
    {"id": "extract", "label": "Extract the part between the two values", "on": ["values"]},
    # ---- the model
    {"id": "rebatch", "label": "Re-batch…", "on": ["model", "input"],
     "fields": [_f("batch", "new batch", "8, or a name such as batch", default="batch")]},
    {"id": "set_opset", "label": "Change the opset…", "on": ["model"],
     "fields": [_f("version", "ai.onnx opset", "17", default="opset")]},
    {"id": "set_metadata", "label": "Set metadata…", "on": ["model"],
     "fields": [_f("key", "key", "author"), _f("value", "value", "")]},
    {"id": "compose", "label": "Compose with another model…", "on": ["model"],
     "fields": [_f("path", "model file", "preprocess.onnx"),
                _f("connect", "connect", "its output=our input, ..."),
                _f("prefix", "prefix for its names", "pre/", optional=True),
                _f("before", "put it before this model", kind="check", optional=True)]},
]
_BY_ID = {a["id"]: a for a in ACTIONS}
_IDENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


# ---------------------------------------------------------------------------- parsing
def _text(params: dict, name: str, what: str, *, required: bool = True) -> str | None:
    v = params.get(name)
    if v is None or (isinstance(v, str) and not v.strip()):
        if required:
            raise EditError(f"{what} is needed")
        return None
    if not isinstance(v, str):
        raise EditError(f"{what} is text, got {type(v).__name__}")
    if len(v) > 100_000:
        raise EditError(f"{what} is too long ({len(v):,} characters)")
    return v.strip()


def _json_or_text(v: str):
    try:
        return json.loads(v)
    except ValueError:
        if len(v) >= 2 and v[0] == v[-1] == "'":
            return v[1:-1]
        return v


def parse_attrs(text: str | None) -> dict | None:
    """``alpha=0.1; axes=[0, 1]; mode=constant`` (or a JSON object) -> a dict; each value is
    read as JSON where it can be (numbers, lists, quoted strings), else as text."""
    if text is None:
        return None
    if text.startswith("{"):
        try:
            v = json.loads(text)
        except ValueError as e:
            raise EditError(f"attributes: not a JSON object ({e})") from None
        if not isinstance(v, dict):
            raise EditError("attributes: a JSON object such as {\"alpha\": 0.1}")
        return v
    out = {}
    for part in _split_top(text, ";\n"):
        part = part.strip()
        if not part:
            continue
        if "=" not in part:
            raise EditError(f"attributes are name=value pairs separated by ';' ({_ATTRS_HELP}); "
                            f"{part!r} has no '='")
        k, v = part.split("=", 1)
        k = k.strip()
        if not k:
            raise EditError(f"attributes: {part!r} has no name before '='")
        out[k] = _json_or_text(v.strip())
    return out or None


def _split_top(text: str, seps: str) -> list:
    """``text`` split at ``seps`` outside quotes and brackets (``s="a;b"; axes=[1, 2]``)."""
    parts, cur, depth, quote = [], [], 0, None
    for ch in text:
        if quote:
            quote = None if ch == quote else quote
        elif ch in "\"'":
            quote = ch
        elif ch in "[{(":
            depth += 1
        elif ch in "]})":
            depth = max(0, depth - 1)
        elif ch in seps and depth == 0:
            parts.append("".join(cur))
            cur = []
            continue
        cur.append(ch)
    parts.append("".join(cur))
    return parts


def parse_names(text: str | None) -> list:
    """``a, b`` -> ``["a", "b"]``."""
    if text is None:
        return []
    return [p.strip() for p in text.split(",") if p.strip()]


def parse_dims(text: str) -> list:
    """``batch, 3, 224, 224`` -> ``["batch", 3, 224, 224]`` (``?`` or nothing: unknown)."""
    t = text.strip()
    if t.startswith("[") and t.endswith("]"):
        t = t[1:-1]
    dims = []
    for part in t.split(","):
        p = part.strip().strip("'\"")
        if p in ("", "?", "None", "null"):
            dims.append(None)
        elif re.fullmatch(r"[+]?\d+", p):
            dims.append(int(p))
        else:
            dims.append(p)
    return dims


def _int_or_name(text: str, what: str):
    if re.fullmatch(r"[+-]?\d+", text):
        return int(text)
    return text


def _connect(text: str) -> dict:
    out = {}
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        m = re.match(r"^(.*?)\s*(?:=|->|:)\s*(.*)$", part)
        if not m or not m.group(1) or not m.group(2):
            raise EditError(f"connect is 'output=input' pairs separated by commas; "
                            f"{part!r} is not one")
        out[m.group(1).strip()] = m.group(2).strip()
    if not out:
        raise EditError("connect names at least one 'output=input' pair")
    return out


# ---------------------------------------------------------------------------- the drawing
@dataclass
class Drawing:
    """What a viewer draws for one version of the model: the Graph IR, the builder that
    walked it (for :class:`~workbench.widgets.graph_data.Details`) and the payload, which
    carries, besides :func:`~workbench.widgets.graph_data.graph_payload`'s lists, ``ref``
    (per drawn item: the name an edit uses for it, '' where it cannot be edited),
    ``evalue`` (per edge: the value it carries) and ``marks`` (what the last edit added or
    changed, as item indices, and the labels of what it removed)."""

    graph: object
    builder: object
    data: dict
    details_cache: dict = field(default_factory=dict)

    def details(self):
        from workbench.widgets.graph_data import Details  # noqa: PLC0415
        d = self.details_cache.get("d")
        if d is None:
            d = self.details_cache["d"] = Details(self.graph, self.builder)
        return d


def _graph_of(state, weights: bool):
    """The Graph IR of a ModelState. ``weights=False``: tensors above a few KiB are
    described (dtype and shape), not converted: what a drawing needs, at the cost of the
    skeleton alone (the edit worker holds the weights once, not twice)."""
    from workbench.arrays.dtypes import np_dtype_of_onnx  # noqa: PLC0415
    from workbench.graph.external import UnreadTensor  # noqa: PLC0415
    from workbench.graph.load import load  # noqa: PLC0415
    if weights:
        return load(state.model(), check=False).graph
    light = state.light()
    kept = {t.name for t in light.graph.initializer}
    big = {n: t for n, t in state.initializers.items() if n not in kept}
    g = load(light, check=False).graph
    g.inputs = [v for v in g.inputs if v.name not in big]
    for name, t in big.items():
        try:
            dt = np_dtype_of_onnx(t.data_type)
        except (TypeError, KeyError, ValueError):
            dt = np.dtype("uint8")
        g.initializers[name] = UnreadTensor(t.dims, dt, "the edit session", 0, t.ByteSize(),
                                            f"initializer {name!r}")
    return g


def drawing_of(state, *, weights: bool = True, marks: dict | None = None) -> Drawing:
    """The :class:`Drawing` of a ``ModelState`` (``marks``: labels of nodes added, changed,
    removed, as in ``step.changes``)."""
    from workbench.widgets.graph_data import build_drawing, graph_payload  # noqa: PLC0415
    graph = _graph_of(state, weights)
    builder = build_drawing(graph)
    data = graph_payload(graph, builder=builder)
    sk = state.skeleton.graph
    # the name an edit uses for a node: its name when unique, else its first output
    counts: dict = {}
    for n in sk.node:
        if n.name:
            counts[n.name] = counts.get(n.name, 0) + 1
    by_output = {}
    for n in sk.node:
        for o in n.output:
            if o:
                by_output[o] = n
    refs = []
    for i, kind in enumerate(builder.kind):
        if kind != 0:
            refs.append(builder.name[i])
            continue
        if builder.owner_graph[i] is not graph:
            refs.append("")                  # inside an If/Loop/Scan body
            continue
        n = by_output.get(builder.first_out[i])
        if n is None:
            refs.append("")                  # from an inlined function
        elif n.name and counts.get(n.name) == 1:
            refs.append(n.name)
        else:
            refs.append(next((o for o in n.output if o), ""))
    data["ref"] = refs
    data["evalue"] = list(builder.edge_value)
    data["marks"] = _marks(state, builder, graph, marks or {})
    return Drawing(graph, builder, data)


def _marks(state, builder, graph, spec: dict) -> dict:
    """Labels (``step.changes``'s) -> item indices of the drawing (a folded node: the node it
    is folded into)."""
    index = {}
    for i, kind in enumerate(builder.kind):
        if kind == 0 and builder.owner_graph[i] is graph:
            index.setdefault(builder.first_out[i], i)
    label_out = {}
    for k, n in enumerate(state.skeleton.graph.node):
        label_out[node_label(n, k)] = next((o for o in n.output if o), None)

    def items(labels):
        out = []
        for lab in labels or []:
            i = index.get(label_out.get(lab))
            if i is None:
                continue
            h = builder.host[i]
            i = h if h >= 0 else i
            if i not in out:
                out.append(i)
        return out
    return {"added": items(spec.get("added")), "changed": items(spec.get("changed")),
            "removed": list(spec.get("removed") or [])[:50],
            "removed_count": len(spec.get("removed") or [])}


# ---------------------------------------------------------------------------- answers
def _step_summary(step) -> dict:
    notes = list(step.notes) + [n for n in step.check.notes if n not in step.notes]
    return {"index": step.index, "edit": step.edit, "call": step.call(),
            "check": step.check.summary(), "ok": bool(step.check.ok), "notes": notes[:12],
            "more_notes": max(0, len(notes) - 12)}


def _change_spec(what: str, step) -> dict:
    c = step.changes
    if what == "undo":      # the step taken back: what it added is gone, what it removed back
        return {"added": c["nodes_removed"], "changed": c["nodes_changed"],
                "removed": c["nodes_added"]}
    return {"added": c["nodes_added"], "changed": c["nodes_changed"],
            "removed": c["nodes_removed"]}


class EditController:
    """Answers a viewer's requests over one :class:`~workbench.edit.EditSession`.

    ``resolve(path, purpose) -> full path``: how a path in a request becomes a file
    (``purpose``: "save" or "model"); the JupyterLab worker confines it to the server's root
    and raises for anything outside. ``shown(text) -> text``: what a path-bearing message
    looks like to the user (the worker makes server paths relative to the root)."""

    def __init__(self, session, *, name: str = "model", resolve=None, shown=None,
                 default_save: str | None = None):
        self.session = session
        self.name = name
        self.resolve = resolve or (lambda p, purpose: p)
        self.shown = shown or (lambda t: t)
        self.default_save = default_save
        self.last_change: tuple | None = None      # (what, step) of the last edit/undo/redo
        self._saved_state = session.state_at(-1)   # the version on disk (as opened, saved)
        session.on_change(self._note)

    def _note(self, session, what, step) -> None:
        self.last_change = (what, step)

    # ------------------------------------------------------------------ the view
    def change_spec(self) -> dict:
        if self.last_change is None:
            return {}
        return _change_spec(*self.last_change)

    def drawing(self, *, weights: bool = True, index: int | None = None,
                marks: bool = True) -> Drawing:
        """The drawing of the edited model (``index``: of another version, no marks)."""
        s = self.session
        state = s.state_at(-1 if index is None else index)
        spec = self.change_spec() if marks and index is None else {}
        return drawing_of(state, weights=weights, marks=spec)

    def state(self) -> dict:
        """What the edit bar shows: the edits in effect and undone, what the last one did."""
        s = self.session
        steps = s.steps
        last = None
        if self.last_change is not None:
            what, step = self.last_change
            last = {"what": what, **_step_summary(step)}
        return {
            "source": self.name,
            "nodes": len(s.state_at(-1).skeleton.graph.node),
            "steps": [_step_summary(st) for st in steps],
            "undone": [_step_summary(st) for st in s.undone],
            "can_undo": s.can_undo(), "can_redo": s.can_redo(),
            "last": last,
            "unsaved": s.state_at(-1) is not self._saved_state,
            "opset": next((int(o.version) for o in s.state_at(-1).skeleton.opset_import
                           if o.domain in ("", "ai.onnx")), None),
            "save_path": self.shown(self.default_save or self.session.source or ""),
            "actions": ACTIONS,
        }

    # ------------------------------------------------------------------ requests
    def handle(self, req) -> dict:
        """Answer one request (see the module docs); never raises for a refused edit."""
        try:
            if not isinstance(req, dict):
                raise EditError("a request is a JSON object")
            op = req.get("op")
            fn = getattr(self, f"_op_{op}", None) if isinstance(op, str) and \
                _IDENT.match(op) else None
            if fn is None:
                raise EditError(f"unknown request {op!r}; the requests are: action, apply, "
                                f"undo, redo, script, state, compare, save")
            return fn(req)
        except (EditError, WorkbenchError) as e:
            return {"ok": False, "error": self.shown(str(e))}
        except FileExistsError as e:
            return {"ok": False, "exists": True, "error": self.shown(str(e))}
        except OSError as e:
            return {"ok": False, "error": self.shown(f"{e.strerror or e}: "
                                                     f"{e.filename or ''}".rstrip(": "))}

    def _changed(self, extra: dict | None = None) -> dict:
        out = {"ok": True, "changed": True, "state": self.state()}
        if extra:
            out.update(extra)
        return out

    def _op_state(self, req) -> dict:
        return self._changed()

    def _op_undo(self, req) -> dict:
        self.session.undo()
        return self._changed()

    def _op_redo(self, req) -> dict:
        self.session.redo()
        return self._changed()

    def _op_script(self, req) -> dict:
        return {"ok": True, "script": self.shown(self.session.script())}

    def _op_apply(self, req) -> dict:
        rec = req.get("record")
        if not isinstance(rec, dict):
            raise EditError("'apply' needs a record: {'edit': name, 'args': {...}}")
        self.session.apply(self._confined(rec))
        return self._changed()

    def _op_action(self, req) -> dict:
        action = req.get("action")
        spec = _BY_ID.get(action) if isinstance(action, str) else None
        if spec is None:
            raise EditError(f"unknown action {action!r}; the actions are: "
                            f"{', '.join(a['id'] for a in ACTIONS)}")
        target = req.get("target") or {"kind": "model"}
        params = req.get("params") or {}
        if not isinstance(target, dict) or not isinstance(params, dict):
            raise EditError("an action's target and params are JSON objects")
        kind = target.get("kind")
        if kind not in spec["on"]:
            raise EditError(f"{spec['label'].rstrip('…')} applies to "
                            f"{' or '.join(spec['on'])}, not to {kind!r}")
        record = getattr(self, f"_rec_{action}")(target, params)
        self.session.apply(self._confined(record))
        return self._changed()

    def _op_compare(self, req) -> dict:
        """Both drawings and their matches (the JupyterLab viewer draws them side by side)."""
        from workbench.widgets.compare import match_graphs  # noqa: PLC0415
        k, title = self.compare_index(req.get("against", "last"))
        before = self.drawing(weights=False, index=k, marks=False)
        after = self.drawing(weights=False, marks=False)
        matches = match_graphs(before.data, after.data)
        left = {a for a, _ in matches}
        right = {b for _, b in matches}

        def ops(d):
            return [n for n, op, kk, h in zip(d["name"], d["op"], d["kind"], d["host"])
                    if kk == 0 and h == -1]
        return {"ok": True, "compare": {
            "titles": [title, "now"],
            "before": before.data, "after": after.data,
            "before_details": before.details().all(), "after_details": after.details().all(),
            "matches": matches,
            "only_left": [n for n in ops(before.data) if n not in left],
            "only_right": [n for n in ops(after.data) if n not in right]}}

    def compare_index(self, against) -> tuple:
        """(version index, title) for "last" (before the last edit), "original" or a step
        number (before that step)."""
        n = len(self.session.steps)
        if n == 0:
            raise EditError("nothing to compare yet: make an edit first")
        if against in (None, "last"):
            return n - 1, f"before edit {n}"
        if against == "original":
            return 0, "original"
        if isinstance(against, int) and not isinstance(against, bool) and 1 <= against <= n:
            return against - 1, f"before edit {against}"
        raise EditError(f"compare against 'last', 'original' or an edit 1 .. {n}, "
                        f"not {against!r}")

    def _op_save(self, req) -> dict:
        path = req.get("path") or self.default_save or self.session.source
        if not isinstance(path, str) or not path.strip():
            raise EditError("save needs a file name")
        full = self.resolve(path.strip(), "save")
        overwrite = req.get("overwrite") is True
        if not overwrite and os.path.exists(full):
            raise FileExistsError(f"{path.strip()} exists already: replace it?")
        written = self.session.save(full, overwrite=overwrite)
        self._saved_state = self.session.state_at(-1)
        n = len(self.session.steps)
        return {"ok": True, "saved": self.shown(os.fspath(written)), "state": self.state(),
                "message": self.shown(f"saved the model with {n} edit(s) to {path.strip()}")}

    # ------------------------------------------------------------------ paths
    def _confined(self, record: dict) -> dict:
        """The record with every other model's path (compose) through ``resolve``."""
        def walk(v):
            if isinstance(v, dict):
                if set(v) == {"__model__"} and isinstance(v["__model__"], dict) and \
                        isinstance(v["__model__"].get("path"), str):
                    return {"__model__": {**v["__model__"],
                                          "path": self.resolve(v["__model__"]["path"],
                                                               "model")}}
                return {k: walk(x) for k, x in v.items()}
            if isinstance(v, list):
                return [walk(x) for x in v]
            return v
        return walk(record)

    # ------------------------------------------------------------------ actions -> records
    def _node(self, target) -> str:
        ref = target.get("ref")
        if not isinstance(ref, str) or not ref:
            raise EditError("this node cannot be edited here (it is inside an If/Loop/Scan "
                            "body or comes from an inlined function): edit the node that "
                            "holds it")
        return ref

    def _value(self, target) -> str:
        v = target.get("value")
        if not isinstance(v, str) or not v:
            raise EditError("no value chosen: click an edge (a value) first")
        return v

    def _proto_node(self, ref: str):
        d = self.session.state_at(-1).draft()
        return d, d.find_node(ref)

    def _rec_bypass(self, t, p):
        return {"edit": "bypass_node", "args": {"node": self._node(t)}}

    def _rec_delete(self, t, p):
        return {"edit": "delete_node", "args": {"node": self._node(t)}}

    def _rec_delete_downstream(self, t, p):
        return {"edit": "delete_node", "args": {"node": self._node(t), "downstream": True}}

    def _rec_replace(self, t, p):
        node = self._node(t)
        _, n = self._proto_node(node)
        args: dict = {"node": node}
        op = _text(p, "op_type", "the op type", required=False)
        if op is not None and op != n.op_type:
            args["op_type"] = op
        attrs = parse_attrs(_text(p, "attrs", "the attributes", required=False))
        if attrs:
            args["attrs"] = attrs
        rm = parse_names(_text(p, "remove_attrs", "the attributes to remove", required=False))
        if rm:
            args["remove_attrs"] = rm
        if len(args) == 1:
            raise EditError("nothing to change: give another op type, attributes to set or "
                            "attributes to remove")
        return {"edit": "replace_node", "args": args}

    def _rec_rename_node(self, t, p):
        return {"edit": "rename_node", "args": {"node": self._node(t),
                                                 "new": _text(p, "new", "the new name")}}

    def _rec_add_output_node(self, t, p):
        _, n = self._proto_node(self._node(t))
        outs = [o for o in n.output if o]
        if not outs:
            raise EditError("this node has no output")
        return {"edit": "add_output", "args": {"value": outs[0]}}

    def _rec_cut_after_node(self, t, p):
        _, n = self._proto_node(self._node(t))
        outs = [o for o in n.output if o]
        if not outs:
            raise EditError("this node has no output")
        return {"edit": "cut_after", "args": {"values": outs}}

    def _rec_cut_before_node(self, t, p):
        d, n = self._proto_node(self._node(t))
        # the data inputs: not weights, not computed from constants and shapes alone
        from workbench.ops import registry  # noqa: PLC0415
        static = set(d.inits)
        for m in d.g.node:
            ins = [i for i in m.input if i]
            if all(i in static for i in ins) or registry.facts(m.op_type, m.domain).shape_only:
                static.update(o for o in m.output if o)
        ins = [i for i in n.input if i and i not in static]
        if not ins:
            raise EditError(f"node {n.name or n.op_type!r} reads only weights and constants: "
                            f"nothing to cut before")
        return {"edit": "cut_before", "args": {"values": list(dict.fromkeys(ins))}}

    def _rec_insert(self, t, p):
        args = {"value": self._value(t), "op_type": _text(p, "op_type", "the op type")}
        attrs = parse_attrs(_text(p, "attrs", "the attributes", required=False))
        if attrs:
            args["attrs"] = attrs
        name = _text(p, "name", "the node name", required=False)
        if name:
            args["name"] = name
        return {"edit": "insert_node", "args": args}

    def _rec_add_output(self, t, p):
        args = {"value": self._value(t)}
        name = _text(p, "name", "the output name", required=False)
        if name and name != args["value"]:
            args["name"] = name
        return {"edit": "add_output", "args": args}

    def _rec_rename_value(self, t, p):
        edit = {"input": "rename_input", "output": "rename_output"}.get(t.get("kind"),
                                                                         "rename_value")
        return {"edit": edit, "args": {"old": self._value(t),
                                       "new": _text(p, "new", "the new name")}}

    def _rec_remove_output(self, t, p):
        return {"edit": "remove_output", "args": {"name": self._value(t)}}

    def _rec_set_dims(self, t, p):
        return {"edit": "set_dims", "args": {"value": self._value(t),
                                             "dims": parse_dims(_text(p, "dims", "the dims"))}}

    def _rec_cut_after(self, t, p):
        return {"edit": "cut_after", "args": {"values": [self._value(t)]}}

    def _rec_cut_before(self, t, p):
        return {"edit": "cut_before", "args": {"values": [self._value(t)]}}

    def _rec_extract(self, t, p):
        vals = t.get("values")
        if not isinstance(vals, list) or len(vals) != 2 or not all(
                isinstance(v, str) and v for v in vals) or vals[0] == vals[1]:
            raise EditError("extract needs two different values: click an edge, then "
                            "shift-click another")
        d = self.session.state_at(-1).draft()
        pos = {}
        for k, n in enumerate(d.g.node):
            for o in n.output:
                if o:
                    pos.setdefault(o, k)
        a, b = sorted(vals, key=lambda v: pos.get(v, -1))
        return {"edit": "extract", "args": {"inputs": [a], "outputs": [b]}}

    def _rec_rebatch(self, t, p):
        return {"edit": "rebatch",
                "args": {"batch": _int_or_name(_text(p, "batch", "the batch"), "the batch")}}

    def _rec_set_opset(self, t, p):
        v = _text(p, "version", "the opset version")
        if not re.fullmatch(r"\d+", v):
            raise EditError(f"the opset version is a whole number, not {v!r}")
        return {"edit": "set_opset", "args": {"version": int(v)}}

    def _rec_set_metadata(self, t, p):
        return {"edit": "set_metadata", "args": {"key": _text(p, "key", "the key"),
                                                 "value": _text(p, "value", "the value",
                                                                required=False) or ""}}

    def _rec_compose(self, t, p):
        path = _text(p, "path", "the other model's file")
        args = {"other": {"__model__": {"path": path}},
                "connect": _connect(_text(p, "connect", "connect"))}
        prefix = _text(p, "prefix", "the prefix", required=False)
        if prefix:
            args["prefix"] = prefix
        if p.get("before") in (True, "true", "on", "1"):
            args["before"] = True
        return {"edit": "compose", "args": args}
