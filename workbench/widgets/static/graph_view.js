// ONNX Workbench - GraphView front-end (follows graph_core.js).

function wbRenderGraphView(model, el, opts = {}) {
  wbInjectStyle();
  const t0 = performance.now();
  const data = model.get("graph_data");
  const root = wbEl("div", { class: "wb-root wb-graphview", style: `height:${model.get("height")}px` });
  const title = wbEl("span", { class: "wb-title" }, model.get("title") || "graph");
  const search = wbEl("input", { type: "search", placeholder: "search name or op…", class: "wb-search" });
  const count = wbEl("span", { class: "wb-muted wb-count" }, "");
  const fit = wbEl("button", { class: "wb-btn", title: "fit the whole graph" }, "Fit");
  const info = wbEl("span", { class: "wb-muted" },
    `${(data.op_counts ? Object.values(data.op_counts).reduce((a, b) => a + b, 0) : 0).toLocaleString()} nodes`);
  const toolbar = wbEl("div", { class: "wb-toolbar" }, title, info, search, count, fit);
  if (opts.toolbarExtra) toolbar.appendChild(opts.toolbarExtra);
  const wrap = wbEl("div", { class: "wb-canvaswrap" });
  const details = wbEl("div", { class: "wb-details" });
  const legendTitle = wbEl("h4", null, "Operators");
  const side = wbEl("div", { class: "wb-side" }, details);
  const body = wbEl("div", { class: "wb-body" }, wrap, side);
  root.appendChild(toolbar);
  if (!data.name || data.name.length === 0) {
    root.appendChild(wbEl("div", { class: "wb-msg" }, "This graph has no nodes, inputs or outputs to draw."));
  }
  root.appendChild(body);
  el.appendChild(root);

  const gc = new WbGraphCanvas(wrap, data);
  let matches = [], cursor = -1;
  let lateTimer = 0;
  const setSelectedLocal = (i, centre) => {
    gc.selected = i;
    details.innerHTML = wbDetailsHTML(data, i, model.get("details"));
    clearTimeout(lateTimer);
    if (i >= 0) lateTimer = setTimeout(() => {
      if (gc.selected === i) details.innerHTML = wbDetailsHTML(data, i, model.get("details"), true);
    }, 4000);
    root.dataset.selected = i >= 0 ? data.name[i] : "";
    if (centre && i >= 0) gc.centreOn(i); else gc.draw();
  };
  gc.on((i, name) => {
    setSelectedLocal(i, false);
    model.set("selected", i >= 0 ? name : "");
    model.save_changes();
    if (opts.onClick) opts.onClick(i, name);
  });
  const runSearch = (advance) => {
    const q = search.value;
    if (!advance || !matches.length) { matches = gc.search(q); cursor = -1; }
    gc.highlight = new Set(matches);
    count.textContent = q ? `${matches.length} match${matches.length === 1 ? "" : "es"}` : "";
    if (matches.length) {
      cursor = (cursor + 1) % matches.length;
      if (matches.length > 1) count.textContent = `${cursor + 1}/${matches.length}`;
      gc.centreOn(matches[cursor]);
    } else gc.draw();
    root.dataset.matches = String(matches.length);
  };
  search.addEventListener("input", () => runSearch(false));
  search.addEventListener("keydown", (e) => { if (e.key === "Enter") { e.preventDefault(); runSearch(true); } });
  fit.addEventListener("click", () => gc.fitAll());
  side.appendChild(legendTitle);
  side.appendChild(wbLegend(data, (op) => {
    search.value = op; runSearch(false);
  }));

  const sync = (kind) => { gc.setNames(kind, model.get(kind)); gc.draw(); };
  gc.setNames("highlight", model.get("highlight"));
  gc.setNames("dimmed", model.get("dimmed"));
  gc.setNames("marked", model.get("marked"));
  const onSel = () => {
    const nm = model.get("selected");
    const i = nm ? gc.index.get(nm) : -1;
    setSelectedLocal(i === undefined ? -1 : i, true);
  };
  const onDetails = () => { details.innerHTML = wbDetailsHTML(data, gc.selected, model.get("details")); };
  const showMarked = () => { const first = [...gc.marked][0]; if (first !== undefined) gc.ensureVisible(first); };
  const onH = () => sync("highlight"), onD = () => sync("dimmed");
  const onM = () => { sync("marked"); showMarked(); };
  model.on("change:selected", onSel);
  model.on("change:details", onDetails);
  model.on("change:highlight", onH);
  model.on("change:dimmed", onD);
  model.on("change:marked", onM);
  const initSel = model.get("selected");
  if (initSel && gc.index.has(initSel)) setSelectedLocal(gc.index.get(initSel), true);
  else setSelectedLocal(-1, false);
  gc.resize(); gc.fitInitial(); gc.draw();
  const ms = performance.now() - t0;
  root.dataset.drawMs = ms.toFixed(1);
  root.dataset.nodes = String(data.name ? data.name.length : 0);
  if (opts.reportTiming !== false && model.get("render_ms") < 0) {
    model.set("render_ms", ms);
    model.save_changes();
  }
  return {
    root, gc,
    destroy() {
      clearTimeout(lateTimer);
      model.off("change:selected", onSel); model.off("change:details", onDetails);
      model.off("change:highlight", onH); model.off("change:dimmed", onD); model.off("change:marked", onM);
      gc.destroy();
    },
  };
}

export default {
  render({ model, el }) {
    const view = wbRenderGraphView(model, el);
    // the first layout can happen before the element is attached: redraw once it has a size
    requestAnimationFrame(() => {
      const gc = view.gc;
      gc.resize(); gc.fitInitial();
      if (gc.selected >= 0) gc.centreOn(gc.selected);
      else { const m = [...gc.marked][0]; if (m !== undefined) gc.ensureVisible(m); gc.draw(); }
    });
    return () => view.destroy();
  },
};
