"""The trunk cache: transfer learning at classroom speed.

Fine-tuning a new head on an imported model runs the imported graph up to the cut (the
*trunk*, ``forward(x, last_layers=...)``) and then the new layers (the *head*). When the
trunk is frozen it computes the same outputs for a sample in every epoch; the cache computes
them once per sample and hands them back afterwards, so later epochs cost the head only.

>>> net = BigDigit(path, "pool").freeze_imported()                  # doctest: +SKIP
>>> hist = training.fit(net, x, y, epochs=5, cache_trunk=True)      # doctest: +SKIP
trunk cache (memory): 1,000 samples x 128 bytes = 125.0 KiB (budget 2.0 GiB) ...
>>> net.cache_trunk("disk")      # a SINGA-style loop: the model's forward uses the cache

**An entry** is the trunk's outputs for one sample (every input's row), keyed by a SHA-256 of
the sample's bytes (dtype and shape included) and of the trunk's state: the graph the cut
needs (nodes, attributes, opsets, inputs), the resolved cut (output names) and the
``last_layers`` counting, every parameter and buffer the trunk reads (their current values,
hashed on every call), the device, and the cache format. Changing the input data or its
preprocessing gives new keys; changing the weights, the cut, the graph or the device
invalidates what was cached (in memory: dropped, with a message naming what changed; on
disk: a folder per state, so a later session with the same weights finds its entries again).

**Storage**: ``"memory"`` (arrays on the model's device, within ``budget``: default the
smaller of 2 GiB and a quarter of the memory this process may use) or ``"disk"`` (one raw
file per sample under ``$WORKBENCH_HOME/trunk-cache/<state>/``, each written atomically,
its layout — dtypes and shapes — in the folder's ``meta.json``, its size checked when read
back, no pickle; a layout that is not numbers of a sane size, or entries without a readable
``meta.json``, are recomputed; outputs of another layout for the same trunk — inputs of
another shape — turn the cache off rather than be misread; the free space is checked
against the estimate; a later session with the same trunk and data finds the entries
there; what fits the budget is also kept in memory).
:meth:`TrunkCache.estimate` gives the size before it starts (``fit`` prints it).

**Skipped, with a message** (the trunk then runs as usual): a trunk parameter is trainable
(``requires_grad``: freeze it with ``freeze_imported()``); the trunk draws random numbers
(RandomNormal, RandomUniformLike, Bernoulli, Multinomial...; Dropout aside); an input
Tensor requires a gradient; the inputs have no common batch dimension; data augmentation —
``fit(..., augment=fn)``, or the inputs of one sample index differ between epochs (``fit`` tells the
cache which indices a batch holds; a loop of your own can with :meth:`TrunkCache.samples`);
the trunk mixes the samples of a batch (checked once per state: the first sample run alone
must give the same outputs as in its batch); inside ``to_onnx``/``export`` (the trunk is
recorded there, as always).

**Inference form.** The cache runs the trunk in eval mode: BatchNormalization normalises
with its running statistics (and does not update them), Dropout passes its input through —
the convention for frozen layers (Keras runs a frozen BatchNormalization in inference mode
for this reason). Without the cache, a model in training mode runs its frozen graph in the
training forms: BatchNormalization then normalises with each batch's statistics and updates
its running statistics although its weights are frozen, and Dropout drops. Where the trunk
has such nodes and the model trains, the cache says once that its results differ from the
uncached training forms. ``freeze_imported(inference=True)`` gives the uncached forward the
same inference forms, so that training with and without the cache computes the same thing
(equal to rounding: the cache batches the trunk differently).
"""

from __future__ import annotations

import contextlib
import contextvars
import hashlib
import json
import os
import re
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass, fields

import numpy as np

from workbench.arrays import xp_of
from workbench.autodiff.tape import Tensor
from workbench.errors import InputError, WorkbenchError
from workbench.files import cache_home, write_atomic
from workbench.graph.ir import Graph
from workbench.graph.toposort import needed_nodes, topological_order
from workbench.limits import parse_size, usable_memory
from workbench.ops.parallel import run_blocks
from workbench.ops.registry import facts

FORMAT = "workbench-trunk-cache/1"
STORAGES = ("memory", "disk")
DEFAULT_MEMORY_BUDGET = 2 << 30
KEY_BYTES = 16                 # 128-bit keys
DISK_MARGIN = 256 << 20        # free space left on the disk after the estimate

_BYPASS = contextvars.ContextVar("workbench_trunk_cache_bypass", default=False)

__all__ = ["TrunkCache", "cache_folder", "bypassed", "FORMAT", "STORAGES"]


def cache_folder() -> str:
    """Where disk caches live: ``$WORKBENCH_HOME/trunk-cache`` (see ``files.cache_home``)."""
    return os.path.join(cache_home(), "trunk-cache")


@contextlib.contextmanager
def bypassed():
    """No trunk cache and no inference forms inside (``Model.to_onnx`` records the trunk)."""
    token = _BYPASS.set(True)
    try:
        yield
    finally:
        _BYPASS.reset(token)


