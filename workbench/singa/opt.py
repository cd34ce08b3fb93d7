"""Optimizers (SINGA-compatible): SGD, Adam, AdamW, RMSProp, AdaGrad, and learning-rate schedules.

>>> import numpy as np
>>> from workbench import tensor, autograd, opt
>>> w = tensor.Tensor(data=np.array([1.0, 2.0], np.float32), requires_grad=True,
...                   stores_grad=True)
>>> sgd = opt.SGD(lr=0.1)
>>> sgd.backward_and_update(autograd.reduce_sum(w * w))
>>> w.numpy().tolist()
[0.800000011920929, 1.600000023841858]

Like SINGA's, an optimizer is not given the parameters: ``backward_and_update(loss)`` updates
every parameter (a leaf Tensor with ``stores_grad``) that the loss's backward pass reaches.
Frozen parameters (``requires_grad=False``) are not reached. Updates are in place.

* SGD follows PyTorch (``momentum``, ``dampening``, ``nesterov``, L2 ``weight_decay``; the
  momentum buffer starts at the first gradient).
* ``backward_and_update_half(loss)``: mixed precision - the backward pass runs on the
  (float16) parameters with the loss multiplied by a dynamic loss scale; gradients are
  unscaled in float32 and applied to float32 master copies, which are rounded back into the
  parameters. A step whose gradients overflow is skipped and the scale is halved; after
  ``growth_interval`` good steps it doubles.
* ``DistOpt(opt)`` wraps any of them for data-parallel training across processes (SINGA's
  ``opt.DistOpt``: MPI on CPUs, NCCL on GPUs; see docs/distributed.md). Its
  ``backward_and_partial_update`` / ``backward_and_sparse_update`` exist only there: on a
  plain optimizer they raise :class:`DistributedOnlyError`.
"""

from __future__ import annotations

import math
import warnings
import weakref

import numpy as np

from workbench.arrays.device import cpu
from workbench.autodiff.tape import Tensor
from workbench.dist import Reducer, get_communicator
from workbench.errors import WorkbenchError
from workbench.singa import autograd


class DistributedOnlyError(WorkbenchError, NotImplementedError):
    """A SINGA DistOpt (multi-GPU, all-reduce) feature that this single-process engine lacks."""


# --------------------------------------------------------------------------- schedules
def _step_number(step) -> float:
    """The step as a number, from an int/float or SINGA's step Tensor of shape (1,)."""
    if isinstance(step, Tensor):
        a = step.numpy().reshape(-1)
        if a.size != 1:
            raise WorkbenchError(f"a scheduler takes the step counter (one value), got a "
                                 f"Tensor of shape {list(step.shape)}")
        return float(a[0])
    return float(step)


class DecayScheduler:
    """A value (learning rate, momentum, weight decay...) as a function of the step counter
    (SINGA's ``opt.DecayScheduler``).

    Called with a number it returns a float; called with a Tensor (SINGA's step counter,
    shape (1,)) it returns a float32 Tensor of shape (1,) on the step's device, as SINGA's do.
    Subclasses implement ``value(step: float) -> float``.
    """

    def __init__(self, init_value: float):
        self.init_value = float(init_value)

    def __call__(self, step):
        v = float(self.value(_step_number(step)))
        if isinstance(step, Tensor):
            return Tensor(device=step.device, data=np.array([v], np.float32))
        return v

    def call(self, step):
        """SINGA's name for ``__call__`` on a step Tensor."""
        return self(step)

    def value(self, step: float) -> float:
        raise NotImplementedError(f"{type(self).__name__}.value is not implemented")


class Constant(DecayScheduler):
    """Always ``init_value``."""

    def value(self, step: float) -> float:
        return self.init_value


class ExponentialDecay(DecayScheduler):
    """``init * decay_rate ** (step / decay_steps)`` (floored exponent with ``staircase``)."""

    def __init__(self, init_value: float, decay_steps: int, decay_rate: float,
                 staircase: bool = False):
        super().__init__(init_value)
        if not decay_steps or float(decay_steps) <= 0:
            raise WorkbenchError(f"ExponentialDecay: decay_steps must be > 0, got "
                                 f"{decay_steps!r}")
        self.decay_steps, self.decay_rate, self.staircase = decay_steps, decay_rate, staircase

    def value(self, step: float) -> float:
        e = step / self.decay_steps
        if self.staircase:
            e = math.floor(e)
        return self.init_value * self.decay_rate ** e


def _hyper(value, what: str, *, minimum: float | None = 0.0):
    """A hyper-parameter as given: a number (checked) or a DecayScheduler (or any callable of
    the step, our extension)."""
    if isinstance(value, DecayScheduler) or (callable(value) and not isinstance(value, type)):
        return value
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise TypeError(f"Wrong {what} type: {type(value).__name__} (give a number or an "
                        f"opt.DecayScheduler such as opt.ExponentialDecay)")
    v = float(value)
    if minimum is not None and (v < minimum or math.isnan(v)):
        raise ValueError(f"Invalid {what} value: {value}")
    return v


