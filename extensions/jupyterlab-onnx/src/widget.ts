// The "ONNX Graph" document: a model summary header above the GraphView drawing.
//
// The drawing is the GraphView widget's own front-end (workbench/widgets/static/graph_core.js
// and graph_view.js, with the dagre layout engine's source for its Web Worker, turned into a
// module at build time by scripts/gen-core.mjs). GraphView
// talks to a kernel through an anywidget model; here a small local model stands in for it and
// answers node selections from the details the server sent with the layout.
//
// Everything shown comes from a model file, that is from anyone: it goes into the page only
// as text nodes and attribute values (core.wbEl), never as HTML.
import { DocumentRegistry, DocumentWidget } from '@jupyterlab/docregistry';
import { refreshIcon, runIcon, ToolbarButton } from '@jupyterlab/ui-components';
import { Message } from '@lumino/messaging';
import { Widget } from '@lumino/widgets';

import { fetchGraph, fetchMeasured, GraphLoadError, IGraphResponse, IModelSummary } from './api';
import * as generated from './generated/graph_core.js';

/** The parts of the shared drawing code used here (graph_core.js / graph_view.js). */
interface IGraphCanvas {
  selected: number;
  lay: unknown;
  resize(): void;
  fitInitial(): void;
  draw(): void;
}
interface IGraphViewHandle {
  root: HTMLElement;
  gc: IGraphCanvas;
  ready: Promise<void>;
  destroy(): void;
}
interface ICore {
  WB_CORE_SHA256: string;
  wbInjectStyle(): void;
  wbEl(tag: string, attrs?: { [k: string]: any } | null, ...children: any[]): HTMLElement;
  wbRenderGraphView(model: LocalModel, el: HTMLElement, opts?: { [k: string]: any }): IGraphViewHandle;
}
const core = generated as unknown as ICore;
const el = core.wbEl;

type Handler = () => void;

/** Stands in for the anywidget model that wbRenderGraphView reads and writes. */
export class LocalModel {
  private _handlers = new Map<string, Set<Handler>>();

  constructor(private _attrs: { [key: string]: any }) {}

  get(key: string): any {
    return this._attrs[key];
  }

  set(key: string, value: any): void {
    this._attrs[key] = value;
    for (const fn of [...(this._handlers.get(`change:${key}`) || [])]) {
      fn();
    }
  }

  on(event: string, fn: Handler): void {
    if (!this._handlers.has(event)) {
      this._handlers.set(event, new Set());
    }
    this._handlers.get(event)!.add(fn);
  }

  off(event: string, fn: Handler): void {
    this._handlers.get(event)?.delete(fn);
  }

  save_changes(): void {
    // nothing to sync: there is no kernel behind this view
  }
}

function fmtInt(n: number): string {
  return Number(n || 0).toLocaleString('en-US');
}

function fmtBytes(n: number): string {
  const units: [string, number][] = [['GiB', 2 ** 30], ['MiB', 2 ** 20], ['KiB', 2 ** 10]];
  for (const [u, size] of units) {
    if (n >= size) {
      return `${(n / size).toFixed(1)} ${u}`;
    }
  }
  return `${fmtInt(n)} bytes`;
}

function valueList(title: string, values: { name: string; dtype: string; shape: string }[]) {
  const items = values.length
    ? values.map(v =>
        el('span', { class: 'jp-OnnxGraph-value' },
          el('b', null, v.name), ` ${v.dtype} ${v.shape}`)
      )
    : [el('span', { class: 'wb-muted' }, 'none')];
  return el('div', { class: 'jp-OnnxGraph-row' },
    el('span', { class: 'jp-OnnxGraph-label' }, title), ...items);
}

