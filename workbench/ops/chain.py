"""``com.workbench::ScalarChain``: a chain of Unsqueeze / Cast / Add / Sub / Mul / Div with
one-element constants, run as one step (written by the inference pass
``workbench.graph.passes.fuse_scalar_chains``).

Exported transformers turn their attention mask into an additive bias through such a chain
(``Unsqueeze -> Unsqueeze -> Cast(float) -> Sub(1, .) -> Mul(., -10000)``): five steps on a
few dozen elements, each paying a kernel's Python checks for well under a microsecond of
arithmetic. The fused step runs the same operations in the same order on the same dtypes --
the same numpy ufuncs the elementwise kernels call, and the Cast and Unsqueeze kernels
themselves where a shortcut would not be exact -- so its result is bit for bit the chain's.
"""

from __future__ import annotations

import numpy as np

from workbench.errors import InputError
from workbench.ops._common import quiet
from workbench.ops.cast import cast
from workbench.ops.elementwise import add, div, mul, sub
from workbench.ops.registry import FUSED_DOMAIN, kernel
from workbench.ops.shape import _unsqueeze

#: the arithmetic a chain may hold: (the engine's kernel, the numpy ufunc it calls on floats)
_ARITH = {"Add": (add, np.add), "Sub": (sub, np.subtract), "Mul": (mul, np.multiply),
          "Div": (div, np.true_divide)}
CHAIN_OPS = frozenset(_ARITH) | {"Unsqueeze", "Cast"}

_SHAPES_KEPT = 16   # input shapes whose Unsqueeze results a node remembers


@kernel("ScalarChain", since=1, domain=FUSED_DOMAIN, category="math", wants_ctx=True,
        host_read_inputs=())
def scalar_chain(x, *params, ops=(), swap=(), cast_to=(), ctx=None):
    """Apply ``ops`` in order to ``x``. ``params[i]`` is op ``i``'s other input: the axes of an
    Unsqueeze, the one-element constant of an arithmetic op (the left operand when
    ``swap[i]`` is 1, e.g. ``Sub(1, x)``), None for a Cast (to ``cast_to[i]``). Float numpy
    arrays take the ufunc straight (what the elementwise kernels call for them); anything
    else (integers: ONNX's truncating Div; cupy arrays) goes through the kernels themselves.
    The Unsqueeze results' shapes are remembered per input shape (the axes are constants)."""
    n = len(ops)
    if len(params) != n or len(swap) != n or len(cast_to) != n:
        raise InputError(f"ScalarChain: {n} ops need {n} params, swap and cast_to entries, got "
                         f"{len(params)}, {len(swap)}, {len(cast_to)}")
    memo = None if ctx is None else ctx.extra.setdefault("chain_shapes", {})
    y = x
    for i in range(n):
        op = ops[i]
        if op == "Unsqueeze":
            key = (i, y.shape)
            shape = None if memo is None else memo.get(key)
            if shape is None:
                y = _unsqueeze(y, params[i])
                if memo is not None:
                    if len(memo) >= _SHAPES_KEPT:
                        memo.clear()
                    memo[key] = y.shape
            else:
                y = y.reshape(shape)
        elif op == "Cast":
            y = cast(y, to=int(cast_to[i]))
        else:
            entry = _ARITH.get(op)
            if entry is None:
                raise InputError(f"ScalarChain: unknown op {op!r} (known: "
                                 f"{', '.join(sorted(CHAIN_OPS))})")
            c = params[i]
            a, b = (c, y) if swap[i] else (y, c)
            if type(y) is np.ndarray and type(c) is np.ndarray and y.dtype.kind == "f" \
                    and c.dtype == y.dtype:
                if op == "Div":
                    with quiet():   # as the Div kernel
                        y = entry[1](a, b)
                else:
                    y = entry[1](a, b)
                if type(y) is not np.ndarray:   # 0-d operands give a numpy scalar
                    y = np.asarray(y)
            else:
                y = entry[0](a, b)
    return y
