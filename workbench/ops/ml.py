"""ai.onnx.ml kernels: ArrayFeatureExtractor, Binarizer, LabelEncoder (opsets 1, 2, 4),
TreeEnsemble (opset 5)."""

from __future__ import annotations

import math

import numpy as np

from workbench.arrays import xp_of
from workbench.errors import InputError, ShapeError
from workbench.ops.registry import kernel

ML = "ai.onnx.ml"


@kernel("ArrayFeatureExtractor", since=1, domain=ML)
def array_feature_extractor(X, Y):
    """Z = X[..., Y]: select the indexed elements along the last axis."""
    xp = xp_of(X)
    idx = Y.reshape(-1).astype(np.int64)
    last = X.shape[-1] if X.ndim else 0
    if idx.size and (int(idx.min()) < 0 or int(idx.max()) >= last):
        raise InputError(f"ArrayFeatureExtractor: indices {idx.tolist()} out of range "
                         f"[0, {last}) for X of shape {tuple(X.shape)}")
    if X.ndim == 1:
        return xp.take(X, idx, axis=0).reshape(1, -1)
    return xp.take(X, idx, axis=-1)


@kernel("Binarizer", since=1, domain=ML)
def binarizer(X, *, threshold=0.0):
    """Y = 1 where X > threshold, else 0 (same dtype as X)."""
    return xp_of(X).asarray(X > threshold).astype(X.dtype)


# ---------------------------------------------------------------------------------------------
# LabelEncoder


def _lookup(op, X, keys, values, default):
    """Map every element of X through keys -> values, default where absent."""
    xp = xp_of(X)
    keys = list(keys)
    if len(keys) != len(values):
        raise InputError(f"{op}: {len(keys)} keys but {len(values)} values")
    out_dtype = values.dtype
    if X.dtype == object or (keys and isinstance(keys[0], str)):
        table = dict(zip((str(k) for k in keys), values.tolist()))
        flat = [table.get(v if isinstance(v, str) else str(v), default)
                for v in X.reshape(-1).tolist()]
        out = np.empty(len(flat), dtype=out_dtype)
        out[:] = flat
        return out.reshape(X.shape)
    k = np.asarray(keys, dtype=X.dtype if X.dtype.kind == "f" else np.float64)
    if X.dtype.kind in "iu":
        k = np.asarray(keys, dtype=np.int64)
    order = np.argsort(k, kind="stable")
    ks, vs = xp.asarray(k[order]), xp.asarray(values[order])
    out = xp.full(X.shape, default, dtype=out_dtype)
    if ks.size:
        pos = xp.clip(xp.searchsorted(ks, X), 0, ks.size - 1)
        found = ks[pos] == X
        out = xp.where(found, vs[pos], out)
        if k.dtype.kind == "f" and np.isnan(k).any():
            nan_val = values[order][np.isnan(k[order])][0]
            out = xp.where(xp.isnan(X), nan_val, out)
    return out


def _default_for(values_dtype, default_int64, default_float, default_string):
    if np.dtype(values_dtype).kind == "O":
        return default_string
    if np.dtype(values_dtype).kind == "f":
        return default_float
    return default_int64


@kernel("LabelEncoder", since=1, domain=ML)
def label_encoder_1(X, *, classes_strings=None, default_int64=-1, default_string="_Unused"):
    """Opset 1: strings -> index in classes_strings, or int64 -> classes_strings[index]."""
    op = "LabelEncoder"
    classes = list(classes_strings or [])
    if X.dtype == object:
        table = {s: i for i, s in enumerate(classes)}
        out = [table.get(v, default_int64) for v in X.reshape(-1).tolist()]
        return np.asarray(out, dtype=np.int64).reshape(X.shape)
    if X.dtype.kind in "iu":
        flat = [classes[i] if 0 <= i < len(classes) else default_string
                for i in X.reshape(-1).tolist()]
        out = np.empty(len(flat), dtype=object)
        out[:] = flat
        return out.reshape(X.shape)
    raise InputError(f"{op}: opset-1 input must be string or int64, got {X.dtype}")


