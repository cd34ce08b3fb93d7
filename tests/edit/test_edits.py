"""Each edit on real exports (ResNet-18, BERT-like, a Paddle-style graph, a scikit-learn
pipeline), with the bad requests: a clear error and nothing changed."""

from __future__ import annotations

import numpy as np
import onnx
import pytest

from tests.edit.conftest import model_bytes, ort_run
from workbench import edit
from workbench.edit import EditError


def _refused(s, match, fn, *args, **kwargs):
    """``fn`` raises an EditError matching ``match`` and leaves the session as it was."""
    before, steps = model_bytes(s), len(s.steps)
    with pytest.raises(EditError, match=match):
        fn(*args, **kwargs)
    assert model_bytes(s) == before and len(s.steps) == steps


def _node(m, name):
    return next(n for n in m.graph.node if n.name == name)


# ---------------------------------------------------------------------------- ResNet-18
@pytest.mark.slow
def test_resnet_node_edits(exports):
    s = edit.open(exports.resnet())
    m = s.model
    relu = next(n for n in m.graph.node if n.op_type == "Relu")
    gemm = next(n for n in m.graph.node if n.op_type == "Gemm")
    # deleting a node others read is refused, naming them
    _refused(s, r"cannot be deleted: its output is read by .*MaxPool", s.delete_node, relu.name)
    # deleting the classifier with what depends on it would leave no output
    _refused(s, "every graph output", s.delete_node, gemm.name, downstream=True)
    _refused(s, "no node named 'nope'", s.delete_node, "nope")
    # the head becomes a Softmax over the logits; the output keeps its name
    step = s.insert_node("logits", "Softmax", attrs={"axis": 1}, name="probs")
    assert step.check.kind == "changes" and step.check.ran
    x = np.random.default_rng(0).standard_normal((2, 3, 64, 64)).astype(np.float32)
    np.testing.assert_allclose(s.run(x)["logits"].sum(1), 1, rtol=1e-5)
    # Relu -> LeakyRelu(0.1) with replace_node
    s.replace_node(relu.name, op_type="LeakyRelu", attrs={"alpha": 0.1})
    assert _node(s.model, relu.name).op_type == "LeakyRelu"
    _refused(s, "has no attribute 'beta'", s.replace_node, relu.name, remove_attrs=["beta"])
    # bypassing a BatchNormalization changes the function and says so; its four parameter
    # tensors go with it
    bn = next(n for n in m.graph.node if n.op_type == "BatchNormalization")
    step = s.bypass_node(bn.name)
    assert "changes the function" in step.check.summary()
    assert bn.name not in [n.name for n in s.model.graph.node]
    assert not ({i for i in bn.input[1:]} & {t.name for t in s.model.graph.initializer})
    # weights stored as float16 with a Cast back: about half the size, nearly the same
    size = s.model.ByteSize()
    step = s.convert_initializers("float16")
    assert step.check.kind == "approx" and max(step.check.errors.values()) < 1e-2
    assert s.model.ByteSize() < 0.6 * size
    # opset 17 -> 18 with onnx's converter, verified by running before and after; the
    # converter has no way down for BatchNormalization: the error lists the nodes per op
    step = s.set_opset(18)
    assert step.check.same and s.model.opset_import[0].version == 18
    _refused(s, r"(?s)cannot take this model from opset 18 to 13.*BatchNormalization \(19: ",
             s.set_opset, 13)
    # everything runs in onnxruntime too
    np.testing.assert_allclose(ort_run(s.model, {"input": x})[0], s.run(x)["logits"],
                               rtol=1e-3, atol=1e-5)


@pytest.mark.slow
def test_bert_outputs_renames_initializers(exports, tmp_path):
    s = edit.open(exports.transformer("bert", baked=False))
    m = s.model
    inner = next(n for n in m.graph.node if n.op_type == "Softmax").output[0]
    step = s.add_output(inner)
    assert step.check.same and inner in step.check.errors   # compared with the inner value
    _refused(s, "a graph output already", s.add_output, inner)
    s.rename_value(inner, "attention_probs_0")
    _refused(s, "name clash", s.rename_value, "attention_probs_0", "logits")
    _refused(s, "not a graph input", s.rename_input, "attention_probs_0", "z")
    s.rename_input("input_ids", "tokens")
    s.rename_output("logits", "scores")
    assert [v.name for v in s.model.graph.input][0] == "tokens"
    assert [v.name for v in s.model.graph.output] == ["sequence_output", "scores",
                                                      "attention_probs_0"]
    s.remove_output("attention_probs_0")
    s.remove_output("sequence_output")
    _refused(s, "only output", s.remove_output, "scores")
    # int8 per output column for the classifier's weight (a DequantizeLinear after it)
    w = next(n for n in s.model.graph.node if n.name == "/classifier/Gemm").input[1]
    step = s.convert_initializers("int8", names=[w], axis=0)
    assert step.check.kind == "approx" and max(step.check.errors.values()) < 0.05
    assert any(n.op_type == "DequantizeLinear" for n in s.model.graph.node)
    # replace a weight from numpy; a wrong shape is refused by the checks
    b = onnx.numpy_helper.to_array(next(t for t in s.model.graph.initializer
                                        if t.name == "classifier.bias"))
    s.set_initializer("classifier.bias", np.zeros_like(b))
    _refused(s, "does not run", s.set_initializer, "classifier.bias", np.zeros(5, np.float32))
    _refused(s, "neither an initializer", s.set_initializer, "scores", np.zeros(3))
    s.set_metadata("source", "bert-like test export")
    assert {p.key: p.value for p in s.model.metadata_props}["source"] == "bert-like test export"
    s.remove_metadata("source")
    _refused(s, "no metadata", s.remove_metadata, "source")
    s.rename_node("/classifier/Gemm", "classifier")
    _refused(s, "exists already", s.rename_node, "/pooler/Gemm", "classifier")
    path = tmp_path / "b.onnx"
    s.save(path)
    again = edit.open(str(path))
    assert [o.name for o in again.model.graph.output] == ["scores"]


