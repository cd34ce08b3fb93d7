"""Exercises that check themselves: a prompt, the student's answer, specific feedback, hints.

>>> from workbench import classroom                                   # doctest: +SKIP
>>> q = classroom.ArrayExercise("1.2", "Normalise x to [0, 1] as float32", hint="x / 16")
>>> q.check(answer)                                                   # doctest: +SKIP
✘ Exercise 1.2 - not yet: dtype float64, expected float32 ...

Six kinds: :class:`ValueExercise` (exact: numbers, strings, lists, dicts),
:class:`NumberExercise` and :class:`ArrayExercise` (within a tolerance),
:class:`FunctionExercise` (the student's function run on given cases),
:class:`ModelExercise` (an ONNX model the student built or edited, compared output by output
and node by node) and :class:`ClassifierExercise` (a model reaching an accuracy).

Where the reference comes from
------------------------------
An exercise holds no reference answer. In the **instructor's notebook** (solutions in place)
``check`` takes the instructor's answer as the reference (it says so). ``workbench assign``
runs that notebook once, records what each check needs (digests, see
:mod:`workbench.classroom.digest`, and the exercise's definition) and puts it in the
**student's notebook** as one ``classroom.load_checks("wbc1:...")`` cell; ``check`` then
compares the student's answer with those digests. When **grading**, the grader loads the
same data from the answer key (a student who edits the cell, or the exercise's tolerance,
changes nothing there) and ``check`` only hands the answer over; the grader decides.
"""

from __future__ import annotations

import copy
import math
import re

import numpy as np

from workbench.classroom import digest as dg
from workbench.classroom import modelcheck
from workbench.classroom.encoding import ClassroomError, decode, encode, unpack

_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")


class _State:
    """What this kernel checks against. ``mode``: "student" (self-check), "record" (the
    instructor's run under ``workbench assign``) or "grade" (a sandboxed grading run)."""

    def __init__(self):
        self.checks: dict | None = None
        self.salt = "instructor"
        self.assignment: str | None = None
        self.locked = False           # grading: the grader's data; load_checks() is ignored
        self.mode = "student"
        self.sink = None              # record/grade: callable(dict) receiving frames


STATE = _State()


def load_checks(blob: str) -> None:
    """Load the check data that ``workbench assign`` put in a student's notebook."""
    data = unpack(blob)
    if STATE.locked:
        return
    if not isinstance(data, dict) or not isinstance(data.get("exercises"), dict):
        raise ClassroomError("this check data holds no exercises; copy the cell again")
    STATE.checks = data["exercises"]
    STATE.salt = str(data.get("salt", ""))
    STATE.assignment = data.get("assignment")


# ----------------------------------------------------------------------------- results
class CheckResult:
    """The outcome of one check: ``passed`` (also its truth value), ``fraction`` of the
    points earned (function cases, model input sets), feedback ``messages``, the ``hint``
    shown after a wrong try, a ``note``."""

    def __init__(self, exercise_id: str, passed: bool, fraction: float, messages=(),
                 *, title: str = "", hint: str | None = None, note: str | None = None):
        self.exercise = exercise_id
        self.passed = bool(passed)
        self.fraction = 1.0 if passed else max(0.0, min(1.0, float(fraction)))
        self.messages = [m for m in messages if m]
        self.title = title
        self.hint = hint
        self.note = note

    def __bool__(self) -> bool:
        return self.passed

    def __str__(self) -> str:
        head = f"Exercise {self.exercise}" + (f" ({self.title})" if self.title else "")
        if self.passed:
            lines = [f"✔ {head}: correct."]
        else:
            part = f" ({self.fraction:.0%} of it right)" if 0 < self.fraction < 1 else ""
            lines = [f"✘ {head}: not yet{part}."]
        lines += [f"  - {m}" for m in self.messages]
        if self.hint and not self.passed:
            lines.append(f"  Hint: {self.hint}")
        if self.note:
            lines.append(f"  ({self.note})")
        return "\n".join(lines)

    __repr__ = __str__

    def to_dict(self) -> dict:
        return {"exercise": self.exercise, "passed": self.passed, "fraction": self.fraction,
                "messages": self.messages, "note": self.note}


