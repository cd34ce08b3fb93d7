"""Real-browser layout checks of the TensorInspector and TrainingMonitor front-ends: each
widget's ES module rendered by headless Chromium in a page of its own (no Jupyter; see
tests/helpers/widget_page.py), at several pane widths. The inspector's table fits its pane
(it scrolls inside the widget, nothing spills out), its histogram and the monitor's charts
have titled axes. Screenshots go to ``test-artifacts/layout-*.png``.

Run: ``pytest -m browser tests/browser/test_widget_layout.py``.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

from tests.helpers.widget_page import widget_html

pytestmark = pytest.mark.browser

ROOT = Path(__file__).resolve().parents[2]
ARTIFACTS = ROOT / "test-artifacts"
sys.path.insert(0, str(ROOT / "tests" / "widgets"))


@pytest.fixture(scope="module")
def browser(chromium):
    """The session's Chromium (tests/browser/conftest.py)."""
    ARTIFACTS.mkdir(exist_ok=True)
    return chromium


def _render(browser, widget, width, tmp_path, name):
    page_file = tmp_path / f"{name}.html"
    page_file.write_text(widget_html(widget, width))
    pg = browser.new_page(viewport={"width": width + 40, "height": 720})
    errors = []
    pg.on("pageerror", lambda e: errors.append(str(e)))
    pg.goto(page_file.as_uri())
    pg.wait_for_function("window.wbReady === true", timeout=30_000)
    pg.wait_for_timeout(200)          # ResizeObserver, requestAnimationFrame drawing
    return pg, errors


BOX = """sel => { const r = document.querySelector(sel).getBoundingClientRect();
  return [r.left, r.top, r.right, r.bottom]; }"""


def _inside(inner, outer, slack=1.0):
    return (inner[0] >= outer[0] - slack and inner[1] >= outer[1] - slack
            and inner[2] <= outer[2] + slack and inner[3] <= outer[3] + slack)


@pytest.fixture(scope="module")
def inspector():
    import synth

    from workbench.widgets import TensorInspector
    x = np.random.default_rng(0).standard_normal((1, 4, 8)).astype(np.float32)
    insp = TensorInspector(synth.transformer_like(blocks=4), [x], height=380)
    insp.selected = insp.rows[5]["value"]
    return insp


@pytest.mark.parametrize("width", [420, 700, 1100])
def test_inspector_table_fits_its_pane(browser, inspector, width, tmp_path):
    pg, errors = _render(browser, inspector, width, tmp_path, f"insp{width}")
    try:
        assert not errors, errors
        pane, root = pg.evaluate(BOX, "#pane"), pg.evaluate(BOX, ".wb-inspector")
        assert _inside(root, pane), (root, pane)
        for part in (".wb-ti-table", ".wb-ti-detail", ".wb-toolbar"):
            assert _inside(pg.evaluate(BOX, part), root), part
        m = pg.evaluate("""() => { const r = document.querySelector('.wb-inspector'),
            t = document.querySelector('.wb-ti-table'), cs = getComputedStyle(t);
            return {rootOverflowX: r.scrollWidth - r.clientWidth,
                    rows: t.querySelectorAll('tbody tr').length,
                    tScrollH: t.scrollHeight, tClientH: t.clientHeight,
                    tScrollW: t.scrollWidth, tClientW: t.clientWidth,
                    oy: cs.overflowY, ox: cs.overflowX,
                    narrow: r.classList.contains('wb-narrow'),
                    page: document.documentElement.scrollWidth -
                          document.documentElement.clientWidth};
            }""")
        assert m["rootOverflowX"] <= 1 and m["page"] <= 0, m       # nothing spills out
        assert m["rows"] == len(inspector.rows)
        assert m["oy"] == "auto" and m["ox"] == "auto", m
        assert m["tScrollH"] > m["tClientH"], m                      # long tables scroll
        pg.evaluate("() => { document.querySelector('.wb-ti-table').scrollTop = 1e6; }")
        last, box = (pg.evaluate(BOX, ".wb-ti-table tbody tr:last-child"),
                     pg.evaluate(BOX, ".wb-ti-table"))
        assert box[1] - 2 <= last[1] and last[3] <= box[3] + 2, "last row unreachable"
        assert m["narrow"] == (width < 620), m
        if m["tScrollW"] > m["tClientW"]:                 # wide columns: scroll sideways
            pg.evaluate("() => { document.querySelector('.wb-ti-table').scrollLeft = 1e6; }")
            cell = pg.evaluate(BOX, ".wb-ti-table thead th:last-child")
            box = pg.evaluate(BOX, ".wb-ti-table")
            assert box[0] - 2 <= cell[0] and cell[2] <= box[2] + 2, "last column unreachable"
        hist = pg.locator("canvas.wb-hist")
        assert hist.get_attribute("data-x-title").startswith("value (")
        assert hist.get_attribute("data-y-title").startswith("count (")
        pg.screenshot(path=str(ARTIFACTS / f"layout-inspector-{width}.png"))
    finally:
        pg.close()


def test_monitor_charts_have_axis_titles(browser, tmp_path):
    from workbench.widgets.monitor import _MonitorWidget, curves_svg
    rng = np.random.default_rng(0)
    train = [[i, float(2.0 / i + 0.05 * rng.random())] for i in range(1, 61)]
    series = {"loss": {"train": train, "val": [[20, 0.3], [40, 0.2], [60, 0.18]]},
              "acc": {"train": [[i, i / 60] for i in range(1, 61)], "val": [[60, 0.9]]}}
    w = _MonitorWidget(title="fit", total=60)
    w.series, w.step, w.done = series, 60, True
    w.latest = {"train": {"loss": train[-1][1], "acc": 1.0}, "val": {"loss": 0.18}}
    pg, errors = _render(browser, w, 760, tmp_path, "monitor")
    try:
        assert not errors, errors
        charts = pg.locator(".wb-tm-chart canvas")
        assert charts.count() == 2
        for i, name in enumerate(["loss", "acc"]):
            assert charts.nth(i).get_attribute("data-x-title") == "step (batches)"
            assert charts.nth(i).get_attribute("data-y-title") == name
        pg.screenshot(path=str(ARTIFACTS / "layout-monitor.png"))
        # the static picture (what a saved notebook shows) rendered by the same browser
        pg.set_content(f"<body style='margin:0'>{curves_svg(series, 'fit')}</body>")
        box = pg.evaluate(BOX, "svg")
        assert box[2] - box[0] >= 600 and box[3] - box[1] >= 200
        titles = pg.eval_on_selector_all("text.x-title, text.y-title",
                                         "els => els.map(e => e.textContent)")
        assert titles == ["step (batches)", "loss", "step (batches)", "acc"]
        pg.screenshot(path=str(ARTIFACTS / "layout-monitor-svg.png"))
    finally:
        pg.close()
