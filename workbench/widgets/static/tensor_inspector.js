// ONNX Workbench - TensorInspector front-end (follows graph_core.js for helpers/styles).

const WB_TI_CSS = `
.wb-inspector { width: 100%; max-width: 100%; }
.wb-ti-body { display: flex; flex: 1; min-height: 0; min-width: 0; }
.wb-ti-table { flex: 1 1 60%; overflow: auto; min-width: 0; min-height: 0; scrollbar-width: thin; }
.wb-ti-table table { border-collapse: collapse; width: max-content; min-width: 100%;
  font-variant-numeric: tabular-nums; }
.wb-ti-table th { position: sticky; top: 0; background: #f1f3f6; text-align: left;
  padding: 3px 6px; border-bottom: 1px solid #d5dae1; cursor: pointer; user-select: none;
  white-space: nowrap; }
.wb-ti-table th.wb-sorted { color: #1463ff; }
.wb-ti-table td { padding: 2px 6px; border-bottom: 1px solid #eef0f3; white-space: nowrap;
  max-width: 220px; overflow: hidden; text-overflow: ellipsis; }
.wb-ti-table tr.wb-row { cursor: pointer; }
.wb-ti-table tr.wb-row:hover { background: #f3f7ff; }
.wb-ti-table tr.wb-sel { background: #dfe9ff !important; }
.wb-ti-table tr.wb-bad td.wb-c-nan, .wb-ti-table tr.wb-bad td.wb-c-inf { color: #c0392b; font-weight: 600; }
.wb-ti-table tr.wb-diverge { background: #fdecea; }
.wb-ti-table tr.wb-first-diverge { background: #f8c9c4; }
.wb-ti-table tr.wb-st-unsupported td, .wb-ti-table tr.wb-st-notrun td { color: #9aa3ad; }
.wb-ti-table tr.wb-st-error td { color: #c0392b; }
.wb-ti-detail { flex: 0 1 40%; border-left: 1px solid #e4e7eb; overflow: auto; padding: 8px;
  min-width: 220px; max-width: 440px; min-height: 0; }
.wb-ti-detail canvas.wb-hist { display: block; width: 100%; }
/* a narrow pane: the details go below the table, both scroll within the widget's height */
.wb-inspector.wb-narrow .wb-ti-body { flex-direction: column; }
.wb-inspector.wb-narrow .wb-ti-table { flex: 1 1 55%; }
.wb-inspector.wb-narrow .wb-ti-detail { flex: 1 1 45%; max-width: none; min-width: 0;
  border-left: 0; border-top: 1px solid #e4e7eb; }
.wb-ti-maps { display: grid; grid-template-columns: repeat(auto-fill, minmax(52px, 1fr)); gap: 3px; }
.wb-ti-maps canvas { width: 100%; image-rendering: pixelated; border: 1px solid #e4e7eb; }
`;

function wbTypedArray(dv, dtype) {
  const buf = dv.buffer.slice(dv.byteOffset, dv.byteOffset + dv.byteLength);
  switch (dtype) {
    case "float32": return new Float32Array(buf);
    case "float64": return new Float64Array(buf);
    case "int8": return new Int8Array(buf);
    case "uint8": case "bool": return new Uint8Array(buf);
    case "int16": return new Int16Array(buf);
    case "uint16": return new Uint16Array(buf);
    case "int32": return new Int32Array(buf);
    case "uint32": return new Uint32Array(buf);
    case "int64": return Float64Array.from(new BigInt64Array(buf), Number);
    case "uint64": return Float64Array.from(new BigUint64Array(buf), Number);
    case "float16": {
      if (typeof Float16Array !== "undefined") return new Float16Array(buf);
      const u = new Uint16Array(buf), out = new Float32Array(u.length);
      for (let i = 0; i < u.length; i++) {
        const h = u[i], s = h & 0x8000 ? -1 : 1, e = (h >> 10) & 0x1f, f = h & 0x3ff;
        out[i] = e === 0 ? s * f * 2 ** -24 : e === 31 ? (f ? NaN : s * Infinity) : s * (1 + f / 1024) * 2 ** (e - 15);
      }
      return out;
    }
    default: return null;
  }
}

