"""``Model`` (SINGA-compatible): forward, train_one_batch, compile, train/eval, states, export;
and ``SONNXModel``, an imported ONNX graph as a trainable Model (``sonnx.SONNXModel``; it lives
here because ``Model.cut`` returns one, so neither module imports the other).

>>> import numpy as np
>>> from workbench import layer, model, tensor, opt, autograd
>>> class MLP(model.Model):
...     def __init__(self):
...         super().__init__()
...         self.fc1, self.fc2 = layer.Linear(8), layer.Linear(2)
...     def forward(self, x):
...         return self.fc2(autograd.relu(self.fc1(x)))
...     def train_one_batch(self, x, y):
...         loss = autograd.softmax_cross_entropy(self.forward(x), y)
...         self.optimizer.backward_and_update(loss)
...         return loss
>>> m = MLP()
>>> m.optimizer = opt.SGD(lr=0.1)
>>> m.compile([tensor.PlaceHolder((4, 3))], is_train=True, use_graph=False)
>>> loss = m(tensor.from_numpy(np.ones((4, 3), np.float32)), np.array([0, 1, 0, 1]))
>>> sorted(m.get_params())
['fc1.W', 'fc1.b', 'fc2.W', 'fc2.b']

Calling the model runs ``train_one_batch`` in training mode (``model.train()``) and ``forward``
in eval mode (``model.eval()``), as in SINGA.

Graph mode (``compile(..., use_graph=True)``): the first call of ``forward`` for a given
training flag and input shapes/dtypes runs eagerly and its tape becomes a static list of
kernel calls; later calls replay that list (no Python layer code, no kernel lookups). It
assumes the forward has no data-dependent Python control flow, as SINGA's graph mode does.
``sequential`` is accepted for compatibility (plans always run in order).

States: ``save_states(path)`` writes an ``.npz`` (no pickle) through a temporary file and an
atomic rename and refuses to overwrite an existing file unless ``overwrite=True``.
"""

from __future__ import annotations

import os
from collections import OrderedDict

import numpy as np
import onnx

from workbench import trunk_cache as _trunk_cache
from workbench.arrays.device import graph_generation
from workbench.autodiff.export import to_onnx as _to_onnx
from workbench.autodiff.runner import TapeRunner
from workbench.autodiff.tape import _recording, tape_order
from workbench.errors import InputError, OverwriteError, ShapeError, WorkbenchError
from workbench.files import write_atomic
from workbench.graph import passes as _passes
from workbench.graph.export import save_atomic as _save_atomic
from workbench.graph.ir import Node, ValueInfo
from workbench.graph.load import load
from workbench.ops.parallel import exact_products, one_blas_thread
from workbench.ops.registry import facts
from workbench.runtime.cut import COUNTINGS, cut, layer_nodes, resolve_cut
from workbench.runtime.plan import Plan, Step
from workbench.singa import autograd
from workbench.singa import counting as _singa_counting  # noqa: F401 - registers "singa"
from workbench.singa import device as _device
from workbench.singa import inference_cache as _icache
from workbench.singa.layer import Layer
from workbench.singa.tensor import Tensor, as_tensor

_AUX = "__aux__/"


