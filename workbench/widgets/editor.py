"""ModelEditor: model surgery by hand, in the notebook's drawing of the model.

>>> ed = ModelEditor("model.onnx")        # doctest: +SKIP
>>> ed                                      # right-click a node or an edge: choose an action
>>> ed.session.steps                        # the edits made, each checked   # doctest: +SKIP
>>> print(ed.session.script())              # the Python that replays them  # doctest: +SKIP

A :class:`GraphView` with an edit bar (Undo, Redo, History, Script, Compare, Save) and menus:
right-click a node for node actions (bypass, delete, replace, rename, cut, make its output a
graph output), an edge (a value) or a graph input/output for value actions (insert a node,
rename, make it an output, set dims, cut), click an edge to select its value and shift-click
a second one to extract the part between them; right-click the background for the model's
actions (re-batch, opset, metadata, compose). Every action is an edit of an
:class:`~workbench.edit.EditSession` (``ed.session``): checked as it is made, undoable, in
the replay script. The drawing is redrawn in place and marks what the edit added (green) and
changed (orange) and lists what it removed; an edit that is refused changes nothing and says
why in the menu where it was chosen. Compare opens a :class:`GraphCompare` of the model
before the last edit (or the original) and now, below the drawing. Edits made in code on the
same session (``ed.session.rename_value(...)``) redraw it too.
"""

from __future__ import annotations

import os

from workbench.widgets._base import TextRepr, import_widgets
from workbench.widgets.editing import EditController
from workbench.widgets.graph_view import GraphView

__all__ = ["ModelEditor"]

anywidget, ipywidgets, traitlets = import_widgets()


class ModelEditor(TextRepr, ipywidgets.VBox):
    """Edit a model in its drawing (see the module docs).

    ``model``: a path, bytes, an ``onnx.ModelProto`` or an :class:`~workbench.edit.EditSession`
    (edits already made stay undoable); ``inputs``, ``dims``, ``check``: as in
    :func:`workbench.edit.open`; ``save_to``: the file name the Save form proposes (default
    ``<name>_edited.onnx`` beside the model, or ``edited.onnx``).

    Attributes: ``session`` (the edit session), ``view`` (the :class:`GraphView`: ``selected``,
    ``details``, ``edit_state``), ``compare_box`` (where Compare puts its GraphCompare),
    ``controller`` (what answers the drawing's requests: :class:`~workbench.widgets.editing.
    EditController`).
    """

    def __init__(self, model, *, height: int = 560, title: str | None = None,
                 inputs: dict | None = None, dims: dict | None = None, check: str = "run",
                 save_to: str | None = None):
        from workbench import edit
        if isinstance(model, edit.EditSession):
            session = model
        else:
            session = edit.open(model, inputs=inputs, dims=dims, check=check)
        self.session = session
        src = session.source
        name = title or (os.path.basename(src) if src else
                         (session.original.graph.name or "model"))
        if save_to is None:
            stem = os.path.splitext(src)[0] if src else "edited"
            save_to = f"{stem}_edited.onnx" if src else "edited.onnx"
        self.controller = EditController(session, name=name, default_save=save_to)
        drawing = self.controller.drawing()
        self.view = GraphView(drawing.graph, height=height, title=name)
        self.view._show_drawing(drawing)
        self.view.edit_state = self._state()
        self.view.editable = True
        self.view.on_msg(self._on_msg)
        self.compare_box = ipywidgets.VBox([])
        self.compare_box.add_class("wb-edit-compare")
        session.on_change(self._redraw)
        super().__init__([self.view, self.compare_box])
        self.add_class("wb-model-editor")

    # ------------------------------------------------------------------ drawing
    def _state(self) -> dict:
        return self.controller.state()

    def _redraw(self, session=None, what=None, step=None) -> None:
        """Draw the session's current model in place, with the marks of its last change."""
        drawing = self.controller.drawing()
        with self.view.hold_sync():
            self.view.edit_state = self._state()
            self.view._show_drawing(drawing)

    def refresh(self) -> None:
        """Redraw (the session redraws the editor by itself after every edit, undo and
        redo; this is for a model changed some other way)."""
        self._redraw()

    # ------------------------------------------------------------------ requests
    def _on_msg(self, widget, content, buffers) -> None:
        if not isinstance(content, dict) or content.get("type") != "wb-edit":
            return
        req = content.get("request") or {}
        if isinstance(req, dict) and req.get("op") == "compare":
            reply = self._compare(req.get("against", "last"))
        else:
            reply = self.controller.handle(req)
            if reply.get("state") is not None:     # the edit_state trait carries it
                self.view.edit_state = self._state()
                reply = {k: v for k, v in reply.items() if k != "state"}
        self.view.send({"type": "wb-edit-reply", "id": content.get("id"), "reply": reply})

    def compare(self, against="last"):
        """A :class:`GraphCompare` of the model before the last edit (``"original"``: the
        original; an int k: before edit k) and now; the Compare button shows it below."""
        from workbench.widgets.compare import GraphCompare
        k, title = self.controller.compare_index(against)
        return GraphCompare(self.session.model_at(k), self.session.model,
                            titles=(title, "now"), height=max(320, self.view.height - 120))

    def _compare(self, against) -> dict:
        from workbench.edit import EditError
        try:
            cmp = self.compare(against)
        except EditError as e:
            return {"ok": False, "error": str(e)}
        close = ipywidgets.Button(description="Close the comparison",
                                  layout=ipywidgets.Layout(width="auto"))
        close.add_class("wb-edit-compare-close")
        close.on_click(lambda _b: setattr(self.compare_box, "children", ()))
        self.compare_box.children = (close, cmp)
        return {"ok": True, "message": f"GraphCompare below: {cmp.summary()}"}

    def summary(self) -> str:
        s = self.session
        n = len(s.state_at(-1).skeleton.graph.node)
        undone = f", {len(s.undone)} undone" if s.undone else ""
        return (f"ModelEditor({self.controller.name!r}: {n} nodes, {len(s.steps)} edit(s)"
                f"{undone}; right-click a node or an edge in the notebook to edit)")
