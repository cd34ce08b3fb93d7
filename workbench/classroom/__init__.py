"""A classroom kit: exercises that check themselves in any notebook, and grading.

For students, in any notebook front end (JupyterLab, Notebook 7, VS Code, Colab; no server
extension)::

    from workbench import classroom
    q = classroom.ArrayExercise("1.2", "Scale the pixels to [0, 1] as float32",
                                hint="divide by the largest possible value")
    q.check(pixels)          # ✘ Exercise 1.2: not yet. - dtype float64, expected float32 ...

For teachers, three steps (``docs/classroom.md``)::

    workbench assign course/ch1.ipynb --out release/        # students' notebook + key
    # hand out release/ch1.ipynb, collect the notebooks in submissions/
    workbench grade submissions/ --key release/ch1.key.json --out results/

Exercise kinds: :class:`ValueExercise`, :class:`NumberExercise`, :class:`ArrayExercise`,
:class:`FunctionExercise`, :class:`ModelExercise`, :class:`ClassifierExercise`. How answers
are hidden, and what that does not protect against: :mod:`workbench.classroom.digest`.
"""

from __future__ import annotations

from workbench.classroom.encoding import ClassroomError
from workbench.classroom.exercise import (
    ArrayExercise,
    CheckResult,
    ClassifierExercise,
    Exercise,
    FunctionExercise,
    ModelExercise,
    NumberExercise,
    ValueExercise,
    load_checks,
)


def assign(instructor, out_dir, **kwargs):
    """Instructor notebook -> students' notebook + answer key (:mod:`.notebook`)."""
    from workbench.classroom.notebook import assign as _assign
    return _assign(instructor, out_dir, **kwargs)


def grade(submissions, key, out, **kwargs):
    """Grade a folder of submitted notebooks (:mod:`.grading`)."""
    from workbench.classroom.grading import grade as _grade
    return _grade(submissions, key, out, **kwargs)


__all__ = ["ArrayExercise", "CheckResult", "ClassifierExercise", "ClassroomError", "Exercise",
           "FunctionExercise", "ModelExercise", "NumberExercise", "ValueExercise", "assign",
           "grade", "load_checks"]
