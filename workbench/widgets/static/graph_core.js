// ONNX Workbench - shared graph drawing core (canvas). Concatenated in front of graph_view.js
// by the Python side; no imports, no network. The JupyterLab extension bundles both files too
// (extensions/jupyterlab-onnx/scripts/gen-core.mjs): after editing them, run
// scripts/build-labextension.sh and commit workbench/labextension/.

const WB_STYLE_ID = "wb-widgets-style";
const WB_CSS = `
.wb-root { font: 12px/1.35 -apple-system, "Segoe UI", Roboto, Helvetica, Arial, sans-serif;
  color: #1f2933; border: 1px solid #d5dae1; border-radius: 6px; background: #fff;
  display: flex; flex-direction: column; overflow: hidden; box-sizing: border-box; }
.wb-root * { box-sizing: border-box; }
.wb-toolbar { display: flex; gap: 8px; align-items: center; padding: 5px 8px;
  border-bottom: 1px solid #e4e7eb; background: #f7f8fa; flex-wrap: wrap; }
.wb-title { font-weight: 600; margin-right: auto; white-space: nowrap; overflow: hidden;
  text-overflow: ellipsis; max-width: 40%; }
.wb-toolbar input[type=search] { width: 190px; padding: 3px 6px; border: 1px solid #c3c9d1;
  border-radius: 4px; font-size: 12px; }
.wb-btn { padding: 2px 9px; border: 1px solid #c3c9d1; border-radius: 4px; background: #fff;
  cursor: pointer; font-size: 12px; }
.wb-btn:hover { background: #eef2f7; }
.wb-btn.wb-danger { border-color: #c0392b; color: #c0392b; }
.wb-btn:disabled { opacity: .5; cursor: default; }
.wb-muted { color: #6b7785; }
.wb-body { display: flex; flex: 1; min-height: 0; }
.wb-canvaswrap { position: relative; flex: 1; min-width: 0; background: #fbfcfd;
  cursor: grab; overflow: hidden; }
.wb-canvaswrap.wb-dragging { cursor: grabbing; }
.wb-canvaswrap canvas.wb-main { position: absolute; left: 0; top: 0; }
.wb-minimap { position: absolute; right: 8px; bottom: 8px; border: 1px solid #c3c9d1;
  background: rgba(255,255,255,.92); cursor: crosshair; }
.wb-side { width: 270px; border-left: 1px solid #e4e7eb; overflow: auto; padding: 8px;
  background: #fff; }
.wb-side h4 { margin: 8px 0 4px; font-size: 12px; text-transform: uppercase; color: #52606d;
  letter-spacing: .03em; }
.wb-side table { border-collapse: collapse; width: 100%; }
.wb-side td { padding: 1px 4px 1px 0; vertical-align: top; word-break: break-all; }
.wb-kv td:first-child { color: #52606d; white-space: nowrap; word-break: normal; }
.wb-legend-item { display: flex; align-items: center; gap: 6px; cursor: pointer;
  padding: 1px 2px; border-radius: 3px; }
.wb-legend-item:hover { background: #eef2f7; }
.wb-swatch { width: 11px; height: 11px; border-radius: 2px; flex: none; }
.wb-opname { font-weight: 600; font-size: 13px; }
.wb-param { color: #8a5a00; }
.wb-msg { padding: 6px 8px; background: #fff8e1; border-bottom: 1px solid #f0e0a0; }
.wb-err { padding: 6px 8px; background: #fdecea; border-bottom: 1px solid #f5c2bd;
  color: #8a1c12; white-space: pre-wrap; }
`;

function wbInjectStyle() {
  if (document.getElementById(WB_STYLE_ID)) return;
  const s = document.createElement("style");
  s.id = WB_STYLE_ID;
  s.textContent = WB_CSS;
  document.head.appendChild(s);
}

function wbEl(tag, attrs, ...children) {
  const e = document.createElement(tag);
  if (attrs) for (const [k, v] of Object.entries(attrs)) {
    if (k === "class") e.className = v;
    else if (k === "style") e.style.cssText = v;
    else if (k.startsWith("on")) e.addEventListener(k.slice(2), v);
    else e.setAttribute(k, v);
  }
  for (const c of children) {
    if (c == null) continue;
    e.appendChild(typeof c === "string" ? document.createTextNode(c) : c);
  }
  return e;
}

