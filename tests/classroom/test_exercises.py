"""Exercises, digests and the check data, in this process (no notebooks run here)."""

from __future__ import annotations

import io
import json
import zlib

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from workbench.classroom import (
    ArrayExercise,
    ClassifierExercise,
    ClassroomError,
    FunctionExercise,
    ModelExercise,
    NumberExercise,
    ValueExercise,
    load_checks,
)
from workbench.classroom import digest as dg
from workbench.classroom import exercise as ex
from workbench.classroom.encoding import BLOB_PREFIX, array_from_bytes, decode, encode, pack, unpack
from workbench.classroom.notebook import leaks, secret_lines, strip_cell, strip_solutions


@pytest.fixture(autouse=True)
def fresh_state():
    saved = ex.STATE
    ex.STATE = ex._State()
    yield ex.STATE
    ex.STATE = saved


def students_view(q, solution, salt="s4lt"):
    """Record ``solution`` as ``q``'s reference and load it as a student's notebook would."""
    prepared = type(q).prepare(solution, q.params)
    data = type(q).reference(prepared, q.params, salt)
    blob = pack({"format": 1, "assignment": "t", "salt": salt, "exercises": {
        q.id: {"kind": q.kind, "params": encode(q.params), "data": data, "points": q.points,
               "title": q.title, "prompt": q.prompt}}})
    load_checks(blob)
    return blob


def messages(res):
    return " | ".join(res.messages)


# ----------------------------------------------------------------------------- digests
@pytest.mark.parametrize("scale", [1e-6, 1e-2, 1.0, 37.0, 1e5])
def test_tolerance_buckets_always_accept_within_and_reject_beyond_twice(scale):
    rng = np.random.default_rng(0)
    ref = (rng.standard_normal(4000) * scale).astype(np.float64)
    atol, rtol = 1e-6, 1e-4
    d = dg.array_digest(ref, "salt", atol=atol, rtol=rtol)
    tol = atol + rtol * np.abs(ref)
    sign = rng.choice([-1.0, 1.0], size=ref.size)
    inside = ref + sign * tol * rng.uniform(0, 0.9, ref.size)
    assert np.all(dg.match_levels(inside, d, "salt") == 0)
    outside = ref + sign * tol * rng.uniform(2.2, 5, ref.size)
    assert np.all(dg.match_levels(outside, d, "salt") > 0)
    assert np.all(dg.match_levels(ref + sign * tol * 50, d, "salt") == 2)   # "within ~100x"


def test_digests_depend_on_position_salt_and_exact_for_integers():
    a = np.arange(10, dtype=np.int64)
    d = dg.array_digest(a, "one", atol=1e-6, rtol=1e-4)
    assert np.all(dg.match_levels(a, d, "one") == 0)
    assert np.all(dg.match_levels(a, d, "two") > 0)            # another salt
    assert np.sum(dg.match_levels(a[::-1], d, "one") > 0) == 10   # same values, moved
    b = a.copy()
    b[3] += 1
    assert list(np.flatnonzero(dg.match_levels(b, d, "one"))) == [3]
    f = dg.array_digest(np.array([np.nan, np.inf, -np.inf, 0.0]), "s", atol=1e-6, rtol=1e-4)
    assert list(dg.match_levels(np.array([np.nan, np.inf, -np.inf, 0.0]), f, "s")) == [0] * 4
    assert list(dg.match_levels(np.array([-np.inf, np.nan, 1e300, 1e-9]), f, "s")) == \
        [3, 3, 3, 0]


def test_large_arrays_are_sampled_the_same_way_everywhere():
    a = np.random.default_rng(1).standard_normal(200_000).astype(np.float32)
    d = dg.array_digest(a, "s", atol=1e-5, rtol=1e-4)
    assert dg.sampled_count(d) == dg.SAMPLE_LIMIT
    assert np.all(dg.match_levels(a, d, "s") == 0)
    b = a.copy()
    b[::2] += 1
    assert np.mean(dg.match_levels(b, d, "s") > 0) > 0.4


def test_normalize():
    assert dg.normalize((1, 2.0, np.int64(3))) == [1, 2, 3]
    assert dg.normalize({"b": np.float32(0.5)}) == {"b": 0.5}
    assert dg.normalize(" Relu ", case_sensitive=False) == "relu"
    assert dg.normalize({3, 1, 2}) == [1, 2, 3]
    with pytest.raises(ClassroomError, match="cannot be compared"):
        dg.normalize(object())


