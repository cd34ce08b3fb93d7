"""Model strings never reach HTML unescaped (issue 20), Python side: every HTML or SVG a
widget writes from a hostile model (tests/helpers/hostile_models.py: payloads in every string
field) is parsed, and only the tags our code writes, without event handlers or links, are
found. What a saved notebook keeps (the widgets' state, the monitor's SVG) is checked the same
way. The browser side is tests/browser/test_xss.py."""

from __future__ import annotations

import html.parser
import json

import numpy as np
import pytest

from tests.helpers import hostile_models as hm

#: the tags the widgets' Python code writes
ALLOWED = {"b", "span", "code", "div", "table", "tr", "td", "p", "iframe", "i"}


class _Tags(html.parser.HTMLParser):
    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.tags, self.text = [], []

    def handle_starttag(self, tag, attrs):
        self.tags.append((tag, dict(attrs)))

    def handle_startendtag(self, tag, attrs):
        self.tags.append((tag, dict(attrs)))

    def handle_data(self, data):
        self.text.append(data)


def assert_inert(markup: str, allowed=ALLOWED) -> str:
    """Parse ``markup`` as a browser would; no tag outside ``allowed``, no event-handler
    attribute, no link, no element classed as a payload. Returns the text (payloads as
    text)."""
    p = _Tags()
    p.feed(markup)
    p.close()
    for tag, attrs in p.tags:
        assert tag in allowed, (tag, attrs, markup[:300])
        for k, v in attrs.items():
            assert not k.startswith("on"), (tag, k, markup[:300])
            assert k not in ("href", "srcdoc", "xlink:href"), (tag, k)
            assert not (k == "class" and hm.MARK in (v or "").split()), (tag, k, v)
    return "".join(p.text)


@pytest.fixture(scope="module")
def evil(tmp_path_factory):
    import onnx
    d = tmp_path_factory.mktemp("evil")
    path = d / (hm.payloads("file")[0].replace("/", "_") + ".onnx")
    onnx.save(hm.xss_model(), str(path))
    return str(path)


def test_the_helper_escapes_text_and_attributes():
    from workbench.widgets._html import esc, frag, joined, tag
    for p in hm.payloads("t"):
        out = tag("div", p, tag("b", p), title=p, cls="wb-x")
        assert assert_inert(out) == p + p
        assert esc(p) in out
    assert joined(", ", ["<x>", tag("b", "y")]) == "&lt;x&gt;, <b>y</b>"
    assert frag("a", None, tag("i", "<")) == "a<i>&lt;</i>"
    with pytest.raises(ValueError):
        tag("div", "x", onclick="alert(1)")
    with pytest.raises(ValueError):
        tag("img src=x onerror=alert(1)", "x")


def test_layer_cutter_html_is_inert(evil):
    from workbench.widgets import LayerCutter
    cutter = LayerCutter(evil, height=200)
    layers = len(cutter._layers)
    for k in range(-1, -layers - 1, -1):
        cutter.last_layers = k
        text = assert_inert(cutter.cut_label.value) + assert_inert(cutter.info.value)
        assert "cut after" in text
    cutter.last_layers = -1
    assert hm.MARK in assert_inert(cutter.cut_label.value)       # the payload, as text
    # by name, with a new head, and with a head that cannot be sized
    for node in cutter.graph.nodes:
        cutter.last_layers = node.name
        assert_inert(cutter.cut_label.value)
        cutter.head_classes = 3
        assert_inert(cutter.info.value)
        cutter.head_classes = 0
    # what a saved notebook keeps: every HTML widget value in the widgets' state
    for w in (cutter.cut_label, cutter.info):
        assert_inert(w.get_state()["value"])


def test_layer_cutter_error_text_is_inert():
    """The head error message quotes a value name (a payload)."""
    from onnx import TensorProto, helper

    from workbench.widgets import LayerCutter
    name = hm.payloads("dyn")[0]
    g = helper.make_graph([helper.make_node("Relu", ["x"], [name], name="r")], "g",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", "k"])],
                          [helper.make_tensor_value_info(name, TensorProto.FLOAT, ["n", "k"])])
    cutter = LayerCutter(helper.make_model(g), height=200)
    cutter.head_classes = 4
    text = assert_inert(cutter.info.value)
    assert "head: cannot size the new head" in text and name in text


def test_graph_compare_html_is_inert(evil):
    from workbench.graph.load import load
    from workbench.widgets import GraphCompare
    from workbench.widgets.cutter import cut_graph
    cmp = GraphCompare(evil, cut_graph(load(evil).graph, -2).graph, height=200)
    assert "matched nodes" in assert_inert(cmp.info.value)


def test_training_monitor_svg_is_inert():
    """The SVG kept in a saved notebook (shown by GitHub, nbviewer, HTML exports) carries the
    title and metric names as text."""
    from workbench.widgets import TrainingMonitor
    title = hm.payloads("title")[0]
    mon = TrainingMonitor(total=4, title=title, display=False)
    for i in range(4):
        mon.update(loss=1 / (i + 1), metrics={hm.payloads("metric")[1]: i / 4})
    mon.update(loss=0.5, metrics={hm.payloads("metric")[1]: 0.5}, phase="val")
    mon.close()
    svg = mon.curves_svg()
    text = assert_inert(svg, {"svg", "rect", "text", "tspan", "g", "path", "line", "circle"})
    assert title in text
    import xml.dom.minidom
    xml.dom.minidom.parseString(svg)                 # well-formed: nothing broke out


def test_netron_view_html_is_inert(monkeypatch):
    from workbench.widgets.netron_view import NetronView
    view = NetronView(("127.0.0.1", 1), f"/tmp/{hm.payloads('f')[0]}.onnx", None,
                      width=hm.payloads("w")[5], height=300)
    monkeypatch.setattr(NetronView, "close", lambda self: None)
    assert_inert(view._repr_html_())
    view.closed = True
    assert "<img" in assert_inert(view._repr_html_())


def test_netron_temp_file_name_is_plain(tmp_path):
    from workbench.widgets.netron_view import _model_file
    m = hm.xss_model()
    path, folder = _model_file(m)
    try:
        import os
        base = os.path.basename(path)
        assert os.path.dirname(path) == folder
        assert all(c.isalnum() or c in "._-" for c in base), base
    finally:
        import shutil
        shutil.rmtree(folder, ignore_errors=True)


def test_widget_traits_carry_payloads_as_data(evil):
    """GraphView and TensorInspector send model strings as JSON data (the front-end puts
    them in the page as text): nothing in their state is HTML."""
    from workbench.widgets import GraphView, TensorInspector
    gv = GraphView(evil, height=200)
    for n in gv.graph.nodes:
        gv.selected = n.name
        assert gv.details["name"] == n.name
    x = np.ones((2, 4), np.float32)
    insp = TensorInspector(evil, [x], height=200)
    assert len(insp.rows) == len(insp.graph.nodes)
    for state in (gv.get_state(), insp.get_state()):
        for k, v in state.items():
            if k.startswith("_") or isinstance(v, (bytes, memoryview)):
                continue
            json.dumps(v)                     # plain data


def test_text_reprs_keep_payloads_as_text(evil):
    from workbench.widgets import GraphView
    gv = GraphView(evil, height=200)
    bundle = gv._repr_mimebundle_()
    data = bundle[0] if isinstance(bundle, tuple) else bundle
    assert set(data) == {"text/plain"}
