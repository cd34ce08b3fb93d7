"""Re-batch and re-shape on exports whose shapes are baked in.

The demonstration of the issue: on torch.onnx exports made with a fixed batch, declaring a new
batch (plain dim editing) passes onnx.checker and shape inference but the model does not run
(a Reshape constant carries the old batch), while ``rebatch`` rewrites those constants and the
result equals, sample by sample, the model before; onnxruntime and the same network exported
with dynamic axes agree.
"""

from __future__ import annotations

import numpy as np
import pytest

from tests.edit.conftest import model_bytes, ort_run, torch_run
from tests.helpers.torch_models import example_inputs
from workbench import edit
from workbench.edit import EditError

pytestmark = pytest.mark.slow


def _feeds(name, batch, seq=8):
    names = {"bert": ("input_ids", "token_type_ids", "attention_mask"),
             "gpt2": ("input_ids",)}[name]
    return dict(zip(names, example_inputs(name, batch, seq=seq)))


def test_plain_dim_edit_fails_where_rebatch_works_bert(exports):
    baked = exports.transformer("bert", baked=True)
    assert [d.dim_value for d in baked.graph.input[0].type.tensor_type.shape.dim] == [1, 8]
    # 1. plain dim editing: the declaration changes, the checker and shape inference accept it
    plain = edit.open(baked, check="static")
    for name in ("input_ids", "token_type_ids", "attention_mask"):
        plain.set_dims(name, [4, 8])
    assert plain.steps[-1].check.static == "ok"
    # ... but the model does not run at batch 4, in the engine or in onnxruntime
    with pytest.raises(Exception, match=r"Reshape"):
        plain.run(_feeds("bert", 4))
    with pytest.raises(Exception, match=r"(?i)reshape"):
        ort_run(plain.model, _feeds("bert", 4))
    # 2. with the run check (the default) the same dim edit is refused, nothing changes
    s = edit.open(baked)
    before = model_bytes(s)
    with pytest.raises(EditError, match=r"does not run .*Reshape.*\[1, 8, 4, 16\]"):
        s.set_dims("input_ids", [4, 8])
    assert model_bytes(s) == before and not s.steps
    # 3. rebatch rewrites the baked Reshape targets and is checked sample by sample
    step = s.rebatch(4)
    assert step.check.ok and step.check.same
    assert any("batch 4: each sample" in n for n in step.check.notes)
    rewritten = [n for n in step.notes if "Reshape" in n and "->" in n]
    assert len(rewritten) == 8, step.notes
    got = s.run(_feeds("bert", 4))
    # onnxruntime runs the edited model too, and the network exported with dynamic axes
    # (same weights) computes the same at batch 4
    dynamic = exports.transformer("bert", baked=False)
    ref = ort_run(dynamic, _feeds("bert", 4))
    ours_in_ort = ort_run(s.model, _feeds("bert", 4))
    for a, b, c in zip(ref, ours_in_ort, [got["sequence_output"], got["logits"]]):
        np.testing.assert_allclose(b, a, rtol=1e-4, atol=1e-5)
        np.testing.assert_allclose(c, a, rtol=1e-4, atol=1e-4)


def test_symbolic_batch_gpt2_and_a_seq_change_it_cannot_make(exports):
    s = edit.open(exports.transformer("gpt2", baked=True))
    step = s.rebatch("batch")
    assert [d.dim_param for d in s.model.graph.input[0].type.tensor_type.shape.dim[:1]] \
        == ["batch"]
    assert any("batch 3" in n for n in step.check.notes) and \
        any("batch 5" in n for n in step.check.notes)
    ref = exports.torch_model("gpt2")
    for b in (2, 6):
        x = _feeds("gpt2", b)["input_ids"]
        np.testing.assert_allclose(ort_run(s.model, {"input_ids": x})[0],
                                   torch_run(ref, x)[0], rtol=1e-4, atol=1e-4)
    # GPT-2's position embeddings were folded for 8 positions: a new length is refused,
    # naming the constant, and the session keeps its model
    before = model_bytes(s)
    with pytest.raises(EditError, match=r"initializer .* holds data computed for the old size "
                                        r"8 on axis 1"):
        s.reshape_inputs({"input_ids": ["batch", 12]})
    assert model_bytes(s) == before and len(s.steps) == 1


