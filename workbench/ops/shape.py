"""Shape manipulation: Reshape, Transpose, Flatten, (Un)Squeeze, Concat, Split, Slice, Pad, Expand,
Tile, Shape, Size, DepthToSpace, SpaceToDepth, CenterCropPad, Trilu, ReverseSequence.

Shapes, axes, starts/ends and pads that arrive as tensors are int64 (or int32) arrays and are
converted to Python ints on the host. Reshape, Transpose, Squeeze, Unsqueeze, Flatten, Slice,
Split and Expand return views of their input where numpy can (the engine never writes in place).
"""

from __future__ import annotations

import numpy as np

from workbench.arrays import xp_of
from workbench.errors import InputError, ShapeError
from workbench.limits import check_alloc
from workbench.ops._common import ints, norm_axis, prod
from workbench.ops.registry import describe, kernel

# Reshape -----------------------------------------------------------------------------------------

def _target_shape(data_shape, shape, allowzero: bool) -> tuple:
    out = []
    infer = None
    for i, s in enumerate(shape):
        if s == -1:
            if infer is not None:
                raise ShapeError(f"Reshape: shape {shape} has more than one -1")
            infer = i
            out.append(1)
        elif s == 0 and not allowzero:
            if i >= len(data_shape):
                raise ShapeError(f"Reshape: shape {shape} has 0 at position {i} (copy the input "
                                 f"dimension) but the input shape {tuple(data_shape)} has only "
                                 f"{len(data_shape)} dimensions")
            out.append(int(data_shape[i]))
        elif s < 0:
            raise ShapeError(f"Reshape: invalid dimension {s} in shape {shape} (only -1 may be "
                             f"negative)")
        else:
            out.append(int(s))
    total = prod(data_shape)
    if infer is not None:
        known = prod(out)
        if allowzero and 0 in shape:
            raise ShapeError(f"Reshape: with allowzero=1 the shape {shape} may not contain "
                             f"both 0 and -1")
        if known == 0 or total % known:
            raise ShapeError(f"Reshape: cannot reshape input of shape {tuple(data_shape)} "
                             f"({total} elements) to {shape}")
        out[infer] = total // known
    if prod(out) != total:
        raise ShapeError(f"Reshape: cannot reshape input of shape {tuple(data_shape)} "
                         f"({total} elements) to {shape} (-> {tuple(out)}, {prod(out)} elements)")
    return tuple(out)


@kernel("Reshape", since=1, category="shape", host_read_inputs=(1,), host_shape_math=True,
        settings=(1,))
def reshape_attr(data, *, shape=None, consumed_inputs=None):
    """Reshape-1..4: the target shape is the ``shape`` attribute."""
    return data.reshape(_target_shape(data.shape, ints(shape), False))


#: Reshape-5+'s target shapes by (input shape, the shape input's int64 bytes, allowzero): a
#: pure function of the key; a transformer's Reshapes see the same few keys every run, and
#: resolving 0 / -1 and checking the sizes costs ~5x the lookup
_TARGETS: dict = {}
_TARGETS_KEPT = 256


@kernel("Reshape", since=5)
def reshape(data, shape, *, allowzero=0):
    """Reshape-5+: 0 copies the input dimension (unless ``allowzero``), -1 is inferred."""
    if type(shape) is np.ndarray and shape.dtype == np.int64 and shape.ndim == 1:
        key = (data.shape, shape.tobytes(), allowzero)
        target = _TARGETS.get(key)
        if target is None:
            target = _target_shape(data.shape, ints(shape), bool(allowzero))
            if len(_TARGETS) >= _TARGETS_KEPT:
                _TARGETS.clear()
            _TARGETS[key] = target
        return data.reshape(target)
    return data.reshape(_target_shape(data.shape, ints(shape), bool(allowzero)))


