"""Sequence and optional kernels: SequenceConstruct/Empty/At/Insert/Erase/Length, SplitToSequence,
ConcatFromSequence, SequenceMap, Optional, OptionalHasElement, OptionalGetElement.

Representation of the non-tensor values these ops handle:

* a *sequence* value is a Python ``list`` of arrays (never a tuple, which means "several
  outputs" to the executor). Kernels never mutate a list they receive; they return a new one.
* an *optional* value is either its content (an array or a list) or :data:`NONE_OPTIONAL`, the
  unique object that stands for an empty optional (``Optional()`` with only a ``type``); it is
  defined in :mod:`workbench.ops.sequence_repr` and re-exported here.
* an omitted input is plain ``None``; ``OptionalHasElement`` treats it as empty.
"""

from __future__ import annotations

import numpy as np

from workbench.arrays import xp_of
from workbench.errors import InputError, ShapeError
from workbench.ops.registry import kernel
from workbench.ops.sequence_repr import NONE_OPTIONAL

# NONE_OPTIONAL, the empty optional value (what ``Optional`` produces without an input; test it
# with ``is``), is the one object defined in workbench.ops.sequence_repr (shared with the
# executor) and re-exported here as workbench.ops.sequence.NONE_OPTIONAL.
__all__ = ["NONE_OPTIONAL", "is_empty_optional"]


def is_empty_optional(value) -> bool:
    """True for an empty optional value (:data:`NONE_OPTIONAL`) or an omitted input (None)."""
    return value is None or value is NONE_OPTIONAL


def _as_sequence(op: str, seq) -> list:
    if not isinstance(seq, list):
        raise InputError(f"{op}: input_sequence must be a sequence (a list of tensors), "
                         f"got {type(seq).__name__}")
    return seq


def _position(op: str, position, n: int, *, allow_end: bool) -> int:
    pos = int(position.reshape(-1)[0]) if hasattr(position, "reshape") else int(position)
    hi = n if allow_end else n - 1
    if not -n <= pos <= hi:
        rng = f"[-{n}, {hi}]"
        raise InputError(f"{op}: position {pos} is out of range {rng} for a sequence of "
                         f"length {n}")
    return pos + n if pos < 0 else pos


@kernel("SequenceConstruct", since=11)
def sequence_construct(*inputs):
    dtypes = {a.dtype for a in inputs}
    if len(dtypes) > 1:
        raise InputError(f"SequenceConstruct: all inputs must have the same dtype, got "
                         f"{sorted(str(d) for d in dtypes)}")
    return list(inputs)


@kernel("SequenceEmpty", since=11)
def sequence_empty(*, dtype=None):
    # An empty list carries no element type; ``dtype`` only matters to type inference.
    return []


@kernel("SequenceAt", since=11)
def sequence_at(input_sequence, position):
    seq = _as_sequence("SequenceAt", input_sequence)
    return seq[_position("SequenceAt", position, len(seq), allow_end=False)]


@kernel("SequenceInsert", since=11)
def sequence_insert(input_sequence, tensor, position=None):
    seq = _as_sequence("SequenceInsert", input_sequence)
    if seq and seq[0].dtype != tensor.dtype:
        raise InputError(f"SequenceInsert: tensor dtype {tensor.dtype} differs from the "
                         f"sequence's dtype {seq[0].dtype}")
    out = list(seq)
    if position is None:
        out.append(tensor)
    else:
        out.insert(_position("SequenceInsert", position, len(seq), allow_end=True), tensor)
    return out


@kernel("SequenceErase", since=11)
def sequence_erase(input_sequence, position=None):
    seq = _as_sequence("SequenceErase", input_sequence)
    if not seq:
        raise InputError("SequenceErase: cannot erase from an empty sequence")
    out = list(seq)
    pos = len(seq) - 1 if position is None else _position("SequenceErase", position, len(seq),
                                                            allow_end=False)
    del out[pos]
    return out


@kernel("SequenceLength", since=11)
def sequence_length(input_sequence):
    seq = _as_sequence("SequenceLength", input_sequence)
    xp = xp_of(seq)
    return xp.asarray(len(seq), dtype=np.int64)