# ----------------------------------------------------------------------------- base class
class Exercise:
    """One exercise: ``id`` (unique in the assignment: letters, digits, ``._-``), ``prompt``
    (the task in a sentence or two, shown when the exercise is displayed), ``points``,
    ``hint`` (a string, or a list shown one more per wrong try), ``title``; the other
    keyword arguments are the kind's settings (tolerances, cases, inputs...)."""

    kind = ""
    defaults: dict = {}

    def __init__(self, id: str, prompt: str = "", *, points: float = 1, hint=None,
                 title: str = "", **params):
        if not isinstance(id, str) or not _ID.match(id):
            raise ClassroomError(f"exercise id {id!r}: use 1-64 letters, digits, '.', '_' or "
                                 f"'-', starting with a letter or digit")
        unknown = set(params) - set(self.defaults)
        if unknown:
            raise ClassroomError(f"{type(self).__name__} has no setting "
                                 f"{', '.join(sorted(unknown))}; it has "
                                 f"{', '.join(sorted(self.defaults)) or 'none'}")
        self.id = id
        self.prompt = prompt
        self.points = float(points)
        if not (self.points >= 0 and math.isfinite(self.points)):
            raise ClassroomError(f"exercise {id}: points must be a number >= 0")
        self.hints = [hint] if isinstance(hint, str) else list(hint or [])
        self.title = title
        self.params = self.validate({**self.defaults, **params})
        self.tries = 0
        self.wrong_tries = 0
        self.last_result: CheckResult | None = None

    # -- display
    def __repr__(self) -> str:
        pts = f"{self.points:g} point{'s' if self.points != 1 else ''}"
        title = f" - {self.title}" if self.title else ""
        return f"Exercise {self.id}{title} ({pts}): {self.prompt}".rstrip(": ")

    def _repr_markdown_(self) -> str:
        pts = f"{self.points:g} point{'s' if self.points != 1 else ''}"
        title = f" — {self.title}" if self.title else ""
        return f"**Exercise {self.id}**{title} *({pts})*\n\n{self.prompt}"

    # -- checking
    def check(self, answer) -> CheckResult:
        """Check ``answer``, print the feedback (and a hint after a wrong try), and return the
        :class:`CheckResult` (its display is the printed text, so a cell ending with
        ``q.check(x)`` shows the feedback once)."""
        self.tries += 1
        if STATE.mode == "record":
            res = self._record(answer)
        elif STATE.mode == "grade":
            res = self._hand_in(answer)
        else:
            res = self.evaluate(answer)
        if not res.passed and STATE.mode == "student":
            self.wrong_tries += 1
            if self.hints:
                res.hint = self.hints[min(self.wrong_tries, len(self.hints)) - 1]
        self.last_result = res
        print(res)
        return _Shown(res)

    def evaluate(self, answer) -> CheckResult:
        """The check without printing, hints or try counting."""
        spec = STATE.checks.get(self.id) if STATE.checks is not None else None
        note = None
        if STATE.checks is not None and spec is None:
            return CheckResult(self.id, False, 0.0, [
                f"the check data loaded in this notebook has no exercise {self.id!r} (ids: "
                f"{', '.join(sorted(STATE.checks)[:12])}); was the exercise's id changed?"],
                title=self.title)
        if spec is None:
            cls, params = type(self), self.params
            try:
                prepared = cls.prepare(answer, params)
                data = cls.reference(prepared, params, STATE.salt)
            except ClassroomError as e:
                return CheckResult(self.id, False, 0.0, [str(e)], title=self.title)
            note = "instructor's version: no check data loaded, this answer is the reference"
        else:
            cls = KINDS.get(spec.get("kind"))
            if cls is None:
                raise ClassroomError(f"exercise {self.id}: unknown kind {spec.get('kind')!r} "
                                     f"in the check data (a newer workbench made it?)")
            params = cls.decode_params(spec["params"])
            data = spec["data"]
            if cls is not type(self) or \
                    dg.canonical(encode(params)) != dg.canonical(encode(self.params)):
                note = ("this exercise's definition was changed in this notebook; it is "
                        "checked as originally given")
            try:
                prepared = cls.prepare(answer, params)
            except ClassroomError as e:
                return CheckResult(self.id, False, 0.0, [str(e)], title=self.title, note=note)
        passed, fraction, msgs = cls.compare(prepared, params, data, STATE.salt)
        return CheckResult(self.id, passed, fraction, msgs, title=self.title, note=note)

    def _record(self, answer) -> CheckResult:
        """``workbench assign``: the instructor's answer becomes the reference."""
        cls, params = type(self), self.params
        try:
            prepared = cls.prepare(answer, params)
            data = cls.reference(prepared, params, STATE.salt)
        except ClassroomError as e:
            raise ClassroomError(f"exercise {self.id}: the instructor's answer cannot be "
                                 f"recorded: {e}") from None
        passed, _, msgs = cls.compare(prepared, params, data, STATE.salt)
        if not passed:
            raise ClassroomError(f"exercise {self.id}: the instructor's answer does not pass "
                                 f"its own check: {'; '.join(msgs)}")
        STATE.sink({"type": "reference", "id": self.id, "kind": self.kind,
                    "points": self.points, "title": self.title, "prompt": self.prompt,
                    "params": encode(params), "data": data})
        return CheckResult(self.id, True, 1.0, title=self.title,
                           note="recorded as the reference")

    def _hand_in(self, answer) -> CheckResult:
        """A grading run: the answer (prepared as the grader's definition says) goes to the
        grader, which checks it outside this process."""
        spec = (STATE.checks or {}).get(self.id)
        if spec is None or spec.get("kind") not in KINDS:
            STATE.sink({"type": "answer", "id": self.id,
                        "error": "not an exercise of this assignment"})
            return CheckResult(self.id, False, 0.0, ["not an exercise of this assignment"])
        cls = KINDS[spec["kind"]]
        try:
            prepared = cls.prepare(answer, cls.decode_params(spec["params"]))
            STATE.sink({"type": "answer", "id": self.id, "answer": encode(prepared)})
        except ClassroomError as e:
            STATE.sink({"type": "answer", "id": self.id, "error": str(e)})
        return CheckResult(self.id, False, 0.0, note="handed in; the grader checks it")

    # -- what a kind defines
    @classmethod
    def validate(cls, params: dict) -> dict:
        return params

    @classmethod
    def decode_params(cls, enc) -> dict:
        """A definition from check data; settings added since it was made get defaults."""
        params = decode(enc)
        if not isinstance(params, dict):
            raise ClassroomError("malformed exercise definition in the check data")
        return cls.validate({**cls.defaults, **params})

    @classmethod
    def prepare(cls, answer, params):
        """The answer in the form that is checked and handed to the grader (encodable)."""
        raise NotImplementedError

    @classmethod
    def reference(cls, prepared, params, salt: str) -> dict:
        """What the check stores of the instructor's prepared answer (never the answer)."""
        raise NotImplementedError

    @classmethod
    def compare(cls, prepared, params, data, salt: str) -> tuple[bool, float, list]:
        """``(passed, fraction, messages)`` of a prepared answer against stored data."""
        raise NotImplementedError