@kernel("Transpose", since=1, category="shape")
def transpose(data, *, perm=None):
    """Permute the axes (reversed when ``perm`` is not given)."""
    xp = xp_of(data)
    if perm is None or len(perm) == 0:
        return xp.transpose(data) if data.ndim else data
    r = data.ndim
    perm = [int(p) + r if int(p) < 0 else int(p) for p in perm]
    if sorted(perm) != list(range(r)):
        raise ShapeError(f"Transpose: perm {perm} is not a permutation of the "
                         f"{r} axes of the input shape {tuple(data.shape)}")
    return xp.transpose(data, perm)


@kernel("Flatten", since=1, category="shape", host_shape_math=True)
def flatten(input, *, axis=1):
    """2-D view: dims before ``axis`` into the rows, the rest into the columns."""
    r = input.ndim
    if not -r <= axis <= r:
        raise ShapeError(f"Flatten: axis {axis} is out of range for an input of rank {r} "
                         f"(accepted range is [{-r}, {r}])")
    axis = axis + r if axis < 0 else axis
    return input.reshape(prod(input.shape[:axis]), prod(input.shape[axis:]))


# Squeeze / Unsqueeze -----------------------------------------------------------------------------

def _squeeze(data, axes):
    axes = ints(axes)
    if not axes:
        return data.reshape(tuple(d for d in data.shape if d != 1))
    norm = {norm_axis(a, data.ndim, "Squeeze", "axes value") for a in axes}
    for a in norm:
        if data.shape[a] != 1:
            raise ShapeError(f"Squeeze: cannot squeeze axis {a} of size {data.shape[a]} "
                             f"(input shape {tuple(data.shape)}); only size-1 axes can be removed")
    return data.reshape(tuple(d for i, d in enumerate(data.shape) if i not in norm))


@kernel("Squeeze", since=1, category="shape", host_read_inputs=(1,), host_shape_math=True)
def squeeze_attr(data, *, axes=None):
    """Squeeze-1..12: remove size-1 axes listed in the ``axes`` attribute (all when absent)."""
    return _squeeze(data, axes)


@kernel("Squeeze", since=13)
def squeeze(data, axes=None):
    """Squeeze-13+: ``axes`` is an optional int64 input."""
    return _squeeze(data, axes)


def _unsqueeze(data, axes):
    axes = ints(axes)
    rank = data.ndim + len(axes)
    norm = sorted(norm_axis(a, rank, "Unsqueeze", "axes value") for a in axes)
    if len(set(norm)) != len(norm):
        raise ShapeError(f"Unsqueeze: axes {axes} contain duplicates (after normalising to "
                         f"output rank {rank})")
    shape = list(data.shape)
    for a in norm:
        shape.insert(a, 1)
    return data.reshape(tuple(shape))


@kernel("Unsqueeze", since=1, category="shape", host_read_inputs=(1,), host_shape_math=True)
def unsqueeze_attr(data, *, axes):
    """Unsqueeze-1..12: insert size-1 axes at the positions in the ``axes`` attribute."""
    return _unsqueeze(data, axes)


@kernel("Unsqueeze", since=13)
def unsqueeze(data, axes):
    """Unsqueeze-13+: ``axes`` is an int64 input; positions refer to the output rank."""
    return _unsqueeze(data, axes)


# Concat / Split ----------------------------------------------------------------------------------

def _concat(inputs, axis):
    xp = xp_of(*inputs)
    if not inputs:
        raise InputError("Concat: needs at least one input")
    ranks = {a.ndim for a in inputs if a.size}
    # empty tensors of another rank (e.g. shape (0,)) contribute nothing: drop them
    if len(ranks) == 1:
        rank = ranks.pop()
        inputs = [a for a in inputs if a.size or a.ndim == rank]
    rank = inputs[0].ndim
    ax = norm_axis(int(axis), rank, "Concat")
    ref = inputs[0].shape
    for a in inputs[1:]:
        if a.ndim != rank or any(d != e for i, (d, e) in enumerate(zip(a.shape, ref)) if i != ax):
            raise ShapeError(f"Concat: input shapes {[tuple(b.shape) for b in inputs]} do not "
                             f"match outside axis {ax}")
    if len(inputs) == 1:
        return inputs[0]
    out = list(ref)
    out[ax] = sum(int(a.shape[ax]) for a in inputs)
    # inputs may be broadcast views (Expand): the output is the first real allocation
    check_alloc(out, inputs[0].dtype, what="Concat: the output")
    return xp.concatenate(inputs, axis=ax)


