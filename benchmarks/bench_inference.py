"""Inference speed and memory: the workbench engine vs onnxruntime (and PyTorch) on the CPU.

Models: light_resnet50 and light_squeezenet from the onnx wheel (given deterministic random
weights and a symbolic batch axis); ResNet-18, MobileNetV2, ShuffleNetV2, a BERT-like encoder
and a GPT-2-like decoder built in PyTorch (``tests/helpers/torch_models.py``) and exported with
torch.onnx (skipped with a message when torch is missing). Each at batch 1 and 8.

Every engine runs in a FRESH subprocess per (model, batch): it loads the model file, prepares
it, runs warm-up runs and then the timed runs, and reports its times and its peak resident
memory (``VmHWM``, the RSS high-water mark of the whole process). Rounds alternate the engines
(ours, ort, ours, ort, ...; ``--rounds``), so that load from other processes hits both, and no
engine's worker threads (onnxruntime spins its thread pool after each run) slow the other.
The reported time is the median over the rounds of each round's median.

``--interleave`` runs both engines in ONE fresh process per round instead, alternately in
blocks of ``--block`` runs (ours, ort, ort, ours, ...; a block's time is the median of its runs
after the first, which re-warms the caches the other engine used), and reports the median of
the neighbouring blocks' ratios ("paired"). On a VM the core itself can run ~1.4x slower for
seconds at a time (another tenant on the host core: see "ShuffleNetV2 b8's two speeds" in
benchmarks/README.md), which in fresh processes lands on one engine's process and not the
other's; a pair of neighbouring blocks sees the same speed. Peak memory and first-run times
are not measured in this mode (two engines share the process).

Every worker also times a fixed reference kernel (a 64x64 float32 product 150 times: it stays
in L1, so only the core's own speed moves it) before and after its timed runs: the ``ref ms``
column gives its range over the row's processes, and a note says when it moved by more than
15 % (the machine's speed changed between or within processes).

The ``floor ms`` column is the sgemm-bound floor: the model's FLOPs (2 x the multiply-adds of
its Conv, ConvTranspose, MatMul and Gemm nodes at these input shapes) divided by the float32
GEMM rate numpy's BLAS reaches on this machine (measured at the start, all threads).

    python benchmarks/bench_inference.py                  # all models, batch 1 and 8
    python benchmarks/bench_inference.py --quick          # batch 1, few runs, one round
    python benchmarks/bench_inference.py --models mobilenetv2 bert --batches 8 --runs 20
    python benchmarks/bench_inference.py --profile --models mobilenetv2 --batches 8
    python benchmarks/bench_inference.py --prepare        # prepare seconds (GPT-2, 20k nodes)
    python benchmarks/bench_inference.py --threads 1 --clock cpu   # CPU time: a shared machine
    python benchmarks/bench_inference.py --threads 1 --clock cpu --interleave --models shufflenetv2
    python benchmarks/bench_inference.py --json out.json

Not part of the test pass/fail. See benchmarks/README.md for the targets and the last results.
"""

from __future__ import annotations

import argparse
import collections
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks._cpu import cpu_description, prepare_compiled  # noqa: E402
from benchmarks._proc import peak_rss_mib  # noqa: E402

#: environment of each engine's worker processes (set in main: the compiled kernels)
WORKER_ENV: dict = {}

ALL_MODELS = ("light_resnet50", "light_squeezenet", "resnet18", "mobilenetv2", "shufflenetv2",
              "bert", "gpt2")
TORCH_MODELS = ("resnet18", "mobilenetv2", "shufflenetv2", "bert", "gpt2")
SEQ = 32  # tokens per sequence for the BERT-like and GPT-2-like models


@dataclass
class Row:
    model: str
    batch: int
    ours_ms: float | None = None
    numpy_ms: float | None = None        # ours with the compiled kernels off (--numpy)
    ort_ms: float | None = None
    torch_ms: float | None = None
    ours_best_ms: float | None = None    # the fastest single run of any round
    ort_best_ms: float | None = None
    floor_ms: float | None = None
    gflop: float | None = None
    ours_mb: float | None = None
    ort_mb: float | None = None
    ours_first_s: float | None = None    # prepare + first run, fresh process
    ort_first_s: float | None = None     # session creation + first run, fresh process
    prepare_s: float | None = None
    max_err: float | None = None
    paired_ratio: float | None = None    # --interleave: median of neighbouring blocks' ratios
    ref_ms: list = field(default_factory=list)   # the reference kernel, every process (ms)
    rounds: dict = field(default_factory=dict)   # engine -> [median ms of each round]
    notes: list = field(default_factory=list)

    @property
    def ratio(self) -> float | None:
        if self.ours_ms is None or not self.ort_ms:
            return None
        return self.ours_ms / self.ort_ms

    @property
    def mem_ratio(self) -> float | None:
        if self.ours_mb is None or not self.ort_mb:
            return None
        return self.ours_mb / self.ort_mb


