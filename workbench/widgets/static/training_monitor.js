// ONNX Workbench - TrainingMonitor front-end (follows graph_core.js for helpers/styles).

const WB_TM_CSS = `
.wb-tm-bar { height: 10px; background: #e9edf2; border-radius: 5px; overflow: hidden; margin: 6px 8px 2px; }
.wb-tm-fill { height: 100%; background: #3c6eb4; width: 0; transition: width .2s; }
.wb-tm-fill.wb-tm-done { background: #2e8b57; }
.wb-tm-fill.wb-tm-stopped { background: #d68910; }
.wb-tm-status { padding: 2px 8px 4px; font-variant-numeric: tabular-nums; }
.wb-tm-charts { display: grid; grid-template-columns: repeat(auto-fill, minmax(260px, 1fr)); gap: 8px; padding: 6px 8px 8px; }
.wb-tm-chart { border: 1px solid #e4e7eb; border-radius: 4px; padding: 4px; }
.wb-tm-chart canvas { width: 100%; height: 170px; display: block; }
.wb-tm-summary { padding: 6px 8px; background: #eef7f0; border-top: 1px solid #cfe6d6; white-space: pre-wrap; }
`;

function wbFmtTime(s) {
  if (s == null || s < 0 || !isFinite(s)) return "?";
  s = Math.round(s);
  const h = Math.floor(s / 3600), m = Math.floor((s % 3600) / 60), x = s % 60;
  return h ? `${h}:${String(m).padStart(2, "0")}:${String(x).padStart(2, "0")}` : `${m}:${String(x).padStart(2, "0")}`;
}

function wbNum(v) {
  if (v == null) return "—";
  const a = Math.abs(v);
  return a !== 0 && (a < 1e-3 || a >= 1e5) ? v.toExponential(3) : v.toFixed(4);
}

// the axis titles: steps count optimizer updates (one batch each); the y axis is the metric
const WB_TM_XTITLE = "step (batches)";

function wbDrawChart(canvas, name, ser) {
  const W = canvas.clientWidth || 260, H = canvas.clientHeight || 170, dpr = window.devicePixelRatio || 1;
  canvas.width = W * dpr; canvas.height = H * dpr;
  canvas.dataset.xTitle = WB_TM_XTITLE; canvas.dataset.yTitle = name;
  const c = canvas.getContext("2d");
  c.setTransform(dpr, 0, 0, dpr, 0, 0);
  c.clearRect(0, 0, W, H);
  const all = [...(ser.train || []), ...(ser.val || [])];
  c.font = "11px sans-serif"; c.fillStyle = "#1f2933"; c.textAlign = "left";
  c.fillText(name, 6, 12);
  const L = 58, R = 8, T = 24, B = 30;
  // axis titles: x below the tick labels, y rotated along the left edge
  c.font = "10px sans-serif"; c.textAlign = "center";
  c.fillText(WB_TM_XTITLE, L + (W - L - R) / 2, H - 3);
  c.save(); c.translate(10, T + (H - T - B) / 2); c.rotate(-Math.PI / 2); c.fillText(name, 0, 0); c.restore();
  if (!all.length) return;
  let x0 = Infinity, x1 = -Infinity, y0 = Infinity, y1 = -Infinity;
  for (const [x, y] of all) { x0 = Math.min(x0, x); x1 = Math.max(x1, x); y0 = Math.min(y0, y); y1 = Math.max(y1, y); }
  if (x1 === x0) x1 = x0 + 1;
  if (y1 === y0) { y1 += 0.5; y0 -= 0.5; }
  const sx = (x) => L + (x - x0) / (x1 - x0) * (W - L - R);
  const sy = (y) => T + (1 - (y - y0) / (y1 - y0)) * (H - T - B);
  c.strokeStyle = "#e4e7eb"; c.lineWidth = 1;
  c.fillStyle = "#6b7785"; c.font = "10px sans-serif"; c.textAlign = "right";
  for (let i = 0; i <= 3; i++) {
    const y = y0 + (y1 - y0) * i / 3;
    c.beginPath(); c.moveTo(L, sy(y)); c.lineTo(W - R, sy(y)); c.stroke();
    c.fillText(wbNum(y), L - 3, sy(y) + 3);
  }
  c.textAlign = "center";
  c.fillText(String(Math.round(x0)), L, H - B + 12); c.fillText(String(Math.round(x1)), W - R - 8, H - B + 12);
  const line = (pts, colour, dots) => {
    if (!pts || !pts.length) return;
    c.strokeStyle = colour; c.fillStyle = colour; c.lineWidth = 1.6;
    c.beginPath();
    pts.forEach(([x, y], i) => (i ? c.lineTo(sx(x), sy(y)) : c.moveTo(sx(x), sy(y))));
    c.stroke();
    if (dots) for (const [x, y] of pts) { c.beginPath(); c.arc(sx(x), sy(y), 2.5, 0, 6.3); c.fill(); }
  };
  line(ser.train, "#3c6eb4", false);
  line(ser.val, "#e67e22", true);
  c.textAlign = "right"; c.font = "10px sans-serif";
  if (ser.train && ser.train.length) { c.fillStyle = "#3c6eb4"; c.fillText("train", W - 40, 12); }
  if (ser.val && ser.val.length) { c.fillStyle = "#e67e22"; c.fillText("val", W - 8, 12); }
}

