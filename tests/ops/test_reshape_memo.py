"""Reshape-5+'s remembered target shapes (workbench/ops/shape.py ``_TARGETS``): the same
answers and the same errors as resolving the shape every call."""

from __future__ import annotations

import numpy as np
import pytest

from workbench.errors import ShapeError
from workbench.ops import shape as shape_ops


def test_remembered_targets_match_and_errors_repeat():
    shape_ops._TARGETS.clear()
    x = np.arange(24, dtype=np.float32).reshape(2, 3, 4)
    for _ in range(2):   # the second pass reads the remembered targets
        for target, allowzero, expect in (([0, -1], 0, (2, 12)), ([-1, 4], 0, (6, 4)),
                                          ([2, 0, 4], 0, (2, 3, 4)), ([24], 0, (24,))):
            y = shape_ops.reshape(x, np.array(target, np.int64), allowzero=allowzero)
            assert y.shape == expect and np.array_equal(y.reshape(-1), x.reshape(-1))
        # the same shape input on another input shape resolves 0 / -1 again
        assert shape_ops.reshape(np.zeros((4, 6)), np.array([0, -1], np.int64)).shape == (4, 6)
        # allowzero is part of the key: 0 is a zero-size dimension then
        z = shape_ops.reshape(np.zeros((0, 3)), np.array([0, 3], np.int64), allowzero=1)
        assert z.shape == (0, 3)
        for bad in ([5, -1], [-1, -1], [7]):   # never remembered: raised every time
            with pytest.raises(ShapeError, match="Reshape"):
                shape_ops.reshape(x, np.array(bad, np.int64))
    assert 0 < len(shape_ops._TARGETS) <= shape_ops._TARGETS_KEPT
    # int32 shapes and lists take the unremembered path with the same answers
    assert shape_ops.reshape(x, np.array([0, -1], np.int32)).shape == (2, 12)
    assert shape_ops.reshape(x, [4, -1]).shape == (4, 6)


def test_the_memo_is_bounded():
    shape_ops._TARGETS.clear()
    for n in range(1, shape_ops._TARGETS_KEPT + 10):
        shape_ops.reshape(np.zeros(n), np.array([n, 1], np.int64))
    assert len(shape_ops._TARGETS) <= shape_ops._TARGETS_KEPT
