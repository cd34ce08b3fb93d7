"""The structure reader (workbench/graph/structure.py, ``load(path, weights=False)``): every
tensor a model can carry, wherever it sits, is left out and described exactly when its data
passes the threshold; everything else comes back byte for byte; malformed files are
``ModelLoadError``s like a failed protobuf parse; the structure-only graph matches the full
one in everything but the values."""

from __future__ import annotations

import os
import random

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from tests.graph.models import mlp
from workbench.errors import ModelLoadError
from workbench.graph.external import (
    UnreadTensor,
    is_described,
    iter_model_tensors,
    unread_mark,
)
from workbench.graph.load import load
from workbench.graph.structure import FileBytes, read_structure


def _t(name, shape, dtype=np.float32, seed=0):
    a = np.random.default_rng(seed).standard_normal(shape).astype(dtype)
    return numpy_helper.from_array(a, name)


def everywhere() -> onnx.ModelProto:
    """Big (8 KiB+) and small tensors in every place a model can hold one: initializers,
    a sparse initializer, Constant value and sparse_value, a tensor-list attribute, an If
    body's initializer and Constant, a model-local function's Constant, training info."""
    big, small = (64, 64), (2,)
    then_g = helper.make_graph(
        [helper.make_node("Constant", [], ["tc"], value=_t("tcv", big, seed=3)),
         helper.make_node("Add", ["tc", "ti"], ["to"])], "then", [],
        [helper.make_tensor_value_info("to", 1, list(big))], [_t("ti", big, seed=4)])
    else_g = helper.make_graph(
        [helper.make_node("Constant", [], ["eo"], value=_t("ecv", big, seed=5))], "else", [],
        [helper.make_tensor_value_info("eo", 1, list(big))])
    sp = helper.make_sparse_tensor(_t("spv", (2000,), seed=6),
                                   numpy_helper.from_array(np.arange(2000, dtype=np.int64),
                                                           "spi"), [4000])
    nodes = [
        helper.make_node("Constant", [], ["c_big"], value=_t("cbv", big, seed=1)),
        helper.make_node("Constant", [], ["c_small"], value=_t("csv", small, seed=2)),
        helper.make_node("Constant", [], ["c_sparse"], sparse_value=sp),
        helper.make_node("If", ["cond"], ["if_out"], then_branch=then_g, else_branch=else_g),
        helper.make_node("Add", ["x", "w"], ["h"]),
        helper.make_node("Add", ["h", "c_big"], ["h2"]),
        helper.make_node("Add", ["h2", "if_out"], ["h3"]),
        helper.make_node("Fbig", ["h3"], ["y"], domain="local"),
    ]
    node_with_list = helper.make_node("Custom", ["x"], ["z"], domain="ext",
                                      ts=[_t("l0", big, seed=7), _t("l1", small, seed=8)])
    nodes.append(node_with_list)
    fn = helper.make_function(
        "local", "Fbig", ["a"], ["b"],
        [helper.make_node("Constant", [], ["k"], value=_t("fk", big, seed=9)),
         helper.make_node("Add", ["a", "k"], ["b"])], [helper.make_opsetid("", 17)])
    g = helper.make_graph(
        nodes, "everywhere",
        [helper.make_tensor_value_info("x", 1, list(big)),
         helper.make_tensor_value_info("cond", TensorProto.BOOL, [])],
        [helper.make_tensor_value_info("y", 1, list(big)),
         helper.make_tensor_value_info("z", 1, None)],
        [_t("w", big, seed=10), _t("w_small", small, seed=11)])
    g.sparse_initializer.append(helper.make_sparse_tensor(
        _t("gsv", (3000,), seed=12),
        numpy_helper.from_array(np.arange(3000, dtype=np.int64), "gsi"), [5000]))
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17),
                                            helper.make_opsetid("local", 1),
                                            helper.make_opsetid("ext", 1)], functions=[fn])
    ti = m.training_info.add()
    ti.initialization.CopyFrom(helper.make_graph(
        [helper.make_node("Constant", [], ["ti_c"], value=_t("tiv", big, seed=13))], "init",
        [], [helper.make_tensor_value_info("ti_c", 1, list(big))]))
    return m


def _data_bytes(t) -> int:
    return len(t.raw_data) + 4 * len(t.float_data) + 8 * len(t.int64_data) + \
        4 * len(t.int32_data) + 8 * len(t.double_data) + 8 * len(t.uint64_data)


@pytest.mark.parametrize("keep", [0, 4096, 10**9])
def test_every_tensor_is_described_exactly_when_big(keep):
    m = everywhere()
    data = m.SerializeToString()
    mark = unread_mark()
    out, n, nbytes = read_structure(data, mark, keep_bytes=keep)
    before = list(iter_model_tensors(m))
    after = list(iter_model_tensors(out))
    assert [w for _, w in before] == [w for _, w in after]
    described = 0
    for (a, where), (b, _) in zip(before, after):
        assert (a.name, list(a.dims), a.data_type) == (b.name, list(b.dims), b.data_type), where
        if _data_bytes(a) > keep:
            assert is_described(b) and _data_bytes(b) == 0, where
            info = {e.key: e.value for e in b.external_data}
            assert info["location"] == mark and int(info["length"]) == _data_bytes(a), where
            described += 1
        else:
            assert b == a, where                        # untouched, byte for byte
    assert n == described and (described == 0) == (keep >= 10**9)
    if keep >= 10**9:
        assert out.SerializeToString() == data
    # everything but the tensors is the same message
    for t, _ in after:
        t.Clear()
    for t, _ in before:
        t.Clear()
    assert out == m


