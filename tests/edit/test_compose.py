"""Compose, extract and cut: a pre-processing model joined to a classifier, the classifier's
head cut off, the pre-processing cut off again."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from tests.edit.conftest import model_bytes, ort_run
from workbench import edit
from workbench.edit import EditError


def preprocessing(out_name: str = "image", opset: int = 13) -> onnx.ModelProto:
    """uint8 HWC pixels (8x8x1) -> float NCHW in [-1, 1]: Cast, Transpose, Sub, Div."""
    nodes = [
        helper.make_node("Cast", ["pixels"], ["f"], to=TensorProto.FLOAT, name="cast"),
        helper.make_node("Transpose", ["f"], ["chw"], perm=[0, 3, 1, 2], name="to_nchw"),
        helper.make_node("Sub", ["chw", "mean"], ["centred"], name="centre"),
        helper.make_node("Div", ["centred", "scale"], [out_name], name="scale"),
    ]
    inits = [helper.make_tensor("mean", TensorProto.FLOAT, [], [127.5]),
             helper.make_tensor("scale", TensorProto.FLOAT, [], [127.5])]
    g = helper.make_graph(nodes, "pre",
                          [helper.make_tensor_value_info("pixels", TensorProto.UINT8,
                                                         ["batch", 8, 8, 1])],
                          [helper.make_tensor_value_info(out_name, TensorProto.FLOAT,
                                                         ["batch", 1, 8, 8])], inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])


def _pixels(n=3):
    return np.random.default_rng(0).integers(0, 256, (n, 8, 8, 1)).astype(np.uint8)


def test_compose_preprocessing_with_a_classifier_then_cut_it_off(digits):
    s = edit.open(digits)
    x = _pixels()
    want = s.run(((x.astype(np.float32) - 127.5) / 127.5).transpose(0, 3, 1, 2))["logits"]
    step = s.compose(preprocessing("image"), {"image": "image"}, before=True, prefix="pre/")
    assert [i.name for i in s.model.graph.input] == ["pre/pixels"]
    assert step.check.kind == "changes" and step.check.ran
    assert any("converted from opset 13" in n for n in step.notes) or \
        s.model.opset_import[0].version == 13
    got = s.run(x)["logits"]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(ort_run(s.model, {"pre/pixels": x})[0], want, rtol=1e-4,
                               atol=1e-5)
    # cut the pre-processing off again: 'pre/image' becomes the input
    step = s.cut_before(["pre/image"])
    assert [i.name for i in s.model.graph.input] == ["pre/image"] and step.check.same
    # and the head: the pooled features become the output
    step = s.cut_after("/10/Flatten_output_0")
    assert [o.name for o in s.model.graph.output] == ["/10/Flatten_output_0"]
    assert step.check.same


def test_compose_after_and_bad_requests(digits):
    s = edit.open(digits)
    softmax = helper.make_model(helper.make_graph(
        [helper.make_node("Softmax", ["z"], ["p"], axis=1)], "head",
        [helper.make_tensor_value_info("z", TensorProto.FLOAT, ["n", 10])],
        [helper.make_tensor_value_info("p", TensorProto.FLOAT, ["n", 10])]),
        opset_imports=[helper.make_opsetid("", 13)])
    before = model_bytes(s)
    with pytest.raises(EditError, match="no output 'nope'"):
        s.compose(softmax, {"nope": "z"})
    with pytest.raises(EditError, match="no input 'q'"):
        s.compose(softmax, {"logits": "q"})
    wrong = onnx.ModelProto()
    wrong.CopyFrom(softmax)
    wrong.graph.input[0].type.tensor_type.shape.dim[1].dim_value = 7
    with pytest.raises(EditError, match=r"dims differ"):
        s.compose(wrong, {"logits": "z"})
    int_in = onnx.ModelProto()
    int_in.CopyFrom(softmax)
    int_in.graph.input[0].type.tensor_type.elem_type = TensorProto.INT64
    with pytest.raises(EditError, match=r"element types differ"):
        s.compose(int_in, {"logits": "z"})
    newer = onnx.ModelProto()
    newer.CopyFrom(softmax)
    newer.opset_import[0].version = 18
    with pytest.raises(EditError, match=r"opset 18, newer .* set_opset\(18\)"):
        s.compose(newer, {"logits": "z"})
    clash = preprocessing("image")   # a value of its own called 'logits' too
    for n in clash.graph.node:
        n.input[:] = ["logits" if i == "centred" else i for i in n.input]
        n.output[:] = ["logits" if o == "centred" else o for o in n.output]
    with pytest.raises(EditError, match=r"name clash .*'logits'.*prefix"):
        s.compose(clash, {"image": "image"}, before=True)
    assert model_bytes(s) == before and not s.steps
    s.compose(softmax, {"logits": "z"}, prefix="head/", keep_outputs=True)
    assert [o.name for o in s.model.graph.output] == ["logits", "head/p"]
    out = s.run(np.random.default_rng(1).standard_normal((2, 1, 8, 8)).astype(np.float32))
    np.testing.assert_allclose(out["head/p"].sum(1), 1, rtol=1e-5)
    e = np.exp(out["logits"] - out["logits"].max(1, keepdims=True))
    np.testing.assert_allclose(out["head/p"], e / e.sum(1, keepdims=True), rtol=1e-5)


def test_compose_from_a_file_replays(tmp_path, digits):
    pre = tmp_path / "pre.onnx"
    onnx.save(preprocessing("image"), str(pre))
    s = edit.open(digits)
    s.compose(str(pre), {"image": "image"}, before=True, prefix="p_")
    ns: dict = {}
    exec(s.script(), ns)
    assert ns["model"].SerializeToString(deterministic=True) == model_bytes(s)


def test_extract_agrees_with_onnx_utils_extract_model(digits, tmp_path):
    """extract() on the digits model, checked against onnx.utils.extract_model's result."""
    from onnx.utils import extract_model  # noqa: PLC0415

    s = edit.open(digits)
    ins, outs = ["/2/Relu_output_0"], ["/8/Relu_output_0"]
    step = s.extract(ins, outs)
    assert step.check.same
    src, dst = tmp_path / "m.onnx", tmp_path / "part.onnx"
    onnx.save(edit.open(digits).model, str(src))
    extract_model(str(src), str(dst), ins, outs)
    ref = onnx.load(str(dst))
    assert [n.name for n in s.model.graph.node] == [n.name for n in ref.graph.node]
    x = np.random.default_rng(2).standard_normal((2, 16, 8, 8)).astype(np.float32)
    np.testing.assert_allclose(s.run({"/2/Relu_output_0": x})["/8/Relu_output_0"],
                               ort_run(ref, {"/2/Relu_output_0": x})[0], rtol=1e-4, atol=1e-4)