function wbEsc(s) {
  return String(s).replace(/[&<>"]/g, (c) => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;" }[c]));
}

// A pannable / zoomable canvas drawing of a laid-out graph.
class WbGraphCanvas {
  constructor(wrap, data, opts = {}) {
    this.wrap = wrap;
    this.data = data;
    this.opts = opts;
    this.n = data.name.length;
    this.index = new Map();
    for (let i = 0; i < this.n; i++) if (!this.index.has(data.name[i])) this.index.set(data.name[i], i);
    this.selected = -1;
    this.highlight = new Set();
    this.dimmed = new Set();
    this.marked = new Set();
    this.k = 1; this.tx = 0; this.ty = 0;
    this.canvas = wbEl("canvas", { class: "wb-main" });
    this.mini = wbEl("canvas", { class: "wb-minimap" });
    wrap.appendChild(this.canvas);
    wrap.appendChild(this.mini);
    this.ctx = this.canvas.getContext("2d");
    this.listeners = [];
    this._prepareEdges();
    this._bind();
    this.resize();
    this.fitInitial();
    this._miniBase = null;
  }

  _prepareEdges() {
    const pts = this.data.edge_points;
    this.ebox = pts.map((p) => {
      let x0 = Infinity, y0 = Infinity, x1 = -Infinity, y1 = -Infinity;
      for (let i = 0; i < p.length; i += 2) {
        x0 = Math.min(x0, p[i]); x1 = Math.max(x1, p[i]);
        y0 = Math.min(y0, p[i + 1]); y1 = Math.max(y1, p[i + 1]);
      }
      return [x0, y0, x1, y1];
    });
  }

  on(fn) { this.listeners.push(fn); }

  resize() {
    const r = this.wrap.getBoundingClientRect();
    const dpr = window.devicePixelRatio || 1;
    this.W = Math.max(50, r.width); this.H = Math.max(50, r.height);
    this.canvas.width = Math.round(this.W * dpr); this.canvas.height = Math.round(this.H * dpr);
    this.canvas.style.width = this.W + "px"; this.canvas.style.height = this.H + "px";
    this.dpr = dpr;
    const d = this.data;
    const mw = 120, mh = Math.max(40, Math.min(this.H * 0.45, mw * d.height / Math.max(1, d.width)));
    this.miniScale = Math.min(mw / Math.max(1, d.width), mh / Math.max(1, d.height));
    this.mini.width = Math.round(mw * dpr); this.mini.height = Math.round(mh * dpr);
    this.mini.style.width = mw + "px"; this.mini.style.height = mh + "px";
    this.mini.style.display = (d.height * this.k > this.H * 1.2 || d.width * this.k > this.W * 1.2) ? "" : "none";
    this._miniBase = null;
  }

  fitInitial() {
    const d = this.data;
    const kAll = Math.min(1.5, (this.W - 20) / Math.max(1, d.width), (this.H - 20) / Math.max(1, d.height));
    if (kAll >= 0.75) {
      this.k = kAll;
      this.tx = (this.W - d.width * this.k) / 2; this.ty = (this.H - d.height * this.k) / 2;
    } else {
      // too big to read when fitted: start at the top, readable, and pan/zoom from there
      this.k = Math.max(0.75, Math.min(1, (this.W - 20) / Math.max(1, d.width)));
      this.tx = (this.W - d.width * this.k) / 2; this.ty = 10;
      if (this.tx < 10) this.tx = 10;
    }
  }

  fitAll() {
    const d = this.data;
    this.k = Math.min(1.5, (this.W - 20) / Math.max(1, d.width), (this.H - 20) / Math.max(1, d.height));
    this.tx = (this.W - d.width * this.k) / 2; this.ty = (this.H - d.height * this.k) / 2;
    this.draw();
  }

  centreOn(i, zoomIn = true) {
    if (i < 0 || i >= this.n) return;
    if (zoomIn && this.k < 0.8) this.k = 1;
    this.tx = this.W / 2 - this.data.x[i] * this.k;
    this.ty = this.H / 2 - this.data.y[i] * this.k;
    this.draw();
  }

  ensureVisible(i, margin = 40) {
    if (i < 0 || i >= this.n) return;
    const sx = this.data.x[i] * this.k + this.tx, sy = this.data.y[i] * this.k + this.ty;
    if (sx < margin || sx > this.W - margin || sy < margin || sy > this.H - margin) this.centreOn(i, false);
  }

