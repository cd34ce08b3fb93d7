"""The JupyterLab extension's server side: a jupyter_server extension with two handlers (the
viewer's ``GET .../graph`` below, and the edit sessions' ``POST .../edit``:
:mod:`workbench.labext_edit`).

``GET {base_url}workbench/api/graph?path=<contents path>`` reads the model's structure with
:func:`workbench.graph.load.load` (``weights=False``: weights and external data are described,
never read), prepares the drawing with :func:`workbench.widgets.graph_data.graph_payload`
(folding, groups, shapes; the browser lays it out) and answers JSON::

    {"source": "onnx-workbench", "path": ..., "summary": {...},   # producer, IR, opsets, I/O,
     "graph": {...},          # what the drawing shows (graph_data.graph_payload)
     "details": {name: {...}},                                    # what GraphView shows on click
     "overlay": {...},        # the static analysis (workbench.analysis.overlay), dims = 1
     "timing": {"load_s": ..., "graph_s": ..., "details_s": ...}}

``...&measure=1`` (the viewer's Measure button) runs the model in a worker, within the same
budgets, and answers ``{"source", "path", "overlay"}``: our per-node times, onnxruntime's,
the memory over the schedule and the roofline (``labext_worker.measure_response``).

The work runs in worker processes with a time and a memory budget and a small concurrency
limit (:mod:`workbench.labext_worker`), never in the server process: a hostile file cannot
starve other requests or the rest of JupyterLab. The path is relative to the server's
root_dir (as in the contents API) and refused when it escapes it. Errors answer a 4xx (503
when the viewer is busy) with ``{"source": "onnx-workbench", "error": message, "title": ...,
"path": ...}``; the message names the file relative to the server's root and what is wrong.

The front-end lives in ``extensions/jupyterlab-onnx`` and is shipped prebuilt in
``workbench/labextension``. Enabled by ``jupyter-config/jupyter_server_config.d/
onnx_workbench.json`` (installed with the package) or ``jupyter server extension enable
workbench``.
"""

from __future__ import annotations

import atexit
import json
import os

import tornado.web
from jupyter_server.auth.decorator import authorized
from jupyter_server.base.handlers import APIHandler
from jupyter_server.utils import url_path_join

from workbench.labext_worker import (  # noqa: F401 - re-exported: the handler's vocabulary
    SOURCE,
    GraphRequestError,
    ViewerPool,
    error_body,
    graph_response,
    model_summary,
    resolve_path,
    scrub,
)

API_PATH = "workbench/api/graph"
EDIT_PATH = "workbench/api/edit"
POOL_SETTING = "workbench_viewer_pool"
EDIT_SETTING = "workbench_edit_pool"


def _model_file(handler, path: str) -> tuple[str, str]:
    """(the file, the server's root) for contents path ``path``; raises GraphRequestError
    for a path outside the root, a hidden file the contents manager hides, a missing file
    or a folder."""
    cm = handler.contents_manager
    root = getattr(cm, "root_dir", None) or handler.settings.get("server_root_dir") or "."
    full = resolve_path(root, path)
    if not getattr(cm, "allow_hidden", True):
        from jupyter_core.paths import is_hidden
        if is_hidden(full, os.path.realpath(root)):
            raise GraphRequestError(404, "File not found",
                                    f"{path}: hidden files are not served "
                                    f"(ContentsManager.allow_hidden is False)")
    if not os.path.exists(full):
        raise GraphRequestError(404, "File not found", f"{path}: file not found")
    if os.path.isdir(full):
        raise GraphRequestError(400, "Not a model file",
                                f"{path}: is a folder, not an .onnx file")
    return full, root


