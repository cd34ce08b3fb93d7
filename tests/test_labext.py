"""The JupyterLab extension's server side (workbench/labext.py) and its packaging.

A real ``jupyter server`` is started on 127.0.0.1 with a token and the extension enabled in a
private config folder; ``GET /workbench/api/graph`` is checked on a good model, a 2,500-node
model, bad files, paths escaping the root, and without credentials. The packaging tests check
that the committed prebuilt front-end (workbench/labextension) is built from the current
graph_core.js / graph_view.js and is installed by a wheel and by an editable install (the
build backend's shared-data).
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import onnx
import pytest
from onnx import TensorProto, helper

from tests.helpers import jupyter

pytest.importorskip("jupyter_server", reason="jupyter_server is not installed (the lab extra)")

ROOT = Path(__file__).resolve().parents[1]
LABEXT = ROOT / "workbench" / "labextension"
STATIC = ROOT / "workbench" / "widgets" / "static"
DEFAULT_MODEL = ROOT / "workbench" / "data" / "default_model.onnx"
API = "workbench/api/graph"
sys.path.insert(0, str(ROOT / "tests" / "widgets"))
import synth  # noqa: E402


def _mystery_model() -> onnx.ModelProto:
    """Relu -> an operator the engine has no kernel for (custom domain) -> Relu."""
    nodes = [helper.make_node("Relu", ["x"], ["a"], name="r1"),
             helper.make_node("Mystery", ["a"], ["b"], name="m1", domain="com.example"),
             helper.make_node("Relu", ["b"], ["y"], name="r2")]
    g = helper.make_graph(nodes, "mystery",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17),
                                               helper.make_opsetid("com.example", 1)])


def _unsorted_model() -> onnx.ModelProto:
    """Nodes out of topological order (the loader sorts them) and an attribute Relu does not
    have: onnx.checker rejects it, the viewer still draws it."""
    nodes = [helper.make_node("Relu", ["a"], ["y"], name="r2", bogus=1),
             helper.make_node("Relu", ["x"], ["a"], name="r1")]
    g = helper.make_graph(nodes, "unsorted",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    base = tmp_path_factory.mktemp("labext")
    root = base / "root"
    (root / "models").mkdir(parents=True)
    shutil.copy(DEFAULT_MODEL, root / "models" / "digits.onnx")
    good = DEFAULT_MODEL.read_bytes()
    (root / "truncated.onnx").write_bytes(good[: len(good) // 3])
    (root / "garbage.onnx").write_bytes(b"this is not a protobuf \xff\xfe" * 10)
    (root / "empty.onnx").write_bytes(b"")
    (root / "a folder.onnx").mkdir()
    onnx.save(synth.transformer_like(blocks=100), str(root / "big.onnx"))
    onnx.save(_mystery_model(), str(root / "mystery.onnx"))
    onnx.save(_unsorted_model(), str(root / "unsorted.onnx"))
    outside = base / "outside.onnx"
    shutil.copy(DEFAULT_MODEL, outside)
    try:
        (root / "link-out.onnx").symlink_to(outside)
    except OSError:
        pass
    try:
        srv = jupyter.start(base / "srv", root, lab=False,
                            server_config={"ServerApp": {"jpserver_extensions":
                                                         {"workbench": True}}})
    except RuntimeError as e:
        pytest.fail(str(e))
    yield srv
    srv.stop()


def test_good_model(server):
    status, d = server.get(API, {"path": "models/digits.onnx"})
    assert status == 200, d
    assert d["source"] == "onnx-workbench" and d["path"] == "models/digits.onnx"
    s = d["summary"]
    assert s["file"] == "digits.onnx"
    assert s["producer"].startswith("onnx-workbench") and s["ir_version"] == 7
    assert s["opsets"] == [{"domain": "ai.onnx", "version": 13}]
    assert s["inputs"] == [{"name": "image", "dtype": "float", "shape": "[batch, 1, 8, 8]"}]
    assert s["outputs"] == [{"name": "logits", "dtype": "float", "shape": "[batch, 10]"}]
    assert s["nodes"] == s["nodes_total"] == 10 and s["parameters"] == 14378
    assert s["missing"] == [] and s["checker"] is None
    g = d["graph"]
    n = len(g["name"])
    assert n == 12 and g["kind"].count(1) == 1 and g["kind"].count(2) == 1   # + input, output
    for key in ("op", "kind", "group", "host", "nfold"):
        assert len(g[key]) == n, key
    assert len(g["edges"]) % 3 == 0 and len(g["edges"]) > 0         # src, dst, shape label
    assert all(0 <= a < n for a in g["edges"][0::3] + g["edges"][1::3])
    assert all(0 <= k < len(g["labels"]) for k in g["edges"][2::3])
    assert g["groups"]["label"][0] and g["colors"]["Conv"].startswith("#")
    assert sum(g["op_counts"].values()) == 10 and g["params"] == 14378
    # details for every node drawn, the same as GraphView's
    from workbench.graph.load import load
    from workbench.widgets.graph_data import node_details
    graph = load(str(DEFAULT_MODEL), check=False).graph
    assert set(d["details"]) == set(g["name"])
    for name in g["name"]:
        assert d["details"][name] == json.loads(json.dumps(node_details(graph, name))), name
    conv = d["details"]["/0/Conv"]
    assert conv["op"] == "Conv" and conv["params"] > 0 and conv["inputs"][1]["param"]
    assert d["details"]["image"]["op"] == "Input"


def test_large_model(server):
    t0 = time.perf_counter()
    status, d = server.get(API, {"path": "big.onnx"})
    dt = time.perf_counter() - t0
    assert status == 200, d
    assert d["summary"]["nodes"] >= 2500
    assert len(d["graph"]["name"]) == d["summary"]["nodes"] + 2
    assert len(d["details"]) >= 2500
    print(f"\n{d['summary']['nodes']}-node model: answered in {dt:.2f} s "
          f"({len(json.dumps(d)) / 1e6:.1f} MB of JSON; timing {d['timing']})")
    assert dt < 60


def test_static_analysis_overlay(server):
    """The viewer's colours without running anything: FLOPs, parameters, activation memory
    per node (symbolic dims bound to 1), a summary naming the file as the user knows it."""
    status, d = server.get(API, {"path": "models/digits.onnx"})
    assert status == 200, d
    ov = d["overlay"]
    keys = {m["key"] for m in ov["metrics"]}
    assert {"flops", "params", "activation_bytes", "intensity"} <= keys
    assert not keys & {"time_ours_ms", "time_ort_ms", "live_bytes_after"}   # nothing ran
    assert ov["metric"] == "flops" and ov["values"]
    from workbench.analysis import analyze
    a = analyze(str(DEFAULT_MODEL), default_dim=1)
    flops = next(m for m in ov["metrics"] if m["key"] == "flops")["values"]
    assert sum(flops.values()) == a.totals()["flops"]
    params = next(m for m in ov["metrics"] if m["key"] == "params")["values"]
    assert sum(params.values()) == 14378
    rows = dict(map(tuple, ov["summary"]))
    assert rows["model"] == "models/digits.onnx" and "bound to 1" in rows["shapes"]
    assert str(server.root) not in json.dumps(ov)


def test_measure_runs_the_model_in_a_worker(server):
    """The Measure button: our per-node times, onnxruntime's, the memory over the schedule."""
    status, d = server.get(API, {"path": "models/digits.onnx", "measure": "1"})
    assert status == 200, d
    assert set(d) == {"source", "path", "overlay"}
    ov = d["overlay"]
    keys = {m["key"] for m in ov["metrics"]}
    assert {"time_ours_ms", "live_bytes_after", "pct_of_roof", "bound"} <= keys
    rows = dict(map(tuple, ov["summary"]))
    assert "a plain run" in rows["time, ours"] and "peak memory" in rows
    assert str(server.root) not in json.dumps(ov)
    # a model the engine cannot run: said as such, in the summary, not a failure
    status, d = server.get(API, {"path": "mystery.onnx", "measure": "1"})
    assert status == 200, d
    notes = [t for k, t in d["overlay"]["summary"] if k == "not measured"]
    assert any(t.startswith("our engine: ") and "Mystery" in t for t in notes), notes
    assert any(t.startswith("memory: ") for t in notes), notes


