"""Splitting a data set between the ranks of a data-parallel job."""

from __future__ import annotations

import numpy as np

from workbench.errors import WorkbenchError


def partition(*arrays, rank: int, world_size: int, shuffle: bool = False, seed: int = 0,
              drop_last: bool = True):
    """Rank ``rank``'s share of ``arrays`` (all with the same first dimension).

    Every rank gets the same number of samples (``len // world_size``; the remainder is
    dropped with ``drop_last``, as SINGA's examples do), so every rank runs the same number of
    steps: a rank with one step more would wait alone in its all-reduce until the timeout.
    ``shuffle`` permutes the samples first with ``seed`` (the same permutation on every rank,
    so the shares stay disjoint). Returns one array per input (a single array for one input).

    >>> import numpy as np
    >>> x = np.arange(10)
    >>> partition(x, rank=1, world_size=3).tolist()
    [3, 4, 5]
    """
    if not arrays:
        raise WorkbenchError("partition: give at least one array")
    if not 0 <= int(rank) < int(world_size):
        raise WorkbenchError(f"partition: rank {rank} is outside world size {world_size}")
    n = len(arrays[0])
    for i, a in enumerate(arrays):
        if len(a) != n:
            raise WorkbenchError(f"partition: array {i} has {len(a)} samples, array 0 has {n}")
    per = n // world_size
    if per == 0:
        raise WorkbenchError(f"partition: {n} samples cannot be shared by {world_size} ranks")
    idx = np.arange(n)
    if shuffle:
        idx = np.random.default_rng(seed).permutation(n)
    if drop_last:
        mine = idx[rank * per:(rank + 1) * per]
    else:
        mine = np.array_split(idx, world_size)[rank]
    out = tuple(a[mine] for a in arrays)
    return out[0] if len(out) == 1 else out


def batches_per_rank(n_samples: int, batch_size: int, world_size: int) -> int:
    """Steps per epoch that every rank can run with ``partition`` and ``batch_size``."""
    return (n_samples // world_size) // batch_size
