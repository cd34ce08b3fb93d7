"""Inference speed: the workbench engine vs onnxruntime (and onnx.reference, PyTorch) in one run.

Models: light_resnet50 and light_squeezenet from the onnx wheel (given deterministic random
weights and a symbolic batch axis), ResNet-18 and MobileNetV2 built in PyTorch and exported with
torch.onnx (skipped with a message when torch is missing). Each at batch 1 and 8: warm-up runs,
then the median of N timed runs. onnxruntime gets as many intra-op threads as numpy's BLAS uses
(``os.cpu_count()``); PyTorch too.

    python benchmarks/bench_inference.py              # full run
    python benchmarks/bench_inference.py --quick      # fast sanity run
    python benchmarks/bench_inference.py --no-reference --runs 20 --batches 8
    python benchmarks/bench_inference.py --models resnet18 light_squeezenet --json out.json

Not part of the test pass/fail. See benchmarks/README.md for the target.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import signal
import statistics
import sys
import time
import traceback
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from tests.helpers.compare import normalised_max_error, ort_session  # noqa: E402
from tests.helpers.light_models import (  # noqa: E402
    light_path,
    random_inputs,
    with_dynamic_batch,
    with_random_weights,
)

ALL_MODELS = ("light_resnet50", "light_squeezenet", "resnet18", "mobilenetv2")
TORCH_MODELS = ("resnet18", "mobilenetv2")


@dataclass
class Row:
    model: str
    batch: int
    ours_ms: float | None = None
    ort_ms: float | None = None
    ref_ms: float | None = None
    torch_ms: float | None = None
    prepare_s: float | None = None
    max_err: float | None = None
    notes: list = field(default_factory=list)

    @property
    def ratio(self) -> float | None:
        if self.ours_ms is None or not self.ort_ms:
            return None
        return self.ours_ms / self.ort_ms


# ----------------------------------------------------------------------------- timing
STAT = {"median": statistics.median, "min": min}
_stat = statistics.median  # set from --stat in main()


def time_median(fn, runs: int, warmup: int) -> tuple[float, object]:
    """Median (or, with ``--stat min``, best) wall time of ``fn()`` in ms over ``runs`` runs
    after ``warmup`` runs."""
    out = None
    for _ in range(warmup):
        out = fn()
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        out = fn()
        times.append((time.perf_counter() - t0) * 1e3)
    return _stat(times), out


class _Budget(Exception):
    pass


def _alarm(_signum, _frame):
    raise _Budget()


def time_with_budget(fn, runs: int, warmup: int, budget_s: float):
    """Like :func:`time_median`, giving up (returns None) when one run takes over ``budget_s``.

    Uses SIGALRM (main thread, POSIX); elsewhere it runs without a limit.
    """
    use_alarm = hasattr(signal, "setitimer") and os.name == "posix"
    if use_alarm:
        old = signal.signal(signal.SIGALRM, _alarm)
    try:
        t0 = time.perf_counter()
        if use_alarm:
            signal.setitimer(signal.ITIMER_REAL, budget_s)
        try:
            out = fn()
        finally:
            if use_alarm:
                signal.setitimer(signal.ITIMER_REAL, 0)
        first = time.perf_counter() - t0
        # as many timed runs as fit in the budget (at least 1)
        n = max(1, min(runs, int(budget_s / max(first, 1e-6))))
        ms, out = time_median(fn, n, max(0, min(warmup - 1, n)))
        return ms, out
    except _Budget:
        return None, None
    finally:
        if use_alarm:
            signal.signal(signal.SIGALRM, old)


# ----------------------------------------------------------------------------- models
def load_model(name: str, batch: int, cache: dict):
    """``(proto, inputs, torch_model_or_None)`` for a benchmark model at ``batch``."""
    import onnx

    if name.startswith("light_"):
        if name not in cache:
            base = onnx.load(str(light_path(name[len("light_"):])))
            cache[name] = with_dynamic_batch(with_random_weights(base, seed=2))
        proto = cache[name]
        return proto, random_inputs(proto, seed=3, batch=batch), None
    from tests.helpers import torch_models

    if name not in cache:
        model, example = torch_models.build(name)
        cache[name] = (model, torch_models.export_onnx(model, example, None, opset=17))
    model, proto = cache[name]
    return proto, list(torch_models.example_inputs(name, batch)), model


def torch_available() -> bool:
    try:
        import torch  # noqa: F401
    except ImportError:
        return False
    return True


# ----------------------------------------------------------------------------- one row
def bench_one(name, batch, args, cache, threads) -> Row:
    row = Row(name, batch)
    proto, inputs, tmodel = load_model(name, batch, cache)
    feed_names = None

    # onnxruntime
    sess = ort_session(proto, threads=threads)
    feed_names = [i.name for i in sess.get_inputs()]
    feeds = dict(zip(feed_names, inputs))
    row.ort_ms, ref_out = time_median(lambda: sess.run(None, feeds), args.runs, args.warmup)

    # ours
    try:
        import workbench.backend as backend

        t0 = time.perf_counter()
        rep = backend.prepare(proto)
        row.prepare_s = time.perf_counter() - t0
        row.ours_ms, ours_out = time_median(lambda: rep.run(inputs), args.runs, args.warmup)
        row.max_err = max(normalised_max_error(np.asarray(a), b)
                          for a, b in zip(ours_out, ref_out))
    except Exception as e:  # noqa: BLE001 -- report and go on with the other models
        msg = str(e).splitlines()[0] if str(e) else type(e).__name__
        row.notes.append(f"ours failed: {type(e).__name__}: {msg[:300]}")
        if args.verbose:
            traceback.print_exc()

    # onnx.reference
    if not args.no_reference:
        try:
            from onnx.reference import ReferenceEvaluator

            ev = ReferenceEvaluator(proto)
            ms, _ = time_with_budget(lambda: ev.run(None, feeds), args.runs, args.warmup,
                                     args.reference_budget)
            row.ref_ms = ms
            if ms is None:
                row.notes.append(f"reference: over {args.reference_budget:g} s/run, skipped")
        except Exception as e:  # noqa: BLE001
            row.notes.append(f"reference failed: {type(e).__name__}: {str(e)[:200]}")

    # PyTorch eager, where the model came from torch
    if tmodel is not None:
        import torch

        xs = [torch.from_numpy(np.ascontiguousarray(a)) for a in inputs]

        def torch_run():
            with torch.inference_mode():
                return tmodel(*xs)

        row.torch_ms, _ = time_median(torch_run, args.runs, args.warmup)
    return row


# ----------------------------------------------------------------------------- output
def _fmt(v, spec="{:.1f}"):
    return "-" if v is None else spec.format(v)


def print_table(rows: list[Row]) -> None:
    head = ("model", "batch", "ours ms", "ort ms", "ours/ort", "ref ms", "torch ms", "prepare s",
            "max err")
    lines = [head]
    for r in rows:
        lines.append((r.model, str(r.batch), _fmt(r.ours_ms), _fmt(r.ort_ms),
                      _fmt(r.ratio, "{:.2f}x"), _fmt(r.ref_ms), _fmt(r.torch_ms),
                      _fmt(r.prepare_s, "{:.2f}"), _fmt(r.max_err, "{:.1e}")))
    widths = [max(len(line[i]) for line in lines) for i in range(len(head))]
    for i, line in enumerate(lines):
        print("  ".join(c.ljust(w) if j == 0 else c.rjust(w)
                        for j, (c, w) in enumerate(zip(line, widths))))
        if i == 0:
            print("  ".join("-" * w for w in widths))
    notes = [(r, n) for r in rows for n in r.notes]
    if notes:
        print()
        for r, n in notes:
            print(f"note {r.model} batch {r.batch}: {n}")


def environment(threads: int) -> dict:
    import onnx
    import onnxruntime

    env = {
        "python": platform.python_version(),
        "machine": platform.machine(),
        "cpu_count": os.cpu_count(),
        "threads": threads,
        "numpy": np.__version__,
        "onnx": onnx.__version__,
        "onnxruntime": onnxruntime.__version__,
    }
    try:
        from threadpoolctl import threadpool_info  # optional

        env["blas"] = [f"{i.get('internal_api')} {i.get('version')} threads={i.get('num_threads')}"
                       for i in threadpool_info() if i.get("user_api") == "blas"]
    except ImportError:
        pass
    if torch_available():
        import torch

        env["torch"] = torch.__version__
    if hasattr(os, "getloadavg"):
        env["loadavg_1m"] = round(os.getloadavg()[0], 2)
    return env


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", nargs="+", default=list(ALL_MODELS), choices=ALL_MODELS)
    p.add_argument("--batches", nargs="+", type=int, default=[1, 8])
    p.add_argument("--runs", type=int, default=10, help="timed runs per measurement (median)")
    p.add_argument("--warmup", type=int, default=2, help="untimed runs first")
    p.add_argument("--no-reference", action="store_true",
                   help="skip onnx.reference.ReferenceEvaluator (slow)")
    p.add_argument("--reference-budget", type=float, default=60.0,
                   help="seconds one reference run may take before it is skipped")
    p.add_argument("--threads", type=int, default=os.cpu_count() or 1,
                   help="intra-op threads for onnxruntime and torch (default: os.cpu_count())")
    p.add_argument("--quick", action="store_true",
                   help="fast sanity run: batch 1, 3 runs, 1 warm-up, small reference budget")
    p.add_argument("--stat", choices=sorted(STAT), default="median",
                   help="median (default) or min of the timed runs; min is steadier on a busy "
                        "machine")
    p.add_argument("--json", type=Path, help="also write the results as JSON here")
    p.add_argument("-v", "--verbose", action="store_true", help="print tracebacks of failures")
    args = p.parse_args(argv)
    global _stat
    _stat = STAT[args.stat]
    if args.quick:
        args.batches, args.runs, args.warmup = [1], 3, 1
        args.reference_budget = min(args.reference_budget, 15.0)

    models = list(args.models)
    if not torch_available():
        skipped = [m for m in models if m in TORCH_MODELS]
        if skipped:
            print(f"PyTorch is not installed: skipping {', '.join(skipped)} "
                  "(pip install torch to benchmark them)")
        models = [m for m in models if m not in TORCH_MODELS]
    else:
        import torch

        torch.set_num_threads(args.threads)

    env = environment(args.threads)
    print("environment: " + ", ".join(f"{k}={v}" for k, v in env.items()))
    if env.get("loadavg_1m", 0) > 0.5 * (os.cpu_count() or 1):
        print(f"warning: the machine is busy (load average {env['loadavg_1m']}): timings will "
              "be noisy; try --stat min, or run on a quiet machine")
    print(f"{args.stat} of {args.runs} runs after {args.warmup} warm-up runs; "
          "ours/ort < 1 means faster than onnxruntime\n")
    rows, cache = [], {}
    for name in models:
        for batch in args.batches:
            t0 = time.perf_counter()
            row = bench_one(name, batch, args, cache, args.threads)
            rows.append(row)
            print(f"  {name} batch {batch}: ours {_fmt(row.ours_ms)} ms, "
                  f"ort {_fmt(row.ort_ms)} ms ({time.perf_counter() - t0:.0f} s)", flush=True)
    print()
    print_table(rows)
    if args.json:
        args.json.write_text(json.dumps(
            {"environment": env, "stat": args.stat, "runs": args.runs,
             "rows": [dict(asdict(r), ratio=r.ratio) for r in rows]}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
