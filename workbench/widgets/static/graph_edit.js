// ONNX Workbench - model surgery in the drawing (follows graph_core.js and graph_view.js).
//
// wbEditUI(model, el, {api, confirm}) puts an edit bar (Undo, Redo, History, Script, Compare,
// Save), menus and the marks of the last edit around the GraphView drawing. Used by the
// notebook's ModelEditor (api: messages to the kernel, workbench/widgets/editor.py) and by the
// JupyterLab viewer's edit mode (api: POST /workbench/api/edit, workbench/labext_edit.py).
// What can be done is decided in Python (workbench/widgets/editing.py: the actions, sent in
// `edit_state.actions`, and what they do); here: choosing a target, asking for the fields,
// showing the answer. The drawing is redrawn in place when `graph_data` changes.
//
// Right-click a node, an edge (a value) or a graph input/output for its actions, the
// background for the model's; click an edge to select its value, shift-click a second one
// to extract the part between them. Delete deletes the selected node; Ctrl+Z / Ctrl+Shift+Z
// undo and redo. Everything from a model or an edit (names, notes, errors) goes into the
// page as text (wbEl), never as HTML.

const WB_EDIT_STYLE_ID = "wb-edit-style";
const WB_EDIT_CSS = `
.wb-edit { position: relative; font: 12px/1.35 -apple-system, "Segoe UI", Roboto, Helvetica, Arial, sans-serif;
  color: #1f2933; }
.wb-editbar { display: flex; gap: 6px; align-items: center; flex-wrap: wrap; padding: 4px 8px;
  border: 1px solid #d5dae1; border-bottom: none; border-radius: 6px 6px 0 0;
  background: #f1f5fb; font: 12px/1.35 -apple-system, "Segoe UI", Roboto, Helvetica, Arial, sans-serif; }
.wb-editbar .wb-edit-title { font-weight: 600; color: #52606d; margin-right: 4px; }
.wb-editbar select { font-size: 12px; padding: 1px 2px; }
.wb-edit-chip { display: inline-flex; align-items: center; gap: 3px; padding: 1px 6px;
  border-radius: 10px; background: #ede4ff; border: 1px solid #9b7be0; max-width: 220px; }
.wb-edit-chip span { overflow: hidden; text-overflow: ellipsis; white-space: nowrap; }
.wb-edit-chip button { border: none; background: none; cursor: pointer; padding: 0 2px; color: #5b3fb0; }
.wb-edit-status { margin-left: auto; color: #6b7785; white-space: nowrap; }
.wb-edit-last { padding: 3px 8px; border-left: 1px solid #d5dae1; border-right: 1px solid #d5dae1;
  background: #fbfcfe; font-size: 12px; color: #1f2933; word-break: break-word; }
.wb-edit-last .wb-ok { color: #1a7f3c; font-weight: 600; }
.wb-edit-last .wb-notok { color: #b3261e; font-weight: 600; }
.wb-edit-last code, .wb-edit-panel code { font: 11.5px ui-monospace, Menlo, Consolas, monospace; }
.wb-edit-host .wb-root { border-radius: 0 0 6px 6px; }
.wb-edit-panel { border: 1px solid #d5dae1; border-top: none; padding: 6px 8px; max-height: 360px;
  overflow: auto; font-size: 12px; background: #fff; }
.wb-edit-panel pre { margin: 4px 0; white-space: pre; overflow: auto; background: #f7f8fa;
  padding: 6px; border-radius: 4px; font: 11.5px ui-monospace, Menlo, Consolas, monospace; }
.wb-edit-step { padding: 2px 0; border-bottom: 1px solid #f0f2f5; }
.wb-edit-step.wb-undone { opacity: .5; }
.wb-edit-compare-sides { display: flex; gap: 6px; }
.wb-edit-compare-sides > div { flex: 1; min-width: 0; }
.wb-menu { position: absolute; z-index: 20; min-width: 220px; max-width: 380px; background: #fff;
  border: 1px solid #b8c0ca; border-radius: 6px; box-shadow: 0 4px 16px rgba(0,0,0,.18);
  padding: 4px 0; font: 12px/1.35 -apple-system, "Segoe UI", Roboto, Helvetica, Arial, sans-serif; }
.wb-menu-head { padding: 3px 10px 5px; color: #52606d; border-bottom: 1px solid #eef0f3;
  margin-bottom: 3px; word-break: break-all; }
.wb-menu-head b { color: #1f2933; }
.wb-menu-item { display: block; width: 100%; text-align: left; border: none; background: none;
  padding: 4px 10px; cursor: pointer; font: inherit; color: #1f2933; }
.wb-menu-item:hover, .wb-menu-item:focus { background: #eef2f7; outline: none; }
.wb-menu-item.wb-danger { color: #b3261e; }
.wb-menu-sep { border-top: 1px solid #eef0f3; margin: 3px 0; }
.wb-menu form { padding: 4px 10px; display: flex; flex-direction: column; gap: 5px; }
.wb-menu label { display: flex; flex-direction: column; gap: 2px; color: #52606d; }
.wb-menu label.wb-check { flex-direction: row; align-items: center; gap: 6px; }
.wb-menu input[type=text] { font-size: 12px; padding: 3px 5px; border: 1px solid #c3c9d1;
  border-radius: 4px; }
.wb-menu .wb-menu-buttons { display: flex; gap: 6px; justify-content: flex-end; padding: 4px 10px 2px; }
.wb-menu .wb-err, .wb-edit-err { border: 1px solid #f5c2bd; border-radius: 4px; margin: 4px 10px;
  max-height: 180px; overflow: auto; }
.wb-edit-err { margin: 0; border-radius: 0; display: flex; gap: 6px; align-items: flex-start; }
.wb-edit-err span { flex: 1; }
.wb-menu .wb-working { padding: 4px 10px; color: #6b7785; }
`;

