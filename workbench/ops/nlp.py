"""Text kernels: StringNormalizer, StringSplit, StringConcat, RegexFullMatch, TfIdfVectorizer.

String tensors are numpy object arrays of Python ``str`` (host only: the array module of a string
tensor is always numpy). Regular expressions use Python's ``re`` with full-match semantics; the
RE2 syntax ONNX names agrees with it for the common constructs (classes, quantifiers, groups,
alternation, anchors).
"""

from __future__ import annotations

import re

import numpy as np

from workbench.arrays import xp_of
from workbench.errors import InputError, ShapeError
from workbench.limits import check_alloc
from workbench.ops.registry import kernel

try:  # RE2 itself (the syntax the spec names; matching in linear time): the `re2` extra
    import re2 as _re2
except ImportError:  # pragma: no cover - depends on the environment
    _re2 = None

# a quantified group that itself contains a quantifier: (a*)*, (a+|b)+, (x{2,})*...
_NESTED_QUANTIFIER = re.compile(r"\((?:[^()\\]|\\.)*[*+?}](?:[^()\\]|\\.)*\)[*+{]")


def _compile_regex(op: str, pattern: str):
    """A compiled pattern with ``fullmatch``: RE2 when installed; else Python's ``re``, refusing
    patterns with nested quantifiers (exponential backtracking there: a model could hang the
    process)."""
    if _re2 is not None:
        opts = _re2.Options()
        opts.log_errors = False
        try:
            return _re2.compile(pattern, opts)
        except Exception as e:  # re2._re2.Error
            raise InputError(f"{op}: invalid regular expression {pattern!r} (RE2 syntax): "
                             f"{e}") from None
    if _NESTED_QUANTIFIER.search(pattern):
        raise InputError(
            f"{op}: pattern {pattern!r} nests quantifiers, which Python's re engine may take "
            f"exponential time on; install RE2 (pip install 'onnx-workbench[re2]', the engine "
            f"the ONNX spec names, linear time) to run it")
    try:
        return re.compile(pattern)
    except re.error as e:
        raise InputError(f"{op}: invalid regular expression {pattern!r}: {e}") from None


def _strings(op: str, x):
    """An object array of str (accepts numpy unicode/bytes arrays too)."""
    xp = xp_of(x)
    if not hasattr(x, "dtype"):
        x = xp.asarray(x, dtype=object)
    if x.dtype.kind == "U":
        return x.astype(object)
    if x.dtype.kind == "S":
        return xp.vectorize(lambda b: b.decode("utf-8"), otypes=[object])(x) if x.size \
            else x.astype(object)
    if x.dtype != object:
        raise InputError(f"{op}: expected a string tensor, got dtype {x.dtype}")
    return x


def _as_str(v) -> str:
    return v.decode("utf-8") if isinstance(v, bytes) else str(v)


@kernel("StringNormalizer", since=10)
def string_normalizer(X, *, case_change_action="NONE", is_case_sensitive=0, locale=None,
                      stopwords=None):
    op = "StringNormalizer"
    xp = xp_of(X)
    x = _strings(op, X)
    if x.ndim == 1:
        row, two_d = x, False
    elif x.ndim == 2 and x.shape[0] == 1:
        row, two_d = x[0], True
    else:
        raise ShapeError(f"{op}: input must have shape [C] or [1, C], got {tuple(x.shape)}")
    action = (case_change_action or "NONE").upper()
    if action not in ("NONE", "LOWER", "UPPER"):
        raise InputError(f"{op}: case_change_action {case_change_action!r} must be NONE, "
                         f"LOWER or UPPER")
    words = [_as_str(w) for w in row.tolist()]
    if stopwords:
        if is_case_sensitive:
            stop = set(stopwords)
            words = [w for w in words if w not in stop]
        else:
            stop = {s.casefold() for s in stopwords}
            words = [w for w in words if w.casefold() not in stop]
    if action == "LOWER":
        words = [w.lower() for w in words]
    elif action == "UPPER":
        words = [w.upper() for w in words]
    if not words:
        words = [""]
    out = xp.empty(len(words), dtype=object)
    out[:] = words
    return out.reshape(1, -1) if two_d else out


@kernel("StringSplit", since=20)
def string_split(X, *, delimiter=None, maxsplit=None):
    op = "StringSplit"
    xp = xp_of(X)
    x = _strings(op, X)
    sep = delimiter if delimiter else None
    limit = -1 if maxsplit is None else int(maxsplit)
    parts = [_as_str(s).split(sep, limit) for s in x.reshape(-1).tolist()]
    width = max((len(p) for p in parts), default=0)
    y = xp.full((len(parts), width), "", dtype=object)
    for i, p in enumerate(parts):
        y[i, :len(p)] = p
    z = xp.asarray([len(p) for p in parts], dtype=np.int64)
    return y.reshape(tuple(x.shape) + (width,)), z.reshape(x.shape)