  toWorld(sx, sy) { return [(sx - this.tx) / this.k, (sy - this.ty) / this.k]; }

  hit(sx, sy) {
    const [wx, wy] = this.toWorld(sx, sy);
    const d = this.data, h2 = d.h / 2 + 2;
    let best = -1, bestD = Infinity;
    for (let i = 0; i < this.n; i++) {
      const dx = Math.abs(wx - d.x[i]), dy = Math.abs(wy - d.y[i]);
      if (dx <= d.w[i] / 2 + 2 && dy <= h2) {
        const dd = dx + dy;
        if (dd < bestD) { bestD = dd; best = i; }
      }
    }
    return best;
  }

  _bind() {
    const c = this.wrap;
    let drag = null;
    c.addEventListener("pointerdown", (e) => {
      if (e.target === this.mini) return;
      drag = { x: e.clientX, y: e.clientY, tx: this.tx, ty: this.ty, moved: false };
      c.setPointerCapture && c.setPointerCapture(e.pointerId);
    });
    c.addEventListener("pointermove", (e) => {
      if (!drag) return;
      const dx = e.clientX - drag.x, dy = e.clientY - drag.y;
      if (Math.abs(dx) + Math.abs(dy) > 4) { drag.moved = true; c.classList.add("wb-dragging"); }
      if (drag.moved) { this.tx = drag.tx + dx; this.ty = drag.ty + dy; this.requestDraw(); }
    });
    c.addEventListener("pointerup", (e) => {
      if (!drag) return;
      const moved = drag.moved;
      drag = null;
      c.classList.remove("wb-dragging");
      if (!moved) {
        const r = this.canvas.getBoundingClientRect();
        const i = this.hit(e.clientX - r.left, e.clientY - r.top);
        this.listeners.forEach((fn) => fn(i, this.data.name[i]));
      }
    });
    c.addEventListener("wheel", (e) => {
      e.preventDefault();
      const r = this.canvas.getBoundingClientRect();
      const sx = e.clientX - r.left, sy = e.clientY - r.top;
      const f = Math.exp(-e.deltaY * (e.deltaMode === 1 ? 0.05 : 0.0015));
      const k = Math.min(4, Math.max(0.01, this.k * f));
      this.tx = sx - (sx - this.tx) * (k / this.k);
      this.ty = sy - (sy - this.ty) * (k / this.k);
      this.k = k;
      this.requestDraw();
    }, { passive: false });
    const miniMove = (e) => {
      const r = this.mini.getBoundingClientRect();
      const wx = (e.clientX - r.left) / this.miniScale, wy = (e.clientY - r.top) / this.miniScale;
      this.tx = this.W / 2 - wx * this.k; this.ty = this.H / 2 - wy * this.k;
      this.requestDraw();
    };
    let miniDrag = false;
    this.mini.addEventListener("pointerdown", (e) => { e.stopPropagation(); miniDrag = true; miniMove(e); });
    this.mini.addEventListener("pointermove", (e) => { if (miniDrag) miniMove(e); });
    this.mini.addEventListener("pointerup", () => { miniDrag = false; });
    if (window.ResizeObserver) {
      this.ro = new ResizeObserver(() => { this.resize(); this.draw(); });
      this.ro.observe(c);
    }
  }

  requestDraw() {
    if (this._raf) return;
    this._raf = requestAnimationFrame(() => { this._raf = 0; this.draw(); });
  }

  colorOf(i) { return this.data.colors[this.data.op[i]] || "#667"; }

