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
from workbench.ops.cast import _PLAIN_SOURCES, _PLAIN_TARGETS, cast
from workbench.ops.elementwise import add, div, mul, sub
from workbench.ops.registry import FUSED_DOMAIN, kernel
from workbench.ops.shape import _unsqueeze

#: the arithmetic a chain may hold: (the engine's kernel, the numpy ufunc it calls on floats)
_ARITH = {"Add": (add, np.add), "Sub": (sub, np.subtract), "Mul": (mul, np.multiply),
          "Div": (div, np.true_divide)}
CHAIN_OPS = frozenset(_ARITH) | {"Unsqueeze", "Cast"}



@kernel("ScalarChain", since=1, domain=FUSED_DOMAIN, category="math", wants_ctx=True,
        host_read_inputs=())
def scalar_chain(x, *params, ops=(), swap=(), cast_to=(), ctx=None):
    """Apply ``ops`` in order to ``x``. ``params[i]`` is op ``i``'s other input: the axes of an
    Unsqueeze, the one-element constant of an arithmetic op (the left operand when
    ``swap[i]`` is 1, e.g. ``Sub(1, x)``), None for a Cast (to ``cast_to[i]``). Float numpy
    arrays take the ufunc straight (what the elementwise kernels call for them); anything
    else (integers: ONNX's truncating Div; cupy arrays) goes through the kernels themselves.
    With a node context, a chain whose every op took such a shortcut is remembered as a
    program for this input type, shape and dtype and these constants (consecutive Unsqueezes
    one reshape, a Cast one astype, each arithmetic op one ufunc call) and replayed on the
    next input of the same kind: the same operations on the same dtypes."""
    n = len(ops)
    if len(params) != n or len(swap) != n or len(cast_to) != n:
        raise InputError(f"ScalarChain: {n} ops need {n} params, swap and cast_to entries, got "
                         f"{len(params)}, {len(swap)}, {len(cast_to)}")
    if ctx is None:
        return _chain(x, params, ops, swap, cast_to, None)
    # the replay of the last input's program: the same input type, shape and dtype and the
    # same constant objects (the program holds them, so their ids stay theirs)
    key = (type(x), x.shape, x.dtype, tuple(map(id, params)))
    prog = ctx.extra.get(_PROGRAM)
    if prog is not None and prog[0] == key:
        y = x
        for kind, a, c, left in prog[1]:
            if kind == _RESHAPE:
                y = y.reshape(a)
            elif kind == _ASTYPE:
                y = y.astype(a)
            elif kind == _UFUNC:
                y = a(c, y) if left else a(y, c)
                if type(y) is not np.ndarray:   # 0-d operands give a numpy scalar
                    y = np.asarray(y)
            else:
                with quiet():   # as the Div kernel
                    y = a(c, y) if left else a(y, c)
                if type(y) is not np.ndarray:
                    y = np.asarray(y)
        return y
    steps: list = []
    y = _chain(x, params, ops, swap, cast_to, steps)
    if steps is not None and len(steps) == n:
        program = []
        for st in steps:   # consecutive reshapes are one
            if st[0] == _RESHAPE and program and program[-1][0] == _RESHAPE:
                program[-1] = st
            elif st[0] is not None:
                program.append(st)
        ctx.extra[_PROGRAM] = (key, tuple(program), params)
    else:
        ctx.extra.pop(_PROGRAM, None)
    return y


#: the kinds of a program's steps (``scalar_chain``'s replay)
_RESHAPE, _ASTYPE, _UFUNC, _UFUNC_QUIET = 0, 1, 2, 3
_PROGRAM = "scalar_chain_program"


def _chain(x, params, ops, swap, cast_to, steps):
    """The chain op by op: the Unsqueeze and Cast kernels themselves, the arithmetic by numpy's
    ufunc on float numpy arrays of the constant's dtype (what the elementwise kernels call for
    them), else by the kernels. ``steps`` (a list) collects the replay of each op (its kind,
    argument, constant, side), or an entry (None, ...) for a Cast that returned its input;
    an op that took a kernel's general path appends nothing (no replay)."""
    y = x
    for i in range(len(ops)):
        op = ops[i]
        if op == "Unsqueeze":
            y = _unsqueeze(y, params[i])
            if steps is not None:
                steps.append((_RESHAPE, y.shape, None, 0))
        elif op == "Cast":
            to = int(cast_to[i])
            src = y
            plain = type(y) is np.ndarray and y.dtype.type in _PLAIN_SOURCES \
                and to in _PLAIN_TARGETS
            y = cast(y, to=to)
            if steps is not None and plain:
                steps.append((None, None, None, 0) if y is src
                             else (_ASTYPE, y.dtype, None, 0))
        else:
            entry = _ARITH.get(op)
            if entry is None:
                raise InputError(f"ScalarChain: unknown op {op!r} (known: "
                                 f"{', '.join(sorted(CHAIN_OPS))})")
            c = params[i]
            left = bool(swap[i])
            a, b = (c, y) if left else (y, c)
            if type(y) is np.ndarray and type(c) is np.ndarray and y.dtype.kind == "f" \
                    and c.dtype == y.dtype:
                if op == "Div":
                    with quiet():   # as the Div kernel
                        y = entry[1](a, b)
                else:
                    y = entry[1](a, b)
                if type(y) is not np.ndarray:   # 0-d operands give a numpy scalar
                    y = np.asarray(y)
                if steps is not None:
                    steps.append((_UFUNC_QUIET if op == "Div" else _UFUNC, entry[1], c, left))
            else:
                y = entry[0](a, b)
    return y