@kernel("StringConcat", since=20)
def string_concat(X, Y):
    op = "StringConcat"
    xp = xp_of(X)
    a, b = _strings(op, X), _strings(op, Y)
    try:
        shape = np.broadcast_shapes(a.shape, b.shape)
    except ValueError:
        raise ShapeError(f"{op}: shapes {tuple(a.shape)} and {tuple(b.shape)} do not "
                         f"broadcast") from None
    check_alloc(shape, itemsize=8, what=f"{op}: the output")
    out = xp.empty(shape, dtype=object)
    out[...] = xp.add(a, b)
    return out


@kernel("RegexFullMatch", since=20)
def regex_full_match(X, *, pattern=None):
    op = "RegexFullMatch"
    xp = xp_of(X)
    if pattern is None:
        raise InputError(f"{op}: the 'pattern' attribute is required")
    rx = _compile_regex(op, pattern)
    x = _strings(op, X)
    flat = [rx.fullmatch(_as_str(s)) is not None for s in x.reshape(-1).tolist()]
    return xp.asarray(flat, dtype=bool).reshape(x.shape)


def _ngram_pool(op, pool, ngram_counts, ngram_indexes):
    """{n: {ngram tuple: pool position}} from the CSR-like pool description."""
    counts = list(ngram_counts or [0])
    n_total = len(pool)
    table: dict[int, dict[tuple, int]] = {}
    idx = 0
    for k, start in enumerate(counts):
        n = k + 1
        end = counts[k + 1] if k + 1 < len(counts) else n_total
        if (end - start) % n:
            raise InputError(f"{op}: pool entries {start}..{end} do not divide into {n}-grams")
        grams = table.setdefault(n, {})
        for s in range(start, end, n):
            grams.setdefault(tuple(pool[s:s + n]), idx)
            idx += 1
    if idx != len(ngram_indexes):
        raise InputError(f"{op}: the pool holds {idx} n-grams but ngram_indexes has "
                         f"{len(ngram_indexes)} entries")
    return table


@kernel("TfIdfVectorizer", since=9)
def tfidf_vectorizer(X, *, max_gram_length=None, max_skip_count=None, min_gram_length=None,
                     mode=None, ngram_counts=None, ngram_indexes=None, pool_int64s=None,
                     pool_strings=None, weights=None):
    op = "TfIdfVectorizer"
    xp = xp_of(X)
    if (pool_int64s is None) == (pool_strings is None):
        raise InputError(f"{op}: exactly one of pool_int64s and pool_strings must be set")
    if mode not in ("TF", "IDF", "TFIDF"):
        raise InputError(f"{op}: mode {mode!r} must be TF, IDF or TFIDF")
    if ngram_indexes is None or min_gram_length is None or max_gram_length is None:
        raise InputError(f"{op}: ngram_indexes, min_gram_length and max_gram_length are "
                         f"required")
    if pool_strings is not None:
        pool = [_as_str(s) for s in pool_strings]
        rows = _strings(op, X)
        conv = _as_str
    else:
        pool = [int(v) for v in pool_int64s]
        rows = X
        conv = int
    if rows.ndim not in (1, 2):
        raise ShapeError(f"{op}: input must be 1-D or 2-D, got shape {tuple(rows.shape)}")
    table = _ngram_pool(op, pool, ngram_counts, ngram_indexes)
    out_size = max(ngram_indexes) + 1 if len(ngram_indexes) else 0
    w = (np.asarray(weights, dtype=np.float32) if weights
         else np.ones(len(ngram_indexes), dtype=np.float32))
    target = np.asarray(ngram_indexes, dtype=np.int64)
    data = rows.reshape(1, -1) if rows.ndim == 1 else rows
    host = data.tolist() if hasattr(data, "tolist") else data
    counts = np.zeros((len(host), len(ngram_indexes)), dtype=np.float32)
    skips = int(max_skip_count or 0)
    # only the n-gram lengths the pool holds can match (max_gram_length may be anything)
    lengths = [n for n in sorted(table) if int(min_gram_length) <= n <= int(max_gram_length)]
    for r, row in enumerate(host):
        seq = [conv(v) for v in row]
        for n in lengths:
            grams = table[n]
            if not grams:
                continue
            # a skip wider than the row matches nothing: clamp it to the row's length
            for skip in range(min(skips, len(seq)) + 1 if n > 1 else 1):
                span = (n - 1) * (skip + 1)
                for s in range(len(seq) - span):
                    pos = grams.get(tuple(seq[s:s + span + 1:skip + 1]))
                    if pos is not None:
                        counts[r, pos] += 1
    if mode == "IDF":
        counts = np.minimum(counts, 1) * w
    elif mode == "TFIDF":
        counts = counts * w
    check_alloc((len(host), out_size), np.float32, what=f"{op}: the output")
    out = np.zeros((len(host), out_size), dtype=np.float32)
    np.add.at(out, (slice(None), target), counts)
    res = xp.asarray(out)
    return res[0] if rows.ndim == 1 else res
