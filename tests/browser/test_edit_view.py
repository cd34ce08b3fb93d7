"""Real-browser tests of model surgery in the drawing (issue 24, phase 2): Playwright drives
Debian's Chromium.

- In a JupyterLab notebook, the ModelEditor widget: right-click a node and bypass it (Python's
  ``session.steps`` has the edit, the drawing marks what changed), click two edges and extract
  the part between them, undo, an edit the session refuses (its error shown in the menu where
  the action was chosen, nothing changed in Python), a rename through a form, Save (then
  Save again: the drawing asks before replacing; Cancel keeps the file), Compare (a
  GraphCompare below).
- In the JupyterLab ``.onnx`` viewer: Edit, bypass a node, rename another through its form,
  undo (Ctrl+Z), redo (the button), Save as a new file (the original untouched; the saved
  model passes the checker and the engine computes what the edited graph should; the file
  browser lists it), Save over the open file (a dialog asks: Cancel writes nothing, Replace
  writes it), Done: the viewer shows the saved file.
- In the ``.onnx`` viewer, a model whose every string is an HTML payload, edited through the
  server endpoint (menus, a refused rename quoting payloads, a rename to a payload, History,
  Script, Save as): nothing becomes markup.
- Without Jupyter (the widget's ES module in a page wired to its Python object): a model
  whose every string is an HTML payload, through menus, forms, an error, History and Script:
  nothing becomes markup.

One JupyterLab server for the module (the front-end of this working tree, the server
extension enabled). Screenshots in ``test-artifacts/edit-*.png``. Skips cleanly without
chromium, playwright, jupyterlab or anywidget.

Run: ``pytest -m browser tests/browser/test_edit_view.py -s``.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import numpy_helper

from tests.helpers import hostile_models as hm
from tests.helpers import jupyter

pytestmark = pytest.mark.browser

ROOT = Path(__file__).resolve().parents[2]
ARTIFACTS = ROOT / "test-artifacts"
sys.path.insert(0, str(ROOT / "tests" / "widgets"))


CELLS = [
    # 0: the editor
    """
import json, sys
sys.path.insert(0, {tests!r})
import synth
from workbench.widgets import ModelEditor
ed = ModelEditor(synth.mlp(), height=430)
ed
""",
    # 1: what Python sees (n: a new answer each time)
    """
s = ed.session
n = globals().get("n", 0) + 1
print("PROBE", json.dumps({"n": n, "records": s.records(), "undone": [u.record for u in s.undone],
                           "nodes": [n.name for n in s.model.graph.node],
                           "compare": [type(c).__name__ for c in ed.compare_box.children]}))
