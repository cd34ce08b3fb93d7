"""Model-local functions are inlined at load: attribute references, defaults, nested calls,
calls inside subgraphs, recursion refused (also with check=False), against onnxruntime."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import workbench.backend as backend
from workbench.errors import ModelLoadError

ort = pytest.importorskip("onnxruntime")
OPS = [helper.make_opsetid("", 18), helper.make_opsetid("local", 1)]


def vi(name, shape):
    return helper.make_tensor_value_info(name, TensorProto.FLOAT, shape)


def _funcs():
    # ScaledLeaky(x; alpha, scale=2.0) = scale * LeakyRelu(x, alpha)
    scaled = helper.make_function(
        "local", "ScaledLeaky", ["x"], ["y"],
        [helper.make_node("LeakyRelu", ["x"], ["t"], alpha=0.0),
         helper.make_node("Constant", [], ["s"], value_float=0.0),
         helper.make_node("Mul", ["t", "s"], ["y"])],
        OPS, attributes=["alpha"])
    # attribute references: LeakyRelu.alpha <- alpha, Constant.value_float <- scale (default)
    scaled.node[0].attribute[0].ref_attr_name = "alpha"
    scaled.node[1].attribute[0].ref_attr_name = "scale"
    scaled.attribute_proto.append(helper.make_attribute("scale", 2.0))
    del scaled.attribute[:]
    scaled.attribute.append("alpha")
    # Twice(x) = ScaledLeaky(ScaledLeaky(x)) with a fixed alpha: a call inside a body
    twice = helper.make_function(
        "local", "Twice", ["x"], ["y"],
        [helper.make_node("ScaledLeaky", ["x"], ["h"], domain="local", alpha=0.5),
         helper.make_node("ScaledLeaky", ["h"], ["y"], domain="local", alpha=0.25,
                          scale=-1.0)], OPS)
    return [scaled, twice]


def _model(nodes, outputs):
    g = helper.make_graph(nodes, "g", [vi("x", [2, 3])], outputs)
    return helper.make_model(g, opset_imports=OPS, functions=_funcs())


def _compare(m):
    x = np.array([[-2.0, -0.5, 0.0], [0.5, 1.0, 3.0]], np.float32)
    ours = backend.prepare(m).run([x])
    ref = ort.InferenceSession(m.SerializeToString()).run(None, {"x": x})
    for a, b in zip(ours, ref):
        np.testing.assert_allclose(a, b, rtol=1e-6)
    return ours


def test_calls_with_attribute_references_defaults_and_nested_calls():
    m = _model([helper.make_node("ScaledLeaky", ["x"], ["a"], domain="local", alpha=0.1),
                helper.make_node("Twice", ["x"], ["b"], domain="local"),
                helper.make_node("Twice", ["a"], ["c"], domain="local")],
               [vi("a", [2, 3]), vi("b", [2, 3]), vi("c", [2, 3])])
    a, _, _ = _compare(m)
    x = np.array([[-2.0, -0.5, 0.0], [0.5, 1.0, 3.0]], np.float32)
    np.testing.assert_allclose(a, 2.0 * np.where(x >= 0, x, 0.1 * x), rtol=1e-6)


def test_calls_inside_if_bodies():
    then = helper.make_graph([helper.make_node("Twice", ["x"], ["t"], domain="local")], "then",
                             [], [vi("t", [2, 3])])
    other = helper.make_graph([helper.make_node("Neg", ["x"], ["e"])], "else", [],
                              [vi("e", [2, 3])])
    cond = helper.make_tensor("c", TensorProto.BOOL, [], [True])
    g = helper.make_graph([helper.make_node("If", ["c"], ["y"], then_branch=then,
                                            else_branch=other)],
                          "g", [vi("x", [2, 3])], [vi("y", [2, 3])], [cond])
    _compare(helper.make_model(g, opset_imports=OPS, functions=_funcs()))


def test_the_users_modelproto_keeps_its_calls():
    m = _model([helper.make_node("Twice", ["x"], ["b"], domain="local")], [vi("b", [2, 3])])
    before = m.SerializeToString()
    backend.prepare(m)
    assert m.SerializeToString() == before


@pytest.mark.parametrize("check", [True, False])
def test_recursive_functions_are_refused(check):
    f = helper.make_function("local", "A", ["x"], ["y"],
                             [helper.make_node("B", ["x"], ["y"], domain="local")], OPS)
    g_ = helper.make_function("local", "B", ["x"], ["y"],
                              [helper.make_node("A", ["x"], ["y"], domain="local")], OPS)
    g = helper.make_graph([helper.make_node("A", ["x"], ["y"], domain="local")], "g",
                          [vi("x", [2])], [vi("y", [2])])
    m = helper.make_model(g, opset_imports=OPS, functions=[f, g_])
    with pytest.raises(ModelLoadError, match="local::A -> local::B -> local::A"):
        backend.prepare(m, check=check)


def test_scikit_learn_knn_imputer_uses_functions():
    pytest.importorskip("skl2onnx")
    from skl2onnx import to_onnx
    from sklearn.impute import KNNImputer

    rng = np.random.default_rng(0)
    X = rng.standard_normal((30, 4)).astype(np.float32)
    X[::5, 1] = np.nan
    X[3, 2] = np.nan
    est = KNNImputer(n_neighbors=3).fit(X)
    m = to_onnx(est, X[:1], target_opset=18)
    assert len(m.functions) > 0
    (y,) = backend.prepare(m).run([X])
    (r,) = ort.InferenceSession(m.SerializeToString()).run(None, {m.graph.input[0].name: X})
    np.testing.assert_allclose(y, r, rtol=1e-5)
    np.testing.assert_allclose(y, est.transform(X), rtol=1e-5, atol=1e-6)
    assert onnx.checker.check_model(m) is None