class _Shown(CheckResult):
    """A CheckResult already printed: its notebook display is empty (no double feedback)."""

    def __init__(self, res: CheckResult):
        self.__dict__.update(res.__dict__)

    def _repr_pretty_(self, p, cycle) -> None:
        pass

    def _ipython_display_(self) -> None:
        pass


def _plural(n: int, word: str) -> str:
    return f"{n} {word}{'' if n == 1 else 's'}"


def _short(v, limit: int = 60) -> str:
    if isinstance(v, np.ndarray):
        if v.size <= 8 and v.dtype.kind in "biuf":
            text = np.array2string(v, separator=", ", precision=4, suppress_small=True)
            return re.sub(r"\s+", " ", text)
        return f"array(shape={list(v.shape)}, {v.dtype})"
    if type(v).__name__ == "ModelProto":
        return f"<ONNX model {getattr(v.graph, 'name', '') or ''}>"
    r = repr(v)
    return r if len(r) <= limit else r[:limit - 3] + "..."


# ----------------------------------------------------------------------------- values
class ValueExercise(Exercise):
    """An exact answer: a number compared exactly, a string, a bool, a list/tuple/dict of
    these. Settings: ``ordered`` (False: a list's order does not matter), ``case_sensitive``,
    ``strip`` (of strings). A tuple and a list with the same items are the same answer, and
    ``2.0`` is ``2``."""

    kind = "value"
    defaults = {"ordered": True, "case_sensitive": True, "strip": True}

    @classmethod
    def prepare(cls, answer, params):
        return {"value": dg.normalize(answer, ordered=params["ordered"],
                                      case_sensitive=params["case_sensitive"],
                                      strip=params["strip"])}

    @classmethod
    def reference(cls, prepared, params, salt):
        return value_data(prepared["value"], salt)

    @classmethod
    def compare(cls, prepared, params, data, salt):
        ok, text = compare_value(prepared["value"], data, salt)
        return ok, float(ok), [] if ok else [text]


