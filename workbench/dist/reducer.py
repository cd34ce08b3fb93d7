"""Gradient reduction for data-parallel training: what ``opt.DistOpt`` does between the backward
pass and the optimizer's update, on plain arrays.

A :class:`Reducer` owns one communicator and does, on numpy (CPU) or cupy (GPU) arrays:

- **bucketing** (:func:`buckets`): arrays of more than ``threshold`` elements are reduced
  alone, smaller ones are fused in order into one buffer until the buffer holds more than
  ``threshold`` elements (SINGA's grouping; every rank forms the same buckets in the same
  order, so the collectives match);
- **staging**: the fused buffer of SINGA's ``fused_all_reduce(t, send=False/True)``
  (:meth:`stage`, :meth:`send`), at most ``buffer_size`` elements;
- **sum / average** of gradients (:meth:`reduce`), float32 or float16 on the wire;
- **sparsification** (:meth:`sparse_all_reduce`): only the significant elements are sent
  (``|g| >= spars`` or the top ``spars`` fraction), with a local residual;
- **partial update** (:meth:`average_bucket`): one bucket of parameters averaged per step,
  round robin;
- the **start-equal check** (:meth:`check_start`): the ranks agree on the parameters' shapes
  (else an error) and values (else rank 0's are broadcast).

It knows nothing of Tensors, models or optimizers: ``workbench.singa.opt.DistOpt`` is the
SINGA-shaped adapter over it.
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Sequence

import numpy as np

from workbench.arrays import xp_of
from workbench.dist.comm import Communicator
from workbench.errors import WorkbenchError

#: SINGA's default fused-buffer size, in elements
DEFAULT_BUFFER_SIZE = 4194304
#: SINGA's default bucketing threshold, in elements
DEFAULT_THRESHOLD = 2097152


def buckets(sizes: Sequence[int], threshold: int) -> list[list[int]]:
    """The indices of ``sizes`` grouped for reduction, in the order the groups close: an entry
    larger than ``threshold`` is a group alone (closed where it stands); the others are
    gathered in order until their total exceeds ``threshold`` (the last group may be
    smaller)."""
    groups, current, total = [], [], 0
    for i, n in enumerate(sizes):
        if n > threshold:
            groups.append([i])
            continue
        current.append(i)
        total += n
        if total > threshold:
            groups.append(current)
            current, total = [], 0
    if current:
        groups.append(current)
    return groups


class Reducer:
    """Gradient reduction over ``communicator`` (see the module docstring).

    ``buffer_size``: the most elements SINGA's staged ``fused_all_reduce`` may hold.
    """

    def __init__(self, communicator: Communicator, buffer_size: int = DEFAULT_BUFFER_SIZE):
        self.communicator = communicator
        self.buffer_size = int(buffer_size)
        self._staged: list = []
        self._staged_size = 0
        self.checked = False    # check_start has run
        self.synced = False     # the ranks' parameters are known to be equal

    @property
    def world_size(self) -> int:
        return int(self.communicator.world_size)

    # ------------------------------------------------------------------ one array / a bucket
    def all_reduce(self, a, *, half: bool = False) -> None:
        """Sum ``a`` over the ranks, in place (float16 on the wire with ``half``)."""
        self.communicator.all_reduce(a, half=half)

    def all_reduce_bucket(self, arrays: Sequence, *, half: bool = False) -> None:
        """Sum ``arrays`` over the ranks in place: one array alone, several through one fused
        buffer."""
        if len(arrays) == 1:
            self.communicator.all_reduce(arrays[0], half=half)
            return
        xp = xp_of(arrays[0])
        buf = xp.concatenate([a.reshape(-1) for a in arrays])
        self.communicator.all_reduce(buf, half=half)
        _scatter(buf, arrays)

    def _check_buffer(self, arrays: Sequence, threshold: int) -> None:
        """A bucket of small arrays goes through the fused buffer: it must fit
        ``buffer_size`` (an array above ``threshold`` is reduced alone, unbuffered)."""
        if len(arrays) == 1 and int(arrays[0].size) > threshold:
            return
        n = sum(int(a.size) for a in arrays)
        if n > self.buffer_size:
            raise WorkbenchError(
                f"fused all-reduce: {n} values buffered, more than buffSize="
                f"{self.buffer_size}; raise DistOpt(buffSize=...) or lower the fusion "
                f"threshold")

    def stage(self, arrays: Sequence) -> None:
        """Copy ``arrays`` into the fused buffer (SINGA's ``fused_all_reduce(t, send=False)``)."""
        for a in arrays:
            self._staged_size += int(a.size)
            if self._staged_size > self.buffer_size:
                n = self._staged_size
                self._staged, self._staged_size = [], 0
                raise WorkbenchError(
                    f"fused all-reduce: {n} values buffered, more than buffSize="
                    f"{self.buffer_size}; raise DistOpt(buffSize=...) or lower the fusion "
                    f"threshold")
            self._staged.append(a.ravel().copy())

    def send(self, arrays: Sequence, *, half: bool = False) -> None:
        """Reduce the fused buffer and copy the sums into ``arrays`` (the arrays staged since
        the last send, in order; with nothing staged, ``arrays`` are staged first)."""
        if not self._staged:
            self.stage(arrays)
        staged, self._staged, self._staged_size = self._staged, [], 0
        got, held = sum(int(a.size) for a in arrays), sum(int(s.size) for s in staged)
        if got != held:
            raise WorkbenchError(
                f"fused all-reduce: send=True got {len(arrays)} tensor(s) of {got} values but "
                f"{len(staged)} tensor(s) of {held} values were buffered with send=False")
        buf = xp_of(staged[0]).concatenate(staged) if len(staged) > 1 else staged[0]
        self.communicator.all_reduce(buf, half=half)
        _scatter(buf, arrays)

    # ------------------------------------------------------------------ whole steps
    def reduce(self, grads: Sequence, threshold: int = DEFAULT_THRESHOLD, *,
               half: bool = False) -> None:
        """Sum the gradient arrays ``grads`` over the ranks in place, bucket by bucket
        (:func:`buckets`), and wait for the collectives."""
        for group in buckets([int(g.size) for g in grads], threshold):
            arrays = [grads[i] for i in group]
            self._check_buffer(arrays, threshold)
            self.all_reduce_bucket(arrays, half=half)
        self.communicator.wait()

    def average(self, arrays: Sequence) -> None:
        """Divide ``arrays`` (sums over the ranks) by the world size, in place."""
        if self.world_size > 1:
            for a in arrays:
                a /= a.dtype.type(self.world_size)

    def average_bucket(self, params: Sequence, threshold: int, partition: int) -> bool:
        """Average bucket ``partition`` (counted from 1, :func:`buckets` of ``params``) of the
        parameter arrays over the ranks, in place (SINGA's partial update). Returns True when
        that was the last bucket (a cycle over every parameter is complete)."""
        groups = buckets([int(p.size) for p in params], threshold)
        if 1 <= partition <= len(groups):
            chosen = [params[i] for i in groups[partition - 1]]
            self._check_buffer(chosen, threshold)
            self.all_reduce_bucket(chosen)
            self.communicator.wait()
            for a in chosen:
                a /= a.dtype.type(self.world_size)
        return partition >= len(groups)

    def reduce_sparse(self, grads: Sequence, threshold: int, spars: float, topk: bool,
                      residuals=None) -> None:
        """Sum sparsified gradients over the ranks in place, bucket by bucket;
        ``residuals(k, size)`` gives bucket ``k``'s float32 residual array (or None for no
        residual)."""
        for k, group in enumerate(buckets([int(g.size) for g in grads], threshold)):
            arrays = [grads[i] for i in group]
            acc = residuals(k, sum(int(a.size) for a in arrays)) if residuals else None
            self.sparsify(arrays, acc, spars, topk)
        self.communicator.wait()

    def sparsify(self, arrays: Sequence, residual, spars: float, topk: bool) -> None:
        """All-reduce ``arrays`` (fused when several) sending only their significant elements
        (:meth:`sparse_all_reduce`), in place."""
        xp = xp_of(arrays[0])
        buf = arrays[0].reshape(-1) if len(arrays) == 1 else xp.concatenate(
            [a.reshape(-1) for a in arrays])
        acc = None if residual is None else residual.reshape(-1)
        _scatter(self.sparse_all_reduce(buf, acc, float(spars), bool(topk)), arrays)

    def sparse_all_reduce(self, g, acc, spars: float, topk: bool):
        """The sum over the ranks of the significant elements of the flat float32 array ``g``:
        those with ``|g| >= spars`` (``topk`` False) or the ``ceil(spars * size)`` largest in
        magnitude (``topk`` True). With ``acc`` (float32, same size) the previous steps'
        unsent remainder is added first and this step's remainder is kept there. Returns a
        new dense array."""
        xp = xp_of(g)
        if g.dtype != np.float32:
            raise WorkbenchError(f"sparsification supports float32 gradients (as SINGA's), "
                                 f"got {g.dtype}")
        n = int(g.size)
        work = g.astype(np.float32, copy=True)
        if acc is not None:
            if int(acc.size) != n:
                raise WorkbenchError(f"sparsification: the accumulation has {acc.size} "
                                     f"values, the gradient {n}")
            work += acc
        if topk:
            k = min(n, max(0, int(math.ceil(spars * n))))
            if k == 0:
                idx = xp.zeros(0, np.int64)
            elif k == n:
                idx = xp.arange(n)
            else:  # the k largest magnitudes (O(n); SINGA sorts them all)
                idx = xp.sort(xp.argpartition(-xp.abs(work), k - 1)[:k])
        else:
            idx = xp.nonzero(xp.abs(work) >= np.float32(spars))[0]
        idx = idx.astype(np.int32)
        vals = work[idx]
        if acc is not None:  # the residual: what this rank did not send
            acc[...] = work
            acc[idx] = 0
        comm = self.communicator
        counts = comm.all_gather(xp.asarray([idx.size], dtype=np.int64))
        counts = [int(c) for c in (counts.get() if xp is not np else counts)[:, 0]]
        m = max(counts)
        payload = xp.zeros(2 * m, np.float32)
        payload[:idx.size] = idx.view(np.float32)
        payload[m:m + idx.size] = vals
        everyone = comm.all_gather(payload)
        dense = xp.zeros(n, np.float32)
        for r, c in enumerate(counts):
            ii = everyone[r, :c].view(np.int32)
            dense[ii] += everyone[r, m:m + c]
        return dense

    # ------------------------------------------------------------------ agreement
    def check_start(self, params: Sequence) -> bool:
        """Check once that every rank holds parameter arrays of the same shapes and dtypes
        (a ``WorkbenchError`` naming this rank's otherwise) and values; where the values
        differ and the ranks were not synchronised before (:attr:`synced`), rank 0's are
        broadcast. Returns True when that broadcast happened (the caller says so)."""
        xp = xp_of(params[0])
        sig = repr([(tuple(p.shape), str(p.dtype)) for p in params])
        values = 0
        for p in params:
            h = p.get() if xp is not np else p
            values = zlib.crc32(np.ascontiguousarray(h).tobytes(), values)
        mine = xp.asarray([zlib.crc32(sig.encode()), values], dtype=np.int64)
        everyone = self.communicator.all_gather(mine)
        everyone = everyone.get() if xp is not np else everyone
        self.checked = True
        if len(set(everyone[:, 0].tolist())) > 1:
            raise WorkbenchError(
                f"DistOpt: the ranks' models differ (rank {self.communicator.global_rank} has "
                f"{len(params)} trainable parameters {sig[:200]}...); every rank must build "
                f"the same model and freeze the same layers")
        broadcast = len(set(everyone[:, 1].tolist())) > 1 and not self.synced
        if broadcast:
            for p in params:
                self.communicator.broadcast(p, 0)
        self.synced = True
        return broadcast

    def broadcast(self, arrays: Sequence, root: int = 0) -> None:
        """Overwrite ``arrays`` with rank ``root``'s, in place; the ranks are then in sync."""
        for a in arrays:
            self.communicator.broadcast(a, root)
        self.synced = True


def _scatter(buf, arrays) -> None:
    """Copy the flat ``buf`` back into ``arrays`` (in order)."""
    off = 0
    for a in arrays:
        a[...] = buf[off:off + a.size].reshape(a.shape)
        off += a.size
