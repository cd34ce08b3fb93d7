"""Where the time and memory go (issue 25): the accounting of ``workbench.analysis`` checked on
real models, one model per fresh process.

For each model (torch exports of ``tests/helpers/torch_models.py``, batch 1):

- **per-node times vs a plain run**: ``Analysis.profile_ours`` (the plain run's own pre-bound
  schedule with a clock around each kernel call: kernel calls only) - the sum of the per-node
  times against a plain ``plan.execute`` of the same Plan, both from the same alternated runs
  (means of the middle half; "run by run": the median of the pairs' ratios); the target is
  within 10 %;
- **memory**: the peak the schedule predicts against a measured run (tracemalloc around every
  kernel and gradient rule), for inference (the engine's graph) and a training step (the
  prediction includes the autodiff tape's objects: "tape (predicted)"); the target is within
  10 %;
- for ``--table MODEL`` (default mobilenetv2): the roofline table of its slowest nodes
  relative to their roof (op, FLOPs, bytes, intensity, bound, time ours / onnxruntime,
  % of roof).

Run from the repository root::

    python benchmarks/bench_analysis.py                       # resnet18 mobilenetv2 bert
    python benchmarks/bench_analysis.py --models mobilenetv2 --runs 40 --table mobilenetv2
    python benchmarks/bench_analysis.py --json out.json

On a shared machine give it many runs: the comparison is of means over the middle half of
alternated runs, which a burst of load hits alike.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

DEFAULT_MODELS = ("resnet18", "mobilenetv2", "bert")


def _export(name: str, folder: Path) -> tuple[Path, dict]:
    import numpy as np  # noqa: F401
    import onnx

    from tests.helpers import torch_models

    model, example = torch_models.build(name)
    proto = torch_models.export_onnx(model, example, None, opset=17)
    path = folder / f"{name}.onnx"
    onnx.save(proto, str(path))
    inputs = torch_models.example_inputs(name, 1, seq=32)
    names = [i.name for i in proto.graph.input
             if i.name not in {t.name for t in proto.graph.initializer}]
    return path, {n: tuple(x.shape) for n, x in zip(names, inputs)}


def worker(path: str, shapes: dict, runs: int, table: bool, top: int,
           clock: str = "cpu") -> dict:
    """One model in this (fresh) process."""
    from workbench.analysis import analyze

    out: dict = {"model": Path(path).stem}
    a = analyze(path, shapes)
    a.roofline()
    out["time"] = {}
    for c in ("wall", "cpu") if clock == "both" else (clock,):
        a.profile_ours(runs=runs, warmup=3, clock=c)
        t = a.ours
        out["time"][c] = {"sum_ms": t.sum_ms, "plain_ms": t.plain_ms, "ratio": t.ratio,
                          "paired_ratio": t.paired_ratio, "steps": len(t.steps),
                          "runs": runs}
    opt = analyze(path, shapes, optimized=True)
    inf = opt.memory(measure=True)
    train = a.memory(training=True, measure=True)
    out["memory"] = {
        "inference": {"predicted": inf.peak_bytes, "measured": inf.measured["peak"],
                      "inside_kernels": inf.measured["peak_during"],
                      "weights": inf.weights_bytes},
        "training": {"predicted": train.peak_bytes, "measured": train.measured["peak"],
                     "inside_kernels": train.measured["peak_during"],
                     "weights": train.weights_bytes,
                     "objects": train.measured.get("objects_forward_end"),
                     "tape_predicted": train.peak_tape_bytes,
                     "tape_forward_end": [s for s in train.steps
                                          if s["phase"] == "forward"][-1]["tape_bytes"]}}
    out["peaks"] = a.peaks.describe()
    if table:
        try:
            a.profile_ort(runs=max(10, runs // 2), warmup=2, threads=1)
        except Exception as e:  # noqa: BLE001 - the table without onnxruntime's column
            out["ort_error"] = str(e)[:200]
        rows = [r for r in a.records if r["time_ours_ms"] is not None and r["flops"]]
        rows.sort(key=lambda r: -r["time_ours_ms"])
        out["table"] = [{k: r[k] for k in ("node", "op", "flops", "bytes_read",
                                           "bytes_written", "intensity", "bound",
                                           "time_ours_ms", "time_ort_ms", "pct_of_roof")}
                        for r in rows[:top]]
        t = a.totals()
        out["totals"] = {"macs": t["macs"], "flops": t["flops"], "params": t["params"],
                         "time_ours_ms": t["time_ours_ms"], "time_ort_ms": t["time_ort_ms"]}
    return out


def _cpu() -> str:
    """The CPU's model name, its vector extensions that matter here and the CPU count."""
    from workbench.analysis.roofline import cpu_identity

    flags: set = set()
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            flags = set(next((ln for ln in f if ln.startswith("flags")), ":").split(":", 1)[1]
                        .split())
    except OSError:
        pass
    simd = [n for f, n in (("avx2", "AVX2"), ("avx512f", "AVX-512"), ("avx512_vnni", "VNNI"),
                           ("avx_vnni", "AVX-VNNI")) if f in flags]
    return f"{cpu_identity()[0]} ({', '.join(simd) or 'no AVX2'}); {os.cpu_count()} CPUs"


