"""GraphCompare: two graphs side by side (a model before and after ``last_layers`` or a new
head, float vs quantized, the engine's passes vs the original) with matched nodes paired.

>>> cmp = GraphCompare("model.onnx", cut_model)     # doctest: +SKIP
>>> cmp                                              # click a node: its match is selected
>>> cmp.matches, cmp.only_left, cmp.only_right       # the pairing, as names

Nodes are matched on what the drawing shows (constants and shape computations folded, see
:mod:`workbench.widgets.graph_data`): first by name and op type, then what is left by aligning
the two graphs' sequences of op types in topological order (longest common subsequence, as
``difflib`` does for text). Nodes without a match are ringed in each drawing.
"""

from __future__ import annotations

import difflib

from workbench.widgets._base import TextRepr, import_widgets
from workbench.widgets._html import tag
from workbench.widgets._model import as_source
from workbench.widgets.graph_data import graph_payload
from workbench.widgets.graph_view import GraphView

__all__ = ["GraphCompare", "match_graphs"]

anywidget, ipywidgets, traitlets = import_widgets()


def _architecture(data) -> list:
    """(name, op) of the shown op nodes of a drawing payload, in topological order."""
    return [(n, op) for n, op, k, h in zip(data["name"], data["op"], data["kind"], data["host"])
            if k == 0 and h == -1]


def match_graphs(left, right) -> list:
    """Pairs ``(left node, right node)`` of matched nodes of two graphs (Graph IR or drawing
    payloads), in the left graph's order (see the module docs)."""
    a = _architecture(left if isinstance(left, dict) else graph_payload(left))
    b = _architecture(right if isinstance(right, dict) else graph_payload(right))
    by_name = {n: op for n, op in b}
    pairs = {n: n for n, op in a if by_name.get(n) == op}
    rest_a = [(n, op) for n, op in a if n not in pairs]
    used = set(pairs.values())
    rest_b = [(n, op) for n, op in b if n not in used]
    sm = difflib.SequenceMatcher(None, [op for _, op in rest_a], [op for _, op in rest_b],
                                 autojunk=False)
    for blk in sm.get_matching_blocks():
        for k in range(blk.size):
            pairs[rest_a[blk.a + k][0]] = rest_b[blk.b + k][0]
    return [(n, pairs[n]) for n, _ in a if n in pairs]


class GraphCompare(TextRepr, ipywidgets.VBox):
    """Two :class:`GraphView` side by side; unmatched nodes ringed; selecting a node in one
    selects (and reveals) its match in the other.

    ``arrange``: ``"auto"`` (side by side while each drawing gets at least
    :data:`MIN_PANE_PX` of width, one above the other in a narrower notebook), ``"columns"``
    (always side by side) or ``"rows"`` (always one above the other, each the full width).

    Attributes: ``left`` / ``right`` (the GraphViews), ``matches`` (pairs of names),
    ``only_left`` / ``only_right`` (names without a match).
    """

    #: the narrowest a drawing gets side by side under ``arrange="auto"`` (below: stacked)
    MIN_PANE_PX = 480
    ARRANGEMENTS = ("auto", "columns", "rows")

    def __init__(self, left, right, *, height: int = 560, titles=None, arrange: str = "auto"):
        if arrange not in self.ARRANGEMENTS:
            raise ValueError(f"GraphCompare(arrange={arrange!r}): use one of "
                             f"{', '.join(map(repr, self.ARRANGEMENTS))}")
        ls, rs = as_source(left), as_source(right)
        t = titles or (ls.name, rs.name)
        self.left = GraphView(ls, height=height, title=t[0])
        self.right = GraphView(rs, height=height, title=t[1])
        self.matches = match_graphs(self.left.graph_data, self.right.graph_data)
        self._l2r = dict(self.matches)
        self._r2l = {r: l for l, r in self.matches}
        self.only_left = [n for n, _ in _architecture(self.left.graph_data) if n not in self._l2r]
        self.only_right = [n for n, _ in _architecture(self.right.graph_data)
                           if n not in self._r2l]
        self.left.overlay = {"title": f"not in {t[1]}", "values": {}, "flagged": self.only_left}
        self.right.overlay = {"title": f"not in {t[0]}", "values": {},
                              "flagged": self.only_right}
        self.left.add_class("wb-compare-left")
        self.right.add_class("wb-compare-right")
        self.info = ipywidgets.HTML(self._info_html())
        self.info.add_class("wb-compare-info")
        self._syncing = False
        self.left.observe(lambda ch: self._follow(ch, self._l2r, self.right), names="selected")
        self.right.observe(lambda ch: self._follow(ch, self._r2l, self.left), names="selected")
        # flex items: two columns while both fit MIN_PANE_PX ("auto" wraps the right one
        # under the left one in a narrower output area), or fixed columns/rows
        flow = {"auto": "row wrap", "columns": "row nowrap", "rows": "column nowrap"}[arrange]
        box = ipywidgets.HBox([self.left, self.right],
                              layout=ipywidgets.Layout(width="100%", flex_flow=flow))
        for pane in (self.left, self.right):
            pane.layout = (ipywidgets.Layout(width="100%") if arrange == "rows" else
                           ipywidgets.Layout(flex=f"1 1 {self.MIN_PANE_PX}px", min_width="0")
                           if arrange == "auto" else ipywidgets.Layout(width="50%"))
        self.arrange = arrange
        super().__init__([self.info, box])
        self.add_class("wb-graph-compare")

    def _follow(self, change, table, other) -> None:
        if self._syncing:
            return
        match = table.get(change["new"], "")
        self._syncing = True
        try:
            other.selected = match
        finally:
            self._syncing = False

    def _info_html(self) -> str:
        nl = len(self.matches) + len(self.only_left)
        nr = len(self.matches) + len(self.only_right)
        ring = "color:#b0006e"
        return tag("div", tag("b", len(self.matches)), " matched nodes; ",
                   tag("span", f"{len(self.only_left)} only on the left", style=ring),
                   f" (of {nl}), ",
                   tag("span", f"{len(self.only_right)} only on the right", style=ring),
                   f" (of {nr}) — ringed. Click a node: its match is selected on the other "
                   f"side.")

    def summary(self) -> str:
        return (f"GraphCompare({self.left.title!r} vs {self.right.title!r}: "
                f"{len(self.matches)} matched, {len(self.only_left)} only left, "
                f"{len(self.only_right)} only right)")
