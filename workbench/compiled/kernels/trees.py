"""Tree-ensemble traversal: the leaf every row reaches in every tree.

The node table is the engine's (:class:`workbench.ops.ml_trees.Forest`) packed into one
16-byte record per node (see ``_walk``): a walk with one row is bound by memory latency, one
cache miss per node instead of one per field. Comparison codes: 0 LEQ, 1 LT, 2 GTE, 3 GT,
4 EQ, 5 NEQ, 7 LEAF. BRANCH_MEMBER nodes are not handled here (the engine keeps its numpy path
for forests that have them), nor features >= 2**24.

``leaves_f32`` / ``leaves_f64``: for the trees ``t0 <= t < t1`` and every row, ``out[row, t]``
is the leaf reached; tree by tree, so one tree's nodes stay in cache for all the rows. A walk
longer than ``limit`` steps (a cycle in a malformed forest) writes -1 and stops. A comparison
with NaN is false, as in numpy.
"""

from numba import carray, njit

from workbench.compiled.build import export

_ARGS_F32 = "f32[] i32[] f32[] i32[] i32[]! i64 i64 i64 i64 i64 i64"
_ARGS_F64 = "f64[] i32[] f64[] i32[] i32[]! i64 i64 i64 i64 i64 i64"


@njit(inline="always", error_model="numpy")
def _leaf_of(x, nodes, thr, r, nd, limit, packed_thr):
    """The leaf row ``r`` of ``x`` reaches from node ``nd``; -1 past ``limit`` steps (a cycle
    in a malformed forest)."""
    steps = 0
    while True:
        w = nodes[nd, 0]
        m = (w >> 24) & 7
        if m == 7:
            return nd
        v = x[r, w & 0xFFFFFF]
        th = thr[nd, 1] if packed_thr else thr[nd, 0]
        if m == 0:
            go = v <= th
        elif m == 1:
            go = v < th
        elif m == 2:
            go = v >= th
        elif m == 3:
            go = v > th
        elif m == 4:
            go = v == th
        else:
            go = v != th
        if (w >> 27) & 1 and v != v:
            go = True
        nd = nodes[nd, 3] if go else nodes[nd, 2]
        steps += 1
        if steps > limit:
            return -1


@njit(inline="always", error_model="numpy")
def _walk(xp, nodesp, thrp, rootsp, outp, N, F, G, T, t0, t1, limit, packed_thr):
    """``nodes`` (G, 4) int32 per node: feature | flags << 24 (flags: the comparison code in
    bits 0-2, 7 for a leaf; bit 3: NaN goes to the true branch), the threshold's float32 bits
    (``thr`` is the same memory seen as float32 when ``packed_thr``; else ``thr`` (G,) holds
    the thresholds), false child, true child: one cache line holds four nodes' records."""
    x = carray(xp, (N, F))
    nodes = carray(nodesp, (G, 4))
    thr = carray(thrp, (G, 4)) if packed_thr else carray(thrp, (G, 1))
    roots = carray(rootsp, (T,))
    out = carray(outp, (N, T))
    for t in range(t0, t1):
        root = roots[t]
        for r in range(N):
            out[r, t] = _leaf_of(x, nodes, thr, r, root, limit, packed_thr)


@export("leaves_f32", _ARGS_F32)
def leaves_f32(x, nodes, thr, roots, out, N, F, G, T, t0, t1):
    _walk(x, nodes, thr, roots, out, N, F, G, T, t0, t1, G + 8, True)


@export("leaves_f64", _ARGS_F64)
def leaves_f64(x, nodes, thr, roots, out, N, F, G, T, t0, t1):
    _walk(x, nodes, thr, roots, out, N, F, G, T, t0, t1, G + 8, False)


# ----------------------------------------------------------------------------- fused sums
# the walk and the leaf weights summed per (row, target) in one pass: the leaf's record holds
# where its (target, weight) pairs start (field 1) and how many it has (field 2)
_SUM_ARGS = ("{t}[] i32[] {t}[] i32[] i64[] f64[] f64[]! u8[]! i64[]! i64 i64 i64 i64 i64 "
             "i64 i64 i64")


@njit(inline="always", error_model="numpy")
def _walk_sum(xp, nodesp, thrp, rootsp, tgtp, wtp, scoresp, hitsp, errp, N, F, G, T, K, P,
              r0, r1, limit, packed_thr):
    x = carray(xp, (N, F))
    nodes = carray(nodesp, (G, 4))
    thr = carray(thrp, (G, 4)) if packed_thr else carray(thrp, (G, 1))
    roots = carray(rootsp, (T,))
    tgt = carray(tgtp, (P,))
    wt = carray(wtp, (P,))
    scores = carray(scoresp, (N, K))
    hits = carray(hitsp, (N, K))
    err = carray(errp, (1,))
    for t in range(T):
        root = roots[t]
        for r in range(r0, r1):
            nd = _leaf_of(x, nodes, thr, r, root, limit, packed_thr)
            if nd < 0:
                err[0] = 1
                return
            s = nodes[nd, 1]
            for j in range(s, s + nodes[nd, 2]):
                k = tgt[j]
                scores[r, k] += wt[j]
                hits[r, k] = 1


@export("sum_f32", _SUM_ARGS.format(t="f32"))
def sum_f32(x, nodes, thr, roots, tgt, wt, scores, hits, err, N, F, G, T, K, P, r0, r1):
    _walk_sum(x, nodes, thr, roots, tgt, wt, scores, hits, err, N, F, G, T, K, P, r0, r1,
              G + 8, True)


@export("sum_f64", _SUM_ARGS.format(t="f64"))
def sum_f64(x, nodes, thr, roots, tgt, wt, scores, hits, err, N, F, G, T, K, P, r0, r1):
    _walk_sum(x, nodes, thr, roots, tgt, wt, scores, hits, err, N, F, G, T, K, P, r0, r1,
              G + 8, False)
