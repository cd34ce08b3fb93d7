"""``fit``: a small, explicit training loop over numpy arrays.

>>> import numpy as np
>>> from workbench import layer, model, autograd, opt, training
>>> class Net(model.Model):
...     def __init__(self):
...         super().__init__()
...         self.fc = layer.Linear(2)
...     def forward(self, x):
...         return self.fc(x)
>>> x = np.random.default_rng(0).standard_normal((64, 3)).astype(np.float32)
>>> y = (x[:, 0] > 0).astype(np.int64)
>>> hist = training.fit(Net(), x, y, epochs=3, batch_size=16, optimizer=opt.SGD(lr=0.5))
>>> hist["loss"][-1] < hist["loss"][0]
True

The model's ``forward`` gives the scores, ``loss`` (default
``autograd.softmax_cross_entropy``) turns scores and labels into a scalar Tensor, and the
optimizer's ``backward_and_update`` applies it. ``callback(epoch, logs)`` is called after every
epoch (the TrainingMonitor widget uses it); returning ``False`` stops training.

``cache_trunk=True`` (or "memory", "disk", a ``TrunkCache``) computes the outputs of a frozen
imported graph (the trunk below ``last_layers``) once per sample and reuses them in later
epochs and for the validation data (``workbench.trunk_cache``; the size estimate is printed
before the first epoch); None (the default) uses the model's own ``cache_trunk(...)`` setting,
False none. ``augment(x_batch, rng) -> x_batch`` transforms each training batch (data
augmentation; a trunk cache is then skipped, with a message).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from contextlib import nullcontext

import numpy as np

from workbench.autodiff.collector import training_step
from workbench.errors import InputError
from workbench.singa import autograd
from workbench.singa.tensor import PlaceHolder, Tensor, from_numpy
from workbench.trunk_cache import FitCaches


def _scores(out):
    return out[0] if isinstance(out, (list, tuple)) else out


def evaluate(model, x, y, *, batch_size: int = 256, loss: Callable | None = None,
             _samples=None) -> dict:
    """Mean loss and accuracy of ``model`` (eval mode) on ``x``/``y``."""
    loss = loss or autograd.softmax_cross_entropy
    was = model.training
    model.eval()
    total, correct, n = 0.0, 0, 0
    try:
        with autograd.no_grad():
            for i in range(0, len(x), batch_size):
                xb, yb = x[i:i + batch_size], y[i:i + batch_size]
                with _samples(np.arange(i, i + len(xb))) if _samples else nullcontext():
                    out = _scores(model.forward(from_numpy(xb)))
                total += loss(out, yb).item() * len(xb)
                if out.ndim() == 2 and np.asarray(yb).ndim == 1:
                    correct += int((out.numpy().argmax(1) == np.asarray(yb)).sum())
                n += len(xb)
    finally:
        model.train(was)
    return {"loss": total / max(n, 1), "accuracy": correct / max(n, 1)}


def fit(model, x, y, *, epochs: int = 1, batch_size: int = 32, optimizer=None,
        loss: Callable | None = None, validation=None, shuffle: bool = True, seed: int = 0,
        callback: Callable | None = None, use_graph: bool = False, cache_trunk=None,
        augment: Callable | None = None) -> dict:
    """Train ``model`` on arrays ``x``, ``y``; returns the history
    ``{"loss": [...], "accuracy": [...], "val_loss": [...], "val_accuracy": [...], "time": [...]}``
    (one value per epoch), plus ``"trunk_cache"`` (samples computed and reused, messages)
    when a trunk cache took part. ``cache_trunk`` and ``augment``: see the module docs."""
    if len(x) != len(y):
        raise InputError(f"fit: {len(x)} inputs but {len(y)} labels")
    if len(x) < batch_size:
        batch_size = len(x)
    from workbench.singa import opt as _opt
    optimizer = optimizer or getattr(model, "optimizer", None) or _opt.SGD(lr=0.01,
                                                                              momentum=0.9)
    loss = loss or autograd.softmax_cross_entropy
    if getattr(model, "_placeholders", None) is None:
        model.compile([PlaceHolder((batch_size,) + tuple(np.shape(x)[1:]),
                                   dtype=np.asarray(x[:1]).dtype)], is_train=True,
                      use_graph=use_graph)
    rng = np.random.default_rng(seed)
    caches = FitCaches(model, cache_trunk, augment=augment)
    hist = {"loss": [], "accuracy": [], "val_loss": [], "val_accuracy": [], "time": []}
    try:
        caches.start(x, len(x) + (len(validation[0]) if validation is not None else 0))
        for epoch in range(epochs):
            t0 = time.perf_counter()
            model.train()
            order = rng.permutation(len(x)) if shuffle else np.arange(len(x))
            total, correct, n = 0.0, 0, 0
            for i in range(0, len(order), batch_size):
                b = order[i:i + batch_size]
                xb, yb = x[b], y[b]
                if augment is not None:
                    xb = augment(xb, rng)
                # the collector's policy for one step (workbench.autodiff.collector); the
                # step's Tensors go inside the block, so its tape is freed before the
                # thresholds come back
                with training_step():
                    with caches.samples(b, "train"):
                        out = _scores(model.forward(xb if isinstance(xb, Tensor)
                                                    else from_numpy(xb)))
                    lv = loss(out, yb)
                    optimizer.backward_and_update(lv)
                    total += lv.item() * len(b)
                    if out.ndim() == 2 and np.asarray(yb).ndim == 1:
                        correct += int((out.numpy().argmax(1) == np.asarray(yb)).sum())
                    del out, lv
                n += len(b)
            hist["loss"].append(total / n)
            hist["accuracy"].append(correct / n)
            if validation is not None:
                ev = evaluate(model, validation[0], validation[1], loss=loss,
                              _samples=lambda idx: caches.samples(idx, "validation"))
                hist["val_loss"].append(ev["loss"])
                hist["val_accuracy"].append(ev["accuracy"])
            hist["time"].append(time.perf_counter() - t0)
            if callback is not None:
                logs = {k: v[-1] for k, v in hist.items() if v}
                if callback(epoch, logs) is False:
                    break
    finally:
        stats = caches.finish()
    if stats is not None:
        hist["trunk_cache"] = stats
    model.eval()
    return hist
