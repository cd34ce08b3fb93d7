"""Grading a folder of submitted notebooks: ``workbench grade SUBMISSIONS --key KEY --out OUT``.

>>> from workbench.classroom import grade                            # doctest: +SKIP
>>> report = grade("submissions/", "release/ch1.key.json", "results/")
>>> print(report)                                                  # doctest: +SKIP

Each submission (``SUBMISSIONS/<student>.ipynb``, or ``SUBMISSIONS/<student>/<notebook>``)
runs in its own sandboxed process (:mod:`.sandbox`: time and memory limits, no network,
a throwaway folder, the key and the other submissions out of sight). The notebook's checks
hand their answers to the grader as data; the grader, which alone holds the key, checks
them: value, number, array and function answers in this process (digest arithmetic on
bounded, pickle-free data), model answers in a separate, limited process (running a model
someone else built is work for the engine, and a hostile model must not stall the grading).
A submission can therefore not grade itself: what it prints, the files it writes and the
scores it claims are never read.

Writes ``OUT/grades.csv`` (one row per student: status, points per exercise, total),
``OUT/grades.json`` (the same, with every message) and ``OUT/feedback/<student>.md``.
"""

from __future__ import annotations

import concurrent.futures
import csv
import datetime
import io
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field

from workbench.classroom import exercise as ex
from workbench.classroom import sandbox
from workbench.classroom.encoding import (
    MAX_ITEM_BYTES,
    ClassroomError,
    decode,
    unpack,
)
from workbench.files import write_atomic

KEY_FORMAT = "workbench-classroom-key/1"
MAX_NOTEBOOK_BYTES = 64 << 20
MODEL_KINDS = ("model", "classifier")
LOG_TAIL = 64 << 10           # bytes of a notebook's printed output kept in OUT/logs/


def parse_size(v) -> int | None:
    """``"4GiB"``, ``"512M"``, ``"100k"``, an int (bytes) or None."""
    if v is None or isinstance(v, int):
        return v
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([kKmMgGtT]?)(i?[bB])?\s*", str(v))
    if not m:
        raise ClassroomError(f"not a size: {v!r} (e.g. 4GiB, 512M)")
    mult = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}[m.group(2).lower()]
    return int(float(m.group(1)) * mult)


@dataclass
class Limits:
    """Per submission: ``timeout`` (wall seconds, the sandbox's start included), ``cpu``
    (CPU seconds; default the timeout), ``memory`` (address space), ``output`` (largest file
    written, frames and log included), ``processes``, ``tmp`` (size of the private /tmp)."""

    timeout: float = 300
    cpu: float | None = None
    memory: int | str | None = "4GiB"
    output: int | str | None = "64MiB"
    processes: int | None = 256
    tmp: str = "512m"

    def rlimits(self) -> dict:
        return {"memory": parse_size(self.memory), "output": parse_size(self.output),
                "cpu": int(self.cpu if self.cpu is not None else self.timeout) + 1,
                "processes": self.processes}


# ----------------------------------------------------------------------------- isolation
@dataclass
class Isolation:
    mode: str                       # "namespaces" or "none"
    uid: int | None = None          # the uid the notebooks run as (None: the grader's)
    notes: list = field(default_factory=list)

    def describe(self) -> str:
        if self.mode == "namespaces":
            who = "user nobody" if self.uid is not None else (
                f"the grader's own user (uid {os.geteuid()}) without capabilities: it can "
                f"read what that user can read outside the hidden folders")
            text = (f"namespaces (no network, private /tmp, read-only file system, key and "
                    f"submissions hidden), {who}, resource limits")
        else:
            text = ("NONE for network and files: resource limits and a throwaway folder only; "
                    "a submission can reach the network and read what the grading user can "
                    "read (the key is still never given to it)")
        return text + ("" if not self.notes else " [" + "; ".join(self.notes) + "]")


_ISOLATION: Isolation | None = None


