"""The pre-bound FusedMatMul / MatMul / Gemm / LayerNormalization steps (``ops/linalg.py::
_make_bound``, ``ops/rowwise.py::bind_layer_norm``) and the lean Gather / Cast paths, on and
off in ONE process, CPU time at one thread (``time.process_time``; a shared machine).

``steps``: each step kind of the BERT-like / GPT-2-like models at batch 1 (seq 32, hidden 64)
called directly, full path vs pre-bound, min and median over rounds of many calls.
``models``: whole models (``backend.prepare``), the same plan with those paths off and on
alternated run by run, onnxruntime (one thread, all graph optimisations) timed in between;
the outputs of both settings are checked bit for bit. "off" still runs the C GEMM and the
compiled GELU/LayerNorm (the state before this change, but for Gemm's C path).

    python benchmarks/bench_bound_steps.py                       # steps, then bert gpt2 b1 b8
    python benchmarks/bench_bound_steps.py --what models --models bert --batches 1 --runs 500
    python benchmarks/bench_bound_steps.py --files /tmp/s6       # exported <model>.onnx and
                                                                 # <model>_b<batch>.npz there
Without ``--files`` the models are built and exported with PyTorch (tests/helpers).
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks._cpu import cpu_description, one_thread, ort_session  # noqa: E402

one_thread()   # before numpy (BLAS) is imported

import argparse  # noqa: E402
import statistics  # noqa: E402
import time  # noqa: E402

import numpy as np  # noqa: E402


class Switch:
    """The new paths on or off (module attributes swapped; the same plan either way)."""

    def __init__(self):
        from workbench.ops import cast, indexing, linalg, norm, rowwise
        self.m = (linalg, rowwise, norm, indexing, cast)
        self.orig = (linalg._bound_step, linalg._bind_step, rowwise.bind_layer_norm,
                     norm._LN_BOUND, indexing._HOST_INDEX_TYPES, cast._PLAIN_SOURCES)

    def __call__(self, on: bool) -> None:
        linalg, rowwise, norm, indexing, cast = self.m
        o = self.orig
        linalg._bound_step = o[0] if on else (lambda *a: None)
        linalg._bind_step = o[1] if on else (lambda *a: None)
        rowwise.bind_layer_norm = o[2] if on else (lambda *a: None)
        norm._LN_BOUND = o[3] if on else o[3] + "_off"
        indexing._HOST_INDEX_TYPES = o[4] if on else ()
        cast._PLAIN_SOURCES = o[5] if on else ()


def steps(switch, calls: int, rounds: int) -> None:
    from workbench.ops import norm
    from workbench.ops.linalg import fused_matmul_epilogue as fused
    from workbench.ops.linalg import gemm, matmul
    from workbench.ops.registry import NodeContext

    rng = np.random.default_rng(0)

    def f(*s):
        return rng.standard_normal(s).astype(np.float32)
    a, a256, a1 = f(1, 32, 64), f(1, 32, 256), f(1, 64)
    w64, w256, w256b, wl, pw = f(64, 64), f(64, 256), f(256, 64), f(64, 1000), f(64, 64)
    b64, b256, z, g, be = f(64), f(256), f(1, 32, 64), f(64) + 1, f(64)
    cases = {
        "qkv [1,32,64]x[64,64]+bias": lambda c: fused(a, w64, b64, ctx=c),
        "ffn_in x[64,256]+bias+GELU(erf)": lambda c: fused(a, w256, b256, activation="Gelu",
                                                           ctx=c),
        "ffn_in x[64,256]+bias+GELU(tanh)": lambda c: fused(a, w256, b256,
                                                            activation="GeluTanh", ctx=c),
        "ffn_out [1,32,256]x[256,64]+b+res+LN": lambda c: fused(a256, w256b, b64, z, g, be,
                                                                epsilon=1e-12, ctx=c),
        "lm_head MatMul x[64,1000]": lambda c: matmul(a, wl, ctx=c),
        "pooler Gemm [1,64]x[64,64]^T+b": lambda c: gemm(a1, pw, b64, transB=1, ctx=c),
        "LayerNormalization [1,32,64]": lambda c: norm.layer_norm(a, g, be, epsilon=1e-5,
                                                                  ctx=c),
    }
    print(f"{'step':40s} {'full us (min/med)':>18s} {'bound us (min/med)':>19s}")
    for name, fn in cases.items():
        ctxs = {on: NodeContext("n", "X", 17, 1) for on in (False, True)}
        for on in (False, True):
            switch(on)
            for _ in range(3):
                fn(ctxs[on])
        t = {False: [], True: []}
        for _ in range(rounds):
            for on in (False, True):
                switch(on)
                c, s = ctxs[on], time.process_time()
                for _ in range(calls):
                    fn(c)
                t[on].append((time.process_time() - s) / calls * 1e6)
        print(f"{name:40s} {min(t[False]):8.1f} /{statistics.median(t[False]):7.1f} "
              f"{min(t[True]):9.1f} /{statistics.median(t[True]):7.1f}", flush=True)
    switch(True)


def _inputs_and_model(name, batch, files):
    if files:
        d = np.load(Path(files) / f"{name}_b{batch}.npz")
        keys = sorted(d.files, key=lambda s: int(s.split("_")[1]))
        return (Path(files) / f"{name}.onnx").read_bytes(), [d[k] for k in keys]
    from tests.helpers import torch_models
    model, example = torch_models.build(name)
    proto = torch_models.export_onnx(model, example, None, opset=17)
    return proto.SerializeToString(), list(torch_models.example_inputs(name, batch, seq=32))


def models(switch, names, batches, runs, files) -> None:
    from workbench import backend

    for name in names:
        for batch in batches:
            blob, xs = _inputs_and_model(name, batch, files)
            rep = backend.prepare(blob)
            sess = ort_session(blob)
            feed = {i.name: x for i, x in zip(sess.get_inputs(), xs)}
            switch(False)
            off = rep.run(xs)
            switch(True)
            for _ in range(5):
                rep.run(xs)
            same = all(np.array_equal(p, q) for p, q in zip(off, rep.run(xs)))
            t = {"off": [], "on": [], "ort": []}
            for _ in range(runs):
                for key in ("off", "on"):
                    switch(key == "on")
                    s = time.process_time()
                    rep.run(xs)
                    t[key].append(time.process_time() - s)
                s = time.process_time()
                sess.run(None, feed)
                t["ort"].append(time.process_time() - s)
            med = {k: statistics.median(v) * 1e3 for k, v in t.items()}
            print(f"{name} b{batch}: off {med['off']:.3f} ms ({med['off'] / med['ort']:.2f}x "
                  f"ort)  on {med['on']:.3f} ms ({med['on'] / med['ort']:.2f}x)  ort "
                  f"{med['ort']:.3f} ms  off/on {med['off'] / med['on']:.2f}  same bits "
                  f"{same}", flush=True)
            switch(True)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--what", choices=["steps", "models", "both"], default="both")
    p.add_argument("--models", nargs="+", default=["bert", "gpt2"])
    p.add_argument("--batches", nargs="+", type=int, default=[1, 8])
    p.add_argument("--runs", type=int, default=300, help="whole-model runs per setting")
    p.add_argument("--calls", type=int, default=3000, help="calls per round (steps)")
    p.add_argument("--rounds", type=int, default=9, help="rounds (steps)")
    p.add_argument("--files", default=None,
                   help="folder with <model>.onnx and <model>_b<batch>.npz (arr_0, ...)")
    args = p.parse_args()
    from workbench import compiled
    compiled.wait(["gemm_avx2", "transformer"], timeout=600)
    if compiled.kernel("gemm_avx2.fused_block") is None:
        print("gemm_avx2 is not available here:", compiled.status()["modules"].get("gemm_avx2"))
        return 1
    print(cpu_description(), "- CPU time at one thread")
    switch = Switch()
    if args.what in ("steps", "both"):
        steps(switch, args.calls, args.rounds)
    if args.what in ("models", "both"):
        models(switch, args.models, args.batches, args.runs, args.files)
    return 0


if __name__ == "__main__":
    sys.exit(main())
