"""ONNX's C++ checker and shape inference, run in a helper process.

``onnx.checker`` and ``onnx.shape_inference`` are C++ code; on some malformed models they
crash the process (e.g. a SIGSEGV was seen on LayerNormalization with ``axis=2**31``). In a
notebook that kills the kernel and the user's unsaved state. So the loader runs them in a small,
long-lived helper process that imports only ``onnx``: a crash, a hang or a memory blow-up
there becomes a :class:`~workbench.errors.ModelLoadError` here, and the helper is restarted on
the next request.

What is sent is a *skeleton* of the model: large initializers are replaced by graph inputs of
the same type and shape (what the checker and shape inference need of them), so the round trip
costs little even for big models. Small integer initializers stay, for data propagation
(Reshape targets, Slice bounds...).

Out of memory is told apart from a crash: the helper's address space is limited
(``WORKBENCH_HELPER_MEMORY``, default 4 GiB); an allocation that fails in Python or in onnx's
C++ code (``std::bad_alloc``) answers "out of memory"; a helper that dies anyway is reaped with
``os.wait4`` and its peak resident memory decides the message: near the limit, or killed by
the system (the kernel's OOM killer sends SIGKILL, which this module sends only on a timeout),
it ran out of memory; otherwise it crashed on malformed input.

A model loaded without its weights (``load(..., weights=False)``) has *described* tensors:
the skeleton moves described initializers to graph inputs like big ones, and points any other
described tensor at an empty placeholder file in the helper's private working folder (what
the checker asks of external data: a regular file; shape inference does not read it).

Measured on this project's machines: the helper starts once per process (~0.2 s, importing
onnx); a request costs the serialisation of the skeleton (under a millisecond for the light
models, ~15 ms for the GPT-2-like export). ``WORKBENCH_SHAPE_INFERENCE=inprocess`` runs them in
this process instead (no isolation), e.g. where subprocesses are not allowed.
"""

from __future__ import annotations

import atexit
import os
import select
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import threading
import time

import onnx

from workbench.errors import ModelLoadError
from workbench.graph.external import is_described, iter_model_tensors
from workbench.limits import parse_size, shape_inference_timeout

# initializers up to this many bytes stay in the skeleton (data propagation reads them)
KEEP_INITIALIZER_BYTES = 4096
# the helper's address-space limit (bytes); it only ever holds a skeleton
HELPER_MEMORY_LIMIT = 4 * 2**30
# what a described tensor's data location becomes in the skeleton (an empty file in the
# helper's working folder)
PLACEHOLDER = "workbench-unread.bin"
# the helper gets a session of its own (see _Helper._start); the JupyterLab viewer's worker
# processes set this to False so that killing a worker's process group ends its helper too
NEW_SESSION = True
# a helper that died with its peak resident memory above this fraction of its limit ran out
# of memory (its address space also holds the interpreter's and libraries' mappings)
OOM_FRACTION = 0.6


def helper_memory_limit() -> int:
    """The helper's address-space limit: ``WORKBENCH_HELPER_MEMORY`` (a size such as
    ``2GiB``) or :data:`HELPER_MEMORY_LIMIT`."""
    env = os.environ.get("WORKBENCH_HELPER_MEMORY")
    if env:
        try:
            return parse_size(env)
        except ValueError:
            pass
    return HELPER_MEMORY_LIMIT


def memory_verdict(code, peak_rss: int, limit: int, *, killed_by_us: bool = False):
    """Why a helper process died, for people: the out-of-memory circumstances when its peak
    resident memory came near ``limit`` or the system killed it (SIGKILL we did not send),
    else None (a crash)."""
    if limit and peak_rss >= OOM_FRACTION * limit:
        return (f"peak {peak_rss / 2**20:,.0f} MiB of its {limit / 2**20:,.0f} MiB limit, "
                f"then {_signal_name(code)}")
    if code == -signal.SIGKILL and not killed_by_us:
        return (f"killed by the system, as the kernel does for lack of memory; peak "
                f"{peak_rss / 2**20:,.0f} MiB")
    return None