@kernel("LabelEncoder", since=2, domain=ML)
def label_encoder(X, *, default_float=-0.0, default_int64=-1, default_string="_Unused",
                  default_tensor=None, keys_floats=None, keys_int64s=None, keys_strings=None,
                  keys_tensor=None, values_floats=None, values_int64s=None,
                  values_strings=None, values_tensor=None):
    """Opsets 2 and 4 (4 adds the *_tensor attributes): a key -> value map with a default."""
    op = "LabelEncoder"
    key_sets = [k for k in (keys_floats, keys_int64s, keys_strings, keys_tensor) if k is not None]
    val_sets = [v for v in (values_floats, values_int64s, values_strings, values_tensor)
                if v is not None]
    if len(key_sets) != 1 or len(val_sets) != 1:
        raise InputError(f"{op}: exactly one keys_* and one values_* attribute must be set "
                         f"(got {len(key_sets)} and {len(val_sets)})")
    if keys_tensor is not None:
        keys = keys_tensor.reshape(-1).tolist()
    else:
        keys = list(key_sets[0])
    if values_tensor is not None:
        values = np.asarray(values_tensor).reshape(-1)
    elif values_strings is not None:
        values = np.empty(len(values_strings), dtype=object)
        values[:] = list(values_strings)
    elif values_int64s is not None:
        values = np.asarray(values_int64s, dtype=np.int64)
    else:
        values = np.asarray(values_floats, dtype=np.float32)
    if default_tensor is not None:
        default = np.asarray(default_tensor).reshape(-1)[0]
        default = default.item() if hasattr(default, "item") and values.dtype != object \
            else default
    else:
        default = _default_for(values.dtype, default_int64, default_float, default_string)
    if values.dtype == object and not isinstance(default, str):
        default = str(default)
    return _lookup(op, X, keys, values, default)


# ---------------------------------------------------------------------------------------------
# TreeEnsemble

_LEQ, _LT, _GTE, _GT, _EQ, _NEQ, _MEMBER = range(7)


def _probit(p):
    """sqrt(2) * erfinv(2p - 1), by an initial approximation refined with Newton steps."""
    y = np.clip(2 * np.asarray(p, dtype=np.float64) - 1, -1 + 1e-16, 1 - 1e-16)
    a = 0.147
    ln = np.log(1 - y * y)
    t = 2 / (math.pi * a) + ln / 2
    z = np.sign(y) * np.sqrt(np.sqrt(t * t - ln / a) - t)
    erf = np.vectorize(math.erf)
    for _ in range(3):
        z = z - (erf(z) - y) / (2 / math.sqrt(math.pi) * np.exp(-z * z))
    return math.sqrt(2) * z