# ----------------------------------------------------------------------------- models
def model_files(name: str, batch: int, folder: Path, cache: dict) -> tuple[Path, Path]:
    """(model.onnx, inputs.npz) for a benchmark model at ``batch``, written into ``folder``."""
    import onnx

    from tests.helpers.light_models import (
        light_path,
        random_inputs,
        with_dynamic_batch,
        with_random_weights,
    )

    path = folder / f"{name}.onnx"
    if name not in cache:
        if name.startswith("light_"):
            proto = with_dynamic_batch(with_random_weights(
                onnx.load(str(light_path(name[len("light_"):]))), seed=2))
        else:
            from tests.helpers import torch_models

            model, example = torch_models.build(name)
            proto = torch_models.export_onnx(model, example, None, opset=17)
        onnx.save(proto, str(path))
        cache[name] = proto
    proto = cache[name]
    if name.startswith("light_"):
        from tests.helpers.light_models import random_inputs

        inputs = random_inputs(proto, seed=3, batch=batch)
    else:
        from tests.helpers import torch_models

        inputs = list(torch_models.example_inputs(name, batch, seq=SEQ))
    npz = folder / f"{name}_b{batch}.npz"
    np.savez(npz, *inputs)
    return path, npz


def _read_inputs(npz) -> list:
    with np.load(npz) as f:
        return [f[f"arr_{i}"] for i in range(len(f.files))]


def count_flops(path: Path, inputs: list) -> float:
    """2 x the multiply-adds of the Conv/ConvTranspose/MatMul/Gemm nodes at these inputs'
    shapes (value shapes taken from one run of the unoptimised graph)."""
    import workbench.backend as backend

    rep = backend.prepare(str(path), optimize=False)
    plan = rep.plan
    shapes = {v.name: tuple(np.shape(a)) for v, a in zip(plan.input_infos, inputs)}
    shapes.update({k: tuple(np.shape(v)) for k, v in plan.graph.initializers.items()})
    macs = 0

    def hook(node, outs):
        nonlocal macs
        for o, v in zip(node.outputs, outs):
            if o and hasattr(v, "shape"):
                shapes[o] = tuple(v.shape)
        op = node.op_type
        ins = [shapes.get(i) for i in node.inputs]
        out = shapes.get(node.outputs[0]) if node.outputs else None
        if out is None or len(ins) < 2 or ins[0] is None or ins[1] is None:
            return
        if op == "Conv":
            w = ins[1]  # (M, C/group, *k): every output element takes C/group * prod(k) MACs
            macs += math.prod(out) * math.prod(w[1:])
        elif op == "ConvTranspose":
            w = ins[1]  # (C, M/group, *k): every input element feeds M/group * prod(k)
            macs += math.prod(ins[0]) * math.prod(w[1:])
        elif op == "MatMul":
            k = ins[0][-1] if len(ins[0]) else 1
            macs += math.prod(out) * k
        elif op == "Gemm":
            k = ins[0][0] if node.attrs.get("transA", 0) else ins[0][-1]
            macs += math.prod(out) * k

    plan.run(inputs, hook=hook)
    return 2.0 * macs


def sgemm_gflops(seconds: float = 3.0) -> float:
    """float32 GEMM rate of numpy's BLAS (all its threads), GFLOP/s: the best of repeated
    512^3 and 1024^3 products over ``seconds`` (the best, since other processes on a shared
    machine only ever slow it down)."""
    rng = np.random.default_rng(0)
    best = 0.0
    t_end = time.perf_counter() + seconds
    while time.perf_counter() < t_end:
        for n in (512, 1024):
            a = rng.standard_normal((n, n), dtype=np.float32)
            b = rng.standard_normal((n, n), dtype=np.float32)
            c = np.empty((n, n), np.float32)
            np.matmul(a, b, out=c)
            for _ in range(3):
                t0 = time.perf_counter()
                np.matmul(a, b, out=c)
                best = max(best, 2.0 * n ** 3 / (time.perf_counter() - t0) / 1e9)
    return best


# ----------------------------------------------------------------------------- workers
#: the clock of the timed runs: wall time, or with ``--clock cpu`` the CPU time of the whole
#: process (every thread), which load from other processes on a shared machine barely moves
CLOCK = [time.perf_counter]


#: seconds of warm-up and of timed runs each worker runs at least (``--warmup-time``,
#: ``--min-time``), on top of the counts: a sub-millisecond model is still settling after 2
#: warm-up runs, and 10 runs of 0.3 ms are one scheduler tick (see ``_time_runs``)
MIN_SECONDS = {"warmup": 0.25, "timed": 1.0}


def _time_runs(fn, runs: int, warmup: int,
               timed: float | None = None) -> tuple[list, object]:
    """``warmup`` untimed runs and ``runs`` timed ones, each continued until it has lasted
    ``MIN_SECONDS`` (wall). The same rule for every engine. Why: in fresh processes both
    ours and onnxruntime need ~10 runs of a small model to settle (BERT-like b1, the fastest
    run at each position over 6 processes: ours 0.52 -> 0.35 ms, onnxruntime 0.30 -> 0.22 ms
    over runs 3-12), which 2 warm-up runs did not cover; and 10 timed runs of 0.3 ms span
    3 ms, so one preemption on a shared VM moved a process' median by 30-100 %.
    ``timed``: seconds of timed runs instead of ``MIN_SECONDS["timed"]`` (0 with ``runs`` 0:
    the warm-up only)."""
    out = None
    end = time.perf_counter() + MIN_SECONDS["warmup"]
    k = 0
    while k < warmup or time.perf_counter() < end:
        out = fn()
        k += 1
    times = []
    clock = CLOCK[0]
    end = time.perf_counter() + (MIN_SECONDS["timed"] if timed is None else timed)
    while len(times) < runs or time.perf_counter() < end:
        t0 = clock()
        out = fn()
        times.append((clock() - t0) * 1e3)
    return times, out


