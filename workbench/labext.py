"""The JupyterLab extension's server side: a jupyter_server extension with one handler.

``GET {base_url}workbench/api/graph?path=<contents path>`` loads the model with
:func:`workbench.graph.load.load`, prepares the drawing with
:func:`workbench.widgets.graph_data.graph_payload` (folding, groups, shapes; the browser lays
it out) and answers JSON::

    {"source": "onnx-workbench", "path": ..., "summary": {...},   # producer, IR, opsets, I/O,
     "graph": {...},          # what the drawing shows (graph_data.graph_payload)
     "details": {name: {...}},                                    # what GraphView shows on click
     "timing": {"load_s": ..., "graph_s": ..., "details_s": ...}}

The path is relative to the server's root_dir (as in the contents API) and refused when it
escapes it. Errors answer a 4xx status with ``{"source": "onnx-workbench", "error": message,
"title": ..., "path": ...}``; the message names the file and what is wrong.

The front-end lives in ``extensions/jupyterlab-onnx`` and is shipped prebuilt in
``workbench/labextension``. Enabled by ``jupyter-config/jupyter_server_config.d/
onnx_workbench.json`` (installed with the package) or ``jupyter server extension enable
workbench``.
"""

from __future__ import annotations

import asyncio
import io
import json
import os
import threading
import time
import warnings

import tornado.web
from jupyter_server.auth.decorator import authorized
from jupyter_server.base.handlers import APIHandler
from jupyter_server.utils import url_path_join

API_PATH = "workbench/api/graph"
SOURCE = "onnx-workbench"
# warnings.catch_warnings is process-wide: loads that record warnings take turns
_LOAD_LOCK = threading.Lock()


class GraphRequestError(Exception):
    """A request the handler refuses: HTTP status, a short title and a message for people."""

    def __init__(self, status: int, title: str, message: str):
        super().__init__(message)
        self.status = status
        self.title = title


def resolve_path(root_dir: str, path: str) -> str:
    """The absolute, symlink-free file for contents path ``path`` under ``root_dir``; raises
    :class:`GraphRequestError` (403) when it lies outside ``root_dir``."""
    root = os.path.realpath(root_dir)
    rel = path.replace("\\", "/").strip("/")
    full = os.path.realpath(os.path.join(root, *rel.split("/"))) if rel else root
    try:
        inside = os.path.commonpath([root, full]) == root
    except ValueError:               # another drive (Windows)
        inside = False
    if not inside or os.path.isabs(rel) or (os.path.splitdrive(rel)[0] != ""):
        raise GraphRequestError(403, "Access refused",
                                f"{path}: the path points outside the server's root folder; "
                                f"only files under the Jupyter server's root can be shown")
    return full


def model_summary(loaded, path: str) -> dict:
    """The header of the viewer: the facts ``workbench info`` prints, as JSON."""
    from workbench.cli import _dtype_str, _shape_str, describe

    g, p = loaded.graph, loaded.proto
    facts = describe(loaded, out=io.StringIO())
    missing = sorted(facts["missing"].items())
    return {
        "file": os.path.basename(path),
        "path": path,
        "producer": f"{p.producer_name} {p.producer_version}".strip(),
        "ir_version": int(p.ir_version),
        "model_version": int(p.model_version),
        "graph_name": g.name or "",
        "doc": (p.doc_string or g.doc_string or "").strip()[:500],
        "opsets": [{"domain": d or "ai.onnx", "version": int(v)}
                   for d, v in sorted(g.opsets.items())],
        "inputs": [{"name": v.name, "dtype": _dtype_str(v), "shape": _shape_str(v.shape)}
                   for v in g.inputs],
        "outputs": [{"name": v.name, "dtype": _dtype_str(v), "shape": _shape_str(v.shape)}
                    for v in g.outputs],
        "nodes": len(g.nodes),
        "nodes_total": int(sum(facts["histogram"].values())),
        "op_types": len(facts["histogram"]),
        "parameters": int(facts["parameters"]),
        "initializers": len(g.initializers),
        "missing": [{"op": op, "count": int(c)} for op, c in missing],
        "checker": None,
        "warnings": [],
    }


