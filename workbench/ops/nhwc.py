"""Channels-last helpers the layout pass writes (internal, ``com.workbench``): the channel
shuffle of ShuffleNet-like networks on (N, H, W, C) activations.

ShuffleNet's ``Reshape(N, g, C/g, H, W) -> Transpose(0, 2, 1, 3, 4) -> Reshape(N, C, H, W)``
(with the shapes computed in the graph) becomes one ``NhwcChannelShuffle(X, shape5, shape4)``
node: the two shapes are still graph values, and the kernel checks at run time that they are a
channel shuffle of X's logical (NCHW) shape. When they are, it is one copy in channels-last
order; otherwise it runs the three ops as written on the logical layout (the same result,
slower), so the rewrite never depends on shape inference having guessed right.
"""

from __future__ import annotations

import numpy as np

from workbench.errors import ShapeError
from workbench.ops._common import ints
from workbench.ops.registry import FUSED_DOMAIN, kernel
from workbench.ops.shape import _target_shape


@kernel("NhwcChannelShuffle", since=1, domain=FUSED_DOMAIN, category="shape",
        host_read_inputs=(1, 2))
def nhwc_channel_shuffle(X, shape5, shape4, *, allowzero=0):
    """Reshape(shape5) -> Transpose(0, 2, 1, 3, 4) -> Reshape(shape4) of the logical NCHW
    tensor whose channels-last form is ``X`` (N, H, W, C); the result channels-last too."""
    if X.ndim != 4:
        raise ShapeError(f"NhwcChannelShuffle: X must be (N, H, W, C), got {tuple(X.shape)}")
    N, H, W, C = (int(v) for v in X.shape)
    logical = (N, C, H, W)
    s5 = _target_shape(logical, ints(shape5), bool(allowzero))
    if len(s5) != 5:
        raise ShapeError(f"NhwcChannelShuffle: the first shape {list(ints(shape5))} must have "
                         f"5 dimensions")
    mid = (s5[0], s5[2], s5[1], s5[3], s5[4])
    s4 = _target_shape(mid, ints(shape4), bool(allowzero))
    if len(s4) != 4:
        raise ShapeError(f"NhwcChannelShuffle: the second shape {list(ints(shape4))} must have "
                         f"4 dimensions")
    g = s5[1]   # the number of groups the channels are shuffled across
    if g >= 1 and C % g == 0 and s5 == (N, g, C // g, H, W) and s4 == logical:
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