def _now(value, step: float) -> float:
    if isinstance(value, DecayScheduler):
        return float(value.value(step))
    return float(value(step)) if callable(value) else float(value)


def _init_of(value) -> float:
    """A hyper-parameter's value at step 0 (a scheduler's ``init_value``)."""
    if isinstance(value, DecayScheduler):
        return value.init_value
    return float(value(0)) if callable(value) else float(value)


# --------------------------------------------------------------------------- base class
class Optimizer:
    """Base class: subclasses implement ``_apply(state, w, g, lr)`` updating ``w`` in place.

    SINGA's interface: ``lr`` is a number or a ``DecayScheduler``; ``step_counter`` is a float32
    Tensor of shape (1,) (SINGA's; :attr:`steps` gives it as an int) and ``lr_value`` a Tensor
    of shape (1,) holding the current learning rate, refreshed by :meth:`step`;
    ``apply(name, param, grad)`` updates one parameter in place; ``opt(loss)`` (or
    ``backward_and_update(loss)``) back-propagates and updates every parameter, then steps;
    ``get_states()``/``set_states()`` hold the step counter and the per-parameter slots keyed
    by parameter name, as SINGA keeps them (``moments`` for SGD, ``m``/``v`` for Adam,
    ``running_average`` for RMSProp, ``history`` for AdaGrad; dicts of Tensors).
    """

    #: SINGA's name of each internal slot in get_states()/set_states()
    _slot_names: dict = {}

    def __init__(self, lr=0.1, dtype=None, *, init_scale: float = 2.0 ** 15,
                 growth_interval: int = 1000, growth_factor: float = 2.0,
                 backoff_factor: float = 0.5, max_consecutive_skips: int = 30):
        if lr is None:
            raise TypeError("Wrong learning rate type: None (give a number or an "
                            "opt.DecayScheduler)")
        self.lr = _hyper(lr, "learning rate")
        self.dtype = np.dtype(dtype) if dtype is not None else np.dtype(np.float32)
        self.step_counter = Tensor(device=_host_device(), data=np.zeros(1, np.float32))
        self.lr_value = Tensor(device=_host_device(),
                               data=np.array([_now(self.lr, 0)], np.float32))
        self._state: dict = {}      # key (name, or id of an unnamed parameter) -> {slot: array}
        self._owner: dict = {}      # key -> weakref of the parameter the state belongs to
        self._master = weakref.WeakKeyDictionary()
        self.loss_scale = float(init_scale)
        self.growth_interval = int(growth_interval)
        self.growth_factor = float(growth_factor)
        self.backoff_factor = float(backoff_factor)
        self.max_consecutive_skips = int(max_consecutive_skips)
        self._good_steps = 0
        self._skips_in_a_row = 0
        self.skipped_steps = 0

    # ------------------------------------------------------------------ SINGA API
    @property
    def steps(self) -> int:
        """The step counter as an int (``step_counter`` is SINGA's Tensor of shape (1,))."""
        return int(self.step_counter.numpy().reshape(-1)[0])

    def get_lr(self) -> float:
        lr = self.lr
        if type(lr) is float:   # a number: no need to read the step counter
            return lr
        return _now(lr, self.steps)

    def _state_of(self, key, param) -> dict:
        """The slots kept under ``key`` for ``param``; fresh when the key is new or its
        parameter no longer exists or changed shape (a rebuilt model reusing the names)."""
        st = self._state.get(key)
        ref = self._owner.get(key)
        owner = ref() if ref is not None else None
        shape = tuple(param.shape)
        stale = ref is not None and (owner is None or tuple(owner.shape) != shape)
        if not stale and st is not None:
            for a in st.values():
                if tuple(getattr(a, "shape", ())) != shape:
                    stale = True
                    break
        if st is None or stale:
            st = self._state[key] = {}
            if isinstance(key, int):  # keyed by id: forget the slots with the parameter
                weakref.finalize(param, _forget, weakref.ref(self), key, st)
        if owner is not param:
            self._owner[key] = weakref.ref(param)
        return st

    @staticmethod
    def _key(param, name=None):
        if name is not None:
            return name
        return param.name if param.name is not None else id(param)

    def apply(self, param_name, param_value, param_grad) -> None:
        """Update ``param_value`` (a Tensor, in place) with ``param_grad`` (Tensor or array)
        at the current learning rate; the optimizer's slots for it are kept under
        ``param_name`` (SINGA's ``Optimizer.apply``; ``None`` keys by the parameter)."""
        g = param_grad.data if isinstance(param_grad, Tensor) else param_grad
        if tuple(g.shape) != tuple(param_value.shape):
            raise WorkbenchError(f"apply: the gradient of {param_name!r} has shape "
                                 f"{list(g.shape)}, the parameter {list(param_value.shape)}")
        if param_value.device.xp is not np and not hasattr(g, "device"):
            g = param_value.device.put(g)
        st = self._state_of(self._key(param_value, param_name), param_value)
        self._apply(st, param_value.data, g, self.get_lr())

    def _apply(self, st: dict, w, g, lr: float) -> None:
        raise NotImplementedError(f"{type(self).__name__} has no update rule: use opt.SGD, "
                                  f"Adam, AdamW, RMSProp or AdaGrad, or implement _apply")

    def update(self, param, grad) -> None:
        """Apply one update of ``param`` (a Tensor) with ``grad`` (Tensor or array); state
        is kept under the parameter's name (SINGA's deprecated ``update``), or under the
        parameter itself when it has no name or another live parameter holds that name."""
        key = param.name
        if key is not None:
            ref = self._owner.get(key)
            owner = ref() if ref is not None else None
            if owner is not None and owner is not param:
                key = id(param)
        self.apply(key, param, grad)

    def call(self, loss) -> None:
        """Back-propagate ``loss`` and update every parameter it reaches (no step)."""
        self._check_loss(loss)
        for p, g in self._params_of(loss):
            self.update(p, g)

    def step(self) -> None:
        """Count one step and refresh ``lr_value`` (and the scheduled hyper-parameters)."""
        self.step_counter.data += 1
        self.lr_value.data[...] = self.get_lr()

    def __call__(self, loss) -> None:
        self.call(loss)
        self.step()

    def _check_loss(self, loss) -> None:
        xp = loss.device.xp
        if not bool(xp.isfinite(loss.data).all()):
            v = loss.numpy()
            shown = v.item() if v.size == 1 else f"{int((~np.isfinite(v)).sum())} non-finite"
            raise WorkbenchError(
                f"the loss is {shown} at optimizer step {self.steps}: training diverged "
                f"(try a lower learning rate, check the inputs for NaN/Inf, or use gradient "
                f"clipping); no update was applied")

    def _params_of(self, loss, dy=None) -> list:
        pairs = [(p, g) for p, g in autograd.backward(loss, dy) if p.stores_grad]
        if not pairs:
            raise WorkbenchError(
                "the optimizer has no parameters to update: the loss reaches no Tensor with "
                "stores_grad=True and requires_grad=True (is every parameter frozen?)")
        return pairs

    def backward_and_update(self, loss, threshold=None) -> None:
        """Back-propagate ``loss``, update every parameter it reaches, then :meth:`step`
        (SINGA's ``opt(loss)``)."""
        self.call(loss)
        self.step()

    def backward_and_update_half(self, loss, clipping: bool = False,
                                 clip_value: float = 100.0) -> bool:
        """Mixed-precision step with dynamic loss scaling; returns False if it was skipped
        (overflow), True if the parameters were updated."""
        xp = loss.device.xp
        lossf = loss.data
        if not bool(xp.isfinite(lossf).all()):
            return self._skip(f"the loss is {loss.numpy().ravel()[:1].item()}")
        dy = xp.full(loss.shape, self.loss_scale, dtype=np.float32).astype(loss.dtype)
        if not bool(xp.isfinite(dy).all()):  # the scale does not fit the loss dtype
            self.loss_scale = float(np.finfo(loss.dtype).max) / 2
            dy = xp.full(loss.shape, self.loss_scale, dtype=loss.dtype)
        with np.errstate(over="ignore", invalid="ignore"):  # overflow is detected below
            pairs = self._params_of(loss, dy)
        unscaled = []
        for p, g in pairs:
            g32 = g.data.astype(np.float32) * np.float32(1.0 / self.loss_scale)
            unscaled.append((p, g32))
        # one device-to-host check for every gradient (not one sync per parameter)
        finite = xp.stack([xp.isfinite(g32).all() for _, g32 in unscaled])
        if not bool(finite.all()):
            bad = next(p for (p, _), ok in zip(unscaled, finite.tolist()) if not ok)
            return self._skip(f"gradient of {bad.name or 'a parameter'} overflowed")
        if clipping:
            unscaled = [(p, xp.clip(g32, -clip_value, clip_value)) for p, g32 in unscaled]
        lr = self.get_lr()
        for p, g32 in unscaled:
            master = self._master.get(p)
            if master is None or master.shape != p.data.shape:
                master = self._master[p] = p.data.astype(np.float32)
            st = self._state_of(self._key(p), p)
            self._apply(st, master, g32, lr)
            p.data[...] = master.astype(p.dtype)
        self._skips_in_a_row = 0
        self._good_steps += 1
        if self._good_steps >= self.growth_interval:
            self.loss_scale *= self.growth_factor
            self._good_steps = 0
        self.step()
        return True

    def _skip(self, why: str) -> bool:
        self.skipped_steps += 1
        self._skips_in_a_row += 1
        self._good_steps = 0
        if self._skips_in_a_row > self.max_consecutive_skips:
            raise WorkbenchError(
                f"mixed precision: {self._skips_in_a_row} steps in a row skipped at optimizer "
                f"step {self.steps} ({why}; loss scale now {self.loss_scale:g}): the "
                f"training diverged or float16 cannot represent it; lower the learning rate or "
                f"train in float32")
        self.loss_scale *= self.backoff_factor
        return False

    def backward_and_partial_update(self, loss, threshold: int = 2097152):
        raise DistributedOnlyError(
            "backward_and_partial_update is SINGA's DistOpt partial all-reduce for data-"
            "parallel training: wrap the optimizer, opt.DistOpt(opt), or use "
            "backward_and_update(loss)")

    def backward_and_sparse_update(self, loss, threshold=None, spars=0.05, topK=False,  # noqa: N803
                                   corr=True):
        raise DistributedOnlyError(
            "backward_and_sparse_update is SINGA's DistOpt gradient sparsification (top-K / "
            "threshold) for data-parallel all-reduce: wrap the optimizer, opt.DistOpt(opt), or "
            "use backward_and_update(loss)")

    # ------------------------------------------------------------------ checkpoints
    def get_states(self) -> dict:
        """SINGA's optimizer states: ``{"step_counter": float, <slot>: {name: Tensor}}`` with
        each slot (``moments``, ``m``/``v``, ``running_average``, ``history``) keyed by
        parameter name (copies), plus ``loss_scale`` (mixed precision; ours)."""
        out = {"step_counter": self.step_counter.numpy().reshape(-1)[0],
               "loss_scale": self.loss_scale}
        for slot, singa_name in self._slot_names.items():
            d = {}
            for key, st in self._state.items():
                if slot in st:
                    ref = self._owner.get(key)
                    owner = ref() if ref is not None else None
                    dev = owner.device if owner is not None else None
                    d[key] = Tensor(device=dev, data=st[slot])
            out[singa_name] = d
        return out

    def set_states(self, states: dict) -> None:
        """Restore what :meth:`get_states` returned (SINGA's form; values may be Tensors or
        arrays). Slots are matched to parameters by name at their next update."""
        if "step_counter" not in states:
            raise WorkbenchError(f"set_states: no 'step_counter' in the states (keys "
                                 f"{sorted(map(str, states))[:10]})")
        sc = states["step_counter"]
        sc = sc.numpy() if isinstance(sc, Tensor) else np.asarray(sc)
        self.step_counter = Tensor(device=_host_device(),
                                   data=np.asarray(sc, np.float32).reshape(1))
        self.lr_value = Tensor(device=_host_device(),
                               data=np.array([self.get_lr()], np.float32))
        self.loss_scale = float(states.get("loss_scale", self.loss_scale))
        for slot, singa_name in self._slot_names.items():
            for key, v in (states.get(singa_name) or {}).items():
                arr = v.data if isinstance(v, Tensor) else np.asarray(v)
                st = self._state.setdefault(key, {})
                st[slot] = arr.copy()
                self._owner.pop(key, None)


