"""Teacher tools: one instructor notebook -> the students' notebook and an answer key.

>>> from workbench.classroom import assign                           # doctest: +SKIP
>>> a = assign("course/ch1.ipynb", "release/")   # release/ch1.ipynb, release/ch1.key.json

**Marking solutions.** In the instructor's notebook, code between a line
``### BEGIN SOLUTION`` and a line ``### END SOLUTION`` (the markers nbgrader uses; in code
cells, at any indentation) is the solution. In the students' version each such region
becomes ``# YOUR CODE HERE`` and ``raise NotImplementedError()`` at the marker's
indentation; everything else is kept, the checks included. In markdown cells a region
becomes ``YOUR ANSWER HERE``.

**What ``assign`` does.** (1) It runs the instructor's notebook top to bottom (in a fresh
Python, in the notebook's folder, solutions in place): every exercise's ``check`` records
the instructor's answer as the reference — as digests — and the run must pass every check
and raise no error. (2) It writes the students' notebook: solutions replaced, every output
and execution count cleared, widget state dropped, and one cell added after the first cell
that imports ``workbench.classroom``, holding ``classroom.load_checks("wbc1:...")``: the
recorded digests and exercise definitions, so the checks work in any notebook front end
with no server extension. (3) It writes the answer key (``<name>.key.json``, mode 0600):
the same check data, the points, the solution regions' code for the teacher, the
instructor notebook's path and the files the assignment needs (copied next to the students'
notebook, given with ``files=``). Nothing is written over an existing file unless
``overwrite=True``.
"""

from __future__ import annotations

import copy
import datetime
import hashlib
import json
import os
import re
import secrets
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass

from workbench.classroom.encoding import ClassroomError, pack
from workbench.classroom.grading import KEY_FORMAT
from workbench.classroom.runner import code_cells
from workbench.files import write_atomic

BEGIN, END = "### BEGIN SOLUTION", "### END SOLUTION"
STUB = ("# YOUR CODE HERE", "raise NotImplementedError()")
MARKDOWN_STUB = "YOUR ANSWER HERE"
CHECKS_CELL_TAG = "classroom-checks"
_IMPORTS_CLASSROOM = re.compile(r"\bclassroom\b")


@dataclass
class Region:
    cell: int
    source: str


def _source(cell) -> str:
    src = cell.get("source", "")
    return "".join(src) if isinstance(src, list) else str(src)


def strip_cell(src: str, *, markdown: bool = False, where: str = "") -> tuple[str, list]:
    """``src`` with every solution region replaced; returns ``(new source, [region code])``."""
    out, regions, current, indent = [], [], None, ""
    for n, line in enumerate(src.split("\n"), 1):
        mark = line.strip()
        if mark == BEGIN:
            if current is not None:
                raise ClassroomError(f"{where}line {n}: {BEGIN} inside another solution "
                                     f"region (missing {END}?)")
            current, indent = [], line[:len(line) - len(line.lstrip())]
            continue
        if mark == END:
            if current is None:
                raise ClassroomError(f"{where}line {n}: {END} without {BEGIN}")
            regions.append("\n".join(current))
            out += [indent + MARKDOWN_STUB] if markdown else [indent + s for s in STUB]
            current = None
            continue
        if current is not None:
            current.append(line)
        else:
            out.append(line)
    if current is not None:
        raise ClassroomError(f"{where}{BEGIN} is never closed by {END}")
    return "\n".join(out), regions


def _as_lines(text: str) -> list:
    lines = text.split("\n")
    return [ln + "\n" for ln in lines[:-1]] + ([lines[-1]] if lines[-1] else [])


def strip_solutions(nb: dict) -> tuple[dict, list]:
    """The students' notebook (a new dict) and the solution regions found."""
    student = copy.deepcopy(nb)
    regions = []
    for i, cell in enumerate(student.get("cells", [])):
        kind = cell.get("cell_type")
        if kind not in ("code", "markdown"):
            continue
        src = _source(cell)
        if BEGIN in src or END in src:
            new, found = strip_cell(src, markdown=kind == "markdown", where=f"cell {i + 1}: ")
            cell["source"] = _as_lines(new)
            regions += [Region(i, r) for r in found]
        if kind == "code":
            cell["outputs"] = []
            cell["execution_count"] = None
        md = cell.get("metadata", {})
        for k in ("execution", "collapsed", "scrolled"):
            md.pop(k, None)
    student.get("metadata", {}).pop("widgets", None)
    return student, regions


def secret_lines(nb: dict, regions: list) -> set:
    """Lines of solution code that appear nowhere else in the instructor's notebook (what
    must not reach a student)."""
    inside = {ln.strip() for r in regions for ln in r.source.split("\n")}
    outside = set()
    for cell in nb.get("cells", []):
        src, _ = strip_cell(_source(cell)) if BEGIN in _source(cell) else (_source(cell), [])
        outside.update(ln.strip() for ln in src.split("\n"))
    return {ln for ln in inside - outside if len(ln) > 3 and not ln.startswith("#")}


