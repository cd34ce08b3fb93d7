"""Data-parallel training speed: 1 vs N processes per DistOpt option (MPI on CPU, NCCL on GPU).

Each configuration is one ``mpiexec -n P`` job (this script in ``--worker`` mode) that trains
SINGA's examples/cnn CNN (``examples/singa_cnn/model/cnn.py``: conv 20 - pool - conv 50 - pool -
dense 500 - dense 10, 431k parameters) on MNIST-shaped synthetic data with a fixed batch per
process (weak scaling: the global batch is P x batch), one BLAS thread per process. Rank 0
reports the median step time over the timed steps (after warm-up), the global throughput
(samples of all ranks per second), the payload bytes one rank hands to the collectives per step
(``DistOpt.bytes_communicated``), and the time spent inside the collectives.

    python benchmarks/bench_distributed.py                     # P = 1, 2; every option
    python benchmarks/bench_distributed.py --procs 1 2 4 --steps 20 --json out.json
    python benchmarks/bench_distributed.py --device cuda --procs 1 2   # one GPU per process

Scaling efficiency = throughput(P) / (P x throughput(1)), with throughput(1) from the plain run
of the same option at P = 1 (every option is the plain update at world size 1, except that
sparsification still selects). On a machine with fewer free cores than P the processes share
cores and the efficiency says so. Not part of the test pass/fail.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

OPTIONS = ("plain", "half", "partialUpdate", "sparseTopK", "sparseThreshold")


def worker(a) -> None:
    from workbench import device, opt, tensor
    sys.path.insert(0, str(ROOT / "examples" / "singa_cnn"))
    from model import cnn  # SINGA's model file, ported

    d = opt.DistOpt(opt.SGD(lr=0.005, momentum=0.9, weight_decay=1e-5))
    dev = device.create_cuda_gpu_on(d.local_rank) if a.device == "cuda" else device.create_cpu()
    comm = d.communicator
    spent = [0.0]

    def timed(fn):
        def wrapper(*args, **kw):
            t0 = time.perf_counter()
            try:
                return fn(*args, **kw)
            finally:
                spent[0] += time.perf_counter() - t0
        return wrapper

    for name in ("all_reduce", "all_gather", "wait"):
        setattr(comm, name, timed(getattr(comm, name)))

    tensor.seed(0)
    m = cnn.create_model(num_channels=1, num_classes=10)
    b = a.batch
    tx = tensor.Tensor((b, 1, 28, 28), dev, tensor.float32)
    ty = tensor.Tensor((b,), dev, tensor.int32)
    m.set_optimizer(d)
    m.compile([tx], is_train=True, use_graph=True, sequential=True)
    rng = np.random.default_rng(d.global_rank)
    n = a.warmup + a.steps
    xs = rng.random((n, b, 1, 28, 28), dtype=np.float32)
    ys = rng.integers(0, 10, (n, b)).astype(np.int32)
    times, sent, in_comm = [], [], []
    for s in range(n):
        tx.copy_from_numpy(xs[s])
        ty.copy_from_numpy(ys[s])
        comm.barrier()                       # every rank starts the step together
        b0, c0 = d.bytes_communicated, spent[0]
        t0 = time.perf_counter()
        out, loss = m(tx, ty, a.option, a.spars)
        tensor.to_numpy(loss).item()        # the step is done (GPU: synchronised)
        dt = time.perf_counter() - t0
        if s >= a.warmup:
            times.append(dt)
            sent.append(d.bytes_communicated - b0)
            in_comm.append(spent[0] - c0)
    step = statistics.median(times)
    # the slowest rank sets the pace
    step = max(comm.all_gather_object(step)) if d.world_size > 1 else step
    if d.global_rank == 0:
        print("RESULT " + json.dumps({
            "procs": d.world_size, "option": a.option, "device": a.device,
            "backend": comm.backend, "batch_per_proc": b, "step_ms": step * 1e3,
            "samples_per_s": d.world_size * b / step,
            "bytes_per_step": statistics.median(sent),
            "comm_ms": statistics.median(in_comm) * 1e3,
            "load": os.getloadavg()[0]}), flush=True)


def run_config(procs, option, a) -> dict | None:
    from workbench.dist import mpiexec_command, one_thread_env
    env = one_thread_env()
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    cmd = mpiexec_command(procs) + [
        sys.executable, str(Path(__file__).resolve()), "--worker", "--option", option,
        "--batch", str(a.batch), "--steps", str(a.steps), "--warmup", str(a.warmup),
        "--spars", str(a.spars), "--device", a.device]
    p = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=a.timeout,
                       cwd=ROOT)
    for line in p.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[7:])
    print(f"  P={procs} {option}: failed (exit {p.returncode})\n{p.stderr[-1500:]}",
          file=sys.stderr)
    return None


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--procs", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--options", nargs="+", default=list(OPTIONS), choices=OPTIONS)
    ap.add_argument("--batch", type=int, default=32, help="batch per process")
    ap.add_argument("--steps", type=int, default=15)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--spars", type=float, default=0.05)
    ap.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    ap.add_argument("--timeout", type=float, default=600)
    ap.add_argument("--json")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--option", default="plain", help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.worker:
        worker(a)
        return 0
    rows = []
    for option in a.options:
        for procs in a.procs:
            r = run_config(procs, option, a)
            if r is not None:
                rows.append(r)
    base = {r["option"]: r["samples_per_s"] for r in rows if r["procs"] == 1}
    print(f"\nSINGA CNN, batch {a.batch} per process, {a.device}, median of {a.steps} steps "
          f"(load average at the end: {os.getloadavg()[0]:.1f}, {os.cpu_count()} CPUs)\n")
    print("| option | procs | step (ms) | samples/s | comm. (ms/step) | bytes sent/step/rank "
          "| scaling eff. |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        eff = r["samples_per_s"] / (r["procs"] * base[r["option"]]) if r["option"] in base \
            else float("nan")
        r["scaling_efficiency"] = eff
        print(f"| {r['option']} | {r['procs']} | {r['step_ms']:.1f} | {r['samples_per_s']:.0f} "
              f"| {r['comm_ms']:.1f} | {r['bytes_per_step'] / 1e6:.3f} MB | {eff:.2f} |")
    if a.json:
        Path(a.json).write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