def graph_response(full: str, path: str) -> dict:
    """Load ``full`` (shown to people as ``path``) and build the JSON answer. Raises
    :class:`GraphRequestError` for files that cannot be shown."""

    from workbench.errors import ModelLoadError, WorkbenchError
    from workbench.graph.load import check_and_infer, load
    from workbench.widgets.graph_data import all_node_details, graph_payload

    def fail(status, title, msg):
        return GraphRequestError(status, title, msg.replace(full, path))

    if not os.path.exists(full):
        raise fail(404, "File not found", f"{path}: file not found")
    if os.path.isdir(full):
        raise fail(400, "Not a model file", f"{path}: is a folder, not an .onnx file")
    t0 = time.perf_counter()
    try:
        with _LOAD_LOCK, warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            loaded = load(full, check=False)
    except ModelLoadError as e:
        raise fail(422, "Cannot read this model", str(e)) from None
    except WorkbenchError as e:
        raise fail(422, "Cannot read this model", f"{path}: {e}") from None
    except OSError as e:
        raise fail(400, "Cannot read this file", f"{path}: {e.strerror or e}") from None
    t1 = time.perf_counter()
    summary = model_summary(loaded, path)
    summary["warnings"] = [str(w.message).replace(full, path) for w in caught][:10]
    try:    # in the helper process: onnx's C++ checker must not crash the server
        check_and_infer(loaded.proto, check=True, infer=False, path=full)
    except WorkbenchError as e:      # shown, not fatal: the viewer draws what it can
        lines = str(e).replace("the model fails onnx.checker: ", "").strip().splitlines()
        summary["checker"] = " | ".join(lines[:4]).replace(full, path) or type(e).__name__
    t2 = time.perf_counter()
    graph = graph_payload(loaded.graph)
    t3 = time.perf_counter()
    details = all_node_details(loaded.graph)
    t4 = time.perf_counter()
    return {"source": SOURCE, "path": path, "summary": summary, "graph": graph,
            "details": details,
            "timing": {"load_s": round(t1 - t0, 4), "summary_s": round(t2 - t1, 4),
                       "graph_s": round(t3 - t2, 4), "details_s": round(t4 - t3, 4)}}


def _json_default(o):
    if hasattr(o, "item"):          # numpy scalars
        return o.item()
    if hasattr(o, "tolist"):
        return o.tolist()
    return str(o)


class GraphHandler(APIHandler):
    """``GET /workbench/api/graph?path=...``: summary, drawing data and node details as JSON."""

    auth_resource = "contents"       # reading a model is reading a file

    def _error(self, status: int, title: str, message: str, path: str) -> None:
        self.set_status(status)
        self.set_header("Content-Type", "application/json")
        self.finish(json.dumps({"source": SOURCE, "error": message, "message": message,
                                "title": title, "path": path}))

    @tornado.web.authenticated
    @authorized
    async def get(self) -> None:
        path = self.get_query_argument("path", "")
        if not path.strip("/"):
            self._error(400, "No file given", "the 'path' query argument is required: the "
                        "model's path relative to the server's root folder", path)
            return
        cm = self.contents_manager
        root = getattr(cm, "root_dir", None) or self.settings.get("server_root_dir") or "."
        try:
            full = resolve_path(root, path)
            if not getattr(cm, "allow_hidden", True):
                from jupyter_core.paths import is_hidden
                if is_hidden(full, os.path.realpath(root)):
                    raise GraphRequestError(404, "File not found",
                                            f"{path}: hidden files are not served "
                                            f"(ContentsManager.allow_hidden is False)")
            loop = asyncio.get_running_loop()
            data = await loop.run_in_executor(None, graph_response, full, path)
        except GraphRequestError as e:
            self._error(e.status, e.title, str(e), path)
            return
        except Exception as e:      # a bug on our side: say so, and keep the traceback in the log
            self.log.exception("workbench: showing %s failed", path)
            self._error(500, "Internal error",
                        f"{path}: the workbench failed to lay out this model "
                        f"({type(e).__name__}: {e})", path)
            return
        self.set_header("Content-Type", "application/json")
        self.finish(json.dumps(data, default=_json_default, separators=(",", ":")))


def _load_jupyter_server_extension(serverapp) -> None:
    web_app = serverapp.web_app
    route = url_path_join(web_app.settings["base_url"], API_PATH)
    web_app.add_handlers(".*$", [(route, GraphHandler)])
    serverapp.log.info("ONNX Workbench server extension: GET %s", route)


# the older name, for jupyter_server < 2 and notebook-style loaders
load_jupyter_server_extension = _load_jupyter_server_extension
