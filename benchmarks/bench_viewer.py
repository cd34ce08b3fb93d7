"""Scale benchmark of the GraphView drawing (issue 15): a generated graph of N nodes
(default 20,000: transformer-ish blocks with scoped names, constants and shape chains) drawn
by the widget's front-end in Chromium (Playwright), outside Jupyter.

Measures, with medians over --repeat runs:
- python: graph_payload (folding, groups, splits) and JSON size;
- json parse: JSON.parse of the payload text in the page (what arrives from the kernel);
- first paint: from the payload text (parse included) until the first level is laid out
  (dagre, in its Web Worker) and drawn;
- fit: the Fit action (redraw of the whole first level);
- open a group: double-click-equivalent open of the first group (layout + draw);
- pan frames: 60 drag steps, time between animation frames (median and 95th percentile).

Run: ``python benchmarks/bench_viewer.py [--nodes 20000] [--repeat 3]``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=int, default=20_000)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    from playwright.sync_api import sync_playwright

    from tests.helpers import jupyter
    from tests.helpers.graph_page import page_html
    from tests.helpers.viewer_models import big_graph
    from workbench.graph.load import load
    from workbench.widgets.graph_data import graph_payload

    g = load(big_graph(args.nodes), check=False).graph
    t0 = time.perf_counter()
    data = graph_payload(g)
    py_s = time.perf_counter() - t0
    text = json.dumps(data)
    print(f"graph: {len(g.nodes):,} nodes; python graph_payload {py_s:.2f} s, "
          f"{len(text) / 1e6:.2f} MB JSON, {data['folded']:,} folded")
    html = Path(tempfile.mkdtemp()) / "bench.html"
    html.write_text(page_html(), encoding="utf-8")
    res = {"json_parse_ms": [], "first_paint_ms": [], "fit_ms": [], "open_group_ms": [],
           "frame_med_ms": [], "frame_p95_ms": []}
    with sync_playwright() as pw:
        b = pw.chromium.launch(executable_path=jupyter.CHROMIUM, headless=True,
                               args=jupyter.CHROME_ARGS)
        for _ in range(args.repeat):
            pg = b.new_page(viewport={"width": 1280, "height": 820})
            pg.goto(html.as_uri())
            pg.wait_for_function("window.wbReady === true")
            pg.evaluate("t => { window.__text = t; }", text)
            ms = pg.evaluate("""async () => { const t0 = performance.now();
                const payload = JSON.parse(window.__text);
                const t1 = performance.now();
                await wbOpen(payload, {}, 680);
                await new Promise((r) => requestAnimationFrame(() => r()));
                return [t1 - t0, performance.now() - t0]; }""")
            res["json_parse_ms"].append(ms[0])
            res["first_paint_ms"].append(ms[1])
            res["fit_ms"].append(pg.evaluate("""() => { const gc = document.querySelector(
                '.wb-graphview').wbView.gc; const t0 = performance.now(); gc.fitAll();
                return performance.now() - t0; }"""))
            res["open_group_ms"].append(pg.evaluate("""async () => { const gc = document
                .querySelector('.wb-graphview').wbView.gc;
                const b = gc.lay.items.find((b) => b.it.type === 'group');
                const t0 = performance.now(); await gc.open(b.it.g);
                return performance.now() - t0; }"""))
            box = pg.locator(".wb-canvaswrap").bounding_box()
            pg.evaluate("""() => { window.__frames = []; let last = performance.now();
                const tick = (t) => { window.__frames.push(t - last); last = t;
                  if (window.__frames.length < 400) requestAnimationFrame(tick); };
                requestAnimationFrame(tick); }""")
            cx, cy = box["x"] + box["width"] / 2, box["y"] + box["height"] / 2
            pg.mouse.move(cx, cy)
            pg.mouse.down()
            for k in range(60):
                pg.mouse.move(cx + 3 * k, cy + 2 * k)
                pg.wait_for_timeout(16)
            pg.mouse.up()
            frames = sorted(pg.evaluate("() => window.__frames.slice(2)"))
            res["frame_med_ms"].append(statistics.median(frames))
            res["frame_p95_ms"].append(frames[int(0.95 * (len(frames) - 1))])
            pg.close()
        b.close()
    for k, v in res.items():
        print(f"{k:>16}: median {statistics.median(v):8.1f}   runs {[round(x, 1) for x in v]}")


if __name__ == "__main__":
    main()
