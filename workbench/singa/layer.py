"""Layers (SINGA-compatible): parameters created lazily from the first input, ONNX nodes out.

>>> import numpy as np
>>> from workbench import layer, tensor
>>> fc = layer.Linear(3)                     # in_features taken from the first input
>>> y = fc(tensor.from_numpy(np.ones((2, 5), np.float32)))
>>> y.shape, sorted(fc.get_params())
((2, 3), ['W', 'b'])

Every layer records ONNX nodes through ``autograd.apply`` (Linear: Gemm, or MatMul + Add for
more than two dimensions; Conv2d: Conv; BatchNorm2d: BatchNormalization; ...), which is what
makes a model of layers trainable and exportable. Parameters are Tensors with
``requires_grad=True, stores_grad=True``; a layer creates them on the first call, from the
input's shape, device and float dtype (float32 unless the input is another float type), or
eagerly when the input size is given (``Linear(in, out)``, ``Conv2d(in, out, k)``).

``get_params()`` / ``get_states()`` return ``{name: Tensor}`` with dotted names
(``"conv1.W"``); states are the parameters plus buffers such as BatchNorm's running
statistics. ``layer.training`` (set by ``model.train()`` / ``model.eval()``) switches Dropout
and BatchNorm between their training and inference forms.
"""

from __future__ import annotations

import math
from collections import OrderedDict

import numpy as np

from workbench.arrays.geometry import window_geometry
from workbench.errors import InputError, ShapeError
from workbench.singa import autograd
from workbench.singa.tensor import Tensor, host_rng


def _pair(v, what: str):
    if isinstance(v, (int, np.integer)):
        return int(v), int(v)
    v = tuple(int(a) for a in v)
    if len(v) != 2:
        raise InputError(f"{what} must be an int or a pair, got {v}")
    return v


def _float_dtype(x: Tensor):
    return x.dtype if x.dtype.kind == "f" else np.dtype(np.float32)


def _param(data: np.ndarray, like: Tensor | None, dtype, name: str) -> Tensor:
    t = Tensor(device=like.device if like is not None else None, data=data.astype(dtype),
               requires_grad=True, stores_grad=True, name=name)
    return t


def _buffer(data: np.ndarray, like: Tensor | None, dtype, name: str) -> Tensor:
    return Tensor(device=like.device if like is not None else None, data=data.astype(dtype),
                  requires_grad=False, stores_grad=False, name=name)


