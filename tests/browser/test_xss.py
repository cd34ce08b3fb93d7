"""A model from a stranger cannot run script in JupyterLab (issue 20).

Real JupyterLab on 127.0.0.1 (this working tree's front-end and server extension), driven by
Playwright with Debian's Chromium. Two hostile models (tests/helpers/hostile_models.py: an
HTML/script payload in every string field a model can carry: node, value, input, output and
initializer names, op types, domains, attribute names and string values, doc strings,
metadata keys and values, producer, graph name, function names; and in the file names) are
opened in every widget (GraphView, LayerCutter, TensorInspector with and without an
onnxruntime comparison, GraphCompare, TrainingMonitor with payload title and metric names,
Netron) and in the ONNX Graph viewer. Every item is hovered and clicked, groups opened,
searches typed, the legend and table headers clicked, the cutter's slider moved through every
position, the drawings exported as SVG (the file is checked) and PNG. Then the notebook is
saved with its widget state and the page reloaded (outputs rendered again), and then opened
again with a fresh kernel (widgets restored from the saved state).

Throughout, ``window.__xss`` (which every payload would set) stays unset in the page and in
every frame, and no element made from a payload exists: no element classed ``wbxss``, no
attribute named after it, no event-handler attribute or ``javascript:`` link carrying the
payload, no script holding it. Screenshots go to ``test-artifacts/xss-*.png``.
"""

from __future__ import annotations

import json
import sys
import time
import xml.dom.minidom
from pathlib import Path

import onnx
import pytest

from tests.helpers import hostile_models as hm
from tests.helpers import jupyter

pytestmark = pytest.mark.browser

ROOT = Path(__file__).resolve().parents[2]
ARTIFACTS = ROOT / "test-artifacts"

EVIL = hm.payloads("file")[0] + ".onnx"             # <img src=x class="wbxss" onerror=...>
CUSTOM = hm.payloads("file2")[5] + ".onnx"          # ' onmouseover='...' data-wbxss='
BROKEN = hm.payloads("file3")[6] + ".onnx"          # " onfocus="..." autofocus data-wbxss="

CELLS = [
    # 0
    """
import sys, json, numpy as np
sys.path.insert(0, {root!r})
from tests.helpers import hostile_models as hm
from workbench.widgets import (GraphCompare, GraphView, LayerCutter, TensorInspector,
                               TrainingMonitor, netron)
from workbench.widgets.cutter import cut_graph
from workbench.graph.load import load
EVIL, CUSTOM, BROKEN = {evil!r}, {custom!r}, {broken!r}
x = np.ones((2, 4), np.float32)
""",
    "gv = GraphView(EVIL, height=360)\ngv",                                        # 1
    "cutter = LayerCutter(EVIL, height=300)\ncutter",                               # 2
    "insp = TensorInspector(EVIL, [x], height=260)\ninsp",                          # 3
    # 4: the custom op cannot run (listed with its payload names), onnxruntime refuses it
    "insp2 = TensorInspector(CUSTOM, {'a': np.ones(2, np.float32)}, compare='onnxruntime', "
    "height=260)\ninsp2",
    "cmp = GraphCompare(EVIL, cut_graph(load(EVIL).graph, -2).graph, height=300)\ncmp",  # 5
    "gv2 = GraphView(CUSTOM, height=320)\ngv2",                                     # 6
    # 7
    """
with TrainingMonitor(total=6, title=hm.payloads("title")[0]) as mon:
    for i in range(6):
        mon.update(loss=1 / (i + 1), metrics={hm.payloads("metric")[1]: i / 6})
        if i % 3 == 2:
            mon.update(loss=1.2 / (i + 1), metrics={hm.payloads("metric")[1]: i / 7}, phase="val")
""",
    "nv = netron(EVIL, height=300)\nnv",                                            # 8
    "print(repr(gv)); print(repr(cutter)); print(insp.table())",                    # 9
    "load(BROKEN)",                                                                 # 10 (error)
]

