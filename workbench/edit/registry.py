"""The table of edits: record name -> function. Each edit module registers its functions here.

An edit function takes the working copy (:class:`~workbench.edit.state.Draft`), the edit's
context (:class:`Context`) and the record's arguments as keywords; it changes the draft and
returns an :class:`~workbench.edit.verify.Intent` (does the edit keep the function, and how to
compare before and after). It raises :class:`~workbench.edit.errors.EditError` for a bad
request; the session then keeps its model as it was.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass

from workbench.edit.errors import EditError

EDITS: dict[str, Callable] = {}


def edit(name: str):
    """Register ``fn(draft, ctx, **args) -> Intent`` as the edit ``name``."""
    def deco(fn):
        if name in EDITS:
            raise RuntimeError(f"edit {name!r} registered twice")
        EDITS[name] = fn
        return fn
    return deco


def parameters(name: str) -> dict:
    """The edit's arguments: name -> default (``inspect.Parameter.empty`` when required)."""
    fn = EDITS[name]
    return {p.name: p.default for p in list(inspect.signature(fn).parameters.values())[2:]}


def validate(name: str, args: dict) -> None:
    if name not in EDITS:
        raise EditError(f"unknown edit {name!r}; the edits are: {', '.join(sorted(EDITS))}")
    params = parameters(name)
    unknown = [k for k in args if k not in params]
    if unknown:
        raise EditError(f"edit {name!r} has no argument {', '.join(map(repr, unknown))}; its "
                        f"arguments are: {', '.join(params)}")
    missing = [k for k, d in params.items() if d is inspect.Parameter.empty and k not in args]
    if missing:
        raise EditError(f"edit {name!r} needs the argument(s) {', '.join(map(repr, missing))}")


@dataclass
class Context:
    """What an edit may need from its session: the types of the values of the model before
    the edit (shape inference, else a run on the sample inputs)."""

    checker: object   # verify.Checker
    before: object    # state.ModelState

    def types(self, names) -> dict:
        """name -> ValueInfoProto (dtype and shape as far as known)."""
        from workbench.edit import verify  # noqa: PLC0415
        return verify.infer_types(self.before, list(names), self.checker.samples)