#: the reference kernel's operands (made on first use): 64x64 float32, 48 KiB in all
_REF: list = []


def reference_ms(repeat: int = 5) -> float:
    """The median over ``repeat`` of one timing (on :data:`CLOCK`) of a fixed reference kernel:
    a 64x64 float32 product 150 times (about 1.3 ms on a 2-core AMD EPYC). Its operands stay
    in L1 and the product is too small for BLAS to split, so nothing of the process (buffer
    addresses, huge pages, caches) moves it: only the core's own speed does, which on a VM
    changes when another tenant runs on the same host core."""
    if not _REF:
        rng = np.random.default_rng(0)
        _REF.extend([rng.standard_normal((64, 64), dtype=np.float32),
                     rng.standard_normal((64, 64), dtype=np.float32),
                     np.empty((64, 64), np.float32)])
    a, b, c = _REF
    clock, out = CLOCK[0], []
    for _ in range(repeat):
        t0 = clock()
        for _ in range(150):
            np.matmul(a, b, out=c)
        out.append((clock() - t0) * 1e3)
    return statistics.median(out)


def _engine_fn(engine: str, model: str, inputs: list, threads: int, name: str,
               fixed_shapes: bool, spin: bool = True):
    """(the engine's run on ``inputs``, its plan or None) for one engine in this process;
    ``spin``: onnxruntime's pool busy-waits between runs (its default; off when it shares the
    process with another engine)."""
    if engine in ("ours", "ours_np"):
        import workbench.backend as backend

        rep = backend.prepare(model, batch_size=int(inputs[0].shape[0])) \
            if fixed_shapes and inputs and inputs[0].ndim else backend.prepare(model)
        return (lambda: rep.run(inputs)), rep.plan
    if engine == "ort":
        import onnxruntime as ort

        so = ort.SessionOptions()
        so.log_severity_level = 3
        so.intra_op_num_threads = threads
        so.inter_op_num_threads = 1
        if not spin:
            so.add_session_config_entry("session.intra_op.allow_spinning", "0")
        sess = ort.InferenceSession(model, sess_options=so, providers=["CPUExecutionProvider"])
        feeds = dict(zip([i.name for i in sess.get_inputs()], inputs))
        return (lambda: sess.run(None, feeds)), None
    if engine == "torch":
        import torch

        from tests.helpers import torch_models

        torch.set_num_threads(threads)
        tmodel, _ = torch_models.build(name)
        xs = [torch.from_numpy(np.ascontiguousarray(a)) for a in inputs]

        def fn():
            with torch.inference_mode():
                return tmodel(*xs)
        return fn, None
    raise SystemExit(f"unknown engine {engine!r}")


def pair_worker(model: str, npz: str, runs: int, warmup: int, threads: int, block: int,
                out_npz: str | None, fixed_shapes: bool = False) -> dict:
    """Ours and onnxruntime in this (fresh) process, run alternately in blocks of ``block``
    runs (ours, ort, ort, ours, ...) after the warm-up rule of :func:`_time_runs` for each;
    pairs of neighbouring blocks go on until there are ``runs`` pairs and
    ``MIN_SECONDS["timed"]`` have passed. A block's time is the median of its runs after
    the first (with ``block`` 1: its one run), the reference kernel is timed before each
    pair. Returns both engines' block times, the pairs' ratios and the reference times."""
    inputs = _read_inputs(npz)
    fo, _ = _engine_fn("ours", model, inputs, threads, "", fixed_shapes)
    fr, _ = _engine_fn("ort", model, inputs, threads, "", False, spin=False)
    outs = {}
    for key, fn in (("ours", fo), ("ort", fr)):
        _t, outs[key] = _time_runs(fn, 0, warmup, timed=0.0)
    clock = CLOCK[0]

    def one_block(fn):
        t = []
        for _ in range(max(1, block)):
            t0 = clock()
            fn()
            t.append((clock() - t0) * 1e3)
        return statistics.median(t[1:] if len(t) > 1 else t)

    ours, ort_, ref = [], [], []
    end = time.perf_counter() + MIN_SECONDS["timed"]
    while len(ours) < max(1, runs) or time.perf_counter() < end:
        ref.append(reference_ms(3))
        if len(ours) % 2 == 0:
            ours.append(one_block(fo))
            ort_.append(one_block(fr))
        else:
            ort_.append(one_block(fr))
            ours.append(one_block(fo))
    if out_npz:
        np.savez(out_npz + ".ours.npz", *[np.asarray(o) for o in outs["ours"]])
        np.savez(out_npz + ".ort.npz", *[np.asarray(o) for o in outs["ort"]])
    return {"engine": "pair", "ours_ms": ours, "ort_ms": ort_,
            "ratios": [a / b for a, b in zip(ours, ort_)], "ref_ms": ref}


