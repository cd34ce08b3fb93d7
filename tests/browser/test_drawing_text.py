"""Text in the GraphView drawing stays readable at every zoom (issue 26: group captions were
~5 px tall at the smallest zoom, tensor-shape labels on edges overlapped where many edges
leave one node). Every ``fillText`` of the canvas is recorded in Chromium (the widget's own
front-end, on the page of tests/helpers/graph_page.py) with its on-screen size and box."""

from __future__ import annotations

import pytest

from tests.helpers import jupyter

pytestmark = pytest.mark.browser

#: graph_core.js's WB_MIN_TEXT_PX
MIN_PX = 9

RECORD = """() => {
  const P = CanvasRenderingContext2D.prototype;
  if (!P.__wbOrig) {
    P.__wbOrig = P.fillText;
    P.fillText = function (text, x, y) {
      const t = this.getTransform(), dpr = window.devicePixelRatio || 1;
      const size = parseFloat(/([\\d.]+)px/.exec(this.font)[1]);
      const w = this.measureText(text).width;
      const al = this.textAlign;
      const x0 = al === "center" ? x - w / 2 : al === "right" || al === "end" ? x - w : x;
      const sx = (v) => (t.a * v + t.e) / dpr, sy = (v) => (t.d * v + t.f) / dpr;
      window.wbTexts.push({ text: String(text), px: size * t.a / dpr, fill: this.fillStyle,
        box: [sx(x0), sy(y - size / 2), sx(x0 + w), sy(y + size / 2)] });
      return P.__wbOrig.call(this, text, x, y);
    };
  }
  window.wbTexts = [];
}"""


def _fan_out(n=8):
    """One value read by ``n`` nodes (as silero_vad's STFT output is): their edges leave
    together, each labelled with the same long shape."""
    from onnx import TensorProto, helper
    ops = ["Relu", "Sigmoid", "Tanh", "Abs", "Neg", "Exp", "Softsign", "Softplus"][:n]
    nodes = [helper.make_node("Relu", ["x"], ["h"], name="/stft/Relu")]
    nodes += [helper.make_node(op, ["h"], [f"b{i}"], name=f"/branch{i}/{op}")
              for i, op in enumerate(ops)]
    nodes.append(helper.make_node("Sum", [f"b{i}" for i in range(n)], ["y"], name="/sum/Sum"))
    vi = lambda name: helper.make_tensor_value_info(  # noqa: E731
        name, TensorProto.FLOAT, [1, 258, 64])
    g = helper.make_graph(nodes, "fan_out", [vi("x")], [vi("y")],
                          value_info=[vi("h")] + [vi(f"b{i}") for i in range(n)])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


@pytest.fixture(scope="module")
def page(tmp_path_factory, chromium):
    from tests.helpers.graph_page import page_html

    html = tmp_path_factory.mktemp("drawing-text") / "graph.html"
    html.write_text(page_html(), encoding="utf-8")
    ctx, pg = jupyter.new_page(chromium, 1100, 760)
    pg.goto(html.as_uri())
    pg.wait_for_function("window.wbReady === true")
    pg.evaluate(RECORD)
    yield pg
    ctx.close()


def _open(pg, model):
    from tests.helpers.graph_page import payload_of
    from workbench.graph.load import load
    data, details = payload_of(load(model, check=False).graph)
    pg.evaluate("([p, d]) => wbOpen(p, d, 620)", [data, details])


def _texts_at(pg, k):
    """Draw at zoom ``k`` (centred) and return what was written."""
    return pg.evaluate("""k => { const gc = document.querySelector('.wb-graphview').wbView.gc;
        gc.k = k; gc.tx = (gc.W - gc.lay.width * k) / 2; gc.ty = 12;
        window.wbTexts = []; gc.draw(); return window.wbTexts; }""", k)


def _overlaps(boxes):
    return [(a, b) for i, a in enumerate(boxes) for b in boxes[i + 1:]
            if a[0] < b[2] - 0.5 and b[0] < a[2] - 0.5 and a[1] < b[3] - 0.5 and b[1] < a[3] - 0.5]


def test_no_text_below_the_minimum_size_at_any_zoom(page):
    from tests.helpers.viewer_models import paddle_ocr_like
    _open(page, paddle_ocr_like())
    seen = 0
    for k in (0.05, 0.2, 0.3, 0.4, 0.5, 0.7, 1.0, 1.4):
        texts = _texts_at(page, k)
        small = [(t["text"], round(t["px"], 1)) for t in texts if t["px"] < MIN_PX - 0.01]
        assert not small, (k, small[:5])
        seen += len(texts)
    assert seen > 20                                    # text was drawn at the larger zooms
    assert page.errors == [], page.errors


def test_edge_labels_do_not_overlap(page):
    _open(page, _fan_out(8))
    for k in (0.7, 0.9, 1.2):
        texts = _texts_at(page, k)
        labels = [t for t in texts if t["fill"] == "#6b7785"]
        assert labels, f"no edge label drawn at zoom {k}"
        clash = _overlaps([t["box"] for t in labels])
        assert not clash, (k, clash[:3])
        # nor over a node's own label
        names = [t["box"] for t in texts if t["fill"] != "#6b7785"]
        assert not [(a, b) for a in (t["box"] for t in labels) for b in names
                    if _overlaps([a, b])], k
    assert page.errors == [], page.errors