SCAN = """() => {
  const bad = [];
  const scan = (doc, where) => {
    const w = doc.defaultView;
    if (w && w.__xss) bad.push(`${where}: window.__xss = ${JSON.stringify(w.__xss)}`);
    for (const e of doc.querySelectorAll("*")) {
      const tag = e.tagName.toLowerCase();
      if (e.classList && e.classList.contains("wbxss")) bad.push(`${where}: <${tag} class=wbxss>`);
      for (const a of e.attributes) {
        const n = a.name.toLowerCase(), v = a.value;
        if (n.includes("wbxss")) bad.push(`${where}: <${tag}> attribute ${n}`);
        if (n.startsWith("on") && v.includes("__xss")) bad.push(`${where}: <${tag} ${n}>`);
        if (["href", "src", "xlink:href", "action", "formaction"].includes(n) &&
            v.trim().toLowerCase().startsWith("javascript:")) bad.push(`${where}: <${tag} ${n}>`);
        if (n === "srcdoc" && v.includes("__xss")) bad.push(`${where}: <${tag} srcdoc>`);
      }
      if (tag === "script" && e.textContent.includes("__xss")) bad.push(`${where}: <script>`);
      if (tag === "iframe") {
        try { if (e.contentDocument) scan(e.contentDocument, where + " > iframe"); } catch (err) {}
      }
    }
  };
  scan(document, "page");
  return bad;
}"""

# every item of a drawing's current level, in page coordinates (the canvas draws them)
ITEMS = """el => { const gc = el.wbView.gc; const r = gc.canvas.getBoundingClientRect();
  if (!gc.lay) return [];
  return gc.lay.items.map((b) => ({ x: r.left + b.x * gc.k + gc.tx, y: r.top + b.y * gc.k + gc.ty,
    type: b.it.type, g: b.it.g })).filter((p) => p.x > r.left + 2 && p.x < r.right - 2 &&
    p.y > r.top + 2 && p.y < r.bottom - 2); }"""


def _cell(src: str) -> dict:
    return {"cell_type": "code", "metadata": {}, "execution_count": None, "outputs": [],
            "source": src.strip("\n")}


@pytest.fixture(scope="module")
def lab(shared_lab):
    """This module's folder on the session's JupyterLab (tests/browser/conftest.py), which
    saves the widgets' state with a notebook."""
    folder = jupyter.lab_folder(shared_lab, "xss")
    root = folder.root
    onnx.save(hm.xss_model(), str(root / EVIL))
    onnx.save(hm.xss_custom_op_model(), str(root / CUSTOM))
    (root / BROKEN).write_bytes(hm.xss_model().SerializeToString()[:300])
    subs = {"{root!r}": repr(str(ROOT)), "{evil!r}": repr(EVIL), "{custom!r}": repr(CUSTOM),
            "{broken!r}": repr(BROKEN)}
    cells = []
    for c in CELLS:
        for k, v in subs.items():
            c = c.replace(k, v)
        cells.append(_cell(c))
    nb = {"cells": cells, "nbformat": 4, "nbformat_minor": 5,
          "metadata": {"kernelspec": {"name": "python3", "display_name": "Python 3",
                                      "language": "python"}}}
    (root / "evil.ipynb").write_text(json.dumps(nb))
    yield folder
    folder.close()


@pytest.fixture(scope="module")
def page(lab, chromium):
    ARTIFACTS.mkdir(exist_ok=True)
    ctx, pg = jupyter.new_page(chromium, 1400, 1000, accept_downloads=True)
    yield pg
    ctx.close()


def _shot(pg, name, locator=None):
    (locator or pg).screenshot(path=str(ARTIFACTS / f"xss-{name}.png"))