def _forget(opt_ref, key, st) -> None:
    o = opt_ref()
    if o is not None and o._state.get(key) is st:
        del o._state[key]
        o._owner.pop(key, None)


def _host_device():
    return cpu()


# --------------------------------------------------------------------------- optimizers
def _fused_gpu(w, g) -> bool:
    """Whether a parameter update can run as one fused CUDA kernel (float32/16 cupy arrays
    of one shape and dtype, contiguous)."""
    from workbench.arrays import cupy_module  # noqa: PLC0415
    cp = cupy_module()
    return (cp is not None and isinstance(w, cp.ndarray) and isinstance(g, cp.ndarray)
            and w.dtype == g.dtype and w.dtype.name in ("float32", "float16")
            and w.shape == g.shape and w.flags.c_contiguous)


class SGD(Optimizer):
    """Stochastic gradient descent with momentum / Nesterov / dampening / L2 weight decay.

    ``momentum``, ``dampening`` and ``weight_decay`` may be numbers or DecaySchedulers (as
    SINGA's). The momentum buffer starts at the first gradient (PyTorch; SINGA starts it at
    zero, which differs only when ``dampening`` is not 0)."""

    _slot_names = {"momentum": "moments"}

    def __init__(self, lr=0.1, momentum=0.0, dampening=0.0, weight_decay=0.0,
                 nesterov: bool = False, dtype=None, **kw):
        super().__init__(lr, dtype=dtype, **kw)
        self.momentum = _hyper(momentum, "momentum")
        self.dampening = _hyper(dampening, "dampening", minimum=None)
        self.weight_decay = _hyper(weight_decay, "weight_decay")
        self.nesterov = bool(nesterov)
        if nesterov and (_init_of(self.momentum) <= 0 or _init_of(self.dampening) != 0):
            raise ValueError("SGD: Nesterov momentum needs momentum > 0 and dampening 0")

    def _apply(self, st, w, g, lr):
        mom, damp, wd = self.momentum, self.dampening, self.weight_decay
        if type(mom) is float and type(damp) is float and type(wd) is float:
            use_mom = mom != 0      # plain numbers (the usual case): no step counter read
        else:
            step = self.steps
            mom, damp = _now(self.momentum, step), _now(self.dampening, step)
            wd = _now(self.weight_decay, step)
            use_mom = _init_of(self.momentum) != 0
        if type(w) is not np.ndarray and _fused_gpu(w, g):  # one CUDA kernel per parameter
            from workbench.arrays.cuda.elementwise import sgd_step  # noqa: PLC0415
            buf = st.get("momentum")
            first = buf is None
            if use_mom and first:
                buf = st["momentum"] = w.copy()
            sgd_step(w, g, buf if use_mom else None, lr=lr, momentum=mom,
                     dampening=damp, weight_decay=wd, nesterov=self.nesterov, first=first)
            return
        t = w.dtype.type
        if wd:
            g = g + w * t(wd)
        if use_mom:
            buf = st.get("momentum")
            if buf is None:
                buf = st["momentum"] = g.copy()
            else:
                buf *= t(mom)
                buf += g * t(1.0 - damp) if damp else g
            g = g + buf * t(mom) if self.nesterov else buf
        w -= g * t(lr)