class Layer:
    """Base class: ``initialize(*inputs)`` (optional, lazy parameter creation), ``forward``."""

    def __init__(self):
        object.__setattr__(self, "_layers", OrderedDict())
        object.__setattr__(self, "_params", OrderedDict())
        object.__setattr__(self, "_buffers", OrderedDict())
        self._initialized = False
        self.training = True
        self.name = None

    # ------------------------------------------------------------------ registration
    def __setattr__(self, name, value):
        if "_layers" not in self.__dict__:
            raise RuntimeError(f"{type(self).__name__}.__init__ must call super().__init__() "
                               f"before setting attributes")
        if isinstance(value, Layer):
            self._layers[name] = value
        elif isinstance(value, Tensor):
            if value.stores_grad:
                self._params[name] = value
                self._buffers.pop(name, None)
            elif name in self._buffers:
                self._buffers[name] = value
        else:
            self._layers.pop(name, None)
            self._params.pop(name, None)
        object.__setattr__(self, name, value)

    def register_buffer(self, name: str, t: Tensor) -> None:
        """Register a non-trainable state Tensor (saved by ``get_states``)."""
        self._buffers[name] = t
        object.__setattr__(self, name, t)

    # ------------------------------------------------------------------ calling
    def initialize(self, *inputs) -> None:
        """Create the parameters from the first inputs (override in layers that need it)."""

    def forward(self, *inputs):
        raise NotImplementedError(f"{type(self).__name__}.forward is not implemented")

    def __call__(self, *args, **kwargs):
        if not self._initialized:
            self.initialize(*args)
            self._initialized = True
        if args and isinstance(args[0], Tensor) and (self._params or self._buffers):
            self._follow_device(args[0].device)
        return self.forward(*args, **kwargs)

    def _follow_device(self, dev) -> None:
        """Move this layer's own parameters and buffers to the inputs' device (layers
        created eagerly live on the default device until their first call)."""
        first = next(iter(self._params.values()), None) or next(iter(self._buffers.values()))
        if first.device is dev or first.device == dev:
            return
        for t in list(self._params.values()) + list(self._buffers.values()):
            t.to_device(dev)

    # ------------------------------------------------------------------ traversal
    def sublayers(self) -> OrderedDict[str, Layer]:
        return OrderedDict(self._layers)

    def _walk(self, prefix: str = ""):
        yield prefix, self
        for n, sub in self._layers.items():
            yield from sub._walk(f"{prefix}{n}.")

    def get_params(self) -> OrderedDict[str, Tensor]:
        """``{dotted name: parameter}``; also sets each parameter's ``name``."""
        out = OrderedDict()
        for prefix, lay in self._walk():
            for n, p in lay._params.items():
                key = prefix + n
                if key not in out and all(p is not q for q in out.values()):
                    p.name = key
                    out[key] = p
        return out

    def get_states(self) -> OrderedDict[str, Tensor]:
        """Parameters and buffers (running statistics...)."""
        out = self.get_params()
        for prefix, lay in self._walk():
            for n, b in lay._buffers.items():
                key = prefix + n
                b.name = key
                out[key] = b
        return out

    def set_params(self, parameters: dict) -> None:
        self._set(parameters, self.get_params(), "parameter")

    def set_states(self, states: dict) -> None:
        self._set(states, self.get_states(), "state")

    def _set(self, values: dict, mine: dict, what: str) -> None:
        unknown = [k for k in values if k not in mine]
        if unknown:
            raise InputError(f"unknown {what}(s) {unknown[:5]}; this model has "
                             f"{list(mine)[:10]}{' ...' if len(mine) > 10 else ''}")
        for k, v in values.items():
            t = mine[k]
            arr = v.numpy() if isinstance(v, Tensor) else np.asarray(v)
            if tuple(arr.shape) != tuple(t.shape):
                raise ShapeError(f"{what} {k!r}: expected shape {list(t.shape)}, got "
                                 f"{list(arr.shape)}")
            t.data = t.device.put(arr.astype(t.dtype, copy=True))

    def train(self, mode: bool = True):
        for _, lay in self._walk():
            object.__setattr__(lay, "training", bool(mode))
        return self

    def eval(self):
        return self.train(False)

    def freeze(self) -> Layer:
        """Stop training every parameter of this layer (``requires_grad = False``)."""
        for p in self.get_params().values():
            p.requires_grad = False
        return self

    def unfreeze(self) -> Layer:
        for p in self.get_params().values():
            p.requires_grad = True
        return self

    def register_layers(self, *args) -> None:
        """SINGA's ``register_layers(layer, ...)`` (named ``<Class>_<i>``) or
        ``register_layers(OrderedDict(name=layer))``: add sublayers."""
        if len(args) == 1 and isinstance(args[0], dict):
            items = list(args[0].items())
        else:
            items = [(f"{type(v).__name__}_{i}", v) for i, v in enumerate(args)]
        for name, lay in items:
            if not isinstance(lay, Layer):
                raise InputError(f"register_layers: {name!r} is a {type(lay).__name__}, not a "
                                 f"Layer")
            setattr(self, name, lay)

    def dtype_check(self, *inputs) -> None:
        """SINGA's check that the inputs share one dtype; here a mismatch is an error naming
        them (SINGA casts them silently)."""
        dts = [t.dtype for t in inputs if isinstance(t, Tensor)]
        if len(set(dts)) > 1:
            raise InputError(f"{type(self).__name__}: inputs have different dtypes "
                             f"{[str(d) for d in dts]}; cast them with Tensor.as_type")

    def device_check(self, *inputs) -> None:
        devs = {t.device for t in inputs if isinstance(t, Tensor)}
        if len(devs) > 1:
            from workbench.errors import DeviceError
            where = ", ".join(f"input {i}{f' ({t.name!r})' if t.name else ''} on {t.device}"
                              for i, t in enumerate(inputs) if isinstance(t, Tensor))
            raise DeviceError(f"{type(self).__name__}: inputs live on different devices "
                              f"({where}); move them to one device with Tensor.to_device")

    def __repr__(self) -> str:
        subs = ", ".join(f"{n}={type(s).__name__}" for n, s in self._layers.items())
        return f"{type(self).__name__}({subs})"


# --------------------------------------------------------------------------- dense
class Linear(Layer):
    """``y = x W + b`` with ``W`` of shape (in, out) (SINGA's layout). ``Linear(out)`` or
    ``Linear(in, out)``. Records Gemm for 2-D inputs, MatMul + Add otherwise."""

    def __init__(self, out_features, *args, bias: bool = True, **kwargs):
        super().__init__()
        self.in_features = None
        if args:
            self.in_features, out_features = int(out_features), int(args[0])
        self.out_features = int(out_features)
        self.bias = bias
        if self.in_features is not None:
            self._create(None, np.dtype(np.float32))
            self._initialized = True

    def _create(self, like, dtype):
        fan_in, fan_out = self.in_features, self.out_features
        std = math.sqrt(2.0 / (fan_in + fan_out))
        self.W = _param(host_rng().normal(0.0, std, (fan_in, fan_out)), like, dtype, "W")
        if self.bias:
            self.b = _param(np.zeros(fan_out), like, dtype, "b")

    def initialize(self, x):
        if self.in_features is None:
            self.in_features = int(x.shape[-1])
            self._create(x, _float_dtype(x))

    def forward(self, x):
        if x.shape[-1] != self.in_features:
            raise ShapeError(f"Linear: expects inputs with {self.in_features} features in the "
                             f"last dimension, got shape {list(x.shape)}")
        if x.ndim() == 2:
            return autograd.apply("Gemm", [x, self.W, self.b if self.bias else None])
        y = autograd.matmul(x, self.W)
        return autograd.add(y, self.b) if self.bias else y


