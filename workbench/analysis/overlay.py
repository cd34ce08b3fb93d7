"""The analysis as a graph overlay: JSON the graph drawing colours its nodes and groups by.

:func:`overlay_payload` turns an :class:`~workbench.analysis.Analysis` into the ``overlay``
value of a GraphView (and of the JupyterLab viewer): one entry per metric that has numbers,
each saying how a collapsed group totals its nodes, and a summary panel. The drawing shows
one metric at a time (chosen in its legend, or with ``GraphView.overlay_metric``)::

    {"title", "unit", "values": {node: number}},      # the chosen metric (older front-ends)
     "metric": key, "metrics": [{
        "key", "title", "unit", "format": "si" | "bytes" | "ms" | "pct" | "ratio" | "",
        "kind": "sum" | "max" | "ratio" | "category", "scale": "log" | "linear",
        "reverse": bool,                     # dark = low (% of roof: far below the roof)
        "values": {node: number},            # sum / max
        "num": {node: n}, "den": {node: d}, "times": k,   # ratio: k * sum(num) / sum(den)
        "categories": {node: name}, "colors": {name: css}, "flops": {...}, "bytes": {...},
        "ridge": float,                      # category (bound): a group by its total intensity
        "note": str}, ...],
     "summary": [[label, text], ...], "source": "analysis"}

Node names and every other string from a model travel as JSON data: the front-end puts them
in the page as text only.
"""

from __future__ import annotations

from ._units import human

#: (key, title, unit, format, kind, scale, reverse, how a group totals it)
METRICS = (
    ("flops", "FLOPs", "FLOP", "si", "sum", "log", False, "the sum of its nodes"),
    ("params", "parameters", "", "si", "sum", "log", False, "the sum of its nodes"),
    ("activation_bytes", "activation memory (outputs written)", "B", "bytes", "sum", "log",
     False, "the sum of its nodes"),
    ("live_bytes_after", "memory live after the step", "B", "bytes", "max", "linear", False,
     "the largest after any of its nodes"),
    ("time_ours_ms", "time per node, ours", "ms", "ms", "sum", "log", False,
     "the sum of its nodes"),
    ("time_ort_ms", "time per node, onnxruntime", "ms", "ms", "sum", "log", False,
     "the sum of its nodes"),
    ("pct_of_roof", "% of roof (roofline time / measured time)", "%", "pct", "ratio",
     "linear", True, "its roofline time / its measured time"),
    ("bound", "compute- or memory-bound", "", "", "category", "linear", False,
     "by its total FLOPs / bytes against the ridge"),
    ("intensity", "arithmetic intensity", "FLOP/B", "ratio", "ratio", "log", False,
     "its FLOPs / its bytes moved"),
)

BOUND_COLORS = {"compute": "#d9480f", "memory": "#1c7ed6"}


def metric_keys() -> list:
    return [m[0] for m in METRICS]


def _num(v) -> bool:
    return isinstance(v, (int, float)) and v == v and v not in (float("inf"), float("-inf"))