function wbEditInjectStyle() {
  wbInjectStyle();
  if (document.getElementById(WB_EDIT_STYLE_ID)) return;
  const s = document.createElement("style");
  s.id = WB_EDIT_STYLE_ID;
  s.textContent = WB_EDIT_CSS;
  document.head.appendChild(s);
}

// the kernel side of the notebook's ModelEditor: requests as custom messages, answers matched
// by id (the widget's traits carry the drawing and the edit state)
function wbKernelApi(model) {
  let next = 0;
  const pending = new Map();
  const onMsg = (msg) => {
    if (!msg || msg.type !== "wb-edit-reply" || !pending.has(msg.id)) return;
    const p = pending.get(msg.id);
    pending.delete(msg.id);
    clearTimeout(p.timer);
    p.resolve(msg.reply || { ok: false, error: "the kernel sent an empty answer" });
  };
  model.on("msg:custom", onMsg);
  return {
    call(request, timeoutMs = 600000) {
      return new Promise((resolve) => {
        const id = `${++next}-${Date.now()}`;
        const timer = setTimeout(() => {
          pending.delete(id);
          resolve({ ok: false, error: "No answer from the kernel: it may be busy, stopped or restarted. Re-run the cell that shows the editor to reconnect." });
        }, timeoutMs);
        pending.set(id, { resolve, timer });
        model.send({ type: "wb-edit", id, request });
      });
    },
    destroy() {
      model.off("msg:custom", onMsg);
      for (const p of pending.values()) clearTimeout(p.timer);
      pending.clear();
    },
  };
}

// a stand-in for a widget model (get/set/on/off): the compare panel's two drawings
class WbLocalModel {
  constructor(attrs) { this.attrs = attrs; this.handlers = new Map(); }
  get(k) { return this.attrs[k]; }
  set(k, v) { this.attrs[k] = v; for (const fn of [...(this.handlers.get("change:" + k) || [])]) fn(); }
  on(ev, fn) { if (!this.handlers.has(ev)) this.handlers.set(ev, new Set()); this.handlers.get(ev).add(fn); }
  off(ev, fn) { const h = this.handlers.get(ev); if (h) h.delete(fn); }
  save_changes() {}
}

// distance from (x, y) to the segment (ax, ay)-(bx, by)
function wbSegDist(x, y, ax, ay, bx, by) {
  const dx = bx - ax, dy = by - ay, L = dx * dx + dy * dy;
  const t = L > 0 ? Math.max(0, Math.min(1, ((x - ax) * dx + (y - ay) * dy) / L)) : 0;
  const px = ax + t * dx - x, py = ay + t * dy - y;
  return Math.sqrt(px * px + py * py);
}

// the edge of the drawn level nearest to screen point (sx, sy), within a few pixels
function wbEdgeAt(gc, sx, sy, tolPx = 6) {
  if (!gc.lay) return null;
  const [wx, wy] = gc.toWorld(sx, sy);
  let best = null, bestD = tolPx / gc.k;
  for (const ed of gc.lay.edges) {
    const p = ed.pts;
    if (!ed.e.vals || !ed.e.vals.length) continue;
    for (let i = 0; i + 3 < p.length; i += 2) {
      const d = wbSegDist(wx, wy, p[i], p[i + 1], p[i + 2], p[i + 3]);
      if (d < bestD) { bestD = d; best = ed; }
    }
  }
  return best;
}

// an edge's middle on screen (where tests and the menu point at it)
function wbEdgeMiddle(gc, ed) {
  const p = ed.pts, m = (p.length / 2) >> 1;
  const x = p.length === 4 ? (p[0] + p[2]) / 2 : p[2 * m], y = p.length === 4 ? (p[1] + p[3]) / 2 : p[2 * m + 1];
  return [x * gc.k + gc.tx, y * gc.k + gc.ty];
}