# ----------------------------------------------------------------------------- the kinds
def test_value_feedback_and_hints(capsys):
    q = ValueExercise("v1", "shape?", hint=["look at the dims", "it is (batch, classes)"])
    students_view(q, (2, 4))
    assert q.check([2, 4]) and q.check(np.array([2, 4]))     # a list or an array is fine
    assert not q.check((4, 2))
    out = capsys.readouterr().out
    assert "the right items, in the wrong order" in out and "Hint: look at the dims" in out
    assert "1 item of 2 wrong (at index 1)" in messages(q.evaluate((2, 5)))
    r = q.check("2, 4")
    assert "expected a list, got a string" in messages(r)
    assert "Hint: it is (batch, classes)" in capsys.readouterr().out   # the next hint
    assert q.check((2, 4, 1)).messages == ["expected 2 items, got 3"]
    assert q.tries == 5 and q.wrong_tries == 3


def test_value_strings():
    q = ValueExercise("v2", "op?")
    students_view(q, "MatMul")
    assert q.evaluate("MatMul ")
    assert "upper/lower case" in messages(q.evaluate("matmul"))
    assert "is not the expected string" in messages(q.evaluate("Gemm"))


def test_number_feedback():
    q = NumberExercise("n1", "scale?", rtol=1e-3)
    students_view(q, 0.0125)
    assert q.evaluate(np.float32(0.0125))
    assert q.evaluate(np.array([0.012501]))                    # a size-1 array is a number
    assert "10^2 times too large" in messages(q.evaluate(1.25))
    assert "check the sign" in messages(q.evaluate(-0.0125))
    assert "close, but not within" in messages(q.evaluate(0.0125 * 1.005))
    assert "got a bool" in messages(q.evaluate(True))
    assert "got an array of shape [2]" in messages(q.evaluate([1.0, 2.0]))


def test_array_feedback():
    q = ArrayExercise("a1", "relu", rtol=1e-4, atol=1e-6)
    ref = np.linspace(-1, 1, 12, dtype=np.float32).reshape(3, 4)
    students_view(q, ref)
    assert q.evaluate(ref.copy())
    assert "dtype float64, expected float32" in messages(q.evaluate(ref.astype(np.float64)))
    assert "the transpose of the expected one" in messages(q.evaluate(ref.T))
    assert "in the wrong shape" in messages(q.evaluate(ref.reshape(4, 3)))
    assert "(the same number of elements)" in messages(q.evaluate(ref.T[::-1]))
    bad = ref.copy()
    bad[1, 2] = np.nan
    bad[2, 3] *= 1.0005
    m = messages(q.evaluate(bad))
    assert "2 of 12 values differ, first at (1, 2), (2, 3)" in m
    assert "1 close" in m and "1 further off" in m and "NaN" in m
    assert "2 times the expected" in messages(q.evaluate(ref * 2))
    assert "expected an array" in messages(q.evaluate("no"))


def test_function_partial_credit_errors_and_copied_arguments():
    def relu(v):
        return np.maximum(v, 0)

    cases = [(np.array([-1.0, 2.0]),), (np.array([0.5, -0.5]),), (np.zeros(2),)]
    q = FunctionExercise("f1", "relu", cases=cases, points=3)
    students_view(q, relu)

    def half_wrong(v):
        v[v < 0] = 0            # changes its argument: the next case still gets the original
        return v if v[0] != 0.5 else v * 2

    r = q.evaluate(half_wrong)
    assert not r and r.fraction == pytest.approx(2 / 3)
    assert "case 2, f([ 0.5, -0.5])" in messages(r)

    def broken(v):
        raise ValueError("nope")
    assert "raised ValueError: nope" in messages(q.evaluate(broken))
    assert "expected a function" in messages(q.evaluate(3))


def test_changed_definition_is_checked_as_given(capsys):
    q = NumberExercise("n2", "pi?", rtol=1e-6)
    students_view(q, np.pi)
    lenient = NumberExercise("n2", "pi?", rtol=0.5)           # the student loosens it
    r = lenient.evaluate(3.0)
    assert not r and "checked as originally given" in r.note


def test_unknown_exercise_and_instructor_mode():
    q = ValueExercise("x9", "?")
    r = q.evaluate(1)
    assert r and "instructor's version" in r.note                 # nothing loaded
    students_view(ValueExercise("other", "?"), 1)
    assert "has no exercise 'x9'" in messages(q.evaluate(1))


