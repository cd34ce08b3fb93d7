"""MobileNetV2 / ShuffleNetV2 at one thread, in one process: the layout pass' inverted-residual
chains (``NhwcConvChain`` -> ``dwconv_avx2.chain``) and the stems' few-channel kernel
(``dwconv_avx2.fewc``) on and off, against onnxruntime, engines interleaved run by run.

    python benchmarks/bench_conv_chain.py                       # both nets, batches 1 and 8
    python benchmarks/bench_conv_chain.py --models mobilenetv2 --batches 8 --reps 10

Models: ``--dir`` holds ``<model>.onnx`` and ``<model>_b<batch>.npz`` (the inputs, arr_0...),
as ``bench_inference.py`` writes them; missing ones are exported there as it does. Variants,
each its own plan of the same model: "chain+fewc" (as shipped), "chain" (the stem on the
indirect GEMM), "layers" (no chains: the three NhwcConv steps per block, the stem on the
indirect GEMM: the engine before these kernels), "ort". CPU time
(``time.process_time``), medians and 10th percentiles of ``--reps`` rounds; the outputs of the
variants are compared bit for bit (the chains compute the same bits as the layers).
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


def _model(folder: Path, name: str, batch: int, cache: dict):
    """The model and its inputs: ``folder``'s files when there, else exported there as
    ``bench_inference.py`` does."""
    path, npz = folder / f"{name}.onnx", folder / f"{name}_b{batch}.npz"
    if not path.exists() or not npz.exists():
        from benchmarks.bench_inference import model_files  # noqa: PLC0415

        folder.mkdir(parents=True, exist_ok=True)
        path, npz = model_files(name, batch, folder, cache)
    d = np.load(npz)
    return str(path), [d[k] for k in d.files]


def _plans(path):
    import workbench.backend as backend  # noqa: PLC0415
    import workbench.graph.layout as layout  # noqa: PLC0415
    from workbench.ops import conv_nhwc  # noqa: PLC0415

    real, fewc = layout.chain_convs, conv_nhwc._FEWC_MAX
    plans = {"chain+fewc": backend.prepare(path)}
    plans["chain"] = backend.prepare(path)
    layout.chain_convs = lambda g, nodes, *a, **k: nodes
    try:
        plans["layers"] = backend.prepare(path)
    finally:
        layout.chain_convs = real
    few = {"chain+fewc": fewc, "chain": 0, "layers": 0}

    def runner(name):
        rep = plans[name]

        def run(inputs):
            conv_nhwc._FEWC_MAX = few[name]
            try:
                return rep.run(inputs)
            finally:
                conv_nhwc._FEWC_MAX = fewc
        return run
    return {name: runner(name) for name in plans}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", nargs="+", default=["mobilenetv2", "shufflenetv2"])
    p.add_argument("--batches", nargs="+", type=int, default=[1, 8])
    p.add_argument("--reps", type=int, default=20)
    p.add_argument("--dir", default="/tmp/s6")
    args = p.parse_args()
    from workbench import compiled  # noqa: PLC0415

    compiled.wait(["dwconv_avx2", "gemm_avx2"], timeout=600)
    print(f"CPU: {cpu_description()}; one thread; CPU time; medians (p10) of {args.reps}")
    import onnxruntime as ort  # noqa: PLC0415

    cache: dict = {}
    for name in args.models:
        for batch in args.batches:
            path, inputs = _model(Path(args.dir), name, batch, cache)
            fns = _plans(path)
            so = ort.SessionOptions()
            so.intra_op_num_threads = so.inter_op_num_threads = 1
            sess = ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])
            feeds = dict(zip([i.name for i in sess.get_inputs()], inputs))
            fns["ort"] = lambda _inputs, s=sess, f=feeds: s.run(None, f)
            outs = {}
            for k, fn in fns.items():
                for _ in range(3):
                    outs[k] = np.asarray(fn(inputs)[0])
            same = np.array_equal(outs["chain"].view(np.int32), outs["layers"].view(np.int32))
            ts = {k: [] for k in fns}
            for _ in range(args.reps):
                for k, fn in fns.items():
                    t = time.process_time()
                    fn(inputs)
                    ts[k].append((time.process_time() - t) * 1e3)
            ort_ms = statistics.median(ts["ort"])
            print(f"\n{name} b{batch}: chain = layers bit for bit: {same}; "
                  f"max |chain+fewc - ort| {np.abs(outs['chain+fewc'] - outs['ort']).max():.2e}")
            for k, v in ts.items():
                med = statistics.median(v)
                p10 = sorted(v)[len(v) // 10]
                print(f"  {k:11s} {med:8.2f} ms ({p10:7.2f})   {med / ort_ms:5.2f}x ort")


if __name__ == "__main__":
    main()