def worker(engine: str, model: str, npz: str, runs: int, warmup: int, threads: int,
           out_npz: str | None, profile: bool, name: str, fixed_shapes: bool = False) -> dict:
    """Run one engine on one model in this (fresh) process; returns the measurements.
    ``fixed_shapes``: ours is prepared for the inputs' batch (``backend.prepare(...,
    batch_size=)``: shape arithmetic folded at prepare)."""
    inputs = _read_inputs(npz)
    res: dict = {"engine": engine}
    t0 = time.perf_counter()
    fn, plan = _engine_fn(engine, model, inputs, threads, name, fixed_shapes)
    if plan is not None:
        res["prepare_s"] = time.perf_counter() - t0
    out = fn()
    res["first_s"] = time.perf_counter() - t0
    ref0 = reference_ms()
    times, out = _time_runs(fn, runs, warmup)
    res["ref_ms"] = [ref0, reference_ms()]
    res["times_ms"] = times
    res["peak_mb"] = peak_rss_mib()
    if out_npz and engine in ("ours", "ort"):
        np.savez(out_npz, *[np.asarray(o) for o in out])
    if profile and engine in ("ours", "ours_np"):
        res["profile"] = profile_plan(plan, inputs, max(3, runs // 2))
    return res


def _node_key(node, plan) -> str:
    """The op type, with convolutions told apart by kind (depthwise, grouped, 1x1, kxk)."""
    op = node.op_type
    if op == "NhwcConv" and len(node.inputs) > 1:   # channels-last: weights (kh, kw, C/g, M)
        w = plan.graph.initializers.get(node.inputs[1])
        g = int(node.attrs.get("group", 1))
        if w is not None:
            kind = "depthwise " if g > 1 and w.shape[2] == 1 else "grouped " if g > 1 else ""
            return f"{op} {kind}{'x'.join(map(str, w.shape[:2]))}"
    if op in ("Conv", "FusedConv") and len(node.inputs) > 1:
        w = plan.graph.initializers.get(node.inputs[1])
        g = int(node.attrs.get("group", 1))
        if w is not None:
            if g > 1 and w.shape[1] == 1:
                return f"{op} depthwise {'x'.join(map(str, w.shape[2:]))}"
            if g > 1:
                return f"{op} grouped"
            return f"{op} {'x'.join(map(str, w.shape[2:]))}"
    return op


def profile_plan(plan, inputs, runs: int) -> dict:
    """Per-step and per-op-type time of the schedule a plain run takes (the run loop's
    pre-bound steps, shape arithmetic in remembered segments, each kernel call timed by
    ``workbench.analysis.timing.time_plan``; means over the middle half of ``runs``): a
    remembered shape segment is one row, "shape memo (N nodes: ...)", not its member
    nodes (a per-node hook would run every member every run, which plain runs do not)."""
    from workbench.analysis.timing import time_plan

    clock = "cpu" if CLOCK[0] is time.process_time else "wall"
    times = time_plan(plan, inputs, runs=runs, warmup=2, clock=clock)
    by_node = {n.name: n for n in plan.nodes}
    values: dict = {}

    def hook(node, outs):   # one hooked run for the output shapes only
        shape = [list(o.shape) for o in outs if hasattr(o, "shape")][:1]
        values[node.name] = shape[0] if shape else None

    plan.run(inputs, hook=hook)
    rows = []
    for label, members, ms in times.entries:
        node = by_node.get(members[0])
        if len(members) > 1 or node is None:
            key, shape = label.split(" (")[0], None
        else:
            key, shape = _node_key(node, plan), values.get(label)
        rows.append([label, key, shape, ms])
    by_type: dict = collections.defaultdict(lambda: [0.0, 0])
    for _, key, _, ms in rows:
        by_type[key][0] += ms
        by_type[key][1] += 1
    return {"total_ms": times.plain_ms, "clock": clock,
            "steps": len(times.entries), "nodes_run": len(times.steps),
            "nodes": sorted(rows, key=lambda r: -r[3]),
            "by_type": sorted(([k, v[0], v[1]] for k, v in by_type.items()),
                              key=lambda r: -r[1])}


def run_worker(engine, model_path, npz, args, name, out_npz=None, profile=False) -> dict:
    cmd = [sys.executable, str(Path(__file__).resolve()), "--worker", engine, str(model_path),
           str(npz), "--runs", str(args.runs), "--warmup", str(args.warmup),
           "--threads", str(args.threads), "--name", name, "--clock", args.clock,
           "--warmup-time", str(args.warmup_time), "--min-time", str(args.min_time)]
    if out_npz:
        cmd += ["--out", str(out_npz)]
    if profile:
        cmd += ["--profile"]
    if getattr(args, "fixed_shapes", False):
        cmd += ["--fixed-shapes"]
    if engine == "pair":
        cmd += ["--block", str(args.block)]
    env = dict(WORKER_ENV.get("ours" if engine == "pair" else engine) or os.environ)
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    if engine.startswith("ours") or engine == "pair":   # the thread count the others get
        env["WORKBENCH_NUM_THREADS"] = str(args.threads)
    p = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=args.timeout)
    if p.returncode != 0:
        tail = (p.stderr or p.stdout).strip().splitlines()[-3:]
        raise RuntimeError(f"{engine} worker failed: {' | '.join(tail)}")
    return json.loads(p.stdout.strip().splitlines()[-1])


# ----------------------------------------------------------------------------- one row
def bench_one(name, batch, args, folder, cache, rate) -> Row:
    row = Row(name, batch)
    path, npz = model_files(name, batch, folder, cache)
    inputs = _read_inputs(npz)
    try:
        row.gflop = count_flops(path, inputs) / 1e9
        row.floor_ms = row.gflop / rate * 1e3
    except Exception as e:  # noqa: BLE001 -- the floor is informative only
        row.notes.append(f"FLOP count failed: {type(e).__name__}: {e}")
    if getattr(args, "interleave", False):
        return _bench_pairs(row, name, path, npz, args, folder)
    engines = ["ours", "ort"]
    if args.torch and name in TORCH_MODELS:
        engines.append("torch")
    if args.numpy:
        engines.append("ours_np")
    res: dict = {e: [] for e in engines}
    outs = {"ours": folder / "ours_out.npz", "ort": folder / "ort_out.npz"}
    for r in range(args.rounds):
        order = engines if r % 2 == 0 else engines[1:] + engines[:1]
        for e in order:
            try:
                res[e].append(run_worker(e, path, npz, args, name,
                                         out_npz=outs.get(e) if r == 0 else None))
            except Exception as ex:  # noqa: BLE001 -- report, go on
                row.notes.append(f"{e} round {r}: {str(ex)[:300]}")
    for e, rs in res.items():
        if not rs:
            continue
        meds = [statistics.median(x["times_ms"]) for x in rs]
        row.rounds[e] = meds
        row.ref_ms += [v for x in rs for v in x.get("ref_ms", ())]
        ms = statistics.median(meds)
        mb = statistics.median(x["peak_mb"] for x in rs)
        first = statistics.median(x["first_s"] for x in rs)
        best = min(min(x["times_ms"]) for x in rs)
        if e == "ours":
            row.ours_ms, row.ours_mb, row.ours_first_s = ms, mb, first
            row.ours_best_ms = best
            row.prepare_s = statistics.median(x["prepare_s"] for x in rs)
        elif e == "ort":
            row.ort_ms, row.ort_mb, row.ort_first_s = ms, mb, first
            row.ort_best_ms = best
        elif e == "ours_np":
            row.numpy_ms = ms
        else:
            row.torch_ms = ms
    if res.get("ours") and res.get("ort"):
        from tests.helpers.compare import normalised_max_error

        a, b = _read_inputs(outs["ours"]), _read_inputs(outs["ort"])
        row.max_err = max(normalised_max_error(x, y) for x, y in zip(a, b))
    _note_speed(row)
    return row


def _bench_pairs(row: Row, name, path, npz, args, folder) -> Row:
    """``--interleave``: ``args.rounds`` fresh processes, each running both engines
    alternately (:func:`pair_worker`); the times are the medians of all blocks, the ratio the
    median of all neighbouring pairs' ratios."""
    out = folder / "pair_out"
    res = []
    for r in range(args.rounds):
        try:
            res.append(run_worker("pair", path, npz, args, name,
                                  out_npz=str(out) if r == 0 else None))
        except Exception as ex:  # noqa: BLE001 -- report, go on
            row.notes.append(f"pair round {r}: {str(ex)[:300]}")
    if not res:
        return row
    ours = [v for x in res for v in x["ours_ms"]]
    ort_ = [v for x in res for v in x["ort_ms"]]
    row.rounds = {"ours": [statistics.median(x["ours_ms"]) for x in res],
                  "ort": [statistics.median(x["ort_ms"]) for x in res]}
    row.ours_ms, row.ort_ms = statistics.median(ours), statistics.median(ort_)
    row.ours_best_ms, row.ort_best_ms = min(ours), min(ort_)
    row.paired_ratio = statistics.median(v for x in res for v in x["ratios"])
    row.ref_ms = [v for x in res for v in x["ref_ms"]]
    from tests.helpers.compare import normalised_max_error

    if Path(str(out) + ".ours.npz").exists():
        a, b = _read_inputs(str(out) + ".ours.npz"), _read_inputs(str(out) + ".ort.npz")
        row.max_err = max(normalised_max_error(x, y) for x, y in zip(a, b))
    _note_speed(row)
    return row


#: the reference kernel's spread (slowest / fastest) above which a row gets a note
SPEED_SPREAD = 1.15


def _note_speed(row: Row) -> None:
    """A note when the reference kernel's times over the row's processes differ by more
    than :data:`SPEED_SPREAD`: the core's own speed changed while the row was measured."""
    if row.ref_ms and min(row.ref_ms) > 0:
        spread = max(row.ref_ms) / min(row.ref_ms)
        if spread > SPEED_SPREAD:
            how = "neighbouring blocks in one process are paired (--interleave)" \
                if row.paired_ratio is not None else \
                "fresh-process times may be off by as much: --interleave pairs the engines' " \
                "runs in one process"
            row.notes.append(f"the reference kernel ran {min(row.ref_ms):.2f}-"
                             f"{max(row.ref_ms):.2f} ms ({spread:.2f}x): the core's speed "
                             f"changed during this row; {how}")


def print_profile(name, batch, prof, top: int) -> None:
    print(f"\nprofile {name} batch {batch}: {prof['total_ms']:.2f} ms per plain run "
          f"({prof['clock']} clock), {prof['steps']} steps per run for "
          f"{prof['nodes_run']} nodes")
    print("  by op type:            ms      %   steps")
    total = sum(r[1] for r in prof["by_type"]) or 1.0
    for key, ms, n in prof["by_type"]:
        print(f"  {key:22s} {ms:7.2f} {100 * ms / total:6.1f} {n:6d}")
    print(f"  top {top} steps:")
    for node, key, shape, ms in prof["nodes"][:top]:
        print(f"  {ms:7.3f} ms  {key:22s} {node}  -> {shape}")


# ----------------------------------------------------------------------------- prepare
def generated_graph(n_nodes: int):
    """A model of ``n_nodes`` nodes: units of Conv(1x1) -> BatchNormalization -> Relu ->
    Add(residual) on a (1, 8, 4, 4) input (the passes fold and fuse every unit)."""
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    c = 8
    nodes, inits = [], []
    x = "x"
    for u in range(n_nodes // 4):
        w = numpy_helper.from_array((rng.standard_normal((c, c, 1, 1)) * 0.3)
                                    .astype(np.float32), f"w{u}")
        bn = [numpy_helper.from_array(v.astype(np.float32), f"bn{u}_{k}") for k, v in
              enumerate((rng.uniform(0.5, 1.5, c), rng.standard_normal(c) * 0.1,
                         rng.standard_normal(c) * 0.1, rng.uniform(0.5, 1.5, c)))]
        inits += [w] + bn
        nodes += [helper.make_node("Conv", [x, f"w{u}"], [f"c{u}"], name=f"conv{u}"),
                  helper.make_node("BatchNormalization", [f"c{u}"] + [t.name for t in bn],
                                   [f"b{u}"], name=f"bn{u}"),
                  helper.make_node("Relu", [f"b{u}"], [f"r{u}"], name=f"relu{u}"),
                  helper.make_node("Add", [f"r{u}", x], [f"y{u}"], name=f"add{u}")]
        x = f"y{u}"
    g = helper.make_graph(nodes, f"generated_{n_nodes}",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, c, 4, 4])],
                          [helper.make_tensor_value_info(x, TensorProto.FLOAT, [1, c, 4, 4])],
                          inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def time_prepare(model, repeat: int = 3) -> dict:
    """Seconds of each prepare stage (best of ``repeat``): read + checks (``load`` without
    shape inference), shape inference (the rest of ``load``), passes, plan; and the CPU
    seconds of this process for the whole (the checks and shape inference run in a helper
    process, whose CPU time is not counted)."""
    from workbench.graph import passes
    from workbench.graph.load import load
    from workbench.runtime import Plan

    data = model.SerializeToString()
    best: dict = {}
    for _ in range(repeat):
        t = {}
        t0 = time.perf_counter()
        load(data, check=True, shape_inference=False)
        t["load+checks"] = time.perf_counter() - t0
        t0 = time.perf_counter()
        loaded = load(data, check=True, shape_inference=True)
        t["shape inference"] = max(0.0, time.perf_counter() - t0 - t["load+checks"])
        t0 = time.perf_counter()
        g = passes.optimize(loaded.graph)
        t["passes"] = time.perf_counter() - t0
        t0 = time.perf_counter()
        Plan(g)
        t["plan"] = time.perf_counter() - t0
        t["total"] = t["load+checks"] + t["shape inference"] + t["passes"] + t["plan"]
        c0 = time.process_time()
        Plan(passes.optimize(load(data, check=True, shape_inference=True).graph))
        t["total cpu"] = time.process_time() - c0   # this process' CPU: steadier when shared
        for k, v in t.items():
            best[k] = min(best.get(k, float("inf")), v)
    return best


