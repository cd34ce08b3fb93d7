"""An anywidget front-end in headless Chromium wired to its Python object without Jupyter: the
page's stand-in model sends ``save_changes`` and ``send`` to Python through Playwright
(``page.expose_function``) and applies what changed in the widget's synced state, and the
widget's custom messages, in return - a kernel in a few lines, for front-ends that talk to
Python (the ModelEditor's menus). The same ES module the notebook runs (``widget._esm``).
"""

from __future__ import annotations

import json

from tests.helpers.widget_page import _js

PAGE = """<!doctype html><html><head><meta charset="utf-8"><style>
body { margin: 0; padding: 10px; background: #fff; }
#pane { width: %(width)dpx; }
</style></head><body><div id="pane"></div>
<script type="module">
const state = %(state)s;
const handlers = {};
let dirty = {};
const fire = (ev, ...a) => (handlers[ev] || []).slice().forEach((f) => f(...a));
const apply = (answer) => {
  const r = JSON.parse(answer);
  for (const [k, v] of Object.entries(r.state)) { state[k] = v; }
  for (const k of Object.keys(r.state)) fire("change:" + k);
  for (const m of r.msgs) fire("msg:custom", m, []);
};
const model = {
  get: (k) => state[k],
  set: (k, v) => { state[k] = v; dirty[k] = v; fire("change:" + k); },
  save_changes: () => {
    const d = dirty; dirty = {};
    window.wbPython(JSON.stringify({ sync: d })).then(apply);
  },
  on: (ev, f) => { (handlers[ev] = handlers[ev] || []).push(f); },
  off: (ev, f) => { handlers[ev] = (handlers[ev] || []).filter((g) => g !== f); },
  send: (msg) => { window.wbPython(JSON.stringify({ msg })).then(apply); },
};
window.wbModel = model;
const src = %(esm)s;
const mod = await import(URL.createObjectURL(new Blob([src], { type: "text/javascript" })));
await mod.default.render({ model, el: document.getElementById("pane") });
window.wbReady = true;
</script></body></html>"""


def _synced(widget) -> dict:
    return {k: v for k, v in widget.get_state().items()
            if not k.startswith("_") and not isinstance(v, (bytes, bytearray, memoryview))}


def open_page(browser, widget, tmp_path, *, width: int = 1100, height: int = 900):
    """A page showing ``widget`` (an anywidget) wired to it; returns the Playwright page.
    ``page.errors`` collects the page's JavaScript errors."""
    sent: list = []
    widget.send = lambda content, buffers=None: sent.append(content)
    handlers = list(widget._msg_callbacks.callbacks)
    last = {"state": json.loads(json.dumps(_synced(widget), default=str))}

    def python(text: str) -> str:
        req = json.loads(text)
        if "sync" in req:
            with widget.hold_sync():
                for k, v in req["sync"].items():
                    setattr(widget, k, v)
        if "msg" in req:
            for cb in handlers:
                cb(widget, req["msg"], [])
        now = json.loads(json.dumps(_synced(widget), default=str))
        changed = {k: v for k, v in now.items() if last["state"].get(k) != v}
        last["state"] = now
        msgs = list(sent)
        sent.clear()
        return json.dumps({"state": changed, "msgs": msgs}, default=str)

    page_file = tmp_path / "kernel_page.html"
    page_file.write_text(PAGE % {"width": width, "state": _js(last["state"]),
                                 "esm": _js(widget._esm)})
    pg = browser.new_page(viewport={"width": width + 40, "height": height})
    pg.errors = []
    pg.on("pageerror", lambda e: pg.errors.append(str(e)))
    pg.expose_function("wbPython", python)
    pg.goto(page_file.as_uri())
    pg.wait_for_function("window.wbReady === true", timeout=30_000)
    return pg
