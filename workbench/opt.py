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
* ``backward_and_partial_update`` / ``backward_and_sparse_update`` belong to SINGA's
  distributed optimizer (DistOpt: partial parameter all-reduce, top-K / threshold gradient
  sparsification); they raise :class:`DistributedOnlyError`.
"""

from __future__ import annotations

import math
import weakref

import numpy as np

from workbench.errors import WorkbenchError


class DistributedOnlyError(WorkbenchError, NotImplementedError):
    """A SINGA DistOpt (multi-GPU, all-reduce) feature that this single-process engine lacks."""


# --------------------------------------------------------------------------- schedules
class DecayScheduler:
    """Learning rate as a function of the step counter (SINGA's ``opt.DecayScheduler``)."""

    def __init__(self, init_value: float):
        self.init_value = float(init_value)

    def __call__(self, step: int) -> float:
        raise NotImplementedError


class Constant(DecayScheduler):
    def __call__(self, step: int) -> float:
        return self.init_value


class ExponentialDecay(DecayScheduler):
    """``init * decay_rate ** (step / decay_steps)`` (floored exponent with ``staircase``)."""

    def __init__(self, init_value: float, decay_steps: int, decay_rate: float,
                 staircase: bool = False):
        super().__init__(init_value)
        self.decay_steps, self.decay_rate, self.staircase = decay_steps, decay_rate, staircase

    def __call__(self, step: int) -> float:
        e = step / self.decay_steps
        if self.staircase:
            e = math.floor(e)
        return self.init_value * self.decay_rate ** e


# --------------------------------------------------------------------------- base class
class Optimizer:
    """Base class: subclasses implement ``_apply(state, w, g, lr)`` updating ``w`` in place."""

    def __init__(self, lr=0.1, *, init_scale: float = 2.0 ** 15, growth_interval: int = 1000,
                 growth_factor: float = 2.0, backoff_factor: float = 0.5,
                 max_consecutive_skips: int = 30):
        self.lr = lr
        self.step_counter = 0
        self._state = weakref.WeakKeyDictionary()
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
    def get_lr(self) -> float:
        return float(self.lr(self.step_counter)) if callable(self.lr) else float(self.lr)

    def update(self, param, grad) -> None:
        """Apply one update of ``param`` (a Tensor) with ``grad`` (Tensor or array)."""
        from workbench.tensor import Tensor
        g = grad.data if isinstance(grad, Tensor) else grad
        st = self._state.get(param)
        if st is None:
            st = self._state[param] = {}
        self._apply(st, param.data, g, self.get_lr())

    def step(self) -> None:
        self.step_counter += 1

    def __call__(self, loss) -> None:
        self.backward_and_update(loss)

    def _check_loss(self, loss) -> None:
        xp = loss.device.xp
        if not bool(xp.isfinite(loss.data).all()):
            v = loss.numpy()
            shown = v.item() if v.size == 1 else f"{int((~np.isfinite(v)).sum())} non-finite"
            raise WorkbenchError(
                f"the loss is {shown} at optimizer step {self.step_counter}: training diverged "
                f"(try a lower learning rate, check the inputs for NaN/Inf, or use gradient "
                f"clipping); no update was applied")

    def _params_of(self, loss, dy=None) -> list:
        from workbench import autograd
        pairs = [(p, g) for p, g in autograd.backward(loss, dy) if p.stores_grad]
        if not pairs:
            raise WorkbenchError(
                "the optimizer has no parameters to update: the loss reaches no Tensor with "
                "stores_grad=True and requires_grad=True (is every parameter frozen?)")
        return pairs

    def backward_and_update(self, loss, threshold=None) -> None:
        """Back-propagate ``loss`` and update every parameter it reaches."""
        self._check_loss(loss)
        for p, g in self._params_of(loss):
            self.update(p, g)
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
            st = self._state.get(p)
            if st is None:
                st = self._state[p] = {}
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
                f"step {self.step_counter} ({why}; loss scale now {self.loss_scale:g}): the "
                f"training diverged or float16 cannot represent it; lower the learning rate or "
                f"train in float32")
        self.loss_scale *= self.backoff_factor
        return False

    def backward_and_partial_update(self, loss, threshold: int = 2097152):
        raise DistributedOnlyError(
            "backward_and_partial_update is SINGA's DistOpt partial all-reduce for multi-GPU "
            "training; this engine trains in one process: use backward_and_update(loss)")

    def backward_and_sparse_update(self, loss, threshold=None, spars=0.05, topK=False,  # noqa: N803
                                   corr=True):
        raise DistributedOnlyError(
            "backward_and_sparse_update is SINGA's DistOpt gradient sparsification (top-K / "
            "threshold) for multi-GPU all-reduce; this engine trains in one process: use "
            "backward_and_update(loss)")

    # ------------------------------------------------------------------ checkpoints
    def get_states(self, params: dict | None = None) -> dict:
        """Optimizer state as arrays: ``{"step_counter": ..., "<param name>/<slot>": ...}``;
        ``params`` ({name: Tensor}, e.g. ``model.get_params()``) names the slots."""
        out = {"step_counter": np.asarray(self.step_counter),
               "loss_scale": np.asarray(self.loss_scale)}
        for name, p in (params or {}).items():
            for slot, a in self._state.get(p, {}).items():
                out[f"{name}/{slot}"] = np.asarray(a) if isinstance(a, np.ndarray) else \
                    p.device.get(a)
        return out

    def set_states(self, states: dict, params: dict | None = None) -> None:
        self.step_counter = int(states.get("step_counter", 0))
        self.loss_scale = float(states.get("loss_scale", self.loss_scale))
        for name, p in (params or {}).items():
            st = {}
            for k, v in states.items():
                if k.startswith(name + "/"):
                    st[k[len(name) + 1:]] = p.device.put(np.asarray(v))
            if st:
                self._state[p] = st


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
    """Stochastic gradient descent with momentum / Nesterov / dampening / L2 weight decay."""

    def __init__(self, lr=0.1, momentum: float = 0.0, dampening: float = 0.0,
                 weight_decay: float = 0.0, nesterov: bool = False, dtype=None, **kw):
        super().__init__(lr, **kw)
        if nesterov and (momentum <= 0 or dampening != 0):
            raise WorkbenchError("SGD: Nesterov momentum needs momentum > 0 and dampening 0")
        if lr is None or (not callable(lr) and float(lr) < 0):
            raise WorkbenchError(f"SGD: invalid learning rate {lr!r}")
        self.momentum, self.dampening = float(momentum), float(dampening)
        self.weight_decay, self.nesterov = float(weight_decay), bool(nesterov)

    def _apply(self, st, w, g, lr):
        if _fused_gpu(w, g):  # one CUDA kernel per parameter
            from workbench.arrays.cuda.elementwise import sgd_step  # noqa: PLC0415
            buf = st.get("momentum")
            first = buf is None
            if self.momentum and first:
                buf = st["momentum"] = w.copy()
            sgd_step(w, g, buf if self.momentum else None, lr=lr, momentum=self.momentum,
                     dampening=self.dampening, weight_decay=self.weight_decay,
                     nesterov=self.nesterov, first=first)
            return
        t = w.dtype.type
        if self.weight_decay:
            g = g + w * t(self.weight_decay)
        if self.momentum:
            buf = st.get("momentum")
            if buf is None:
                buf = st["momentum"] = g.copy()
            else:
                buf *= t(self.momentum)
                buf += g * t(1.0 - self.dampening) if self.dampening else g
            g = g + buf * t(self.momentum) if self.nesterov else buf
        w -= g * t(lr)


