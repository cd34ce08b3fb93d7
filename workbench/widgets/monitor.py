"""TrainingMonitor: live loss/metric curves, progress with ETA, a Stop button.

>>> with TrainingMonitor(total=len(loader) * epochs) as mon:         # doctest: +SKIP
...     for epoch in range(epochs):
...         for x, y in loader:
...             loss = train_step(x, y)
...             mon.update(loss=loss, metrics={"acc": acc})
...             if mon.should_stop:          # the Stop button was pressed
...                 break
...         mon.update(loss=val_loss, metrics={"acc": val_acc}, phase="val")
...         if mon.should_stop:
...             break
>>> mon.history["train"]["loss"]                                     # doctest: +SKIP

In a notebook it is a widget; anywhere else (a script, a terminal, a CI log) it writes a text
progress bar to stderr instead. It never raises because there is no display.

The widget's output also carries a static picture of the curves (``image/svg+xml``, drawn by
:func:`curves_svg`, the same axes as the live charts) and the summary as text: when training
ends the output is updated with them, so a notebook saved with its outputs shows the curves
where no widget can render (GitHub, nbviewer, an HTML export, a closed kernel).

How Stop reaches a busy kernel: while a cell runs, the kernel does not read widget messages,
so the button also asks the Jupyter server to interrupt the kernel. While the monitor is
active (inside ``with`` or between the first ``update`` and ``close``) the first interrupt
only sets ``should_stop`` (the loop ends cleanly, between batches, weights kept); a second
interrupt raises ``KeyboardInterrupt`` as usual.
"""

from __future__ import annotations

import math
import os
import signal
import sys
import threading
import time

from workbench.widgets._base import in_notebook
from workbench.widgets._html import esc

MAX_POINTS = 600            # per series sent to the browser (older points thinned out)
PUSH_INTERVAL = 0.2         # seconds between browser updates while training
X_TITLE = "step (batches)"  # the x axis of every chart: optimizer steps, one batch each
TRAIN_COLOUR, VAL_COLOUR = "#3c6eb4", "#e67e22"


def _fmt_time(s) -> str:
    if s is None or not math.isfinite(s):
        return "?"
    s = int(round(s))
    h, rem = divmod(s, 3600)
    m, sec = divmod(rem, 60)
    return f"{h}:{m:02d}:{sec:02d}" if h else f"{m}:{sec:02d}"


def _fmt_val(v) -> str:
    if v is None:
        return "—"
    a = abs(v)
    return f"{v:.3e}" if a and (a < 1e-3 or a >= 1e5) else f"{v:.4f}"


def _scalar(v):
    """A float from a number, a 0-d/1-element array or a workbench/numpy/cupy tensor."""
    if v is None:
        return None
    if hasattr(v, "item"):
        v = v.item()
    elif hasattr(v, "numpy"):
        v = v.numpy()
        v = v.item() if hasattr(v, "item") else v
    return float(v)


def _isatty(stream) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, OSError, ValueError):
        return False


def _kernel_id() -> str:
    try:
        from ipykernel import get_connection_file
        base = os.path.basename(get_connection_file())
    except Exception:
        return ""
    if base.startswith("kernel-") and base.endswith(".json"):
        return base[len("kernel-"):-len(".json")]
    return ""


def _nice_ticks(lo: float, hi: float, n: int = 4) -> list[float]:
    """About ``n`` round tick values covering [lo, hi]."""
    if not (math.isfinite(lo) and math.isfinite(hi)) or hi <= lo:
        return [lo]
    raw = (hi - lo) / n
    if not (math.isfinite(raw) and raw > 0):          # the range overflows a float
        return [lo, hi]
    mag = 10.0 ** math.floor(math.log10(raw))
    if not mag > 0:                                   # a subnormal range
        return [lo, hi]
    step = next(m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= raw)
    first = math.ceil(lo / step - 1e-9) * step
    ticks, t = [], first
    while t <= hi + step * 1e-9:
        ticks.append(t)
        t = first + len(ticks) * step             # no drift from repeated addition
    return ticks


def _tick_label(v: float) -> str:
    a = abs(v)
    if a and (a < 1e-3 or a >= 1e5):
        return f"{v:.2e}"
    return f"{v:.6g}"