def test_missing_kernels_are_listed(server):
    status, d = server.get(API, {"path": "mystery.onnx"})
    assert status == 200, d
    assert d["summary"]["missing"] == [{"op": "com.example::Mystery", "count": 1}]
    assert d["details"]["m1"]["domain"] == "com.example"


def test_checker_failure_is_shown_not_fatal(server):
    status, d = server.get(API, {"path": "unsorted.onnx"})
    assert status == 200, d
    assert "Unrecognized attribute: bogus" in d["summary"]["checker"]
    assert d["graph"]["name"] == ["x", "r1", "r2", "y"]      # sorted at load


@pytest.mark.parametrize("name, words", [
    ("truncated.onnx", "not a valid ONNX model"),
    ("garbage.onnx", "not a valid ONNX model"),
    ("empty.onnx", "empty"),
])
def test_bad_files(server, name, words):
    status, d = server.get(API, {"path": name})
    assert 400 <= status < 500, (status, d)
    assert d["source"] == "onnx-workbench"
    assert d["error"].startswith(f"{name}: ") and words in d["error"], d["error"]
    assert str(server.root) not in d["error"]          # the server's own folders stay private


def test_not_found_and_folder(server):
    status, d = server.get(API, {"path": "models/nope.onnx"})
    assert status == 404 and d["error"] == "models/nope.onnx: file not found"
    status, d = server.get(API, {"path": "a folder.onnx"})
    assert status == 400 and "is a folder" in d["error"]
    status, d = server.get(API, {})
    assert status == 400 and "'path' query argument is required" in d["error"]


