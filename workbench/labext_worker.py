"""The ONNX Graph viewer's work, done away from the Jupyter server's event loop.

A model shown in JupyterLab is a file from anyone. Reading it and preparing its drawing
(:func:`graph_response`) runs in worker processes, never in the server process, so that no
file can starve other requests or the rest of JupyterLab:

- **structure only**: a worker loads with ``load(path, check=False, weights=False)``; big
  initializers and external data are described (dtype, shape, where the bytes are), never
  read, and ``onnx.checker`` runs on the same structure in the worker's checker helper;
- **a time budget per request** (``WORKBENCH_VIEWER_TIMEOUT``, seconds, default 60): when it
  runs out, the worker's process group (the worker and its checker helper) is killed, the
  answer says so, and a fresh worker serves the next request; ``RLIMIT_CPU`` stops a worker
  that the server could not (a backstop);
- **below the server**: workers run at a lower priority (``nice`` 10), so the server and the
  user's kernels come first when the machine is busy;
- **a memory budget per worker** (``WORKBENCH_VIEWER_MEMORY``, default 2 GiB, a size such as
  ``4GiB``): its address space is limited (``RLIMIT_AS``; its checker helper inherits the
  limit); running out is answered as running out of memory, not as a malformed model; a
  worker whose peak resident memory passed a quarter of the budget ends after answering,
  giving the memory back to the system;
- **a small concurrency limit** (``WORKBENCH_VIEWER_WORKERS``, default 2 workers, started
  when the viewer is first used, the second in the background, and ended after 10 idle
  minutes): more requests wait in line, at most ``WORKBENCH_VIEWER_QUEUE`` (default 16) of
  them, beyond which the answer is 503 (busy); identical requests in flight (same file, size
  and modification time) share one job, and an answer that ran out of time or memory is
  remembered for that version of the file, so a hostile file costs its budget once, not once
  per reload.

Error messages name the file relative to the server's root (never an absolute server path).

The worker side is :func:`main` (``python -m workbench.labext_worker``): it reads requests on
stdin and answers on stdout (length-prefixed JSON). The server side is :class:`ViewerPool`.
"""

from __future__ import annotations

import asyncio
import collections
import io
import json
import os
import re
import signal
import struct
import subprocess
import sys
import tempfile
import threading
import time
import warnings
from concurrent.futures import ThreadPoolExecutor

SOURCE = "onnx-workbench"
DEFAULT_TIMEOUT = 60.0
DEFAULT_MEMORY = 2 * 2**30
DEFAULT_WORKERS = 2
DEFAULT_QUEUE = 16
#: a worker whose peak resident memory passed this fraction of its budget is replaced
RECYCLE_FRACTION = 0.25
#: idle workers end after this many seconds
IDLE_SECONDS = 600.0
#: remembered out-of-budget answers (per file version)
FAILURES_KEPT = 64


class GraphRequestError(Exception):
    """A request the handler refuses: HTTP status, a short title and a message for people."""

    def __init__(self, status: int, title: str, message: str):
        super().__init__(message)
        self.status = status
        self.title = title


def error_body(status: int, title: str, message: str, path: str) -> bytes:
    return json.dumps({"source": SOURCE, "error": message, "message": message,
                       "title": title, "path": path, "status": status}).encode("utf-8")


def scrub(text: str, root: str | None, full: str | None = None, path: str | None = None) -> str:
    """``text`` with the server's absolute paths made relative to its root: the model's
    absolute path becomes its contents path, anything else under the root its relative
    path, the root itself ``.``."""
    if full and path is not None:
        text = text.replace(full, path)
    if root:
        for r in {root, os.path.realpath(root)}:
            r = r.rstrip(os.sep)
            if r:                                 # a server rooted at "/" has nothing to hide
                text = text.replace(r + os.sep, "")
                text = re.sub(re.escape(r) + r"(?![\w.-])", ".", text)
    return text