def probe_isolation(*, refresh: bool = False) -> Isolation:
    """What this machine allows: a trial run of the sandbox, as nobody when root."""
    global _ISOLATION
    if _ISOLATION is not None and not refresh:
        return _ISOLATION
    notes = []
    if not sys.platform.startswith("linux"):
        _ISOLATION = Isolation("none", notes=[f"{sys.platform} has no Linux namespaces"])
        return _ISOLATION
    if not sandbox.shutil.which("unshare"):
        _ISOLATION = Isolation("none", notes=["`unshare` (util-linux) is not installed"])
        return _ISOLATION
    root = os.geteuid() == 0
    tries = [(sandbox.NOBODY, sandbox.NOBODY)] if root else []
    tries.append((None, None))
    for uid, _gid in tries:
        with tempfile.TemporaryDirectory(prefix="wb-grade-probe-") as tmp:
            res = _run_sandbox(tmp, None, {}, Limits(timeout=60, memory="8GiB"),
                               Isolation("namespaces", uid), [], probe=True)
        if res["done"]:
            _ISOLATION = Isolation("namespaces", uid, notes=res["sandbox_notes"])
            return _ISOLATION
        notes.append(f"namespaces {'as nobody' if uid is not None else 'in a user namespace'}"
                     f" failed: {res['failure'] or res['log_tail'][-300:]}")
    _ISOLATION = Isolation("none", notes=notes)
    return _ISOLATION


def _run_sandbox(stage: str, notebook: str | None, files: dict, limits: Limits,
                 iso: Isolation, hide: list, *, checks: str | None = None,
                 probe: bool = False) -> dict:
    """Run one sandbox in ``stage`` (a private folder); returns what came back."""
    work = os.path.join(stage, "work")
    os.makedirs(work, exist_ok=True)
    for rel, data in files.items():
        p = os.path.join(work, rel)
        os.makedirs(os.path.dirname(p), exist_ok=True)
        with open(p, "wb") as f:
            f.write(data)
    ns = iso.mode == "namespaces"
    root = os.geteuid() == 0
    expose = []
    if ns and iso.uid is not None:
        groups: dict = {}
        for p in sandbox.needed_paths():
            a = sandbox.blocking_ancestor(p)
            if a is not None:
                groups.setdefault(a, []).append(p)
        expose = [{"mask": a, "paths": ps} for a, ps in groups.items()]
    workdir = sandbox.WORK if ns else work
    spec = {"workdir": work, "notebook": notebook, "namespaces": ns, "hide": hide,
            "expose": expose, "needed": sandbox.needed_paths() if ns else [],
            "uid": iso.uid, "gid": iso.uid, "limits": limits.rlimits(), "tmp_size": limits.tmp,
            "env": sandbox.limits_env("{WORK}"), "checks": checks, "probe": probe}
    if not ns and iso.uid is not None:
        for dirpath, dirs, names in os.walk(work):
            for n in [dirpath] + [os.path.join(dirpath, x) for x in dirs + names]:
                os.chown(n, iso.uid, iso.uid)
    frames_path = os.path.join(stage, "frames")
    log_path = os.path.join(stage, "log")
    spec_path = os.path.join(stage, "spec.json")
    with open(frames_path, "w+b") as frames, open(log_path, "w+b") as log:
        spec["frames_fd"] = frames.fileno()
        with open(spec_path, "w") as f:
            json.dump(spec, f)
        os.chmod(spec_path, 0o600)
        cmd = sandbox.command(spec_path, namespaces=ns, root=root)
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LANG": "C.UTF-8",
               "PYTHONPATH": sandbox.limits_env("")["PYTHONPATH"]}
        t0 = time.monotonic()
        proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=log,
                                stderr=subprocess.STDOUT, pass_fds=(frames.fileno(),),
                                cwd=workdir if not ns else stage, env=env,
                                start_new_session=True)
        timed_out = False
        try:
            proc.wait(timeout=limits.timeout)
        except subprocess.TimeoutExpired:
            timed_out = True
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            proc.wait()
        seconds = time.monotonic() - t0
        res = read_frames(frames, limit=(parse_size(limits.output) or MAX_ITEM_BYTES) + 4096)
        log.seek(0, os.SEEK_END)
        size = log.tell()
        log.seek(max(0, size - LOG_TAIL))
        res["log_tail"] = log.read().decode("utf-8", errors="replace")
    res.update(returncode=proc.returncode, timed_out=timed_out, seconds=seconds)
    res["failure"] = _failure(res, limits)
    return res