def value_data(v, salt: str) -> dict:
    d = {"category": dg.category(v), "digest": dg.value_digest(salt, v)}
    if isinstance(v, list):
        d["items"] = [dg.value_digest(f"{salt}/{i}", x) for i, x in enumerate(v)]
        d["sorted"] = dg.value_digest(f"{salt}/sorted", sorted(v, key=dg.canonical))
    if isinstance(v, str):
        d["folded"] = dg.value_digest(salt + "/folded", " ".join(v.lower().split()))
    return d


def compare_value(v, data: dict, salt: str) -> tuple[bool, str]:
    if dg.value_digest(salt, v) == data["digest"]:
        return True, ""
    want, got = data["category"], dg.category(v)
    if want != got:
        return False, f"expected a {want}, got a {got} ({_short(v)})"
    if want == "list":
        items = data.get("items", [])
        if len(v) != len(items):
            return False, f"expected {_plural(len(items), 'item')}, got {len(v)}"
        wrong = [i for i, x in enumerate(v) if dg.value_digest(f"{salt}/{i}", x) != items[i]]
        if wrong and data.get("sorted") == dg.value_digest(f"{salt}/sorted",
                                                           sorted(v, key=dg.canonical)):
            return False, "the right items, in the wrong order"
        if wrong:
            shown = ", ".join(str(i) for i in wrong[:6]) + (", ..." if len(wrong) > 6 else "")
            return False, (f"{_plural(len(wrong), 'item')} of {len(v)} wrong (at index "
                           f"{shown})")
    if want == "string" and data.get("folded") == \
            dg.value_digest(salt + "/folded", " ".join(v.lower().split())):
        return False, "almost: the upper/lower case or the spacing differs"
    return False, f"{_short(v)} is not the expected {want}"


class NumberExercise(Exercise):
    """One number within ``atol + rtol * |expected|`` (see :mod:`..digest` for exactly what
    passes)."""

    kind = "number"
    defaults = {"rtol": 1e-4, "atol": 1e-6}

    @classmethod
    def validate(cls, params):
        _check_tolerance(params)
        return params

    @classmethod
    def prepare(cls, answer, params):
        return {"number": as_number(answer)}

    @classmethod
    def reference(cls, prepared, params, salt):
        return number_data(prepared["number"], params, salt)

    @classmethod
    def compare(cls, prepared, params, data, salt):
        ok, text = compare_number(prepared["number"], data, salt)
        return ok, float(ok), [] if ok else [text]


def _check_tolerance(params: dict) -> None:
    for k in ("rtol", "atol"):
        v = params[k]
        if not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
            raise ClassroomError(f"{k} must be a number >= 0, got {v!r}")
    if params["rtol"] == 0 and params["atol"] == 0:
        raise ClassroomError("rtol and atol are both 0: use a ValueExercise for exact answers")


def as_number(answer) -> float:
    if isinstance(answer, (bool, np.bool_)):
        raise ClassroomError(f"expected a number, got a bool ({answer})")
    if isinstance(answer, (int, float, np.integer, np.floating)):
        return float(answer)
    a = _as_array(answer)
    if a is not None and a.size == 1 and a.dtype.kind in "iuf":
        return float(a.reshape(()))
    what = f"an array of shape {list(a.shape)}" if a is not None else \
        f"a {type(answer).__name__}"
    raise ClassroomError(f"expected a single number, got {what}")


