"""Channels-last helpers the layout pass writes (internal, ``com.workbench``): the channel
shuffle of ShuffleNet-like networks on (N, H, W, C) activations.

ShuffleNet's ``Reshape(N, g, C/g, H, W) -> Transpose(0, 2, 1, 3, 4) -> Reshape(N, C, H, W)``
(with the shapes computed in the graph) becomes one ``NhwcChannelShuffle(X, shape5, shape4)``
node: the two shapes are still graph values, and the kernel checks at run time that they are a
channel shuffle of X's logical (NCHW) shape. When they are, it is one copy in channels-last
order; otherwise it runs the three ops as written on the logical layout (the same result,
slower), so the rewrite never depends on shape inference having guessed right.

When the shuffled tensor is a channel ``Concat`` read by nothing else (its ``Shape`` aside: the
shuffle's shapes are computed from it), the Concat becomes ``NhwcConcatShuffle(*inputs,
groups=g)``: its inputs written straight into their shuffled places (one copy instead of the
concat's and the shuffle's), ``g`` the group count the graph's value shapes give. The
NhwcChannelShuffle after it gets ``shuffled=g``: its X is already shuffled by ``g``, so when the
shapes it reads at run time say "shuffle by g" it hands X on as it is; otherwise it undoes the
``g`` shuffle and runs the ops as written. Either way the result is what the graph computes.
"""

from __future__ import annotations

import numpy as np

from workbench import compiled
from workbench.errors import ShapeError
from workbench.ops._common import ints
from workbench.ops.parallel import call_blocks, n_workers
from workbench.ops.registry import FUSED_DOMAIN, kernel
from workbench.ops.shape import _target_shape


