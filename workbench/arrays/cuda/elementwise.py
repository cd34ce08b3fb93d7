"""CUDA elementwise kernels (cupy ``ElementwiseKernel``): GELU (exact and tanh), Erf, and
:func:`fuse_elementwise`, which turns a chain of unary/binary ops into one kernel (one pass over
memory instead of one per op) for an inference fusion pass.

Every operation computes in float32 on a local ``float v`` and stores in the output type, so the
same text serves float32 and float16 (``(float)`` and ``(T)`` conversions exist for both cupy's
``float16`` and CUDA's ``__half``). :func:`check_source` wraps an operation into a plain CUDA
kernel so that ``nvcc`` can compile-check it without cupy or a GPU.
"""

from __future__ import annotations

import numpy as np

from workbench.arrays import cupy_module

FAMILY = "elementwise"

# name -> (in_params, out_params, operation)
KERNELS = {
    "gelu": ("T x", "T y",
             "float v = (float)x; y = (T)(0.5f * v * (1.0f + erff(v * 0.70710678118654752f)));"),
    "gelu_tanh": ("T x", "T y",
                  "float v = (float)x; "
                  "y = (T)(0.5f * v * (1.0f + tanhf(0.7978845608028654f * "
                  "(v + 0.044715f * v * v * v))));"),
    "erf": ("T x", "T y", "y = (T)erff((float)x);"),
}

_COMPILED: dict = {}

# fused optimizer steps (one kernel per parameter instead of 4-6): float math, T storage
SGD_STEP = ("T g, float32 lr, float32 mom, float32 damp, float32 wd, int32 nesterov, "
            "int32 first, int32 use_mom", "T w, T buf",
            "float gv = (float)g + wd * (float)w;"
            "if (use_mom) {"
            "  float b = first ? gv : (float)buf * mom + gv * (1.f - damp);"
            "  buf = (T)b;"
            "  gv = nesterov ? gv + b * mom : b;"
            "}"
            "w = (T)((float)w - lr * gv);")


def sgd_step(w, g, buf, *, lr, momentum, dampening, weight_decay, nesterov, first):
    """SGD (momentum, dampening, Nesterov, L2 weight decay) on cupy arrays in one kernel:
    updates ``w`` and the momentum buffer ``buf`` (None without momentum) in place."""
    k = _COMPILED.get("sgd_step")
    if k is None:
        cp = cupy_module()
        k = _COMPILED["sgd_step"] = cp.ElementwiseKernel(*SGD_STEP, "wb_sgd_step")
    use = buf is not None and momentum != 0
    k(g, np.float32(lr), np.float32(momentum), np.float32(dampening if not first else 0.0),
      np.float32(weight_decay), np.int32(bool(nesterov)), np.int32(bool(first)),
      np.int32(use), w, buf if use else w)


def _kernel(name):
    k = _COMPILED.get(name)
    if k is None:
        cp = cupy_module()
        ins, outs, op = KERNELS[name]
        k = cp.ElementwiseKernel(ins, outs, op, f"wb_{name}")
        _COMPILED[name] = k
    return k


def gelu(x, approximate="none"):
    return _kernel("gelu_tanh" if approximate == "tanh" else "gelu")(x)


def erf(x):
    return _kernel("erf")(x)


# ----------------------------------------------------------------------------- fusion
# unary ops on the running value v (float); attrs are formatted in
_UNARY = {
    "Identity": "",
    "Relu": "v = fmaxf(v, 0.f);",
    "LeakyRelu": "v = v >= 0.f ? v : v * {alpha}f;",
    "Sigmoid": "v = 1.f / (1.f + expf(-v));",
    "HardSigmoid": "v = fminf(fmaxf(v * {alpha}f + {beta}f, 0.f), 1.f);",
    "Tanh": "v = tanhf(v);",
    "Exp": "v = expf(v);",
    "Log": "v = logf(v);",
    "Neg": "v = -v;",
    "Abs": "v = fabsf(v);",
    "Sqrt": "v = sqrtf(v);",
    "Reciprocal": "v = 1.f / v;",
    "Erf": "v = erff(v);",
    "Gelu": "v = 0.5f * v * (1.f + erff(v * 0.70710678118654752f));",
    "Softplus": "v = v > 20.f ? v : log1pf(expf(v));",
    "Silu": "v = v / (1.f + expf(-v));",
    "Clip": "v = fminf(fmaxf(v, {min}f), {max}f);",
}
_UNARY_DEFAULTS = {"LeakyRelu": {"alpha": 0.01}, "HardSigmoid": {"alpha": 0.2, "beta": 0.5},
                   "Clip": {"min": -3.4028234663852886e38, "max": 3.4028234663852886e38}}
# binary ops of v and input a{k}; "R" forms put the input first
_BINARY = {
    "Add": "v = v + {a};", "Sub": "v = v - {a};", "Mul": "v = v * {a};",
    "Div": "v = v / {a};", "Pow": "v = powf(v, {a});", "Max": "v = fmaxf(v, {a});",
    "Min": "v = fminf(v, {a});", "RSub": "v = {a} - v;", "RDiv": "v = {a} / v;",
}