async function wbInterruptKernel(kernelId) {
  try {
    const cfgEl = document.getElementById("jupyter-config-data");
    const cfg = cfgEl ? JSON.parse(cfgEl.textContent) : {};
    let base = cfg.baseUrl || "/";
    if (!base.endsWith("/")) base += "/";
    const headers = {};
    const xsrf = document.cookie.split("; ").find((c) => c.startsWith("_xsrf="));
    if (xsrf) headers["X-XSRFToken"] = decodeURIComponent(xsrf.slice(6));
    if (cfg.token) headers["Authorization"] = `token ${cfg.token}`;
    const r = await fetch(`${base}api/kernels/${kernelId}/interrupt`, { method: "POST", headers, credentials: "same-origin" });
    return r.ok;
  } catch (e) {
    return false;
  }
}

export default {
  render({ model, el }) {
    wbInjectStyle();
    if (!document.getElementById("wb-tm-style")) {
      const s = document.createElement("style"); s.id = "wb-tm-style"; s.textContent = WB_TM_CSS;
      document.head.appendChild(s);
    }
    const root = wbEl("div", { class: "wb-root wb-monitor" });
    const stopBtn = wbEl("button", { class: "wb-btn wb-danger wb-stop" }, "Stop");
    root.appendChild(wbEl("div", { class: "wb-toolbar" }, wbEl("span", { class: "wb-title" }, model.get("title")), stopBtn));
    const fill = wbEl("div", { class: "wb-tm-fill" });
    root.appendChild(wbEl("div", { class: "wb-tm-bar" }, fill));
    const status = wbEl("div", { class: "wb-tm-status wb-muted" });
    root.appendChild(status);
    const charts = wbEl("div", { class: "wb-tm-charts" });
    root.appendChild(charts);
    const summary = wbEl("div", { class: "wb-tm-summary", style: "display:none" });
    root.appendChild(summary);
    el.appendChild(root);
    const canv = new Map();

    const draw = () => {
      const total = model.get("total"), step = model.get("step");
      const done = model.get("done"), stopping = model.get("stopping") || model.get("stop_requested");
      const frac = total ? Math.min(1, step / total) : (done ? 1 : 0);
      fill.style.width = (total || done ? frac * 100 : 100) + "%";
      fill.className = "wb-tm-fill" + (done ? (stopping ? " wb-tm-stopped" : " wb-tm-done") : "");
      const el_ = model.get("elapsed"), eta = model.get("eta");
      const rate = el_ > 0 ? step / el_ : 0;
      const latest = model.get("latest") || {};
      const bits = [total ? `step ${step}/${total} (${(frac * 100).toFixed(1)}%)` : `step ${step}`,
        `${rate.toFixed(rate < 10 ? 2 : 0)} steps/s`, `elapsed ${wbFmtTime(el_)}`];
      if (!done && eta >= 0) bits.push(`ETA ${wbFmtTime(eta)}`);
      for (const [k, v] of Object.entries(latest.train || {})) bits.push(`${k} ${wbNum(v)}`);
      for (const [k, v] of Object.entries(latest.val || {})) bits.push(`val ${k} ${wbNum(v)}`);
      if (stopping && !done) bits.push("stopping…");
      status.textContent = bits.join(" · ");
      root.dataset.step = String(step);
      const series = model.get("series") || {};
      for (const [name, ser] of Object.entries(series)) {
        if (!canv.has(name)) {
          const cv = wbEl("canvas");
          charts.appendChild(wbEl("div", { class: "wb-tm-chart", "data-series": name }, cv));
          canv.set(name, cv);
        }
        wbDrawChart(canv.get(name), name, ser);
      }
      stopBtn.disabled = done || stopping;
      stopBtn.textContent = done ? "Done" : stopping ? "Stopping…" : "Stop";
      const s = model.get("summary");
      summary.style.display = done && s ? "" : "none";
      summary.textContent = s;
      root.dataset.done = String(done);
    };
    stopBtn.addEventListener("click", async () => {
      model.set("stop_requested", true);
      model.save_changes();
      stopBtn.disabled = true; stopBtn.textContent = "Stopping…";
      // the kernel is busy running the training cell and reads no widget messages until it
      // ends: ask the server to interrupt it; the monitor turns that into should_stop = True
      const kid = model.get("kernel_id");
      if (kid && model.get("sigint_armed")) root.dataset.interrupt = String(await wbInterruptKernel(kid));
    });
    const names = ["step", "total", "series", "latest", "done", "summary", "stopping", "eta"];
    for (const n of names) model.on(`change:${n}`, draw);
    requestAnimationFrame(draw);
    draw();
    return () => { for (const n of names) model.off(`change:${n}`, draw); };
  },
};
