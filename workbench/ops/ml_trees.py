"""ai.onnx.ml tree ensembles: TreeEnsembleRegressor and TreeEnsembleClassifier (opsets 1 and
3; opset 3 adds the double-precision ``*_as_tensor`` attributes; their deprecated opset-5
schemas are served by the opset-3 kernels), and TreeEnsemble (opset 5).

All three are translated into one array-based node table (:class:`Forest`): every node of
every tree is a row (feature, threshold, mode, true child, false child, missing-value track),
leaves point to themselves, and each leaf owns a slice of (target, weight) pairs. Evaluation is
vectorised over all (row, tree) pairs at once: each step gathers the current node of every
unfinished pair, compares, moves to a child and drops the pairs that reached a leaf, so the
number of Python-level steps is the depth of the deepest tree, whatever the number of rows,
trees or nodes. Rows are processed in chunks so the working set stays in cache. Aggregation is
a ``bincount`` over (row, target) (SUM, AVERAGE) or a ``ufunc.at`` (MIN, MAX).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field

import numpy as np

from workbench import compiled
from workbench.errors import InputError, ShapeError
from workbench.ops.ml_common import (
    apply_post_transform,
    binary_label_and_scores,
    features_2d,
    labels_of,
    like_input,
    pt_name,
)
from workbench.ops.parallel import n_workers, run_blocks
from workbench.ops.registry import kernel

ML = "ai.onnx.ml"

LEQ, LT, GTE, GT, EQ, NEQ, MEMBER, LEAF = range(8)
_MODE_CODES = {"BRANCH_LEQ": LEQ, "BRANCH_LT": LT, "BRANCH_GTE": GTE, "BRANCH_GT": GT,
               "BRANCH_EQ": EQ, "BRANCH_NEQ": NEQ, "BRANCH_MEMBER": MEMBER, "LEAF": LEAF}
#: (row, tree) pairs evaluated together: big enough to amortise numpy's per-call cost, small
#: enough to stay in the CPU caches
_CHUNK_PAIRS = 1 << 17


@dataclass
class Forest:
    feature: np.ndarray          # int64 [G]
    threshold: np.ndarray        # float64 [G]
    mode: np.ndarray             # int8 [G]
    true_next: np.ndarray        # int64 [G] (leaves: themselves)
    false_next: np.ndarray       # int64 [G]
    track_true: np.ndarray | None  # bool [G] or None when no node tracks missing values
    roots: np.ndarray            # int64 [T]
    leaf_start: np.ndarray       # int64 [G]: first (target, weight) pair of a leaf
    leaf_count: np.ndarray       # int64 [G]: number of pairs of a leaf (0 for branches)
    targets: np.ndarray          # int64 [P]
    weights: np.ndarray          # float64 [P]
    members: dict = field(default_factory=dict)  # node -> sorted member values
    n_outputs: int = 1

    @property
    def is_leaf(self) -> np.ndarray:
        return self.mode == LEAF

    def validate(self, op: str, n_features: int) -> None:
        """Check the forest against X's feature count (the ranges it checks are found once:
        a run of a 5M-node forest must not scan its nodes again)."""
        rng = getattr(self, "_feature_range", None)
        if rng is None:
            if self.targets.size and (int(self.targets.min()) < 0
                                      or int(self.targets.max()) >= self.n_outputs):
                raise InputError(f"{op}: a leaf writes to target/class "
                                 f"{int(self.targets.max())}, outside [0, {self.n_outputs})")
            branch = self.mode != LEAF
            rng = self._feature_range = (int(self.feature[branch].min()),
                                         int(self.feature[branch].max())) \
                if branch.any() else (0, -1)
        fmin, fmax = rng
        if fmin < 0 or fmax >= n_features:
            bad = fmax if fmax >= n_features else fmin
            raise ShapeError(f"{op}: a node reads feature {bad} but X has {n_features} "
                             f"features")

    # ---------------------------------------------------------------- evaluation
    def _prepare(self) -> None:
        """Evaluation tables, built once: children interleaved (``child[2 * node + go]``),
        int32 indices, float32 thresholds where they are exact in float32."""
        if getattr(self, "_child", None) is not None:
            return
        g = self.mode.size
        child = np.empty(2 * g, dtype=np.int32)
        child[0::2] = self.false_next
        child[1::2] = self.true_next
        self._child = child
        self._feat = self.feature.astype(np.int32)
        t32 = self.threshold.astype(np.float32)
        same = (t32.astype(np.float64) == self.threshold) | np.isnan(self.threshold)
        self._thr32 = t32 if same.all() else None
        self._leaf = self.mode == LEAF
        self._modes = np.unique(self.mode[~self._leaf])
        self._nodes32 = self._roots32 = None    # the compiled traversal's tables, on first use
        self._pairs_ok = False

    def ready(self) -> Forest:
        """Build the evaluation tables now (at prepare: the first run then only walks)."""
        self._prepare()
        self._dense()
        if compiled.enabled() and not self.members and MEMBER not in self._modes:
            self._records()
        return self

    def leaves(self, x: np.ndarray, op: str) -> np.ndarray:
        """The leaf every row reaches in every tree: an int32 [N, T] matrix.

        Blocks of (rows x trees) pairs are walked together: all the rows of a block of trees
        (up to ``_CHUNK_PAIRS`` pairs), pairs ordered tree by tree, so the nodes of a large
        forest are read from memory once per block instead of once per row chunk."""
        self._prepare()
        n, t = x.shape[0], self.roots.size
        out = np.empty((n, t), dtype=np.int32)
        if n == 0 or t == 0:
            return out
        if x.dtype == np.float32 and self._thr32 is not None:
            thr = self._thr32
        else:
            x, thr = x.astype(np.float64, copy=False), self.threshold
        x = np.ascontiguousarray(x)
        done = self._leaves_compiled(x, thr, op)
        if done is not None:
            return done
        rstep = min(n, _CHUNK_PAIRS)
        tstep = max(1, _CHUNK_PAIRS // rstep)
        roots = self.roots.astype(np.int32)
        for r0 in range(0, n, rstep):
            for t0 in range(0, t, tstep):
                out[r0:r0 + rstep, t0:t0 + tstep] = self._leaves_chunk(
                    x[r0:r0 + rstep], thr, op, roots[t0:t0 + tstep])
        return out

    def _leaves_compiled(self, x: np.ndarray, thr: np.ndarray, op: str):
        """:meth:`leaves` by the compiled traversal (``workbench.compiled.kernels.trees``,
        one 16-byte record per node), the trees split over the engine's threads; None when it
        is not loaded (yet), or for forests with BRANCH_MEMBER nodes or features >= 2**24
        (the numpy path then)."""
        if self.members or MEMBER in self._modes:
            return None
        f32 = thr.dtype == np.float32
        k = compiled.kernel("trees.leaves_f32" if f32 else "trees.leaves_f64")
        if k is None or x.dtype != thr.dtype:
            return None
        nodes = self._records()
        if nodes is None:
            return None
        n, f = x.shape
        t, g = self.roots.size, self.mode.size
        out = np.empty((n, t), dtype=np.int32)
        args = (x, nodes, nodes.view(np.float32) if f32 else thr, self._roots32, out, n, f, g,
                t)
        step = max(1, -(-t // (4 * n_workers())))
        jobs = [(t0, min(t, t0 + step)) for t0 in range(0, t, step)]

        def work(chunk):
            for t0, t1 in chunk:
                k(*args, t0, t1)
        run_blocks(np, jobs, work, n * t * 16)
        if n and t and int(out.min()) < 0:
            raise InputError(f"{op}: a tree has a cycle (no leaf reached after {g + 8} steps)")
        return out

    def _sum_compiled(self, x: np.ndarray, op: str):
        """(scores [N, k] float64, hits [N, k] bool) by the compiled walk that sums the leaf
        weights as it reaches them (``trees.sum_f32``/``sum_f64``), rows split over the
        engine's threads; None when it cannot run (then :meth:`leaves` and the numpy
        aggregation)."""
        if self.members or MEMBER in self._modes:
            return None
        n, t, k = x.shape[0], self.roots.size, self.n_outputs
        x, thr = self._x_thr(x)
        f32 = thr.dtype == np.float32
        kern = compiled.kernel("trees.sum_f32" if f32 else "trees.sum_f64")
        if kern is None or n == 0 or t == 0:
            return None
        nodes = self._records()
        if nodes is None or not self._pairs_ok:
            return None
        scores = np.zeros((n, k))
        hits = np.zeros((n, k), np.uint8)
        err = np.zeros(1, np.int64)
        tgt = np.ascontiguousarray(self.targets, dtype=np.int64)
        wt = np.ascontiguousarray(self.weights, dtype=np.float64)
        args = (x, nodes, nodes.view(np.float32) if f32 else thr, self._roots32, tgt, wt,
                scores, hits, err, n, x.shape[1], self.mode.size, t, k, tgt.size)
        # one block of rows per thread: each block is one pass over the whole node table
        # (streamed from memory for a large forest), so no more blocks than threads
        step = max(1, -(-n // n_workers()))
        jobs = [(r0, min(n, r0 + step)) for r0 in range(0, n, step)]

        def work(chunk):
            for r0, r1 in chunk:
                kern(*args, r0, r1)
        run_blocks(np, jobs, work, n * t * 16)
        if err[0]:
            raise InputError(f"{op}: a tree has a cycle (no leaf reached after "
                             f"{self.mode.size + 8} steps)")
        return scores, hits.view(bool)

    def _x_thr(self, x: np.ndarray):
        """(x, thresholds) in the dtype the walk compares in: float32 when x is and every
        threshold is exact in float32, else float64; x C-contiguous."""
        if x.dtype == np.float32 and self._thr32 is not None:
            return np.ascontiguousarray(x), self._thr32
        return np.ascontiguousarray(x, dtype=np.float64), self.threshold

    def _records(self):
        """The compiled traversal's node table, made once: int32 (G, 4) records (feature |
        flags << 24, threshold float32 bits, false child, true child; flags: the comparison
        code, 7 for a leaf, + 8 when NaN goes to the true branch; a leaf's fields 1 and 2: the
        first of its (target, weight) pairs and their count). None when a feature index or
        the node count does not fit."""
        if self._nodes32 is False:
            return None
        if self._nodes32 is None:
            g = self.mode.size
            branch = ~self._leaf
            if g >= 2 ** 31 - 8 or (branch.any() and int(self.feature[branch].max()) >= 1 << 24):
                self._nodes32 = False
                return None
            flags = self.mode.astype(np.int32)
            if self.track_true is not None:
                flags |= self.track_true.astype(np.int32) << 3
            rec = np.empty((g, 4), np.int32)
            rec[:, 0] = np.where(branch, self._feat, 0) | (flags << 24)
            rec[:, 1] = self._thr32.view(np.int32) if self._thr32 is not None else 0
            rec[:, 2] = self.false_next
            rec[:, 3] = self.true_next
            if self.targets.size < 2 ** 31:     # a leaf: where its (target, weight) pairs are
                rec[self._leaf, 1] = self.leaf_start[self._leaf]
                rec[self._leaf, 2] = self.leaf_count[self._leaf]
                self._pairs_ok = True
            self._nodes32 = rec
            self._roots32 = self.roots.astype(np.int32)
        return self._nodes32

    def _leaves_chunk(self, x: np.ndarray, thr: np.ndarray, op: str,
                      roots: np.ndarray) -> np.ndarray:
        """[rows, trees] leaves of ``roots``' trees; pair p = tree * rows + row."""
        n, f = x.shape
        t = roots.size
        res = np.repeat(roots, n)
        xflat = x.reshape(-1)
        leaf, child, feat = self._leaf, self._child, self._feat
        modes = self._modes
        single = int(modes[0]) if modes.size == 1 else None
        track = self.track_true
        pidx = np.flatnonzero(~leaf[res]).astype(np.int32)
        cur = res[pidx]
        rb = (pidx % n).astype(np.int32) * f if n * f < 2 ** 31 else (pidx % n) * f
        limit = self.mode.size + 8
        steps = 0
        while cur.size:
            # a few steps on every unfinished pair (leaves loop onto themselves), then drop
            # the pairs that reached a leaf
            # (np.take with mode="clip" skips the bounds checks of fancy indexing, about 1.5x
            # faster; every index here is valid by construction)
            for _ in range(4):
                steps += 1
                v = np.take(xflat, rb + np.take(feat, cur, mode="clip"), mode="clip")
                th = np.take(thr, cur, mode="clip")
                if single is not None and not self.members:
                    go = _compare(single, v, th)
                else:
                    go = self._go_mixed(cur, v, th)
                if track is not None:
                    go |= np.isnan(v) & track[cur]
                cur = np.take(child, 2 * cur + go, mode="clip")
            done = np.take(leaf, cur, mode="clip")
            if done.any():
                res[pidx[done]] = cur[done]
                keep = ~done
                pidx, cur, rb = pidx[keep], cur[keep], rb[keep]
            if steps > limit:
                raise InputError(f"{op}: a tree has a cycle (no leaf reached after {limit} "
                                 f"steps)")
        return res.reshape(t, n).T

    def _go_mixed(self, nd, v, th):
        m = self.mode[nd]
        go = np.zeros(nd.size, dtype=bool)
        for code in self._modes:
            sel = m == code
            if sel.any():
                go[sel] = _compare(int(code), v[sel], th[sel])
        if self.members:
            self._member_branches(nd, v, go)
        return go

    def _member_branches(self, nd, v, go) -> None:
        for node, values in self.members.items():
            sel = nd == node
            if sel.any():
                go[sel] = np.isin(v[sel], values)

    #: dense leaf-value tables up to this many entries (nodes x outputs)
    DENSE_MAX = 1 << 22    # 32 MiB of float64 values

    def _dense(self):
        """(values [G, k] float64, has [G, k] bool): every node's weight per output (zero and
        False for branches), or None when too large; built once."""
        if getattr(self, "_dense_tables", False) is not False:
            return self._dense_tables
        g, k = self.mode.size, self.n_outputs
        tables = None
        if g * k <= self.DENSE_MAX:
            owner = np.repeat(np.arange(g), self.leaf_count)
            pos = np.repeat(self.leaf_start, self.leaf_count) + _ranks(self.leaf_count)
            vals = np.zeros((g, k))
            has = np.zeros((g, k), dtype=bool)
            np.add.at(vals, (owner, self.targets[pos]), self.weights[pos])
            has[owner, self.targets[pos]] = True
            tables = (vals, has)
        self._dense_tables = tables
        return tables

    def evaluate(self, x: np.ndarray, how: str, op: str, need_hits: bool = False):
        """(scores [N, k] float64, hit [N, k] bool or None) for every row: the leaves reached
        in every tree, aggregated per target, chunk by chunk (the leaf matrix of a chunk stays
        in cache). ``hit`` (which targets received a weight) only with ``need_hits``."""
        self._prepare()
        if how in ("SUM", "AVERAGE"):
            fused = self._sum_compiled(x, op)
            if fused is not None:
                scores, hits = fused
                if how == "AVERAGE":
                    scores /= max(self.roots.size, 1)
                return scores, hits
        dense = self._dense()
        if dense is None:
            return self.aggregate(self.leaves(x, op), how)
        vals, has = dense
        n, t = x.shape[0], self.roots.size
        k = self.n_outputs
        scores = np.zeros((n, k))
        # every leaf writes the same targets (the usual case): hits are the same for all rows
        # (found once: it scans every leaf)
        uniform = getattr(self, "_uniform_hits", False)
        if uniform is False:
            leaf_has = has[self._leaf]
            uniform = self._uniform_hits = leaf_has[0].copy() if leaf_has.shape[0] > 0 and \
                bool((leaf_has == leaf_has[0]).all()) else None
        if uniform is not None and how in ("SUM", "AVERAGE"):
            hits = np.broadcast_to(uniform if t else np.zeros(k, bool), (n, k)) \
                if need_hits else None
            need_hits = False
        else:
            hits = np.zeros((n, k), dtype=bool)
            need_hits = True
        step = max(1, _CHUNK_PAIRS // max(t, 1))
        for r0 in range(0, n, step):
            leaves = self.leaves(x[r0:r0 + step], op)
            if need_hits:
                h = np.take(has, leaves, axis=0, mode="clip")  # [rows, trees, k]
                hits[r0:r0 + step] = h.any(axis=1)
            if how in ("SUM", "AVERAGE"):
                scores[r0:r0 + step] = np.take(vals, leaves, axis=0, mode="clip").sum(axis=1)
            else:
                fill = np.inf if how == "MIN" else -np.inf
                v = np.where(h, vals[leaves], fill)
                v = v.min(axis=1) if how == "MIN" else v.max(axis=1)
                scores[r0:r0 + step] = np.where(np.isfinite(v), v, 0.0)
        if how == "AVERAGE":
            scores /= max(t, 1)
        return scores, hits

    def aggregate(self, leaves: np.ndarray, how: str):
        """(scores [N, n_outputs] float64, hit [N, n_outputs] bool): the leaves' weights
        combined per (row, target) by SUM, AVERAGE, MIN or MAX; ``hit`` says which (row,
        target) received any weight."""
        n, t = leaves.shape
        k = self.n_outputs
        flat = leaves.reshape(-1)
        cnt = self.leaf_count[flat]
        start = self.leaf_start[flat]
        rows = np.repeat(np.arange(n, dtype=np.int64), t)
        if cnt.size and (cnt == cnt[0]).all():
            c = int(cnt[0])
            idx = (start[:, None] + np.arange(c)).reshape(-1)
            rows = np.repeat(rows, c)
        else:
            total = int(cnt.sum())
            offs = np.repeat(np.cumsum(cnt) - cnt, cnt)
            idx = np.repeat(start, cnt) + (np.arange(total) - offs)
            rows = np.repeat(rows, cnt)
        key = rows * k + self.targets[idx]
        w = self.weights[idx]
        hits = np.bincount(key, minlength=n * k).reshape(n, k) > 0
        if how in ("SUM", "AVERAGE"):
            s = np.bincount(key, weights=w, minlength=n * k).reshape(n, k)
            if how == "AVERAGE":
                s = s / max(t, 1)
            return s, hits
        fill = np.inf if how == "MIN" else -np.inf
        s = np.full(n * k, fill)
        (np.minimum if how == "MIN" else np.maximum).at(s, key, w)
        s = s.reshape(n, k)
        s[~hits] = 0.0
        return s, hits


def _ranks(counts: np.ndarray) -> np.ndarray:
    """0, 1, ..., c-1 for every count c, concatenated."""
    total = int(counts.sum())
    return np.arange(total) - np.repeat(np.cumsum(counts) - counts, counts)


def _compare(code: int, v, th):
    if code == LEQ:
        return v <= th
    if code == LT:
        return v < th
    if code == GTE:
        return v >= th
    if code == GT:
        return v > th
    if code == EQ:
        return v == th
    if code == NEQ:
        return v != th
    return np.zeros(v.shape, dtype=bool)  # MEMBER: decided by _member_branches


# --------------------------------------------------------------------------- opsets 1 / 3


def _double_or(op, name, values, tensor):
    """An attribute given as floats or (opset 3) as a double tensor ``name_as_tensor``."""
    if tensor is not None:
        if values is not None and len(values):
            raise InputError(f"{op}: {name} and {name}_as_tensor are both set; use one")
        return np.asarray(tensor, dtype=np.float64).reshape(-1)
    if values is None:
        return None
    return np.asarray(values, dtype=np.float32).astype(np.float64).reshape(-1)


def _ints(values):
    return np.asarray(values if values is not None else [], dtype=np.int64).reshape(-1)


#: node modes by name, as str and as bytes
_MODE_LOOKUP = {**_MODE_CODES, **{k.encode(): v for k, v in _MODE_CODES.items()}}


def _mode_codes(op: str, modes) -> np.ndarray:
    """The int8 code of every node mode (names as str or bytes), in one pass over the list."""
    if isinstance(modes, np.ndarray):
        modes = modes.reshape(-1).tolist()
    codes = np.fromiter(map(_MODE_LOOKUP.get, modes, itertools.repeat(-1)), dtype=np.int8,
                        count=len(modes))
    if (codes < 0).any():
        bad = modes[int(np.flatnonzero(codes < 0)[0])]
        bad = bad.decode(errors="replace") if isinstance(bad, bytes) else bad
        raise InputError(f"{op}: unknown node mode {bad!r}; expected one of "
                         f"{sorted(_MODE_CODES)}")
    return codes


def forest_from_v3(op: str, *, treeids, nodeids, featureids, modes, values, truenodeids,
                   falsenodeids, missing_tracks, w_treeids, w_nodeids, w_ids, w_weights,
                   n_outputs: int) -> Forest:
    """The node table of the opset-1/3 attribute layout: nodes named (tree id, node id),
    children named by node id within the tree, leaf weights named by (tree id, node id)."""
    tree = _ints(treeids)
    node = _ints(nodeids)
    g = tree.size
    modes = modes if modes is not None else []
    truenodeids, falsenodeids = _ints(truenodeids), _ints(falsenodeids)
    for name, size in (("nodes_nodeids", node.size), ("nodes_featureids", _ints(featureids).size),
                       ("nodes_modes", len(modes)), ("nodes_truenodeids", truenodeids.size),
                       ("nodes_falsenodeids", falsenodeids.size)):
        if size != g:
            raise InputError(f"{op}: {name} has {size} entries, nodes_treeids has {g}")
    if g == 0:
        raise InputError(f"{op}: the ensemble has no nodes")
    mode = _mode_codes(op, modes)
    thr = values if values is not None else np.zeros(g)
    if thr.size != g:
        raise InputError(f"{op}: nodes_values has {thr.size} entries for {g} nodes")
    span = int(max(node.max(), truenodeids.max(), falsenodeids.max(), 0)) + 1
    keys = tree * span + node
    order = np.argsort(keys, kind="stable")
    sorted_keys = keys[order]
    if np.any(sorted_keys[1:] == sorted_keys[:-1]):
        dup = int(np.flatnonzero(sorted_keys[1:] == sorted_keys[:-1])[0])
        k = int(sorted_keys[dup])
        raise InputError(f"{op}: node (tree {k // span}, id {k % span}) is defined twice")

    def find(tids, nids, what, must=True):
        q = tids * span + nids
        pos = np.clip(np.searchsorted(sorted_keys, q), 0, g - 1)
        found = sorted_keys[pos] == q
        if must and not found.all():
            i = int(np.flatnonzero(~found)[0])
            raise InputError(f"{op}: {what} refers to node (tree {int(tids[i])}, id "
                             f"{int(nids[i])}), which does not exist")
        return order[pos], found

    branch = mode != LEAF
    idx = np.arange(g, dtype=np.int64)
    tnext, fnext = idx.copy(), idx.copy()
    if branch.any():
        tnext[branch], _ = find(tree[branch], truenodeids[branch], "a true branch")
        fnext[branch], _ = find(tree[branch], falsenodeids[branch], "a false branch")
    # roots: per tree, the first node (in attribute order) that no branch points to
    child = np.zeros(g, dtype=bool)
    child[tnext[branch]] = True
    child[fnext[branch]] = True
    # (one sort over all nodes: a loop over the trees scanning every node is quadratic, hours
    # for a 10,000-tree model)
    nonchild = np.flatnonzero(~child)
    root_tids, first = np.unique(tree[nonchild], return_index=True)
    tree_ids = np.unique(tree)
    if root_tids.size != tree_ids.size:
        tid = int(np.setdiff1d(tree_ids, root_tids)[0])
        raise InputError(f"{op}: tree {tid} has no root (every node is a child)")
    roots = nonchild[first].astype(np.int64)
    track = None
    if missing_tracks is not None and len(missing_tracks):
        tr = np.asarray(missing_tracks, dtype=bool).reshape(-1)
        if tr.size != g:
            raise InputError(f"{op}: nodes_missing_value_tracks_true has {tr.size} entries "
                             f"for {g} nodes")
        track = tr if tr.any() else None
    # leaf weights
    wt, wn, wi = _ints(w_treeids), _ints(w_nodeids), _ints(w_ids)
    ww = w_weights if w_weights is not None else np.zeros(0)
    if not (wt.size == wn.size == wi.size == ww.size):
        raise InputError(f"{op}: the leaf weight attributes have different lengths "
                         f"({wt.size}, {wn.size}, {wi.size}, {ww.size})")
    wg, _ = find(wt, wn, "a leaf weight")
    if wg.size and (mode[wg] != LEAF).any():
        i = int(np.flatnonzero(mode[wg] != LEAF)[0])
        raise InputError(f"{op}: a weight is attached to node (tree {int(wt[i])}, id "
                         f"{int(wn[i])}), which is not a LEAF")
    worder = np.argsort(wg, kind="stable")
    cnt = np.bincount(wg, minlength=g).astype(np.int64)
    start = np.cumsum(cnt) - cnt
    forest = Forest(np.where(branch, _ints(featureids), 0), thr.astype(np.float64), mode,
                    tnext, fnext, track, roots, start, cnt, wi[worder], ww[worder],
                    n_outputs=n_outputs)
    return forest


def _x_for_trees(op, X):
    """X as [N, F]; float32 stays float32 (compared with float32 thresholds: the same
    decisions as in float64, half the memory traffic)."""
    from workbench.ops.ml_common import host
    x = host(X)
    if x.dtype == np.float32 and x.ndim == 2:
        return np.ascontiguousarray(x)
    return features_2d(op, X)


_AGGREGATES = ("SUM", "AVERAGE", "MIN", "MAX")


def _cached(ctx, build, key="forest"):
    """What ``build()`` makes for the node (its Forest, its setup), made at prepare (see
    :func:`_prepare_with`) or on its first run, and kept in the node's context."""
    if ctx is None:
        return build()
    forest = ctx.extra.get(key)
    if forest is None:
        forest = ctx.extra[key] = build()
    return forest


def _prepare_with(setup):
    """A kernel's ``prepare(**attrs)`` (called once when a plan binds the node, see
    ``workbench.runtime.plan.bind_kernels``): the node's setup built from its attributes and
    kept in its context, so the first run does not pay for it (a 5M-node forest)."""
    def prepare(*, ctx=None, **attrs):
        if ctx is not None and ctx.extra.get("setup") is None:
            ctx.extra["setup"] = setup(**attrs)
    return prepare


def _regressor_setup(*, aggregate_function="SUM", base_values=None,
                     base_values_as_tensor=None, n_targets=None, nodes_falsenodeids=None,
                     nodes_featureids=None, nodes_hitrates=None, nodes_hitrates_as_tensor=None,
                     nodes_missing_value_tracks_true=None, nodes_modes=None, nodes_nodeids=None,
                     nodes_treeids=None, nodes_truenodeids=None, nodes_values=None,
                     nodes_values_as_tensor=None, post_transform="NONE", target_ids=None,
                     target_nodeids=None, target_treeids=None, target_weights=None,
                     target_weights_as_tensor=None) -> dict:
    """Everything a TreeEnsembleRegressor node's runs need from its attributes: the forest,
    the aggregate, the base values, the post transform."""
    op = "TreeEnsembleRegressor"
    agg = aggregate_function.decode() if isinstance(aggregate_function, bytes) else \
        str(aggregate_function)
    if agg not in _AGGREGATES:
        raise InputError(f"{op}: aggregate_function {agg!r} must be one of {_AGGREGATES}")
    tids = _ints(target_ids)
    k = int(n_targets) if n_targets is not None else (int(tids.max()) + 1 if tids.size else 1)
    forest = forest_from_v3(
        op, treeids=nodes_treeids, nodeids=nodes_nodeids, featureids=nodes_featureids,
        modes=nodes_modes, values=_double_or(op, "nodes_values", nodes_values,
                                             nodes_values_as_tensor),
        truenodeids=nodes_truenodeids, falsenodeids=nodes_falsenodeids,
        missing_tracks=nodes_missing_value_tracks_true, w_treeids=target_treeids,
        w_nodeids=target_nodeids, w_ids=tids,
        w_weights=_double_or(op, "target_weights", target_weights, target_weights_as_tensor),
        n_outputs=k)
    base = _double_or(op, "base_values", base_values, base_values_as_tensor)
    if base is not None and base.size and base.size != k:
        raise InputError(f"{op}: {base.size} base_values for {k} targets")
    return {"forest": forest.ready(), "agg": agg, "pt": pt_name(op, post_transform),
            "base": base if base is not None and base.size else None}


@kernel("TreeEnsembleRegressor", since=1, domain=ML, wants_ctx=True)
@kernel("TreeEnsembleRegressor", since=3, domain=ML, wants_ctx=True)
def tree_ensemble_regressor(X, *, aggregate_function="SUM", base_values=None,
                            base_values_as_tensor=None, n_targets=None,
                            nodes_falsenodeids=None, nodes_featureids=None,
                            nodes_hitrates=None, nodes_hitrates_as_tensor=None,
                            nodes_missing_value_tracks_true=None, nodes_modes=None,
                            nodes_nodeids=None, nodes_treeids=None, nodes_truenodeids=None,
                            nodes_values=None, nodes_values_as_tensor=None,
                            post_transform="NONE", target_ids=None, target_nodeids=None,
                            target_treeids=None, target_weights=None,
                            target_weights_as_tensor=None, ctx=None):
    """Sum (or average, min, max) of the leaf weights each row reaches per target, plus
    base_values, post-transformed. [N, n_targets] float32."""
    op = "TreeEnsembleRegressor"
    x = _x_for_trees(op, X)
    s = _cached(ctx, lambda: _regressor_setup(
        aggregate_function=aggregate_function, base_values=base_values,
        base_values_as_tensor=base_values_as_tensor, n_targets=n_targets,
        nodes_falsenodeids=nodes_falsenodeids, nodes_featureids=nodes_featureids,
        nodes_missing_value_tracks_true=nodes_missing_value_tracks_true,
        nodes_modes=nodes_modes, nodes_nodeids=nodes_nodeids, nodes_treeids=nodes_treeids,
        nodes_truenodeids=nodes_truenodeids, nodes_values=nodes_values,
        nodes_values_as_tensor=nodes_values_as_tensor, post_transform=post_transform,
        target_ids=target_ids, target_nodeids=target_nodeids, target_treeids=target_treeids,
        target_weights=target_weights, target_weights_as_tensor=target_weights_as_tensor),
        "setup")
    forest = s["forest"]
    forest.validate(op, x.shape[1])
    scores, _ = forest.evaluate(x, s["agg"], op)
    if s["base"] is not None:
        scores = scores + s["base"]
    if s["pt"] != "NONE":
        scores = apply_post_transform(scores, s["pt"])
    return like_input(scores.astype(np.float32), X)


tree_ensemble_regressor.prepare = _prepare_with(_regressor_setup)


def _classifier_setup(*, base_values=None, base_values_as_tensor=None, class_ids=None,
                      class_nodeids=None, class_treeids=None, class_weights=None,
                      class_weights_as_tensor=None, classlabels_int64s=None,
                      classlabels_strings=None, nodes_falsenodeids=None, nodes_featureids=None,
                      nodes_hitrates=None, nodes_hitrates_as_tensor=None,
                      nodes_missing_value_tracks_true=None, nodes_modes=None,
                      nodes_nodeids=None, nodes_treeids=None, nodes_truenodeids=None,
                      nodes_values=None, nodes_values_as_tensor=None,
                      post_transform="NONE") -> dict:
    """Everything a TreeEnsembleClassifier node's runs need from its attributes: labels,
    forest, the classes the leaves vote for, whether all weights are positive, base values,
    the post transform."""
    op = "TreeEnsembleClassifier"
    labels, _ = labels_of(op, classlabels_int64s, classlabels_strings)
    k = len(labels)
    cids = _ints(class_ids)
    weights = _double_or(op, "class_weights", class_weights, class_weights_as_tensor)
    forest = forest_from_v3(
        op, treeids=nodes_treeids, nodeids=nodes_nodeids, featureids=nodes_featureids,
        modes=nodes_modes, values=_double_or(op, "nodes_values", nodes_values,
                                             nodes_values_as_tensor),
        truenodeids=nodes_truenodeids, falsenodeids=nodes_falsenodeids,
        missing_tracks=nodes_missing_value_tracks_true, w_treeids=class_treeids,
        w_nodeids=class_nodeids, w_ids=cids, w_weights=weights, n_outputs=k)
    base = _double_or(op, "base_values", base_values, base_values_as_tensor)
    base = base if base is not None and base.size else None
    if k == 2:
        if base is not None and base.size > 2:
            raise InputError(f"{op}: {base.size} base_values for 2 classes")
    elif base is not None and base.size != k:
        raise InputError(f"{op}: {base.size} base_values for {k} classes")
    return {"labels": labels, "forest": forest.ready(), "used": np.unique(cids),
            "positive": weights is None or bool((weights >= 0).all()), "base": base,
            "pt": pt_name(op, post_transform)}


@kernel("TreeEnsembleClassifier", since=1, domain=ML, wants_ctx=True)
@kernel("TreeEnsembleClassifier", since=3, domain=ML, wants_ctx=True)
def tree_ensemble_classifier(X, *, base_values=None, base_values_as_tensor=None,
                             class_ids=None, class_nodeids=None, class_treeids=None,
                             class_weights=None, class_weights_as_tensor=None,
                             classlabels_int64s=None, classlabels_strings=None,
                             nodes_falsenodeids=None, nodes_featureids=None,
                             nodes_hitrates=None, nodes_hitrates_as_tensor=None,
                             nodes_missing_value_tracks_true=None, nodes_modes=None,
                             nodes_nodeids=None, nodes_treeids=None, nodes_truenodeids=None,
                             nodes_values=None, nodes_values_as_tensor=None,
                             post_transform="NONE", ctx=None):
    """Per-class sums of the leaf weights each row reaches (plus base_values); the label is
    the best class. A two-class model whose leaves all vote for one class stores one score:
    the label is labels[1] where it exceeds 0.5 (all weights positive: probabilities) or 0
    (margins), and the two score columns are built as onnxruntime does."""
    op = "TreeEnsembleClassifier"
    x = _x_for_trees(op, X)
    s = _cached(ctx, lambda: _classifier_setup(
        base_values=base_values, base_values_as_tensor=base_values_as_tensor,
        class_ids=class_ids, class_nodeids=class_nodeids, class_treeids=class_treeids,
        class_weights=class_weights, class_weights_as_tensor=class_weights_as_tensor,
        classlabels_int64s=classlabels_int64s, classlabels_strings=classlabels_strings,
        nodes_falsenodeids=nodes_falsenodeids, nodes_featureids=nodes_featureids,
        nodes_missing_value_tracks_true=nodes_missing_value_tracks_true,
        nodes_modes=nodes_modes, nodes_nodeids=nodes_nodeids, nodes_treeids=nodes_treeids,
        nodes_truenodeids=nodes_truenodeids, nodes_values=nodes_values,
        nodes_values_as_tensor=nodes_values_as_tensor, post_transform=post_transform),
        "setup")
    forest, labels, base, pt = s["forest"], s["labels"], s["base"], s["pt"]
    forest.validate(op, x.shape[1])
    scores, hits = forest.evaluate(x, "SUM", op, need_hits=True)
    if len(labels) == 2:
        return _binary_trees(X, scores, s["used"], base, s["positive"], pt, labels)
    if base is not None:
        scores = scores + base
    # classes that no reached leaf votes for are not candidates for the label
    masked = np.where(hits | (base is not None), scores, -np.inf)
    y = labels[np.argmax(masked, axis=1)]
    z = apply_post_transform(scores, pt) if pt != "NONE" else scores
    return like_input(y, X), like_input(z.astype(np.float32), X)


tree_ensemble_classifier.prepare = _prepare_with(_classifier_setup)


def _binary_trees(X, scores, used, base, positive, pt, labels):
    """Two classes, onnxruntime's conventions (what converters target):

    - two base values and class 1 scored: the scores become ``[-(b1 + s0), b1 + s0]``;
    - only class 0 scored (gradient boosting): one score ``s0 (+ base)`` turned into two
      columns by :func:`binary_label_and_scores`;
    - the label is ``labels[1]`` where the positive score (class 1's, else class 0's)
      exceeds 0.5 (every leaf on one class, all weights positive: probabilities) or 0.
    """
    has0, has1 = 0 in used, 1 in used
    s0, s1 = scores[:, 0].copy(), scores[:, 1].copy()
    one_column = False
    if base is not None and base.size == 2:
        if has1:
            s1 = base[1] + s0
            s0 = -s1
        else:
            s1 = s1 + base[1]
            s0 = s0 + base[0]
    elif base is not None and base.size == 1:
        s0 = s0 + base[0]
        one_column = not has1
    elif base is not None:
        raise InputError(f"TreeEnsembleClassifier: {base.size} base_values for 2 classes")
    else:
        one_column = not has1
    single = used.size == 1
    pos = s1 if has1 else (s0 if has0 else np.zeros_like(s0))
    thr = 0.5 if single and positive else 0.0
    if one_column:
        y, z = binary_label_and_scores(s0, pt, labels, thr, single and positive)
        if not single:
            y = np.where(pos > 0, labels[1], labels[0])
    else:
        y = np.where(pos > thr, labels[1], labels[0])
        z = apply_post_transform(np.stack([s0, s1], axis=1), pt)
    y = np.asarray(y, dtype=labels.dtype)
    return like_input(y, X), like_input(z.astype(np.float32), X)


# --------------------------------------------------------------------------- opset 5


def forest_from_v5(op: str, x_dtype, *, leaf_targetids, leaf_weights, membership_values,
                   n_targets, nodes_falseleafs, nodes_falsenodeids, nodes_featureids,
                   nodes_missing_value_tracks_true, nodes_modes, nodes_splits,
                   nodes_trueleafs, nodes_truenodeids, tree_roots) -> Forest:
    """The node table of TreeEnsemble's layout: branch nodes 0..n-1, then the leaves n..n+L-1
    (children are node or leaf indices, told apart by the *_leafs flags)."""
    required = dict(leaf_targetids=leaf_targetids, leaf_weights=leaf_weights,
                    n_targets=n_targets, nodes_falseleafs=nodes_falseleafs,
                    nodes_falsenodeids=nodes_falsenodeids, nodes_featureids=nodes_featureids,
                    nodes_modes=nodes_modes, nodes_splits=nodes_splits,
                    nodes_trueleafs=nodes_trueleafs, nodes_truenodeids=nodes_truenodeids,
                    tree_roots=tree_roots)
    missing = [k for k, v in required.items() if v is None]
    if missing:
        raise InputError(f"{op}: required attributes missing: {missing}")
    feat = _ints(nodes_featureids)
    nb = feat.size
    modes = np.asarray(nodes_modes).reshape(-1).astype(np.int64)
    splits = np.asarray(nodes_splits).reshape(-1).astype(x_dtype).astype(np.float64)
    t_ids, f_ids = _ints(nodes_truenodeids), _ints(nodes_falsenodeids)
    t_leaf = np.asarray(nodes_trueleafs, dtype=bool).reshape(-1)
    f_leaf = np.asarray(nodes_falseleafs, dtype=bool).reshape(-1)
    for name, arr in (("nodes_modes", modes), ("nodes_splits", splits),
                      ("nodes_truenodeids", t_ids), ("nodes_falsenodeids", f_ids),
                      ("nodes_trueleafs", t_leaf), ("nodes_falseleafs", f_leaf)):
        if arr.size != nb:
            raise InputError(f"{op}: {name} has {arr.size} entries, nodes_featureids has "
                             f"{nb}")
    if ((modes < 0) | (modes > MEMBER)).any():
        raise InputError(f"{op}: node modes must be 0..6, got {sorted(set(modes.tolist()))}")
    l_t = _ints(leaf_targetids)
    l_w = np.asarray(leaf_weights).reshape(-1).astype(x_dtype).astype(np.float64)
    nl = l_t.size
    if l_w.size != nl:
        raise InputError(f"{op}: leaf_weights has {l_w.size} entries, leaf_targetids {nl}")
    for name, ids, leaf in (("true", t_ids, t_leaf), ("false", f_ids, f_leaf)):
        lim = np.where(leaf, nl, nb)
        if ((ids < 0) | (ids >= lim)).any():
            raise InputError(f"{op}: a nodes_{name}nodeids entry is out of range")
    g = nb + nl
    mode = np.concatenate([modes.astype(np.int8), np.full(nl, LEAF, np.int8)])
    idx = np.arange(g, dtype=np.int64)
    tnext = idx.copy()
    fnext = idx.copy()
    tnext[:nb] = np.where(t_leaf, nb + t_ids, t_ids)
    fnext[:nb] = np.where(f_leaf, nb + f_ids, f_ids)
    track = None
    if nodes_missing_value_tracks_true is not None:
        tr = np.asarray(nodes_missing_value_tracks_true, dtype=bool).reshape(-1)
        if tr.any():
            track = np.concatenate([tr, np.zeros(nl, bool)])
    members = {}
    if (modes == MEMBER).any():
        if membership_values is None:
            raise InputError(f"{op}: BRANCH_MEMBER nodes need membership_values")
        mv = np.asarray(membership_values).reshape(-1).astype(x_dtype).astype(np.float64)
        sets = [s[~np.isnan(s)] for s in np.split(mv, np.flatnonzero(np.isnan(mv)))]
        for j, node in enumerate(np.flatnonzero(modes == MEMBER)):
            members[int(node)] = np.sort(sets[j]) if j < len(sets) else np.empty(0)
    roots = _ints(tree_roots)
    if roots.size and ((roots < 0) | (roots >= nb)).any():
        raise InputError(f"{op}: tree_roots must index nodes (0..{nb - 1})")
    cnt = np.concatenate([np.zeros(nb, np.int64), np.ones(nl, np.int64)])
    start = np.concatenate([np.zeros(nb, np.int64), np.arange(nl, dtype=np.int64)])
    return Forest(np.concatenate([feat, np.zeros(nl, np.int64)]),
                  np.concatenate([splits, np.zeros(nl)]), mode, tnext, fnext, track, roots,
                  start, cnt, l_t, l_w, members, n_outputs=int(n_targets))


@kernel("TreeEnsemble", since=5, domain=ML, wants_ctx=True)
def tree_ensemble(X, *, aggregate_function=1, leaf_targetids=None, leaf_weights=None,
                  membership_values=None, n_targets=None, nodes_falseleafs=None,
                  nodes_falsenodeids=None, nodes_featureids=None, nodes_hitrates=None,
                  nodes_missing_value_tracks_true=None, nodes_modes=None, nodes_splits=None,
                  nodes_trueleafs=None, nodes_truenodeids=None, post_transform=0,
                  tree_roots=None, ctx=None):
    """Every tree for the whole batch at once, the reached leaves aggregated per target
    (0 AVERAGE, 1 SUM, 2 MIN, 3 MAX) and post-transformed (0 NONE, 1 SOFTMAX, 2 LOGISTIC,
    3 SOFTMAX_ZERO, 4 PROBIT); the output has X's dtype."""
    op = "TreeEnsemble"
    if X.ndim != 2:
        raise ShapeError(f"{op}: X must be 2-D [batch, features], got {tuple(X.shape)}")
    agg = int(aggregate_function)
    if not 0 <= agg <= 3:
        raise InputError(f"{op}: aggregate_function {agg} must be 0 (AVERAGE), 1 (SUM), "
                         f"2 (MIN) or 3 (MAX)")
    forest = _cached(ctx, lambda: forest_from_v5(
        op, X.dtype, leaf_targetids=leaf_targetids, leaf_weights=leaf_weights,
        membership_values=membership_values, n_targets=n_targets,
        nodes_falseleafs=nodes_falseleafs, nodes_falsenodeids=nodes_falsenodeids,
        nodes_featureids=nodes_featureids,
        nodes_missing_value_tracks_true=nodes_missing_value_tracks_true,
        nodes_modes=nodes_modes, nodes_splits=nodes_splits, nodes_trueleafs=nodes_trueleafs,
        nodes_truenodeids=nodes_truenodeids, tree_roots=tree_roots), f"forest-{X.dtype}")
    x = _x_for_trees(op, X)
    forest.validate(op, x.shape[1])
    how = ("AVERAGE", "SUM", "MIN", "MAX")[agg]
    scores, _ = forest.evaluate(x, how, op)
    scores = apply_post_transform(scores, pt_name(op, int(post_transform)))
    return like_input(scores.astype(X.dtype), X)