class Gemm(Layer):
    """SINGA's Gemm layer: ``alpha * A' B' + beta * C`` with a trainable B (and C)."""

    #: the ONNX ops SINGA's backend imports as this layer
    onnx_ops = ("Gemm",)

    def __init__(self, nb_kernels, alpha=1.0, beta=1.0, transA=False, transB=True,  # noqa: N803
                 bias=True, bias_shape=None):
        super().__init__()
        self.nb_kernels, self.alpha, self.beta = int(nb_kernels), alpha, beta
        self.transA, self.transB, self.bias, self.bias_shape = int(transA), int(transB), bias, \
            bias_shape

    def initialize(self, x):
        k = x.shape[0] if self.transA else x.shape[1]
        shape = (self.nb_kernels, k) if self.transB else (k, self.nb_kernels)
        std = math.sqrt(2.0 / (k + self.nb_kernels))
        dt = _float_dtype(x)
        self.W = _param(host_rng().normal(0, std, shape), x, dt, "W")
        if self.bias:
            self.b = _param(np.zeros(self.bias_shape or (1, self.nb_kernels)), x, dt, "b")

    def forward(self, x):
        return autograd.gemm(x, self.W, self.b if self.bias else None, self.alpha, self.beta,
                             self.transA, self.transB)


class Embedding(Layer):
    """Lookup table ``W[ids]`` (a Gather node), ``W`` of shape (input_dim, output_dim)."""

    def __init__(self, input_dim: int, output_dim: int, initializer: str = "gaussian"):
        super().__init__()
        self.input_dim, self.output_dim = int(input_dim), int(output_dim)
        self.W = _param(host_rng().normal(0.0, 1.0, (self.input_dim, self.output_dim)), None,
                        np.float32, "W")

    def forward(self, ids):
        """``W[ids]`` (a Gather node); float ids holding whole numbers are accepted, as in
        SINGA (a Cast node first)."""
        return autograd.embedding(ids, self.W)


