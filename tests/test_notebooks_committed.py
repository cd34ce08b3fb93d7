"""The notebooks under ``notebooks/`` are committed executed, valid and runnable by nbval.

This does not run them (``pytest --nbval-lax notebooks/`` does, see ``notebooks/README.md``);
it checks what a reader and nbval find in the committed files. The rule for outputs:

1. Every code cell with source was executed in one top-to-bottom run: its ``execution_count``
   is set and the counts are 1, 2, 3, ... in cell order (no stale or partial runs).
2. A cell *that shows something* has at least one output. A cell shows something when it is
   marked ``# NBVAL_CHECK_OUTPUT`` (nbval compares its output), calls ``print`` or ``display``
   anywhere, or ends with a bare expression that is not a call (``gv``, ``cutter``: a widget
   or a value is displayed). Cells that only define, import or compute (the setup cell, a
   training loop whose monitor is a widget, ``model.compile(...)``) may be empty. A cell that
   shows something only conditionally can opt out with the cell tag ``allow-empty-output``.
3. No committed output is an error (a traceback), and every notebook has outputs.
4. The notebook validates against the nbformat schema and its kernelspec is ``python3``.
5. The zoo notebooks say plainly that offline they run an untrained twin whose predictions are
   meaningless (nothing pretends to be pretrained).
6. No output shows a raw object repr (``<... object at 0x...>``): every object a notebook
   displays has a readable text form (widgets: their summary, and the TrainingMonitor a
   picture of its curves).
7. Notebooks leave no temporary folders behind: they make them with
   ``tempfile.TemporaryDirectory`` (removed when the kernel stops, or by the notebook), never
   ``mkdtemp``/``mkstemp``, and no committed output shows a temporary path. One notebook is
   run in a kernel whose temporary folder is private to check that nothing is left there
   (that test needs a kernel).
"""

from __future__ import annotations

import ast
import json
import re
from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat")

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((ROOT / "notebooks").rglob("*.ipynb"))  # tutorials/ included
CHECK_MARK = "# NBVAL_CHECK_OUTPUT"
ALLOW_EMPTY_TAG = "allow-empty-output"


def _ids(paths):
    return [p.name for p in paths]


def _read(path: Path):
    return nbformat.read(str(path), as_version=4)


def _code_cells(nb):
    return [c for c in nb.cells if c.cell_type == "code" and c.source.strip()]


def _shows_something(source: str) -> bool:
    if CHECK_MARK in source:
        return True
    lines = source.splitlines()
    if lines and lines[0].startswith("%%"):     # a cell magic (%%px, %%time): judge its body
        lines = lines[1:]
    # line magics and shell escapes become no-ops for the parser
    source = "\n".join("pass" if ln.lstrip().startswith(("%", "!")) else ln for ln in lines)
    try:
        tree = ast.parse(source)
    except SyntaxError:          # IPython magics: be conservative, require an output
        return True
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and \
                node.func.id in ("print", "display"):
            return True
    if tree.body:
        last = tree.body[-1]
        if isinstance(last, ast.Expr) and not isinstance(last.value, (ast.Call, ast.Constant)):
            return True
    return False


def test_there_are_notebooks():
    names = {p.name for p in NOTEBOOKS}
    assert "01_getting_started.ipynb" in names
    assert sum(n.startswith("zoo_") for n in names) == 10, sorted(names)
    assert (ROOT / "notebooks" / "nbval_sanitize.cfg").is_file()


@pytest.mark.parametrize("path", NOTEBOOKS, ids=_ids(NOTEBOOKS))
def test_valid_and_python3(path):
    nb = _read(path)
    nbformat.validate(nb)
    ks = nb.metadata.get("kernelspec", {})
    assert ks.get("name") == "python3", f"{path.name}: kernelspec {ks!r}, expected python3"
    assert ks.get("language", "python") == "python"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=_ids(NOTEBOOKS))
