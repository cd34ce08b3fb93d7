"""One anywidget front-end rendered in headless Chromium without Jupyter: a page that imports
the widget's ES module (``widget._esm``, the same code the notebook runs) and hands its
``render`` a small stand-in for the anywidget model holding the widget's synced state.

For layout checks (does the table fit its pane, are the axes titled) that need a real browser
but not a kernel: seconds instead of a JupyterLab start. ``model.set``/``save_changes`` only
change the page's copy (nothing goes back to Python).
"""

from __future__ import annotations

import base64
import json

PAGE = """<!doctype html><html><head><meta charset="utf-8"><style>
body { margin: 0; padding: 10px; background: #fff; }
#pane { width: %(width)dpx; border: 1px dashed #999; }
</style></head><body><div id="pane"></div>
<script type="module">
const state = %(state)s;
const buffers = %(buffers)s;
for (const [k, b64] of Object.entries(buffers)) {
  const bin = atob(b64), u = new Uint8Array(bin.length);
  for (let i = 0; i < bin.length; i++) u[i] = bin.charCodeAt(i);
  state[k] = new DataView(u.buffer);
}
const handlers = {};
const model = {
  get: (k) => state[k],
  set: (k, v) => { state[k] = v; (handlers["change:" + k] || []).forEach((f) => f()); },
  save_changes: () => {},
  on: (ev, f) => { (handlers[ev] = handlers[ev] || []).push(f); },
  off: (ev, f) => { handlers[ev] = (handlers[ev] || []).filter((g) => g !== f); },
  send: () => {},
};
window.wbModel = model;
const src = %(esm)s;
const mod = await import(URL.createObjectURL(new Blob([src], { type: "text/javascript" })));
await mod.default.render({ model, el: document.getElementById("pane") });
window.wbReady = true;
</script></body></html>"""


def widget_html(widget, width: int = 700) -> str:
    """An HTML page that renders ``widget`` (an anywidget) into a ``width``-pixel pane."""
    state, buffers = {}, {}
    for name, value in widget.get_state().items():
        if name.startswith("_"):
            continue
        if isinstance(value, (bytes, bytearray, memoryview)):
            buffers[name] = base64.b64encode(bytes(value)).decode("ascii")
        else:
            state[name] = value
    return PAGE % {"width": width, "state": _js(state), "buffers": _js(buffers),
                   "esm": _js(widget._esm)}


def _js(value) -> str:
    """``value`` as a JavaScript literal inside a <script> element: JSON with "</" written
    "<\\/" (a model's names may hold "</script>")."""
    return json.dumps(value).replace("</", "<\\/")