  draw() {
    const d = this.data, ctx = this.ctx, k = this.k;
    ctx.setTransform(this.dpr, 0, 0, this.dpr, 0, 0);
    ctx.clearRect(0, 0, this.W, this.H);
    ctx.setTransform(this.dpr * k, 0, 0, this.dpr * k, this.dpr * this.tx, this.dpr * this.ty);
    const [vx0, vy0] = this.toWorld(0, 0), [vx1, vy1] = this.toWorld(this.W, this.H);
    const pad = 40;
    const visible = (x0, y0, x1, y1) => x1 >= vx0 - pad && x0 <= vx1 + pad && y1 >= vy0 - pad && y0 <= vy1 + pad;
    const hh = d.h / 2;
    // edges
    ctx.lineWidth = Math.max(1 / k, 1.1);
    const dimE = [], normE = [];
    for (let e = 0; e < d.edges.length; e++) {
      const b = this.ebox[e];
      if (!visible(b[0], b[1], b[2], b[3])) continue;
      const [s, t] = d.edges[e];
      (this.dimmed.has(s) || this.dimmed.has(t) ? dimE : normE).push(e);
    }
    const drawEdges = (list, colour) => {
      ctx.strokeStyle = colour; ctx.fillStyle = colour;
      ctx.beginPath();
      for (const e of list) {
        const p = d.edge_points[e];
        const n = p.length;
        ctx.moveTo(p[0], p[1] + hh);
        if (n === 4) {
          const y0 = p[1] + hh, y1 = p[3] - hh, my = (y0 + y1) / 2;
          ctx.bezierCurveTo(p[0], my, p[2], my, p[2], y1);
        } else {
          for (let i = 2; i < n - 2; i += 2) ctx.lineTo(p[i], p[i + 1]);
          const px = p[n - 4], py = p[n - 3];
          const my = (py + p[n - 1] - hh) / 2;
          ctx.bezierCurveTo(px, my, p[n - 2], my, p[n - 2], p[n - 1] - hh);
        }
      }
      ctx.stroke();
      if (k > 0.3) {
        ctx.beginPath();
        for (const e of list) {
          const p = d.edge_points[e], n = p.length;
          const x = p[n - 2], y = p[n - 1] - hh;
          ctx.moveTo(x, y); ctx.lineTo(x - 3.5, y - 6); ctx.lineTo(x + 3.5, y - 6); ctx.closePath();
        }
        ctx.fill();
      }
    };
    drawEdges(dimE, "#dde1e6");
    drawEdges(normE, "#8795a5");
    // nodes
    const showText = k * d.h >= 11;
    ctx.textAlign = "center"; ctx.textBaseline = "middle";
    ctx.font = "600 11px -apple-system, Segoe UI, Roboto, Helvetica, Arial, sans-serif";
    for (let i = 0; i < this.n; i++) {
      const x = d.x[i], y = d.y[i], w = d.w[i];
      if (!visible(x - w / 2, y - hh, x + w / 2, y + hh)) continue;
      const dim = this.dimmed.has(i);
      const kind = d.kind[i];
      ctx.globalAlpha = dim ? 0.28 : 1;
      ctx.fillStyle = dim ? "#b8bec6" : this.colorOf(i);
      const r = kind === 0 ? 5 : hh;
      this._roundRect(x - w / 2, y - hh, w, d.h, r);
      ctx.fill();
      if (showText) {
        ctx.fillStyle = "#fff";
        let label = kind === 0 ? d.op[i] : d.name[i];
        if (label.length > 28) label = label.slice(0, 26) + "…";
        ctx.fillText(label, x, y + 0.5);
      }
    }
    ctx.globalAlpha = 1;
    const ring = (i, colour, width) => {
      const x = d.x[i], y = d.y[i], w = d.w[i];
      ctx.strokeStyle = colour; ctx.lineWidth = width / Math.min(1, Math.max(k, 0.05));
      this._roundRect(x - w / 2 - 3, y - hh - 3, w + 6, d.h + 6, 7);
      ctx.stroke();
    };
    for (const i of this.highlight) ring(i, "#f5b700", 3);
    for (const i of this.marked) ring(i, "#d62d20", 3);
    if (this.selected >= 0) ring(this.selected, "#1463ff", 3);
    this.drawMini();
  }

  _roundRect(x, y, w, h, r) {
    const ctx = this.ctx;
    ctx.beginPath();
    ctx.moveTo(x + r, y);
    ctx.arcTo(x + w, y, x + w, y + h, r);
    ctx.arcTo(x + w, y + h, x, y + h, r);
    ctx.arcTo(x, y + h, x, y, r);
    ctx.arcTo(x, y, x + w, y, r);
    ctx.closePath();
  }

