"""The kernel registry: one registration next to each kernel.

A kernel is a plain named function registered for an ONNX op and the opset version that
introduced the behaviour it implements::

    @kernel("LeakyRelu", since=6)
    def leaky_relu(x, *, alpha):
        xp = xp_of(x)
        return xp.where(x >= 0, x, x * x.dtype.type(alpha))

Lookup takes the newest ``since`` not above the model's opset for that domain. Inputs arrive
positionally in spec order (``None`` for omitted optional inputs), attributes as keyword
arguments under their spec names; attributes with a default in the spec are always passed, with
the spec's default (read from ``onnx.defs``, never retyped). A kernel returns one array, or a
tuple of arrays for several outputs (a Python ``list`` is a single *sequence* value).

Kernels that need to know about the node (number of outputs, node name, opset, a random
generator) ask for it with ``wants_ctx=True`` and receive ``ctx=`` a :class:`NodeContext`.
Graph-valued attributes (If/Loop/Scan bodies) arrive as callables: ``body(*inputs) -> list``.

Device-specific fast paths are *overrides* registered for an array module::

    @kernel("Conv", since=1, xp="cupy")
    def conv_cuda(X, W, B=None, *, ...): ...

``lookup(..., xp="cupy")`` (what a Plan built for a CUDA device asks) returns the override when
one exists for the same behaviour (its ``since`` is not older than the portable kernel's it
would replace), else the portable kernel. An override has the portable kernel's signature and
falls back to it (``portable(op_type, since)``) for attribute combinations it does not handle.

Facts about an op that the engine needs besides its kernel are given in the same decorator and
queried with :func:`facts` / :func:`category` (no tables of op names elsewhere)::

    @kernel("Reshape", since=14, host_read_inputs=(1,), host_shape_math=True, category="shape")

- ``category``: the family the graph viewer colours it by ("layer", "activation", "shape"...).
- ``host_read_inputs``: input positions a kernel reads on the host as Python numbers
  (shape-like inputs such as Reshape's ``shape``, settings such as Dropout's ``ratio``); a
  device plan keeps such values in numpy and never uploads them for that use.
- ``host_shape_math``: cheap integer shape arithmetic that a device plan runs on the host when
  every input is a host value (cheaper than a kernel launch, and no device-to-host sync).
  (Both were called ``host_inputs`` / ``host_compute`` before; those spellings are still
  accepted by :func:`kernel`/:func:`describe` and readable on :class:`OpFacts`.)
- ``settings``: input positions that hold settings rather than weights (Dropout's ratio,
  Clip's bounds...): an imported float initializer used only there is not a parameter.
- ``random``: the output depends on a random draw (never constant-folded).
- ``shape_only``: reads only the shape of its input (Shape, Size): a device plan computes it
  on the host from the array's metadata.
- ``state_inputs``: input positions that hold running statistics (buffers, not parameters).
- ``elementwise``: pointwise (each output element depends only on the inputs' elements at
  the same broadcast position, nothing else: no attributes that mix elements); the inference
  passes may fuse chains of such ops into a product's epilogue.
- ``train``: the training-mode form of the op (a kernel registered with ``train=True``), run
  by the Tensor runner for imported graphs in training mode, with ``state_outputs``
  ``{output: input}`` naming the outputs written back into stateful inputs.

``describe(op_type, domain=..., category=...)`` declares facts of an op without registering a
kernel (an op the engine only shows).

A second registration of the same kernel -- the same (domain, op_type, since) for the same
array module and mode (portable, ``xp=`` override, ``train=True`` form) -- is an error naming
both functions: a renamed or copied kernel never silently replaces another. A custom operator
that means to replace a kernel says so with ``register(..., replace=True)`` (or
``@kernel(..., replace=True)``).

``FUSED_DOMAIN`` (``com.workbench``) is the domain of the engine's internal fused operators,
which only the inference passes write (``FusedConv``, ``FusedMatMul``, ``FusedAttention``,
``FoldBatchNormWeights``); optimized graphs are never exported.
"""

from __future__ import annotations

import bisect
import functools
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import onnx
import onnx.defs
import onnx.helper

from workbench.errors import UnsupportedOperatorError

DEFAULT_DOMAIN = ""
#: the domain of the engine's internal fused operators (written by the inference passes only)
FUSED_DOMAIN = "com.workbench"
_DOMAIN_ALIASES = {"ai.onnx": ""}


def _norm_domain(domain: str | None) -> str:
    domain = domain or ""
    return _DOMAIN_ALIASES.get(domain, domain)