def prepare_report(args) -> list:
    rows = []
    models = []
    if torch_available():
        from tests.helpers import torch_models

        m, ex = torch_models.build("gpt2")
        models.append(("gpt2", torch_models.export_onnx(m, ex, None, opset=17)))
    for n in args.prepare_sizes:
        models.append((f"generated {n:,} nodes", generated_graph(n)))
    print("\nprepare (best of 3), seconds:")
    head = ["model", "nodes", "load+checks", "shape inference", "passes", "plan", "total",
            "total CPU", "us/node"]
    print("  " + "  ".join(f"{h:>15s}" if i else f"{h:24s}" for i, h in enumerate(head)))
    for label, proto in models:
        t = time_prepare(proto)
        n = len(proto.graph.node)
        rows.append(dict(model=label, nodes=n, **t))
        vals = [t["load+checks"], t["shape inference"], t["passes"], t["plan"], t["total"],
                t["total cpu"]]
        print("  " + f"{label:24s}" + f"  {n:>15,d}" + "".join(f"  {v:15.3f}" for v in vals)
              + f"  {1e6 * t['total'] / n:15.1f}", flush=True)
    return rows


# ----------------------------------------------------------------------------- output
def _fmt(v, spec=None):
    """``spec`` or, by default, three significant digits below 10 (a 0.3 ms model's times
    would read 0.3 or 0.4 at one decimal: 30 % steps), one decimal above."""
    if v is None:
        return "-"
    if spec is None:
        spec = "{:.1f}" if abs(v) >= 10 else "{:.2f}" if abs(v) >= 1 else "{:.3f}"
    return spec.format(v)


