"""com.microsoft::Tokenizer against onnxruntime on the same one-node models."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper

import workbench.backend as backend
from workbench.errors import WorkbenchError

ort = pytest.importorskip("onnxruntime")

TEXT = np.array([["Hello World", "I love  computer science !"],
                 ["a-b-c", ""]], dtype=object)


def _model(shape, **attrs):
    node = helper.make_node("Tokenizer", ["X"], ["Y"], domain="com.microsoft",
                            name="tok", **attrs)
    x = helper.make_tensor_value_info("X", TensorProto.STRING, shape)
    y = helper.make_tensor_value_info("Y", TensorProto.STRING, [None] * (len(shape) + 1))
    g = helper.make_graph([node], "g", [x], [y])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17),
                                            helper.make_opsetid("com.microsoft", 1)])
    m.ir_version = 8
    return m


CASES = {
    "tokenexp": dict(tokenexp="[a-zA-Z]+", mark=0, mincharnum=1, pad_value="#"),
    "tokenexp-mark-minchar": dict(tokenexp="[a-zA-Z]+", mark=1, mincharnum=2,
                                  pad_value="<pad>"),
    "separators": dict(separators=[" ", "-"], mark=0, mincharnum=1, pad_value="#"),
    "characters": dict(separators=[""], mark=0, mincharnum=1, pad_value="#"),
}


@pytest.mark.parametrize("name", sorted(CASES))
@pytest.mark.parametrize("rank", [1, 2])
def test_tokenizer_vs_onnxruntime(name, rank):
    x = TEXT if rank == 2 else TEXT[0]
    m = _model([None] * rank, **CASES[name])
    ours = backend.prepare(m).run({"X": x})[0]
    sess = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
    ref = sess.run(None, {"X": x})[0]
    assert ours.shape == ref.shape
    np.testing.assert_array_equal(ours, ref)


def test_tokenizer_needs_a_mode():
    m = _model([None], mark=0, mincharnum=1, pad_value="#")
    with pytest.raises(WorkbenchError, match=r"node 'tok' \(Tokenizer\).*tokenexp"):
        backend.prepare(m).run({"X": np.array(["a b"], dtype=object)})


# ---------------------------------------------------------------------------------- MurmurHash3
# MurmurHash3_x86_32 test vectors as published with the algorithm's verification (key, seed,
# hash), covering every tail length and the empty key
VECTORS = [
    (b"", 0, 0x00000000), (b"", 1, 0x514E28B7), (b"", 0xFFFFFFFF, 0x81F16F39),
    (b"\x00\x00\x00\x00", 0, 0x2362F9DE), (b"\xff\xff\xff\xff", 0, 0x76293B50),
    (b"\x21\x43\x65\x87", 0, 0xF55B516B), (b"\x21\x43\x65\x87", 0x5082EDEE, 0x2362F9DE),
    (b"\x21\x43\x65", 0, 0x7E4A8634), (b"\x21\x43", 0, 0xA0F7B07A), (b"\x21", 0, 0x72661CF4),
    (b"aaaa", 0x9747B28C, 0x5A97808A), (b"aaa", 0x9747B28C, 0x283E0130),
    (b"aa", 0x9747B28C, 0x5D211726), (b"a", 0x9747B28C, 0x7FA09EA6),
    (b"abcd", 0x9747B28C, 0xF0478627), (b"abc", 0x9747B28C, 0xC84A62DD),
    (b"ab", 0x9747B28C, 0x74875592), (b"Hello, world!", 0x9747B28C, 0x24884CBA),
    (b"The quick brown fox jumps over the lazy dog", 0x9747B28C, 0x2FA826CD),
]


def _hash_model(elem_type, shape, positive=1, seed=0):
    node = helper.make_node("MurmurHash3", ["X"], ["Y"], domain="com.microsoft", name="hash",
                            positive=positive, seed=seed)
    out = TensorProto.UINT32 if positive else TensorProto.INT32
    g = helper.make_graph([node], "g", [helper.make_tensor_value_info("X", elem_type, shape)],
                          [helper.make_tensor_value_info("Y", out, shape)])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17),
                                            helper.make_opsetid("com.microsoft", 1)])
    m.ir_version = 8
    return m


def test_murmurhash3_published_vectors():
    from workbench.ops.contrib_tokenizer import murmur3_x86_32
    for key, seed, want in VECTORS:
        data = np.zeros((1, max(4, -(-len(key) // 4) * 4)), np.uint8)
        data[0, :len(key)] = np.frombuffer(key, np.uint8)
        assert int(murmur3_x86_32(data, [len(key)], seed)[0]) == want, (key, seed)
    # the kernel, on strings (latin-1 keeps the bytes of the binary keys as code points < 128)
    text = [k for k, s, _ in VECTORS if s == 0x9747B28C]
    m = _hash_model(TensorProto.STRING, [len(text)], seed=0x9747B28C - 2 ** 32)
    got = backend.prepare(m).run({"X": np.array([k.decode() for k in text], dtype=object)})[0]
    assert got.tolist() == [h for _, s, h in VECTORS if s == 0x9747B28C]


@pytest.mark.parametrize("positive", [0, 1])
@pytest.mark.parametrize("seed", [0, 42, -1, 0x7FFFFFFF])
def test_murmurhash3_strings_match_scikit_learn(positive, seed):
    sk = pytest.importorskip("sklearn.utils")
    words = np.array([["", "a", "ab"], ["abc", "héllo wörld ✓", "The quick brown fox"]],
                     dtype=object)
    got = backend.prepare(_hash_model(TensorProto.STRING, [2, 3], positive, seed)).run(
        {"X": words})[0]
    assert got.dtype == (np.uint32 if positive else np.int32) and got.shape == (2, 3)
    want = [[sk.murmurhash3_32(w, seed=seed & 0xFFFFFFFF, positive=bool(positive))
             for w in row] for row in words]
    assert got.tolist() == want


NUMERIC = {
    TensorProto.INT32: np.array([0, 1, -1, 2 ** 31 - 1, -(2 ** 31)], np.int32),
    TensorProto.UINT32: np.array([0, 1, 2 ** 32 - 1, 123456789], np.uint32),
    TensorProto.INT64: np.array([0, -1, 2 ** 62 + 3, -(2 ** 63)], np.int64),
    TensorProto.UINT64: np.array([0, 2 ** 64 - 1, 77], np.uint64),
    TensorProto.FLOAT: np.array([0.0, -0.0, 1.5, np.inf, -3.25e-7], np.float32),
    TensorProto.DOUBLE: np.array([0.0, 1e300, -2.5, np.pi]),
    TensorProto.STRING: np.array(["cat", "dog", "", "naïve"], dtype=object),
}


@pytest.mark.parametrize("elem_type", sorted(NUMERIC))
@pytest.mark.parametrize("positive,seed", [(1, 0), (0, 17), (1, -5)])
def test_murmurhash3_matches_onnxruntime(elem_type, positive, seed):
    x = NUMERIC[elem_type]
    m = _hash_model(elem_type, list(x.shape), positive, seed)
    ref = ort.InferenceSession(m.SerializeToString(),
                               providers=["CPUExecutionProvider"]).run(None, {"X": x})[0]
    got = backend.prepare(m).run({"X": x})[0]
    assert got.dtype == ref.dtype
    np.testing.assert_array_equal(got, ref)


def test_murmurhash3_numbers_hash_their_bytes():
    from sklearn.utils import murmurhash3_32
    x = np.array([7, -3], np.int32)
    got = backend.prepare(_hash_model(TensorProto.INT32, [2])).run({"X": x})[0]
    assert got.tolist() == [murmurhash3_32(v.tobytes(), positive=True) for v in x]


def test_murmurhash3_bad_input():
    m = _hash_model(TensorProto.INT16, [2])
    with pytest.raises(WorkbenchError, match=r"hash.*int16 is not supported"):
        backend.prepare(m, check=False).run({"X": np.array([1, 2], np.int16)})
    m = _hash_model(TensorProto.INT32, [0])
    assert backend.prepare(m).run({"X": np.zeros(0, np.int32)})[0].shape == (0,)
