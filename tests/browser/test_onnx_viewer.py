"""Real-browser test of the JupyterLab extension (extensions/jupyterlab-onnx): JupyterLab on
127.0.0.1 with a token, the prebuilt front-end from workbench/labextension and the server
extension enabled in a private config; Playwright drives Debian's Chromium. Opens the embedded
default model by URL (/lab/tree/<file>), checks the summary header and the drawing, clicks a node
for its details, opens a corrupt file (a clear message), fixes it and presses Reload, and opens a
2,500-node model and a PaddleOCR-style export (its first screen: stages, no Constant nodes),
and checks the message shown when the server extension is not enabled.
Screenshots go to ``test-artifacts/labext-*.png``. Skips cleanly when
chromium, playwright or jupyterlab is missing.

Run: ``pytest -m browser tests/browser/test_onnx_viewer.py -s``.
"""

from __future__ import annotations

import shutil
import sys
import time
from pathlib import Path

import onnx
import pytest

from tests.helpers import jupyter

pytestmark = pytest.mark.browser

ROOT = Path(__file__).resolve().parents[2]
ARTIFACTS = ROOT / "test-artifacts"
DEFAULT_MODEL = ROOT / "workbench" / "data" / "default_model.onnx"


@pytest.fixture(scope="module")
def lab(shared_lab):
    """This module's folder on the session's JupyterLab (tests/browser/conftest.py)."""
    folder = jupyter.lab_folder(shared_lab, "viewer")
    root = folder.root
    shutil.copy(DEFAULT_MODEL, root / "default_model.onnx")
    (root / "broken.onnx").write_bytes(DEFAULT_MODEL.read_bytes()[:700])
    sys.path.insert(0, str(ROOT / "tests" / "widgets"))
    import synth
    onnx.save(synth.transformer_like(blocks=100), str(root / "big.onnx"))
    from tests.helpers.viewer_models import paddle_ocr_like
    onnx.save(paddle_ocr_like(), str(root / "paddle_rec.onnx"))
    yield folder
    folder.close()


def _start_lab(base, root, server_extension):
    """A JupyterLab of its own: this working tree's front-end, the server extension enabled
    or disabled in its private config."""
    try:
        return jupyter.start_test_lab(base, root, server_extension=server_extension)
    except RuntimeError as e:
        pytest.fail(str(e))


@pytest.fixture(scope="module")
def browser(chromium):
    ARTIFACTS.mkdir(exist_ok=True)
    return chromium


def _new_page(browser):
    return jupyter.new_page(browser, 1400, 900)


@pytest.fixture(scope="module")
def page(browser):
    ctx, pg = _new_page(browser)
    yield pg
    ctx.close()


def _shot(pg, name, locator=None):
    path = ARTIFACTS / f"labext-{name}.png"
    (locator or pg).screenshot(path=str(path))
    return path


def _panel(pg, path):
    return pg.locator(f".jp-OnnxGraph[data-path='{path}']")


def _open(pg, path):
    jupyter.command(pg, "docmanager:open", {"path": path})
    return _panel(pg, path)


def test_onnx_viewer_in_jupyterlab(lab, page):
    for old in ARTIFACTS.glob("labext-*.png"):
        if "no-server" not in old.name:
            old.unlink()
    try:
        _test(lab, page)
    except Exception:
        _shot(page, "failure")
        raise