def _no_xss(pg, when: str) -> None:
    """No payload ran or became an element: in the page, its same-origin frames (scanned
    from the page) and every other frame (Netron's, cross-origin: scanned in place)."""
    bad = pg.evaluate(SCAN)
    for frame in pg.frames[1:]:
        if frame.is_detached():
            continue
        try:
            found = frame.evaluate(SCAN)
        except Exception:  # noqa: BLE001 - Netron's page refuses evaluation (window.eval)
            found = _scan_by_selectors(frame)
        bad += [f"frame {frame.url[:40]}: {b}" for b in found]
    assert not bad, f"{when}: {bad[:10]}"
    assert not pg.dialogs, f"{when}: dialogs opened: {pg.dialogs}"


# what SCAN looks for, as selectors: Playwright queries them in its own isolated world, which
# works in a page (Netron's) that refuses script evaluation in its main world
BAD_SELECTORS = (".wbxss", "[data-wbxss]", "[onerror*='__xss']", "[onload*='__xss']",
                 "[onmouseover*='__xss']", "[onfocus*='__xss']", "[onclick*='__xss']",
                 "a[href^='javascript:' i]", "iframe[src^='javascript:' i]",
                 "iframe[srcdoc*='__xss']")


def _scan_by_selectors(frame) -> list:
    try:
        bad = [f"{sel}: {n} element(s)" for sel in BAD_SELECTORS
               if (n := frame.locator(sel).count())]
        bad += ["<script> holding the payload" for t in
                frame.locator("script").all_text_contents() if "__xss" in t]
        return bad
    except Exception:  # noqa: BLE001 - a frame that went away meanwhile
        return []


def _svg_is_inert(path: Path) -> str:
    """The exported SVG parses as XML and holds only drawing elements; returns its text."""
    doc = xml.dom.minidom.parse(str(path))
    allowed = {"svg", "rect", "text", "path", "defs", "marker", "g"}
    texts = []
    for e in doc.getElementsByTagName("*"):
        assert e.tagName in allowed, e.tagName
        for k, _ in e.attributes.items():
            assert not k.lower().startswith("on") and "wbxss" not in k, k
        texts += [c.data for c in e.childNodes if c.nodeType == c.TEXT_NODE]
    return "".join(texts)


def _run_cell(pg, i, wait=True):
    pg.evaluate("""async ([i, wait]) => {
        const app = window.jupyterapp, panel = app.shell.currentWidget;
        panel.content.activeCellIndex = i;
        panel.content.deselectAll();
        const done = app.commands.execute('notebook:run-cell');
        if (wait) await done;
    }""", [i, wait])


def _wait_idle(pg, timeout=180):
    deadline = time.time() + timeout
    while time.time() < deadline:
        prompts = pg.locator(".jp-Notebook .jp-InputPrompt").all_inner_texts()
        if prompts and not any("*" in p for p in prompts):
            return
        time.sleep(0.3)
    raise AssertionError("the kernel stayed busy")


