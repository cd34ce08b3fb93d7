"""The course in ``notebooks/course/``: its students' versions hold no solution code, its
chapters have 3-6 exercises, and ``workbench assign`` + ``workbench grade`` work on it.

The students' versions and keys are generated here (in a temporary folder), not committed:
they are derived files (a committed copy goes stale the moment a chapter changes), a
students' version raises ``NotImplementedError`` by design (nbval, which runs every notebook
under ``notebooks/``, would fail on it), and a key in the repository would sit next to the
instructor notebooks it is made from anyway. The instructor chapters themselves run under
nbval with their solutions in place, which exercises every check's recording path; here
chapter 1 (value, array, function and model exercises) is built and graded end to end,
chapter 4 (number exercises, integer arrays) is built, and chapter 6 (models made with
``workbench.edit``) is built and its solved version graded.
"""

from __future__ import annotations

import csv
import json
import re
import shutil
from pathlib import Path

import pytest

from workbench.classroom import assign, grade
from workbench.classroom.encoding import unpack
from workbench.classroom.grading import Limits
from workbench.classroom.notebook import leaks, secret_lines, strip_solutions

COURSE = Path(__file__).resolve().parents[2] / "notebooks" / "course"
CHAPTERS = sorted(COURSE.glob("0*.ipynb"))
EXERCISE = re.compile(r"classroom\.(\w+Exercise)\(\s*\"([^\"]+)\"")


def _read(p):
    return json.loads(p.read_text())


def _code(nb):
    return ["".join(c["source"]) for c in nb["cells"] if c["cell_type"] == "code"]


def test_six_chapters():
    assert [p.name[:2] for p in CHAPTERS] == ["01", "02", "03", "04", "05", "06"]


@pytest.mark.parametrize("path", CHAPTERS, ids=[p.stem for p in CHAPTERS])
def test_students_version_has_no_solution_code(path):
    nb = _read(path)
    student, regions = strip_solutions(nb)
    exercises = [m.group(2) for src in _code(nb) for m in EXERCISE.finditer(src)]
    assert 3 <= len(exercises) <= 6, exercises
    assert len(set(exercises)) == len(exercises)
    assert all(e.startswith(path.name[1] + ".") for e in exercises)   # "1.1" in chapter 01
    assert len(regions) >= len(exercises)
    secrets = secret_lines(nb, regions)
    assert secrets and not leaks(student, secrets)
    text = json.dumps(student)
    assert "### BEGIN SOLUTION" not in text and "### END SOLUTION" not in text
    assert sum(src.count("raise NotImplementedError()") for src in _code(student)) == \
        len(regions)
    assert all(not c.get("outputs") for c in student["cells"] if c["cell_type"] == "code")


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    out = tmp_path_factory.mktemp("course") / "release"
    ch1 = assign(COURSE / "01_what_is_an_onnx_model.ipynb", out)
    ch4 = assign(COURSE / "04_quantization.ipynb", out)
    return out, ch1, ch4


def test_built_chapters_hide_their_answers(built):
    out, *chapters = built
    for a in chapters:
        src = _read(Path(json.loads(Path(a.key).read_text())["source"]))
        student = _read(Path(a.notebook))
        _, regions = strip_solutions(src)
        assert not leaks(student, secret_lines(src, regions))
        checks = unpack(json.loads(Path(a.key).read_text())["checks"])
        assert [e for e, _, _ in a.exercises] == list(checks["exercises"])
        for eid, spec in checks["exercises"].items():
            # what is stored of a reference answer is digests: no array, model or bytes
            data = json.dumps(spec["data"])
            assert not any(tag in data for tag in ("__nd__", "__onnx__", "__bytes__")), eid
            if spec["kind"] == "model":       # its definition holds the inputs, not a model
                assert "__onnx__" not in json.dumps(spec["params"]), eid


def test_chapter_one_grades_full_and_empty(built, tmp_path):
    out, ch1, _ = built
    subs = tmp_path / "subs"
    subs.mkdir()
    shutil.copy(COURSE / "01_what_is_an_onnx_model.ipynb", subs / "solved.ipynb")
    shutil.copy(ch1.notebook, subs / "blank.ipynb")
    grade(subs, ch1.key, tmp_path / "out", limits=Limits(timeout=120), jobs=2)
    rows = {r["student"]: r for r in csv.DictReader((tmp_path / "out" / "grades.csv").open())}
    assert rows["solved"]["total"] == rows["solved"]["max"] == "8"
    assert rows["blank"]["total"] == "0"


def test_chapter_six_grades_its_edited_models(tmp_path):
    # the references are models made with workbench.edit in the assigning process; the
    # grader's fresh process must make the same ones (no random names, no timestamps)
    ch6 = assign(COURSE / "06_editing_a_model.ipynb", tmp_path / "release")
    subs = tmp_path / "subs"
    subs.mkdir()
    shutil.copy(COURSE / "06_editing_a_model.ipynb", subs / "solved.ipynb")
    grade(subs, ch6.key, tmp_path / "out", limits=Limits(timeout=120), jobs=1)
    rows = list(csv.DictReader((tmp_path / "out" / "grades.csv").open()))
    assert [(r["student"], r["status"], r["total"], r["max"]) for r in rows] == \
        [("solved", "ok", "5", "5")]
