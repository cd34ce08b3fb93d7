"""The trainable model's API (``wb.load(m).run``) against ``backend.prepare(m).run``, in ONE
process, CPU time at one thread (``time.process_time``; a shared machine), the engines
alternated round by round.

Per model and batch: ``prepare`` (``backend.prepare(m).run``), ``model.run`` (the cached
prepared plan, ``workbench.singa.inference_cache``), ``variable`` (the variable-weight plan
through the Tensor runner: what ``model.run`` ran before the cache, and still runs on the one
run after a change of the weights), ``check`` (the exact per-run check alone: the graph's edit
count, every weight's identity/shape/dtype and a byte comparison with the snapshot), then the
cost of an in-place edit of one weight element: the run that notices it (variable plan +
new snapshot) and the next one (the prepared plan rebuilt). Outputs of ``model.run`` and
``prepare`` are checked bit for bit.

    python benchmarks/bench_model_run.py --files /tmp/s6 --models bert resnet18 --batches 1 8
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks._cpu import cpu_description, one_thread  # noqa: E402

one_thread()   # before numpy (BLAS) is imported

import argparse  # noqa: E402
import statistics  # noqa: E402
import time  # noqa: E402

import numpy as np  # noqa: E402


def _case(name, batch, files):
    if files:
        d = np.load(Path(files) / f"{name}_b{batch}.npz")
        keys = sorted(d.files, key=lambda s: int(s.split("_")[1]) if "_" in s and
                      s.split("_")[1].isdigit() else 0)
        return str(Path(files) / f"{name}.onnx"), [d[k] for k in keys]
    from benchmarks._cpu import torch_export_case
    proto, xs, _, _ = torch_export_case(name, batch)
    return proto, xs


def _times(fn, n):
    out = []
    for _ in range(n):
        t = time.process_time()
        fn()
        out.append(time.process_time() - t)
    return out


def _one(name, batch, args) -> None:
    import workbench as wb
    from workbench import backend

    src, xs = _case(name, batch, args.files)
    m, rep = wb.load(src), backend.prepare(src)
    for _ in range(3):
        a, b = m.run(*xs), rep.run(list(xs))
    assert all(np.array_equal(x, y) for x, y in zip(a, b)), "not bit for bit"
    (ent,) = m._inference_cache.values()
    snap, plan = ent[3], ent[2]
    outs = tuple(m._inference_cache)[0]
    n = args.runs or max(3, min(200, int(0.5 / max(1e-4, min(_times(
        lambda: rep.run(list(xs)), 3))))))
    res = {"prepare": [], "model.run": [], "variable": [], "check": []}
    for _ in range(args.rounds):
        res["prepare"] += _times(lambda: rep.run(list(xs)), n)
        res["model.run"] += _times(lambda: m.run(*xs), n)
        res["variable"] += _times(lambda: m._variable_run(xs, list(outs), ()), n)
        res["check"] += _times(snap.unchanged, n)
    assert m._inference_cache[outs][2] is plan, "the plan was rebuilt while timing"
    arena = snap.arena_live.nbytes if snap.arena_live is not None else 0
    w = next(t for t in m.imported_params().values() if t.data.size > 1)
    flat = w.data.reshape(-1)
    flat[flat.size // 2] += np.float32(1e-3)        # one element, in place
    t0 = time.process_time()
    m.run(*xs)
    t1 = time.process_time()
    m.run(*xs)
    t2 = time.process_time()
    med = {k: statistics.median(v) * 1e3 for k, v in res.items()}
    mn = {k: min(v) * 1e3 for k, v in res.items()}
    print(f"{name} b{batch} (weights compared: {arena / 1e6:.1f} MB in one block, "
          f"{len(snap.foreign)} arrays apart; {len(snap.tensors)} tensors, "
          f"{len(snap.arrays)} attribute arrays)")
    for k in res:
        print(f"  {k:10s} {med[k]:9.3f} / {mn[k]:9.3f}")
    print(f"  model.run / prepare: median {med['model.run'] / med['prepare']:.3f}, "
          f"min {mn['model.run'] / mn['prepare']:.3f}; variable / prepare: median "
          f"{med['variable'] / med['prepare']:.3f}")
    print(f"  after an in-place edit of one element: run that notices it "
          f"{(t1 - t0) * 1e3:.1f} ms, next run (plan rebuilt) {(t2 - t1) * 1e3:.1f} ms")



def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", nargs="+", default=["bert", "resnet18"])
    ap.add_argument("--batches", nargs="+", type=int, default=[1])
    ap.add_argument("--files", default=None, help="folder of <model>.onnx, <model>_b<N>.npz")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--runs", type=int, default=0, help="runs per round (0: by model size)")
    args = ap.parse_args()

    print(cpu_description())
    print("CPU ms per run (median / min over rounds x runs), one thread, one process")
    for name in args.models:
        for batch in args.batches:
            _one(name, batch, args)


if __name__ == "__main__":
    main()