function wbFmt(v) {
  if (v === null || v === undefined) return "—";
  if (typeof v === "number") {
    if (Number.isInteger(v) && Math.abs(v) < 1e9) return String(v);
    const a = Math.abs(v);
    return a !== 0 && (a < 1e-3 || a >= 1e5) ? v.toExponential(3) : v.toPrecision(4);
  }
  return String(v);
}

function wbDrawHist(canvas, hist, dtype) {
  // bars of element counts over the value range, with both axes titled
  const W = canvas.clientWidth || 300, H = 150, dpr = window.devicePixelRatio || 1;
  canvas.width = W * dpr; canvas.height = H * dpr; canvas.style.height = H + "px";
  const c = canvas.getContext("2d");
  c.setTransform(dpr, 0, 0, dpr, 0, 0);
  c.clearRect(0, 0, W, H);
  const counts = hist.counts || [], edges = hist.edges || [];
  c.font = "10px sans-serif";
  if (!counts.length) { c.fillStyle = "#6b7785"; c.fillText("no finite values", 8, 20); return; }
  const max = Math.max(...counts, 1);
  const L = 40, R = 6, T = 6, B = 30;              // plot area inside the axes' labels
  const pw = W - L - R, ph = H - T - B, bw = pw / counts.length;
  c.strokeStyle = "#c3c9d1"; c.lineWidth = 1;
  c.beginPath(); c.moveTo(L, T); c.lineTo(L, T + ph); c.lineTo(L + pw, T + ph); c.stroke();
  c.fillStyle = "#3c6eb4";
  counts.forEach((n, i) => {
    const h = ph * n / max;
    c.fillRect(L + i * bw, T + ph - h, Math.max(1, bw - 1), h);
  });
  c.fillStyle = "#52606d";
  c.textAlign = "right";
  c.fillText(String(max), L - 3, T + 8); c.fillText("0", L - 3, T + ph);
  c.textAlign = "left"; c.fillText(wbFmt(edges[0]), L, T + ph + 11);
  c.textAlign = "right"; c.fillText(wbFmt(edges[edges.length - 1]), L + pw, T + ph + 11);
  c.fillStyle = "#1f2933"; c.textAlign = "center";
  c.fillText(`value (${dtype || "element"})`, L + pw / 2, H - 3);
  c.save(); c.translate(10, T + ph / 2); c.rotate(-Math.PI / 2);
  c.fillText(hist.sampled ? "count (sampled elements)" : "count (elements)", 0, 0);
  c.restore();
  canvas.dataset.xTitle = `value (${dtype || "element"})`;
  canvas.dataset.yTitle = hist.sampled ? "count (sampled elements)" : "count (elements)";
}

function wbDrawMaps(box, info, dv) {
  box.textContent = "";
  if (!info || !info.shape || !dv || !dv.byteLength) return;
  const arr = wbTypedArray(dv, info.dtype);
  if (!arr) { box.textContent = `(cannot show dtype ${info.dtype})`; return; }
  const [C, H, W] = info.shape;
  for (let ch = 0; ch < C; ch++) {
    const off = ch * H * W;
    let lo = Infinity, hi = -Infinity;
    for (let i = 0; i < H * W; i++) { const v = Number(arr[off + i]); if (isFinite(v)) { if (v < lo) lo = v; if (v > hi) hi = v; } }
    const cv = wbEl("canvas", { title: `channel ${ch}: ${wbFmt(lo)} … ${wbFmt(hi)}` });
    cv.width = W; cv.height = H;
    const ctx = cv.getContext("2d"), img = ctx.createImageData(W, H);
    const span = hi > lo ? hi - lo : 1;
    for (let i = 0; i < H * W; i++) {
      const v = Number(arr[off + i]);
      const t = isFinite(v) ? (v - lo) / span : 0;
      // a light-to-dark blue ramp; NaN/Inf in red
      const p = i * 4;
      if (!isFinite(v)) { img.data[p] = 220; img.data[p + 1] = 40; img.data[p + 2] = 40; }
      else { img.data[p] = 255 - 235 * t; img.data[p + 1] = 255 - 185 * t; img.data[p + 2] = 255 - 95 * t; }
      img.data[p + 3] = 255;
    }
    ctx.putImageData(img, 0, 0);
    box.appendChild(cv);
  }
}