def _texts(obj):
    """Every string in a JSON-like object (sources, outputs, metadata)."""
    if isinstance(obj, str):
        yield obj
    elif isinstance(obj, list):
        for x in obj:
            yield from _texts(x)
    elif isinstance(obj, dict):
        for x in obj.values():
            yield from _texts(x)


def leaks(student: dict, secrets_: set) -> list:
    """Solution lines that appear as a line anywhere in the students' notebook (sources,
    outputs, metadata); empty when clean."""
    lines = {ln.strip() for t in _texts(student) for ln in t.split("\n")}
    return sorted(secrets_ & lines)


def _checks_cell(blob: str) -> dict:
    width = 96
    chunks = [blob[i:i + width] for i in range(0, len(blob), width)]
    body = "\n".join(f'    "{c}"' for c in chunks)
    src = ("# The check data for this notebook's exercises: digests of the answers and the\n"
           "# exercises' definitions, made by `workbench assign` (not the answers themselves).\n"
           "# Run this cell; do not edit it.\n"
           "from workbench import classroom\n\n"
           f"classroom.load_checks(\n{body}\n)\n")
    return {"cell_type": "code", "execution_count": None, "id": CHECKS_CELL_TAG,
            "metadata": {"tags": [CHECKS_CELL_TAG], "editable": False},
            "outputs": [], "source": _as_lines(src)}


def record(path: str, *, salt: str, timeout: float = 900) -> dict:
    """Run the instructor's notebook in a fresh Python (``runner``, record mode) in its own
    folder; returns ``{exercise id: reference frame}``."""
    folder = os.path.dirname(os.path.abspath(path))
    with tempfile.TemporaryDirectory(prefix="wb-assign-") as tmp:
        frames_path = os.path.join(tmp, "frames")
        env = dict(os.environ)
        import workbench
        root = os.path.dirname(os.path.dirname(os.path.abspath(workbench.__file__)))
        env["PYTHONPATH"] = os.pathsep.join([root] + [p for p in env.get(
            "PYTHONPATH", "").split(os.pathsep) if p])
        env.setdefault("MPLBACKEND", "Agg")
        env["IPYTHONDIR"] = os.path.join(tmp, "ipython")
        with open(frames_path, "w+b") as frames:
            cmd = [sys.executable, "-m", "workbench.classroom.runner", os.path.abspath(path),
                   "--mode", "record", "--salt", salt, "--frames-fd", str(frames.fileno()),
                   "--stop-on-error"]
            try:
                proc = subprocess.run(cmd, cwd=folder, env=env, stdin=subprocess.DEVNULL,
                                      capture_output=True, pass_fds=(frames.fileno(),),
                                      timeout=timeout)
            except subprocess.TimeoutExpired:
                raise ClassroomError(f"{path}: the instructor's notebook did not finish in "
                                     f"{timeout:g} s") from None
            frames.seek(0)
            lines = frames.read().decode("utf-8").splitlines()
    refs, errors, done = {}, [], False
    for line in lines:
        fr = json.loads(line)
        if fr["type"] == "reference":
            if fr["id"] in refs:
                raise ClassroomError(f"{path}: exercise {fr['id']} is checked more than once; "
                                     f"check each exercise once, with the solution")
            refs[fr["id"]] = fr
        elif fr["type"] == "cell":
            errors.append(fr)
        elif fr["type"] == "done":
            done = True
    if errors or not done:
        out = proc.stdout.decode("utf-8", errors="replace")[-2500:]
        what = (f"cell {errors[0]['index'] + 1} raised {errors[0]['error']}" if errors
                else f"the run stopped (status {proc.returncode}): "
                     f"{proc.stderr.decode('utf-8', errors='replace')[-1500:]}")
        raise ClassroomError(f"{path}: the instructor's notebook must run top to bottom with "
                             f"every check passing; {what}\n--- its output ---\n{out}")
    if not refs:
        raise ClassroomError(f"{path}: no exercise was checked (call exercise.check(answer) "
                             f"in the notebook)")
    return refs


def _same_file(a: str, b: str) -> bool:
    with open(a, "rb") as fa, open(b, "rb") as fb:
        return fa.read() == fb.read()


@dataclass
class Assignment:
    """What :func:`assign` wrote: the students' notebook, the key, the exercises."""

    notebook: str
    key: str
    exercises: list          # [(id, kind, points)]
    files: list

    def __str__(self) -> str:
        pts = sum(p for _, _, p in self.exercises)
        return (f"students' notebook: {self.notebook}\nanswer key:         {self.key} (keep it "
                f"private)\n{len(self.exercises)} exercises, {pts:g} points: "
                + ", ".join(f"{i} ({k}, {p:g})" for i, k, p in self.exercises))

    __repr__ = __str__


