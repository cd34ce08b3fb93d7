"""FusedAttention's C kernel (``compiled/kernels/attention_avx2.c``) against its numpy / OpenBLAS
path, in one process, CPU time (``time.process_time``), one thread, the two interleaved.

Per step: one FusedAttention node with the head split and merge folded, as the optimiser makes
it for a BERT-like encoder (Q/K/V (B, S, H*D), additive (B, 1, 1, S) mask, ``/ scale``) and a
GPT-2-like decoder (Q/K/V slices of one (B, S, 3*H*D) projection, causal bool mask, ``* scale``,
output reshaped to (B, S, H*D)), through a node context (the pre-bound call) and without one
(the numpy path the engine takes without the kernel).

Whole model (``--model file.onnx --inputs file.npz``): ``backend.prepare(model).run`` with the
kernel and with it hidden (``linalg._attention_c`` answering None), alternated run by run.

    python benchmarks/bench_attention.py
    python benchmarks/bench_attention.py --shapes 1x32x4x16 8x32x4x16 1x128x12x64
    python benchmarks/bench_attention.py --model bert.onnx --inputs bert_b1.npz --runs 600

Not part of the test pass/fail; results in benchmarks/README.md.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

os.environ.setdefault("WORKBENCH_NUM_THREADS", "1")
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import numpy as np  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks._cpu import cpu_description  # noqa: E402
from workbench import backend, compiled  # noqa: E402
from workbench.ops import linalg  # noqa: E402
from workbench.ops.registry import NodeContext  # noqa: E402

SPLIT = dict(q_perm=[0, 2, 1, 3], k_perm=[0, 2, 3, 1], v_perm=[0, 2, 1, 3],
             out_perm=[0, 2, 1, 3])


def _case(form, b, s, h, d, rng):
    f = lambda *shape: rng.standard_normal(shape).astype(np.float32)  # noqa: E731
    shp = np.array([b, s, h, d], np.int64)
    if form == "bert":
        kw = dict(SPLIT, scale=float(np.sqrt(d)), scale_op="div", mask="add")
        mask = np.where(rng.random((b, 1, 1, s)) < 0.2, -10000.0, 0.0).astype(np.float32)
        return (f(b, s, h * d), f(b, s, h * d), f(b, s, h * d), mask, shp, shp, shp, None), kw
    kw = dict(SPLIT, scale=float(1 / np.sqrt(d)), scale_op="mul", mask="fill_where_true",
              fill=-3.4028234663852886e38)
    qkv = f(b, s, 3 * h * d)
    q, k, v = (qkv[..., i * h * d:(i + 1) * h * d] for i in range(3))
    causal = ~np.tril(np.ones((s, s), bool))
    return (q, k, v, causal, shp, shp, shp, np.array([b, s, h * d], np.int64)), kw


def per_step(shapes, rounds):
    rng = np.random.default_rng(0)
    print("per step (us, CPU time, median of rounds):")
    print(f"  {'form':5} {'BxSxHxD':>12} {'C kernel':>9} {'numpy':>9} {'ratio':>6}  max|diff|")
    for form in ("bert", "gpt2"):
        for b, s, h, d in shapes:
            args, kw = _case(form, b, s, h, d, rng)
            ctx = NodeContext("attention", "FusedAttention", 1, 1)
            got = linalg.fused_attention(*args, ctx=ctx, **kw)
            ref = linalg.fused_attention(*args, **kw)
            if linalg._ATT_BOUND not in ctx.extra:
                print(f"  {form:5} {b}x{s}x{h}x{d}: the kernel did not take it")
                continue
            n = max(5, int(3e6 / (b * h * s * s * 2 * d + 2e4)))
            res = {"C": [], "numpy": []}
            for r in range(rounds):
                for lab, c in ((("C", ctx), ("numpy", None)) if r % 2 == 0
                               else (("numpy", None), ("C", ctx))):
                    t = time.process_time()
                    for _ in range(n):
                        linalg.fused_attention(*args, ctx=c, **kw)
                    res[lab].append((time.process_time() - t) / n * 1e6)
            c_, n_ = statistics.median(res["C"]), statistics.median(res["numpy"])
            print(f"  {form:5} {f'{b}x{s}x{h}x{d}':>12} {c_:9.1f} {n_:9.1f} {n_ / c_:5.2f}x"
                  f"  {float(np.abs(got - ref).max()):.2g}")


def whole_model(model, inputs, runs):
    real = linalg._attention_c
    rep = backend.prepare(model)
    data = np.load(inputs)
    xs = [data[k] for k in sorted(data.files)]
    for _ in range(5):
        rep.run(xs)
    res = {"C": [], "hidden": []}
    try:
        for i in range(runs):
            for lab in (("C", "hidden") if i % 2 else ("hidden", "C")):
                linalg._attention_c = real if lab == "C" else (lambda *a: None)
                t = time.process_time()
                rep.run(xs)
                res[lab].append(time.process_time() - t)
    finally:
        linalg._attention_c = real
    c, h = statistics.median(res["C"]) * 1e3, statistics.median(res["hidden"]) * 1e3
    print(f"{Path(model).name} + {Path(inputs).name}: kernel {c:.3f} ms, hidden {h:.3f} ms, "
          f"saved {h - c:.3f} ms ({h / c:.2f}x), median of {runs} runs each")


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shapes", nargs="+", default=["1x32x4x16", "8x32x4x16", "1x128x12x64"],
                   help="BxSxHxD per step")
    p.add_argument("--rounds", type=int, default=6)
    p.add_argument("--model", help="an ONNX model with attention blocks (whole-model A/B)")
    p.add_argument("--inputs", help="its inputs, an .npz (arr_0, arr_1, ... in order)")
    p.add_argument("--runs", type=int, default=300, help="whole-model runs of each")
    args = p.parse_args()
    print(f"CPU: {cpu_description()}; threads: WORKBENCH_NUM_THREADS="
          f"{os.environ['WORKBENCH_NUM_THREADS']}, OPENBLAS_NUM_THREADS="
          f"{os.environ['OPENBLAS_NUM_THREADS']}; load {os.getloadavg()[0]:.1f}")
    if not compiled.wait(["attention_avx2", "transformer", "gemm_avx2"], timeout=600) \
            or compiled.kernel("attention_avx2.attention") is None:
        sys.exit(f"attention_avx2 is not available: {compiled.status()['modules']}")
    if args.model:
        whole_model(args.model, args.inputs, args.runs)
    else:
        per_step([tuple(int(v) for v in s.split("x")) for s in args.shapes], args.rounds)


if __name__ == "__main__":
    main()
