"""A small instructor notebook with one exercise of each checked kind, and fabricated
submissions made from its students' version (correct, partly wrong, crashing, endless,
memory-hungry, hostile)."""

from __future__ import annotations

import json

SETUP = """\
import numpy as np
import onnx
from onnx import TensorProto, helper

from workbench import classroom

x = np.linspace(-2, 2, 8, dtype=np.float32).reshape(2, 4)"""

Q1 = """\
q1 = classroom.ValueExercise("q1", "What is 6 * 7?", hint="multiply")
### BEGIN SOLUTION
answer1 = 42
### END SOLUTION
q1.check(answer1)"""

Q2 = """\
q2 = classroom.ArrayExercise("q2", "relu(x)", points=2)
### BEGIN SOLUTION
answer2 = np.maximum(x, 0)
### END SOLUTION
q2.check(answer2)"""

Q3 = """\
q3 = classroom.FunctionExercise("q3", "softplus", cases=[(x,), (np.zeros(3, np.float32),)])


def softplus(v):
    ### BEGIN SOLUTION
    return np.log1p(np.exp(v))
    ### END SOLUTION


q3.check(softplus)"""

Q4 = """\
q4 = classroom.ModelExercise("q4", "y = relu(x @ W)", feeds={"x": x}, points=2)
W = np.arange(12, dtype=np.float32).reshape(4, 3) / 10 - 0.5
### BEGIN SOLUTION
nodes = [helper.make_node("MatMul", ["x", "W"], ["h"], name="mm"),
         helper.make_node("Relu", ["h"], ["y"], name="relu")]
g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4])],
                      [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])],
                      [onnx.numpy_helper.from_array(W, "W")])
model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
### END SOLUTION
q4.check(model)"""

# the solution regions, in order, as a student would fill them in
SOLUTIONS = ["answer1 = 42", "answer2 = np.maximum(x, 0)", "return np.log1p(np.exp(v))",
             Q4.split("### BEGIN SOLUTION\n")[1].split("\n### END SOLUTION")[0]]
# a unique piece of each solution: must never appear in a student's notebook or log
SECRETS = ["np.log1p(np.exp(v))", 'helper.make_node("Relu", ["h"], ["y"], name="relu")']
POINTS = {"q1": 1, "q2": 2, "q3": 1, "q4": 2}


def notebook(cells) -> dict:
    return {"cells": [{"cell_type": "code", "execution_count": None, "metadata": {},
                       "outputs": [], "source": c} if not c.startswith("## ") else
                      {"cell_type": "markdown", "metadata": {}, "source": c} for c in cells],
            "metadata": {"kernelspec": {"display_name": "Python 3", "language": "python",
                                        "name": "python3"}},
            "nbformat": 4, "nbformat_minor": 5}


def instructor() -> dict:
    return notebook([SETUP, "## Exercises", Q1, Q2, Q3, Q4])


def fill(student: dict, answers) -> dict:
    """The students' notebook with its stubs replaced by ``answers`` (in order; None keeps
    the stub, a missing item uses the solution)."""
    nb = json.loads(json.dumps(student))
    k = 0
    for c in nb["cells"]:
        if c["cell_type"] != "code":
            continue
        lines = "".join(c["source"]).split("\n")
        out, i = [], 0
        while i < len(lines):
            ln = lines[i]
            if ln.strip() == "# YOUR CODE HERE" and i + 1 < len(lines) and \
                    lines[i + 1].strip() == "raise NotImplementedError()":
                indent = ln[:len(ln) - len(ln.lstrip())]
                code = answers[k] if k < len(answers) else SOLUTIONS[k]
                if code is None:
                    out += [ln, lines[i + 1]]
                else:
                    out += [indent + c2 if c2 else c2 for c2 in code.split("\n")]
                k += 1
                i += 2
                continue
            out.append(ln)
            i += 1
        c["source"] = "\n".join(out)
    return nb


HOSTILE = r'''
import glob, os, socket, sys
KEY, SUBS, OUT, REPO = {key!r}, {subs!r}, {out!r}, {repo!r}
PORT, GRADER = {port}, {grader}


def attempt(name, fn):
    try:
        r = fn()
        print(f"HOSTILE {{name}}: SUCCEEDED {{str(r)[:60]!r}}")
    except BaseException as e:
        print(f"HOSTILE {{name}}: blocked ({{type(e).__name__}})")


def nonempty(xs):
    if not xs:
        raise FileNotFoundError("nothing")
    return xs


attempt("read-key", lambda: open(KEY).read())
attempt("list-key-folder", lambda: nonempty(os.listdir(os.path.dirname(KEY))))
attempt("find-keys", lambda: nonempty(glob.glob("/tmp/**/*.key.json", recursive=True)
                                      + glob.glob(os.path.dirname(KEY) + "/*")))
attempt("read-other-student", lambda: open(os.path.join(SUBS, "alice.ipynb")).read())
attempt("list-submissions", lambda: nonempty(os.listdir(SUBS)))
attempt("network-local", lambda: socket.create_connection(("127.0.0.1", PORT), timeout=3))
attempt("network-outside", lambda: socket.create_connection(("1.1.1.1", 53), timeout=3))
attempt("write-submissions", lambda: open(os.path.join(SUBS, "pwned.txt"), "w").write("x"))
attempt("write-out", lambda: open(os.path.join(OUT, "grades.csv"), "w").write("mallory,99"))
attempt("write-repo", lambda: open(os.path.join(REPO, "pwned.txt"), "w").write("x"))
attempt("write-home", lambda: open("/root/pwned.txt", "w").write("x"))
attempt("kill-grader", lambda: os.kill(GRADER, 9))
attempt("become-root", lambda: os.setuid(0))
attempt("read-shadow", lambda: open("/etc/shadow").read())
attempt("write-tmp", lambda: open("/tmp/wb-hostile-marker", "w").write("x"))


def forge():
    import json
    n = 0
    for fd in range(3, 64):
        try:
            os.write(fd, (json.dumps({{"type": "score", "student": "mallory", "points": 99}})
                          + "\n" + json.dumps({{"type": "answer", "id": "q2",
                                               "answer": {{"__map__": {{"array": "junk"}}}}}})
                          + "\n" + "not json at all\n").encode())
            n += 1
        except OSError:
            pass
    return n


attempt("forge-frames", forge)
from workbench.classroom import exercise as _ex
_ex.STATE.mode = "student"
_ex.STATE.checks = None
q1 = classroom.ValueExercise("q1", "What is 6 * 7?")
q1.check(0)        # "correct" in this process: the instructor mode takes 0 as the reference
print("SCORE: 6 / 6")
print("HOSTILE done")
'''


def hostile(student: dict, **paths) -> dict:
    code = HOSTILE.format(**paths)
    return fill(student, [code, None, None, None])


ENDLESS = "while True:\n    pass"
SLEEPER = "import time\ntime.sleep(10_000)"
MEMORY_HOG = """\
try:
    big = np.ones(6 * 2**30 // 8)            # 6 GiB, over the limit
    print("HOG allocated 6 GiB")
except MemoryError:
    print("HOG MemoryError on 6 GiB")
chunks = []
try:
    for _ in range(48):                        # at most 4.8 GiB, 100 MiB at a time
        chunks.append(bytearray(100 << 20))
    print("HOG kept", len(chunks), "chunks")
except MemoryError:
    print("HOG MemoryError after", len(chunks), "chunks")
del chunks
answer2 = np.maximum(x, 0)"""