def assign(instructor, out_dir, *, files=(), overwrite: bool = False,
           timeout: float = 900) -> Assignment:
    """Make the students' notebook and the answer key from an instructor's notebook (see
    the module docstring). ``files``: paths (relative to the notebook's folder) the
    notebook reads, copied next to the students' notebook and given to every graded run."""
    src = os.path.abspath(os.fspath(instructor))
    out_dir = os.path.abspath(os.fspath(out_dir))
    folder = os.path.dirname(src)
    if os.path.realpath(out_dir) == os.path.realpath(folder):
        raise ClassroomError("the output folder is the instructor's folder: the students' "
                             "notebook would replace the instructor's; choose another folder")
    try:
        with open(src, encoding="utf-8") as f:
            nb = json.load(f)
        code_cells(nb)
    except (OSError, ValueError) as e:
        raise ClassroomError(f"{src}: not a readable notebook ({e})") from None
    name = os.path.basename(src)
    stem = name[:-len(".ipynb")] if name.endswith(".ipynb") else name
    student_path = os.path.join(out_dir, name if name.endswith(".ipynb") else name + ".ipynb")
    key_path = os.path.join(out_dir, stem + ".key.json")
    rel_files = []
    for f in files:
        p = os.path.realpath(os.path.join(folder, f))
        if not p.startswith(os.path.realpath(folder) + os.sep) or not os.path.isfile(p):
            raise ClassroomError(f"{f}: not a file inside {folder}")
        rel_files.append(os.path.relpath(p, os.path.realpath(folder)))
    for p in [student_path, key_path]:
        if os.path.exists(p) and not overwrite:
            raise ClassroomError(f"{p} already exists; pass overwrite=True (--overwrite)")
    for r in rel_files:          # a file several assignments share may already be there
        p = os.path.join(out_dir, r)
        if os.path.exists(p) and not overwrite and not _same_file(p, os.path.join(folder, r)):
            raise ClassroomError(f"{p} already exists (different); pass overwrite=True")
    student, regions = strip_solutions(nb)
    if not regions:
        raise ClassroomError(f"{src}: no solution is marked ({BEGIN} ... {END})")
    where = next((k for k, c in enumerate(student["cells"]) if c.get("cell_type") == "code"
                  and _IMPORTS_CLASSROOM.search(_source(c))), None)
    if where is None:
        raise ClassroomError(f"{src}: no code cell imports workbench.classroom (the check-data "
                             f"cell goes after the first one that does)")
    salt = secrets.token_hex(16)
    refs = record(src, salt=salt, timeout=timeout)
    exercises = {eid: {k: fr[k] for k in ("kind", "points", "title", "prompt", "params",
                                           "data")} for eid, fr in refs.items()}
    blob = pack({"format": 1, "assignment": stem, "salt": salt, "exercises": exercises})
    cell = _checks_cell(blob)
    if nb.get("nbformat_minor", 0) < 5 and nb.get("nbformat", 4) <= 4:
        del cell["id"]                # cell ids came with nbformat 4.5
    elif any(c.get("id") == cell["id"] for c in student["cells"]):
        cell["id"] = f"{CHECKS_CELL_TAG}-{salt[:8]}"
    student["cells"].insert(where + 1, cell)
    found = leaks(student, secret_lines(nb, regions))
    if found:
        raise ClassroomError(f"{src}: solution code also appears outside the solution regions "
                             f"(in a markdown cell or an output?): {found[:3]}")
    student_json = json.dumps(student, indent=1, ensure_ascii=False) + "\n"
    os.makedirs(out_dir, exist_ok=True)
    def write_student(f):
        os.fchmod(f.fileno(), 0o644)
        f.write(student_json.encode("utf-8"))
    write_atomic(student_path, write_student, overwrite=overwrite)
    key = {"format": KEY_FORMAT, "assignment": stem, "notebook": os.path.basename(student_path),
           "source": src, "created": datetime.datetime.now().isoformat(timespec="seconds"),
           "checks": blob, "files": rel_files,
           "exercises": [{"id": eid, "kind": e["kind"], "points": e["points"],
                          "title": e["title"]} for eid, e in exercises.items()],
           "total_points": sum(e["points"] for e in exercises.values()),
           "solutions": [{"cell": r.cell + 1, "source": r.source} for r in regions],
           "student_notebook_sha256": hashlib.sha256(student_json.encode()).hexdigest()}

    def write_key(f):
        os.fchmod(f.fileno(), 0o600)
        f.write(json.dumps(key, indent=1).encode("utf-8"))
    write_atomic(key_path, write_key, overwrite=overwrite)
    for rel in rel_files:
        dst = os.path.join(out_dir, rel)
        os.makedirs(os.path.dirname(dst), exist_ok=True)
        shutil.copyfile(os.path.join(folder, rel), dst)
    return Assignment(student_path, key_path,
                      [(eid, e["kind"], e["points"]) for eid, e in exercises.items()], rel_files)