def test_grading_mode_hands_in_with_the_grader_definition(fresh_state):
    q = ArrayExercise("a2", "x", atol=1e-6)
    students_view(q, np.ones(3, np.float32))                      # the grader's data
    frames = []
    fresh_state.mode, fresh_state.sink, fresh_state.locked = "grade", frames.append, True
    edited = pack({"format": 1, "salt": "x", "exercises": {"a2": {"kind": "value"}}})
    load_checks(edited)                           # a notebook's own check data is ignored
    assert fresh_state.checks["a2"]["kind"] == "array"
    res = q.check(np.full(3, 2, np.float32))
    assert not res and "the grader checks it" in res.note
    (fr,) = frames
    assert fr["type"] == "answer" and fr["id"] == "a2"
    assert np.array_equal(decode(fr["answer"])["array"], np.full(3, 2, np.float32))
    ValueExercise("nope", "?").check(1)
    assert frames[-1] == {"type": "answer", "id": "nope",
                          "error": "not an exercise of this assignment"}


# ----------------------------------------------------------------------------- models
def _mlp(w, act="Relu", names=("x", "y")):
    nodes = [helper.make_node("MatMul", [names[0], "W"], ["h"], name="mm"),
             helper.make_node(act, ["h"], [names[1]], name="act")]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info(names[0], TensorProto.FLOAT,
                                                                     [2, 3])],
                          [helper.make_tensor_value_info(names[1], TensorProto.FLOAT, [2, 2])],
                          [numpy_helper.from_array(w, "W")])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


W = np.array([[1.0, -1.0], [0.5, 2.0], [-0.25, 0.0]], np.float32)
X = np.array([[1.0, 2.0, 3.0], [-1.0, 0.5, 2.0]], np.float32)


def test_model_exercise_finds_the_first_wrong_node():
    q = ModelExercise("m1", "relu(x @ W)", feeds={"x": X})
    students_view(q, _mlp(W))
    assert q.evaluate(_mlp(W))
    assert q.evaluate(_mlp(W).SerializeToString())
    r = q.evaluate(_mlp(W, act="Sigmoid"))
    assert "'act' (Sigmoid)" in messages(r) and "goes wrong" in messages(r)
    r = q.evaluate(_mlp(W.T.copy().reshape(3, 2)))                   # a wrong initializer
    assert "'W' (an initializer)" in messages(r)
    assert q.evaluate(_mlp(W, names=("inp", "out")))          # names free unless asked
    r = q.evaluate(helper.make_graph([], "g", [], []))
    assert "wrap it in a model" in messages(r)
    broken = _mlp(W)
    broken.graph.node[1].input[0] = "missing"
    assert "onnx.checker rejects" in messages(q.evaluate(broken))


def test_model_exercise_names_when_asked():
    q = ModelExercise("m2", "rename", feeds={"image": X}, input_names=True)
    students_view(q, _mlp(W, names=("image", "y")))
    r = q.evaluate(_mlp(W))
    assert "inputs are ['x'], the exercise asks for ['image']" in messages(r)


def test_classifier_exercise():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((200, 3)).astype(np.float32)
    labels = (x[:, 0] > 0).astype(np.int64)
    good = np.array([[-1, 1], [0, 0], [0, 0]], np.float32)
    bad = np.array([[1, -1], [0, 0], [0, 0]], np.float32)

    def lin(w):
        g = helper.make_graph([helper.make_node("MatMul", ["x", "W"], ["y"])], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [200, 3])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [200, 2])],
                              [numpy_helper.from_array(w, "W")])
        return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    q = ClassifierExercise("c1", "sign", inputs=x, labels=labels, min_accuracy=0.95)
    students_view(q, lin(good))
    assert q.evaluate(lin(good))
    assert "accuracy 0.000 on the 200 test samples; 0.950 needed" in messages(q.evaluate(lin(bad)))


# ----------------------------------------------------------------------------- data
def test_encoding_never_unpickles_and_bounds_sizes():
    buf = io.BytesIO()
    np.save(buf, np.array([{"a": 1}], dtype=object), allow_pickle=True)
    with pytest.raises(ClassroomError, match="not a readable array"):
        array_from_bytes(buf.getvalue())
    with pytest.raises(ClassroomError, match="cannot be stored"):
        encode(np.array([object()]))
    m = _mlp(W)
    back = decode(json.loads(json.dumps(encode({"m": m, "t": (1, 2.5), "n": float("nan")}))))
    assert back["m"] == m and back["t"] == (1, 2.5) and np.isnan(back["n"])
    bomb = BLOB_PREFIX + __import__("base64").b64encode(zlib.compress(b"[" + b"0," * 10**7
                                                                      + b"0]")).decode()
    with pytest.raises(ClassroomError, match="inflates to more than"):
        unpack(bomb, limit=1 << 20)
    with pytest.raises(ClassroomError, match="not check data"):
        load_checks("hello")