/** The summary header: producer, IR version, opsets, inputs/outputs, counts, missing ops. */
export function renderSummary(s: IModelSummary): HTMLElement {
  const opsets = s.opsets.map(o => `${o.domain} ${o.version}`).join(', ') || 'none';
  const nodes =
    `${fmtInt(s.nodes)} node${s.nodes === 1 ? '' : 's'}` +
    (s.nodes_total > s.nodes ? ` (+${fmtInt(s.nodes_total - s.nodes)} in subgraphs)` : '');
  const facts = el('div', { class: 'jp-OnnxGraph-row' },
    el('span', { class: 'jp-OnnxGraph-fact jp-OnnxGraph-producer' },
      'producer ', el('b', null, s.producer || 'unknown')),
    el('span', { class: 'jp-OnnxGraph-fact jp-OnnxGraph-ir' },
      'IR version ', el('b', null, String(s.ir_version))),
    el('span', { class: 'jp-OnnxGraph-fact jp-OnnxGraph-opsets' }, 'opsets ', el('b', null, opsets)),
    el('span', { class: 'jp-OnnxGraph-fact jp-OnnxGraph-nodecount' }, el('b', null, nodes)),
    el('span', { class: 'jp-OnnxGraph-fact' }, el('b', null, fmtInt(s.op_types)), ' op types'),
    el('span', { class: 'jp-OnnxGraph-fact jp-OnnxGraph-params' },
      el('b', null, fmtInt(s.parameters)), ` parameters in ${fmtInt(s.initializers)} initializers`),
    s.not_read && s.not_read.tensors
      ? el('span', { class: 'jp-OnnxGraph-fact jp-OnnxGraph-notread',
                     title: `The viewer reads the structure only: ${fmtInt(s.not_read.tensors)} ` +
                       `tensor${s.not_read.tensors === 1 ? ' is' : 's are'} described (type, shape, size), not read` },
          el('b', null, fmtBytes(s.not_read.bytes)), ' of weights not read (structure only)')
      : null
  );
  const head = el('div', { class: 'jp-OnnxGraph-row' },
    el('span', { class: 'jp-OnnxGraph-file' }, s.file),
    s.graph_name ? el('span', { class: 'wb-muted' }, `graph ${s.graph_name}`) : null);
  const support = s.missing.length
    ? el('div', { class: 'jp-OnnxGraph-row jp-OnnxGraph-missing' },
        el('span', { class: 'jp-OnnxGraph-label' }, 'Engine lacks'),
        `The workbench engine cannot run ${s.missing.length} operator type${s.missing.length === 1 ? '' : 's'}: `,
        s.missing.map(m => `${m.op} (×${m.count})`).join(', '))
    : el('div', { class: 'jp-OnnxGraph-row jp-OnnxGraph-supported' },
        'The workbench engine has kernels for every operator in this model.');
  const box = el('div', { class: 'jp-OnnxGraph-header' }, head, facts,
    valueList('Inputs', s.inputs), valueList('Outputs', s.outputs), support);
  for (const w of [...(s.checker ? [`onnx.checker: ${s.checker}`] : []), ...(s.warnings || [])]) {
    box.appendChild(el('div', { class: 'jp-OnnxGraph-row jp-OnnxGraph-warning' }, w));
  }
  if (s.metadata && s.metadata.length) {
    box.appendChild(el('div', { class: 'jp-OnnxGraph-row jp-OnnxGraph-metadata' },
      el('span', { class: 'jp-OnnxGraph-label' }, 'Metadata'),
      ...s.metadata.map(m => el('span', { class: 'jp-OnnxGraph-value' }, el('b', null, m.key), ` ${m.value}`))));
  }
  if (s.doc) {
    box.appendChild(el('div', { class: 'jp-OnnxGraph-row wb-muted jp-OnnxGraph-doc' }, s.doc));
  }
  return box;
}

/** The document's content: loads from the server, draws, shows errors in place. */
export class OnnxGraphPanel extends Widget {
  private _view: IGraphViewHandle | null = null;
  private _model: LocalModel | null = null;
  private _measureLine: HTMLElement | null = null;
  private _request = 0;
  private _fitted = false;

  constructor(private _context: DocumentRegistry.Context) {
    super();
    this.addClass('jp-OnnxGraph');
    this.node.dataset.status = 'idle';
    core.wbInjectStyle();
  }

  /** The contents path (without a drive prefix) of the file shown. */
  get path(): string {
    return this._context.localPath;
  }

  /** (Re-)read the file through the server extension and draw it. */
  async load(): Promise<void> {
    const request = ++this._request;
    const path = this.path;
    this.node.dataset.path = path;
    this.node.dataset.status = 'loading';
    if (!this._view) {
      this._show(el('div', { class: 'jp-OnnxGraph-loading' }, `Loading ${path}…`));
    } else {
      this.node.classList.add('jp-OnnxGraph-reloading');
    }
    let result: IGraphResponse;
    try {
      result = await fetchGraph(path);
    } catch (err) {
      if (request === this._request && !this.isDisposed) {
        this._showError(err);
      }
      return;
    }
    if (request !== this._request || this.isDisposed) {
      return;
    }
    this._render(result);
  }

  /** Run the model on the server (the Measure button) and colour the drawing by the measured
   * times; the static overlay stays until the answer arrives. */
  async measure(): Promise<void> {
    const model = this._model, line = this._measureLine;
    if (!model || !line) {
      return;
    }
    const request = this._request;
    this.node.dataset.measure = 'running';
    line.textContent = 'Measuring: running the model on the server (symbolic dims = 1)…';
    try {
      const result = await fetchMeasured(this.path);
      if (request !== this._request || this._model !== model || this.isDisposed) {
        return;
      }
      model.set('overlay_metric', '');
      model.set('overlay', result.overlay);
      line.textContent = 'Measured on the server: choose what the colours show in the side panel.';
      this.node.dataset.measure = 'done';
    } catch (err) {
      if (request !== this._request || this.isDisposed) {
        return;
      }
      const e = err as GraphLoadError;
      line.textContent = `Measuring failed: ${e.title ? e.title + ': ' : ''}${e.message || String(err)}`;
      this.node.dataset.measure = 'error';
    }
  }