def reap(proc) -> tuple[int | None, int]:
    """Wait for ``proc`` (a Popen that has exited or is exiting) and return (its returncode
    as Popen gives it, its peak resident memory in bytes; 0 when unknown)."""
    try:
        _, status, usage = os.wait4(proc.pid, 0)
    except (ChildProcessError, OSError, AttributeError):   # already reaped, or no wait4
        try:
            return proc.wait(timeout=10), 0
        except Exception:  # noqa: BLE001
            return proc.returncode, 0
    code = -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)
    proc.returncode = code
    peak = usage.ru_maxrss * (1 if sys.platform == "darwin" else 1024)
    return code, peak


class HelperDied(Exception):
    """The helper process ended without answering: ``code`` (returncode), ``peak`` (its peak
    resident memory, bytes), ``limit`` (its address-space limit)."""

    def __init__(self, code, peak: int = 0, limit: int = 0):
        super().__init__(code)
        self.code, self.peak, self.limit = code, peak, limit

_WORKER_SOURCE = r"""
import os, struct, sys, traceback
try:
    import resource
    lim = int(os.environ.get("WORKBENCH_HELPER_AS", "0"))
    if lim:
        resource.setrlimit(resource.RLIMIT_AS, (lim, lim))
except Exception:
    pass
import onnx, onnx.checker, onnx.shape_inference
TYPE_ERROR = "has unsupported type"   # = isolated.TYPE_ERROR
rd = os.fdopen(0, "rb", buffering=0)
wr = os.fdopen(1, "wb", buffering=0)
def read_exact(n):
    buf = bytearray()
    while len(buf) < n:
        chunk = rd.read(n - len(buf))
        if not chunk:
            sys.exit(0)
        buf += chunk
    return bytes(buf)
def reply(status, payload):
    wr.write(struct.pack("<BQ", status, len(payload)) + payload)
wr.write(b"R")
while True:
    flags, n = struct.unpack("<BQ", read_exact(9))
    data = read_exact(n)
    prop = not (flags & 4)
    phase = 4
    try:
        m = onnx.ModelProto()
        m.ParseFromString(data)
        if flags & 1:
            try:
                onnx.checker.check_model(m)
            except onnx.checker.ValidationError as e:
                reply(2, str(e).encode("utf-8", "replace"))
                continue
        phase = 6
        if flags & 2:
            try:
                m = onnx.shape_inference.infer_shapes(m, check_type=True, strict_mode=False,
                                                      data_prop=prop)
            except MemoryError:
                raise
            except Exception as e:
                if "bad_alloc" in str(e):
                    raise MemoryError(str(e))
                if TYPE_ERROR in str(e) and "sparse_tensor(" not in str(e):
                    reply(5, str(e).encode("utf-8", "replace"))
                    continue
                try:
                    m = onnx.shape_inference.infer_shapes(m, check_type=False,
                                                          strict_mode=False, data_prop=prop)
                except MemoryError:
                    raise
                except Exception as e:
                    if "bad_alloc" in str(e):
                        raise MemoryError(str(e))
                    reply(3, (type(e).__name__ + ": " + str(e)).encode("utf-8", "replace"))
                    continue
            reply(0, m.SerializeToString())
        else:
            reply(0, b"")
    except MemoryError:
        # 4: the checker ran out of memory, 6: shape inference did; onnx's C++ code is not
        # safe to use after a failed allocation: answer, then end (a fresh helper follows)
        m = data = None
        reply(phase, b"out of memory")
        os._exit(0)
    except Exception as e:
        reply(1, (type(e).__name__ + ": " + str(e)).encode("utf-8", "replace"))
"""


class CheckFailed(Exception):
    """onnx.checker refused the model (message: the checker's text)."""


class OutOfMemory(ModelLoadError):
    """The helper ran out of memory (not a verdict on the model)."""


