"""GPU speed: the workbench engine on CUDA (cupy + our kernels) vs PyTorch CUDA eager, in one run.

Inference at batch 32: ResNet-18 and BERT-like (``tests/helpers/torch_models.py``) and a
ResNet-50 written below (torchvision's bottleneck layout), each exported with torch.onnx so both
sides run the same weights. Training: one SGD step of ResNet-18 at batch 32 (forward, softmax
cross-entropy, backward, update) with ``workbench.sonnx``/``opt`` against ``torch.optim.SGD``.
Timings: warm-up runs, then the median of N runs, each ended by a device synchronize; inputs
are already on the GPU on both sides. Targets: inference <= 1.5x PyTorch, training <= 2x.

    python benchmarks/bench_gpu.py                      # everything
    python benchmarks/bench_gpu.py --quick              # 3 timed runs each
    python benchmarks/bench_gpu.py --models resnet18 --no-train --json out.json
    python benchmarks/bench_gpu.py --precision tf32     # TF32 tensor cores on both sides
    python benchmarks/bench_gpu.py --profile            # also: time per op type (synchronized)

Precision: by default both sides compute in strict float32 (PyTorch's cuDNN would otherwise
use TF32 for convolutions while cuBLAS in cupy does not: not the same arithmetic).
``--precision tf32`` lets both use TF32 tensor cores (``CUPY_TF32=1`` for cupy's cuBLAS calls,
``allow_tf32`` for PyTorch).

Exits with status 2 and a message when no CUDA GPU (or no cupy / CUDA build of PyTorch) is
present. Not part of the test pass/fail.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import statistics
import sys
import time
import traceback
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

INFER_MODELS = ("resnet18", "resnet50", "bert")
TARGET_INFER, TARGET_TRAIN = 1.5, 2.0


def require_gpu():
    """(workbench Device, torch) or exit 2 with the reason."""
    from workbench import device as wbdevice
    from workbench.arrays import cupy_module
    if cupy_module() is None:
        print("bench_gpu: no GPU benchmark possible: cupy is not installed "
              "(pip install '.[gpu-cuda12]' or '.[gpu-cuda13]')", file=sys.stderr)
        sys.exit(2)
    if not wbdevice.cuda_available():
        print("bench_gpu: no GPU benchmark possible: cupy sees no CUDA GPU on this machine",
              file=sys.stderr)
        sys.exit(2)
    try:
        import torch
    except ImportError:
        print("bench_gpu: PyTorch is not installed (the comparison needs a CUDA build)",
              file=sys.stderr)
        sys.exit(2)
    if not torch.cuda.is_available():
        print("bench_gpu: this PyTorch build has no CUDA (install a CUDA wheel of torch)",
              file=sys.stderr)
        sys.exit(2)
    return wbdevice.create_cuda_gpu(0), torch


def median_ms(fn, sync, runs, warmup):
    for _ in range(warmup):
        fn()
    sync()
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        fn()
        sync()
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


# ----------------------------------------------------------------------------- ResNet-50
def resnet50(torch):
    nn = torch.nn

    class Bottleneck(nn.Module):
        def __init__(self, inplanes, planes, stride=1, down=None):
            super().__init__()
            self.conv1 = nn.Conv2d(inplanes, planes, 1, bias=False)
            self.bn1 = nn.BatchNorm2d(planes)
            self.conv2 = nn.Conv2d(planes, planes, 3, stride, 1, bias=False)
            self.bn2 = nn.BatchNorm2d(planes)
            self.conv3 = nn.Conv2d(planes, planes * 4, 1, bias=False)
            self.bn3 = nn.BatchNorm2d(planes * 4)
            self.relu = nn.ReLU(inplace=True)
            self.down = down

        def forward(self, x):
            idt = x if self.down is None else self.down(x)
            out = self.relu(self.bn1(self.conv1(x)))
            out = self.relu(self.bn2(self.conv2(out)))
            return self.relu(self.bn3(self.conv3(out)) + idt)

    class ResNet50(nn.Module):
        def __init__(self, classes=1000):
            super().__init__()
            self.stem = nn.Sequential(nn.Conv2d(3, 64, 7, 2, 3, bias=False), nn.BatchNorm2d(64),
                                      nn.ReLU(inplace=True), nn.MaxPool2d(3, 2, 1))
            layers, inplanes = [], 64
            for planes, blocks, stride in ((64, 3, 1), (128, 4, 2), (256, 6, 2), (512, 3, 2)):
                down = nn.Sequential(nn.Conv2d(inplanes, planes * 4, 1, stride, bias=False),
                                     nn.BatchNorm2d(planes * 4))
                layers.append(Bottleneck(inplanes, planes, stride, down))
                inplanes = planes * 4
                layers += [Bottleneck(inplanes, planes) for _ in range(blocks - 1)]
            self.layers = nn.Sequential(*layers)
            self.pool = nn.AdaptiveAvgPool2d(1)
            self.fc = nn.Linear(2048, classes)

        def forward(self, x):
            return self.fc(torch.flatten(self.pool(self.layers(self.stem(x))), 1))

    torch.manual_seed(0)
    return ResNet50().eval()


def build(name, torch, batch, seq):
    from tests.helpers import torch_models as tm
    if name == "resnet50":
        model = resnet50(torch)
        inputs = tm.example_inputs("resnet18", batch)       # (batch, 3, 224, 224)
    else:
        model, _ = tm.build(name)
        inputs = tm.example_inputs(name, batch, seq=seq) if name == "bert" else \
            tm.example_inputs(name, batch)
    example = tuple(torch.from_numpy(a[:1]) for a in inputs)
    proto = tm.export_onnx(model, example, None, opset=17)
    return model, proto, inputs


# ----------------------------------------------------------------------------- inference
def bench_inference(name, dev, torch, args):
    import workbench.backend as backend
    model, proto, inputs = build(name, torch, args.batch, args.seq)
    t0 = time.perf_counter()
    rep = backend.prepare(proto, str(dev))
    prep_s = time.perf_counter() - t0
    feeds = [dev.put(a) for a in inputs]
    ours = median_ms(lambda: rep.plan.run(feeds), dev.synchronize, args.runs, args.warmup)
    if args.profile:
        profile_plan(name, rep.plan, feeds, dev)
    rep.plan.track_memory = True
    dev.reset_peak()
    out = dev.get(rep.plan.run(feeds)[0])
    peak = rep.plan.last_peak_bytes
    tmodel = model.cuda().eval()
    tin = [torch.from_numpy(a).cuda() for a in inputs]

    def tfwd():
        with torch.no_grad():
            return tmodel(*tin)
    theirs = median_ms(tfwd, torch.cuda.synchronize, args.runs, args.warmup)
    ref = tfwd()
    ref = (ref[0] if isinstance(ref, (tuple, list)) else ref).float().cpu().numpy()
    err = float(np.abs(out - ref).max() / max(1e-12, np.abs(ref).max()))
    return dict(kind="inference", model=name, batch=args.batch, ours_ms=ours, torch_ms=theirs,
                ratio=ours / theirs, target=TARGET_INFER, prepare_s=prep_s,
                peak_mib=None if peak is None else peak / 2 ** 20, max_rel_err=err)


def profile_plan(name, plan, feeds, dev, runs=5):
    """Print the synchronized time per op type of ``plan`` (Python overhead included)."""
    per_op = collections.defaultdict(float)
    count = collections.Counter()
    state = {}

    def hook(node, outs):
        dev.synchronize()
        t = time.perf_counter()
        per_op[node.op_type] += t - state["t"]
        count[node.op_type] += 1
        state["t"] = t
    for _ in range(runs):
        dev.synchronize()
        state["t"] = time.perf_counter()
        plan.run(feeds, hook=hook)
    total = sum(per_op.values())
    print(f"profile {name}: {len(plan.steps)} nodes, {total / runs * 1e3:.2f} ms per run "
          f"(synchronized after every node)")
    for op, sec in sorted(per_op.items(), key=lambda kv: -kv[1])[:12]:
        print(f"  {op:24s} {count[op] // runs:4d} nodes {sec / runs * 1e3:8.3f} ms "
              f"{100 * sec / total:5.1f}%")


# ----------------------------------------------------------------------------- training
def bench_training(dev, torch, args):
    from workbench import autograd, opt, sonnx, tensor
    model, proto, inputs = build("resnet18", torch, args.batch, args.seq)
    x = inputs[0]
    y = np.random.default_rng(0).integers(0, 1000, size=args.batch).astype(np.int64)
    m = sonnx.SONNXModel(proto, device=dev)
    m.compile([tensor.PlaceHolder(x.shape, device=dev)], is_train=True)
    m.train()
    sgd = opt.SGD(lr=0.01, momentum=0.9)
    tx = tensor.Tensor(data=x, device=dev)
    ty = tensor.Tensor(data=y, device=dev)

    def ours_step():
        out = m.forward(tx)[0]
        loss = autograd.softmax_cross_entropy(out, ty)
        sgd.backward_and_update(loss)
        return loss
    ours = median_ms(ours_step, dev.synchronize, args.runs, args.warmup)
    if args.profile:
        fw = median_ms(lambda: autograd.softmax_cross_entropy(m.forward(tx)[0], ty),
                       dev.synchronize, args.runs, 1)
        print(f"profile training resnet18: step {ours:.2f} ms, forward+loss (taped) "
              f"{fw:.2f} ms, backward+update {ours - fw:.2f} ms")
        from workbench.autodiff import backprop as _bw  # backward() calls its run_rule
        per_op, count = collections.defaultdict(float), collections.Counter()
        real = _bw.run_rule

        def timed(node, gouts):
            dev.synchronize()
            t0 = time.perf_counter()
            r = real(node, gouts)
            dev.synchronize()
            per_op[node.op_type] += time.perf_counter() - t0
            count[node.op_type] += 1
            return r
        _bw.run_rule = timed
        try:
            ours_step()
        finally:
            _bw.run_rule = real
        for op, sec in sorted(per_op.items(), key=lambda kv: -kv[1])[:10]:
            print(f"  backward {op:22s} {count[op]:4d} nodes {sec * 1e3:8.3f} ms")

    tmodel = model.cuda().train()
    topt = torch.optim.SGD(tmodel.parameters(), lr=0.01, momentum=0.9)
    txt, tyt = torch.from_numpy(x).cuda(), torch.from_numpy(y).cuda()
    lossf = torch.nn.CrossEntropyLoss()

    def torch_step():
        topt.zero_grad(set_to_none=True)
        loss = lossf(tmodel(txt), tyt)
        loss.backward()
        topt.step()
        return loss
    theirs = median_ms(torch_step, torch.cuda.synchronize, args.runs, args.warmup)
    return dict(kind="training", model="resnet18", batch=args.batch, ours_ms=ours,
                torch_ms=theirs, ratio=ours / theirs, target=TARGET_TRAIN)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--models", nargs="*", default=list(INFER_MODELS), choices=INFER_MODELS)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--seq", type=int, default=64, help="BERT sequence length (<= 64)")
    p.add_argument("--runs", type=int, default=20)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--quick", action="store_true", help="3 timed runs, 1 warm-up")
    p.add_argument("--no-train", action="store_true")
    p.add_argument("--json", help="also write the rows to this file")
    p.add_argument("--precision", choices=("fp32", "tf32"), default="fp32",
                   help="fp32 (default): strict float32 on both sides; tf32: TF32 tensor "
                        "cores on both sides")
    p.add_argument("--profile", action="store_true", help="print time per op type")
    args = p.parse_args(argv)
    if args.precision == "tf32":
        if "cupy" in sys.modules:
            print("bench_gpu: --precision tf32 must be chosen before cupy is imported",
                  file=sys.stderr)
            return 2
        os.environ["CUPY_TF32"] = "1"   # read by cupy at import: TF32 in its cuBLAS calls
    if args.quick:
        args.runs, args.warmup = 3, 1
    dev, torch = require_gpu()
    tf32 = args.precision == "tf32"
    torch.backends.cudnn.allow_tf32 = tf32
    torch.backends.cuda.matmul.allow_tf32 = tf32
    cp = dev.xp
    print(f"device: {cp.cuda.runtime.getDeviceProperties(dev.index)['name'].decode()}  "
          f"cupy {cp.__version__}  torch {torch.__version__}  precision {args.precision}")
    rows = []
    jobs = [("inference", m) for m in args.models] + ([] if args.no_train else
                                                      [("training", "resnet18")])
    for kind, name in jobs:
        try:
            row = bench_inference(name, dev, torch, args) if kind == "inference" else \
                bench_training(dev, torch, args)
        except Exception as e:  # keep going: one broken model must not hide the others
            traceback.print_exc()
            row = dict(kind=kind, model=name, batch=args.batch, error=f"{type(e).__name__}: {e}")
        rows.append(row)
        if "error" in row:
            print(f"{kind:9s} {name:9s} b{args.batch}: FAILED {row['error']}")
        else:
            ok = "ok" if row["ratio"] <= row["target"] else "MISSES TARGET"
            extra = f"  err {row['max_rel_err']:.1e}" if "max_rel_err" in row else ""
            print(f"{kind:9s} {name:9s} b{args.batch}: ours {row['ours_ms']:8.2f} ms  "
                  f"torch {row['torch_ms']:8.2f} ms  ratio {row['ratio']:5.2f} "
                  f"(target <= {row['target']}) {ok}{extra}")
        cp.get_default_memory_pool().free_all_blocks()
    print("memory:", dev.memory_info())
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
