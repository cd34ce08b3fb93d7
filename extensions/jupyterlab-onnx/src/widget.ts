// The "ONNX Graph" document: a model summary header above the GraphView drawing.
//
// The drawing is the GraphView widget's own front-end (workbench/widgets/static/graph_core.js
// and graph_view.js, with the dagre layout engine's source for its Web Worker, turned into a
// module at build time by scripts/gen-core.mjs). GraphView
// talks to a kernel through an anywidget model; here a small local model stands in for it and
// answers node selections from the details the server sent with the layout.
//
// Edit mode (the toolbar's Edit button): an edit session on the server (POST
// /workbench/api/edit, workbench/labext_edit.py: the model in a worker process of its own)
// and the edit front-end shared with the notebook's ModelEditor (graph_edit.js: menus on
// nodes and values, undo/redo, script, compare, Save that asks before replacing the file).
//
// Everything shown comes from a model file, that is from anyone: it goes into the page only
// as text nodes and attribute values (core.wbEl), never as HTML.
import { Dialog, showDialog } from '@jupyterlab/apputils';
import { DocumentRegistry, DocumentWidget } from '@jupyterlab/docregistry';
import { checkIcon, editIcon, refreshIcon, runIcon, ToolbarButton } from '@jupyterlab/ui-components';
import { Message } from '@lumino/messaging';
import { Widget } from '@lumino/widgets';

import {
  fetchGraph,
  fetchMeasured,
  GraphLoadError,
  IEditAnswer,
  IGraphResponse,
  IModelSummary,
  postEdit
} from './api';
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
interface IEditHandle {
  root: HTMLElement;
  /** Resolves once the first version of the edited model is drawn. */
  ready: Promise<void>;
  readonly view: IGraphViewHandle | null;
  destroy(): void;
}
interface IEditApi {
  call(request: { [key: string]: unknown }): Promise<IEditAnswer>;
}
interface ICore {
  WB_CORE_SHA256: string;
  wbInjectStyle(): void;
  wbEl(tag: string, attrs?: { [k: string]: any } | null, ...children: any[]): HTMLElement;
  wbRenderGraphView(model: LocalModel, el: HTMLElement, opts?: { [k: string]: any }): IGraphViewHandle;
  wbEditUI(
    model: LocalModel,
    el: HTMLElement,
    opts: {
      api: IEditApi;
      confirm?: (text: string, path: string) => Promise<boolean>;
      onView?: (view: IGraphViewHandle) => void;
      reportTiming?: boolean;
    }
  ): IEditHandle;
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
  private _edit: { session: string; ui: IEditHandle; model: LocalModel } | null = null;
  private _opening = false;
  /** Called when edit mode starts or ends (the document's toolbar follows it). */
  onEditingChanged: ((editing: boolean) => void) | null = null;
  /** Called with the contents path of each file an edit session saved. */
  onSaved: ((path: string) => void) | null = null;

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

  /** Whether an edit session is open. */
  get editing(): boolean {
    return this._edit !== null;
  }