def overlay_payload(analysis, metric: str | None = None, *, memory=None) -> dict:
    """The overlay of ``analysis`` (see the module docstring); ``metric``: the one shown first
    (default: the measured time when there is one, else FLOPs). ``memory``: a
    :class:`~workbench.analysis.memory.MemoryTimeline` for the summary (the analysis' last
    one when None)."""
    rows = [r for r in analysis.records if not r["static"]]
    fused_ours, fused_ort = analysis.fused("ours"), analysis.fused("ort")
    out = []
    for key, title, unit, fmt, kind, scale, reverse, group_rule in METRICS:
        m = {"key": key, "title": title, "unit": unit, "format": fmt, "kind": kind,
             "scale": scale, "reverse": reverse, "group_rule": group_rule}
        if kind in ("sum", "max"):
            vals = {r["node"]: float(r[key]) for r in rows if _num(r[key])}
            if not vals or (key != "live_bytes_after" and not any(vals.values())):
                continue
            m["values"] = vals
        elif key == "pct_of_roof":
            num, den = {}, {}
            for r in rows:
                ours = r["time_ours_ms"] is not None
                t = r["time_ours_ms"] if ours else r["time_ort_ms"]
                if not _num(t) or not t or r["pct_of_roof"] is None:
                    continue
                group = (fused_ours if ours else fused_ort).get(r["node"])
                roof = (analysis.group_roof_ms(group) if group else None) or r["roof_time_ms"]
                if _num(roof):
                    num[r["node"]], den[r["node"]] = float(roof), float(t)
            if not num:
                continue
            m.update(num=num, den=den, times=100.0,
                     values={k: 100.0 * num[k] / den[k] for k in num},
                     note="from our times where measured, else onnxruntime's")
        elif key == "intensity":
            num = {r["node"]: float(r["flops"]) for r in rows
                   if _num(r["flops"]) and r["flops"] and _num(r["bytes_read"])
                   and _num(r["bytes_written"]) and r["bytes_read"] + r["bytes_written"]}
            if not num:
                continue
            den = {k: float(by["bytes_read"] + by["bytes_written"])
                   for k, by in ((r["node"], r) for r in rows) if k in num}
            m.update(num=num, den=den, times=1.0,
                     values={k: num[k] / den[k] for k in num})
        elif key == "bound":
            cats = {r["node"]: r["bound"] for r in rows if r["bound"]}
            if not cats or analysis.peaks is None:
                continue
            m.update(categories=cats, colors=dict(BOUND_COLORS),
                     flops={k: float(r["flops"] or 0) for r in rows
                            if (k := r["node"]) in cats},
                     bytes={k: float((r["bytes_read"] or 0) + (r["bytes_written"] or 0))
                            for r in rows if (k := r["node"]) in cats},
                     ridge=float(analysis.peaks.ridge),
                     note=f"ridge {analysis.peaks.ridge:.1f} FLOP/B: "
                          f"{analysis.peaks.describe()}")
        out.append(m)
    keys = [m["key"] for m in out]
    if metric is None:
        metric = next((k for k in ("time_ours_ms", "time_ort_ms", "flops") if k in keys),
                      keys[0] if keys else "")
    elif keys and metric not in keys:
        known = metric_keys()
        raise ValueError(f"overlay metric {metric!r}: " + (
            f"no numbers for it in this analysis (run {_how(metric)} first)"
            if metric in known else f"unknown; the metrics are {known}")
            + f"; available: {keys}")
    chosen = next((m for m in out if m["key"] == metric), None)
    return {"title": chosen["title"] if chosen else "", "unit": chosen["unit"] if chosen else "",
            "values": dict(chosen["values"]) if chosen else {}, "metric": metric,
            "metrics": out, "summary": summary_rows(analysis, memory), "source": "analysis"}


def _how(metric: str) -> str:
    return {"time_ours_ms": "profile_ours()", "time_ort_ms": "profile_ort()",
            "pct_of_roof": "roofline() and a profile", "bound": "roofline()",
            "live_bytes_after": "memory()"}.get(metric, "analyze()")


def summary_rows(analysis, memory=None) -> list:
    """The summary panel: [[label, text], ...] (plain text; the front-end shows it as text)."""
    t = analysis.totals()
    out = [["model", analysis.label],
           ["inputs", ", ".join(f"{k} {'x'.join(str(d) for d in s)}"
                                for k, s in analysis.input_shapes.items())],
           ["MACs / FLOPs", f"{human(t['macs'])} / {human(t['flops'])}"],
           ["parameters", f"{t['params']:,}" + (f" + {t['buffers']:,} buffers"
                                                if t["buffers"] else "")
            + f" ({human(t['param_bytes'], 'B')})"],
           ["activations written", human(t["activation_bytes"], "B")],
           ["intensity", f"{t['intensity']:.1f} FLOP/B" if t["intensity"] else "n/a"]]
    tl = memory if memory is not None else getattr(analysis, "timeline", None)
    if tl is not None:
        out.append(["peak memory", f"{human(tl.peak_bytes, 'B')} of arrays at "
                    f"{tl.peak_node} (+ {human(tl.weights_bytes, 'B')} weights)"])
        if tl.measured:
            out.append(["measured peak", f"{human(tl.measured['peak'], 'B')} between steps, "
                        f"{human(tl.measured['peak_during'], 'B')} inside kernels"])
    ours = getattr(analysis, "ours", None)
    if ours is not None:
        out.append(["time, ours", f"{ours.sum_ms:.3f} ms in the nodes, a plain run "
                    f"{ours.plain_ms:.3f} ms"])
    if analysis.ort is not None:
        out.append(["time, onnxruntime", f"{t['time_ort_ms'] or 0:.3f} ms in kernels, a run "
                    f"{analysis.ort.total_ms:.3f} ms"])
    if analysis.peaks is not None:
        out.append(["roofline", analysis.peaks.describe()])
        if t["roof_time_ms"] is not None:
            out.append(["roofline time", f"{t['roof_time_ms']:.3f} ms (the least the peaks "
                        f"allow)"])
    slow = analysis.slowest(3)
    if slow:
        out.append(["furthest below the roof", ", ".join(
            f"{r['node']} ({r['pct_of_roof']:.0f} %)" for r in slow)])
    return out


__all__ = ["overlay_payload", "summary_rows", "METRICS", "metric_keys"]