@kernel("SplitToSequence", since=11)
def split_to_sequence(input, split=None, *, axis=0, keepdims=1):
    x = input
    r = x.ndim
    if not -r <= axis < r:
        raise ShapeError(f"SplitToSequence: axis {axis} is out of range for an input of "
                         f"rank {r} (shape {tuple(x.shape)})")
    axis = axis % r
    dim = x.shape[axis]
    xp = xp_of(x)
    if split is None:
        parts = [xp.take(x, i, axis=axis) if not keepdims
                 else x[(slice(None),) * axis + (slice(i, i + 1),)] for i in range(dim)]
        return parts
    sizes = [int(s) for s in np.asarray(split.tolist()).reshape(-1)]
    if split.ndim == 0:
        step = sizes[0]
        if step <= 0:
            raise InputError(f"SplitToSequence: split must be positive, got {step}")
        sizes = [step] * (dim // step) + ([dim % step] if dim % step else [])
    elif any(s < 0 for s in sizes) or sum(sizes) != dim:
        raise ShapeError(f"SplitToSequence: split {sizes} must be non-negative and sum to "
                         f"the size {dim} of axis {axis} (input shape {tuple(x.shape)})")
    out, start = [], 0
    for s in sizes:
        out.append(x[(slice(None),) * axis + (slice(start, start + s),)])
        start += s
    return out


@kernel("ConcatFromSequence", since=11)
def concat_from_sequence(input_sequence, *, axis=None, new_axis=0):
    seq = _as_sequence("ConcatFromSequence", input_sequence)
    if axis is None:
        raise InputError("ConcatFromSequence: the 'axis' attribute is required")
    if not seq:
        raise InputError("ConcatFromSequence: cannot concatenate an empty sequence (the "
                         "result's shape and dtype are unknown)")
    xp = xp_of(seq)
    r = seq[0].ndim
    if new_axis:
        if not -r - 1 <= axis <= r:
            raise ShapeError(f"ConcatFromSequence: axis {axis} out of range [{-r - 1}, {r}] "
                             f"for new_axis=1 and tensors of rank {r}")
        try:
            return xp.stack(seq, axis=axis % (r + 1))
        except ValueError as e:
            raise ShapeError(f"ConcatFromSequence: cannot stack shapes "
                             f"{[tuple(a.shape) for a in seq]}: {e}") from None
    if not -r <= axis < r:
        raise ShapeError(f"ConcatFromSequence: axis {axis} out of range [{-r}, {r - 1}] for "
                         f"tensors of rank {r}")
    try:
        return xp.concatenate(seq, axis=axis % r)
    except ValueError as e:
        raise ShapeError(f"ConcatFromSequence: cannot concatenate shapes "
                         f"{[tuple(a.shape) for a in seq]} on axis {axis}: {e}") from None


@kernel("SequenceMap", since=17, wants_ctx=True, category="control")
def sequence_map(input_sequence, *additional_inputs, body, ctx):
    seq = _as_sequence("SequenceMap", input_sequence)
    n = len(seq)
    for j, extra in enumerate(additional_inputs):
        if isinstance(extra, list) and len(extra) != n:
            raise InputError(f"SequenceMap: additional input {j + 1} is a sequence of length "
                             f"{len(extra)}, but input_sequence has length {n}")
    n_out = ctx.n_outputs
    outs: list[list] = [[] for _ in range(n_out)]
    for i in range(n):
        args = [seq[i]] + [a[i] if isinstance(a, list) else a for a in additional_inputs]
        res = body(*args)
        if len(res) != n_out:
            raise InputError(f"SequenceMap: body returned {len(res)} outputs, the node has "
                             f"{n_out}")
        for k, v in enumerate(res):
            outs[k].append(v)
    return outs[0] if n_out == 1 else tuple(outs)


@kernel("Optional", since=15)
def optional(input=None, *, type=None):
    return NONE_OPTIONAL if input is None else input


@kernel("OptionalHasElement", since=15)
def optional_has_element(input=None):
    xp = xp_of(input)  # numpy for None / NONE_OPTIONAL
    return xp.asarray(not is_empty_optional(input))


@kernel("OptionalGetElement", since=15)
def optional_get_element(input):
    if is_empty_optional(input):
        raise InputError("OptionalGetElement: the optional input is empty (it holds no "
                         "element); guard the call with OptionalHasElement")
    return input