  /** (Re-)read the file through the server extension and draw it (leaving edit mode,
   * after asking when there are unsaved edits). */
  async load(): Promise<void> {
    if (this._edit) {
      await this.stopEditing();
      return;
    }
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
    this._endEdit();
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

  /** Open an edit session on the file (its model, weights included, in a worker process
   * on the server) and switch the panel to edit mode. */
  async startEditing(): Promise<void> {
    if (this._edit || this._opening) {
      return;
    }
    this._opening = true;
    this.node.dataset.status = 'opening-editor';
    this.node.querySelector('.jp-OnnxGraph-editmsg')?.remove();
    const note = el('div', { class: 'jp-OnnxGraph-editmsg wb-msg' },
      `Opening ${this.path} for editing (the model is loaded with its weights and checked)…`);
    this.node.insertBefore(note, this.node.firstChild);
    let answer: IEditAnswer;
    try {
      answer = await postEdit({ op: 'open', path: this.path });
    } finally {
      this._opening = false;
    }
    if (this.isDisposed) {
      if (answer.session) {
        void postEdit({ session: answer.session, op: 'close' });
      }
      return;
    }
    if (!answer.ok || !answer.session || !answer.graph) {
      note.className = 'jp-OnnxGraph-editmsg wb-err';
      note.textContent = `Cannot edit ${this.path}: ${answer.error || 'no answer from the server'}`;
      this.node.dataset.status = 'ready';
      return;
    }
    this._renderEdit(answer);
  }

  /** Leave edit mode (asking first when there are unsaved edits) and show the file. */
  async stopEditing(): Promise<boolean> {
    const edit = this._edit;
    if (!edit) {
      return true;
    }
    const st = edit.model.get('edit_state') || {};
    if (st.unsaved) {
      const res = await showDialog({
        title: 'Discard the unsaved edits?',
        body: `${this.path} has ${(st.steps || []).length} edit(s) that are not saved. ` +
          'Leaving edit mode discards them (Save first to keep them).',
        buttons: [Dialog.cancelButton({ label: 'Keep editing' }), Dialog.warnButton({ label: 'Discard' })]
      });
      if (!res.button.accept || this._edit !== edit) {
        return false;
      }
    }
    this._endEdit();
    await this.load();
    return true;
  }

  private _endEdit(): void {
    const edit = this._edit;
    if (!edit) {
      return;
    }
    this._edit = null;
    void postEdit({ session: edit.session, op: 'close' });
    edit.ui.destroy();
    this.onEditingChanged?.(false);
  }

  private _renderEdit(answer: IEditAnswer): void {
    const session = answer.session as string;
    let details: { [name: string]: unknown } = answer.details || {};
    this._clear();
    const model = new LocalModel({
      graph_data: answer.graph,
      title: this.path.split('/').pop() || this.path,
      height: 400,
      selected: '',
      details: {},
      highlight: [],
      dimmed: [],
      marked: [],
      overlay: {},
      render_ms: -1,
      edit_state: answer.state || {}
    });
    model.on('change:selected', () => {
      const name = model.get('selected');
      model.set('details', (name && details[name]) || {});
    });
    const api: IEditApi = {
      call: async request => {
        const r = await postEdit({ ...request, session });
        if (r.graph) {
          details = r.details || {};
          model.set('edit_state', r.state || {});
          model.set('graph_data', r.graph);
        } else if (r.state) {
          model.set('edit_state', r.state);
        }
        if (request.op === 'save' && r.ok && typeof r.saved === 'string') {
          this.onSaved?.(r.saved);
        }
        return r;
      }
    };
    const confirm = async (text: string, path: string): Promise<boolean> => {
      const res = await showDialog({
        title: 'Replace the file?',
        body: text.includes(path) ? text : `${text} (${path})`,
        buttons: [Dialog.cancelButton(), Dialog.warnButton({ label: 'Replace' })]
      });
      return res.button.accept;
    };
    const banner = el('div', { class: 'jp-OnnxGraph-editbanner' },
      'Editing ', el('b', null, this.path),
      ' — every edit is checked; the file changes only when you Save. Leave edit mode with Done.');
    const host = el('div', { class: 'jp-OnnxGraph-graph jp-OnnxGraph-edithost' });
    this.node.appendChild(banner);
    this.node.appendChild(host);
    const ui = core.wbEditUI(model, host, {
      api,
      confirm,
      reportTiming: false,
      onView: view => {
        view.root.style.height = '';
        view.root.classList.add('jp-OnnxGraph-view');
        view.root.dataset.coreSha256 = core.WB_CORE_SHA256;
      }
    });
    const edit = { session, ui, model };
    this._edit = edit;
    this.onEditingChanged?.(true);
    // 'editing' once the first frame is drawn (tests and users wait on it), not before
    void ui.ready.then(() => {
      if (this._edit === edit) {
        this.node.dataset.status = 'editing';
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
    this._endEdit();
    this._view?.destroy();
    this._view = null;
    super.dispose();
  }
}

/** The document widget: the panel plus a toolbar with Reload. */
export class OnnxGraphDocument extends DocumentWidget<OnnxGraphPanel> {
  constructor(context: DocumentRegistry.Context, onSaved?: (path: string) => void) {
    const content = new OnnxGraphPanel(context);
    super({ context, content });
    content.onSaved = onSaved || null;
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
    const measure = new ToolbarButton({
      icon: runIcon,
      label: 'Measure',
      tooltip:
        'Run the model on the server (symbolic dims = 1): per-node times (ours, onnxruntime), ' +
        'memory over the schedule, % of roof',
      className: 'jp-OnnxGraph-measure-button',
      onClick: () => void content.measure()
    });
    this.toolbar.addItem('measure', measure);
    const edit = new ToolbarButton({
      icon: editIcon,
      label: 'Edit',
      tooltip: 'Edit the model: right-click nodes and edges for actions; every edit is checked',
      className: 'jp-OnnxGraph-edit',
      onClick: () => void content.startEditing()
    });
    const done = new ToolbarButton({
      icon: checkIcon,
      label: 'Done',
      tooltip: 'Leave edit mode (asks first when there are unsaved edits)',
      className: 'jp-OnnxGraph-done',
      onClick: () => void content.stopEditing()
    });
    done.hide();
    this.toolbar.addItem('edit', edit);
    this.toolbar.addItem('done', done);
    content.onEditingChanged = editing => {
      edit.setHidden(editing);
      done.setHidden(!editing);
      measure.setHidden(editing);
    };
    // the server reads the file itself: no need to wait for the document context
    void content.load();
    context.pathChanged.connect(() => void content.load(), this);
  }
}