class Model(Layer):
    """Base class of user models (and of ``sonnx.SONNXModel``)."""

    def __init__(self):
        super().__init__()
        self.graph_mode = False
        self.sequential = False
        self._placeholders = None
        self._replays = {}
        self.optimizer = None
        self.inference_only = False

    # ------------------------------------------------------------------ SINGA API
    def set_optimizer(self, optimizer) -> None:
        self.optimizer = optimizer
        if self._placeholders is not None:  # already compiled: a DistOpt syncs the ranks now
            self._optimizer_sees_model()

    def _optimizer_sees_model(self) -> None:
        hook = getattr(self.optimizer, "_on_model", None)  # opt.DistOpt: broadcast rank 0's
        if callable(hook):
            hook(self)

    def _writes_files(self) -> bool:
        """False on the ranks other than 0 of a data-parallel job (opt.DistOpt)."""
        return bool(getattr(self.optimizer, "writes_checkpoints", True))

    def forward(self, *inputs):
        raise NotImplementedError(f"{type(self).__name__}.forward is not implemented")

    def train_one_batch(self, *inputs, **kwargs):
        raise NotImplementedError(f"{type(self).__name__}.train_one_batch is not implemented")

    def __call__(self, *args, **kwargs):
        # one BLAS thread, as in every CPU run of the engine (its own workers split the large
        # products): eager steps then round as graph-mode replays (plan runs) do. Its
        # MatMul-family products round alike at any thread count (exact_products)
        with one_blas_thread(), exact_products():
            if self.training and type(self).train_one_batch is not Model.train_one_batch:
                return self.train_one_batch(*args, **kwargs)
            if self.inference_only:
                with autograd.no_grad():
                    return self.forward(*args, **kwargs)
            return self.forward(*args, **kwargs)

    def train(self, mode: bool = True):
        """Training mode (Dropout drops, BatchNorm uses batch statistics); ``train(True)``
        also ends the inference-only state of ``compile(is_train=False)``. As SINGA's
        ``Model.train``, it also sets SINGA's global flag ``autograd.training`` (read by
        ``autograd.dropout``/``batchnorm_2d`` and the operator classes in SINGA code)."""
        super().train(mode)
        autograd.training = bool(mode)
        if mode:
            object.__setattr__(self, "inference_only", False)
        return self

    def graph(self, mode: bool = True, sequential: bool = False) -> None:
        self._set_graph_mode(mode)
        self.sequential = sequential

    def compile(self, inputs, is_train: bool = True, use_graph: bool = False,
                sequential: bool = False) -> None:
        """Fix the input shapes (``tensor.PlaceHolder``s), create lazily-sized parameters by
        running the forward once (without changing running statistics), and choose eager or
        graph mode."""
        inputs = [inputs] if isinstance(inputs, Tensor) else list(inputs)
        for i, t in enumerate(inputs):
            if not isinstance(t, Tensor):
                raise InputError(f"compile: input {i} must be a Tensor (tensor.PlaceHolder), "
                                 f"got {type(t).__name__}")
        self._placeholders = inputs
        self._prepare_inputs(inputs)
        self._set_graph_mode(False)
        if self._needs_init_forward():
            self._init_forward(inputs)
        self.train(is_train)
        # compile(is_train=False) is SINGA's inference set-up: forward passes then keep no
        # arrays for a backward pass (their structure is still recorded, for export) until
        # model.train() is called
        object.__setattr__(self, "inference_only", not is_train)
        self.sequential = sequential
        self._set_graph_mode(use_graph)
        self._optimizer_sees_model()

    def _prepare_inputs(self, inputs) -> None:
        """Hook for subclasses (SONNXModel re-plans for the placeholders' batch size)."""

    def _needs_init_forward(self) -> bool:
        """True when a sublayer still has to size its parameters from a first input."""
        return any(not lay._initialized and type(lay).initialize is not Layer.initialize
                   for _, lay in self._walk() if lay is not self)

    def _init_forward(self, inputs) -> None:
        saved = {k: t.data.copy() for k, t in self.get_states().items() if not t.stores_grad}
        was, flag = self.training, autograd.training
        self.train(False)
        try:
            with autograd.no_grad(), _trunk_cache.bypassed():   # placeholders: not samples
                type(self).forward(self, *inputs)
        finally:
            self.train(was)
            autograd.training = flag    # SINGA's global as it was, not the model's mode
            states = self.get_states()
            for k, a in saved.items():
                states[k].data = a

    # ------------------------------------------------------------------ graph mode
    @property
    def _replays(self) -> dict:
        """The graph-mode replays recorded since the last ``Device.ResetGraph`` (on any
        device: ``graph_generation()``): ``{call key: _Replay, or False}``; older ones are
        dropped here, when the model next looks."""
        gen, replays = self.__dict__.get("_replay_cache", (None, None))
        now = graph_generation()
        if gen != now:
            replays = {}
            self.__dict__["_replay_cache"] = (now, replays)
        return replays

    @_replays.setter
    def _replays(self, value: dict) -> None:
        self.__dict__["_replay_cache"] = (graph_generation(), value)

    def __getstate__(self) -> dict:
        """Pickles and deep copies leave the graph-mode replays behind: a replay's Tensor
        runner knows its steps by object identity (``id(step)``), and a copy's steps are new
        objects, so a copied replay re-prepared every step as a plain one (a training step's
        recorded calls lost: BatchNormalization's running-statistics updates, the training
        fusions) and could even take another object's call for a reused id. A copy records
        its own replays at its next graph-mode forward."""
        state = self.__dict__.copy()
        state.pop("_replay_cache", None)
        return state

    def _set_graph_mode(self, mode: bool) -> None:
        self.graph_mode = bool(mode)
        self._replays = {}
        if mode:
            object.__setattr__(self, "forward", self._graph_forward)
        elif "forward" in self.__dict__:
            del self.__dict__["forward"]

    def _graph_forward(self, *args, **kwargs):
        eager = type(self).forward
        try:
            key = (self.training,
                   tuple((tuple(a.shape), a.dtype.str, str(a.device)) if isinstance(a, Tensor)
                         else ("py", a) for a in args),
                   tuple(sorted(kwargs.items())))
            hash(key)
        except TypeError:
            return eager(self, *args, **kwargs)
        rep = self._replays.get(key)
        if rep is None:
            out = eager(self, *args, **kwargs)
            try:
                self._replays[key] = _Replay([a for a in args if isinstance(a, Tensor)], out)
            except _NotReplayable:
                self._replays[key] = False
            return out
        if rep is False:
            return eager(self, *args, **kwargs)
        return self._run_replay(rep, [a for a in args if isinstance(a, Tensor)])

    def _run_replay(self, rep, inputs):
        """Hook: run a graph-mode replay under what the eager ``forward`` it replays holds
        (``SONNXModel``: one BLAS thread and thread-independent products, as its forward)."""
        return rep.run(inputs)

    # ------------------------------------------------------------------ dtype / device
    def astype(self, dtype) -> Model:
        """Convert every float parameter and buffer to ``dtype`` (e.g. float64 for gradient
        checks, float16 for mixed precision)."""
        dt = np.dtype(dtype)
        for t in self.get_states().values():
            if t.dtype.kind == "f" and t.dtype != dt:
                t.data = t.data.astype(dt)
        self._replays = {}
        return self

    def half(self) -> Model:
        return self.astype(np.float16)

    def to_device(self, device) -> Model:
        for t in self.get_states().values():
            t.to_device(device)
        self._replays = {}
        return self

    # ------------------------------------------------------------------ states on disk
    def save_states(self, fpath, aux_states: dict | None = None, *,
                    overwrite: bool = False) -> str:
        """Write parameters, buffers and ``aux_states`` ({name: array/Tensor}) to an .npz.
        In a data-parallel job (``opt.DistOpt``) only rank 0 writes; the others return the
        path without writing."""
        fpath = os.fspath(fpath)
        if not self._writes_files():
            return fpath
        if os.path.exists(fpath) and not overwrite:
            raise OverwriteError(f"{fpath} already exists; pass overwrite=True to replace it")
        arrays = OrderedDict((k, t.numpy()) for k, t in self.get_states().items())
        for k, v in (aux_states or {}).items():
            arrays[_AUX + k] = v.numpy() if isinstance(v, Tensor) else np.asarray(v)
        for k, a in arrays.items():
            if a.dtype == object:
                raise WorkbenchError(f"save_states: {k!r} is an object array; only numeric "
                                     f"arrays are saved (no pickle)")
        return write_atomic(fpath, lambda f: np.savez(f, **arrays), overwrite=overwrite)

    def load_states(self, fpath) -> dict:
        """Read an .npz written by ``save_states``; returns the aux states as SINGA does
        (``{name: Tensor}``, on the host)."""
        with np.load(os.fspath(fpath), allow_pickle=False) as z:
            data = {k: z[k] for k in z.files}
        aux = {k[len(_AUX):]: v for k, v in data.items() if k.startswith(_AUX)}
        states = {k: v for k, v in data.items() if not k.startswith(_AUX)}
        mine = self.get_states()
        missing = [k for k in mine if k not in states]
        if missing:
            raise InputError(f"load_states: {fpath} lacks {len(missing)} state(s) of this "
                             f"model, e.g. {missing[:5]}")
        self.set_states(states)
        self._replays = {}
        return {k: Tensor(device=_device.create_cpu(), data=v) for k, v in aux.items()}

    # ------------------------------------------------------------------ export / cut
    def _example_inputs(self, inputs):
        if inputs is None:
            if self._placeholders is None:
                raise WorkbenchError("give example inputs (or compile the model with "
                                     "tensor.PlaceHolder inputs first)")
            return list(self._placeholders)
        inputs = [inputs] if not isinstance(inputs, (list, tuple)) else list(inputs)
        return [as_tensor(x) for x in inputs]

    def to_onnx(self, inputs=None, **kwargs):
        """The model as an ``onnx.ModelProto``: the forward runs in eval mode on ``inputs``
        (default: the PlaceHolders of ``compile``) and its tape is exported. Keyword
        arguments go to ``sonnx.to_onnx`` (input_names, output_names, dynamic_axes,
        opset_version...)."""
        xs = self._example_inputs(inputs)
        was, flag = self.training, autograd.training
        self.train(False)
        try:
            # the trunk is recorded, never served from a trunk cache (workbench.trunk_cache)
            with autograd.no_grad(), _trunk_cache.bypassed():
                out = type(self).forward(self, *xs)
        finally:
            self.train(was)
            autograd.training = flag    # SINGA's global as it was, not the model's mode
        outs = [out] if isinstance(out, Tensor) else list(out)
        kwargs.setdefault("model_name", type(self).__name__)
        self._export_defaults(xs, outs, kwargs)
        return _to_onnx(xs, outs, **kwargs)

    def _export_defaults(self, inputs, outputs, kwargs) -> None:
        """Hook: fill default export arguments (SONNXModel keeps the file's names)."""

    def export(self, path, inputs=None, *, overwrite: bool = False, **kwargs) -> str:
        """Write the model to ``path`` as ONNX (atomically; never over an existing file
        unless ``overwrite=True``). See :meth:`to_onnx` for the arguments. In a data-parallel
        job (``opt.DistOpt``) only rank 0 writes; the others return the path."""
        path = os.fspath(path)
        if not self._writes_files():
            return path
        if os.path.exists(path) and not overwrite:
            raise OverwriteError(f"{path} already exists; pass overwrite=True to replace it")
        return _save_atomic(self.to_onnx(inputs, **kwargs), path, overwrite=overwrite)

    def cut(self, last_layers, inputs=None):
        """A NEW model (``sonnx.SONNXModel``) computing only what the outputs at
        ``last_layers`` (-1, -k or a node/value name, see ``sonnx``) need, with a copy of the
        current weights."""
        return SONNXModel(self.to_onnx(inputs)).cut(last_layers)

    def summary(self) -> str:
        lines = [f"{type(self).__name__}"]
        total = 0
        for k, p in self.get_params().items():
            lines.append(f"  {k:40s} {str(list(p.shape)):20s} {p.dtype}"
                         f"{'' if p.requires_grad else '  (frozen)'}")
            total += p.size()
        lines.append(f"  {total:,} parameters")
        return "\n".join(lines)


