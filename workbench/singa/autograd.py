"""SINGA's ``autograd`` module: its functions, its ``Operator`` classes and its ``training`` flag,
over the engine's tape (``workbench.autodiff``).

Every function here records ONNX ops through the tape's :func:`apply` (``autograd.relu(x)``,
``autograd.softmax_cross_entropy(out, y)``, ``autograd.conv2d(...)``...); the tape, the Tensor
class and back-propagation are the engine's, re-exported here under SINGA's names
(:class:`Tensor`, :func:`backward`, :func:`gradients`, :func:`no_grad`...).

Training mode: ``model.train()`` / ``model.eval()`` (or ``training=`` in the functions below)
for layers and models. ``autograd.training`` is SINGA's global train/eval flag (False by
default), for code written against SINGA. Assigning it (``autograd.training = True``, as
SINGA programs and ``Model.train`` do) also sets the tape's ``set_save_all``: while it is True
every recorded op keeps what its own backward needs, so SINGA's per-operator
``y.creator.backward(dy)`` works on data that does not require a gradient. The SINGA-level
functions that change with the mode (:func:`dropout`, :func:`batchnorm_2d`, the
:class:`Dropout` operator) follow it unless told ``training=`` explicitly.

SINGA's operator API: ``autograd.ReLU()(x)[0]``, ``autograd.Gemm(alpha, beta, 0, 0)(a, b, c)``
... (:class:`Operator` and its subclasses, the same ONNX ops underneath); ``y.creator`` has
SINGA's ``forward(*raw)`` / ``backward(*dys)`` (arrays or :class:`RawTensor` in,
:class:`RawTensor` out, one per differentiable input): importing this module makes the tape
record its nodes as :class:`OperatorNode` (``tape.set_node_class``), a :class:`TapeNode`
with those two methods, which run the gradient rules over the tape from here.

Gradients: ``backward(loss)`` returns the list of ``(leaf, grad)`` pairs, so SINGA's
``for p, g in autograd.backward(loss)`` works.

>>> from workbench import tensor, autograd
>>> import numpy as np
>>> w = tensor.Tensor(data=np.array([1.0, -2.0], np.float32), requires_grad=True,
...                   stores_grad=True)
>>> loss = autograd.reduce_sum(autograd.relu(w) * 3.0)
>>> [g.numpy().tolist() for _, g in autograd.backward(loss)]
[[3.0, 0.0]]
"""

from __future__ import annotations

import itertools
import math
import sys
import types
import weakref
from builtins import max as _max  # this module's ``max`` is SINGA's element-wise Max
from collections.abc import Callable

import numpy as np

from workbench.arrays import is_array, xp_of
from workbench.arrays import to_numpy as _arr_to_numpy
from workbench.arrays.device import device_of_array, seed_all
from workbench.arrays.dtypes import onnx_dtype_of_np
from workbench.autodiff import rules as _rules
from workbench.autodiff import tape as _tape
from workbench.autodiff.backprop import backward, gradients, run_rule
from workbench.autodiff.runner import TapeRunner
from workbench.autodiff.tape import (
    DEFAULT_OPSET,
    PlaceHolder,
    TapeNode,
    Tensor,
    apply,
    as_tensor,
    enable_grad,
    inference_mode,
    is_grad_enabled,
    no_grad,
    parse_dtype,
    run_op,
    tape_order,
    walk_tape,
)
from workbench.autodiff.tape import is_float_dtype as _is_float
from workbench.errors import (
    GradientError,
    InputError,
    ShapeError,
    SingaShapeError,
)
from workbench.ops.loss import label_range
from workbench.ops.registry import NodeContext

__all__ = [
    # the engine's tape under SINGA's module
    "DEFAULT_OPSET", "PlaceHolder", "TapeNode", "TapeRunner", "Tensor", "apply", "as_tensor",
    "backward", "enable_grad", "gradients", "inference_mode", "is_grad_enabled", "no_grad",
    "run_op", "tape_order",
    # SINGA's flag, seeding and helpers
    "training", "manual_seed", "OperatorNode", "RawTensor", "axis_helper", "back_broadcast",
    "ctensor2numpy", "infer_dependency",
    # functions
    "abs", "acos", "acosh", "add", "add_all", "add_bias", "asin", "asinh", "atan", "atanh",
    "batch_norm", "batchnorm_2d", "binary_cross_entropy", "cast", "cat", "ceil", "clip",
    "concat", "constant_of_shape", "conv2d", "cos", "cosh", "cossim", "cross_entropy",
    "depth_to_space", "div", "dropout", "elu", "embedding", "equal", "erf", "exp", "expand",
    "flatten", "floor", "gather", "gelu", "gemm", "globalaveragepool", "greater",
    "hardsigmoid", "identity", "layer_norm", "leakyrelu", "less", "log", "log_softmax",
    "matmul", "max", "mean", "min", "mse_loss", "mul", "negative", "nll_loss", "nonzero",
    "onehot", "pad", "pow", "prelu", "ranking_loss", "reciprocal", "reduce_max", "reduce_mean",
    "reduce_sum", "relu", "reshape", "round", "rounde", "scatter_elements", "selu", "shape",
    "sigmoid", "sign", "sin", "sinh", "slice", "softmax", "softmax_cross_entropy", "softplus",
    "softsign", "space_to_depth", "split", "sqrt", "squeeze", "sub", "sum", "tan", "tanh",
    "tile", "transpose", "unsqueeze", "upsample", "where",
    # operator classes
    "Operator", "Abs", "Acos", "Acosh", "Add", "AddBias", "And", "Asin", "Asinh", "Atan",
    "Atanh", "BinaryCrossEntropy", "Cast", "Ceil", "Clip", "Concat", "ConstantOfShape", "Cos",
    "CosSim", "Cosh", "CrossEntropy", "DepthToSpace", "Div", "Dropout", "Elu", "Embedding",
    "Equal", "Erf", "Exp", "Expand", "Flatten", "Floor", "Gather", "Gemm", "GlobalAveragePool",
    "Greater", "HardSigmoid", "Identity", "LeakyRelu", "Less", "Log", "Matmul", "Max", "Mean",
    "MeanSquareError", "Min", "Mul", "Negative", "NonZero", "Not", "OneHot", "Or", "PRelu",
    "Pad", "Pow", "RankingLoss", "Reciprocal", "ReduceMean", "ReduceSum", "ReLU", "Reshape",
    "Round", "Rounde", "ScatterElements", "SeLU", "Shape", "Sigmoid", "Sign", "Sin", "Sinh",
    "Slice", "SoftMax", "SoftMaxCrossEntropy", "SoftPlus", "SoftSign", "SpaceToDepth", "Split",
    "Sqrt", "Squeeze", "Sub", "Sum", "Tan", "Tanh", "Tile", "Transpose", "UpSample",
    "Unsqueeze", "Where", "Xor",
]

#: SINGA's global train/eval flag (see the module docstring; assigning it goes through
#: ``_SingaAutograd.training`` below, which also sets the tape's ``set_save_all``)
training = False

_OPSET13 = DEFAULT_OPSET if DEFAULT_OPSET >= 13 else 13


class _SingaAutograd(types.ModuleType):
    """This module's type: ``autograd.training = flag`` (SINGA's global) is kept in the
    module's namespace, where its functions read it, and is passed on to the engine's tape
    (``tape.set_save_all``)."""

    @property
    def training(self):
        return self.__dict__["training"]

    @training.setter
    def training(self, value):
        self.__dict__["training"] = value
        _tape.set_save_all(bool(value))


sys.modules[__name__].__class__ = _SingaAutograd


def manual_seed(seed: int) -> None:
    """Seed the random source of every device in use (``Device.SetRandSeed``): Dropout masks
    in training, random ops without a ``seed`` attribute, initialisers."""
    seed_all(seed)


def _singa_training() -> bool:
    return bool(training)


# --------------------------------------------------------------------------- functional API
# SINGA names; each records ONNX ops. Unary/binary helpers first.
def _unary(op: str, x, **attrs):
    return apply(op, [x], attrs or None)


def relu(x):
    return _unary("Relu", x)


def sigmoid(x):
    return _unary("Sigmoid", x)


def tanh(x):
    return _unary("Tanh", x)


def exp(x):
    return _unary("Exp", x)


def log(x):
    return _unary("Log", x)


def sqrt(x):
    return _unary("Sqrt", x)


def abs(x):  # noqa: A001 - SINGA's name
    return _unary("Abs", x)


def erf(x):
    return _unary("Erf", x)


