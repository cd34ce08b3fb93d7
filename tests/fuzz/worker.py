"""The fuzzer's worker process: runs cases one at a time, fed over stdin/stdout.

Started by :mod:`tests.fuzz.harness` as ``python -m tests.fuzz.worker`` in its own session (so
a timeout kills it with any helper process it started). Protocol: each message is an 8-byte
little-endian length and a pickle. The worker first sends ``{"ready": True}``; each request is
``{"case": Case, "mode": "ours" | "ort"}`` and each reply a result dict
``{"cls", "error_type", "message", "frame", "seconds", "exit"}``; ``exit`` asks the harness to
restart the worker (after a MemoryError its heap may be in any state).

Set-up, once: an address-space limit (``WBFUZZ_MEMORY_LIMIT`` bytes, default 3 GiB), the
engine's memory budget below it (``WORKBENCH_MEMORY_BUDGET``, set by the harness), a private
temporary folder, sentinel files ``secret.txt`` holding a random marker in the working
directory and in a folder under /tmp. Per case: a fresh folder ``case-N`` holding a sentinel
``secret.txt`` (the model folder's parent) and ``model/`` with ``model.onnx`` and the case's
extra files.

Classes (ours): ``ok`` ran; ``clean`` a WorkbenchError with one clear message; ``uncaught`` any
other exception, or a WorkbenchError whose message is empty, holds a traceback or runs past
20,000 characters; ``memory`` a MemoryError that is not a ResourceError (anywhere in the cause
chain), or an output larger than the memory budget; ``leak`` the marker in an output, an error
message or a warning. Crash and hang are decided by the harness. onnxruntime: ``ok``,
``refused`` (any exception), ``memory``, ``leak``.
"""

from __future__ import annotations

import os
import pickle
import shutil
import struct
import sys
import tempfile
import time
import traceback
import warnings

_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SECRET_NAME = "secret.txt"
SECRET_SIZE = 1 << 16


def _read_msg(f):
    head = f.read(8)
    if len(head) < 8:
        return None
    (n,) = struct.unpack("<Q", head)
    data = f.read(n)
    if len(data) < n:
        return None
    return pickle.loads(data)  # noqa: S301 - from our own harness


def _write_msg(f, obj):
    data = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    f.write(struct.pack("<Q", len(data)) + data)
    f.flush()