def resolve_path(root_dir: str, path: str) -> str:
    """The absolute, symlink-free file for contents path ``path`` under ``root_dir``; raises
    :class:`GraphRequestError` (403) when it lies outside ``root_dir``."""
    if "\x00" in path:
        raise GraphRequestError(400, "Bad path",
                                f"{path!r}: a file name cannot contain a NUL character")
    root = os.path.realpath(root_dir)
    rel = path.replace("\\", "/").strip("/")
    full = os.path.realpath(os.path.join(root, *rel.split("/"))) if rel else root
    try:
        inside = os.path.commonpath([root, full]) == root
    except ValueError:               # another drive (Windows)
        inside = False
    if not inside or os.path.isabs(rel) or (os.path.splitdrive(rel)[0] != ""):
        raise GraphRequestError(403, "Access refused",
                                f"{path}: the path points outside the server's root folder; "
                                f"only files under the Jupyter server's root can be shown")
    return full


# ----------------------------------------------------------------------------- the work
def model_summary(loaded, path: str) -> dict:
    """The header of the viewer: the facts ``workbench info`` prints, as JSON."""
    from workbench.cli import _dtype_str, _shape_str, describe
    from workbench.graph.external import UnreadTensor

    g, p = loaded.graph, loaded.proto
    facts = describe(loaded, out=io.StringIO())
    missing = sorted(facts["missing"].items())
    unread = [a for a in g.initializers.values() if isinstance(a, UnreadTensor)]
    return {
        "file": os.path.basename(path),
        "path": path,
        "producer": f"{p.producer_name} {p.producer_version}".strip(),
        "ir_version": int(p.ir_version),
        "model_version": int(p.model_version),
        "graph_name": g.name or "",
        "doc": (p.doc_string or g.doc_string or "").strip()[:500],
        "opsets": [{"domain": d or "ai.onnx", "version": int(v)}
                   for d, v in sorted(g.opsets.items())],
        "inputs": [{"name": v.name, "dtype": _dtype_str(v), "shape": _shape_str(v.shape)}
                   for v in g.inputs],
        "outputs": [{"name": v.name, "dtype": _dtype_str(v), "shape": _shape_str(v.shape)}
                    for v in g.outputs],
        "nodes": len(g.nodes),
        "nodes_total": int(sum(facts["histogram"].values())),
        "op_types": len(facts["histogram"]),
        "parameters": int(facts["parameters"]),
        "initializers": len(g.initializers),
        "not_read": {"tensors": len(unread), "bytes": int(sum(a.nbytes for a in unread))},
        "metadata": [{"key": e.key, "value": e.value[:300]} for e in p.metadata_props][:20],
        "missing": [{"op": op, "count": int(c)} for op, c in missing],
        "checker": None,
        "warnings": [],
    }


def graph_response(full: str, path: str, root: str | None = None) -> dict:
    """Load ``full`` (shown to people as ``path``) and build the JSON answer: its structure
    only (weights described, not read). Raises :class:`GraphRequestError` for files that
    cannot be shown; messages name files relative to ``root``."""
    from workbench.errors import ModelLoadError, WorkbenchError
    from workbench.graph.load import check_and_infer, load
    from workbench.widgets.graph_data import Details, build_drawing, graph_payload

    def fail(status, title, msg):
        return GraphRequestError(status, title, scrub(msg, root, full, path))

    if not os.path.exists(full):
        raise fail(404, "File not found", f"{path}: file not found")
    if os.path.isdir(full):
        raise fail(400, "Not a model file", f"{path}: is a folder, not an .onnx file")
    t0 = time.perf_counter()
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            loaded = load(full, check=False, weights=False)
    except ModelLoadError as e:
        raise fail(422, "Cannot read this model", str(e)) from None
    except WorkbenchError as e:
        raise fail(422, "Cannot read this model", f"{path}: {e}") from None
    except OSError as e:
        raise fail(400, "Cannot read this file", f"{path}: {e.strerror or e}") from None
    t1 = time.perf_counter()
    summary = model_summary(loaded, path)
    summary["warnings"] = [scrub(str(w.message), root, full, path) for w in caught][:10]
    try:    # in the helper process: onnx's C++ checker must not crash the worker
        check_and_infer(loaded.proto, check=True, infer=False, path=full, described=True)
    except WorkbenchError as e:      # shown, not fatal: the viewer draws what it can
        lines = str(e).replace("the model fails onnx.checker: ", "").strip().splitlines()
        summary["checker"] = scrub(" | ".join(lines[:4]), root, full, path) or \
            type(e).__name__
    t2 = time.perf_counter()
    builder = build_drawing(loaded.graph)
    graph = graph_payload(loaded.graph, builder=builder)
    t3 = time.perf_counter()
    details = Details(loaded.graph, builder).all()
    t4 = time.perf_counter()
    overlay = static_overlay(loaded, path, summary, root, full)
    t5 = time.perf_counter()
    return {"source": SOURCE, "path": path, "summary": summary, "graph": graph,
            "details": details, "overlay": overlay,
            "timing": {"load_s": round(t1 - t0, 4), "summary_s": round(t2 - t1, 4),
                       "graph_s": round(t3 - t2, 4), "details_s": round(t4 - t3, 4),
                       "analysis_s": round(t5 - t4, 4)}}


