"""MobileNetV2's (or ShuffleNetV2's) depthwise 3x3 convolutions on the channels-last path,
one thread, CPU time: the C kernel ``dwconv_avx2.dw3x3`` against the numba kernel
``conv_nhwc.dw_k3s{1,2}`` and the numpy path, in one process, interleaved per layer.

    python benchmarks/bench_dwconv.py                      # both nets, batches 1 and 8
    python benchmarks/bench_dwconv.py --nets mobilenetv2 --batches 8 --reps 20

Per layer (input H=W, channels, stride, how many such layers): ms of the kernel call alone
for the C and the numba kernel (weights already in their layouts, the same epilogue: bias +
ReLU6 for MobileNetV2, bias for ShuffleNetV2), then the sums over the network (MobileNetV2:
17 layers, ShuffleNetV2: 19). Medians of ``--reps`` (``time.process_time``), best of two
interleaved rounds. Also the whole NhwcConv node on a tiny layer ([1, 7, 7, C]): what a step
costs beyond its kernel (``--overhead``).

``--models``: whole models (``tests/helpers/torch_models``, 224x224) in one process, one plan
each: "after" as it is, "before" with ``dwconv_avx2`` and ``gemm_avx2.gemm_block`` hidden (the
depthwise layers on the numba kernel, no pre-bound calls: the engine before this module),
onnxruntime at one thread; blocks of ``--reps`` runs (two warm-up runs each, so the node
contexts settle) taking turns for ``--rounds`` rounds; medians.
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

from benchmarks._cpu import cpu_description  # noqa: E402

#: (input H = W, channels, stride, how many) of the depthwise layers at 224x224
NETS = {
    "mobilenetv2": [(112, 32, 1, 1), (112, 96, 2, 1), (56, 144, 1, 1), (56, 144, 2, 1),
                    (28, 192, 1, 2), (28, 192, 2, 1), (14, 384, 1, 4), (14, 576, 1, 2),
                    (14, 576, 2, 1), (7, 960, 1, 3)],
    "shufflenetv2": [(56, 24, 2, 1), (56, 58, 2, 1), (28, 58, 1, 3), (28, 116, 2, 2),
                     (14, 116, 1, 7), (14, 232, 2, 2), (7, 232, 1, 3)],
}
CLIPS = {"mobilenetv2": (0.0, 6.0), "shufflenetv2": (-np.inf, np.inf)}


def cpu_ms(fn, reps):
    fn()
    ts = []
    for _ in range(reps):
        t = time.process_time()
        fn()
        ts.append(time.process_time() - t)
    return statistics.median(ts) * 1e3


def layer(net, batch, h, c, s, reps, rng):
    from workbench import compiled
    from workbench.ops import conv_nhwc

    kc = compiled.kernel("dwconv_avx2.dw3x3")
    kn = compiled.kernel(f"conv_nhwc.dw_k3s{s}")
    lo, hi = CLIPS[net]
    x = rng.standard_normal((batch, h, h, c)).astype(np.float32)
    w = rng.standard_normal((3, 3, 1, c)).astype(np.float32)
    b = rng.standard_normal(c).astype(np.float32)
    o = (h + 2 - 3) // s + 1
    y = np.empty((batch, o, o, c), np.float32)
    wp, bp = conv_nhwc.pack_depthwise(w, b)
    blk = conv_nhwc.dw_block(x, wp, bp, None, y, [s, s], [1, 1], (o, o), 0, batch * o, lo, hi)
    w3 = np.ascontiguousarray(w.reshape(3, 3, c))
    rows = batch * o
    reps = max(5, min(reps * 5, int(reps * 3e6 / (rows * o * c * 9))))

    def c_kernel():
        kc(blk)

    def numba_kernel():
        kn(x, w3, b, conv_nhwc._ONE, y, batch, h, h, c, o, o, 1, 1, 0, 0, rows, lo, hi)
    t = {}
    for _ in range(2):
        for name, fn in (("c", c_kernel), ("numba", numba_kernel)):
            v = cpu_ms(fn, reps)
            t[name] = min(t.get(name, v), v)
    return t


def overhead(reps):
    """µs per NhwcConv call beyond its kernel, on [1, 7, 7, C] depthwise and 1x1 layers: the
    node (its context kept, as a plan's) against the bare ctypes call of its kernel with the
    pointers ready."""
    from workbench import compiled
    from workbench.ops import conv_nhwc
    from workbench.ops.registry import FUSED_DOMAIN, NodeContext, lookup

    conv = lookup("NhwcConv", FUSED_DOMAIN, 1).fn
    rng = np.random.default_rng(0)
    c, m = 160, 160
    x = rng.standard_normal((1, 7, 7, c)).astype(np.float32)
    out = {}
    wd = rng.standard_normal((3, 3, 1, c)).astype(np.float32)
    bd = rng.standard_normal(c).astype(np.float32)
    w1 = rng.standard_normal((1, 1, c, m)).astype(np.float32)
    b1 = rng.standard_normal(m).astype(np.float32)
    kc = compiled.kernel("dwconv_avx2.dw3x3")
    dp = compiled.data_pointer
    for name, w, b, kw in (("depthwise 3x3", wd, bd, {"group": c, "pads": [1, 1, 1, 1]}),
                           ("1x1", w1, b1, {})):
        ctx = NodeContext("n", "NhwcConv", 1, 1)
        y = np.empty((1, 7, 7, w.shape[-1]), np.float32)
        if name == "1x1":   # the bare call: the kernel's one-argument form, block ready
            kb = compiled.kernel("gemm_avx2.gemm_block")
            wp, bp = conv_nhwc.pack_panels(w.reshape(c, m), b)
            blk = conv_nhwc.call_block([dp(a) for a in (x, wp, bp, x, y)], [c, m, 0, 49, 0],
                                       0.0, 6.0)
            addr, raw = dp(blk), kb.raw
        else:
            wp, bp = conv_nhwc.pack_depthwise(w, b)
            blk = conv_nhwc.dw_block(x, wp, bp, None, y, [1, 1], [1, 1], (7, 7), 0, 7, 0.0, 6.0)
            addr, raw = dp(blk), kc.raw

        def bare(raw=raw, addr=addr):
            raw(addr)

        def node(w=w, b=b, ctx=ctx, kw=kw):
            conv(x, w, b, None, activation="Clip", activation_params=[0.0, 6.0], ctx=ctx,
                 **kw)
        n = 2000
        best = {}
        for _ in range(reps):
            for key, fn in (("node", node), ("bare", bare)):
                fn()
                t = time.process_time()
                for _ in range(n):
                    fn()
                v = (time.process_time() - t) / n * 1e6
                best[key] = min(best.get(key, v), v)
        out[name] = best
    return out


def models_table(models, batches, reps, rounds) -> None:
    from benchmarks._cpu import torch_export_case
    from workbench import backend, compiled
    from workbench.ops import conv_nhwc

    real_kernel, real_key = compiled.kernel, conv_nhwc._BOUND

    def hidden(name):
        return None if name.startswith("dwconv_avx2.") or name == "gemm_avx2.gemm_block" \
            else real_kernel(name)

    def before(rep, xs):
        conv_nhwc.compiled.kernel, conv_nhwc._BOUND = hidden, "nhwc_bound_hidden"
        try:
            rep.run(xs)
        finally:
            conv_nhwc.compiled.kernel, conv_nhwc._BOUND = real_kernel, real_key

    print(f"\nwhole models, 224x224, CPU ms per run at one thread (median of {rounds * reps} "
          f"runs each, blocks of {reps} taking turns):")
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
            fns = {"b": (before, rep, xs), "a": (lambda r, v: r.run(v), rep, xs),
                   "o": (sess.run, None, feeds)}
            for _ in range(rounds):
                for key, (fn, *args) in fns.items():
                    fn(*args)
                    fn(*args)
                    for _ in range(reps):
                        c0 = time.process_time()
                        fn(*args)
                        t[key].append((time.process_time() - c0) * 1e3)
            b, a_, o = (statistics.median(t[k]) for k in "bao")
            print(f"{name:13s} {n:5d} {b:8.1f} {a_:8.1f} {o:8.1f} {a_ / b:11.2f}x "
                  f"{b / o:9.2f}x {a_ / o:8.2f}x {err:8.1e}", flush=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--nets", nargs="+", default=list(NETS), choices=list(NETS))
    ap.add_argument("--batches", nargs="+", type=int, default=[1, 8])
    ap.add_argument("--reps", type=int, default=15)
    ap.add_argument("--overhead", action="store_true", help="only the per-call overhead")
    ap.add_argument("--models", nargs="+", help="whole models, before/after (see above)")
    ap.add_argument("--rounds", type=int, default=3, help="rounds of blocks (--models)")
    a = ap.parse_args()
    from workbench import compiled

    if not compiled.wait(["dwconv_avx2", "conv_nhwc", "gemm_avx2"], timeout=600):
        print("kernels not available:", compiled.status()["modules"])
        return 1
    print(cpu_description())
    for name, t in overhead(5).items():
        print(f"NhwcConv [1,7,7,160] {name}: node {t['node']:.1f} µs, kernel alone "
              f"{t['bare']:.1f} µs, outside the kernel {t['node'] - t['bare']:.1f} µs")
    if a.overhead:
        return 0
    if a.models:
        models_table(a.models, a.batches, a.reps, a.rounds)
        return 0
    rng = np.random.default_rng(0)
    for net in a.nets:
        for batch in a.batches:
            print(f"\n{net} b{batch}: H C stride xN | C kernel ms | numba ms | numba/C")
            tot = {"c": 0.0, "numba": 0.0}
            for h, c, s, n in NETS[net]:
                t = layer(net, batch, h, c, s, a.reps, rng)
                for k in tot:
                    tot[k] += n * t[k]
                print(f"  {h:4d} {c:4d} s{s} x{n} | {t['c']:7.3f} | {t['numba']:7.3f} | "
                      f"{t['numba'] / t['c']:.2f}")
            print(f"  total ({sum(n for *_, n in NETS[net])} layers) | {tot['c']:.2f} | "
                  f"{tot['numba']:.2f} | {tot['numba'] / tot['c']:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