def test_committed_with_outputs(path):
    nb = _read(path)
    cells = _code_cells(nb)
    assert cells, f"{path.name} has no code"
    counts = [c.get("execution_count") for c in cells]
    assert None not in counts, (
        f"{path.name}: cell {counts.index(None) + 1} was never executed; run the notebook top "
        f"to bottom and commit it with its outputs (see notebooks/README.md)")
    assert counts == list(range(1, len(cells) + 1)), (
        f"{path.name}: execution counts {counts} are not 1..{len(cells)} in order; restart the "
        f"kernel and run all cells before committing")
    assert any(c.outputs for c in cells), f"{path.name} was committed without any output"
    for i, c in enumerate(cells, 1):
        errors = [o for o in c.outputs if o.get("output_type") == "error"]
        assert not errors, f"{path.name}: code cell {i} has an error output: " \
                           f"{errors[0].get('ename')}: {errors[0].get('evalue')}"
        tags = c.metadata.get("tags", [])
        if _shows_something(c.source) and ALLOW_EMPTY_TAG not in tags:
            assert c.outputs, (f"{path.name}: code cell {i} prints or displays something but "
                               f"has no output:\n{c.source[:200]}")


@pytest.mark.parametrize("path", NOTEBOOKS, ids=_ids(NOTEBOOKS))
def test_checked_cells_are_deterministic_kinds(path):
    """Checked cells must not hold widget views (their ids are random) or rely on stderr."""
    nb = _read(path)
    for i, c in enumerate(_code_cells(nb), 1):
        if CHECK_MARK not in c.source:
            continue
        for o in c.outputs:
            data = o.get("data", {})
            assert "application/vnd.jupyter.widget-view+json" not in data, \
                f"{path.name}: checked cell {i} displays a widget"
            assert not (o.get("output_type") == "stream" and o.get("name") == "stderr"), \
                f"{path.name}: checked cell {i} writes to stderr: {o.get('text', '')[:200]}"


ZOO = [p for p in NOTEBOOKS if p.name.startswith("zoo_")]


@pytest.mark.parametrize("path", ZOO, ids=_ids(ZOO))
def test_zoo_notebooks_are_honest_about_twins(path):
    nb = _read(path)
    text = " ".join(c.source for c in nb.cells if c.cell_type == "markdown").lower()
    assert "untrained" in text and "meaningless" in text, \
        f"{path.name} must say that offline it runs an untrained twin (predictions meaningless)"
    code = " ".join(c.source for c in _code_cells(nb))
    assert "allow_twin=True" in code, \
        f"{path.name} must load with zoo.load_model(..., allow_twin=True)"
    outputs = json.dumps([c.outputs for c in _code_cells(nb)])
    if "twin" in outputs:       # executed offline: the run itself says so
        assert "meaningless" in outputs


_RAW_REPR = re.compile(r"<[\w.]+(\.<locals>\.[\w.]+)? object at 0x[0-9a-fA-F]+>")


@pytest.mark.parametrize("path", NOTEBOOKS, ids=_ids(NOTEBOOKS))
def test_outputs_show_no_raw_object_reprs(path):
    nb = _read(path)
    for i, c in enumerate(_code_cells(nb), 1):
        for o in c.outputs:
            for t in [o.get("text", "")] + [v for k, v in o.get("data", {}).items()
                                           if k.startswith("text/") and isinstance(v, str)]:
                m = _RAW_REPR.search(t)
                assert not m, f"{path.name}: code cell {i} shows a raw object repr: {m.group(0)}"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=_ids(NOTEBOOKS))