class Adam(Optimizer):
    """Adam (Kingma & Ba) with optional L2 ``weight_decay`` added to the gradient; the bias
    corrections use the optimizer's step (``step_counter + 1``), as SINGA's."""

    decoupled = False
    _slot_names = {"m": "m", "v": "v"}

    def __init__(self, lr=0.001, beta_1=0.9, beta_2=0.999, epsilon=1e-8,
                 weight_decay=0.0, dtype=None, **kw):
        super().__init__(lr, dtype=dtype, **kw)
        self.beta_1, self.beta_2 = _hyper(beta_1, "beta_1"), _hyper(beta_2, "beta_2")
        self.epsilon = _hyper(epsilon, "epsilon")
        self.weight_decay = _hyper(weight_decay, "weight_decay")

    def _apply(self, st, w, g, lr):
        step = self.steps
        b1, b2 = _now(self.beta_1, step), _now(self.beta_2, step)
        eps, wd = _now(self.epsilon, step), _now(self.weight_decay, step)
        xp_t = w.dtype.type
        if wd and not self.decoupled:
            g = g + w * xp_t(wd)
        m, v = st.get("m"), st.get("v")
        if m is None:
            m = st["m"] = g * 0
            v = st["v"] = g * 0
        t = step + 1
        m *= xp_t(b1)
        m += g * xp_t(1 - b1)
        v *= xp_t(b2)
        v += g * g * xp_t(1 - b2)
        c1 = 1 - b1 ** t
        c2 = 1 - b2 ** t
        if self.decoupled and wd:
            w *= xp_t(1 - lr * wd)
        denom = (v * xp_t(1.0 / c2)) ** 0.5 + xp_t(eps)
        w -= (m / denom) * xp_t(lr / c1)