def test_big_files_are_read_a_window_at_a_time(tmp_path):
    m = everywhere()
    data = m.SerializeToString()
    p = tmp_path / "m.onnx"
    p.write_bytes(data)
    with open(p, "rb") as f:
        fb = FileBytes(f.fileno(), len(data))
        fb.WINDOW = 1000                               # many windows
        assert bytes(fb[i] for i in range(len(data))) == data
        assert fb[10:5000] == data[10:5000] and fb[0:len(data)] == data
        a, _, _ = read_structure(fb, "\x00m", keep_bytes=4096)
    b, _, _ = read_structure(data, "\x00m", keep_bytes=4096)
    assert a == b


def test_structure_only_graph_matches_the_full_one(tmp_path):
    path = tmp_path / "mlp.onnx"
    m = mlp()
    m.graph.initializer[0].CopyFrom(_t("w1", (4, 8)))
    w_big = _t("w2", (8, 300))                         # 9,600 bytes: described
    m.graph.initializer[2].CopyFrom(w_big)
    m.graph.node[-1].output[0] = "y300"
    m.graph.output[0].CopyFrom(helper.make_tensor_value_info("y300", 1, ["N", 300]))
    onnx.save(m, str(path))
    full, desc = load(str(path)), load(str(path), weights=False)
    assert [n.name for n in full.graph.nodes] == [n.name for n in desc.graph.nodes]
    assert full.proto.graph.value_info == desc.proto.graph.value_info        # same shapes
    for k, a in full.graph.initializers.items():
        d = desc.graph.initializers[k]
        assert (d.shape, d.dtype) == (a.shape, a.dtype)
        if a.nbytes > 4096:
            assert isinstance(d, UnreadTensor) and d.nbytes == a.nbytes
            assert d.source == "raw_data" and d.stored == a.nbytes
        else:
            np.testing.assert_array_equal(d, a)
    assert desc.graph.num_parameters() == full.graph.num_parameters()


def test_everywhere_model_loads_structure_only(tmp_path):
    path = tmp_path / "e.onnx"
    onnx.save(everywhere(), str(path))
    lm = load(str(path), check=False, weights=False)
    kinds = {type(a).__name__ for a in lm.graph.initializers.values()}
    assert kinds == {"UnreadTensor", "ndarray"}
    assert isinstance(lm.graph.initializers["gsv"], UnreadTensor)          # sparse, big
    assert lm.graph.initializers["gsv"].shape == (5000,)
    if_node = next(n for n in lm.graph.nodes if n.op_type == "If")
    assert isinstance(if_node.attrs["then_branch"].initializers["ti"], UnreadTensor)
    custom = next(n for n in lm.graph.nodes if n.op_type == "Custom")
    assert [type(t).__name__ for t in custom.attrs["ts"]] == ["UnreadTensor", "ndarray"]


def test_external_data_is_checked_not_read(tmp_path, monkeypatch):
    """The structure-only load opens no external data file: it checks the location (inside
    the folder, a regular file) and the size only."""
    from tests.helpers import hostile_models as hm
    path = hm.write_external_data_model(str(tmp_path), 1 << 20)
    opened = []
    real_open = open

    def spy(file, *a, **k):
        opened.append(os.fspath(file) if not isinstance(file, int) else file)
        return real_open(file, *a, **k)

    monkeypatch.setattr("builtins.open", spy)
    lm = load(path, check=False, shape_inference=False, weights=False)
    monkeypatch.undo()
    assert not any(str(o).endswith("weights.bin") for o in opened), opened
    w = lm.graph.initializers["w"]
    assert w.source == "external file 'weights.bin'" and w.nbytes == 1 << 20
    (tmp_path / "weights.bin").write_bytes(b"\0" * 100)                  # too short now
    with pytest.raises(ModelLoadError, match="has only 100 bytes"):
        load(path, check=False, weights=False)


def test_a_forged_mark_is_refused(tmp_path):
    """A file cannot pass a tensor off as described: the mark starts with a NUL byte, which
    an external data location may not hold."""
    t = onnx.TensorProto(name="w", data_type=TensorProto.FLOAT, dims=[4])
    t.data_location = TensorProto.EXTERNAL
    for k, v in (("location", "\x00workbench-unread:0000"), ("source", "raw_data"),
                 ("length", "16")):
        e = t.external_data.add()
        e.key, e.value = k, v
    g = helper.make_graph([helper.make_node("Relu", ["w"], ["y"])], "g", [],
                          [helper.make_tensor_value_info("y", 1, [4])], [t])
    p = tmp_path / "forged.onnx"
    onnx.save(helper.make_model(g), str(p))
    for weights in (False, True):
        with pytest.raises(ModelLoadError, match="NUL byte|unknown external data key"):
            load(str(p), check=False, weights=weights)


def test_malformed_files_are_model_load_errors(tmp_path):
    data = everywhere().SerializeToString()
    rng = random.Random(0)
    for k in range(150):
        buf = bytearray(data)
        kind = k % 3
        if kind == 0:
            buf = buf[:rng.randrange(1, len(buf))]
        elif kind == 1:
            for _ in range(rng.randrange(1, 6)):
                buf[rng.randrange(len(buf))] = rng.randrange(256)
        else:
            i = rng.randrange(len(buf))
            buf[i:i] = bytes(rng.randrange(256) for _ in range(rng.randrange(1, 12)))
        try:
            read_structure(bytes(buf), "\x00m", keep_bytes=256)
        except ModelLoadError:
            pass
    nested = b"\x3a\xff\xff\xff\xff\x0f"          # graph field claiming 4 GiB
    with pytest.raises(ModelLoadError, match="not a valid ONNX model"):
        read_structure(nested, "\x00m")
