"""Model surgery in the JupyterLab viewer: one edit session per open file, each in a worker
process of its own.

``POST {base_url}workbench/api/edit`` (authenticated, the ``contents`` write permission: an
edit session can save over files) with a JSON body:

- ``{"op": "open", "path": <contents path>}`` starts a session on that file and answers
  ``{"session": id, "ok": true, "graph": ..., "details": ..., "state": ...}``;
- ``{"session": id, "op": ..., ...}`` is a request of
  :class:`workbench.widgets.editing.EditController` (action, apply, undo, redo, script,
  compare, save); an answer that changed the model carries the new drawing (``graph``,
  ``details``) and ``state``; a refused edit answers ``{"ok": false, "error": message}``;
- ``{"session": id, "op": "close"}`` ends it.

Where a session lives, and why. An edit session holds the whole model, weights included (an
edit is checked by running the model before and after), and every version an undo can go
back to. It cannot live in the server process (one big or hostile model would take the
server's memory and, while an edit is checked, its event loop) nor in the viewer's shared
workers (they are stateless and recycled). So each session gets a **worker process of its
own** (``python -m workbench.labext_edit``), started from the same set-up as the viewer's
workers (:mod:`workbench.labext_worker`): an address-space limit
(``WORKBENCH_EDIT_MEMORY``, default 4 GiB), a time budget per request
(``WORKBENCH_EDIT_TIMEOUT``, default 120 s: the worker and its checker helper are killed when
it runs out), a lower CPU priority, and at most ``WORKBENCH_EDIT_WORKERS`` (default 2) such
processes at once. The server keeps each session's **log** (its edit records and how many
are undone: a few kilobytes), so a worker is disposable: a session whose worker was ended
(idle for ``IDLE_SECONDS``, taken by another session when all workers are in use, killed
after a request ran out of time or memory) is restored by replaying its log in a new worker
before its next request. One hostile or huge model costs its own worker's budget and nothing
else: the server's event loop only forwards bytes, and other sessions wait at most for a
worker slot (beyond ``WORKBENCH_EDIT_QUEUE`` waiting requests the answer is 503, busy).

Paths: the file opened, the file saved and the other model of a compose are contents paths,
resolved under the server's root (symlinks included; outside it: refused), hidden files
refused when the contents manager hides them; Save writes atomically and answers
``"exists": true`` instead of replacing a file unless the request says ``"overwrite": true``
(the viewer asks first). Messages name files relative to the root.
"""

from __future__ import annotations

import asyncio
import json
import os
import secrets
import struct
import threading
import time
from concurrent.futures import ThreadPoolExecutor

from workbench.labext_worker import (
    SOURCE,
    GraphRequestError,
    _Died,
    _env_float,
    _env_size,
    _json_default,
    _Worker,
    resolve_path,
    scrub,
)

DEFAULT_TIMEOUT = 120.0
DEFAULT_MEMORY = 4 * 2**30
DEFAULT_WORKERS = 2
DEFAULT_QUEUE = 8
#: a session's worker ends after this many idle seconds (its log stays: it is replayed)
IDLE_SECONDS = 600.0
#: sessions remembered (their logs); the least recently used beyond this are forgotten
MAX_SESSIONS = 32
#: the largest request body (records with arrays for set_initializer)
MAX_BODY = 16 * 2**20
#: a replay gets this many times the budget of one request (capped)
REPLAY_FACTOR_CAP = 10


def _body(status: int, data: dict) -> tuple[int, bytes]:
    return status, json.dumps({"source": SOURCE, **data}, default=_json_default).encode()


def error(status: int, message: str, **extra) -> tuple[int, bytes]:
    return _body(status, {"ok": False, "error": message, "status": status, **extra})


def hidden(full: str, root: str) -> bool:
    """Whether ``full`` is hidden under ``root`` (a dot name, or a hidden attribute)."""
    from jupyter_core.paths import is_hidden
    return is_hidden(full, os.path.realpath(root))


