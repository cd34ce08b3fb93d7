"""The one way the widgets write HTML or SVG in Python.

Model files come from strangers: a node may be named ``<img src=x onerror=...>``. Every text
that our own code did not write (names of nodes and values, op types, attribute values, file
names, error messages, titles and metric names given by the user) reaches markup through
:func:`esc` (Python's ``html.escape``, quotes included), usually through :func:`tag`, which
escapes its text children and attribute values. :class:`Markup` marks what :func:`tag` built,
so that it is not escaped twice. ``ipywidgets.HTML`` renders its value with ``innerHTML``
(no sanitising), and the value is kept in a saved notebook's widget state and rendered again
when the notebook is opened: only :class:`Markup` goes there.

The JavaScript side has the same rule in its own form: model data reaches the page only as
DOM text (``textContent``, ``createTextNode``) or attribute values (``setAttribute``), never
through ``innerHTML`` (``static/graph_core.js``: ``wbEl``).
"""

from __future__ import annotations

import html
import re

__all__ = ["Markup", "esc", "frag", "joined", "tag"]

_NAME = re.compile(r"^[a-zA-Z][a-zA-Z0-9_:-]*$")


class Markup(str):
    """A piece of HTML built by :func:`tag` / :func:`frag` (its text already escaped)."""

    __slots__ = ()

    def __add__(self, other):
        return frag(self, other)

    def __radd__(self, other):
        return frag(other, self)


def esc(value) -> str:
    """``value`` as HTML text or a quoted attribute value: ``& < > " '`` escaped."""
    return html.escape(str(value), quote=True)


def frag(*parts) -> Markup:
    """The parts one after the other: :class:`Markup` as it is, anything else escaped."""
    return Markup("".join(p if isinstance(p, Markup) else esc(p) for p in parts
                          if p is not None))


def joined(sep, items) -> Markup:
    """``items`` separated by ``sep``, each escaped unless it is :class:`Markup`."""
    out: list = []
    for k, it in enumerate(items):
        if k:
            out.append(sep)
        out.append(it)
    return frag(*out)


def tag(name: str, *children, cls: str | None = None, **attrs) -> Markup:
    """``<name attr="...">children</name>``. ``name`` and the attribute names are fixed by
    our code (checked); attribute values and text children are escaped (``cls`` is the
    ``class`` attribute; ``None`` values are left out)."""
    if not _NAME.match(name):
        raise ValueError(f"not a tag name: {name!r}")
    if cls is not None:
        attrs = {"class": cls, **attrs}
    head = [name]
    for k, v in attrs.items():
        k = k.rstrip("_").replace("_", "-")
        if not _NAME.match(k) or k.lower().startswith("on"):
            raise ValueError(f"not an attribute this helper writes: {k!r}")
        if v is not None:
            head.append(f'{k}="{esc(v)}"')
    return Markup(f"<{' '.join(head)}>") + frag(*children) + Markup(f"</{name}>")
