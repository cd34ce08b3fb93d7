"""Install the workbench as a newcomer does — the README's install blocks, verbatim, in a copy of
the repository and new virtual environments — and check what each way of installing promises.

The ways (``PLAN``; every block marked ``<!-- docs-test: fresh-install -->`` in the README and
docs belongs to one, which ``tests/test_docs.py`` checks):

- ``editable``: the README's "Start here" (``python3 -m venv .venv``, ``pip install -e .``,
  ``workbench demo``): the demo classifies its digits;
- ``notebooks``: "Start here", then "In JupyterLab" (``pip install -e ".[notebooks]"``) and
  notebooks/README.md's set-up: notebook 01 runs top to bottom in that venv's kernel
  (``jupyter nbconvert --execute``), and ``jupyter lab`` — started as the README says, with
  ``--allow-root`` when this runs as root — opens the notebook in Chromium with no error dialog;
- ``wheel``: the README's wheel block (``pip wheel . --no-deps -w dist/``, ``pip install
  "<wheel>[lab]"``) in a new venv: the wheel holds LICENSE and the JupyterLab extension;
  ``jupyter labextension list`` / ``jupyter server extension list`` show the ONNX Graph viewer
  enabled; ``jupyter lab --allow-root`` serves a folder holding the embedded model and Chromium
  opens it in the viewer, drawn, with no error dialog;
- ``dist``: "Start here", "In JupyterLab", then the README's ``dist`` install block: the
  README's ``train.py`` (its ``docs-test: file`` block) under ``mpiexec -n 2`` trains on two
  ranks, and JupyterLab, with ipyparallel's lab extension now installed, opens notebook 01
  with no error dialog (the "IPP Extension Server Error" a lab extension without its server
  side shows).

``jupyter lab`` lines of a block are started in the background (the script stops them): on
127.0.0.1, a free port, a token, private config/runtime folders (nothing of the user's own
set-up), no PYTHONPATH. pip's output is checked for warnings about this project's packaging.
Each way reports its time and the venv's size. Screenshots: ``test-artifacts/install-*.png``.

Run: ``python3 scripts/check_fresh_install.py [--keep] [editable|notebooks|wheel ...]``
(default: all; minutes each, installing from the configured package index); exit status 0 when
every check passed. Playwright is used from the interpreter that runs this script.
"""

from __future__ import annotations

import argparse
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.helpers import docblocks, jupyter  # noqa: E402

#: way of installing -> the fresh-install blocks it runs, in order: (page, text in the block)
PLAN = {
    "editable": [("README.md", "pip install -e . && workbench demo")],
    "notebooks": [("README.md", "pip install -e . && workbench demo"),
                  ("README.md", 'pip install -e ".[notebooks]"\njupyter lab notebooks/01'),
                  ("notebooks/README.md", 'pip install -e ".[notebooks]"')],
    "wheel": [("README.md", "pip wheel . --no-deps -w dist/")],
    "dist": [("README.md", "pip install -e . && workbench demo"),
             ("README.md", 'pip install -e ".[notebooks]"\njupyter lab notebooks/01'),
             ("README.md", 'pip install -e ".[dist]"')],
}
#: the README's "Start here" block, which makes the clone's .venv (the others run in it)
START = ("README.md", "pip install -e . && workbench demo")
EXT = "@onnx-workbench/jupyterlab-onnx"
MODEL = ROOT / "workbench" / "data" / "default_model.onnx"
ARTIFACTS = ROOT / "test-artifacts"
PACKAGING_WARNINGS = re.compile(
    r"SetuptoolsDeprecationWarning|SetuptoolsWarning|DeprecationWarning|deprecated|"
    r"hatchling.*warn|UserWarning", re.IGNORECASE)
ANSI = re.compile(r"\x1b\[[0-9;]*m")
IS_ROOT = hasattr(os, "geteuid") and os.geteuid() == 0


class CheckFailed(Exception):
    pass


def block(page: str, needle: str) -> docblocks.Block:
    hits = [b for b in docblocks.parse(ROOT / page)
            if b.marker == "fresh-install" and needle in b.code]
    if len(hits) != 1:
        raise CheckFailed(f"{page}: {len(hits)} fresh-install blocks hold {needle!r}")
    return hits[0]


