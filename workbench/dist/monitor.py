"""Training progress in a data-parallel job: rank 0's curves with the global throughput."""

from __future__ import annotations

import time


class DistMonitor:
    """Wraps :class:`workbench.widgets.TrainingMonitor` on rank 0; the other ranks record
    nothing and show nothing. Every ``update`` adds ``samples_per_s``: the global throughput
    (``batch_size`` x ``world_size`` samples per step over the time since the first update).
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
            from workbench.widgets.monitor import TrainingMonitor  # noqa: PLC0415
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