def print_table(rows: list[Row]) -> None:
    head = ("model", "batch", "ours ms", "ort ms", "ours/ort", "paired", "best ours/ort",
            "ref ms", "floor ms",
            "torch ms", "numpy ms",
            "ours MB", "ort MB", "mem ratio", "first s (ours/ort)", "prepare s", "max err",
            "rounds ours | ort")
    lines = [head]
    for r in rows:
        rounds = " ".join(_fmt(v) for v in r.rounds.get("ours", [])) + " | " + \
            " ".join(_fmt(v) for v in r.rounds.get("ort", []))
        lines.append((r.model, str(r.batch), _fmt(r.ours_ms), _fmt(r.ort_ms),
                      _fmt(r.ratio, "{:.2f}x"), _fmt(r.paired_ratio, "{:.2f}x"),
                      f"{_fmt(r.ours_best_ms)}/{_fmt(r.ort_best_ms)}",
                      f"{min(r.ref_ms):.2f}-{max(r.ref_ms):.2f}" if r.ref_ms else "-",
                      _fmt(r.floor_ms, "{:.2f}"), _fmt(r.torch_ms), _fmt(r.numpy_ms),
                      _fmt(r.ours_mb, "{:.0f}"), _fmt(r.ort_mb, "{:.0f}"),
                      _fmt(r.mem_ratio, "{:.2f}x"),
                      f"{_fmt(r.ours_first_s, '{:.2f}')}/{_fmt(r.ort_first_s, '{:.2f}')}",
                      _fmt(r.prepare_s, "{:.2f}"), _fmt(r.max_err, "{:.1e}"), rounds))
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