def number_data(x: float, params: dict, salt: str) -> dict:
    d = dg.array_digest(np.array([x], dtype=np.float64), salt, atol=params["atol"],
                        rtol=params["rtol"])
    d["order"] = None if x == 0 or not math.isfinite(x) else int(math.floor(math.log10(abs(x))))
    d["sign"] = 0 if x == 0 else (1 if x > 0 else -1)
    return d


def compare_number(x: float, data: dict, salt: str) -> tuple[bool, str]:
    level = int(dg.match_levels(np.array([x], dtype=np.float64), data, salt)[0])
    tol = f"atol {data['atol']:g}, rtol {data['rtol']:g}"
    if level == 0:
        return True, ""
    if math.isnan(x):
        return False, "your answer is NaN"
    if level == 1:
        return False, (f"close, but not within the tolerance ({tol}): is something rounded, "
                       f"or computed in lower precision?")
    if level == 2:
        return False, f"within about 100 times the tolerance ({tol}) but no closer"
    sign = 0 if x == 0 else (1 if x > 0 else -1)
    if data.get("sign") is not None and sign and data["sign"] and sign != data["sign"]:
        return False, f"{x:g} is not it: check the sign"
    order = data.get("order")
    if order is not None and x != 0 and math.isfinite(x):
        mine = int(math.floor(math.log10(abs(x))))
        if mine != order:
            return False, (f"{x:g} is about 10^{abs(mine - order)} times too "
                           f"{'large' if mine > order else 'small'}")
    return False, f"{x:g} is not the expected number"


# ----------------------------------------------------------------------------- arrays
def _as_array(answer):
    if isinstance(answer, np.ndarray):
        return answer
    if hasattr(answer, "numpy") and callable(answer.numpy):       # workbench / torch tensors
        try:
            return np.asarray(answer.detach().numpy() if hasattr(answer, "detach")
                              else answer.numpy())
        except Exception:
            return None
    if isinstance(answer, (list, tuple, int, float, np.generic)):
        try:
            a = np.asarray(answer)
        except Exception:
            return None
        return None if a.dtype.hasobject else a
    return None


class ArrayExercise(Exercise):
    """An array: shape, dtype (``dtype="exact"``, ``"kind"`` (float vs int), or None) and
    every value within ``atol + rtol * |expected|``; integers and strings exactly."""

    kind = "array"
    defaults = {"rtol": 1e-4, "atol": 1e-6, "dtype": "exact"}

    @classmethod
    def validate(cls, params):
        _check_tolerance(params)
        if params["dtype"] not in ("exact", "kind", None):
            raise ClassroomError('dtype must be "exact", "kind" or None')
        return params

    @classmethod
    def prepare(cls, answer, params):
        a = _as_array(answer)
        if a is None:
            raise ClassroomError(f"expected an array (numpy), got a {type(answer).__name__}")
        return {"array": a}

    @classmethod
    def reference(cls, prepared, params, salt):
        return array_data(prepared["array"], params, salt)

    @classmethod
    def compare(cls, prepared, params, data, salt):
        ok, text = compare_array(prepared["array"], data, salt, dtype_rule=params["dtype"])
        return ok, float(ok), [] if ok else [text]


def array_data(a: np.ndarray, params: dict, salt: str) -> dict:
    d = dg.array_digest(a, salt, atol=params["atol"], rtol=params["rtol"])
    if a.dtype.kind in "iuf" and a.size > 4:
        n = float(np.linalg.norm(a.astype(np.float64).ravel()))
        d["norm"] = float(f"{n:.3g}") if math.isfinite(n) else None
    return d


