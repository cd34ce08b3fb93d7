"""Training-step speed: the workbench (autograd on an imported ONNX graph) vs PyTorch CPU.

One training step = forward + loss + backward + SGD update (momentum 0.9), batch 8, train mode
(BatchNorm batch statistics, Dropout active). The models are built in PyTorch
(``tests/helpers/torch_models.py``), exported with torch.onnx (opset 17) and imported with
``sonnx.SONNXModel``, so both sides train the same network from the same weights. Both run on
the same machine in the same process, PyTorch with ``torch.set_num_threads(os.cpu_count())``,
their steps interleaved (ours, torch, ours, torch...) so that both see the same load.

    python benchmarks/bench_training.py                 # ResNet-18, MobileNetV2, BERT-like
    python benchmarks/bench_training.py --quick         # 112x112 images, 2 timed steps
    python benchmarks/bench_training.py --models bert --runs 10 --json out.json

Printed per model: median step time (ms) of ours and of PyTorch, their ratio (target: within
2.5x of PyTorch), and the first step's loss on both sides (a check that the same thing is
trained). Not part of the test pass/fail.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

MODELS = ("resnet18", "mobilenetv2", "bert")
TARGET = 2.5


def _inputs(name, batch, image, seq, seed=0):
    from tests.helpers.torch_models import example_inputs
    if name == "bert":
        return example_inputs(name, batch, seq=seq, seed=seed)
    return example_inputs(name, batch, image=image, seed=seed)


def _labels(name, batch, seed=0):
    n = 3 if name == "bert" else 1000
    return np.random.default_rng(seed).integers(0, n, size=batch).astype(np.int64)


class TorchStep:
    def __init__(self, model, xs, labels):
        import torch
        self.torch = torch
        self.model = model.train()
        self.sgd = torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9)
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


class OurStep:
    def __init__(self, proto, xs, labels, use_graph):
        from workbench import autograd, opt, sonnx, tensor
        self.autograd = autograd
        self.m = sonnx.SONNXModel(proto)
        self.m.compile([tensor.PlaceHolder(a.shape, dtype=a.dtype) for a in xs],
                       is_train=True, use_graph=use_graph)
        self.sgd = opt.SGD(lr=1e-3, momentum=0.9)
        self.txs = [tensor.from_numpy(a) for a in xs]
        self.labels = labels

    def __call__(self) -> float:
        outs = self.m.forward(*self.txs)
        loss = self.autograd.softmax_cross_entropy(outs[-1], self.labels)
        self.sgd.backward_and_update(loss)
        return loss.item()


def interleaved(ours, theirs, warmup, runs):
    """Alternate the two steps so that both see the same machine load; medians."""
    first = (ours(), theirs())
    for _ in range(max(0, warmup - 1)):
        ours(), theirs()
    t_ours, t_theirs = [], []
    for _ in range(runs):
        t0 = time.perf_counter()
        ours()
        t_ours.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        theirs()
        t_theirs.append(time.perf_counter() - t0)
    return statistics.median(t_ours), statistics.median(t_theirs), first


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description="training-step time vs PyTorch CPU")
    ap.add_argument("--models", nargs="+", default=list(MODELS), choices=MODELS)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--image", type=int, default=224)
    ap.add_argument("--seq", type=int, default=32)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--graph", action="store_true", help="compile with use_graph=True")
    ap.add_argument("--quick", action="store_true", help="112x112 images, 2 timed runs")
    ap.add_argument("--threads", type=int, default=None,
                    help="threads for both sides (default: all cores); numpy's BLAS is limited "
                         "with threadpoolctl when installed")
    ap.add_argument("--json", help="write the results there")
    args = ap.parse_args(argv)
    if args.quick:
        args.image, args.runs = 112, 2
    try:
        import torch
    except ImportError:
        print("PyTorch is not installed: nothing to compare against (pip install torch)")
        return 0
    from tests.helpers.torch_models import build, export_onnx

    threads = args.threads or os.cpu_count() or 1
    torch.set_num_threads(threads)
    if args.threads:
        try:
            from threadpoolctl import threadpool_limits
            threadpool_limits(args.threads)
        except ImportError:
            print("threadpoolctl is not installed: numpy's BLAS keeps its own thread count")
    print(f"batch {args.batch}, images {args.image}x{args.image}, bert seq {args.seq}, "
          f"{threads} threads, median of {args.runs} steps after {args.warmup} warm-up")
    print(f"{'model':14s} {'ours ms':>10s} {'torch ms':>10s} {'ours/torch':>11s} "
          f"{'loss ours':>10s} {'loss torch':>11s}")
    rows = []
    for name in args.models:
        model, example = build(name)
        proto = export_onnx(model, example, None, opset=17)
        xs = _inputs(name, args.batch, args.image, args.seq)
        labels = _labels(name, args.batch)
        ours, theirs, (l_ours, l_torch) = interleaved(
            OurStep(proto, xs, labels, args.graph), TorchStep(model, xs, labels),
            args.warmup, args.runs)
        ratio = ours / theirs
        rows.append({"model": name, "ours_ms": ours * 1e3, "torch_ms": theirs * 1e3,
                     "ratio": ratio, "loss_ours": l_ours, "loss_torch": l_torch})
        flag = "" if ratio <= TARGET else f"  (above the {TARGET}x target)"
        print(f"{name:14s} {ours * 1e3:10.1f} {theirs * 1e3:10.1f} {ratio:10.2f}x "
              f"{l_ours:10.4f} {l_torch:11.4f}{flag}", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"batch": args.batch, "image": args.image, "seq": args.seq,
                       "threads": threads, "rows": rows}, f, indent=2)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