def _dims_note(a) -> list:
    return [["shapes", "symbolic dims bound to 1 (" + ", ".join(
        f"{k} {'x'.join(str(d) for d in s)}" for k, s in a.input_shapes.items()) + ")"]]


def static_overlay(loaded, path: str, summary: dict, root=None, full=None) -> dict:
    """The analysis overlay the viewer can show without running anything (FLOPs,
    parameters, activation memory, intensity; compute- or memory-bound when this machine's
    peaks are cached), symbolic dims bound to 1; {} (and a warning) when it cannot be made."""
    from workbench.analysis import analyze
    from workbench.analysis.roofline import cached_peaks
    from workbench.errors import WorkbenchError

    try:
        a = analyze(loaded, default_dim=1)
        a.label = path                       # never the server's absolute path
        peaks = cached_peaks()
        if peaks is not None:
            a.roofline(peaks)
        ov = a.overlay()                     # FLOPs when the model has any, else what it has
    except WorkbenchError as e:
        summary["warnings"].append(scrub(f"analysis: {e}", root, full, path)[:500])
        return {}
    except Exception as e:  # noqa: BLE001 - the overlay is optional: never fail the drawing
        summary["warnings"].append(scrub(f"analysis failed ({type(e).__name__}: {e}); the "
                                         f"drawing is shown without its overlay",
                                         root, full, path)[:500])
        return {}
    ov["summary"] = ov["summary"][:2] + _dims_note(a) + ov["summary"][2:]
    if peaks is None:
        ov["summary"].append(["roofline", "this machine's peaks are not measured yet: press "
                                          "Measure (or run `workbench profile --roofline`)"])
    return ov


def measure_response(full: str, path: str, root: str | None = None) -> dict:
    """The viewer's Measure: the model read with its weights and run (symbolic dims bound
    to 1): our per-node times, onnxruntime's (when installed), the memory over the
    schedule, this machine's roofline; answered as an analysis overlay."""
    from workbench.analysis import analyze
    from workbench.errors import WorkbenchError

    try:
        a = analyze(full, default_dim=1)
    except WorkbenchError as e:
        raise GraphRequestError(422, "Cannot measure this model",
                                scrub(f"{path}: {e}", root, full, path)) from None
    a.label = path
    notes = []
    a.roofline()
    for what, fn in (("our engine", lambda: a.profile_ours(runs=5, warmup=1)),
                     ("onnxruntime", lambda: a.profile_ort(runs=5, warmup=1, threads=1)),
                     ("memory", a.memory)):
        try:
            fn()
        except (WorkbenchError, ImportError) as e:
            notes.append(["not measured", scrub(f"{what}: {e}", root, full, path)[:300]])
    ov = a.overlay()
    ov["summary"] = ov["summary"][:2] + _dims_note(a) + ov["summary"][2:] + notes
    return {"source": SOURCE, "path": path, "overlay": ov}


def _json_default(o):
    if hasattr(o, "item"):          # numpy scalars
        return o.item()
    if hasattr(o, "tolist"):
        return o.tolist()
    return str(o)