def curves_svg(series: dict, title: str = "training", *, note: str = "",
               panel_width: int = 300, panel_height: int = 190, columns: int = 3) -> str:
    """A static picture of training curves as an SVG document.

    ``series`` maps a metric name to ``{"train": [[step, value], ...], "val": [...]}`` (the
    form :class:`TrainingMonitor` sends to the browser). One panel per metric, laid out in up
    to ``columns`` columns; each panel has its x axis titled ``step (batches)`` and its y axis
    titled with the metric's name, tick labels on both, the training curve as a line and the
    validation points as dots, and a legend. Values that are not finite are left out.
    ``note``: a line shown after the title (the final values, say).
    """
    names = [k for k, v in series.items() if any(v.get(ph) for ph in ("train", "val"))]
    cols = max(1, min(columns, len(names) or 1))
    rows = max(1, math.ceil(len(names) / cols))
    head = 24
    # wide enough for the title line (about 6 px a character at this size)
    W, H = max(cols * panel_width, 6 * (len(title) + len(note)) + 40), head + rows * panel_height
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" '
           f'viewBox="0 0 {W} {H}" font-family="sans-serif" font-size="10">',
           f'<rect width="{W}" height="{H}" fill="#ffffff"/>',
           f'<text x="6" y="16" font-size="12" fill="#1f2933"><tspan font-weight="bold">'
           f'{esc(title)}</tspan><tspan fill="#52606d" dx="10">{esc(note)}</tspan></text>']
    if not names:
        out.append(f'<text x="6" y="{head + 16}" fill="#6b7785">no values recorded</text>')
    L, R, T, B = 58, 10, 22, 34                  # margins of the plot area in a panel
    for i, name in enumerate(names):
        ox, oy = (i % cols) * panel_width, head + (i // cols) * panel_height
        pw, ph = panel_width - L - R, panel_height - T - B
        x0p, y0p = ox + L, oy + T
        pts = {ph_: [(float(x), float(y)) for x, y in series[name].get(ph_) or []
                     if y is not None and math.isfinite(float(y))] for ph_ in ("train", "val")}
        allp = pts["train"] + pts["val"]
        out.append(f'<g class="wb-curve-panel" data-metric="{esc(name)}">')
        out.append(f'<text x="{ox + 6}" y="{oy + 14}" font-size="11" fill="#1f2933">'
                   f'{esc(name)}</text>')
        # axis titles: x centred under the tick labels, y rotated along the left edge
        out.append(f'<text class="x-title" x="{x0p + pw / 2:.1f}" y="{oy + panel_height - 4}" '
                   f'text-anchor="middle" fill="#1f2933">{X_TITLE}</text>')
        yc = y0p + ph / 2
        out.append(f'<text class="y-title" x="{ox + 12}" y="{yc:.1f}" text-anchor="middle" '
                   f'transform="rotate(-90 {ox + 12} {yc:.1f})" fill="#1f2933">'
                   f'{esc(name)}</text>')
        out.append(f'<path d="M{x0p} {y0p}V{y0p + ph}H{x0p + pw}" fill="none" '
                   f'stroke="#9aa5b1"/>')
        if not allp:
            out.append("</g>")
            continue
        xs, ys = [p[0] for p in allp], [p[1] for p in allp]
        xlo, xhi, ylo, yhi = min(xs), max(xs), min(ys), max(ys)
        if xhi == xlo:
            xhi = xlo + 1
        if yhi == ylo:
            ylo, yhi = ylo - 0.5, yhi + 0.5

        def sx(x, xlo=xlo, xhi=xhi, x0p=x0p, pw=pw):
            return x0p + (x - xlo) / (xhi - xlo) * pw

        def sy(y, ylo=ylo, yhi=yhi, y0p=y0p, ph=ph):   # halves: finite even for ±1e308
            return y0p + (1 - (y * 0.5 - ylo * 0.5) / (yhi * 0.5 - ylo * 0.5)) * ph

        for t in _nice_ticks(ylo, yhi):
            out.append(f'<line x1="{x0p}" x2="{x0p + pw}" y1="{sy(t):.1f}" y2="{sy(t):.1f}" '
                       f'stroke="#e4e7eb"/>')
            out.append(f'<text x="{x0p - 4}" y="{sy(t) + 3:.1f}" text-anchor="end" '
                       f'fill="#52606d">{_tick_label(t)}</text>')
        for t in _nice_ticks(xlo, xhi):
            out.append(f'<text x="{sx(t):.1f}" y="{y0p + ph + 12}" text-anchor="middle" '
                       f'fill="#52606d">{_tick_label(t)}</text>')
        if pts["train"]:
            d = " ".join(f"{'M' if j == 0 else 'L'}{sx(x):.1f} {sy(y):.1f}"
                         for j, (x, y) in enumerate(pts["train"]))
            out.append(f'<path class="train" d="{d}" fill="none" stroke="{TRAIN_COLOUR}" '
                       f'stroke-width="1.6"/>')
        for x, y in pts["val"]:
            out.append(f'<circle class="val" cx="{sx(x):.1f}" cy="{sy(y):.1f}" r="2.5" '
                       f'fill="{VAL_COLOUR}"/>')
        lx = ox + panel_width - R
        if pts["val"]:
            out.append(f'<text x="{lx}" y="{oy + 14}" text-anchor="end" '
                       f'fill="{VAL_COLOUR}">● val</text>')
            lx -= 40
        if pts["train"]:
            out.append(f'<text x="{lx}" y="{oy + 14}" text-anchor="end" '
                       f'fill="{TRAIN_COLOUR}">— train</text>')
        out.append("</g>")
    out.append("</svg>")
    return "\n".join(out)


class TrainingMonitor:
    """Live training progress. ``update(step=, loss=, metrics=, phase="train"|"val")``.

    Parameters: ``total`` steps (for the bar and ETA; optional), ``title``, ``display``
    (None: widget in a notebook, text elsewhere; False: no output; "text": force the text
    bar), ``stream`` for the text bar (default stderr), ``stop_on_interrupt`` (default True:
    see module docs).
    """

    def __init__(self, total: int | None = None, *, title: str = "training", display=None,
                 stream=None, stop_on_interrupt: bool = True):
        self.total = int(total) if total else None
        self.title = title
        self.history: dict = {"train": {"step": [], "loss": []}, "val": {"step": [], "loss": []}}
        self.step = 0
        self._t0 = None
        self._t_end = None
        self._stop = False
        self.stop_reason = ""
        self.finished = False
        self._stream = stream
        self._last_push = 0.0
        self._last_text = 0.0
        self._text_len = 0
        self._old_sigint = None
        self._sigint_count = 0
        self._stop_on_interrupt = stop_on_interrupt
        self.widget = None
        self._display = None            # the DisplayHandle of the widget's output
        mode = display
        if mode is None:
            mode = "widget" if in_notebook() else "text"
        if mode == "widget":
            try:
                self.widget = _MonitorWidget(title=title, total=self.total or 0,
                                             kernel_id=_kernel_id())
                self.widget.observe(self._on_widget_stop, names="stop_requested")
            except Exception:           # no widget machinery: fall back to text
                mode = "text"
        self.mode = mode or "none"
        self._shown = False

    # ------------------------------------------------------------------ lifecycle
    def __enter__(self) -> TrainingMonitor:
        self.start()
        return self

    def __exit__(self, exc_type, exc, tb) -> bool:
        if exc_type is KeyboardInterrupt and not self.stop_reason:
            self.stop_reason = "interrupted"
        self.close()
        return False

    def start(self) -> None:
        if self._t0 is None:
            self._t0 = time.perf_counter()
        self._show()
        self._arm()

    def _show(self) -> None:
        if self._shown:
            return
        self._shown = True
        if self.widget is not None:
            try:
                from IPython.display import display
            except Exception:
                self.mode, self.widget = "text", None
                return
            try:
                # shown through _repr_mimebundle_ (widget view + text; the curves once there
                # are some) with a display id, so close() can add the final static picture
                self._display = display(self, display_id=True)
            except Exception:
                try:            # a display hook without display ids: the widget alone
                    display(self)
                except Exception:
                    self.mode, self.widget = "text", None

    def _arm(self) -> None:
        """Catch the first SIGINT as a stop request (main thread of a kernel only)."""
        if (not self._stop_on_interrupt or self.widget is None or self._old_sigint is not None
                or threading.current_thread() is not threading.main_thread()):
            return
        try:
            self._old_sigint = signal.signal(signal.SIGINT, self._on_sigint)
            self.widget.sigint_armed = True
        except (ValueError, OSError):
            self._old_sigint = None

    def _disarm(self) -> None:
        if self._old_sigint is not None:
            try:
                signal.signal(signal.SIGINT, self._old_sigint)
            except (ValueError, OSError):
                pass
            self._old_sigint = None
        if self.widget is not None:
            self.widget.sigint_armed = False

    def _on_sigint(self, signum, frame) -> None:
        self._sigint_count += 1
        if self._sigint_count > 1:
            self._disarm()
            raise KeyboardInterrupt
        self.stop("stop requested")

    def _on_widget_stop(self, change) -> None:
        if change["new"]:
            self.stop("stop requested")

    def stop(self, reason: str = "stopped") -> None:
        """Ask the training loop to stop (what the Stop button does)."""
        self._stop = True
        if not self.stop_reason:
            self.stop_reason = reason
        if self.widget is not None:
            self.widget.stopping = True

    @property
    def should_stop(self) -> bool:
        """True once Stop was pressed (or ``stop()`` called); check it between batches."""
        if self.widget is not None and self.widget.stop_requested:
            self._stop = True
            self.stop_reason = self.stop_reason or "stop requested"
        return self._stop

    # ------------------------------------------------------------------ updates
    def update(self, step: int | None = None, loss=None, metrics: dict | None = None,
               phase: str = "train", **more) -> None:
        """Record one point. ``step`` defaults to the next train step (val points use the
        current step). Extra keyword arguments are treated as metrics."""
        if phase not in ("train", "val"):
            raise ValueError(f"phase must be 'train' or 'val', got {phase!r}")
        if self._t0 is None:
            self.start()
        if step is None:
            step = self.step + 1 if phase == "train" else self.step
        step = int(step)
        if phase == "train":
            self.step = max(self.step, step)
        h = self.history[phase]
        vals = dict(metrics or {})
        vals.update(more)
        if loss is not None:
            vals = {"loss": loss, **vals}
        h["step"].append(step)
        for k in set(h) - {"step"} | set(vals):
            h.setdefault(k, [None] * (len(h["step"]) - 1))
            h[k].append(_scalar(vals.get(k)))
        now = time.perf_counter()
        force = phase == "val" or (self.total is not None and self.step >= self.total)
        if self.mode == "widget" and self.widget is not None:
            if force or now - self._last_push >= PUSH_INTERVAL:
                self._push(now)
        elif self.mode == "text":
            self._text(now, force)

    def fit_callback(self, epoch: int, logs: dict) -> bool:
        """For ``workbench.training.fit(..., callback=monitor.fit_callback)``: one train and
        one val point per epoch; returns False (stop) once Stop was pressed.

        >>> with TrainingMonitor(total=epochs) as mon:                  # doctest: +SKIP
        ...     fit(model, x, y, epochs=epochs, callback=mon.fit_callback)
        """
        step = epoch + 1
        train = {k: v for k, v in logs.items() if not k.startswith("val_") and k != "time"}
        val = {k[4:]: v for k, v in logs.items() if k.startswith("val_")}
        self.update(step=step, **train)
        if val:
            self.update(step=step, phase="val", **val)
        return not self.should_stop

    # ------------------------------------------------------------------ derived numbers
    @property
    def elapsed(self) -> float:
        if self._t0 is None:
            return 0.0
        return (self._t_end or time.perf_counter()) - self._t0

    @property
    def eta(self) -> float | None:
        if not self.total or not self.step or self.finished:
            return None
        rate = self.elapsed / self.step
        return max(0.0, (self.total - self.step) * rate)

    def _latest(self, phase: str) -> dict:
        h = self.history[phase]
        out = {}
        for k, vs in h.items():
            if k == "step":
                continue
            for v in reversed(vs):
                if v is not None:
                    out[k] = v
                    break
        return out

    def _series(self) -> dict:
        series = {}
        for phase in ("train", "val"):
            h = self.history[phase]
            for k, vs in h.items():
                if k == "step":
                    continue
                n = len(vs)
                stride = max(1, math.ceil(n / MAX_POINTS))
                idx = list(range(0, n, stride))
                if n and idx[-1] != n - 1:
                    idx.append(n - 1)
                steps = h["step"]
                pts = [[steps[i], vs[i]] for i in idx if vs[i] is not None]
                series.setdefault(k, {})[phase] = pts
        return series

    def _push(self, now: float) -> None:
        self._last_push = now
        w = self.widget
        with w.hold_sync():
            w.step = self.step
            w.total = self.total or 0
            w.elapsed = self.elapsed
            w.eta = -1.0 if self.eta is None else self.eta
            w.series = self._series()
            w.latest = {"train": self._latest("train"), "val": self._latest("val")}

    # ------------------------------------------------------------------ text fallback
    def _out(self):
        return self._stream or sys.stderr

    def _text_line(self) -> str:
        parts = []
        if self.total:
            frac = min(1.0, self.step / self.total)
            n = 24
            bar = "#" * int(frac * n) + "." * (n - int(frac * n))
            parts.append(f"[{bar}] {frac * 100:5.1f}% {self.step}/{self.total}")
        else:
            parts.append(f"step {self.step}")
        for phase, tag in (("train", ""), ("val", "val_")):
            for k, v in self._latest(phase).items():
                parts.append(f"{tag}{k} {_fmt_val(v)}")
        parts.append(f"{_fmt_time(self.elapsed)} elapsed")
        if self.eta is not None:
            parts.append(f"ETA {_fmt_time(self.eta)}")
        return f"{self.title}: " + " | ".join(parts)

    def _text(self, now: float, force: bool) -> None:
        out = self._out()
        tty = _isatty(out)
        interval = 0.1 if tty else 5.0
        if not force and now - self._last_text < interval:
            return
        self._last_text = now
        line = self._text_line()
        try:
            if tty:
                pad = max(0, self._text_len - len(line))
                out.write("\r" + line + " " * pad)
                self._text_len = len(line)
            else:
                out.write(line + "\n")
            out.flush()
        except (OSError, ValueError):
            self.mode = "none"        # a closed stream must not break training

    # ------------------------------------------------------------------ end
    def summary(self) -> str:
        lines = [f"{self.title}: {self.step} step(s) in {_fmt_time(self.elapsed)}"
                 + (f" of {self.total}" if self.total else "")
                 + (f" — {self.stop_reason}" if self.stop_reason else "")]
        tr = self._latest("train")
        if tr:
            lines.append("final train: " + ", ".join(f"{k} {_fmt_val(v)}" for k, v in tr.items()))
        hv = self.history["val"]
        if hv["step"]:
            va = self._latest("val")
            lines.append("final val: " + ", ".join(f"{k} {_fmt_val(v)}" for k, v in va.items()))
            losses = [(v, s) for s, v in zip(hv["step"], hv.get("loss", [])) if v is not None]
            if losses:
                best, at = min(losses)
                lines.append(f"best val loss {_fmt_val(best)} at step {at}")
        return "\n".join(lines)

    def close(self) -> None:
        """End the run: final update, summary, interrupt handling restored."""
        if self.finished:
            return
        if self._t0 is None:
            self._t0 = time.perf_counter()
        self._t_end = time.perf_counter()
        self._disarm()
        self.finished = True
        text = self.summary()
        if self.mode == "widget" and self.widget is not None:
            self._push(time.perf_counter())
            self.widget.summary = text
            self.widget.done = True
            if self._display is not None:
                try:      # the saved output gets the final curves as a picture
                    self._display.update(self)
                except Exception:
                    pass
        elif self.mode == "text":
            out = self._out()
            try:
                if _isatty(out):
                    out.write("\r" + self._text_line() + " " * 4 + "\n")
                out.write(text + "\n")
                out.flush()
            except (OSError, ValueError):
                pass

    finish = close

    def __repr__(self) -> str:
        state = "done" if self.finished else ("stopping" if self._stop else "running")
        return f"TrainingMonitor({self.title!r}, {state}, step {self.step}" + \
            (f"/{self.total}" if self.total else "") + f", {self.mode})"

    def _repr_pretty_(self, p, cycle) -> None:
        p.text(self.summary() if self.finished else repr(self))

    def curves_svg(self) -> str:
        """The curves recorded so far as an SVG document (see :func:`curves_svg`)."""
        # the final values (the summary without its first line, which holds the duration)
        note = "; ".join(self.summary().splitlines()[1:]) if self.finished else ""
        return curves_svg(self._series(), self.title, note=note)

    def _has_points(self) -> bool:
        return any(len(v) for h in self.history.values() for k, v in h.items() if k != "step")

    def _repr_mimebundle_(self, **kwargs):
        text = self.summary() if self.finished else repr(self)
        data, metadata = {}, {}
        if self.widget is not None and in_notebook():
            self._shown = True
            got = self.widget._repr_mimebundle_(**kwargs)
            if isinstance(got, tuple):          # anywidget answers (data, metadata)
                got, metadata = got[0], dict(got[1] or {})
            data = dict(got) if isinstance(got, dict) else {}
        data["text/plain"] = text              # not the widget object's default repr
        # the static picture next to the widget view: shown where no widget can render
        if self._has_points():
            data["image/svg+xml"] = self.curves_svg()
        return (data, metadata) if metadata else data


# --------------------------------------------------------------------------- data-parallel jobs
class DistMonitor:
    """Training progress of a data-parallel job (``opt.DistOpt``): a :class:`TrainingMonitor`
    on rank 0; the other ranks record nothing and show nothing. Every ``update`` adds
    ``samples_per_s``: the global throughput (``batch_size`` x ``world_size`` samples per
    step over the time since the first update).
    Curves are rank 0's own (its local loss and metrics) unless the caller all-reduces them.
    """

    def __init__(self, comm_or_opt, batch_size: int, total: int | None = None, **kwargs):
        self.world_size = int(comm_or_opt.world_size)
        self.rank = int(comm_or_opt.global_rank)
        self.batch_size = int(batch_size)
        self.samples = 0
        self._t0 = None
        self.monitor = None
        if self.rank == 0:
            kwargs.setdefault("title", f"training on {self.world_size} process(es)")
            self.monitor = TrainingMonitor(total=total, **kwargs)

    @property
    def samples_per_s(self) -> float | None:
        if self._t0 is None or self.samples == 0:
            return None
        dt = time.perf_counter() - self._t0
        return self.samples / dt if dt > 0 else None

    def update(self, step=None, loss=None, metrics=None, phase: str = "train", **more):
        now = time.perf_counter()
        if phase == "train":
            if self._t0 is None:
                # the first step's samples are timed from its end: throughput counts the
                # steps after it (the first step includes warm-up)
                self._t0 = now
            else:
                self.samples += self.batch_size * self.world_size
        if self.monitor is None:
            return
        m = dict(metrics or {})
        if phase == "train" and self.samples_per_s is not None:
            m["samples_per_s"] = self.samples_per_s
        self.monitor.update(step=step, loss=loss, metrics=m, phase=phase, **more)

    @property
    def should_stop(self) -> bool:
        return bool(self.monitor is not None and self.monitor.should_stop)

    @property
    def history(self) -> dict | None:
        return self.monitor.history if self.monitor is not None else None

    def close(self) -> None:
        if self.monitor is not None:
            self.monitor.close()

    def __enter__(self):
        if self.monitor is not None:
            self.monitor.start()
        return self

    def __exit__(self, *exc):
        if self.monitor is not None:
            return self.monitor.__exit__(*exc)
        return False


def _make_widget_class():
    from workbench.widgets._base import esm, import_widgets
    anywidget, _ipywidgets, traitlets = import_widgets()

    class MonitorWidget(anywidget.AnyWidget):
        _esm = esm("graph_core.js", "training_monitor.js")
        title = traitlets.Unicode("").tag(sync=True)
        total = traitlets.Int(0).tag(sync=True)
        step = traitlets.Int(0).tag(sync=True)
        elapsed = traitlets.Float(0.0).tag(sync=True)
        eta = traitlets.Float(-1.0).tag(sync=True)
        series = traitlets.Dict().tag(sync=True)
        latest = traitlets.Dict().tag(sync=True)
        stop_requested = traitlets.Bool(False).tag(sync=True)
        stopping = traitlets.Bool(False).tag(sync=True)
        sigint_armed = traitlets.Bool(False).tag(sync=True)
        kernel_id = traitlets.Unicode("").tag(sync=True)
        done = traitlets.Bool(False).tag(sync=True)
        summary = traitlets.Unicode("").tag(sync=True)

    return MonitorWidget


class _LazyWidget:
    cls = None

    def __call__(self, **kw):
        if _LazyWidget.cls is None:
            _LazyWidget.cls = _make_widget_class()
        return _LazyWidget.cls(**kw)


_MonitorWidget = _LazyWidget()