def clean_env(venv: Path | None = None) -> dict:
    """The environment of a newcomer's shell: no PYTHONPATH or Jupyter paths of ours; the venv
    (when given) first on PATH, as `. venv/bin/activate` leaves it."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "JUPYTER_PATH", "JUPYTER_CONFIG_DIR", "VIRTUAL_ENV",
                        "PYTHONHOME")}
    if venv is not None:
        env["VIRTUAL_ENV"] = str(venv)
        env["PATH"] = f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}"
    return env


def sh(script: str, cwd: Path, env: dict, what: str, timeout: float = 1800) -> str:
    t0 = time.perf_counter()
    r = subprocess.run(["bash", "-e", "-o", "pipefail", "-c", script], cwd=cwd, env=env,
                       capture_output=True, text=True, timeout=timeout)
    out = r.stdout + r.stderr
    if r.returncode:
        raise CheckFailed(f"{what} failed (exit {r.returncode}) after "
                          f"{time.perf_counter() - t0:.0f} s:\n{script}\n{out[-4000:]}")
    return out


def size(path: Path) -> str:
    total = sum(p.stat().st_size for p in path.rglob("*") if p.is_file() and not p.is_symlink())
    return f"{total / 2**30:.2f} GB" if total >= 2**30 else f"{total / 2**20:.0f} MB"


def packaging_warnings(log: str) -> list[str]:
    return [ln.strip() for ln in log.splitlines() if PACKAGING_WARNINGS.search(ln)]


def split_jupyter(code: str) -> tuple[str, list[list[str]]]:
    """The block without its `jupyter lab ...` lines, and those lines' arguments."""
    keep, labs = [], []
    for line in code.splitlines():
        words = shlex.split(line, comments=True)
        if words[:2] == ["jupyter", "lab"]:
            labs.append(words[2:])
        else:
            keep.append(line)
    return "\n".join(keep), labs


# ------------------------------------------------------------------------------ JupyterLab
def start_lab(venv: Path, root: Path, args: list, base: Path) -> jupyter.Server:
    """`jupyter lab ARGS` from the venv, serving ``root``, as the README says to start it:
    with --allow-root when running as root."""
    extra = [a for a in args if a.startswith("-")]
    if IS_ROOT and "--allow-root" not in extra:
        extra.append("--allow-root")
    return jupyter.start(base, root, lab=True, python=str(venv / "bin" / "python"),
                         extra_args=extra, timeout=180, quiet=False)


def lab_page(srv: jupyter.Server, path: str, shot: str, ready) -> dict:
    """Open ``/lab/tree/<path>`` in Chromium; ``ready(page)`` waits for what must be there;
    returns what was seen. No error dialog may be on the page."""
    from playwright.sync_api import sync_playwright

    ARTIFACTS.mkdir(exist_ok=True)
    with sync_playwright() as pw:
        b = pw.chromium.launch(executable_path=jupyter.CHROMIUM, headless=True,
                               args=jupyter.CHROME_ARGS)
        pg = b.new_page(viewport={"width": 1300, "height": 850})
        errors = []
        pg.on("pageerror", lambda e: errors.append(str(e)))
        try:
            pg.goto(f"{srv.url}/lab/tree/{path}?token={srv.token}")
            seen = ready(pg)
            pg.wait_for_timeout(4000)           # extensions that call their server at start
            dialogs = [d for d in pg.locator(".jp-Dialog").all_inner_texts() if d.strip()]
        finally:
            pg.screenshot(path=str(ARTIFACTS / f"install-{shot}.png"))
            b.close()
    if dialogs:
        raise CheckFailed(f"JupyterLab showed a dialog on opening {path}: {dialogs}")
    seen["page errors"] = len(errors)
    return seen


def notebook_ready(pg) -> dict:
    pg.locator(".jp-NotebookPanel").first.wait_for(timeout=180_000)
    pg.wait_for_function("() => document.querySelectorAll('.jp-Cell').length > 3",
                         timeout=120_000)
    return {"cells": pg.locator(".jp-Cell").count()}


def viewer_ready(pg) -> dict:
    panel = pg.locator(".jp-OnnxGraph[data-path='default_model.onnx']")
    panel.wait_for(timeout=180_000)
    pg.wait_for_function("el => el.dataset.status === 'ready'", arg=panel.element_handle(),
                         timeout=120_000)
    return {"viewer": panel.locator(".jp-OnnxGraph-nodecount").inner_text()}