def _load() -> str:
    try:
        return " ".join(f"{x:.1f}" for x in os.getloadavg())
    except OSError:
        return "n/a"


def _mib(b) -> str:
    return f"{b / 2**20:.2f} MiB"


def _fmt_table(rows) -> str:
    from workbench.analysis import human

    head = ("| node | op | FLOPs | bytes | FLOP/B | bound | ours ms | ort ms | % of roof |\n"
            "|---|---|---|---|---|---|---|---|---|")
    lines = [head]
    for r in rows:
        moved = (r["bytes_read"] or 0) + (r["bytes_written"] or 0)
        ort = "" if r["time_ort_ms"] is None else f"{r['time_ort_ms']:.3f}"
        ort_note = "" if r["time_ort_ms"] is not None else "(fused)"
        lines.append(f"| {r['node']} | {r['op']} | {human(r['flops'])} | {human(moved, 'B')} | "
                     f"{r['intensity']:.1f} | {r['bound']} | {r['time_ours_ms']:.3f} | "
                     f"{ort or ort_note} | {r['pct_of_roof']:.1f} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", nargs="+", default=list(DEFAULT_MODELS))
    ap.add_argument("--runs", type=int, default=30)
    ap.add_argument("--table", default="mobilenetv2", help="model whose roofline table to print")
    ap.add_argument("--top", type=int, default=12)
    ap.add_argument("--json", help="write the results here")
    ap.add_argument("--clock", choices=["wall", "cpu", "both"], default="both",
                    help="the per-node timings' clock (cpu: the process' CPU time, for a "
                         "shared machine)")
    ap.add_argument("--worker", nargs=3, metavar=("PATH", "SHAPES", "TABLE"),
                    help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker:
        path, shapes, table = args.worker
        res = worker(path, {k: tuple(v) for k, v in json.loads(shapes).items()}, args.runs,
                     table == "1", args.top, args.clock)
        print("RESULT " + json.dumps(res, default=float))
        return 0
    try:
        import torch  # noqa: F401
    except ImportError:
        print("bench_analysis needs PyTorch (the models are torch exports)")
        return 1
    print(f"CPU: {_cpu()}; runs {args.runs}; load average {_load()}")
    results = []
    with tempfile.TemporaryDirectory(prefix="wb-bench-analysis-") as tmp:
        for name in args.models:
            path, shapes = _export(name, Path(tmp))
            cmd = [sys.executable, __file__, "--runs", str(args.runs), "--top", str(args.top),
                   "--clock", args.clock,
                   "--worker", str(path), json.dumps(shapes), "1" if name == args.table else "0"]
            env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep
                       + os.environ.get("PYTHONPATH", ""))
            p = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=str(ROOT))
            line = next((x for x in p.stdout.splitlines() if x.startswith("RESULT ")), None)
            if line is None:
                print(f"{name}: failed\n{p.stderr[-2000:]}")
                continue
            results.append(json.loads(line[len("RESULT "):]))
    print("\n| model | clock | steps | per-node sum ms | plain run ms | sum / run | run by run |")
    print("|---|---|---|---|---|---|---|")
    for r in results:
        for c, t in r["time"].items():
            print(f"| {r['model']} | {c} | {t['steps']} | {t['sum_ms']:.2f} | "
                  f"{t['plain_ms']:.2f} | {100 * (t['ratio'] - 1):+.1f} % | "
                  f"{100 * (t['paired_ratio'] - 1):+.1f} % |")
    print("\n| model | phase | predicted peak | of it: tape (predicted) | measured peak (between "
          "steps) | error | measured inside kernels | weights | tape at the forward's end: "
          "predicted / measured |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in results:
        for phase in ("inference", "training"):
            m = r["memory"][phase]
            err = 100 * (m["predicted"] / m["measured"] - 1)
            tape = _mib(m["tape_predicted"]) if m.get("tape_predicted") else ""
            obj = f"{_mib(m['tape_forward_end'])} / {_mib(m['objects'])}" \
                if m.get("objects") else ""
            print(f"| {r['model']} | {phase} | {_mib(m['predicted'])} | {tape} | "
                  f"{_mib(m['measured'])} | {err:+.1f} % | {_mib(m['inside_kernels'])} | "
                  f"{_mib(m['weights'])} | {obj} |")
    for r in results:
        if "table" in r:
            print(f"\n{r['model']}: the {len(r['table'])} slowest nodes (ours), roofline "
                  f"{r['peaks']}")
            print(_fmt_table(r["table"]))
            tt = r["totals"]
            print(f"totals: {tt['macs'] / 1e6:.0f} M MACs, {tt['params'] / 1e6:.2f} M "
                  f"parameters, ours {tt['time_ours_ms']:.2f} ms in the nodes, onnxruntime "
                  f"{(tt['time_ort_ms'] or 0):.2f} ms in kernels (1 thread)")
    for r in results[:1]:
        print(f"\nroofline: {r['peaks']}")
    print(f"\nload average at the end {_load()}")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1, default=float))
    return 0


if __name__ == "__main__":
    sys.exit(main())
