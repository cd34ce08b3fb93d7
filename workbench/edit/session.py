"""The edit session: a model, the edits made to it (each checked), undo/redo, the replay
script and saving.

>>> from workbench import edit
>>> s = edit.open("workbench/data/default_model.onnx")     # doctest: +SKIP
>>> s.cut_after("/10/Flatten_output_0")                     # doctest: +SKIP
>>> s.rebatch(8)                                            # doctest: +SKIP
>>> print(s.script())                                       # doctest: +SKIP
>>> s.save("features.onnx")                                 # doctest: +SKIP

Every edit is a record (``{"edit": name, "args": {...}}``, JSON-able): the methods below build
one and call :meth:`EditSession.apply`, which is also what a viewer calls with the records it
receives. An edit works on a copy; when it is refused (a bad request, or an edited model that
fails its checks) the session is unchanged.
"""

from __future__ import annotations

import html
import os

import onnx

from workbench.edit import records
from workbench.edit.errors import EditError
from workbench.edit.records import ModelRef
from workbench.edit.registry import EDITS, Context, parameters, validate
from workbench.edit.state import ModelState, node_label
from workbench.edit.verify import KEEPS, Check, Checker, Samples, refresh_outputs
from workbench.errors import ModelLoadError, WorkbenchError

CHECK_MODES = ("run", "static")


class Step:
    """One edit: its record, the model it produced, its check and what it changed."""

    def __init__(self, index: int, record: dict, state: ModelState, check: Check,
                 notes: list, changes: dict):
        self.index = index
        self.record = record
        self.state = state
        self.check = check
        self.notes = notes
        self.changes = changes
        self.rewrites: list = []   # re-shape: every constant rewritten (the notes show some)

    @property
    def edit(self) -> str:
        return self.record["edit"]

    def call(self, short: bool = True) -> str:
        """The edit as a line of Python (as in the replay script; ``short``: big arrays shown
        as their dtype and shape)."""
        return records.call_line("session", self.record, {}, short=short)

    def to_dict(self) -> dict:
        """JSON-able: the record, the check, the notes and the changes."""
        return {"index": self.index, "record": self.record, "check": self.check.to_dict(),
                "notes": list(self.notes), "changes": self.changes,
                "rewrites": list(self.rewrites)}

    def __repr__(self) -> str:
        text = f"[{self.index}] {self.call()}\n    checked: {self.check.summary()}"
        for n in self.check.notes + self.notes:
            text += f"\n    {n}"
        return text