  drawMini() {
    const d = this.data;
    this.mini.style.display = (d.height * this.k > this.H * 1.2 || d.width * this.k > this.W * 1.2) ? "" : "none";
    if (this.mini.style.display === "none") return;
    const m = this.mini.getContext("2d"), s = this.miniScale, dpr = this.dpr;
    if (!this._miniBase) {
      const base = document.createElement("canvas");
      base.width = this.mini.width; base.height = this.mini.height;
      const b = base.getContext("2d");
      b.setTransform(dpr, 0, 0, dpr, 0, 0);
      for (let i = 0; i < this.n; i++) {
        b.fillStyle = this.dimmed.has(i) ? "#d0d4da" : this.colorOf(i);
        b.fillRect(d.x[i] * s - Math.max(1, d.w[i] * s) / 2, d.y[i] * s, Math.max(1, d.w[i] * s), Math.max(1, d.h * s));
      }
      this._miniBase = base;
    }
    m.setTransform(1, 0, 0, 1, 0, 0);
    m.clearRect(0, 0, this.mini.width, this.mini.height);
    m.drawImage(this._miniBase, 0, 0);
    m.setTransform(dpr, 0, 0, dpr, 0, 0);
    const [x0, y0] = this.toWorld(0, 0), [x1, y1] = this.toWorld(this.W, this.H);
    m.strokeStyle = "#1463ff"; m.lineWidth = 1.5;
    m.strokeRect(x0 * s, y0 * s, Math.max(2, (x1 - x0) * s), Math.max(2, (y1 - y0) * s));
    if (this.selected >= 0) {
      m.fillStyle = "#1463ff";
      m.fillRect(d.x[this.selected] * s - 2, d.y[this.selected] * s - 2, 4, 4);
    }
  }

  setNames(kind, names) {
    const set = new Set();
    for (const nm of names || []) { const i = this.index.get(nm); if (i !== undefined) set.add(i); }
    this[kind] = set;
    if (kind === "dimmed") this._miniBase = null;
  }

  search(q) {
    q = (q || "").trim().toLowerCase();
    if (!q) return [];
    const d = this.data, out = [];
    for (let i = 0; i < this.n; i++) {
      if (d.name[i].toLowerCase().includes(q) || d.op[i].toLowerCase().includes(q)) out.push(i);
    }
    return out;
  }

  destroy() { if (this.ro) this.ro.disconnect(); }
}

// Details panel contents for a node (uses Python's details when they are for this node).
function wbDetailsHTML(data, i, det, late = false) {
  if (i < 0) return '<div class="wb-muted">Click a node to see its details.</div>';
  const name = data.name[i], op = data.op[i];
  let h = `<div class="wb-opname">${wbEsc(op)}</div><div class="wb-muted" style="word-break:break-all">${wbEsc(name)}</div>`;
  if (!det || det.name !== name) {
    return h + (late
      ? '<div class="wb-msg wb-nokernel">No details arrived from Python: the kernel may be busy, stopped or restarted. Re-run the cell to reconnect.</div>'
      : '<div class="wb-muted">(loading details from the kernel…)</div>');
  }
  if (det.domain && det.domain !== "ai.onnx") h += `<div class="wb-muted">domain ${wbEsc(det.domain)}</div>`;
  const attrs = Object.entries(det.attrs || {});
  if (attrs.length) {
    h += "<h4>Attributes</h4><table class='wb-kv'>";
    for (const [k, v] of attrs) h += `<tr><td>${wbEsc(k)}</td><td>${wbEsc(v)}</td></tr>`;
    h += "</table>";
  }
  const vals = (title, list) => {
    if (!list || !list.length) return "";
    let s = `<h4>${title}</h4><table>`;
    for (const v of list) {
      if (v.omitted) { s += "<tr><td class='wb-muted'>(omitted)</td></tr>"; continue; }
      s += `<tr><td${v.param ? " class='wb-param'" : ""}>${wbEsc(v.name)}</td><td style="white-space:nowrap">${wbEsc(v.dtype)} ${wbEsc(v.shape)}${v.param ? " · " + Number(v.count).toLocaleString() : ""}</td></tr>`;
    }
    return s + "</table>";
  };
  h += vals("Inputs", det.inputs) + vals("Outputs", det.outputs);
  if (det.params) h += `<h4>Parameters</h4><div>${Number(det.params).toLocaleString()} values</div>`;
  return h;
}

function wbLegend(data, onPick) {
  const box = wbEl("div");
  const counts = data.op_counts || {};
  for (const [op, c] of Object.entries(counts)) {
    const item = wbEl("div", { class: "wb-legend-item", title: `highlight all ${op} nodes` },
      wbEl("span", { class: "wb-swatch", style: `background:${data.colors[op] || "#667"}` }),
      wbEl("span", null, op), wbEl("span", { class: "wb-muted", style: "margin-left:auto" }, String(c)));
    item.addEventListener("click", () => onPick(op));
    box.appendChild(item);
  }
  return box;
}
