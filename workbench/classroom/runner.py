"""Running a notebook's code cells in this process, for ``workbench assign`` and the grader.

No Jupyter kernel and no network port: the cells run one after another in an IPython shell
(magics and ``display`` work; plain ``exec`` when IPython is missing), an error in one cell
is reported and the next cell still runs (a grading run gives points for what works). What
the checks produce goes out as *frames*, one JSON object per line, on a file descriptor the
caller opened:

- ``{"type": "reference", "id", ...}``: ``workbench assign``'s recording run;
- ``{"type": "answer", "id", "answer" | "error"}``: a grading run's handed-in answer;
- ``{"type": "cell", "index", "error"}``: a cell that raised; ``{"type": "done"}`` at the end.

Frames are data for the parent: the grader reads answers from them and nothing else (no
score, no verdict), so code in the notebook that writes frames of its own can only hand in
answers.
"""

from __future__ import annotations

import json
import os
import sys
import traceback

from workbench.classroom import exercise as ex
from workbench.classroom.encoding import unpack


class FrameWriter:
    """One JSON object per line on a file descriptor (each frame one ``os.write``)."""

    def __init__(self, fd: int):
        self.fd = fd

    def __call__(self, frame: dict) -> None:
        data = (json.dumps(frame, separators=(",", ":")) + "\n").encode("utf-8")
        view = memoryview(data)
        while view:
            n = os.write(self.fd, view)
            view = view[n:]


def code_cells(nb: dict) -> list:
    """The sources of a notebook's code cells (nbformat 4 JSON), in order."""
    if not isinstance(nb, dict) or not isinstance(nb.get("cells"), list):
        raise ValueError("not a notebook (no list of cells)")
    out = []
    for i, c in enumerate(nb["cells"]):
        if isinstance(c, dict) and c.get("cell_type") == "code":
            src = c.get("source", "")
            src = "".join(src) if isinstance(src, list) else str(src)
            out.append((i, src))
    return out


def _shell():
    try:
        from IPython.core.interactiveshell import InteractiveShell
        from traitlets.config import Config
    except ImportError:
        return None
    cfg = Config()
    cfg.HistoryManager.enabled = False
    cfg.InteractiveShell.colors = "NoColor"
    cfg.InteractiveShell.xmode = "Plain"
    return InteractiveShell.instance(config=cfg)


def _exec_plain(src: str, ns: dict) -> BaseException | None:
    try:
        exec(compile(src, "<cell>", "exec"), ns)
    except Exception as e:           # noqa: BLE001 - reported as the cell's error
        traceback.print_exc()
        return e
    return None


def run_notebook(path: str, *, mode: str, frames_fd: int, checks: str | None = None,
                 salt: str | None = None, stop_on_error: bool = False) -> int:
    """Run the notebook at ``path``; returns the number of cells that raised."""
    with open(path, encoding="utf-8") as f:
        nb = json.load(f)
    sink = FrameWriter(frames_fd)
    st = ex.STATE
    st.sink = sink
    st.mode = mode
    if checks is not None:
        data = unpack(checks)
        st.checks = data["exercises"]
        st.salt = str(data.get("salt", ""))
        st.assignment = data.get("assignment")
        st.locked = True
    if salt is not None:
        st.salt = salt
    shell = _shell()
    ns = {"__name__": "__main__"}
    errors = 0
    for index, src in code_cells(nb):
        if not src.strip():
            continue
        if shell is not None:
            res = shell.run_cell(src, store_history=False)
            err = res.error_in_exec or res.error_before_exec
        else:
            err = _exec_plain(src, ns)
        sys.stdout.flush()
        if err is not None:
            errors += 1
            msg = f"{type(err).__name__}: {err}"
            sink({"type": "cell", "index": index, "error": msg[:500]})
            if stop_on_error:
                break
    sink({"type": "done", "errors": errors})
    return errors


def main(argv=None) -> int:
    import argparse
    p = argparse.ArgumentParser(prog="python -m workbench.classroom.runner")
    p.add_argument("notebook")
    p.add_argument("--mode", choices=("record", "grade", "student"), required=True)
    p.add_argument("--frames-fd", type=int, required=True)
    p.add_argument("--salt")
    p.add_argument("--stop-on-error", action="store_true")
    a = p.parse_args(argv)
    errors = run_notebook(a.notebook, mode=a.mode, frames_fd=a.frames_fd, salt=a.salt,
                          stop_on_error=a.stop_on_error)
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
