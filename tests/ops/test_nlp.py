"""Text kernels against Python string expectations."""

from __future__ import annotations

import numpy as np
import pytest

from workbench.errors import InputError, ShapeError
from workbench.ops.registry import NodeContext, attribute_defaults, lookup


def run(op, *inputs, opset=21, n_outputs=1, **attrs):
    entry = lookup(op, "", opset)
    kw = dict(attribute_defaults(op, "", opset))
    kw.update(attrs)
    if entry.wants_ctx:
        kw["ctx"] = NodeContext(node_name="n", op_type=op, opset=opset, n_outputs=n_outputs)
    return entry.fn(*inputs, **kw)


def S(*values, shape=None):
    a = np.empty(len(values), dtype=object)
    a[:] = list(values)
    return a.reshape(shape) if shape is not None else a


# ----------------------------------------------------------------------- StringNormalizer


def test_normalizer_case_insensitive_stopwords_and_upper():
    y = run("StringNormalizer", S("Monday", "tuesday", "MONDAY", "x"), stopwords=["monday"],
            case_change_action="UPPER")
    assert y.dtype == object and y.tolist() == ["TUESDAY", "X"]


def test_normalizer_case_sensitive_keeps_other_cases():
    y = run("StringNormalizer", S("Monday", "monday", shape=(1, 2)), stopwords=["monday"],
            is_case_sensitive=1, case_change_action="LOWER")
    assert y.shape == (1, 1) and y.tolist() == [["monday"]]


@pytest.mark.parametrize("shape, out", [((2,), (1,)), ((1, 2), (1, 1))])
def test_normalizer_all_removed_gives_one_empty_string(shape, out):
    y = run("StringNormalizer", S("a", "b", shape=shape), stopwords=["a", "b"])
    assert y.shape == out and y.reshape(-1).tolist() == [""]


def test_normalizer_rejects_other_shapes_and_actions():
    with pytest.raises(ShapeError, match=r"\[C\] or \[1, C\]"):
        run("StringNormalizer", S("a", "b", shape=(2, 1)))
    with pytest.raises(InputError, match="case_change_action"):
        run("StringNormalizer", S("a"), case_change_action="TITLE")


# --------------------------------------------------------------------------- StringSplit


def test_split_on_delimiter_pads_and_counts():
    y, z = run("StringSplit", S("a,b", "c,,d,", "", shape=(3,)), delimiter=",")
    assert y.shape == (3, 4)
    assert y.tolist() == [["a", "b", "", ""], ["c", "", "d", ""], ["", "", "", ""]]
    assert z.dtype == np.int64 and z.tolist() == [2, 4, 1]


def test_split_whitespace_with_maxsplit_keeps_rank():
    y, z = run("StringSplit", S("  a  b c ", "d", shape=(1, 2)), maxsplit=1)
    assert y.shape == (1, 2, 2)
    assert y.tolist() == [[["a", "b c "], ["d", ""]]]
    assert z.tolist() == [[2, 1]]


def test_split_empty_tensor():
    y, z = run("StringSplit", np.empty((0, 3), dtype=object), delimiter=" ")
    assert y.shape == (0, 3, 0) and z.shape == (0, 3)


# -------------------------------------------------------------------------- StringConcat


def test_concat_broadcasts_and_keeps_unicode():
    z = run("StringConcat", S("a", "é", shape=(2, 1)), S("x", "ü", "", shape=(3,)))
    assert z.shape == (2, 3) and z.dtype == object
    assert z.tolist() == [["ax", "aü", "a"], ["éx", "éü", "é"]]


def test_concat_zero_dim_and_numpy_unicode():
    z = run("StringConcat", np.array("ab", dtype=object), np.array(["c"]))
    assert z.shape == (1,) and z.tolist() == ["abc"]
    z = run("StringConcat", np.array("a", dtype=object), np.array("b", dtype=object))
    assert z.shape == () and z.item() == "ab"
    with pytest.raises(ShapeError):
        run("StringConcat", S("a", "b"), S("a", "b", "c"))


# ------------------------------------------------------------------------ RegexFullMatch


def test_regex_full_match_not_search():
    x = S("www.google.com", "www.facebook.com", "google.com", shape=(3,))
    y = run("RegexFullMatch", x, pattern=r"www\.[\w.-]+\.com")
    assert y.dtype == np.bool_ and y.tolist() == [True, True, False]
    assert run("RegexFullMatch", S("abc", shape=(1,)), pattern="b").tolist() == [False]