class InferenceOutOfMemory(OutOfMemory):
    """... during shape inference, after the checker (if asked for) accepted the model."""


class InferenceFailed(Exception):
    """onnx shape inference raised (message: its text)."""


class TypeRefused(Exception):
    """A node's input or output type is outside its op's type constraints (message: onnx's
    text, naming the op and the input)."""


#: what onnx's type check says of a value outside an op's type constraints (the one kind of
#: inference error that refuses a model: onnxruntime refuses such a graph too). Not for
#: sparse initializers: onnx types them sparse_tensor, which most ops' constraints leave out,
#: but they are dense tensors to the engine (and to onnxruntime)
TYPE_ERROR = "has unsupported type"


def read_exactly(fd: int, n: int, deadline: float) -> bytes | None:
    """``n`` bytes from pipe ``fd`` (a helper process's stdout) before ``deadline``
    (``time.monotonic()``): None when the process closed it first, TimeoutError past it."""
    buf = bytearray()
    while len(buf) < n:
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError
        r, _, _ = select.select([fd], [], [], min(left, 1.0))
        if not r:
            continue
        chunk = os.read(fd, min(n - len(buf), 1 << 20))
        if not chunk:
            return None
        buf += chunk
    return bytes(buf)


class _Helper:
    def __init__(self):
        self.proc: subprocess.Popen | None = None
        self.pid = os.getpid()
        self.lock = threading.Lock()
        self.cwd: str | None = None
        self.limit = 0

    def close(self):
        """Let the helper exit (end of its input) and reap it."""
        p, self.proc = self.proc, None
        if p is None or self.pid != os.getpid():
            return
        try:
            p.stdin.close()
            p.wait(timeout=5)
        except Exception:  # noqa: BLE001 - best effort at exit
            p.kill()
            p.wait()
        finally:
            if p.stdout is not None:
                p.stdout.close()
            if self.cwd:
                shutil.rmtree(self.cwd, ignore_errors=True)
                self.cwd = None

    def _workdir(self) -> str:
        """The helper's private working folder, holding the empty placeholder file that
        described tensors point at (the checker wants their data file to exist)."""
        if not (self.cwd and os.path.isfile(os.path.join(self.cwd, PLACEHOLDER))):
            self.cwd = tempfile.mkdtemp(prefix="workbench-helper-")
            open(os.path.join(self.cwd, PLACEHOLDER), "wb").close()
        return self.cwd

    def _start(self):
        env = dict(os.environ)
        self.limit = helper_memory_limit()
        env["WORKBENCH_HELPER_AS"] = str(self.limit)
        env.setdefault("OMP_NUM_THREADS", "1")
        # its own session: a Jupyter kernel that shuts down signals the children in its
        # process group and waits until they are gone; the helper (ended and reaped by
        # close() at exit, or by the end of its input when this process dies) would stay a
        # zombie there, the kernel would never exit and be killed before its exit handlers
        # ran (temporary folders left behind). Ctrl-C in a terminal does not reach it either.
        self.proc = subprocess.Popen(
            [sys.executable, "-I", "-c", _WORKER_SOURCE], stdin=subprocess.PIPE,
            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env, close_fds=True,
            start_new_session=(os.name == "posix" and NEW_SESSION), cwd=self._workdir())
        # -I (isolated mode) keeps the user's cwd and PYTHONPATH out of the helper's imports,
        # but onnx must still be found: it is in this interpreter's site-packages
        ready = self._read(1, time.monotonic() + 60)
        if ready != b"R":
            self.kill()
            raise OSError("the shape-inference helper did not start")

    def kill(self):
        p, self.proc = self.proc, None
        if p is not None:
            try:
                p.kill()
                p.wait(timeout=5)
            except Exception:  # noqa: BLE001 - best effort
                pass
            for f in (p.stdin, p.stdout):
                try:
                    if f is not None:
                        f.close()
                except OSError:
                    pass

    def _read(self, n: int, deadline: float) -> bytes | None:
        return read_exactly(self.proc.stdout.fileno(), n, deadline)

    def request(self, flags: int, data: bytes, timeout: float) -> tuple[int, bytes]:
        with self.lock:
            if self.pid != os.getpid():   # a forked child: the pipes belong to the parent
                self.proc, self.pid = None, os.getpid()
            if self.proc is None or self.proc.poll() is not None:
                self._start()
            deadline = time.monotonic() + timeout
            try:
                self.proc.stdin.write(struct.pack("<BQ", flags, len(data)))
                self.proc.stdin.write(data)
                self.proc.stdin.flush()
                head = self._read(9, deadline)
                if head is not None:
                    status, n = struct.unpack("<BQ", head)
                    payload = self._read(n, deadline)
                    if payload is not None:
                        if status in (4, 6):      # out of memory: the helper ends itself
                            self.kill()
                        return status, payload
            except TimeoutError:
                self.kill()
                raise
            except (BrokenPipeError, OSError):
                pass
            # the helper died: how, and how much memory it had
            code, peak = reap(self.proc)
            self.kill()
            raise HelperDied(code, peak, self.limit)


