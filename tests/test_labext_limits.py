"""The viewer's endpoint under hostile files (issue 20): ``GET /workbench/api/graph`` stays
responsive and bounded.

A real jupyter_server runs the extension with stated budgets (2 workers, 30 s and 1 GiB per
model); the tests check that a 20,000-input fan-in answers within the 30 s budget, that a valid
model with a 1 GiB initializer and one with 1 GiB of external data are described without being
read (the server's and the workers' memory stay small), that error messages name files
relative to the server's root, and that a normal request and ``/api/status`` keep answering
while hostile requests run. The pool's budgets themselves (a model slower than its time
budget, or bigger than its memory budget: stopped, answered as such, remembered, the next
request served by a fresh worker) are checked on a pool in the test process with budgets
small enough to be certain. Also: the structure-only load itself, and the checker helper
reporting running out of memory as such.
"""

from __future__ import annotations

import concurrent.futures as cf
import json
import os
import shutil
import sys
import threading
import time
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from tests.helpers import hostile_models as hm
from tests.helpers import jupyter

pytest.importorskip("jupyter_server", reason="jupyter_server is not installed (the lab extra)")

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_MODEL = ROOT / "workbench" / "data" / "default_model.onnx"
API = "workbench/api/graph"
TIMEOUT = 30         # the test server's budget per model (seconds)
GIB = 2**30


def _chain(n: int) -> onnx.ModelProto:
    """n Relu nodes in a row: valid, and slow to lay out when n is large (100,000 nodes take
    ~30 s on this project's 2-core machine; several seconds on any machine)."""
    nodes = [helper.make_node("Relu", [f"v{i}"], [f"v{i + 1}"], name=f"r{i}") for i in range(n)]
    g = helper.make_graph(nodes, "chain", [helper.make_tensor_value_info("v0", 1, [1])],
                          [helper.make_tensor_value_info(f"v{n}", 1, [1])])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    return m


def _rss_mib(pid: int) -> float:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


