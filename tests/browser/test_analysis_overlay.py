"""The analysis on the graph, in Chromium (issue 25): the GraphView front-end coloured by an
analysis of a scoped CNN (FLOPs, parameters, memory, our times and onnxruntime's, % of roof,
compute- or memory-bound), the legend that chooses the metric, the totals on collapsed groups
(checked against the analysis' own sums per scope), the analysis rows of a clicked node and
of a selected group, the summary panel, hostile node names staying text; then the JupyterLab
``.onnx`` viewer: its static overlay and the Measure button. Screenshots:
``test-artifacts/analysis-*.png``.

Run: ``pytest -m browser tests/browser/test_analysis_overlay.py -s``.
"""

from __future__ import annotations

import shutil

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from tests.browser.test_graph_drawing import ARTIFACTS, _open, _view, page  # noqa: F401
from tests.browser.test_onnx_viewer import DEFAULT_MODEL
from tests.helpers import jupyter

pytestmark = pytest.mark.browser

HOSTILE = "<img src=x onerror=window.__xss=1>"


def scoped_cnn():
    """stem / block1..3 (conv, relu, conv, residual add, relu) / head: five scopes, the
    blocks collapsed on the first screen; one node name carries HTML."""
    rng = np.random.default_rng(0)
    c, hw = 8, 16
    inits = [numpy_helper.from_array(rng.standard_normal((c, 3, 3, 3)).astype(np.float32) * .2,
                                     "w_stem"),
             numpy_helper.from_array(rng.standard_normal((10, c)).astype(np.float32), "fw"),
             numpy_helper.from_array(np.zeros(10, np.float32), "fb")]
    nodes = [helper.make_node("Conv", ["x", "w_stem"], ["s0"], name="/stem/conv/Conv",
                              pads=[1] * 4),
             helper.make_node("Relu", ["s0"], ["s1"], name="/stem/relu/Relu")]
    prev = "s1"
    for b in (1, 2, 3):
        for k in (1, 2):
            inits.append(numpy_helper.from_array(
                rng.standard_normal((c, c, 3, 3)).astype(np.float32) * .1, f"w{b}{k}"))
        conv2 = f"/block{b}/{HOSTILE}/Conv" if b == 2 else f"/block{b}/conv2/Conv"
        nodes += [helper.make_node("Conv", [prev, f"w{b}1"], [f"b{b}c1"],
                                   name=f"/block{b}/conv1/Conv", pads=[1] * 4),
                  helper.make_node("Relu", [f"b{b}c1"], [f"b{b}r1"], name=f"/block{b}/relu1/Relu"),
                  helper.make_node("Conv", [f"b{b}r1", f"w{b}2"], [f"b{b}c2"], name=conv2,
                                   pads=[1] * 4),
                  helper.make_node("Add", [f"b{b}c2", prev], [f"b{b}a"], name=f"/block{b}/Add"),
                  helper.make_node("Relu", [f"b{b}a"], [f"b{b}o"], name=f"/block{b}/relu2/Relu")]
        prev = f"b{b}o"
    nodes += [helper.make_node("GlobalAveragePool", [prev], ["p"], name="/head/pool/Pool"),
              helper.make_node("Flatten", ["p"], ["f"], name="/head/Flatten"),
              helper.make_node("Gemm", ["f", "fw", "fb"], ["y"], name="/head/fc/Gemm",
                               transB=1)]
    g = helper.make_graph(nodes, "scoped",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, hw, hw])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 10])], inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    return m


@pytest.fixture(scope="module")
def analysed():
    from workbench.analysis import Peaks, analyze

    a = analyze(scoped_cnn())
    a.roofline(Peaks(60e9, 6e9))        # fixed peaks: the same colours on every machine
    a.profile_ours(runs=3, warmup=1)
    pytest.importorskip("onnxruntime")
    a.profile_ort(runs=3, warmup=1, threads=1)
    a.memory()
    return a


def _gc(pg, expr):
    return pg.evaluate("() => { const gc = document.querySelector('.wb-graphview').wbView.gc; "
                       f"return {expr}; }}")


def _group_values(pg):
    """[label, total shown, total value] of every collapsed group on screen."""
    return _gc(pg, "gc.lay.items.filter((b) => b.it.type === 'group').map((b) => "
                   "[gc.graph.G.label[b.it.g], gc.overlay.groupText(b.it.g), "
                   "gc.overlay.group.get(b.it.g)])")