@dataclass(frozen=True)
class KernelEntry:
    op_type: str
    domain: str
    since: int
    fn: Callable
    wants_ctx: bool = False
    #: a training form that computes the same function as the kernel (only faster for a
    #: training step, e.g. Conv's): training does not change what the op means
    same_results: bool = False


@dataclass(frozen=True)
class OpFacts:
    """What the engine knows about an op besides its kernels (see the module docstring)."""

    category: str = "other"
    host_read_inputs: tuple = ()   # input positions read on the host as Python numbers
    host_shape_math: bool = False  # integer shape arithmetic a device plan runs on the host
    settings: tuple = ()
    random: bool = False
    state_inputs: tuple = ()
    state_outputs: tuple = ()      # ((output index, input index), ...) of the training form
    shape_only: bool = False       # reads only its input's shape (Shape, Size)
    elementwise: bool = False      # pointwise: output[i] depends on the inputs' [i] only
    output_view: str = ""          # "view": the kernel returns views of input 0 (no new array);
                                   # "view-unless-strided": a view, a copy of a strided input

    @property
    def host_inputs(self) -> tuple:
        """Old name of :attr:`host_read_inputs`."""
        return self.host_read_inputs

    @property
    def host_compute(self) -> bool:
        """Old name of :attr:`host_shape_math`."""
        return self.host_shape_math


#: fact names accepted under their old spellings
_OLD_FACT_NAMES = {"host_inputs": "host_read_inputs", "host_compute": "host_shape_math"}


_NO_FACTS = OpFacts()
# (domain, op_type) -> facts
_FACTS: dict[tuple[str, str], OpFacts] = {}
# (domain, op_type) -> sorted training-form entries
_TRAIN: dict[tuple[str, str], list[KernelEntry]] = {}
# array-module name -> (domain, op_type) -> sorted training-form overrides
_TRAIN_OVERRIDES: dict[str, dict[tuple[str, str], list[KernelEntry]]] = {}


@dataclass
class NodeContext:
    """What a kernel may know about the node it runs (only when registered ``wants_ctx``)."""

    node_name: str
    op_type: str
    opset: int
    n_outputs: int
    output_names: tuple = ()
    training: bool = False
    rng: Any = None
    extra: dict = field(default_factory=dict)


# (domain, op_type) -> sorted list of since versions / entries
_REGISTRY: dict[tuple[str, str], list[KernelEntry]] = {}
# array-module name ("cupy") -> (domain, op_type) -> sorted override entries
_OVERRIDES: dict[str, dict[tuple[str, str], list[KernelEntry]]] = {}
# modules that register the overrides of an array module, imported on its first lookup
_OVERRIDE_MODULES = {"cupy": "workbench.ops.cuda"}
_overrides_loaded: set = set()


def _xp_name(xp) -> str | None:
    if xp is None:
        return None
    if isinstance(xp, str):
        name = xp
    else:   # (not getattr's default: str(module) was built on every call, ~5 us)
        name = getattr(xp, "__name__", None)
        if name is None:
            name = str(xp)
    return None if name == "numpy" else name


def kernel(op_type: str, since: int = 1, *, domain: str = "", wants_ctx: bool = False,
           xp=None, train: bool = False, replace: bool = False, same_results: bool = False,
           **facts):
    """Register the decorated function as the kernel of ``op_type`` from opset ``since``.

    Stack several decorators to register one function for several ops or versions.
    ``xp="cupy"`` registers a device-specific override instead of the portable kernel;
    ``train=True`` the training-mode form (``same_results=True``: a form that computes the
    same function as the kernel, only another way, so the op does not behave differently in
    training: :func:`train_form_differs` is False for it); ``replace=True`` replaces a kernel
    registered for the same (domain, op_type, since, xp, train) (otherwise an error).
    Keyword ``facts`` (``category``, ``host_read_inputs``, ``host_shape_math``, ``settings``,
    ``random``, ``state_inputs``, ``state_outputs``, ``shape_only``, ``elementwise``) describe
    the op (see the module docstring).
    """

    def deco(fn: Callable) -> Callable:
        if fn.__name__ in ("_", "<lambda>"):
            raise ValueError(f"kernel for {op_type} must be a named function")
        register(op_type, fn, since=since, domain=domain, wants_ctx=wants_ctx, xp=xp,
                 train=train, replace=replace, same_results=same_results, **facts)
        return fn

    return deco