# --------------------------------------------------------------------------- replay
class _NotReplayable(Exception):
    pass


def _lifetimes(calls, keep: set) -> list[tuple]:
    """The slots each replayed step frees (``calls``: ``[(node, in slots, out slots), ...]``
    in run order): every value right after its last reader, an output nobody reads right
    after its producer, never the slots in ``keep`` (the replay's outputs), as a plan made
    from a graph does (``runtime.plan.lifetimes``). A value its reader frees is one nothing
    else reads, which the training fusions (``autodiff.fusion``) look for; the tape keeps
    what the backward needs."""
    last: dict = {}
    for k, (_, ins, _) in enumerate(calls):
        for s in ins:
            if s >= 0:
                last[s] = k
    frees: list[list[int]] = [[] for _ in calls]
    for s, k in last.items():
        if s not in keep:
            frees[k].append(s)
    for k, (_, _, outs_) in enumerate(calls):
        for s in outs_:
            if s >= 0 and s not in last and s not in keep:
                frees[k].append(s)
    return [tuple(sorted(f)) for f in frees]


class _Replay:
    """A forward's tape as a static schedule of kernel calls (a ``Plan`` of steps over integer
    slots), re-run on new inputs by the executor's run loop with the Tensor runner."""

    def __init__(self, inputs, out):
        self.structure = out
        outs = [out] if isinstance(out, Tensor) else list(out) if isinstance(
            out, (list, tuple)) else None
        if outs is None or not all(isinstance(t, Tensor) for t in outs):
            raise _NotReplayable
        slots: dict = {}             # source key -> slot
        constants: dict = {}         # slot -> leaf Tensor
        stop = set()
        for k, t in enumerate(inputs):
            key = ("n", id(t.creator), t._index) if t.creator is not None else ("l", id(t))
            slots.setdefault(key, k)
            if t.creator is not None:
                stop.add((id(t.creator), t._index))
        n_in = len(inputs)

        n_slots = [n_in]

        def slot_of(key, leaf=None) -> int:
            s = slots.get(key)
            if s is None:
                s = slots[key] = n_slots[0]
                n_slots[0] += 1
                if leaf is not None:
                    constants[s] = leaf
            return s

        nodes = tape_order(outs, stop)
        runner = TapeRunner()
        calls = []
        for n in nodes:
            ins = []
            for p in n.parents:
                if p is None:
                    ins.append(-1)
                elif type(p) is tuple:
                    ins.append(slot_of(("n", id(p[0]), p[1])))
                else:
                    if getattr(p, "_untraced", False):
                        raise _NotReplayable
                    ins.append(slot_of(("l", id(p)), p))
            outs_ = tuple(slot_of(("n", id(n), i)) for i in range(n.n_outputs))
            calls.append((n, tuple(ins), outs_))
        out_slots = []
        for t in outs:
            if t.creator is not None:
                out_slots.append(slot_of(("n", id(t.creator), t._index)))
            else:
                out_slots.append(slot_of(("l", id(t)), t))
        frees = _lifetimes(calls, set(out_slots))
        steps = []
        for (n, ins, outs_), free in zip(calls, frees):
            # keep what the kernel call needs, not the tape node (it holds saved arrays)
            node = Node(n.op_type, [], list(n.out_names or ()), n.attrs, n.name, n.domain)
            step = Step(n.fn, ins, outs_, n.kw, free, node, opset=n.opset)
            runner.preset(step, kw=n.kw, wants_ctx=n.wants_ctx, n_outputs=n.n_outputs, fn=n.fn,
                          training_mode=n.training_mode, state_updates=n.state_updates,
                          out_names=n.out_names)
            steps.append(step)
        self.plan = Plan.of_steps(steps, n_slots=n_slots[0],
                                  inputs=range(n_in), outputs=out_slots, constants=constants)
        runner.leaf_source = constants.get   # the leaves the plan holds, fixed
        self.runner = runner
        self.single = isinstance(out, Tensor)
        self.kind = type(out)

    def run(self, inputs):
        dev = next((t.device for t in inputs), None)
        hook = dev.profile_hook() if dev is not None else None
        outs = self.plan.execute(inputs, runner=self.runner, hook=hook)
        if self.single:
            return outs[0]
        return self.kind(outs) if self.kind in (list, tuple) else outs