def read_frames(f, *, limit: int) -> dict:
    """Parse the frames a sandbox wrote: the last answer per exercise, cell errors, whether
    the run finished. Malformed lines are skipped; nothing here is trusted beyond its type."""
    f.seek(0)
    data = f.read(limit + 1)[:limit]
    out = {"answers": {}, "cells": [], "done": False, "sandbox_notes": [], "exit_signal": None,
           "runner_error": None, "sandbox_error": None}
    for line in data.split(b"\n"):
        if not line.strip():
            continue
        try:
            fr = json.loads(line)
        except (ValueError, RecursionError):      # garbage, or nested beyond reason
            continue
        if not isinstance(fr, dict):
            continue
        t = fr.get("type")
        if t == "answer" and isinstance(fr.get("id"), str):
            out["answers"][fr["id"]] = fr
        elif t == "cell":
            out["cells"].append({"index": fr.get("index"), "error": str(fr.get("error"))[:500]})
        elif t == "done":
            out["done"] = True
        elif t == "sandbox":
            if fr.get("error"):
                out["sandbox_error"] = str(fr["error"])[:500]
            elif isinstance(fr.get("notes"), list) and not out["sandbox_notes"]:
                out["sandbox_notes"] = [str(n)[:200] for n in fr["notes"][:20]]
        elif t == "exit" and isinstance(fr.get("signal"), int):
            out["exit_signal"] = fr["signal"]
        elif t == "runner":
            out["runner_error"] = str(fr.get("error"))[:500]
    return out


def _failure(res: dict, limits: Limits) -> str | None:
    if res["done"]:
        return None
    if res["timed_out"]:
        return f"stopped: the time limit ({limits.timeout:g} s) was reached"
    sig = res["exit_signal"]
    rc = res["returncode"]
    if sig is None and rc is not None and rc > 128:
        sig = rc - 128
    if sig is None and rc is not None and rc < 0:
        sig = -rc
    if sig in (signal.SIGXCPU, signal.SIGKILL) and res.get("seconds", 0) >= 0:
        if sig == signal.SIGXCPU or res["seconds"] >= (limits.cpu or limits.timeout):
            return f"stopped: the CPU time limit ({limits.cpu or limits.timeout:g} s) was reached"
    if sig == signal.SIGXFSZ:
        return f"stopped: it wrote more than the output limit ({limits.output})"
    if res["sandbox_error"]:
        return f"the sandbox could not start: {res['sandbox_error']}"
    if res["runner_error"]:
        return f"the notebook could not be run: {res['runner_error']}"
    if sig is not None:
        name = signal.Signals(sig).name if sig in signal.Signals._value2member_map_ else sig
        return f"the notebook's process was killed ({name}); the memory limit " \
               f"({limits.memory}) may have been exceeded"
    return f"the notebook's process ended early (exit status {rc})"


# ----------------------------------------------------------------------------- the key
def load_key(path) -> dict:
    path = os.fspath(path)
    try:
        with open(path, encoding="utf-8") as f:
            key = json.load(f)
    except OSError as e:
        raise ClassroomError(f"cannot read the answer key {path}: {e.strerror}") from None
    except ValueError as e:
        raise ClassroomError(f"{path} is not an answer key (not JSON: {e})") from None
    if not isinstance(key, dict) or key.get("format") != KEY_FORMAT:
        raise ClassroomError(f"{path} is not an answer key made by `workbench assign` "
                             f"(format {KEY_FORMAT!r})")
    checks = unpack(key["checks"])
    key["_checks"] = checks
    key["_path"] = os.path.abspath(path)
    return key