@pytest.mark.parametrize("path", ["../outside.onnx", "models/../../outside.onnx",
                                  "link-out.onnx"])
def test_paths_outside_root_are_refused(server, path):
    if path == "link-out.onnx" and not (server.root / path).is_symlink():
        pytest.skip("symlinks are not available here")
    status, d = server.get(API, {"path": path})
    assert status == 403, (status, d)
    assert "outside the server's root" in d["error"] and "graph" not in d


def test_unauthenticated_is_refused(server):
    assert server.get(API, {"path": "models/digits.onnx"}, token=None)[0] == 403
    status, d = server.get(API, {"path": "models/digits.onnx"}, token="wrong")
    assert status == 403 and "graph" not in (d if isinstance(d, dict) else {})


def test_resolve_path(tmp_path):
    from workbench.labext import GraphRequestError, resolve_path
    root = tmp_path / "r"
    (root / "a").mkdir(parents=True)
    assert resolve_path(str(root), "a/m.onnx") == os.path.realpath(root / "a" / "m.onnx")
    assert resolve_path(str(root), "/a/m.onnx") == os.path.realpath(root / "a" / "m.onnx")
    for bad in ("../x.onnx", "a/../../x.onnx", "a/../..", ".."):
        with pytest.raises(GraphRequestError) as e:
            resolve_path(str(root), bad)
        assert e.value.status == 403
    with pytest.raises(GraphRequestError, match="NUL character") as e:     # not a 500
        resolve_path(str(root), "a/m\x00.onnx")
    assert e.value.status == 400


# ----------------------------------------------------------------------------- packaging
def test_extension_points():
    import workbench
    assert workbench._jupyter_server_extension_points() == [{"module": "workbench.labext"}]
    import workbench.labext as labext
    assert callable(labext._load_jupyter_server_extension)
    (paths,) = workbench._jupyter_labextension_paths()
    assert paths == {"src": "labextension", "dest": "@onnx-workbench/jupyterlab-onnx"}
    pkg = json.loads((Path(workbench.__file__).parent / paths["src"] / "package.json")
                     .read_text())
    assert pkg["name"] == paths["dest"]
    assert (LABEXT / pkg["jupyterlab"]["_build"]["load"]).is_file()
    src = json.loads((ROOT / "extensions" / "jupyterlab-onnx" / "package.json").read_text())
    assert src["name"] == pkg["name"] and src["version"] == pkg["version"]
    cfg = json.loads((ROOT / "jupyter-config" / "jupyter_server_config.d" /
                      "onnx_workbench.json").read_text())
    assert cfg == {"ServerApp": {"jpserver_extensions": {"workbench": True}}}


def test_prebuilt_extension_is_up_to_date():
    """The committed build embeds the sha256 of dagre.min.js + graph_core.js + graph_view.js +
    graph_edit.js it was built from (scripts/gen-core.mjs): editing the drawing code needs a
    rebuild."""
    digest = hashlib.sha256()
    for f in ("dagre.min.js", "graph_core.js", "graph_view.js", "graph_edit.js"):
        digest.update((STATIC / f).read_bytes())
    bundles = [p.read_text(errors="replace") for p in (LABEXT / "static").glob("*.js")]
    assert any(digest.hexdigest() in b for b in bundles), (
        "workbench/labextension was built from other versions of workbench/widgets/static/"
        "graph_core.js, graph_view.js or graph_edit.js: rebuild it with "
        "scripts/build-labextension.sh (needs node and npm) and commit workbench/labextension")


def _shared_data() -> dict:
    try:
        import tomllib
    except ImportError:  # Python 3.10
        tomllib = pytest.importorskip("tomli")
    cfg = tomllib.loads((ROOT / "pyproject.toml").read_text())
    return cfg["tool"]["hatch"]["build"]["targets"]["wheel"]["shared-data"]


