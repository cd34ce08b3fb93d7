"""Convolutional nets in CPU time at one thread, in one process: our NCHW path ("before"),
the channels-last path on numpy and with the compiled kernels ("after"), onnxruntime.

For a shared machine (several engineers on 2 cores): wall-clock ratios between fresh
processes are noise there, but the CPU time one thread spends (``time.process_time``; BLAS,
the engine's pool and onnxruntime all at one thread) moves much less with the load. The
fresh-process wall-clock tables are ``bench_inference.py``'s (the lead runs them on a quiet
machine).

    python benchmarks/bench_conv_cpu.py                    # depthwise layers + whole models
    python benchmarks/bench_conv_cpu.py --layers-only --batches 1
    python benchmarks/bench_conv_cpu.py --models mobilenetv2 --batches 1 8 --reps 20

Part 1: MobileNetV2's 17 depthwise 3x3 layers (+ bias + ReLU6), summed: our NCHW FusedConv,
NhwcConv on numpy, NhwcConv compiled, onnxruntime's Conv+Clip (a one-node model each,
NCHW in and out as it is in a model). Part 2: whole models (``tests/helpers/torch_models``,
exported with torch.onnx, 224x224): ``prepare(layout=None)`` on numpy, the default prepare
(channels-last where it pays) on numpy and compiled, onnxruntime. Each time is the median of
``--reps`` runs after warm-up runs; the cold compile of the kernels is reported separately.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks._cpu import (  # noqa: E402
    cpu_description,
    one_thread,
    ort_session,
    prepare_compiled,
    torch_export_case,
)

one_thread()   # before numpy (BLAS) is imported

import argparse  # noqa: E402
import statistics  # noqa: E402
import time  # noqa: E402

import numpy as np  # noqa: E402


def mobilenetv2_depthwise():
    """(channels, input size, stride) of MobileNetV2's 17 depthwise layers at 224x224."""
    layers, c_in, h = [(32, 112, 1)], 16, 112
    for t, c, n, s in ((6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 4, 2), (6, 96, 3, 1),
                       (6, 160, 3, 2), (6, 320, 1, 1)):
        for i in range(n):
            stride = s if i == 0 else 1
            layers.append((c_in * t, h, stride))
            h = -(-h // stride)
            c_in = c
    return layers


def cpu_ms(reps: int, warmup: int, fn, *args, **kwargs) -> float:
    """The median CPU time (ms) of ``fn(*args, **kwargs)`` after ``warmup`` calls."""
    for _ in range(warmup):
        fn(*args, **kwargs)
    times = []
    for _ in range(reps):
        c0 = time.process_time()
        fn(*args, **kwargs)
        times.append((time.process_time() - c0) * 1e3)
    return statistics.median(times)




def layers_table(batches, reps) -> None:
    from onnx import TensorProto, helper, numpy_helper

    from workbench import compiled
    from workbench.ops.registry import FUSED_DOMAIN, lookup

    fused = lookup("FusedConv", FUSED_DOMAIN, 1).fn
    nhwc = lookup("NhwcConv", FUSED_DOMAIN, 1).fn
    rng = np.random.default_rng(0)
    layers = mobilenetv2_depthwise()
    print(f"\nMobileNetV2's {len(layers)} depthwise 3x3 layers + bias + ReLU6, summed "
          f"(CPU ms at one thread, median of {reps}):")
    print(f"{'batch':>5s} {'ours NCHW':>10s} {'NHWC numpy':>11s} {'NHWC compiled':>14s} "
          f"{'onnxruntime':>12s} {'compiled/ort':>13s} {'NCHW/compiled':>14s}")
    for n in batches:
        tot = dict.fromkeys(("nchw", "np", "cc", "ort"), 0.0)
        for c, h, s in layers:
            x = rng.standard_normal((n, c, h, h)).astype(np.float32)
            w = (rng.standard_normal((c, 1, 3, 3)) * 0.3).astype(np.float32)
            b = rng.standard_normal(c).astype(np.float32)
            xh = np.ascontiguousarray(x.transpose(0, 2, 3, 1))
            wh = np.ascontiguousarray(w.transpose(2, 3, 1, 0))
            kw = dict(group=c, pads=[1, 1, 1, 1], strides=[s, s], activation="Clip",
                      activation_params=[0.0, 6.0])
            tot["nchw"] += cpu_ms(reps, 2, fused, x, w, b, None, **kw)
            with compiled.disabled():
                tot["np"] += cpu_ms(reps, 2, nhwc, xh, wh, b, None, **kw)
            tot["cc"] += cpu_ms(reps, 2, nhwc, xh, wh, b, None, **kw)
            node = helper.make_node("Conv", ["x", "w", "b"], ["c"], group=c,
                                    pads=[1, 1, 1, 1], strides=[s, s])
            clip = helper.make_node("Clip", ["c", "lo", "hi"], ["y"])
            g = helper.make_graph(
                [node, clip], "dw",
                [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(x.shape))],
                [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                [numpy_helper.from_array(w, "w"), numpy_helper.from_array(b, "b"),
                 numpy_helper.from_array(np.float32(0), "lo"),
                 numpy_helper.from_array(np.float32(6), "hi")])
            m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
            m.ir_version = 8
            sess = ort_session(m.SerializeToString())
            tot["ort"] += cpu_ms(reps, 2, sess.run, None, {"x": x})
        print(f"{n:5d} {tot['nchw']:10.1f} {tot['np']:11.1f} {tot['cc']:14.1f} "
              f"{tot['ort']:12.1f} {tot['cc'] / tot['ort']:12.2f}x "
              f"{tot['nchw'] / tot['cc']:13.1f}x", flush=True)


def models_table(models, batches, reps) -> None:
    from workbench import backend, compiled

    print(f"\nwhole models, 224x224 (CPU ms per run at one thread, median of {reps}):")
    print(f"{'model':13s} {'batch':>5s} {'before':>9s} {'layout np':>10s} {'after':>9s} "
          f"{'ort':>9s} {'before/ort':>11s} {'after/ort':>10s} {'max err':>8s}")
    for name in models:
        for n in batches:
            proto, xs, sess, ref = torch_export_case(name, n)
            feeds = dict(zip([i.name for i in sess.get_inputs()], xs))
            before_rep = backend.prepare(proto, layout=None)
            after_rep = backend.prepare(proto)
            with compiled.disabled():
                before = cpu_ms(reps, 1, before_rep.run, xs)
                lay_np = cpu_ms(reps, 1, after_rep.run, xs)
            after = cpu_ms(reps, 1, after_rep.run, xs)
            got = np.asarray(after_rep.run(xs)[0])
            err = float(np.abs(got - ref).max() / max(1.0, np.abs(ref).max()))
            ort_ms = cpu_ms(reps, 1, sess.run, None, feeds)
            print(f"{name:13s} {n:5d} {before:9.1f} {lay_np:10.1f} {after:9.1f} "
                  f"{ort_ms:9.1f} {before / ort_ms:10.2f}x {after / ort_ms:9.2f}x "
                  f"{err:8.1e}", flush=True)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--batches", nargs="+", type=int, default=[1, 8])
    p.add_argument("--models", nargs="+", default=["mobilenetv2", "shufflenetv2", "resnet18"])
    p.add_argument("--reps", type=int, default=10)
    p.add_argument("--layers-only", action="store_true")
    p.add_argument("--models-only", action="store_true")
    a = p.parse_args(argv)
    print(f"CPU: {cpu_description()}")
    if hasattr(os, "getloadavg"):
        print(f"load average {os.getloadavg()[0]:.2f} (CPU times, one thread: steadier than "
              f"wall clock on a shared machine)")
    line, _env = prepare_compiled(True)
    print(line)
    if not a.models_only:
        layers_table(a.batches, a.reps)
    if not a.layers_only:
        models_table(a.models, a.batches, a.reps)
    return 0


if __name__ == "__main__":
    sys.exit(main())