class FusedElementwise:
    """One ElementwiseKernel for a chain; call it with the chain's inputs (broadcasting)."""

    def __init__(self, chain, n_inputs, body, name):
        self.chain = chain
        self.n_inputs = n_inputs
        self.body = body
        self.name = name
        # cupy's type placeholders are single capital letters: input k has type A, B, C, ...
        self.in_params = ", ".join(f"{_placeholder(k)} x{k}" for k in range(n_inputs))
        self.out_params = "A y"
        self.operation = f"float v = (float)x0; {body} y = (A)v;"
        self._k = None

    def __call__(self, *inputs):
        if len(inputs) != self.n_inputs:
            raise TypeError(f"{self.name} takes {self.n_inputs} input(s), got {len(inputs)}")
        if self._k is None:
            cp = cupy_module()
            self._k = cp.ElementwiseKernel(self.in_params, self.out_params, self.operation,
                                           self.name)
        return self._k(*inputs)

    def check_source(self, dtype="float32") -> str:
        """A plain CUDA kernel with the same operation (all inputs ``dtype``) for nvcc."""
        ins = ", ".join(f"T x{k}" for k in range(self.n_inputs))
        return check_source(ins, "T y", self.operation.replace("(A)", "(T)"), dtype, self.name)


def _placeholder(k: int) -> str:
    if not 0 <= k < 26:
        raise ValueError(f"fuse_elementwise: at most 26 inputs, got input index {k}")
    return chr(ord("A") + k)


def fuse_elementwise(chain, name: str | None = None) -> FusedElementwise:
    """Build one kernel from ``chain``: a list of steps applied to the running value, which
    starts as input 0. A step is an op name (``"Relu"``), ``(op, attrs_dict)`` for a unary op
    with attributes (``("LeakyRelu", {"alpha": 0.1})``), or ``(op, k)`` for a binary op with
    input ``k`` (``("Add", 1)`` adds the kernel's second input; ``"RSub"``/``"RDiv"`` put the
    input first). Example: ``fuse_elementwise([("Add", 1), "Relu"])(x, bias)``."""
    lines = []
    n_inputs = 1
    for step in chain:
        if isinstance(step, str):
            op, arg = step, None
        else:
            op, arg = step[0], (step[1] if len(step) > 1 else None)
        if op in _BINARY:
            if not isinstance(arg, int) or arg < 0:
                raise ValueError(f"fuse_elementwise: binary step {step!r} needs an input index")
            n_inputs = max(n_inputs, arg + 1)
            lines.append(_BINARY[op].format(a=f"(float)x{arg}"))
        elif op in _UNARY:
            attrs = dict(_UNARY_DEFAULTS.get(op, {}))
            attrs.update(arg or {})
            lines.append(_UNARY[op].format(**{k: repr(float(v)) for k, v in attrs.items()}))
        else:
            raise ValueError(f"fuse_elementwise: unsupported op {op!r}; supported: "
                             f"{sorted(_UNARY) + sorted(_BINARY)}")
    body = " ".join(lines)
    name = name or "wb_fused_" + "_".join(
        (s if isinstance(s, str) else s[0]).lower() for s in chain)
    return FusedElementwise(list(chain), n_inputs, body, name)


def check_source(in_params: str, out_params: str, operation: str, dtype: str,
                 name: str) -> str:
    """Wrap an ElementwiseKernel operation into a plain ``extern "C"`` CUDA kernel (contiguous
    arrays, no broadcasting) so nvcc can compile-check it; ``T`` is ``dtype``."""
    from workbench.arrays.cuda._base import full_source  # noqa: PLC0415
    params = [p.strip().split() for p in (in_params + ", " + out_params).split(",") if p.strip()]
    ins = [n for _, n in params[:-1]]
    outs = [params[-1][1]]
    sig = ", ".join([f"const T* __restrict__ {n}_p" for n in ins] +
                    [f"T* __restrict__ {n}_p" for n in outs] + ["long long n"])
    loads = " ".join(f"T {n} = {n}_p[i];" for n in ins)
    body = (f'extern "C" __global__ void {name}({sig}) {{\n'
            f"  for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n;\n"
            f"       i += (long long)blockDim.x * gridDim.x) {{\n"
            f"    {loads} T {outs[0]};\n    {operation}\n    {outs[0]}_p[i] = {outs[0]};\n"
            f"  }}\n}}\n")
    return full_source(body, np.dtype(dtype).name)


def sources(dtype="float32") -> dict:
    """{name: compilable CUDA source} of every fixed kernel of this family, plus a sample fused
    chain covering every fusable op (for the nvcc compile check)."""
    out = {name: check_source(i, o, op, dtype, f"wb_{name}")
           for name, (i, o, op) in KERNELS.items()}
    chain = [("Add", 1), ("Mul", 2), ("RSub", 1), ("RDiv", 2)] + [
        (op, {}) for op in _UNARY] + [(b, 1) for b in _BINARY]
    out["fused_all"] = fuse_elementwise(chain, "wb_fused_all").check_source(dtype)
    return out