def _scope_sums(a, key):
    out = {}
    for r in a.records:
        if r["static"] or r[key] is None:
            continue
        top = r["group"].split("/")[0] if r["group"] else ""
        out[top] = out.get(top, 0) + r[key]
    return out


def _click(pg, *, node=None, group=None, dbl=False):
    x, y = pg.evaluate(
        """([node, group]) => { const gc = document.querySelector('.wb-graphview').wbView.gc;
        const b = gc.lay.items.find((b) => node !== null
            ? b.it.type === 'node' && gc.data.name[b.it.i] === node
            : b.it.type === 'group' && gc.graph.G.label[b.it.g] === group);
        const r = gc.canvas.getBoundingClientRect();
        return [r.left + b.x * gc.k + gc.tx, r.top + b.y * gc.k + gc.ty]; }""", [node, group])
    (pg.mouse.dblclick if dbl else pg.mouse.click)(x, y)


def test_overlays_legend_group_totals_and_summary(page, analysed):  # noqa: F811
    pg, a = page, analysed
    ARTIFACTS.mkdir(exist_ok=True)
    _open(pg, scoped_cnn(), height=620)
    ov = a.overlay("time_ours_ms")
    pg.evaluate("ov => { wbModel.set('overlay_metric', ov.metric); wbModel.set('overlay', ov); }",
                ov)
    view = _view(pg)
    assert view.get_attribute("data-overlay-metric") == "time_ours_ms"
    # the legend chooses among every metric the analysis has
    options = view.locator(".wb-overlay-metric option").all_text_contents()
    for title in ("FLOPs", "parameters", "activation memory (outputs written)",
                  "memory live after the step", "time per node, ours",
                  "time per node, onnxruntime", "% of roof (roofline time / measured time)",
                  "compute- or memory-bound"):
        assert title in options, options
    legend = view.locator(".wb-overlay-legend").text_content()
    assert "ms per node" in legend and "collapsed groups: the sum of its nodes" in legend
    # totals on the collapsed groups: the analysis' own sums of their scopes
    shown = {lab: (text, v) for lab, text, v in _group_values(pg)}
    sums = _scope_sums(a, "time_ours_ms")
    assert {"block1", "block3", "head"} <= set(shown), shown
    for lab in ("block1", "block3", "head"):
        assert shown[lab][1] == pytest.approx(sums[lab], rel=1e-9), (lab, shown[lab])
        assert shown[lab][0].endswith(" ms"), shown[lab]
    summary = view.locator(".wb-overlay-summary").text_content()
    assert "MACs / FLOPs" in summary and "peak memory" in summary and "a plain run" in summary
    view.screenshot(path=str(ARTIFACTS / "analysis-time.png"))

    # FLOPs: chosen in the legend; the model hears of it; group totals are exact sums
    pg.select_option(".wb-overlay-metric", "flops")
    assert view.get_attribute("data-overlay-metric") == "flops"
    assert pg.evaluate("() => wbModel.get('overlay_metric')") == "flops"
    shown = {lab: (text, v) for lab, text, v in _group_values(pg)}
    sums = _scope_sums(a, "flops")
    for lab in ("block1", "block3", "head"):
        assert shown[lab][1] == sums[lab], (lab, shown[lab], sums[lab])
        assert shown[lab][0].endswith("FLOP"), shown[lab]
    assert "logarithmic scale" in view.locator(".wb-overlay-legend").text_content()
    svg = _gc(pg, "gc.toSVG()")
    assert shown["block1"][0] in svg               # the totals go into the SVG export too
    view.screenshot(path=str(ARTIFACTS / "analysis-flops.png"))

    # compute- or memory-bound: two colours, each node in its category's
    pg.select_option(".wb-overlay-metric", "bound")
    cats = view.locator(".wb-overlay-cat")
    assert sorted(cats.evaluate_all("els => els.map((e) => e.dataset.category)")) == \
        ["compute", "memory"]
    bound = {r["node"]: r["bound"] for r in a.records if r["bound"]}
    fills = _gc(pg, "Object.fromEntries(['/stem/conv/Conv', '/stem/relu/Relu'].map("
                    "(n) => [n, gc.fillOf(gc.index.get(n))]))")
    colours = _gc(pg, "Object.fromEntries(['compute', 'memory'].map((c) => "
                      "[c, gc.overlay.color(c)]))")
    for n, f in fills.items():
        assert f == colours[bound[n]], (n, f, colours)
    view.screenshot(path=str(ARTIFACTS / "analysis-bound.png"))

    # % of roof: a group's is its roofline time over its measured time
    pg.select_option(".wb-overlay-metric", "pct_of_roof")
    text = view.locator(".wb-overlay-legend").text_content()
    assert "0 %" in text and "100 % per node" in text

    # a clicked node lists every metric; a selected group its totals
    _click(pg, node="/stem/conv/Conv")
    facts = view.locator(".wb-details .wb-overlay-facts")
    facts.wait_for()
    rows = dict(zip(facts.locator("td:nth-child(1)").all_text_contents(),
                    facts.locator("td:nth-child(2)").all_text_contents()))
    conv = next(r for r in a.records if r["node"] == "/stem/conv/Conv")
    assert rows["FLOPs"].endswith("FLOP") and rows["compute- or memory-bound"] == conv["bound"]
    _click(pg, group="block1")
    group_facts = view.locator(".wb-details .wb-overlay-facts")
    group_facts.wait_for()
    assert "group total" in group_facts.text_content()

    # node names from the model are text, never markup
    _click(pg, group="block2", dbl=True)
    pg.wait_for_function("() => document.querySelector('.wb-graphview').dataset.levelLabel "
                         "=== 'block2'")
    assert pg.evaluate("() => window.__xss") is None
    assert view.locator("img").count() == 0
    pg.evaluate("() => wbModel.set('overlay', {})")
    assert view.locator(".wb-overlay-legend").count() == 0
    assert view.locator(".wb-overlay-summary").count() == 0
    assert pg.errors == [], pg.errors


