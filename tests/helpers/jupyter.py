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