def test_training_monitors_show_their_curves(path):
    """A TrainingMonitor's saved output carries the curves as a picture next to the widget
    view, so the notebook shows them where widgets do not render (GitHub, nbviewer)."""
    nb = _read(path)
    for i, c in enumerate(_code_cells(nb), 1):
        if "TrainingMonitor(" not in c.source or "with " not in c.source:
            continue
        views = [o for o in c.outputs
                 if "application/vnd.jupyter.widget-view+json" in o.get("data", {})]
        assert views, f"{path.name}: code cell {i} trains with a monitor but shows no widget"
        for o in views:
            data = o["data"]
            svg = data.get("image/svg+xml", "")
            assert "step (batches)" in svg, (
                f"{path.name}: code cell {i}: the monitor's output has no picture of its "
                f"curves; re-execute the notebook")
            assert "step(s)" in data.get("text/plain", ""), data.get("text/plain")


# calls that make temporary files or folders nobody removes
_LEAKY_TEMP = re.compile(r"\b(mkdtemp|mkstemp|mktemp)\s*\("
                         r"|NamedTemporaryFile\([^)]*delete\s*=\s*False")
# a temporary path in an output: /tmp/..., a Windows temp folder, or the prefixes of our folders
_TEMP_PATH = re.compile(r"/tmp/|\\Temp\\|\bwb-(notebook|export|retrain|transfer|dist|quantize)-"
                        r"[a-z0-9_]{6,}|/var/folders/")


@pytest.mark.parametrize("path", NOTEBOOKS, ids=_ids(NOTEBOOKS))
def test_temporary_folders_are_removed(path):
    nb = _read(path)
    for i, c in enumerate(_code_cells(nb), 1):
        m = _LEAKY_TEMP.search(c.source)
        assert not m, (f"{path.name}: code cell {i} calls {m.group(0)!r}, which leaves its "
                       f"file or folder behind; use tempfile.TemporaryDirectory (as a context "
                       f"manager, or kept in a variable: removed when the kernel stops)")
        for line in c.source.splitlines():
            if "TemporaryDirectory(" in line:
                code = line.split("#", 1)[0]
                assert re.match(r"\s*(with\b|\w+\s*=)", code), (
                    f"{path.name}: code cell {i}: keep the TemporaryDirectory in a variable or "
                    f"use it in a with-statement (an unnamed one is removed at once): {line}")


@pytest.mark.parametrize("path", NOTEBOOKS, ids=_ids(NOTEBOOKS))
def test_outputs_show_no_temporary_paths(path):
    nb = _read(path)
    for i, c in enumerate(_code_cells(nb), 1):
        for o in c.outputs:
            texts = [o.get("text", "")] + [v for k, v in o.get("data", {}).items()
                                           if k.startswith("text/") and isinstance(v, str)]
            for t in texts:
                m = _TEMP_PATH.search(t)
                assert not m, (f"{path.name}: code cell {i} shows a temporary path "
                               f"({t[max(0, m.start() - 40):m.end() + 40]!r}); print names "
                               f"relative to the folder instead")
    state = json.dumps(nb.metadata.get("widgets", {}))
    m = _TEMP_PATH.search(state)
    assert not m, f"{path.name}: the saved widget state shows a temporary path: " \
                  f"{state[max(0, m.start() - 60):m.end() + 60]!r}"


def test_a_notebook_run_leaves_no_temporary_folder(tmp_path):
    """Notebook 03 (a private zoo cache and an export folder) in a kernel whose TMPDIR is an
    empty folder: once the kernel has shut down, no folder is left there."""
    pytest.importorskip("nbclient")
    pytest.importorskip("ipykernel")
    pytest.importorskip("onnxruntime")
    path = ROOT / "notebooks" / "03_exporting_your_own_model.ipynb"
    nb = _read(path)
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    from tests.helpers.kernel import run_notebook
    run_notebook(nb, path.parent, env={"TMPDIR": str(tmp), "WORKBENCH_NOTEBOOK_OFFLINE": "1"})
    outputs = json.dumps([c.get("outputs", []) for c in nb.cells])
    assert "second export refused" in outputs          # the export cell ran
    left = sorted(p.name for p in tmp.iterdir() if p.is_dir())
    assert not left, f"{path.name} left temporary folders behind: {left}"