def _exercise_graph(pg, view, name, export=False, tmp=None, full=True):
    """Hover and click every item of the first level, open every group (and click its
    items); with ``full``: search, click the legend, Show all; ``export``: SVG and PNG."""
    pg.wait_for_function("el => el.dataset.ready === '1'", arg=view.element_handle(),
                         timeout=60_000)
    view.scroll_into_view_if_needed()
    view.locator("button.wb-fit").click()

    def click_all(level_label):
        for it in view.evaluate(ITEMS):
            pg.mouse.move(it["x"], it["y"])
            pg.mouse.click(it["x"], it["y"])
            pg.wait_for_timeout(60)
        _no_xss(pg, f"{name}: after clicking the items of {level_label}")

    click_all("the first level")
    groups = [it for it in view.evaluate(ITEMS) if it["type"] == "group"]
    for g in groups:
        pg.mouse.dblclick(g["x"], g["y"])
        pg.wait_for_timeout(400)
        click_all(f"group {g['g']}")
        crumbs = view.locator("button.wb-crumb:not(.wb-here)")
        if crumbs.count():
            crumbs.first.click()
            pg.wait_for_timeout(300)
    if not full:
        return
    search = view.locator("input.wb-search")
    for q in ("<img", "wbxss", "'"):
        search.fill(q)
        search.press("Enter")
        search.press("Enter")
    search.fill("")
    for item in view.locator(".wb-legend-item").all():
        item.hover()
        item.click()
    if view.locator("button.wb-showall").is_visible():
        view.locator("button.wb-showall").click()
        click_all("the level with everything shown")
        view.locator("button.wb-showall").click()
    _no_xss(pg, f"{name}: after search, legend and Show all")
    if export:
        with pg.expect_download() as dl:
            view.locator("button.wb-export-svg").click()
        svg = Path(tmp) / f"{name}.svg"
        dl.value.save_as(str(svg))
        text = _svg_is_inert(svg)
        assert "wbxss" in text               # the payload labels are there, as text
        with pg.expect_download() as dl:
            view.locator("button.wb-export-png").click()
        png = Path(tmp) / f"{name}.png"
        dl.value.save_as(str(png))
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        _no_xss(pg, f"{name}: after the exports")


def _exercise_notebook(pg, cells, tmp):
    # GraphView, the custom-op GraphView, GraphCompare's two sides
    _exercise_graph(pg, cells.nth(1).locator(".wb-graphview"), "graphview", True, tmp)
    _exercise_graph(pg, cells.nth(6).locator(".wb-graphview"), "graphview-custom", True, tmp)
    comp = cells.nth(5).locator(".wb-graph-compare")
    for k in range(2):
        _exercise_graph(pg, comp.locator(".wb-graphview").nth(k), f"compare-{k}", full=False)
    # LayerCutter: every slider position, then every node of its drawing, with a new head
    cut = cells.nth(2).locator(".wb-layer-cutter")
    cut.scroll_into_view_if_needed()
    handle = cut.locator(".noUi-handle").first
    handle.focus()
    for _ in range(8):
        handle.press("ArrowLeft")
        pg.wait_for_timeout(150)
    cut.locator(".widget-checkbox input").first.check()
    _exercise_graph(pg, cut.locator(".wb-graphview"), "cutter", full=False)
    pg.wait_for_function("el => el.innerText.includes('cut after')", arg=cut.element_handle())
    assert "wbxss" in cut.locator(".wb-cut-info, .widget-html").first.inner_text() or \
        "wbxss" in cut.inner_text()                     # the payload names, as text
    _shot(pg, "cutter", cut)
    # TensorInspectors: every row, every header, the filter
    for k in (3, 4):
        ins = cells.nth(k).locator(".wb-inspector")
        ins.scroll_into_view_if_needed()
        for th in ins.locator("th").all():
            th.click()
        for row in ins.locator("tr.wb-row").all():
            row.hover()
            row.click()
            pg.wait_for_timeout(100)
        ins.locator("input[type=search]").fill("<img")
        ins.locator("input[type=search]").fill("")
        _no_xss(pg, f"inspector {k}")
    assert "cannot run" in cells.nth(4).locator(".wb-inspector").inner_text()
    _shot(pg, "inspector-custom", cells.nth(4).locator(".wb-inspector"))
    # TrainingMonitor: hover its charts
    mon = cells.nth(7).locator(".wb-monitor")
    mon.scroll_into_view_if_needed()
    for chart in mon.locator("canvas").all():
        chart.hover()
    assert "wbxss" in mon.inner_text()
    # Netron (its own viewer, in a frame of another origin): click its nodes
    frame_el = cells.nth(8).locator("iframe")
    frame_el.scroll_into_view_if_needed()
    frame = frame_el.content_frame
    try:
        frame.get_by_text("Accept").click(timeout=3_000)
    except Exception:  # noqa: BLE001 - no consent prompt
        pass
    try:
        frame.locator("g.node").first.wait_for(timeout=20_000)
        for node in frame.locator("g.node").all()[:8]:
            node.click()
            pg.wait_for_timeout(200)
    except Exception:  # noqa: BLE001 - an older Netron draws differently: scanned all the same
        pass
    _no_xss(pg, "netron")


