"""Install the package as a new user would, in clean virtual environments, and check that
JupyterLab opens an .onnx file in the "ONNX Graph" viewer with no further step.

For each way of installing (default: both)

- ``wheel``: ``pip wheel . --no-deps`` then ``pip install "<wheel>[lab]"`` in a new venv
  (what ``pip install onnx-workbench[lab]`` does from an index),
- ``editable``: ``pip install -e ".[lab]"`` in a new venv,

it checks pip's output for deprecation warnings about this project's packaging, runs
``jupyter labextension list`` and ``jupyter server extension list`` with the venv's jupyter, starts
that venv's JupyterLab on 127.0.0.1 (private config and runtime folders: nothing from the
user's own set-up; no PYTHONPATH), opens the embedded default model by URL in headless Chromium
(Playwright) and waits for the viewer's drawing. Screenshots: ``test-artifacts/install-*.png``.

The venvs are clean (no ``--system-site-packages``): pip installs JupyterLab and the rest from
the configured index, a few minutes each on 2 cores. Playwright is used from the interpreter
that runs this script (it only drives the browser).

Run: ``python3 scripts/check_fresh_install.py [--keep] [wheel|editable ...]``; exit code 0 when
every check passed.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.helpers import jupyter  # noqa: E402

EXT = "@onnx-workbench/jupyterlab-onnx"
MODEL = ROOT / "workbench" / "data" / "default_model.onnx"
# what pip's verbose output says when a build backend dislikes a project's configuration
PACKAGING_WARNINGS = re.compile(
    r"SetuptoolsDeprecationWarning|SetuptoolsWarning|DeprecationWarning|deprecated|"
    r"hatchling.*warn|UserWarning", re.IGNORECASE)
ANSI = re.compile(r"\x1b\[[0-9;]*m")


def run(cmd, **kw) -> str:
    """Run ``cmd`` outside the working tree (cwd: the temp folder) and without PYTHONPATH, so
    that the venv's own installation is what gets imported."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "JUPYTER_PATH",
                                                            "JUPYTER_CONFIG_DIR")}
    kw.setdefault("cwd", tempfile.gettempdir())
    r = subprocess.run(cmd, capture_output=True, text=True, env=env, **kw)
    out = r.stdout + r.stderr
    if r.returncode:
        raise SystemExit(f"failed ({r.returncode}): {' '.join(map(str, cmd))}\n{out[-3000:]}")
    return out


def packaging_warnings(pip_log: str) -> list[str]:
    return [ln.strip() for ln in pip_log.splitlines() if PACKAGING_WARNINGS.search(ln)]


def install(kind: str, work: Path) -> Path:
    venv = work / f"venv-{kind}"
    run([sys.executable, "-m", "venv", str(venv)])
    py = venv / "bin" / "python"
    if kind == "wheel":
        whl_dir = work / "wheel"
        log = run([str(py), "-m", "pip", "wheel", str(ROOT), "--no-deps", "-v", "-w",
                   str(whl_dir)])
        wheel = next(whl_dir.glob("onnx_workbench-*.whl"))
        log += run([str(py), "-m", "pip", "install", "-v", f"{wheel}[lab]"])
    else:
        log = run([str(py), "-m", "pip", "install", "-v", "-e", f"{ROOT}[lab]"])
    (work / f"pip-{kind}.log").write_text(log)
    bad = packaging_warnings(log)
    print(f"[{kind}] pip install done; packaging warnings in pip's output: {len(bad)}")
    for ln in bad:
        print("   ", ln)
    if bad:
        raise SystemExit(f"[{kind}] pip printed warnings about the packaging")
    return py


def check_lists(kind: str, py: Path) -> None:
    jup = py.parent / "jupyter"
    labs = ANSI.sub("", run([str(jup), "labextension", "list"]))
    line = next((ln.strip() for ln in labs.splitlines() if EXT in ln), "")
    print(f"[{kind}] jupyter labextension list: {line or '(missing)'}")
    if "enabled" not in line or "OK" not in line:
        raise SystemExit(f"[{kind}] the ONNX Graph front-end is not installed:\n{labs}")
    srv = ANSI.sub("", run([str(jup), "server", "extension", "list"]))
    lines = [ln.strip() for ln in srv.splitlines() if ln.strip().startswith("workbench")]
    print(f"[{kind}] jupyter server extension list: {' / '.join(lines) or '(missing)'}")
    if not any("enabled" in ln for ln in lines) or not any("OK" in ln for ln in lines):
        raise SystemExit(f"[{kind}] the server extension is not enabled:\n{srv}")


def check_viewer(kind: str, py: Path, work: Path) -> None:
    from playwright.sync_api import sync_playwright

    base = work / f"lab-{kind}"
    root = base / "root"
    root.mkdir(parents=True)
    shutil.copy(MODEL, root / "default_model.onnx")
    t0 = time.perf_counter()
    srv = jupyter.start(base, root, lab=True, python=str(py), timeout=180)
    try:
        with sync_playwright() as pw:
            b = pw.chromium.launch(executable_path=jupyter.CHROMIUM, headless=True,
                                   args=jupyter.CHROME_ARGS)
            pg = b.new_page(viewport={"width": 1300, "height": 850})
            pg.goto(f"{srv.url}/lab/tree/default_model.onnx?token={srv.token}")
            panel = pg.locator(".jp-OnnxGraph[data-path='default_model.onnx']")
            try:
                panel.wait_for(timeout=120_000)
                pg.wait_for_function("el => el.dataset.status === 'ready'",
                                     arg=panel.element_handle(), timeout=120_000)
            finally:
                shot = ROOT / "test-artifacts" / f"install-{kind}.png"
                shot.parent.mkdir(exist_ok=True)
                pg.screenshot(path=str(shot))
            label = pg.locator("#jp-main-dock-panel .lm-TabBar-tab.lm-mod-current "
                               ".lm-TabBar-tabLabel").inner_text()
            nodes = panel.locator(".jp-OnnxGraph-nodecount").inner_text()
            b.close()
        where = run([str(py), "-c", "import workbench; print(workbench.__file__)"]).strip()
        print(f"[{kind}] JupyterLab opened default_model.onnx in the ONNX Graph viewer "
              f"(tab {label!r}, {nodes}) in {time.perf_counter() - t0:.0f} s; "
              f"workbench imported from {where}; screenshot {shot.relative_to(ROOT)}")
    finally:
        srv.stop()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("kinds", nargs="*", metavar="wheel|editable",
                    help="the ways of installing to check (default: both)")
    ap.add_argument("--keep", action="store_true", help="keep the venvs (printed at the end)")
    args = ap.parse_args()
    bad = [k for k in args.kinds if k not in ("wheel", "editable")]
    if bad:
        ap.error(f"unknown way of installing {bad}: choose wheel and/or editable")
    args.kinds = args.kinds or ["wheel", "editable"]
    work = Path(tempfile.mkdtemp(prefix="wb-install-check-"))
    try:
        for kind in args.kinds:
            t0 = time.perf_counter()
            py = install(kind, work)
            print(f"[{kind}] installed in {time.perf_counter() - t0:.0f} s")
            check_lists(kind, py)
            check_viewer(kind, py, work)
        print("all install checks passed")
        return 0
    finally:
        if args.keep:
            print(f"kept: {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