def test_bert_new_sequence_length_from_a_folded_arange(exports):
    """BERT's position ids were folded to the constant [0..7]; a new length makes it a Range,
    and the result equals the dynamic export at length 12."""
    s = edit.open(exports.transformer("bert", baked=True))
    step = s.reshape_inputs({n: ["batch", 12] for n in ("input_ids", "token_type_ids",
                                                        "attention_mask")})
    assert any("range 0..7 -> Range" in n for n in step.notes), step.notes
    feeds = _feeds("bert", 3, seq=12)
    ref = ort_run(exports.transformer("bert", baked=False), feeds)
    got = s.run(feeds)
    np.testing.assert_allclose(got["sequence_output"], ref[0], rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(ort_run(s.model, feeds)[1], ref[1], rtol=1e-4, atol=1e-4)


def test_vit_baked_at_batch_two_expand_concat_and_folded_zeros(exports):
    """Old batch 2 (not 1): the class token's Expand target [2, 1, 1] (found through the
    Concat that needs equal batches), a zeros [2, 16] constant and a Reshape to [2, -1]."""
    s = edit.open(exports.vit())
    step = s.rebatch("N")
    text = "\n".join(step.notes)
    assert "Expand" in text and "[2, 16], the same along axis 0" in text and "Reshape" in text
    x = np.random.default_rng(3).standard_normal((7, 3, 16, 16)).astype(np.float32)
    ref = torch_run(exports.vit_torch(), x)[0]
    np.testing.assert_allclose(s.run(x)["y"], ref, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(ort_run(s.model, {"x": x})[0], ref, rtol=1e-4, atol=1e-5)


def test_resnet_flatten_needs_no_rewrite_and_bad_requests(exports):
    s = edit.open(exports.resnet(baked=True))
    step = s.rebatch(3)
    assert "no constant was baked" in "\n".join(step.notes)
    before = model_bytes(s)
    with pytest.raises(EditError, match="already"):
        s.rebatch(3)
    with pytest.raises(EditError, match="positive int or a name"):
        s.rebatch(0)
    with pytest.raises(EditError, match="rank 4; 2 dims"):
        s.reshape_inputs({"input": [3, 3]})
    with pytest.raises(EditError, match="not a graph input"):
        s.reshape_inputs({"nope": [1]})
    assert model_bytes(s) == before


def test_cnn_view_batch_baked(exports):
    """``x.view(x.size(0), -1)`` exported at batch 1: Reshape(x, [1, -1]) would silently
    merge a batch of 4 into one row; rebatch makes it [batch, -1]-like."""
    import io  # noqa: PLC0415
    import warnings  # noqa: PLC0415

    import onnx  # noqa: PLC0415
    import torch  # noqa: PLC0415

    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Conv2d(1, 4, 3), torch.nn.ReLU(),
                              torch.nn.AdaptiveAvgPool2d(2))

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.body, self.fc = net, torch.nn.Linear(16, 3)

        def forward(self, x):
            return self.fc(self.body(x).view(1, -1))

    model = Net().eval()
    buf = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(model, (torch.randn(1, 1, 8, 8),), buf, input_names=["x"],
                          output_names=["y"], opset_version=13, dynamo=False)
    m = onnx.load_from_string(buf.getvalue())
    s = edit.open(m)
    step = s.rebatch(4)
    assert any("target [1, -1] ->" in n for n in step.notes), step.notes
    x = np.random.default_rng(0).standard_normal((4, 1, 8, 8)).astype(np.float32)
    want = np.concatenate([torch_run(model, x[i:i + 1])[0] for i in range(4)])
    np.testing.assert_allclose(s.run(x)["y"], want, rtol=1e-5, atol=1e-5)


def test_shufflenet_new_image_size_and_batch(exports):
    """ShuffleNetV2 exported at 64x64, batch 1: its channel shuffle is Reshape(x, [1, 2, 58,
    8, 8]) -> Transpose -> Reshape(x, [1, -1, 8, 8]) with the batch and the spatial size baked
    in; a new image size and batch rewrites all of them and matches torch."""
    from tests.helpers import torch_models  # noqa: PLC0415

    model = exports.torch_model("shufflenetv2")
    x = __import__("torch").from_numpy(torch_models.example_inputs("shufflenetv2", 1,
                                                                   image=64)[0])
    m = torch_models.export_onnx(model, (x,), None, opset=17, dynamic_batch=False)
    s = edit.open(m)
    step = s.reshape_inputs({"input": [2, 3, 96, 96]}, batch_axis=0)
    assert len(step.rewrites) == 32 and step.check.same
    xx = np.random.default_rng(0).standard_normal((2, 3, 96, 96)).astype(np.float32)
    ref = torch_run(model, xx)[0]
    np.testing.assert_allclose(s.run(xx)["logits"], ref, rtol=1e-4, atol=1e-4)