# --------------------------------------------------------------------------- imported graphs
def _coerce_input(name: str, t: Tensor, want: np.dtype, where: str) -> Tensor:
    """``t`` converted to the integer dtype ``want`` when that loses nothing (a warning says
    so), else an InputError naming the input, the dtypes and the first value that does not
    fit."""
    fix = f"convert it with .astype({want.name!r})"
    if want.kind not in "iub" or t.dtype.kind not in "iubf":
        raise InputError(f"{where}: input {name!r} expects dtype {want}, got {t.dtype}; {fix}")
    a = t.numpy()
    if want.kind == "b":
        ok = np.isin(a, (0, 1))
    else:
        info = np.iinfo(want)
        with np.errstate(invalid="ignore"):
            ok = np.isfinite(a) & (a == np.round(a)) & (a >= info.min) & (a <= info.max) \
                if a.dtype.kind == "f" else (a >= info.min) & (a <= info.max)
    if not bool(np.all(ok)):
        bad = a[~ok].ravel()[0].item()
        raise InputError(f"{where}: input {name!r} expects dtype {want}, got {t.dtype} with "
                         f"a value that {want} cannot hold exactly ({bad!r}); {fix} after "
                         f"checking the values")
    import warnings  # noqa: PLC0415
    warnings.warn(f"{where}: input {name!r} expects {want}, got {t.dtype}; its values are "
                  f"exact in {want} and were converted (pass {want} to avoid the copy)",
                  UserWarning, stacklevel=4)
    return Tensor(device=t.device, data=t.device.put(a.astype(want)), name=t.name)


def _is_float(a) -> bool:
    return a.dtype.kind == "f" or a.dtype.name == "bfloat16"


def _initializer_source(plan, weights: dict, inputs: set):
    """``slot -> Tensor or None`` (``TapeRunner.leaf_source``): the Tensor of ``weights``
    ({initializer name: Tensor}, the dict the model's runs pass as ``values``) that a plan
    slot holds; None for the graph's inputs (a fed input overrides an initializer)."""
    names = {s: n for n, s in plan.slots.items() if n in weights and n not in inputs}

    def source(slot):
        name = names.get(slot)
        return None if name is None else weights.get(name)
    return source


def _parameter_rule(graph, params, constants, scalars):
    """``trainable(name, array, used_as_weight) -> bool`` for the float initializers of
    ``graph`` that are no running statistics (see :class:`SONNXModel`).

    By default a float initializer read as a weight (not only as an op's setting) is a
    parameter unless it is 0-d: exporters write scalar constants as 0-d initializers (the
    dynamo exporter of torch >= 2.9 every one: the attention scale, GELU's sqrt(2), 1 and
    0.5, mask fills; TorchScript's constant folding and tf2onnx some), while a layer's weights
    have a shape. ``scalars`` (True) makes 0-d ones parameters too; ``params`` / ``constants``
    (names) decide single initializers either way."""
    if scalars is None:
        env = os.environ.get("WORKBENCH_SCALAR_PARAMS", "").strip().lower()
        if env not in ("", "0", "1", "false", "true", "no", "yes", "off", "on"):
            raise InputError(f"WORKBENCH_SCALAR_PARAMS must be 0 or 1, got {env!r}")
        scalars = env in ("1", "true", "yes", "on")
    names = dict(graph.initializers)

    def named(arg, what):
        if arg is None:
            return set()
        got = {arg} if isinstance(arg, str) else set(arg)
        bad = sorted(k for k in got if not isinstance(k, str) or k not in names)
        if bad:
            raise InputError(f"SONNXModel({what}=...): {bad} are no initializers of the "
                             f"graph {graph.name!r} (its float initializers: "
                             f"{sorted(k for k, a in names.items() if _is_float(a))[:20]})")
        return got

    forced, fixed = named(params, "params"), named(constants, "constants")
    both = sorted(forced & fixed)
    if both:
        raise InputError(f"SONNXModel: {both} given both as params and as constants")
    not_float = sorted(k for k in forced if not _is_float(names[k]))
    if not_float:
        raise InputError(f"SONNXModel(params=...): {not_float} are no float initializers "
                         f"(dtypes {[str(names[k].dtype) for k in not_float]}): only float "
                         f"tensors can be trained")

    def trainable(name, a, used_as_weight) -> bool:
        if name in forced:
            return True
        if name in fixed:
            return False
        return used_as_weight and (scalars or a.ndim > 0)
    trainable.forced = forced
    return trainable


