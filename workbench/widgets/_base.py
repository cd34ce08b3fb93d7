"""Shared bits of the widgets: notebook detection, text fallbacks, loading front-end files."""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path

STATIC = Path(__file__).parent / "static"


def in_notebook() -> bool:
    """True inside a Jupyter kernel (where widgets can render), False in scripts/terminals."""
    try:
        from IPython import get_ipython
    except ImportError:
        return False
    ip = get_ipython()
    return ip is not None and getattr(ip, "kernel", None) is not None


@cache
def esm(*files: str, embed: tuple = ()) -> str:
    """The widget's ES module: the given files from ``static/`` joined in order (a shared
    core first, then the widget's own file with its ``export default``). ``embed``: pairs
    (constant name, file) put in front as JavaScript string constants (source text a Web
    Worker is made from: the layout engine). No network."""
    head = [f"const {name} = {json.dumps((STATIC / f).read_text(encoding='utf-8'))};"
            for name, f in embed]
    return "\n".join(head + [(STATIC / f).read_text(encoding="utf-8") for f in files])


class TextRepr:
    """Mixin: a readable text form outside a notebook, the widget view inside one."""

    def summary(self) -> str:  # pragma: no cover - overridden
        return type(self).__name__

    def __repr__(self) -> str:
        return self.summary()

    def _repr_pretty_(self, p, cycle) -> None:
        p.text(self.summary())

    def _repr_mimebundle_(self, **kwargs):
        if in_notebook():
            data = super()._repr_mimebundle_(**kwargs)
            if isinstance(data, dict):
                data["text/plain"] = self.summary()
            return data
        return {"text/plain": self.summary()}


def import_widgets():
    """(anywidget, ipywidgets, traitlets), with a clear message when they are missing."""
    try:
        import anywidget
        import ipywidgets
        import traitlets
    except ImportError as e:  # pragma: no cover - depends on the environment
        raise ImportError(
            f"workbench.widgets needs anywidget and ipywidgets ({e}); install them with "
            f"`pip install anywidget ipywidgets`") from e
    return anywidget, ipywidgets, traitlets