class AdamW(Adam):
    """Adam with decoupled weight decay (Loshchilov & Hutter)."""

    decoupled = True

    def __init__(self, lr=0.001, beta_1=0.9, beta_2=0.999, epsilon=1e-8,
                 weight_decay=0.01, **kw):
        super().__init__(lr, beta_1, beta_2, epsilon, weight_decay, **kw)


class RMSProp(Optimizer):
    """RMSProp: ``acc = rho*acc + (1-rho)*g^2``, ``w -= lr * g / (sqrt(acc) + epsilon)``
    (SINGA adds epsilon inside the square root; the two differ by far less than epsilon)."""

    _slot_names = {"acc": "running_average"}

    def __init__(self, lr=0.1, rho=0.9, epsilon=1e-8, weight_decay=0.0, dtype=None, **kw):
        super().__init__(lr, dtype=dtype, **kw)
        self.rho, self.epsilon = _hyper(rho, "rho"), _hyper(epsilon, "epsilon")
        self.weight_decay = _hyper(weight_decay, "weight_decay")

    def _apply(self, st, w, g, lr):
        step = self.steps
        rho, eps, wd = (_now(self.rho, step), _now(self.epsilon, step),
                        _now(self.weight_decay, step))
        t = w.dtype.type
        if wd:
            g = g + w * t(wd)
        acc = st.get("acc")
        if acc is None:
            acc = st["acc"] = g * 0
        acc *= t(rho)
        acc += g * g * t(1 - rho)
        w -= g / (acc ** 0.5 + t(eps)) * t(lr)