def answer(full: str, path: str, root: str | None, measure: bool = False) -> tuple[int, bytes]:
    """(HTTP status, JSON body) for one request; what a worker computes (``measure``: the
    Measure button's run, :func:`measure_response`)."""
    try:
        data = measure_response(full, path, root) if measure else \
            graph_response(full, path, root)
    except GraphRequestError as e:
        return e.status, error_body(e.status, e.title, str(e), path)
    return 200, json.dumps(data, default=_json_default, separators=(",", ":")).encode("utf-8")


# ----------------------------------------------------------------------------- worker side
def _env_float(name: str, default: float) -> float:
    try:
        v = float(os.environ.get(name, ""))
        return v if v > 0 else default
    except ValueError:
        return default


def _env_size(name: str, default: int) -> int:
    from workbench.limits import parse_size
    try:
        v = os.environ.get(name)
        return parse_size(v) if v else default
    except ValueError:
        return default


def _peak_rss() -> int:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def _read_exact(f, n: int) -> bytes | None:
    buf = bytearray()
    while len(buf) < n:
        chunk = f.read(n - len(buf))
        if not chunk:
            return None
        buf += chunk
    return bytes(buf)


def _start_checker() -> None:
    """Start the checker helper now (a tiny model through it), not in the first request."""
    import onnx
    from onnx import helper

    from workbench.graph import isolated
    g = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "warm-up",
                          [helper.make_tensor_value_info("x", 1, [1])],
                          [helper.make_tensor_value_info("y", 1, [1])])
    try:
        isolated.check_and_infer(helper.make_model(g), check=True, infer=True)
    except Exception:  # noqa: BLE001 - the first request will say what is wrong
        pass
    del onnx


def limit_self():
    """A worker's set-up: its address-space limit (``WORKBENCH_VIEWER_WORKER_AS``), a lower
    priority, stdout kept for the protocol, its checker helper in its own process group.
    Returns (request stream, answer stream, the ``resource`` module or None, memory)."""
    memory = int(os.environ.get("WORKBENCH_VIEWER_WORKER_AS", "0"))
    try:
        import resource
        if memory:
            resource.setrlimit(resource.RLIMIT_AS, (memory, memory))
    except (ImportError, ValueError, OSError):
        resource = None
    rd = os.fdopen(0, "rb", buffering=0)
    wr = os.fdopen(1, "wb", buffering=0)
    sys.stdout = sys.stderr                     # stray prints must not break the protocol
    try:        # background work: the server and the user's kernels come first
        os.nice(10)
    except (AttributeError, OSError):
        pass
    from workbench.graph import isolated
    isolated.NEW_SESSION = False    # the checker helper stays in this worker's process group
    return rd, wr, resource, memory


def next_request(rd, resource) -> dict | None:
    """The next request (None at the end of input), with the CPU-time backstop set for it."""
    head = _read_exact(rd, 8)
    if head is None:
        return None
    req = json.loads(_read_exact(rd, struct.unpack("<Q", head)[0]) or b"{}")
    if resource is not None:                # the server's kill is the rule; this, a net
        used = sum(resource.getrusage(resource.RUSAGE_SELF)[:2])
        soft = int(used + 2 * float(req.get("timeout", DEFAULT_TIMEOUT)) + 5)
        try:
            resource.setrlimit(resource.RLIMIT_CPU, (soft, resource.RLIM_INFINITY))
        except (ValueError, OSError):
            pass
    return req


def main() -> None:
    """The worker: limits itself, then answers requests until its input ends."""
    rd, wr, resource, memory = limit_self()
    import workbench.cli  # noqa: F401 - imported before the first request, not during it
    import workbench.graph.load  # noqa: F401
    import workbench.widgets.graph_data  # noqa: F401
    _start_checker()
    wr.write(b"R")
    while True:
        req = next_request(rd, resource)
        if req is None:
            return
        recycle = False
        try:
            status, body = answer(req["full"], req["path"], req.get("root"),
                                  bool(req.get("measure")))
        except MemoryError:
            status, body, recycle = 507, b"", True
        except Exception as e:  # noqa: BLE001 - a bug on our side: say so
            msg = scrub(f"{req.get('path')}: the workbench failed to lay out this model "
                        f"({type(e).__name__}: {e})", req.get("root"), req.get("full"),
                        req.get("path"))
            status, body = 500, error_body(500, "Internal error", msg, req.get("path", ""))
        wr.write(struct.pack("<IQ", status, len(body)) + body)
        body = None
        if recycle or (memory and _peak_rss() > RECYCLE_FRACTION * memory):
            return