def check_extension_lists(venv: Path) -> str:
    env = clean_env(venv)
    labs = ANSI.sub("", sh("jupyter labextension list", Path(tempfile.gettempdir()), env,
                           "jupyter labextension list"))
    line = next((ln.strip() for ln in labs.splitlines() if EXT in ln), "")
    if "enabled" not in line or "OK" not in line:
        raise CheckFailed(f"the ONNX Graph front-end is not installed:\n{labs}")
    srv = ANSI.sub("", sh("jupyter server extension list", Path(tempfile.gettempdir()), env,
                          "jupyter server extension list"))
    ours = [ln.strip() for ln in srv.splitlines() if ln.strip().startswith("workbench")]
    if not any("enabled" in ln for ln in ours) or not any("OK" in ln for ln in ours):
        raise CheckFailed(f"the server extension is not enabled:\n{srv}")
    return f"{line} / {' '.join(ours)}"


def refuses_root_without_flag(venv: Path, cwd: Path) -> bool:
    """As root, plain `jupyter lab` stops with "Running as root is not recommended" (what the
    README tells root users to add --allow-root for)."""
    env = clean_env(venv)
    env["JUPYTER_CONFIG_DIR"] = tempfile.mkdtemp(prefix="wb-cfg-")
    env["JUPYTER_RUNTIME_DIR"] = tempfile.mkdtemp(prefix="wb-rt-")
    r = subprocess.run([str(venv / "bin" / "jupyter"), "lab", "--no-browser",
                        f"--port={jupyter.free_port()}"], cwd=cwd, env=env,
                       capture_output=True, text=True, timeout=120)
    return r.returncode != 0 and "Running as root is not recommended" in r.stdout + r.stderr


# ------------------------------------------------------------------------------ the ways
def start_here(clone: Path) -> tuple[Path, str]:
    b = block(*START)
    out = sh(b.code, clone, clean_env(), f"{b.where} (Start here)")
    if "accuracy 1.000" not in out:
        raise CheckFailed(f"{b.where}: the demo did not classify its digits:\n{out[-3000:]}")
    return clone / ".venv", out


def way_editable(work: Path, report: dict) -> None:
    clone = docblocks.copy_checkout(work / "clone")
    t0 = time.perf_counter()
    venv, out = start_here(clone)
    report["time"] = f"{time.perf_counter() - t0:.0f} s"
    report["venv"] = size(venv)
    report["demo"] = next(ln.strip() for ln in out.splitlines() if "classified" in ln)
    where = sh("python3 -c 'import workbench; print(workbench.__file__)'", work,
               clean_env(venv), "import")
    if not where.strip().startswith(str(clone)):
        raise CheckFailed(f"the venv imports workbench from {where.strip()}, not the clone")


def way_notebooks(work: Path, report: dict) -> None:
    clone = docblocks.copy_checkout(work / "clone")
    t0 = time.perf_counter()
    venv, _ = start_here(clone)
    labs = []
    for page, needle in PLAN["notebooks"]:
        if (page, needle) == START:
            continue
        b = block(page, needle)
        code, lab_args = split_jupyter(b.code)
        log = sh(code, clone, clean_env(venv), b.where)
        bad = packaging_warnings(log)
        if bad:
            raise CheckFailed(f"{b.where}: pip warned about the packaging: {bad}")
        labs.extend(lab_args)
    report["install time"] = f"{time.perf_counter() - t0:.0f} s"
    report["venv"] = size(venv)
    t0 = time.perf_counter()
    sh("jupyter nbconvert --to notebook --execute --ExecutePreprocessor.timeout=600 "
       "--output-dir .nb-out notebooks/01_getting_started.ipynb", clone, clean_env(venv),
       "notebook 01 in the venv's kernel")
    report["notebook 01"] = f"ran top to bottom in {time.perf_counter() - t0:.0f} s"
    if IS_ROOT:
        report["plain `jupyter lab` as root"] = (
            "refused ('Running as root is not recommended')"
            if refuses_root_without_flag(venv, clone) else "started (not refused)")
    for k, args in enumerate(labs):
        target = next((a for a in args if not a.startswith("-")), "")
        srv = start_lab(venv, clone, args, work / f"lab-nb{k}")
        try:
            path = target if target.endswith(".ipynb") else \
                f"{target.rstrip('/')}/01_getting_started.ipynb"
            seen = lab_page(srv, path, f"notebooks-{k}", notebook_ready)
        finally:
            srv.stop()
        report[f"jupyter lab {' '.join(args)}"] = f"opened {path}: {seen}"