_helper = _Helper()
atexit.register(_helper.close)


def _mode() -> str:
    return os.environ.get("WORKBENCH_SHAPE_INFERENCE", "isolated").strip().lower()


def _data_bytes(t: onnx.TensorProto) -> int:
    if is_described(t):
        return KEEP_INITIALIZER_BYTES + 1
    size = 8 * (len(t.float_data) + len(t.int64_data) + len(t.int32_data)
                + len(t.double_data) + len(t.uint64_data))
    if size <= KEEP_INITIALIZER_BYTES and t.HasField("raw_data"):
        size += t.ByteSize()           # raw_data's length without copying it out
    return size + sum(len(s) for s in t.string_data)


def skeleton(m: onnx.ModelProto, described: bool = False) -> onnx.ModelProto:
    """A copy of ``m`` whose large initializers are graph inputs of the same type and shape.
    ``described``: ``m`` has described tensors (a structure-only load); the others among
    them point at the helper's placeholder file."""
    sk = _skeleton(m)
    _cut_bulk_attributes(sk.graph)
    if described:
        for t, _ in iter_model_tensors(sk):
            if is_described(t):
                del t.external_data[:]
                e = t.external_data.add()
                e.key, e.value = "location", PLACEHOLDER
    return sk


#: nodes whose long list attributes are data neither the checker nor shape inference reads
#: (a tree ensemble's node and leaf tables: 5 M entries and 190 MB in a 10,000-tree LightGBM
#: model); in the skeleton their node/leaf lists longer than BULK_ENTRIES keep one entry (the
#: type the checker checks), and the model's own nodes are put back by :func:`_merge`
BULK_ATTRIBUTE_OPS = frozenset({("ai.onnx.ml", "TreeEnsembleClassifier"),
                                ("ai.onnx.ml", "TreeEnsembleRegressor")})
BULK_ENTRIES = 4096
_BULK_PREFIXES = ("nodes_", "class_", "target_")


def _cut_bulk_attributes(g: onnx.GraphProto) -> None:
    for n in g.node:
        if (n.domain, n.op_type) in BULK_ATTRIBUTE_OPS:
            for a in n.attribute:
                if not a.name.startswith(_BULK_PREFIXES):    # class labels, base values stay
                    continue
                for rep in (a.ints, a.floats, a.strings):
                    if len(rep) > BULK_ENTRIES:
                        del rep[1:]


