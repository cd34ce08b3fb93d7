"""What the benchmark tables must say about the machine and the compiled kernels, and the
set-up the one-thread CPU-time benchmarks share (``bench_transformer_cpu.py``,
``bench_conv_cpu.py``): :func:`one_thread` before numpy is imported, :func:`ort_session`.

``cpu_description()``: the CPU's model and the SIMD flags that change our numbers and
onnxruntime's (AVX2/FMA vs AVX-512, VNNI). ``prepare_compiled()``: the compiled kernels
(``workbench.compiled``) built or loaded in this process before anything is timed, with
what that cost (a cold build happens once per machine and engine version: it is reported,
never mixed into a timed run), and the environment for fresh worker processes so that their
first run loads the kernels (``WORKBENCH_COMPILED=wait``: milliseconds from the cache)
instead of running numpy while they load.
"""

from __future__ import annotations

import os
import time

THREAD_VARIABLES = ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS",
                    "WORKBENCH_NUM_THREADS")


def one_thread() -> None:
    """One thread everywhere (BLAS, OpenMP, the engine's pool): call it before numpy is
    imported, since BLAS reads its thread count once at load."""
    for v in THREAD_VARIABLES:
        os.environ[v] = "1"


def ort_session(model_bytes):
    """An onnxruntime CPU session at one thread (all graph optimisations, quiet log)."""
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    so.inter_op_num_threads = 1
    so.log_severity_level = 3
    return ort.InferenceSession(model_bytes, sess_options=so,
                                providers=["CPUExecutionProvider"])


SIMD_FLAGS = ("sse4_2", "avx", "avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl",
              "avx512_vnni", "avx_vnni", "avx512_bf16", "amx_tile")


def cpu_description() -> str:
    name, flags = "unknown CPU", set()
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                key, _, value = line.partition(":")
                key = key.strip()
                if key == "model name" and name == "unknown CPU":
                    name = value.strip()
                elif key == "flags" and not flags:
                    flags = set(value.split())
    except OSError:
        pass
    have = [f for f in SIMD_FLAGS if f in flags]
    simd = "AVX-512" if "avx512f" in flags else "AVX2" if "avx2" in flags else "no AVX2"
    vnni = "VNNI" if {"avx512_vnni", "avx_vnni"} & flags else "no VNNI"
    return f"{name}, {os.cpu_count()} CPUs, {simd}, {vnni} (flags: {' '.join(have) or '-'})"


def prepare_compiled(use: bool = True) -> tuple[str, dict]:
    """(a line for the report, environment for worker processes). ``use`` False: workers run
    on numpy (``WORKBENCH_COMPILED=0``), the "before" of a before/after table."""
    env = dict(os.environ)
    if not use:
        env["WORKBENCH_COMPILED"] = "0"
        return "compiled kernels: off (numpy paths)", env
    from workbench import compiled

    if not compiled.enabled():
        return "compiled kernels: off (WORKBENCH_COMPILED=0 in the environment)", env
    t0 = time.perf_counter()
    cold = [m for m, st in compiled.status()["modules"].items() if st["state"] == "cold"]
    if compiled.can_build() is None:
        report = compiled.warmup(progress=None)
        ok = [m for m, r in report["modules"].items() if r["ok"]]
        bad = {m: r["error"] for m, r in report["modules"].items() if not r["ok"]}
    else:
        ok = [m for m in compiled.modules() if compiled.wait([m], timeout=60)]
        bad = {m: compiled.status()["modules"][m].get("why")
               for m in compiled.modules() if m not in ok}
    secs = time.perf_counter() - t0
    line = (f"compiled kernels: {len(ok)} module(s) ready ({', '.join(ok) or '-'}); "
            + (f"cold build of {', '.join(cold)} took {secs:.1f} s (once per machine and "
               f"engine version; not in any timed run)" if cold else
               f"loaded from the cache in {secs:.2f} s"))
    if bad:
        line += f"; NOT available: {bad}"
    env["WORKBENCH_COMPILED"] = "wait"
    return line, env


def torch_export_case(name: str, batch: int):
    """``(proto, xs, session, reference)`` for a zoo twin of ``tests/helpers/torch_models``:
    the model exported by ``torch.onnx`` (opset 17) for ``batch`` example inputs, those inputs
    as contiguous numpy arrays, a one-thread onnxruntime session on it and its first output."""
    import numpy as np

    from tests.helpers import torch_models

    model, _ = torch_models.build(name)
    x = torch_models.example_inputs(name, batch=batch)
    xs = [np.ascontiguousarray(np.asarray(a)) for a in x]
    proto = torch_models.export_onnx(model, tuple(x) if isinstance(x, list) else x, None,
                                     opset=17)
    sess = ort_session(proto.SerializeToString())
    feeds = dict(zip([i.name for i in sess.get_inputs()], xs))
    return proto, xs, sess, sess.run(None, feeds)[0]