def way_wheel(work: Path, report: dict) -> None:
    clone = docblocks.copy_checkout(work / "clone")
    venv = work / "venv-wheel"
    sh(f"{shlex.quote(sys.executable)} -m venv {shlex.quote(str(venv))}", work, clean_env(),
       "python3 -m venv")
    b = block(*PLAN["wheel"][0])
    t0 = time.perf_counter()
    log = sh(b.code, clone, clean_env(venv), b.where)
    report["time"] = f"{time.perf_counter() - t0:.0f} s"
    bad = packaging_warnings(log)
    if bad:
        raise CheckFailed(f"{b.where}: pip warned about the packaging: {bad}")
    wheel = next((clone / "dist").glob("onnx_workbench-*.whl"))
    names = zipfile.ZipFile(wheel).namelist()
    want = [n for n in names if n.endswith(".dist-info/licenses/LICENSE")]
    if not want:
        raise CheckFailed(f"{wheel.name} holds no LICENSE")
    report["wheel"] = f"{wheel.name}: {len(names)} files, LICENSE at {want[0]}"
    report["venv"] = size(venv)
    report["extension lists"] = check_extension_lists(venv)
    root = work / "models"
    root.mkdir()
    shutil.copy(MODEL, root / "default_model.onnx")
    srv = start_lab(venv, root, ["--allow-root"], work / "lab-wheel")
    try:
        seen = lab_page(srv, "default_model.onnx", "wheel", viewer_ready)
    finally:
        srv.stop()
    where = sh("python -c 'import workbench; print(workbench.__file__)'", root,
               clean_env(venv), "import")
    report["jupyter lab --allow-root"] = f"viewer drew default_model.onnx: {seen}"
    report["workbench imported from"] = where.strip()


def way_dist(work: Path, report: dict) -> None:
    clone = docblocks.copy_checkout(work / "clone")
    t0 = time.perf_counter()
    venv, _ = start_here(clone)
    for page, needle in PLAN["dist"][1:]:
        b = block(page, needle)
        code, _labs = split_jupyter(b.code)     # JupyterLab is started below
        log = sh(code, clone, clean_env(venv), b.where)
        bad = packaging_warnings(log)
        if bad:
            raise CheckFailed(f"{b.where}: pip warned about the packaging: {bad}")
    report["install time"] = f"{time.perf_counter() - t0:.0f} s"
    report["venv"] = size(venv)
    readme = docblocks.parse(ROOT / "README.md")
    script = next(x for x in readme if x.marker == "file" and x.arg == "train.py")
    run = next(x for x in readme if x.runs and "mpiexec -n 2 python3 train.py" in x.code)
    (clone / "train.py").write_text(script.code)
    env = clean_env(venv)
    env.setdefault("OMP_NUM_THREADS", "1")
    t0 = time.perf_counter()
    out = sh(run.code, clone, env, f"{run.where} (mpiexec)", timeout=600)
    ranks = sorted({ln.split(":")[0] for ln in out.splitlines() if ln.startswith("rank ")})
    if ranks != ["rank 0 of 2", "rank 1 of 2"]:
        raise CheckFailed(f"{run.where}: expected ranks 0 and 1 of 2, saw {ranks}:\n{out[-2000:]}")
    report["mpiexec -n 2 python3 train.py"] = \
        f"{', '.join(ranks)} trained in {time.perf_counter() - t0:.0f} s"
    srv = start_lab(venv, clone, [], work / "lab-dist")
    try:
        seen = lab_page(srv, "notebooks/01_getting_started.ipynb", "dist", notebook_ready)
    finally:
        srv.stop()
    report["jupyter lab (ipyparallel installed)"] = f"no error dialog: {seen}"


WAYS = {"editable": way_editable, "notebooks": way_notebooks, "wheel": way_wheel,
        "dist": way_dist}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("ways", nargs="*", metavar="|".join(WAYS),
                    help="the ways of installing to check (default: all)")
    ap.add_argument("--keep", action="store_true", help="keep the copies and venvs")
    args = ap.parse_args()
    bad = [w for w in args.ways if w not in WAYS]
    if bad:
        ap.error(f"unknown way of installing {bad}: choose from {list(WAYS)}")
    work = Path(tempfile.mkdtemp(prefix="wb-install-check-"))
    failed = []
    try:
        for way in args.ways or list(WAYS):
            report: dict = {}
            t0 = time.perf_counter()
            print(f"[{way}] ...", flush=True)
            try:
                WAYS[way](work / way, report)
                status = "passed"
            except (CheckFailed, subprocess.TimeoutExpired, RuntimeError) as e:
                status = f"FAILED: {e}"
                failed.append(way)
            print(f"[{way}] {status} ({time.perf_counter() - t0:.0f} s)")
            for k, v in report.items():
                print(f"    {k}: {v}")
            sys.stdout.flush()
    finally:
        if args.keep:
            print(f"kept: {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)
    print("all install checks passed" if not failed else f"failed: {failed}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
