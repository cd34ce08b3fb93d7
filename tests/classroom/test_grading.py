"""``workbench assign`` and ``workbench grade`` on a folder of fabricated submissions.

One small assignment (four exercises: value, array, function, model) is made once; the
submissions are graded in one run with short limits: correct, partly wrong, crashing,
unanswered, an endless loop, a sleeper, a memory hog, and hostile code that tries to read the
key and the other students' files, reach the network, write outside its folder, kill the
grader and forge its score. Sandboxed grading needs Linux namespaces (``unshare``); where
they are missing the hostile test is skipped and the fallback is tested instead.
"""

from __future__ import annotations

import csv
import json
import os
import socket
import threading
from pathlib import Path

import pytest

from tests.classroom import assignment as A
from workbench.classroom import assign, grade
from workbench.classroom.encoding import ClassroomError, unpack
from workbench.classroom.grading import Limits, find_submissions, probe_isolation, read_frames

ROOT = Path(__file__).resolve().parents[2]
LIMITS = Limits(timeout=20, cpu=10, memory="2GiB")


@pytest.fixture(scope="module")
def released(tmp_path_factory):
    base = tmp_path_factory.mktemp("classroom")
    src = base / "teacher" / "tiny.ipynb"
    src.parent.mkdir()
    src.write_text(json.dumps(A.instructor()))
    a = assign(src, base / "release")
    return base, a