def _skeleton(m: onnx.ModelProto) -> onnx.ModelProto:
    sk = onnx.ModelProto()
    g = m.graph
    keep, move = [], []
    for t in g.initializer:
        (move if _data_bytes(t) > KEEP_INITIALIZER_BYTES else keep).append(t)
    if not move:
        sk.CopyFrom(m)
        return sk
    # copy everything but the initializers, then add back the small ones
    saved = list(g.initializer)
    try:
        del g.initializer[:]
        sk.CopyFrom(m)
    finally:
        g.initializer.extend(saved)
    sk.graph.initializer.extend(keep)
    declared = {i.name for i in sk.graph.input}
    for t in move:
        if t.name in declared:
            continue
        vi = sk.graph.input.add()
        vi.name = t.name
        tt = vi.type.tensor_type
        tt.elem_type = t.data_type
        tt.shape.SetInParent()
        for d in t.dims:
            tt.shape.dim.add().dim_value = d
    return sk


#: onnx's data propagation spends ~200 bytes and ~2 µs per element of every 1-D value it
#: meets (onnx 1.23: 2 GiB and 21 s for one float input of 10**7 elements); shape-like values
#: have a handful. Above this many elements in one 1-D graph input, output, value_info or
#: initializer, shapes are inferred without data propagation.
MAX_PROPAGATED = 1 << 16


def _huge_1d(g: onnx.GraphProto) -> bool:
    for vi in (*g.input, *g.output, *g.value_info):
        tt = vi.type.tensor_type
        if len(tt.shape.dim) == 1 and tt.shape.dim[0].dim_value > MAX_PROPAGATED:
            return True
    return any(len(t.dims) == 1 and t.dims[0] > MAX_PROPAGATED for t in g.initializer)


def _signal_name(code) -> str:
    if code is None:
        return "it stopped for an unknown reason"
    if code < 0:
        try:
            return f"it was killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"it was killed by signal {-code}"
    return f"it exited with status {code}"


def check_and_infer(m: onnx.ModelProto, *, check: bool, infer: bool,
                    path: str | None = None, described: bool = False) -> onnx.ModelProto | None:
    """Run onnx.checker (``check``) and shape inference (``infer``) on ``m``.

    Returns the model with inferred value_info merged (None when ``infer`` is False).
    Raises CheckFailed (checker refusal), InferenceFailed (inference raised), or
    ModelLoadError when the C++ code crashed, hung or ran out of memory. ``described``: see
    :func:`skeleton`.
    """
    if not check and not infer:
        return None
    if _mode() == "inprocess" and not described:
        return _in_process(m, check, infer)
    sk = skeleton(m, described)
    flags = (1 if check else 0) | (2 if infer else 0)
    if infer and _huge_1d(sk.graph):
        flags |= 4
    try:
        data = sk.SerializeToString()
    except ValueError as e:  # e.g. > 2 GB even without the big initializers
        raise ModelLoadError(f"the model cannot be serialised for checking: {e}",
                             path=path) from None
    timeout = shape_inference_timeout()
    try:
        status, payload = _helper.request(flags, data, timeout)
    except TimeoutError:
        raise ModelLoadError(
            f"onnx's checker/shape inference did not finish in {timeout:g} s on this model and "
            f"was stopped (raise WORKBENCH_SHAPE_INFERENCE_TIMEOUT if the model is really that "
            f"big)", path=path) from None
    except HelperDied as e:
        oom = memory_verdict(e.code, e.peak, e.limit)
        if oom:
            raise OutOfMemory(
                f"onnx's C++ checker/shape inference ran out of memory on this model "
                f"({oom}). The model is not necessarily malformed: raise the limit with "
                f"WORKBENCH_HELPER_MEMORY (e.g. 8GiB) if this machine has the memory. It ran "
                f"in a helper process, so this session is unharmed", path=path) from None
        raise ModelLoadError(
            f"onnx's C++ checker/shape inference crashed on this model ({_signal_name(e.code)}"
            f"): the model is malformed in a way onnx does not catch. It ran in a helper "
            f"process, so this session is unharmed", path=path) from None
    except OSError as e:
        if described:          # the checker would look for the placeholder file here
            raise InferenceFailed(f"the shape-inference helper is unavailable ({e}); a model "
                                  f"loaded without its weights is not checked in this "
                                  f"process") from None
        # no subprocesses here: fall back to running in this process
        import warnings  # noqa: PLC0415
        warnings.warn(f"shape-inference helper unavailable ({e}); running onnx's checker and "
                      f"shape inference in this process", stacklevel=3)
        return _in_process(m, check, infer)
    text = payload.decode("utf-8", "replace")
    if status == 2:
        raise CheckFailed(text)
    if status == 3:
        raise InferenceFailed(text)
    if status == 5:
        raise TypeRefused(text)
    if status in (4, 6):
        what = "onnx.checker" if status == 4 else "onnx's shape inference"
        err = OutOfMemory if status == 4 else InferenceOutOfMemory
        raise err(
            f"{what} ran out of memory on this model (its helper process may use "
            f"{helper_memory_limit() / 2**20:,.0f} MiB; raise the limit with "
            f"WORKBENCH_HELPER_MEMORY if this machine has the memory). The model is not "
            f"necessarily malformed; this session is unharmed", path=path)
    if status != 0:
        raise InferenceFailed(text)
    if not infer:
        return None
    inferred = onnx.ModelProto()
    inferred.ParseFromString(payload)
    out = _merge(m, inferred)
    if described:
        _restore_described(m, out)
    return out


