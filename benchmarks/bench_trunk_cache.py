"""Fine-tuning a new head on a frozen MobileNetV2, with and without the trunk cache.

The model is the MobileNetV2 zoo twin (``workbench.zoo.twins``: the real architecture's
layout at width 0.25 with one block per stage, deterministic random weights — nothing is
downloaded, and its features are random convolutional features, not ImageNet ones). It is
cut after its GlobalAveragePool (320 features, by value name), a new ``layer.Linear(320,
10)`` head is trained with ``training.fit`` for 5 epochs (batch 32, ``opt.Adam(lr=0.01)``: the
twin's random features share a large common offset, which plain SGD at a useful rate does not
survive) on
1,000 images: scikit-learn's 8x8 digits, upscaled to 224x224 by repeating each pixel 28x28
times, copied to 3 channels and normalised with ImageNet's mean and standard deviation. The
test accuracy is measured afterwards on 300 other digits. Random features of upscaled 8x8
digits are weak features: the accuracies are low (about 0.3 after 5 epochs); what the
benchmark checks is that both runs reach the same ones, and how long each takes.

Both runs freeze the imported graph with ``freeze_imported(inference=True)``, so the trunk
runs in its inference form (BatchNormalization with its running statistics) with and
without the cache and both compute the same thing; the only difference is
``fit(..., cache_trunk=True)`` (memory). Each run is a fresh process with 2 threads
(``WORKBENCH_NUM_THREADS=2``, BLAS at 2 threads) and its own empty ``WORKBENCH_HOME``; the
runs go one after the other. Printed: the fit time of each (wall, and CPU time of the
process: on a machine shared with other work the wall time also counts the waits for a
core), per-epoch times, the ratios, the
final training loss and the training and test accuracies of each (equal to rounding: the
cache computes the same trunk outputs, batched differently), and the peak RSS.

    python benchmarks/bench_trunk_cache.py                 # 1,000 images, 5 epochs
    python benchmarks/bench_trunk_cache.py --quick         # 128 images, 2 epochs
    python benchmarks/bench_trunk_cache.py --json out.json

Not part of the test pass/fail.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks._proc import peak_rss_mib  # noqa: E402

MEAN = np.array([0.485, 0.456, 0.406], np.float32).reshape(1, 3, 1, 1)
STD = np.array([0.229, 0.224, 0.225], np.float32).reshape(1, 3, 1, 1)


def digits_224(start: int, n: int) -> tuple[np.ndarray, np.ndarray]:
    """Digits ``start .. start+n`` as [n, 3, 224, 224] float32 ImageNet-normalised images."""
    from sklearn.datasets import load_digits
    d = load_digits()
    img = (d.images[start:start + n] / 16.0).astype(np.float32)
    big = np.repeat(np.repeat(img, 28, axis=1), 28, axis=2)          # 8x8 -> 224x224
    x = (np.repeat(big[:, None], 3, axis=1) - MEAN) / STD
    return np.ascontiguousarray(x, dtype=np.float32), d.target[start:start + n].astype(np.int64)


def worker(args) -> dict:
    from workbench import autograd, layer, opt, sonnx, tensor, training
    from workbench.zoo import twins

    x, y = digits_224(0, args.images)
    xt, yt = digits_224(1200, args.test)
    proto = twins.build("mobilenetv2")

    class Head(sonnx.SONNXModel):
        def __init__(self, m):
            super().__init__(m)
            self.cut_at = next(n.outputs[0] for n in self.onnx_graph.nodes
                               if n.op_type == "GlobalAveragePool")
            self.fc = layer.Linear(320, 10)

        def forward(self, *xs):
            f = super().forward(*xs, last_layers=self.cut_at)[0]      # [n, 320, 1, 1]
            return self.fc(autograd.flatten(f, 1))

    tensor.seed(0)
    net = Head(proto).freeze_imported(inference=True)
    marks = []
    c0, t0 = time.process_time(), time.perf_counter()
    hist = training.fit(net, x, y, epochs=args.epochs, batch_size=32,
                        optimizer=opt.Adam(lr=args.lr),
                        cache_trunk=True if args.mode == "cached" else False,
                        callback=lambda epoch, logs: marks.append(time.process_time()))
    fit_s, cpu_s = time.perf_counter() - t0, time.process_time() - c0
    test = training.evaluate(net, xt, yt)
    return {"mode": args.mode, "fit_s": fit_s, "epoch_s": hist["time"], "loss": hist["loss"],
            "cpu_s": cpu_s, "epoch_cpu_s": np.diff([c0] + marks).tolist(),
            "train_accuracy": hist["accuracy"][-1], "test_accuracy": test["accuracy"],
            "trunk_cache": {k: v for k, v in hist.get("trunk_cache", {}).items()
                            if k != "messages"},
            "peak_rss_mib": peak_rss_mib()}


def run_worker(mode: str, args, home: str) -> dict:
    env = dict(os.environ, WORKBENCH_NUM_THREADS=str(args.threads),
               OPENBLAS_NUM_THREADS=str(args.threads), OMP_NUM_THREADS=str(args.threads),
               MKL_NUM_THREADS=str(args.threads), WORKBENCH_HOME=home,
               PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    with tempfile.NamedTemporaryFile(suffix=".json") as out:
        cmd = [sys.executable, __file__, "--worker", mode, "--out", out.name,
               "--images", str(args.images), "--test", str(args.test),
               "--epochs", str(args.epochs), "--lr", str(args.lr)]
        subprocess.run(cmd, env=env, check=True)
        return json.loads(Path(out.name).read_text())


def cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--images", type=int, default=1000)
    p.add_argument("--test", type=int, default=300)
    p.add_argument("--epochs", type=int, default=5)
    p.add_argument("--lr", type=float, default=0.01)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--quick", action="store_true", help="128 images, 2 epochs")
    p.add_argument("--json", help="write the results here")
    p.add_argument("--worker", choices=["plain", "cached"], help=argparse.SUPPRESS)
    p.add_argument("--out", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.quick:
        args.images, args.test, args.epochs = 128, 64, 2
    if args.worker:
        args.mode = args.worker
        res = worker(args)
        Path(args.out).write_text(json.dumps(res))
        return 0
    print(f"CPU: {cpu_name()}, {os.cpu_count()} logical cores; load average before: "
          f"{os.getloadavg()[0]:.1f}; {args.threads} threads per run")
    print(f"MobileNetV2 twin, new Linear(320, 10) head, {args.images} digits upscaled to "
          f"224x224, {args.epochs} epochs, batch 32")
    results = {}
    with tempfile.TemporaryDirectory() as home:
        for mode in ("plain", "cached"):
            results[mode] = run_worker(mode, args, os.path.join(home, mode))
    plain, cached = results["plain"], results["cached"]
    ratio = plain["fit_s"] / cached["fit_s"]
    cpu_ratio = plain["cpu_s"] / cached["cpu_s"]
    print(f"\n{'':22s}{'without cache':>16s}{'with cache':>16s}")
    print(f"{'fit wall time (s)':22s}{plain['fit_s']:16.1f}{cached['fit_s']:16.1f}")
    for e in range(len(plain["epoch_s"])):
        print(f"{f'  epoch {e + 1} (s)':22s}{plain['epoch_s'][e]:16.1f}"
              f"{cached['epoch_s'][e]:16.2f}")
    print(f"{'fit CPU time (s)':22s}{plain['cpu_s']:16.1f}{cached['cpu_s']:16.1f}")
    for e in range(len(plain["epoch_cpu_s"])):
        print(f"{f'  epoch {e + 1} (s)':22s}{plain['epoch_cpu_s'][e]:16.1f}"
              f"{cached['epoch_cpu_s'][e]:16.2f}")
    print(f"{'final training loss':22s}{plain['loss'][-1]:16.5f}{cached['loss'][-1]:16.5f}")
    print(f"{'training accuracy':22s}{plain['train_accuracy']:16.3f}"
          f"{cached['train_accuracy']:16.3f}")
    print(f"{'test accuracy':22s}{plain['test_accuracy']:16.3f}{cached['test_accuracy']:16.3f}")
    print(f"{'peak RSS (MiB)':22s}{plain['peak_rss_mib']:16.0f}{cached['peak_rss_mib']:16.0f}")
    print(f"\nspeed-up with the cache: {ratio:.2f}x wall, {cpu_ratio:.2f}x CPU (trunk ran on "
          f"{cached['trunk_cache'].get('computed')} samples, outputs reused "
          f"{cached['trunk_cache'].get('reused')} times); load average after: "
          f"{os.getloadavg()[0]:.1f}")
    if args.json:
        Path(args.json).write_text(json.dumps({"cpu": cpu_name(), "ratio": ratio,
                                               "cpu_ratio": cpu_ratio, **results}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