DEST = "share/jupyter/labextensions/@onnx-workbench/jupyterlab-onnx"
SERVER_CONF = "etc/jupyter/jupyter_server_config.d/onnx_workbench.json"


def test_shared_data_ships_the_extension():
    """The build backend's shared-data maps the prebuilt extension folder to
    share/jupyter/labextensions/<name>/ (where JupyterLab looks), install.json next to it, and
    the server config to etc/jupyter/jupyter_server_config.d (where jupyter_server reads it)."""
    shared = _shared_data()
    assert shared["workbench/labextension"] == DEST
    assert shared["extensions/jupyterlab-onnx/install.json"] == f"{DEST}/install.json"
    assert shared["jupyter-config/jupyter_server_config.d/onnx_workbench.json"] == SERVER_CONF
    for src in shared:
        assert (ROOT / src).exists(), src
    name = json.loads((LABEXT / "package.json").read_text())["name"]
    assert DEST.endswith(name)


def _expected_install() -> set[str]:
    files = {f"{DEST}/{f.relative_to(LABEXT).as_posix()}" for f in LABEXT.rglob("*")
             if f.is_file()}
    return files | {f"{DEST}/install.json", SERVER_CONF}


# what a build backend prints when it dislikes a project's configuration (pip -v shows it)
_PACKAGING_WARNING = re.compile(r"Deprecat|SetuptoolsWarning|UserWarning|deprecated", re.I)


def _pip(*args, cwd=None) -> str:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update(PIP_DISABLE_PIP_VERSION_CHECK="1", PIP_ROOT_USER_ACTION="ignore")
    r = subprocess.run([sys.executable, "-m", "pip", *args, "-v", "--no-deps"],
                       capture_output=True, text=True, timeout=300, env=env, cwd=cwd)
    out = r.stdout + r.stderr
    assert r.returncode == 0, out[-3000:]
    warnings_ = [ln for ln in out.splitlines() if _PACKAGING_WARNING.search(ln)]
    assert not warnings_, "pip printed warnings about the packaging:\n" + "\n".join(warnings_)
    return out


@pytest.fixture(scope="module")
def installs(tmp_path_factory):
    """The package built as a wheel, and installed (without dependencies) from that wheel and
    as an editable install into two private prefixes, as pip does for a user. The
    environment running the tests keeps its own installation (checked after)."""
    base = tmp_path_factory.mktemp("installs")
    before = _installed_here()
    # offline when the build backend is installed (the test extra has hatchling)
    isolation = ["--no-build-isolation"] if importlib.util.find_spec("hatchling") else []
    _pip("wheel", str(ROOT), "-w", str(base / "wheel"), *isolation, cwd=base)
    wheel = next((base / "wheel").glob("onnx_workbench-*.whl"))
    # --ignore-installed: without it pip first uninstalls the package from the environment
    # running the tests (a prefix install still "replaces" what it finds installed)
    _pip("install", "--ignore-installed", "--prefix", str(base / "wheel-prefix"), str(wheel),
         cwd=base)
    _pip("install", "--ignore-installed", "--prefix", str(base / "editable-prefix"), "-e",
         str(ROOT), cwd=base)
    return {"wheel": wheel, "wheel-prefix": base / "wheel-prefix",
            "editable-prefix": base / "editable-prefix", "base": base, "before": before}


def _installed_here():
    """(version, files) of onnx-workbench as installed in the environment running the tests."""
    import importlib.metadata as md  # noqa: PLC0415
    try:
        dist = md.distribution("onnx-workbench")
    except md.PackageNotFoundError:
        return None
    return dist.version, sorted(str(f) for f in (dist.files or ()))


def test_private_installs_leave_the_environment_alone(installs):
    """Installing into private prefixes never uninstalls the environment's own copy."""
    assert _installed_here() == installs["before"]


def test_wheel_contents(installs):
    """The wheel holds the package (with the extension points and the prebuilt front-end) and,
    as .data, exactly the extension files for share/ and the server config for etc/."""
    import zipfile
    with zipfile.ZipFile(installs["wheel"]) as z:
        names = set(z.namelist())
        data = {n.split(".data/data/", 1)[1] for n in names if ".data/data/" in n}
        assert data == _expected_install()
        assert {"workbench/__init__.py", "workbench/labext.py",
                "workbench/labextension/package.json",
                "workbench/widgets/static/graph_core.js",
                "workbench/data/default_model.onnx"} <= names
        assert not any(n.startswith(("tests/", "notebooks/", "benchmarks/")) for n in names)
        meta = next(n for n in names if n.endswith(".dist-info/entry_points.txt"))
        assert "workbench = workbench.cli:main" in z.read(meta).decode()
        metadata = z.read(next(n for n in names if n.endswith(".dist-info/METADATA"))).decode()
        assert "Provides-Extra: lab" in metadata and "License-Expression: Apache-2.0" in metadata
        assert "Provides-Extra: notebooks" in metadata
        assert re.search(r"Requires-Dist: pillow.*extra == .dist.", metadata, re.I), \
            "the dist extra needs Pillow (SINGA's examples/cnn programs read images with it)"
        # the licence travels with the package
        assert "License-File: LICENSE" in metadata
        lic = next(n for n in names if n.endswith(".dist-info/licenses/LICENSE"))
        assert z.read(lic) == (ROOT / "LICENSE").read_bytes()


