"""A page that draws a graph with the GraphView front-end outside Jupyter (for Playwright
tests and benchmarks): the widget's ES module inline, a local stand-in for the anywidget model
that answers node selections from :func:`workbench.widgets.graph_data.all_node_details`."""

from __future__ import annotations

import json

from workbench.widgets.graph_data import all_node_details, graph_payload
from workbench.widgets.graph_view import GraphView

STUB = """
class WbStubModel {
  constructor(attrs, details) { this.a = attrs; this.h = {}; this.details = details; }
  get(k) { return this.a[k]; }
  set(k, v) {
    this.a[k] = v;
    if (k === "selected") this.a.details = (v && this.details[v]) || {};
    for (const fn of [...(this.h["change:" + k] || [])]) fn();
    if (k === "selected") for (const fn of [...(this.h["change:details"] || [])]) fn();
  }
  on(e, fn) { (this.h[e] = this.h[e] || []).push(fn); }
  off(e, fn) { this.h[e] = (this.h[e] || []).filter((f) => f !== fn); }
  save_changes() {}
}
window.wbOpen = (payload, details, height, extra) => {
  const host = document.getElementById("host");
  host.textContent = "";
  const model = new WbStubModel(Object.assign({ graph_data: payload, title: "graph", height,
    selected: "", details: {}, highlight: [], dimmed: [], marked: [], overlay: {},
    render_ms: -1 }, extra || {}), details);
  window.wbModel = model;
  window.wbViewHandle = wbRenderGraphView(model, host, { reportTiming: false });
  return window.wbViewHandle.ready;
};
window.wbReady = true;
"""


def page_html() -> str:
    """An HTML page with the GraphView module; call ``wbOpen(payload, details, height)``."""
    src = GraphView._esm.replace("export default {", "const __wbWidget = {")
    return (
        "<!doctype html><html><head><meta charset='utf-8'><title>graph</title></head>"
        "<body style='margin:0;padding:8px'><div id='host'></div>"
        f"<script type='module'>{src}\n{STUB}</script></body></html>"
    )


def payload_of(graph, details: bool = True):
    """(graph_payload, all_node_details or {}) as JSON-ready objects."""
    data = graph_payload(graph)
    det = all_node_details(graph) if details else {}
    return json.loads(json.dumps(data)), json.loads(json.dumps(det, default=str))
