"""Group-1 KxK (and strided 1x1) convolutions, one thread, CPU time: the compiled indirect
GEMM ``gemm_avx2.iconv`` on the channels-last path (``NhwcConv`` with its weights packed
and its indirection table kept in the node's context) against the numpy channels-last path
it replaces (im2col per block + OpenBLAS sgemm) and against today's NCHW path
(``FusedConv``: im2col + OpenBLAS), interleaved per layer in one process.

    python benchmarks/bench_conv_kxk.py                 # batches 1 and 8
    python benchmarks/bench_conv_kxk.py --batches 1 --reps 20
    python benchmarks/bench_conv_kxk.py --net stems

Layers: ResNet-18's convolutions at 224x224 (``--net resnet18``: the 7x7 stem, the 3x3s,
the strided 1x1 downsamples, each with its epilogue: ReLU, or a residual add + ReLU) or the
3-channel 3x3 stride-2 stems of MobileNetV2 and ShuffleNetV2 (``--net stems``). Per layer:
GFLOP/s of the node for each path (medians of ``--reps`` after warm-up), then the sums.
Whole models against onnxruntime: ``benchmarks/bench_inference.py``.
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


def resnet18_layers():
    """(H in, C, M, k, stride, pad, epilogue, how many) of ResNet-18's convolutions at
    224x224; epilogue "relu" or "res" (residual add + ReLU)."""
    layers = [(224, 3, 64, 7, 2, 3, "relu", 1)]
    h, c = 56, 64
    for m, first_stride in ((64, 1), (128, 2), (256, 2), (512, 2)):
        if first_stride == 2:
            layers.append((h, c, m, 3, 2, 1, "relu", 1))
            layers.append((h, c, m, 1, 2, 0, "", 1))     # the downsample
            h //= 2
            layers.append((h, m, m, 3, 1, 1, "res", 1))
            layers.append((h, m, m, 3, 1, 1, "relu", 1))
            layers.append((h, m, m, 3, 1, 1, "res", 1))
        else:
            layers.append((h, c, m, 3, 1, 1, "relu", 2))
            layers.append((h, c, m, 3, 1, 1, "res", 2))
        c = m
    return layers


def stems():
    """MobileNetV2's (ReLU6) and ShuffleNetV2's (ReLU) stems."""
    return [(224, 3, 32, 3, 2, 1, "relu6", 1), (224, 3, 24, 3, 2, 1, "relu", 1)]


NETS = {"resnet18": resnet18_layers, "stems": stems}


def cpu_ms(fn, reps):
    fn()
    fn()
    ts = []
    for _ in range(reps):
        t = time.process_time()
        fn()
        ts.append(time.process_time() - t)
    return statistics.median(ts) * 1e3


def layer_times(nhwc, nchw, args_nhwc, args_nchw, attrs, flops, reps):
    """{"i": iconv, "h": numpy channels-last, "c": NCHW} ms for one layer (interleaved,
    best of two medians), after checking that the paths agree."""
    from workbench import compiled
    from workbench.ops import conv_nhwc
    from workbench.ops.registry import NodeContext

    real_kernel = compiled.kernel

    def without_iconv(name):
        return None if name == "gemm_avx2.iconv" else real_kernel(name)
    ctx = NodeContext("n", "NhwcConv", 1, 1)

    def ours():
        return nhwc(*args_nhwc, ctx=ctx, **attrs)

    def numpy_nhwc():
        conv_nhwc.compiled.kernel = without_iconv
        try:
            nhwc(*args_nhwc, **attrs)
        finally:
            conv_nhwc.compiled.kernel = real_kernel

    def ncwh():
        return nchw(*args_nchw, **attrs)
    want = ncwh().transpose(0, 2, 3, 1)
    err = float(np.abs(ours() - want).max() / max(1.0, np.abs(want).max()))
    assert err < 1e-4, err
    reps = max(3, min(reps * 3, int(reps * 300 / flops)))
    t = {}
    for _ in range(2):
        for key, fn in (("i", ours), ("h", numpy_nhwc), ("c", ncwh)):
            v = cpu_ms(fn, reps)
            t[key] = min(t.get(key, v), v)
    return t


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 8])
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--net", choices=sorted(NETS), default="resnet18")
    a = ap.parse_args()

    from workbench import compiled
    from workbench.ops.registry import FUSED_DOMAIN, lookup

    if not compiled.wait(["gemm_avx2", "conv_nhwc"], timeout=600):
        print(f"kernels not available: {compiled.status()['modules']}")
        return 1
    nhwc = lookup("NhwcConv", FUSED_DOMAIN, 1).fn
    nchw = lookup("FusedConv", FUSED_DOMAIN, 1).fn
    print(cpu_description())
    print(f"one thread, CPU time (time.process_time), medians of {a.reps}; GFLOP/s of the "
          f"whole node (product + epilogue)")
    rng = np.random.default_rng(0)
    for batch in a.batches:
        print(f"\nbatch {batch}")
        print(f"{'H  C -> M  kxk/s':>22} {'epi':>5} {'n':>2} | GFLOP/s iconv  numpy-NHWC "
              f"NCHW | ms iconv  NCHW | NCHW/iconv")
        tot = {"i": 0.0, "h": 0.0, "c": 0.0}
        for h, c, m, k, s, p, epi, n in NETS[a.net]():
            oh = (h + 2 * p - k) // s + 1
            x = rng.standard_normal((batch, h, h, c)).astype(np.float32)
            xc = np.ascontiguousarray(x.transpose(0, 3, 1, 2))
            w = (rng.standard_normal((k, k, c, m)) * 0.1).astype(np.float32)
            wc = np.ascontiguousarray(w.transpose(3, 2, 0, 1))
            b = rng.standard_normal(m).astype(np.float32)
            z = rng.standard_normal((batch, oh, oh, m)).astype(np.float32) \
                if epi == "res" else None
            zc = None if z is None else np.ascontiguousarray(z.transpose(0, 3, 1, 2))
            act, params = {"relu6": ("Clip", [0.0, 6.0]), "relu": ("Relu", []),
                           "res": ("Relu", [])}.get(epi, ("", []))
            attrs = dict(activation=act, activation_params=params, strides=[s, s],
                         pads=[p] * 4, kernel_shape=[k, k])
            flops = 2 * batch * oh * oh * k * k * c * m / 1e6
            t = layer_times(nhwc, nchw, (x, w, b, z), (xc, wc, b, zc), attrs, flops,
                            a.reps)
            for key in tot:
                tot[key] += n * t[key]
            label = f"{h:>3} {c:>3} -> {m:>3} {k}x{k}/{s}"
            print(f"{label:>22} {epi:>5} {n:>2} | {flops / t['i']:>13.1f} "
                  f"{flops / t['h']:>11.1f} {flops / t['c']:>4.1f} | {t['i']:>8.2f} "
                  f"{t['c']:>5.2f} | {t['c'] / t['i']:>9.2f}x")
        print(f"{'sum (ms): iconv, numpy-NHWC, NCHW':>35} | {tot['i']:.2f}  {tot['h']:.2f}  "
              f"{tot['c']:.2f} | NCHW/iconv {tot['c'] / tot['i']:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