def _shuffle_into(y, pieces, g: int) -> None:
    """Write the channel concatenation of ``pieces`` (N, H, W, C_k) into ``y`` (N, H, W, C)
    shuffled across ``g`` groups: concatenated channel ``i * C/g + j`` goes to ``j * g + i``.
    One strided copy per (group, piece) overlap: the inner loop runs over channels."""
    N, H, W, C = y.shape
    cg = C // g
    yv = y.reshape(N, H, W, cg, g)
    start = 0
    for p in pieces:
        c = int(p.shape[-1])
        for i in range(start // cg, min(g, -(-(start + c) // cg))):
            lo, hi = max(start, i * cg), min(start + c, (i + 1) * cg)
            if lo < hi:
                yv[..., lo - i * cg:hi - i * cg, i] = p[..., lo - start:hi - start]
        start += c


def _unshuffle(X, g: int):
    """The inverse of a ``g``-group channel shuffle of X (N, H, W, C), C divisible by g."""
    N, H, W, C = X.shape
    return np.ascontiguousarray(
        X.reshape(N, H, W, C // g, g).transpose(0, 1, 2, 4, 3)).reshape(N, H, W, C)


@kernel("NhwcConcatShuffle", since=1, domain=FUSED_DOMAIN, category="shape")
def nhwc_concat_shuffle(*inputs, groups=1):
    """Concat of channels-last tensors (N, H, W, C_k) on the channel axis, written shuffled
    across ``groups`` (as NhwcChannelShuffle would leave it) when ``groups`` divides the
    channel count; a plain concat otherwise (the NhwcChannelShuffle after it knows which)."""
    if not inputs:
        raise ShapeError("NhwcConcatShuffle: needs at least one input")
    ref = inputs[0].shape
    if any(a.ndim != 4 or a.shape[:3] != ref[:3] or a.dtype != inputs[0].dtype
           for a in inputs):
        raise ShapeError(f"NhwcConcatShuffle: inputs {[tuple(a.shape) for a in inputs]} must "
                         f"be (N, H, W, C) arrays of one dtype differing only in C")
    C = sum(int(a.shape[3]) for a in inputs)
    g = int(groups)
    if g < 1 or C % g or C == 0:
        return np.concatenate(inputs, axis=3)
    y = np.empty(tuple(ref[:3]) + (C,), inputs[0].dtype)
    if g == 2 and len(inputs) == 2 and _interleave_c(y, *inputs):
        return y
    _shuffle_into(y, inputs, g)
    return y


_INTERLEAVE_C = "dwconv_avx2.interleave2"   # the C two-way channel interleave
_INTERLEAVE_SPLIT = 1 << 20   # output values under which the call is not split over the pool


def _row_stride(a):
    """The element stride between the channel rows of (N, H, W, c) ``a`` when its pixels are
    evenly spaced and its channels contiguous (a contiguous array, or a channel slice of
    one), else None."""
    if a.flags.c_contiguous:
        return int(a.shape[3])
    it = a.itemsize
    N, H, W, c = a.shape
    st = a.strides
    if c > 1 and st[3] != it:
        return None
    rs = st[2] if W > 1 else (st[1] if H > 1 else (st[0] if N > 1 else c * it))
    if (W > 1 and H > 1 and st[1] != W * rs) or (N > 1 and H * W > 1 and st[0] != H * W * rs) \
            or (N > 1 and H * W == 1 and st[0] != rs) or rs % it or rs < c * it:
        return None
    return rs // it


def _interleave_c(y, a, b) -> bool:
    """``dwconv_avx2.interleave2`` for two halves of 4-byte values (ShuffleNet's split and
    shuffle): y[..., 2j] = a[..., j], y[..., 2j+1] = b[..., j]. False (nothing written) when
    the kernel is not loaded or the inputs do not fit it."""
    if a.shape != b.shape or a.itemsize != 4 or type(a) is not np.ndarray \
            or type(b) is not np.ndarray or y.size == 0:
        return False
    k = compiled.kernel(_INTERLEAVE_C)
    if k is None:
        return False
    sa, sb = _row_stride(a), _row_stride(b)
    if sa is None or sb is None:
        return False
    P = y.size // y.shape[3]
    dp = compiled.data_pointer
    head = [dp(a), dp(b), dp(y), int(a.shape[3]), sa, sb]
    if y.size < _INTERLEAVE_SPLIT:
        k(np.array(head + [0, P], np.int64))
        return True
    step = -(-P // (4 * n_workers()))
    call_blocks(k, [np.array(head + [p, min(P, p + step)], np.int64)
                    for p in range(0, P, step)], y.size)
    return True


#: shape checks a NhwcChannelShuffle node remembers (per node, keyed by the shapes' bytes)
_PLANS_KEPT = 16


def _shuffle_plan(X_shape, shape5, shape4, allowzero: bool) -> tuple:
    """``(s5, s4, g, is_shuffle)``: the two reshape targets for the logical (NCHW) form of an
    (N, H, W, C) array, the group count, and whether they are a channel shuffle of it."""
    N, H, W, C = (int(v) for v in X_shape)
    logical = (N, C, H, W)
    s5 = _target_shape(logical, ints(shape5), allowzero)
    if len(s5) != 5:
        raise ShapeError(f"NhwcChannelShuffle: the first shape {list(ints(shape5))} must have "
                         f"5 dimensions")
    mid = (s5[0], s5[2], s5[1], s5[3], s5[4])
    s4 = _target_shape(mid, ints(shape4), allowzero)
    if len(s4) != 4:
        raise ShapeError(f"NhwcChannelShuffle: the second shape {list(ints(shape4))} must have "
                         f"4 dimensions")
    g = s5[1]   # the number of groups the channels are shuffled across
    return s5, s4, g, g >= 1 and C % g == 0 and s5 == (N, g, C // g, H, W) and s4 == logical


@kernel("NhwcChannelShuffle", since=1, domain=FUSED_DOMAIN, category="shape",
        host_read_inputs=(1, 2), wants_ctx=True)
def nhwc_channel_shuffle(X, shape5, shape4, *, allowzero=0, shuffled=0, ctx=None):
    """Reshape(shape5) -> Transpose(0, 2, 1, 3, 4) -> Reshape(shape4) of the logical NCHW
    tensor whose channels-last form is ``X`` (N, H, W, C); the result channels-last too.
    ``shuffled=g`` (> 0): X is that form already shuffled across ``g`` groups (written so by
    NhwcConcatShuffle, which shuffles only when ``g`` divides C). The shape checks of a node
    are remembered per (X's shape, the shapes' values): the shapes come from the same shape
    segment every run."""
    if X.ndim != 4:
        raise ShapeError(f"NhwcChannelShuffle: X must be (N, H, W, C), got {tuple(X.shape)}")
    C = int(X.shape[3])
    memo = key = None
    if ctx is not None and type(shape5) is np.ndarray and type(shape4) is np.ndarray:
        memo = ctx.extra.setdefault("shuffle_plans", {})
        key = (X.shape, shape5.dtype.str, shape5.tobytes(), shape4.dtype.str,
               shape4.tobytes(), bool(allowzero))
        found = memo.get(key)
    else:
        found = None
    if found is None:
        found = _shuffle_plan(X.shape, shape5, shape4, bool(allowzero))
        if memo is not None:
            if len(memo) >= _PLANS_KEPT:
                memo.clear()
            memo[key] = found
    s5, s4, g, is_shuffle = found
    pre = int(shuffled)
    if pre > 0 and (C % pre or C == 0):
        pre = 0     # NhwcConcatShuffle wrote a plain concat
    if pre > 0:
        if is_shuffle and g == pre:
            return X
        X = _unshuffle(X, pre)
    if is_shuffle:
        y = np.empty_like(X)
        # one strided copy per group: the inner loop runs over C/g channels (a transposed
        # copy's inner loop would run over the g groups: 4-5x slower for g = 2)
        yv = y.reshape(-1, C // g, g)
        xv = np.ascontiguousarray(X).reshape(-1, g, C // g)
        for i in range(g):
            yv[:, :, i] = xv[:, i, :]
        return y
    # not a shuffle of these channels: the ops as written, on the logical layout
    t = X.transpose(0, 3, 1, 2).reshape(s5).transpose(0, 2, 1, 3, 4).reshape(s4)
    return np.ascontiguousarray(t.transpose(0, 2, 3, 1))