# ----------------------------------------------------------------------------- notebooks
def test_strip_cell_keeps_indentation_and_checks_markers():
    src = "def f(x):\n    ### BEGIN SOLUTION\n    return x + 1\n    ### END SOLUTION\nq.check(f)"
    new, regions = strip_cell(src)
    assert new == ("def f(x):\n    # YOUR CODE HERE\n    raise NotImplementedError()\n"
                   "q.check(f)")
    assert regions == ["    return x + 1"]
    for bad, msg in [("### END SOLUTION", "without"), ("### BEGIN SOLUTION\nx",
                                                        "never closed"),
                     ("### BEGIN SOLUTION\n### BEGIN SOLUTION", "inside another")]:
        with pytest.raises(ClassroomError, match=msg):
            strip_cell(bad)


def test_strip_solutions_clears_outputs_and_finds_leaks():
    nb = {"cells": [
        {"cell_type": "code", "source": "x = 1\n### BEGIN SOLUTION\ny = secret_value(x)\n"
                                        "### END SOLUTION\n", "execution_count": 3,
         "metadata": {"execution": {"a": 1}},
         "outputs": [{"output_type": "stream", "name": "stdout", "text": "y = secret_value(x)"}]},
        {"cell_type": "markdown", "source": "Answer:\n### BEGIN SOLUTION\nBecause.\n"
                                            "### END SOLUTION", "metadata": {}}],
        "metadata": {"widgets": {"state": 1}}, "nbformat": 4, "nbformat_minor": 5}
    student, regions = strip_solutions(nb)
    assert [r.source for r in regions] == ["y = secret_value(x)", "Because."]
    assert student["cells"][0]["outputs"] == [] and student["cells"][0]["execution_count"] is None
    assert "execution" not in student["cells"][0]["metadata"]
    assert "YOUR ANSWER HERE" in "".join(student["cells"][1]["source"])
    assert "widgets" not in student["metadata"]
    secrets = secret_lines(nb, regions)
    assert "y = secret_value(x)" in secrets
    assert leaks(student, secrets) == []
    assert leaks(nb, secrets)              # the instructor's version does hold it


def test_forged_answers_fail_cleanly():
    """What a hostile notebook could hand in instead of an answer: the grader's check says
    "could not be read/checked" and never raises."""
    from workbench.classroom.grading import _decode_and_check
    q = ArrayExercise("a9", "x")
    prepared = ArrayExercise.prepare(np.ones(3, np.float32), q.params)
    spec = {"id": "a9", "kind": "array", "params": encode(q.params),
            "data": ArrayExercise.reference(prepared, q.params, "s")}
    deep = []
    for _ in range(100_000):
        deep = [deep]
    for forged in ({"__map__": {"array": "junk"}}, {"__nd__": "AAAA"}, [1, 2], "x", None,
                   {"__map__": {"array": {"__nd__": "!!"}}}, deep, {"__tuple__": 5},
                   {"__map__": {"results": 3}}):
        r = _decode_and_check(spec, forged, "s")
        assert not r.passed, forged
    good = _decode_and_check(spec, encode(prepared), "s")
    assert good.passed


@pytest.mark.parametrize("ipython", [True, False])
def test_runner_runs_cells_past_errors(tmp_path, monkeypatch, ipython):
    import sys

    from workbench.classroom import runner
    if not ipython:
        monkeypatch.setattr(runner, "_shell", lambda: None)     # plain exec, no IPython
    else:       # an IPython shell replaces sys.modules["__main__"]: put it back afterwards
        monkeypatch.setitem(sys.modules, "__main__", sys.modules["__main__"])
    q = ValueExercise("r1", "?")
    blob = students_view(q, 42)
    nb = {"cells": [
        {"cell_type": "code", "source": "from workbench import classroom\nx = 41"},
        {"cell_type": "markdown", "source": "text"},
        {"cell_type": "code", "source": ["1 / 0"]},
        {"cell_type": "code", "source": "q = classroom.ValueExercise('r1', '?')\n"
                                        "q.check(x + 1)"}]}
    path = tmp_path / "nb.ipynb"
    path.write_text(json.dumps(nb))
    frames_path = tmp_path / "frames"
    try:
        with open(frames_path, "wb") as f:
            errors = runner.run_notebook(str(path), mode="grade", frames_fd=f.fileno(),
                                         checks=blob)
    finally:
        if ipython:
            from IPython.core.interactiveshell import InteractiveShell
            InteractiveShell.clear_instance()
    frames = [json.loads(line) for line in frames_path.read_text().splitlines()]
    assert errors == 1
    assert frames[0] == {"type": "cell", "index": 2, "error": "ZeroDivisionError: division by zero"}
    assert frames[1]["type"] == "answer" and decode(frames[1]["answer"]) == {"value": 42}
    assert frames[2] == {"type": "done", "errors": 1}
