"""MobileNetV2's (or ShuffleNetV2's) 1x1 convolutions on the channels-last path, one
thread, CPU time: the compiled C kernel ``gemm_avx2.gemm`` (weights packed once, epilogue
fused) against the path it replaces (OpenBLAS sgemm through numpy + the compiled one-pass
epilogue), in one process, the two interleaved per layer.

    python benchmarks/bench_gemm_1x1.py                 # batches 1 and 8
    python benchmarks/bench_gemm_1x1.py --batches 1 --reps 30
    python benchmarks/bench_gemm_1x1.py --net shufflenetv2
    python benchmarks/bench_gemm_1x1.py --models mobilenetv2 shufflenetv2 --rounds 5

Per layer: GFLOP/s of the GEMM alone (ours vs ``np.matmul``) and of the whole NhwcConv node
(product + bias + ReLU6 / residual: what a model run pays), then the sum over the network's
1x1 layers (MobileNetV2: 34). Times are medians of ``--reps`` after warm-up (``time.process_time``).

``--models``: whole models (``tests/helpers/torch_models``, 224x224) in one process, one
plan each: with ``gemm_avx2`` ("after"), the same plan with only ``gemm_avx2`` hidden
("before": every other compiled kernel stays), onnxruntime at one thread, taking turns run
by run (``--rounds`` x ``--reps`` runs each; medians).
"""

from __future__ import annotations

import os

for _v in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS",
           "WORKBENCH_NUM_THREADS"):
    os.environ[_v] = "1"

import argparse  # noqa: E402
import statistics  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks._cpu import cpu_description, torch_export_case  # noqa: E402