def _descendants(pid: int) -> list[int]:
    out = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                ppid = int((d / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
            if ppid == pid:
                out += [int(d.name)] + _descendants(int(d.name))
    return out


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    base = tmp_path_factory.mktemp("labext-limits")
    root = base / "root"
    (root / "ext").mkdir(parents=True)
    shutil.copy(DEFAULT_MODEL, root / "normal.onnx")
    onnx.save(hm.fan_in_concat(20_000), str(root / "fan_in.onnx"))
    hm.write_big_initializer_model(root / "big_init.onnx", GIB)
    hm.write_external_data_model(root / "ext", GIB)
    # external data through a symbolic link that leaves the root
    (root / "linked").mkdir()
    outside = base / "outside"
    outside.mkdir()
    hm.write_external_data_model(outside, 4096, location="w.bin", name="unused.onnx")
    hm.write_external_data_model(root / "linked", 4096, location="w.bin", write_data=False)
    os.symlink(outside / "w.bin", root / "linked" / "w.bin")
    env = {"WORKBENCH_VIEWER_WORKERS": "2", "WORKBENCH_VIEWER_TIMEOUT": str(TIMEOUT),
           "WORKBENCH_VIEWER_MEMORY": "1GiB"}
    old = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        srv = jupyter.start(base / "srv", root, lab=False,
                            server_config={"ServerApp": {"jpserver_extensions":
                                                         {"workbench": True}}})
    except RuntimeError as e:
        pytest.fail(str(e))
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    srv.base = base
    yield srv
    srv.stop()


def _get(server, path, timeout=300):
    t0 = time.perf_counter()
    status, d = server.get(API, {"path": path}, timeout=timeout)
    return status, d, time.perf_counter() - t0


def _get_raw(server, path, timeout=300):
    """(status, body bytes, seconds): nothing parsed while the clock runs (eight threads of
    this process parsing megabytes of JSON at once would hold up the others, the /api/status
    poller among them, and that would be measured as the server's latency)."""
    import urllib.error
    import urllib.parse
    import urllib.request
    url = f"{server.url}/{API}?" + urllib.parse.urlencode({"path": path})
    req = urllib.request.Request(url, headers={"Authorization": f"token {server.token}"})
    t0 = time.perf_counter()
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            status, body = r.status, r.read()
    except urllib.error.HTTPError as e:
        status, body = e.code, e.read()
    return status, body, time.perf_counter() - t0


def test_fan_in_of_20000_inputs_answers_within_budget(server):
    """One Concat reading 20,000 graph inputs: the old drawing code was quadratic (399 s on
    this project's 2-core machine); now linear: ~3.5 s there with a warm worker (10 s with
    the machine shared by several test runs). Stated budget: the server's 30 s per model
    (over it, the answer is a 422, failing this test)."""
    _get(server, "normal.onnx")                      # both workers' start-up out of the way
    status, d, dt = _get(server, "fan_in.onnx")
    if status == 422 and "longer than" in d.get("error", ""):
        pytest.fail(f"the 20,000-input fan-in took longer than the {TIMEOUT} s budget: {d}")
    assert status == 200, d
    assert d["summary"]["inputs"][0]["name"] == "x0" and len(d["summary"]["inputs"]) == 20_000
    assert len(d["details"]["cat"]["inputs"]) == 20_000
    print(f"\n20,000-input fan-in: {dt:.2f} s ({d['timing']})")


@pytest.mark.parametrize("name, source", [("big_init.onnx", "raw_data"),
                                          ("ext/model.onnx", "external file 'weights.bin'")])
def test_a_1gib_model_is_described_not_read(server, name, source):
    before = _rss_mib(server.proc.pid)
    status, d, dt = _get(server, name)
    assert status == 200, d
    s = d["summary"]
    assert s["not_read"] == {"tensors": 1, "bytes": GIB}
    assert s["parameters"] == GIB // 4 and s["checker"] is None, s
    w = d["details"]["add"]["inputs"][1]
    assert w == {"name": "w", "shape": f"[{GIB // 4}]", "dtype": "float32", "param": True,
                 "count": GIB // 4}
    # nothing near 1 GiB was read or held: the server's and its workers' peak memory
    server_peak = _rss_mib(server.proc.pid)
    workers = [_rss_mib(p) for p in _descendants(server.proc.pid)]
    print(f"\n{name}: {dt:.2f} s; server peak RSS {before:.0f} -> {server_peak:.0f} MiB, "
          f"workers' peaks {[round(w) for w in workers]} MiB")
    assert server_peak - before < 100
    assert max(workers, default=0) < 512
    assert dt < 30


def test_external_data_symlink_error_names_no_server_path(server):
    status, d, _ = _get(server, "linked/model.onnx")
    assert status == 422, d
    err = d["error"]
    assert err.startswith("linked/model.onnx: ") and "outside the model's folder" in err, err
    assert str(server.base) not in err and os.path.realpath(server.base) not in err, err


def test_normal_requests_stay_responsive_under_hostile_load(server):
    """As in the issue: 8 requests for the same 20,000-input fan-in at once, plus both 1 GiB
    models, then a normal request. Identical requests share one job, so 3 jobs are ahead of
    the normal one on 2 workers, each bounded by the 30 s budget: it waits at most two rounds,
    2 x 30 s, plus a worker start-up (a few seconds); asserted: under 70 s. Measured on this
    project's 2-core machine: ~5-10 s (alone: 0.3 s); before issue 20 the same kind of load kept a
    ResNet-18 request waiting 37 s, and the 1 GiB external-data model alone brought the
    server down (out of memory). /api/status (the rest of JupyterLab) keeps answering: its
    median under 0.5 s and its worst under 3 s (measured here: ~0.1 s; the event loop never
    runs model work, which takes seconds of CPU per job: were it on the loop, most polls would
    wait seconds; the worst case allows for a machine whose 2 cores are shared by several busy
    processes)."""
    hostile = ["fan_in.onnx"] * 8 + ["big_init.onnx", "ext/model.onnx"]
    status_times, stop = [], threading.Event()

    def poll():
        while not stop.is_set():
            t0 = time.perf_counter()
            assert server.get("api/status", timeout=60)[0] == 200
            status_times.append(time.perf_counter() - t0)
            time.sleep(0.2)

    with cf.ThreadPoolExecutor(len(hostile) + 2) as ex:
        poller = ex.submit(poll)
        futs = [ex.submit(_get_raw, server, h) for h in hostile]
        time.sleep(0.3)
        status, body, dt = _get_raw(server, "normal.onnx")
        results = [f.result() for f in futs]
        stop.set()
        poller.result()
    print(f"\nnormal request under load: {dt:.2f} s; hostile answers "
          f"{[(r[0], round(r[2], 1)) for r in results]}; /api/status max "
          f"{max(status_times):.2f} s over {len(status_times)} requests")
    assert status == 200 and json.loads(body)["summary"]["nodes"] == 10
    assert dt < 70
    assert sorted(status_times)[len(status_times) // 2] < 0.5
    assert max(status_times) < 3.0
    assert [r[0] for r in results] == [200] * 10


def _pool_answer(pool, path):
    import asyncio
    t0 = time.perf_counter()
    status, body = asyncio.run(pool.answer(str(path), path.name, str(path.parent)))
    import json
    return status, json.loads(body), time.perf_counter() - t0


def test_pool_stops_a_model_over_its_time_budget(tmp_path):
    from workbench.labext_worker import ViewerPool
    onnx.save(_chain(100_000), str(tmp_path / "slow.onnx"))
    shutil.copy(DEFAULT_MODEL, tmp_path / "normal.onnx")
    pool = ViewerPool(workers=1, timeout=3.0)
    try:
        _pool_answer(pool, tmp_path / "normal.onnx")           # a warm worker
        status, d, dt = _pool_answer(pool, tmp_path / "slow.onnx")
        assert status == 422 and d["title"] == "Too slow to show", d
        assert d["error"].startswith("slow.onnx: ") and "longer than 3 s" in d["error"]
        assert dt < 20
        t0 = time.perf_counter()                 # the same file again: the answer is remembered
        assert _pool_answer(pool, tmp_path / "slow.onnx")[:2] == (status, d)
        assert time.perf_counter() - t0 < 1
        assert _pool_answer(pool, tmp_path / "normal.onnx")[0] == 200    # a fresh worker
        os.utime(tmp_path / "slow.onnx", ns=(1, 1))           # another version: tried again
        assert _pool_answer(pool, tmp_path / "slow.onnx")[0] == 422
    finally:
        pool.close()


def test_pool_answers_out_of_memory_as_such(tmp_path):
    """A worker limited to 300 MiB of address space cannot hold a 100,000-node model's
    drawing: the answer says it is too big for the budget, not that it is malformed."""
    from workbench.labext_worker import ViewerPool
    onnx.save(_chain(100_000), str(tmp_path / "big.onnx"))
    pool = ViewerPool(workers=1, timeout=300, memory=300 * 2**20)
    try:
        status, d, _ = _pool_answer(pool, tmp_path / "big.onnx")
        assert status == 422 and d["title"] == "Too big to show", d
        assert "300 MiB" in d["error"] and "not necessarily malformed" in d["error"]
    finally:
        pool.close()


# ----------------------------------------------------------------------------- in process
def test_structure_only_load_describes_big_tensors(tmp_path):
    from workbench.graph.external import UnreadTensor
    from workbench.graph.load import load
    from workbench.widgets.graph_data import all_node_details

    w = numpy_helper.from_array(np.arange(4096, dtype=np.float32).reshape(64, 64), "w")
    b = numpy_helper.from_array(np.ones(4, np.float32), "b")
    big_const = numpy_helper.from_array(np.ones((32, 64), np.float32), "c")
    nodes = [helper.make_node("Constant", [], ["k"], value=big_const, name="const"),
             helper.make_node("MatMul", ["x", "w"], ["h"], name="mm"),
             helper.make_node("Add", ["h", "k"], ["y"], name="add")]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", 1, [32, 64])],
                          [helper.make_tensor_value_info("y", 1, [32, 64])], [w, b])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    p = tmp_path / "m.onnx"
    onnx.save(m, str(p))
    lm = load(str(p), weights=False)
    assert lm.weights is False
    uw = lm.graph.initializers["w"]
    assert isinstance(uw, UnreadTensor) and uw.shape == (64, 64) and uw.nbytes == 16384
    assert uw.source == "raw_data" and uw.stored == 16384
    assert isinstance(lm.graph.initializers["b"], np.ndarray)       # small: read
    assert isinstance(lm.graph.nodes[0].attrs["value"], UnreadTensor)
    assert lm.proto.graph.output[0].type.tensor_type.shape.dim[1].dim_value == 64   # inferred
    det = all_node_details(lm.graph)
    assert det["mm"]["inputs"][1]["count"] == 4096
    with pytest.raises(Exception, match="loaded without its weights"):
        np.asarray(uw)
    full = load(str(p))
    assert np.array_equal(full.graph.initializers["w"], numpy_helper.to_array(w))


def test_structure_only_load_refuses_what_a_full_load_refuses(tmp_path):
    from workbench.errors import ModelLoadError
    from workbench.graph.load import load

    good = DEFAULT_MODEL.read_bytes()
    for data, words in ((good[: len(good) // 3], "not a valid ONNX model"), (b"", "empty"),
                        (b"\xff" * 50, "not a valid ONNX model")):
        p = tmp_path / "bad.onnx"
        p.write_bytes(data)
        with pytest.raises(ModelLoadError, match=words):
            load(str(p), weights=False)
    # raw_data shorter than its dims need
    t = onnx.TensorProto(name="w", data_type=TensorProto.FLOAT, dims=[4096])
    t.raw_data = b"\0" * 8000
    g = helper.make_graph([helper.make_node("Relu", ["w"], ["y"])], "g", [],
                          [helper.make_tensor_value_info("y", 1, [4096])], [t])
    with pytest.raises(ModelLoadError, match="raw_data has 8,000 bytes"):
        load(helper.make_model(g).SerializeToString(), weights=False)
    # external data outside the folder: refused without reading
    folder = tmp_path / "ext"
    folder.mkdir()
    path = hm.write_external_data_model(folder, 4096, location="../w.bin", write_data=False)
    with pytest.raises(ModelLoadError, match=r"contains '\.\.'"):
        load(path, weights=False)


def test_structure_only_load_time_does_not_grow_with_the_weights(tmp_path):
    from workbench.graph.load import load

    hm.write_big_initializer_model(tmp_path / "big.onnx", 4 * GIB - 4096)   # > 2 GiB: refused
    with pytest.raises(Exception, match="more than the 2 GiB"):
        load(str(tmp_path / "big.onnx"), weights=False)
    hm.write_big_initializer_model(tmp_path / "big.onnx", GIB)
    t0 = time.perf_counter()
    lm = load(str(tmp_path / "big.onnx"), check=False, shape_inference=False, weights=False)
    assert time.perf_counter() - t0 < 5           # reading 1 GiB would be seconds by itself
    assert lm.graph.initializers["w"].nbytes == GIB


def test_checker_helper_reports_out_of_memory_as_out_of_memory(monkeypatch):
    """onnx's data propagation costs ~200 bytes per element of a 1-D value: with the helper
    limited to 400 MiB and the guard against huge 1-D values lifted, inference on a
    10,000,000-element input runs out of memory. That is reported as out of memory (a
    warning: shapes unknown), not as a malformed model; the next model gets a fresh helper."""
    from workbench.graph import isolated
    from workbench.graph.load import load

    n = 10_000_000
    g = helper.make_graph([helper.make_node("Add", ["x", "x"], ["y"])], "g",
                          [helper.make_tensor_value_info("x", 1, [n])],
                          [helper.make_tensor_value_info("y", 1, None)])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    isolated._helper.kill()
    monkeypatch.setenv("WORKBENCH_HELPER_MEMORY", "400MiB")
    monkeypatch.setattr(isolated, "MAX_PROPAGATED", 2**40)
    with pytest.warns(UserWarning, match="ran out of memory") as rec:
        load(m, check=False)
    assert "malformed" not in str(rec[0].message) and "crashed" not in str(rec[0].message)
    monkeypatch.undo()
    isolated._helper.kill()
    assert load(m, check=False).proto.graph.output[0].type.tensor_type.shape.dim[0].dim_value == n


def test_memory_verdict():
    import signal

    from workbench.graph.isolated import memory_verdict
    assert "peak 3,900 MiB of its 4,096 MiB limit" in memory_verdict(
        -signal.SIGSEGV, 3900 * 2**20, 4 * GIB)
    assert memory_verdict(-signal.SIGSEGV, 100 * 2**20, 4 * GIB) is None
    assert "killed by the system" in memory_verdict(-signal.SIGKILL, 100 * 2**20, 4 * GIB)
    assert memory_verdict(-signal.SIGKILL, 100 * 2**20, 4 * GIB, killed_by_us=True) is None


def test_scrub_makes_server_paths_relative():
    from workbench.labext_worker import scrub
    root = "/srv/notebooks"
    text = ("/srv/notebooks/a/m.onnx: tensor 'w': external file '/srv/notebooks/a/w.bin' "
            "outside /srv/notebooks")
    assert scrub(text, root, "/srv/notebooks/a/m.onnx", "a/m.onnx") == \
        "a/m.onnx: tensor 'w': external file 'a/w.bin' outside ."


if sys.platform != "linux":                     # /proc and sparse files
    pytestmark = pytest.mark.skip(reason="Linux only (reads /proc)")