# ---------------------------------------------------------------------------- BERT-like
@pytest.mark.slow
def test_bert_bypass_identity_and_extract(exports):
    s = edit.open(exports.transformer("bert", baked=False))
    ident = next(n for n in s.model.graph.node if n.op_type == "Identity")
    step = s.bypass_node(ident.name)
    assert step.check.kind == "keeps" and step.check.same
    # the part between the embeddings' output and the first attention output, alone
    m = s.model
    emb = next(n for n in m.graph.node if n.op_type == "LayerNormalization").output[0]
    attn_out = next(n for n in m.graph.node
                    if n.name.startswith("/layers.0/attn/out/") and n.op_type == "Add").output[0]
    step = s.extract([emb, "attention_mask"], [attn_out])
    assert step.check.same and [i.name for i in s.model.graph.input] == [emb, "attention_mask"]
    assert len(s.model.graph.node) < len(m.graph.node) // 2
    s.undo()
    # inputs the part needs are kept (and said so); an input that feeds nothing is refused
    step = s.extract([emb], [attn_out])
    assert "attention_mask" in [i.name for i in s.model.graph.input]
    assert any("still needed" in n for n in step.notes)
    s.undo()
    _refused(s, "do not feed", s.extract, [emb, "token_type_ids"], [attn_out])
    _refused(s, "no value 'nope'", s.extract, [emb], ["nope"])


# ---------------------------------------------------------------------------- Paddle style
def test_paddle_style_graph(paddle):
    s = edit.open(paddle)
    _refused(s, r"read by 'p2o.Relu.0'", s.delete_node, "p2o.BatchNormalization.0")
    # remove the Scale (Mul + Add of constants) before the softmax: changes the function
    s.bypass_node("p2o.Add.1")
    s.bypass_node("p2o.Mul.0")
    names = {t.name for t in s.model.graph.initializer}
    assert "p2o.helper.constant.1" not in names and "p2o.helper.constant.2" not in names
    # the logits as a second output, renamed, and the batch fixed at 4
    s.add_output("linear_1.tmp_1", name="logits")
    s.rebatch(4)
    x = np.random.default_rng(1).standard_normal((4, 3, 16, 16)).astype(np.float32)
    out = s.run(x)
    np.testing.assert_allclose(out["softmax_0.tmp_0"],
                               np.exp(out["logits"]) / np.exp(out["logits"]).sum(1,
                                                                                 keepdims=True),
                               rtol=1e-5)
    assert [d.dim_value for d in s.model.graph.input[0].type.tensor_type.shape.dim] == \
        [4, 3, 16, 16]
    # the symbolic paddle dim name back, under a name of ours
    s.set_dims("x", ["N", 3, 16, 16])
    _refused(s, r"rank 4 .*2 dims given", s.set_dims, "x", [1, 2])
    _refused(s, "not a graph input or output", s.set_dims, "relu_0.tmp_0", [1])
    s.set_opset(13)
    assert ort_run(s.model, {"x": x})[0].shape == (4, 4)
    # cut off the head: the pooled features become the output
    s.cut_after(["reshape2_0.tmp_0"])
    assert [o.name for o in s.model.graph.output] == ["reshape2_0.tmp_0"]
    assert s.run(x)["reshape2_0.tmp_0"].shape == (4, 8)


# ---------------------------------------------------------------------------- scikit-learn
def test_sklearn_pipeline(sklearn_pipeline):
    pipe, m, X = sklearn_pipeline
    s = edit.open(m, inputs={"X": X[:5]})
    _refused(s, "graph output 'output_probability'", s.delete_node, "ZipMap")
    # ZipMap's list of dicts -> a plain probability tensor; the output's type follows
    step = s.bypass_node("ZipMap")
    assert any("now carries" in n for n in step.notes)
    out_t = next(o for o in s.model.graph.output if o.name == "output_probability")
    assert out_t.type.HasField("tensor_type")
    s.add_output("variable", name="scaled")
    s.rename_output("output_probability", "proba")
    s.rebatch(5)
    out = s.run(X[:5])
    np.testing.assert_allclose(out["proba"], pipe.predict_proba(X[:5]), rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(out["output_label"], pipe.predict(X[:5]))
    np.testing.assert_allclose(out["scaled"], pipe[0].transform(X[:5]), rtol=1e-5, atol=1e-6)
    got = ort_run(s.model, {"X": X[:5]})
    np.testing.assert_allclose(got[1], out["proba"], rtol=1e-5, atol=1e-6)
    # the LinearClassifier's coefficients replaced from numpy: predictions follow
    lc = next(n for n in s.model.graph.node if n.op_type == "LinearClassifier")
    coef = next(a for a in lc.attribute if a.name == "coefficients")
    zeros = [0.0] * len(coef.floats)
    s.replace_node(lc.name, attrs={"coefficients": zeros, "intercepts": [0.0, 0.0, 0.0]})
    np.testing.assert_allclose(s.run(X[:5])["proba"], 1 / 3, rtol=1e-5)
    _refused(s, "name clash", s.rename_value, "scaled", "proba")
