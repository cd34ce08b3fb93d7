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
