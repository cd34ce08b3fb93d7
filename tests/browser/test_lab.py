"""Real-browser test of the widgets: JupyterLab on 127.0.0.1, driven by Playwright with Debian's
Chromium. Clicks a graph node and checks that Python sees the selection, moves the cutter's
slider, clicks an inspector row, presses Stop on a running training loop, and keeps
screenshots in ``test-artifacts/``. Skips cleanly when chromium, playwright or jupyterlab is
missing.

Run: ``pytest -m browser tests/browser -s`` (prints the 2,500-node GraphView draw time).
"""

from __future__ import annotations

import json
import re
import time

import pytest

from tests.helpers import jupyter

pytestmark = pytest.mark.browser

CHROMIUM = jupyter.CHROMIUM
ROOT = jupyter.ROOT
ARTIFACTS = ROOT / "test-artifacts"


def _cell(src: str) -> dict:
    return {"cell_type": "code", "metadata": {}, "execution_count": None, "outputs": [],
            "source": src.strip("\n")}


CELLS = [
    # 0: setup
    """
import sys, time
sys.path.insert(0, {tests!r})
import numpy as np
import synth
from workbench.widgets import GraphView, LayerCutter, TensorInspector, TrainingMonitor, netron
mlp, cnn = synth.mlp(), synth.cnn()
x_cnn = np.random.default_rng(0).standard_normal((2, 1, 8, 8)).astype(np.float32)
""",
    # 1
    "gv = GraphView(mlp, height=360)\ngv",
    # 2
    "cutter = LayerCutter(mlp, height=300)\ncutter",
    # 3
    "insp = TensorInspector(cnn, [x_cnn], height=360)\ninsp",
    # 4
    """
with TrainingMonitor(total=40, title="short run") as mon:
    for i in range(40):
        time.sleep(0.02)
        mon.update(loss=1 / (i + 1), metrics={"acc": i / 40})
        if i % 10 == 9:
            mon.update(loss=1.3 / (i + 1), metrics={"acc": i / 45}, phase="val")
""",
    # 5
    """
t0 = time.perf_counter()
big = GraphView(synth.transformer_like(blocks=100), height=420)
print(f"python side: {len(big.graph.nodes)} nodes, {time.perf_counter() - t0:.2f} s")
big
""",
    # 6
    "nv = netron(mlp, height=320)\nnv",
    # 7: a long training loop, stopped with the Stop button
    """
mon2 = TrainingMonitor(total=600, title="stoppable")
with mon2:
    for i in range(600):
        time.sleep(0.05)
        mon2.update(loss=1 / (i + 1))
        if mon2.should_stop:
            break
""",
    # 8: probe: what Python sees
    """
print("PROBE", json.dumps({"selected": gv.selected, "details_op": gv.details.get("op"),
      "cut": cutter.last_layers, "outputs": cutter.outputs, "slider": cutter.slider.value,
      "insp_selected": insp.selected,
      "mon2_step": mon2.step, "mon2_reason": mon2.stop_reason, "render_ms": big.render_ms}))
""",
    # 9: two graphs side by side: the MLP and its cut with a new head
    """
from workbench.widgets import GraphCompare
from workbench.widgets.cutter import cut_graph
from workbench.graph.load import load
cmp = GraphCompare(mlp, cut_graph(load(mlp).graph, -3, head_classes=5).graph, height=320)
cmp
""",
]


@pytest.fixture(scope="module")
def lab(shared_lab):
    """This module's folder on the session's JupyterLab (tests/browser/conftest.py)."""
    folder = jupyter.lab_folder(shared_lab, "lab")
    cells = [_cell(c.replace("{tests!r}", repr(str(ROOT / "tests" / "widgets")))) for c in CELLS]
    cells[0]["source"] = "import json\n" + cells[0]["source"]
    nb = {"cells": cells, "nbformat": 4, "nbformat_minor": 5,
          "metadata": {"kernelspec": {"name": "python3", "display_name": "Python 3",
                                      "language": "python"}}}
    (folder.root / "widgets.ipynb").write_text(json.dumps(nb))
    yield folder
    folder.close()