# ----------------------------------------------------------------------------- submissions
def find_submissions(folder: str, notebook: str) -> list:
    """``[(student, path or None, problem or None)]`` for ``folder/<student>.ipynb`` and
    ``folder/<student>/*.ipynb`` (the one named like the assignment, or the only one)."""
    out = []
    for name in sorted(os.listdir(folder)):
        if name.startswith("."):
            continue
        p = os.path.join(folder, name)
        if os.path.isfile(p) and name.endswith(".ipynb"):
            out.append((name[:-len(".ipynb")], p, None))
        elif os.path.isdir(p):
            nbs = sorted(n for n in os.listdir(p) if n.endswith(".ipynb") and
                         not n.startswith(".") and os.path.isfile(os.path.join(p, n)))
            if notebook in nbs:
                out.append((name, os.path.join(p, notebook), None))
            elif len(nbs) == 1:
                out.append((name, os.path.join(p, nbs[0]), None))
            elif not nbs:
                out.append((name, None, "no notebook in the folder"))
            else:
                out.append((name, None, f"several notebooks and none named {notebook}: "
                                        f"{', '.join(nbs[:5])}"))
    return out


def _safe_name(name: str, used: set) -> str:
    base = re.sub(r"[^A-Za-z0-9._-]", "_", name)[:64].lstrip(".") or "student"
    out, k = base, 1
    while out.lower() in used:
        k += 1
        out = f"{base}-{k}"
    used.add(out.lower())
    return out


# ----------------------------------------------------------------------------- checking
def _check_answers(key: dict, answers: dict, models: ModelChecker) -> dict:
    """``{exercise id: CheckResult}`` for every exercise of the key."""
    checks = key["_checks"]
    salt = str(checks.get("salt", ""))
    results = {}
    for eid, spec in checks["exercises"].items():
        spec = dict(spec, id=eid)
        fr = answers.get(eid)
        if fr is None:
            results[eid] = ex.CheckResult(eid, False, 0.0, [
                "no answer was handed in: its check cell did not run (an error before it, "
                "or the cell was changed or deleted)"], title=spec.get("title", ""))
            continue
        if "error" in fr:
            results[eid] = ex.CheckResult(eid, False, 0.0, [str(fr["error"])[:500]],
                                          title=spec.get("title", ""))
            continue
        if spec["kind"] in MODEL_KINDS:
            results[eid] = models.check(spec, fr.get("answer"), salt)
            continue
        results[eid] = _decode_and_check(spec, fr.get("answer"), salt)
    return results


def _decode_and_check(spec: dict, answer, salt: str) -> ex.CheckResult:
    """Decode a handed-in answer (pickle-free, size-checked) and check it; a malformed
    answer fails, it never stops the grading."""
    try:
        prepared = decode(answer, limit=MAX_ITEM_BYTES)
        if not isinstance(prepared, dict):
            raise ClassroomError("malformed answer")
    except (ClassroomError, RecursionError, TypeError, ValueError) as e:
        return ex.CheckResult(spec["id"], False, 0.0, [f"the answer could not be read: {e}"],
                              title=spec.get("title", ""))
    try:
        return ex.check_prepared(spec, prepared, salt)
    except Exception as e:   # noqa: BLE001 - whatever a forged answer makes the check do
        return ex.CheckResult(spec["id"], False, 0.0,
                              [f"the answer could not be checked ({type(e).__name__}: "
                               f"{str(e)[:200]})"], title=spec.get("title", ""))