# --------------------------------------------------------------------------- sentinel
class Sentinel:
    """A random marker, the files that hold it, and the search for it in outputs/messages."""

    ALPHABET = b"GHJKMNPQRSTVWXYZ"

    def __init__(self):
        raw = os.urandom(24)
        self.marker = b"WBFZ" + bytes(self.ALPHABET[b % 16] for b in raw)   # 28 bytes
        self.content = (self.marker * (SECRET_SIZE // len(self.marker) + 1))[:SECRET_SIZE]
        cyc = self.marker + self.marker
        n = len(self.marker)
        self.windows4 = {cyc[i:i + 4] for i in range(n)}     # for binary outputs
        self.windows8 = {cyc[i:i + 8] for i in range(n)}     # for text (messages)

    def plant(self, folder: str) -> str:
        p = os.path.join(folder, SECRET_NAME)
        with open(p, "wb") as f:
            f.write(self.content)
        return p

    def in_bytes(self, b: bytes, text: bool = False) -> bool:
        """Whether ``b`` holds a piece of the marker: 8 bytes of it, or 4 in a value of at most
        64 bytes (a 1-element tensor read from the file; in large random outputs a 4-byte match
        happens by chance)."""
        if not b:
            return False
        if len(b) <= 64 and not text:
            return any(w in b for w in self.windows4)
        if len(b) <= 1 << 16:
            return any(w in b for w in self.windows8)
        import numpy as np  # noqa: PLC0415

        return self._scan_u8(np.frombuffer(b, np.uint8))

    def _scan_u8(self, flat) -> bool:
        """8-byte windows in a large uint8 array: a vectorised pre-filter (8 bytes in a row from
        the marker's alphabet) and an exact search only where it fires."""
        import numpy as np  # noqa: PLC0415

        lut = getattr(self, "_lut", None)
        if lut is None:
            lut = np.zeros(256, bool)
            lut[list(set(self.marker))] = True
            self._lut = lut
        step = 1 << 24
        for i in range(0, flat.size, step):
            chunk = flat[i:i + step + 7]
            if chunk.size < 8:
                break
            m = lut[chunk]
            run = m[:-7].copy()
            for k in range(1, 8):
                run &= m[k:chunk.size - 7 + k]
            if run.any():
                b = bytes(chunk)
                if any(w in b for w in self.windows8):
                    return True
        return False

    def in_value(self, v, depth: int = 0) -> bool:
        import numpy as np  # noqa: PLC0415

        if v is None or depth > 4:
            return False
        if isinstance(v, dict):
            return any(self.in_value(x, depth + 1) for x in v.values())
        if isinstance(v, (list, tuple)):
            return any(self.in_value(x, depth + 1) for x in v[:1000])
        if isinstance(v, (bytes, str)):
            return self.in_bytes(v.encode("utf-8", "replace") if isinstance(v, str) else v)
        try:
            a = np.asarray(v)
        except Exception:  # noqa: BLE001
            return False
        if a.dtype == object:
            parts = []
            for x in a.ravel()[:100000]:
                if isinstance(x, bytes):
                    parts.append(x)
                elif isinstance(x, str):
                    parts.append(x.encode("utf-8", "replace"))
                else:
                    parts.append(repr(x).encode())
            return self.in_bytes(b"\x00".join(parts))
        if a.nbytes > 1 << 16:   # large: scan without copying, no casts
            try:
                flat = np.ascontiguousarray(a).reshape(-1).view(np.uint8)
            except (TypeError, ValueError):
                return False
            return self._scan_u8(flat)
        if self.in_bytes(a.tobytes()):
            return True
        # a leaked value may have been cast on its way out: cast back to the usual types
        if a.dtype.kind in "biufc" and a.size:
            with np.errstate(all="ignore"), warnings.catch_warnings():
                warnings.simplefilter("ignore")
                for dt in (np.float32, np.float64, np.int64, np.int32, np.uint8, np.int8,
                           np.float16, np.uint16):
                    if a.dtype != dt:
                        try:
                            if self.in_bytes(a.real.astype(dt).tobytes()):
                                return True
                        except (TypeError, ValueError, OverflowError):
                            pass
        return False

    def in_exception(self, e: BaseException) -> bool:
        seen = 0
        while e is not None and seen < 10:
            try:
                txt = (str(e) + repr(e.args)).encode("utf-8", "replace")
            except Exception:  # noqa: BLE001
                txt = b""
            if self.in_bytes(txt, text=True):
                return True
            e = e.__cause__ or e.__context__
            seen += 1
        return False


# --------------------------------------------------------------------------- case set-up
TOKENS = ("@PARENT@", "@CWD@", "@TMP@", "@MODEL_DIR@")


def _substitute_model(data: bytes, mapping: dict) -> bytes:
    """Replace the tokens in every external-data string and in nothing else."""
    import onnx  # noqa: PLC0415

    from tests.fuzz.generators import iter_tensors  # noqa: PLC0415

    m = onnx.ModelProto()
    m.ParseFromString(data)
    for t in iter_tensors(m):
        for e in t.external_data:
            v = e.value
            for k, rep in mapping.items():
                v = v.replace(k, rep)
            e.value = v
    return m.SerializeToString()


def _subst_text(s: str, mapping: dict) -> str:
    for k, rep in mapping.items():
        s = s.replace(k, rep)
    return s


def place_files(model_dir: str, files, mapping: dict):
    for rel, kind, data in files:
        p = os.path.join(model_dir, rel)
        os.makedirs(os.path.dirname(p), exist_ok=True)
        if kind == "file":
            with open(p, "wb") as f:
                f.write(data)
        elif kind == "symlink":
            os.symlink(_subst_text(data, mapping), p)
        elif kind == "fifo":
            os.mkfifo(p)
        elif kind == "dir":
            os.makedirs(p, exist_ok=True)
        else:
            raise ValueError(f"unknown file kind {kind!r}")


def declared_inputs(model_bytes: bytes, seed: int):
    """Inputs made from the graph's declared input types (small sizes for symbolic dims)."""
    import numpy as np  # noqa: PLC0415
    import onnx  # noqa: PLC0415
    from onnx import helper  # noqa: PLC0415

    m = onnx.ModelProto()
    try:
        m.ParseFromString(model_bytes)
    except Exception:  # noqa: BLE001 - a broken file: no inputs
        return {}
    rng = np.random.default_rng(seed & 0xFFFFFFFF)
    inits = {t.name for t in m.graph.initializer} | {
        s.values.name for s in m.graph.sparse_initializer}
    out = {}
    for v in m.graph.input:
        if v.name in inits or not v.type.HasField("tensor_type"):
            continue
        tt = v.type.tensor_type
        try:
            dt = helper.tensor_dtype_to_np_dtype(tt.elem_type)
        except Exception:  # noqa: BLE001 - an odd dtype: leave the input out
            continue
        shape = []
        for d in tt.shape.dim:
            if d.HasField("dim_value") and 0 <= d.dim_value <= 16:
                shape.append(d.dim_value)
            else:
                shape.append(2)
        if dt.kind == "O":
            a = np.array(["a"] * int(np.prod(shape, dtype=np.int64)), dtype=object).reshape(shape)
        elif dt.kind == "b":
            a = rng.random(shape) < 0.5
        elif dt.kind in "iu":
            a = rng.integers(0, 3, size=shape).astype(dt)
        else:
            try:
                a = rng.standard_normal(shape).astype(dt)
            except (TypeError, ValueError):
                a = np.zeros(shape, dt)
        out[v.name] = a
    return out


# --------------------------------------------------------------------------- running
def _innermost(tb) -> str:
    frames = traceback.extract_tb(tb)
    if not frames:
        return ""
    f = frames[-1]
    # the innermost frame in the engine, when there is one, says more than numpy's
    engine = (os.path.join(_ROOT, "workbench") + os.sep, os.sep + "site-packages" + os.sep
              + "workbench" + os.sep)
    for fr in reversed(frames):
        if fr.filename.startswith(engine[0]) or engine[1] in fr.filename:
            f = fr
            break
    fn = f.filename
    i = fn.find("site-packages/")
    if i >= 0:
        fn = fn[i + 14:]
    elif fn.startswith(_ROOT + os.sep):
        fn = fn[len(_ROOT) + 1:]
    return f"{fn}:{f.lineno} in {f.name}"


def _memory_in_chain(e: BaseException, resource_error) -> bool:
    seen = 0
    while e is not None and seen < 10:
        if isinstance(e, MemoryError) and not (resource_error and isinstance(e, resource_error)):
            return True
        e = e.__cause__ or e.__context__
        seen += 1
    return False


def clear_message(msg: str) -> str | None:
    """Why a WorkbenchError's message is not one clear text, or None."""
    if not msg.strip():
        return "empty message"
    if "Traceback (most recent call last)" in msg:
        return "message holds a traceback"
    if len(msg) > 20000:
        return f"message of {len(msg)} characters"
    return None


class Runner:
    def __init__(self):
        self.root = tempfile.mkdtemp(prefix="wbfuzz-")
        self.cwd = os.path.join(self.root, "cwd")
        os.makedirs(self.cwd)
        os.chdir(self.cwd)
        self.tmpdir = tempfile.mkdtemp(prefix="wbfuzz-sentinel-", dir="/tmp")
        self.sentinel = Sentinel()
        self.sentinel.plant(self.cwd)
        self.sentinel.plant(self.tmpdir)
        self.n = 0
        import numpy  # noqa: F401, PLC0415
        import onnx  # noqa: F401, PLC0415

        import workbench.backend  # noqa: F401, PLC0415

        self.ort = None

    def close(self):
        shutil.rmtree(self.root, ignore_errors=True)
        shutil.rmtree(self.tmpdir, ignore_errors=True)

    def setup(self, case):
        self.n += 1
        parent = os.path.join(self.root, f"case-{self.n}")
        model_dir = os.path.join(parent, "model")
        os.makedirs(model_dir)
        self.sentinel.plant(parent)
        mapping = {"@PARENT@": parent, "@CWD@": self.cwd, "@TMP@": self.tmpdir,
                   "@MODEL_DIR@": model_dir}
        data = case.model
        if case.substitute:
            data = _substitute_model(data, mapping)
        path = os.path.join(model_dir, "model.onnx")
        with open(path, "wb") as f:
            f.write(data)
        place_files(model_dir, case.files, mapping)
        if case.feed == "path_via_link":   # the folder reached through a symlink
            alias = os.path.join(parent, "alias")
            os.symlink(model_dir, alias)
            path = os.path.join(alias, "model.onnx")
        if case.inputs is not None:
            inputs = {k: v for k, v in case.inputs}
        else:
            inputs = declared_inputs(data, case.seed)
        return parent, model_dir, path, data, inputs

    def run(self, case, mode: str) -> dict:
        if mode == "selftest_crash":     # the harness's own tests: die by a signal
            os.kill(os.getpid(), 11)
        if mode == "selftest_hang":      # ... or never answer
            time.sleep(3600)
        if mode == "selftest_memory":    # ... or run into the address-space limit
            import numpy as np  # noqa: PLC0415

            np.ones(1 << 40, np.uint8)
        parent, model_dir, path, data, inputs = self.setup(case)
        t0 = time.perf_counter()
        try:
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                if mode == "ort":
                    res = self._run_ort(case, path, data, inputs)
                else:
                    res = self._run_ours(case, path, model_dir, data, inputs)
            # a warning is a message to the user too
            text = "\n".join(str(w.message) for w in caught[:1000])
            if res["cls"] != "leak" and self.sentinel.in_bytes(
                    text.encode("utf-8", "replace"), text=True):
                res.update(cls="leak", where="warning", message=text[:2000])
        finally:
            shutil.rmtree(parent, ignore_errors=True)
        res["seconds"] = round(time.perf_counter() - t0, 4)
        return res

    def _classify_exc(self, e, ours: bool) -> dict:
        import workbench.errors as errs  # noqa: PLC0415

        resource_error = getattr(errs, "ResourceError", None)
        msg = str(e)
        res = {"error_type": f"{type(e).__module__}.{type(e).__qualname__}",
               "message": msg[:2000], "frame": _innermost(e.__traceback__), "exit": False}
        if self.sentinel.in_exception(e):
            res["cls"] = "leak"
            res["where"] = "error message"
        elif _memory_in_chain(e, resource_error):
            res["cls"] = "memory"
            res["exit"] = True
        elif not ours:
            res["cls"] = "refused"
        elif isinstance(e, errs.WorkbenchError):
            why = clear_message(msg)
            res["cls"] = "clean" if why is None else "uncaught"
            if why:
                res["why"] = why
        else:
            res["cls"] = "uncaught"
        return res

    def _outputs_leak(self, outs) -> bool:
        return any(self.sentinel.in_value(o) for o in outs)

    @staticmethod
    def _over_budget(outs) -> str | None:
        """An output larger than the engine's memory budget (it should have been refused)."""
        try:
            from workbench import limits  # noqa: PLC0415

            budget = limits.memory_budget()
        except Exception:  # noqa: BLE001 - no budget in this engine
            return None
        for i, o in enumerate(outs):
            n = getattr(o, "nbytes", 0)
            if isinstance(n, int) and n > budget:
                return (f"output {i} of {n} bytes (shape {getattr(o, 'shape', '?')}) passed the "
                        f"memory budget of {budget} bytes")
        return None

    def _run_ours(self, case, path, model_dir, data, inputs) -> dict:
        import workbench.backend as backend  # noqa: PLC0415

        try:
            if case.feed in ("path", "path_via_link"):
                rep = backend.prepare(path)
            elif case.feed == "path_nocheck":
                rep = backend.prepare(path, check=False)
            elif case.feed == "bytes":
                rep = backend.prepare(data)
            elif case.feed == "proto":
                import onnx  # noqa: PLC0415

                proto = onnx.ModelProto()
                proto.ParseFromString(data)
                rep = backend.prepare(proto)
            else:
                rep = backend.prepare(data, base_dir=model_dir)
            outs = rep.run(inputs)
            outs = list(outs) if isinstance(outs, (tuple, list)) else [outs]
        except BaseException as e:  # noqa: BLE001 - classify everything
            if isinstance(e, (KeyboardInterrupt, SystemExit)):
                res = self._classify_exc(e, True)
                res["cls"] = "uncaught"
                return res
            return self._classify_exc(e, True)
        over = self._over_budget(outs)
        if over:
            return {"cls": "memory", "error_type": "(no error)", "message": over, "exit": True}
        if self._outputs_leak(outs):
            return {"cls": "leak", "where": "output", "exit": False,
                    "message": f"{len(outs)} outputs"}
        return {"cls": "ok", "exit": False}

    def _run_ort(self, case, path, data, inputs) -> dict:
        try:
            if self.ort is None:
                import onnxruntime as ort  # noqa: PLC0415

                ort.set_default_logger_severity(4)
                self.ort = ort
            ort = self.ort
            so = ort.SessionOptions()
            so.intra_op_num_threads = 1
            so.inter_op_num_threads = 1
            so.log_severity_level = 4
            src = data if case.feed in ("bytes", "proto") else path
            sess = ort.InferenceSession(src, so, providers=["CPUExecutionProvider"])
            names = [i.name for i in sess.get_inputs()]
            feeds = {k: v for k, v in inputs.items() if k in names}
            outs = sess.run(None, feeds)
        except BaseException as e:  # noqa: BLE001
            return self._classify_exc(e, False)
        if self._outputs_leak(outs):
            return {"cls": "leak", "where": "output", "exit": False}
        return {"cls": "ok", "exit": False}


def _limit_memory():
    lim = int(os.environ.get("WBFUZZ_MEMORY_LIMIT", str(3 * 2**30)))
    if lim > 0:
        try:
            import resource  # noqa: PLC0415

            resource.setrlimit(resource.RLIMIT_AS, (lim, lim))
        except (ImportError, ValueError, OSError):
            pass


def main():
    from tests.fuzz.generators import Case  # noqa: PLC0415

    # replies go to the original stdout; anything the engine or a library prints goes to stderr
    out = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    inp = os.fdopen(os.dup(0), "rb")
    _limit_memory()
    runner = Runner()
    try:
        _write_msg(out, {"ready": True, "pid": os.getpid(),
                         "dirs": [runner.root, runner.tmpdir]})
        while True:
            req = _read_msg(inp)
            if req is None:
                break
            case = req["case"]
            if isinstance(case, dict):
                case = Case.from_json(case)
            try:
                res = runner.run(case, req.get("mode", "ours"))
            except MemoryError as e:
                res = {"cls": "memory", "error_type": type(e).__name__, "message": str(e)[:500],
                       "frame": _innermost(e.__traceback__), "exit": True}
            except Exception as e:  # noqa: BLE001 - the fuzzer's own failure (setting up a case)
                res = {"cls": "uncaught", "error_type": f"FUZZER {type(e).__name__}",
                       "message": str(e)[:500], "frame": _innermost(e.__traceback__),
                       "exit": False}
            _write_msg(out, res)
            if res.get("exit"):
                break
    finally:
        runner.close()


if __name__ == "__main__":
    main()
