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

MAX_POINTS = 600            # per series sent to the browser (older points thinned out)
PUSH_INTERVAL = 0.2         # seconds between browser updates while training


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
                display(self.widget)
            except Exception:
                self.mode = "text"
                self.widget = None

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

    def _repr_mimebundle_(self, **kwargs):
        if self.widget is not None and in_notebook():
            self._shown = True
            data = self.widget._repr_mimebundle_(**kwargs)
            if isinstance(data, dict):
                data["text/plain"] = repr(self)
            return data
        return {"text/plain": self.summary() if self.finished else repr(self)}


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
