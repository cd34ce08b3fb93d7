"""Jupyter servers for tests: started on 127.0.0.1 with a free port, a random token and private
config/runtime folders (nothing from the user's own set-up), stopped at the end; plus the
Chromium settings the real-browser tests share (Debian's /usr/bin/chromium, no network)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CHROMIUM = os.environ.get("WORKBENCH_CHROMIUM", "/usr/bin/chromium")
CHROME_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking",
               "--disable-component-update", "--disable-sync", "--no-first-run",
               "--disable-quic"]
LAB_SETTINGS = {   # no news or update checks: the tests never leave 127.0.0.1
    "@jupyterlab/apputils-extension/notification.jupyterlab-settings":
        {"fetchNews": "false", "checkForUpdates": False},
}
#: lab extensions of other packages a test server turns off (``start(..., quiet=True)``): a
#: user-level install of ipyparallel (~/.local/share/jupyter) is loaded by every JupyterLab
#: while its server side is off in a venv, and its "IPP Extension Server Error" dialog would
#: cover the page; no test uses its panel
QUIET_LABEXTENSIONS = ("ipyparallel-labextension",)


#: this working tree's built JupyterLab extension (scripts/build-labextension.sh)
LABEXT = ROOT / "workbench" / "labextension"
EXT_NAME = "@onnx-workbench/jupyterlab-onnx"


def browser_requirements(*, lab: bool = True) -> None:
    """Skip (saying what is missing) without Chromium and Playwright, and, for ``lab``, without
    JupyterLab, anywidget and the built lab extension."""
    import pytest  # noqa: PLC0415

    if not os.path.exists(CHROMIUM):
        pytest.skip(f"chromium not found at {CHROMIUM} (apt-get install chromium)")
    pytest.importorskip("playwright.sync_api", reason="playwright is not installed")
    pytest.importorskip("anywidget", reason="anywidget is not installed")
    if lab:
        pytest.importorskip("jupyterlab", reason="jupyterlab is not installed")
        if not (LABEXT / "package.json").is_file():
            pytest.skip("workbench/labextension is not built (scripts/build-labextension.sh)")


def new_page(browser, width: int = 1400, height: int = 1000, **context):
    """(context, page) at this viewport; ``page.errors`` collects uncaught page errors and
    ``page.dialogs`` the JavaScript dialogs (dismissed; a ``beforeunload`` is accepted)."""
    ctx = browser.new_context(viewport={"width": width, "height": height}, **context)
    pg = ctx.new_page()
    pg.errors, pg.dialogs = [], []
    pg.on("pageerror", lambda e: pg.errors.append(str(e)))
    pg.on("dialog", lambda d: d.accept() if d.type == "beforeunload" else
          (pg.dialogs.append(f"{d.type}: {d.message}"), d.dismiss()))
    return ctx, pg


def command(page, name: str, args: dict | None = None) -> None:
    """Run a JupyterLab command in ``page`` and wait for it to finish. Whatever the command
    returns is dropped in the page: Playwright would serialise it, and a widget (what
    ``docmanager:open`` returns) is an object graph that took it 15-25 s to walk."""
    page.evaluate("async ([n, a]) => { await window.jupyterapp.commands.execute(n, a); }",
                  [name, args or {}])


def start_test_lab(base: Path, root: Path, *, server_extension: bool = True,
                   lab_settings: dict | None = None, timeout: float = 90) -> Server:
    """JupyterLab with this working tree's front-end (a private data folder linking
    :data:`LABEXT`, whatever is installed in the environment) and the workbench server
    extension enabled or not in its private config; notebooks without windowing (every cell in
    the page) and the widget state saved with a notebook."""
    data = base / "data"
    (data / "labextensions" / "@onnx-workbench").mkdir(parents=True, exist_ok=True)
    link = data / "labextensions" / EXT_NAME
    if not link.exists():
        link.symlink_to(LABEXT, target_is_directory=True)
    settings = {"@jupyterlab/notebook-extension/tracker.jupyterlab-settings":
                {"windowingMode": "none"},
                "@jupyter-widgets/jupyterlab-manager/plugin.jupyterlab-settings":
                {"saveState": True}}
    settings.update(lab_settings or {})
    return start(base / "lab", root, lab=True, jupyter_path=[data], lab_settings=settings,
                 server_config={"ServerApp": {"jpserver_extensions":
                                              {"workbench": server_extension}}},
                 timeout=timeout)


@dataclass
class LabFolder:
    """A test module's own folder on the session's shared JupyterLab (tests/browser/conftest.py):
    its files go in ``root``; the server names them ``rel(name)``."""
    server: Server
    name: str

    @property
    def url(self) -> str:
        return self.server.url

    @property
    def token(self) -> str:
        return self.server.token

    @property
    def log(self) -> Path:
        return self.server.log

    @property
    def root(self) -> Path:
        return self.server.root / self.name

    def rel(self, path: str) -> str:
        return f"{self.name}/{path}"

    def tree(self, path: str) -> str:
        """The URL that opens ``path`` (in this folder) in JupyterLab, in a workspace of this
        folder's own (the documents other modules left open are not restored into it)."""
        return f"{self.url}/lab/workspaces/{self.name}/tree/{self.rel(path)}?token={self.token}"

    def get(self, path, params=None, **kw):
        return self.server.get(path, params, **kw)

    def post(self, path, body, **kw):
        return self.server.post(path, body, **kw)

    def close(self) -> None:
        """Shut down the kernels of this folder's notebooks (the server goes on)."""
        status, sessions = self.server.get("/api/sessions")
        if status != 200 or not isinstance(sessions, list):
            return
        for s in sessions:
            if str(s.get("path", "")).startswith(self.name + "/") and s.get("kernel"):
                req = urllib.request.Request(
                    f"{self.url}/api/kernels/{s['kernel']['id']}", method="DELETE",
                    headers={"Authorization": f"token {self.token}"})
                try:
                    urllib.request.urlopen(req, timeout=30).close()
                except OSError:
                    pass


