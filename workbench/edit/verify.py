"""Checking an edit: onnx.checker, shape inference, and running before and after.

Every edited model goes through the loader's checks (``workbench.graph.load.load``: onnx.checker,
onnx's type check and shape inference in a helper process, the loader's own sanity checks),
then runs in the engine (``workbench.backend.prepare``) on sample inputs. An edit that should
keep what the model computes (rename, bypass of an Identity, re-batch, opset change, extract)
is run before and after on the same inputs and the outputs compared; an edit that changes the
function says so, and is only required to run.

Sample inputs are generated from the inputs' declared types (a fixed seed): floats from a
normal distribution, integers below the size of the embedding table they index (0/1 when they
index none), booleans at random, strings from the categories the model's nodes list. Symbolic
dims take the session's ``dims`` (by dim name) or 2 on the first axis and 8 elsewhere. Real
inputs given to the session (``edit.open(..., inputs=...)``) are used instead where they fit.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass, field

import numpy as np
import onnx

from workbench.arrays.dtypes import dtype_name, np_dtype_of_onnx
from workbench.edit.errors import EditError
from workbench.edit.state import ModelState, elem_type, shape_of
from workbench.errors import ModelLoadError, WorkbenchError, shorten
from workbench.ops import registry

#: normalised max error (max|after - before| / max|before|) under which float outputs count
#: as the same (the engine may fuse differently after an edit; float32 rounding differs)
SAME_TOL = 1e-4
#: default size of a symbolic dim in generated inputs (first axis, other axes)
DEFAULT_BATCH, DEFAULT_DIM = 2, 8
SEED = 0

KEEPS, CHANGES, APPROX = "keeps", "changes", "approx"


@dataclass
class Intent:
    """What an edit means for the function, and how to compare before and after.

    ``kind``: KEEPS (outputs must match), APPROX (compared and reported, e.g. float16
    weights), CHANGES (only required to run). ``outputs``: after-output -> before-value to
    compare with (default: the outputs both have, by name). ``inputs``: after-input ->
    ("input", before-input) or ("value", before-value): where the after model's feed comes
    from (default: the before input of the same name). ``reason``: said in the check."""

    kind: str = CHANGES
    reason: str = ""
    outputs: dict | None = None
    inputs: dict = field(default_factory=dict)
    #: a comparison of its own: callable(checker, model_before, model_after) -> (errors by
    #: label, notes); replaces the output-by-output comparison (re-shape uses it)
    custom: object = None
    rewrites: list = field(default_factory=list)


@dataclass
class Check:
    """The result of checking one edit (printed with the edit)."""

    static: str = "not run"        # "ok", or why not
    ran: bool | None = None        # the edited model ran on the sample inputs
    kind: str = CHANGES
    same: bool | None = None       # outputs matched (KEEPS / APPROX), None = not compared
    errors: dict = field(default_factory=dict)   # output -> normalised max error
    notes: list = field(default_factory=list)
    reason: str = ""
    not_run: str = ""              # why the run check did not run

    @property
    def ok(self) -> bool:
        return self.static == "ok" and self.ran is not False and (
            self.kind != KEEPS or self.same is not False)

    def summary(self) -> str:
        parts = ["onnx.checker + shape inference " + ("ok" if self.static == "ok"
                                                      else self.static)]
        if self.ran is True:
            parts.append("runs")
        elif self.ran is None:
            parts.append("not run" + (f" ({self.not_run})" if self.not_run else ""))
        else:
            parts.append("does not run")
        if self.kind == CHANGES:
            parts.append("changes the function" + (f": {self.reason}" if self.reason else "")
                         + " (not compared)")
        elif self.same is None:
            parts.append("same function: not compared")
        else:
            worst = max(self.errors.values(), default=0.0)
            word = "same outputs" if self.same else "DIFFERENT outputs"
            if self.kind == APPROX:
                word = "approximately the same function:"
            parts.append(f"{word} ({len(self.errors)} compared, max error {worst:.2g})")
        return "; ".join(parts)

    def to_dict(self) -> dict:
        return {"static": self.static, "ran": self.ran, "kind": self.kind, "same": self.same,
                "errors": {k: float(v) for k, v in self.errors.items()},
                "notes": list(self.notes), "reason": self.reason, "not_run": self.not_run,
                "ok": self.ok,
                "summary": self.summary()}

    def __repr__(self) -> str:
        return f"Check({self.summary()})"


# ---------------------------------------------------------------------------- static checks
def static_check(m: onnx.ModelProto):
    """The loader's checks of a model (a ``ModelState.light()`` is enough): version and
    attribute sanity, then onnx.checker, onnx's type check and shape inference in the
    loader's helper process. Returns (the model with inferred value_info, [messages of a
    shape-inference failure]); raises EditError when the model is refused."""
    from workbench.graph.load import check_and_infer, check_attributes, check_versions  # noqa

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            check_versions(m)
            check_attributes(m)
            inferred = check_and_infer(m, check=True, infer=True)
        except ModelLoadError as e:
            raise EditError(f"the edited model is not valid: {e}") from None
    failed = [str(w.message) for w in caught if "shape inference failed" in str(w.message)]
    return inferred, failed


# ---------------------------------------------------------------------------- sample inputs
class Samples:
    """Generates and remembers sample inputs (by input name) for one session."""

    def __init__(self, given: dict | None = None, dims: dict | None = None, seed: int = SEED):
        self.given = {k: np.asarray(v) if not isinstance(v, (list, dict)) else v
                      for k, v in (given or {}).items()}
        self.dims = dict(dims or {})
        self.seed = seed

    def dim_size(self, d, axis: int) -> int:
        if isinstance(d, int) and d > 0:
            return d
        if isinstance(d, str) and d in self.dims:
            return int(self.dims[d])
        return DEFAULT_BATCH if axis == 0 else DEFAULT_DIM

    def shape_for(self, vi: onnx.ValueInfoProto) -> tuple | None:
        shp = shape_of(vi)
        if shp is None:
            return None
        return tuple(self.dim_size(d, k) for k, d in enumerate(shp))

    def feeds(self, m: onnx.ModelProto, overrides: dict | None = None) -> dict:
        """Inputs for every graph input of ``m`` (given, overridden or generated)."""
        inits = {t.name for t in m.graph.initializer}
        out = {}
        for k, vi in enumerate(v for v in m.graph.input if v.name not in inits):
            if overrides and vi.name in overrides:
                out[vi.name] = overrides[vi.name]
                continue
            g = self.given.get(vi.name)
            if g is not None and _fits(g, vi):
                out[vi.name] = g
                continue
            out[vi.name] = self.generate(m, vi, k)
        return out

    def generate(self, m: onnx.ModelProto, vi: onnx.ValueInfoProto, k: int, shape=None):
        if not vi.type.HasField("tensor_type"):
            raise _NoSample(f"input {vi.name!r} is a {vi.type.WhichOneof('value')}, not a "
                            f"tensor; give sample inputs (edit.open(..., inputs=...))")
        et = elem_type(vi)
        shape = self.shape_for(vi) if shape is None else tuple(shape)
        if shape is None:
            raise _NoSample(f"input {vi.name!r} has no declared rank; give sample inputs")
        n = int(np.prod(shape)) if shape else 1
        if n > 2**26:
            raise _NoSample(f"input {vi.name!r} would have {n:,} elements {shape}; give "
                            f"smaller sizes for its symbolic dims (dims=...) or sample inputs")
        rng = np.random.default_rng([self.seed, k, *shape])
        try:
            dt = np_dtype_of_onnx(et)
        except TypeError as e:
            raise _NoSample(f"input {vi.name!r}: {e}") from None
        if dt == np.dtype(object):
            cats = _string_categories(m, vi.name) or ["a", "b"]
            return np.asarray(rng.choice(cats, size=shape), dtype=object)
        if dt == np.bool_:
            return rng.random(shape) < 0.5
        if dt.kind in "iu":
            high = _index_bound(m, vi.name)
            return rng.integers(0, high, size=shape).astype(dt)
        if dt.kind == "c":
            return (rng.standard_normal(shape) + 1j * rng.standard_normal(shape)).astype(dt)
        return rng.standard_normal(shape).astype(np.float32).astype(dt)


class _NoSample(Exception):
    pass


def _fits(a, vi) -> bool:
    if not isinstance(a, np.ndarray):
        return True
    shp = shape_of(vi)
    if shp is None:
        return True
    if len(shp) != a.ndim:
        return False
    for d, s in zip(shp, a.shape):
        if isinstance(d, int) and d > 0 and d != s:
            return False
    et = elem_type(vi)
    try:
        want = np_dtype_of_onnx(et)
    except TypeError:
        return True
    return a.dtype == want or (want == np.dtype(object) and a.dtype.kind in "OUS")


def _moves_values(n) -> bool:
    """Whether node ``n`` only moves, selects or re-types its input's values (the registry's
    "shape" category: Reshape, Transpose, Slice, Concat, Cast, Split, ...), so integers it
    passes on stay within the values it read; Shape/Size (``shape_only``) make new ones."""
    dom = n.domain or ""
    return registry.category(n.op_type, dom) == "shape" and not registry.facts(
        n.op_type, dom).shape_only


def _index_bound(m: onnx.ModelProto, name: str, depth: int = 0) -> int:
    """Integers fed to ``name`` stay below the smallest table they index through Gather or
    an embedding-like op (followed through a few reshaping ops); 2 when none."""
    inits = {t.name: t for t in m.graph.initializer}
    consts = {n.output[0]: n for n in m.graph.node if n.op_type == "Constant" and n.output}
    best = None
    for n in m.graph.node:
        if name not in n.input:
            continue
        if n.op_type in ("Gather", "GatherElements") and len(n.input) > 1 and \
                n.input[1] == name:
            axis = next((a.i for a in n.attribute if a.name == "axis"), 0)
            dims = None
            if n.input[0] in inits:
                dims = list(inits[n.input[0]].dims)
            elif n.input[0] in consts:
                t = next((a.t for a in consts[n.input[0]].attribute if a.name == "value"), None)
                dims = list(t.dims) if t is not None else None
            if dims:
                size = dims[axis if axis >= 0 else axis + len(dims)]
                best = size if best is None else min(best, size)
        elif n.op_type == "OneHot" or (_moves_values(n) and depth < 4 and n.input[0] == name):
            if n.op_type == "OneHot":
                continue
            for o in n.output:
                b = _index_bound(m, o, depth + 1)
                if b != 2:
                    best = b if best is None else min(best, b)
    return int(max(1, best)) if best is not None else 2


def _string_categories(m: onnx.ModelProto, name: str, depth: int = 0) -> list:
    cats = []
    for n in m.graph.node:
        if name not in n.input:
            continue
        for a in n.attribute:
            if a.type == onnx.AttributeProto.STRINGS and a.name in (
                    "cats_strings", "keys_strings", "classes_strings"):
                cats.extend(s.decode("utf-8", "replace") for s in a.strings)
        if not cats and depth < 3 and _moves_values(n):
            for o in n.output:
                cats.extend(_string_categories(m, o, depth + 1))
    return list(dict.fromkeys(cats))[:64]


# ---------------------------------------------------------------------------- running
def with_outputs(m: onnx.ModelProto, names, typed: onnx.ModelProto | None = None):
    """A copy of ``m`` whose graph also outputs ``names`` (types from ``typed``'s value_info
    where known)."""
    out = onnx.ModelProto()
    out.CopyFrom(m)
    have = {o.name for o in out.graph.output}
    known = {}
    if typed is not None:
        for v in list(typed.graph.value_info) + list(typed.graph.input) + \
                list(typed.graph.output):
            known[v.name] = v
    for t in m.graph.initializer:
        known.setdefault(t.name, onnx.helper.make_tensor_value_info(t.name, t.data_type,
                                                                    list(t.dims)))
    for name in names:
        if name in have:
            continue
        vi = out.graph.output.add()
        if name in known:
            vi.CopyFrom(known[name])
        else:
            vi.name = name
        have.add(name)
    return out


def prepare(m: onnx.ModelProto, *, check: bool = True, optimize: bool = False):
    import workbench.backend as backend  # noqa: PLC0415

    return backend.prepare(m, check=check, optimize=optimize)


def run(m: onnx.ModelProto, feeds: dict, *, check: bool = True, optimize: bool = False) -> dict:
    """Run ``m`` on ``feeds``; the outputs by name. The checks run the graph as written
    (``optimize=False``): every node of the edited model runs, and preparing costs less."""
    return runner(m, check=check, optimize=optimize)(feeds)


def runner(m: onnx.ModelProto, *, check: bool = True, optimize: bool = False):
    """``m`` prepared once: a function feeds -> outputs by name."""
    rep = prepare(m, check=check, optimize=optimize)

    def call(feeds: dict) -> dict:
        return dict(zip(rep.output_names, rep.run(dict(feeds))))
    return call


def error_text(e: BaseException) -> str:
    if isinstance(e, WorkbenchError):
        return shorten(str(e), 800)
    return shorten(f"{type(e).__name__}: {e}", 800)


# ---------------------------------------------------------------------------- comparing
def compare(after, before) -> float:
    """Normalised max error between two outputs (0 when equal); inf when their kinds,
    shapes or dtypes differ."""
    if isinstance(before, np.ndarray) or isinstance(after, np.ndarray):
        a, b = np.asarray(after), np.asarray(before)
        if a.shape != b.shape or a.dtype != b.dtype:
            return math.inf
        if a.dtype.kind in "fc":
            a64, b64 = a.astype(np.complex128 if a.dtype.kind == "c" else np.float64), \
                b.astype(np.complex128 if b.dtype.kind == "c" else np.float64)
            same_nan = np.isnan(a64) == np.isnan(b64)
            if not same_nan.all():
                return math.inf
            fin = ~np.isnan(a64)
            if not fin.any():
                return 0.0
            inf_a, inf_b = np.isinf(a64[fin]), np.isinf(b64[fin])
            if (inf_a != inf_b).any() or (a64[fin][inf_a] != b64[fin][inf_b]).any():
                return math.inf
            fa, fb = a64[fin][~inf_a], b64[fin][~inf_b]
            if fa.size == 0:
                return 0.0
            diff = float(np.max(np.abs(fa - fb)))
            scale = float(np.max(np.abs(fb)))
            return diff / scale if scale > 0 else diff
        if a.dtype.kind == "O":
            return 0.0 if all(str(x) == str(y) for x, y in zip(a.ravel(), b.ravel())) \
                else math.inf
        return 0.0 if np.array_equal(a, b) else math.inf
    if isinstance(before, dict) and isinstance(after, dict):
        if set(before) != set(after):
            return math.inf
        return max((compare(np.asarray(after[k]), np.asarray(before[k])) for k in before),
                   default=0.0)
    if isinstance(before, (list, tuple)) and isinstance(after, (list, tuple)):
        if len(before) != len(after):
            return math.inf
        return max((compare(x, y) for x, y in zip(after, before)), default=0.0)
    return 0.0 if before == after else math.inf


def describe_value(v) -> str:
    if isinstance(v, np.ndarray):
        try:
            from workbench.arrays.dtypes import onnx_dtype_of_np  # noqa: PLC0415
            dn = dtype_name(onnx_dtype_of_np(v.dtype))
        except TypeError:
            dn = str(v.dtype)
        return f"{dn}{list(v.shape)}"
    if isinstance(v, list):
        return f"sequence of {len(v)}"
    return type(v).__name__


# ---------------------------------------------------------------------------- the check
class Checker:
    """Runs the checks of one session (its sample inputs; the last state's outputs cached)."""

    def __init__(self, samples: Samples):
        self.samples = samples
        self._cache: dict = {}    # id(state) -> (state, feeds, outputs)

    def reference(self, state: ModelState, model: onnx.ModelProto | None = None):
        """(feeds, outputs) of ``state`` on the sample inputs (cached)."""
        hit = self._cache.get(id(state))
        if hit is not None and hit[0] is state:
            return hit[1], hit[2]
        feeds = self.samples.feeds(state.stub())
        outs = run(model if model is not None else state.model(), feeds)
        self._remember(state, feeds, outs)
        return feeds, outs

    def _remember(self, state, feeds, outs) -> None:
        if len(self._cache) > 4:
            self._cache.pop(next(iter(self._cache)))
        self._cache[id(state)] = (state, feeds, outs)

    def check(self, before: ModelState, after: ModelState, intent: Intent,
              mode: str = "run") -> Check:
        """Check ``after`` (made from ``before`` by an edit with ``intent``). Raises EditError
        when the edited model is invalid or does not run where the model before did, or (for
        KEEPS) when its outputs differ."""
        chk = Check(kind=intent.kind, reason=intent.reason)
        _, infer_failed = static_check(after.light())
        if infer_failed:
            _, before_failed = static_check(before.light())
            if not before_failed:
                chk.static = "shape inference fails"
                raise EditError("the edited model fails onnx shape inference (the model before "
                                "the edit did not): " + shorten(infer_failed[0], 600), check=chk)
            chk.notes.append("onnx shape inference fails on this model (it did before the "
                             "edit too)")
        chk.static = "ok"
        if mode == "static":
            chk.ran = None
            chk.not_run = "run check switched off"
            return chk
        lazy = _Lazy(before)
        try:
            feeds_b, outs_b = self._before(before, lazy, intent)
        except Exception as e:  # noqa: BLE001 - any failure: the model before cannot be run
            chk.ran = None
            chk.not_run = ("the model before the edit did not run on the sample inputs: "
                           + error_text(e) + "; give sample inputs (edit.open(..., inputs=...)) "
                           "to have edits checked by running")
            return chk
        stub_after = after.stub()
        feeds_a = self._after_feeds(stub_after, feeds_b, outs_b, intent)
        m_after = after.model()
        try:
            outs_a = run(m_after, feeds_a)
        except Exception as e:  # noqa: BLE001
            chk.ran = False
            raise EditError("the edited model does not run on the sample inputs (the model "
                            "before the edit did): " + error_text(e), check=chk) from None
        chk.ran = True
        self._remember(after, feeds_a, outs_a)   # the next edit's "before"
        if intent.kind == CHANGES:
            return chk
        bad = []
        if intent.custom is not None:
            try:
                errors, notes = intent.custom(self, lazy.get(), m_after)
            except EditError:
                raise
            except Exception as e:  # noqa: BLE001
                chk.same = False
                raise EditError("the edited model fails its comparison with the model before: "
                                + error_text(e), check=chk) from None
            chk.notes.extend(notes)
            for label, err in errors.items():
                chk.errors[label] = err
                if err > SAME_TOL:
                    bad.append(f"{label!r}: " + ("different shape/dtype" if math.isinf(err)
                                                 else f"max error {err:.3g}"))
        else:
            pairs = intent.outputs if intent.outputs is not None else {
                k: k for k in outs_a if k in outs_b}
            for a_name, b_name in pairs.items():
                if a_name not in outs_a or b_name not in outs_b:
                    continue
                err = compare(outs_a[a_name], outs_b[b_name])
                chk.errors[a_name] = err
                if err > SAME_TOL:
                    bad.append(f"{a_name!r}: " + (
                        "different shape/dtype/kind: "
                        f"{describe_value(outs_a[a_name])} vs {describe_value(outs_b[b_name])}"
                        if math.isinf(err) else f"max error {err:.3g}"))
        chk.same = not bad if chk.errors else None
        if bad and intent.kind == KEEPS:
            hint = ""
            if any("per sample" in b for b in bad):
                hint = (" (a sample's outputs depend on the other samples of the batch: this "
                         "model does not treat that axis as a batch; reshape_inputs changes the "
                         "shape without the per-sample comparison)")
            raise EditError("the edit should keep what the model computes, but outputs differ "
                            "on the sample inputs: " + "; ".join(bad) + hint, check=chk)
        return chk

    def _before(self, state: ModelState, lazy, intent: Intent):
        outputs = {o.name for o in state.skeleton.graph.output}
        extra = [src for kind, src in intent.inputs.values() if kind == "value"]
        if intent.outputs:
            extra += [b for b in intent.outputs.values() if b not in outputs]
        if not extra:
            hit = self._cache.get(id(state))
            if hit is not None and hit[0] is state:
                return hit[1], hit[2]
            return self.reference(state, lazy.get())
        feeds = self.samples.feeds(state.stub())
        typed = _typed(state.light())
        m = with_outputs(lazy.get(), extra, typed)
        return feeds, run(m, feeds, check=False)

    def _after_feeds(self, stub_after, feeds_b, outs_b, intent: Intent) -> dict:
        over = {}
        inits = {t.name for t in stub_after.graph.initializer}
        for vi in stub_after.graph.input:
            if vi.name in inits:
                continue
            src = intent.inputs.get(vi.name)
            if src is not None:
                kind, name = src
                pool = feeds_b if kind == "input" else outs_b
                if name in pool:
                    over[vi.name] = pool[name]
                continue
            if vi.name in feeds_b and _fits(feeds_b[vi.name], vi):
                over[vi.name] = feeds_b[vi.name]
        return self.samples.feeds(stub_after, over)


class _Lazy:
    """The full ModelProto of a state, built on first use."""

    def __init__(self, state: ModelState):
        self.state, self.m = state, None

    def get(self) -> onnx.ModelProto:
        if self.m is None:
            self.m = self.state.model()
        return self.m


def infer_types(state: ModelState, names, samples: Samples | None = None) -> dict:
    """name -> ValueInfoProto for values of ``state``'s model: from shape inference, else
    (dtype and rank only) from a run on sample inputs. Names whose type stays unknown are
    left out."""
    light = state.light()
    typed = _typed(light) or light
    known = {v.name: v for v in list(typed.graph.value_info) + list(typed.graph.input)
             + list(typed.graph.output)}
    for name, t in state.initializers.items():
        known[name] = onnx.helper.make_tensor_value_info(name, t.data_type, list(t.dims))
    for n in state.skeleton.graph.node:
        if n.op_type == "Constant" and n.output and n.output[0] in names:
            for a in n.attribute:
                if a.name == "value":
                    known.setdefault(n.output[0], onnx.helper.make_tensor_value_info(
                        n.output[0], a.t.data_type, list(a.t.dims)))
    missing = [n for n in names if n not in known or not _typed_vi(known[n])
               or shape_of(known[n]) is None and known[n].type.HasField("tensor_type")]
    if missing and samples is not None:
        ran = _types_by_running(state, missing, samples)
        for n, vi in ran.items():
            old = known.get(n)
            if old is not None and _typed_vi(old) and elem_type(old) != elem_type(vi):
                continue   # inference and the run disagree: keep inference's type
            known[n] = vi
    return {n: known[n] for n in names if n in known and _typed_vi(known[n])}


def _typed_vi(vi) -> bool:
    kind = vi.type.WhichOneof("value")
    if kind == "tensor_type":
        return vi.type.tensor_type.elem_type != 0
    return kind is not None


def _types_by_running(state: ModelState, names, samples: Samples) -> dict:
    from workbench.arrays.dtypes import onnx_dtype_of_np  # noqa: PLC0415
    try:
        outs = run(with_outputs(state.model(), names), samples.feeds(state.stub()),
                   check=False, optimize=False)
    except Exception:  # noqa: BLE001 - the types stay unknown; the checks will say why
        return {}
    out = {}
    for n in names:
        v = outs.get(n)
        if isinstance(v, np.ndarray):
            try:
                et = onnx_dtype_of_np(v.dtype)
            except TypeError:
                continue
            out[n] = onnx.helper.make_tensor_value_info(n, et, [None] * v.ndim)
    return out


def refresh_outputs(draft, samples: Samples | None = None) -> list:
    """Make the declared graph outputs of ``draft`` (changed in place) agree with what the
    graph computes: an element type or rank that inference (or a run) contradicts is
    replaced, fixed dims it contradicts are replaced, symbolic names the user gave are kept.
    Returns notes."""
    probe_sk = onnx.ModelProto()
    probe_sk.CopyFrom(draft.m)
    for o in probe_sk.graph.output:
        o.ClearField("type")
    names = [o.name for o in draft.g.output]
    found = infer_types(ModelState(probe_sk, draft.inits), names, samples)
    notes = []
    for o in draft.g.output:
        new = found.get(o.name)
        if new is None or not new.type.HasField("tensor_type"):
            continue
        if not o.type.HasField("tensor_type") or o.type.tensor_type.elem_type == 0:
            o.type.CopyFrom(new.type)
            continue
        old_et, new_et = o.type.tensor_type.elem_type, new.type.tensor_type.elem_type
        old_s, new_s = shape_of(o), shape_of(new)
        if old_et != new_et:
            o.type.tensor_type.elem_type = new_et
            notes.append(f"output {o.name!r} is now {dtype_name(new_et)} (was "
                         f"{dtype_name(old_et)})")
        if new_s is None:
            continue
        new_s = [None if isinstance(x, str) and x.startswith("unk__") else x for x in new_s]
        if old_s is None or len(old_s) != len(new_s):
            merged = new_s
        else:   # inferred ints win; the user's names stay where inference has no int
            merged = [n if isinstance(n, int) else (p if isinstance(p, str) else n)
                      for p, n in zip(old_s, new_s)]
        if merged != old_s:
            from workbench.edit.state import set_shape  # noqa: PLC0415
            set_shape(o, merged)
            notes.append(f"output {o.name!r} declared {_dims_text(merged)} (was "
                         f"{_dims_text(old_s)})")
    return notes


def _dims_text(dims) -> str:
    if dims is None:
        return "rank unknown"
    return "[" + ", ".join("?" if x is None else str(x) for x in dims) + "]"


def _typed(m: onnx.ModelProto) -> onnx.ModelProto | None:
    """``m`` (a light model) with the types shape inference finds (no checker: ``m`` may be a
    probe with untyped outputs); None when inference cannot run."""
    from workbench.graph.load import check_and_infer  # noqa: PLC0415
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            return check_and_infer(m, check=False, infer=True)
        except ModelLoadError:
            return None