""",
]


@pytest.fixture(scope="module")
def lab(shared_lab):
    """This module's folder on the session's JupyterLab (tests/browser/conftest.py)."""
    import synth
    folder = jupyter.lab_folder(shared_lab, "edit")
    onnx.save(synth.mlp(), str(folder.root / "mlp.onnx"))
    onnx.save(hm.xss_model(), str(folder.root / "xss.onnx"))
    cells = [{"cell_type": "code", "metadata": {}, "execution_count": None, "outputs": [],
              "source": c.replace("{tests!r}", repr(str(ROOT / "tests" / "widgets"))).strip()}
             for c in CELLS]
    nb = {"cells": cells, "nbformat": 4, "nbformat_minor": 5,
          "metadata": {"kernelspec": {"name": "python3", "display_name": "Python 3",
                                      "language": "python"}}}
    (folder.root / "edit.ipynb").write_text(json.dumps(nb))
    yield folder
    folder.close()


@pytest.fixture(scope="module")
def browser(chromium):
    ARTIFACTS.mkdir(exist_ok=True)
    for old in ARTIFACTS.glob("edit-*.png"):
        old.unlink()
    return chromium


def _page(browser, width=1400, height=1000):
    return jupyter.new_page(browser, width, height)


def _shot(pg, name, locator=None):
    (locator or pg).screenshot(path=str(ARTIFACTS / f"edit-{name}.png"))


# ---------------------------------------------------------------------------- pointing
def _node_xy(pg, edit, name):
    """The screen point of node ``name`` in the edit view (scrolled into view first)."""
    edit.scroll_into_view_if_needed()
    return pg.evaluate("""([el, name]) => { const gc = el.wbEdit.view.gc;
        const i = gc.index.get(name); gc.ensureVisible(i);
        const b = gc.itemBoxOf(i), r = gc.canvas.getBoundingClientRect();
        return [r.left + b.x * gc.k + gc.tx, r.top + b.y * gc.k + gc.ty]; }""",
                       [edit.element_handle(), name])


def _edge_xy(pg, edit, value):
    edit.scroll_into_view_if_needed()
    xy = pg.evaluate("([el, v]) => el.wbEdit.edgeMiddle(v)", [edit.element_handle(), value])
    assert xy, f"no edge carries {value!r}"
    return xy


def _menu_action(pg, edit, name, action):
    """Right-click node ``name`` and choose ``action`` from its menu; returns the point."""
    x, y = _node_xy(pg, edit, name)
    pg.mouse.click(x, y, button="right")
    item = edit.locator(f".wb-menu [data-action='{action}']")
    item.wait_for(timeout=10_000)
    item.click()
    return x, y


def _wait(pg, edit, cond, timeout=60_000):
    pg.wait_for_function(f"el => {cond}", arg=edit.element_handle(), timeout=timeout)


def _settled(pg, edit, steps, undone=0):
    _wait(pg, edit, f"el.dataset.editBusy !== '1' && el.dataset.editSteps === '{steps}' && "
                    f"el.dataset.editUndone === '{undone}' && el.dataset.editReady === '1' "
                    f"&& el.querySelector('.wb-graphview').dataset.ready === '1'")
    pg.wait_for_timeout(250)


# ---------------------------------------------------------------------------- notebook
def _run_cell(pg, i):
    pg.evaluate("""async (i) => { const app = window.jupyterapp;
        const panel = app.shell.currentWidget; panel.content.activeCellIndex = i;
        panel.content.deselectAll(); await app.commands.execute('notebook:run-cell'); }""", i)


def _probe(pg):
    cell = pg.locator(".jp-Notebook .jp-Cell").nth(1)
    before = cell.locator(".jp-OutputArea-output").all_inner_texts()
    _run_cell(pg, 1)
    deadline = time.time() + 60
    while time.time() < deadline:
        outs = cell.locator(".jp-OutputArea-output").all_inner_texts()
        if outs and outs != before and "PROBE" in outs[0]:
            return json.loads(outs[0].split("PROBE", 1)[1])
        time.sleep(0.2)
    raise AssertionError("the probe cell printed nothing")


def test_model_editor_in_a_notebook(lab, browser):
    ctx, pg = _page(browser)
    try:
        _notebook(lab, pg)
    except Exception:
        _shot(pg, "notebook-failure")
        raise
    finally:
        ctx.close()


def _notebook(lab, pg):
    pg.goto(lab.tree("edit.ipynb"))
    pg.wait_for_selector(".jp-Notebook .jp-Cell", timeout=90_000)
    pg.wait_for_selector(".jp-Notebook-ExecutionIndicator[data-status='idle']", timeout=90_000)
    pg.wait_for_function("window.jupyterapp && window.jupyterapp.shell.currentWidget && "
                         "window.jupyterapp.shell.currentWidget.sessionContext.session",
                         timeout=60_000)
    t0 = time.perf_counter()
    _run_cell(pg, 0)
    edit = pg.locator(".jp-Notebook .jp-Cell").nth(0).locator(".wb-edit")
    edit.wait_for(timeout=90_000)
    _settled(pg, edit, 0)
    print(f"\nModelEditor shown {time.perf_counter() - t0:.1f} s after its cell was run")
    # ---- select a node, bypass it: Python has the step, the drawing marks the change
    x, y = _node_xy(pg, edit, "relu1")
    pg.mouse.click(x, y, button="right")
    menu = edit.locator(".wb-menu")
    menu.wait_for(timeout=10_000)
    assert "relu1" in menu.locator(".wb-menu-head").inner_text()
    assert edit.locator(".wb-graphview").get_attribute("data-selected") == "relu1"
    _shot(pg, "notebook-menu", edit)
    menu.locator("[data-action='bypass']").click()
    _settled(pg, edit, 1)
    assert "relu1" not in pg.evaluate("el => el.wbEdit.view.gc.data.name", edit.element_handle())
    assert edit.get_attribute("data-marks-changed") == "fc2"       # it reads relu1's input now
    last = edit.locator(".wb-edit-last").inner_text()
    assert "session.bypass_node(node='relu1')" in last and "1 removed: relu1" in last, last
    _shot(pg, "notebook-bypass", edit)
    seen = _probe(pg)
    assert seen["records"] == [{"edit": "bypass_node", "args": {"node": "relu1"}}], seen
    assert "relu1" not in seen["nodes"]
    # ---- select two values (click an edge, shift-click another) and extract between them
    pg.mouse.click(*_edge_xy(pg, edit, "h2"))
    pg.keyboard.down("Shift")
    pg.mouse.click(*_edge_xy(pg, edit, "logits"))
    pg.keyboard.up("Shift")
    _wait(pg, edit, "el.dataset.values === 'h2\\nlogits'", 10_000)
    _shot(pg, "notebook-two-values", edit)
    edit.locator(".wb-edit-extract").click()
    _settled(pg, edit, 2)
    names = pg.evaluate("el => el.wbEdit.view.gc.data.name", edit.element_handle())
    assert names == ["h2", "fc2", "fc2_bias", "logits"], names
    _shot(pg, "notebook-extract", edit)
    seen = _probe(pg)
    assert seen["records"][-1] == {"edit": "extract",
                                   "args": {"inputs": ["h2"], "outputs": ["logits"]}}, seen
    # ---- undo: the extract is taken back (and can be redone)
    edit.locator(".wb-edit-undo").click()
    _settled(pg, edit, 1, undone=1)
    assert "softmax" in pg.evaluate("el => el.wbEdit.view.gc.data.name", edit.element_handle())
    seen = _probe(pg)
    assert len(seen["records"]) == 1 and seen["undone"][0]["edit"] == "extract", seen
    # ---- an edit the session refuses: the error where the action was chosen
    x, y = _menu_action(pg, edit, "fc1", "delete")
    err = edit.locator(".wb-menu .wb-edit-error")
    err.wait_for(timeout=30_000)
    text = err.inner_text()
    assert "'fc1' (MatMul) cannot be deleted" in text and "fc1_bias" in text, text
    box = edit.locator(".wb-menu").bounding_box()
    assert abs(box["x"] - x) < 60 and abs(box["y"] - y) < 260, (box, x, y)   # at the node
    assert edit.get_attribute("data-edit-steps") == "1"
    _shot(pg, "notebook-error", edit)
    seen = _probe(pg)
    assert len(seen["records"]) == 1 and "fc1" in seen["nodes"], seen
    # ---- a form: rename a value; a bad name is refused in the form, then corrected
    pg.mouse.click(*_edge_xy(pg, edit, "h4"), button="right")
    edit.locator(".wb-menu [data-action='rename_value']").click()
    field = edit.locator(".wb-menu input[name='new']")
    assert field.input_value() == "h4"
    field.fill("logits")                                           # taken already
    edit.locator(".wb-menu .wb-edit-apply").click()
    edit.locator(".wb-menu .wb-edit-error").wait_for(timeout=30_000)
    assert "logits" in edit.locator(".wb-menu .wb-edit-error").inner_text()
    edit.locator(".wb-menu input[name='new']").fill("scores")
    edit.locator(".wb-menu .wb-edit-apply").click()
    _settled(pg, edit, 2)
    # ---- Save (beside the notebook, the kernel's folder); again: asked in the drawing
    edit.locator(".wb-edit-save").click()
    assert edit.locator(".wb-menu input[name='path']").input_value() == "edited.onnx"
    edit.locator(".wb-menu .wb-edit-apply").click()
    _wait(pg, edit, "el.dataset.saved === 'edited.onnx' && el.dataset.unsaved !== '1'", 30_000)
    saved = lab.root / "edited.onnx"
    first = (saved.read_bytes(), os.stat(saved).st_ino)
    assert "scores" in [v for n in onnx.load_from_string(first[0]).graph.node for v in n.output]
    edit.locator(".wb-edit-save").click()
    edit.locator(".wb-menu .wb-edit-apply").click()
    keep = edit.locator(".wb-menu .wb-edit-keep")
    keep.wait_for(timeout=30_000)
    assert "edited.onnx exists already" in edit.locator(".wb-menu-head").inner_text()
    _shot(pg, "notebook-replace", edit)
    keep.click()
    assert (saved.read_bytes(), os.stat(saved).st_ino) == first          # not replaced
    # ---- Compare: a GraphCompare of before/after opens below the editor
    edit.locator(".wb-edit-compare").click()
    cmp = pg.locator(".jp-Notebook .jp-Cell").nth(0).locator(".wb-graph-compare")
    cmp.wait_for(timeout=60_000)
    cmp.scroll_into_view_if_needed()
    pg.wait_for_timeout(800)
    _shot(pg, "notebook-compare", pg.locator(".jp-Notebook .jp-Cell").nth(0))
    seen = _probe(pg)
    assert seen["records"][-1] == {"edit": "rename_value", "args": {"old": "h4",
                                                                    "new": "scores"}}
    assert seen["compare"] == ["Button", "GraphCompare"]
    assert "Traceback" not in pg.locator(".jp-Notebook").inner_text()
    assert pg.errors == [], pg.errors


# ---------------------------------------------------------------------------- .onnx viewer
def test_edit_and_save_in_the_onnx_viewer(lab, browser):
    ctx, pg = _page(browser)
    try:
        _viewer(lab, pg)
    except Exception:
        _shot(pg, "viewer-failure")
        raise
    finally:
        ctx.close()


def _names(pg, edit):
    return pg.evaluate("el => el.wbEdit.view.gc.data.name", edit.element_handle())


def _save_as(pg, edit, path):
    edit.locator(".wb-edit-save").click()
    field = edit.locator(".wb-menu input[name='path']")
    field.wait_for(timeout=10_000)
    field.fill(path)
    edit.locator(".wb-menu .wb-edit-apply").click()


def _viewer(lab, pg):
    pg.goto(lab.tree("mlp.onnx"))
    panel = pg.locator(f".jp-OnnxGraph[data-path='{lab.rel('mlp.onnx')}']")
    panel.wait_for(timeout=90_000)
    pg.wait_for_function("el => el.dataset.status === 'ready'", arg=panel.element_handle(),
                         timeout=60_000)
    doc = pg.locator(".jp-OnnxGraphDocument:visible")
    original = (lab.root / "mlp.onnx").read_bytes()
    t0 = time.perf_counter()
    doc.locator(".jp-OnnxGraph-edit").click()
    pg.wait_for_function("el => el.dataset.status === 'editing'", arg=panel.element_handle(),
                         timeout=90_000)
    edit = panel.locator(".wb-edit")
    _settled(pg, edit, 0)
    print(f"\n.onnx viewer: edit session open in {time.perf_counter() - t0:.1f} s")
    assert doc.locator(".jp-OnnxGraph-done").is_visible()
    assert not doc.locator(".jp-OnnxGraph-edit").is_visible()
    # ---- bypass a node from its menu
    _menu_action(pg, edit, "relu1", "bypass")
    _settled(pg, edit, 1)
    assert edit.get_attribute("data-unsaved") == "1"
    assert "bypass_node" in edit.locator(".wb-edit-last").inner_text()
    assert "relu1" not in _names(pg, edit)
    _shot(pg, "viewer-bypass")
    # ---- rename a node through its form; undo it, redo it
    _menu_action(pg, edit, "fc2", "rename_node")
    field = edit.locator(".wb-menu input[name='new']")
    assert field.input_value() == "fc2"
    field.fill("head")
    edit.locator(".wb-menu .wb-edit-apply").click()
    _settled(pg, edit, 2)
    assert edit.get_attribute("data-marks-changed") == "head"       # renamed: changed, in place
    assert "head" in _names(pg, edit) and "fc2" not in _names(pg, edit)
    pg.evaluate("el => el.wbEdit.view.gc.wrap.focus()", edit.element_handle())
    pg.keyboard.press("Control+z")                     # the drawing's shortcut, not JupyterLab's
    _settled(pg, edit, 1, undone=1)
    assert "fc2" in _names(pg, edit) and "head" not in _names(pg, edit)
    assert edit.locator(".wb-edit-redo").is_enabled()
    edit.locator(".wb-edit-redo").click()
    _settled(pg, edit, 2)
    assert "head" in _names(pg, edit) and not edit.locator(".wb-edit-redo").is_enabled()
    # ---- Save as a new file: written at once, the original untouched
    _save_as(pg, edit, lab.rel("mlp_edited.onnx"))     # (paths of the server's root)
    _wait(pg, edit, f"el.dataset.saved === '{lab.rel('mlp_edited.onnx')}' && "
          "el.dataset.unsaved !== '1'", 30_000)
    assert (lab.root / "mlp.onnx").read_bytes() == original
    saved = onnx.load(str(lab.root / "mlp_edited.onnx"))
    assert [n.name for n in saved.graph.node] == ["fc1", "fc1_bias", "head", "fc2_bias",
                                                  "softmax"]
    onnx.checker.check_model(saved, full_check=True)
    _runs_as_the_mlp_without_relu(saved)
    pg.locator(".jp-DirListing-item[title*='mlp_edited.onnx']").wait_for(timeout=5_000)
    _shot(pg, "viewer-saved-as")
    # ---- Save over the open file: a dialog asks; Cancel leaves it, Replace writes it
    _save_as(pg, edit, lab.rel("mlp.onnx"))
    dialog = pg.locator(".jp-Dialog")
    dialog.wait_for(timeout=30_000)
    assert "Replace the file?" in dialog.inner_text() and "mlp.onnx" in dialog.inner_text()
    _shot(pg, "viewer-save-dialog")
    dialog.locator("button.jp-mod-reject").click()
    dialog.wait_for(state="detached", timeout=10_000)
    assert (lab.root / "mlp.onnx").read_bytes() == original          # not without consent
    assert edit.get_attribute("data-saved") == lab.rel("mlp_edited.onnx")
    _save_as(pg, edit, lab.rel("mlp.onnx"))
    pg.locator(".jp-Dialog button.jp-mod-warn").click()
    _wait(pg, edit, f"el.dataset.saved === '{lab.rel('mlp.onnx')}'", 30_000)
    assert (lab.root / "mlp.onnx").read_bytes() == saved.SerializeToString()
    assert sorted(p.name for p in lab.root.iterdir() if p.name.startswith("mlp")) == [
        "mlp.onnx", "mlp_edited.onnx"]                                 # no temporary debris
    # ---- Done: the viewer reads the file again, the change is there
    doc.locator(".jp-OnnxGraph-done").click()
    pg.wait_for_function("el => el.dataset.status === 'ready'", arg=panel.element_handle(),
                         timeout=60_000)
    assert doc.locator(".jp-OnnxGraph-edit").is_visible()
    assert panel.locator(".jp-OnnxGraph-nodecount").inner_text() == "5 nodes"
    view = panel.locator(".wb-graphview")
    assert view.get_attribute("data-nodes") == "7"                   # 5 ops + input + output
    assert "Relu" not in view.locator(".wb-side").inner_text()
    pg.wait_for_function("el => el.dataset.ready === '1'", arg=view.element_handle(),
                         timeout=60_000)
    _shot(pg, "viewer-done")
    assert pg.errors == [], pg.errors


def _runs_as_the_mlp_without_relu(model):
    """The saved model, run by the engine, computes softmax((x W1 + b1) W2 + b2)."""
    from workbench import backend
    w = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    x = np.random.default_rng(1).standard_normal((3, 8)).astype(np.float32)
    z = (x @ w["W1"] + w["b1"]) @ w["W2"] + w["b2"]
    want = np.exp(z - z.max(-1, keepdims=True))
    want /= want.sum(-1, keepdims=True)
    (got,) = backend.prepare(model).run([x])
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    relu = np.maximum(x @ w["W1"] + w["b1"], 0) @ w["W2"] + w["b2"]
    assert not np.allclose(z, relu)                    # the bypass did change the function


# ---------------------------------------------------------------------------- hostile names
def test_hostile_model_edited_in_the_onnx_viewer(lab, browser):
    """A model whose every string is an HTML payload, edited through the server endpoint in
    the .onnx viewer: menus, a rename to a payload name, a refused rename quoting payloads,
    History, Script, Save as; nothing becomes markup."""
    ctx, pg = _page(browser)
    try:
        pg.goto(lab.tree("xss.onnx"))
        panel = pg.locator(f".jp-OnnxGraph[data-path='{lab.rel('xss.onnx')}']")
        panel.wait_for(timeout=90_000)
        pg.wait_for_function("el => el.dataset.status === 'ready'",
                             arg=panel.element_handle(), timeout=60_000)
        pg.locator(".jp-OnnxGraphDocument:visible .jp-OnnxGraph-edit").click()
        pg.wait_for_function("el => el.dataset.status === 'editing'",
                             arg=panel.element_handle(), timeout=90_000)
        edit = panel.locator(".wb-edit")
        _settled(pg, edit, 0)
        relu, matmul = hm._p("node", 0), hm._p("node2", 2)
        _menu_action(pg, edit, matmul, "rename_node")
        assert matmul in edit.locator(".wb-menu-head").inner_text()
        edit.locator(".wb-menu input[name='new']").fill(relu)          # a clash: refused
        edit.locator(".wb-menu .wb-edit-apply").click()
        err = edit.locator(".wb-menu .wb-edit-error")
        err.wait_for(timeout=30_000)
        text = err.inner_text()                                # the payload, as text
        assert "exists already" in text and relu.replace("'", "\\'") in text, text
        new = hm._p("renamed", 6)
        edit.locator(".wb-menu input[name='new']").fill(new)
        edit.locator(".wb-menu .wb-edit-apply").click()
        _settled(pg, edit, 1)
        assert new in _names(pg, edit) and matmul not in _names(pg, edit)
        last = edit.locator(".wb-edit-last").inner_text()      # long names shortened, as text
        assert "session.rename_node(node='node2<a class=\"wbxss\"" in last, last
        edit.locator(".wb-edit-history").click()
        assert "[1] session.rename_node(node='node2<a class=" in (
            edit.locator(".wb-edit-panel").inner_text())
        edit.locator(".wb-edit-script").click()
        edit.locator(".wb-edit-script-text").wait_for(timeout=30_000)
        script = edit.locator(".wb-edit-script-text").inner_text()
        assert f"edit.open('{lab.rel('xss.onnx')}')" in script and repr(new) in script, script
        _save_as(pg, edit, lab.rel("xss_edited.onnx"))
        _wait(pg, edit, f"el.dataset.saved === '{lab.rel('xss_edited.onnx')}'", 30_000)
        saved = onnx.load(str(lab.root / "xss_edited.onnx"))
        assert new in [n.name for n in saved.graph.node]
        pg.wait_for_timeout(300)
        _shot(pg, "viewer-hostile")
        assert pg.evaluate("() => window.__xss === undefined"), pg.evaluate("window.__xss")
        assert pg.locator(f".{hm.MARK}, [data-{hm.MARK}]").count() == 0
        assert pg.errors == [], pg.errors
    except Exception:
        _shot(pg, "viewer-hostile-failure")
        raise
    finally:
        ctx.close()


def test_hostile_names_stay_text_in_the_edit_ui(browser, tmp_path):
    """The edit front-end alone in Chromium, wired to its Python ModelEditor (no Jupyter):
    a model whose every name is an HTML payload, through every node's menu, a form, a refused
    edit quoting a payload, a done edit, History and Script."""
    from tests.helpers.kernel_page import open_page
    from workbench.widgets import ModelEditor
    ed = ModelEditor(hm.xss_model(), check="static", height=460)
    pg = open_page(browser, ed.view, tmp_path, width=1100)
    try:
        edit = pg.locator(".wb-edit")
        _settled(pg, edit, 0)
        data = pg.evaluate("el => el.wbEdit.view.gc.data", edit.element_handle())
        ops = [n for n, k, h in zip(data["name"], data["kind"], data["host"])
               if h == -1]
        for name in ops:                      # every drawn item's menu
            x, y = _node_xy(pg, edit, name)
            pg.mouse.click(x, y, button="right")
            edit.locator(".wb-menu").wait_for(timeout=5_000)
            assert name in edit.locator(".wb-menu-head").inner_text()
            pg.keyboard.press("Escape")
        node = next(n for n, k, r in zip(data["name"], data["kind"], data["ref"])
                    if k == 0 and r)
        other = next(n for n, k in zip(data["name"], data["kind"]) if k == 0 and n != node)
        _menu_action(pg, edit, node, "rename_node")
        edit.locator(".wb-menu input[name='new']").fill(other)      # a clash: refused
        edit.locator(".wb-menu .wb-edit-apply").click()
        err = edit.locator(".wb-menu .wb-edit-error")
        err.wait_for(timeout=30_000)
        assert hm.MARK in err.inner_text()                # the payload, as text
        edit.locator(".wb-menu input[name='new']").fill(hm._p("renamed", 2))
        edit.locator(".wb-menu .wb-edit-apply").click()
        _settled(pg, edit, 1)
        assert hm.MARK in edit.locator(".wb-edit-last").inner_text()
        edit.locator(".wb-edit-history").click()
        edit.locator(".wb-edit-script").click()
        edit.locator(".wb-edit-script-text").wait_for(timeout=30_000)
        assert "renamed" in edit.locator(".wb-edit-script-text").inner_text()
        pg.wait_for_timeout(500)
        _shot(pg, "hostile-names")
        assert pg.evaluate("() => window.__xss === undefined"), pg.evaluate("window.__xss")
        assert pg.locator(f".{hm.MARK}, [data-{hm.MARK}]").count() == 0
        assert pg.errors == [], pg.errors
    finally:
        pg.close()