class EditSession:
    """An edit session over one model (see the module docstring and ``docs/architecture.md``).

    ``inputs``: sample inputs (by name) for the run checks; ``dims``: sizes of symbolic dims
    for generated inputs; ``check``: "run" (default: onnx.checker, shape inference and runs
    before/after) or "static" (checker and shape inference only, for models the engine cannot
    run); ``models``: ModelProtos that records name by reference (``{"model_1": proto}``, for
    replaying records of a session that composed an in-memory model)."""

    def __init__(self, model, *, inputs: dict | None = None, dims: dict | None = None,
                 check: str = "run", models: dict | None = None):
        if check not in CHECK_MODES:
            raise EditError(f"check is one of {CHECK_MODES}, got {check!r}")
        self.source = os.fspath(model) if isinstance(model, (str, os.PathLike)) else None
        proto = _load(model)
        self._states = [ModelState.of(proto)]
        self._steps: list[Step] = []
        self._pos = 0
        self.check_mode = check
        self.models: dict = {}     # ref -> ModelProto used by compose
        for ref, m in (models or {}).items():
            if not records._IDENT.match(str(ref)) or not isinstance(m, onnx.ModelProto):
                raise EditError(f"models maps Python names to onnx.ModelProtos; got {ref!r}")
            self.models[ref] = m
        self.checker = Checker(Samples(inputs, dims))
        self._listeners: list = []

    def on_change(self, fn, *, remove: bool = False) -> None:
        """Call ``fn(session, what, step)`` after every edit, undo and redo (``what`` is
        "apply", "undo" or "redo"); ``remove=True`` stops calling it. Viewers use this to
        redraw when code edits the session they show."""
        if remove:
            self._listeners = [f for f in self._listeners if f != fn]
        elif fn not in self._listeners:
            self._listeners.append(fn)

    def _changed(self, what: str, step) -> None:
        for fn in list(self._listeners):
            try:
                fn(self, what, step)
            except Exception as e:  # noqa: BLE001 - a viewer's failure is not the edit's
                import warnings  # noqa: PLC0415
                warnings.warn(f"a listener of the edit session failed after {what}: "
                              f"{type(e).__name__}: {e}", RuntimeWarning, stacklevel=3)

    # ------------------------------------------------------------------ state
    @property
    def model(self) -> onnx.ModelProto:
        """The edited model (a new ModelProto each time)."""
        return self._states[self._pos].model()

    @property
    def original(self) -> onnx.ModelProto:
        return self._states[0].model()

    def model_at(self, index: int) -> onnx.ModelProto:
        """The model after the first ``index`` edits in effect: ``model_at(0)`` is the
        original, ``model_at(len(session.steps))`` (or ``-1``) the edited model, ``-2`` the
        model before the last edit (a new ModelProto each time)."""
        return self.state_at(index).model()

    def state_at(self, index: int) -> ModelState:
        """The :class:`~workbench.edit.state.ModelState` behind :meth:`model_at`."""
        n = self._pos
        if isinstance(index, bool) or not isinstance(index, int):
            raise EditError(f"a version of the model is an int (0 .. {n}, or negative from "
                            f"the end), got {index!r}")
        k = index if index >= 0 else n + 1 + index
        if not 0 <= k <= n:
            raise EditError(f"the session has versions 0 .. {n} (the original and one after "
                            f"each of the {n} edit(s) in effect), not {index}")
        return self._states[k]

    @property
    def steps(self) -> list:
        """The edits in effect (undone ones excluded), oldest first."""
        return self._steps[:self._pos]

    @property
    def undone(self) -> list:
        """The edits undone and not dropped since (``redo`` brings them back, first first)."""
        return self._steps[self._pos:]

    def records(self) -> list:
        """The records of the edits in effect (JSON-able dicts)."""
        return [s.record for s in self.steps]

    def can_undo(self) -> bool:
        return self._pos > 0

    def can_redo(self) -> bool:
        return self._pos < len(self._steps)

    def undo(self) -> Step:
        """Take back the last edit (``redo`` brings it back)."""
        if not self.can_undo():
            raise EditError("nothing to undo")
        self._pos -= 1
        step = self._steps[self._pos]
        self._changed("undo", step)
        return step

    def redo(self) -> Step:
        if not self.can_redo():
            raise EditError("nothing to redo")
        self._pos += 1
        step = self._steps[self._pos - 1]
        self._changed("redo", step)
        return step

    # ------------------------------------------------------------------ applying
    def apply(self, record: dict) -> Step:
        """Make the edit a record describes (``{"edit": name, "args": {...}, "check": mode}``);
        returns the Step. Raises EditError (the session unchanged) when it is refused."""
        name, args, mode = self._parse(record)
        validate(name, args)
        decoded = records.decode(args, self.models)
        before = self._states[self._pos]
        draft = before.draft()
        ctx = Context(self.checker, before)
        try:
            intent = EDITS[name](draft, ctx, **decoded)
        except EditError:
            raise
        except (WorkbenchError, onnx.checker.ValidationError, ValueError, TypeError,
                KeyError, IndexError) as e:
            raise EditError(f"{name} failed: {type(e).__name__}: {e}") from e
        notes = list(draft.notes)
        if intent.kind != KEEPS:
            notes += refresh_outputs(draft, self.checker.samples)
        after = draft.state()
        check = self.checker.check(before, after, intent, mode)
        rec = {"edit": name, "args": args}
        if record.get("check") is not None:
            rec["check"] = mode
        step = Step(self._pos + 1, rec, after, check, notes, _changes(before, after))
        step.rewrites = list(intent.rewrites)
        del self._steps[self._pos:]
        del self._states[self._pos + 1:]
        self._steps.append(step)
        self._states.append(after)
        self._pos += 1
        self._changed("apply", step)
        return step

    def _parse(self, record) -> tuple:
        if not isinstance(record, dict) or not isinstance(record.get("edit"), str):
            raise EditError(f"an edit record is {{'edit': name, 'args': {{...}}}}, got "
                            f"{record!r:.200}")
        extra = set(record) - {"edit", "args", "check"}
        if extra:
            raise EditError(f"unknown record field(s) {sorted(extra)}")
        args = record.get("args", {})
        if not isinstance(args, dict):
            raise EditError("a record's 'args' is a dict")
        mode = record.get("check") or self.check_mode
        if mode not in CHECK_MODES:
            raise EditError(f"check is one of {CHECK_MODES}, got {mode!r}")
        return record["edit"], args, mode

    def _do(self, edit_name: str, check=None, /, **args) -> Step:
        defaults = parameters(edit_name)
        args = {k: v for k, v in args.items()   # the record holds what differs from defaults
                if not (k in defaults and _is_default(v, defaults[k]))}
        rec = {"edit": edit_name, "args": records.encode(args)}
        if check is not None:
            rec["check"] = check
        return self.apply(rec)

    def _model_arg(self, other):
        if isinstance(other, onnx.ModelProto):
            for ref, m in self.models.items():
                if m is other:
                    return ModelRef(ref=ref, proto=other)
            ref = f"model_{len(self.models) + 1}"
            self.models[ref] = other
            return ModelRef(ref=ref, proto=other)
        if isinstance(other, (str, os.PathLike)):
            return ModelRef(path=os.fspath(other))
        raise EditError(f"another model is a path or an onnx.ModelProto, got "
                        f"{type(other).__name__}")

    # ------------------------------------------------------------------ the edits
    def delete_node(self, node: str, *, downstream: bool = False, check=None) -> Step:
        """Delete a node (``downstream=True``: and everything that depends on it)."""
        return self._do("delete_node", check, node=node, downstream=downstream)

    def bypass_node(self, node: str, *, input: int = 0, output: int = 0, check=None) -> Step:
        """Remove a node, wiring its input to its output's readers."""
        return self._do("bypass_node", check, node=node, input=input, output=output)

    def insert_node(self, value: str, op_type: str, *, inputs=None, attrs=None, name=None,
                    domain: str = "", position: int = 0, readers=None, output=None,
                    check=None) -> Step:
        """Insert a node on the edge ``value`` (see ``workbench.edit.edits.insert_node``)."""
        return self._do("insert_node", check, value=value, op_type=op_type, inputs=inputs,
                        attrs=attrs, name=name, domain=domain, position=position,
                        readers=readers, output=output)

    def replace_node(self, node: str, *, op_type=None, attrs=None, remove_attrs=None,
                     domain=None, inputs=None, check=None) -> Step:
        """Change a node's op type, attributes, domain or inputs."""
        return self._do("replace_node", check, node=node, op_type=op_type, attrs=attrs,
                        remove_attrs=remove_attrs, domain=domain, inputs=inputs)

    def rename_node(self, node: str, new: str, *, check=None) -> Step:
        return self._do("rename_node", check, node=node, new=new)

    def rename_value(self, old: str, new: str, *, check=None) -> Step:
        """Rename a value everywhere (inputs, outputs, initializers included)."""
        return self._do("rename_value", check, old=old, new=new)

    def rename_input(self, old: str, new: str, *, check=None) -> Step:
        return self._do("rename_input", check, old=old, new=new)

    def rename_output(self, old: str, new: str, *, check=None) -> Step:
        return self._do("rename_output", check, old=old, new=new)

    def add_output(self, value: str, *, name=None, check=None) -> Step:
        """Make ``value`` a graph output (``name``: under another name)."""
        return self._do("add_output", check, value=value, name=name)

    def remove_output(self, name: str, *, check=None) -> Step:
        return self._do("remove_output", check, name=name)

    def extract(self, inputs, outputs, *, check=None) -> Step:
        """Keep the part between the values ``inputs`` and ``outputs``."""
        return self._do("extract", check, inputs=_names(inputs), outputs=_names(outputs))

    def cut_after(self, values, *, check=None) -> Step:
        """Cut off what follows ``values`` (they become the outputs)."""
        return self._do("cut_after", check, values=_names(values))

    def cut_before(self, values, *, check=None) -> Step:
        """Cut off what precedes ``values`` (they become inputs)."""
        return self._do("cut_before", check, values=_names(values))

    def compose(self, other, connect: dict, *, prefix: str = "", before: bool = False,
                keep_outputs: bool = False, check=None) -> Step:
        """Join another model (a path or a ModelProto) after this one (``before=True``:
        before it), ``connect = {output: input}``."""
        return self._do("compose", check, other=self._model_arg(other), connect=connect,
                        prefix=prefix, before=before, keep_outputs=keep_outputs)

    def set_initializer(self, name: str, value, *, check=None) -> Step:
        """Replace an initializer's (or a Constant's) value with a numpy array."""
        return self._do("set_initializer", check, name=name, value=value)

    def convert_initializers(self, dtype: str, *, names=None, keep_type: bool = True,
                             axis=None, min_elements: int = 16, check=None) -> Step:
        """Store initializers as float16/bfloat16/int8/uint8 (or any dtype, keep_type=False)."""
        return self._do("convert_initializers", check, dtype=dtype,
                        names=_names(names) if names is not None else None,
                        keep_type=keep_type, axis=axis, min_elements=min_elements)

    def set_metadata(self, key: str, value: str, *, check=None) -> Step:
        return self._do("set_metadata", check, key=key, value=value)

    def remove_metadata(self, key: str, *, check=None) -> Step:
        return self._do("remove_metadata", check, key=key)

    def set_opset(self, version: int, *, check=None) -> Step:
        """Convert to another ai.onnx opset (onnx's version converter)."""
        return self._do("set_opset", check, version=version)

    def set_dims(self, value: str, dims, *, check=None) -> Step:
        """Declare an input's or output's dims (ints fixed, strings symbolic, None unknown);
        baked constants are not touched (see ``reshape_inputs`` and ``rebatch``)."""
        return self._do("set_dims", check, value=value, dims=list(dims))

    def reshape_inputs(self, shapes: dict, *, batch_axis=None, check=None) -> Step:
        """New input shapes ({input: dims}), rewriting the constants baked from the old ones."""
        return self._do("reshape_inputs", check, shapes={k: list(v) for k, v in shapes.items()},
                        batch_axis=batch_axis)

    def rebatch(self, batch, *, inputs=None, axis: int = 0, check=None) -> Step:
        """A new batch size (an int, or a name for a symbolic batch), rewriting the constants
        baked from the old one; checked sample by sample against the model before."""
        return self._do("rebatch", check, batch=batch,
                        inputs=_names(inputs) if inputs is not None else None, axis=axis)

    # ------------------------------------------------------------------ using the result
    def run(self, inputs) -> dict:
        """Run the edited model in the engine; the outputs by name."""
        from workbench.edit.verify import run  # noqa: PLC0415
        m = self.model
        if not isinstance(inputs, dict):
            inputs = [inputs] if not isinstance(inputs, (list, tuple)) else list(inputs)
            names = [v.name for v in m.graph.input
                     if v.name not in {t.name for t in m.graph.initializer}]
            inputs = dict(zip(names, inputs))
        return run(m, inputs, optimize=True)

    def save(self, path, *, overwrite: bool = False, external_data: bool | None = None) -> str:
        """Write the edited model to ``path`` atomically (never over an existing file unless
        ``overwrite``). Weights go to ``<file>.data`` beside it with ``external_data=True``, and
        by default when the model is over 2 GB."""
        from workbench.edit.saving import save  # noqa: PLC0415
        return save(self.model, path, overwrite=overwrite, external_data=external_data)

    def script(self, *, var: str = "session", save_to: str | None = None) -> str:
        """Plain Python that replays the edits in effect on the original model."""
        if not records._IDENT.match(var):
            raise EditError(f"{var!r} is not a Python name")
        used = [ref for s in self.steps for ref in _refs(s.record["args"])]
        head = ["# Replays an ONNX Workbench edit session: each line is one edit, checked as",
                "# it runs (onnx.checker, shape inference, and running before and after).",
                "import numpy as np  # noqa: F401  (arrays given to edits)",
                "",
                "from workbench import edit",
                ""]
        if self.source is None:
            head.insert(2, "# 'original' is the onnx.ModelProto the session was opened on "
                        "(it did not come from a file): define it before running this.")
        for ref in dict.fromkeys(used):
            head.insert(2, f"# {ref!r} is the onnx.ModelProto given to compose (not from a "
                        "file): define it before running this.")
        src = records.literal(self.source, {}) if self.source is not None else "original"
        opts = "" if self.check_mode == "run" else f", check={self.check_mode!r}"
        lines = head + [f"{var} = edit.open({src}{opts})"]
        for s in self.steps:
            lines.append(records.call_line(var, s.record, {}, self.models))
        lines.append(f"model = {var}.model")
        if save_to is not None:
            lines.append(f"{var}.save({records.literal(os.fspath(save_to), {})})")
        return "\n".join(lines) + "\n"

    # ------------------------------------------------------------------ display
    def __repr__(self) -> str:
        m = self._states[self._pos].skeleton
        where = repr(self.source) if self.source is not None else "in-memory model"
        head = (f"EditSession({where}): {len(m.graph.node)} nodes, "
                f"{len(self.steps)} edit(s)" + (f", {len(self._steps) - self._pos} undone"
                                                if self.can_redo() else ""))
        return "\n".join([head] + [repr(s) for s in self.steps])

    def _repr_html_(self) -> str:
        esc = html.escape
        rows = []
        for s in self.steps:
            ok = "&#10003;" if s.check.ok else "&#10007;"
            notes = "".join(f"<div style='color:#666'>{esc(n)}</div>" for n in s.notes)
            rows.append(f"<tr><td>{s.index}</td><td><code>{esc(s.call())}</code>{notes}</td>"
                        f"<td>{ok} {esc(s.check.summary())}</td></tr>")
        m = self._states[self._pos].skeleton
        title = esc(f"{self.source or 'model'}: {len(m.graph.node)} nodes, "
                    f"{len(self.steps)} edit(s)")
        return (f"<div><b>EditSession</b> {title}<table><tr><th>#</th><th>edit</th>"
                f"<th>check</th></tr>{''.join(rows)}</table></div>")


