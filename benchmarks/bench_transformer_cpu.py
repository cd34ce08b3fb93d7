"""The BERT-like and GPT-2-like models in CPU time at one thread, in one process: ours with the
compiled transformer kernels, ours on numpy (the same plan with ``compiled.disabled()``: the
"before"), onnxruntime (all graph optimisations, ``intra_op_num_threads=1``).

For a shared machine: wall-clock ratios between fresh processes are noise there, while the CPU
time one thread spends (``time.process_time``; BLAS, the engine's pool and onnxruntime all at
one thread) moves much less with the load. Each rep runs the three engines one after the other
(so load drift hits all three) and the table gives the medians. ``--profile`` adds our per-op-
type CPU time (the executor's per-node hook, so the plain schedule: shape steps included).
The fresh-process wall-clock tables are ``bench_inference.py``'s.

    python benchmarks/bench_transformer_cpu.py                      # bert gpt2, batch 1 and 8
    python benchmarks/bench_transformer_cpu.py --models bert --batches 8 --reps 200 --profile
    python benchmarks/bench_transformer_cpu.py --models bert_ortopt   # com.microsoft op form
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks._cpu import cpu_description, one_thread, ort_session  # noqa: E402

one_thread()   # before numpy (BLAS) is imported

import argparse  # noqa: E402
import collections  # noqa: E402
import statistics  # noqa: E402
import time  # noqa: E402

import numpy as np  # noqa: E402

SEQ = 32


def _cpu(fn):
    c0 = time.process_time()
    fn()
    return (time.process_time() - c0) * 1e3


def profile(plan, inputs, reps):
    """Median CPU ms per op type (the executor's per-node hook)."""
    per = collections.defaultdict(list)
    last = [0.0]

    def hook(node, outs):
        t = time.process_time()
        per[(node.domain or "", node.op_type, node.name)].append((t - last[0]) * 1e3)
        last[0] = time.process_time()

    for _ in range(reps):
        last[0] = time.process_time()
        plan.run(inputs, hook=hook)
    by_type = collections.defaultdict(lambda: [0.0, 0])
    for (_dom, op, _), v in per.items():
        by_type[op][0] += statistics.median(v)
        by_type[op][1] += 1
    return sorted(by_type.items(), key=lambda kv: -kv[1][0])


def _model(torch_models, name):
    """The ONNX model ``name`` (see ``--models``)."""
    import onnx

    model, example = torch_models.build(name.split("_")[0])
    proto = torch_models.export_onnx(model, example, None, opset=17)
    if name != "bert_ortopt":
        return proto
    import tempfile

    from onnxruntime.transformers import optimizer

    with tempfile.TemporaryDirectory() as tmp:
        src, dst = Path(tmp) / "bert.onnx", Path(tmp) / "bert_opt.onnx"
        onnx.save(proto, str(src))
        opt = optimizer.optimize_model(str(src), model_type="bert", num_heads=4, hidden_size=64,
                                       opt_level=0)
        opt.save_model_to_file(str(dst))
        return onnx.load(str(dst))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", nargs="+", default=["bert", "gpt2"],
                   choices=["bert", "gpt2", "bert_ortopt"],
                   help="bert_ortopt: the BERT-like export rewritten by onnxruntime's "
                        "transformer optimizer (com.microsoft EmbedLayerNormalization, "
                        "Attention, SkipLayerNormalization, BiasGelu)")
    p.add_argument("--batches", nargs="+", type=int, default=[1, 8])
    p.add_argument("--reps", type=int, default=100)
    p.add_argument("--warmup", type=int, default=10)
    p.add_argument("--profile", action="store_true")
    args = p.parse_args()

    from tests.helpers import torch_models
    from workbench import compiled
    from workbench.backend import prepare

    print(f"CPU: {cpu_description()}; load average {os.getloadavg()[0]:.1f}")
    t0 = time.perf_counter()
    ready = compiled.wait(timeout=600)
    st = compiled.status()["modules"].get("transformer", {})
    print(f"compiled kernels ready: {ready} (transformer: {st.get('state')}, "
          f"{time.perf_counter() - t0:.1f} s to load or build)")
    print("CPU ms per run at one thread, median of the reps (engines interleaved)\n")
    print(f"{'model':6} {'batch':>5} {'compiled':>9} {'numpy':>9} {'ort':>8} "
          f"{'comp/ort':>9} {'np/ort':>8} {'max err':>9}")
    for name in args.models:
        proto = _model(torch_models, name)
        sess = ort_session(proto.SerializeToString())
        for batch in args.batches:
            inputs = list(torch_models.example_inputs(name.split("_")[0], batch, seq=SEQ))
            feeds = {i.name: a for i, a in zip(sess.get_inputs(), inputs)}
            rep = prepare(proto)
            for _ in range(args.warmup):
                rep.run(inputs)
                with compiled.disabled():
                    rep.run(inputs)
                sess.run(None, feeds)
            t = {"c": [], "n": [], "o": []}
            ours = lambda r=rep, i=inputs: r.run(i)                # noqa: E731
            theirs = lambda s=sess, f=feeds: s.run(None, f)         # noqa: E731
            for _ in range(args.reps):
                t["c"].append(_cpu(ours))
                with compiled.disabled():
                    t["n"].append(_cpu(ours))
                t["o"].append(_cpu(theirs))
            c, n, o = (statistics.median(t[k]) for k in "cno")
            ref = sess.run(None, feeds)[0]
            err = float(np.abs(rep.run(inputs)[0] - ref).max() / max(np.abs(ref).max(), 1e-30))
            print(f"{name:6} {batch:5d} {c:9.3f} {n:9.3f} {o:8.3f} {c / o:8.2f}x "
                  f"{n / o:7.2f}x {err:9.1e}")
            if args.profile:
                for label, ctx in (("compiled", None), ("numpy", compiled.disabled)):
                    if ctx is None:
                        prof = profile(rep.plan, inputs, max(10, args.reps // 4))
                    else:
                        with ctx():
                            prof = profile(rep.plan, inputs, max(10, args.reps // 4))
                    total = sum(v[0] for _, v in prof)
                    print(f"    {label} profile ({total:.3f} ms hooked): " + ", ".join(
                        f"{op} {ms:.3f}x{k}" for op, (ms, k) in prof[:9]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