def mobilenetv2_pointwise():
    """(H=W, C in, C out, epilogue, how many) of MobileNetV2's 1x1 layers at 224x224;
    epilogue "relu6" (expansions and the last layer), "bias" (projections), "res"
    (projections with a residual add)."""
    layers = [(112, 32, 16, "bias", 1)]
    c_in, h = 16, 112
    for t, c, n, s in ((6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 4, 2), (6, 96, 3, 1),
                       (6, 160, 3, 2), (6, 320, 1, 1)):
        for i in range(n):
            stride = s if i == 0 else 1
            layers.append((h, c_in, c_in * t, "relu6", 1))
            h = -(-h // stride)
            layers.append((h, c_in * t, c, "res" if i else "bias", 1))
            c_in = c
    layers.append((7, 320, 1280, "relu6", 1))
    merged = {}
    for h, k, m, e, n in layers:
        merged[(h, k, m, e)] = merged.get((h, k, m, e), 0) + n
    return [(*key, n) for key, n in merged.items()]


def shufflenetv2_pointwise():
    """The same for ShuffleNetV2 x1.0 (branch channels 58, 116, 232; every 1x1 + ReLU)."""
    layers = [(56, 24, 58, "relu", 1)]          # stage 2, first unit, branch 2's first 1x1
    layers += [(28, 58, 58, "relu", 1), (28, 24, 58, "relu", 1), (28, 58, 58, "relu", 6)]
    layers += [(28, 116, 116, "relu", 1), (14, 116, 116, "relu", 2 + 14)]
    layers += [(14, 232, 232, "relu", 1), (7, 232, 232, "relu", 2 + 6)]
    layers.append((7, 464, 1024, "relu", 1))
    return layers


NETS = {"mobilenetv2": mobilenetv2_pointwise, "shufflenetv2": shufflenetv2_pointwise}


def cpu_ms(fn, reps):
    fn()
    fn()
    ts = []
    for _ in range(reps):
        t = time.process_time()
        fn()
        ts.append(time.process_time() - t)
    return statistics.median(ts) * 1e3


def layer_times(k, conv, x, w, b, z, act, params, reps):
    """{"og"/"bg": our/BLAS GEMM ms, "on"/"bn": the node ms with/without gemm_avx2}."""
    from workbench import compiled
    from workbench.ops import conv_nhwc
    from workbench.ops.registry import NodeContext

    real_kernel = compiled.kernel

    def without_gemm(name):
        return None if name.startswith("gemm_avx2.") else real_kernel(name)

    batch, h, _, kk = x.shape
    m = w.shape[-1]
    rows = batch * h * h
    ctx = NodeContext("n", "NhwcConv", 1, 1)
    a2, w2 = x.reshape(rows, kk), w.reshape(kk, m)
    wp, bp = conv_nhwc.pack_panels(w2, b)
    y2 = np.empty((rows, m), np.float32)
    reps = max(3, min(reps * 4, int(reps * 2e7 / (2 * rows * kk * m))))

    def ours_gemm():
        k(a2, wp, bp, a2, y2, kk, m, 0, rows, 0, -np.inf, np.inf)

    def blas_gemm():
        np.matmul(a2, w2, out=y2)

    def ours_node():
        conv(x, w, b, z, activation=act, activation_params=params, ctx=ctx)

    def before_node():
        conv_nhwc.compiled.kernel = without_gemm
        try:
            conv(x, w, b, z, activation=act, activation_params=params)
        finally:
            conv_nhwc.compiled.kernel = real_kernel
    t = {}
    for _ in range(2):   # interleaved
        for name, fn in (("og", ours_gemm), ("bg", blas_gemm), ("on", ours_node),
                         ("bn", before_node)):
            v = cpu_ms(fn, reps)
            t[name] = min(t.get(name, v), v)
    return t


def _plain_run(rep, xs):
    return rep.run(xs)


def models_table(models, batches, reps, rounds) -> None:
    from workbench import backend, compiled
    from workbench.ops import conv_nhwc

    real_kernel = compiled.kernel

    def without_gemm(name):
        return None if name.startswith("gemm_avx2.") else real_kernel(name)

    def before(rep, xs):
        conv_nhwc.compiled.kernel = without_gemm
        try:
            rep.run(xs)
        finally:
            conv_nhwc.compiled.kernel = real_kernel

    print(f"\nwhole models, 224x224, CPU ms per run at one thread (median of {rounds * reps} "
          f"runs each, the three taking turns run by run):")
    print(f"{'model':13s} {'batch':>5s} {'before':>8s} {'after':>8s} {'ort':>8s} "
          f"{'after/before':>12s} {'before/ort':>10s} {'after/ort':>9s} {'max err':>8s}")
    for name in models:
        for n in batches:
            proto, xs, sess, ref = torch_export_case(name, n)
            feeds = dict(zip([i.name for i in sess.get_inputs()], xs))
            rep = backend.prepare(proto)
            got = np.asarray(rep.run(xs)[0])
            err = float(np.abs(got - ref).max() / max(1.0, np.abs(ref).max()))
            t = {"b": [], "a": [], "o": []}
            fns = {"b": (before, rep, xs), "a": (_plain_run, rep, xs),
                   "o": (sess.run, None, feeds)}
            for fn, *args in fns.values():
                fn(*args)
                fn(*args)
            for _ in range(rounds * reps):   # one run of each in turn: load drift is shared
                for key, (fn, *args) in fns.items():
                    c0 = time.process_time()
                    fn(*args)
                    t[key].append((time.process_time() - c0) * 1e3)
            b, a_, o = (statistics.median(t[k]) for k in "bao")
            print(f"{name:13s} {n:5d} {b:8.1f} {a_:8.1f} {o:8.1f} {a_ / b:11.2f}x "
                  f"{b / o:9.2f}x {a_ / o:8.2f}x {err:8.1e}", flush=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 8])
    ap.add_argument("--reps", type=int, default=15)
    ap.add_argument("--net", choices=sorted(NETS), default="mobilenetv2")
    ap.add_argument("--models", nargs="+", help="whole models instead of layers")
    ap.add_argument("--rounds", type=int, default=3, help="interleaved rounds (--models)")
    a = ap.parse_args()

    from workbench import compiled
    from workbench.ops.registry import FUSED_DOMAIN, lookup

    if not compiled.wait(["gemm_avx2", "conv_nhwc"], timeout=600):
        print(f"kernels not available: {compiled.status()['modules']}")
        return 1
    k = compiled.kernel("gemm_avx2.gemm")
    conv = lookup("NhwcConv", FUSED_DOMAIN, 1).fn
    print(cpu_description())
    print("one thread, CPU time (time.process_time), medians of", a.reps)
    if a.models:
        models_table(a.models, a.batches, a.reps, a.rounds)
        return 0
    rng = np.random.default_rng(0)
    for batch in a.batches:
        print(f"\nbatch {batch}")
        print(f"{'rows x K x M':>20} {'epilogue':>8} {'n':>2} | GEMM GFLOP/s ours  BLAS | "
              f"node ms ours   before | speed-up")
        tot_o = tot_b = 0.0
        for h, kk, m, epi, n in NETS[a.net]():
            rows = batch * h * h
            x = rng.standard_normal((batch, h, h, kk)).astype(np.float32)
            w = (rng.standard_normal((1, 1, kk, m)) * 0.1).astype(np.float32)
            b = rng.standard_normal(m).astype(np.float32)
            z = rng.standard_normal((batch, h, h, m)).astype(np.float32) \
                if epi == "res" else None
            act, params = {"relu6": ("Clip", [0.0, 6.0]), "relu": ("Relu", [])}.get(
                epi, ("", []))
            t = layer_times(k, conv, x, w, b, z, act, params, a.reps)
            fl = 2 * rows * kk * m / 1e6
            tot_o += n * t["on"]
            tot_b += n * t["bn"]
            print(f"{rows:>8} x{kk:>4} x{m:>5} {epi:>8} {n:>2} | {fl / max(t['og'], 1e-6):>10.1f}"
                  f" {fl / max(t['bg'], 1e-6):>5.1f} | {t['on']:>12.3f} {t['bn']:>8.3f} | "
                  f"{t['bn'] / max(t['on'], 1e-9):>6.2f}x")
        label = f"all {sum(v[-1] for v in NETS[a.net]())} layers"
        print(f"{label:>31} | {'':>16} | {tot_o:>12.2f} {tot_b:>8.2f} | "
              f"{tot_b / tot_o:>6.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