# ----------------------------------------------------------------------------- server side
class _Died(Exception):
    def __init__(self, code, peak):
        super().__init__(code)
        self.code, self.peak = code, peak


class _Worker:
    """One worker process (its own session: killing its group also ends its helper)."""

    #: the module run as the worker (``python -m``)
    module = "workbench.labext_worker"

    def __init__(self, memory: int, timeout: float):
        # an empty working folder: `python -m` puts it first on sys.path, and the served
        # folder may hold files named like the modules the worker imports; temporary files
        # (its checker helper's) go there too, removed with it
        self.cwd = tempfile.mkdtemp(prefix=self.module.replace(".", "-") + "-")
        env = dict(os.environ)
        env.update(WORKBENCH_VIEWER_WORKER_AS=str(memory), TMPDIR=self.cwd,
                   WORKBENCH_HELPER_MEMORY=str(memory),
                   WORKBENCH_SHAPE_INFERENCE_TIMEOUT=str(max(1.0, timeout)),
                   WORKBENCH_MEMORY_BUDGET=str(memory // 2),
                   OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
        self.memory = memory
        self.proc = subprocess.Popen(
            [sys.executable, "-m", self.module], stdin=subprocess.PIPE,
            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env, cwd=self.cwd,
            close_fds=True, start_new_session=(os.name == "posix"))
        self.idle_since = time.monotonic()
        if self._read(1, time.monotonic() + 120) != b"R":
            self.kill()
            raise OSError("the viewer's worker process did not start")

    def _read(self, n: int, deadline: float) -> bytes | None:
        from workbench.graph.isolated import read_exactly
        return read_exactly(self.proc.stdout.fileno(), n, deadline)

    def request(self, full: str, path: str, root: str, timeout: float,
                measure: bool = False) -> tuple[int, bytes]:
        return self.call({"full": full, "path": path, "root": root, "timeout": timeout,
                          "measure": measure}, timeout, parts=1)

    def call(self, req: dict, timeout: float, parts: int = 1) -> tuple:
        """Send ``req``; the answer is (status, ``parts`` byte strings). Raises TimeoutError
        (the caller kills the worker) or :class:`_Died`."""
        deadline = time.monotonic() + timeout
        msg = json.dumps(req).encode("utf-8")
        try:
            self.proc.stdin.write(struct.pack("<Q", len(msg)) + msg)
            self.proc.stdin.flush()
            head = self._read(4 + 8 * parts, deadline)
            if head is not None:
                status, *sizes = struct.unpack("<I" + "Q" * parts, head)
                out = []
                for n in sizes:
                    part = self._read(n, deadline)
                    if part is None:
                        break
                    out.append(part)
                if len(out) == parts:
                    return (status, *out)
        except TimeoutError:              # (an OSError too): the caller kills the worker
            raise
        except OSError:                   # a broken pipe: the worker is gone
            pass
        from workbench.graph.isolated import reap
        code, peak = reap(self.proc)
        self.kill()
        raise _Died(code, peak)

    def alive(self) -> bool:
        return self.proc.poll() is None

    def kill(self) -> None:
        p = self.proc
        if p.poll() is None:
            try:
                if os.name == "posix":
                    os.killpg(p.pid, signal.SIGKILL)      # the worker and its helper
                else:
                    p.kill()
            except (ProcessLookupError, PermissionError, OSError):
                pass
        try:
            p.wait(timeout=10)
        except Exception:  # noqa: BLE001
            pass
        for f in (p.stdin, p.stdout):
            try:
                f.close()
            except OSError:
                pass
        if self.cwd:
            import shutil
            shutil.rmtree(self.cwd, ignore_errors=True)
            self.cwd = None

    def close(self) -> None:
        """End of input: the worker exits by itself (its helper with it)."""
        try:
            self.proc.stdin.close()
            self.proc.wait(timeout=5)
        except Exception:  # noqa: BLE001
            pass
        self.kill()


class ViewerPool:
    """The server side: a few worker processes, a line for the requests beyond them, and the
    budgets (see the module docs). :meth:`answer` is a coroutine for the handler."""

    def __init__(self, *, workers: int | None = None, timeout: float | None = None,
                 memory: int | None = None, queue: int | None = None):
        self.workers = int(workers or _env_float("WORKBENCH_VIEWER_WORKERS", DEFAULT_WORKERS))
        self.timeout = float(timeout or _env_float("WORKBENCH_VIEWER_TIMEOUT", DEFAULT_TIMEOUT))
        self.memory = int(memory or _env_size("WORKBENCH_VIEWER_MEMORY", DEFAULT_MEMORY))
        self.queue = int(queue or _env_float("WORKBENCH_VIEWER_QUEUE", DEFAULT_QUEUE))
        self._lock = threading.Condition()
        self._idle: list[_Worker] = []
        self._all: set[_Worker] = set()      # started workers, busy or idle
        self._spawning = 0                   # workers being started
        self._reaper: threading.Thread | None = None
        self._executor = ThreadPoolExecutor(self.workers, thread_name_prefix="wb-viewer")
        self._sem: asyncio.Semaphore | None = None
        self._waiting = 0
        self._inflight: dict = {}
        self._failures: collections.OrderedDict = collections.OrderedDict()
        self._closed = False

    # -- in the event loop
    async def answer(self, full: str, path: str, root: str,
                     measure: bool = False) -> tuple[int, bytes]:
        """(status, JSON body) for the model at ``full`` (``path`` under ``root``);
        ``measure``: run it and answer the measured overlay (:func:`measure_response`)."""
        try:
            st = os.stat(full)
            key = (full, path, st.st_size, st.st_mtime_ns, st.st_ino, measure)
        except OSError:
            key = (full, path, None, None, None, measure)
        if key in self._failures:
            self._failures.move_to_end(key)
            return self._failures[key]
        shared = self._inflight.get(key)
        if shared is not None:
            return await asyncio.shield(shared)
        if self._waiting >= self.workers + self.queue:
            msg = (f"{path}: the viewer is busy ({self._waiting} models being read or waiting; "
                   f"at most {self.workers} are read at once): try again in a moment")
            return 503, error_body(503, "The viewer is busy", msg, path)
        loop = asyncio.get_running_loop()
        if self._sem is None:
            self._sem = asyncio.Semaphore(self.workers)
        fut = loop.create_future()
        self._inflight[key] = fut
        self._waiting += 1
        try:
            async with self._sem:
                result = await loop.run_in_executor(self._executor, self._run, full, path, root,
                                                    measure)
        except asyncio.CancelledError:
            fut.cancel()
            raise
        except Exception as e:
            fut.set_exception(e)
            fut.exception()               # retrieved: no "never retrieved" warning
            raise
        finally:
            self._waiting -= 1
            self._inflight.pop(key, None)
        status, body, over_budget = result
        if over_budget:
            self._failures[key] = (status, body)
            while len(self._failures) > FAILURES_KEPT:
                self._failures.popitem(last=False)
        fut.set_result((status, body))
        return status, body

    # -- in a pool thread
    def _take(self) -> _Worker:
        """An idle worker, or a new one; at most ``workers`` exist or are starting."""
        with self._lock:
            while True:
                self._close_stale_locked()
                if self._idle:
                    w = self._idle.pop()
                    break
                if len(self._all) + self._spawning < self.workers:
                    self._spawning += 1
                    w = None
                    break
                self._lock.wait(1.0)          # one is starting (prewarm) or finishing
        if w is None:
            try:
                w = _Worker(self.memory, self.timeout)
            finally:
                with self._lock:
                    self._spawning -= 1
            with self._lock:
                self._all.add(w)
        self._prewarm()
        return w

    def _close_stale_locked(self) -> None:
        now = time.monotonic()
        keep = []
        for w in self._idle:
            if w.alive() and now - w.idle_since < IDLE_SECONDS:
                keep.append(w)
            else:
                self._all.discard(w)
                threading.Thread(target=w.close, daemon=True).start()
        self._idle = keep

    def _prewarm(self) -> None:
        """Start the next worker in the background while there is room, so that the next
        request does not wait for a worker's start-up (imports, its checker helper)."""
        with self._lock:
            if self._closed or len(self._all) + self._spawning >= self.workers:
                return
            self._spawning += 1
            if self._reaper is None:
                self._reaper = threading.Thread(target=self._reap, daemon=True,
                                                name="wb-viewer-reaper")
                self._reaper.start()

        def spawn():
            try:
                w = _Worker(self.memory, self.timeout)
            except OSError:
                w = None
            with self._lock:
                self._spawning -= 1
                if w is not None and not self._closed:
                    self._all.add(w)
                    self._idle.append(w)
                    w = None
                self._lock.notify_all()
            if w is not None:
                w.close()

        threading.Thread(target=spawn, daemon=True, name="wb-viewer-start").start()

    def _reap(self) -> None:
        """End workers idle for longer than IDLE_SECONDS (their memory goes back)."""
        while not self._closed:
            time.sleep(min(60.0, IDLE_SECONDS / 4))
            with self._lock:
                self._close_stale_locked()

    def _give_back(self, w: _Worker) -> None:
        w.idle_since = time.monotonic()
        with self._lock:
            if self._closed or not w.alive():
                self._all.discard(w)
                w.close()
            else:
                self._idle.append(w)
            self._lock.notify_all()

    def _run(self, full: str, path: str, root: str,
             measure: bool = False) -> tuple[int, bytes, bool]:
        """(status, body, whether the answer is an out-of-budget one)."""
        try:
            w = self._take()
        except OSError as e:
            return 500, error_body(500, "Internal error", f"{path}: {e}", path), False
        try:
            status, body = w.request(full, path, root, self.timeout, measure)
        except TimeoutError:
            self._drop(w)
            msg = (f"{path}: reading this model and laying out its drawing took longer than "
                   f"{self.timeout:g} s, the viewer's budget per model, and was stopped "
                   f"(WORKBENCH_VIEWER_TIMEOUT sets it, in seconds, for the Jupyter server)")
            return 422, error_body(422, "Too slow to show", msg, path), True
        except _Died as e:
            self._drop(w)
            from workbench.graph.isolated import _signal_name, memory_verdict
            oom = memory_verdict(e.code, e.peak, self.memory)
            if oom:
                return 422, self._oom_body(path, oom), True
            msg = (f"{path}: the viewer's worker process ended while reading this model "
                   f"({_signal_name(e.code)}); the Jupyter server is unharmed")
            return 422, error_body(422, "Cannot read this model", msg, path), True
        if status == 507:                 # MemoryError in the worker (it ends by itself)
            self._drop(w)
            return 422, self._oom_body(path, "an allocation failed"), True
        self._give_back(w)
        return status, body, False

    def _oom_body(self, path: str, detail: str) -> bytes:
        msg = (f"{path}: reading this model needs more memory than the viewer's budget of "
               f"{self.memory / 2**20:,.0f} MiB ({detail}); the model is not necessarily "
               f"malformed (WORKBENCH_VIEWER_MEMORY sets the budget, e.g. 4GiB, for the "
               f"Jupyter server)")
        return error_body(422, "Too big to show", msg, path)

    def _drop(self, w: _Worker) -> None:
        w.kill()
        with self._lock:
            self._all.discard(w)
            self._lock.notify_all()

    def close(self) -> None:
        with self._lock:
            self._closed = True
            workers, self._idle = list(self._all), []
            self._all.clear()
            self._lock.notify_all()
        for w in workers:
            w.kill()
        self._executor.shutdown(wait=False, cancel_futures=True)


if __name__ == "__main__":
    main()
