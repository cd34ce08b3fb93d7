// ONNX Workbench - GraphView front-end (follows graph_core.js).

function wbRenderGraphView(model, el, opts = {}) {
  wbInjectStyle();
  const t0 = performance.now();
  const data = model.get("graph_data");
  const root = wbEl("div", { class: "wb-root wb-graphview", style: `height:${model.get("height")}px` });
  const title = wbEl("span", { class: "wb-title" }, model.get("title") || "graph");
  const search = wbEl("input", { type: "search", placeholder: "search name or op…", class: "wb-search" });
  const count = wbEl("span", { class: "wb-muted wb-count" }, "");
  const fit = wbEl("button", { class: "wb-btn wb-fit", title: "fit the whole level (key 0)" }, "Fit");
  const all = wbEl("button", { class: "wb-btn wb-showall", title: "show the folded constants and shape computations too" }, "Show all");
  const mapBtn = wbEl("button", { class: "wb-btn wb-on wb-maptoggle", title: "show or hide the minimap" }, "Map");
  const shown = data.host ? data.host.filter((h) => h === -1).length : (data.name || []).length;
  const info = wbEl("span", { class: "wb-muted wb-info" },
    `${(data.op_counts ? Object.values(data.op_counts).reduce((a, b) => a + b, 0) : 0).toLocaleString()} nodes` +
    (data.folded ? ` (+${data.folded.toLocaleString()} folded)` : ""));
  const svgBtn = wbEl("button", { class: "wb-btn wb-export-svg", title: "save the current view as SVG" }, "SVG");
  const pngBtn = wbEl("button", { class: "wb-btn wb-export-png", title: "save the current view as PNG" }, "PNG");
  const toolbar = wbEl("div", { class: "wb-toolbar" }, title, info, search, count, all, mapBtn, fit, svgBtn, pngBtn);
  if (opts.toolbarExtra) toolbar.appendChild(opts.toolbarExtra);
  if (!data.folded) all.style.display = "none";
  const crumbs = wbEl("div", { class: "wb-crumbs" });
  const wrap = wbEl("div", { class: "wb-canvaswrap", title: "drag: pan · wheel / + -: zoom · arrows: pan · double-click: open · Backspace: up" });
  const details = wbEl("div", { class: "wb-details" });
  const legendTitle = wbEl("h4", null, "Operators");
  const side = wbEl("div", { class: "wb-side" });
  const body = wbEl("div", { class: "wb-body" }, wrap, side);
  root.appendChild(toolbar);
  root.appendChild(crumbs);
  if (!data.name || data.name.length === 0) {
    root.appendChild(wbEl("div", { class: "wb-msg" }, "This graph has no nodes, inputs or outputs to draw."));
  }
  root.appendChild(body);
  el.appendChild(root);

  const gc = new WbGraphCanvas(wrap, data, { engine: opts.engine });
  side.appendChild(gc.mini);
  side.appendChild(details);
  let matches = [], cursor = -1;
  let lateTimer = 0;
  const showDetails = (i) => {
    if (i < 0 && gc.selectedGroup >= 0) details.replaceChildren(wbGroupDetails(gc.graph, gc.selectedGroup));
    else details.replaceChildren(wbDetails(data, i, model.get("details")));
    const facts = i >= 0 || gc.selectedGroup >= 0 ? wbOverlayFacts(gc, i, gc.selectedGroup) : null;
    if (facts) details.appendChild(facts);
  };
  const setSelectedLocal = (i, reveal) => {
    gc.selected = i;
    showDetails(i);
    clearTimeout(lateTimer);
    if (i >= 0) lateTimer = setTimeout(() => {
      if (gc.selected === i) details.replaceChildren(wbDetails(data, i, model.get("details"), true));
    }, 4000);
    root.dataset.selected = i >= 0 ? data.name[i] : "";
    if (reveal && i >= 0) gc.reveal(i); else gc.draw();
  };
  gc.on((i, name, it) => {
    setSelectedLocal(i, false);
    model.set("selected", i >= 0 ? name : "");
    model.save_changes();
    if (opts.onClick) opts.onClick(i, name, it);
  });
  const renderCrumbs = (L) => {
    if (gc.selectedGroup >= 0 && !(gc.lay && gc.lay.byKey.has("g" + gc.selectedGroup))) {
      gc.selectedGroup = -1;            // the group selected is not on this level any more
      showDetails(gc.selected);
    }
    crumbs.textContent = "";
    const cr = gc.graph.crumbs(L);
    cr.forEach(([lv, label], k) => {
      if (k) crumbs.appendChild(wbEl("span", { class: "wb-muted" }, "›"));
      const here = k === cr.length - 1;
      const b = wbEl("button", { class: "wb-crumb" + (here ? " wb-here" : ""), "data-level": String(lv) }, label);
      if (!here) b.addEventListener("click", () => gc.open(lv));
      crumbs.appendChild(b);
    });
    if (cr.length === 1) crumbs.appendChild(wbEl("span", { class: "wb-muted", style: "margin-left:8px" }, "double-click a group to open it"));
    root.dataset.level = String(L);
    root.dataset.levelLabel = cr[cr.length - 1][1];
    root.dataset.items = String(gc.lay ? gc.lay.items.length : 0);
    root.dataset.layoutMs = gc.lay ? gc.lay.ms.toFixed(1) : "";
  };
  gc.onLevel(renderCrumbs);
  const runSearch = async (advance) => {
    const q = search.value;
    if (!advance || !matches.length) { matches = gc.search(q); cursor = -1; }
    gc.setNames("highlight", matches.map((i) => data.name[i]));
    count.textContent = q ? `${matches.length} match${matches.length === 1 ? "" : "es"}` : "";
    root.dataset.matches = String(matches.length);
    if (!matches.length) gc.setPathTo(-1);
    if (matches.length) {
      cursor = (cursor + 1) % matches.length;
      if (matches.length > 1) count.textContent = `${cursor + 1}/${matches.length}`;
      gc.setPathTo(matches[cursor]);
      await gc.reveal(matches[cursor]);
    } else gc.draw();
  };
  search.addEventListener("input", () => runSearch(false));
  search.addEventListener("keydown", (e) => { if (e.key === "Enter") { e.preventDefault(); runSearch(true); } });
  fit.addEventListener("click", () => gc.fitAll());
  all.addEventListener("click", async () => {
    const on = !gc.graph.showAll;
    all.classList.toggle("wb-on", on);
    root.dataset.showAll = on ? "1" : "";
    matches = [];
    await gc.setShowAll(on);
  });
  mapBtn.addEventListener("click", () => {
    gc.showMini = !gc.showMini;
    mapBtn.classList.toggle("wb-on", gc.showMini);
    gc.draw();
  });
  const fileBase = String(model.get("title") || "graph").replace(/\.onnx$/i, "").replace(/[^\w.-]+/g, "_") || "graph";
  const download = (href, name) => {
    const a = wbEl("a", { href, download: name, style: "display:none" });
    root.appendChild(a); a.click(); a.remove();
  };
  svgBtn.addEventListener("click", () => {
    const url = URL.createObjectURL(new Blob([gc.toSVG()], { type: "image/svg+xml" }));
    download(url, `${fileBase}.svg`);
    setTimeout(() => URL.revokeObjectURL(url), 10000);
  });
  pngBtn.addEventListener("click", () => download(gc.toPNG(), `${fileBase}.png`));
  const overlayBox = wbEl("div", { class: "wb-overlay" });
  side.appendChild(overlayBox);
  const onOverlay = () => {
    const spec = model.get("overlay");
    gc.setOverlay(spec, model.get("overlay_metric"));
    overlayBox.textContent = "";
    const lg = wbOverlayLegend(gc, spec, (key) => { model.set("overlay_metric", key); model.save_changes(); });
    if (lg) overlayBox.appendChild(lg);
    const sm = wbOverlaySummary(spec);
    if (sm) overlayBox.appendChild(sm);
    root.dataset.overlay = gc.overlay ? gc.overlay.title : "";
    root.dataset.overlayMetric = gc.overlay ? gc.overlay.key : "";
    root.dataset.flagged = String(gc.flagged ? gc.flagged.size : 0);
    showDetails(gc.selected);
  };
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
    // our own click echoed back: already selected, and a click never moves the view
    if ((nm || "") === (gc.selected >= 0 ? data.name[gc.selected] : "")) { showDetails(gc.selected); return; }
    const i = nm ? gc.index.get(nm) : -1;
    if (i !== undefined && i >= 0) gc.selectedGroup = -1;
    setSelectedLocal(i === undefined ? -1 : i, true);
  };
  const onDetails = () => { showDetails(gc.selected); };
  const showMarked = () => { const first = [...gc.marked][0]; if (first !== undefined) gc.ensureVisible(first); };
  const onH = () => sync("highlight"), onD = () => sync("dimmed");
  const onM = () => { sync("marked"); showMarked(); };
  model.on("change:selected", onSel);
  model.on("change:details", onDetails);
  model.on("change:highlight", onH);
  model.on("change:dimmed", onD);
  model.on("change:marked", onM);
  model.on("change:overlay", onOverlay);
  model.on("change:overlay_metric", onOverlay);
  setSelectedLocal(-1, false);
  if (model.get("overlay")) onOverlay();
  const initSel = model.get("selected");
  // the first level: the whole graph, collapsed, laid out in the worker
  const ready = gc.open(0).then(async () => {
    if (initSel && gc.index.has(initSel)) setSelectedLocal(gc.index.get(initSel), true);
    else { const m = [...gc.marked][0]; if (m !== undefined) await gc.reveal(m); }
    const ms = performance.now() - t0;
    root.dataset.drawMs = ms.toFixed(1);
    root.dataset.layoutWorker = gc.engine.worker ? "1" : "0";   // 0: laid out on the main thread
    root.dataset.ready = "1";
    if (opts.reportTiming !== false && model.get("render_ms") < 0) {
      model.set("render_ms", ms);
      model.save_changes();
    }
  }).catch((err) => {
    root.insertBefore(wbEl("div", { class: "wb-err" }, `The layout failed: ${err && err.message || err}`), body);
  });
  root.dataset.nodes = String(data.name ? data.name.length : 0);
  root.dataset.shown = String(shown);
  root.wbView = { gc, ready };
  return {
    root, gc, ready,
    destroy() {
      clearTimeout(lateTimer);
      model.off("change:selected", onSel); model.off("change:details", onDetails);
      model.off("change:highlight", onH); model.off("change:dimmed", onD); model.off("change:marked", onM);
      model.off("change:overlay", onOverlay); model.off("change:overlay_metric", onOverlay);
      gc.destroy();
    },
  };
}

export default {
  render({ model, el }) {
    if (model.get("editable")) {      // workbench.widgets.ModelEditor: graph_edit.js
      const ui = wbEditUI(model, el, { api: wbKernelApi(model) });
      return () => ui.destroy();
    }
    const view = wbRenderGraphView(model, el);
    // the first layout can happen before the element is attached: refit once it has a size
    view.ready.then(() => requestAnimationFrame(() => {
      const gc = view.gc;
      const before = gc.W;
      gc.resize();
      if (gc.W !== before && gc.selected < 0) gc.fitInitial();
      gc.draw();
    }));
    return () => view.destroy();
  },
};
