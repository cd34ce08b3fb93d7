"""``Model`` (SINGA-compatible): forward, train_one_batch, compile, train/eval, states, export.

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
import tempfile
from collections import OrderedDict

import numpy as np

from workbench import autograd
from workbench.errors import InputError, OverwriteError, WorkbenchError
from workbench.layer import Layer
from workbench.tensor import Tensor, as_tensor

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
        if self.training and type(self).train_one_batch is not Model.train_one_batch:
            return self.train_one_batch(*args, **kwargs)
        if self.inference_only:
            with autograd.no_grad():
                return self.forward(*args, **kwargs)
        return self.forward(*args, **kwargs)

    def train(self, mode: bool = True):
        """Training mode (Dropout drops, BatchNorm uses batch statistics); ``train(True)``
        also ends the inference-only state of ``compile(is_train=False)``."""
        super().train(mode)
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
        was = self.training
        self.train(False)
        try:
            with autograd.no_grad():
                type(self).forward(self, *inputs)
        finally:
            self.train(was)
            states = self.get_states()
            for k, a in saved.items():
                states[k].data = a

    # ------------------------------------------------------------------ graph mode
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
        return rep.run([a for a in args if isinstance(a, Tensor)])

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
        folder = os.path.dirname(os.path.abspath(fpath))
        fd, tmp = tempfile.mkstemp(prefix=f".{os.path.basename(fpath)}.", suffix=".tmp",
                                   dir=folder)
        try:
            with os.fdopen(fd, "wb") as f:
                np.savez(f, **arrays)
            os.replace(tmp, fpath)
        except BaseException:
            if os.path.exists(tmp):
                os.unlink(tmp)
            raise
        return fpath

    def load_states(self, fpath) -> dict:
        """Read an .npz written by ``save_states``; returns the aux states ({name: array})."""
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
        return aux

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
        from workbench.graph.export import to_onnx
        xs = self._example_inputs(inputs)
        was = self.training
        self.train(False)
        try:
            with autograd.no_grad():
                out = type(self).forward(self, *xs)
        finally:
            self.train(was)
        outs = [out] if isinstance(out, Tensor) else list(out)
        kwargs.setdefault("model_name", type(self).__name__)
        self._export_defaults(xs, outs, kwargs)
        return to_onnx(xs, outs, **kwargs)

    def _export_defaults(self, inputs, outputs, kwargs) -> None:
        """Hook: fill default export arguments (SONNXModel keeps the file's names)."""

    def export(self, path, inputs=None, *, overwrite: bool = False, **kwargs) -> str:
        """Write the model to ``path`` as ONNX (atomically; never over an existing file
        unless ``overwrite=True``). See :meth:`to_onnx` for the arguments. In a data-parallel
        job (``opt.DistOpt``) only rank 0 writes; the others return the path."""
        from workbench.graph.export import save_atomic
        path = os.fspath(path)
        if not self._writes_files():
            return path
        if os.path.exists(path) and not overwrite:
            raise OverwriteError(f"{path} already exists; pass overwrite=True to replace it")
        return save_atomic(self.to_onnx(inputs, **kwargs), path, overwrite=overwrite)

    def cut(self, last_layers, inputs=None):
        """A NEW model (``sonnx.SONNXModel``) computing only what the outputs at
        ``last_layers`` (-1, -k or a node/value name, see ``sonnx``) need, with a copy of the
        current weights."""
        from workbench.sonnx import SONNXModel
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


class _Replay:
    """A forward's tape as a static list of kernel calls, re-run on new inputs."""

    def __init__(self, inputs, out):
        self.structure = out
        outs = [out] if isinstance(out, Tensor) else list(out) if isinstance(
            out, (list, tuple)) else None
        if outs is None or not all(isinstance(t, Tensor) for t in outs):
            raise _NotReplayable
        src = {}
        stop = set()
        for k, t in enumerate(inputs):
            if t.creator is not None:
                src[("n", id(t.creator), t._index)] = ("in", k)
                stop.add((id(t.creator), t._index))
            else:
                src[("l", id(t))] = ("in", k)
        nodes = autograd.tape_order(outs, stop)
        index = {id(n): j for j, n in enumerate(nodes)}
        steps = []
        for n in nodes:
            sources = []
            for p in n.parents:
                if p is None:
                    sources.append(None)
                elif type(p) is tuple:
                    key = ("n", id(p[0]), p[1])
                    sources.append(src.get(key) or ("node", index[id(p[0])], p[1]))
                else:
                    if getattr(p, "_untraced", False):
                        raise _NotReplayable
                    sources.append(src.get(("l", id(p))) or ("leaf", p))
            # keep what the kernel call needs, not the node (it holds saved arrays)
            spec = (n.op_type, n.domain, n.opset, n.fn, n.wants_ctx, n.kw, n.attrs,
                    n.n_outputs, n.name, n.out_names, n.training, n.state_updates)
            steps.append((spec, sources))
        self.steps = steps
        self.outs = []
        for t in outs:
            if t.creator is not None:
                key = ("n", id(t.creator), t._index)
                self.outs.append(src.get(key) or ("node", index[id(t.creator)], t._index))
            else:
                self.outs.append(src.get(("l", id(t))) or ("leaf", t))
        self.single = isinstance(out, Tensor)
        self.kind = type(out)

    def run(self, inputs):
        results = []

        def get(s):
            if s is None:
                return None
            if s[0] == "in":
                return inputs[s[1]]
            if s[0] == "node":
                return results[s[1]][s[2]]
            return s[1]

        run_op = autograd.run_op
        for spec, sources in self.steps:
            (op_type, domain, opset, fn, wants_ctx, kw, attrs, n_out, name, out_names,
             training, state_updates) = spec
            results.append(run_op(op_type, domain, opset, fn, wants_ctx, kw, attrs,
                                  [get(s) for s in sources], n_out, name, out_names, training,
                                  state_updates))
        outs = [get(s) for s in self.outs]
        if self.single:
            return outs[0]
        return self.kind(outs) if self.kind in (list, tuple) else outs
