"""What the benchmarks' worker processes report about themselves."""

from __future__ import annotations

import resource
import sys


def peak_rss_mib() -> float:
    """This process's RSS high-water mark in MiB: VmHWM on Linux (per address space, so it
    starts afresh at exec; ``ru_maxrss`` would carry the parent's peak over a fork + exec),
    ``ru_maxrss`` elsewhere."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    r = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux, bytes on macOS
    return r / (1024 * 1024) if sys.platform == "darwin" else r / 1024


#: the instruction-set extensions that decide which kernels a CPU runs fastest (onnxruntime's
#: MLAS and numba's code differ between AVX2 and AVX-512; VNNI speeds up int8 products)
_FLAGS = ("sse4_2", "avx", "avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl",
          "avx512_vnni", "avx512_bf16", "avx_vnni", "amx_tile")


def cpu_description() -> str:
    """One line naming this machine's CPU, its core count, its SIMD flags (of ``_FLAGS``) and
    the load average: print it beside every timing (the project's machines differ)."""
    import os
    import platform

    name, flags = platform.processor() or platform.machine(), set()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name") and name in ("", platform.machine()):
                    name = line.split(":", 1)[1].strip()
                elif line.startswith("flags"):
                    flags = set(line.split(":", 1)[1].split())
                    break
    except OSError:
        pass
    have = [f for f in _FLAGS if f in flags]
    load = f", load average {os.getloadavg()[0]:.1f}" if hasattr(os, "getloadavg") else ""
    return (f"CPU: {name}, {os.cpu_count()} cores, flags: {' '.join(have) or 'unknown'}"
            f"{' (no AVX-512)' if flags and 'avx512f' not in flags else ''}{load}")
