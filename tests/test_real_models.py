"""Real architectures, built in PyTorch, exported with torch.onnx, run by the engine.

Each model (ResNet-18, MobileNetV2, ShuffleNetV2, a BERT-like encoder, a GPT-2-like decoder) is
exported once per session (``torch_exports`` fixture, tests/conftest.py) and run through
``workbench.backend.prepare(model).run(...)`` and through onnxruntime on the same inputs; the
normalised max error ``max|ours - ort| / max|ort|`` must be <= 1e-3 for every output, at batch 1
and batch 3 (the batch axis is dynamic; the sequence axis of the transformers too).
Opset variants cover the exporter's different op forms (Clip attributes vs inputs, LayerNorm
decomposed (14) vs LayerNormalization (17+), GELU decomposed vs the Gelu op (20, erf and tanh),
Split/Slice/Reduce* attribute-to-input moves).
"""

from __future__ import annotations

import pytest

from tests.helpers.compare import assert_outputs_close, ort_session, run_ort, run_workbench

pytestmark = pytest.mark.slow
pytest.importorskip("onnxruntime", reason="onnxruntime is the output oracle of these tests")

TOL = 1e-3

# (model, opset): 17 for every model, plus variants where the exported op forms differ
CASES = [
    ("resnet18", 17), ("resnet18", 9), ("resnet18", 11), ("resnet18", 20),
    ("mobilenetv2", 17), ("mobilenetv2", 10),
    ("shufflenetv2", 17), ("shufflenetv2", 11),
    ("bert", 17), ("bert", 14), ("bert", 20),
    ("gpt2", 17), ("gpt2", 14), ("gpt2", 18), ("gpt2", 20),
]
SEQ = {1: 8, 3: 5}  # sequence length per batch size for the transformers (dynamic axis)

_reps: dict = {}
_sessions: dict = {}


def _rep(torch_exports, name, opset, device="CPU"):
    import workbench.backend as backend

    key = (name, opset, str(device))
    if key not in _reps:
        _reps[key] = backend.prepare(torch_exports.proto(name, opset), str(device))
    return _reps[key]


def _ort(torch_exports, name, opset):
    key = (name, opset)
    if key not in _sessions:
        _sessions[key] = ort_session(torch_exports.proto(name, opset))
    return _sessions[key]


def _inputs(name, batch):
    from tests.helpers.torch_models import example_inputs

    return example_inputs(name, batch, seq=SEQ[batch])


@pytest.mark.parametrize("batch", [1, 3])
@pytest.mark.parametrize("name,opset", CASES, ids=[f"{n}-opset{o}" for n, o in CASES])
def test_real_model_matches_onnxruntime(torch_exports, name, opset, batch, device):
    """On the CPU, and on CUDA:0 where a GPU is present (``device`` fixture)."""
    proto = torch_exports.proto(name, opset)
    inputs = _inputs(name, batch)
    ref = run_ort(_ort(torch_exports, name, opset), inputs)
    got = run_workbench(_rep(torch_exports, name, opset, device), inputs)
    out_names = [o.name for o in proto.graph.output]
    assert_outputs_close(got, ref, tol=TOL, names=out_names,
                         what=f"{name} (opset {opset}, batch {batch}) on {device}")


@pytest.mark.parametrize("name", ["resnet18", "mobilenetv2", "shufflenetv2", "bert", "gpt2"])
def test_export_matches_torch(torch_exports, name):
    """Sanity check of the oracle itself: the exported model computes what torch computes."""
    from tests.helpers.torch_models import torch_forward

    model, _ = torch_exports.model(name)
    inputs = _inputs(name, 3)
    ref = torch_forward(model, inputs)
    got = run_ort(_ort(torch_exports, name, 17), inputs)
    assert_outputs_close(got, ref, tol=1e-4, what=f"onnxruntime vs torch on {name}")


def test_batchnorm_survives_export(torch_exports):
    """The exports keep BatchNormalization nodes with non-trivial stats (the engine folds them)."""
    import numpy as np
    from onnx import numpy_helper

    proto = torch_exports.proto("resnet18", 17)
    bns = [n for n in proto.graph.node if n.op_type == "BatchNormalization"]
    assert len(bns) == 20
    inits = {t.name: t for t in proto.graph.initializer}
    mean = numpy_helper.to_array(inits[bns[0].input[3]])
    var = numpy_helper.to_array(inits[bns[0].input[4]])
    assert np.abs(mean).max() > 1e-3 and np.abs(var - 1).max() > 1e-3


def test_resnet18_from_file_with_external_data(torch_exports, tmp_path):
    """Same model through a path, weights in an external-data file beside it."""
    import workbench.backend as backend
    from tests.helpers.torch_models import export_onnx

    model, example = torch_exports.model("resnet18")
    path = tmp_path / "resnet18.onnx"
    export_onnx(model, example, path, opset=17, external_data=True)
    assert (tmp_path / "resnet18.onnx.data").exists()
    inputs = _inputs("resnet18", 1)
    ref = run_ort(_ort(torch_exports, "resnet18", 17), inputs)
    got = run_workbench(backend.prepare(str(path)), inputs)
    assert_outputs_close(got, ref, tol=TOL, what="resnet18 from a file with external data")


def test_gpt2_causal_mask_in_graph(torch_exports):
    """Changing a later token must not change the logits at earlier positions (ours)."""
    import numpy as np

    from tests.helpers.torch_models import example_inputs

    rep = _rep(torch_exports, "gpt2", 17)
    (ids,) = example_inputs("gpt2", 2, seq=7)
    ids2 = ids.copy()
    ids2[:, -1] = (ids2[:, -1] + 1) % 1000
    a = run_workbench(rep, [ids])[0]
    b = run_workbench(rep, [ids2])[0]
    np.testing.assert_allclose(a[:, :-1], b[:, :-1], rtol=1e-6, atol=1e-6)
    assert np.abs(a[:, -1] - b[:, -1]).max() > 0
