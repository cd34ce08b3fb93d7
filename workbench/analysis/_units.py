"""Human-readable numbers for the analysis' tables and summaries."""

from __future__ import annotations


def human(v, unit: str = "") -> str:
    """1823000000 -> '1.82 G'; bytes (unit 'B') in 1024 steps: 46800000 -> '44.6 MiB'."""
    if v is None:
        return "?"
    v = float(v)
    if unit == "B":
        for u in ("B", "KiB", "MiB", "GiB", "TiB"):
            if abs(v) < 1024 or u == "TiB":
                return f"{v:.0f} B" if u == "B" else f"{v:.3g} {u}"
            v /= 1024.0
    for p in ("", "K", "M", "G", "T", "P"):
        if abs(v) < 1000 or p == "P":
            return f"{v:.3g} {p}{unit}".strip()
        v /= 1000.0
    return str(v)