def sin(x):
    return _unary("Sin", x)


def cos(x):
    return _unary("Cos", x)


def negative(x):
    return _unary("Neg", x)


def reciprocal(x):
    return _unary("Reciprocal", x)


def softplus(x):
    return _unary("Softplus", x)


def softsign(x):
    return _unary("Softsign", x)


def leakyrelu(x, a: float = 0.01):
    return _unary("LeakyRelu", x, alpha=float(a))


def elu(x, alpha: float = 1.0):
    return _unary("Elu", x, alpha=float(alpha))


def selu(x, alpha: float = 1.67326, gamma: float = 1.0507):
    return _unary("Selu", x, alpha=float(alpha), gamma=float(gamma))


def hardsigmoid(x, alpha: float = 0.2, gamma: float = 0.5):
    return _unary("HardSigmoid", x, alpha=float(alpha), beta=float(gamma))


def gelu(x, approximate: str = "none"):
    """GELU composed of primitives (exportable at any opset >= 9):
    ``0.5 * x * (1 + erf(x / sqrt(2)))``, or the tanh approximation."""
    if approximate == "tanh":
        inner = (x + x * x * x * 0.044715) * math.sqrt(2.0 / math.pi)
        return x * 0.5 * (tanh(inner) + 1.0)
    return x * 0.5 * (erf(x * (1.0 / math.sqrt(2.0))) + 1.0)


def add(a, b):
    return apply("Add", [a, b])


def sub(a, b):
    return apply("Sub", [a, b])


def mul(a, b):
    return apply("Mul", [a, b])


def div(a, b):
    return apply("Div", [a, b])


def pow(a, b):  # noqa: A001 - SINGA's name
    return apply("Pow", [a, b])


def matmul(a, b):
    return apply("MatMul", [a, b])


def gemm(a, b, c=None, alpha: float = 1.0, beta: float = 1.0, transA: int = 0,  # noqa: N803
         transB: int = 0):
    attrs = {}
    if alpha != 1.0:
        attrs["alpha"] = float(alpha)
    if beta != 1.0:
        attrs["beta"] = float(beta)
    if transA:
        attrs["transA"] = 1
    if transB:
        attrs["transB"] = 1
    return apply("Gemm", [a, b, c], attrs)


def add_bias(x, b, axis: int = 0):
    """SINGA's add_bias: ``x + b`` with ``b`` broadcast along ``axis`` (0: rows, 1: columns)."""
    if axis not in (0, 1):
        raise SingaShapeError(f"add_bias: axis must be 0 (b added to every row) or 1 (to every "
                              f"column), got {axis}")
    if axis == 0:
        return add(x, b)
    return add(x, reshape(b, (-1, 1)))


def clip(x, min=None, max=None):  # noqa: A002 - SINGA's names
    lo = None if min is None else as_tensor(np.asarray(min), like=x)
    hi = None if max is None else as_tensor(np.asarray(max), like=x)
    return apply("Clip", [x, lo, hi])


def _axes_tensor(axes, x):
    return as_tensor(np.asarray(axes if isinstance(axes, (list, tuple)) else [axes],
                                dtype=np.int64), like=x)


def reshape(x, shape):
    return apply("Reshape", [x, as_tensor(np.asarray(list(shape), dtype=np.int64), like=x)])


def flatten(x, axis: int = 1):
    return apply("Flatten", [x], {"axis": int(axis)})


def transpose(x, shape=None):
    """Permute axes (SINGA calls the permutation ``shape``); reversed axes by default."""
    attrs = {} if shape is None else {"perm": [int(a) for a in shape]}
    return apply("Transpose", [x], attrs)


def squeeze(x, axis=None):
    """Remove the size-1 axes in ``axis`` (all of them for None or ``[]``, SINGA's default)."""
    if axis is not None and isinstance(axis, (list, tuple)) and len(axis) == 0:
        axis = None
    return apply("Squeeze", [x, None if axis is None else _axes_tensor(axis, x)])


def unsqueeze(x, axis=-1):
    """Insert size-1 axes. ``axis`` positions are applied one after the other as Python's
    ``list.insert`` does (SINGA's rule: ``unsqueeze(x[3, 2], [2, 4, 5])`` is [3, 2, 1, 1, 1],
    a position past the end appends), and recorded as one valid ONNX Unsqueeze."""
    axes = [int(a) for a in axis] if isinstance(axis, (list, tuple)) else [int(axis)]
    dims = ["x"] * x.ndim()
    for a in axes:
        if a < 0:
            a += len(dims) + 1
            if a < 0:
                raise InputError(f"unsqueeze: axis {a - len(dims) - 1} is out of range for a "
                                 f"{len(dims)}-d result")
        dims.insert(a, "new")
    onnx_axes = [i for i, d in enumerate(dims) if d == "new"]
    return apply("Unsqueeze", [x, _axes_tensor(onnx_axes, x)])


def cat(xs, axis: int = 0):
    return apply("Concat", list(xs), {"axis": int(axis)})


concat = cat


