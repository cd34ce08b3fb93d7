"""Training-step speed and peak memory: the workbench (autograd on an imported ONNX graph) vs
PyTorch CPU eager.

One training step = forward + loss (softmax cross-entropy) + backward + SGD update (lr 1e-3,
momentum 0.9, no dampening, no weight decay: ``opt.SGD`` and ``torch.optim.SGD`` with the same
settings compute the same update), batch 8, train mode (BatchNorm batch statistics, Dropout
active). The models are built in PyTorch (``tests/helpers/torch_models.py``), exported with
torch.onnx (opset 17) and imported with ``sonnx.SONNXModel``, so both sides train the same network
from the same weights and inputs.

Each framework runs in a fresh process of its own per model (the workbench process never imports
torch), so that each process's RSS high-water mark (``ru_maxrss``) is that framework's peak memory
for that model. The parent drives the two processes in lock-step: a step of ours, a step of
PyTorch, a step of ours... so that both see the same machine load; each step is timed inside its
process; the medians are reported. Both use ``--threads`` threads (default: all cores; with
``--threads``, PyTorch gets ``torch.set_num_threads``, the engine ``WORKBENCH_NUM_THREADS`` and
numpy's BLAS a threadpoolctl limit).

    python benchmarks/bench_training.py                 # ResNet-18, MobileNetV2, BERT-like
    python benchmarks/bench_training.py --quick         # 112x112 images, 2 timed steps
    python benchmarks/bench_training.py --models bert --runs 10 --json out.json
    python benchmarks/bench_training.py --models resnet18 --profile   # per-op breakdown

``--profile`` runs ``--profile-steps`` more steps after the timed ones with every forward kernel
call (``tape.run_op``), every gradient rule (``backprop._run_rule``, behind ``run_rule``), the
backward engine as a whole and the optimizer update timed, and prints per op (Conv split by
kind: 1x1, kxk, depthwise, with its stride) the forward and backward milliseconds per step;
beside it PyTorch's own profiler table (``torch.profiler``, self CPU time per aten op). Profiled
steps are slower than timed ones (a clock read per call); the shares are what to read.

Printed per model: median step time (ms) of ours and of PyTorch, their ratio (target: within
1.3x of PyTorch, issue 23), the peak RSS of each process (MiB), the median CPU time of a step
(all threads of the process: on a machine shared with other processes the wall time also
counts the time a process waits for a core; with ``--threads 1`` the CPU time is the work
itself), and the first step's loss on both sides (a check that the same thing is trained). Not
part of the test pass/fail.
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
from collections import defaultdict
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks._proc import peak_rss_mib  # noqa: E402

MODELS = ("resnet18", "mobilenetv2", "bert")
TARGET = 1.3   # issue 23: a training step within 1.3x of PyTorch eager
LR, MOMENTUM = 1e-3, 0.9


def _inputs(name, batch, image, seq, seed=0):
    from tests.helpers.torch_models import example_inputs  # numpy only, no torch import
    if name == "bert":
        return example_inputs(name, batch, seq=seq, seed=seed)
    return example_inputs(name, batch, image=image, seed=seed)


def _labels(name, batch, seed=0):
    n = 3 if name == "bert" else 1000
    return np.random.default_rng(seed).integers(0, n, size=batch).astype(np.int64)


def _limit_threads(threads):
    if threads:
        try:
            from threadpoolctl import threadpool_limits
            threadpool_limits(threads)
        except ImportError:
            print("threadpoolctl is not installed: numpy's BLAS keeps its own thread count",
                  file=sys.stderr)


# ----------------------------------------------------------------------------- the two steps
class TorchStep:
    def __init__(self, name, xs, labels):
        import torch

        from tests.helpers.torch_models import build
        self.torch = torch
        model, _ = build(name)          # deterministic: the weights the parent exported
        self.model = model.train()
        self.sgd = torch.optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM)
        self.tx = [torch.from_numpy(a) for a in xs]
        self.ty = torch.from_numpy(labels)

    def __call__(self) -> float:
        out = self.model(*self.tx)
        logits = out[-1] if isinstance(out, tuple) else out
        loss = self.torch.nn.functional.cross_entropy(logits, self.ty)
        self.sgd.zero_grad()
        loss.backward()
        self.sgd.step()
        return float(loss.detach())

    def profile(self, steps, top=25) -> str:
        from torch.profiler import ProfilerActivity, profile
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            for _ in range(steps):
                self()
        return prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=top)


class OurStep:
    def __init__(self, onnx_path, xs, labels, use_graph):
        import onnx

        from workbench import autograd, opt, sonnx, tensor
        from workbench.autodiff import training_step
        self.autograd = autograd
        self.training_step = training_step
        self.m = sonnx.SONNXModel(onnx.load(onnx_path))
        self.m.compile([tensor.PlaceHolder(a.shape, dtype=a.dtype) for a in xs],
                       is_train=True, use_graph=use_graph)
        self.sgd = opt.SGD(lr=LR, momentum=MOMENTUM)
        self.txs = [tensor.from_numpy(a) for a in xs]
        self.labels = labels

    def __call__(self) -> float:
        # the step inside the collector's step policy, as ``training.fit`` runs each step
        # (workbench.autodiff.collector: gen-0 threshold raised for the step, restored after)
        with self.training_step():
            outs = self.m.forward(*self.txs)
            loss = self.autograd.softmax_cross_entropy(outs[-1], self.labels)
            self.sgd.backward_and_update(loss)
            value = loss.item()
            del outs, loss
        return value

    def profile(self, steps, top=40) -> str:
        return _profile_ours(self, steps, top)


def _op_key(op_type, kw, arrays) -> str:
    """The profile row of a node: the op type, Conv split by kind."""
    if op_type not in ("Conv", "ConvTranspose") or len(arrays) < 2 or arrays[1] is None:
        return op_type
    w = arrays[1]
    x = arrays[0]
    group = int(kw.get("group", 1) or 1)
    k = "x".join(str(v) for v in w.shape[2:])
    s = max(kw.get("strides") or [1])
    if group > 1 and x is not None and group == x.shape[1] and w.shape[1] == 1:
        kind = f"depthwise {k}"
    elif group > 1:
        kind = f"grouped {k}"
    else:
        kind = k
    return f"{op_type} {kind}" + (f" s{s}" if s != 1 else "")


def _profile_ours(step, steps, top) -> str:
    """Per-op forward / backward time per step (see the module docstring)."""
    from workbench import autograd, opt
    from workbench.autodiff import backprop as _bw
    from workbench.autodiff import runner as _runner
    from workbench.autodiff import tape as _tape
    fwd, bwd = defaultdict(float), defaultdict(float)
    cpu = defaultdict(float)
    cnt = defaultdict(int)
    totals = defaultdict(float)
    # the tape's apply and the Tensor runner call run_op, backward() calls run_rule
    orig_run_op, orig_rule = _tape.run_op, _bw._run_rule
    from workbench.autodiff import fusion as _fusion
    orig_fused = _fusion.run_step
    inside = [0]    # a fused step's own recording is counted with the step (below)
    orig_backward, orig_update = autograd.backward, opt.Optimizer.update
    orig_loss = autograd.softmax_cross_entropy
    model = getattr(step, "m", None)
    orig_forward = model.forward if model is not None else None
    clock, cpu_clock = time.perf_counter, time.process_time

    def run_op(op_type, domain, opset, fn, wants_ctx, kw, attrs, inputs, *a, **k):
        if inside[0]:
            return orig_run_op(op_type, domain, opset, fn, wants_ctx, kw, attrs, inputs, *a,
                               **k)
        t0, c0 = clock(), cpu_clock()
        r = orig_run_op(op_type, domain, opset, fn, wants_ctx, kw, attrs, inputs, *a, **k)
        arrays = [getattr(t, "data", t) for t in inputs]
        key = _op_key(op_type, kw, arrays)
        fwd[key] += clock() - t0
        cpu[key] += cpu_clock() - c0
        cnt[key] += 1
        return r

    def run_fused(runner, role, chain, step, call, args):
        # a step of a fused GELU chain / attention core: its kernels run here, outside
        # run_op, so the whole call is the step's forward time (else "rest" would hold it)
        t0, c0 = clock(), cpu_clock()
        inside[0] += 1
        try:
            r = orig_fused(runner, role, chain, step, call, args)
        finally:
            inside[0] -= 1
        if r is not None:
            key = step.node.op_type
            fwd[key] += clock() - t0
            cpu[key] += cpu_clock() - c0
            cnt[key] += 1
        return r

    def run_rule(node, gouts, needs=None, found=None):
        key = _op_key(node.op_type, node.kw, node.saved_in)
        t0, c0 = clock(), cpu_clock()
        r = orig_rule(node, gouts, needs, found)
        bwd[key] += clock() - t0
        cpu[key] += cpu_clock() - c0
        return r

    def backward(*a, **k):
        t0 = clock()
        r = orig_backward(*a, **k)
        totals["backward (all)"] += clock() - t0
        return r

    def update(self, param, grad):
        t0 = clock()
        orig_update(self, param, grad)
        totals["optimizer update"] += clock() - t0

    # the model's forward as a whole (its ops + the run loop and the Tensor runner around
    # them) and the loss, so that "rest" is only what no line covers
    def forward(*a, **k):
        t0 = clock()
        r = orig_forward(*a, **k)
        totals["forward (all)"] += clock() - t0
        return r

    def loss(*a, **k):
        t0 = clock()
        r = orig_loss(*a, **k)
        totals["loss"] += clock() - t0
        return r

    _tape.run_op = _runner.run_op = run_op
    _fusion.run_step = run_fused
    _bw._run_rule = run_rule   # what backward() and run_rule() both call
    autograd.backward, opt.Optimizer.update = backward, update
    autograd.softmax_cross_entropy = loss
    if model is not None:
        model.forward = forward
    try:
        t_all, c_all = clock(), cpu_clock()
        for _ in range(steps):
            step()
        t_all, c_all = clock() - t_all, cpu_clock() - c_all
    finally:
        _tape.run_op = _runner.run_op = orig_run_op
        _fusion.run_step = orig_fused
        _bw._run_rule = orig_rule
        autograd.backward, opt.Optimizer.update = orig_backward, orig_update
        autograd.softmax_cross_entropy = orig_loss
        if model is not None:
            del model.forward    # the instance attribute set above; the method again
    per = 1e3 / steps
    f_sum, b_sum = sum(fwd.values()), sum(bwd.values())
    rows = sorted(set(fwd) | set(bwd), key=lambda k: -(fwd.get(k, 0) + bwd.get(k, 0)))
    lines = [f"ours, {steps} profiled steps, {t_all * per:.1f} ms per step (profiled), "
             f"{c_all * per:.1f} ms CPU time (all threads):",
             f"  {'op':28s} {'nodes':>6s} {'fwd ms':>9s} {'bwd ms':>9s} {'total':>9s} "
             f"{'% step':>7s} {'CPU ms':>9s}"]
    for key in rows[:top]:
        f, b = fwd.get(key, 0.0) * per, bwd.get(key, 0.0) * per
        lines.append(f"  {key:28s} {cnt.get(key, 0) // steps:6d} {f:9.1f} {b:9.1f} "
                     f"{f + b:9.1f} {100 * (f + b) / (t_all * per):6.1f}% "
                     f"{cpu.get(key, 0.0) * per:9.1f}")
    if len(rows) > top:
        rest_f = sum(fwd.get(k, 0) for k in rows[top:]) * per
        rest_b = sum(bwd.get(k, 0) for k in rows[top:]) * per
        lines.append(f"  {'(' + str(len(rows) - top) + ' more op kinds)':28s} {'':6s} "
                     f"{rest_f:9.1f} {rest_b:9.1f} {rest_f + rest_b:9.1f}")
    bw_all = totals["backward (all)"] * per
    upd = totals["optimizer update"] * per
    fw_all = totals["forward (all)"] * per
    loss_all = totals["loss"] * per
    lines += [f"  {'forward (all ops)':28s} {'':6s} {f_sum * per:9.1f}",
              f"  {'backward rules':28s} {'':6s} {'':9s} {b_sum * per:9.1f}",
              f"  {'backward engine (accumulate, walk)':36s} {bw_all - b_sum * per:9.1f}",
              f"  {'optimizer update':36s} {upd:9.1f}"]
    if model is not None:
        # forward (all) and loss hold their ops' lines above (and this profile's own clock
        # reads and bookkeeping around each op: profiled steps are slower)
        lines += [f"  {'model.forward (ops, run loop, runner)':36s} {fw_all:9.1f}",
                  f"  {'loss (softmax_cross_entropy, its op)':36s} {loss_all:9.1f}",
                  f"  {'rest (step, loss.item, tape freed)':36s} "
                  f"{t_all * per - fw_all - loss_all - bw_all - upd:9.1f}"]
    else:
        lines.append(f"  {'rest (loss check, Python)':36s} "
                     f"{t_all * per - f_sum * per - bw_all - upd:9.1f}")
    return "\n".join(lines)


# ----------------------------------------------------------------------------- child processes
def child_main(argv) -> int:
    """``--child ours|torch``: build one side, then answer the parent's commands on stdin."""
    ap = argparse.ArgumentParser()
    ap.add_argument("--child", choices=("ours", "torch"), required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--onnx")
    ap.add_argument("--batch", type=int)
    ap.add_argument("--image", type=int)
    ap.add_argument("--seq", type=int)
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--graph", action="store_true")
    a = ap.parse_args(argv)
    if a.threads:  # the engine's own worker threads (ops.parallel) as well as BLAS
        os.environ["WORKBENCH_NUM_THREADS"] = str(a.threads)
    _limit_threads(a.threads)
    xs = _inputs(a.model, a.batch, a.image, a.seq)
    labels = _labels(a.model, a.batch)
    if a.child == "torch":
        import torch
        torch.set_num_threads(a.threads or os.cpu_count() or 1)
        step = TorchStep(a.model, xs, labels)
    else:
        step = OurStep(a.onnx, xs, labels, a.graph)
    out = sys.stdout
    setup_rss = peak_rss_mib()
    out.write(json.dumps({"ready": True, "setup_rss_mib": setup_rss}) + "\n")
    out.flush()
    for line in sys.stdin:
        cmd = json.loads(line)
        if cmd["do"] == "step":
            t0, c0 = time.perf_counter(), time.process_time()
            loss = step()
            dt, dc = time.perf_counter() - t0, time.process_time() - c0
            reply = {"s": dt, "cpu": dc, "loss": loss}
        elif cmd["do"] == "profile":
            reply = {"text": step.profile(cmd["steps"])}
        elif cmd["do"] == "rss":
            reply = {"peak_rss_mib": peak_rss_mib()}
        else:
            break
        out.write(json.dumps(reply) + "\n")
        out.flush()
    return 0


class Child:
    def __init__(self, args_list):
        self.p = subprocess.Popen([sys.executable, __file__] + args_list, stdin=subprocess.PIPE,
                                  stdout=subprocess.PIPE, text=True, cwd=str(ROOT),
                                  env={**os.environ, "PYTHONPATH": os.pathsep.join(
                                      [str(ROOT)] + [p for p in os.environ.get(
                                          "PYTHONPATH", "").split(os.pathsep) if p])})
        self.ready = self._read()

    def _read(self):
        line = self.p.stdout.readline()
        if not line:
            rc = self.p.wait()
            raise RuntimeError(f"benchmark child {self.p.args[2:6]} exited with status {rc}")
        return json.loads(line)

    def ask(self, **cmd):
        self.p.stdin.write(json.dumps(cmd) + "\n")
        self.p.stdin.flush()
        return self._read()

    def close(self):
        try:
            self.p.stdin.close()
        finally:
            self.p.wait(timeout=60)


def run_model(name, args, threads, tmpdir):
    from tests.helpers.torch_models import build, export_onnx
    model, example = build(name)
    path = os.path.join(tmpdir, f"{name}.onnx")
    export_onnx(model, example, path, opset=17)
    del model
    common = ["--model", name, "--batch", str(args.batch), "--image", str(args.image),
              "--seq", str(args.seq), "--threads", str(args.threads or 0)]
    ours = Child(["--child", "ours", "--onnx", path] + common
                 + (["--graph"] if args.graph else []))
    theirs = Child(["--child", "torch"] + common)
    try:
        first = (ours.ask(do="step")["loss"], theirs.ask(do="step")["loss"])
        for _ in range(max(0, args.warmup - 1)):
            ours.ask(do="step"), theirs.ask(do="step")
        t_ours, t_theirs, c_ours, c_theirs = [], [], [], []
        gap = getattr(args, "gap", 0.0) or 0.0
        for _ in range(args.runs):
            if gap:   # the other engine's idle threads (PyTorch's OpenMP spin) settle first
                time.sleep(gap)
            r = ours.ask(do="step")
            t_ours.append(r["s"])
            c_ours.append(r["cpu"])
            if gap:
                time.sleep(gap)
            r = theirs.ask(do="step")
            t_theirs.append(r["s"])
            c_theirs.append(r["cpu"])
        rss = (ours.ask(do="rss")["peak_rss_mib"], theirs.ask(do="rss")["peak_rss_mib"])
        prof = None
        if args.profile:
            prof = (ours.ask(do="profile", steps=args.profile_steps)["text"],
                    theirs.ask(do="profile", steps=args.profile_steps)["text"])
    finally:
        ours.close()
        theirs.close()
    return {"model": name, "ours_ms": statistics.median(t_ours) * 1e3,
            "torch_ms": statistics.median(t_theirs) * 1e3,
            "ours_cpu_ms": statistics.median(c_ours) * 1e3,
            "torch_cpu_ms": statistics.median(c_theirs) * 1e3,
            "ours_steps_ms": [t * 1e3 for t in t_ours],
            "torch_steps_ms": [t * 1e3 for t in t_theirs],
            "ours_peak_rss_mib": rss[0], "torch_peak_rss_mib": rss[1],
            "ours_setup_rss_mib": ours.ready["setup_rss_mib"],
            "torch_setup_rss_mib": theirs.ready["setup_rss_mib"],
            "loss_ours": first[0], "loss_torch": first[1]}, prof


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if "--child" in argv:
        return child_main(argv)
    ap = argparse.ArgumentParser(description="training-step time and peak memory vs PyTorch CPU")
    ap.add_argument("--models", nargs="+", default=list(MODELS), choices=MODELS)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--image", type=int, default=224)
    ap.add_argument("--seq", type=int, default=32)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--graph", action="store_true", help="compile with use_graph=True")
    ap.add_argument("--gap", type=float, default=0.0,
                    help="seconds to wait before each timed step of either engine (with several "
                         "threads PyTorch's OpenMP workers spin ~10 ms of CPU after its step, "
                         "on the cores the next step of ours then runs on)")
    ap.add_argument("--quick", action="store_true", help="112x112 images, 2 timed runs")
    ap.add_argument("--threads", type=int, default=None,
                    help="threads for both sides (default: all cores): torch.set_num_threads, the "
                         "engine's WORKBENCH_NUM_THREADS, and numpy's BLAS through "
                         "threadpoolctl when installed")
    ap.add_argument("--profile", action="store_true",
                    help="after the timed steps: per-op forward/backward breakdown of both sides")
    ap.add_argument("--profile-steps", type=int, default=2)
    ap.add_argument("--json", help="write the results there")
    args = ap.parse_args(argv)
    if args.quick:
        args.image, args.runs = 112, 2
    try:
        import torch  # noqa: F401
    except ImportError:
        print("PyTorch is not installed: nothing to compare against (pip install torch)")
        return 0
    threads = args.threads or os.cpu_count() or 1
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    from benchmarks._cpu import cpu_description, prepare_compiled  # noqa: PLC0415
    cpu = cpu_description()
    compiled_line, env = prepare_compiled()   # built or loaded here, never in a timed step
    if "WORKBENCH_COMPILED" in env:   # our child waits for the cached kernels to load
        os.environ["WORKBENCH_COMPILED"] = env["WORKBENCH_COMPILED"]
    print(f"CPU: {cpu}\n{compiled_line}; a training step runs the graph as written (NCHW): "
          f"of these it uses conv_grad (depthwise forward and gradients), norm_train "
          f"(training BatchNormalization, LayerNormalization's gradient) and transformer "
          f"(LayerNorm/Softmax forward); the channels-last layout and its kernels are for "
          f"inference plans")
    print(f"batch {args.batch}, images {args.image}x{args.image}, bert seq {args.seq}, "
          f"{threads} threads, median of {args.runs} steps after {args.warmup} warm-up, "
          f"one process per framework and model; load average {load:.2f}")
    print(f"{'model':12s} {'ours ms':>9s} {'torch ms':>9s} {'ours/torch':>10s} "
          f"{'ours MiB':>9s} {'torch MiB':>9s} {'ours CPU':>9s} {'torch CPU':>9s} "
          f"{'loss ours':>10s} {'loss torch':>10s}")
    rows, profiles = [], []
    with tempfile.TemporaryDirectory() as tmpdir:
        for name in args.models:
            row, prof = run_model(name, args, threads, tmpdir)
            row["ratio"] = row["ours_ms"] / row["torch_ms"]
            rows.append(row)
            flag = "" if row["ratio"] <= TARGET else f"  (above the {TARGET}x target)"
            print(f"{name:12s} {row['ours_ms']:9.1f} {row['torch_ms']:9.1f} "
                  f"{row['ratio']:9.2f}x {row['ours_peak_rss_mib']:9.0f} "
                  f"{row['torch_peak_rss_mib']:9.0f} {row['ours_cpu_ms']:9.1f} "
                  f"{row['torch_cpu_ms']:9.1f} {row['loss_ours']:10.4f} "
                  f"{row['loss_torch']:10.4f}{flag}", flush=True)
            if prof:
                profiles.append((name, prof))
    for name, (ours_p, torch_p) in profiles:
        print(f"\n=== {name}: profile\n{ours_p}\n\nPyTorch ({name}):\n{torch_p}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"cpu": cpu, "batch": args.batch, "image": args.image, "seq": args.seq,
                       "threads": threads, "load_average": load, "rows": rows}, f, indent=2)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