def describe(op_type: str, *, domain: str = "", **facts) -> None:
    """Record facts about ``op_type`` (merged with those given before; an op registered by
    several decorators may give each fact once)."""
    key = (_norm_domain(domain), op_type)
    facts = {_OLD_FACT_NAMES.get(k, k): v for k, v in facts.items()}
    unknown = set(facts) - set(OpFacts.__dataclass_fields__)
    if unknown:
        raise TypeError(f"unknown op facts for {op_type}: {sorted(unknown)}")
    if not facts:
        return
    for k in ("host_read_inputs", "settings", "state_inputs"):
        if k in facts:
            facts[k] = tuple(int(i) for i in facts[k])
    if "state_outputs" in facts:
        so = facts["state_outputs"]
        facts["state_outputs"] = tuple(sorted((int(o), int(i)) for o, i in
                                              (so.items() if isinstance(so, dict) else so)))
    import dataclasses  # noqa: PLC0415
    _FACTS[key] = dataclasses.replace(_FACTS.get(key, _NO_FACTS), **facts)


def facts(op_type: str, domain: str = "") -> OpFacts:
    """The facts registered for ``op_type`` (defaults for an op nobody described)."""
    return _FACTS.get((_norm_domain(domain), op_type), _NO_FACTS)


def category(op_type: str, domain: str | None = None) -> str:
    """The viewer category of ``op_type`` ("other" when unknown). With ``domain=None`` the
    op type is looked up in any domain (the standard domain first)."""
    if domain is not None:
        return facts(op_type, domain).category
    f = _FACTS.get(("", op_type))
    if f is not None:
        return f.category
    for (_, op), f in _FACTS.items():
        if op == op_type:
            return f.category
    return _NO_FACTS.category


def register(op_type: str, fn: Callable, *, since: int = 1, domain: str = "",
             wants_ctx: bool = False, xp=None, train: bool = False, replace: bool = False,
             same_results: bool = False, **facts) -> None:
    """Register ``fn`` as a kernel (the non-decorator form, for custom operators).

    A kernel already registered for the same (domain, op_type, since, xp, train) is an error
    unless ``replace=True``."""
    key = (_norm_domain(domain), op_type)
    xname = _xp_name(xp)
    if train:
        table = _TRAIN if xname is None else _TRAIN_OVERRIDES.setdefault(xname, {})
    else:
        table = _REGISTRY if xname is None else _OVERRIDES.setdefault(xname, {})
    entries = table.get(key, [])
    old = next((e for e in entries if e.since == int(since)), None)
    if old is not None and not replace:
        kind = ("training form" if train else "kernel") + (f" ({xname} override)" if xname
                                                            else "")
        raise ValueError(
            f"{key[0] or 'ai.onnx'}::{op_type} since opset {since}: a {kind} is already "
            f"registered ({_qualname(old.fn)}); registering {_qualname(fn)} as well would "
            f"replace it silently. Pass replace=True to replace it on purpose")
    describe(op_type, domain=domain, **facts)
    entries = table.setdefault(key, [])
    entries[:] = [e for e in entries if e.since != int(since)]
    entries.append(KernelEntry(op_type, key[0], int(since), fn, wants_ctx,
                               bool(train and same_results)))
    entries.sort(key=lambda e: e.since)
    attribute_defaults.cache_clear()


def _qualname(fn) -> str:
    return f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', repr(fn))}"


def unregister(op_type: str, *, domain: str = "", since: int | None = None, xp=None,
               train: bool = False) -> None:
    """Remove a registration (all versions when ``since`` is None; the op's facts go with its
    last portable kernel)."""
    key = (_norm_domain(domain), op_type)
    xname = _xp_name(xp)
    if train:
        table = _TRAIN if xname is None else _TRAIN_OVERRIDES.get(xname, {})
    else:
        table = _REGISTRY if xname is None else _OVERRIDES.get(xname, {})
    if since is None:
        table.pop(key, None)
        if table is _REGISTRY:
            _FACTS.pop(key, None)
    elif key in table:
        table[key] = [e for e in table[key] if e.since != since]


def _ensure_overrides(xname: str) -> None:
    if xname in _overrides_loaded:
        return
    _overrides_loaded.add(xname)
    mod = _OVERRIDE_MODULES.get(xname)
    if mod:
        import importlib
        importlib.import_module(mod)


