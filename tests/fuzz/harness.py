"""Runs fuzz cases in a small pool of long-lived worker processes.

Each worker (:mod:`tests.fuzz.worker`) runs in its own session with an address-space limit; a
case that does not answer within the timeout is a ``hang`` (the worker's whole process group
is killed and the worker restarted), a worker that dies during a case is a ``crash`` (by a
signal, or an exit status). Workers are restarted after a crash, a hang and a ``memory`` case.

    with Pool(workers=2) as pool:
        results = pool.run([(case, "ours"), (case, "ort")])
"""

from __future__ import annotations

import os
import pickle
import select
import shutil
import signal
import struct
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

DEFAULT_TIMEOUT = 20.0
DEFAULT_MEMORY_LIMIT = 3 * 2**30        # RLIMIT_AS of a worker
DEFAULT_BUDGET = "1GiB"                 # the engine's memory budget for one value
DEFAULT_MAX_LOOP = 100_000              # the engine's Loop/Scan ceiling inside the fuzzer
STARTUP_TIMEOUT = 120.0

OUR_CLASSES = ["ok", "clean", "uncaught", "crash", "hang", "memory", "leak"]
ORT_CLASSES = ["ok", "refused", "crash", "hang", "memory", "leak"]
FAILURES = {"uncaught", "crash", "hang", "memory", "leak"}


def _signal_name(rc: int) -> str:
    try:
        return signal.Signals(-rc).name
    except ValueError:
        return f"signal {-rc}"


class _Worker:
    def __init__(self, env: dict, ort: bool):
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tests.fuzz.worker"], cwd=str(ROOT), env=env,
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, bufsize=0,
            stderr=None if os.environ.get("WBFUZZ_VERBOSE") else subprocess.DEVNULL,
            start_new_session=True)
        self.ready = False
        self.dirs: list[str] = []   # the worker's temporary folders, removed after a kill
        self.job = None          # (index, case, mode)
        self.deadline = time.monotonic() + STARTUP_TIMEOUT
        self.started = time.monotonic()

    @property
    def fd(self):
        return self.proc.stdout.fileno()

    def send(self, job, timeout):
        self.job = job
        data = pickle.dumps({"case": job[1], "mode": job[2]}, protocol=pickle.HIGHEST_PROTOCOL)
        self.started = time.monotonic()
        self.deadline = self.started + timeout
        try:
            self.proc.stdin.write(struct.pack("<Q", len(data)) + data)
            self.proc.stdin.flush()
        except (BrokenPipeError, OSError):
            pass   # the worker died; its EOF is seen by the reader

    def _read_exact(self, n: int) -> bytes | None:
        buf = bytearray()
        while len(buf) < n:
            chunk = self.proc.stdout.read(n - len(buf))
            if not chunk:
                return None
            buf += chunk
        return bytes(buf)

    def read(self):
        head = self._read_exact(8)
        if head is None:
            return None
        data = self._read_exact(struct.unpack("<Q", head)[0])
        if data is None:
            return None
        return pickle.loads(data)  # noqa: S301 - our own worker

    def kill(self, grace: float = 0.0):
        """End the worker: after ``grace`` seconds for a worker that exits by itself, its whole
        process group (the engine's helper process too) is killed; its folders removed."""
        if grace:
            try:
                self.proc.stdin.close()
                self.proc.wait(timeout=grace)
            except (OSError, subprocess.TimeoutExpired):
                pass
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass
        for f in (self.proc.stdin, self.proc.stdout):
            try:
                f.close()
            except OSError:
                pass
        for d in self.dirs:
            shutil.rmtree(d, ignore_errors=True)

    def exit_status(self) -> int | None:
        try:
            return self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            return None