class ModelChecker:
    """Checks model answers in a separate process with memory and CPU limits: running a
    model someone else built is work for the engine, and a hostile model must not stall or
    crash the grader. No student code runs there (only the handed-in ONNX models, with the
    engine). The process serves one answer at a time and is replaced after a timeout or a
    crash, which then costs only the answer that caused it."""

    def __init__(self, limits: Limits):
        self.limits = limits
        self.proc = None
        self.lock = threading.Lock()

    def _start(self):
        lim = self.limits.rlimits()
        arg = json.dumps({"memory": lim["memory"], "cpu": None})
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "workbench.classroom.grading", "--serve-models", arg],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
            env={**os.environ, "OPENBLAS_NUM_THREADS": "1", "WORKBENCH_OFFLINE": "1"})

    def close(self) -> None:
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait()
            self.proc = None

    def check(self, spec: dict, answer, salt: str) -> ex.CheckResult:
        with self.lock:
            return self._check(spec, answer, salt)

    def _check(self, spec, answer, salt) -> ex.CheckResult:
        eid = spec["id"]
        if self.proc is None or self.proc.poll() is not None:
            self._start()
        line = json.dumps({"spec": spec, "answer": answer, "salt": salt}) + "\n"
        reply: list = []

        def talk():
            try:
                self.proc.stdin.write(line.encode("utf-8"))
                self.proc.stdin.flush()
                reply.append(self.proc.stdout.readline())
            except OSError:
                pass
        t = threading.Thread(target=talk, daemon=True)
        t.start()
        t.join(self.limits.timeout)
        try:
            r = json.loads(reply[0]) if reply and reply[0] else None
        except ValueError:
            r = None
        if r is None:
            why = (f"took longer than {self.limits.timeout:g} s" if t.is_alive() else
                   "crashed the checking process (too big, or malformed?)")
            self.close()
            return ex.CheckResult(eid, False, 0.0, [f"checking your model {why}"],
                                  title=spec.get("title", ""))
        return ex.CheckResult(eid, bool(r["passed"]), float(r["fraction"]),
                              [str(m) for m in r["messages"]], title=spec.get("title", ""))


def _serve_models(limits_json: str) -> int:
    sandbox.set_limits(json.loads(limits_json))
    for line in sys.stdin:
        try:
            job = json.loads(line)
            spec = dict(job["spec"])
            r = _decode_and_check(spec, job["answer"], job["salt"]).to_dict()
        except Exception as e:  # noqa: BLE001 - a reply for every request
            r = {"passed": False, "fraction": 0.0,
                 "messages": [f"the answer could not be checked ({type(e).__name__})"]}
        sys.stdout.write(json.dumps(r) + "\n")
        sys.stdout.flush()
    return 0


# ----------------------------------------------------------------------------- reports
@dataclass
class StudentResult:
    student: str
    file: str | None
    results: dict                 # exercise id -> CheckResult
    points: dict                  # exercise id -> points earned
    status: str                   # "ok" or what stopped the run
    cell_errors: list
    seconds: float = 0.0
    log: str = ""

    @property
    def total(self) -> float:
        return round(sum(self.points.values()), 4)


@dataclass
class GradeReport:
    assignment: str
    exercises: list               # [(id, points)]
    students: list                # [StudentResult]
    isolation: Isolation
    out: str

    @property
    def max_points(self) -> float:
        return sum(p for _, p in self.exercises)

    def __str__(self) -> str:
        lines = [f"Graded {len(self.students)} submission(s) of {self.assignment} "
                 f"({self.max_points:g} points) -> {self.out}",
                 f"isolation: {self.isolation.describe()}"]
        for s in self.students:
            lines.append(f"  {s.student:24s} {s.total:6g} / {self.max_points:g}  {s.status}")
        return "\n".join(lines)

    __repr__ = __str__


def _csv_cell(v):
    if isinstance(v, str) and v[:1] in ("=", "+", "-", "@", "\t", "\r"):
        return "'" + v          # a spreadsheet must not read a student's name as a formula
    return v