# ----------------------------------------------------------------------------- worker side
class _WorkerState:
    """What one edit worker holds: its session's controller, and how paths are resolved."""

    def __init__(self):
        self.ctl = None
        self.root = self.full = self.path = None
        self.allow_hidden = True

    def shown(self, text: str) -> str:
        return scrub(text, self.root, self.full, self.path)

    def resolve(self, path: str, purpose: str) -> str:
        from workbench.edit import EditError
        try:
            full = resolve_path(self.root, path)
        except GraphRequestError as e:
            raise EditError(str(e)) from None
        if not self.allow_hidden and hidden(full, self.root):
            raise EditError(f"{path}: hidden files are not used here (ContentsManager."
                            f"allow_hidden is False)")
        if os.path.isdir(full):
            raise EditError(f"{path}: is a folder, not a model file")
        if purpose == "save" and not full.lower().endswith(".onnx"):
            raise EditError(f"{path}: the edited model is saved as an .onnx file")
        if purpose == "model" and not os.path.exists(full):
            raise EditError(f"{path}: file not found")
        return full

    def open(self, req: dict) -> dict:
        from workbench import edit
        from workbench.widgets.editing import EditController
        self.root, self.full, self.path = req["root"], req["full"], req["path"]
        self.allow_hidden = bool(req.get("allow_hidden", True))
        session = edit.open(self.full)
        self.ctl = EditController(session, name=os.path.basename(self.path),
                                  resolve=self.resolve, shown=self.shown,
                                  default_save=self.path)
        for rec in req.get("records") or []:
            session.apply(rec)
        for _ in range(int(req.get("undo") or 0)):
            session.undo()
        if req.get("records"):
            self.ctl.last_change = None
        return {"ok": True, "changed": True, "state": self.ctl.state()}

    def log(self) -> dict:
        s = self.ctl.session
        return {"records": [st.record for st in s.steps] + [st.record for st in s.undone],
                "undo": len(s.undone)}

    def answer(self, req: dict) -> tuple[int, dict, dict | None]:
        """(status, answer, the session's log when it changed)."""
        from workbench.edit import EditError
        from workbench.errors import WorkbenchError
        op = req.get("op")
        if op == "open":
            try:
                out = self.open(req)
            except (EditError, WorkbenchError, OSError) as e:
                self.ctl = None
                verb = "restore the edit session" if req.get("records") else "open the model"
                return 422, {"ok": False, "error": self.shown(f"{req.get('path')}: cannot "
                                                             f"{verb}: {e}")}, None
        elif self.ctl is None:
            return 409, {"ok": False, "error": "no model open in this edit worker"}, None
        else:
            out = self.ctl.handle(req.get("request") or {})
        if out.get("changed"):
            drawing = self.ctl.drawing(weights=False)
            out["graph"] = drawing.data
            out["details"] = drawing.details().all()
            return 200, out, self.log()
        if op != "open" and out.get("ok") and req.get("request", {}).get("op") == "save":
            return 200, out, self.log()
        return 200, out, None


def main() -> None:
    """The edit worker: limits itself, then answers requests until its input ends."""
    from workbench.labext_worker import _start_checker, limit_self, next_request
    rd, wr, resource, memory = limit_self()
    import workbench.edit  # noqa: F401 - imported before the first request
    import workbench.widgets.editing  # noqa: F401
    _start_checker()
    wr.write(b"R")
    state = _WorkerState()
    while True:
        req = next_request(rd, resource)
        if req is None:
            return
        try:
            status, out, log = state.answer(req)
            body = json.dumps({"source": SOURCE, **out}, default=_json_default).encode()
            logb = json.dumps(log).encode() if log is not None else b""
        except MemoryError:
            status, body, logb = 507, b"", b""
        except Exception as e:  # noqa: BLE001 - a bug on our side: say so
            msg = state.shown(f"the workbench failed to answer this edit request "
                              f"({type(e).__name__}: {e})")
            status, body, logb = 500, json.dumps({"source": SOURCE, "ok": False,
                                                  "error": msg}).encode(), b""
        wr.write(struct.pack("<IQQ", status, len(logb), len(body)) + logb + body)
        body = None
        if status == 507:
            return                        # out of memory: a fresh worker replays the log


# ----------------------------------------------------------------------------- server side
class _EditWorker(_Worker):
    module = "workbench.labext_edit"