  private _clear(): void {
    this._view?.destroy();
    this._view = null;
    this._model = null;
    this._measureLine = null;
    this._fitted = false;
    this.node.classList.remove('jp-OnnxGraph-reloading');
    this.node.textContent = '';
  }

  private _show(...children: HTMLElement[]): void {
    this._clear();
    for (const c of children) {
      this.node.appendChild(c);
    }
  }

  private _showError(err: unknown): void {
    const e =
      err instanceof GraphLoadError
        ? err
        : new GraphLoadError('Cannot show this model', String((err as Error)?.message || err), 0);
    this._show(
      el('div', { class: 'jp-OnnxGraph-error', 'data-status-code': String(e.status) },
        el('div', { class: 'jp-OnnxGraph-error-title' }, `${e.title}: ${this.path}`),
        el('pre', { class: 'jp-OnnxGraph-error-message' }, e.message),
        e.hint ? el('div', { class: 'jp-OnnxGraph-error-hint' }, e.hint) : null,
        el('div', { class: 'wb-muted' },
          e.status >= 400 && e.status < 500 && !e.hint
            ? 'Fix the file and press Reload in the toolbar.'
            : 'Press Reload in the toolbar to try again.'))
    );
    this.node.dataset.status = 'error';
  }

  private _render(result: IGraphResponse): void {
    const header = renderSummary(result.summary);
    const measureLine = el('div', { class: 'jp-OnnxGraph-row wb-muted jp-OnnxGraph-measure' },
      'Colours: the static analysis (side panel). Measure runs the model for times and memory.');
    header.appendChild(measureLine);
    const host = el('div', { class: 'jp-OnnxGraph-graph' });
    this._show(header, host);
    this._measureLine = measureLine;
    const details = result.details;
    const model = new LocalModel({
      graph_data: result.graph,
      title: result.summary.file,
      height: 400,
      selected: '',
      details: {},
      highlight: [],
      dimmed: [],
      marked: [],
      overlay: result.overlay || {},
      overlay_metric: '',
      render_ms: -1
    });
    this._model = model;
    // registered before the view's own listeners: details are in place when it redraws
    model.on('change:selected', () => {
      const name = model.get('selected');
      model.set('details', (name && details[name]) || {});
    });
    const view = core.wbRenderGraphView(model, host, { reportTiming: false });
    view.root.style.height = '';
    view.root.classList.add('jp-OnnxGraph-view');
    view.root.dataset.coreSha256 = core.WB_CORE_SHA256;
    this._view = view;
    this.node.dataset.status = 'ready';
    this.node.dataset.nodes = String(result.summary.nodes);
    // the first level is laid out in a worker: fit once it is there
    void view.ready.then(() => {
      if (this._view === view) {
        this._refit();
      }
    });
  }

  /** Fit once the panel has a real size (it may be hidden or unattached when data arrives). */
  private _refit(): void {
    const view = this._view;
    if (!view || !this.isVisible) {
      return;
    }
    const gc = view.gc;
    gc.resize();
    if (!this._fitted && gc.lay) {
      const r = view.root.getBoundingClientRect();
      if (r.width < 60 || r.height < 60) {
        return;
      }
      gc.fitInitial();
      this._fitted = true;
    }
    gc.draw();
  }

  protected onAfterShow(msg: Message): void {
    super.onAfterShow(msg);
    requestAnimationFrame(() => this._refit());
  }

  protected onAfterAttach(msg: Message): void {
    super.onAfterAttach(msg);
    requestAnimationFrame(() => this._refit());
  }

  protected onResize(msg: Widget.ResizeMessage): void {
    super.onResize(msg);
    if (!this._fitted) {
      requestAnimationFrame(() => this._refit());
    }
  }

  dispose(): void {
    if (this.isDisposed) {
      return;
    }
    this._request++;
    this._view?.destroy();
    this._view = null;
    super.dispose();
  }
}

/** The document widget: the panel plus a toolbar with Reload. */
export class OnnxGraphDocument extends DocumentWidget<OnnxGraphPanel> {
  constructor(context: DocumentRegistry.Context) {
    const content = new OnnxGraphPanel(context);
    super({ context, content });
    this.addClass('jp-OnnxGraphDocument');
    this.toolbar.addItem(
      'reload',
      new ToolbarButton({
        icon: refreshIcon,
        label: 'Reload',
        tooltip: 'Re-read the model file from disk',
        className: 'jp-OnnxGraph-reload',
        onClick: () => void content.load()
      })
    );
    this.toolbar.addItem(
      'measure',
      new ToolbarButton({
        icon: runIcon,
        label: 'Measure',
        tooltip:
          'Run the model on the server (symbolic dims = 1): per-node times (ours, onnxruntime), ' +
          'memory over the schedule, % of roof',
        className: 'jp-OnnxGraph-measure-button',
        onClick: () => void content.measure()
      })
    );
    // the server reads the file itself: no need to wait for the document context
    void content.load();
    context.pathChanged.connect(() => void content.load(), this);
  }
}
