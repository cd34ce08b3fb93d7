"""Is a slow process our code or the machine? Our engine's run next to a reference kernel.

Runs ``--processes`` fresh processes; each prepares one model with our engine, makes 5 warm-up
runs, then ``--runs`` times: the reference kernel (a 64x64 float32 product 150 times, operands
in L1: only the core's own speed moves it, see ``bench_inference.reference_ms``), one run of
the model, the reference kernel again — all on the process' CPU time, one thread. It then
splits all runs into a fast phase (reference within 8 % of its base, the median of its faster
half) and a slow phase (reference over 1.2x its base) and prints:

- per process: the model's median and minimum, the reference's median, their ratio;
- over all runs: the share of slow-phase runs, the model's median in each phase against the
  reference's (the same factor in both: the core changed speed, not our code), and the
  correlation of model and reference times over all runs.

On the project's 2-core KVM guest the model and the reference slow down together by 1.3-1.5x
for seconds at a time (benchmarks/README.md, "ShuffleNetV2 b8's two speeds").

    python benchmarks/bench_core_phases.py --model shufflenetv2 --batch 8 --processes 30
    python benchmarks/bench_core_phases.py --onnx my.onnx --inputs my_inputs.npz

``--onnx`` / ``--inputs`` take any model and an ``.npz`` of its inputs in input order
(``arr_0``, ``arr_1``, ...); ``--model`` builds one of bench_inference's models (needs torch
for the exported ones). Not part of the test pass/fail.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


def child(model: str, npz: str, runs: int) -> dict:
    """One process: the (reference, model, reference) triples of ``runs`` runs, CPU ms."""
    import workbench.backend as backend
    from benchmarks import bench_inference as bi
    from workbench.ops.parallel import one_blas_thread

    bi.CLOCK[0] = time.process_time
    inputs = bi._read_inputs(npz)
    rep = backend.prepare(model)
    for _ in range(5):
        rep.run(inputs)
    clock, model_ms, ref_ms = time.process_time, [], []
    with one_blas_thread():
        for _ in range(runs):
            r0 = bi.reference_ms(1)
            t0 = clock()
            rep.run(inputs)
            model_ms.append((clock() - t0) * 1e3)
            ref_ms.append((r0 + bi.reference_ms(1)) / 2)
    return {"model_ms": model_ms, "ref_ms": ref_ms}


def summary(results: list[dict]) -> dict:
    """The phase split of all runs (see the module docstring)."""
    model = np.concatenate([r["model_ms"] for r in results])
    ref = np.concatenate([r["ref_ms"] for r in results])
    base = float(np.median(ref[ref <= np.median(ref)]))
    fast, slow = ref < 1.08 * base, ref > 1.2 * base
    out = {"runs": int(model.size), "ref_base_ms": base, "slow_share": float(slow.mean()),
           "corr": float(np.corrcoef(model, ref)[0, 1]) if model.size > 1 else None}
    if fast.any() and slow.any():
        out.update(model_fast_ms=float(np.median(model[fast])),
                   model_slow_ms=float(np.median(model[slow])),
                   ref_fast_ms=float(np.median(ref[fast])),
                   ref_slow_ms=float(np.median(ref[slow])))
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="shufflenetv2",
                   help="one of bench_inference's models (built into a temporary folder)")
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--onnx", type=Path, help="a model file instead of --model")
    p.add_argument("--inputs", type=Path, help="with --onnx: an .npz of its inputs in order")
    p.add_argument("--processes", type=int, default=30)
    p.add_argument("--runs", type=int, default=30, help="runs per process")
    p.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        print(json.dumps(child(args.child[0], args.child[1], args.runs)))
        return 0
    if (args.onnx is None) != (args.inputs is None):
        p.error("--onnx and --inputs go together")
    if args.processes < 1 or args.runs < 1:
        p.error("--processes and --runs are at least 1")
    env = dict(os.environ)
    for v in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "WORKBENCH_NUM_THREADS"):
        env[v] = "1"
    env.setdefault("WORKBENCH_COMPILED", "wait")
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    with tempfile.TemporaryDirectory(prefix="wb-phases-") as tmp:
        if args.onnx is not None:
            model, npz, name = args.onnx, args.inputs, args.onnx.name
        else:
            from benchmarks import bench_inference as bi

            model, npz = bi.model_files(args.model, args.batch, Path(tmp), {})
            name = f"{args.model} b{args.batch}"
        print(f"{name}: {args.processes} fresh processes x {args.runs} runs, CPU time, one "
              f"thread (load average {os.getloadavg()[0]:.2f})")
        results = []
        for i in range(args.processes):
            cmd = [sys.executable, str(Path(__file__).resolve()), "--child", str(model),
                   str(npz), "--runs", str(args.runs)]
            proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=900)
            if proc.returncode != 0:
                tail = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
                print(f"  process {i}: failed: {' | '.join(tail)}")
                continue
            r = json.loads(proc.stdout.strip().splitlines()[-1])
            results.append(r)
            med, ref = statistics.median(r["model_ms"]), statistics.median(r["ref_ms"])
            print(f"  process {i:2d}: model median {med:8.2f} ms, min {min(r['model_ms']):8.2f}"
                  f" | reference median {ref:.2f} ms | model / reference {med / ref:.1f}",
                  flush=True)
    if not results:
        return 1
    s = summary(results)
    print(f"\n{s['runs']} runs; reference base {s['ref_base_ms']:.2f} ms; "
          f"{100 * s['slow_share']:.0f} % of runs in a slow phase (reference > 1.2x base); "
          f"correlation model vs reference {s['corr']:.2f}")
    if "model_fast_ms" in s:
        print(f"model: fast phase {s['model_fast_ms']:.2f} ms, slow phase "
              f"{s['model_slow_ms']:.2f} ms ({s['model_slow_ms'] / s['model_fast_ms']:.2f}x); "
              f"reference {s['ref_slow_ms'] / s['ref_fast_ms']:.2f}x")
    print(f"process medians {min(statistics.median(r['model_ms']) for r in results):.2f}-"
          f"{max(statistics.median(r['model_ms']) for r in results):.2f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