def _test(lab, pg):
    t0 = time.perf_counter()
    pg.goto(lab.tree("default_model.onnx"))
    # ---- opened by URL with the default viewer for .onnx: the ONNX Graph document
    panel = _panel(pg, lab.rel("default_model.onnx"))
    panel.wait_for(timeout=90_000)
    pg.wait_for_function("el => el.dataset.status === 'ready'", arg=panel.element_handle(),
                         timeout=60_000)
    # 'ready' means the data arrived; the first level is laid out in a worker afterwards
    # (data-ready on the view) and drawn on the next frame
    pg.wait_for_function("el => el.querySelector('.wb-graphview') && "
                         "el.querySelector('.wb-graphview').dataset.ready === '1'",
                         arg=panel.element_handle(), timeout=60_000)
    print(f"\nJupyterLab up and default_model.onnx drawn {time.perf_counter() - t0:.1f} s "
          f"after page load started")
    tab = pg.locator("#jp-main-dock-panel .lm-TabBar-tab.lm-mod-current .lm-TabBar-tabLabel")
    assert "default_model.onnx" in tab.first.inner_text()
    header = panel.locator(".jp-OnnxGraph-header")
    assert header.locator(".jp-OnnxGraph-nodecount").inner_text() == "10 nodes"
    text = header.inner_text()
    for words in ("onnx-workbench", "IR version", "7", "ai.onnx 13", "image", "float",
                  "[batch, 1, 8, 8]", "logits", "[batch, 10]", "14,378", "parameters",
                  "kernels for every operator"):
        assert words in text, (words, text)
    view = panel.locator(".wb-graphview")
    assert view.locator("canvas.wb-main").count() == 1
    assert view.get_attribute("data-nodes") == "12"              # 10 ops + input + output
    assert "Conv" in view.locator(".wb-side").inner_text()        # op colour legend
    box = view.locator(".wb-canvaswrap").bounding_box()
    assert box["width"] > 600 and box["height"] > 300              # fills the panel
    # the canvas has something drawn on it (not a blank panel)
    count_ink = """el => { const c = el.querySelector('canvas.wb-main');
        const d = c.getContext('2d').getImageData(0, 0, c.width, c.height).data;
        let n = 0; for (let i = 3; i < d.length; i += 4) if (d[i] > 0) n++; return n; }"""
    try:   # drawn on the frame after the layout: wait for it, however slow the machine
        pg.wait_for_function(f"el => ({count_ink})(el) > 2000", arg=view.element_handle(),
                             timeout=30_000)
    except Exception:
        pass
    inked = pg.evaluate(count_ink, view.element_handle())
    assert inked > 2000, inked
    _shot(pg, "onnx-graph")
    # ---- search, then click the centred node: the details panel shows its op type
    search = view.locator("input.wb-search")
    search.fill("Flatten")
    search.press("Enter")
    assert view.get_attribute("data-matches") == "1"
    for _ in range(4):
        box = view.locator(".wb-canvaswrap").bounding_box()
        pg.mouse.click(box["x"] + box["width"] / 2, box["y"] + box["height"] / 2)
        try:
            pg.wait_for_function("el => el.dataset.selected === '/10/Flatten'",
                                 arg=view.element_handle(), timeout=3_000)
            break
        except Exception:
            search.press("Enter")
    details = view.locator(".wb-details")
    assert view.get_attribute("data-selected") == "/10/Flatten"
    det = details.inner_text()
    assert "Flatten" in det and "/10/Flatten" in det and "outputs" in det.lower(), det
    assert "axis" in det                                           # attributes
    _shot(pg, "onnx-graph-details")
    # pan and zoom keep the selection
    pg.mouse.move(box["x"] + 80, box["y"] + 80)
    pg.mouse.wheel(0, -200)
    pg.mouse.down()
    pg.mouse.move(box["x"] + 160, box["y"] + 120, steps=4)
    pg.mouse.up()
    assert view.get_attribute("data-selected") == "/10/Flatten"
    # ---- a corrupt file: a clear message in the panel, never a blank one
    broken = _open(pg, lab.rel("broken.onnx"))
    broken.wait_for(timeout=30_000)
    pg.wait_for_function("el => el.dataset.status === 'error'", arg=broken.element_handle(),
                         timeout=30_000)
    msg = broken.locator(".jp-OnnxGraph-error").inner_text()
    assert "broken.onnx: not a valid ONNX model" in msg, msg
    assert broken.locator(".jp-OnnxGraph-error").get_attribute("data-status-code") == "422"
    _shot(pg, "onnx-graph-error")
    # ---- fix the file on disk and press Reload: the graph appears
    shutil.copy(DEFAULT_MODEL, lab.root / "broken.onnx")
    doc = pg.locator(".jp-OnnxGraphDocument:visible")
    doc.locator(".jp-Toolbar").get_by_text("Reload").click()
    pg.wait_for_function("el => el.dataset.status === 'ready'", arg=broken.element_handle(),
                         timeout=30_000)
    assert broken.locator(".jp-OnnxGraph-nodecount").inner_text() == "10 nodes"
    # ---- the file disappears: Reload says so
    (lab.root / "broken.onnx").unlink()
    doc.locator(".jp-Toolbar").get_by_text("Reload").click()
    pg.wait_for_function("el => el.dataset.status === 'error'", arg=broken.element_handle(),
                         timeout=30_000)
    assert "broken.onnx: file not found" in broken.inner_text()
    # ---- 2,500 nodes
    t0 = time.perf_counter()
    big = _open(pg, lab.rel("big.onnx"))
    big.wait_for(timeout=30_000)
    pg.wait_for_function("el => el.dataset.status === 'ready'", arg=big.element_handle(),
                         timeout=120_000)
    bview = big.locator(".wb-graphview")
    pg.wait_for_function("el => el.dataset.ready === '1'", arg=bview.element_handle(),
                         timeout=60_000)
    print(f"2,500-node model: opened and drawn in {time.perf_counter() - t0:.1f} s "
          f"(first draw in the browser {float(bview.get_attribute('data-draw-ms')):.0f} ms)")
    assert int(big.get_attribute("data-nodes")) >= 2500
    bview.locator("input.wb-search").fill("b50_attn")
    bview.locator("input.wb-search").press("Enter")
    assert bview.get_attribute("data-matches") == "1"
    _shot(pg, "onnx-graph-2500")
    # ---- a PaddleOCR-style export: the first screen is its stages, not its 141 Constants
    paddle = _open(pg, lab.rel("paddle_rec.onnx"))
    paddle.wait_for(timeout=30_000)
    pg.wait_for_function("el => el.dataset.status === 'ready' && "
                         "el.querySelector('.wb-graphview').dataset.ready === '1'",
                         arg=paddle.element_handle(), timeout=60_000)
    pg.wait_for_timeout(300)
    vis = pg.evaluate("el => el.querySelector('.wb-graphview').wbView.gc.visibleItems()",
                      paddle.element_handle())
    assert not [v for v in vis if v["type"] == "node" and v["op"] == "Constant"], vis
    assert [v["label"] for v in vis if v["type"] == "node" and v["kind"] == 1] == ["x"]
    assert [v["label"] for v in vis if v["type"] == "node" and v["kind"] == 2] == ["softmax_out"]
    assert all(v["full"] for v in vis) and sum(v["type"] == "group" for v in vis) >= 3
    assert paddle.locator(".wb-graphview").get_attribute("data-layout-worker") == "1"
    _shot(pg, "onnx-graph-paddle")
    assert pg.errors == [], pg.errors


def test_without_the_server_extension(browser, tmp_path):
    """The front-end is installed but the server extension is not enabled: the panel says so
    and how to fix it (not a blank panel)."""
    root = tmp_path / "root"
    root.mkdir()
    shutil.copy(DEFAULT_MODEL, root / "model.onnx")
    srv = _start_lab(tmp_path, root, server_extension=False)
    ctx, pg = _new_page(browser)
    try:
        pg.goto(f"{srv.url}/lab/tree/model.onnx?token={srv.token}")
        panel = _panel(pg, "model.onnx")
        panel.wait_for(timeout=90_000)
        pg.wait_for_function("el => el.dataset.status === 'error'",
                             arg=panel.element_handle(), timeout=60_000)
        text = panel.inner_text()
        assert "server extension is not available" in text, text
        assert "jpserver_extensions=workbench=True" in text, text
        _shot(pg, "onnx-graph-no-server-extension")
        assert pg.errors == [], pg.errors
    finally:
        ctx.close()
        srv.stop()