def torch_available() -> bool:
    try:
        import torch  # noqa: F401
    except ImportError:
        return False
    return True


def environment(threads: int, rate: float | None) -> dict:
    import onnx
    import onnxruntime

    env = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
           "python": platform.python_version(), "machine": platform.machine(),
           "cpu_count": os.cpu_count(), "threads": threads, "numpy": np.__version__,
           "onnx": onnx.__version__, "onnxruntime": onnxruntime.__version__}
    try:
        with open("/proc/cpuinfo") as f:
            names = [ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")]
        if names:
            env["cpu"] = names[0]
    except OSError:
        pass
    try:
        from threadpoolctl import threadpool_info  # optional

        env["blas"] = [f"{i.get('internal_api')} {i.get('version')} threads={i.get('num_threads')}"
                       for i in threadpool_info() if i.get("user_api") == "blas"]
    except ImportError:
        pass
    if torch_available():
        import torch

        env["torch"] = torch.__version__
    if rate is not None:
        env["sgemm_gflops"] = round(rate, 1)
    env["cpu_flags"] = cpu_description()
    if hasattr(os, "getloadavg"):
        env["loadavg_1m"] = round(os.getloadavg()[0], 2)
    return env


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", nargs="+", default=list(ALL_MODELS), choices=ALL_MODELS)
    p.add_argument("--batches", nargs="+", type=int, default=[1, 8])
    p.add_argument("--runs", type=int, default=10, help="timed runs per worker (median)")
    p.add_argument("--warmup", type=int, default=2, help="untimed runs first")
    p.add_argument("--warmup-time", type=float, default=MIN_SECONDS["warmup"],
                   help="untimed runs go on at least this many seconds")
    p.add_argument("--min-time", type=float, default=MIN_SECONDS["timed"],
                   help="timed runs go on at least this many seconds (the median of them "
                        "all; 0: exactly --runs runs)")
    p.add_argument("--rounds", type=int, default=2,
                   help="fresh processes per engine, alternating engines (median of rounds)")
    p.add_argument("--threads", type=int, default=os.cpu_count() or 1,
                   help="threads of each engine: onnxruntime's and torch's intra-op threads, "
                        "our WORKBENCH_NUM_THREADS (default: os.cpu_count())")
    p.add_argument("--torch", action="store_true", help="also time PyTorch eager")
    p.add_argument("--numpy", action="store_true",
                   help="also time ours with the compiled kernels off (the before column)")
    p.add_argument("--no-compiled", action="store_true",
                   help="ours on numpy only (WORKBENCH_COMPILED=0 in its workers)")
    p.add_argument("--quick", action="store_true", help="batch 1, 3 runs, 1 warm-up, 1 round")
    p.add_argument("--profile", action="store_true",
                   help="also print our per-node and per-op-type time breakdown")
    p.add_argument("--top", type=int, default=15, help="nodes listed by --profile")
    p.add_argument("--prepare", action="store_true",
                   help="time prepare's stages for the GPT-2-like model and generated graphs")
    p.add_argument("--prepare-only", action="store_true", help="only the --prepare report")
    p.add_argument("--prepare-sizes", nargs="+", type=int, default=[5000, 10000, 20000])
    p.add_argument("--timeout", type=float, default=900.0, help="seconds per worker process")
    p.add_argument("--json", type=Path, help="also write the results as JSON here")
    p.add_argument("--clock", choices=("wall", "cpu"), default="wall",
                   help="time runs by the wall clock (default) or by the process's CPU time "
                        "(all threads: for a shared machine, best with --threads 1)")
    p.add_argument("--fixed-shapes", action="store_true",
                   help="prepare ours for each batch's input shapes (backend.prepare(..., "
                        "batch_size=N): shape arithmetic folded at prepare)")
    p.add_argument("--interleave", action="store_true",
                   help="ours and onnxruntime in one fresh process per round, alternately in "
                        "blocks of --block runs; the ratio is the median of neighbouring "
                        "blocks' ratios (no memory or first-run columns)")
    p.add_argument("--block", type=int, default=3,
                   help="runs per block with --interleave (the first re-warms the caches)")
    # internal: one engine in a fresh process
    p.add_argument("--worker", nargs=3, metavar=("ENGINE", "MODEL", "INPUTS"),
                   help=argparse.SUPPRESS)
    p.add_argument("--out", help=argparse.SUPPRESS)
    p.add_argument("--name", default="", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.interleave and (args.torch or args.numpy):
        p.error("--interleave pairs ours with onnxruntime only: run --torch / --numpy "
                "without it")
    if args.block < 1:
        p.error(f"--block is at least 1, not {args.block}")
    if args.clock == "cpu":
        CLOCK[0] = time.process_time
    MIN_SECONDS["warmup"], MIN_SECONDS["timed"] = args.warmup_time, args.min_time
    if args.worker and args.worker[0] == "pair":
        _, model, npz = args.worker
        print(json.dumps(pair_worker(model, npz, args.runs, args.warmup, args.threads,
                                     args.block, args.out, args.fixed_shapes)))
        return 0
    if args.worker:
        engine, model, npz = args.worker
        res = worker(engine, model, npz, args.runs, args.warmup, args.threads, args.out,
                     args.profile, args.name, args.fixed_shapes)
        print(json.dumps(res))
        return 0
    if args.quick:
        args.batches, args.runs, args.warmup, args.rounds = [1], 3, 1, 1
        args.warmup_time, args.min_time = 0.0, 0.0

    prep_rows = []
    if args.prepare or args.prepare_only:
        prep_rows = prepare_report(args)
        if args.prepare_only:
            if args.json:
                args.json.write_text(json.dumps({"prepare": prep_rows}, indent=2))
            return 0

    models = list(args.models)
    if not torch_available():
        skipped = [m for m in models if m in TORCH_MODELS]
        if skipped:
            print(f"PyTorch is not installed: skipping {', '.join(skipped)} "
                  "(pip install torch to benchmark them)")
        models = [m for m in models if m not in TORCH_MODELS]
    rate = sgemm_gflops()
    env = environment(args.threads, rate)
    print("environment: " + ", ".join(f"{k}={v}" for k, v in env.items()))
    compiled_line, WORKER_ENV["ours"] = prepare_compiled(not args.no_compiled)
    WORKER_ENV["ours_np"] = prepare_compiled(False)[1]
    env["compiled"] = compiled_line
    print(f"CPU: {env['cpu_flags']}\n{compiled_line}")
    if env.get("loadavg_1m", 0) > 0.5 * (os.cpu_count() or 1):
        print(f"warning: the machine is busy (load average {env['loadavg_1m']}): timings will "
              "be noisy; compare ratios within one run")
    if args.interleave:
        print(f"{args.clock} clock; both engines in one fresh process per round ({args.rounds} "
              f"rounds), >= {args.warmup} warm-up runs and >= {args.warmup_time} s each, then "
              f">= {args.runs} pairs of blocks of {args.block} runs (ours, ort, ort, ours, "
              f"...) and >= {args.min_time} s; paired = median of the pairs' ratios; ours/ort "
              f"< 1 means faster than onnxruntime\n")
    else:
        print(f"{args.clock} clock; median of >= {args.runs} runs and >= {args.min_time} s "
              f"after >= {args.warmup} warm-up runs and >= {args.warmup_time} s per fresh "
              f"process, median of {args.rounds} alternating rounds; ours/ort < 1 "
              f"means faster than onnxruntime\n")
    rows = []
    profiles = []
    with tempfile.TemporaryDirectory(prefix="wb-bench-") as tmp:
        folder, cache = Path(tmp), {}
        for name in models:
            for batch in args.batches:
                t0 = time.perf_counter()
                row = bench_one(name, batch, args, folder, cache, rate)
                rows.append(row)
                print(f"  {name} batch {batch}: ours {_fmt(row.ours_ms)} ms, "
                      f"ort {_fmt(row.ort_ms)} ms, floor {_fmt(row.floor_ms, '{:.2f}')} ms "
                      f"({time.perf_counter() - t0:.0f} s)", flush=True)
                if args.profile:
                    path, npz = model_files(name, batch, folder, cache)
                    try:
                        prof = run_worker("ours", path, npz, args, name,
                                          profile=True)["profile"]
                        profiles.append((name, batch, prof))
                        print_profile(name, batch, prof, args.top)
                    except Exception as e:  # noqa: BLE001
                        print(f"  profile failed: {e}")
    print()
    print_table(rows)
    if args.json:
        args.json.write_text(json.dumps(
            {"environment": env, "runs": args.runs, "rounds": args.rounds,
             "rows": [dict(asdict(r), ratio=r.ratio, mem_ratio=r.mem_ratio) for r in rows],
             "profiles": [{"model": n, "batch": b, **pr} for n, b, pr in profiles],
             "prepare": prep_rows}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
