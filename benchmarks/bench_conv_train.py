"""A training step's convolutions, layer by layer: ResNet-18's convolutions at 224x224 (NCHW,
float32), forward, dL/dX and dL/dW, on the compiled paths (``gemm_avx2.iconv`` for the forward
and the stride-1 input gradient, ``wgrad_avx2.wgrad`` for the weight gradient, each taken where
``autodiff/rules/conv.py``'s size rules take it) against the im2col + OpenBLAS paths they
replace (``compiled.disabled()``), interleaved per call in one process, CPU time
(``time.process_time``), medians of ``--reps``. Then MaxPool's gradient (``conv_grad.maxpool_dx``
vs the numpy path). Whole steps against PyTorch: ``benchmarks/bench_training.py``.

    python benchmarks/bench_conv_train.py                 # batch 8, one thread
    python benchmarks/bench_conv_train.py --batch 1 --reps 15
    python benchmarks/bench_conv_train.py --threads 2
"""

from __future__ import annotations

import os
import sys

_THREADS = "1"
for _i, _a in enumerate(sys.argv):   # the thread variables are read when numpy is imported
    if _a == "--threads" and _i + 1 < len(sys.argv):
        _THREADS = sys.argv[_i + 1]
for _v in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS",
           "WORKBENCH_NUM_THREADS"):
    os.environ[_v] = _THREADS

import argparse  # noqa: E402
import statistics  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks._cpu import cpu_description  # noqa: E402

# (C, M, H, kernel, stride, pad, count in ResNet-18)
LAYERS = [
    (3, 64, 224, 7, 2, 3, 1),
    (64, 64, 56, 3, 1, 1, 4),
    (64, 128, 56, 3, 2, 1, 1),
    (128, 128, 28, 3, 1, 1, 3),
    (128, 256, 28, 3, 2, 1, 1),
    (256, 256, 14, 3, 1, 1, 3),
    (256, 512, 14, 3, 2, 1, 1),
    (512, 512, 7, 3, 1, 1, 3),
    (64, 128, 56, 1, 2, 0, 1),
    (128, 256, 28, 1, 2, 0, 1),
    (256, 512, 14, 1, 2, 0, 1),
]


def _pair(fa, fb, reps):
    """Medians (ms) of ``fa`` and ``fb``, called alternately."""
    fa(), fb()
    a, b = [], []
    for _ in range(reps):
        t = time.process_time()
        fa()
        a.append(time.process_time() - t)
        t = time.process_time()
        fb()
        b.append(time.process_time() - t)
    return statistics.median(a) * 1e3, statistics.median(b) * 1e3


def _layer(x, w, gy, attrs, geo, reps):
    """[numpy, compiled] x [forward, dL/dX, dL/dW] medians (ms) of one layer."""
    from workbench import compiled
    from workbench.autodiff.rules import conv as rc

    def off(f):
        def run():
            with compiled.disabled():
                return f()
        return run

    calls = (lambda: rc.conv_train(x, w, None, **attrs),
             lambda: rc._grads_cpu(None, gy, w, w.shape, x.shape, *geo, True, False),
             lambda: rc._grads_cpu(x, gy, None, w.shape, x.shape, *geo, False, True))
    row = []
    for f in calls:
        row += list(_pair(off(f), f, reps))
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--reps", type=int, default=9)
    ap.add_argument("--threads", default="1", help="engine and BLAS threads (default 1)")
    args = ap.parse_args()

    from workbench import compiled
    from workbench.autodiff.rules import pool as rp
    from workbench.ops.registry import lookup

    print(cpu_description())
    compiled.warmup()
    for name in ("gemm_avx2.iconv", "wgrad_avx2.wgrad", "conv_grad.maxpool_dx"):
        print(f"{name}: {'loaded' if compiled.kernel(name) is not None else 'NOT loaded'}")
    n = args.batch
    rng = np.random.default_rng(0)
    print(f"batch {n}, {args.threads} thread(s), CPU ms, medians of {args.reps} alternated "
          f"calls: numpy (im2col + OpenBLAS) -> compiled where the rules take it")
    print(f"{'layer':26s} {'x':>2s} {'forward':>15s} {'dL/dX':>15s} {'dL/dW':>15s}")
    tot = np.zeros(6)
    for c, m, h, k, s, p, count in LAYERS:
        x = rng.standard_normal((n, c, h, h)).astype(np.float32)
        w = (rng.standard_normal((m, c, k, k)) * 0.05).astype(np.float32)
        attrs = dict(pads=[p] * 4, strides=[s, s])
        oh = (h + 2 * p - k) // s + 1
        gy = rng.standard_normal((n, m, oh, oh)).astype(np.float32)
        geo = ([k, k], [s, s], [1, 1], [p, p], [p, p])

        row = _layer(x, w, gy, attrs, geo, args.reps)
        tot += np.array(row) * count
        name = f"{c}->{m} {h}x{h} {k}x{k}/{s}"
        cells = " ".join(f"{row[i]:6.1f} -> {row[i + 1]:5.1f}" for i in range(0, 6, 2))
        print(f"{name:26s} {count:2d} {cells}")
    cells = " ".join(f"{tot[i]:6.1f} -> {tot[i + 1]:5.1f}" for i in range(0, 6, 2))
    print(f"{'ResNet-18 (x count)':26s} {'':2s} {cells}")
    print(f"all three: {tot[0::2].sum():.1f} -> {tot[1::2].sum():.1f} ms")

    x = rng.standard_normal((n, 64, 112, 112)).astype(np.float32)
    y = lookup("MaxPool", "", 12).fn(x, kernel_shape=[3, 3], strides=[2, 2], pads=[1] * 4)
    y = y[0] if isinstance(y, tuple) else y
    g = rng.standard_normal(y.shape).astype(np.float32)
    geo = ([3, 3], [2, 2], [1, 1], [1, 1])
    a, b = _pair(lambda: rp._max_pool_grad_cpu(x, y, g, *geo),
                 lambda: rp._max_pool_grad_compiled(x, y, g, *geo), args.reps)
    print(f"MaxPool 3x3/2 gradient, (N, 64, 112, 112): {a:.1f} -> {b:.1f} ms")


if __name__ == "__main__":
    main()