class SONNXModel(Model):
    """An ONNX model as a trainable ``model.Model`` (SINGA's ``sonnx.SONNXModel``).

    ``last_layers_counting`` says how an integer ``last_layers`` is counted
    (``runtime.cut.resolve_cut``): ``"workbench"`` (the default: -1 is the whole graph,
    -k cuts after the k-th node from the end) or ``"singa"`` (SINGA's code: node index
    ``(k+1) % N``, so -1 is the first node, -2 the whole graph, -3 drops the last node).
    It comes from the constructor argument, else the class attribute, else the environment
    variable ``WORKBENCH_LAST_LAYERS`` (``singa`` or ``workbench``): SINGA programs run
    unchanged with ``WORKBENCH_LAST_LAYERS=singa``. Node or value names mean the same in
    both.

    Which initializers are parameters (``get_params()``, trained): the float initializers
    that a node reads as a weight, except 0-d ones, which are constants like the
    non-float initializers, the ops' settings (Dropout's ratio, Clip's bounds...) and
    BatchNormalization's running statistics (buffers). Exporters write scalar constants as 0-d
    initializers (torch.onnx's dynamo exporter every one: the attention scale, GELU's
    sqrt(2), 1 and 0.5, mask fills); trained, they would make training differ from the
    framework's. The overrides: ``params=[names]`` trains these initializers anyway (e.g. a
    learnable 0-d ``nn.Parameter``), ``constants=[names]`` keeps these out of the
    parameters; ``scalar_params=True`` (or the class attribute, or the environment variable
    ``WORKBENCH_SCALAR_PARAMS=1``) makes every 0-d float initializer a parameter (this class's
    rule before 0-d initializers became constants). A name that is no initializer of the
    graph is an error.
    """

    #: None: taken from WORKBENCH_LAST_LAYERS (default "workbench")
    last_layers_counting: str | None = None
    #: None: taken from WORKBENCH_SCALAR_PARAMS ("1": 0-d float initializers are parameters
    #: too, the rule before 0-d ones became constants; default: they are constants)
    scalar_params: bool | None = None

    def __init__(self, onnx_model, device=None, *, last_layers_counting: str | None = None,
                 params=None, constants=None, scalar_params: bool | None = None):
        super().__init__()
        counting = (last_layers_counting or type(self).last_layers_counting
                    or os.environ.get("WORKBENCH_LAST_LAYERS") or "workbench")
        counting = counting.strip().lower()
        if counting not in COUNTINGS:
            raise InputError(f"last_layers_counting must be one of {COUNTINGS}, got "
                             f"{counting!r} (argument, class attribute or the environment "
                             f"variable WORKBENCH_LAST_LAYERS)")
        self.last_layers_counting = counting
        self._dev = _device.get_device(device)
        loaded = load(onnx_model)
        self._proto = loaded.proto
        self.onnx_graph = loaded.graph
        self._weights: OrderedDict[str, Tensor] = OrderedDict()
        self._tplans: dict = {}
        stats, trainable = set(), set()
        trainable_now = _parameter_rule(self.onnx_graph, params, constants, scalar_params
                                        if scalar_params is not None else
                                        type(self).scalar_params)
        for n in self.onnx_graph.nodes:
            # an op's registered ``state_inputs`` hold running statistics (buffers) and its
            # ``settings`` inputs settings (Dropout's ratio, Clip's bounds...), not weights
            f = facts(n.op_type, n.domain)
            stats.update(i for k, i in enumerate(n.inputs) if i and k in f.state_inputs)
            fixed = f.settings + f.state_inputs
            trainable.update(i for k, i in enumerate(n.inputs) if i and k not in fixed)
            for sg in n.subgraphs:
                trainable.update(sg.free_variables())
        stat_params = sorted(stats & trainable_now.forced)
        if stat_params:
            raise InputError(f"SONNXModel(params=...): {stat_params} are running statistics "
                             f"(BatchNormalization's mean/variance: buffers updated in "
                             f"training), not trainable weights")
        # the initial host weights and the graph's attribute arrays in one block
        # (``inference_cache.Arena``): the inference cache compares them with its snapshot in
        # one ``memcmp`` per run; copied once, straight from the loader's arrays
        arrays = dict(self.onnx_graph.initializers)
        arena = None if self._dev.is_cuda else _icache.arena_for(arrays, self.onnx_graph)
        self.__dict__["_arena"] = arena
        for name, arr in arrays.items():
            held = arena is not None and arena.holds(arr)
            a = arr if held else np.array(arr, copy=True)
            if _is_float(a) and name not in stats and trainable_now(name, a, name in trainable):
                t = Tensor(device=self._dev, data=a, requires_grad=True, stores_grad=True,
                           name=name)
                self._params[name] = t
            elif name in stats:
                t = Tensor(device=self._dev, data=a, name=name)
                self._buffers[name] = t
            else:
                t = Tensor(device=self._dev, data=a, name=name)
            if held:
                t.data = a           # the block's array itself (the Tensor made a copy)
            self._weights[name] = t
        self._track_graph()
        self._share_initializers()

    def _track_graph(self) -> None:
        """Count every in-place edit of ``onnx_graph`` (``inference_cache.track``): the
        cached plans (inference, training, cuts) are dropped when the count moves. A graph
        that was not tracked (new, or a copy: copies and pickles are plain objects) moves the
        count once, since it may have been edited before."""
        version = self.__dict__.get("_graph_version")
        if version is None:
            version = self.__dict__["_graph_version"] = _icache.Version()
        if not _icache.tracked_by(self.onnx_graph, version):
            version.n += 1
        _icache.track(self.onnx_graph, version)

    def _graph_state(self) -> tuple:
        """``(id of the graph, edit count, graph)``: cached plans are valid while the first
        two stay the same (the graph is held so that its id is not reused)."""
        if not _icache.tracked_by(self.onnx_graph, self.__dict__.get("_graph_version")):
            self._track_graph()
        return id(self.onnx_graph), self.__dict__["_graph_version"].n, self.onnx_graph

    def __getstate__(self) -> dict:
        """Pickles and deep copies leave the prepared plans behind (they hold addresses of
        this model's buffers), the weight block (the copy's arrays are its own) and the
        graph-mode replays (:meth:`Model.__getstate__`)."""
        state = super().__getstate__()
        for k in ("_inference_cache", "_arena", "_feed_dtypes", "_tplans_state", "_icache_fits"):
            state.pop(k, None)
        state["_tplans"] = {}
        return state

    def _share_initializers(self) -> None:
        # the graph's initializer arrays are not used by the Tensor runner: share ours
        for k in list(self.onnx_graph.initializers):
            self.onnx_graph.initializers[k] = self._weights[k].data

    def _set(self, values: dict, mine: dict, what: str) -> None:
        # states saved when these initializers were parameters (scalar_params=True, an
        # earlier version, SINGA): say how to load them instead of only "unknown"
        kept = [k for k in values if k not in mine and k in self._weights
                and _is_float(self._weights[k].data)]
        if kept:
            raise InputError(f"{what}(s) {kept[:5]} are initializers that this model keeps as "
                             f"constants (0-d initializers, settings or constants=...); to "
                             f"load them as parameters build it with "
                             f"SONNXModel(..., params={kept[:5]!r}) or scalar_params=True")
        super()._set(values, mine, what)

    # ------------------------------------------------------------------ helpers
    @property
    def input_names(self) -> list:
        return [v.name for v in self.onnx_graph.inputs]

    @property
    def output_names(self) -> list:
        return [v.name for v in self.onnx_graph.outputs]

    def layer_names(self) -> list:
        """Node names in the order ``last_layers`` counts them (-1 is the last)."""
        return [n.name for n in layer_nodes(self.onnx_graph)]

    def imported_params(self) -> OrderedDict[str, Tensor]:
        """The parameters that came from the ONNX file (not appended layers)."""
        return OrderedDict((k, t) for k, t in self._params.items())

    def freeze_imported(self, inference: bool = False) -> SONNXModel:
        """Freeze the imported weights (transfer learning that trains only appended layers).

        ``inference=True``: the frozen graph also runs in its inference form in training
        mode (BatchNormalization with its running statistics, left unchanged; Dropout
        passing through), as a trunk cache runs it (``workbench.trunk_cache``); by default
        a model in training mode runs every node in its training form."""
        for t in self._params.values():
            t.requires_grad = False
        self.__dict__["_frozen_inference"] = bool(inference)
        return self

    def unfreeze_imported(self) -> SONNXModel:
        for t in self._params.values():
            t.requires_grad = True
        self.__dict__["_frozen_inference"] = False
        return self

    def cache_trunk(self, storage="memory", **options):
        """Compute the frozen imported graph's outputs (up to the ``last_layers`` of each
        forward) once per sample and reuse them: ``storage`` "memory" or "disk" (options:
        ``folder``, ``budget``, ``log``, ``check_batch``), a ``TrunkCache``, or False to
        stop. Returns the cache (``trunk_cache``). See ``workbench.trunk_cache``."""
        return _trunk_cache.attach(self, storage, **options)

    @property
    def trunk_cache(self):
        """The ``TrunkCache`` this model's forward uses, or None."""
        return self.__dict__.get("_trunk_cache")

    def run(self, *inputs, last_layers=None, aux_output=()) -> list:
        """Numpy in, numpy out: the outputs (at ``last_layers``) without recording gradients.

        Runs the imported graph after the inference passes ``backend.prepare`` runs (constant
        folding, BatchNorm folding, fusions), on the current weights: the same numbers as
        ``backend.prepare(model).run`` of the same weights. Appended layers are not run (use
        ``forward``)."""
        if not self._dev.is_cuda and self._inference_cache_fits():
            return self._cached_run(inputs, self._outputs_for(last_layers, aux_output))
        return self._variable_run(inputs, last_layers, aux_output)

    def _inference_cache_fits(self) -> bool:
        """Whether the inference cache may hold its snapshot of the weights (a second copy of
        them, see ``inference_cache``): at most ``WORKBENCH_INFERENCE_CACHE_MB`` (1024 by
        default; 0 turns the cache off) and at most a quarter of the memory available when
        it is decided (``/proc/meminfo``). A bigger model keeps the variable-weight plan (the
        same numbers, slower, no copy). Decided once per graph version and weight set."""
        d = self.__dict__
        version = d.get("_graph_version")
        key = (id(self.onnx_graph), version.n if version is not None else None,
               len(self._weights))
        got = d.get("_icache_fits")
        if got is not None and got[0] == key:
            return got[1]
        need = sum(int(getattr(t.data, "nbytes", 0)) for t in self._weights.values())
        fits = need <= _icache.snapshot_budget()
        d["_icache_fits"] = (key, fits)
        return fits

    def _variable_run(self, inputs, last_layers, aux_output) -> list:
        """``run`` on the variable-weight inference plan (``_tplan(..., inference=True)``)."""
        xs = [x if isinstance(x, Tensor) else Tensor(device=self._dev, data=np.asarray(x))
              for x in inputs]
        was = self.training
        self.eval()
        try:
            with autograd.no_grad():
                outs = SONNXModel._forward(self, xs, last_layers, aux_output,
                                           inference=True)
        finally:
            super().train(was)
        return [o.numpy() for o in outs]

    # ------------------------------------------------------------------ inference cache
    def _cached_run(self, inputs, outputs: tuple) -> list:
        """The outputs of a host run on the cached prepared plan (``inference_cache``): built
        as ``backend.prepare`` builds one, with the weights as constants, and used only while
        the exact checks say nothing it was built from changed."""
        d = self.__dict__
        cache = d.setdefault("_inference_cache", {})
        g = self.onnx_graph
        if not _icache.tracked_by(g, d.get("_graph_version")):
            self._track_graph()     # a new graph, a copy, or one tracked by another model
        version = d["_graph_version"]
        ent = cache.get(outputs)
        same_graph = ent is not None and ent[0] is g and ent[1] == version.n
        if same_graph and ent[3].unchanged():
            plan = ent[2]
            feeds = self._cached_feeds(inputs)
            if feeds is None:
                return self._variable_run(inputs, list(outputs), ())
            if plan is None:         # weights unchanged since the last run noticed a change
                plan = self._build_cached_plan(outputs, ent[3])
                cache[outputs] = (g, ent[1], plan, ent[3])
            if plan is False:
                return self._variable_run(inputs, list(outputs), ())
            return plan.run(feeds)
        if ent is not None and ent[0] is not g:
            cache.clear()            # another graph (compile re-planned): drop the old plans
        _icache.track(g, version)    # nodes the user added since: count their edits too
        snap = next((e[3] for e in cache.values() if e[0] is g and e[1] == version.n
                     and e[3].unchanged()), None)   # another cut's: share its frozen weights
        if snap is None:
            names = [k for k in g.initializers if k in self._weights]
            snap = _icache.Snapshot(self._weights, names, d.get("_arena"), g)
        if same_graph:
            # only the weights changed (a training step): this run on the variable-weight
            # plan, the prepared plan built on the next run that finds them unchanged
            cache[outputs] = (g, version.n, None, snap)
            return self._variable_run(inputs, list(outputs), ())
        feeds = self._cached_feeds(inputs)
        if feeds is None:
            cache[outputs] = (g, version.n, None, snap)
            return self._variable_run(inputs, list(outputs), ())
        plan = self._build_cached_plan(outputs, snap)
        cache[outputs] = (g, version.n, plan, snap)
        if plan is False:
            return self._variable_run(inputs, list(outputs), ())
        return plan.run(feeds)

    def _build_cached_plan(self, outputs: tuple, snap) -> Plan | bool:
        """``backend.prepare``'s plan of the graph with the snapshot's (frozen) weights;
        False when the inference passes or the planner refuse this graph with every weight
        constant (the variable-weight plan runs it then, and says what is wrong if it is)."""
        try:
            return self._prepared_plan(outputs, snap)
        except Exception:  # noqa: BLE001 - the variable-weight path reports the model's faults
            return False

    def _prepared_plan(self, outputs: tuple, snap) -> Plan:
        g = self.onnx_graph.copy()
        g.outputs = [self._value_info(o) for o in outputs]
        g.initializers = {k: snap.frozen_of(self._weights[k].data if k in self._weights
                                            else v) for k, v in g.initializers.items()}
        for n in g.nodes:
            for k, v in n.attrs.items():
                if isinstance(v, np.ndarray):
                    n.attrs[k] = snap.frozen_of(v)
        g = _passes.optimize(g, layout="auto")
        return Plan(g, outputs=list(outputs), device=self._dev)

    def _cached_feeds(self, inputs) -> list | None:
        """The inputs as arrays of the declared dtypes, checked and converted as ``forward``
        checks them; None when a float input comes in another float dtype (``forward``
        computes in that dtype) or with a size other than one the file fixes (``forward``
        takes another batch): the variable-weight plan runs those, as before."""
        infos = self.onnx_graph.inputs
        if len(inputs) != len(infos):
            raise InputError(f"the model takes {len(infos)} input(s) "
                             f"{[v.name for v in infos]}, got {len(inputs)}")
        wants = self.__dict__.get("_feed_dtypes")
        if wants is None or wants[0] is not infos:
            from workbench.arrays.dtypes import np_dtype_of_onnx
            wants = self.__dict__["_feed_dtypes"] = (infos, [
                (np_dtype_of_onnx(v.dtype) if v.dtype else None,
                 None if v.shape is None else len(v.shape),
                 () if v.shape is None else tuple((d, n) for d, n in enumerate(v.shape)
                                                  if isinstance(n, int))) for v in infos])
        feeds = []
        for info, (want, rank, fixed), a in zip(infos, wants[1], inputs):
            shape = getattr(a, "shape", None)
            if fixed and shape is not None and len(shape) == rank and \
                    any(shape[d] != n for d, n in fixed):
                # another size where the file fixes one (forward accepts another batch):
                # the prepared plan may have folded the declared sizes in
                return None
            if type(a) is np.ndarray and a.dtype == want and a.ndim == rank:
                feeds.append(a)
                continue
            if isinstance(a, Tensor):
                if a.device != self._dev:
                    raise InputError(f"input {info.name!r} lives on {a.device} but the model "
                                     f"on {self._dev}; move it with Tensor.to_device")
            else:
                a = Tensor._make(np.asarray(a), self._dev, False, None, 0, None)
            a = self._check_input(info, a).data
            if want is not None and getattr(a, "dtype", want) != want:
                return None
            feeds.append(a)
        return feeds

    def _example_inputs(self, inputs):
        if inputs is None and self._placeholders is None:
            from workbench.arrays.dtypes import np_dtype_of_onnx
            from workbench.singa.tensor import PlaceHolder
            return [PlaceHolder(tuple(d if isinstance(d, int) else 1 for d in (v.shape or ())),
                                device=self._dev, dtype=np_dtype_of_onnx(v.dtype or 1),
                                name=v.name) for v in self.onnx_graph.inputs]
        return super()._example_inputs(inputs)

    def _export_defaults(self, inputs, outputs, kwargs) -> None:
        """Keep the file's input names and its symbolic (dynamic) dimensions."""
        names = self.input_names
        if "input_names" not in kwargs and len(inputs) == len(names):
            kwargs["input_names"] = names
        if "dynamic_axes" in kwargs:
            return
        declared = {}
        inits = {t.name for t in self._proto.graph.initializer}
        for vi in list(self._proto.graph.input) + list(self._proto.graph.output):
            if vi.name in inits or not vi.type.HasField("tensor_type"):
                continue
            dims = {i: d.dim_param for i, d in enumerate(vi.type.tensor_type.shape.dim)
                    if d.dim_param}
            if dims:
                declared[vi.name] = dims
        in_names = kwargs.get("input_names") or []
        out_names = list(kwargs.get("output_names") or []) + [
            t.name for t in outputs[len(kwargs.get("output_names") or []):]]
        dyn = {k: v for k, v in declared.items() if k in in_names or k in out_names}
        if dyn:
            kwargs["dynamic_axes"] = dyn

    def to_device(self, device) -> SONNXModel:
        """Move every imported weight (constants too) and appended layers to ``device``."""
        device = _device.get_device(device)
        for t in self._weights.values():
            t.to_device(device)
        super().to_device(device)
        self._dev = device
        self._share_initializers()
        return self

    def _prepare_inputs(self, inputs) -> None:
        """Re-load with the placeholders' shapes (SINGA: the batch size of the PlaceHolder)."""
        infos = self.onnx_graph.inputs
        if len(inputs) != len(infos):
            raise InputError(f"compile: the model takes {len(infos)} input(s) "
                             f"{[v.name for v in infos]}, got {len(inputs)} placeholder(s)")
        changed = {}
        for info, t in zip(infos, inputs):
            self._check_input(info, t, where="compile")
            if info.shape is None or tuple(info.shape) != tuple(t.shape):
                changed[info.name] = tuple(t.shape)
        if changed:
            loaded = load(self._proto, input_shapes=changed)
            loaded.graph.initializers = {k: self._weights[k].data
                                         for k in loaded.graph.initializers}
            self.onnx_graph = loaded.graph
            self._tplans = {}
            self.__dict__.pop("_inference_cache", None)
            self._track_graph()
        dev = inputs[0].device if inputs else None
        if dev is not None and dev != self._dev:
            self.to_device(dev)

    def _check_input(self, info, t, where="forward") -> Tensor:
        """dtype and rank always; fixed non-batch dimensions in forward (compile re-declares
        the input shapes from its placeholders). Returns the Tensor to use: integer or float
        values given for an integer input (SINGA's programs feed int32/float32 token ids to
        int64 inputs) are converted when every value is exactly representable, with a
        warning; otherwise the dtype mismatch is an error."""
        if info.dtype:
            from workbench.arrays.dtypes import np_dtype_of_onnx
            want = np_dtype_of_onnx(info.dtype)
            if t.dtype != want and not (t.dtype.kind == want.kind == "f"):
                t = _coerce_input(info.name, t, want, where)
        if info.shape is not None:
            if len(info.shape) != t.ndim():
                raise ShapeError(f"{where}: input {info.name!r} expects rank "
                                 f"{len(info.shape)} (shape {list(info.shape)}), got shape "
                                 f"{list(t.shape)}")
            for d, (want, got) in enumerate(zip(info.shape, t.shape)):
                if where == "forward" and d > 0 and isinstance(want, int) and want != got:
                    raise ShapeError(f"{where}: input {info.name!r} expects shape "
                                     f"{list(info.shape)}, got {list(t.shape)} (dimension {d} "
                                     f"differs)")
        return t

    def _outputs_for(self, last_layers, aux_output) -> tuple:
        try:
            key = (last_layers, tuple(aux_output))
            hash(key)
        except TypeError:
            return tuple(resolve_cut(self.onnx_graph, last_layers, self.last_layers_counting)
                         + list(aux_output))
        key = key + (self.last_layers_counting,)
        cache = self.__dict__.setdefault("_cut_cache", {})
        state = self._graph_state()
        if key not in cache or cache[key][0][:2] != state[:2]:
            outs = tuple(resolve_cut(self.onnx_graph, last_layers, self.last_layers_counting)
                         + list(aux_output))
            cache[key] = (state, outs)
        return cache[key][1]

    def _tplan(self, outputs: tuple, inference: bool = False) -> tuple:
        """(Plan, TapeRunner) for these outputs in the current mode.

        ``inference`` (eval mode, no gradient recorded): the graph after the inference passes
        that ``backend.prepare`` runs (``passes.optimize``), with this model's parameters and
        running statistics as variables, so ``model.run`` and ``prepare(...).run`` execute the
        same nodes with the same kernels and give the same numbers. Training and recorded
        forwards run the graph as written (every node has its gradient rule)."""
        key = (outputs, self.training, inference)
        state = self._graph_state()
        if self.__dict__.get("_tplans_state", (None, None))[:2] != state[:2]:
            self._tplans = {}        # the graph was edited in place since these were made
            self.__dict__["_tplans_state"] = state
        tp = self._tplans.get(key)
        if tp is None:
            graph = self.onnx_graph
            if inference:
                graph = self._inference_graph(outputs)
            # kernels looked up for the model's device (the CUDA overrides on a GPU); the
            # weights are this model's Tensors, so the plan's own copies stay where they are
            plan = Plan(graph, outputs=list(outputs), training=self.training,
                        check_inputs=False, device=self._dev, move_initializers=inference)
            runner = TapeRunner(self._dev, training_mode=self.training)
            runner.leaf_source = _initializer_source(plan, self._weights,
                                                     {v.name for v in graph.inputs})
            tp = (plan, runner)
            self._tplans[key] = tp
        return tp

    def _inference_graph(self, outputs: tuple):
        g = self.onnx_graph.copy()
        g.outputs = [self._value_info(o) for o in outputs]
        variables = set(self._params) | set(self._buffers)
        variables &= set(g.initializers)
        return _passes.optimize(g, variables=variables,
                                layout=None if self._dev.is_cuda else "auto")

    # ------------------------------------------------------------------ forward
    def forward(self, *x, last_layers=None, aux_output=()):
        """Run the graph on Tensors (or arrays); returns the list of output Tensors (the
        outputs at ``last_layers`` - None, the default, is the whole graph in either
        counting - then the ``aux_output`` values).

        The graph runs as written, each node recorded (for gradients, and for ``to_onnx``,
        which exports what was recorded); :meth:`run` runs the optimized inference graph.
        On the host it runs with one BLAS thread, as ``model(...)`` and the backward do (the
        engine's own threads split the large products): a direct ``forward`` call computes
        as the same step through ``__call__`` does, whatever BLAS' own thread count, and its
        MatMul/Gemm products give the same bits at any engine thread count
        (``ops.parallel.exact_products``)."""
        if self._dev.is_cuda:
            return self._forward(x, last_layers, aux_output)
        with one_blas_thread(), exact_products():
            return self._forward(x, last_layers, aux_output)

    def _run_replay(self, rep, inputs):
        # a direct ``forward`` call in graph mode rounds as the eager forward does (the
        # same products at any thread count), not only a step through ``__call__``
        if self._dev.is_cuda:
            return rep.run(inputs)
        with one_blas_thread(), exact_products():
            return rep.run(inputs)

    def _forward(self, x, last_layers, aux_output, inference: bool = False):
        if not inference and (self.__dict__.get("_trunk_cache") is not None
                              or self.__dict__.get("_frozen_inference")):
            out = _trunk_cache.forward_hook(self, x, last_layers, aux_output)
            if out is not None:
                return out
        if not inference and not self.training and not self._dev.is_cuda \
                and not _recording.get() and self._inference_cache_fits():
            # eval mode with no tape at all (autograd.inference_mode): nothing can be
            # exported or differentiated from these outputs, so the cached prepared plan
            outs = self._cached_run(x, self._outputs_for(last_layers, aux_output))
            return [Tensor._make(o, self._dev, False, None, 0, None) if type(o) is np.ndarray
                    else o for o in outs]
        tp = self._tplan(self._outputs_for(last_layers, aux_output), inference)
        infos = self.onnx_graph.inputs
        if len(x) != len(infos):
            raise InputError(f"the model takes {len(infos)} input(s) "
                             f"{[v.name for v in infos]}, got {len(x)}")
        xs = []
        for info, a in zip(infos, x):
            t = a if isinstance(a, Tensor) else Tensor(device=self._dev, data=np.asarray(a))
            if t.device != self._dev:
                raise InputError(f"input {info.name!r} lives on {t.device} but the model on "
                                 f"{self._dev}; move it with Tensor.to_device")
            xs.append(self._check_input(info, t))
        if self.inference_only:
            with autograd.no_grad():
                return self._run(tp, xs)
        return self._run(tp, xs)

    def _run(self, tp: tuple, xs: list) -> list:
        plan, runner = tp
        return plan.execute(xs, runner=runner, values=self._weights,
                            hook=self._dev.profile_hook())

    # ------------------------------------------------------------------ cut
    def cut(self, last_layers, inputs=None) -> SONNXModel:
        """A NEW SONNXModel holding only the nodes the outputs at ``last_layers`` need, with
        a copy of the current weights (appended layers are not part of it)."""
        if isinstance(last_layers, (int, np.integer)) and not isinstance(last_layers, bool):
            last_layers = resolve_cut(self.onnx_graph, last_layers, self.last_layers_counting)
        g = cut(self.onnx_graph, last_layers, name=self.onnx_graph.name,
                initializers={k: np.array(t.numpy(), copy=True)
                              for k, t in self._weights.items()})
        g.outputs = [self._value_info(v.name) for v in g.outputs]
        proto = onnx.ModelProto()
        proto.CopyFrom(self._proto)
        proto.graph.CopyFrom(g.to_proto())
        for vi in list(proto.graph.output):
            if not vi.type.tensor_type.elem_type:
                self._type_outputs(proto)
                break
        kept = set(g.initializers)
        return SONNXModel(proto, device=self._dev,
                          last_layers_counting=self.last_layers_counting,
                          params=[k for k in self._params if k in kept],
                          constants=[k for k in self._weights
                                     if k in kept and k not in self._params])

    def _value_info(self, name: str) -> ValueInfo:
        v = self.onnx_graph.value(name)
        if v is not None and v.dtype:
            return ValueInfo(name, v.dtype, v.shape)
        return ValueInfo(name, None, None)

    def _type_outputs(self, proto) -> None:
        """Give untyped graph outputs an element type (run the cut graph once)."""
        from workbench.arrays.dtypes import np_dtype_of_onnx, onnx_dtype_of_np
        del proto.graph.value_info[:]
        tmp = onnx.ModelProto()
        tmp.CopyFrom(proto)
        for vi in tmp.graph.output:
            vi.type.tensor_type.elem_type = onnx.TensorProto.FLOAT
        feeds = []
        for v in self.onnx_graph.inputs:
            if v.name not in {i.name for i in proto.graph.input}:
                continue
            shape = [d if isinstance(d, int) else 1 for d in (v.shape or ())]
            feeds.append(np.zeros(shape, dtype=np_dtype_of_onnx(v.dtype or 1)))
        outs = Plan(load(tmp, check=False).graph).run(feeds)
        for vi, o in zip(proto.graph.output, outs):
            vi.type.tensor_type.elem_type = onnx_dtype_of_np(np.asarray(o).dtype)
