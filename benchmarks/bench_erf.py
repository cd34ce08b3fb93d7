"""Erf without scipy: accuracy over the whole float32 range, float64 ulps, speed.

```
python benchmarks/bench_erf.py                 # every float32 (2**32 patterns) + float64 + speed
python benchmarks/bench_erf.py --step 257      # every 257th float32 pattern (quick)
python benchmarks/bench_erf.py --fit           # print the series coefficients (mpmath)
```

Accuracy: the engine's erf (``workbench.ops.elementwise``: the compiled float32 kernel when it
is built, else the numpy path; both give the same bits, which this checks too) against
scipy.special.erf computed in float64 and rounded to float32 (the oracle: scipy is a test
dependency only), in ulps of the float32 result; NaN must map to NaN. float64: against mpmath
at 100 bits on a fixed sample (uniform on [-7, 7], near 0, log-spaced down to subnormals).
Speed: CPU time per call on 65,536 float32 values (a BERT-like batch-8 GELU), one thread.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
os.environ.setdefault("WORKBENCH_NUM_THREADS", "1")
os.environ.setdefault("WORKBENCH_COMPILED", "wait")

import numpy as np  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)


def fit() -> None:
    """The Chebyshev coefficients of ``kernels/_erf_series.py``, from mpmath at 160 bits."""
    import mpmath as mp
    mp.mp.prec = 160
    n = 48

    def cheb(f):
        th = [mp.pi * (j + mp.mpf(1) / 2) / n for j in range(n)]
        fv = [f(mp.cos(t)) for t in th]
        c = [2 * mp.fsum(fv[j] * mp.cos(k * th[j]) for j in range(n)) / n for k in range(n)]
        c[0] /= 2
        return [float(v) for v in c if abs(v) > mp.mpf(2) ** -60]

    def small(u):   # erf(x) / x in u = x*x / 2 - 1, |x| < 2
        t = 2 * u + 2
        return mp.erf(mp.sqrt(t)) / mp.sqrt(t) if t > 0 else 2 / mp.sqrt(mp.pi)

    def large(u):   # erfc(y) exp(y*y) in u = y / 2 - 2, 2 <= y <= 6
        y = 2 * u + 4
        return mp.erfc(y) * mp.exp(y * y)

    print("SMALL =", tuple(cheb(small)))
    print("LARGE =", tuple(cheb(large)))


def sweep_f32(step: int, chunk: int = 1 << 24) -> dict:
    import scipy.special

    from workbench.ops import elementwise as ew
    worst, differ, total, nan_bad, path_bad = 0.0, 0, 0, 0, 0
    worst_x = None
    for start in range(0, 1 << 32, chunk * step):
        bits = np.arange(start, min(1 << 32, start + chunk * step), step, dtype=np.uint64)
        x = bits.astype(np.uint32).view(np.float32)
        got = ew.erf_array(x)
        with np.errstate(invalid="ignore"):
            ref = scipy.special.erf(x.astype(np.float64)).astype(np.float32)
        if ew._erf_compiled(x[:4096]) is not None:   # the kernel and the numpy path agree
            a, b = ew._erf_compiled(x[::64]), ew._erf_fallback(x[::64])
            ok = ~np.isnan(b)
            path_bad += int(np.count_nonzero(a[ok].view(np.uint32) != b[ok].view(np.uint32)))
        nan_bad += int(np.count_nonzero(np.isnan(got) != np.isnan(ref)))
        ok = ~np.isnan(ref)
        g, r = got[ok].astype(np.float64), ref[ok]
        u = np.abs(g - r) / np.spacing(np.abs(r)).astype(np.float64)
        if u.size and u.max() > worst:
            worst, worst_x = float(u.max()), float(x[ok][np.argmax(u)])
        differ += int(np.count_nonzero(u))
        total += int(ok.sum())
    return {"values": total, "max_ulp": worst, "at": worst_x, "not_rounded_as_scipy": differ,
            "nan_mismatch": nan_bad, "kernel_vs_numpy_bits_differ": path_bad}


def ulps_f64() -> dict:
    import mpmath as mp

    from workbench.ops import elementwise as ew
    mp.mp.prec = 100
    rng = np.random.default_rng(0)
    x = np.concatenate([rng.uniform(-7, 7, 40000), rng.standard_normal(10000) * 1e-3,
                        np.geomspace(5e-324, 6, 5000), -np.geomspace(1e-200, 6, 5000)])
    got = ew.erf_array(x)
    ref = np.array([float(mp.erf(mp.mpf(float(v)))) for v in x])
    u = np.abs(got - ref) / np.spacing(np.abs(ref))
    return {"values": x.size, "max_ulp": float(u.max()), "at": float(x[np.argmax(u)]),
            "p99.9": float(np.percentile(u, 99.9))}


def speed() -> dict:
    from workbench import compiled
    from workbench.ops import elementwise as ew
    x = np.random.default_rng(0).standard_normal(65536).astype(np.float32)
    out = {}
    try:
        import scipy.special
        cands = {"scipy.special.erf (float32)": lambda: scipy.special.erf(x)}
    except ImportError:
        cands = {}
    cands["numpy path"] = lambda: ew._erf_fallback(x)
    if compiled.kernel("transformer.erf_f32") is not None:
        cands["compiled transformer.erf_f32"] = lambda: ew._erf_compiled(x)
    times = {k: [] for k in cands}
    for _ in range(7):   # rounds, engines alternated
        for k, f in cands.items():
            f()
            t0 = time.process_time()
            for _ in range(50):
                f()
            times[k].append((time.process_time() - t0) / 50 * 1e3)
    for k, v in times.items():
        out[k] = f"{sorted(v)[len(v) // 2]:.3f} ms (median of 7 rounds of 50 calls)"
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--step", type=int, default=1, help="check every STEP-th float32 pattern")
    ap.add_argument("--fit", action="store_true", help="print the series coefficients")
    args = ap.parse_args(argv)
    if args.fit:
        fit()
        return 0
    from benchmarks._cpu import cpu_description
    print("CPU:", cpu_description())
    for k, v in speed().items():
        print(f"speed, 65,536 float32 values: {k}: {v}")
    print("float64 vs mpmath:", ulps_f64())
    t0 = time.monotonic()
    print(f"float32, every {args.step}th pattern vs scipy rounded:", sweep_f32(args.step),
          f"({time.monotonic() - t0:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