def split(x, axis: int, parts, num_output=None):
    """Split ``x`` along ``axis`` into pieces of the sizes in ``parts`` (a list); SINGA's
    ``num_output`` with ``parts=None`` splits into that many equal pieces."""
    if parts is None:
        if not num_output:
            raise InputError("split: give the piece sizes (parts) or their number (num_output)")
        n = x.shape[axis]
        if n % int(num_output):
            raise ShapeError(f"split: axis {axis} of size {n} does not split into "
                             f"{num_output} equal pieces")
        parts = [n // int(num_output)] * int(num_output)
    parts = [int(p) for p in parts]
    sizes = as_tensor(np.asarray(parts, dtype=np.int64), like=x)
    return list(apply("Split", [x, sizes], {"axis": int(axis)}, n_outputs=len(parts))) \
        if len(parts) > 1 else [apply("Split", [x, sizes], {"axis": int(axis)})]


def gather(x, axis: int, indices):
    """``x`` indexed along ``axis``. Indices given as a list or array are taken modulo the
    axis size, as SINGA does (``gather(x[3], 0, [0, 1, 3])`` reads element 0 for 3), so the
    recorded (exported) Gather only holds valid indices; index Tensors go to ONNX Gather as
    they are (negative allowed, out of range refused)."""
    if isinstance(indices, Tensor):
        idx = indices
    else:
        a = np.asarray(indices, dtype=np.int64)
        n = x.shape[axis]
        if n == 0 and a.size:
            raise ShapeError(f"gather: axis {axis} of shape {list(x.shape)} is empty")
        idx = as_tensor(np.asarray(a % n if n else a, dtype=np.int64), like=x)
    return apply("Gather", [x, idx], {"axis": int(axis)})


def slice(x, starts, ends, axes=None, steps=None):  # noqa: A001 - SINGA's name
    def c(v):
        return None if v is None else as_tensor(np.asarray(list(v), dtype=np.int64), like=x)
    return apply("Slice", [x, c(starts), c(ends), c(axes), c(steps)])


def expand(x, shape):
    return apply("Expand", [x, as_tensor(np.asarray(list(shape), dtype=np.int64), like=x)])


def tile(x, repeats):
    """``numpy.tile``'s rule (SINGA's): see :func:`_tile`; one :class:`Tile` operator."""
    return Tile(repeats)(x)[0]


def _tile(x, repeats):
    """``numpy.tile``'s rule (SINGA's): an int repeats the last axis; fewer repeats than axes
    repeat the last ones; more repeats than axes first give ``x`` leading axes of size 1 (a
    Reshape), so the recorded Tile is valid ONNX."""
    reps = [int(repeats)] if isinstance(repeats, (int, np.integer)) else [int(r) for r in repeats]
    nd = x.ndim()
    if len(reps) < nd:
        reps = [1] * (nd - len(reps)) + reps
    elif len(reps) > nd:
        x = reshape(x, [1] * (len(reps) - nd) + list(x.shape))
    return apply("Tile", [x, as_tensor(np.asarray(reps, dtype=np.int64), like=x)])


def pad(x, mode: str = "constant", pads=(), constant=0.0):
    return apply("Pad", [x, as_tensor(np.asarray(list(pads), dtype=np.int64), like=x),
                         as_tensor(np.asarray(constant), like=x)], {"mode": mode})


def where(x, y, condition):
    """SINGA's argument order: ``where(x, y, condition)`` = ``condition ? x : y``."""
    return apply("Where", [condition, x, y])


def cast(x, to):
    """Cast to ``to`` (a numpy dtype, or SINGA's ``'int'``/``'float'``/type codes)."""
    return apply("Cast", [x], {"to": int(onnx_dtype_of_np(parse_dtype(to)))})


def identity(x):
    return apply("Identity", [x])


def reduce_sum(x, axes=None, keepdims: int = 1):
    ax = None if axes is None else _axes_tensor(axes, x)
    return apply("ReduceSum", [x, ax], {"keepdims": int(keepdims)})


def reduce_mean(x, axes=None, keepdims: int = 1):
    attrs = {"keepdims": int(keepdims)}
    if axes is not None:
        attrs["axes"] = list(axes) if isinstance(axes, (list, tuple)) else [int(axes)]
    return apply("ReduceMean", [x], attrs)


def reduce_max(x, axes=None, keepdims: int = 0):
    attrs = {"keepdims": int(keepdims)}
    if axes is not None:
        attrs["axes"] = list(axes) if isinstance(axes, (list, tuple)) else [int(axes)]
    return apply("ReduceMax", [x], attrs)


def sum(*xs):  # noqa: A001 - SINGA's name (variadic element-wise Sum)
    return apply("Sum", list(xs))


def mean(*xs):
    return apply("Mean", list(xs))


def max(*xs):  # noqa: A001
    return apply("Max", list(xs))


def min(*xs):  # noqa: A001
    return apply("Min", list(xs))


def softmax(x, axis: int = 1):
    return apply("Softmax", [x], {"axis": int(axis)})


def log_softmax(x, axis: int = 1):
    return apply("LogSoftmax", [x], {"axis": int(axis)})


def layer_norm(x, scale, bias=None, axis: int = -1, epsilon: float = 1e-5):
    return apply("LayerNormalization", [x, scale, bias],
                 {"axis": int(axis), "epsilon": float(epsilon)})


def dropout(x, seed=0, ratio: float = 0.5, training: bool | None = None):
    """Inverted dropout; identity outside training (a Dropout node either way). SINGA's
    signature: ``dropout(x, seed=0, ratio=0.5)`` (``seed`` is accepted and not used: the
    device's random source draws the masks, seed it with ``Device.SetRandSeed``).
    ``training`` None follows ``autograd.training``."""
    if training is None:
        training = _singa_training()
    r = as_tensor(np.asarray(ratio, dtype=x.dtype), like=x)
    if not training or ratio == 0.0:
        return apply("Dropout", [x, r], opset=_OPSET13)
    mode = as_tensor(np.asarray(True), like=x)
    return apply("Dropout", [x, r, mode], n_outputs=2, opset=_OPSET13,
                 fn=_train_fn("Dropout", _OPSET13, x), training_mode=True)[0]


def _train_fn(op_type: str, opset: int, x: Tensor) -> Callable:
    """The registered training form of ``op_type`` for ``x``'s device."""
    return _rules.train_form(op_type, "", opset, xp="cupy" if x.device.is_cuda else None).fn


def batch_norm(x, scale, bias, running_mean, running_var, *, momentum: float = 0.9,
               epsilon: float = 1e-5, training: bool = False):
    """BatchNormalization; in training it normalises with the batch statistics and updates
    ``running_mean``/``running_var`` in place (ONNX: ``running = running * momentum + batch *
    (1 - momentum)``, biased batch variance)."""
    attrs = {"epsilon": float(epsilon), "momentum": float(momentum)}
    if not training:
        return apply("BatchNormalization", [x, scale, bias, running_mean, running_var], attrs,
                     opset=15)
    attrs["training_mode"] = 1
    return apply("BatchNormalization", [x, scale, bias, running_mean, running_var], attrs,
                 opset=15, n_outputs=3, fn=_train_fn("BatchNormalization", 15, x),
                 training_mode=True,
                 state_updates={1: running_mean, 2: running_var})[0]


def conv2d(x, W, b=None, stride=1, padding=0, dilation=1, group: int = 1):
    """2-D convolution (an ONNX Conv node); ``padding``/``stride``/``dilation`` int or pair."""
    def pair(v):
        return [int(v), int(v)] if isinstance(v, (int, np.integer)) else [int(a) for a in v]
    ph, pw = pair(padding)
    attrs = {"strides": pair(stride), "dilations": pair(dilation), "group": int(group),
             "pads": [ph, pw, ph, pw], "kernel_shape": list(W.shape[2:])}
    return apply("Conv", [x, W, b], attrs)


# --------------------------------------------------------------------------- losses
def _labels(t, n: int, c: int, op: str, like=None):
    """(kind, Tensor) for labels: ('index', int tensor of shape (N,)) or ('onehot', float).
    Labels given as arrays go to the device of ``like`` (the scores)."""
    if not isinstance(t, Tensor):
        t = as_tensor(np.asarray(t) if not is_array(t) else t, like=like)
    shape, dtype = tuple(t.shape), t.dtype
    if dtype.kind in "iu":
        if shape == (n, 1):
            t = reshape(t, (n,))
            shape = (n,)
        if shape != (n,):
            raise SingaShapeError(f"{op}: integer labels must have shape ({n},) (one class index "
                                  f"per row of the ({n}, {c}) scores), got {list(shape)}")
        data = t.data
        if data.size:
            lo, hi = label_range(data)
            if lo < 0 or hi >= c:
                raise InputError(f"{op}: class indices must lie in [0, {c - 1}] for {c} "
                                 f"classes, got values in [{lo}, {hi}]")
        if dtype not in (np.int32, np.int64):
            t = cast(t, np.int64)
        return "index", t
    if _is_float(dtype):
        if shape != (n, c):
            hint = (" (float labels of shape (N,) look like class indices: convert them with "
                    ".astype(np.int64))" if shape == (n,) else "")
            raise SingaShapeError(f"{op}: one-hot/probability labels must have the scores' "
                                  f"shape ({n}, {c}), got {list(shape)}{hint}")
        return "onehot", t
    raise InputError(f"{op}: labels must be integer class indices or float one-hot rows, got "
                     f"dtype {dtype}")


def _loss_shape(loss):
    """SINGA's losses are ``SumAll`` results of shape (1,); the recorded graph ends in a
    Reshape to [1] (``float(loss)`` / ``loss.item()`` still work)."""
    return reshape(loss, (1,)) if tuple(loss.shape) != (1,) else loss


def softmax_cross_entropy(x, t):
    """Mean cross-entropy of logits ``x`` (N, C) against labels ``t`` (see
    :func:`_softmax_cross_entropy`); one :class:`SoftMaxCrossEntropy` operator."""
    return SoftMaxCrossEntropy(t)(x)[0]


def _softmax_cross_entropy(x, t):
    """Mean cross-entropy of logits ``x`` (N, C) against ``t``: int class indices (N,) or
    one-hot / probability rows (N, C). Records SoftmaxCrossEntropyLoss (indices) or
    LogSoftmax/Mul/ReduceSum/ReduceMean (one-hot). Shape (1,), as SINGA's."""
    if x.ndim() != 2:
        raise SingaShapeError(f"softmax_cross_entropy: scores must be 2-D (N, C), got shape "
                              f"{list(x.shape)}; flatten them first")
    n, c = x.shape
    kind, t = _labels(t, n, c, "softmax_cross_entropy", like=x)
    if kind == "index":
        return _loss_shape(apply("SoftmaxCrossEntropyLoss", [x, t], {"reduction": "mean"},
                                 opset=_OPSET13))
    if t.dtype != x.dtype:
        t = cast(t, x.dtype)
    logp = log_softmax(x, 1)
    return _loss_shape(negative(reduce_mean(reduce_sum(logp * t, [1], 0), None, 0)))


def cross_entropy(y, t):
    """SINGA's CrossEntropy (see :func:`_cross_entropy`)."""
    return CrossEntropy(t)(y)[0]


def _cross_entropy(y, t):
    """SINGA's CrossEntropy: ``-sum(t * log(y)) / N`` for probabilities ``y`` (N, C);
    shape (1,)."""
    n, c = y.shape
    kind, t = _labels(t, n, c, "cross_entropy", like=y)
    if kind == "index":
        onehot = np.zeros((n, c), dtype=y.dtype)
        onehot[np.arange(n), np.asarray(t.numpy())] = 1
        t = Tensor(device=y.device, data=onehot)
    return _loss_shape(negative(reduce_sum(log(y) * t, None, 0)) * (1.0 / n))


def mse_loss(x, t):
    """SINGA's ``mse_loss``: the mean of ``(x - t)^2`` over all elements; shape (1,). The
    target must have the prediction's shape (``MeanSquareError(t)(x)`` broadcasts it)."""
    if tuple(getattr(t, "shape", np.shape(t))) != tuple(x.shape):
        raise SingaShapeError(f"mse_loss: target shape {list(np.shape(t))} differs from the "
                              f"prediction's {list(x.shape)}")
    return MeanSquareError(t)(x)[0]


def _mse_loss(x, t):
    """SINGA's ``MeanSquareError``: ``sum((x - t)^2) / x.size`` with ``t`` broadcast to x's
    shape (SINGA subtracts with broadcasting)."""
    if not isinstance(t, Tensor):
        t = as_tensor(np.asarray(t, dtype=x.dtype), like=x)
    try:
        shape = np.broadcast_shapes(tuple(t.shape), tuple(x.shape))
    except ValueError:
        shape = None
    if shape != tuple(x.shape):
        raise SingaShapeError(f"MeanSquareError: target shape {list(t.shape)} does not "
                              f"broadcast to the prediction's {list(x.shape)}")
    d = x - t
    return _loss_shape(reduce_sum(d * d, None, 0) * (1.0 / _max(x.size(), 1)))


def nll_loss(logp, t):
    """Mean negative log-likelihood of log-probabilities (N, C) and int labels (N,); shape
    (1,)."""
    n, c = logp.shape
    kind, t = _labels(t, n, c, "nll_loss", like=logp)
    if kind != "index":
        raise InputError("nll_loss: labels must be integer class indices")
    return _loss_shape(apply("NegativeLogLikelihoodLoss", [logp, t], {"reduction": "mean"},
                             opset=_OPSET13))


def binary_cross_entropy(x, t):
    """Mean binary cross-entropy (see :func:`_binary_cross_entropy`)."""
    return BinaryCrossEntropy(t)(x)[0]


def _binary_cross_entropy(x, t):
    """Mean binary cross-entropy of probabilities ``x`` and targets ``t`` (same shape), over
    all elements (probabilities clipped to [1e-7, 1 - 1e-7]); shape (1,). SINGA divides the
    sum by the batch size ``N`` instead: multiply by ``x.size() / x.shape[0]`` for its
    number."""
    if not isinstance(t, Tensor):
        t = as_tensor(np.asarray(t, dtype=x.dtype), like=x)
    eps = 1e-7
    xc = clip(x, eps, 1.0 - eps)
    return _loss_shape(negative(reduce_mean(t * log(xc) + (1.0 - t) * log(1.0 - xc), None, 0)))


# --------------------------------------------------------------------------- more SINGA functions
# Thin names over ONNX ops (SINGA's ``autograd`` functions); the operator classes below call
# these.
def cosh(x):
    return _unary("Cosh", x)


def sinh(x):
    return _unary("Sinh", x)


def tan(x):
    return _unary("Tan", x)


def acos(x):
    return _unary("Acos", x)


def acosh(x):
    return _unary("Acosh", x)


def asin(x):
    return _unary("Asin", x)


def asinh(x):
    return _unary("Asinh", x)


def atan(x):
    return _unary("Atan", x)


def atanh(x):
    return _unary("Atanh", x)


def sign(x):
    return _unary("Sign", x)


def ceil(x):
    return _unary("Ceil", x)


def floor(x):
    return _unary("Floor", x)


def rounde(x):
    """Round half to even (ONNX Round; SINGA's ``rounde``)."""
    return _unary("Round", x)


def round(x):  # noqa: A001 - SINGA's name
    """Round half away from zero (SINGA's ``round``): ``sign(x) * floor(|x| + 0.5)``."""
    return Round()(x)[0]


def _round(x):
    return sign(x) * floor(abs(x) + 0.5)


def less(x, y):
    return apply("Less", [x, y])


def greater(x, y):
    return apply("Greater", [x, y])


def equal(x, y):
    return apply("Equal", [x, y])


def _as_bool(x):
    x = x if isinstance(x, Tensor) else as_tensor(np.asarray(x))
    return x if x.dtype == np.bool_ else cast(x, np.bool_)


def _and(a, b):
    """Logical and; non-bool inputs count as True where non-zero (SINGA's rule)."""
    return apply("And", [_as_bool(a), _as_bool(b)])


def _or(a, b):
    return apply("Or", [_as_bool(a), _as_bool(b)])


def _xor(a, b):
    return apply("Xor", [_as_bool(a), _as_bool(b)])


def _not(x):
    return apply("Not", [_as_bool(x)])


def shape(x):
    """The shape of ``x`` as an int64 Tensor (ONNX Shape)."""
    return Shape()(x)[0]


def prelu(x, slope):
    """ONNX PRelu. ``slope`` broadcasts to ``x``; where only the two together broadcast (SINGA
    allows it: x [1, 4, 1, 6], slope [3, 1, 5, 6]) ``x`` is first expanded to the common shape
    (an Expand node), so the recorded PRelu stays valid ONNX."""
    s_shape = tuple(slope.shape) if isinstance(slope, Tensor) else np.shape(slope)
    try:
        np.broadcast_shapes(tuple(x.shape), s_shape)
    except ValueError:
        raise ShapeError(f"prelu: slope of shape {list(s_shape)} does not broadcast with x of "
                         f"shape {list(x.shape)}") from None
    return PRelu()(x, slope)[0]


def _prelu(x, slope):
    out = np.broadcast_shapes(tuple(x.shape), tuple(np.shape(slope.data if isinstance(
        slope, Tensor) else slope)))
    if tuple(out) != tuple(x.shape):
        x = expand(x, out)
    return apply("PRelu", [x, slope])


def add_all(*xs):
    """Element-wise sum of several Tensors, one Add after the other (SINGA's ``add_all``)."""
    if not xs:
        raise InputError("add_all: needs at least one Tensor")
    y = xs[0]
    for x in xs[1:]:
        y = add(y, x)
    return y


def onehot(axis, indices, depth, values):
    """ONNX OneHot: ``indices`` (a Tensor), ``depth`` (a number or one-element array),
    ``values`` ``[off, on]``; the output takes ``values``' dtype."""
    vals = np.asarray(values.numpy() if isinstance(values, Tensor) else values)
    if vals.size != 2:
        raise InputError(f"onehot: values must be [off_value, on_value], got {vals.tolist()}")
    d = np.asarray(depth.numpy() if isinstance(depth, Tensor) else depth).reshape(-1)
    if d.size != 1:
        raise InputError(f"onehot: depth must be one number, got {d.tolist()}")
    return apply("OneHot", [indices, as_tensor(d.astype(np.int64), like=indices),
                            as_tensor(vals.reshape(2), like=None)], {"axis": int(axis)})


def nonzero(x):
    """Indices of the non-zero elements, shape (ndim, count), int64 (ONNX NonZero)."""
    return apply("NonZero", [x])


def constant_of_shape(x, value=0):
    """A float32 Tensor of the shape held in ``x`` (a 1-D Tensor), filled with ``value``."""
    if x.dtype != np.int64:
        x = cast(x, np.int64)
    return apply("ConstantOfShape", [x], {"value": np.asarray([value], dtype=np.float32)})


def globalaveragepool(x, data_format: str = "channels_first"):
    """Mean over the spatial axes; ``channels_last`` inputs (N, ..., C) are transposed to
    channels first and the (N, C, 1, ...) result back (``channel_last``, the spelling
    SINGA's tests use, is accepted too)."""
    return GlobalAveragePool(data_format)(x)[0]


def _globalaveragepool(x, data_format: str = "channels_first"):
    if data_format == "channels_first":
        return apply("GlobalAveragePool", [x])
    if data_format not in ("channels_last", "channel_last"):
        raise InputError(f"globalaveragepool: data_format must be 'channels_first' or "
                         f"'channels_last', got {data_format!r}")
    nd = x.ndim()
    y = apply("GlobalAveragePool", [transpose(x, [0, nd - 1] + list(range(1, nd - 1)))])
    return transpose(y, [0] + list(range(2, nd)) + [1])


def scatter_elements(x, indices, updates, axis: int = 0):
    """ONNX ScatterElements: a copy of ``x`` with ``updates`` written at ``indices`` along
    ``axis`` (lists and arrays become constants). As SINGA's, ``indices`` and ``updates`` are
    settings of the :class:`ScatterElements` operator: ``creator.backward`` gives ``dx``
    only (``autograd.backward`` still reaches an ``updates`` Tensor that needs a gradient)."""
    return ScatterElements(indices, updates, axis)(x)[0]


def _scatter_elements(x, indices, updates, axis: int = 0):
    idx = indices if isinstance(indices, Tensor) else as_tensor(
        np.asarray(indices, dtype=np.int64), like=x)
    upd = updates if isinstance(updates, Tensor) else as_tensor(
        np.asarray(updates, dtype=x.dtype), like=x)
    return apply("ScatterElements", [x, idx, upd], {"axis": int(axis)}, opset=_OPSET13)


def upsample(x, mode: str, scales):
    """Nearest upsampling by integer ``scales`` per axis (SINGA's ``upsample``; its only
    mode), recorded as ONNX Resize (nearest, asymmetric, floor: every element repeated)."""
    if str(mode).lower() != "nearest":
        raise InputError(f"upsample: only mode 'nearest' is supported (as in SINGA), got "
                         f"{mode!r}")
    sc = np.asarray(scales, dtype=np.float32).reshape(-1)
    if sc.size != x.ndim():
        raise ShapeError(f"upsample: {sc.size} scales for a {x.ndim()}-d input")
    if np.any(sc < 1) or np.any(sc != np.floor(sc)):
        raise InputError(f"upsample: scales must be integers >= 1, got {sc.tolist()}")
    return apply("Resize", [x, None, as_tensor(sc, like=None)],
                 {"mode": "nearest", "coordinate_transformation_mode": "asymmetric",
                  "nearest_mode": "floor"})


def depth_to_space(x, blocksize: int, mode: str = "DCR"):
    return apply("DepthToSpace", [x], {"blocksize": int(blocksize), "mode": str(mode)})


def space_to_depth(x, blocksize: int, mode: str = "DCR"):
    """The inverse of :func:`depth_to_space` (see :func:`_space_to_depth`)."""
    return SpaceToDepth(blocksize, mode)(x)[0]


def _space_to_depth(x, blocksize: int, mode: str = "DCR"):
    """The inverse of :func:`depth_to_space` with the same ``mode`` (SINGA's). DCR is ONNX
    SpaceToDepth; CRD (which ONNX's SpaceToDepth lacks) is recorded as Reshape, Transpose,
    Reshape."""
    b = int(blocksize)
    mode = str(mode).upper()
    if mode == "DCR":
        return apply("SpaceToDepth", [x], {"blocksize": b})
    if mode != "CRD":
        raise InputError(f"space_to_depth: mode must be 'DCR' or 'CRD', got {mode!r}")
    n, c, h, w = x.shape
    if h % b or w % b:
        raise ShapeError(f"space_to_depth: spatial size {h}x{w} is not a multiple of the "
                         f"block size {b}")
    y = reshape(x, (n, c, h // b, b, w // b, b))
    y = transpose(y, (0, 1, 3, 5, 2, 4))
    return reshape(y, (n, c * b * b, h // b, w // b))


def batchnorm_2d(handle, x, scale, bias, running_mean, running_var, training=None):
    """SINGA's ``batchnorm_2d(handle, x, scale, bias, running_mean, running_var)``: the
    momentum comes from ``handle.factor`` (SINGA's ``BatchNormHandle(factor, x)``) or a number;
    ``training`` None follows ``autograd.training`` (batch statistics and running-statistics
    update in training, the running ones otherwise)."""
    momentum = float(getattr(handle, "factor", handle if isinstance(handle, (int, float))
                             else 0.9))
    if training is None:
        training = _singa_training()
    return batch_norm(x, scale, bias, running_mean, running_var, momentum=momentum,
                      training=bool(training))


def cossim(a, b):
    """Cosine similarity of the rows of ``a`` and ``b`` (both (N, D)); shape (N,)."""
    if tuple(a.shape) != tuple(b.shape) or a.ndim() != 2:
        raise SingaShapeError(f"cossim: needs two (N, D) Tensors of one shape, got "
                              f"{list(a.shape)} and {list(b.shape)}")
    return CosSim()(a, b)[0]


def _cossim(a, b):
    dot = reduce_sum(a * b, [1], 0)
    na = sqrt(reduce_sum(a * a, [1], 0))
    nb = sqrt(reduce_sum(b * b, [1], 0))
    return dot / (na * nb)


def ranking_loss(pos, neg, M=0.2):  # noqa: N803 - SINGA's name
    """SINGA's margin ranking loss: ``sum(max(0, M - pos + neg)) / N``; shape (1,)."""
    if tuple(pos.shape) != tuple(neg.shape):
        raise SingaShapeError(f"ranking_loss: pos and neg must have one shape, got "
                              f"{list(pos.shape)} and {list(neg.shape)}")
    return RankingLoss(M)(pos, neg)[0]


def _ranking_loss(pos, neg, M):  # noqa: N803
    return _loss_shape(reduce_sum(relu(neg - pos + float(M)), None, 0) *
                       (1.0 / _max(pos.shape[0] if pos.shape else 1, 1)))


def embedding(x, w):
    """Rows of ``w`` picked by the integer ids in ``x`` (ONNX Gather on axis 0)."""
    return Embedding()(x, w)[0]


def _embedding(x, w):
    if x.dtype.kind not in "iu":
        if not _is_float(x.dtype) or not np.all(np.equal(np.mod(x.numpy(), 1), 0)):
            raise InputError(f"embedding: ids must be integers, got dtype {x.dtype}")
        x = cast(x, np.int64)
    return apply("Gather", [w, x], {"axis": 0})


def back_broadcast(y_shape, x_shape, x):
    """Sum the array ``x`` (of ``y_shape``) back to ``x_shape`` (SINGA's helper)."""
    a = _raw_array(x)
    if tuple(a.shape) != tuple(y_shape):
        a = a.reshape(tuple(y_shape))
    return _rules.unbroadcast(a, tuple(x_shape))


def axis_helper(y_shape, x_shape):
    """The axes of ``y_shape`` along which ``x_shape`` was broadcast (SINGA's helper's name):
    with the shapes aligned on the right, the leading axes ``x_shape`` lacks and those whose
    sizes differ."""
    lead = len(y_shape) - len(x_shape)
    return tuple(i for i, d in enumerate(y_shape) if i < lead or x_shape[i - lead] != d)


def ctensor2numpy(x):
    """A raw tensor (or array) as a numpy array."""
    return _arr_to_numpy(_raw_array(x))


def infer_dependency(op):
    """SINGA's ``infer_dependency``: ``{node: number of nodes that consume its outputs}`` for
    the tape nodes ``op`` (a Tensor's ``creator``) depends on, ``op`` included."""
    order = walk_tape([(op, 0)] + [(op, i) for i in range(1, op.n_outputs)])
    counts = {n: 0 for n in order}
    for n in order:
        for p in n.parents:
            if type(p) is tuple and p[0] in counts:
                counts[p[0]] += 1
    return counts



# =========================================================================== SINGA's operators
# =========================================================================== SINGA's operators
class RawTensor:
    """SINGA's ``CTensor`` face over an array: what SINGA's operator ``forward``/``backward``
    take and return (``dx = y.creator.backward(dy.data)``). ``shape()`` is a method, as in
    SINGA's C++ tensor; ``data`` is the array; ``tensor.from_raw_tensor(r)`` makes it a
    Tensor. Arrays are accepted wherever a RawTensor is."""

    __slots__ = ("data",)

    def __init__(self, data):
        if isinstance(data, (RawTensor, Tensor)):
            data = data.data
        self.data = data if is_array(data) else np.asarray(data)

    def shape(self) -> tuple:
        return tuple(self.data.shape)

    def nDim(self) -> int:  # noqa: N802 - SINGA's name
        return int(self.data.ndim)

    def Size(self) -> int:  # noqa: N802 - SINGA's name
        return int(self.data.size)

    ndim = nDim
    size = Size

    @property
    def dtype(self):
        return self.data.dtype

    def data_type(self):
        return self.data.dtype

    def device(self):
        return device_of_array(self.data)

    def numpy(self) -> np.ndarray:
        return _arr_to_numpy(self.data)

    def __array__(self, dtype=None, copy=None):
        a = self.numpy()
        return a if dtype is None else a.astype(dtype)

    def __repr__(self) -> str:
        return f"RawTensor(shape={list(self.data.shape)}, dtype={self.data.dtype})"


def _raw_array(x):
    if isinstance(x, (RawTensor, Tensor)):
        return x.data
    if is_array(x):
        return x
    return np.asarray(x)

class OperatorNode(TapeNode):
    """A tape node with SINGA's operator face: ``y.creator.forward(*raw)`` /
    ``y.creator.backward(*dys)``. The tape records its nodes as this class once this module
    is imported (``tape.set_node_class``); nothing else differs from :class:`TapeNode`."""

    __slots__ = ()

    def forward(self, *xs):
        """Run this node's op again on arrays (or :class:`RawTensor`) without recording;
        returns a :class:`RawTensor`, or a tuple of them for several outputs."""
        if self.origin is not None:
            return self.origin.forward(*xs)
        arrays = [None if x is None else _raw_array(x) for x in xs]
        if self.wants_ctx:
            dev = device_of_array(next(a for a in arrays if a is not None))
            ctx = NodeContext(self.name, self.op_type, self.opset, self.n_outputs,
                              tuple(self.out_names or ()), self.training_mode, dev.rng)
            r = self.fn(*arrays, **self.kw, ctx=ctx)
        else:
            r = self.fn(*arrays, **self.kw)
        r = r if type(r) is tuple else (r,)
        outs = tuple(RawTensor(a) for a in r[:self.n_outputs])
        return outs[0] if len(outs) == 1 else outs

    def backward(self, *dys):
        """SINGA's per-operator backward: the gradients of this op's differentiable inputs
        (float inputs the caller gave, not the constants made from attributes) for output
        gradients ``dys`` (arrays, :class:`RawTensor` or Tensors; ones when omitted). One
        :class:`RawTensor`, or a tuple in input order."""
        if self.origin is not None:
            return self.origin.backward(*dys)
        return _singa_vjp([(self, i) for i in range(self.n_outputs)], dys, None)


_tape.set_node_class(OperatorNode)


def _singa_vjp(roots, dys, inputs):
    """Gradients of the ``inputs`` (Tensors; None: the parents of the single root node) for
    output gradients ``dys`` at ``roots`` ((node, index) pairs), over the recorded tape
    between them. SINGA's per-operator backward; nothing is freed."""
    roots = [(n, i) for n, i in roots if n is not None]
    if not roots:
        raise GradientError("backward: the operator's outputs were not recorded on the tape "
                            "(computed inside inference_mode())")
    first = roots[0][0]
    if first.saved_in is None:
        raise GradientError(
            f"node {first.name!r} ({first.op_type}): nothing was saved for its backward: set "
            f"autograd.training = True before the forward (SINGA's rule) or give an input "
            f"requires_grad=True")
    xp = xp_of(*[a for a in first.saved_in if a is not None])
    given = [d for d in dys] if dys and not (len(dys) == 1 and dys[0] is None) else []
    grads: dict = {}
    for k, (node, i) in enumerate(roots):
        shape, dtype = node.out_meta[i]
        if not given:
            g = xp.ones(shape, dtype=dtype)
        elif k < len(given) and given[k] is not None:
            d = given[k]
            g = xp.full(shape, d, dtype=dtype) if isinstance(d, (int, float)) else \
                _raw_array(d)
            if g.dtype != dtype:
                g = g.astype(dtype)
            if tuple(g.shape) != tuple(shape):
                try:
                    g = xp.broadcast_to(g, shape)
                except ValueError:
                    raise ShapeError(f"backward: the gradient for output {k} has shape "
                                     f"{list(g.shape)}, the output has {list(shape)}") from None
        else:
            continue
        grads[(id(node), i)] = g
    targets = []
    if inputs is None:
        for p in first.parents:
            if p is None:
                continue
            if type(p) is tuple:
                if _is_float(p[0].out_meta[p[1]][1]):
                    targets.append(("edge", (id(p[0]), p[1])))
            elif not p._const and _is_float(p.dtype):
                targets.append(("leaf", p))
    else:
        for t in inputs:
            if not _is_float(t.dtype):
                continue
            if t.creator is not None:
                targets.append(("edge", (id(t.creator), t._index)))
            else:
                targets.append(("leaf", t))
    stop = {ref for kind, ref in targets if kind == "edge"}
    order = walk_tape(roots, stop)
    leaf: dict = {}
    for node in reversed(order):
        gouts = [(grads.get if (id(node), j) in stop else grads.pop)((id(node), j), None)
                 for j in range(node.n_outputs)]
        if all(g is None for g in gouts):
            continue
        if node.saved_in is None:
            raise GradientError(
                f"node {node.name!r} ({node.op_type}): nothing was saved for its backward "
                f"(freed by an earlier backward(), or recorded with autograd.training False "
                f"and no input requiring a gradient)")
        needs = tuple(p is not None and _is_float(node.parent_meta(j)[1])
                      for j, p in enumerate(node.parents))
        gins = run_rule(node, gouts, needs)
        for j, p in enumerate(node.parents):
            if p is None or j >= len(gins) or gins[j] is None or not needs[j]:
                continue
            g = gins[j]
            if type(p) is tuple:
                key = (id(p[0]), p[1])
                prev = grads.get(key)
                grads[key] = g if prev is None else prev + g
            else:
                prev = leaf.get(id(p))
                leaf[id(p)] = g if prev is None else prev + g
    out = []
    for kind, ref in targets:
        g = grads.get(ref) if kind == "edge" else leaf.get(id(ref))
        if g is not None:
            out.append(RawTensor(g))
    if not out:
        # piecewise-constant ops (Sign, Ceil, Floor, Round...) have no gradient flow: their
        # inputs get zeros, as in SINGA
        for kind, ref in targets:
            shape, dtype = (ref.shape, ref.dtype) if kind == "leaf" else \
                _meta_of_edge(order, ref, first)
            out.append(RawTensor(xp.zeros(shape, dtype=dtype)))
        if not out:
            return None
    return out[0] if len(out) == 1 else tuple(out)


def _meta_of_edge(order, key, first):
    """(shape, dtype) of the tape value ``key`` = (id(node), index) among nodes' parents."""
    for node in list(order) + [first]:
        for p in node.parents:
            if type(p) is tuple and (id(p[0]), p[1]) == key:
                return p[0].out_meta[p[1]]
    raise GradientError("internal: a backward input was not found on the tape")


class _OpCall:
    """One call of an :class:`Operator`: its input Tensors and output slots; the tape nodes
    that produced the outputs point here (``node.origin``), so ``y.creator.backward`` is the
    operator's backward for that call.

    No reference cycle: the nodes hold the call, the call holds its operator, and the
    operator's ``_last`` holds the call only weakly (see :meth:`Operator.__call__`). A cycle
    here (operator <-> call, the call holding its input Tensors and so the whole tape) kept
    every training step's tape and saved arrays alive until the garbage collector found it:
    ~1,400 tracked objects per BERT-like step for the collector to walk and free."""

    __slots__ = ("_op", "_op_is_weak", "xs", "_roots", "__weakref__")

    def __init__(self, op, xs, roots, weak_op=False):
        # the nodes point here (node.origin); weak references back keep that from being a
        # cycle
        self._op = weakref.ref(op) if weak_op else op
        self._op_is_weak = weak_op
        self.xs = xs
        self._roots = tuple((None if n is None else weakref.ref(n), i) for n, i in roots)

    @property
    def op(self):
        return self._op() if self._op_is_weak else self._op

    @property
    def roots(self) -> tuple:
        out = tuple((None if r is None else r(), i) for r, i in self._roots)
        if any(r is not None and n is None for (r, _), (n, _) in zip(self._roots, out)):
            raise GradientError(f"{self.op.name}: the outputs of this call are gone (no Tensor "
                                f"holds them any more); backward needs them")
        return out

    def forward(self, *xs):
        return self.op.forward(*xs)

    def backward(self, *dys):
        return self.op._backward(self, dys)


class Operator:
    """SINGA's operator class: ``ys = Op(settings...)(*inputs)`` returns a tuple of Tensors
    (``autograd.ReLU()(x)[0]``); each operator records the same ONNX nodes as the functions
    of this module. ``forward(*raw)`` runs it on arrays / :class:`RawTensor` without
    recording; ``backward(*dys)`` gives the gradients of its (float Tensor) inputs for the
    last call, as does ``y.creator.backward(dy)`` for the call that made ``y``.

    Subclasses implement ``_do(*inputs)`` with Tensor operations (which is what makes them
    differentiable and exportable); SINGA's own subclassing style (``forward``/``backward``
    on raw C++ tensors) is not supported.
    """

    _ids = itertools.count()
    #: the ONNX op SINGA's backend imports as this operator (None: none)
    onnx_op: str | None = None

    def __init__(self, name=None):
        self.name = name if name is not None else f"{type(self).__name__}#{next(Operator._ids)}"
        self._last = None

    def _do(self, *xs):
        raise NotImplementedError(
            f"{type(self).__name__}: an Operator subclass implements _do(*inputs) with Tensor "
            f"operations (SINGA-style forward/backward on raw tensors is not supported)")

    def __call__(self, *xs):
        mark = _tape.next_node_id()
        outs = self._do(*xs)
        outs = tuple(outs) if isinstance(outs, (tuple, list)) else (outs,)
        nodes = [o.creator for o in outs
                 if o.creator is not None and o.creator.uid > mark]
        # who holds whom, without a cycle: the recorded nodes hold the call (node.origin) and
        # the call its operator, the operator the call weakly (the call lives as long as its
        # nodes do, and backward needs those anyway); when nothing was recorded the operator
        # holds the call and the call the operator weakly
        call = _OpCall(self, tuple(x for x in xs if isinstance(x, Tensor)),
                       tuple((o.creator, o._index) for o in outs), weak_op=not nodes)
        for n in nodes:
            n.origin = call
        self._last = weakref.ref(call) if nodes else call
        return outs

    def forward(self, *xs):
        """Run on arrays / :class:`RawTensor` (nothing recorded); RawTensor(s) out."""
        ts = []
        for x in xs:
            if isinstance(x, Tensor) or x is None:
                ts.append(x)
            else:
                a = _raw_array(x)
                ts.append(Tensor._make(a, device_of_array(a), False, None, 0, None))
        with inference_mode():
            outs = self._do(*ts)
        outs = tuple(outs) if isinstance(outs, (tuple, list)) else (outs,)
        outs = tuple(RawTensor(o.data) for o in outs)
        return outs[0] if len(outs) == 1 else outs

    def backward(self, *dys):
        last = self._last
        if last is None:
            raise GradientError(f"{self.name}: backward() before the operator was called on "
                                f"Tensors")
        if type(last) is weakref.ReferenceType:
            last = last()
            if last is None:
                raise GradientError(f"{self.name}: the outputs of its last call are gone (no "
                                    f"Tensor holds them any more); backward needs them")
        return last.backward(*dys)

    def _backward(self, call, dys):
        return _singa_vjp(call.roots, dys, call.xs)

    def __repr__(self) -> str:
        return f"{type(self).__name__}(name={self.name!r})"


def _operator(name: str, fn: Callable, params: tuple = (), defaults: dict | None = None,
              doc: str = "", onnx_op: str | None = None) -> type:
    """An :class:`Operator` subclass ``name(*params)`` whose call is ``fn(self, *inputs)``;
    ``onnx_op``: the ONNX op SINGA's backend imports as this operator (SINGA's
    ``SingaBackend._rename_operators`` is made from these)."""
    defaults = defaults or {}

    def __init__(self, *args, **kwargs):
        name_ = kwargs.pop("name", None)
        if len(args) > len(params):
            raise TypeError(f"{type(self).__name__}() takes {len(params)} settings "
                            f"({', '.join(params) or 'none'}), got {len(args)}")
        vals = dict(zip(params, args))
        for k, v in kwargs.items():
            if k not in params:
                raise TypeError(f"{type(self).__name__}() got an unexpected setting {k!r}")
            if k in vals:
                raise TypeError(f"{type(self).__name__}() got {k!r} twice")
            vals[k] = v
        for p in params:
            if p not in vals:
                if p not in defaults:
                    raise TypeError(f"{type(self).__name__}() is missing the setting {p!r}")
                vals[p] = defaults[p]
        Operator.__init__(self, name_)
        for k, v in vals.items():
            setattr(self, k, v)

    sig = ", ".join(p + (f"={defaults[p]!r}" if p in defaults else "") for p in params)
    return type(name, (Operator,), {
        "__init__": __init__, "_do": lambda self, *xs: fn(self, *xs), "onnx_op": onnx_op,
        "__doc__": f"SINGA's ``{name}({sig})`` operator. {doc}".strip(),
        "__module__": __name__})


# element-wise, one input
ReLU = _operator("ReLU", lambda s, x: relu(x), onnx_op="Relu")
Sigmoid = _operator("Sigmoid", lambda s, x: sigmoid(x), onnx_op="Sigmoid")
Tanh = _operator("Tanh", lambda s, x: tanh(x), onnx_op="Tanh")
Identity = _operator("Identity", lambda s, x: identity(x), onnx_op="Identity")
Abs = _operator("Abs", lambda s, x: abs(x), onnx_op="Abs")
Exp = _operator("Exp", lambda s, x: exp(x))
Log = _operator("Log", lambda s, x: log(x), onnx_op="Log")
Sqrt = _operator("Sqrt", lambda s, x: sqrt(x), onnx_op="Sqrt")
Sign = _operator("Sign", lambda s, x: sign(x), onnx_op="Sign")
Negative = _operator("Negative", lambda s, x: negative(x), onnx_op="Neg")
Reciprocal = _operator("Reciprocal", lambda s, x: reciprocal(x), onnx_op="Reciprocal")
SoftSign = _operator("SoftSign", lambda s, x: softsign(x), onnx_op="Softsign")
SoftPlus = _operator("SoftPlus", lambda s, x: softplus(x), onnx_op="Softplus")
Erf = _operator("Erf", lambda s, x: erf(x), onnx_op="Erf")
Ceil = _operator("Ceil", lambda s, x: ceil(x), onnx_op="Ceil")
Floor = _operator("Floor", lambda s, x: floor(x), onnx_op="Floor")
Round = _operator("Round", lambda s, x: _round(x), doc="Half away from zero.")
Rounde = _operator("Rounde", lambda s, x: rounde(x), doc="Half to even.")
Cos = _operator("Cos", lambda s, x: cos(x), onnx_op="Cos")
Cosh = _operator("Cosh", lambda s, x: cosh(x), onnx_op="Cosh")
Sin = _operator("Sin", lambda s, x: sin(x), onnx_op="Sin")
Sinh = _operator("Sinh", lambda s, x: sinh(x), onnx_op="Sinh")
Tan = _operator("Tan", lambda s, x: tan(x), onnx_op="Tan")
Acos = _operator("Acos", lambda s, x: acos(x), onnx_op="Acos")
Acosh = _operator("Acosh", lambda s, x: acosh(x), onnx_op="Acosh")
Asin = _operator("Asin", lambda s, x: asin(x), onnx_op="Asin")
Asinh = _operator("Asinh", lambda s, x: asinh(x), onnx_op="Asinh")
Atan = _operator("Atan", lambda s, x: atan(x), onnx_op="Atan")
Atanh = _operator("Atanh", lambda s, x: atanh(x), onnx_op="Atanh")
Not = _operator("Not", lambda s, x: _not(x), onnx_op="Not")
NonZero = _operator("NonZero", lambda s, x: nonzero(x), onnx_op="NonZero")
LeakyRelu = _operator("LeakyRelu", lambda s, x: leakyrelu(x, s.a), ("a",), {"a": 0.01},
                      onnx_op="LeakyRelu")
Elu = _operator("Elu", lambda s, x: elu(x, s.alpha), ("alpha",), {"alpha": 1.0}, onnx_op="Elu")
SeLU = _operator("SeLU", lambda s, x: selu(x, s.alpha, s.gamma), ("alpha", "gamma"),
                 {"alpha": 1.67326, "gamma": 1.0507},
                 onnx_op="Selu")
HardSigmoid = _operator("HardSigmoid", lambda s, x: hardsigmoid(x, s.alpha, s.gamma),
                        ("alpha", "gamma"), {"alpha": 0.2, "gamma": 0.5},
                        onnx_op="HardSigmoid")
SoftMax = _operator("SoftMax", lambda s, x: softmax(x, s.axis), ("axis",), {"axis": 1},
                    onnx_op="Softmax")
Clip = _operator("Clip", lambda s, x: clip(x, s.min, s.max), ("min", "max"),
                 {"min": None, "max": None},
                 onnx_op="Clip")
Cast = _operator("Cast", lambda s, x: cast(x, s.to), ("to",), onnx_op="Cast")
# element-wise, several inputs
Add = _operator("Add", lambda s, a, b: add(a, b), onnx_op="Add")
Sub = _operator("Sub", lambda s, a, b: sub(a, b), onnx_op="Sub")
Mul = _operator("Mul", lambda s, a, b: mul(a, b), onnx_op="Mul")
Div = _operator("Div", lambda s, a, b: div(a, b), onnx_op="Div")
Pow = _operator("Pow", lambda s, a, b: pow(a, b), onnx_op="Pow")
Less = _operator("Less", lambda s, a, b: less(a, b), onnx_op="Less")
Greater = _operator("Greater", lambda s, a, b: greater(a, b), onnx_op="Greater")
Equal = _operator("Equal", lambda s, a, b: equal(a, b), onnx_op="Equal")
And = _operator("And", lambda s, a, b: _and(a, b), onnx_op="And")
Or = _operator("Or", lambda s, a, b: _or(a, b), onnx_op="Or")
Xor = _operator("Xor", lambda s, a, b: _xor(a, b), onnx_op="Xor")
PRelu = _operator("PRelu", lambda s, x, slope: _prelu(x, slope), onnx_op="PRelu")
Sum = _operator("Sum", lambda s, *xs: sum(*xs), onnx_op="Sum")
Mean = _operator("Mean", lambda s, *xs: mean(*xs), onnx_op="Mean")
Max = _operator("Max", lambda s, *xs: max(*xs), onnx_op="Max")
Min = _operator("Min", lambda s, *xs: min(*xs), onnx_op="Min")
Where = _operator("Where", lambda s, x, y: where(x, y, s.condition), ("condition",),
                  doc="``Where(condition)(x, y)``: ``condition ? x : y``.",
                  onnx_op="Where")
# linear algebra
Matmul = _operator("Matmul", lambda s, x, w: matmul(x, w), onnx_op="MatMul")
Gemm = _operator("Gemm", lambda s, a, b, c=None: gemm(a, b, c, s.alpha, s.beta, s.transA,
                                                       s.transB),
                 ("alpha", "beta", "transA", "transB"),
                 {"alpha": 1.0, "beta": 1.0, "transA": 0, "transB": 0})
AddBias = _operator("AddBias", lambda s, x, b: add_bias(x, b, s.axis), ("axis",), {"axis": 0})
# shape
Reshape = _operator("Reshape", lambda s, x: reshape(x, s.shape), ("shape",), onnx_op="Reshape")
Flatten = _operator("Flatten", lambda s, x: flatten(x, s.axis), ("axis",), {"axis": 1},
                    onnx_op="Flatten")
Transpose = _operator("Transpose", lambda s, x: transpose(x, s.perm), ("perm",),
                      onnx_op="Transpose")
Squeeze = _operator("Squeeze", lambda s, x: squeeze(x, s.axis), ("axis",), {"axis": []},
                    onnx_op="Squeeze")
Unsqueeze = _operator("Unsqueeze", lambda s, x: unsqueeze(x, s.axis), ("axis",),
                      onnx_op="Unsqueeze")
Concat = _operator("Concat", lambda s, *xs: cat(xs, s.axis), ("axis",), {"axis": 0},
                   onnx_op="Concat")
Slice = _operator("Slice", lambda s, x: slice(x, s.starts, s.ends, s.axes, s.steps),
                  ("starts", "ends", "axes", "steps"), {"axes": None, "steps": None},
                  onnx_op="Slice")
Split = _operator("Split", lambda s, x: tuple(split(x, s.axis, s.parts, s.num_output)),
                  ("axis", "parts", "num_output"), {"num_output": None},
                  onnx_op="Split")
Gather = _operator("Gather", lambda s, x: gather(x, s.axis, s.indices), ("axis", "indices"),
                   onnx_op="Gather")
Tile = _operator("Tile", lambda s, x: _tile(x, s.repeats), ("repeats",), onnx_op="Tile")
Expand = _operator("Expand", lambda s, x: expand(x, s.shape), ("shape",), onnx_op="Expand")
Pad = _operator("Pad", lambda s, x: pad(x, s.mode, s.pads, s.constant),
                ("mode", "pads", "constant"), {"constant": 0.0},
                onnx_op="Pad")
UpSample = _operator("UpSample", lambda s, x: upsample(x, s.mode, s.scales), ("mode", "scales"),
                     onnx_op="Upsample")
DepthToSpace = _operator("DepthToSpace", lambda s, x: depth_to_space(x, s.blocksize, s.mode),
                         ("blocksize", "mode"), {"mode": "DCR"},
                         onnx_op="DepthToSpace")
SpaceToDepth = _operator("SpaceToDepth", lambda s, x: _space_to_depth(x, s.blocksize, s.mode),
                         ("blocksize", "mode"), {"mode": "DCR"},
                         onnx_op="SpaceToDepth")
ScatterElements = _operator(
    "ScatterElements", lambda s, x: _scatter_elements(x, s.indices, s.updates, s.axis),
    ("indices", "updates", "axis"), {"axis": 0},
                            onnx_op="ScatterElements")
OneHot = _operator("OneHot", lambda s, x: onehot(s.axis, x, s.depth, s.values),
                   ("axis", "depth", "values"),
                   onnx_op="OneHot")
ConstantOfShape = _operator("ConstantOfShape", lambda s, x: constant_of_shape(x, s.value),
                            ("value",), {"value": 0.0},
                            onnx_op="ConstantOfShape")
# reductions, pooling, regularisation
ReduceSum = _operator("ReduceSum", lambda s, x: reduce_sum(x, s.axes, s.keepdims),
                      ("axes", "keepdims"), {"axes": None, "keepdims": 1},
                      onnx_op="ReduceSum")
ReduceMean = _operator("ReduceMean", lambda s, x: reduce_mean(x, s.axes, s.keepdims),
                       ("axes", "keepdims"), {"axes": None, "keepdims": 1},
                       onnx_op="ReduceMean")
GlobalAveragePool = _operator("GlobalAveragePool",
                              lambda s, x: _globalaveragepool(x, s.data_format),
                              ("data_format",), {"data_format": "channels_first"},
                              onnx_op="GlobalAveragePool")
Dropout = _operator("Dropout", lambda s, x: dropout(x, s.seed, s.ratio), ("seed", "ratio"),
                    {"seed": 0, "ratio": 0.5},
                    doc="Follows ``autograd.training`` (identity when it is False).",
                    onnx_op="Dropout")
CosSim = _operator("CosSim", lambda s, a, b: _cossim(a, b))
RankingLoss = _operator("RankingLoss", lambda s, pos, neg: _ranking_loss(pos, neg, s.M),
                        ("M",), {"M": 0.2})
# losses: SINGA's take the target at construction: MeanSquareError(t)(x)
MeanSquareError = _operator("MeanSquareError", lambda s, x: _mse_loss(x, s.t), ("t",))
SoftMaxCrossEntropy = _operator("SoftMaxCrossEntropy",
                                lambda s, x: _softmax_cross_entropy(x, s.t), ("t",))
CrossEntropy = _operator("CrossEntropy", lambda s, x: _cross_entropy(x, s.t), ("t",))
BinaryCrossEntropy = _operator("BinaryCrossEntropy",
                               lambda s, x: _binary_cross_entropy(x, s.t), ("t",))


class Shape(Operator):
    """SINGA's ``Shape()`` operator: the shape of its input as an int64 Tensor. It has no
    gradient; as in SINGA, ``backward(dy)`` returns ``dy``'s shape as a list."""
    onnx_op = "Shape"

    def _do(self, x):
        return apply("Shape", [x])

    def _backward(self, call, dys):
        if not dys or dys[0] is None:
            raise GradientError("Shape.backward needs dy (it returns dy's shape, as SINGA's)")
        return list(_raw_array(dys[0]).shape)


class Embedding(Operator):
    """SINGA's ``Embedding()`` operator: ``Embedding()(x, w)`` picks rows of ``w`` by the
    integer ids in ``x`` (ONNX Gather). Backward returns ``(dx, dW)`` as SINGA's: ids have no
    gradient, and ``dx`` is, as there, ``dy`` summed over the embedding axis (ids' shape)."""

    def _do(self, x, w):
        return _embedding(x, w)

    def _backward(self, call, dys):
        x, w = call.xs
        dw = _singa_vjp(call.roots, dys, (w,))
        (node, i), = call.roots
        dy = _raw_array(dys[0]) if dys and dys[0] is not None else \
            xp_of(w.data).ones(node.out_meta[i][0], dtype=w.dtype)
        return RawTensor(dy.sum(axis=-1)), dw


class _BatchNorm2d(Operator):
    """SINGA's ``_BatchNorm2d(handle, running_mean, running_var)(x, scale, bias)``."""

    def __init__(self, handle, running_mean, running_var, name=None):
        super().__init__(name)
        self.handle, self.running_mean, self.running_var = handle, running_mean, running_var

    def _do(self, x, scale, bias):
        return batchnorm_2d(self.handle, x, scale, bias, self.running_mean, self.running_var)