class GraphHandler(APIHandler):
    """``GET /workbench/api/graph?path=...``: summary, drawing data and node details as JSON."""

    auth_resource = "contents"       # reading a model is reading a file

    def _send(self, status: int, body: bytes) -> None:
        self.set_status(status)
        self.set_header("Content-Type", "application/json")
        self.finish(body)

    @tornado.web.authenticated
    @authorized
    async def get(self) -> None:
        path = self.get_query_argument("path", "")
        # measure=1: the viewer's Measure button (the model run in a worker: times, memory)
        measure = self.get_query_argument("measure", "") in ("1", "true")
        if not path.strip("/"):
            self._send(400, error_body(
                400, "No file given", "the 'path' query argument is required: the model's "
                "path relative to the server's root folder", path))
            return
        try:
            full, root = _model_file(self, path)
        except GraphRequestError as e:
            self._send(e.status, error_body(e.status, e.title, str(e), path))
            return
        pool = self.settings.get(POOL_SETTING)
        if pool is None:                   # the handler mounted without the extension's loader
            pool = self.settings[POOL_SETTING] = ViewerPool()
        try:
            status, body = await pool.answer(full, path, root, measure=measure)
        except Exception as e:      # a bug on our side: say so, and keep the traceback in the log
            self.log.exception("workbench: showing %s failed", path)
            msg = scrub(f"{path}: the workbench failed to lay out this model "
                        f"({type(e).__name__}: {e})", root, full, path)
            self._send(500, error_body(500, "Internal error", msg, path))
            return
        self._send(status, body)


class EditHandler(APIHandler):
    """``POST /workbench/api/edit``: the viewer's edit sessions (:mod:`workbench.labext_edit`:
    one worker process per session, budgets, the session's log kept here)."""

    auth_resource = "contents"       # an edit session reads a model and may save over one

    def _send(self, status: int, body: bytes) -> None:
        self.set_status(status)
        self.set_header("Content-Type", "application/json")
        self.finish(body)

    @tornado.web.authenticated
    @authorized
    async def post(self) -> None:
        from workbench.labext_edit import MAX_BODY, EditPool, error
        if len(self.request.body or b"") > MAX_BODY:
            self._send(*error(413, f"the edit request is too big ({len(self.request.body):,} "
                                   f"bytes; at most {MAX_BODY:,})"))
            return
        try:
            req = json.loads(self.request.body or b"{}")
        except ValueError as e:
            self._send(*error(400, f"the edit request is not JSON ({e})"))
            return
        if not isinstance(req, dict):
            self._send(*error(400, "the edit request is a JSON object"))
            return
        pool = self.settings.get(EDIT_SETTING)
        if pool is None:                   # the handler mounted without the extension's loader
            pool = self.settings[EDIT_SETTING] = EditPool()
        try:
            if req.get("op") == "open":
                path = req.get("path")
                if not isinstance(path, str) or not path.strip("/"):
                    self._send(*error(400, "'open' needs the model's path relative to the "
                                           "server's root folder"))
                    return
                try:
                    full, root = _model_file(self, path)
                except GraphRequestError as e:
                    self._send(*error(e.status, str(e), title=e.title))
                    return
                allow_hidden = bool(getattr(self.contents_manager, "allow_hidden", True))
                status, body = await pool.open(full, path, root, allow_hidden)
            else:
                status, body = await pool.request(req.get("session"),
                                                  {k: v for k, v in req.items()
                                                   if k != "session"})
        except Exception as e:      # a bug on our side: say so, and keep the traceback in the log
            self.log.exception("workbench: an edit request failed")
            self._send(*error(500, f"the model editor failed ({type(e).__name__}: {e})"))
            return
        self._send(status, body)


def _load_jupyter_server_extension(serverapp) -> None:
    from workbench.labext_edit import EditPool
    web_app = serverapp.web_app
    route = url_path_join(web_app.settings["base_url"], API_PATH)
    edit_route = url_path_join(web_app.settings["base_url"], EDIT_PATH)
    pool = ViewerPool()
    edits = EditPool()
    web_app.settings[POOL_SETTING] = pool
    web_app.settings[EDIT_SETTING] = edits
    atexit.register(pool.close)
    atexit.register(edits.close)
    web_app.add_handlers(".*$", [(route, GraphHandler), (edit_route, EditHandler)])
    serverapp.log.info("ONNX Workbench server extension: GET %s (models read in up to %d "
                       "worker processes, %g s and %d MiB each)", route, pool.workers,
                       pool.timeout, pool.memory // 2**20)
    serverapp.log.info("ONNX Workbench server extension: POST %s (edit sessions in up to %d "
                       "worker processes, %g s per request and %d MiB each)", edit_route,
                       edits.workers, edits.timeout, edits.memory // 2**20)


# the older name, for jupyter_server < 2 and notebook-style loaders
load_jupyter_server_extension = _load_jupyter_server_extension