@pytest.mark.parametrize("kind", ["wheel", "editable"])
def test_install_puts_the_extension_where_jupyter_finds_it(installs, kind):
    """A wheel install and an editable install alike put the front-end and the server config
    into the prefix; JupyterLab, pointed at that prefix's share/jupyter (where it looks in an
    environment), lists the front-end as enabled and OK, and the server config there enables
    the server extension."""
    prefix = installs[f"{kind}-prefix"]
    got = {p.relative_to(prefix).as_posix() for p in prefix.rglob("*")
           if p.is_file() and p.relative_to(prefix).parts[0] in ("share", "etc")}
    assert got == _expected_install()
    assert not (prefix / DEST).is_symlink()
    # what JupyterLab does at page load to find prebuilt extensions: scan the labextensions
    # folders of the Jupyter data path (<prefix>/share/jupyter for an environment)
    pytest.importorskip("jupyterlab_server", reason="jupyterlab is not installed (the lab extra)")
    from jupyterlab_server.config import get_federated_extensions
    found = get_federated_extensions([str(prefix / "share" / "jupyter" / "labextensions")])
    ext = found["@onnx-workbench/jupyterlab-onnx"]
    assert ext["version"] == json.loads((LABEXT / "package.json").read_text())["version"]
    assert ext["install"] == {"packageManager": "python", "packageName": "onnx-workbench",
                              "uninstallInstructions": ext["install"]["uninstallInstructions"]}
    assert (Path(ext["ext_path"]) / ext["jupyterlab"]["_build"]["load"]).is_file()
    # jupyter_server reads jpserver_extensions from every config folder on its path
    # (<prefix>/etc/jupyter for an environment); `jupyter server extension list` shows only the
    # standard ones, so read the prefix's folder as the server does and validate the package
    from jupyter_server.extension.config import ExtensionConfigManager
    from jupyter_server.extension.manager import ExtensionPackage
    manager = ExtensionConfigManager(read_config_path=[str(prefix / "etc" / "jupyter")])
    assert manager.get_jpserver_extensions() == {"workbench": True}
    assert ExtensionPackage(name="workbench", enabled=True).validate()


def test_pyproject_links_exist():
    """No link in the packaging metadata points at a repository that does not exist: the
    project has no public home yet, so neither pyproject.toml nor the extension's
    package.json names one."""
    text = (ROOT / "pyproject.toml").read_text()
    assert "[project.urls]" not in text and "github.com" not in text
    for pkg in (ROOT / "extensions" / "jupyterlab-onnx" / "package.json",
                LABEXT / "package.json"):
        meta = json.loads(pkg.read_text())
        assert "repository" not in meta and "homepage" not in meta and "bugs" not in meta, pkg


def _jupyter(*args) -> str:
    r = subprocess.run([sys.executable, "-m", *args], capture_output=True, text=True,
                       timeout=120)
    return r.stdout + r.stderr


def test_installed_and_enabled():
    """After `pip install -e ".[lab]"` (scripts/setup-test-env.sh) or a wheel install,
    JupyterLab lists the front-end as enabled and OK, and the server extension as enabled."""
    pytest.importorskip("jupyterlab", reason="jupyterlab is not installed (the lab extra)")
    how = "pip install -e '.[lab]' again (scripts/setup-test-env.sh), or pip install the wheel"
    out = _jupyter("jupyterlab.labextensions", "list")
    line = next((ln for ln in out.splitlines() if "@onnx-workbench/jupyterlab-onnx" in ln), "")
    assert line, f"the ONNX Graph front-end is not installed: {how}\n{out}"
    assert "enabled" in line and "OK" in line, line
    out = _jupyter("jupyter_server", "extension", "list")
    lines = [ln for ln in out.splitlines() if ln.strip().startswith("workbench ")]
    assert any("enabled" in ln for ln in lines), f"server extension not enabled: {how}\n{out}"
    assert any("OK" in ln for ln in lines), out