@pytest.fixture(scope="module")
def page(lab, chromium):
    ARTIFACTS.mkdir(exist_ok=True)
    ctx, pg = jupyter.new_page(chromium, 1400, 1000)
    pg.goto(lab.tree("widgets.ipynb"))
    yield pg
    ctx.close()


def _shot(pg, name, locator=None):
    path = ARTIFACTS / f"lab-{name}.png"
    (locator or pg).screenshot(path=str(path))
    return path


def _run_cell(pg, i, wait=True):
    """Run cell i through JupyterLab's own commands (window.jupyterapp)."""
    pg.evaluate("""async ([i, wait]) => {
        const app = window.jupyterapp;
        const panel = app.shell.currentWidget;
        panel.content.activeCellIndex = i;
        panel.content.deselectAll();
        const done = app.commands.execute('notebook:run-cell');
        if (wait) await done;
    }""", [i, wait])
    return pg.locator(".jp-Notebook .jp-Cell").nth(i)


def _click_centre(pg, gv, expect, tries=4):
    """Click the middle of the graph canvas (where a search match is centred). Outputs that
    finish loading (the Netron iframe) can move the page, so measure right before clicking
    and retry."""
    for _ in range(tries):
        gv.scroll_into_view_if_needed()
        pg.wait_for_timeout(300)
        box = gv.locator(".wb-canvaswrap").bounding_box()
        pg.mouse.click(box["x"] + box["width"] / 2, box["y"] + box["height"] / 2)
        try:
            pg.wait_for_function(f"el => el.dataset.selected === {expect!r}",
                                 arg=gv.element_handle(), timeout=3_000)
            return box
        except Exception:
            gv.locator("input.wb-search").press("Enter")   # centre the match again
    raise AssertionError(f"clicking the centred node did not select {expect!r}")


def _wait_idle(pg, timeout=120):
    deadline = time.time() + timeout
    while time.time() < deadline:
        prompts = pg.locator(".jp-Notebook .jp-InputPrompt").all_inner_texts()
        if prompts and not any("*" in p for p in prompts):
            return
        time.sleep(0.3)
    raise AssertionError("the kernel stayed busy")


def test_widgets_in_jupyterlab(lab, page):
    pg = page
    for old in ARTIFACTS.glob("lab-*.png"):
        old.unlink()
    try:
        _test(lab, pg)
    except Exception:
        _shot(pg, "failure")
        raise