class Pool:
    def __init__(self, workers: int = 2, timeout: float = DEFAULT_TIMEOUT,
                 memory_limit: int = DEFAULT_MEMORY_LIMIT, budget: str = DEFAULT_BUDGET,
                 max_loop_iterations: int = DEFAULT_MAX_LOOP, ort: bool = False):
        self.n = max(1, workers)
        self.timeout = timeout
        env = dict(os.environ)
        env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
        env["WBFUZZ_MEMORY_LIMIT"] = str(int(memory_limit))
        env["WORKBENCH_MEMORY_BUDGET"] = str(budget)
        env["WORKBENCH_MAX_LOOP_ITERATIONS"] = str(int(max_loop_iterations))
        env["WORKBENCH_SHAPE_INFERENCE_TIMEOUT"] = str(max(1, int(timeout * 0.75)))
        env.setdefault("OMP_NUM_THREADS", "1")
        env.setdefault("OPENBLAS_NUM_THREADS", "1")
        env.setdefault("MKL_NUM_THREADS", "1")
        env["PYTHONWARNINGS"] = "ignore"
        self.env = env
        self.ort = ort
        self.workers: list[_Worker] = []
        self.restarts = 0
        self.failed_starts = 0

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def close(self):
        for w in self.workers:
            try:
                w.proc.stdin.close()
            except OSError:
                pass
        for w in self.workers:
            try:
                w.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass
            w.kill()
        self.workers = []

    def _start(self) -> _Worker:
        return _Worker(self.env, self.ort)

    def _replace(self, w: _Worker, grace: float = 0.0):
        w.kill(grace)
        self.restarts += 1
        nw = self._start()
        self.workers[self.workers.index(w)] = nw

    def run(self, jobs, progress=None) -> list[dict]:
        """Results for ``jobs`` [(case, mode)], in order. ``progress(done, total, result)``."""
        jobs = list(jobs)
        results: list = [None] * len(jobs)
        while len(self.workers) < min(self.n, max(1, len(jobs))):
            self.workers.append(self._start())
        queue = list(range(len(jobs)))[::-1]
        done = 0

        def finish(w, res):
            nonlocal done
            i = w.job[0]
            res.setdefault("seconds", round(time.monotonic() - w.started, 4))
            results[i] = res
            w.job = None
            done += 1
            if progress:
                progress(done, len(jobs), jobs[i][0], jobs[i][1], res)

        while done < len(jobs):
            for w in self.workers:
                if w.ready and w.job is None and queue:
                    i = queue.pop()
                    w.send((i, *jobs[i]), self.timeout)
            busy = [w for w in self.workers if not w.ready or w.job is not None]
            if not busy:
                break
            now = time.monotonic()
            wait = max(0.0, min(w.deadline for w in busy) - now)
            readable, _, _ = select.select([w.fd for w in busy], [], [], wait)
            now = time.monotonic()
            for w in list(busy):
                if w.fd in readable:
                    msg = w.read()
                    if msg is None:   # the worker died
                        rc = w.exit_status()
                        if w.job is not None:
                            how = _signal_name(rc) if rc is not None and rc < 0 else f"exit {rc}"
                            finish(w, {"cls": "crash", "message": f"worker died: {how}",
                                       "error_type": how})
                        if not w.ready:
                            # a worker that cannot even start: give up rather than spin
                            self.failed_starts += 1
                            if self.failed_starts >= 3:
                                raise RuntimeError(f"fuzz worker fails to start (exit {rc}); "
                                                   f"run with WBFUZZ_VERBOSE=1 to see why")
                        self._replace(w)
                        continue
                    if msg.get("ready"):
                        w.ready = True
                        w.dirs = list(msg.get("dirs", []))
                        self.failed_starts = 0
                        continue
                    exit_after = msg.pop("exit", False)
                    finish(w, msg)
                    if exit_after:
                        self._replace(w, grace=5.0)
                elif now >= w.deadline:
                    if w.job is not None:
                        finish(w, {"cls": "hang",
                                   "message": f"no answer in {self.timeout:g} s",
                                   "seconds": round(now - w.started, 2)})
                    self._replace(w)
        return results