def _is_default(v, default) -> bool:
    import inspect  # noqa: PLC0415
    if default is inspect.Parameter.empty:
        return False
    return type(v) is type(default) and v == default if default is not None else v is None


def _names(v) -> list:
    if isinstance(v, str):
        return [v]
    return list(v)


def _refs(value) -> list:
    out = []
    if isinstance(value, dict):
        if set(value) == {"__model__"} and isinstance(value["__model__"], dict) and \
                "ref" in value["__model__"]:
            return [value["__model__"]["ref"]]
        for v in value.values():
            out += _refs(v)
    elif isinstance(value, list):
        for v in value:
            out += _refs(v)
    return out


def _load(model) -> onnx.ModelProto:
    from workbench.graph.load import load  # noqa: PLC0415
    try:
        loaded = load(model, check=True, shape_inference=False)
    except ModelLoadError as e:
        raise EditError(f"cannot open the model for editing: {e}") from None
    return loaded.proto


def _node_key(n: onnx.NodeProto, k: int) -> str:
    return node_label(n, k)


def _changes(before: ModelState, after: ModelState) -> dict:
    """What an edit changed, for a viewer to mark: node labels added/removed/changed, the
    inputs/outputs before and after, initializers added/removed/replaced."""
    def nodes(state):
        return {_node_key(n, k): n.SerializeToString(deterministic=True)
                for k, n in enumerate(state.skeleton.graph.node)}
    nb, na = nodes(before), nodes(after)
    ib, ia = before.initializers, after.initializers
    g0, g1 = before.skeleton.graph, after.skeleton.graph
    added = [k for k in na if k not in nb]
    removed = [k for k in nb if k not in na]
    changed = [k for k in na if k in nb and na[k] != nb[k]]
    # a node renamed (same first output, another label) is changed, not removed and added
    first = {}
    for k, n in enumerate(g0.node):
        if n.output and n.output[0]:
            first.setdefault(n.output[0], _node_key(n, k))
    for k, n in enumerate(g1.node):
        lab = _node_key(n, k)
        old = first.get(n.output[0]) if n.output else None
        if lab in added and old in removed:
            added.remove(lab)
            removed.remove(old)
            changed.append(lab)
    return {
        "nodes_added": added,
        "nodes_removed": removed,
        "nodes_changed": changed,
        "inputs": {"before": [v.name for v in g0.input if v.name not in ib],
                   "after": [v.name for v in g1.input if v.name not in ia]},
        "outputs": {"before": [v.name for v in g0.output], "after": [v.name for v in g1.output]},
        "initializers_added": [k for k in ia if k not in ib],
        "initializers_removed": [k for k in ib if k not in ia],
        "initializers_changed": [k for k in ia if k in ib and ia[k] is not ib[k]],
    }


def open(model, *, inputs: dict | None = None, dims: dict | None = None,   # noqa: A001
         check: str = "run", models: dict | None = None) -> EditSession:
    """Start an edit session over ``model`` (a path, bytes or an onnx.ModelProto; the
    caller's ModelProto is not changed). See :class:`EditSession` for the options."""
    return EditSession(model, inputs=inputs, dims=dims, check=check, models=models)