def _merge(m: onnx.ModelProto, inferred: onnx.ModelProto) -> onnx.ModelProto:
    """``m`` with the inferred graph (value_info, outputs, subgraphs) but its own initializers
    (sparse ones too) and inputs."""
    out = onnx.ModelProto()
    g = inferred.graph
    del g.initializer[:]
    del g.sparse_initializer[:]
    del g.input[:]
    out.CopyFrom(inferred)
    out.graph.input.extend(m.graph.input)
    out.graph.initializer.extend(m.graph.initializer)
    out.graph.sparse_initializer.extend(m.graph.sparse_initializer)
    del out.training_info[:]                 # not inferred: as it was
    out.training_info.extend(m.training_info)
    # the nodes whose bulk attributes the skeleton cut (inference changes no top-level node)
    if len(out.graph.node) == len(m.graph.node):
        for mine, theirs in zip(out.graph.node, m.graph.node):
            if (theirs.domain, theirs.op_type) in BULK_ATTRIBUTE_OPS:
                mine.CopyFrom(theirs)
    return out


def _node_tensors(g: onnx.GraphProto) -> list:
    """Every tensor held by ``g``'s nodes (attributes, subgraphs with their initializers)."""
    from workbench.graph.external import _iter_node_tensors
    return [t for n in g.node for t, _ in _iter_node_tensors(n, "")]


def _restore_described(m: onnx.ModelProto, out: onnx.ModelProto) -> None:
    """Put back the marks of the described tensors inside ``out``'s nodes (the skeleton
    pointed them at the placeholder file); inference changes no node, so the tensors pair up
    in order."""
    src, dst = _node_tensors(m.graph), _node_tensors(out.graph)
    if len(src) != len(dst):          # not expected: keep the nodes as they were, unshaped
        del out.graph.node[:]
        out.graph.node.extend(m.graph.node)
        return
    for a, b in zip(src, dst):
        if is_described(a):
            b.CopyFrom(a)


def _in_process(m, check, infer):
    if check:
        try:
            onnx.checker.check_model(m)
        except onnx.checker.ValidationError as e:
            raise CheckFailed(str(e)) from None
    if not infer:
        return None
    try:
        return onnx.shape_inference.infer_shapes(m, check_type=True, strict_mode=False,
                                                 data_prop=True)
    except Exception as e:  # noqa: BLE001
        if TYPE_ERROR in str(e) and "sparse_tensor(" not in str(e):
            raise TypeRefused(str(e)) from None
    try:
        return onnx.shape_inference.infer_shapes(m, check_type=False, strict_mode=False,
                                                 data_prop=True)
    except Exception as e:  # noqa: BLE001
        raise InferenceFailed(f"{type(e).__name__}: {e}") from None