@pytest.fixture(scope="module")
def lab(shared_lab):
    """This module's folder on the session's JupyterLab (tests/browser/conftest.py)."""
    folder = jupyter.lab_folder(shared_lab, "analysis")
    shutil.copy(DEFAULT_MODEL, folder.root / "digits.onnx")
    onnx.save(scoped_cnn(), str(folder.root / "scoped.onnx"))
    yield folder
    folder.close()


def test_onnx_viewer_overlay_and_measure(lab, page):  # noqa: F811
    # the browser of the drawing tests (one Playwright per thread), a context of its own
    ctx = page.context.browser.new_context(viewport={"width": 1400, "height": 900})
    try:
        pg = ctx.new_page()
        errors = []
        pg.on("pageerror", lambda e: errors.append(str(e)))
        pg.goto(lab.tree("scoped.onnx"))
        panel = pg.locator(f".jp-OnnxGraph[data-path='{lab.rel('scoped.onnx')}']")
        panel.locator(".wb-graphview[data-ready='1']").wait_for(timeout=90_000)
        view = panel.locator(".wb-graphview")
        # the static analysis, before anything ran: FLOPs with group totals and a summary
        assert view.get_attribute("data-overlay-metric") == "flops"
        options = view.locator(".wb-overlay-metric option").all_text_contents()
        assert "FLOPs" in options and "time per node, ours" not in options
        groups = view.evaluate("v => { const gc = v.wbView.gc; return gc.lay.items.filter("
                               "(b) => b.it.type === 'group').map((b) => "
                               "gc.overlay.groupText(b.it.g)); }")
        assert groups and all(t.endswith("FLOP") for t in groups), groups
        summary = view.locator(".wb-overlay-summary").text_content()
        assert "scoped.onnx" in summary and "bound to 1" in summary
        # Measure: the model runs on the server; the colours become the measured times
        pg.locator(".jp-OnnxGraph-measure-button").first.click()
        pg.wait_for_function("p => ['done', 'error'].includes(document.querySelector("
                             "`.jp-OnnxGraph[data-path='${p}']`).dataset.measure)",
                             arg=lab.rel("scoped.onnx"), timeout=90_000)
        assert panel.get_attribute("data-measure") == "done", \
            panel.locator(".jp-OnnxGraph-measure").text_content()
        assert view.get_attribute("data-overlay-metric") == "time_ours_ms"
        options = view.locator(".wb-overlay-metric option").all_text_contents()
        assert "time per node, ours" in options and "memory live after the step" in options
        assert "a plain run" in view.locator(".wb-overlay-summary").text_content()
        pg.wait_for_timeout(300)
        panel.screenshot(path=str(ARTIFACTS / "analysis-viewer-measured.png"))
        assert pg.evaluate("() => window.__xss") is None
        assert errors == [], errors
    finally:
        ctx.close()