def _widget_models(nb: dict) -> tuple[set, set]:
    """(model ids the outputs show, model ids in the saved widget state) of a notebook."""
    shown = {o["data"]["application/vnd.jupyter.widget-view+json"]["model_id"]
             for c in nb["cells"] for o in c.get("outputs", [])
             if "application/vnd.jupyter.widget-view+json" in o.get("data", {})}
    state = nb["metadata"].get("widgets", {}).get(
        "application/vnd.jupyter.widget-state+json", {}).get("state", {})
    return shown, set(state)


def _save_with_widget_state(pg, lab, timeout=60):
    """Save the notebook until the file holds the state of every widget its outputs show
    (after a reload the page's widget manager gets the kernel's models back one by one: a
    save before that holds only some of them)."""
    path = lab.root / "evil.ipynb"
    deadline = time.time() + timeout
    while True:
        jupyter.command(pg, "docmanager:open", {"path": lab.rel("evil.ipynb")})   # current
        jupyter.command(pg, "docmanager:save")
        shown, state = _widget_models(json.loads(path.read_text()))
        if shown and shown <= state:
            return
        if time.time() > deadline:
            raise AssertionError(f"the notebook was saved without the state of "
                                 f"{len(shown - state)} of its {len(shown)} widgets")
        pg.wait_for_timeout(1000)


def test_no_model_string_runs_script(lab, page, tmp_path):
    pg = page
    for old in ARTIFACTS.glob("xss-*.png"):
        old.unlink()
    try:
        _test(lab, pg, tmp_path)
    except Exception:
        _shot(pg, "failure")
        raise