def _feedback(rep: GradeReport, s: StudentResult, spec_of: dict) -> str:
    lines = [f"# {rep.assignment}: feedback for {s.student}", "",
             f"**Score: {s.total:g} / {rep.max_points:g}**", ""]
    if s.status != "ok":
        lines += [f"Your notebook did not run to the end: {s.status}. Exercises after that "
                  f"point got no points.", ""]
    for eid, pts in rep.exercises:
        r = s.results[eid]
        title = spec_of[eid].get("title")
        lines.append(f"## Exercise {eid}" + (f" — {title}" if title else "") +
                     f": {s.points[eid]:g} / {pts:g}")
        lines.append("")
        lines.append("Correct." if r.passed else
                     "Not correct" + (f" ({r.fraction:.0%} of it right)." if r.fraction else "."))
        lines += [f"- {m}" for m in r.messages]
        lines.append("")
    if s.cell_errors:
        lines += ["## Cells that raised an error", ""]
        lines += [f"- cell {c['index'] + 1 if isinstance(c['index'], int) else '?'}: "
                  f"`{c['error']}`" for c in s.cell_errors[:20]]
        lines.append("")
    return "\n".join(lines)


def write_reports(rep: GradeReport, key: dict, *, overwrite: bool) -> None:
    os.makedirs(os.path.join(rep.out, "feedback"), exist_ok=True)
    os.makedirs(os.path.join(rep.out, "logs"), exist_ok=True)
    ids = [eid for eid, _ in rep.exercises]
    spec_of = key["_checks"]["exercises"]
    buf = io.StringIO()
    w = csv.writer(buf)
    w.writerow(["student", "file", "status"] + ids + ["total", "max"])
    for s in rep.students:
        w.writerow([_csv_cell(s.student), _csv_cell(os.path.basename(s.file or "")),
                    _csv_cell(s.status)] + [f"{s.points[e]:g}" for e in ids] +
                   [f"{s.total:g}", f"{rep.max_points:g}"])
    write_atomic(os.path.join(rep.out, "grades.csv"),
                 lambda f: f.write(buf.getvalue().encode("utf-8")), overwrite=overwrite)
    data = {"assignment": rep.assignment, "graded": datetime.datetime.now().isoformat(
        timespec="seconds"), "isolation": rep.isolation.describe(),
        "exercises": [{"id": e, "points": p} for e, p in rep.exercises],
        "students": [{"student": s.student, "file": s.file, "status": s.status,
                      "seconds": round(s.seconds, 1), "total": s.total,
                      "points": s.points, "cell_errors": s.cell_errors,
                      "results": {e: r.to_dict() for e, r in s.results.items()}}
                     for s in rep.students]}
    write_atomic(os.path.join(rep.out, "grades.json"),
                 lambda f: f.write(json.dumps(data, indent=1).encode("utf-8")),
                 overwrite=overwrite)
    used: set = set()
    for s in rep.students:
        name = _safe_name(s.student, used)
        text = _feedback(rep, s, spec_of)
        write_atomic(os.path.join(rep.out, "feedback", name + ".md"),
                     lambda f, t=text: f.write(t.encode("utf-8")), overwrite=overwrite)
        write_atomic(os.path.join(rep.out, "logs", name + ".txt"),
                     lambda f, t=s.log: f.write(t.encode("utf-8")), overwrite=overwrite)