def compare_array(a: np.ndarray, data: dict, salt: str, *, dtype_rule="exact"):
    """``(ok, feedback)`` of an answer array against an array digest."""
    want_shape = tuple(data["shape"])
    if tuple(a.shape) != want_shape:
        msg = f"shape {list(a.shape)}, expected {list(want_shape)}"
        if a.size == int(np.prod(want_shape)) and a.dtype.kind in "biufUS":
            if np.all(dg.match_levels(a.reshape(want_shape), data, salt) == 0):
                msg += ": your values are right, in the wrong shape (a reshape is missing)"
            elif tuple(a.shape)[::-1] == want_shape and \
                    np.all(dg.match_levels(np.transpose(a), data, salt) == 0):
                msg += ": your array is the transpose of the expected one"
            else:
                msg += " (the same number of elements)"
        return False, msg
    problems = []
    want = np.dtype(data["dtype"])
    if dtype_rule == "exact" and a.dtype != want:
        problems.append(f"dtype {a.dtype}, expected {want}")
    elif dtype_rule == "kind" and (a.dtype.kind in "iub") != (want.kind in "iub"):
        kind = "integers" if want.kind in "iub" else "floats"
        problems.append(f"dtype {a.dtype}: expected {kind}")
    if a.dtype.hasobject:
        return False, "an array of Python objects; give numbers"
    levels = dg.match_levels(a, data, salt)
    bad = np.flatnonzero(levels > 0)
    if bad.size:
        n = dg.sampled_count(data)
        pos = dg.positions(data, a.size)[bad]
        where = ", ".join(str(tuple(int(i) for i in np.unravel_index(p, a.shape))
                              if a.ndim > 1 else int(p)) for p in pos[:3])
        close = int(np.count_nonzero(levels == 1))
        near = int(np.count_nonzero(levels == 2))
        far = bad.size - close - near
        parts = []
        if close:
            parts.append(f"{close} close (within ~10x the tolerance)")
        if near:
            parts.append(f"{near} within ~100x")
        if far:
            parts.append(f"{far} further off")
        sampled = " (of those checked)" if n < a.size else ""
        msg = (f"{bad.size} of {n} values differ{sampled}, first at {where}: "
               f"{', '.join(parts)}")
        if a.dtype.kind == "f":
            nans = int(np.count_nonzero(np.isnan(a)))
            if nans:
                msg += f"; {nans} of your values are NaN"
        ref_norm = data.get("norm")
        if ref_norm and a.dtype.kind in "iuf":
            mine = float(np.linalg.norm(a.astype(np.float64).ravel()))
            if math.isfinite(mine) and abs(mine - ref_norm) > 0.01 * ref_norm:
                msg += (f"; the size (L2 norm) of your array is {mine / ref_norm:.3g} times "
                        f"the expected one")
        problems.append(msg)
    return not problems, "; ".join(problems)


# ----------------------------------------------------------------------------- functions
class FunctionExercise(Exercise):
    """A function, run on ``cases``: a list whose items are a tuple of positional arguments,
    or a dict ``{"args": (...), "kwargs": {...}}``. Each case's result is compared like a
    ValueExercise (ints, strings, lists), a NumberExercise (floats, with ``rtol``/``atol``) or
    an ArrayExercise (arrays, dtype ``"exact"`` unless ``dtype=`` says otherwise) depending on
    what the reference returned; points are shared between the cases. Arguments are copied
    for each call, so a function that changes its input does not spoil the next case."""

    kind = "function"
    defaults = {"cases": (), "rtol": 1e-4, "atol": 1e-6, "dtype": "exact"}

    @classmethod
    def validate(cls, params):
        _check_tolerance(params)
        cases = []
        for c in params["cases"]:
            if isinstance(c, dict) and set(c) <= {"args", "kwargs"}:
                cases.append({"args": tuple(c.get("args", ())),
                              "kwargs": dict(c.get("kwargs", {}))})
            elif isinstance(c, (tuple, list)):
                cases.append({"args": tuple(c), "kwargs": {}})
            else:
                raise ClassroomError("each case is a tuple of arguments or a dict with 'args' "
                                     "and 'kwargs'")
        if not cases:
            raise ClassroomError("a FunctionExercise needs at least one case")
        params["cases"] = cases
        return params

    @classmethod
    def prepare(cls, answer, params):
        if not callable(answer):
            raise ClassroomError(f"expected a function, got a {type(answer).__name__}")
        results = []
        for c in params["cases"]:
            args, kwargs = copy.deepcopy(c["args"]), copy.deepcopy(c["kwargs"])
            try:
                r = answer(*args, **kwargs)
            except Exception as e:
                results.append({"error": f"{type(e).__name__}: {e}"[:300]})
                continue
            results.append(_case_result(r))
        return {"results": results}

    @classmethod
    def reference(cls, prepared, params, salt):
        out = []
        for i, r in enumerate(prepared["results"]):
            s = f"{salt}/case{i}"
            if "error" in r:
                raise ClassroomError(f"case {i + 1} raised {r['error']}")
            if "array" in r:
                out.append({"kind": "array", "data": array_data(r["array"], params, s)})
            elif "number" in r:
                out.append({"kind": "number", "data": number_data(r["number"], params, s)})
            else:
                out.append({"kind": "value", "data": value_data(r["value"], s)})
        return {"cases": out}

    @classmethod
    def compare(cls, prepared, params, data, salt):
        refs = data["cases"]
        results = prepared["results"]
        if len(results) != len(refs):
            return False, 0.0, ["the number of cases run does not match the exercise"]
        good, msgs = 0, []
        for i, (r, ref) in enumerate(zip(results, refs)):
            ok, text = _compare_case(r, ref, f"{salt}/case{i}", params["dtype"])
            good += ok
            if not ok and len(msgs) < 3:
                c = params["cases"][i]
                call = ", ".join([_short(a, 30) for a in c["args"]] +
                                 [f"{k}={_short(v, 30)}" for k, v in c["kwargs"].items()])
                msgs.append(f"case {i + 1}, f({call}): {text}")
        if len(refs) - good > len(msgs):
            msgs.append(f"... {len(refs) - good - len(msgs)} more case(s) fail")
        return good == len(refs), good / len(refs), msgs