class AdaGrad(Optimizer):
    """AdaGrad: ``acc += g^2``, ``w -= lr * g / (sqrt(acc) + epsilon)``."""

    _slot_names = {"acc": "history"}

    def __init__(self, lr=0.1, epsilon=1e-8, weight_decay=0.0, dtype=None, **kw):
        super().__init__(lr, dtype=dtype, **kw)
        self.epsilon = _hyper(epsilon, "epsilon")
        self.weight_decay = _hyper(weight_decay, "weight_decay")

    def _apply(self, st, w, g, lr):
        step = self.steps
        eps, wd = _now(self.epsilon, step), _now(self.weight_decay, step)
        t = w.dtype.type
        if wd:
            g = g + w * t(wd)
        acc = st.get("acc")
        if acc is None:
            acc = st["acc"] = g * 0
        acc += g * g
        w -= g / (acc ** 0.5 + t(eps)) * t(lr)


# --------------------------------------------------------------------------- distributed
def _arr(t):
    """The array of a Tensor (or the array itself): collectives work on it in place."""
    return t.data if isinstance(t, Tensor) else t


class DistOpt:
    """Data-parallel training across processes (SINGA's ``opt.DistOpt``).

    ``DistOpt(opt=SGD(), nccl_id=None, local_rank=None, world_size=None, buffSize=4194304)``
    wraps any optimizer of this module. Every process (rank) runs the same script on its own
    share of the data (:func:`workbench.dist.partition`); after each backward pass the
    gradients are summed over the ranks (all-reduce) and divided by the world size, so N
    processes with batch b take the same steps as one process with batch N*b.

    * Started by ``mpiexec -n N python train.py`` (or ``srun``, or ipyparallel's MPI engines):
      MPI through mpi4py for CPU arrays, NCCL (id shared over MPI) for GPU arrays.
    * ``nccl_id=NcclIdHolder(), local_rank=i, world_size=n``: SINGA's multiprocess style on
      one machine's GPUs (``workbench.dist.spawn``), NCCL only.
    * Neither: world size 1, every collective a no-op (the script runs unchanged alone).

    Attributes ``world_size``, ``local_rank`` (rank on this machine, the GPU to use),
    ``global_rank``, ``communicator`` (a :class:`workbench.dist.Communicator` of its own:
    each DistOpt has one, with its own ``timeout``), ``reducer`` (the
    :class:`workbench.dist.Reducer` doing the work) and ``bytes_communicated`` (payload bytes
    this DistOpt handed to collectives so far). Other attributes (``lr``, ``step_counter``,
    ``get_states``...) are the wrapped optimizer's.

    Beyond SINGA: parameters (and buffers) are broadcast from rank 0 when a model is compiled
    with this optimizer (or given it after compiling) and, as a fallback, at the first step if
    the ranks' parameters differ; ranks whose parameter lists differ get a clear error at the
    first step; BatchNorm running statistics stay local to each rank (as in SINGA) unless
    :meth:`sync_buffers` averages them; ``Model.save_states`` / ``Model.export`` write only on
    rank 0; a collective that waits longer than ``timeout`` seconds (default 300,
    ``WORKBENCH_DIST_TIMEOUT``) or whose peer died raises ``DistributedError``.
    """

    def __init__(self, opt=None, nccl_id=None, local_rank=None, world_size=None,
                 buffSize=4194304, *, timeout: float | None = None,  # noqa: N803
                 communicator=None):
        if opt is None:
            opt = SGD()
        if isinstance(opt, DistOpt):
            raise WorkbenchError("DistOpt: the optimizer is already a DistOpt")
        if not isinstance(opt, Optimizer):
            raise WorkbenchError(f"DistOpt wraps a workbench optimizer (opt.SGD, opt.Adam, "
                                 f"...), got {type(opt).__name__}")
        self.opt = opt
        if communicator is None:
            communicator = get_communicator(nccl_id, local_rank, world_size, timeout)
        elif timeout is not None:
            communicator.timeout = float(timeout)
        self.communicator = communicator
        self.world_size = int(communicator.world_size)
        self.local_rank = int(communicator.local_rank)
        self.global_rank = int(communicator.global_rank)
        self.buffSize = int(buffSize)
        self.reducer = Reducer(communicator, self.buffSize)

    def __getattr__(self, name):
        if name == "opt" or name.startswith("__"):
            raise AttributeError(name)
        return getattr(self.opt, name)

    def __repr__(self) -> str:
        return (f"DistOpt({type(self.opt).__name__}, backend={self.communicator.backend}, "
                f"world_size={self.world_size}, global_rank={self.global_rank}, "
                f"local_rank={self.local_rank})")

    @property
    def bytes_communicated(self) -> int:
        return int(self.communicator.bytes_sent)

    @property
    def writes_checkpoints(self) -> bool:
        """Only rank 0 writes checkpoints and ONNX files (``Model.save_states``/``export``)."""
        return self.global_rank == 0

    def __call__(self, loss):
        self.backward_and_update(loss)

    # ------------------------------------------------------------------ SINGA's collectives
    def update(self, param, grad):
        """Apply the wrapped optimizer's update with ``grad`` (already summed over the ranks)
        divided by the world size (in place, as SINGA does)."""
        g = _arr(grad)
        self.reducer.average([g])
        self.opt.update(param, g)

    def all_reduce(self, tensor):
        """Sum ``tensor`` (a Tensor or its ``.data`` array) over the ranks, in place."""
        self.reducer.all_reduce(_arr(tensor))

    def all_reduce_half(self, tensor):
        """Sum ``tensor`` over the ranks in place, float16 on the wire."""
        self.reducer.all_reduce(_arr(tensor), half=True)

    def fused_all_reduce(self, tensor, send=True):
        """All-reduce a list of tensors through one buffer: ``send=False`` copies them into
        the buffer; ``send=True`` reduces the buffer and copies the sums back into ``tensor``
        (which must be the tensors buffered since the last send, in order; if nothing was
        buffered, ``tensor`` itself is buffered and reduced)."""
        self._fused(tensor, send, half=False)

    def fused_all_reduce_half(self, tensor, send=True):
        """:meth:`fused_all_reduce` with float16 on the wire."""
        self._fused(tensor, send, half=True)

    def _fused(self, tensors, send: bool, half: bool) -> None:
        arrays = [_arr(t) for t in (tensors if isinstance(tensors, (list, tuple))
                                    else [tensors])]
        if send:
            self.reducer.send(arrays, half=half)
        else:
            self.reducer.stage(arrays)

    def sparsification(self, tensor, accumulation, spars, topK):  # noqa: N803
        """All-reduce ``tensor`` sending only its significant elements: those with
        ``|g| >= spars`` (``topK=False``) or the ``ceil(spars * size)`` largest in magnitude
        (``topK=True``). With ``accumulation`` (a float32 Tensor/array of the same size) the
        previous steps' unsent remainder is added first and this step's remainder is kept
        there (local residual accumulation)."""
        acc = None if accumulation is None else _arr(accumulation)
        self.reducer.sparsify([_arr(tensor)], acc, spars, topK)

    def fused_sparsification(self, tensor, accumulation, spars, topK):  # noqa: N803
        """:meth:`sparsification` of a list of tensors fused into one buffer."""
        acc = None if accumulation is None else _arr(accumulation)
        self.reducer.sparsify([_arr(t) for t in tensor], acc, spars, topK)

    def wait(self):
        """Wait for the collectives in flight (GPU streams) to finish."""
        self.communicator.wait()

    # ------------------------------------------------------------------ steps
    def _begin(self, loss) -> list:
        """Backward pass; gradients made contiguous, writable and unshared (they are reduced
        in place); the first step checks that the ranks agree on the parameters."""
        pairs = self.opt._params_of(loss)
        self.communicator.step = self.opt.steps
        seen = set()
        for _, g in pairs:
            a = g.data
            key = id(a.base if a.base is not None else a)
            if key in seen or not a.flags.c_contiguous or not a.flags.writeable:
                a = a.copy()
                g.data = a
            seen.add(id(a.base if a.base is not None else a))
        if not self.reducer.checked and self.world_size > 1:
            if self.reducer.check_start([p.data for p, _ in pairs]) and self.global_rank == 0:
                warnings.warn(
                    "DistOpt: the ranks began with different parameters; rank 0's were "
                    "broadcast at the first step (whose gradients were computed with each "
                    "rank's own values). Compile the model after set_optimizer(DistOpt(...)) "
                    "or call dist_opt.broadcast_model(model) before training.",
                    RuntimeWarning, stacklevel=3)
        return pairs

    def _finish(self, pairs) -> None:
        for p, g in pairs:
            self.update(p, g)
        self.opt.step()

    def backward_and_update(self, loss, threshold=2097152):
        """Backward pass, all-reduce of the gradients (tensors of at most ``threshold``
        elements fused into buffers of about ``threshold`` elements, larger ones reduced
        alone), then the update with the averaged gradients."""
        pairs = self._begin(loss)
        self.reducer.reduce([g.data for _, g in pairs], threshold)
        self._finish(pairs)

    def backward_and_update_half(self, loss, threshold=2097152, clipping=False,
                                 clip_Value=100):  # noqa: N803
        """:meth:`backward_and_update` with float16 on the wire (float32 parameters only, as
        in SINGA); ``clipping`` clips every gradient to ``[-clip_Value, clip_Value]`` before
        it is sent."""
        pairs = self._begin(loss)
        for p, g in pairs:
            if p.dtype != np.float32:
                raise WorkbenchError(
                    f"backward_and_update_half sends float32 gradients as float16 (SINGA's "
                    f"DistOpt); parameter {p.name or ''} is {p.dtype}. For a float16 model "
                    f"use backward_and_update (its float16 gradients are reduced as they are)")
            if clipping:
                p.device.xp.clip(g.data, -clip_Value, clip_Value, out=g.data)
        self.reducer.reduce([g.data for _, g in pairs], threshold, half=True)
        self._finish(pairs)

    def backward_and_partial_update(self, loss, threshold=2097152):
        """Every rank updates its parameters with its own gradient, then one partition of the
        parameters is averaged over the ranks (round robin: partition ``self.partial`` this
        step; tensors above ``threshold`` elements are a partition alone, smaller ones are
        grouped until a group exceeds ``threshold``). A whole cycle averages every
        parameter once."""
        self.partial = getattr(self, "partial", 0) + 1
        pairs = self._begin(loss)
        for p, g in pairs:
            self.opt.update(p, g)
        if self.reducer.average_bucket([p.data for p, _ in pairs], threshold, self.partial):
            self.partial = 0  # a cycle is complete
        self.opt.step()

    def backward_and_sparse_update(self, loss, threshold=2097152, spars=0.05, topK=False,  # noqa: N803
                                   corr=True):
        """All-reduce of sparsified gradients (see :meth:`sparsification`), fused as in
        :meth:`backward_and_update`; with ``corr`` each fused group keeps a local residual
        (``self.gradAccumulation[k]``) that is added to the next step's gradient."""
        if not hasattr(self, "gradAccumulation"):
            self.gradAccumulation = []
        self.sparsInit = getattr(self, "sparsInit", False)
        pairs = self._begin(loss)
        dev = pairs[0][0].device

        def residual(k, size):
            if k == len(self.gradAccumulation):
                self.gradAccumulation.append(Tensor((size,), dev, np.float32))
            a = self.gradAccumulation[k]
            if a.size() != size:
                raise WorkbenchError(
                    f"backward_and_sparse_update: gradient group {k} has {size} values but "
                    f"its accumulation {a.size()}; the set of trained parameters changed "
                    f"(reset with del dist_opt.gradAccumulation)")
            return a.data

        self.reducer.reduce_sparse([g.data for _, g in pairs], threshold, spars, topK,
                                   residual if corr else None)
        self._finish(pairs)
        self.sparsInit = True

    # ------------------------------------------------------------------ beyond SINGA
    def broadcast_model(self, model, root: int = 0) -> None:
        """Overwrite every parameter and buffer of ``model`` with rank ``root``'s, so the
        ranks begin equal (done by ``Model.compile`` / ``set_optimizer`` with a DistOpt)."""
        states = model.get_states()
        self.reducer.broadcast([_writable(states[name]) for name in sorted(states)], root)

    def sync_buffers(self, model) -> None:
        """Average the buffers (BatchNorm running mean/var; not the parameters) over the
        ranks, e.g. before evaluating or saving: during training each rank's BatchNorm keeps
        statistics of its own batches (SINGA's behaviour)."""
        states = model.get_states()
        bufs = [_writable(states[name]) for name in sorted(states)
                if not states[name].stores_grad and states[name].dtype.kind == "f"]
        for a in bufs:
            self.reducer.all_reduce(a)
            a /= a.dtype.type(self.world_size)

    def _on_model(self, model) -> None:
        """Called by ``Model.compile`` / ``Model.set_optimizer``: rank 0's weights everywhere."""
        if self.world_size > 1:
            self.broadcast_model(model)

    def all_reduce_mean(self, value) -> np.ndarray:
        """The mean over the ranks of a number or host array (losses, accuracies)."""
        a = np.array(value, dtype=np.float64, copy=True).reshape(-1)
        self.communicator.all_reduce(a)
        return (a / self.world_size).reshape(np.shape(value))


def _writable(t):
    """``t``'s array, made C-contiguous and writable first (collectives work in place)."""
    if not t.data.flags.c_contiguous or not t.data.flags.writeable:
        t.data = t.data.copy()
    return t.data
