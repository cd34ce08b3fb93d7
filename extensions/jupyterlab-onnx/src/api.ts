// Talks to the server extension (workbench/labext.py): GET /workbench/api/graph?path=...
import { URLExt } from '@jupyterlab/coreutils';
import { ServerConnection } from '@jupyterlab/services';

export const API_PATH = 'workbench/api/graph';

export interface IValueSummary {
  name: string;
  dtype: string;
  shape: string;
}

export interface IModelSummary {
  file: string;
  path: string;
  producer: string;
  ir_version: number;
  model_version: number;
  graph_name: string;
  doc: string;
  opsets: { domain: string; version: number }[];
  inputs: IValueSummary[];
  outputs: IValueSummary[];
  nodes: number;
  nodes_total: number;
  op_types: number;
  parameters: number;
  initializers: number;
  /** tensors described but not read (the server reads the structure only) */
  not_read?: { tensors: number; bytes: number };
  /** the model's metadata_props (values cut at 300 characters, at most 20) */
  metadata?: { key: string; value: string }[];
  missing: { op: string; count: number }[];
  checker: string | null;
  warnings: string[];
}

/** The layout and colours from workbench.widgets.graph_data.graph_payload (column lists). */
export interface IGraphData {
  name: string[];
  op: string[];
  kind: number[];
  [key: string]: unknown;
}

export interface IGraphResponse {
  summary: IModelSummary;
  graph: IGraphData;
  details: { [name: string]: unknown };
  /** the static analysis as a graph overlay (workbench/analysis/overlay.py); {} when none */
  overlay?: { [key: string]: unknown };
  timing: { [step: string]: number };
}

/** The answer of the Measure button (?measure=1): the measured analysis overlay. */
export interface IMeasureResponse {
  overlay: { [key: string]: unknown };
}

/** A failed request, with what the panel should say. */
export class GraphLoadError extends Error {
  constructor(
    readonly title: string,
    message: string,
    readonly status: number,
    readonly hint: string = ''
  ) {
    super(message);
  }
}

const SERVER_EXTENSION_HINT =
  'The ONNX Workbench server extension is not enabled in this Jupyter server. A pip install ' +
  'of onnx-workbench enables it (etc/jupyter/jupyter_server_config.d/onnx_workbench.json); ' +
  'for an editable install of a checkout run scripts/setup-test-env.sh, or start JupyterLab ' +
  'with `jupyter lab --ServerApp.jpserver_extensions=workbench=True`. If it was disabled: ' +
  '`jupyter server extension enable workbench`. Then restart JupyterLab.';

/** Fetch the summary, layout and node details of the model at contents path `path`. */
export async function fetchGraph(
  path: string,
  settings: ServerConnection.ISettings = ServerConnection.makeSettings()
): Promise<IGraphResponse> {
  const body = await requestGraph(path, {}, settings);
  if (!body.graph || !body.summary) {
    throw new GraphLoadError(
      'Unexpected answer from the server',
      `GET ${API_PATH} did not return the ONNX Workbench graph JSON.`,
      200,
      SERVER_EXTENSION_HINT
    );
  }
  return body as IGraphResponse;
}

/** Run the model at `path` on the server (in a budgeted worker) and fetch the measured
 * analysis overlay: per-node times (ours, onnxruntime), memory, roofline. */
export async function fetchMeasured(
  path: string,
  settings: ServerConnection.ISettings = ServerConnection.makeSettings()
): Promise<IMeasureResponse> {
  const body = await requestGraph(path, { measure: '1' }, settings);
  if (!body.overlay) {
    throw new GraphLoadError(
      'Unexpected answer from the server',
      `GET ${API_PATH}?measure=1 did not return a measured overlay.`,
      200
    );
  }
  return body as IMeasureResponse;
}

async function requestGraph(
  path: string,
  extra: { [key: string]: string },
  settings: ServerConnection.ISettings
): Promise<any> {
  const url =
    URLExt.join(settings.baseUrl, API_PATH) +
    URLExt.objectToQueryString({ path, ...extra });
  let response: Response;
  try {
    response = await ServerConnection.makeRequest(url, { method: 'GET' }, settings);
  } catch (err) {
    throw new GraphLoadError(
      'The Jupyter server cannot be reached',
      String((err as Error).message || err),
      0
    );
  }
  const text = await response.text();
  let body: any = null;
  try {
    body = text ? JSON.parse(text) : null;
  } catch {
    body = null;
  }
  const ours = body && body.source === 'onnx-workbench';
  if (!response.ok) {
    if (ours && body.error) {
      throw new GraphLoadError(body.title || 'Cannot show this model', body.error, response.status);
    }
    if (response.status === 404 || response.status === 405) {
      throw new GraphLoadError(
        'The ONNX Workbench server extension is not available',
        `GET ${API_PATH} returned ${response.status} ${response.statusText}.`,
        response.status,
        SERVER_EXTENSION_HINT
      );
    }
    const msg = (body && (body.message || body.reason)) || response.statusText;
    throw new GraphLoadError(
      `The server answered ${response.status}`,
      String(msg || text.slice(0, 300)),
      response.status
    );
  }
  if (!ours) {
    throw new GraphLoadError(
      'Unexpected answer from the server',
      `GET ${API_PATH} did not return the ONNX Workbench graph JSON.`,
      response.status,
      SERVER_EXTENSION_HINT
    );
  }
  return body;
}

export const EDIT_PATH = 'workbench/api/edit';

/** An answer of the edit endpoint (workbench/labext_edit.py): `ok`, and what changed. */
export interface IEditAnswer {
  ok: boolean;
  error?: string;
  session?: string;
  graph?: IGraphData;
  details?: { [name: string]: unknown };
  state?: { [key: string]: unknown };
  ended?: boolean;
  exists?: boolean;
  [key: string]: unknown;
}

/**
 * POST one request to the edit endpoint. Never throws: a refused edit, a server error or a
 * lost connection all come back as `{ok: false, error}` for the viewer to show where the
 * user acted.
 */
export async function postEdit(
  body: { [key: string]: unknown },
  settings: ServerConnection.ISettings = ServerConnection.makeSettings()
): Promise<IEditAnswer> {
  const url = URLExt.join(settings.baseUrl, EDIT_PATH);
  let response: Response;
  try {
    response = await ServerConnection.makeRequest(
      url,
      { method: 'POST', body: JSON.stringify(body) },
      settings
    );
  } catch (err) {
    return { ok: false, error: `The Jupyter server cannot be reached: ${String((err as Error).message || err)}` };
  }
  const text = await response.text();
  let answer: any = null;
  try {
    answer = text ? JSON.parse(text) : null;
  } catch {
    answer = null;
  }
  if (answer && answer.source === 'onnx-workbench') {
    if (!response.ok && answer.ok !== false) {
      answer.ok = false;
    }
    return answer as IEditAnswer;
  }
  if (response.status === 404 || response.status === 405) {
    return { ok: false, error: `POST ${EDIT_PATH} returned ${response.status}: ${SERVER_EXTENSION_HINT}` };
  }
  const msg = (answer && (answer.message || answer.reason)) || response.statusText || text.slice(0, 300);
  return { ok: false, error: `The server answered ${response.status}: ${msg}` };
}