def _case_result(r) -> dict:
    if isinstance(r, (bool, np.bool_)) or r is None or isinstance(r, str):
        return {"value": dg.normalize(r)}
    if isinstance(r, (float, np.floating)):
        return {"number": float(r)}
    if isinstance(r, (int, np.integer)):
        return {"value": int(r)}
    a = _as_array(r) if not isinstance(r, (list, tuple)) else None
    if a is not None:
        return {"array": a}
    try:
        return {"value": dg.normalize(r)}
    except ClassroomError as e:
        return {"error": f"returned something that cannot be compared: {e}"}


def _compare_case(r: dict, ref: dict, salt: str, dtype_rule) -> tuple[bool, str]:
    if "error" in r:
        return False, f"raised {r['error']}"
    kind, data = ref["kind"], ref["data"]
    if kind == "array":
        a = r.get("array")
        if a is None:
            v = r.get("value", r.get("number"))
            a = _as_array(v)
            if a is None:
                return False, f"expected an array, got {_short(v)}"
        return compare_array(a, data, salt, dtype_rule=dtype_rule)
    if kind == "number":
        x = r.get("number", r.get("value"))
        if isinstance(x, bool) or not isinstance(x, (int, float)):
            return False, f"expected a number, got {_short(x)}"
        return compare_number(float(x), data, salt)
    v = r.get("value")
    if v is None and "value" not in r:
        try:
            v = dg.normalize(r.get("number", r.get("array")))
        except ClassroomError as e:
            return False, str(e)
    return compare_value(v, data, salt)


# ----------------------------------------------------------------------------- models
def _feeds(params) -> list:
    feeds = params.get("feeds")
    if isinstance(feeds, dict):
        feeds = [feeds]
    if not feeds or not all(isinstance(f, dict) and f for f in feeds):
        raise ClassroomError("feeds: give the model's inputs as a dict {input name: array}, or "
                             "a list of such dicts")
    out = []
    for f in feeds:
        g = {}
        for k, v in f.items():
            a = _as_array(v)
            if a is None:
                raise ClassroomError(f"feeds[{k!r}] is not an array")
            g[str(k)] = a
        out.append(g)
    return out