export default {
  render({ model, el }) {
    wbInjectStyle();
    if (!document.getElementById("wb-ti-style")) {
      const s = document.createElement("style"); s.id = "wb-ti-style"; s.textContent = WB_TI_CSS;
      document.head.appendChild(s);
    }
    const root = wbEl("div", { class: "wb-root wb-inspector", style: `height:${model.get("height")}px` });
    const title = wbEl("span", { class: "wb-title" }, `Tensors — ${model.get("title")}`);
    const filter = wbEl("input", { type: "search", placeholder: "filter node / op…" });
    const count = wbEl("span", { class: "wb-muted" });
    root.appendChild(wbEl("div", { class: "wb-toolbar" }, title, filter, count));
    const banners = wbEl("div");
    root.appendChild(banners);
    const tableBox = wbEl("div", { class: "wb-ti-table" });
    const detail = wbEl("div", { class: "wb-ti-detail" });
    root.appendChild(wbEl("div", { class: "wb-ti-body" }, tableBox, detail));
    el.appendChild(root);
    // below 620 px the details panel goes under the table (side by side they would squeeze
    // the table to a few columns)
    const fit = () => root.classList.toggle("wb-narrow", root.clientWidth > 0 && root.clientWidth < 620);
    const ro = typeof ResizeObserver !== "undefined" ? new ResizeObserver(fit) : null;
    if (ro) ro.observe(root);
    fit();

    let cols = ["node", "op", "shape", "dtype", "min", "max", "mean", "std", "nan", "inf"];
    let sortCol = null, sortDesc = true;

    const drawBanners = () => {
      banners.textContent = "";
      const uns = model.get("unsupported") || [];
      if (uns.length) {
        const ops = [...new Set(uns.map((u) => u.op))].join(", ");
        banners.appendChild(wbEl("div", { class: "wb-msg wb-unsupported" },
          `The engine cannot run ${uns.length} node(s) (${ops}): ${uns.map((u) => u.node).slice(0, 8).join(", ")}` +
          `${uns.length > 8 ? " …" : ""}. Nodes that depend on them were not run; the rest was.`));
      }
      const err = model.get("error");
      if (err) banners.appendChild(wbEl("div", { class: "wb-err" }, err));
      const ci = model.get("compare_info") || {};
      if (ci.error) banners.appendChild(wbEl("div", { class: "wb-msg" }, ci.error));
      else if (ci.engine) {
        const fd = model.get("first_diverging");
        banners.appendChild(wbEl("div", { class: fd ? "wb-err" : "wb-msg" },
          fd ? `Compared with ${ci.engine}: first diverging value "${fd}" (highlighted).`
             : `Compared with ${ci.engine}: all ${ci.values} values agree within tolerance.`));
      }
    };

    const drawTable = () => {
      let rows = (model.get("rows") || []).slice();
      const hasDiff = rows.some((r) => "diff" in r);
      const cs = cols.concat(hasDiff ? ["diff"] : [], ["status"]);
      const q = filter.value.trim().toLowerCase();
      if (q) rows = rows.filter((r) => r.node.toLowerCase().includes(q) || r.op.toLowerCase().includes(q) || r.value.toLowerCase().includes(q));
      if (sortCol) {
        rows.sort((a, b) => {
          const x = a[sortCol], y = b[sortCol];
          if (x == null && y == null) return 0;
          if (x == null) return 1;
          if (y == null) return -1;
          const c = typeof x === "number" && typeof y === "number" ? x - y : String(x).localeCompare(String(y));
          return sortDesc ? -c : c;
        });
      }
      count.textContent = `${rows.length} values`;
      const sel = model.get("selected"), fd = model.get("first_diverging");
      // rows as elements, every value as text (names come from the model)
      const head = wbEl("tr", null, ...cs.map((c) => wbEl("th", { "data-col": c, class: c === sortCol ? "wb-sorted" : "" },
        c + (c === sortCol ? (sortDesc ? " ▾" : " ▴") : ""))));
      const body = document.createElement("tbody");
      for (const r of rows) {
        const cls = ["wb-row", "wb-st-" + String(r.status).replace(/[^a-z]/g, "")];
        if (r.nan || r.inf) cls.push("wb-bad");
        if (r.value === sel || r.node === sel) cls.push("wb-sel");
        if (r.diff_ok === false) cls.push(r.value === fd ? "wb-first-diverge" : "wb-diverge");
        const tr = wbEl("tr", { class: cls.join(" "), "data-value": r.value });
        for (const c of cs) {
          const text = wbFmt(r[c]);
          tr.appendChild(wbEl("td", { class: "wb-c-" + c, title: c === "node" ? `${r.node} → ${r.value}` : text }, text));
        }
        body.appendChild(tr);
      }
      tableBox.replaceChildren(wbEl("table", null, wbEl("thead", null, head), body));
    };

    const drawDetail = () => {
      const sel = model.get("selected");
      detail.textContent = "";
      if (!sel) { detail.appendChild(wbEl("div", { class: "wb-muted" }, "Click a row for its histogram and feature maps.")); return; }
      const row = (model.get("rows") || []).find((r) => r.value === sel || r.node === sel);
      if (row) {
        detail.appendChild(wbEl("div", { class: "wb-opname" }, `${row.op} · ${row.node}`));
        detail.appendChild(wbEl("div", { class: "wb-muted" }, `${row.value}: ${row.dtype} ${row.shape} (${row.status})`));
      }
      const hist = model.get("hist") || {};
      if (hist.counts) {
        detail.appendChild(wbEl("h4", null, "Histogram" + (hist.sampled ? " (sampled)" : "")));
        const cv = wbEl("canvas", { class: "wb-hist" });
        detail.appendChild(cv);
        requestAnimationFrame(() => wbDrawHist(cv, hist, row && row.dtype));
      }
      const info = model.get("fmap_info") || {};
      if (info.shape) {
        detail.appendChild(wbEl("h4", null, `Feature maps (${info.shape[0]} of ${info.channels_total} channels, ${info.shape[1]}×${info.shape[2]}, ${info.dtype})`));
        const box = wbEl("div", { class: "wb-ti-maps" });
        detail.appendChild(box);
        wbDrawMaps(box, info, model.get("fmaps"));
      }
    };

    tableBox.addEventListener("click", (e) => {
      const th = e.target.closest("th");
      if (th) {
        const c = th.dataset.col;
        if (sortCol === c) sortDesc = !sortDesc; else { sortCol = c; sortDesc = true; }
        drawTable();
        return;
      }
      const tr = e.target.closest("tr.wb-row");
      if (tr) {
        model.set("selected", tr.dataset.value);
        model.save_changes();
        drawTable();
      }
    });
    filter.addEventListener("input", drawTable);
    const onRows = () => { drawTable(); drawBanners(); };
    const onSel = () => { drawTable(); drawDetail(); };
    model.on("change:rows", onRows);
    model.on("change:selected", onSel);
    model.on("change:hist", drawDetail);
    model.on("change:fmaps", drawDetail);
    model.on("change:unsupported", drawBanners);
    model.on("change:error", drawBanners);
    drawBanners(); drawTable(); drawDetail();
    return () => {
      if (ro) ro.disconnect();
      model.off("change:rows", onRows); model.off("change:selected", onSel);
      model.off("change:hist", drawDetail); model.off("change:fmaps", drawDetail);
      model.off("change:unsupported", drawBanners); model.off("change:error", drawBanners);
    };
  },
};