def _free_space(path: str) -> int:
    """Free bytes on the disk that holds ``path`` (its nearest existing folder; nothing is
    created); 0 when none can be found."""
    path = os.path.abspath(path)
    while True:
        try:
            return int(shutil.disk_usage(path).free)
        except OSError:
            parent = os.path.dirname(path)
            if parent == path:
                return 0
            path = parent


def fmt_bytes(n: float) -> str:
    for unit, size in (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= size:
            return f"{n / size:,.1f} {unit}"
    return f"{int(n):,} bytes"


# ----------------------------------------------------------------------------- hashing
def _bytes_of(a: np.ndarray) -> np.ndarray:
    """The bytes of any fixed-size numpy array (bfloat16 and other ml_dtypes too)."""
    return np.ascontiguousarray(a).reshape(-1).view(np.uint8)


def _feed(h, v) -> None:
    """Put ``v`` into hash ``h`` in a canonical, typed form."""
    if v is None:
        h.update(b"N")
    elif isinstance(v, bool):
        h.update(b"b1" if v else b"b0")
    elif isinstance(v, (int, np.integer)):
        h.update(b"i%d;" % int(v))
    elif isinstance(v, (float, np.floating)):
        h.update(b"f" + repr(float(v)).encode() + b";")
    elif isinstance(v, str):
        e = v.encode("utf-8", "surrogatepass")
        h.update(b"s%d:" % len(e) + e)
    elif isinstance(v, (bytes, bytearray)):
        h.update(b"y%d:" % len(v) + bytes(v))
    elif isinstance(v, np.ndarray):
        h.update(b"a" + v.dtype.str.encode() + repr(v.shape).encode())
        if v.dtype.hasobject:
            _feed(h, [x for x in v.reshape(-1).tolist()])
        else:
            h.update(_bytes_of(v))
    elif isinstance(v, (list, tuple)):
        h.update(b"l%d:" % len(v))
        for x in v:
            _feed(h, x)
    elif isinstance(v, dict):
        h.update(b"d%d:" % len(v))
        for k in sorted(v, key=str):
            _feed(h, str(k))
            _feed(h, v[k])
    elif isinstance(v, Graph):
        h.update(b"g")
        _feed(h, [(i.name, i.dtype, i.shape) for i in v.inputs])
        _feed(h, [o.name for o in v.outputs])
        _feed(h, [(n.op_type, n.domain, n.name, n.inputs, n.outputs, n.attrs) for n in v.nodes])
        _feed(h, {k: np.asarray(a) for k, a in v.initializers.items()})
    elif hasattr(v, "SerializeToString"):
        h.update(b"p" + v.SerializeToString(deterministic=True))
    else:
        _feed(h, repr(v))


def _host(a) -> np.ndarray:
    if isinstance(a, np.ndarray):
        return a
    if hasattr(a, "numpy") and callable(a.numpy):
        return a.numpy()
    if hasattr(a, "get") and hasattr(a, "__cuda_array_interface__"):
        return a.get()
    return np.asarray(a)


def _dtype(name: str) -> np.dtype:
    """A fixed-size numeric dtype by name (numpy's, or ml_dtypes' bfloat16 and the like);
    ValueError for anything else (a meta.json is read back with it)."""
    try:
        dt = np.dtype(name)
    except TypeError:
        import ml_dtypes
        kind = getattr(ml_dtypes, name, None) if name.isidentifier() else None
        if not isinstance(kind, type):
            raise ValueError(f"unknown dtype {name!r}") from None
        dt = np.dtype(kind)
    if not (dt.kind in "biufc" or dt.type.__module__.startswith("ml_dtypes")):
        raise ValueError(f"dtype {name!r} is not a fixed-size number type")
    return dt


def _row_bytes(layout) -> int:
    return sum(int(np.prod(sh, dtype=np.int64)) * _dtype(d).itemsize for d, sh in layout)


def _layout_text(layout) -> str:
    return ", ".join(f"{d} {list(sh)}" for d, sh in layout)


def _check_layout(layout):
    """A meta.json layout as [(dtype name, shape tuple)], or None; ValueError when malformed."""
    if layout is None:
        return None
    out = []
    for d, shape in layout:
        if not isinstance(d, str) or not isinstance(shape, list) or \
                not all(isinstance(x, int) and 0 <= x < 2**31 for x in shape):
            raise ValueError(f"bad layout entry {[d, shape]!r}")
        _dtype(d)
        out.append((d, tuple(shape)))
    if _row_bytes(out) > 2**34:
        raise ValueError("a sample larger than 16 GiB")
    return out


#: the files of a state folder: meta.json, one file per key, write_atomic's temporaries
_ENTRY_NAME = re.compile(rf"(\.)?(meta\.json|[0-9a-f]{{{2 * KEY_BYTES}}}\.bin)(?(1)\..+\.tmp)")


def _is_state_folder(path: str) -> bool:
    """A folder this module made: 32 hex digits, a meta.json of this format (or an
    unreadable one), entries named by their keys."""
    name = os.path.basename(path)
    if len(name) != 32 or any(c not in "0123456789abcdef" for c in name) or \
            os.path.islink(path) or not os.path.isdir(path):
        return False
    files = os.listdir(path)
    if "meta.json" not in files or not all(_ENTRY_NAME.fullmatch(f) for f in files):
        return False
    try:
        with open(os.path.join(path, "meta.json"), encoding="utf-8") as f:
            meta = json.load(f)
    except ValueError:                  # damaged, among entries of ours only
        return True
    except OSError:
        return False
    return isinstance(meta, dict) and meta.get("format") == FORMAT


# ----------------------------------------------------------------------------- the trunk
@dataclass
class Trunk:
    """What the cut needs of a model's imported graph."""
    outputs: tuple
    weights: list           # initializer names the trunk reads (sorted)
    train_forms: dict       # op type -> nodes whose training form differs from inference
    structure: str          # digest of the nodes, attributes, opsets and inputs
    random: list = None     # "op 'name'" of nodes that draw random numbers (Dropout aside)


def trunk_of(model, outputs: tuple) -> Trunk:
    """The trunk of ``model`` (a ``SONNXModel``) for these outputs, remembered per graph."""
    from workbench.autodiff.rules import train_form_differs
    graph = model.onnx_graph
    memo = model.__dict__.setdefault("_trunk_memo", {})
    hit = memo.get(outputs)
    if hit is not None and hit[0] is graph:
        return hit[1]
    nodes = needed_nodes(topological_order(graph), list(outputs))
    reads = set()
    for n in nodes:
        reads.update(i for i in n.inputs if i)
        for sg in n.subgraphs:
            reads.update(sg.free_variables())
    forms: dict = {}
    for n in nodes:
        opset = graph.opsets.get(n.domain or "", graph.opsets.get("ai.onnx"))
        if train_form_differs(n.op_type, n.domain, opset):
            forms[n.op_type] = forms.get(n.op_type, 0) + 1
    h = hashlib.sha256(FORMAT.encode())
    _feed(h, sorted(graph.opsets.items()))
    _feed(h, [(v.name, v.dtype, v.shape) for v in graph.inputs])
    _feed(h, [(n.op_type, n.domain, n.name, n.inputs, n.outputs, n.attrs) for n in nodes])
    trunk = Trunk(outputs, sorted(r for r in reads if r in graph.initializers), forms,
                  h.hexdigest(), _random_nodes(nodes))
    memo[outputs] = (graph, trunk)
    return trunk


def _random_nodes(nodes) -> list:
    """The nodes (subgraphs included) whose outputs are a random draw: a cached draw would be
    the same one every epoch. Dropout is not one here: the cache runs its inference form."""
    out = []
    for n in nodes:
        if n.op_type != "Dropout" and facts(n.op_type, n.domain).random:
            out.append(f"{n.op_type} {n.name!r}")
        for sg in n.subgraphs:
            out += _random_nodes(sg.nodes)
    return out


@dataclass(frozen=True)
class State:
    """What the cached outputs were computed from (one digest each)."""
    graph: str
    cut: str
    weights: str
    device: str

    #: how each part is named in messages
    NAMES = {"graph": "the graph", "cut": "the cut (last_layers)",
             "weights": "the trunk's weights", "device": "the device"}

    @property
    def digest(self) -> bytes:
        h = hashlib.sha256(FORMAT.encode())
        for f in fields(self):
            _feed(h, getattr(self, f.name))
        return h.digest()

    def changes(self, other: State) -> list:
        return [self.NAMES[f.name] for f in fields(self)
                if getattr(self, f.name) != getattr(other, f.name)]


def state_of(model, trunk: Trunk) -> State:
    h = hashlib.sha256()
    for name in trunk.weights:          # every parameter, buffer and constant it reads, now
        t = model._weights.get(name)
        a = _host(t.data if t is not None else model.onnx_graph.initializers[name])
        _feed(h, name)
        _feed(h, a)
    cut = hashlib.sha256()
    _feed(cut, [list(trunk.outputs), model.last_layers_counting])
    return State(trunk.structure, cut.hexdigest(), h.hexdigest(), str(model._dev))


def trainable_weights(model, trunk: Trunk) -> list:
    return [w for w in trunk.weights if w in model._params and model._params[w].requires_grad]


# ----------------------------------------------------------------------------- running it
def run_trunk(model, xs: list, last_layers, aux_output) -> list:
    """The trunk's outputs (arrays on the model's device) in eval mode, without recording:
    the inference graph ``model.run`` uses."""
    from workbench.singa import autograd
    was, flag = model.training, autograd.training
    model.eval()
    try:
        with autograd.no_grad():
            outs = model._forward(xs, last_layers, aux_output, inference=True)
    finally:
        model.train(was)
        autograd.training = flag
    return [o.data for o in outs]


def _tensors(model, arrays: list) -> list:
    out = []
    for a in arrays:
        t = Tensor(device=model._dev, data=a, requires_grad=False)
        t._untraced = True          # a graph-mode replay must not bake it in as a constant
        out.append(t)
    return out


def _inputs_need_grad(x) -> bool:
    return any(getattr(a, "requires_grad", False) and getattr(a, "creator", None) is not None
               or getattr(a, "stores_grad", False) for a in x)


def forward_hook(model, x, last_layers, aux_output):
    """Called by ``SONNXModel.forward``: the trunk's outputs from the model's cache, or in
    inference form for a model frozen with ``freeze_imported(inference=True)``; None to run
    the graph as usual."""
    if _BYPASS.get():
        return None
    cache = model.__dict__.get("_trunk_cache")
    if cache is not None:
        out = cache.forward(model, x, last_layers, aux_output)
        if out is not None:
            return out
    if model.__dict__.get("_frozen_inference") and model.training and \
            not _inputs_need_grad(x):
        outputs = model._outputs_for(last_layers, aux_output)
        if not trainable_weights(model, trunk_of(model, outputs)):
            return _tensors(model, run_trunk(model, list(x), last_layers, aux_output))
    return None


# ----------------------------------------------------------------------------- the cache
class TrunkCache:
    """Per-sample outputs of a frozen trunk (see the module docstring).

    ``storage``: "memory" or "disk"; ``folder``: the disk cache's root (default
    :func:`cache_folder`); ``budget``: bytes (or "512MiB", "0.1" of RAM) the memory cache
    may hold; ``log``: where messages go (``print``; None: only ``messages``);
    ``check_batch``: check once per state that the trunk treats samples independently.
    Attach it with ``model.cache_trunk(...)`` or ``fit(..., cache_trunk=...)``.
    """

    def __init__(self, storage: str = "memory", *, folder=None, budget=None,
                 log: Callable | None = print, check_batch: bool = True):
        if storage not in STORAGES:
            raise InputError(f"trunk cache storage is one of {STORAGES}, got {storage!r}")
        self.storage = storage
        self.root = os.fspath(folder) if folder is not None else None
        if budget is None:
            budget = min(DEFAULT_MEMORY_BUDGET, usable_memory() // 4)
        elif isinstance(budget, str):
            budget = parse_size(budget)
        self.budget = int(budget)
        self.log = log
        self.check_batch = check_batch
        self.enabled = True
        self.off_reason: str | None = None
        self.state: State | None = None
        self.messages: list = []
        self.computed = 0           # samples the trunk ran on
        self.reused = 0             # samples served from the cache
        self.sample_bytes: int | None = None
        self.layout: list | None = None     # [(dtype str, shape)] of one sample's outputs
        self.outputs: tuple = ()
        self._entries: dict = {}
        self._bytes = 0
        self._full = False
        self._said: set = set()
        self._seen: dict = {}       # (tag, index) -> digest of the sample's inputs
        self._ctx = None            # (tag, indices) of the batch being run
        self._checked: set = set()  # states whose batch independence was checked
        self._folder: str | None = None
        self._announced = False     # the size per sample said (fit says its estimate)

    # ------------------------------------------------------------------ reporting
    def say(self, text: str, key=None) -> None:
        """A message (once per ``key``), to ``log`` and ``messages``."""
        if key is not None:
            if key in self._said:
                return
            self._said.add(key)
        self.messages.append(text)
        if self.log is not None:
            self.log(f"trunk cache: {text}")

    def disable(self, reason: str) -> None:
        """Stop caching (what is held in memory is dropped); the trunk runs as usual."""
        if self.enabled:
            self.enabled = False
            self.off_reason = reason
            self._drop()
            self.say(f"off: {reason}")

    @property
    def entries(self) -> int:
        """Samples held (in memory, or in this state's disk folder)."""
        if self.storage == "memory":
            return len(self._entries)
        if self._folder is None or not os.path.isdir(self._folder):
            return 0
        return sum(1 for f in os.listdir(self._folder) if f.endswith(".bin"))

    @property
    def nbytes(self) -> int:
        return self._bytes

    @property
    def folder(self) -> str | None:
        """The disk folder of the current state (None in memory or before the first use)."""
        return self._folder

    def __repr__(self) -> str:
        where = f"disk {self._folder or self.root or cache_folder()}" \
            if self.storage == "disk" else f"memory, budget {fmt_bytes(self.budget)}"
        state = "on" if self.enabled else f"off ({self.off_reason})"
        return (f"TrunkCache({where}; {state}; {self.entries} sample(s); trunk ran on "
                f"{self.computed}, reused {self.reused})")

    def estimate(self, n_samples: int) -> dict:
        """The size of ``n_samples`` entries (known after the first sample):
        ``{"samples", "per_sample", "total", "limit", "fits"}``; ``limit`` is the memory
        budget or the disk's free space less a margin."""
        per = self.sample_bytes
        total = None if per is None else int(per) * int(n_samples)
        if self.storage == "memory":
            limit = self.budget
        else:
            root = (self._folder or self.root
                    or os.path.join(cache_home(create=False), "trunk-cache"))
            limit = max(0, _free_space(root) - DISK_MARGIN)
        return {"samples": int(n_samples), "per_sample": per, "total": total, "limit": limit,
                "fits": None if total is None else total <= limit}

    def describe_estimate(self, n_samples: int) -> str:
        e = self.estimate(n_samples)
        if e["per_sample"] is None:
            return f"{n_samples:,} samples; the size per sample is known after the first one"
        outs = self._outputs_text()
        where = (f"budget {fmt_bytes(e['limit'])}" if self.storage == "memory"
                 else f"{fmt_bytes(e['limit'])} free in {self._folder or cache_folder()}")
        return (f"({self.storage}) {n_samples:,} samples x {fmt_bytes(e['per_sample'])} = "
                f"{fmt_bytes(e['total'])} ({where}); per sample: {outs}; the trunk runs once "
                f"per sample, in inference form")

    def _outputs_text(self) -> str:
        return ", ".join(f"{n!r} {d} {list(s)}" for n, (d, s) in zip(self.outputs,
                                                                      self.layout or ()))

    # ------------------------------------------------------------------ the batch's indices
    @contextlib.contextmanager
    def samples(self, indices, tag: str = "train"):
        """Say which sample indices (of data set ``tag``) the next forward's batch holds:
        the cache then detects inputs that change between epochs (augmentation)."""
        before = self._ctx
        self._ctx = (tag, [int(i) for i in np.asarray(indices).reshape(-1)])
        try:
            yield self
        finally:
            self._ctx = before

    # ------------------------------------------------------------------ storage
    def _drop(self) -> None:
        self._entries.clear()
        self._bytes = 0
        self._full = False

    def clear(self) -> None:
        """Forget every entry: in memory, and this cache's disk folders (all states under its
        root). Only folders the cache made are removed: a name of 32 hex digits holding a
        trunk cache's meta.json and nothing but its entries; anything else under the root
        stays."""
        self._drop()
        if self.storage == "disk":
            root = self.root or cache_folder()
            if os.path.isdir(root):
                for name in os.listdir(root):
                    p = os.path.join(root, name)
                    if _is_state_folder(p):
                        shutil.rmtree(p, ignore_errors=True)
        self.state = None
        self._folder = None

    def _open(self, state: State, model) -> None:
        self.state = state
        if self.storage != "disk":
            return
        try:
            root = self.root or cache_folder()
            self._folder = os.path.join(root, state.digest.hex()[:32])
            os.makedirs(self._folder, exist_ok=True)
            meta = self._read_meta()
            if meta is None:
                self._remove_entries()
                self._write_meta(model)
            elif meta.get("layout") is not None:
                self.layout = meta["layout"]
                self.sample_bytes = _row_bytes(self.layout)
        except (OSError, WorkbenchError) as e:
            self.disable(f"cannot use the disk cache folder "
                         f"{self._folder or self.root or 'WORKBENCH_HOME'}: {e}")

    def _remove_entries(self) -> None:
        """Entries without a readable meta.json have no known layout: they are removed."""
        stale = [f for f in os.listdir(self._folder) if f.endswith(".bin")]
        for f in stale:
            with contextlib.suppress(OSError):
                os.remove(os.path.join(self._folder, f))
        if stale:
            self.say(f"{len(stale):,} cached file(s) in {self._folder} had no readable "
                     f"meta.json (their layout is unknown): removed, computed again")

    def _meta_path(self) -> str:
        return os.path.join(self._folder, "meta.json")

    def _read_meta(self) -> dict | None:
        """This state's meta.json (None when absent); a layout that does not read back is
        dropped (the entries are then recomputed and the file rewritten)."""
        path = self._meta_path()
        if not os.path.exists(path):
            return None
        try:
            with open(path, encoding="utf-8") as f:
                meta = json.load(f)
            meta["layout"] = _check_layout(meta.get("layout"))
            return meta
        except (OSError, ValueError, TypeError, KeyError) as e:
            self.say(f"{path} could not be read ({type(e).__name__}: {e}); it is written again",
                     key=("meta", path))
            return None

    def _write_meta(self, model=None) -> None:
        info = {"format": FORMAT, "created": time.strftime("%Y-%m-%dT%H:%M:%S"),
                "outputs": list(self.outputs), "device": self.state.device,
                "graph": self.state.graph, "cut": self.state.cut,
                "weights": self.state.weights,
                "layout": None if self.layout is None else
                [[d, list(sh)] for d, sh in self.layout]}
        if model is not None:
            info.update(model=model.onnx_graph.name, counting=model.last_layers_counting)
        text = json.dumps(info, indent=1).encode()
        write_atomic(self._meta_path(), lambda f: f.write(text), overwrite=True)

    def _path(self, key: bytes) -> str:
        return os.path.join(self._folder, key.hex() + ".bin")

    def _remember(self, key: bytes, row: tuple, nb: int) -> bool:
        """Keep ``row`` in memory within the budget; False when it is full."""
        if self._bytes + nb > self.budget:
            if not self._full and self.storage == "memory":
                self.say(f"the memory budget ({fmt_bytes(self.budget)}) is full with "
                         f"{len(self._entries):,} samples: the others run the trunk every "
                         f"time (a larger budget=, or storage='disk'; if your inputs are "
                         f"augmented, differing every epoch, turn the cache off)")
            self._full = True
            return False
        self._entries[key] = row
        self._bytes += nb
        return True

    def _get(self, key: bytes, dev):
        row = self._entries.get(key)
        if row is not None or self.storage == "memory" or self.layout is None:
            return row
        path = self._path(key)
        try:
            with open(path, "rb") as f:     # the size first: nothing allocated from meta.json
                size = os.fstat(f.fileno()).st_size
                data = f.read(self.sample_bytes + 1) if size == self.sample_bytes else b""
        except FileNotFoundError:
            return None
        except OSError as e:
            self.say(f"a cached file could not be read ({e}); its sample is computed again",
                     key=("unreadable", path))
            return None
        if len(data) != self.sample_bytes:
            self.say(f"{path} holds {size:,} bytes, not the {self.sample_bytes:,} bytes "
                     f"of a sample; it is computed again", key=("size", path))
            return None
        row, at = [], 0
        for dt, shape in self.layout:
            dtype = _dtype(dt)
            n = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
            row.append(dev.put(np.frombuffer(data, dtype, offset=at,
                                             count=n // dtype.itemsize).reshape(shape)))
            at += n
        row = tuple(row)
        if not self._full:
            self._remember(key, row, self.sample_bytes)
        return row

    def _put(self, key: bytes, row: tuple) -> None:
        nb = sum(int(a.nbytes) for a in row)
        if not self._full:
            self._remember(key, row, nb)
        if self.storage != "disk":
            return
        data = b"".join(np.ascontiguousarray(_host(a)).tobytes() for a in row)
        try:   # content-addressed: a file another process wrote for this key is the same
            write_atomic(self._path(key), lambda f: f.write(data), overwrite=True)
        except WorkbenchError as e:
            self.disable(f"cannot write the disk cache: {e}")

    # ------------------------------------------------------------------ the forward
    def forward(self, model, x, last_layers, aux_output):
        """The trunk's outputs for the batch ``x`` (a list of Tensors or arrays, one per
        graph input) as Tensors, from the cache where it can; None when the cache does not
        apply (the caller runs the graph as usual)."""
        if not self.enabled or _BYPASS.get():
            return None
        outputs = model._outputs_for(last_layers, aux_output)
        trunk = trunk_of(model, outputs)
        trainable = trainable_weights(model, trunk)
        if trainable:
            self.say(f"not used: {len(trainable)} parameter(s) of the trunk are trainable "
                     f"(e.g. {trainable[0]!r}), so its outputs change as it trains; freeze "
                     f"it (freeze_imported()) to cache it", key=("trainable", outputs))
            return None
        if trunk.random:
            self.say(f"not used: the trunk draws random numbers ({', '.join(trunk.random[:3])}"
                     f"), so its outputs for a sample differ from call to call",
                     key=("random", outputs))
            return None
        if _inputs_need_grad(x):
            self.say("not used: an input requires a gradient", key="input-grad")
            return None
        host = [_host(a) for a in x]
        sizes = {a.shape[0] if a.ndim else None for a in host}
        if len(sizes) != 1 or None in sizes or 0 in sizes:
            self.say(f"not used: the inputs have no common batch dimension (shapes "
                     f"{[list(a.shape) for a in host]})", key="batch")
            return None
        n = sizes.pop()
        state = state_of(model, trunk)
        if self.state is None or state != self.state or outputs != self.outputs:
            self._new_state(model, state, outputs)
            if not self.enabled:
                return None
        if model.training and trunk.train_forms and \
                not model.__dict__.get("_frozen_inference"):
            forms = ", ".join(f"{k} {op}" for op, k in sorted(trunk.train_forms.items()))
            self.say(f"the trunk runs in inference form ({forms} node(s): BatchNormalization "
                     f"with its running statistics, Dropout passing through); training "
                     f"without the cache would run them in training form (batch statistics, "
                     f"updated running statistics, dropped values): results differ. "
                     f"freeze_imported(inference=True) makes the uncached forward use the "
                     f"inference form too", key=("forms", outputs))
        sample = self._sample_digests(host, n)
        if self._ctx is not None and not self._same_as_before(sample):
            return None
        prefix = state.digest
        keys = [hashlib.sha256(prefix + s).digest()[:KEY_BYTES] for s in sample]
        dev = model._dev
        rows = [self._get(k, dev) for k in keys]
        miss = [i for i, r in enumerate(rows) if r is None]
        if miss:
            xs = self._rows(x, host, miss, n, dev)
            outs = run_trunk(model, xs, last_layers, aux_output)
            if not self._first_batch_checked(model, xs, outs, miss, last_layers, aux_output):
                return None
            if self.layout is not None and not self._same_layout(outs):
                return None
            if self.layout is None:
                if not self._set_layout(outs):
                    return None
                if not self._announced:
                    self._announced = True
                    e = self.estimate(1)
                    self.say(f"({self.storage}) {fmt_bytes(self.sample_bytes)} per sample "
                             f"({self._outputs_text()}); "
                             + (f"the budget holds about "
                                f"{e['limit'] // max(1, self.sample_bytes):,} samples"
                                if self.storage == "memory" else
                                f"{fmt_bytes(e['limit'])} free in {self._folder}"))
            for j, i in enumerate(miss):
                rows[i] = tuple(o[j].copy() for o in outs)
                if self.enabled:
                    self._put(keys[i], rows[i])
            self.computed += len(miss)
            if len(miss) == n:
                return _tensors(model, outs)
        self.reused += n - len(miss)
        xp = xp_of(rows[0][0])
        return _tensors(model, [xp.stack([r[k] for r in rows]) for k in range(len(rows[0]))])

    def _same_layout(self, outs) -> bool:
        """The layout of these outputs is the one this state's entries have (a disk entry is
        read back with it): otherwise the cache turns off rather than misread an entry."""
        layout = [(o.dtype.name, tuple(int(d) for d in o.shape[1:])) for o in outs]
        if layout == [(d, tuple(sh)) for d, sh in self.layout]:
            return True
        self.disable(f"the trunk's outputs for these inputs are {_layout_text(layout)} per "
                     f"sample, but the cached ones are {_layout_text(self.layout)}: the "
                     f"cache holds one layout per trunk state (inputs of another shape, or a "
                     f"graph whose output shape depends on the data)")
        return False

    def _set_layout(self, outs) -> bool:
        self.layout = [(o.dtype.name, tuple(int(d) for d in o.shape[1:])) for o in outs]
        self.sample_bytes = sum(int(o[0].nbytes) for o in outs)
        if self.storage == "disk":
            if any(o.dtype.hasobject for o in outs):
                self.disable("the trunk's outputs hold Python objects (strings), which the "
                             "disk cache does not store; use storage='memory'")
                return False
            self._write_meta()
        return True

    def _new_state(self, model, state: State, outputs: tuple) -> None:
        if self.state is not None:
            what = state.changes(self.state) or ["the cut (last_layers)"]
            held = self.entries
            if self.storage == "memory":
                self.say(f"{' and '.join(what)} changed: {held:,} cached sample(s) dropped; "
                         f"the trunk runs again once per sample")
            else:
                self.say(f"{' and '.join(what)} changed: a new folder for this state (the "
                         f"{held:,} sample(s) cached for the previous one stay in "
                         f"{self._folder}; TrunkCache.clear() removes them)")
            self._drop()
            self.layout = None
            self.sample_bytes = None
        self.outputs = outputs
        self._open(state, model)

    def _sample_digests(self, host: list, n: int) -> list:
        flat = [np.ascontiguousarray(a).reshape(n, -1) for a in host]
        heads = [(a.dtype.str + repr(a.shape[1:])).encode() for a in host]
        out: list = [None] * n

        def work(rows) -> None:      # hashlib releases the GIL on large buffers
            for i in rows:
                h = hashlib.sha256()
                for head, a in zip(heads, flat):
                    h.update(head)
                    if a.dtype.hasobject:
                        _feed(h, a[i])
                    else:
                        h.update(a[i].view(np.uint8))
                out[i] = h.digest()
        run_blocks(np, list(range(n)), work, sum(a.nbytes for a in flat))
        return out

    def _same_as_before(self, sample: list) -> bool:
        tag, indices = self._ctx
        if len(indices) != len(sample):
            self.say(f"samples(): {len(indices)} indices for a batch of {len(sample)}; "
                     f"augmentation is not checked for it", key="ctx-len")
            return True
        for idx, s in zip(indices, sample):
            before = self._seen.get((tag, idx))
            if before is None:
                self._seen[(tag, idx)] = s
            elif before != s:
                self.disable(f"the inputs of sample {idx} ({tag}) differ from the last time "
                             f"it was seen: data augmentation (or data that changes) makes "
                             f"every epoch's inputs different, so the trunk's outputs cannot "
                             f"be reused")
                return False
        return True

    @staticmethod
    def _rows(x, host, miss, n, dev) -> list:
        if len(miss) == n:
            return list(x)
        idx = np.asarray(miss)
        return [dev.put(np.ascontiguousarray(a[idx])) for a in host]

    def _first_batch_checked(self, model, xs, outs, miss, last_layers, aux_output) -> bool:
        digest = self.state.digest
        if not self.check_batch or len(miss) < 2 or digest in self._checked:
            return True
        self._checked.add(digest)
        one = [(a.data if isinstance(a, Tensor) else a)[:1] for a in xs]
        alone = run_trunk(model, one, last_layers, aux_output)
        for name, a, b in zip(self.outputs, alone, outs):
            a, b = _host(a).astype(np.float64), _host(b[:1]).astype(np.float64)
            if a.shape != b.shape:
                self.disable(f"the trunk's output {name!r} has shape {list(b.shape)} for a "
                             f"sample in a batch but {list(a.shape)} alone: it does not keep "
                             f"the batch dimension first")
                return False
            scale = float(np.max(np.abs(b))) if b.size else 0.0
            diff = float(np.max(np.abs(a - b))) if b.size else 0.0
            if not diff <= 1e-4 * scale + 1e-6:
                self.disable(f"the trunk mixes the samples of a batch: its output {name!r} "
                             f"for a sample alone differs from the same sample in a batch "
                             f"(by up to {diff:.3g}), so a sample's outputs cannot be stored "
                             f"on their own")
                return False
        return True


# ----------------------------------------------------------------------------- attaching
def attach(model, storage="memory", **options):
    """``model.cache_trunk(...)``: attach a cache (``storage`` "memory"/"disk" or a
    TrunkCache; False/None detaches). Returns the cache (or None)."""
    if storage is False or storage is None:
        model.__dict__.pop("_trunk_cache", None)
        return None
    if isinstance(storage, TrunkCache):
        if options:
            raise InputError("cache_trunk(TrunkCache(...)) takes no further options")
        cache = storage
    else:
        cache = TrunkCache("memory" if storage is True else storage, **options)
    model.__dict__["_trunk_cache"] = cache
    return cache


def imported_models(model) -> list:
    """The SONNXModels (models with ``cache_trunk``) in ``model``'s layer tree (``model``
    itself included)."""
    walk = getattr(model, "_walk", None)
    if walk is None:
        return []
    out = []
    for _, lay in walk():
        if callable(getattr(type(lay), "cache_trunk", None)) and all(lay is not m for m in out):
            out.append(lay)
    return out


class FitCaches:
    """What ``training.fit(..., cache_trunk=...)`` does with the caches: attach them for the
    fit (or use the ones the model holds), skip them for ``augment=``, probe the first sample
    and print the size estimate before the first epoch, tell them each batch's indices, and
    put the model back as it was at the end."""

    def __init__(self, model, cache_trunk, *, augment=None, log: Callable | None = print):
        self.model = model
        self.log = log
        self.caches: list = []
        self._restore: list = []       # (sonnx model, previous cache or None)
        found = imported_models(model)
        if cache_trunk is None:        # the model's own setting
            self.caches = [m.trunk_cache for m in found if m.trunk_cache is not None]
        elif cache_trunk is False:
            for m in found:
                if m.trunk_cache is not None:
                    self._restore.append((m, m.trunk_cache))
                    attach(m, False)
        else:
            if not found:
                self._say("not used: the model holds no imported ONNX graph (a SONNXModel) "
                          "whose forward could be cached")
            if isinstance(cache_trunk, TrunkCache) and len(found) > 1:
                raise InputError(f"cache_trunk: one TrunkCache for {len(found)} imported "
                                 f"graphs; pass True, 'memory' or 'disk'")
            for m in found:
                self._restore.append((m, m.trunk_cache))
                if isinstance(cache_trunk, TrunkCache):
                    cache = attach(m, cache_trunk)
                elif m.trunk_cache is not None and cache_trunk is True:
                    cache = m.trunk_cache
                else:
                    storage = "memory" if cache_trunk is True else cache_trunk
                    cache = attach(m, TrunkCache(storage, log=log))
                self.caches.append(cache)
        if augment is not None and self.caches:
            for c in self.caches:
                c.disable("augment= makes every epoch's inputs different, so the trunk's "
                          "outputs cannot be reused")
            self.caches = []

    def _say(self, text: str) -> None:
        if self.log is not None:
            self.log(f"trunk cache: {text}")

    def start(self, x, n_samples: int) -> None:
        """Run the model once on the first sample (in eval mode, nothing recorded) so that
        the caches know a sample's size, then print each estimate; a disk cache whose
        estimate does not fit the free space is turned off."""
        live = [c for c in self.caches if c.enabled]
        if not live:
            return
        for c in live:
            c._announced = True
        from workbench.singa import autograd
        from workbench.singa.tensor import from_numpy
        was = self.model.training
        self.model.eval()
        try:
            with autograd.no_grad(), self.samples([0], "train"):
                self.model.forward(from_numpy(np.asarray(x[:1])))
        finally:
            self.model.train(was)
        for c in live:
            if not c.enabled:
                continue
            c.say(c.describe_estimate(n_samples))
            e = c.estimate(n_samples)
            if e["fits"] is False:
                if c.storage == "disk":
                    c.disable(f"the estimate ({fmt_bytes(e['total'])}) does not fit the free "
                              f"disk space ({fmt_bytes(e['limit'])} after a margin)")
                else:
                    c.say(f"the estimate is over the memory budget: about "
                          f"{e['limit'] // max(1, e['per_sample']):,} samples will be cached, "
                          f"the others run the trunk every time (budget= or "
                          f"storage='disk' for all)")

    @contextlib.contextmanager
    def samples(self, indices, tag: str):
        with contextlib.ExitStack() as stack:
            for c in self.caches:
                stack.enter_context(c.samples(indices, tag))
            yield

    def finish(self) -> dict | None:
        """Put the model's caches back as they were; the stats of the caches used."""
        stats = None
        if self.caches:
            stats = {"computed": sum(c.computed for c in self.caches),
                     "reused": sum(c.reused for c in self.caches),
                     "on": all(c.enabled for c in self.caches),
                     "messages": [m for c in self.caches for m in c.messages]}
            if any(c.computed or c.reused for c in self.caches):
                self._say(f"the trunk ran on {stats['computed']:,} sample(s); their outputs "
                          f"were reused {stats['reused']:,} time(s)")
        for m, previous in self._restore:
            attach(m, previous if previous is not None else False)
        return stats