class _Session:
    def __init__(self, sid: str, full: str, path: str, root: str, allow_hidden: bool):
        self.sid, self.full, self.path, self.root = sid, full, path, root
        self.allow_hidden = allow_hidden
        self.records: list = []
        self.undo = 0
        self.worker: _EditWorker | None = None
        self.lock = asyncio.Lock()
        self.used = time.monotonic()
        self.busy = False


class EditPool:
    """The server side of the edit sessions (see the module docs): their logs, their worker
    processes and the budgets. :meth:`open` and :meth:`request` are coroutines."""

    def __init__(self, *, workers: int | None = None, timeout: float | None = None,
                 memory: int | None = None, queue: int | None = None):
        self.workers = int(workers or _env_float("WORKBENCH_EDIT_WORKERS", DEFAULT_WORKERS))
        self.timeout = float(timeout or _env_float("WORKBENCH_EDIT_TIMEOUT", DEFAULT_TIMEOUT))
        self.memory = int(memory or _env_size("WORKBENCH_EDIT_MEMORY", DEFAULT_MEMORY))
        self.queue = int(queue or _env_float("WORKBENCH_EDIT_QUEUE", DEFAULT_QUEUE))
        self.sessions: dict[str, _Session] = {}
        self._executor = ThreadPoolExecutor(self.workers + 1, thread_name_prefix="wb-edit")
        self._waiting = 0
        self._closed = False
        self._reaper: asyncio.Task | None = None

    # -- sessions
    async def open(self, full: str, path: str, root: str,
                   allow_hidden: bool = True) -> tuple[int, bytes]:
        sid = secrets.token_urlsafe(16)
        s = _Session(sid, full, path, root, allow_hidden)
        self.sessions[sid] = s
        self._forget_old()
        status, body = await self._run(s, None)
        if status != 200:
            self.sessions.pop(sid, None)
            if s.worker is not None:
                self._end(s)
            return status, body
        return status, b'{"session": "' + sid.encode() + b'", ' + body[1:]

    async def request(self, sid: str, req: dict) -> tuple[int, bytes]:
        s = self.sessions.get(sid) if isinstance(sid, str) else None
        if s is None:
            return error(410, "this edit session has ended (the server restarted, or it was "
                         "not used for a long time): press Edit to start again from the file",
                         ended=True)
        if req.get("op") == "close":
            self.sessions.pop(sid, None)
            async with s.lock:
                self._end(s)
            return _body(200, {"ok": True, "closed": True})
        return await self._run(s, req)

    def _forget_old(self) -> None:
        if len(self.sessions) <= MAX_SESSIONS:
            return
        for s in sorted(self.sessions.values(), key=lambda x: x.used):
            if len(self.sessions) <= MAX_SESSIONS:
                break
            if not s.busy:
                self.sessions.pop(s.sid, None)
                self._end(s)

    # -- running a request in the session's worker
    async def _run(self, s: _Session, req: dict | None) -> tuple[int, bytes]:
        if self._waiting >= self.workers + self.queue:
            return error(503, f"{s.path}: the model editor is busy ({self._waiting} edit "
                         f"requests running or waiting; {self.workers} run at once): try "
                         f"again in a moment")
        self._waiting += 1
        try:
            async with s.lock:
                s.busy = True
                s.used = time.monotonic()
                try:
                    if s.worker is None or not s.worker.alive():
                        got = await self._worker_for(s)
                        if got is not None:
                            return got
                        if req is not None:           # restore: the log replayed
                            st, body = await self._call(s, self._open_request(s), replay=True)
                            if st != 200:
                                self.sessions.pop(s.sid, None)
                                return st, body
                    if req is None:
                        return await self._call(s, self._open_request(s))
                    return await self._call(s, {"op": "request", "request": req})
                finally:
                    s.busy = False
                    s.used = time.monotonic()
        finally:
            self._waiting -= 1

    def _open_request(self, s: _Session) -> dict:
        return {"op": "open", "full": s.full, "path": s.path, "root": s.root,
                "allow_hidden": s.allow_hidden, "records": s.records, "undo": s.undo}

    async def _worker_for(self, s: _Session):
        """Give ``s`` a worker: a free slot, else the least recently used idle session's
        worker is ended (its log stays). Returns an error answer when none frees up."""
        deadline = time.monotonic() + self.timeout
        loop = asyncio.get_running_loop()
        while True:
            live = [x for x in self.sessions.values() if x.worker is not None]
            for x in live:
                if not x.worker.alive():
                    self._end(x)
            live = [x for x in self.sessions.values() if x.worker is not None]
            if len(live) < self.workers:
                break
            idle = [x for x in live if not x.busy and not x.lock.locked()]
            if idle:
                self._end(min(idle, key=lambda x: x.used))
                break
            if time.monotonic() > deadline:
                return error(503, f"{s.path}: every edit worker is busy with another model "
                             f"({self.workers} at once): try again in a moment")
            await asyncio.sleep(0.2)
        try:
            s.worker = await loop.run_in_executor(self._executor, _EditWorker, self.memory,
                                                  self.timeout)
        except OSError as e:
            return error(500, f"{s.path}: {e}")
        if self._reaper is None or self._reaper.done():
            self._reaper = loop.create_task(self._reap())
        return None

    async def _call(self, s: _Session, req: dict, replay: bool = False) -> tuple[int, bytes]:
        factor = 1 + min(len(s.records), REPLAY_FACTOR_CAP) if req.get("op") == "open" else 1
        timeout = self.timeout * factor
        req = {**req, "timeout": timeout}
        loop = asyncio.get_running_loop()
        w = s.worker
        try:
            status, logb, body = await loop.run_in_executor(
                self._executor, lambda: w.call(req, timeout, parts=2))
        except TimeoutError:
            self._end(s)
            what = "restoring this edit session (its edits replayed)" if replay else \
                "this edit request"
            return error(422, f"{s.path}: {what} took longer than {timeout:g} s, the model "
                         f"editor's budget, and was stopped; the edits made before it are "
                         f"kept (WORKBENCH_EDIT_TIMEOUT sets the budget, in seconds, for "
                         f"the Jupyter server)")
        except _Died as e:
            self._end(s)
            from workbench.graph.isolated import _signal_name, memory_verdict
            oom = memory_verdict(e.code, e.peak, self.memory)
            return self._oom(s) if oom else error(
                422, f"{s.path}: the model editor's worker process ended during this request "
                f"({_signal_name(e.code)}); the edits made before it are kept, the Jupyter "
                f"server is unharmed")
        if status == 507:
            self._end(s)
            return self._oom(s)
        if logb:
            log = json.loads(logb)
            s.records, s.undo = log["records"], int(log["undo"])
        return status, body

    def _oom(self, s: _Session) -> tuple[int, bytes]:
        return error(422, f"{s.path}: editing this model needs more memory than the model "
                     f"editor's budget of {self.memory / 2**20:,.0f} MiB; the edits made "
                     f"before this request are kept (WORKBENCH_EDIT_MEMORY sets the budget, "
                     f"e.g. 8GiB, for the Jupyter server)")

    def _end(self, s: _Session) -> None:
        w, s.worker = s.worker, None
        if w is not None:
            threading.Thread(target=w.kill, daemon=True).start()

    async def _reap(self) -> None:
        """End the workers of sessions idle for IDLE_SECONDS (their logs stay); in the event
        loop, like every change of the sessions."""
        while not self._closed and any(s.worker is not None for s in self.sessions.values()):
            await asyncio.sleep(min(60.0, IDLE_SECONDS / 4))
            now = time.monotonic()
            for s in list(self.sessions.values()):
                if s.worker is not None and not s.lock.locked() and now - s.used > IDLE_SECONDS:
                    self._end(s)

    def close(self) -> None:
        self._closed = True
        if self._reaper is not None:
            try:
                self._reaper.get_loop().call_soon_threadsafe(self._reaper.cancel)
            except RuntimeError:          # the loop is closed already
                pass
        for s in list(self.sessions.values()):
            w, s.worker = s.worker, None
            if w is not None:
                w.kill()
        self.sessions.clear()
        self._executor.shutdown(wait=False, cancel_futures=True)


if __name__ == "__main__":
    main()