@pytest.fixture(scope="module")
def listener():
    """A TCP server on 127.0.0.1 that records whether anybody connected."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(5)
    srv.settimeout(0.2)
    hits = []
    stop = threading.Event()

    def loop():
        while not stop.is_set():
            try:
                conn, _ = srv.accept()
                hits.append(1)
                conn.close()
            except OSError:
                pass
    t = threading.Thread(target=loop, daemon=True)
    t.start()
    yield srv.getsockname()[1], hits
    stop.set()
    t.join()
    srv.close()


def test_assign_writes_student_notebook_and_private_key(released):
    base, a = released
    student = json.loads(Path(a.notebook).read_text())
    text = Path(a.notebook).read_text()
    for secret in A.SECRETS:
        assert secret not in text
    assert "raise NotImplementedError()" in text
    assert all(c.get("outputs", []) == [] for c in student["cells"] if c["cell_type"] == "code")
    key = json.loads(Path(a.key).read_text())
    assert oct(os.stat(a.key).st_mode & 0o777) == "0o600"
    assert [e["id"] for e in key["exercises"]] == ["q1", "q2", "q3", "q4"]
    assert key["total_points"] == 6
    assert any(A.SECRETS[0] in s["source"] for s in key["solutions"])
    # the check data in the students' notebook is the key's, and holds no answer in clear
    cell = next(c for c in student["cells"] if "classroom-checks" in c["metadata"].get("tags", []))
    assert key["checks"].replace("wbc1:", "")[:90] in "".join(cell["source"])
    data = json.dumps(unpack(key["checks"]))
    assert "42" not in [x.strip('",:') for x in data.split()]
    assert "Relu" not in data and "log1p" not in data


def test_assign_refuses_to_overwrite_and_bad_markers(released, tmp_path):
    base, a = released
    with pytest.raises(ClassroomError, match="already exists"):
        assign(base / "teacher" / "tiny.ipynb", base / "release")
    bad = tmp_path / "bad.ipynb"
    bad.write_text(json.dumps(A.notebook([A.SETUP, "### BEGIN SOLUTION\nx = 1\n"])))
    with pytest.raises(ClassroomError, match="never closed"):
        assign(bad, tmp_path / "out")
    wrong = tmp_path / "wrong.ipynb"      # an instructor's answer that fails its own check
    wrong.write_text(json.dumps(A.notebook([A.SETUP, A.Q1.replace(
        "q1.check(answer1)", "q1.check(answer1)\nq1.check(7)")])))
    with pytest.raises(ClassroomError, match="more than once"):
        assign(wrong, tmp_path / "out2")


@pytest.fixture(scope="module")
def graded(released, listener, tmp_path_factory):
    base, a = released
    sandboxed = probe_isolation().mode == "namespaces"
    port, hits = listener
    student = json.loads(Path(a.notebook).read_text())
    subs = base / "submissions"
    out = base / "results"
    subs.mkdir()
    subs_json = {
        "alice": A.fill(student, []),
        "bob": A.fill(student, ["answer1 = 41", A.SOLUTIONS[1], "return np.exp(v)",
                                A.SOLUTIONS[3].replace('"Relu"', '"Sigmoid"')]),
        "carol": A.fill(student, [A.SOLUTIONS[0], "answer2 = 1 / 0"]),
        "erin": student,
        "frank": A.fill(student, [A.SOLUTIONS[0], A.SLEEPER]),
        "gina": A.fill(student, [A.SOLUTIONS[0], A.MEMORY_HOG]),
    }
    if sandboxed:         # without a sandbox the hostile notebook would do what it tries
        subs_json["mallory"] = A.hostile(student, key=a.key, subs=str(subs), out=str(out),
                                         repo=str(ROOT), port=port, grader=os.getpid())
    for name, nb in subs_json.items():
        (subs / f"{name}.ipynb").write_text(json.dumps(nb))
    (subs / "zed").mkdir()                              # a folder without a notebook
    (subs / "xavier.ipynb").write_text("{not json")
    rep = grade(subs, a.key, out, limits=LIMITS, jobs=3)
    rows = {r["student"]: r for r in csv.DictReader((out / "grades.csv").open())}
    return rep, rows, out, subs, hits, sandboxed


def test_scores(graded):
    rep, rows, out, subs, hits, sandboxed = graded
    total = {k: float(r["total"]) for k, r in rows.items()}
    assert total["alice"] == 6
    assert rows["alice"]["status"] == "ok"
    assert (rows["bob"]["q1"], rows["bob"]["q2"], rows["bob"]["q3"], rows["bob"]["q4"]) == \
        ("0", "2", "0", "0")
    assert total["carol"] == 4 and rows["carol"]["q2"] == "0"     # the crash costs q2 only
    assert total["erin"] == 0                                       # nothing answered
    assert total["xavier"] == 0 and "not a readable notebook" in rows["xavier"]["status"]
    assert "no notebook" in rows["zed"]["status"]


def test_feedback_is_specific(graded):
    rep, rows, out, subs, hits, sandboxed = graded
    bob = (out / "feedback" / "bob.md").read_text()
    assert "41 is not the expected number" in bob
    assert "'relu' (Sigmoid)" in bob and "first node of your graph that goes wrong" in bob
    assert "case 1" in bob
    carol = (out / "feedback" / "carol.md").read_text()
    assert "ZeroDivisionError" in carol
    for secret in A.SECRETS:
        for f in (out / "feedback").iterdir():
            assert secret not in f.read_text()


def test_limits_stop_endless_sleeping_and_hungry_notebooks(graded):
    rep, rows, out, subs, hits, sandboxed = graded
    assert "time limit" in rows["frank"]["status"] and rows["frank"]["q1"] == "1"
    gina = (out / "logs" / "gina.txt").read_text()
    assert "HOG MemoryError on 6 GiB" in gina
    assert "HOG MemoryError after" in gina
    assert rows["gina"]["status"] == "ok" and float(rows["gina"]["total"]) == 6


def test_cpu_limit_stops_an_endless_loop(released, tmp_path):
    """Alone, with a wall-clock limit far above the CPU limit (a busy machine gives a loop
    a small share of a core): the CPU limit ends it, the answer before it counts."""
    base, a = released
    subs = tmp_path / "subs"
    subs.mkdir()
    student = json.loads(Path(a.notebook).read_text())
    (subs / "dave.ipynb").write_text(json.dumps(A.fill(student, [A.SOLUTIONS[0], A.ENDLESS])))
    rep = grade(subs, a.key, tmp_path / "out", limits=Limits(timeout=120, cpu=2,
                                                             memory="2GiB"))
    dave = rep.students[0]
    assert "CPU time limit (2 s)" in dave.status, dave.status
    assert dave.points["q1"] == 1 and dave.total == 1
    assert dave.seconds < 100


def test_hostile_submission_is_contained(graded):
    rep, rows, out, subs, hits, sandboxed = graded
    if not sandboxed:
        pytest.skip("no sandbox here (Linux namespaces unavailable): " +
                    rep.isolation.describe())
    log = (out / "logs" / "mallory.txt").read_text()
    assert "HOSTILE done" in log, log[-3000:]
    for attack in ("read-key", "list-key-folder", "find-keys", "read-other-student",
                   "list-submissions", "network-local", "network-outside",
                   "write-submissions", "write-out", "write-repo", "write-home",
                   "kill-grader", "become-root", "read-shadow"):
        assert f"HOSTILE {attack}: blocked" in log, (attack, log[-3000:])
    for secret in A.SECRETS:
        assert secret not in log
    assert not hits, "the sandbox reached a server on the grader's 127.0.0.1"
    assert not (subs / "pwned.txt").exists() and not (ROOT / "pwned.txt").exists()
    assert not Path("/tmp/wb-hostile-marker").exists()   # its /tmp was private
    assert float(rows["mallory"]["total"]) == 0            # forged frames/score ignored
    data = json.loads((out / "grades.json").read_text())
    assert "namespaces" in data["isolation"]
    mallory = next(s for s in data["students"] if s["student"] == "mallory")
    assert "q2" in mallory["results"] and not mallory["results"]["q2"]["passed"]


def test_reports_are_not_overwritten(graded, released):
    rep, rows, out, subs, hits, sandboxed = graded
    with pytest.raises(ClassroomError, match="already holds grades.csv"):
        grade(subs, released[1].key, out)


def test_grading_without_isolation_still_grades(released, tmp_path):
    """The fallback (no namespaces): resource limits and a throwaway folder only; it says so."""
    base, a = released
    student = json.loads(Path(a.notebook).read_text())
    subs = tmp_path / "subs"
    subs.mkdir()
    (subs / "alice.ipynb").write_text(json.dumps(A.fill(student, [])))
    rep = grade(subs, a.key, tmp_path / "out", limits=LIMITS, isolation="none")
    assert rep.students[0].total == 6
    assert "NONE" in rep.isolation.describe()


def test_read_frames_ignores_garbage(tmp_path):
    p = tmp_path / "frames"
    p.write_bytes(b'{"type":"answer","id":"q1","answer":1}\nnot json\n[1,2]\n'
                  b'{"type":"score","points":99}\n{"type":"answer","id":"q1","answer":2}\n'
                  b'{"type":"cell","index":3,"error":"boom"}\n{"type":"done"}\n')
    with p.open("rb") as f:
        res = read_frames(f, limit=1 << 20)
    assert res["answers"]["q1"]["answer"] == 2 and res["done"]
    assert res["cells"] == [{"index": 3, "error": "boom"}]


def test_find_submissions(tmp_path):
    (tmp_path / "a.ipynb").write_text("{}")
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / "x.ipynb").write_text("{}")
    (tmp_path / "b" / "tiny.ipynb").write_text("{}")
    (tmp_path / ".hidden.ipynb").write_text("{}")
    found = find_submissions(str(tmp_path), "tiny.ipynb")
    assert [(s, Path(p).name if p else None) for s, p, _ in found] == \
        [("a", "a.ipynb"), ("b", "tiny.ipynb")]


def test_command_line(released, tmp_path, capsys):
    from workbench.cli import main
    base, a = released
    subs = tmp_path / "subs"
    subs.mkdir()
    (subs / "alice.ipynb").write_text(json.dumps(A.fill(json.loads(Path(a.notebook)
                                                                     .read_text()), [])))
    assert main(["grade", str(subs), "--key", a.key, "--out", str(tmp_path / "out"),
                 "--timeout", "60", "--memory", "2GiB"]) == 0
    assert "alice                         6 / 6  ok" in capsys.readouterr().out
    assert main(["grade", str(subs), "--key", str(tmp_path / "nope.json"), "--out",
                 str(tmp_path / "o2")]) == 2
    assert "cannot read the answer key" in capsys.readouterr().err
    assert main(["assign", str(tmp_path / "missing.ipynb"), "--out", str(tmp_path / "rel")]) == 2
    assert "not a readable notebook" in capsys.readouterr().err