# --------------------------------------------------------------------------- convolution
class Conv2d(Layer):
    """2-D convolution. ``Conv2d(out_channels, kernel_size)`` or
    ``Conv2d(in_channels, out_channels, kernel_size)``; ``padding``/``stride``/``dilation`` int
    or pair; ``group``; ``pad_mode`` "NOTSET", "SAME_UPPER", "SAME_LOWER" or "VALID";
    ``activation`` "RELU" appends a ReLU."""

    #: the ONNX ops SINGA's backend imports as this layer
    onnx_ops = ("Conv",)

    def __init__(self, nb_kernels, kernel_size, *args, stride=1, padding=0, dilation=1,
                 group: int = 1, bias: bool = True, pad_mode: str = "NOTSET",
                 activation: str = "NOTSET", **kwargs):
        super().__init__()
        self.in_channels = None
        if args:
            self.in_channels, nb_kernels, kernel_size = int(nb_kernels), kernel_size, args[0]
        self.nb_kernels = int(nb_kernels)
        self.kernel_size = _pair(kernel_size, "kernel_size")
        self.stride = _pair(stride, "stride")
        self.dilation = _pair(dilation, "dilation")
        if isinstance(padding, (int, np.integer)) or len(padding) == 2:
            ph, pw = _pair(padding, "padding")
            self.padding = (ph, pw, ph, pw)
        else:
            self.padding = tuple(int(p) for p in padding)
        self.group = int(group)
        self.bias = bias
        self.pad_mode = pad_mode.upper()
        self.activation = activation.upper()
        if self.nb_kernels % self.group:
            raise InputError(f"Conv2d: {self.nb_kernels} kernels cannot be split into "
                             f"{self.group} groups")
        if self.in_channels is not None:
            self._create(None, np.dtype(np.float32))
            self._initialized = True

    def _create(self, like, dtype):
        if self.in_channels % self.group:
            raise InputError(f"Conv2d: {self.in_channels} input channels cannot be split into "
                             f"{self.group} groups")
        kh, kw = self.kernel_size
        fan_in = self.in_channels // self.group * kh * kw
        shape = (self.nb_kernels, self.in_channels // self.group, kh, kw)
        self.W = _param(host_rng().normal(0.0, math.sqrt(2.0 / fan_in), shape), like, dtype, "W")
        if self.bias:
            self.b = _param(np.zeros(self.nb_kernels), like, dtype, "b")

    def initialize(self, x):
        if self.in_channels is None:
            if x.ndim() != 4:
                raise ShapeError(f"Conv2d: expects NCHW inputs, got shape {list(x.shape)}")
            self.in_channels = int(x.shape[1])
            self._create(x, _float_dtype(x))

    def _pads(self, x):
        key = (tuple(x.shape[2:]), self.kernel_size, self.stride, self.dilation,
               tuple(self.padding), self.pad_mode)
        cached = self.__dict__.get("_pads_for")
        if cached is None or cached[0] != key:
            pb, pe, _, _ = window_geometry("Conv2d", x.shape[2:], self.kernel_size, self.stride,
                                           self.dilation, list(self.padding), self.pad_mode)
            cached = self.__dict__["_pads_for"] = (key, pb + pe)
        return list(cached[1])

    def forward(self, x):
        if x.ndim() != 4 or x.shape[1] != self.in_channels:
            raise ShapeError(f"Conv2d: expects NCHW inputs with {self.in_channels} channels, "
                             f"got shape {list(x.shape)}")
        attrs = {"kernel_shape": list(self.kernel_size), "strides": list(self.stride),
                 "dilations": list(self.dilation), "pads": self._pads(x), "group": self.group}
        y = autograd.apply("Conv", [x, self.W, self.b if self.bias else None], attrs)
        return autograd.relu(y) if self.activation == "RELU" else y


class BatchNorm2d(Layer):
    """Batch normalisation over (N, H, W) per channel. ``BatchNorm2d(momentum=0.9)`` or
    ``BatchNorm2d(num_features, momentum=0.9)``; running statistics update as in ONNX:
    ``running = running * momentum + batch * (1 - momentum)``."""

    #: the ONNX ops SINGA's backend imports as this layer
    onnx_ops = ("BatchNormalization",)

    def __init__(self, *args, momentum: float = 0.9, epsilon: float = 1e-5):
        super().__init__()
        self.momentum, self.epsilon = float(momentum), float(epsilon)
        self.channels = int(args[0]) if args else None
        if self.channels is not None:
            self._create(None, np.dtype(np.float32))
            self._initialized = True

    def _create(self, like, dtype):
        c = self.channels
        self.scale = _param(np.ones(c), like, dtype, "scale")
        self.bias = _param(np.zeros(c), like, dtype, "bias")
        self.register_buffer("running_mean", _buffer(np.zeros(c), like, dtype, "running_mean"))
        self.register_buffer("running_var", _buffer(np.ones(c), like, dtype, "running_var"))

    def initialize(self, x):
        if self.channels is None:
            self.channels = int(x.shape[1])
            self._create(x, _float_dtype(x))

    def forward(self, x):
        if x.shape[1] != self.channels:
            raise ShapeError(f"BatchNorm2d: expects {self.channels} channels, got shape "
                             f"{list(x.shape)}")
        return autograd.batch_norm(x, self.scale, self.bias, self.running_mean,
                                   self.running_var, momentum=self.momentum,
                                   epsilon=self.epsilon, training=self.training)


class LayerNorm(Layer):
    """Layer normalisation over the last dimensions (LayerNormalization, opset 17)."""

    def __init__(self, normalized_shape=None, eps: float = 1e-5):
        super().__init__()
        if isinstance(normalized_shape, (int, np.integer)):
            normalized_shape = (int(normalized_shape),)
        self.normalized_shape = None if normalized_shape is None else tuple(normalized_shape)
        self.eps = float(eps)
        if self.normalized_shape is not None:
            self._create(None, np.dtype(np.float32))
            self._initialized = True

    def _create(self, like, dtype):
        self.scale = _param(np.ones(self.normalized_shape), like, dtype, "scale")
        self.bias = _param(np.zeros(self.normalized_shape), like, dtype, "bias")

    def initialize(self, x):
        if self.normalized_shape is None:
            self.normalized_shape = (int(x.shape[-1]),)
            self._create(x, _float_dtype(x))

    def forward(self, x):
        return autograd.layer_norm(x, self.scale, self.bias, -len(self.normalized_shape),
                                   self.eps)


# --------------------------------------------------------------------------- pooling
class Pooling2d(Layer):
    """Max or average pooling (MaxPool / AveragePool)."""

    #: the ONNX ops SINGA's backend imports as this layer
    onnx_ops = ("MaxPool", "AveragePool")

    def __init__(self, kernel_size, stride=None, padding=0, is_max: bool = True,
                 pad_mode: str = "NOTSET", ceil_mode: bool = False,
                 count_include_pad: bool = False):
        super().__init__()
        self.kernel_size = _pair(kernel_size, "kernel_size")
        self.stride = self.kernel_size if stride is None else _pair(stride, "stride")
        ph, pw = _pair(padding, "padding")
        self.padding = [ph, pw, ph, pw]
        self.is_max = is_max
        self.pad_mode = pad_mode.upper()
        self.ceil_mode, self.count_include_pad = int(ceil_mode), int(count_include_pad)

    def forward(self, x):
        attrs = {"kernel_shape": list(self.kernel_size), "strides": list(self.stride)}
        if self.pad_mode in ("NOTSET", ""):
            attrs["pads"] = list(self.padding)
        else:
            attrs["auto_pad"] = self.pad_mode
        if self.ceil_mode:
            attrs["ceil_mode"] = 1
        if self.is_max:
            return autograd.apply("MaxPool", [x], attrs)
        if self.count_include_pad:
            attrs["count_include_pad"] = 1
        return autograd.apply("AveragePool", [x], attrs)


class MaxPool2d(Pooling2d):
    def __init__(self, kernel_size, stride=None, padding=0, pad_mode: str = "NOTSET", **kw):
        super().__init__(kernel_size, stride, padding, True, pad_mode, **kw)


class AvgPool2d(Pooling2d):
    def __init__(self, kernel_size, stride=None, padding=0, pad_mode: str = "NOTSET", **kw):
        super().__init__(kernel_size, stride, padding, False, pad_mode, **kw)


class MaxPool1d(Pooling2d):
    """SINGA's 1-d max pooling: a (1, kernel_size) window over (N, C, 1, W) inputs."""

    def __init__(self, kernel_size, stride=None, padding=0, pad_mode: str = "NOTSET"):
        stride = kernel_size if stride is None else stride
        super().__init__((1, kernel_size), (1, stride), (0, padding), True, pad_mode)


class AvgPool1d(Pooling2d):
    """SINGA's 1-d average pooling: a (1, kernel_size) window over (N, C, 1, W) inputs."""

    def __init__(self, kernel_size, stride=None, padding=0, pad_mode: str = "NOTSET"):
        stride = kernel_size if stride is None else stride
        super().__init__((1, kernel_size), (1, stride), (0, padding), False, pad_mode)


class GlobalAvgPool2d(Layer):
    def forward(self, x):
        return autograd.apply("GlobalAveragePool", [x])


# --------------------------------------------------------------------------- element-wise
class _Fn(Layer):
    fn = None

    def forward(self, x):
        return type(self).fn(x)


class ReLU(_Fn):
    fn = staticmethod(autograd.relu)


class Sigmoid(_Fn):
    fn = staticmethod(autograd.sigmoid)


class Tanh(_Fn):
    fn = staticmethod(autograd.tanh)


class Identity(_Fn):
    fn = staticmethod(autograd.identity)


class Gelu(Layer):
    def __init__(self, approximate: str = "none"):
        super().__init__()
        self.approximate = approximate

    def forward(self, x):
        return autograd.gelu(x, self.approximate)


class LeakyReLU(Layer):
    def __init__(self, a: float = 0.01):
        super().__init__()
        self.a = a

    def forward(self, x):
        return autograd.leakyrelu(x, self.a)


class SoftMax(Layer):
    def __init__(self, axis: int = 1):
        super().__init__()
        self.axis = axis

    def forward(self, x):
        return autograd.softmax(x, self.axis)


Softmax = SoftMax


class LogSoftmax(SoftMax):
    def forward(self, x):
        return autograd.log_softmax(x, self.axis)


class Dropout(Layer):
    """Inverted dropout in training, identity in eval."""

    def __init__(self, ratio: float = 0.5):
        super().__init__()
        if not 0.0 <= ratio < 1.0:
            raise InputError(f"Dropout: ratio must be in [0, 1), got {ratio}")
        self.ratio = float(ratio)

    def forward(self, x):
        return autograd.dropout(x, ratio=self.ratio, training=self.training)


class Flatten(Layer):
    def __init__(self, axis: int = 1):
        super().__init__()
        self.axis = axis

    def forward(self, x):
        return autograd.flatten(x, self.axis)


class Reshape(Layer):
    def forward(self, x, shape):
        return autograd.reshape(x, shape)


class Cat(Layer):
    def __init__(self, axis: int = 0):
        super().__init__()
        self.axis = axis

    def forward(self, xs):
        return autograd.cat(xs, self.axis)


class Add(Layer):
    def forward(self, a, b):
        return autograd.add(a, b)


class Sequential(Layer):
    """Layers applied one after the other: ``Sequential(Conv2d(8, 3), ReLU(), ...)``."""

    def __init__(self, *layers):
        super().__init__()
        for i, lay in enumerate(layers):
            setattr(self, str(i), lay)

    def forward(self, x):
        for lay in self._layers.values():
            x = lay(x)
        return x

    def __len__(self) -> int:
        return len(self._layers)

    def __getitem__(self, i) -> Layer:
        return list(self._layers.values())[i]


# --------------------------------------------------------------------------- losses
class SoftMaxCrossEntropy(Layer):
    def forward(self, x, t):
        return autograd.softmax_cross_entropy(x, t)


class MeanSquareError(Layer):
    def forward(self, x, t):
        return autograd.mse_loss(x, t)


class CrossEntropy(Layer):
    def forward(self, x, t):
        return autograd.cross_entropy(x, t)


class BinaryCrossEntropy(Layer):
    def forward(self, x, t):
        return autograd.binary_cross_entropy(x, t)


# --------------------------------------------------------------------------- SINGA's extra layers
class SeparableConv2d(Layer):
    """A depthwise convolution (one ``kernel_size`` filter per input channel, ``group`` = the
    input channels) followed by a 1x1 pointwise one to ``nb_kernels`` channels (SINGA's
    ``SeparableConv2d(nb_kernels, kernel_size, stride=1, padding=0, bias=False)``; the
    sublayers are ``depthwise_conv`` and ``point_conv``)."""

    def __init__(self, nb_kernels, kernel_size, *args, stride=1, padding=0, bias=False):
        super().__init__()
        if len(args) > 0:  # SINGA's older (in_channels, out_channels, kernel_size) form
            nb_kernels, kernel_size = kernel_size, args[0]
        if len(args) > 1:
            stride = args[1]
        if len(args) > 2:
            padding = args[2]
        self.nb_kernels, self.kernel_size = int(nb_kernels), kernel_size
        self.stride, self.padding, self.bias = stride, padding, bias

    def initialize(self, x):
        if x.ndim() != 4:
            raise ShapeError(f"SeparableConv2d: expects NCHW inputs, got shape {list(x.shape)}")
        c = int(x.shape[1])
        self.in_channels = c
        self.depthwise_conv = Conv2d(c, self.kernel_size, stride=self.stride,
                                     padding=self.padding, group=c, bias=self.bias)
        self.point_conv = Conv2d(self.nb_kernels, 1, bias=self.bias)

    def forward(self, x):
        return self.point_conv(self.depthwise_conv(x))


def _gaussian_param(shape, like, std, name):
    return _param(host_rng().normal(0.0, std, shape), like, _float_dtype(like), name)


def _zeros_param(shape, like, name):
    return _param(np.zeros(shape), like, _float_dtype(like), name)


class RNN_Base(Layer):  # noqa: N801 - SINGA's name
    """SINGA's base class of :class:`RNN` and :class:`LSTM` (``step_forward``)."""

    def step_forward(self, *args, **kwargs):
        raise NotImplementedError(f"{type(self).__name__}.step_forward is not implemented")


class RNN(RNN_Base):
    """SINGA's vanilla RNN, unrolled over a list of time steps:
    ``hs, h = RNN(input_size, hidden_size)(xs, h0)`` with ``xs`` a list of (batch, input)
    Tensors; ``h_t = tanh(x_t Wx + h_{t-1} Wh + b)`` (``nonlinearity="relu"``: relu). Each
    step records MatMul/Add/Tanh nodes, so it trains and exports like any layer. SINGA
    accepts and ignores ``num_layers``, ``batch_first``, ``dropout`` and ``bidirectional``
    here; so does this class (``CudnnRNN`` has them)."""

    def __init__(self, input_size, hidden_size, num_layers=1, nonlinearity="tanh", bias=True,
                 batch_first=False, dropout=0, bidirectional=False):
        super().__init__()
        if nonlinearity not in ("tanh", "relu"):
            raise InputError(f"RNN: nonlinearity must be 'tanh' or 'relu', got "
                             f"{nonlinearity!r}")
        self.input_size, self.hidden_size = int(input_size), int(hidden_size)
        self.num_layers, self.nonlinearity, self.bias = num_layers, nonlinearity, bias
        self.batch_first, self.dropout, self.bidirectional = batch_first, dropout, bidirectional

    def initialize(self, xs, h0):
        like = xs[0]
        self.Wx = _gaussian_param((self.input_size, self.hidden_size), like, 1.0, "Wx")
        self.Wh = _gaussian_param((self.hidden_size, self.hidden_size), like, 1.0, "Wh")
        self.b = _zeros_param((self.hidden_size,), like, "b")

    def forward(self, xs, h0):
        xs = list(xs)
        if not xs:
            raise InputError("RNN: needs at least one time step")
        self.device_check(*xs, h0)
        n = xs[0].shape[0]
        out, h = [], h0
        for t, x in enumerate(xs):
            if x.ndim() != 2 or x.shape != (n, self.input_size):
                raise ShapeError(f"RNN: step {t} has shape {list(x.shape)}, expected "
                                 f"[{n}, {self.input_size}]")
            h = self.step_forward(x, h, self.Wx, self.Wh, self.b)
            out.append(h)
        return out, h

    def step_forward(self, x, h, Wx, Wh, b):  # noqa: N803 - SINGA's names
        y = autograd.add(autograd.matmul(h, Wh), autograd.matmul(x, Wx))
        y = autograd.add_bias(y, b, axis=0)
        return autograd.tanh(y) if self.nonlinearity == "tanh" else autograd.relu(y)


class LSTM(RNN_Base):
    """SINGA's LSTM, unrolled over a list of time steps:
    ``hs, h, c = LSTM(input_size, hidden_size)(xs, (h0, c0))``. Gates i, f, o (sigmoid) and
    g (tanh) each have ``Wx_*`` (input, hidden), ``Wh_*`` (hidden, hidden), ``Bx_*`` and
    ``Bh_*``; ``c_t = f c_{t-1} + i g``, ``h_t = o tanh(c_t)``."""

    _GATES = ("i", "f", "o", "g")

    def __init__(self, input_size, hidden_size, nonlinearity="tanh", num_layers=1, bias=True,
                 batch_first=False, dropout=0, bidirectional=False):
        super().__init__()
        self.input_size, self.hidden_size = int(input_size), int(hidden_size)
        self.nonlinearity, self.num_layers, self.bias = nonlinearity, num_layers, bias
        self.batch_first, self.dropout, self.bidirectional = batch_first, dropout, bidirectional

    def initialize(self, xs, h0_c0):
        like = xs[0]
        for g in self._GATES:
            setattr(self, f"Wx_{g}", _gaussian_param((self.input_size, self.hidden_size),
                                                     like, 0.01, f"Wx_{g}"))
            setattr(self, f"Wh_{g}", _gaussian_param((self.hidden_size, self.hidden_size),
                                                     like, 0.01, f"Wh_{g}"))
        for g in self._GATES:
            setattr(self, f"Bx_{g}", _zeros_param((self.hidden_size,), like, f"Bx_{g}"))
            setattr(self, f"Bh_{g}", _zeros_param((self.hidden_size,), like, f"Bh_{g}"))

    def forward(self, xs, h0_c0):
        h, c = h0_c0
        xs = list(xs)
        if not xs:
            raise InputError("LSTM: needs at least one time step")
        self.device_check(*xs, h, c)
        n = xs[0].shape[0]
        out = []
        for t, x in enumerate(xs):
            if x.ndim() != 2 or x.shape != (n, self.input_size):
                raise ShapeError(f"LSTM: step {t} has shape {list(x.shape)}, expected "
                                 f"[{n}, {self.input_size}]")
            h, c = self.step_forward(x, h, c)
            out.append(h)
        return out, h, c

    def _gate(self, x, h, g):
        y1 = autograd.add_bias(autograd.matmul(x, getattr(self, f"Wx_{g}")),
                               getattr(self, f"Bx_{g}"), axis=0)
        y2 = autograd.add_bias(autograd.matmul(h, getattr(self, f"Wh_{g}")),
                               getattr(self, f"Bh_{g}"), axis=0)
        return autograd.add(y1, y2)

    def step_forward(self, x, h, c):
        i = autograd.sigmoid(self._gate(x, h, "i"))
        f = autograd.sigmoid(self._gate(x, h, "f"))
        o = autograd.sigmoid(self._gate(x, h, "o"))
        g = autograd.tanh(self._gate(x, h, "g"))
        c = autograd.add(autograd.mul(f, c), autograd.mul(i, g))
        h = autograd.mul(o, autograd.tanh(c))
        return h, c


class CudnnRNN(Layer):
    """SINGA's ``CudnnRNN(hidden_size, activation="tanh", num_layers=1, bias=True,
    batch_first=True, dropout=0, bidirectional=False, rnn_mode="lstm", use_mask=False,
    return_sequences=True)``: a whole-sequence RNN on a (seq, batch, feature) Tensor
    ((batch, seq, feature) with ``batch_first``). ``rnn_mode``: "vanilla"/"tanh", "relu",
    "lstm" or "gru" (PyTorch/cuDNN gate equations). Returns (seq, batch, dirs * hidden) with
    ``return_sequences``, else the last step (batch, dirs * hidden).

    Not cuDNN: every step records MatMul/Add/activation nodes on any device, so it trains
    and exports like the other layers. Differences from SINGA: the weights are one
    (input, gates*hidden) / (hidden, gates*hidden) / (gates*hidden,) triple per layer and
    direction (``W_l{k}_d{d}`` ...) instead of cuDNN's single flat ``W``; ``dropout`` between
    layers follows ``layer.training``; ``use_mask``/``seq_lengths`` are refused."""

    _NGATES = {"vanilla": 1, "tanh": 1, "relu": 1, "lstm": 4, "gru": 3}

    def __init__(self, hidden_size, activation="tanh", num_layers=1, bias=True,
                 batch_first=True, dropout=0, bidirectional=False, rnn_mode="lstm",
                 use_mask=False, return_sequences=True):
        super().__init__()
        if rnn_mode not in self._NGATES:
            raise InputError(f"CudnnRNN: rnn_mode must be one of {list(self._NGATES)}, got "
                             f"{rnn_mode!r}")
        if int(num_layers) < 1:
            raise InputError(f"CudnnRNN: num_layers must be >= 1, got {num_layers}")
        if not 0 <= dropout < 1:
            raise InputError(f"CudnnRNN: dropout must be in [0, 1), got {dropout}")
        if use_mask:
            raise InputError("CudnnRNN: use_mask/seq_lengths (cuDNN's padded sequences) are "
                             "not supported; pad and mask the loss instead")
        self.hidden_size, self.activation = int(hidden_size), activation
        self.num_layers, self.bias, self.batch_first = int(num_layers), bias, batch_first
        self.dropout, self.bidirectional = float(dropout), bool(bidirectional)
        self.rnn_mode, self.return_sequences = rnn_mode, return_sequences

    def initialize(self, x, hx=None, cx=None, seq_lengths=None):
        if x.ndim() != 3:
            raise ShapeError(f"CudnnRNN: expects a 3-d input, got shape {list(x.shape)}")
        self.input_size = int(x.shape[2])  # features are last either way
        k = 1.0 / self.hidden_size
        gh = self._NGATES[self.rnn_mode] * self.hidden_size
        dt = _float_dtype(x)
        dirs = 2 if self.bidirectional else 1
        for layer_i in range(self.num_layers):
            fan_in = self.input_size if layer_i == 0 else self.hidden_size * dirs
            for d in range(dirs):
                tag = f"l{layer_i}_d{d}"
                for nm, shape in ((f"Wx_{tag}", (fan_in, gh)),
                                  (f"Wh_{tag}", (self.hidden_size, gh)),
                                  (f"Bx_{tag}", (gh,)), (f"Bh_{tag}", (gh,))):
                    if nm.startswith("B") and not self.bias:
                        continue
                    a = host_rng().uniform(-math.sqrt(k), math.sqrt(k), shape)
                    setattr(self, nm, _param(a, x, dt, nm))

    def _step(self, x, h, c, tag):
        hs = self.hidden_size
        gx = autograd.matmul(x, getattr(self, f"Wx_{tag}"))
        gh = autograd.matmul(h, getattr(self, f"Wh_{tag}"))
        if self.bias:
            gx = autograd.add(gx, getattr(self, f"Bx_{tag}"))
            gh = autograd.add(gh, getattr(self, f"Bh_{tag}"))
        mode = self.rnn_mode
        if mode in ("vanilla", "tanh", "relu"):
            y = autograd.add(gx, gh)
            return (autograd.relu(y) if mode == "relu" else autograd.tanh(y)), c
        if mode == "lstm":
            y = autograd.add(gx, gh)
            i, f, g, o = autograd.split(y, 1, [hs] * 4)
            i, f, o = autograd.sigmoid(i), autograd.sigmoid(f), autograd.sigmoid(o)
            c = autograd.add(autograd.mul(f, c), autograd.mul(i, autograd.tanh(g)))
            return autograd.mul(o, autograd.tanh(c)), c
        rx, zx, nx = autograd.split(gx, 1, [hs] * 3)  # gru
        rh, zh, nh = autograd.split(gh, 1, [hs] * 3)
        r = autograd.sigmoid(autograd.add(rx, rh))
        z = autograd.sigmoid(autograd.add(zx, zh))
        n = autograd.tanh(autograd.add(nx, autograd.mul(r, nh)))
        return autograd.add(autograd.mul(autograd.sub(1.0, z), n), autograd.mul(z, h)), c

    def forward(self, x, hx=None, cx=None, seq_lengths=None):
        if seq_lengths is not None:
            raise InputError("CudnnRNN: seq_lengths (cuDNN's padded sequences) are not "
                             "supported")
        if self.batch_first:
            x = autograd.transpose(x, (1, 0, 2))
        seq, n = x.shape[0], x.shape[1]
        dirs = 2 if self.bidirectional else 1
        zeros = np.zeros((self.num_layers * dirs, n, self.hidden_size), dtype=x.dtype)
        hx = hx if hx is not None else Tensor(device=x.device, data=zeros)
        cx = cx if cx is not None else Tensor(device=x.device, data=zeros)
        steps = [autograd.squeeze(s, [0]) for s in autograd.split(x, 0, [1] * seq)] \
            if seq > 1 else [autograd.squeeze(x, [0])]
        for layer_i in range(self.num_layers):
            outs = []
            for d in range(dirs):
                k = layer_i * dirs + d
                h = autograd.squeeze(hx[k], [0])
                c = autograd.squeeze(cx[k], [0])
                seq_out = [None] * seq
                order = range(seq) if d == 0 else range(seq - 1, -1, -1)
                for t in order:
                    h, c = self._step(steps[t], h, c, f"l{layer_i}_d{d}")
                    seq_out[t] = h
                outs.append(seq_out)
            steps = [autograd.cat([o[t] for o in outs], 1) if dirs > 1 else outs[0][t]
                     for t in range(seq)]
            if self.dropout and self.training and layer_i < self.num_layers - 1:
                steps = [autograd.dropout(s, ratio=self.dropout, training=True) for s in steps]
        if not self.return_sequences:
            return steps[-1]
        y = autograd.cat([autograd.unsqueeze(s, [0]) for s in steps], 0)
        return autograd.transpose(y, (1, 0, 2)) if self.batch_first else y