def lab_folder(server: Server, name: str) -> LabFolder:
    """A new folder ``name`` of ``server``'s root, for one test module."""
    folder = LabFolder(server, name)
    folder.root.mkdir()
    return folder


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class Server:
    url: str
    token: str
    root: Path
    proc: subprocess.Popen
    log: Path
    _log_file: object = None

    def get(self, path: str, params: dict | None = None, *, token: str | None = "default",
            timeout: float = 120) -> tuple[int, dict | str]:
        """GET ``path`` (relative to the server) -> (status, parsed JSON or text)."""
        q = dict(params or {})
        headers = {}
        if token == "default":
            token = self.token
        if token:
            headers["Authorization"] = f"token {token}"
        url = f"{self.url}/{path.lstrip('/')}"
        if q:
            url += "?" + urllib.parse.urlencode(q)
        req = urllib.request.Request(url, headers=headers)
        try:
            with urllib.request.urlopen(req, timeout=timeout) as r:
                status, body = r.status, r.read()
        except urllib.error.HTTPError as e:
            status, body = e.code, e.read()
        text = body.decode("utf-8", "replace")
        try:
            return status, json.loads(text)
        except ValueError:
            return status, text

    def post(self, path: str, body, *, token: str | None = "default",
             timeout: float = 300) -> tuple[int, dict | str]:
        """POST ``body`` (JSON) to ``path`` -> (status, parsed JSON or text)."""
        headers = {"Content-Type": "application/json"}
        if token == "default":
            token = self.token
        if token:
            headers["Authorization"] = f"token {token}"
        data = body if isinstance(body, bytes) else json.dumps(body).encode("utf-8")
        req = urllib.request.Request(f"{self.url}/{path.lstrip('/')}", data=data,
                                     headers=headers, method="POST")
        try:
            with urllib.request.urlopen(req, timeout=timeout) as r:
                status, raw = r.status, r.read()
        except urllib.error.HTTPError as e:
            status, raw = e.code, e.read()
        text = raw.decode("utf-8", "replace")
        try:
            return status, json.loads(text)
        except ValueError:
            return status, text

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)
        if self._log_file:
            self._log_file.close()


