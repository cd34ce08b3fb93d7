"""The JupyterLab viewer's edit sessions on the server (workbench/labext_edit.py):
``POST /workbench/api/edit`` on a real jupyter_server on 127.0.0.1 with a token.

Checked: an edit, its refusal, undo, the script, Save that answers "exists" instead of
replacing the file until asked, Save As, the file read back through the viewer's endpoint;
paths confined to the server's root (the file opened, the file saved, the other model of a
compose, symbolic links leaving the root, hidden files); credentials; the sessions sharing a
small number of worker processes (a session whose worker was taken is restored from its log);
and, on a pool in the test process with budgets small enough to be certain, a request that
runs out of time or memory: stopped, answered as such, the edits before it kept.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import sys
import time
from pathlib import Path

import onnx
import pytest
from onnx import TensorProto, helper

from tests.helpers import hostile_models as hm
from tests.helpers import jupyter

pytest.importorskip("jupyter_server", reason="jupyter_server is not installed (the lab extra)")

ROOT = Path(__file__).resolve().parents[1]
EDIT = "workbench/api/edit"
GRAPH = "workbench/api/graph"
sys.path.insert(0, str(ROOT / "tests" / "widgets"))
import synth  # noqa: E402


def _pre() -> onnx.ModelProto:
    """raw [N, 8] -> Neg -> x: put in front of the MLP (compose)."""
    g = helper.make_graph([helper.make_node("Neg", ["raw"], ["x"], name="neg")], "pre",
                          [helper.make_tensor_value_info("raw", TensorProto.FLOAT, ["N", 8])],
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 8])])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    base = tmp_path_factory.mktemp("labext-edit")
    root = base / "root"
    (root / "sub").mkdir(parents=True)
    for name in ("mlp.onnx", "a.onnx", "b.onnx", "c.onnx", ".hidden.onnx"):
        onnx.save(synth.mlp(), str(root / name))
    onnx.save(_pre(), str(root / "pre.onnx"))
    onnx.save(_pre(), str(base / "outside.onnx"))
    (root / "link-out.onnx").symlink_to(base / "outside.onnx")
    (base / "outdir").mkdir()
    (root / "dir-out").symlink_to(base / "outdir", target_is_directory=True)
    (root / "dangling-out.onnx").symlink_to(base / "nowhere.onnx")
    env = {"WORKBENCH_EDIT_WORKERS": "2", "WORKBENCH_EDIT_TIMEOUT": "120"}
    old = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        srv = jupyter.start(base / "srv", root, lab=False, server_config={
            "ServerApp": {"jpserver_extensions": {"workbench": True}},
            "ContentsManager": {"allow_hidden": False}})
    except RuntimeError as e:
        pytest.fail(str(e))
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    yield srv
    srv.stop()


def _post(server, body, **kw):
    return server.post(EDIT, body, **kw)


def _open(server, path):
    status, d = _post(server, {"op": "open", "path": path})
    assert status == 200 and d["ok"], d
    return d["session"], d


def _act(server, sid, action, target, **params):
    return _post(server, {"session": sid, "op": "action", "action": action, "target": target,
                          "params": params})


def test_edit_save_and_read_back(server):
    root = server.root
    sid, d = _open(server, "mlp.onnx")
    assert d["source"] == "onnx-workbench" and d["state"]["steps"] == []
    assert "relu1" in d["graph"]["name"] and set(d["details"]) >= {"relu1", "x", "y"}
    assert d["graph"]["ref"] and d["graph"]["evalue"]
    st, r = _act(server, sid, "bypass", {"kind": "node", "ref": "relu1"})
    assert st == 200 and r["ok"], r
    assert "relu1" not in r["graph"]["name"] and "relu1" not in r["details"]
    assert r["state"]["last"]["call"] == "session.bypass_node(node='relu1')"
    assert r["graph"]["marks"]["removed"] == ["relu1"]
    # refused: said, nothing changed
    st, r = _act(server, sid, "delete", {"kind": "node", "ref": "fc1"})
    assert st == 200 and r["ok"] is False and "cannot be deleted" in r["error"]
    assert "graph" not in r
    st, r = _post(server, {"session": sid, "op": "script"})
    assert "edit.open('mlp.onnx')" in r["script"] and str(root) not in r["script"]
    # Save: the file exists, so the answer asks; nothing written until overwrite
    before = (root / "mlp.onnx").read_bytes()
    st, r = _post(server, {"session": sid, "op": "save"})
    assert r["ok"] is False and r["exists"] is True and "mlp.onnx exists" in r["error"]
    assert (root / "mlp.onnx").read_bytes() == before
    st, r = _post(server, {"session": sid, "op": "save", "overwrite": True})
    assert r["ok"] and r["saved"] == "mlp.onnx" and r["state"]["unsaved"] is False, r
    st, g = server.get(GRAPH, {"path": "mlp.onnx"})
    assert st == 200 and g["summary"]["nodes"] == 5 and "relu1" not in g["graph"]["name"]
    # Save As in a sub-folder; undo; the session goes on
    st, r = _post(server, {"session": sid, "op": "undo"})
    assert r["ok"] and "relu1" in r["graph"]["name"] and r["state"]["unsaved"] is True
    st, r = _post(server, {"session": sid, "op": "save", "path": "sub/copy.onnx"})
    assert r["ok"], r
    assert len(onnx.load(str(root / "sub" / "copy.onnx")).graph.node) == 6
    assert sorted(p.name for p in (root / "sub").iterdir()) == ["copy.onnx"]   # no debris
    st, r = _post(server, {"session": sid, "op": "compare", "against": "original"})
    assert r["ok"] is False and "nothing to compare" in r["error"]
    st, r = _post(server, {"session": sid, "op": "close"})
    assert r["closed"]
    st, r = _post(server, {"session": sid, "op": "undo"})
    assert st == 410 and r["ended"] and "press Edit" in r["error"]


@pytest.mark.parametrize("path,status,words", [
    ("../outside.onnx", 403, "outside the server's root"),
    ("link-out.onnx", 403, "outside the server's root"),
    ("/etc/passwd", 404, "file not found"),
    ("missing.onnx", 404, "file not found"),
    ("sub", 400, "folder"),
    (".hidden.onnx", 404, "hidden files"),
    ("a\x00.onnx", 400, "NUL character"),
    ("", 400, "path"),
])
def test_open_refuses(server, path, status, words):
    st, r = _post(server, {"op": "open", "path": path})
    assert st == status and r["ok"] is False and words in r["error"], r
    assert str(server.root) not in r["error"]


def test_paths_in_requests_stay_under_the_root(server):
    sid, _ = _open(server, "a.onnx")
    for path, words in (("../a2.onnx", "outside the server's root"),
                        ("link-out.onnx", "outside the server's root"),
                        ("dir-out/new.onnx", "outside the server's root"),
                        ("dangling-out.onnx", "outside the server's root"),
                        ("sub/../../a2.onnx", "outside the server's root"),
                        ("a\x00.onnx", "NUL character"),
                        ("notes.txt", "saved as an .onnx file"),
                        ("sub", "folder"), (".hidden.onnx", "hidden")):
        st, r = _post(server, {"session": sid, "op": "save", "path": path, "overwrite": True})
        assert r["ok"] is False and words in r["error"], (path, r)
    assert not (server.root.parent / "a2.onnx").exists()
    assert not (server.root.parent / "nowhere.onnx").exists()
    assert list((server.root.parent / "outdir").iterdir()) == []
    assert (server.root.parent / "outside.onnx").read_bytes() == _pre().SerializeToString()
    compose = {"kind": "model"}
    for path, words in (("../outside.onnx", "outside"), ("link-out.onnx", "outside"),
                        ("nope.onnx", "not found")):
        st, r = _act(server, sid, "compose", compose, path=path, connect="x=x", before=True)
        assert r["ok"] is False and words in r["error"], (path, r)
    st, r = _post(server, {"session": sid, "op": "apply", "record": {
        "edit": "compose", "args": {"other": {"__model__": {"path": "../outside.onnx"}},
                                    "connect": {"x": "x"}, "before": True}}})
    assert r["ok"] is False and "outside" in r["error"]
    st, r = _act(server, sid, "compose", compose, path="pre.onnx", connect="x=x", before=True,
                 prefix="pre/")
    assert r["ok"], r
    assert "pre/neg" in r["graph"]["name"]
    st, r = _post(server, {"session": sid, "op": "script"})
    assert "'pre.onnx'" in r["script"] and str(server.root) not in r["script"]
    _post(server, {"session": sid, "op": "close"})


def test_requests_need_credentials_and_json(server):
    st, r = _post(server, {"op": "open", "path": "mlp.onnx"}, token=None)
    assert st == 403
    st, r = _post(server, {"op": "open", "path": "mlp.onnx"}, token="wrong")
    assert st == 403
    st, r = _post(server, b"{not json")
    assert st == 400 and "not JSON" in r["error"]
    st, r = _post(server, b"[1]")
    assert st == 400
    st, r = _post(server, b'{"op": "open", "path": "' + b"x" * (17 * 2**20) + b'"}')
    assert st == 413 and "too big" in r["error"]
    st, r = _post(server, {"session": "made-up", "op": "undo"})
    assert st == 410
    st, r = server.get(EDIT)
    assert st == 405


def _edit_workers(pid: int) -> list[int]:
    """The edit worker processes under process ``pid``."""
    children: dict = {}
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                ppid = int((d / "stat").read_text().rsplit(")", 1)[1].split()[1])
                cmd = (d / "cmdline").read_bytes()
            except (OSError, ValueError, IndexError):
                continue
            children.setdefault(ppid, []).append((int(d.name), cmd))
    out, todo = [], [pid]
    while todo:
        for child, cmd in children.get(todo.pop(), []):
            todo.append(child)
            if b"workbench.labext_edit" in cmd:
                out.append(child)
    return out


def test_sessions_share_the_workers(server):
    """Three sessions, two worker processes: the least recently used session's worker is
    taken, and that session is restored from its log (replayed) when it is used again."""
    a, _ = _open(server, "a.onnx")
    st, r = _act(server, a, "bypass", {"kind": "node", "ref": "relu1"})
    assert r["ok"], r
    b, _ = _open(server, "b.onnx")
    c, _ = _open(server, "c.onnx")              # takes a's worker
    time.sleep(0.5)                              # (a's worker is killed in the background)
    assert len(_edit_workers(server.proc.pid)) <= 2
    t0 = time.perf_counter()
    st, r = _act(server, a, "rename_node", {"kind": "node", "ref": "fc1"}, new="first")
    assert st == 200 and r["ok"], r              # a's first edit is still there
    assert [s["edit"] for s in r["state"]["steps"]] == ["bypass_node", "rename_node"]
    assert "relu1" not in r["graph"]["name"] and "first" in r["graph"]["name"]
    print(f"\nrestored a session with one edit in {time.perf_counter() - t0:.1f} s")
    st, r = _post(server, {"session": b, "op": "state"})
    assert r["ok"] and r["state"]["steps"] == []
    for sid in (a, b, c):
        _post(server, {"session": sid, "op": "close"})


# ---------------------------------------------------------------------------- budgets
def _slow_model(n: int = 40_000) -> onnx.ModelProto:
    """n Relu nodes in a row: opening it for editing (checked, run, drawn) takes far longer
    than 3 s on any machine (~1 minute here)."""
    nodes = [helper.make_node("Relu", [f"v{i}"], [f"v{i + 1}"], name=f"r{i}")
             for i in range(n)]
    g = helper.make_graph(nodes, "chain", [helper.make_tensor_value_info("v0", 1, [4])],
                          [helper.make_tensor_value_info(f"v{n}", 1, [4])])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    return m


def test_a_request_beyond_its_budgets_is_stopped(tmp_path):
    """A pool in this process with a 3 s budget per request and 600 MiB per worker: opening
    a 40,000-node model (checked by running it) runs out of time, a model with 1 GiB of
    weights out of memory; both are answered as such, and leave no session behind."""
    from workbench.labext_edit import EditPool
    root = tmp_path / "root"
    root.mkdir()
    onnx.save(_slow_model(), str(root / "slow.onnx"))
    hm.write_external_data_model(str(root), 2**30, name="heavy.onnx")

    async def run():
        pool = EditPool(workers=1, timeout=3, memory=600 * 2**20)
        try:
            t0 = time.perf_counter()
            st, body = await pool.open(str(root / "slow.onnx"), "slow.onnx", str(root))
            slow = (st, body, time.perf_counter() - t0)
            st, body = await pool.open(str(root / "heavy.onnx"), "heavy.onnx", str(root))
            heavy = (st, body)
            return slow, heavy, len(pool.sessions)
        finally:
            pool.close()
    slow, heavy, n = asyncio.run(run())
    import json
    st, body, seconds = slow
    d = json.loads(body)
    assert st == 422 and "took longer than 3 s" in d["error"] and "slow.onnx" in d["error"]
    assert seconds < 60
    st, body = heavy
    d = json.loads(body)
    assert st == 422 and "memory" in d["error"] and "heavy.onnx" in d["error"], d
    assert str(root) not in d["error"]
    assert n == 0                                   # the failed opens left no session
    shutil.rmtree(root)