def test_regex_bad_pattern():
    with pytest.raises(InputError, match="invalid regular expression"):
        run("RegexFullMatch", S("a"), pattern="(")


# ------------------------------------------------------------------------ TfIdfVectorizer

POOL = dict(ngram_counts=[0, 4], ngram_indexes=[0, 1, 2, 3, 4, 5, 6],
            pool_int64s=[2, 3, 5, 4, 5, 6, 7, 8, 6, 7], min_gram_length=1, max_gram_length=2,
            max_skip_count=0)


def test_tfidf_tf_unigrams_and_bigrams():
    x = np.array([1, 1, 3, 3, 3, 7, 8, 6, 7, 5, 6, 8], np.int32)
    y = run("TfIdfVectorizer", x, mode="TF", **POOL)
    # unigrams 2,3,5,4 ; bigrams (5,6),(7,8),(6,7)
    assert y.dtype == np.float32 and y.shape == (7,)
    assert y.tolist() == [0, 3, 1, 0, 1, 1, 1]


def test_tfidf_skips_batch_and_modes():
    x = np.array([[1, 5, 9, 6, 7, 5], [7, 1, 8, 4, 6, 7]], np.int64)
    w = [1, 2, 3, 4, 5, 6, 7]
    tf = run("TfIdfVectorizer", x, mode="TF", **{**POOL, "max_skip_count": 1})
    # row 0: 5 twice; (5,6) with skip 1 (5,9,6); (6,7) adjacent. row 1: 4 once; (7,8) skip 1;
    # (6,7) adjacent
    assert tf.shape == (2, 7)
    assert tf.tolist() == [[0, 0, 2, 0, 1, 0, 1], [0, 0, 0, 1, 0, 1, 1]]
    idf = run("TfIdfVectorizer", x, mode="IDF", weights=w, **{**POOL, "max_skip_count": 1})
    assert idf.tolist() == [[0, 0, 3, 0, 5, 0, 7], [0, 0, 0, 4, 0, 6, 7]]
    tfidf = run("TfIdfVectorizer", x, mode="TFIDF", weights=w, **{**POOL, "max_skip_count": 1})
    assert tfidf.tolist() == [[0, 0, 6, 0, 5, 0, 7], [0, 0, 0, 4, 0, 6, 7]]


def test_tfidf_strings_only_bigrams_and_index_permutation():
    x = S("a", "b", "a", "b", "c")
    y = run("TfIdfVectorizer", x, mode="TF", ngram_counts=[0, 1], ngram_indexes=[2, 0, 1],
            pool_strings=["c", "a", "b", "b", "c"], min_gram_length=2, max_gram_length=2,
            max_skip_count=0)
    # min_gram_length=2: the 1-gram "c" is not counted; (a,b) x2 -> 0, (b,c) x1 -> 1
    assert y.tolist() == [2, 1, 0]


def test_tfidf_requires_one_pool_and_known_mode():
    x = np.array([1, 2])
    with pytest.raises(InputError, match="exactly one"):
        run("TfIdfVectorizer", x, mode="TF", ngram_indexes=[0], min_gram_length=1,
            max_gram_length=1)
    with pytest.raises(InputError, match="mode"):
        run("TfIdfVectorizer", x, mode="BM25", **POOL)


def test_regex_catastrophic_pattern_is_linear_with_re2_and_refused_without(monkeypatch):
    """'(a*)*b' backtracks exponentially in Python's re; RE2 (the spec's engine) is linear."""
    import time

    from workbench.ops import nlp

    x = S("a" * 40, "aab")
    if nlp._re2 is not None:
        t0 = time.perf_counter()
        y = run("RegexFullMatch", x, pattern="(a*)*b")
        assert y.tolist() == [False, True]
        assert time.perf_counter() - t0 < 5
    monkeypatch.setattr(nlp, "_re2", None)
    with pytest.raises(InputError, match="nests quantifiers"):
        run("RegexFullMatch", x, pattern="(a*)*b")
    y = run("RegexFullMatch", S("12", "x"), pattern=r"(\d+)?")
    assert y.tolist() == [True, False]