@kernel("TreeEnsemble", since=5, domain=ML)
def tree_ensemble(X, *, aggregate_function=1, leaf_targetids=None, leaf_weights=None,
                  membership_values=None, n_targets=None, nodes_falseleafs=None,
                  nodes_falsenodeids=None, nodes_featureids=None, nodes_hitrates=None,
                  nodes_missing_value_tracks_true=None, nodes_modes=None, nodes_splits=None,
                  nodes_trueleafs=None, nodes_truenodeids=None, post_transform=0,
                  tree_roots=None):
    """Evaluate every tree for the whole batch at once (one vectorised step per depth level),
    then aggregate the reached leaves per target (SUM, AVERAGE, MIN, MAX) and post-transform
    (NONE, SOFTMAX, LOGISTIC, SOFTMAX_ZERO, PROBIT). Evaluated on the host (numpy)."""
    op = "TreeEnsemble"
    xp = xp_of(X)
    if X.ndim != 2:
        raise ShapeError(f"{op}: X must be 2-D [batch, features], got {tuple(X.shape)}")
    required = dict(leaf_targetids=leaf_targetids, leaf_weights=leaf_weights,
                    n_targets=n_targets, nodes_falseleafs=nodes_falseleafs,
                    nodes_falsenodeids=nodes_falsenodeids, nodes_featureids=nodes_featureids,
                    nodes_modes=nodes_modes, nodes_splits=nodes_splits,
                    nodes_trueleafs=nodes_trueleafs, nodes_truenodeids=nodes_truenodeids,
                    tree_roots=tree_roots)
    missing = [k for k, v in required.items() if v is None]
    if missing:
        raise InputError(f"{op}: required attributes missing: {missing}")
    x = np.asarray(X.get() if hasattr(X, "get") else X).astype(np.float64)
    feat = np.asarray(nodes_featureids, dtype=np.int64)
    modes = np.asarray(nodes_modes).reshape(-1).astype(np.int64)
    splits = np.asarray(nodes_splits).reshape(-1).astype(X.dtype).astype(np.float64)
    t_ids = np.asarray(nodes_truenodeids, dtype=np.int64)
    f_ids = np.asarray(nodes_falsenodeids, dtype=np.int64)
    t_leaf = np.asarray(nodes_trueleafs, dtype=bool)
    f_leaf = np.asarray(nodes_falseleafs, dtype=bool)
    n_nodes = feat.size
    for name, arr in (("nodes_modes", modes), ("nodes_splits", splits),
                      ("nodes_truenodeids", t_ids), ("nodes_falsenodeids", f_ids),
                      ("nodes_trueleafs", t_leaf), ("nodes_falseleafs", f_leaf)):
        if arr.size != n_nodes:
            raise InputError(f"{op}: {name} has {arr.size} entries, nodes_featureids has "
                             f"{n_nodes}")
    if n_nodes and int(feat.max()) >= x.shape[1]:
        raise ShapeError(f"{op}: a node reads feature {int(feat.max())} but X has "
                         f"{x.shape[1]} features")
    tracks = (np.zeros(n_nodes, dtype=bool) if nodes_missing_value_tracks_true is None
              else np.asarray(nodes_missing_value_tracks_true, dtype=bool))
    members: dict[int, np.ndarray] = {}
    if (modes == _MEMBER).any():
        if membership_values is None:
            raise InputError(f"{op}: BRANCH_MEMBER nodes need membership_values")
        mv = np.asarray(membership_values).reshape(-1).astype(X.dtype).astype(np.float64)
        cuts = np.flatnonzero(np.isnan(mv))
        sets = np.split(mv, cuts)
        sets = [s[~np.isnan(s)] for s in sets]
        for k, node in enumerate(np.flatnonzero(modes == _MEMBER)):
            members[int(node)] = sets[k] if k < len(sets) else np.empty(0)
    l_target = np.asarray(leaf_targetids, dtype=np.int64)
    l_weight = np.asarray(leaf_weights).reshape(-1).astype(np.float64)
    n = x.shape[0]
    rows = np.arange(n)
    n_t = int(n_targets)
    agg = int(aggregate_function)
    if agg in (0, 1):
        out = np.zeros((n, n_t))
    elif agg == 2:
        out = np.full((n, n_t), np.inf)
    elif agg == 3:
        out = np.full((n, n_t), -np.inf)
    else:
        raise InputError(f"{op}: aggregate_function {agg} must be 0 (AVERAGE), 1 (SUM), "
                         f"2 (MIN) or 3 (MAX)")
    for root in tree_roots:
        node = np.full(n, int(root), dtype=np.int64)
        leaf = np.full(n, -1, dtype=np.int64)
        active = rows
        for _ in range(n_nodes + 1):
            if not active.size:
                break
            nd = node[active]
            v = x[active, feat[nd]]
            s = splits[nd]
            m = modes[nd]
            go = np.select(
                [m == _LEQ, m == _LT, m == _GTE, m == _GT, m == _EQ, m == _NEQ],
                [v <= s, v < s, v >= s, v > s, v == s, v != s], default=False)
            for mnode in np.unique(nd[m == _MEMBER]):
                sel = nd == mnode
                go[sel] = np.isin(v[sel], members[int(mnode)])
            go |= np.isnan(v) & tracks[nd]
            nxt = np.where(go, t_ids[nd], f_ids[nd])
            is_leaf = np.where(go, t_leaf[nd], f_leaf[nd])
            leaf[active[is_leaf]] = nxt[is_leaf]
            node[active] = nxt
            active = active[~is_leaf]
        else:
            raise InputError(f"{op}: tree rooted at node {root} has a cycle")
        tgt, w = l_target[leaf], l_weight[leaf]
        if agg in (0, 1):
            np.add.at(out, (rows, tgt), w)
        elif agg == 2:
            np.minimum.at(out, (rows, tgt), w)
        else:
            np.maximum.at(out, (rows, tgt), w)
    if agg == 0:
        out /= max(len(tree_roots), 1)
    elif agg in (2, 3):
        out[~np.isfinite(out)] = 0.0
    pt = int(post_transform)
    if pt == 1:
        e = np.exp(out - out.max(axis=1, keepdims=True))
        out = e / e.sum(axis=1, keepdims=True)
    elif pt == 2:
        out = 1 / (1 + np.exp(-out))
    elif pt == 3:
        nz = out != 0
        e = np.where(nz, np.exp(out - np.where(nz, out, -np.inf).max(axis=1, keepdims=True)),
                     0)
        tot = e.sum(axis=1, keepdims=True)
        out = np.where(tot > 0, e / np.where(tot > 0, tot, 1), 0)
    elif pt == 4:
        out = _probit(out)
    elif pt != 0:
        raise InputError(f"{op}: post_transform {pt} must be 0..4 (NONE, SOFTMAX, LOGISTIC, "
                         f"SOFTMAX_ZERO, PROBIT)")
    return xp.asarray(out.astype(X.dtype))