# ----------------------------------------------------------------------------- grade()
def grade(submissions, key, out, *, limits: Limits | None = None, jobs: int = 1,
          hide=(), overwrite: bool = False, isolation: str = "auto") -> GradeReport:
    """Grade every notebook in ``submissions`` against the answer ``key`` (a path) and
    write the reports to ``out``. ``isolation``: "auto" (the best this machine allows),
    "required" (refuse to grade without namespaces) or "none". ``hide``: more folders the
    notebooks must not see. Returns a :class:`GradeReport`."""
    limits = limits or Limits()
    submissions, out = os.path.abspath(os.fspath(submissions)), os.path.abspath(os.fspath(out))
    if not os.path.isdir(submissions):
        raise ClassroomError(f"{submissions} is not a folder of submissions")
    k = load_key(key)
    if os.path.exists(os.path.join(out, "grades.csv")) and not overwrite:
        raise ClassroomError(f"{out} already holds grades.csv; pass overwrite=True "
                             f"(--overwrite) to replace the reports")
    if isolation == "none":
        iso = Isolation("none", notes=["isolation switched off by the caller"])
    else:
        iso = probe_isolation()
        if isolation == "required" and iso.mode != "namespaces":
            raise ClassroomError("sandboxed grading is not possible here: "
                                 + iso.describe())
    key_dir = os.path.dirname(k["_path"])
    # the temporary folder holds the other submissions' working copies while they run
    # (/tmp and /var/tmp are replaced in the sandbox anyway)
    tmp = os.path.realpath(tempfile.gettempdir())
    hidden = [key_dir, submissions, out] + ([] if tmp in ("/tmp", "/var/tmp") else [tmp]) + \
        [os.path.abspath(os.fspath(h)) for h in hide]
    src = k.get("source")
    if isinstance(src, str) and os.path.isfile(src):
        hidden.append(os.path.dirname(src))
    needed = sandbox.needed_paths()
    safe_hidden = []
    for h in dict.fromkeys(os.path.realpath(p) for p in hidden):
        if any(n == h or n.startswith(h.rstrip("/") + "/") for n in needed):
            iso.notes.append(f"{h} holds the Python the notebooks need and stays visible")
        else:
            safe_hidden.append(h)
    files = {}
    for rel in k.get("files", []):
        p = os.path.realpath(os.path.join(key_dir, rel))
        if not p.startswith(os.path.realpath(key_dir) + os.sep) or not os.path.isfile(p):
            raise ClassroomError(f"the key lists the file {rel!r}, which is not in {key_dir}")
        with open(p, "rb") as f:
            files[rel] = f.read()
    nb_name = k["notebook"]
    subs = find_submissions(submissions, nb_name)
    checks_blob = k["checks"]
    exercises = [(eid, float(spec.get("points", 1)))
                 for eid, spec in k["_checks"]["exercises"].items()]

    def one(item) -> StudentResult:
        student, path, problem = item
        if problem is None:
            try:
                if os.path.getsize(path) > MAX_NOTEBOOK_BYTES:
                    raise ClassroomError(f"larger than {MAX_NOTEBOOK_BYTES >> 20} MiB")
                with open(path, "rb") as f:
                    raw = f.read()
                json.loads(raw)
            except (OSError, ValueError, ClassroomError) as e:
                problem = f"not a readable notebook ({str(e)[:200]})"
        if problem is not None:
            results = {e: ex.CheckResult(e, False, 0.0, ["not graded: " + problem])
                       for e, _ in exercises}
            return StudentResult(student, path, results, {e: 0.0 for e, _ in exercises},
                                 problem, [])
        with tempfile.TemporaryDirectory(prefix="wb-grade-") as stage:
            os.chmod(stage, 0o700)
            res = _run_sandbox(stage, nb_name, {**files, nb_name: raw}, limits, iso,
                               safe_hidden, checks=checks_blob)
        results = _check_answers(k, res["answers"], models)
        points = {e: round(p * results[e].fraction, 4) for e, p in exercises}
        status = res["failure"] or "ok"
        return StudentResult(student, path, results, points, status, res["cells"],
                             res["seconds"], res["log_tail"])

    models = ModelChecker(limits)
    try:
        with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, int(jobs))) as pool:
            students = list(pool.map(one, subs))
    finally:
        models.close()
    rep = GradeReport(k.get("assignment", nb_name), exercises, students, iso, out)
    write_reports(rep, k, overwrite=overwrite)
    return rep


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) == 2 and argv[0] == "--serve-models":
        return _serve_models(argv[1])
    print("usage: workbench grade SUBMISSIONS --key KEY --out OUT", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())

__all__ = ["grade", "Limits", "GradeReport", "StudentResult", "Isolation", "probe_isolation",
           "load_key"]