def _test(lab, pg):
    page = pg
    pg.wait_for_selector(".jp-Notebook .jp-Cell", timeout=60_000)
    # wait for the kernel to be ready
    pg.wait_for_selector(".jp-Notebook-ExecutionIndicator[data-status='idle']", timeout=60_000)
    pg.wait_for_function(f"document.querySelectorAll('.jp-Notebook .jp-Cell').length === "
                         f"{len(CELLS)}", timeout=30_000)
    cells = pg.locator(".jp-Notebook .jp-Cell")
    t_run = time.perf_counter()
    pg.wait_for_function("window.jupyterapp && window.jupyterapp.shell.currentWidget && "
                         "window.jupyterapp.shell.currentWidget.sessionContext.session",
                         timeout=60_000)
    for i in range(7):                               # every widget cell, in order
        _run_cell(pg, i, wait=False)
    # ---- GraphView
    gv = cells.nth(1).locator(".wb-graphview")
    gv.wait_for(timeout=60_000)
    assert gv.locator("canvas.wb-main").count() == 1
    assert gv.get_attribute("data-nodes") == "8"           # input + 6 ops + output
    assert "MatMul" in gv.locator(".wb-side").inner_text()   # legend
    # ---- the 2,500-node graph: draw time measured in the browser
    big = cells.nth(5).locator(".wb-graphview")
    big.wait_for(timeout=120_000)
    t_big = time.perf_counter() - t_run
    pg.wait_for_function("el => el.dataset.ready === '1'", arg=big.element_handle(),
                         timeout=60_000)
    assert big.get_attribute("data-layout-worker") == "1"     # dagre ran in a Web Worker
    draw_ms = float(big.get_attribute("data-draw-ms"))
    print(f"\n2,500-node GraphView: first draw in the browser {draw_ms:.0f} ms "
          f"(widget visible {t_big:.1f} s after the cells were started; includes kernel "
          f"start, imports and the layout)")
    _wait_idle(pg)
    print(cells.nth(5).locator(".jp-OutputArea-output").first.inner_text())
    cells.nth(6).locator("iframe").wait_for(timeout=30_000)
    pg.wait_for_timeout(2000)                      # let the Netron page load and settle
    big.scroll_into_view_if_needed()
    _shot(pg, "graphview-2500", big)
    # worst case: every node and edge on screen ("Fit"), drawn synchronously on click
    fit_ms = pg.evaluate("""el => { const b = [...el.querySelectorAll('button')]
        .find((x) => x.textContent === 'Fit'); const t = performance.now(); b.click();
        return performance.now() - t; }""", big.element_handle())
    print(f"2,500-node GraphView: redraw with the whole graph on screen {fit_ms:.0f} ms")
    _shot(pg, "graphview-2500-fit", big)
    big.locator("input.wb-search").fill("b50_attn")
    big.locator("input.wb-search").press("Enter")
    assert big.get_attribute("data-matches") == "1"
    _shot(pg, "graphview-2500-search", big)
    # search, then click the centred match: the node is selected in Python
    gv.scroll_into_view_if_needed()
    gv.locator("input.wb-search").fill("relu1")
    gv.locator("input.wb-search").press("Enter")
    assert gv.get_attribute("data-matches") == "1"
    box = _click_centre(pg, gv, "relu1")
    pg.wait_for_function(
        "el => el.querySelector('.wb-details').textContent.includes('Outputs')",
        arg=gv.element_handle(), timeout=10_000)   # details came back from Python
    assert "Relu" in gv.locator(".wb-details").inner_text()
    # pan and zoom do not break anything
    pg.mouse.move(box["x"] + 100, box["y"] + 100)
    pg.mouse.wheel(0, 300)
    pg.mouse.down()
    pg.mouse.move(box["x"] + 160, box["y"] + 140, steps=4)
    pg.mouse.up()
    assert gv.get_attribute("data-selected") == "relu1"     # a drag is not a click
    _shot(pg, "graphview", gv)
    # ---- LayerCutter: move the slider two steps left (-1 -> -3)
    cut = cells.nth(2).locator(".wb-layer-cutter")
    cut.scroll_into_view_if_needed()
    handle = cut.locator(".noUi-handle").first
    handle.focus()
    handle.press("ArrowLeft")
    handle.press("ArrowLeft")
    pg.wait_for_function("el => el.innerText.includes('cut after fc2 (MatMul)')",
                         arg=cut.element_handle(), timeout=10_000)
    assert "h4" in cut.locator(".wb-cut-info").inner_text()
    _shot(pg, "layercutter", cut)
    # clicking a node in the cutter's graph cuts there (and moves the slider to match)
    cgv = cut.locator(".wb-graphview")
    cgv.locator("input.wb-search").fill("relu1")
    cgv.locator("input.wb-search").press("Enter")
    _click_centre(pg, cgv, "relu1")
    pg.wait_for_function("el => el.innerText.includes('cut after relu1 (Relu)')",
                         arg=cut.element_handle(), timeout=10_000)
    pg.wait_for_function("el => el.querySelector('.widget-readout').textContent.includes('4')",
                         arg=cut.element_handle(), timeout=10_000)
    _shot(pg, "layercutter-click", cut)
    # ---- TensorInspector: sort by std, click the relu row -> histogram (+ feature maps)
    ins = cells.nth(3).locator(".wb-inspector")
    ins.scroll_into_view_if_needed()
    assert ins.locator("tr.wb-row").count() == 5
    ins.locator("th[data-col='std']").click()
    ins.locator("tr.wb-row[data-value='r1']").click()
    if ins.locator("tr.wb-row[data-value='r1'] td.wb-c-status").inner_text() == "ok":
        ins.locator("canvas.wb-hist").wait_for(timeout=10_000)
        ins.locator(".wb-ti-maps canvas").first.wait_for(timeout=10_000)
        assert ins.locator(".wb-ti-maps canvas").count() == 4
    _shot(pg, "inspector", ins)
    # ---- TrainingMonitor (short run, finished)
    mon = cells.nth(4).locator(".wb-monitor")
    mon.scroll_into_view_if_needed()
    assert mon.get_attribute("data-done") == "true"
    assert mon.locator(".wb-tm-chart").count() == 2               # loss, acc
    assert "40 step(s)" in mon.locator(".wb-tm-summary").inner_text()
    _shot(pg, "monitor", mon)
    # ---- Netron iframe served from the kernel on 127.0.0.1
    frame_el = cells.nth(6).locator("iframe")
    frame_el.wait_for(timeout=30_000)
    assert re.match(r"http://127\.0\.0\.1:\d+/", frame_el.get_attribute("src"))
    frame_el.scroll_into_view_if_needed()
    frame = frame_el.content_frame
    try:   # Netron asks for cookie consent on a first visit; accept it to see the graph
        frame.get_by_text("Accept").click(timeout=3_000)
    except Exception:
        pass
    pg.wait_for_timeout(1500)
    _shot(pg, "netron", cells.nth(6))
    # ---- Stop button on a running loop (the kernel is busy: Stop interrupts it cleanly)
    _run_cell(pg, 7, wait=False)
    mon2 = cells.nth(7).locator(".wb-monitor")
    mon2.wait_for(timeout=30_000)
    pg.wait_for_function("el => Number(el.dataset.step) >= 10", arg=mon2.element_handle(),
                         timeout=30_000)
    mon2.locator("button.wb-stop").click()
    pg.wait_for_function("el => el.dataset.done === 'true'", arg=mon2.element_handle(),
                         timeout=30_000)
    _shot(pg, "monitor-stopped", mon2)
    # ---- what Python saw
    _wait_idle(pg)
    probe = _run_cell(pg, 8)
    _wait_idle(pg)
    out = probe.locator(".jp-OutputArea-output").first.inner_text()
    seen = json.loads(out.split("PROBE", 1)[1])
    print("python sees:", seen)
    assert seen["selected"] == "relu1" and seen["details_op"] == "Relu"
    assert seen["cut"] == "relu1" and seen["outputs"] == ["h3"] and seen["slider"] == -4
    assert seen["insp_selected"] == "r1"
    assert 10 <= seen["mon2_step"] < 600 and seen["mon2_reason"] == "stop requested"
    assert seen["render_ms"] > 0
    assert "Traceback" not in pg.locator(".jp-Notebook").inner_text()
    # ---- GraphCompare: unmatched nodes ringed; a click selects the match on the other side
    _run_cell(pg, 9)
    comp = cells.nth(9).locator(".wb-graph-compare")
    comp.wait_for(timeout=30_000)
    left, right = comp.locator(".wb-graphview").nth(0), comp.locator(".wb-graphview").nth(1)
    for side in (left, right):
        pg.wait_for_function("el => el.dataset.ready === '1' && el.dataset.flagged === '2'",
                             arg=side.element_handle(), timeout=30_000)
    left.locator("input.wb-search").fill("relu1")
    left.locator("input.wb-search").press("Enter")
    _click_centre(pg, left, "relu1")
    pg.wait_for_function("el => el.dataset.selected === 'relu1'", arg=right.element_handle(),
                         timeout=10_000)
    _shot(pg, "graphcompare", comp)
    _shot(pg, "notebook")
    # ---- the kernel goes away: widgets stay usable locally, nothing hangs or throws
    pg.evaluate("""async ([token]) => {
        const r = await fetch('/api/sessions?token=' + token);
        for (const s of await r.json())
            await fetch('/api/kernels/' + s.kernel.id + '?token=' + token, {method: 'DELETE'});
    }""", [lab.token])
    pg.wait_for_timeout(1500)
    gv.locator("input.wb-search").fill("fc2")
    gv.locator("input.wb-search").press("Enter")
    _click_centre(pg, gv, "fc2")
    gv.locator(".wb-nokernel").wait_for(timeout=10_000)    # a clear message, no hang
    _shot(pg, "graphview-no-kernel", gv)
    assert page.errors == [], page.errors
