"""Architecture twins: built with the layer API, valid ONNX, the real models' interface, and the
same numbers in workbench.backend as in onnxruntime."""

from __future__ import annotations

import numpy as np
import onnx
import pytest

import workbench.backend as backend
from workbench import tensor, zoo
from workbench.errors import WorkbenchError
from workbench.zoo import twins

ort = pytest.importorskip("onnxruntime")

NAMES = sorted(twins.BUILDERS)
_DT = {"float32": onnx.TensorProto.FLOAT, "int64": onnx.TensorProto.INT64}


def _feeds(m: onnx.ModelProto, name: str, rng) -> dict:
    feeds = {}
    for vi in m.graph.input:
        dims = [d.dim_value or 1 for d in vi.type.tensor_type.shape.dim]
        if name == "gpt2":
            dims = [1, 1, 9]
        elif name == "roberta":
            dims = [2, 11]
        if vi.type.tensor_type.elem_type == onnx.TensorProto.INT64:
            if "mask" in vi.name or "segment" in vi.name:
                a = (rng.random(dims) < 0.7).astype(np.int64)
            else:
                a = rng.integers(0, 100, dims).astype(np.int64)
        else:
            a = rng.uniform(0, 255, dims).astype(np.float32)
        feeds[vi.name] = a
    return feeds


def test_every_zoo_model_has_a_twin():
    assert NAMES == zoo.names()


@pytest.mark.parametrize("name", NAMES)
def test_twin_matches_real_interface_and_onnxruntime(name):
    m = twins.build(name)
    onnx.checker.check_model(m)
    e = zoo.get(name)
    assert [i.name for i in m.graph.input] == [s.name for s in e.inputs]
    assert [o.name for o in m.graph.output][:len(e.outputs)] == [s.name for s in e.outputs]
    for vi, spec in zip(m.graph.input, e.inputs):
        assert vi.type.tensor_type.elem_type == _DT[spec.dtype]
        dims = vi.type.tensor_type.shape.dim
        assert len(dims) == len(spec.shape)
    assert twins.twin_of(m) == name
    assert "meaningless" in m.doc_string
    feeds = _feeds(m, name, np.random.default_rng(7))
    got = backend.prepare(m).run(feeds)
    want = ort.InferenceSession(m.SerializeToString(),
                                providers=["CPUExecutionProvider"]).run(None, feeds)
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert g.shape == w.shape and g.dtype == w.dtype
        scale = max(float(np.abs(w).max()), 1e-6)
        err = float(np.abs(g.astype(np.float64) - w).max()) / scale
        assert err <= 1e-4, f"{name}: normalised max error {err:.2e}"
        assert np.all(np.isfinite(g))


def test_twin_output_layouts():
    yolo = twins.build("tinyyolov2")
    s = twins.YOLO_TWIN_SIZE
    (grid,) = backend.prepare(yolo).run([np.zeros((1, 3, s, s), np.float32)])
    assert grid.shape == (1, 125, s // 32, s // 32)
    (emb,) = backend.prepare(twins.build("arcface")).run([np.zeros((1, 3, 112, 112),
                                                                  np.float32)])
    assert emb.shape == (1, 512)
    gpt = backend.prepare(twins.build("gpt2"))
    (logits,) = gpt.run([np.zeros((1, 1, 5), np.int64)])
    assert logits.shape == (1, 1, 5, 257)
    bert = backend.prepare(twins.build("bertsquad"))
    ids = np.zeros((2, 256), np.int64)
    end, start, uid = bert.run([np.array([5, 9], np.int64), ids, ids + 1, ids])
    assert end.shape == start.shape == (2, 256) and uid.tolist() == [5, 9]


def test_gpt2_twin_is_causal():
    rep = backend.prepare(twins.build("gpt2"))
    a = rep.run([np.array([[[1, 2, 3, 4]]], np.int64)])[0]
    b = rep.run([np.array([[[1, 2, 3, 99]]], np.int64)])[0]
    np.testing.assert_allclose(a[..., :3, :], b[..., :3, :], rtol=1e-5, atol=1e-5)
    assert not np.allclose(a[..., 3, :], b[..., 3, :])


def test_twins_are_deterministic_and_do_not_disturb_the_rng():
    tensor.seed(123)
    before = tensor.host_rng().random()
    tensor.seed(123)
    twins._cache.clear()
    m1 = twins.build("emotion_ferplus")
    after = tensor.host_rng().random()
    assert before == after
    twins._cache.clear()
    m2 = twins.build("FerPlus")                                     # an alias
    assert m1.SerializeToString() == m2.SerializeToString()
    assert twins.build("ferplus", seed=1).SerializeToString() != m1.SerializeToString()


def test_unknown_twin_name_suggests():
    with pytest.raises(WorkbenchError, match="did you mean 'resnet18'"):
        twins.build("resnt18")


def test_twin_metadata(tmp_path):
    m = twins.build("roberta")
    p = tmp_path / "r.onnx"
    onnx.save(m, p)
    assert twins.metadata(str(p))["workbench.max_positions"] == "64"
    assert twins.twin_of(str(p)) == "roberta"
    plain = onnx.helper.make_model(onnx.helper.make_graph([], "g", [], []))
    assert twins.twin_of(plain) is None
