// ONNX Workbench - shared graph drawing core (canvas). Concatenated in front of graph_view.js
// by the Python side, after `const WB_DAGRE_SRC = "<dagre.min.js>"` (the layout engine, run in
// a Web Worker); no imports, no network. The JupyterLab extension bundles the same files
// (extensions/jupyterlab-onnx/scripts/gen-core.mjs): after editing them, run
// scripts/build-labextension.sh and commit workbench/labextension/.
//
// What is drawn is decided in Python (workbench/widgets/graph_data.py): nodes with their scope
// group, what is folded into what, edges with shapes. Here: one *level* at a time (the
// children of one group, small groups opened in place as framed clusters), laid out by dagre
// in a worker when the level is first opened, cached, drawn on a canvas.

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
.wb-btn.wb-on { background: #dce8ff; border-color: #7ea6f0; }
.wb-btn.wb-danger { border-color: #c0392b; color: #c0392b; }
.wb-btn:disabled { opacity: .5; cursor: default; }
.wb-muted { color: #6b7785; }
.wb-crumbs { display: flex; gap: 4px; align-items: center; padding: 3px 8px; min-height: 24px;
  border-bottom: 1px solid #eef0f3; background: #fcfcfd; flex-wrap: wrap; font-size: 12px; }
.wb-crumb { color: #1463ff; cursor: pointer; border: none; background: none; padding: 0 2px;
  font: inherit; }
.wb-crumb:hover { text-decoration: underline; }
.wb-crumb.wb-here { color: #1f2933; font-weight: 600; cursor: default; text-decoration: none; }
.wb-body { display: flex; flex: 1; min-height: 0; }
.wb-canvaswrap { position: relative; flex: 1; min-width: 0; background: #fbfcfd;
  cursor: grab; overflow: hidden; outline: none; }
.wb-canvaswrap:focus-visible { box-shadow: inset 0 0 0 2px #7ea6f0; }
.wb-canvaswrap.wb-dragging { cursor: grabbing; }
.wb-canvaswrap canvas.wb-main { position: absolute; left: 0; top: 0; }
.wb-layingout { position: absolute; left: 8px; top: 6px; color: #6b7785; pointer-events: none; }
.wb-jump { position: absolute; left: 50%; transform: translateX(-50%); z-index: 2;
  border: 1px solid #7ea6f0; background: #fff; color: #1463ff; border-radius: 14px;
  padding: 3px 12px; font: 600 12px -apple-system, Segoe UI, Roboto, Helvetica, Arial, sans-serif;
  cursor: pointer; box-shadow: 0 1px 4px rgba(31, 41, 51, .18); white-space: nowrap; }
.wb-jump:hover { background: #eef4ff; }
.wb-jump-out { bottom: 10px; }
.wb-jump-in { top: 10px; }
.wb-minimap { display: block; border: 1px solid #c3c9d1; background: #fff; cursor: crosshair;
  margin-bottom: 6px; }
.wb-side { width: 270px; border-left: 1px solid #e4e7eb; overflow: auto; padding: 8px;
  background: #fff; }
.wb-side h4 { margin: 8px 0 4px; font-size: 12px; text-transform: uppercase; color: #52606d;
  letter-spacing: .03em; }
.wb-side table { border-collapse: collapse; width: 100%; }
.wb-side td { padding: 1px 4px 1px 0; vertical-align: top; word-break: break-all; }
.wb-kv td:first-child { color: #52606d; white-space: nowrap; word-break: normal; }
.wb-doc { white-space: pre-wrap; word-break: break-word; max-height: 12em; overflow: auto; }
.wb-folded { color: #6b7785; font-family: ui-monospace, Menlo, Consolas, monospace; font-size: 11px; }
.wb-legend-item { display: flex; align-items: center; gap: 6px; cursor: pointer;
  padding: 1px 2px; border-radius: 3px; }
.wb-legend-item:hover { background: #eef2f7; }
.wb-swatch { width: 11px; height: 11px; border-radius: 2px; flex: none; }
.wb-opname { font-weight: 600; font-size: 13px; }
.wb-param { color: #8a5a00; }
.wb-msg { padding: 6px 8px; background: #fff8e1; border-bottom: 1px solid #f0e0a0; }
.wb-err { padding: 6px 8px; background: #fdecea; border-bottom: 1px solid #f5c2bd;
  color: #8a1c12; white-space: pre-wrap; }
.wb-overlay-metric { width: 100%; max-width: 100%; font-size: 12px; margin-bottom: 4px; }
.wb-overlay-summary td, .wb-overlay-facts td { word-break: break-word; }
`;

function wbInjectStyle() {
  if (document.getElementById(WB_STYLE_ID)) return;
  const s = document.createElement("style");
  s.id = WB_STYLE_ID;
  s.textContent = WB_CSS;
  document.head.appendChild(s);
}

// The one way these front-ends put text in the page. Model data (names, op types,
// attributes, doc strings, file names: written by whoever made the model) goes in only as
// text nodes and attribute values, never through innerHTML: `<img src=x onerror=...>` as a
// node name stays those characters. Event handlers are functions (an "on..." attribute given
// a string is refused), and links only take our own blob:/data:image URLs or http(s).
const WB_URL_ATTRS = new Set(["href", "src", "xlink:href", "action", "formaction"]);
function wbSafeUrl(v) {
  const s = String(v).trim().toLowerCase();
  return s.startsWith("blob:") || s.startsWith("data:image/") || s.startsWith("http://") ||
    s.startsWith("https://") || s.startsWith("#");
}

function wbEl(tag, attrs, ...children) {
  const e = document.createElement(tag);
  if (attrs) for (const [k, v] of Object.entries(attrs)) {
    if (v == null) continue;
    if (k === "class") e.className = v;
    else if (k === "style") e.style.cssText = v;
    else if (k.startsWith("on")) {
      if (typeof v !== "function") throw new Error(`wbEl: ${k} must be a function`);
      e.addEventListener(k.slice(2), v);
    } else if (WB_URL_ATTRS.has(k) && !wbSafeUrl(v)) throw new Error(`wbEl: refused URL for ${k}`);
    else e.setAttribute(k, v);
  }
  for (const c of children) {
    if (c == null || c === false) continue;
    e.appendChild(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return e;
}

// SVG elements the same way (the SVG export): attribute values and text only
const WB_SVG_NS = "http://www.w3.org/2000/svg";
function wbSvgEl(tag, attrs, text) {
  const e = document.createElementNS(WB_SVG_NS, tag);
  if (attrs) for (const [k, v] of Object.entries(attrs)) {
    if (v == null) continue;
    if (k.startsWith("on") || WB_URL_ATTRS.has(k)) throw new Error(`wbSvgEl: refused attribute ${k}`);
    e.setAttribute(k, String(v));
  }
  if (text != null) e.textContent = String(text);
  return e;
}

// ------------------------------------------------------------------------------ layout engine
// dagre (layered / Sugiyama layout) in a Web Worker made from its source text; on the main
// thread when workers are unavailable (a sandbox refusing blob: workers).
const WB_WORKER_MAIN = `
function wbLayoutJob(job) {
  const g = new dagre.graphlib.Graph({ compound: true, multigraph: false });
  g.setGraph({ rankdir: "TB", nodesep: 18, ranksep: 30, edgesep: 8, marginx: 12, marginy: 12 });
  g.setDefaultEdgeLabel(() => ({}));
  for (const c of job.clusters) g.setNode(c.id, { label: c.label, paddingTop: 22, paddingLeft: 8, paddingRight: 8, paddingBottom: 8 });
  for (const n of job.nodes) g.setNode(n.id, { width: n.w, height: n.h });
  for (const c of job.clusters) if (c.parent) g.setParent(c.id, c.parent);
  for (const n of job.nodes) if (n.parent) g.setParent(n.id, n.parent);
  for (const e of job.edges) if (e.v !== e.w) g.setEdge(e.v, e.w, { minlen: 1 });
  dagre.layout(g);
  const nodes = {}, clusters = {};
  for (const n of job.nodes) { const o = g.node(n.id); nodes[n.id] = [o.x, o.y]; }
  for (const c of job.clusters) { const o = g.node(c.id); clusters[c.id] = [o.x, o.y, o.width, o.height]; }
  const edges = job.edges.map((e) => {
    if (e.v === e.w) return null;
    const o = g.edge(e.v, e.w);
    return o ? o.points.flatMap((p) => [p.x, p.y]) : null;
  });
  const gr = g.graph();
  return { nodes, clusters, edges, width: gr.width || 0, height: gr.height || 0 };
}
`;

class WbLayoutEngine {
  constructor() {
    this.jobs = new Map();
    this.next = 1;
    this.worker = null;
    try {
      const src = WB_DAGRE_SRC + "\n" + WB_WORKER_MAIN +
        "\nself.onmessage = (m) => { let r; try { r = { id: m.data.id, result: wbLayoutJob(m.data.job) }; }" +
        " catch (e) { r = { id: m.data.id, error: String(e && e.message || e) }; } self.postMessage(r); };";
      const url = URL.createObjectURL(new Blob([src], { type: "text/javascript" }));
      this.worker = new Worker(url);
      URL.revokeObjectURL(url);
      this.worker.onmessage = (m) => {
        const j = this.jobs.get(m.data.id);
        if (!j) return;
        this.jobs.delete(m.data.id);
        if (m.data.error) j.reject(new Error(m.data.error)); else j.resolve(m.data.result);
      };
      this.worker.onerror = () => this._fallback();
    } catch (e) {
      this.worker = null;
    }
  }

  _main() {
    if (!this.mainFn) this.mainFn = new Function(WB_DAGRE_SRC + "\n" + WB_WORKER_MAIN + "\nreturn wbLayoutJob;")();
    return this.mainFn;
  }

  _fallback() {
    if (this.worker) { this.worker.terminate(); this.worker = null; }
    for (const [id, j] of this.jobs) {
      this.jobs.delete(id);
      try { j.resolve(this._main()(j.job)); } catch (e) { j.reject(e); }
    }
  }

  layout(job) {
    if (!this.worker) {
      return new Promise((resolve, reject) => {
        try { resolve(this._main()(job)); } catch (e) { reject(e); }
      });
    }
    return new Promise((resolve, reject) => {
      const id = this.next++;
      this.jobs.set(id, { job, resolve, reject });
      this.worker.postMessage({ id, job });
    });
  }

  destroy() { if (this.worker) this.worker.terminate(); this.worker = null; this.jobs.clear(); }
}

// ------------------------------------------------------------------------------ graph model
// The payload of graph_data.graph_payload, with what the levels need: children, sizes, who
// holds whom. A level is named by a number: a group index (>= 0), or -(i + 2) for "the
// subgraphs of node i".
const WB_OPEN_BELOW = 5;        // a level with fewer items opens its biggest group in place
const WB_MAX_ITEMS = 60;        // ... as long as it keeps at most this many items
const WB_TINY = 2;              // groups this small are always opened in place (framed)

class WbGraph {
  constructor(data) {
    this.d = data;
    const n = this.n = data.name.length;
    const G = data.groups || { label: ["graph"], parent: [-1], kind: ["root"], owner: [-1], size: [n], size_all: [n] };
    this.G = G;
    this.ng = G.label.length;
    this.group = data.group || new Array(n).fill(0);
    this.host = data.host || new Array(n).fill(-1);
    this.nfold = data.nfold || new Array(n).fill(0);
    this.index = new Map();
    for (let i = 0; i < n; i++) if (!this.index.has(data.name[i])) this.index.set(data.name[i], i);
    this.kidGroups = Array.from({ length: this.ng }, () => []);
    this.subOf = new Map();          // node -> its subgraph groups
    for (let g = 1; g < this.ng; g++) {
      if (G.kind[g] === "subgraph") {
        const o = G.owner[g];
        if (!this.subOf.has(o)) this.subOf.set(o, []);
        this.subOf.get(o).push(g);
      } else if (G.parent[g] >= 0) this.kidGroups[G.parent[g]].push(g);
    }
    this.kidNodes = Array.from({ length: this.ng }, () => []);
    for (let i = 0; i < n; i++) this.kidNodes[this.group[i]].push(i);
    const e = data.edges || [];
    this.es = []; this.ed = []; this.el = [];
    for (let k = 0; k + 2 < e.length; k += 3) { this.es.push(e[k]); this.ed.push(e[k + 1]); this.el.push(e[k + 2]); }
    this.showAll = false;
    this.expanded = new Set();       // nodes whose folded inputs are shown
  }

  shown(i) {
    const h = this.host[i];
    return h === -1 || this.showAll || (h >= 0 && this.expanded.has(h));
  }

  size(g) { return this.showAll ? this.G.size_all[g] : this.G.size[g]; }

  // the group chain of node i, innermost first, crossing into the owner of a subgraph
  levelOf(i) {
    if (!this.shown(i) && this.host[i] >= 0) i = this.host[i];
    let L = 0;
    for (let guard = 0; guard < 64; guard++) {
      const lv = this.level(L);
      const it = lv.itemOf(i);
      if (!it || (it.type === "node" && it.i === i)) return L;
      if (it.type === "group") L = it.g;
      else if (it.type === "node" && this.subOf.has(it.i)) L = -(it.i + 2);
      else return L;
    }
    return L;
  }

  // the breadcrumbs of level L: [[level, label], ...] from the root
  crumbs(L) {
    const out = [];
    let g = L;
    while (true) {
      if (g < -1) { const o = -g - 2; out.push([g, this.d.name[o]]); g = this.group[o]; continue; }
      out.push([g, g === 0 ? (this.G.label[0] || "graph") : this.G.label[g]]);
      if (g <= 0) break;
      if (this.G.kind[g] === "subgraph") { g = -(this.G.owner[g] + 2); continue; }
      g = this.G.parent[g];
    }
    return out.reverse();
  }

  // the items of level L: nodes, collapsed groups, and groups opened in place (clusters)
  level(L) {
    const key = `${L}|${this.showAll ? 1 : 0}|${[...this.expanded].sort().join(",")}`;
    if (this._cache && this._cache.key === key) return this._cache.lv;
    const items = [], clusters = [];
    const itemOfNode = new Map(), itemOfGroup = new Map();
    const addNode = (i, parent) => {
      if (!this.shown(i)) return;
      const it = { type: "node", i, parent };
      itemOfNode.set(i, it); items.push(it);
    };
    const addGroup = (g, parent) => {
      if (this.size(g) <= 0) return;
      const it = { type: "group", g, parent };
      itemOfGroup.set(g, it); items.push(it);
    };
    const fill = (g, parent) => {
      for (const i of this.kidNodes[g]) addNode(i, parent);
      for (const c of this.kidGroups[g]) addGroup(c, parent);
    };
    if (L < -1) {
      for (const g of this.subOf.get(-L - 2) || []) addGroup(g, null);
    } else fill(L, null);
    // open in place: groups of one or two nodes; the biggest group while the level is small
    // or that group holds most of it
    const total = L < -1 ? 0 : this.size(L);
    const open = (it) => {
      items.splice(items.indexOf(it), 1);
      itemOfGroup.delete(it.g);
      const cid = "c" + it.g;
      clusters.push({ id: cid, g: it.g, parent: it.parent });
      fill(it.g, cid);
    };
    const openSingles = () => {
      for (let again = true; again;) {
        again = false;
        for (const it of items) {
          if (it.type === "group" && this.G.kind[it.g] !== "subgraph" &&
              (this.size(it.g) === 1 || (this.size(it.g) <= WB_TINY && items.length + this.size(it.g) <= WB_MAX_ITEMS))) {
            open(it); again = true; break;
          }
        }
      }
    };
    openSingles();
    while (true) {
      let best = null;
      for (const it of items) if (it.type === "group" && this.G.kind[it.g] !== "subgraph" && (!best || this.size(it.g) > this.size(best.g))) best = it;
      if (!best) break;
      const grow = this.kidNodes[best.g].filter((i) => this.shown(i)).length + this.kidGroups[best.g].filter((c) => this.size(c) > 0).length - 1;
      if (!((items.length < WB_OPEN_BELOW || this.size(best.g) > 0.5 * total) && items.length + grow <= WB_MAX_ITEMS)) break;
      open(best);
      openSingles();
    }
    // a group of one node is that node (labelled with the group's name), not a frame
    for (let c = clusters.length - 1; c >= 0; c--) {
      const inside = items.filter((it) => it.parent === clusters[c].id);
      const sub = clusters.some((o) => o.parent === clusters[c].id);
      if (inside.length === 1 && !sub) {
        inside[0].parent = clusters[c].parent;
        inside[0].scope = clusters[c].g;
        clusters.splice(c, 1);
      }
    }
    const lv = new WbLevel(this, L, items, clusters, itemOfNode, itemOfGroup);
    this._cache = { key, lv };
    return lv;
  }
}

class WbLevel {
  constructor(graph, L, items, clusters, itemOfNode, itemOfGroup) {
    this.graph = graph; this.L = L; this.items = items; this.clusters = clusters;
    this.itemOfNode = itemOfNode; this.itemOfGroup = itemOfGroup;
    for (const it of items) it.key = wbItemKey(it);
    this._edges();
    for (const it of this.items) it.key = wbItemKey(it);
  }

  // the item holding node i at this level (undefined: outside this level)
  itemOf(i) {
    const gr = this.graph;
    if (!gr.shown(i) && gr.host[i] >= 0) i = gr.host[i];
    const direct = this.itemOfNode.get(i);
    if (direct) return direct;
    let g = gr.group[i];
    for (let guard = 0; guard < 256 && g >= 0; guard++) {
      const it = this.itemOfGroup.get(g);
      if (it) return it;
      if (g === this.L) return undefined;
      if (gr.G.kind[g] === "subgraph") {
        const o = gr.G.owner[g];
        if (this.L === -(o + 2)) return undefined;
        const oi = this.itemOfNode.get(o);
        if (oi) return oi;
        g = gr.group[o];
        continue;
      }
      g = gr.G.parent[g];
    }
    return undefined;
  }

  _edges() {
    const gr = this.graph, d = gr.d;
    const pairs = new Map(), stubsIn = new Map(), stubsOut = new Map();
    const MAXSTUB = 8;
    for (let k = 0; k < gr.es.length; k++) {
      const s = gr.es[k], t = gr.ed[k];
      if (!gr.shown(s) || !gr.shown(t)) continue;
      const a = this.itemOf(s), b = this.itemOf(t);
      if (!a && !b) continue;
      if (a === b) continue;
      // the values an edge carries (the edit front-end selects them): `evalue`, when sent
      const val = d.evalue ? d.evalue[k] : undefined;
      const carry = (p) => { if (val !== undefined && !p.vals.includes(val)) p.vals.push(val); return p; };
      if (a && b) {
        const key = a.key + ">" + b.key;
        const p = pairs.get(key);
        if (p) carry(p).n++; else pairs.set(key, carry({ a, b, label: d.labels ? d.labels[gr.el[k]] : "", n: 1, vals: [] }));
      } else if (b) {
        let st = stubsIn.get(s);
        if (!st) {
          if (stubsIn.size >= MAXSTUB) st = stubsIn.get("more");
          if (!st) { st = { type: "stub", dir: "in", src: s, more: stubsIn.size >= MAXSTUB, count: 0 }; stubsIn.set(stubsIn.size >= MAXSTUB ? "more" : s, st); }
        }
        st.count++;
        const key = "in" + s + ">" + b.key;
        if (!pairs.has(key)) pairs.set(key, { a: st, b, label: d.labels ? d.labels[gr.el[k]] : "", n: 1, vals: [] });
        carry(pairs.get(key));
      } else {
        let st = stubsOut.get(t);
        if (!st) {
          if (stubsOut.size >= MAXSTUB) st = stubsOut.get("more");
          if (!st) { st = { type: "stub", dir: "out", dst: t, more: stubsOut.size >= MAXSTUB, count: 0 }; stubsOut.set(stubsOut.size >= MAXSTUB ? "more" : t, st); }
        }
        st.count++;
        const key = a.key + ">out" + t;
        if (!pairs.has(key)) pairs.set(key, { a, b: st, label: d.labels ? d.labels[gr.el[k]] : "", n: 1, vals: [] });
        carry(pairs.get(key));
      }
    }
    for (const st of [...stubsIn.values(), ...stubsOut.values()]) this.items.push(st);
    this.edges = [...pairs.values()];
  }
}

// keys of items (stable within a level)
function wbItemKey(it) {
  if (it.type === "node") return "n" + it.i;
  if (it.type === "group") return "g" + it.g;
  return it.dir === "in" ? "si" + (it.more ? "+" : it.src) : "so" + (it.more ? "+" : it.dst);
}

function wbItemLabel(graph, it) {
  const d = graph.d;
  if (it.type === "node") {
    const k = d.kind[it.i];
    if (k !== 0) return d.name[it.i];
    return it.scope !== undefined ? `${graph.G.label[it.scope]}: ${d.op[it.i]}` : d.op[it.i];
  }
  if (it.type === "group") return graph.G.label[it.g];
  const other = it.dir === "in" ? it.src : it.dst;
  if (it.more) return it.dir === "in" ? "… more inputs" : "… more consumers";
  const nm = d.name[other], short = nm.length > 28 ? "…" + nm.slice(-27) : nm;
  return (it.dir === "in" ? "from " : "to ") + short;
}

function wbGroupOps(graph, g, limit = 3) {
  // the most common op types under group g (shown nodes)
  const counts = new Map();
  const stack = [g];
  let seen = 0;
  while (stack.length && seen < 20000) {
    const x = stack.pop();
    for (const i of graph.kidNodes[x]) if (graph.shown(i) && graph.d.kind[i] === 0) { counts.set(graph.d.op[i], (counts.get(graph.d.op[i]) || 0) + 1); seen++; }
    for (const c of graph.kidGroups[x]) stack.push(c);
  }
  return [...counts.entries()].sort((a, b) => b[1] - a[1]).slice(0, limit);
}

// a sequential colour scale (light yellow -> orange -> dark red) for t in [0, 1]; ``mix``
// blends it with white (group boxes)
function wbScale(t, mix = 0) {
  const stops = [[255, 237, 160], [254, 178, 76], [240, 59, 32], [128, 0, 38]];
  t = Math.max(0, Math.min(1, t)) * (stops.length - 1);
  const k = Math.min(stops.length - 2, Math.floor(t)), u = t - k;
  const c = stops[k].map((a, j) => a + (stops[k + 1][j] - a) * u).map((a) => Math.round(a + (255 - a) * mix));
  return `rgb(${c[0]},${c[1]},${c[2]})`;
}

// ------------------------------------------------------------------------------ canvas
const WB_NODE_H = 28, WB_GROUP_H = 42, WB_STUB_H = 20;
// text is never drawn smaller than this on screen (a smaller zoom draws it at this size, cut to
// its box with an ellipsis, or leaves it out where it cannot fit)
const WB_MIN_TEXT_PX = 9;

// ``text`` cut with an ellipsis to at most ``maxW`` wide in ``ctx``'s current font ("" when
// not even one letter fits)
function wbClipText(ctx, text, maxW) {
  if (ctx.measureText(text).width <= maxW) return text;
  let lo = 0, hi = text.length;
  while (lo < hi) {
    const mid = (lo + hi + 1) >> 1;
    if (ctx.measureText(text.slice(0, mid) + "…").width <= maxW) lo = mid; else hi = mid - 1;
  }
  return lo ? text.slice(0, lo) + "…" : "";
}

class WbGraphCanvas {
  constructor(wrap, data, opts = {}) {
    this.wrap = wrap;
    this.data = data;
    this.graph = new WbGraph(data);
    this.opts = opts;
    this.n = data.name.length;
    this.index = this.graph.index;
    this.engine = opts.engine || new WbLayoutEngine();
    this.layouts = new Map();        // level key -> layout
    this.L = 0;
    this.lay = null;                 // the drawn layout
    this._selected = -1;             // node index
    this._marksDirty = true;
    this.selectedGroup = -1;
    this.highlight = new Set();
    this.dimmed = new Set();
    this.marked = new Set();
    this.pathTo = -1;                // node whose path (its upstream edges) is highlighted
    this.k = 1; this.tx = 0; this.ty = 0;
    this.showMini = true;
    this.canvas = wbEl("canvas", { class: "wb-main" });
    this.mini = wbEl("canvas", { class: "wb-minimap", title: "the whole level: click or drag to move the view" });
    this.busy = wbEl("div", { class: "wb-layingout" }, "");
    // a tall level opens on its inputs: these say that the outputs (inputs) are off screen and
    // take the view there in one click (keys End / Home)
    this.jumpOut = wbEl("button", { class: "wb-jump wb-jump-out", style: "display:none",
      title: "the drawing goes on below: show its outputs (key End)" }, "");
    this.jumpIn = wbEl("button", { class: "wb-jump wb-jump-in", style: "display:none",
      title: "show the inputs (key Home)" }, "");
    for (const [b, dir] of [[this.jumpOut, "out"], [this.jumpIn, "in"]]) {
      b.addEventListener("pointerdown", (e) => e.stopPropagation());   // not a drag of the view
      b.addEventListener("dblclick", (e) => e.stopPropagation());
      b.addEventListener("click", (e) => { e.stopPropagation(); this.goToEnd(dir); });
    }
    wrap.appendChild(this.canvas);
    wrap.appendChild(this.busy);
    wrap.appendChild(this.jumpOut);
    wrap.appendChild(this.jumpIn);
    wrap.tabIndex = 0;
    this.ctx = this.canvas.getContext("2d");
    this.listeners = [];
    this.levelListeners = [];
    this.openListeners = [];
    this._bind();
    this.resize();
  }

  get selected() { return this._selected; }
  set selected(i) { this._selected = i; this._marksDirty = true; }

  on(fn) { this.listeners.push(fn); }
  onLevel(fn) { this.levelListeners.push(fn); }

  // ---------------------------------------------------------------- levels
  _sizeOf(it) {
    const label = wbItemLabel(this.graph, it);
    if (it.type === "node") {
      const kind = this.data.kind[it.i];
      const extra = this.graph.nfold[it.i] && !this.graph.showAll ? 22 : 0;
      return [Math.max(kind ? 70 : 56, Math.min(220, 7 * label.length + 20 + extra)), WB_NODE_H];
    }
    if (it.type === "group") {
      const ops = wbGroupOps(this.graph, it.g, 2).map(([o, c]) => `${o}×${c}`).join(" ");
      const n = this.graph.size(it.g);
      let sub = `${n.toLocaleString()} node${n === 1 ? "" : "s"}${ops ? " · " + ops : ""}`;
      if (sub.length > 44) sub = sub.slice(0, 43) + "…";
      it.sub = sub;
      return [Math.max(120, Math.min(300, Math.max(7.2 * Math.min(label.length, 34) + 30, 6 * sub.length + 20))), WB_GROUP_H];
    }
    return [Math.max(60, Math.min(200, 6.2 * label.length + 16)), WB_STUB_H];
  }

  // open level L (a group index, or -(node + 2) for a node's subgraphs); resolves when drawn
  async open(L, { fit = true, focus = -1 } = {}) {
    this.L = L;
    const lv = this.graph.level(L);
    const key = this.graph._cache.key;
    let lay = this.layouts.get(key);
    if (!lay) {
      this.busy.textContent = `laying out ${lv.items.length} items…`;
      const t0 = performance.now();
      const job = { nodes: [], edges: [], clusters: [] };
      const sizes = new Map();
      for (const it of lv.items) {
        const [w, h] = this._sizeOf(it);
        sizes.set(it.key, [w, h]);
        job.nodes.push({ id: it.key, w, h, parent: it.parent || null });
      }
      const live = new Set(lv.clusters.map((c) => c.id));
      for (const c of lv.clusters) job.clusters.push({ id: c.id, parent: c.parent && live.has(c.parent) ? c.parent : null, label: this.graph.G.label[c.g] });
      // a stub keeps its edges (in: above the level; out: below)
      for (const e of lv.edges) job.edges.push({ v: e.a.key, w: e.b.key });
      let res;
      try {
        res = await this.engine.layout(job);
      } catch (err) {
        // dagre refuses some compound graphs: lay out without frames
        job.clusters = []; for (const nd of job.nodes) nd.parent = null;
        res = await this.engine.layout(job);
      }
      lay = { key, L, lv, res, sizes, ms: performance.now() - t0 };
      lay.items = lv.items.map((it) => {
        const p = res.nodes[it.key] || [0, 0];
        const [w, h] = sizes.get(it.key);
        return { it, x: p[0], y: p[1], w, h };
      });
      lay.byKey = new Map(lay.items.map((x) => [x.it.key, x]));
      lay.frames = lv.clusters.filter((c) => res.clusters[c.id]).map((c) => {
        const r = res.clusters[c.id];
        return { g: c.g, x: r[0] - r[2] / 2, y: r[1] - r[3] / 2, w: r[2], h: r[3] };
      });
      lay.edges = lv.edges.map((e, k) => ({ e, pts: res.edges[k] || [] }));
      lay.width = Math.max(1, res.width); lay.height = Math.max(1, res.height);
      this.layouts.set(key, lay);
      this.busy.textContent = "";
    }
    if (this.L !== L) return lay;          // another level was asked for meanwhile
    this.lay = lay;
    this._miniBase = null;
    this._marksDirty = true;
    if (fit) this.fitInitial();
    if (focus >= 0) {
      const x = this.itemBoxOf(focus);
      if (x) this.centreOnBox(x);
    }
    this.draw();
    this.levelListeners.forEach((fn) => fn(L));
    return lay;
  }

  itemBoxOf(i) {
    if (!this.lay) return null;
    const it = this.lay.lv.itemOf(i);
    return it ? this.lay.byKey.get(it.key) : null;
  }

  // open the level where node i is drawn and centre on it (keeps the zoom)
  async reveal(i, { select = false } = {}) {
    if (i < 0 || i >= this.n) return;
    if (!this.graph.shown(i) && this.graph.host[i] >= 0) this.graph.expanded.add(this.graph.host[i]);
    const L = this.graph.levelOf(i);
    this.graph.level(L);
    if (L !== this.L || !this.lay || this.lay.key !== this.graph._cache.key) await this.open(L, { fit: L !== this.L });
    if (select) this.selected = i;
    const b = this.itemBoxOf(i);
    if (b) this.centreOnBox(b);
    this.draw();
  }

  // ---------------------------------------------------------------- view
  resize() {
    const r = this.wrap.getBoundingClientRect();
    const dpr = window.devicePixelRatio || 1;
    this.W = Math.max(50, r.width); this.H = Math.max(50, r.height);
    this.canvas.width = Math.round(this.W * dpr); this.canvas.height = Math.round(this.H * dpr);
    this.canvas.style.width = this.W + "px"; this.canvas.style.height = this.H + "px";
    this.dpr = dpr;
    this._miniBase = null;
  }

  // inputs at the top, the level fitted to the width (and to the height when it is readable)
  fitInitial() {
    const lay = this.lay;
    if (!lay) return;
    const kw = (this.W - 24) / lay.width, kh = (this.H - 24) / lay.height;
    let k = Math.min(1.4, kw);
    if (lay.height * k > this.H - 24) k = Math.max(Math.min(k, kh), Math.min(k, 0.45));
    this.k = k;
    this.tx = (this.W - lay.width * k) / 2;
    this.ty = lay.height * k <= this.H - 24 ? (this.H - lay.height * k) / 2 : 12;
  }

  // the boxes of the level's graph outputs ("out") or inputs ("in"); on a level without them
  // (inside a group) its stubs to the rest of the graph, else its bottom (top) row of items
  endBoxes(dir) {
    const lay = this.lay;
    if (!lay || !lay.items.length) return [];
    const want = dir === "out" ? 2 : 1;
    let ends = lay.items.filter((b) => (b.it.type === "node" && this.data.kind[b.it.i] === want) ||
      (b.it.type === "stub" && b.it.dir === dir));
    if (!ends.length) {
      const edge = dir === "out" ? Math.max(...lay.items.map((b) => b.y)) : Math.min(...lay.items.map((b) => b.y));
      ends = lay.items.filter((b) => Math.abs(b.y - edge) < 1);
    }
    return ends;
  }

  // how many of the level's outputs ("out") / inputs ("in") are off screen below / above
  endsOffScreen(dir) {
    let n = 0;
    for (const b of this.endBoxes(dir)) {
      const top = (b.y - b.h / 2) * this.k + this.ty, bottom = (b.y + b.h / 2) * this.k + this.ty;
      if (dir === "out" ? bottom > this.H + 1 : top < -1) n++;
    }
    return n;
  }

  // pan (the zoom kept) so that the level's outputs / inputs are on screen
  goToEnd(dir) {
    const ends = this.endBoxes(dir);
    if (!ends.length) return;
    const k = this.k;
    const x0 = Math.min(...ends.map((b) => b.x - b.w / 2)), x1 = Math.max(...ends.map((b) => b.x + b.w / 2));
    const y0 = Math.min(...ends.map((b) => b.y - b.h / 2)), y1 = Math.max(...ends.map((b) => b.y + b.h / 2));
    this.ty = dir === "out" ? this.H - 16 - y1 * k : 16 - y0 * k;
    if (x0 * k + this.tx < 8 || x1 * k + this.tx > this.W - 8) this.tx = this.W / 2 - (x0 + x1) / 2 * k;
    this.draw();
  }

  _drawJumps() {
    for (const [b, dir] of [[this.jumpOut, "out"], [this.jumpIn, "in"]]) {
      const n = this.lay ? this.endsOffScreen(dir) : 0;
      if (!n) { if (b.style.display !== "none") b.style.display = "none"; continue; }
      const what = dir === "out" ? "output" : "input", s = n === 1 ? "" : "s";
      const label = dir === "out" ? `▼ ${n} ${what}${s} below` : `▲ ${n} ${what}${s} above`;
      if (b.textContent !== label) b.textContent = label;
      b.style.display = "";
    }
  }

  fitAll() {
    const lay = this.lay;
    if (!lay) return;
    this.k = Math.min(1.4, (this.W - 24) / lay.width, (this.H - 24) / lay.height);
    this.tx = (this.W - lay.width * this.k) / 2; this.ty = (this.H - lay.height * this.k) / 2;
    this.draw();
  }

  centreOnBox(b) {
    this.tx = this.W / 2 - b.x * this.k;
    this.ty = this.H / 2 - b.y * this.k;
  }

  centreOn(i) { this.reveal(i); }

  // bring node i (or the item holding it) into view, panning as little as possible
  ensureVisible(i, margin = 30) {
    const b = this.itemBoxOf(i);
    if (!b) { this.reveal(i); return; }
    const hw = b.w * this.k / 2, hh = b.h * this.k / 2;
    const sx = b.x * this.k + this.tx, sy = b.y * this.k + this.ty;
    let dx = 0, dy = 0;
    if (sx - hw < margin) dx = margin - (sx - hw); else if (sx + hw > this.W - margin) dx = this.W - margin - (sx + hw);
    if (sy - hh < margin) dy = margin - (sy - hh); else if (sy + hh > this.H - margin) dy = this.H - margin - (sy + hh);
    if (dx || dy) { this.tx += dx; this.ty += dy; }
    this.draw();
  }

  toWorld(sx, sy) { return [(sx - this.tx) / this.k, (sy - this.ty) / this.k]; }

  // the items whose boxes are inside the viewport (what a person sees)
  visibleItems() {
    if (!this.lay) return [];
    const [x0, y0] = this.toWorld(0, 0), [x1, y1] = this.toWorld(this.W, this.H);
    const out = [];
    for (const b of this.lay.items) {
      if (b.x + b.w / 2 < x0 || b.x - b.w / 2 > x1 || b.y + b.h / 2 < y0 || b.y - b.h / 2 > y1) continue;
      const it = b.it;
      const full = b.x - b.w / 2 >= x0 && b.x + b.w / 2 <= x1 && b.y - b.h / 2 >= y0 && b.y + b.h / 2 <= y1;
      const o = { type: it.type, label: wbItemLabel(this.graph, it), full };
      if (it.type === "node") { o.name = this.data.name[it.i]; o.op = this.data.op[it.i]; o.kind = this.data.kind[it.i]; o.folded = this.graph.nfold[it.i]; }
      if (it.type === "group") { o.group = it.g; o.size = this.graph.size(it.g); }
      out.push(o);
    }
    return out;
  }

  hit(sx, sy) {
    if (!this.lay) return null;
    const [wx, wy] = this.toWorld(sx, sy);
    let best = null, bestD = Infinity;
    for (const b of this.lay.items) {
      const dx = Math.abs(wx - b.x), dy = Math.abs(wy - b.y);
      if (dx <= b.w / 2 + 2 && dy <= b.h / 2 + 2 && dx + dy < bestD) { bestD = dx + dy; best = b; }
    }
    return best;
  }

  _bind() {
    const c = this.wrap;
    let drag = null;
    c.addEventListener("pointerdown", (e) => {
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
        const b = this.hit(e.clientX - r.left, e.clientY - r.top);
        this._click(b);
      }
    });
    c.addEventListener("dblclick", (e) => {
      const r = this.canvas.getBoundingClientRect();
      const b = this.hit(e.clientX - r.left, e.clientY - r.top);
      if (b) this.activate(b.it);
    });
    c.addEventListener("wheel", (e) => {
      e.preventDefault();
      const r = this.canvas.getBoundingClientRect();
      if (!e.ctrlKey && !e.metaKey && Math.abs(e.deltaX) > Math.abs(e.deltaY)) {   // sideways: pan
        this.tx -= e.deltaX; this.requestDraw(); return;
      }
      const sx = e.clientX - r.left, sy = e.clientY - r.top;
      const f = Math.exp(-e.deltaY * (e.deltaMode === 1 ? 0.05 : 0.0015));
      this.zoomAt(sx, sy, f);
    }, { passive: false });
    c.addEventListener("keydown", (e) => {
      const step = 60;
      const keys = {
        ArrowLeft: () => { this.tx += step; }, ArrowRight: () => { this.tx -= step; },
        ArrowUp: () => { this.ty += step; }, ArrowDown: () => { this.ty -= step; },
        "+": () => this.zoomAt(this.W / 2, this.H / 2, 1.25), "=": () => this.zoomAt(this.W / 2, this.H / 2, 1.25),
        "-": () => this.zoomAt(this.W / 2, this.H / 2, 0.8), "0": () => this.fitAll(),
        End: () => this.goToEnd("out"), Home: () => this.goToEnd("in"),
        Backspace: () => this.up(), Escape: () => this.up(),
        Enter: () => { if (this.selected >= 0) { const b = this.itemBoxOf(this.selected); if (b) this.activate(b.it); } },
      };
      const fn = keys[e.key];
      if (!fn) return;
      e.preventDefault();
      fn();
      this.requestDraw();
    });
    const miniMove = (e) => {
      if (!this.lay) return;
      const r = this.mini.getBoundingClientRect();
      const wx = (e.clientX - r.left - this.miniOff[0]) / this.miniScale, wy = (e.clientY - r.top - this.miniOff[1]) / this.miniScale;
      this.tx = this.W / 2 - wx * this.k; this.ty = this.H / 2 - wy * this.k;
      this.requestDraw();
    };
    let miniDrag = false;
    this.mini.addEventListener("pointerdown", (e) => { e.stopPropagation(); miniDrag = true; this.mini.setPointerCapture && this.mini.setPointerCapture(e.pointerId); miniMove(e); });
    this.mini.addEventListener("pointermove", (e) => { if (miniDrag) miniMove(e); });
    this.mini.addEventListener("pointerup", () => { miniDrag = false; });
    if (window.ResizeObserver) {
      this.ro = new ResizeObserver(() => { this.resize(); this.draw(); });
      this.ro.observe(c);
    }
  }

  zoomAt(sx, sy, f) {
    const k = Math.min(4, Math.max(0.02, this.k * f));
    this.tx = sx - (sx - this.tx) * (k / this.k);
    this.ty = sy - (sy - this.ty) * (k / this.k);
    this.k = k;
    this.requestDraw();
  }

  _click(b) {
    const it = b ? b.it : null;
    if (it && it.type === "group") {
      this.selected = -1; this.selectedGroup = it.g;
      this.listeners.forEach((fn) => fn(-1, "", it));
    } else if (it && it.type === "node") {
      this.selectedGroup = -1;
      this.listeners.forEach((fn) => fn(it.i, this.data.name[it.i], it));
    } else if (it && it.type === "stub") {
      const other = it.more ? -1 : (it.dir === "in" ? it.src : it.dst);
      if (other >= 0) this.reveal(other, { select: false });
    } else {
      this.selectedGroup = -1;
      this.listeners.forEach((fn) => fn(-1, "", null));
    }
    this.draw();
  }

  // double-click / Enter: open a group, a node's subgraphs, or a node's folded inputs
  activate(it) {
    if (it.type === "group") return this.open(it.g);
    if (it.type === "stub") { if (!it.more) this.reveal(it.dir === "in" ? it.src : it.dst); return; }
    const i = it.i;
    if (this.graph.subOf.has(i)) return this.open(-(i + 2));
    if (this.graph.nfold[i] && !this.graph.showAll) {
      if (this.graph.expanded.has(i)) this.graph.expanded.delete(i); else this.graph.expanded.add(i);
      const b = this.itemBoxOf(i);
      const sx = b ? b.x * this.k + this.tx : this.W / 2, sy = b ? b.y * this.k + this.ty : this.H / 2;
      return this.open(this.L, { fit: false }).then(() => {
        const nb = this.itemBoxOf(i);
        if (nb) { this.tx = sx - nb.x * this.k; this.ty = sy - nb.y * this.k; this.draw(); }
      });
    }
  }

  up() {
    const cr = this.graph.crumbs(this.L);
    if (cr.length > 1) return this.open(cr[cr.length - 2][0]);
  }

  setShowAll(on) {
    this.graph.showAll = !!on;
    this.graph.expanded.clear();
    const focus = this.selected;
    const L = focus >= 0 ? this.graph.levelOf(focus) : (this.L < -1 || this.graph.size(this.L) > 0 ? this.L : 0);
    return this.open(L, { fit: true, focus });
  }

  requestDraw() {
    if (this._raf) return;
    this._raf = requestAnimationFrame(() => { this._raf = 0; this.draw(); });
  }

  _marks() {
    // per-group counts of dimmed / marked / highlighted shown nodes (for collapsed groups)
    const gr = this.graph, lay = this.lay;
    this.itemMarks = new Map();
    if (!lay) return;
    const bump = (set, field) => {
      for (const i of set) {
        const it = lay.lv.itemOf(i);
        if (!it) continue;
        const m = this.itemMarks.get(it.key) || { dim: 0, mark: 0, hl: 0, sel: 0, flag: 0 };
        m[field]++;
        this.itemMarks.set(it.key, m);
      }
    };
    const dimShown = new Set([...this.dimmed].filter((i) => gr.shown(i)));
    bump(dimShown, "dim");
    bump(this.marked, "mark");
    bump(this.highlight, "hl");
    bump(this.flagged || [], "flag");
    if (this.selected >= 0) bump([this.selected], "sel");
    // the path to the searched node: every edge upstream of it in this level
    this.pathEdges = new Set();
    const target = this.pathTo >= 0 ? lay.lv.itemOf(this.pathTo) : null;
    if (target) {
      const into = new Map();
      for (const ed of lay.edges) {
        if (!into.has(ed.e.b.key)) into.set(ed.e.b.key, []);
        into.get(ed.e.b.key).push(ed);
      }
      const seen = new Set([target.key]), todo = [target.key];
      while (todo.length) {
        for (const ed of into.get(todo.pop()) || []) {
          this.pathEdges.add(ed);
          if (!seen.has(ed.e.a.key)) { seen.add(ed.e.a.key); todo.push(ed.e.a.key); }
        }
      }
    }
    for (const b of lay.items) {
      const it = b.it;
      const m = this.itemMarks.get(it.key);
      if (!m || !m.dim) continue;
      const size = it.type === "group" ? gr.size(it.g) : 1;
      m.allDim = m.dim >= size;
    }
  }

  colorOf(i) { return this.data.colors[this.data.op[i]] || "#667"; }

  // the fill of a node: its op colour, or its overlay value's colour when an overlay is shown
  fillOf(i) {
    const ov = this.overlay;
    if (ov && ov.node) {
      const v = ov.node.get(i);
      return v === undefined ? "#c3c9d1" : ov.color(v);
    }
    return this.colorOf(i);
  }

  groupFill(g) {
    const ov = this.overlay;
    if (ov && ov.group) {
      const v = ov.group.get(g);
      if (v !== undefined) return ov.color(v, true);
    }
    return "#f7faff";
  }

  draw() {
    const ctx = this.ctx, k = this.k, lay = this.lay;
    ctx.setTransform(this.dpr, 0, 0, this.dpr, 0, 0);
    ctx.clearRect(0, 0, this.W, this.H);
    if (!lay) return;
    if (this._marksDirty || this._marksFor !== lay) { this._marks(); this._marksDirty = false; this._marksFor = lay; }
    ctx.setTransform(this.dpr * k, 0, 0, this.dpr * k, this.dpr * this.tx, this.dpr * this.ty);
    const [vx0, vy0] = this.toWorld(0, 0), [vx1, vy1] = this.toWorld(this.W, this.H);
    const pad = 40;
    const visible = (x0, y0, x1, y1) => x1 >= vx0 - pad && x0 <= vx1 + pad && y1 >= vy0 - pad && y0 <= vy1 + pad;
    const font = (size, weight = 600) => `${weight} ${size}px -apple-system, Segoe UI, Roboto, Helvetica, Arial, sans-serif`;
    // a font size in world units that is at least WB_MIN_TEXT_PX on screen at this zoom
    const px = (size) => Math.max(size, WB_MIN_TEXT_PX / k);
    // frames of groups opened in place
    for (const f of lay.frames) {
      if (!visible(f.x, f.y, f.x + f.w, f.y + f.h)) continue;
      ctx.fillStyle = "rgba(20, 99, 255, 0.035)"; ctx.strokeStyle = "#c9d3e3"; ctx.lineWidth = 1 / Math.min(1, k);
      this._roundRect(f.x, f.y, f.w, f.h, 8); ctx.fill(); ctx.stroke();
      const fs = px(11);
      if (fs + 6 <= Math.max(f.h, 0)) {
        ctx.fillStyle = "#52606d"; ctx.font = font(fs); ctx.textAlign = "left"; ctx.textBaseline = "top";
        const cap = wbClipText(ctx, this.graph.G.label[f.g], f.w - 16);
        if (cap) ctx.fillText(cap, f.x + 8, f.y + 5);
      }
    }
    // edges
    const dimE = [], normE = [];
    for (const ed of lay.edges) {
      const p = ed.pts;
      if (p.length < 4) continue;
      let x0 = Infinity, y0 = Infinity, x1 = -Infinity, y1 = -Infinity;
      for (let i = 0; i < p.length; i += 2) { x0 = Math.min(x0, p[i]); x1 = Math.max(x1, p[i]); y0 = Math.min(y0, p[i + 1]); y1 = Math.max(y1, p[i + 1]); }
      if (!visible(x0, y0, x1, y1)) continue;
      const ma = this.itemMarks.get(ed.e.a.key), mb = this.itemMarks.get(ed.e.b.key);
      ((ma && ma.allDim) || (mb && mb.allDim) ? dimE : normE).push(ed);
    }
    const drawEdges = (list, colour, width = 1.1) => {
      ctx.strokeStyle = colour; ctx.fillStyle = colour; ctx.lineWidth = Math.max(width / Math.min(1, k), width);
      ctx.beginPath();
      for (const { pts: p } of list) {
        ctx.moveTo(p[0], p[1]);
        if (p.length === 4) ctx.lineTo(p[2], p[3]);
        else {
          for (let i = 2; i < p.length - 2; i += 2) {
            const mx = (p[i] + p[i + 2]) / 2, my = (p[i + 1] + p[i + 3]) / 2;
            ctx.quadraticCurveTo(p[i], p[i + 1], i + 4 >= p.length ? p[i + 2] : mx, i + 4 >= p.length ? p[i + 3] : my);
          }
        }
      }
      ctx.stroke();
      if (k > 0.25) {
        ctx.beginPath();
        for (const { pts: p } of list) {
          const n = p.length, x = p[n - 2], y = p[n - 1];
          const ang = Math.atan2(y - p[n - 3], x - p[n - 4]);
          ctx.moveTo(x, y);
          ctx.lineTo(x - 7 * Math.cos(ang - 0.45), y - 7 * Math.sin(ang - 0.45));
          ctx.lineTo(x - 7 * Math.cos(ang + 0.45), y - 7 * Math.sin(ang + 0.45));
          ctx.closePath();
        }
        ctx.fill();
      }
    };
    drawEdges(dimE, "#dde1e6");
    drawEdges(normE, "#8795a5");
    if (this.pathEdges && this.pathEdges.size) {
      drawEdges(normE.filter((ed) => this.pathEdges.has(ed)), "#e0a800", 2.4);
    }
    // tensor shapes on edges: a label that would overlap one already drawn, or a node, is
    // left out (hover or click the node for its shapes)
    if (k >= 0.7) {
      const fs = px(9.5);
      ctx.font = font(fs, 400); ctx.textAlign = "left"; ctx.textBaseline = "middle"; ctx.fillStyle = "#6b7785";
      const cell = 120, grid = new Map();
      const cells = (r, add) => {
        const out = [];
        for (let gx = Math.floor(r[0] / cell); gx <= Math.floor(r[2] / cell); gx++) {
          for (let gy = Math.floor(r[1] / cell); gy <= Math.floor(r[3] / cell); gy++) {
            const key = gx + "," + gy;
            if (add) { if (!grid.has(key)) grid.set(key, []); grid.get(key).push(r); } else out.push(...(grid.get(key) || []));
          }
        }
        return out;
      };
      const clash = (r) => cells(r, false).some((q) => r[0] < q[2] && q[0] < r[2] && r[1] < q[3] && q[1] < r[3]);
      for (const b of lay.items) {
        const x0 = b.x - b.w / 2, y0 = b.y - b.h / 2;
        if (visible(x0, y0, x0 + b.w, y0 + b.h)) cells([x0, y0, x0 + b.w, y0 + b.h], true);
      }
      for (const { e, pts: p } of normE) {
        if (!e.label) continue;
        const m = (p.length / 2) >> 1;
        const x = p[2 * m], y = p[2 * m + 1];
        const yy = p.length === 4 ? (p[1] + p[3]) / 2 : y;
        const xx = p.length === 4 ? (p[0] + p[2]) / 2 : x;
        const text = e.n > 1 ? `${e.label} ×${e.n}` : e.label;
        const r = [xx + 5, yy - fs * 0.6, xx + 5 + ctx.measureText(text).width, yy + fs * 0.6];
        if (clash(r)) continue;
        cells(r, true);
        ctx.fillText(text, xx + 5, yy);
      }
    }
    // items
    ctx.textAlign = "center"; ctx.textBaseline = "middle";
    const showText = k * WB_NODE_H >= 11;
    for (const b of lay.items) {
      const x0 = b.x - b.w / 2, y0 = b.y - b.h / 2;
      if (!visible(x0, y0, x0 + b.w, y0 + b.h)) continue;
      const it = b.it;
      const m = this.itemMarks.get(it.key);
      const dim = m && m.allDim;
      ctx.globalAlpha = dim ? 0.3 : 1;
      if (it.type === "node") {
        const kind = this.data.kind[it.i];
        ctx.fillStyle = dim ? "#b8bec6" : this.fillOf(it.i);
        this._roundRect(x0, y0, b.w, b.h, kind === 0 ? 5 : b.h / 2);
        ctx.fill();
        const nf = this.graph.showAll ? 0 : this.graph.nfold[it.i];
        if (showText) {
          ctx.fillStyle = "#fff"; ctx.font = font(px(11));
          let label = wbItemLabel(this.graph, it);
          if (label.length > 28) label = label.slice(0, 26) + "…";
          label = wbClipText(ctx, label, b.w - (nf ? 30 : 8));
          ctx.fillText(label, b.x - (nf ? 10 : 0), b.y + 0.5);
        }
        if (nf) {      // folded constants / shape computations: a badge
          const open = this.graph.expanded.has(it.i);
          ctx.fillStyle = open ? "#1463ff" : "rgba(255,255,255,.9)";
          this._roundRect(x0 + b.w - 22, y0 + 6, 17, b.h - 12, 4); ctx.fill();
          if (showText && k * 9 >= WB_MIN_TEXT_PX - 1) {
            ctx.fillStyle = open ? "#fff" : "#334"; ctx.font = font(9);
            ctx.fillText(nf > 99 ? "99+" : "+" + nf, x0 + b.w - 13.5, b.y + 0.5);
          }
        }
      } else if (it.type === "group") {
        ctx.fillStyle = dim ? "#eef0f2" : "#eef3fb";
        ctx.strokeStyle = dim ? "#c8cdd3" : "#7f95b8"; ctx.lineWidth = 1.4 / Math.min(1, Math.max(k, 0.2));
        this._roundRect(x0 + 3, y0 + 3, b.w, b.h, 7); ctx.fill(); ctx.stroke();      // a stack
        ctx.fillStyle = dim ? "#f3f4f6" : this.groupFill(it.g);
        this._roundRect(x0, y0, b.w, b.h, 7); ctx.fill(); ctx.stroke();
        if (showText) {
          let label = wbItemLabel(this.graph, it);
          if (label.length > 34) label = label.slice(0, 32) + "…";
          const f1 = px(11.5), f2 = px(10), both = f1 + f2 + 6 <= b.h;
          ctx.fillStyle = "#1f2933"; ctx.font = font(f1);
          ctx.fillText(wbClipText(ctx, label, b.w - 8), b.x, both ? b.y - 7 * f1 / 11.5 : b.y + 0.5);
          if (both) {
            ctx.fillStyle = "#52606d"; ctx.font = font(f2, 400);
            ctx.fillText(wbClipText(ctx, it.sub || "", b.w - 8), b.x, b.y + 9 * f2 / 10);
          }
          this._groupTotal(it.g, x0, y0, b.w, (size, weight) => font(px(size), weight));
        }
      } else {
        ctx.fillStyle = "#f1f3f5"; ctx.strokeStyle = "#b8c0ca"; ctx.lineWidth = 1 / Math.min(1, k);
        ctx.setLineDash([3, 3]);
        this._roundRect(x0, y0, b.w, b.h, b.h / 2); ctx.fill(); ctx.stroke();
        ctx.setLineDash([]);
        if (showText) {
          ctx.fillStyle = "#52606d"; ctx.font = font(px(10), 400);
          ctx.fillText(wbClipText(ctx, wbItemLabel(this.graph, it), b.w - 8), b.x, b.y + 0.5);
        }
      }
    }
    ctx.globalAlpha = 1;
    const ring = (b, colour, width, dash) => {
      ctx.strokeStyle = colour; ctx.lineWidth = width / Math.min(1, Math.max(k, 0.05));
      if (dash) ctx.setLineDash([5, 4]);
      this._roundRect(b.x - b.w / 2 - 3, b.y - b.h / 2 - 3, b.w + 6, b.h + 6, 8);
      ctx.stroke();
      ctx.setLineDash([]);
    };
    for (const b of lay.items) {
      const m = this.itemMarks.get(b.it.key);
      if (!m) continue;
      const inGroup = b.it.type === "group";
      if (m.hl) ring(b, "#f5b700", 3, false);
      if (m.flag) ring(b, "#b0006e", 3.5, inGroup);
      if (m.mark) ring(b, "#d62d20", 3, inGroup);
      if (m.sel) ring(b, "#1463ff", 3, inGroup);
    }
    if (this.selectedGroup >= 0) {
      const b = lay.byKey.get("g" + this.selectedGroup);
      if (b) ring(b, "#1463ff", 3, false);
    }
    this.drawMini();
    this._drawJumps();
  }

  // an overlay's total of a collapsed group, as a pill on its top edge
  _groupTotal(g, x0, y0, w, font) {
    const text = this.overlay ? this.overlay.groupText(g) : "";
    if (!text) return;
    const ctx = this.ctx;
    ctx.font = font(10, 600);
    const tw = ctx.measureText(text).width + 10;
    ctx.fillStyle = "rgba(31, 41, 51, 0.86)";
    this._roundRect(x0 + w - tw - 6, y0 - 8, tw, 15, 7); ctx.fill();
    ctx.fillStyle = "#fff"; ctx.textAlign = "center";
    ctx.fillText(text, x0 + w - tw / 2 - 6, y0 - 0.5);
  }

  _roundRect(x, y, w, h, r) {
    const ctx = this.ctx;
    r = Math.min(r, w / 2, h / 2);
    ctx.beginPath();
    ctx.moveTo(x + r, y);
    ctx.arcTo(x + w, y, x + w, y + h, r);
    ctx.arcTo(x + w, y + h, x, y + h, r);
    ctx.arcTo(x, y + h, x, y, r);
    ctx.arcTo(x, y, x + w, y, r);
    ctx.closePath();
  }

  // the minimap lives in the side panel (it never covers the drawing); hidden on demand
  drawMini() {
    const lay = this.lay;
    // shown when the level does not fit in the view (and not hidden with the Map button)
    const fits = lay && lay.width * this.k <= this.W * 1.02 && lay.height * this.k <= this.H * 1.02;
    if (!this.showMini || !lay || fits || !this.mini.isConnected) { this.mini.style.display = "none"; return; }
    this.mini.style.display = "";
    const dpr = this.dpr;
    const mw = Math.max(120, Math.min(250, (this.mini.parentElement ? this.mini.parentElement.clientWidth : 250) - 4));
    const mh = Math.max(60, Math.min(160, mw * lay.height / lay.width));
    const s = Math.min(mw / lay.width, mh / lay.height);
    this.miniScale = s;
    this.miniOff = [(mw - lay.width * s) / 2, (mh - lay.height * s) / 2];
    if (!this._miniBase || this._miniBase.width !== Math.round(mw * dpr)) {
      this.mini.width = Math.round(mw * dpr); this.mini.height = Math.round(mh * dpr);
      this.mini.style.width = mw + "px"; this.mini.style.height = mh + "px";
      const base = document.createElement("canvas");
      base.width = this.mini.width; base.height = this.mini.height;
      const b = base.getContext("2d");
      b.setTransform(dpr, 0, 0, dpr, 0, 0);
      b.translate(this.miniOff[0], this.miniOff[1]);
      for (const x of lay.items) {
        const it = x.it;
        b.fillStyle = it.type === "node" ? this.fillOf(it.i) : it.type === "group" ? "#7f95b8" : "#c3c9d1";
        const w = Math.max(1.5, x.w * s), h = Math.max(1.5, x.h * s);
        b.fillRect(x.x * s - w / 2, x.y * s - h / 2, w, h);
      }
      this._miniBase = base;
    }
    const m = this.mini.getContext("2d");
    m.setTransform(1, 0, 0, 1, 0, 0);
    m.clearRect(0, 0, this.mini.width, this.mini.height);
    m.drawImage(this._miniBase, 0, 0);
    m.setTransform(dpr, 0, 0, dpr, 0, 0);
    m.translate(this.miniOff[0], this.miniOff[1]);
    const [x0, y0] = this.toWorld(0, 0), [x1, y1] = this.toWorld(this.W, this.H);
    m.strokeStyle = "#1463ff"; m.lineWidth = 1.5;
    m.strokeRect(x0 * s, y0 * s, Math.max(2, (x1 - x0) * s), Math.max(2, (y1 - y0) * s));
  }

  // ---------------------------------------------------------------- export
  // the current view as a PNG data URL (what is on screen, at the screen's pixel density)
  toPNG() { this.draw(); return this.canvas.toDataURL("image/png"); }

  // the current view as SVG: the same items, edges, frames and shapes, as vector shapes.
  // Built as DOM elements (labels as text content) and serialised by the browser's
  // XMLSerializer, which escapes what it writes: a label cannot become markup.
  toSVGElement() {
    const lay = this.lay;
    const [x0, y0] = this.toWorld(0, 0), [x1, y1] = this.toWorld(this.W, this.H);
    const f = (v) => Math.round(v * 10) / 10;
    const svg = wbSvgEl("svg", { xmlns: WB_SVG_NS, width: f(this.W), height: f(this.H),
      viewBox: `${f(x0)} ${f(y0)} ${f(x1 - x0)} ${f(y1 - y0)}`, "font-family": "Helvetica, Arial, sans-serif" });
    const add = (tag, attrs, text) => svg.appendChild(wbSvgEl(tag, attrs, text));
    add("rect", { x: f(x0), y: f(y0), width: f(x1 - x0), height: f(y1 - y0), fill: "#ffffff" });
    const defs = wbSvgEl("defs");
    const marker = wbSvgEl("marker", { id: "wbArrow", viewBox: "0 0 10 10", refX: 9, refY: 5, markerWidth: 7, markerHeight: 7, orient: "auto" });
    marker.appendChild(wbSvgEl("path", { d: "M0,1 L9,5 L0,9 z", fill: "#8795a5" }));
    defs.appendChild(marker);
    svg.appendChild(defs);
    if (!lay) return svg;
    const inView = (a, b, c, d) => c >= x0 && a <= x1 && d >= y0 && b <= y1;
    for (const fr of lay.frames) {
      if (!inView(fr.x, fr.y, fr.x + fr.w, fr.y + fr.h)) continue;
      add("rect", { x: f(fr.x), y: f(fr.y), width: f(fr.w), height: f(fr.h), rx: 8, fill: "#f5f8fe", stroke: "#c9d3e3" });
      add("text", { x: f(fr.x + 8), y: f(fr.y + 15), "font-size": 11, "font-weight": 600, fill: "#52606d" }, this.graph.G.label[fr.g]);
    }
    for (const { e, pts: p } of lay.edges) {
      if (p.length < 4) continue;
      let d = `M${f(p[0])},${f(p[1])}`;
      for (let i = 2; i < p.length; i += 2) d += ` L${f(p[i])},${f(p[i + 1])}`;
      add("path", { d, fill: "none", stroke: "#8795a5", "stroke-width": 1.1, "marker-end": "url(#wbArrow)" });
      if (e.label) {
        const m = (p.length / 2) >> 1;
        add("text", { x: f(p[2 * m] + 5), y: f(p[2 * m + 1] + 3), "font-size": 9, fill: "#6b7785" }, e.n > 1 ? `${e.label} ×${e.n}` : e.label);
      }
    }
    for (const b of lay.items) {
      const bx = b.x - b.w / 2, by = b.y - b.h / 2;
      if (!inView(bx, by, bx + b.w, by + b.h)) continue;
      const it = b.it, label = wbItemLabel(this.graph, it);
      if (it.type === "node") {
        const r = this.data.kind[it.i] === 0 ? 5 : b.h / 2;
        add("rect", { x: f(bx), y: f(by), width: f(b.w), height: f(b.h), rx: r, fill: this.fillOf(it.i) });
        add("text", { x: f(b.x), y: f(b.y + 4), "text-anchor": "middle", "font-size": 11, "font-weight": 600, fill: "#ffffff" }, label);
        const nf = this.graph.showAll ? 0 : this.graph.nfold[it.i];
        if (nf) add("text", { x: f(bx + b.w - 4), y: f(by + 10), "text-anchor": "end", "font-size": 8, fill: "#ffffff" }, `+${nf}`);
      } else if (it.type === "group") {
        add("rect", { x: f(bx), y: f(by), width: f(b.w), height: f(b.h), rx: 7, fill: this.groupFill(it.g), stroke: "#7f95b8", "stroke-width": 1.4 });
        add("text", { x: f(b.x), y: f(b.y - 3), "text-anchor": "middle", "font-size": 11.5, "font-weight": 600, fill: "#1f2933" }, label);
        add("text", { x: f(b.x), y: f(b.y + 12), "text-anchor": "middle", "font-size": 10, fill: "#52606d" }, it.sub || "");
        const tot = this.overlay ? this.overlay.groupText(it.g) : "";
        if (tot) add("text", { x: f(bx + b.w - 6), y: f(by - 2), "text-anchor": "end", "font-size": 10, "font-weight": 600, fill: "#1f2933" }, tot);
      } else {
        add("rect", { x: f(bx), y: f(by), width: f(b.w), height: f(b.h), rx: b.h / 2, fill: "#f1f3f5", stroke: "#b8c0ca", "stroke-dasharray": "3,3" });
        add("text", { x: f(b.x), y: f(b.y + 3.5), "text-anchor": "middle", "font-size": 10, fill: "#52606d" }, label);
      }
    }
    return svg;
  }

  toSVG() { return new XMLSerializer().serializeToString(this.toSVGElement()); }

  // highlight the path to node i (its upstream edges in the level where it is drawn)
  setPathTo(i) { this.pathTo = i; this._marksDirty = true; }

  // ---------------------------------------------------------------- overlay
  // per-node numbers drawn as colours, with totals on collapsed groups: one series
  // ({title, unit, values: {node name: number}, flagged: [node names]}: differences from a
  // reference) or an analysis' metrics ({metrics: [...], metric, summary}: FLOPs, memory,
  // times, % of roof, bound; workbench/analysis/overlay.py), shown one at a time
  setOverlay(ov, metric) {
    const ms = ov && Array.isArray(ov.metrics) ? ov.metrics : null;
    let m = null;
    if (ms && ms.length) m = ms.find((x) => x.key === metric) || ms.find((x) => x.key === ov.metric) || ms[0];
    else if (ov && ov.values && Object.keys(ov.values).length) {
      m = { key: "", title: ov.title || "", unit: ov.unit || "", format: "", kind: "sum", scale: "linear", values: ov.values, group_rule: "the sum of their nodes" };
    }
    this.overlaySpec = ms && ms.length ? ov : null;
    this.overlay = m ? wbOverlayOf(this.graph, this.index, m) : null;
    this.flagged = new Set();
    for (const nm of (ov && ov.flagged) || []) { const i = this.index.get(nm); if (i !== undefined) this.flagged.add(i); }
    this._marksDirty = true;
    this._miniBase = null;
    this.draw();
  }

  // every metric of the analysis overlay, computed once each (the details panel lists them)
  overlayMetrics() {
    const spec = this.overlaySpec;
    if (!spec) return [];
    if (this._ovAll && this._ovAll.spec === spec) return this._ovAll.list;
    const list = spec.metrics.map((m) => wbOverlayOf(this.graph, this.index, m));
    this._ovAll = { spec, list };
    return list;
  }

  setNames(kind, names) {
    const set = new Set();
    for (const nm of names || []) { const i = this.index.get(nm); if (i !== undefined) set.add(i); }
    this[kind] = set;
    this._marksDirty = true;
  }

  // nodes whose name or op type contains q (shown or folded)
  search(q) {
    q = (q || "").trim().toLowerCase();
    if (!q) return [];
    const d = this.data, out = [];
    for (let i = 0; i < this.n; i++) {
      if (d.name[i].toLowerCase().includes(q) || d.op[i].toLowerCase().includes(q)) out.push(i);
    }
    // shown nodes first, in graph order
    out.sort((a, b) => (this.graph.host[a] === -1 ? 0 : 1) - (this.graph.host[b] === -1 ? 0 : 1) || a - b);
    return out;
  }

  destroy() {
    if (this.ro) this.ro.disconnect();
    if (!this.opts.engine) this.engine.destroy();
  }
}

// Details panel contents for a node (uses Python's details when they are for this node):
// a fragment of elements, every model string in it as text.
function wbDetails(data, i, det, late = false) {
  const out = document.createDocumentFragment();
  const add = (...els) => { for (const e of els) if (e) out.appendChild(e); };
  if (i < 0) {
    add(wbEl("div", { class: "wb-muted" }, "Click a node to see its details; double-click a group to open it."));
    return out;
  }
  const name = data.name[i], op = data.op[i];
  add(wbEl("div", { class: "wb-opname" }, op),
    wbEl("div", { class: "wb-muted", style: "word-break:break-all" }, name));
  if (data.nfold && data.nfold[i]) {
    add(wbEl("div", { class: "wb-muted" }, `${data.nfold[i]} constant / shape node${data.nfold[i] === 1 ? "" : "s"} folded in (double-click the node to show them)`));
  }
  if (!det || det.name !== name) {
    add(late
      ? wbEl("div", { class: "wb-msg wb-nokernel" }, "No details arrived from Python: the kernel may be busy, stopped or restarted. Re-run the cell to reconnect.")
      : wbEl("div", { class: "wb-muted" }, "(loading details from the kernel…)"));
    return out;
  }
  if (det.domain && det.domain !== "ai.onnx") add(wbEl("div", { class: "wb-muted" }, `domain ${det.domain}`));
  const attrs = Object.entries(det.attrs || {});
  if (attrs.length) {
    add(wbEl("h4", null, "Attributes"),
      wbEl("table", { class: "wb-kv" }, ...attrs.map(([k, v]) => wbEl("tr", null, wbEl("td", null, k), wbEl("td", null, v)))));
  }
  const vals = (title, list) => {
    if (!list || !list.length) return;
    const rows = [];
    for (const v of list) {
      if (v.omitted) { rows.push(wbEl("tr", null, wbEl("td", { class: "wb-muted" }, "(omitted)"))); continue; }
      rows.push(wbEl("tr", null, wbEl("td", { class: v.param ? "wb-param" : null }, v.name),
        wbEl("td", { style: "white-space:nowrap" }, `${v.dtype} ${v.shape}${v.param ? " · " + Number(v.count).toLocaleString() : ""}`)));
      if (v.folded) rows.push(wbEl("tr", null, wbEl("td", { colspan: "2", class: "wb-folded" }, `= ${v.folded}`)));
    }
    add(wbEl("h4", null, title), wbEl("table", null, ...rows));
  };
  vals("Inputs", det.inputs);
  vals("Outputs", det.outputs);
  if (det.params) add(wbEl("h4", null, "Parameters"), wbEl("div", null, `${Number(det.params).toLocaleString()} values`));
  if (det.doc) add(wbEl("h4", null, "Doc"), wbEl("div", { class: "wb-muted wb-doc" }, det.doc));
  return out;
}

function wbGroupDetails(graph, g) {
  const n = graph.size(g);
  const ops = wbGroupOps(graph, g, 8);
  const out = document.createDocumentFragment();
  out.appendChild(wbEl("div", { class: "wb-opname" }, graph.G.label[g]));
  out.appendChild(wbEl("div", { class: "wb-muted" },
    `${graph.G.kind[g]} · ${n.toLocaleString()} node${n === 1 ? "" : "s"}${graph.showAll ? "" : ` (+${(graph.G.size_all[g] - n).toLocaleString()} folded)`}`));
  out.appendChild(wbEl("div", { class: "wb-muted" }, "Double-click to open it."));
  if (ops.length) {
    out.appendChild(wbEl("h4", null, "Operators"));
    out.appendChild(wbEl("table", { class: "wb-kv" }, ...ops.map(([o, c]) => wbEl("tr", null, wbEl("td", null, o), wbEl("td", null, String(c))))));
  }
  return out;
}

// an overlay metric prepared for drawing: node and group values (sums, maxima, ratios of
// sums, or categories), the colour scale and the text of a value
function wbOverlayOf(graph, index, m) {
  const kind = m.kind || "sum", G = graph.G;
  const nodeAcc = new Map(), groupAcc = new Map();
  const addTo = (map, key, v) => {
    const a = map.get(key);
    if (kind === "max") map.set(key, a === undefined ? v : Math.max(a, v));
    else if (kind === "sum") map.set(key, (a || 0) + v);
    else if (a === undefined) map.set(key, v.slice());
    else { a[0] += v[0]; a[1] += v[1]; }
  };
  const spread = (i, v) => {
    addTo(nodeAcc, i, v);
    // a folded node counts for the node it is folded into, and for its groups
    const h = graph.host[i] >= 0 ? graph.host[i] : i;
    if (h !== i) addTo(nodeAcc, h, v);
    for (let g = graph.group[h]; g >= 0; g = G.kind[g] === "subgraph" ? graph.group[G.owner[g]] : G.parent[g]) {
      addTo(groupAcc, g, v);
      if (g === 0) break;
    }
  };
  const cats = new Map();
  if (kind === "sum" || kind === "max") {
    for (const [nm, v] of Object.entries(m.values || {})) {
      const i = index.get(nm);
      if (i !== undefined && Number.isFinite(v)) spread(i, v);
    }
  } else if (kind === "ratio") {
    for (const [nm, a] of Object.entries(m.num || {})) {
      const i = index.get(nm), b = (m.den || {})[nm];
      if (i !== undefined && Number.isFinite(a) && Number.isFinite(b) && b > 0) spread(i, [a, b]);
    }
  } else if (kind === "category") {
    for (const [nm, c] of Object.entries(m.categories || {})) {
      const i = index.get(nm);
      if (i === undefined) continue;
      cats.set(i, String(c));
      spread(i, [Number((m.flops || {})[nm]) || 0, Number((m.bytes || {})[nm]) || 0]);
    }
  }
  const times = m.times || 1;
  const fin = (a) => kind === "ratio" ? times * a[0] / a[1] : kind === "category"
    ? (a[1] > 0 && a[0] / a[1] >= (m.ridge || 0) ? "compute" : "memory") : a;
  const node = new Map(), group = new Map();
  for (const [i, a] of nodeAcc) node.set(i, kind === "category" && cats.has(i) ? cats.get(i) : fin(a));
  for (const [g, a] of groupAcc) group.set(g, fin(a));
  const out = { key: m.key, title: m.title || "", unit: m.unit || "", m, kind, node, group };
  if (kind === "category") {
    const colors = m.colors || {};
    out.color = (v, isGroup) => wbMix(colors[v] || "#8a94a0", isGroup ? 0.55 : 0);
  } else {
    const range = (vals) => {
      const pos = vals.filter((v) => v > 0);
      return [vals.length ? Math.min(...vals) : 0, vals.length ? Math.max(...vals) : 0, pos.length ? Math.min(...pos) : 0];
    };
    const nv = [...node.values()], gv = [...group.entries()].filter(([g]) => g !== 0).map(([, v]) => v);
    [out.lo, out.hi, out.minPos] = range(nv);
    [out.glo, out.ghi, out.gminPos] = range(gv);
    const scale = (lo, hi, minPos) => {
      if (m.format === "pct") return (v) => Math.max(0, Math.min(1, v / 100));
      if (m.scale === "log" && minPos > 0 && hi > minPos) {
        const a = Math.log(minPos), b = Math.log(hi);
        return (v) => (v > 0 ? (Math.log(v) - a) / (b - a) : 0);
      }
      const a = Math.min(lo, 0);
      return (v) => (hi > a ? (v - a) / (hi - a) : 1);
    };
    out.t = scale(out.lo, out.hi, out.minPos);
    out.tg = scale(out.glo, out.ghi, out.gminPos);
    const rev = m.reverse ? (t) => 1 - t : (t) => t;
    out.color = (v, isGroup) => isGroup ? wbScale(rev(out.tg(v)), 0.35) : wbScale(rev(out.t(v)));
  }
  out.text = (v) => wbFmtMetric(v, m);
  // the total of group g (not the whole graph's: the summary says that)
  out.groupText = (g) => { const v = group.get(g); return g > 0 && v !== undefined ? out.text(v) : ""; };
  return out;
}

// a CSS hex colour mixed with white
function wbMix(hex, mix) {
  const h = String(hex).replace("#", "");
  if (!/^[0-9a-fA-F]{6}$/.test(h)) return hex;
  const c = [0, 2, 4].map((k) => parseInt(h.slice(k, k + 2), 16)).map((a) => Math.round(a + (255 - a) * mix));
  return `rgb(${c[0]},${c[1]},${c[2]})`;
}

// a metric value as text: 1.23 GFLOP, 4.5 MiB, 12.3 ms, 87 %, compute
function wbFmtMetric(v, m) {
  if (typeof v === "string") return v;
  if (!Number.isFinite(v)) return "—";
  const unit = (m && m.unit) || "", fmt = (m && m.format) || "";
  const a = Math.abs(v);
  const p3 = (x) => (Math.abs(x) >= 100 ? x.toFixed(0) : Math.abs(x) >= 10 ? x.toFixed(1) : x.toFixed(2));
  if (fmt === "bytes") {
    const us = ["B", "KiB", "MiB", "GiB", "TiB"];
    let x = v, k = 0;
    while (Math.abs(x) >= 1024 && k < us.length - 1) { x /= 1024; k++; }
    return k ? `${p3(x)} ${us[k]}` : `${Math.round(x)} B`;
  }
  if (fmt === "si") {
    const ps = ["", "k", "M", "G", "T", "P"];
    let x = v, k = 0;
    while (Math.abs(x) >= 1000 && k < ps.length - 1) { x /= 1000; k++; }
    return `${k ? p3(x) : Math.round(x)} ${ps[k]}${unit}`.trim();
  }
  if (fmt === "ms") return `${a >= 100 ? v.toFixed(0) : a >= 1 ? v.toFixed(2) : v.toPrecision(2)} ms`;
  if (fmt === "pct") return `${a >= 10 ? v.toFixed(0) : v.toFixed(1)} %`;
  if (fmt === "ratio") return `${v.toPrecision(3)} ${unit}`.trim();
  return `${a >= 100 ? v.toFixed(0) : a >= 1 ? v.toFixed(2) : v.toPrecision(2)} ${unit}`.trim();
}

// the overlay's legend: the metric (a choice when there are several), its colours and range,
// how groups total it; rings of flagged nodes
function wbOverlayLegend(gc, spec, onMetric) {
  const ov = gc.overlay;
  if (!ov) {
    if (!gc.flagged || !gc.flagged.size) return null;      // rings only (GraphCompare)
    return wbEl("div", { class: "wb-overlay-legend" },
      wbEl("h4", null, (spec && spec.title) || "ringed nodes"),
      wbEl("div", { class: "wb-muted" }, `${gc.flagged.size} node${gc.flagged.size === 1 ? "" : "s"} ringed`));
  }
  const m = ov.m;
  const box = wbEl("div", { class: "wb-overlay-legend", "data-metric": ov.key || "" });
  const metrics = gc.overlaySpec ? gc.overlaySpec.metrics : null;
  if (metrics && metrics.length > 1 && onMetric) {
    const sel = wbEl("select", { class: "wb-overlay-metric", title: "what the colours show" },
      ...metrics.map((x) => { const o = wbEl("option", { value: x.key }, x.title); if (x.key === ov.key) o.selected = true; return o; }));
    sel.addEventListener("change", () => onMetric(sel.value));
    box.appendChild(wbEl("h4", null, "Colour by"));
    box.appendChild(sel);
  } else box.appendChild(wbEl("h4", null, ov.title || "overlay"));
  if (ov.kind === "category") {
    const names = Object.keys(m.colors || {});
    for (const c of names) {
      const n = [...ov.node.values()].filter((v) => v === c).length;
      box.appendChild(wbEl("div", { class: "wb-legend-item wb-overlay-cat", "data-category": c },
        wbEl("span", { class: "wb-swatch", style: `background:${ov.color(c)}` }),
        wbEl("span", null, c), wbEl("span", { class: "wb-muted", style: "margin-left:auto" }, String(n))));
    }
  } else {
    const stops = [0, 0.33, 0.66, 1].map((t) => wbScale(m.reverse ? 1 - t : t)).join(", ");
    const lo = m.format === "pct" ? 0 : m.scale === "log" && ov.minPos > 0 ? ov.minPos : Math.min(ov.lo, 0);
    const hi = m.format === "pct" ? 100 : ov.hi;
    box.appendChild(wbEl("div", { class: "wb-overlay-scale", style: `height:10px;border-radius:3px;background:linear-gradient(to right, ${stops})` }));
    box.appendChild(wbEl("div", { style: "display:flex;justify-content:space-between", class: "wb-muted" },
      wbEl("span", { class: "wb-overlay-lo" }, ov.text(lo)), wbEl("span", { class: "wb-overlay-hi" }, `${ov.text(hi)} per node`)));
    if (m.scale === "log" && m.format !== "pct") box.appendChild(wbEl("div", { class: "wb-muted" }, "logarithmic scale"));
  }
  if (ov.group.size > 1) {
    box.appendChild(wbEl("div", { class: "wb-muted wb-overlay-grouprule" },
      `collapsed groups: ${m.group_rule || "the sum of their nodes"}, shown on their top edge`));
  }
  if (m.note) box.appendChild(wbEl("div", { class: "wb-muted" }, m.note));
  box.appendChild(wbEl("div", { class: "wb-muted" }, "grey: no number for that node"));
  if (gc.flagged && gc.flagged.size) box.appendChild(wbEl("div", { class: "wb-muted" }, `${gc.flagged.size} node${gc.flagged.size === 1 ? "" : "s"} ringed: outputs differ from the reference`));
  return box;
}

// the analysis' summary panel: [label, text] rows, as text
function wbOverlaySummary(spec) {
  const rows = spec && Array.isArray(spec.summary) ? spec.summary : [];
  if (!rows.length) return null;
  return wbEl("div", { class: "wb-overlay-summary" }, wbEl("h4", null, "Summary"),
    wbEl("table", { class: "wb-kv" }, ...rows.map((r) => wbEl("tr", null,
      wbEl("td", null, String(r[0])), wbEl("td", null, String(r[1]))))));
}

// every analysis metric of node i (or of group g) for the details panel
function wbOverlayFacts(gc, i, g) {
  const list = gc.overlayMetrics();
  if (!list.length) return null;
  const rows = [];
  for (const ov of list) {
    const v = i >= 0 ? ov.node.get(i) : ov.group.get(g);
    if (v === undefined) continue;
    rows.push(wbEl("tr", { "data-metric": ov.key }, wbEl("td", null, ov.title), wbEl("td", null, ov.text(v))));
  }
  if (!rows.length) return null;
  return wbEl("div", { class: "wb-overlay-facts" },
    wbEl("h4", null, i >= 0 ? "Analysis" : "Analysis (group total)"), wbEl("table", { class: "wb-kv" }, ...rows));
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
