"""The ONNX Graph viewer's endpoint (``GET /workbench/api/graph``) under hostile files (issue 20).

Starts a bare jupyter_server with the workbench server extension on 127.0.0.1 (the code of the
checkout this script is in) and measures, one request at a time unless said otherwise:

- fan-in: one Concat with N inputs (2,500 ... 20,000), answer time and status;
- a valid model with a 1 GiB initializer (a sparse file), and one whose 1 GiB initializer
  is in an external file: answer time, status, and the server's RSS (its own, and its
  children's: the viewer's worker processes) before and after;
- a normal request (a ResNet-18 export, 46 MB; falls back to the default model without
  PyTorch) alone, then while ``--parallel`` hostile requests run (for the fan-in file of
  ``--load-inputs`` inputs, as in the issue, and the 1 GiB model), and ``/api/status``
  polled meanwhile. ``--big 0`` leaves the 1 GiB models out (a server that reads them whole
  may not survive them).

Run: ``python benchmarks/bench_viewer_server.py`` from the checkout to measure (to compare with
an older version, copy this file and ``tests/helpers/hostile_models.py`` into that checkout).

``--timeout`` bounds each request on the client side (the old code took minutes on 20,000
inputs). Prints one line per measurement.
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import json
import os
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

API = "workbench/api/graph"


def _rss_mib(pid: int) -> tuple[float, float]:
    """(VmRSS, VmHWM) of ``pid`` in MiB."""
    out = {}
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith(("VmRSS:", "VmHWM:")):
                    out[line.split(":")[0]] = int(line.split()[1]) / 1024
    except OSError:
        pass
    return out.get("VmRSS", 0.0), out.get("VmHWM", 0.0)


def _children(pid: int) -> list[int]:
    kids = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            ppid = int((d / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        if ppid == pid:
            kids.append(int(d.name))
            kids.extend(_children(int(d.name)))
    return kids


def _tree_rss(pid: int) -> str:
    own = _rss_mib(pid)
    kids = [_rss_mib(k)[0] for k in _children(pid)]
    return (f"server RSS {own[0]:.0f} MiB (peak {own[1]:.0f}), {len(kids)} child "
            f"process(es) {sum(kids):.0f} MiB")


def _models(root: Path, fan_ins, load_inputs: int, big: int) -> dict:
    import onnx

    from tests.helpers import hostile_models as hm
    out = {}
    for n in sorted(set(fan_ins) | {load_inputs}):
        p = root / f"fan_in_{n}.onnx"
        onnx.save(hm.fan_in_concat(n), str(p))
        out[f"fan_in_{n}"] = p.name
    if big:
        hm.write_big_initializer_model(root / "big_init.onnx", big)
        out["big_init"] = "big_init.onnx"
        (root / "ext").mkdir()
        hm.write_external_data_model(root / "ext", big)
        out["big_external"] = "ext/model.onnx"
    try:
        from tests.helpers import torch_models as tm
        model, example = tm.build("resnet18")
        onnx.save(tm.export_onnx(model, example), str(root / "resnet18.onnx"))
        out["normal"] = "resnet18.onnx"
    except Exception as e:  # noqa: BLE001 - no torch: the small default model
        print(f"(no ResNet-18 export: {type(e).__name__}: {e}; using the default model)")
        import shutil
        shutil.copy(ROOT / "workbench" / "data" / "default_model.onnx", root / "normal.onnx")
        out["normal"] = "normal.onnx"
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--fan-in", type=int, nargs="*", default=[2500, 5000, 10000, 20000])
    ap.add_argument("--big", type=int, default=2**30,
                    help="initializer bytes (default 1 GiB; 0: no big models)")
    ap.add_argument("--parallel", type=int, default=8)
    ap.add_argument("--load-inputs", type=int, default=10_000)
    ap.add_argument("--timeout", type=float, default=300)
    args = ap.parse_args()

    from tests.helpers import jupyter

    base = Path(tempfile.mkdtemp(prefix="bench-viewer-server-"))
    root = base / "root"
    root.mkdir()
    models = _models(root, args.fan_in, args.load_inputs, args.big)
    srv = jupyter.start(base / "srv", root, lab=False,
                        server_config={"ServerApp": {"jpserver_extensions": {"workbench": True}}})
    pid = srv.proc.pid
    print(f"checkout {ROOT}; CPU: {_cpu()}; {_tree_rss(pid)}")

    def get(name, timeout=args.timeout):
        """(status, seconds until the whole answer arrived, error message); the answer is
        parsed after the clock stops (parsing megabytes of JSON in 8 client threads at once
        would otherwise be measured as the server's latency)."""
        url = f"{srv.url}/{API}?" + urllib.parse.urlencode({"path": models.get(name, name)})
        req = urllib.request.Request(url, headers={"Authorization": f"token {srv.token}"})
        t0 = time.perf_counter()
        try:
            with urllib.request.urlopen(req, timeout=timeout) as r:
                status, body = r.status, r.read()
        except urllib.error.HTTPError as e:
            status, body = e.code, e.read()
        except Exception as e:  # noqa: BLE001 - a client-side timeout
            return "timeout", time.perf_counter() - t0, str(e)
        dt = time.perf_counter() - t0
        msg = ""
        if status != 200:
            try:
                msg = json.loads(body).get("error", "")
            except ValueError:
                msg = body[:200].decode("utf-8", "replace")
        return status, dt, msg

    try:
        for name in ("normal", "normal"):
            st, dt, msg = get(name)
            print(f"normal model ({models['normal']}): {st} in {dt:.2f} s {msg[:120]}")
        normal_alone = dt
        for n in args.fan_in:
            st, dt, msg = get(f"fan_in_{n}")
            print(f"fan-in {n:>6} inputs: {st} in {dt:.2f} s {msg[:160]}; {_tree_rss(pid)}")
        for name in ("big_init", "big_external") if args.big else ():
            st, dt, msg = get(name)
            print(f"{name} ({args.big / 2**30:g} GiB): {st} in {dt:.2f} s {msg[:200]}; "
                  f"{_tree_rss(pid)}")
        # a normal request while hostile ones run
        hostile = [f"fan_in_{args.load_inputs}"] * (args.parallel - (1 if args.big else 0))
        hostile += ["big_init"] if args.big else []
        status_times = []
        stop = threading.Event()

        def poll_status():
            while not stop.is_set():
                t0 = time.perf_counter()
                srv.get("api/status", timeout=args.timeout)
                status_times.append(time.perf_counter() - t0)
                time.sleep(0.25)

        with cf.ThreadPoolExecutor(args.parallel + 2) as ex:
            t0 = time.perf_counter()
            futs = [ex.submit(get, h) for h in hostile]
            poller = ex.submit(poll_status)
            time.sleep(0.5)
            st, dt, msg = get("normal")
            print(f"normal model under load ({args.parallel} hostile requests started "
                  f"0.5 s before): {st} in {dt:.2f} s (alone: {normal_alone:.2f} s) {msg[:120]}")
            res = [f.result() for f in futs]
            stop.set()
            poller.result()
            print(f"hostile requests: {[(r[0], round(r[1], 1)) for r in res]}; all done "
                  f"{time.perf_counter() - t0:.1f} s after the start")
            print(f"/api/status during the load: {len(status_times)} requests, max "
                  f"{max(status_times):.2f} s, median "
                  f"{sorted(status_times)[len(status_times) // 2]:.3f} s")
        print(_tree_rss(pid))
    finally:
        srv.stop()


def _cpu() -> str:
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                return f"{line.split(':', 1)[1].strip()} x{os.cpu_count()}"
    except OSError:
        pass
    return "unknown"


if __name__ == "__main__":
    main()
