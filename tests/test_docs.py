"""The README and the docs, as a newcomer reads them: every code block runs as written, every
path they name exists, the test command is what CI runs, and the install commands are those
``scripts/check_fresh_install.py`` runs in fresh environments (``docs/writing-docs.md``).

The blocks run in a copy of the repository (the reader's clone), one page at a time, in the
page's order, with ``python``, ``python3`` and ``workbench`` this interpreter and the copy's
package. Only blocks marked as needing a GPU (run where there is one) or a cluster are skipped;
installs and the test command itself are checked by the install check and by CI.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import docblocks

ROOT = docblocks.ROOT


def _has_gpu() -> bool:
    try:
        from workbench import device
        return device.cuda_available()
    except Exception:  # noqa: BLE001 - no cupy, no driver: no GPU
        return False


def test_every_block_says_what_it_is():
    """A language on every fence, known markers only (parse raises naming the line)."""
    blocks = docblocks.all_blocks()
    assert len(blocks) > 20
    runnable = [b for b in blocks if b.runs]
    assert len(runnable) > 15, [b.where for b in blocks]


def _pages_with_runnable_blocks() -> list[str]:
    return [p.relative_to(ROOT).as_posix() for p in docblocks.documents()
            if any(b.runs for b in docblocks.parse(p))]


def _singa_downloads(work: Path, env: dict) -> None:
    """SINGA's example programs download the zoo models: the architecture twins, the test
    picture and labels are put where they look (as tests/singa/test_examples_onnx.py does)."""
    from tests.singa.test_examples_onnx import _provide
    downloads = work / ".singa-downloads"
    downloads.mkdir()
    _provide(downloads, "resnet18v1.tar.gz", images=["kitten.jpg"], synset=True)
    env["SINGA_ONNX_DOWNLOAD_DIR"] = str(downloads)


#: what a page's blocks need from the world that a test may not reach (the network)
PAGE_SETUP = {"examples/singa_onnx/README.md": _singa_downloads}


@pytest.mark.slow
@pytest.mark.parametrize("page", _pages_with_runnable_blocks())
def test_the_code_blocks_of_a_page_run_as_written(page, tmp_path):
    blocks = [b for b in docblocks.parse(ROOT / page) if b.runs or b.marker == "file"]
    if not _has_gpu():
        blocks = [b for b in blocks if b.marker != "skip gpu"]
    if not any(b.runs for b in blocks):
        pytest.skip(f"{page}: every runnable block needs a GPU")
    work = docblocks.copy_checkout(tmp_path / "clone")
    env = dict(os.environ)
    env["PYTHONPATH"] = str(work)
    env["PATH"] = os.pathsep.join([str(docblocks.tool_bin(tmp_path / "bin")),
                                   os.path.dirname(sys.executable), env.get("PATH", "")])
    env["MPLBACKEND"] = "Agg"
    env["WORKBENCH_NOTEBOOK_OFFLINE"] = "1"
    env.setdefault("OMP_NUM_THREADS", "1")
    if page in PAGE_SETUP:
        PAGE_SETUP[page](work, env)
    r = docblocks.run_blocks(blocks, work, env=env, timeout=900)
    assert r.returncode == 0 and "all blocks ran" in r.stdout, r.stdout[-8000:]


def test_the_readme_test_command_is_what_ci_runs():
    ci = (ROOT / ".ci" / "run").read_text()
    cmds = [b for b in docblocks.parse(ROOT / "README.md") if b.marker == "test-command"]
    assert cmds, "the README shows the test command"
    main = [line.strip() for line in cmds[0].code.splitlines() if line.strip()]
    for part in " && ".join(main).split(" && "):
        assert part.strip() in ci, f"README's test command {part!r} is not what .ci/run runs"
    assert "-m \"not slow\"" in "".join(b.code for b in cmds[1:]), "the fast subset"


def test_every_install_block_is_run_by_the_fresh_install_check():
    sys.path.insert(0, str(ROOT / "scripts"))
    try:
        import check_fresh_install as cfi
    finally:
        sys.path.remove(str(ROOT / "scripts"))
    installs = [b for b in docblocks.all_blocks() if b.marker == "fresh-install"]
    claimed = {}
    for path, refs in cfi.PLAN.items():
        for doc, needle in refs:
            hits = [b for b in installs if b.doc == doc and needle in b.code]
            assert len(hits) == 1, f"{path}: ({doc}, {needle!r}) matches {len(hits)} blocks"
            claimed[hits[0].where] = path
    unclaimed = [b.where for b in installs if b.where not in claimed]
    assert not unclaimed, f"install blocks no install path of the check runs: {unclaimed}"


# ------------------------------------------------------------------------------ named paths
def _top_level() -> set:
    """The repository's top-level names (what git tracks or would add: an ignored output
    folder such as test-artifacts/ is not a place docs name as existing)."""
    out = subprocess.run(["git", "ls-files", "-z", "-co", "--exclude-standard"], cwd=ROOT,
                         capture_output=True).stdout
    names = {f.decode().split("/")[0] for f in out.split(b"\0") if f}
    return names or {p.name for p in ROOT.iterdir() if not p.name.startswith(".git")}


_TOP = _top_level()
_SPAN = re.compile(r"(?<!`)`([^`\n]+)`(?!`)")
_LINK = re.compile(r"\]\(([^)\s#]+)(?:#[^)]*)?\)")
_NOT_OURS = re.compile(r"(SINGA|singa|apache)[^.\n]{0,12}$")


def _named_paths(text: str):
    """(token, position) for inline code spans and link targets that look like paths."""
    for rx in (_SPAN, _LINK):
        for m in rx.finditer(text):
            tok = m.group(1).strip()
            first = tok.split()[0] if tok.split() else ""
            if first != tok or "://" in tok or any(c in tok for c in "<>*{}$?|=,;()[]"):
                continue
            yield tok.rstrip("/"), m.start()


def _exists(p: Path) -> bool:
    """A file or folder, or a name in a module (``workbench/files.write_atomic``, a module
    without its ``.py``, ``tests/test_x.py::test_y``)."""
    s = str(p).split("::")[0]
    p = Path(s)
    if p.exists() or Path(s + ".py").exists():
        return True
    mod, _, _attr = p.name.partition(".")
    return bool(mod) and (p.parent / (mod + ".py")).exists()


def _markdown_files() -> list[Path]:
    out = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "*.md"], cwd=ROOT,
                         capture_output=True,
                         text=True).stdout.split()
    return [ROOT / p for p in out] if out else sorted(ROOT.glob("**/*.md"))


def test_every_path_named_in_the_docs_exists():
    """A path of this repository named in a Markdown file (inline code or a link) exists:
    one starting with a top-level folder or file (``workbench/graph/load.py``, ``docs/gpu.md``),
    or one relative to the page's own folder. SINGA's own paths ("SINGA's `examples/cnn`")
    are not ours."""
    missing = []
    for md in _markdown_files():
        if "node_modules" in md.parts:
            continue
        text = md.read_text(encoding="utf-8")
        for tok, pos in _named_paths(text):
            if tok.startswith(("./", "/", "~", "-", ".")) and not tok.startswith(".ci"):
                continue
            head = tok.split("/")[0]
            here = md.parent / tok
            ours = head in _TOP or (head != tok and here.parent.exists() and
                                    md.parent != ROOT)
            if not ours and not (md.parent != ROOT and here.exists()):
                continue
            if _NOT_OURS.search(text[max(0, pos - 20):pos]):
                continue
            if not any(_exists(base / tok) for base in (ROOT, md.parent)):
                line = text.count("\n", 0, pos) + 1
                missing.append(f"{md.relative_to(ROOT)}:{line}: {tok}")
    assert not missing, "paths named in the docs that do not exist:\n" + "\n".join(missing)


def test_notebooks_readme_counts_the_notebooks_there_are():
    """notebooks/README.md's counts and lists follow the folder: every notebook is listed,
    and the totals it states are the numbers of files."""
    text = (ROOT / "notebooks" / "README.md").read_text(encoding="utf-8")
    nbs = sorted(p.relative_to(ROOT / "notebooks").as_posix()
                 for p in (ROOT / "notebooks").rglob("*.ipynb")
                 if ".ipynb_checkpoints" not in p.parts)
    unlisted = [n for n in nbs if f"`{n}`" not in text and f"`{n.split('/')[-1]}`" not in text]
    assert not unlisted, f"notebooks/README.md does not list {unlisted}"
    words = {w: i for i, w in enumerate(
        "zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen "
        "fifteen sixteen seventeen eighteen nineteen twenty".split())}
    words.update({f"twenty-{w}": 20 + words[w] for w in list(words)[1:10]})
    words.update({"thirty": 30})
    words.update({f"thirty-{w}": 30 + words[w] for w in list(words)[1:10]})

    def number(tok: str) -> int:
        return int(tok) if tok.isdigit() else words[tok.lower()]

    text = " ".join(text.split())            # sentences across line breaks
    top = [n for n in nbs if "/" not in n]
    counts = {"notebooks": len(nbs), "top": len(top),
              "tutorials": len([n for n in top if n[:2].isdigit()]),
              "zoo": len([n for n in top if n.startswith("zoo_")]),
              "course": len([n for n in nbs if n.startswith("course/")]),
              "more": len([n for n in nbs if n.startswith("tutorials/")])}
    said = {
        "notebooks": re.search(r"^# Notebooks (\w[\w-]*) notebooks:", text),
        "tutorials": re.search(r"(\w[\w-]*) tutorials for a classroom", text),
        "more": re.search(r"(\w[\w-]*) more tutorials in `tutorials/`", text),
        "course": re.search(r"a (\w[\w-]*)-chapter course", text),
        "zoo": re.search(r"(\w[\w-]*) zoo demos", text),
        "top": re.search(r"The (\d+) notebooks outside `course/` and `tutorials/`", text),
    }
    for key, m in said.items():
        assert m, f"notebooks/README.md no longer says how many {key}: update this test"
        assert number(m.group(1)) == counts[key], (key, m.group(0), counts[key])


def _anchor(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def test_readme_contents_lists_every_section():
    """The README's Contents line names every ``##`` section, in order, and every link in it
    reaches a heading (sections added by other branches slot in with their line here)."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    body = re.sub(r"```.*?```", "", text, flags=re.S)
    sections = [_anchor(h) for h in re.findall(r"^## (.+)$", body, re.M)]
    headings = set(sections) | {_anchor(h) for h in re.findall(r"^#{3,} (.+)$", body, re.M)}
    contents = re.search(r"^Contents: (.*?)\n\n", text, re.M | re.S)
    assert contents, "the README starts with a 'Contents: ...' line"
    links = re.findall(r"\]\(#([^)]+)\)", contents.group(1))
    assert [a for a in links if a not in headings] == [], "Contents links without a heading"
    assert [s for s in sections if s not in links] == [], \
        "README sections missing from its Contents line (add them there, in order)"
    assert links == [s for s in sections if s in links], "Contents is not in the page's order"