@kernel("Concat", since=1, category="shape", host_shape_math=True)
def concat_v1(*inputs, axis=1):
    """Concat-1..3: ``axis`` defaults to 1."""
    return _concat(inputs, axis)


@kernel("Concat", since=4)
def concat(*inputs, axis):
    """Concat-4+: join along ``axis`` (negative from 11)."""
    return _concat(inputs, axis)


def _split(input, sizes, axis, n_outputs, num_outputs=None):
    ax = norm_axis(int(axis), input.ndim, "Split")
    dim = input.shape[ax]
    if sizes:
        if len(sizes) != n_outputs:
            raise ShapeError(f"Split: {len(sizes)} split sizes {sizes[:8]}"
                             f"{'...' if len(sizes) > 8 else ''} for a node with {n_outputs} "
                             f"output(s); there must be one size per output")
        if any(s < 0 for s in sizes) or sum(sizes) != dim:
            raise ShapeError(f"Split: split sizes {sizes} must be >= 0 and add up to {dim}, the "
                             f"size of axis {ax} of the input shape {tuple(input.shape)}")
    else:
        n = int(num_outputs) if num_outputs else n_outputs
        if n <= 0:
            raise ShapeError(f"Split: cannot split into {n} outputs")
        if num_outputs and n != n_outputs:
            raise ShapeError(f"Split: num_outputs={n} but the node has {n_outputs} output(s); "
                             f"they must be equal")
        chunk = -(-dim // n)
        sizes = [max(min(chunk, dim - i * chunk), 0) for i in range(n)]
    out = []
    pos = 0
    index = [slice(None)] * input.ndim
    for s in sizes:
        index[ax] = slice(pos, pos + s)
        out.append(input[tuple(index)])
        pos += s
    return tuple(out)


@kernel("Split", since=1, wants_ctx=True, category="shape", host_read_inputs=(1,))
def split_v1(input, split_input=None, *, axis=0, split=None, ctx):
    """Split-1: sizes from the optional second input or the ``split`` attribute."""
    sizes = ints(split_input) if split_input is not None else ints(split)
    return _split(input, sizes, axis, ctx.n_outputs)


@kernel("Split", since=2, wants_ctx=True)
def split_attr(input, *, axis=0, split=None, ctx):
    """Split-2..12: sizes from the ``split`` attribute, else equal parts (one per output)."""
    return _split(input, ints(split), axis, ctx.n_outputs)


@kernel("Split", since=13, wants_ctx=True)
def split(input, split=None, *, axis=0, num_outputs=None, ctx):
    """Split-13+: sizes from the optional ``split`` input; from 18 ``num_outputs`` parts of
    ceil(dim / num_outputs), the last one smaller."""
    if split is not None and num_outputs is not None:
        raise InputError("Split: give either the 'split' input or the 'num_outputs' attribute, "
                         "not both")
    return _split(input, ints(split), axis, ctx.n_outputs, num_outputs)


# Slice -------------------------------------------------------------------------------------------

_SLICE_INDEX: dict = {}   # (data's shape, the four inputs' bytes) -> the index tuple
_SLICE_KEPT = 256


def _index_key(v):
    """A hashable stand-in for a Slice input's values (None when absent)."""
    if v is None:
        return None
    if type(v) is np.ndarray:
        return v.dtype.str, v.shape, v.tobytes()
    return tuple(int(i) for i in v)


def _slice(data, starts, ends, axes, steps):
    """``data[index]`` for the ONNX Slice of these inputs; the index a (shape, inputs) pair
    gives is remembered (ShuffleNet's 26 channel splits a run: 9 -> ~3 µs each), so later
    calls skip the normalisation."""
    try:
        key = (data.shape, _index_key(starts), _index_key(ends), _index_key(axes),
               _index_key(steps))
    except (TypeError, ValueError):   # not plain integers: the checks below say why
        key = None
    index = None if key is None else _SLICE_INDEX.get(key)
    if index is None:
        index = _slice_index(data, starts, ends, axes, steps)
        if key is not None:
            if len(_SLICE_INDEX) >= _SLICE_KEPT:
                _SLICE_INDEX.clear()
            _SLICE_INDEX[key] = index
    return data[index]


def _slice_index(data, starts, ends, axes, steps):
    starts, ends = ints(starts), ints(ends)
    r = data.ndim
    axes = ints(axes) if axes is not None and len(axes) else list(range(len(starts)))
    steps = ints(steps) if steps is not None and len(steps) else [1] * len(starts)
    if not len(starts) == len(ends) == len(axes) == len(steps):
        raise ShapeError(f"Slice: starts {starts}, ends {ends}, axes {axes} and steps {steps} "
                         f"must have the same length")
    index = [slice(None)] * r
    for s, e, a, st in zip(starts, ends, axes, steps):
        a = norm_axis(a, r, "Slice", "axes value")
        dim = data.shape[a]
        if st == 0:
            raise ShapeError("Slice: steps cannot be 0")
        if s < 0:
            s += dim
        if e < 0:
            e += dim
        if st > 0:
            s = min(max(s, 0), dim)
            e = min(max(e, 0), dim)
            index[a] = slice(s, e, st)
        else:
            s = min(max(s, 0), dim - 1)
            e = min(max(e, -1), dim - 1)
            index[a] = slice(s, e if e >= 0 else None, st) if dim else slice(0, 0)
    return tuple(index)


@kernel("Slice", since=1,
        category="shape", host_read_inputs=(1, 2, 3, 4), host_shape_math=True,
        settings=(1, 2, 3, 4))
def slice_attr(data, *, starts, ends, axes=None):
    """Slice-1..9: ``starts``/``ends``/``axes`` are attributes, step 1."""
    return _slice(data, starts, ends, axes, None)


@kernel("Slice", since=10)
def slice_(data, starts, ends, axes=None, steps=None):
    """Slice-10+: inputs; out-of-range starts/ends are clamped, negative steps go backwards."""
    return _slice(data, starts, ends, axes, steps)


# Pad ---------------------------------------------------------------------------------------------

def _pad(data, pads, mode, value, axes=None):
    xp = xp_of(data)
    r = data.ndim
    pads = ints(pads)
    axes = ints(axes) if axes is not None else list(range(r))
    axes = [norm_axis(a, r, "Pad", "axes value") for a in axes]
    if len(pads) != 2 * len(axes):
        raise ShapeError(f"Pad: pads {pads} must have 2 * {len(axes)} values (begins then ends) "
                         f"for the axes {axes} of the input shape {tuple(data.shape)}")
    before = [0] * r
    after = [0] * r
    for i, a in enumerate(axes):
        before[a] = pads[i]
        after[a] = pads[i + len(axes)]
    # negative pads crop first
    for i, (b, e) in enumerate(zip(before, after)):
        if max(-b, 0) + max(-e, 0) > data.shape[i]:
            raise ShapeError(f"Pad: pads {pads} remove more than the {data.shape[i]} elements "
                             f"of axis {i} (input shape {tuple(data.shape)})")
    if any(p < 0 for p in before + after):
        index = tuple(slice(max(-b, 0), data.shape[i] - max(-e, 0))
                      for i, (b, e) in enumerate(zip(before, after)))
        data = data[index]
        before = [max(b, 0) for b in before]
        after = [max(e, 0) for e in after]
    if not any(before) and not any(after):
        return data
    check_alloc([d + b + e for d, b, e in zip(data.shape, before, after)], data.dtype,
                what="Pad: the output")
    if mode == "constant":
        shape = tuple(d + b + e for d, b, e in zip(data.shape, before, after))
        out = xp.empty(shape, dtype=data.dtype)
        if value is None or (hasattr(value, "size") and value.size == 0):
            out[...] = "" if data.dtype == object else 0
        else:
            out[...] = value.reshape(-1)[0] if hasattr(value, "reshape") else value
        out[tuple(slice(b, b + d) for b, d in zip(before, data.shape))] = data
        return out
    if mode not in ("reflect", "edge", "wrap"):
        raise InputError(f"Pad: mode {mode!r} is not supported (constant, reflect, edge, wrap)")
    for i, (b, e) in enumerate(zip(before, after)):
        if not (b or e):
            continue
        d = data.shape[i]
        if d == 0:
            raise ShapeError(f"Pad: cannot {mode}-pad axis {i} of size 0 "
                             f"(input shape {tuple(data.shape)})")
        data = xp.take(data, _pad_source_index(xp, mode, d, b, e), axis=i)
    return data


def _pad_source_index(xp, mode, d, before, after):
    """For each position of a padded axis, the index along the input axis it copies."""
    j = xp.arange(-before, d + after, dtype=np.int64)
    if mode == "edge":
        return xp.clip(j, 0, d - 1)
    if mode == "wrap":
        return j % d
    if d == 1:  # reflect
        return xp.zeros_like(j)
    period = 2 * (d - 1)
    j = xp.abs(j) % period
    return xp.where(j >= d, period - j, j)


@kernel("Pad", since=1, category="shape", host_read_inputs=(1, 3), settings=(1, 2, 3))
def pad_attr(data, *, pads=None, paddings=None, mode="constant", value=0.0):
    """Pad-1..10: ``pads`` (``paddings`` at opset 1) and ``value`` are attributes."""
    return _pad(data, pads if pads is not None else paddings, mode, value)


@kernel("Pad", since=11)
def pad(data, pads, constant_value=None, axes=None, *, mode="constant"):
    """Pad-11+: pads (begins then ends, negative crops), constant_value and (18+) axes inputs;
    modes constant, reflect, edge and (19+) wrap."""
    return _pad(data, pads, mode, constant_value, axes)


# Expand / Tile -----------------------------------------------------------------------------------

@kernel("Expand", since=8, category="shape", host_read_inputs=(1,), settings=(1,))
def expand(input, shape):
    """Broadcast ``input`` with ``shape`` (both directions, as ``input * ones(shape)``).

    Returns a read-only broadcast view.
    """
    xp = xp_of(input)
    shape = ints(shape)
    try:
        out_shape = np.broadcast_shapes(tuple(input.shape), tuple(shape))
    except ValueError:
        raise ShapeError(f"Expand: input shape {tuple(input.shape)} cannot be broadcast to "
                         f"{tuple(shape)}") from None
    if tuple(out_shape) == tuple(input.shape):
        return input
    # a broadcast view costs nothing here, but every consumer materialises it
    check_alloc(out_shape, input.dtype, what="Expand: the output")
    return xp.broadcast_to(input, out_shape)


@kernel("Tile", since=1, category="shape", host_read_inputs=(1,), settings=(1,))
def tile_v1(input, tiles, axis):
    """Tile-1..5: repeat ``tiles`` times along the single ``axis``."""
    xp = xp_of(input)
    reps = [1] * input.ndim
    reps[norm_axis(ints(axis)[0], input.ndim, "Tile")] = ints(tiles)[0]
    if any(x < 0 for x in reps):
        raise ShapeError(f"Tile: tiles must be >= 0, got {ints(tiles)}")
    check_alloc([d * r for d, r in zip(input.shape, reps)], input.dtype, what="Tile: the output")
    return xp.tile(input, reps)


@kernel("Tile", since=6)
def tile(input, repeats):
    """Tile-6+: repeat the input ``repeats[i]`` times along each axis i."""
    xp = xp_of(input)
    reps = ints(repeats)
    if len(reps) != input.ndim or any(x < 0 for x in reps):
        raise ShapeError(f"Tile: repeats {reps} must have one value >= 0 per axis of the input "
                         f"shape {tuple(input.shape)}")
    check_alloc([d * r for d, r in zip(input.shape, reps)], input.dtype, what="Tile: the output")
    return xp.tile(input, reps)


# Shape / Size ------------------------------------------------------------------------------------

@kernel("Shape", since=1, category="shape", shape_only=True)
def shape(data, *, start=0, end=None):
    """The shape as a 1-D int64 tensor; ``start``/``end`` (opset 15) slice it, clamped."""
    xp = xp_of(data)
    r = data.ndim
    s = start + r if start < 0 else start
    e = r if end is None else (end + r if end < 0 else end)
    s, e = min(max(s, 0), r), min(max(e, 0), r)
    return xp.asarray(list(data.shape[s:e]), dtype=np.int64)


@kernel("Size", since=1, category="shape", shape_only=True)
def size(data):
    """The number of elements as a 0-D int64 tensor."""
    xp = xp_of(data)
    return xp.asarray(prod(data.shape), dtype=np.int64)


# DepthToSpace / SpaceToDepth ---------------------------------------------------------------------

def _check_4d(op, x, blocksize):
    if x.ndim != 4:
        raise ShapeError(f"{op}: input must be 4-D [N, C, H, W], got shape {tuple(x.shape)}")
    if int(blocksize) <= 0:
        raise ShapeError(f"{op}: blocksize must be positive, got {blocksize}")


@kernel("DepthToSpace", since=1, category="shape")
def depth_to_space(input, *, blocksize, mode="DCR"):
    """Move channel blocks into [blocksize, blocksize] spatial blocks (DCR or CRD order)."""
    xp = xp_of(input)
    _check_4d("DepthToSpace", input, blocksize)
    bs = int(blocksize)
    b, c, h, w = input.shape
    if c % (bs * bs):
        raise ShapeError(f"DepthToSpace: channels {c} are not divisible by blocksize^2 = "
                         f"{bs * bs}")
    oc = c // (bs * bs)
    if mode == "DCR":
        tmp = input.reshape(b, bs, bs, oc, h, w)
        tmp = xp.transpose(tmp, (0, 3, 4, 1, 5, 2))
    elif mode == "CRD":
        tmp = input.reshape(b, oc, bs, bs, h, w)
        tmp = xp.transpose(tmp, (0, 1, 4, 2, 5, 3))
    else:
        raise InputError(f"DepthToSpace: mode {mode!r} is not supported (DCR, CRD)")
    return tmp.reshape(b, oc, h * bs, w * bs)


@kernel("SpaceToDepth", since=1, category="shape")
def space_to_depth(input, *, blocksize, mode="DCR"):
    """Move [blocksize, blocksize] spatial blocks into channels (DCR; CRD from opset 28)."""
    xp = xp_of(input)
    _check_4d("SpaceToDepth", input, blocksize)
    bs = int(blocksize)
    b, c, h, w = input.shape
    if h % bs or w % bs:
        raise ShapeError(f"SpaceToDepth: height {h} and width {w} must be divisible by "
                         f"blocksize {bs}")
    tmp = input.reshape(b, c, h // bs, bs, w // bs, bs)
    if mode == "DCR":
        tmp = xp.transpose(tmp, (0, 3, 5, 1, 2, 4))
    elif mode == "CRD":
        tmp = xp.transpose(tmp, (0, 1, 3, 5, 2, 4))
    else:
        raise InputError(f"SpaceToDepth: mode {mode!r} is not supported (DCR, CRD)")
    return tmp.reshape(b, c * bs * bs, h // bs, w // bs)


# CenterCropPad / Trilu / ReverseSequence ---------------------------------------------------------

@kernel("CenterCropPad", since=18, host_read_inputs=(1,))
def center_crop_pad(input_data, shape, *, axes=None):
    """Crop (window start rounded down) or zero-pad (extra pixel on the right) to ``shape``."""
    xp = xp_of(input_data)
    r = input_data.ndim
    target = ints(shape)
    axes = [norm_axis(a, r, "CenterCropPad", "axes value") for a in ints(axes)] \
        if axes else list(range(r))
    if len(target) != len(axes):
        raise ShapeError(f"CenterCropPad: shape {target} must have one value per axis {axes}")
    src = [slice(None)] * r
    dst = [slice(None)] * r
    out_shape = list(input_data.shape)
    for a, t in zip(axes, target):
        d = input_data.shape[a]
        out_shape[a] = t
        if t <= d:
            s = (d - t) // 2
            src[a] = slice(s, s + t)
        else:
            s = (t - d) // 2
            dst[a] = slice(s, s + d)
    cropped = input_data[tuple(src)]
    if tuple(out_shape) == tuple(cropped.shape):
        return cropped
    out = xp.zeros(tuple(out_shape), dtype=input_data.dtype)
    out[tuple(dst)] = cropped
    return out


@kernel("Trilu", since=14, category="shape", host_read_inputs=(1,))
def trilu(input, k=None, *, upper=1):
    """Keep the upper (j - i >= k) or lower (j - i <= k) triangle of the last two axes."""
    xp = xp_of(input)
    if input.ndim < 2:
        raise ShapeError(f"Trilu: input must have rank >= 2, got shape {tuple(input.shape)}")
    kk = ints(k)[0] if k is not None and k.size else 0
    n, m = input.shape[-2:]
    keep = xp.tri(n, m, kk - 1, dtype=bool)
    keep = ~keep if upper else xp.tri(n, m, kk, dtype=bool)
    return xp.where(keep, input, xp.zeros((), dtype=input.dtype))


@kernel("ReverseSequence", since=10)
def reverse_sequence(input, sequence_lens, *, batch_axis=1, time_axis=0):
    """Reverse the first ``sequence_lens[b]`` steps along ``time_axis`` of each batch entry."""
    xp = xp_of(input)
    if input.ndim < 2 or {batch_axis, time_axis} != {0, 1}:
        raise ShapeError(f"ReverseSequence: needs rank >= 2 and batch_axis/time_axis 0 and 1, "
                         f"got shape {tuple(input.shape)}, batch_axis={batch_axis}, "
                         f"time_axis={time_axis}")
    t_len, b_len = input.shape[time_axis], input.shape[batch_axis]
    lens = xp.asarray(sequence_lens).astype(np.int64).reshape(-1)
    if lens.shape[0] != b_len:
        raise ShapeError(f"ReverseSequence: sequence_lens has {lens.shape[0]} values for a batch "
                         f"of {b_len}")
    t = xp.arange(t_len, dtype=np.int64)[:, None]          # (T, 1)
    src = xp.where(t < lens[None, :], lens[None, :] - 1 - t, t)  # (T, B)
    if batch_axis == 0:
        src = src.T
    src = src.reshape(src.shape + (1,) * (input.ndim - 2))
    src = xp.broadcast_to(src, input.shape)
    return xp.take_along_axis(input, src, axis=time_axis)


# what the memory analysis needs to know (workbench.analysis.memory): these kernels hand back
# views of their first input (numpy's reshape copies an input that is itself a strided view)
for _op in ("Transpose", "Squeeze", "Unsqueeze", "Expand", "Slice", "Split"):
    describe(_op, output_view="view")
for _op in ("Reshape", "Flatten"):
    describe(_op, output_view="view-unless-strided")