function wbEditUI(model, el, opts = {}) {
  wbEditInjectStyle();
  const api = opts.api;
  const engine = new WbLayoutEngine();
  // JupyterLab opens its own context menu on a right-click unless told not to
  const root = wbEl("div", { class: "wb-edit", "data-jp-suppress-context-menu": "" });
  const bar = wbEl("div", { class: "wb-editbar" });
  const errBox = wbEl("div", { class: "wb-err wb-edit-err", style: "display:none" });
  const lastBox = wbEl("div", { class: "wb-edit-last" });
  const host = wbEl("div", { class: "wb-edit-host" });
  const panel = wbEl("div", { class: "wb-edit-panel", style: "display:none" });
  const menu = wbEl("div", { class: "wb-menu", style: "display:none", role: "menu" });
  root.append(bar, errBox, lastBox, host, panel, menu);
  el.appendChild(root);
  menu.addEventListener("keydown", (e) => { if (e.key === "Escape") { e.preventDefault(); closeMenu(); } });

  const btn = (label, title, cls = "") => wbEl("button", { class: "wb-btn " + cls, title }, label);
  const undoB = btn("Undo", "take back the last edit (Ctrl+Z)", "wb-edit-undo");
  const redoB = btn("Redo", "make the undone edit again (Ctrl+Shift+Z)", "wb-edit-redo");
  const histB = btn("History", "the edits made, each with its check", "wb-edit-history");
  const scriptB = btn("Script", "the Python that replays these edits on the original file", "wb-edit-script");
  const cmpB = btn("Compare", "the model before and after, side by side (matched nodes paired)", "wb-edit-compare");
  const cmpSel = wbEl("select", { class: "wb-edit-against", title: "compare with" },
    wbEl("option", { value: "last" }, "before the last edit"), wbEl("option", { value: "original" }, "the original"));
  const saveB = btn("Save…", "write the edited model to a file (atomic; asks before replacing one)", "wb-edit-save");
  const actB = btn("Model…", "actions on the whole model (re-batch, opset, metadata, compose)", "wb-edit-model");
  const chips = wbEl("span", { class: "wb-edit-chips" });
  const note = wbEl("span", { class: "wb-muted wb-edit-note" });
  const status = wbEl("span", { class: "wb-edit-status" });
  bar.append(wbEl("span", { class: "wb-edit-title" }, "Edit"), undoB, redoB, histB, scriptB, cmpB, cmpSel, saveB, actB, chips, note, status);

  let view = null, busy = false, destroyed = false, version = 0;
  let values = [];          // the selected values (at most two), for extract
  let marks = { added: new Set(), changed: new Set() };
  let panelKind = "";
  let cmpViews = [];

  const state = () => model.get("edit_state") || {};
  const data = () => model.get("graph_data") || { name: [] };
  const actions = () => state().actions || [];

  // ---------------------------------------------------------------- answers
  const setBusy = (on, text = "working…") => {
    busy = on;
    root.dataset.editBusy = on ? "1" : "";
    status.textContent = on ? text : "";
    for (const b of [undoB, redoB, saveB, cmpB, actB]) b.disabled = on;
    if (!on) refreshBar();
  };
  const showBarError = (text) => {
    errBox.replaceChildren(wbEl("span", null, text),
      wbEl("button", { class: "wb-btn", title: "dismiss", onclick: () => { errBox.style.display = "none"; } }, "✕"));
    errBox.style.display = "";
    root.dataset.editError = text;
  };
  const clearBarError = () => { errBox.style.display = "none"; root.dataset.editError = ""; };
  const call = async (request, busyText) => {
    if (busy) return { ok: false, error: "another edit is still being checked: wait for it", busy: true };
    setBusy(true, busyText);
    let r;
    try { r = await api.call(request); } catch (e) { r = { ok: false, error: String(e && e.message || e) }; }
    if (destroyed) return r;
    setBusy(false);
    return r || { ok: false, error: "no answer" };
  };

  // ---------------------------------------------------------------- the bar
  const refreshBar = () => {
    const st = state();
    undoB.disabled = busy || !st.can_undo;
    redoB.disabled = busy || !st.can_redo;
    cmpB.disabled = busy || !(st.steps && st.steps.length);
    cmpSel.disabled = cmpB.disabled;
    root.dataset.editSteps = String(st.steps ? st.steps.length : 0);
    root.dataset.editUndone = String(st.undone ? st.undone.length : 0);
    root.dataset.unsaved = st.unsaved ? "1" : "";
    const last = st.last;
    lastBox.textContent = "";
    if (!last) {
      lastBox.append(wbEl("span", { class: "wb-muted" },
        "Right-click a node, an edge or an input/output for its actions (the background: the model's). Click an edge to select its value; shift-click a second one to extract the part between them."));
    } else {
      const verb = last.what === "undo" ? "undid" : last.what === "redo" ? "redid" : "";
      lastBox.append(wbEl("span", { class: last.ok ? "wb-ok" : "wb-notok" }, last.ok ? "✓ " : "✗ "),
        verb ? `${verb} ` : "", wbEl("code", null, `[${last.index}] ${last.call}`), " — ", last.check);
      const m = data().marks || {};
      const bits = [];
      if (m.added && m.added.length) bits.push(`${m.added.length} added (green)`);
      if (m.changed && m.changed.length) bits.push(`${m.changed.length} changed (orange)`);
      if (m.removed_count) bits.push(`${m.removed_count} removed: ${m.removed.join(", ")}${m.removed_count > m.removed.length ? ", …" : ""}`);
      if (bits.length) lastBox.append(wbEl("div", { class: "wb-muted wb-edit-marks" }, "nodes: " + bits.join("; ")));
      const notes = last.what === "undo" ? [] : (last.notes || []);      // the undone edit's notes: in History
      for (const n of notes.slice(0, 4)) lastBox.append(wbEl("div", { class: "wb-muted" }, n));
      if (notes.length > 4 || (notes.length && last.more_notes)) lastBox.append(wbEl("div", { class: "wb-muted" }, "(more in History)"));
    }
    if (!busy) status.textContent = st.unsaved ? "unsaved edits" : "";
    if (panelKind === "history") showHistory();
  };
  const renderChips = () => {
    chips.textContent = "";
    root.dataset.values = values.join("\n");
    values.forEach((v, k) => {
      chips.append(wbEl("span", { class: "wb-edit-chip", title: v },
        wbEl("span", null, `${k + 1}: ${v}`),
        wbEl("button", { title: "unselect", onclick: () => { values.splice(k, 1); renderChips(); redraw(); } }, "✕")));
    });
    if (values.length === 2) {
      chips.append(btn("Extract between", "keep the part of the model between the two values", "wb-edit-extract"));
      chips.lastChild.addEventListener("click", () => {
        const r = chips.getBoundingClientRect(), rr = root.getBoundingClientRect();
        runAction(actionById("extract"), { kind: "values", values: [...values] }, {}, r.left - rr.left, r.bottom - rr.top + 4);
      });
    }
  };
  const actionById = (id) => actions().find((a) => a.id === id);

  undoB.addEventListener("click", () => history("undo"));
  redoB.addEventListener("click", () => history("redo"));
  const history = async (op) => {
    closeMenu();
    const r = await call({ op });
    if (r.ok) clearBarError(); else if (!r.busy) showBarError(r.error);
  };
  histB.addEventListener("click", () => { if (panelKind === "history") closePanel(); else { panelKind = "history"; showHistory(); } });
  scriptB.addEventListener("click", async () => {
    if (panelKind === "script") return closePanel();
    const r = await call({ op: "script" });
    if (!r.ok) return showBarError(r.error);
    clearBarError();
    panelKind = "script";
    const pre = wbEl("pre", { class: "wb-edit-script-text" }, r.script);
    const copy = btn("Copy", "copy the script");
    copy.addEventListener("click", () => { if (navigator.clipboard) navigator.clipboard.writeText(r.script).catch(() => {}); });
    openPanel(wbEl("div", null, wbEl("b", null, "Replay script "), copy, " ", closeBtn()), pre);
  });
  cmpB.addEventListener("click", async () => {
    const r = await call({ op: "compare", against: cmpSel.value }, "comparing…");
    if (!r.ok) return showBarError(r.error);
    clearBarError();
    if (r.compare) showCompare(r.compare);
    else if (r.message) { note.textContent = r.message; }
  });
  saveB.addEventListener("click", () => {
    const r = saveB.getBoundingClientRect(), rr = root.getBoundingClientRect();
    saveForm(r.left - rr.left, r.bottom - rr.top + 4);
  });
  actB.addEventListener("click", () => {
    const r = actB.getBoundingClientRect(), rr = root.getBoundingClientRect();
    openMenu(r.left - rr.left, r.bottom - rr.top + 4, { kind: "model" });
  });

  // ---------------------------------------------------------------- the panel
  const closeBtn = () => { const b = btn("Close", "close this panel"); b.addEventListener("click", closePanel); return b; };
  const openPanel = (...children) => { panel.replaceChildren(...children); panel.style.display = ""; root.dataset.panel = panelKind; };
  const closePanel = () => {
    panelKind = ""; panel.style.display = "none"; panel.textContent = ""; root.dataset.panel = "";
    for (const v of cmpViews) v.destroy();
    cmpViews = [];
  };
  const stepRow = (s, undone) => wbEl("div", { class: "wb-edit-step" + (undone ? " wb-undone" : "") },
    wbEl("span", { class: s.ok ? "wb-ok" : "wb-notok" }, s.ok ? "✓ " : "✗ "),
    wbEl("code", null, `[${s.index}] ${s.call}`), undone ? " (undone)" : "",
    wbEl("div", { class: "wb-muted" }, s.check),
    ...(s.notes || []).map((n) => wbEl("div", { class: "wb-muted" }, "· " + n)),
    s.more_notes ? wbEl("div", { class: "wb-muted" }, `(+${s.more_notes} more notes)`) : null);
  const showHistory = () => {
    const st = state();
    const rows = [...(st.steps || []).map((s) => stepRow(s, false)), ...(st.undone || []).map((s) => stepRow(s, true))];
    openPanel(wbEl("div", null, wbEl("b", null, `History: ${(st.steps || []).length} edit(s)`),
      (st.undone || []).length ? ` and ${(st.undone || []).length} undone` : "", " ", closeBtn()),
      ...(rows.length ? rows : [wbEl("div", { class: "wb-muted" }, "No edits yet.")]));
  };
  // the JupyterLab viewer's compare: both drawings with GraphCompare's matches (the notebook
  // opens a GraphCompare widget below the editor instead)
  const showCompare = (c) => {
    closePanel();
    panelKind = "compare";
    const l2r = new Map(c.matches.map(([a, b]) => [a, b])), r2l = new Map(c.matches.map(([a, b]) => [b, a]));
    const sides = wbEl("div", { class: "wb-edit-compare-sides" });
    openPanel(wbEl("div", null, wbEl("b", null, `${c.titles[0]} vs ${c.titles[1]}: `),
      `${c.matches.length} matched, ${c.only_left.length} only before, ${c.only_right.length} only now (ringed) `, closeBtn()), sides);
    panel.style.maxHeight = "none";
    const make = (gd, det, title, flagged, other) => {
      const m = new WbLocalModel({ graph_data: gd, title, height: 360, selected: "", details: {}, highlight: [], dimmed: [], marked: [],
        overlay: { title: `not in ${other}`, values: {}, flagged }, render_ms: 0 });
      m.on("change:selected", () => { const nm = m.get("selected"); m.set("details", (nm && det[nm]) || {}); });
      const box = wbEl("div");
      sides.appendChild(box);
      const v = wbRenderGraphView(m, box, { engine, reportTiming: false });
      cmpViews.push(v);
      return m;
    };
    const L = make(c.before, c.before_details || {}, c.titles[0], c.only_left, c.titles[1]);
    const R = make(c.after, c.after_details || {}, c.titles[1], c.only_right, c.titles[0]);
    let syncing = false;
    const follow = (from, to, table) => () => {
      if (syncing) return;
      syncing = true;
      try { to.set("selected", table.get(from.get("selected")) || ""); } finally { syncing = false; }
    };
    L.on("change:selected", follow(L, R, l2r));
    R.on("change:selected", follow(R, L, r2l));
  };

  // ---------------------------------------------------------------- the menu
  const closeMenu = () => { menu.style.display = "none"; menu.textContent = ""; root.dataset.menu = ""; };
  const placeMenu = (x, y) => {
    menu.style.display = "";
    const W = root.clientWidth, H = root.clientHeight;
    const w = menu.offsetWidth || 240, h = menu.offsetHeight || 120;
    menu.style.left = Math.max(4, Math.min(x, W - w - 4)) + "px";
    menu.style.top = Math.max(4, Math.min(y, Math.max(4, H - h - 4))) + "px";
  };
  const describe = (t) => {
    if (t.kind === "node") return ["node ", wbEl("b", null, t.name), ` (${t.op})`];
    if (t.kind === "input") return ["graph input ", wbEl("b", null, t.value)];
    if (t.kind === "output") return ["graph output ", wbEl("b", null, t.value)];
    if (t.kind === "value") return ["value ", wbEl("b", null, t.value)];
    if (t.kind === "values") return ["from ", wbEl("b", null, t.values[0]), " to ", wbEl("b", null, t.values[1])];
    return ["the model"];
  };
  const openMenu = (x, y, target, choices) => {
    closeMenu();
    const items = [];
    if (choices && choices.length > 1) {         // an edge carrying several values: which one?
      items.push(wbEl("div", { class: "wb-menu-head" }, `This edge carries ${choices.length} values: choose one`));
      for (const v of choices) {
        const it = wbEl("button", { class: "wb-menu-item", "data-value": v }, v);
        it.addEventListener("click", () => openMenu(x, y, { kind: "value", value: v }));
        items.push(it);
      }
      menu.replaceChildren(...items);
      placeMenu(x, y);
      root.dataset.menu = "choose";
      return;
    }
    items.push(wbEl("div", { class: "wb-menu-head" }, ...describe(target)));
    const list = actions().filter((a) => a.on.includes(target.kind));
    for (const a of list) {
      const it = wbEl("button", { class: "wb-menu-item" + (a.danger ? " wb-danger" : ""), "data-action": a.id, role: "menuitem" }, a.label);
      it.addEventListener("click", () => (a.fields && a.fields.length ? showForm(a, target, x, y) : runAction(a, target, {}, x, y)));
      items.push(it);
    }
    if (target.kind === "value" || target.kind === "input" || target.kind === "output") {
      items.push(wbEl("div", { class: "wb-menu-sep" }));
      const sel = wbEl("button", { class: "wb-menu-item", "data-action": "select-value" },
        values.includes(target.value) ? "Unselect this value" : values.length === 1 ? "Select as the second value (to extract)" : "Select this value");
      sel.addEventListener("click", () => { toggleValue(target.value, values.length === 1); closeMenu(); });
      items.push(sel);
    }
    if (values.length === 2 && target.kind !== "values") {
      const ex = actionById("extract");
      if (ex) {
        const it = wbEl("button", { class: "wb-menu-item", "data-action": "extract" }, `${ex.label} (${values[0]}, ${values[1]})`);
        it.addEventListener("click", () => runAction(ex, { kind: "values", values: [...values] }, {}, x, y));
        items.push(it);
      }
    }
    if (!list.length && target.kind !== "value") items.push(wbEl("div", { class: "wb-muted", style: "padding:4px 10px" }, "No edits apply here."));
    menu.replaceChildren(...items);
    placeMenu(x, y);
    root.dataset.menu = target.kind;
    const first = menu.querySelector(".wb-menu-item");
    if (first) first.focus({ preventScroll: true });
  };
  const fieldDefault = (f, target) => {
    const st = state();
    if (f.default === "op") return target.op || "";
    if (f.default === "name") return target.name || "";
    if (f.default === "value") return target.value || "";
    if (f.default === "dims") return dimsOf(target.value);
    if (f.default === "batch") return "batch";
    if (f.default === "opset") return st.opset ? String(st.opset) : "";
    return "";
  };
  const showForm = (a, target, x, y, errorText = "", values0 = null) => {
    const inputs = {};
    const form = wbEl("form", { class: "wb-edit-form", "data-action": a.id });
    for (const f of a.fields) {
      if (f.kind === "check") {
        const cb = wbEl("input", { type: "checkbox", name: f.name });
        if (values0 && values0[f.name]) cb.checked = true;
        inputs[f.name] = cb;
        form.append(wbEl("label", { class: "wb-check" }, cb, f.label));
      } else {
        const inp = wbEl("input", { type: "text", name: f.name, placeholder: f.placeholder || "", spellcheck: "false", autocomplete: "off" });
        inp.value = values0 ? (values0[f.name] || "") : fieldDefault(f, target);
        inputs[f.name] = inp;
        form.append(wbEl("label", null, f.label + (f.optional ? " (optional)" : ""), inp));
      }
    }
    const apply = wbEl("button", { type: "submit", class: "wb-btn wb-on wb-edit-apply" }, "Apply");
    const cancel = wbEl("button", { type: "button", class: "wb-btn wb-edit-cancel" }, "Cancel");
    cancel.addEventListener("click", closeMenu);
    const read = () => {
      const p = {};
      for (const [k, inp] of Object.entries(inputs)) p[k] = inp.type === "checkbox" ? inp.checked : inp.value;
      return p;
    };
    form.addEventListener("submit", (e) => { e.preventDefault(); runAction(a, target, read(), x, y); });
    form.addEventListener("keydown", (e) => { if (e.key === "Escape") { e.preventDefault(); closeMenu(); } });
    menu.replaceChildren(wbEl("div", { class: "wb-menu-head" }, a.label.replace(/…$/, ""), " — ", ...describe(target)), form,
      errorText ? wbEl("div", { class: "wb-err wb-edit-error" }, errorText) : null,
      wbEl("div", { class: "wb-menu-buttons" }, cancel, apply));
    apply.addEventListener("click", (e) => { e.preventDefault(); runAction(a, target, read(), x, y); });
    placeMenu(x, y);
    root.dataset.menu = "form";
    const first = form.querySelector("input[type=text]");
    if (first) { first.focus({ preventScroll: true }); first.select(); }
  };
  // run an action; its error shows in the menu, where it was chosen
  const runAction = async (a, target, params, x, y) => {
    if (!a) return;
    menu.replaceChildren(wbEl("div", { class: "wb-menu-head" }, a.label.replace(/…$/, ""), " — ", ...describe(target)),
      wbEl("div", { class: "wb-working" }, "checking the edit…"));
    placeMenu(x, y);
    root.dataset.menu = "working";
    const r = await call({ op: "action", action: a.id, target, params }, "checking the edit…");
    if (r.ok) {
      closeMenu();
      clearBarError();
      if (target.kind === "values") { values = []; renderChips(); }
      return;
    }
    if (a.fields && a.fields.length) { showForm(a, target, x, y, r.error, params); return; }
    const close = btn("Close", "close");
    close.addEventListener("click", closeMenu);
    menu.replaceChildren(wbEl("div", { class: "wb-menu-head" }, a.label.replace(/…$/, ""), " — ", ...describe(target)),
      wbEl("div", { class: "wb-err wb-edit-error" }, r.error), wbEl("div", { class: "wb-menu-buttons" }, close));
    placeMenu(x, y);
    root.dataset.menu = "error";
  };
  const saveForm = (x, y, errorText = "", path0 = null) => {
    closeMenu();
    const inp = wbEl("input", { type: "text", name: "path", spellcheck: "false", autocomplete: "off" });
    inp.value = path0 !== null ? path0 : (state().save_path || "");
    const form = wbEl("form", { class: "wb-edit-form", "data-action": "save" }, wbEl("label", null, "file", inp));
    const go = wbEl("button", { type: "submit", class: "wb-btn wb-on wb-edit-apply" }, "Save");
    const cancel = wbEl("button", { type: "button", class: "wb-btn" }, "Cancel");
    cancel.addEventListener("click", closeMenu);
    const submit = async (e) => { e.preventDefault(); await save(inp.value, false, x, y); };
    form.addEventListener("submit", submit);
    go.addEventListener("click", submit);
    menu.replaceChildren(wbEl("div", { class: "wb-menu-head" }, "Save the edited model"), form,
      errorText ? wbEl("div", { class: "wb-err wb-edit-error" }, errorText) : null,
      wbEl("div", { class: "wb-menu-buttons" }, cancel, go));
    placeMenu(x, y);
    root.dataset.menu = "save";
    inp.focus({ preventScroll: true });
  };
  const save = async (path, overwrite, x, y) => {
    menu.replaceChildren(wbEl("div", { class: "wb-working" }, "saving…"));
    const r = await call({ op: "save", path, overwrite }, "saving…");
    if (r.ok) { closeMenu(); note.textContent = r.message || "saved"; root.dataset.saved = r.saved || path; return; }
    if (r.exists && !overwrite) {
      if (opts.confirm) closeMenu();       // the host's dialog asks: no "saving…" left behind it
      const yes = opts.confirm ? await opts.confirm(r.error, path) : await inlineConfirm(r.error, x, y);
      if (yes) return save(path, true, x, y);
      closeMenu();
      return;
    }
    saveForm(x, y, r.error, path);
  };
  const inlineConfirm = (text, x, y) => new Promise((resolve) => {
    const yes = wbEl("button", { class: "wb-btn wb-danger wb-edit-replace" }, "Replace");
    const no = wbEl("button", { class: "wb-btn wb-edit-keep" }, "Cancel");
    yes.addEventListener("click", () => resolve(true));
    no.addEventListener("click", () => resolve(false));
    menu.replaceChildren(wbEl("div", { class: "wb-menu-head" }, text), wbEl("div", { class: "wb-menu-buttons" }, no, yes));
    placeMenu(x, y);
    root.dataset.menu = "confirm";
  });

  // ---------------------------------------------------------------- targets in the drawing
  const dimsOf = (name) => {
    const d = data();
    const i = view ? view.gc.index.get(name) : undefined;
    if (i === undefined || !d.edges) return "";
    for (let k = 0; k + 2 < d.edges.length; k += 3) {
      if (d.edges[k] === i || d.edges[k + 1] === i) {
        const m = /\[(.*)\]/.exec(d.labels[d.edges[k + 2]] || "");
        return m ? m[1] : "";
      }
    }
    return "";
  };
  const targetAt = (sx, sy) => {
    const gc = view.gc, d = data();
    const b = gc.hit(sx, sy);
    if (b) {
      const it = b.it;
      if (it.type !== "node") return { none: it.type };
      const i = it.i, kind = d.kind[i];
      if (kind === 1) return { kind: "input", value: d.name[i], i };
      if (kind === 2) return { kind: "output", value: d.name[i], i };
      return { kind: "node", ref: (d.ref || [])[i] || "", name: d.name[i], op: d.op[i], i };
    }
    const ed = wbEdgeAt(gc, sx, sy);
    if (ed) return { kind: "value", value: ed.e.vals[0], choices: ed.e.vals, edge: ed };
    return { kind: "model" };
  };
  const toggleValue = (v, add) => {
    const k = values.indexOf(v);
    if (k >= 0) values.splice(k, 1);
    else if (add) { values.push(v); if (values.length > 2) values.shift(); }
    else values = [v];
    renderChips();
    redraw();
  };
  const redraw = () => { if (view) view.gc.draw(); };

  // what the edit adds to the drawing: rings on what the last edit added / changed, the
  // selected values' edges
  const drawMarks = (gc) => {
    const lay = gc.lay;
    if (!lay) return;
    const ctx = gc.ctx, k = gc.k;
    ctx.setTransform(gc.dpr * k, 0, 0, gc.dpr * k, gc.dpr * gc.tx, gc.dpr * gc.ty);
    const ring = (i, colour, dash) => {
      const it = lay.lv.itemOf(i);
      const b = it ? lay.byKey.get(it.key) : null;
      if (!b) return;
      ctx.strokeStyle = colour; ctx.lineWidth = 3.5 / Math.min(1, Math.max(k, 0.05));
      ctx.setLineDash(dash ? [6, 4] : []);
      const r = 9, x = b.x - b.w / 2 - 5, y = b.y - b.h / 2 - 5, w = b.w + 10, h = b.h + 10;
      ctx.beginPath();
      ctx.moveTo(x + r, y); ctx.arcTo(x + w, y, x + w, y + h, r); ctx.arcTo(x + w, y + h, x, y + h, r);
      ctx.arcTo(x, y + h, x, y, r); ctx.arcTo(x, y, x + w, y, r); ctx.closePath(); ctx.stroke();
      ctx.setLineDash([]);
    };
    for (const i of marks.added) ring(i, "#1a9b4b", false);
    for (const i of marks.changed) ring(i, "#e8710a", true);
    if (values.length) {
      ctx.lineWidth = 4 / Math.min(1, Math.max(k, 0.05));
      for (const { e, pts: p } of lay.edges) {
        const n = e.vals ? values.findIndex((v) => e.vals.includes(v)) : -1;
        if (n < 0 || p.length < 4) continue;
        ctx.strokeStyle = "#7b4fe0";
        ctx.beginPath(); ctx.moveTo(p[0], p[1]);
        for (let j = 2; j < p.length; j += 2) ctx.lineTo(p[j], p[j + 1]);
        ctx.stroke();
        const m = (p.length / 2) >> 1;
        ctx.fillStyle = "#7b4fe0"; ctx.beginPath(); ctx.arc(p[2 * m] - 9, p[2 * m + 1], 8, 0, 2 * Math.PI); ctx.fill();
        ctx.fillStyle = "#fff"; ctx.font = "600 10px sans-serif"; ctx.textAlign = "center"; ctx.textBaseline = "middle";
        ctx.fillText(String(n + 1), p[2 * m] - 9, p[2 * m + 1] + 0.5);
      }
    }
  };

  // ---------------------------------------------------------------- (re)drawing
  const renderView = async () => {
    const prev = view ? { labels: view.gc.graph.crumbs(view.gc.L).map((c) => c[1]), k: view.gc.k, tx: view.gc.tx, ty: view.gc.ty } : null;
    if (view) view.destroy();
    host.textContent = "";
    closeMenu();
    const d = data();
    const gvRoot = { v: null };
    view = wbRenderGraphView(model, host, { engine, reportTiming: opts.reportTiming });
    gvRoot.v = view;
    if (opts.onView) opts.onView(view);
    const gc = view.gc;
    const mine = ++version;
    marks = { added: new Set((d.marks && d.marks.added) || []), changed: new Set((d.marks && d.marks.changed) || []) };
    // values that are gone with this version are unselected
    const live = new Set(d.evalue || []);
    values = values.filter((v) => live.has(v));
    renderChips();
    const base = gc.draw.bind(gc);
    gc.draw = () => { base(); drawMarks(gc); };
    bind(gc);
    await view.ready;
    if (mine !== version || destroyed) return;
    // the level that was shown, if it is still there; then what the edit changed
    if (prev && prev.labels.length > 1) {
      for (let g = 1; g < gc.graph.ng; g++) {
        const cr = gc.graph.crumbs(g).map((c) => c[1]);
        if (cr.length === prev.labels.length && cr.every((x, j) => x === prev.labels[j])) { await gc.open(g, { fit: false }); break; }
      }
    }
    if (prev && gc.graph.crumbs(gc.L).length === prev.labels.length) { gc.k = prev.k; gc.tx = prev.tx; gc.ty = prev.ty; }
    const first = [...marks.added, ...marks.changed][0];
    if (first !== undefined) {
      if (gc.itemBoxOf(first)) gc.ensureVisible(first); else await gc.reveal(first);
    }
    gc.draw();
    root.dataset.editVersion = String(mine);
    root.dataset.marksAdded = [...marks.added].map((i) => d.name[i]).join("\n");
    root.dataset.marksChanged = [...marks.changed].map((i) => d.name[i]).join("\n");
    root.dataset.editReady = "1";
  };

  const bind = (gc) => {
    const wrap = gc.wrap;
    let down = null;
    const local = (e) => { const r = gc.canvas.getBoundingClientRect(); return [e.clientX - r.left, e.clientY - r.top]; };
    const inRoot = (e) => { const r = root.getBoundingClientRect(); return [e.clientX - r.left, e.clientY - r.top]; };
    wrap.addEventListener("contextmenu", (e) => {
      e.preventDefault();
      const [sx, sy] = local(e), [x, y] = inRoot(e);
      const t = targetAt(sx, sy);
      if (t.none) { closeMenu(); return; }
      if (t.i !== undefined && gc.selected !== t.i) gc._click(gc.hit(sx, sy));   // selects it, as a click
      openMenu(x + 2, y + 2, t, t.choices);
    });
    wrap.addEventListener("pointerdown", (e) => { down = { x: e.clientX, y: e.clientY }; if (e.button === 0) closeMenu(); });
    wrap.addEventListener("pointerup", (e) => {
      if (!down || e.button !== 0) return;
      const moved = Math.abs(e.clientX - down.x) + Math.abs(e.clientY - down.y) > 4;
      down = null;
      if (moved) return;
      const [sx, sy] = local(e);
      if (gc.hit(sx, sy)) return;                    // a node or group: the view selects it
      const ed = wbEdgeAt(gc, sx, sy);
      if (ed) toggleValue(ed.e.vals[0], e.shiftKey);
      else if (values.length && !e.shiftKey) { values = []; renderChips(); redraw(); }
    });
    wrap.addEventListener("keydown", (e) => {
      const mod = e.ctrlKey || e.metaKey;
      if (mod && (e.key === "z" || e.key === "Z")) { e.preventDefault(); e.stopImmediatePropagation(); history(e.shiftKey ? "redo" : "undo"); }
      else if (mod && (e.key === "y" || e.key === "Y")) { e.preventDefault(); e.stopImmediatePropagation(); history("redo"); }
      else if (e.key === "Delete" && gc.selected >= 0) {
        e.preventDefault(); e.stopImmediatePropagation();
        const d = d0(), i = gc.selected;
        if (d.kind[i] !== 0) return;
        const b = gc.itemBoxOf(i), rr = root.getBoundingClientRect(), cr = gc.canvas.getBoundingClientRect();
        const x = b ? b.x * gc.k + gc.tx + cr.left - rr.left : 20, y = b ? (b.y + b.h / 2) * gc.k + gc.ty + cr.top - rr.top + 6 : 20;
        runAction(actionById("delete"), { kind: "node", ref: (d.ref || [])[i] || "", name: d.name[i], op: d.op[i], i }, {}, x, y);
      } else if (e.key === "Escape" && (values.length || menu.style.display !== "none")) {
        e.preventDefault(); e.stopImmediatePropagation();
        closeMenu(); values = []; renderChips(); redraw();
      }
    }, true);
  };
  const d0 = () => data();

  const onData = () => { Promise.resolve().then(() => { if (!destroyed) renderView(); }); };
  let pendingData = false;
  const onGraph = () => { if (pendingData) return; pendingData = true; Promise.resolve().then(() => { pendingData = false; onData(); }); };
  const onState = () => refreshBar();
  model.on("change:graph_data", onGraph);
  model.on("change:edit_state", onState);
  const onDocClick = (e) => { if (menu.style.display !== "none" && !menu.contains(e.target) && !root.querySelector(".wb-editbar").contains(e.target) && !(view && view.gc.wrap.contains(e.target))) closeMenu(); };
  document.addEventListener("pointerdown", onDocClick, true);
  refreshBar();
  renderChips();
  const ready = renderView();          // resolves once the first version is drawn
  root.wbEdit = {
    get view() { return view; }, get values() { return values; }, marks: () => marks,
    edgeMiddle: (value) => {
      if (!view || !view.gc.lay) return null;
      const ed = view.gc.lay.edges.find((x) => x.e.vals && x.e.vals.includes(value));
      if (!ed) return null;
      const [sx, sy] = wbEdgeMiddle(view.gc, ed), r = view.gc.canvas.getBoundingClientRect();
      return [r.left + sx, r.top + sy];
    },
  };
  return {
    root, ready,
    get view() { return view; },
    destroy() {
      destroyed = true;
      model.off("change:graph_data", onGraph);
      model.off("change:edit_state", onState);
      document.removeEventListener("pointerdown", onDocClick, true);
      closePanel();
      if (view) view.destroy();
      engine.destroy();
      if (api && api.destroy) api.destroy();
    },
  };
}