def lookup(op_type: str, domain: str = "", opset: int | None = None,
           node_name: str | None = None, xp=None) -> KernelEntry:
    """The kernel for ``op_type`` at ``opset``: the newest ``since`` <= opset.

    With ``xp`` (an array module or its name, e.g. ``"cupy"``) an override registered for that
    module is preferred when its ``since`` is at least the portable kernel's.
    """
    entry = _lookup(op_type, domain, opset, node_name)
    xname = _xp_name(xp)
    if xname is None:
        return entry
    _ensure_overrides(xname)
    over = _OVERRIDES.get(xname, {}).get((entry.domain, op_type))
    if not over:
        return entry
    best = None
    for e in over:  # sorted by since
        if opset is None or e.since <= opset:
            best = e
    if best is not None and best.since >= entry.since:
        return best
    return entry


def train_form(op_type: str, domain: str = "", opset: int | None = None,
               xp=None) -> KernelEntry | None:
    """The training-mode form of ``op_type`` at ``opset`` (registered ``train=True``), or None
    when the op has none: a training step runs its kernel. A form registered with
    ``same_results=True`` computes the same function (see :func:`train_form_differs`). With
    ``xp`` an override registered for that array module (``train=True, xp="cupy"``) is
    preferred."""
    key = (_norm_domain(domain), op_type)

    def newest(entries):
        best = None
        for e in entries or ():
            if opset is None or e.since <= opset:
                best = e
        return best

    xname = _xp_name(xp)
    if xname is not None:
        over = newest(_TRAIN_OVERRIDES.get(xname, {}).get(key))
        if over is not None:
            return over
    return newest(_TRAIN.get(key))


def portable(op_type: str, since: int | None = None, domain: str = "") -> Callable:
    """The portable (array-module agnostic) kernel function of ``op_type`` at opset ``since``
    (what an override falls back to)."""
    return _lookup(op_type, domain, since, None).fn


def overrides(xp) -> dict[tuple[str, str], list[int]]:
    """{(domain, op_type): [since versions]} of the overrides registered for ``xp``."""
    xname = _xp_name(xp)
    if xname is None:
        return {}
    _ensure_overrides(xname)
    return {k: [e.since for e in v] for k, v in sorted(_OVERRIDES.get(xname, {}).items()) if v}


def _lookup(op_type: str, domain: str = "", opset: int | None = None,
            node_name: str | None = None) -> KernelEntry:
    dom = _norm_domain(domain)
    entries = _REGISTRY.get((dom, op_type))
    if not entries:
        raise UnsupportedOperatorError(op_type, dom, opset, node_name)
    if opset is None:
        return entries[-1]
    versions = [e.since for e in entries]
    i = bisect.bisect_right(versions, opset)
    if i == 0:
        raise UnsupportedOperatorError(op_type, dom, opset, node_name, versions)
    return entries[i - 1]


def has_kernel(op_type: str, domain: str = "", opset: int | None = None) -> bool:
    try:
        lookup(op_type, domain, opset)
        return True
    except UnsupportedOperatorError:
        return False


def registered_ops() -> dict[tuple[str, str], list[int]]:
    """{(domain, op_type): [since versions]} for every registered kernel."""
    return {k: [e.since for e in v] for k, v in sorted(_REGISTRY.items()) if v}


@functools.cache
def schema(op_type: str, domain: str, opset: int):
    """The onnx OpSchema of ``op_type`` at ``opset`` or None if onnx does not define it."""
    try:
        return onnx.defs.get_schema(op_type, opset, _norm_domain(domain))
    except Exception:
        return None


@functools.cache
def attribute_defaults(op_type: str, domain: str, opset: int) -> dict[str, Any]:
    """Spec defaults of the op's attributes at ``opset`` (only those that have one)."""
    s = schema(op_type, domain, opset)
    if s is None:
        return {}
    out = {}
    for name, attr in s.attributes.items():
        dv = attr.default_value
        if dv is not None and dv.type != 0:
            val = onnx.helper.get_attribute_value(dv)
            if isinstance(val, bytes):
                val = val.decode("utf-8")
            elif isinstance(val, list) and val and isinstance(val[0], bytes):
                val = [v.decode("utf-8") for v in val]
            out[name] = val
    return out


def train_form_differs(op_type: str, domain: str = "", opset: int | None = None,
                       xp=None) -> bool:
    """Whether ``op_type`` computes something else in training than in inference
    (BatchNormalization's batch statistics, Dropout's mask): it has a training form that is
    not registered ``same_results=True``."""
    form = train_form(op_type, domain, opset, xp=xp)
    return form is not None and not form.same_results