def start(base: Path, root: Path, *, lab: bool = True, server_config: dict | None = None,
          lab_settings: dict | None = None, jupyter_path: list | None = None,
          extra_args: list | None = None, timeout: float = 90,
          python: str | None = None, quiet: bool = True) -> Server:
    """Start JupyterLab (``lab=True``) or a bare jupyter_server serving ``root``; its config
    folder is ``base/config`` (with ``server_config`` written as jupyter_server_config.json),
    runtime and IPython folders are under ``base`` too. Raises RuntimeError with the end of
    the log when it does not answer in ``timeout`` seconds.

    ``python``: the interpreter of another environment (a fresh venv) to run Jupyter with,
    as installed there: the working tree is then not put on its PYTHONPATH.

    ``quiet``: the lab extensions of :data:`QUIET_LABEXTENSIONS` are disabled (in the private
    config's ``labconfig/page_config.json``); the fresh-install check passes False, as it
    checks that a new environment shows no error dialog."""
    base.mkdir(parents=True, exist_ok=True)
    config = base / "config"
    config.mkdir(exist_ok=True)
    if server_config:
        (config / "jupyter_server_config.json").write_text(json.dumps(server_config))
    env = dict(os.environ)
    if python is None:
        env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    else:
        env.pop("PYTHONPATH", None)
        env.pop("JUPYTER_PATH", None)
    env["JUPYTER_RUNTIME_DIR"] = str(base / "runtime")
    env["JUPYTER_CONFIG_DIR"] = str(config)
    env["IPYTHONDIR"] = str(base / "ipython")
    if jupyter_path:
        env["JUPYTER_PATH"] = os.pathsep.join(
            [str(p) for p in jupyter_path] + ([env["JUPYTER_PATH"]] if env.get("JUPYTER_PATH")
                                              else []))
    if lab and quiet:
        (config / "labconfig").mkdir(exist_ok=True)
        (config / "labconfig" / "page_config.json").write_text(json.dumps(
            {"disabledExtensions": {name: True for name in QUIET_LABEXTENSIONS}}))
    if lab:
        settings = base / "settings"
        for rel, content in {**LAB_SETTINGS, **(lab_settings or {})}.items():
            p = settings / rel
            p.parent.mkdir(parents=True, exist_ok=True)
            p.write_text(json.dumps(content))
        env["JUPYTERLAB_SETTINGS_DIR"] = str(settings)
    port, token = free_port(), "wbtest" + os.urandom(8).hex()
    cmd = [python or sys.executable, "-m", "jupyterlab" if lab else "jupyter_server",
           "--no-browser",
           "--ip=127.0.0.1", f"--port={port}", "--allow-root", f"--ServerApp.token={token}",
           f"--ServerApp.root_dir={root}", "--ServerApp.open_browser=False",
           "--ServerApp.port_retries=0"]
    if lab:
        cmd += ["--LabApp.news_url=", "--LabApp.expose_app_in_browser=True"]
    cmd += list(extra_args or [])
    log_path = base / ("lab.log" if lab else "server.log")
    log = open(log_path, "w")
    proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, cwd=root)
    srv = Server(f"http://127.0.0.1:{port}", token, root, proc, log_path, log)
    deadline = time.time() + timeout
    while True:
        try:
            with urllib.request.urlopen(f"{srv.url}/api/status?token={token}", timeout=2):
                return srv
        except OSError:
            if proc.poll() is not None or time.time() > deadline:
                srv.stop()
                raise RuntimeError(f"Jupyter did not start ({' '.join(cmd[:3])}):\n"
                                   + log_path.read_text()[-3000:]) from None
            time.sleep(0.5)
