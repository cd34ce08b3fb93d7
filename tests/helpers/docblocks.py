"""The code blocks of the README and the docs, as a reader meets them, and a way to run them.

``docs/writing-docs.md`` is the contract. Every fenced block in :data:`DOCUMENTS` says its
language; ``python`` and ``bash`` blocks run, in the order of their page, in a copy of the
repository (the reader's clone), with the page's Python blocks sharing one namespace as if
typed into one session. An HTML comment on the line just above a block changes that:

- ``<!-- docs-test: skip gpu -->`` / ``<!-- docs-test: skip cluster -->``: needs a GPU / a
  cluster of machines; run only where there is a GPU / never (the only skips);
- ``<!-- docs-test: fresh-install -->``: installs packages; run verbatim in a new virtual
  environment by ``scripts/check_fresh_install.py`` (not by the test suite, which must not
  install into the environment it runs in);
- ``<!-- docs-test: test-command -->``: runs the test suite itself (CI runs it: ``.ci/run``);
- ``<!-- docs-test: file NAME -->``: the block is the content of file ``NAME`` ("save this
  as train.py"), written where the later blocks run.

Blocks in ``text`` (and ``console``, ``output``, ``json``) are shown, not run.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import textwrap
from dataclasses import asdict, dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

#: the pages whose blocks run (benchmarks/README.md holds measurement commands of minutes each:
#: its paths are checked, its commands are not run)
DOCUMENTS = ["README.md", "docs/*.md", "notebooks/README.md", "examples/singa_onnx/README.md"]
RUN = {"python": "python", "py": "python", "bash": "bash", "sh": "bash", "shell": "bash"}
SHOWN = {"text", "console", "output", "json", "diff"}
MARKERS = {"skip gpu", "skip cluster", "fresh-install", "test-command", "file"}

_FENCE = re.compile(r"^([ \t]*)```([^\n`]*)\n(.*?)^\1```[ \t]*$", re.S | re.M)
_MARK = re.compile(r"^<!--\s*docs-test:\s*(.*?)\s*-->\s*$")


@dataclass
class Block:
    doc: str            # path relative to the repository
    line: int           # the fence's line (1-based)
    lang: str           # "python", "bash", or a shown language
    code: str
    marker: str = ""    # "", "skip gpu", "skip cluster", "fresh-install", "test-command", "file"
    arg: str = ""       # the file name of a "file" marker

    @property
    def where(self) -> str:
        return f"{self.doc}:{self.line}"

    @property
    def runs(self) -> bool:
        """Run by the test suite (in the page's order)."""
        return self.lang in ("python", "bash") and self.marker in ("", "skip gpu")


def documents(root: Path = ROOT) -> list[Path]:
    out = []
    for pattern in DOCUMENTS:
        out.extend(sorted(root.glob(pattern)))
    return out


def parse(path: Path, root: Path = ROOT) -> list[Block]:
    """The fenced blocks of ``path``; raises ValueError naming the line of a block without a
    language or with an unknown marker."""
    text = path.read_text(encoding="utf-8")
    rel = path.relative_to(root).as_posix()
    lines = text.splitlines()
    out = []
    for m in _FENCE.finditer(text):
        line = text.count("\n", 0, m.start()) + 1
        info = m.group(2).strip().split()
        lang = info[0].lower() if info else ""
        if not lang:
            raise ValueError(f"{rel}:{line}: a code block without a language: say ```python, "
                             f"```bash, or ```text for one that is shown, not run")
        if lang not in RUN and lang not in SHOWN:
            raise ValueError(f"{rel}:{line}: code block language {lang!r}: use one of "
                             f"{sorted(RUN)} (run) or {sorted(SHOWN)} (shown)")
        marker = arg = ""
        prev = lines[line - 2].strip() if line >= 2 else ""
        code = textwrap.dedent(m.group(3)) if m.group(1) else m.group(3)
        mk = _MARK.match(prev)
        if mk:
            marker, _, arg = mk.group(1).partition(" ") if mk.group(1).startswith("file ") \
                else (mk.group(1), "", "")
            if marker not in MARKERS:
                raise ValueError(f"{rel}:{line}: unknown docs-test marker {mk.group(1)!r}; "
                                 f"known: {sorted(MARKERS)} (docs/writing-docs.md)")
            if marker == "file" and not arg.strip():
                raise ValueError(f"{rel}:{line}: 'docs-test: file' needs a file name")
        out.append(Block(rel, line, RUN.get(lang, lang), code, marker, arg.strip()))
    return out


def all_blocks(root: Path = ROOT) -> list[Block]:
    return [b for p in documents(root) for b in parse(p, root)]


# ------------------------------------------------------------------------------ a working copy
def copy_checkout(dest: Path, root: Path = ROOT) -> Path:
    """The files a clone of the repository holds (tracked and new, not ignored: the working
    tree as it is), copied to ``dest``."""
    try:
        listed = subprocess.run(["git", "ls-files", "-z", "-co", "--exclude-standard"], cwd=root,
                                capture_output=True, check=True).stdout.split(b"\0")
        files = [f.decode() for f in listed if f]
    except (OSError, subprocess.CalledProcessError):    # not a git checkout (an unpacked sdist)
        skip = {".git", ".venv", "__pycache__", "test-artifacts", "node_modules", "dist",
                "build", ".pytest_cache", ".ruff_cache", ".ipynb_checkpoints"}
        files = [p.relative_to(root).as_posix() for p in root.rglob("*")
                 if p.is_file() and not skip & set(p.relative_to(root).parts)]
    for rel in files:
        src = root / rel
        if not src.is_file():            # deleted in the working tree, not yet in git
            continue
        target = dest / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(src, target)
    return dest


def tool_bin(folder: Path, python: str = sys.executable) -> Path:
    """A folder for PATH where ``python``, ``python3`` and ``workbench`` are this interpreter
    (and the working copy's package, through PYTHONPATH)."""
    folder.mkdir(parents=True, exist_ok=True)
    for name, line in (("python", f'exec "{python}" "$@"'), ("python3", f'exec "{python}" "$@"'),
                       ("workbench", f'exec "{python}" -m workbench "$@"')):
        p = folder / name
        p.write_text(f"#!/bin/sh\n{line}\n")
        p.chmod(0o755)
    return folder


# ------------------------------------------------------------------------------ the runner
_DRIVER = r'''
import json, os, subprocess, sys, time, traceback
blocks = json.load(open(sys.argv[1]))
ns = {"__name__": "__main__"}
t0 = time.perf_counter()
for b in blocks:
    at = time.perf_counter() - t0
    print(f"\n===== docs-test: {b['doc']}:{b['line']} ({b['lang']}) at {at:.1f} s", flush=True)
    if b["marker"] == "file":
        with open(b["arg"], "w") as f:
            f.write(b["code"])
        print(f"wrote {b['arg']}", flush=True)
        continue
    if b["lang"] == "bash":
        r = subprocess.run(["bash", "-e", "-o", "pipefail", "-c", b["code"]])
        if r.returncode:
            print(f"===== docs-test FAILED: {b['doc']}:{b['line']}: exit status {r.returncode}",
                  flush=True)
            sys.exit(1)
        continue
    try:
        exec(compile(b["code"], f"{b['doc']}:{b['line']}", "exec"), ns)
    except BaseException:
        traceback.print_exc()
        print(f"===== docs-test FAILED: {b['doc']}:{b['line']}", flush=True)
        sys.exit(1)
    sys.stdout.flush()
print(f"\n===== docs-test: all blocks ran ({time.perf_counter() - t0:.1f} s)", flush=True)
'''


def run_blocks(blocks: list[Block], work: Path, *, env: dict | None = None,
               timeout: float = 900) -> subprocess.CompletedProcess:
    """Run ``blocks`` (one page's, in order) in ``work`` (a working copy) in one fresh Python
    process; stdout and stderr together in ``.stdout``."""
    spec = work / ".docs-test-blocks.json"
    spec.write_text(json.dumps([asdict(b) for b in blocks]))
    driver = work / ".docs-test-driver.py"
    driver.write_text(_DRIVER)
    e = dict(os.environ if env is None else env)
    try:
        return subprocess.run([sys.executable, str(driver), str(spec)], cwd=work, env=e,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                              timeout=timeout)
    finally:
        spec.unlink(missing_ok=True)
        driver.unlink(missing_ok=True)
