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