class Adam(Optimizer):
    """Adam (Kingma & Ba) with optional L2 ``weight_decay`` added to the gradient."""

    decoupled = False

    def __init__(self, lr=0.001, beta_1: float = 0.9, beta_2: float = 0.999,
                 epsilon: float = 1e-8, weight_decay: float = 0.0, dtype=None, **kw):
        super().__init__(lr, **kw)
        self.beta_1, self.beta_2 = float(beta_1), float(beta_2)
        self.epsilon, self.weight_decay = float(epsilon), float(weight_decay)

    def _apply(self, st, w, g, lr):
        xp_t = w.dtype.type
        if self.weight_decay and not self.decoupled:
            g = g + w * xp_t(self.weight_decay)
        m, v = st.get("m"), st.get("v")
        if m is None:
            m = st["m"] = g * 0
            v = st["v"] = g * 0
            st["t"] = 0
        st["t"] += 1
        t = st["t"]
        m *= xp_t(self.beta_1)
        m += g * xp_t(1 - self.beta_1)
        v *= xp_t(self.beta_2)
        v += g * g * xp_t(1 - self.beta_2)
        c1 = 1 - self.beta_1 ** t
        c2 = 1 - self.beta_2 ** t
        if self.decoupled and self.weight_decay:
            w *= xp_t(1 - lr * self.weight_decay)
        denom = (v * xp_t(1.0 / c2)) ** 0.5 + xp_t(self.epsilon)
        w -= (m / denom) * xp_t(lr / c1)


class AdamW(Adam):
    """Adam with decoupled weight decay (Loshchilov & Hutter)."""

    decoupled = True

    def __init__(self, lr=0.001, beta_1: float = 0.9, beta_2: float = 0.999,
                 epsilon: float = 1e-8, weight_decay: float = 0.01, **kw):
        super().__init__(lr, beta_1, beta_2, epsilon, weight_decay, **kw)


class RMSProp(Optimizer):
    def __init__(self, lr=0.1, rho: float = 0.9, epsilon: float = 1e-8,
                 weight_decay: float = 0.0, dtype=None, **kw):
        super().__init__(lr, **kw)
        self.rho, self.epsilon, self.weight_decay = float(rho), float(epsilon), float(
            weight_decay)

    def _apply(self, st, w, g, lr):
        t = w.dtype.type
        if self.weight_decay:
            g = g + w * t(self.weight_decay)
        acc = st.get("acc")
        if acc is None:
            acc = st["acc"] = g * 0
        acc *= t(self.rho)
        acc += g * g * t(1 - self.rho)
        w -= g / (acc ** 0.5 + t(self.epsilon)) * t(lr)


class AdaGrad(Optimizer):
    def __init__(self, lr=0.1, epsilon: float = 1e-8, weight_decay: float = 0.0, dtype=None,
                 **kw):
        super().__init__(lr, **kw)
        self.epsilon, self.weight_decay = float(epsilon), float(weight_decay)

    def _apply(self, st, w, g, lr):
        t = w.dtype.type
        if self.weight_decay:
            g = g + w * t(self.weight_decay)
        acc = st.get("acc")
        if acc is None:
            acc = st["acc"] = g * 0
        acc += g * g
        w -= g / (acc ** 0.5 + t(self.epsilon)) * t(lr)