class ModelExercise(Exercise):
    """An ONNX model (a ModelProto, bytes, a path, or a workbench model), run on ``feeds``
    (a dict {input name: array}, or a list of them): it must pass ``onnx.checker`` and give the
    reference's outputs (``rtol``/``atol``). ``input_names``/``output_names=True`` also require
    the reference's names; ``forbidden_ops`` lists operator types the model must not contain.
    With ``nodes=True`` (default), a wrong model gets told which of its nodes is the first to
    compute something the reference never does."""

    kind = "model"
    defaults = {"feeds": None, "rtol": 1e-4, "atol": 1e-5, "input_names": False,
                "output_names": False, "nodes": True, "forbidden_ops": ()}

    @classmethod
    def validate(cls, params):
        _check_tolerance(params)
        params["feeds"] = _feeds(params)
        ops = params["forbidden_ops"]
        if isinstance(ops, str) or not all(isinstance(o, str) for o in ops):
            raise ClassroomError("forbidden_ops: a list of operator types, e.g. [\"Dropout\"]")
        params["forbidden_ops"] = list(ops)
        return params

    @classmethod
    def prepare(cls, answer, params):
        return {"model": modelcheck.model_bytes(answer, params["feeds"][0])}

    @classmethod
    def reference(cls, prepared, params, salt):
        return modelcheck.reference_data(prepared["model"], params["feeds"], salt,
                                         atol=params["atol"], rtol=params["rtol"],
                                         nodes=params["nodes"])

    @classmethod
    def compare(cls, prepared, params, data, salt):
        return modelcheck.compare_model(
            prepared["model"], params, data, salt,
            lambda a, d, s: compare_array(a, d, s, dtype_rule="exact"))


class ClassifierExercise(Exercise):
    """A classification model (ONNX, or a workbench model) that must reach ``min_accuracy``
    on ``inputs``/``labels`` (its first output's argmax over axis 1 is the class)."""

    kind = "classifier"
    defaults = {"inputs": None, "labels": None, "min_accuracy": 0.9, "input_name": None}

    @classmethod
    def validate(cls, params):
        x, y = _as_array(params["inputs"]), _as_array(params["labels"])
        if x is None or y is None or y.ndim != 1 or len(x) != len(y) or y.dtype.kind not in "iu":
            raise ClassroomError("a ClassifierExercise needs inputs (an array) and labels (a "
                                 "1-D integer array of the same length)")
        params["inputs"], params["labels"] = x, y
        acc = params["min_accuracy"]
        if not isinstance(acc, (int, float)) or not 0 <= acc <= 1:
            raise ClassroomError("min_accuracy must be between 0 and 1")
        return params

    @classmethod
    def _feed(cls, params) -> dict:
        return {params["input_name"] or "input": params["inputs"]}

    @classmethod
    def prepare(cls, answer, params):
        return {"model": modelcheck.model_bytes(answer, cls._feed(params))}

    @classmethod
    def accuracy(cls, prepared, params) -> float:
        m = modelcheck.parse(prepared["model"])
        feed = modelcheck.map_feed(m, cls._feed(params), by_name=False)
        outs, _ = modelcheck.run(m, [feed])
        out = np.asarray(outs[0][0])
        if out.ndim != 2 or out.shape[0] != len(params["labels"]):
            raise ClassroomError(f"your model's first output has shape {list(out.shape)}; "
                                 f"expected [{len(params['labels'])}, classes]")
        return float(np.mean(out.argmax(axis=1) == params["labels"]))

    @classmethod
    def reference(cls, prepared, params, salt):
        return {"accuracy": round(cls.accuracy(prepared, params), 4)}

    @classmethod
    def compare(cls, prepared, params, data, salt):
        try:
            acc = cls.accuracy(prepared, params)
        except ClassroomError as e:
            return False, 0.0, [str(e)]
        need = params["min_accuracy"]
        n = len(params["labels"])
        if acc >= need:
            return True, 1.0, [f"accuracy {acc:.3f} on the {n} test samples"]
        return False, 0.0, [f"accuracy {acc:.3f} on the {n} test samples; {need:.3f} needed"]


KINDS = {c.kind: c for c in (ValueExercise, NumberExercise, ArrayExercise, FunctionExercise,
                             ModelExercise, ClassifierExercise)}


def check_prepared(spec: dict, prepared, salt: str) -> CheckResult:
    """The grader's check of one handed-in answer (already decoded) against its key entry."""
    cls = KINDS[spec["kind"]]
    params = cls.decode_params(spec["params"])
    try:
        passed, fraction, msgs = cls.compare(prepared, params, spec["data"], salt)
    except ClassroomError as e:
        passed, fraction, msgs = False, 0.0, [str(e)]
    return CheckResult(spec.get("id", "?"), passed, fraction, msgs,
                       title=spec.get("title", ""))