def _test(lab, pg, tmp):
    t0 = time.perf_counter()
    pg.goto(lab.tree("evil.ipynb"))
    pg.wait_for_selector(".jp-Notebook .jp-Cell", timeout=90_000)
    pg.wait_for_selector(".jp-Notebook-ExecutionIndicator[data-status='idle']", timeout=90_000)
    pg.wait_for_function("window.jupyterapp && window.jupyterapp.shell.currentWidget && "
                         "window.jupyterapp.shell.currentWidget.sessionContext.session",
                         timeout=60_000)
    cells = pg.locator(".jp-Notebook .jp-Cell")
    for i in range(len(CELLS)):
        _run_cell(pg, i, wait=False)
    _wait_idle(pg)
    for k, sel in ((1, ".wb-graphview"), (2, ".wb-layer-cutter"), (3, ".wb-inspector"),
                   (4, ".wb-inspector"), (5, ".wb-graph-compare"), (6, ".wb-graphview"),
                   (7, ".wb-monitor"), (8, "iframe")):
        cells.nth(k).locator(sel).first.wait_for(timeout=60_000)
    assert "wbxss" in cells.nth(9).locator(".jp-OutputArea-output").first.inner_text()
    assert "not a valid ONNX model" in cells.nth(10).inner_text()
    pg.wait_for_timeout(1500)                       # Netron's page loads in its frame
    _no_xss(pg, "after running every cell")
    _shot(pg, "notebook")
    t_run = time.perf_counter() - t0
    _exercise_notebook(pg, cells, tmp)
    t_nb = time.perf_counter() - t0
    # ---- the ONNX Graph viewer: both models, and a broken file, all with payload names
    for path, nodes in ((EVIL, 4), (CUSTOM, 2)):
        jupyter.command(pg, "docmanager:open", {"path": lab.rel(path), "factory": "ONNX Graph"})
        panel = pg.locator(".jp-OnnxGraph:visible")
        pg.wait_for_function("el => el.dataset.status === 'ready'",
                             arg=panel.element_handle(), timeout=60_000)
        assert panel.get_attribute("data-path") == lab.rel(path)
        header = panel.locator(".jp-OnnxGraph-header").inner_text()
        assert "wbxss" in header and path in header, header
        assert int(panel.get_attribute("data-nodes")) == nodes
        _exercise_graph(pg, panel.locator(".wb-graphview"), f"viewer-{nodes}", True, tmp)
        _shot(pg, f"viewer-{nodes}")
        _no_xss(pg, f"the viewer on {path!r}")
    jupyter.command(pg, "docmanager:open", {"path": lab.rel(BROKEN), "factory": "ONNX Graph"})
    panel = pg.locator(".jp-OnnxGraph:visible")
    pg.wait_for_function("el => el.dataset.status === 'error'", arg=panel.element_handle(),
                         timeout=60_000)
    assert BROKEN in panel.inner_text() and "not a valid ONNX model" in panel.inner_text()
    _no_xss(pg, "the viewer's error panel")
    _shot(pg, "viewer-error")
    # the file browser lists the payload file names, as text
    jupyter.command(pg, "filebrowser:activate")
    pg.wait_for_timeout(500)
    _no_xss(pg, "the file browser")
    t_viewer = time.perf_counter() - t0
    # ---- save (with the widgets' state), reload: every output rendered again
    jupyter.command(pg, "docmanager:open", {"path": lab.rel("evil.ipynb")})
    _save_with_widget_state(pg, lab)
    pg.reload()
    pg.wait_for_selector(".jp-Notebook .jp-Cell", timeout=90_000)
    cells = pg.locator(".jp-Notebook .jp-Cell")
    cells.nth(2).locator(".wb-layer-cutter").wait_for(timeout=60_000)
    cells.nth(1).locator(".wb-graphview").wait_for(timeout=60_000)
    pg.wait_for_timeout(1500)
    _no_xss(pg, "after a reload (kernel alive)")
    _exercise_graph(pg, cells.nth(1).locator(".wb-graphview"), "graphview-reloaded",
                    full=False)
    # ---- a fresh kernel: the widgets come back from the state saved in the notebook
    _save_with_widget_state(pg, lab)
    pg.evaluate("""async ([token]) => {
        const r = await fetch('/api/sessions?token=' + token);
        for (const s of await r.json())
            await fetch('/api/sessions/' + s.id + '?token=' + token, {method: 'DELETE'});
    }""", [lab.token])
    # JupyterLab's widget manager restores the saved state when the notebook opens, but a
    # kernel that connects after that clears it ("model not found"): a race of JupyterLab's
    # own, so one more reload (the kernel then already up) is allowed
    for attempt in range(3):
        pg.reload()
        pg.wait_for_selector(".jp-Notebook .jp-Cell", timeout=90_000)
        cells = pg.locator(".jp-Notebook .jp-Cell")
        try:
            cells.nth(2).locator(".wb-layer-cutter, .widget-html").first.wait_for(
                timeout=30_000)
            break
        except Exception:  # noqa: BLE001 - retried, then raised
            _no_xss(pg, f"reopening with the saved widget state, attempt {attempt + 1}")
            if attempt == 2:
                raise
    pg.wait_for_timeout(2000)
    assert "wbxss" in cells.nth(2).inner_text()          # restored, the payloads as text
    _no_xss(pg, "after reopening with the saved widget state")
    _shot(pg, "reopened")
    print(f"\nXSS test: cells run at {t_run:.0f} s, widgets exercised at {t_nb:.0f} s, viewer "
          f"at {t_viewer:.0f} s, reloads done at {time.perf_counter() - t0:.0f} s (the saved state "
          f"restored at reload {attempt + 1})")
    assert pg.errors == [] or all("wbxss" not in e and "__xss" not in e for e in pg.errors), \
        pg.errors


if sys.platform != "linux":
    pytestmark = [pytest.mark.browser, pytest.mark.skip(reason="Linux only")]
