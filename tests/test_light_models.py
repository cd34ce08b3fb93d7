"""The nine ``light_*`` zoo models shipped in the onnx wheel, run by the engine.

The models (AlexNet, DenseNet-121, Inception v1/v2, ResNet-50, ShuffleNet, SqueezeNet, VGG-19,
ZFNet-512; opset 9, IR 3) carry no weights: every weight is a ``ConstantOfShape`` filled with
0.02, so all channels compute the same thing and the final softmax is uniform. Two tests each:

* as shipped, random input of the declared shape, the pre-softmax logits added as an output:
  ours vs onnxruntime, and vs the expected output shipped beside the model
  (``light_*_output_0.pb``). Where the constant weights make the logits tied *and* huge
  (SqueezeNet: every logit about 7e9, one ulp = 512) the softmax is decided by one-ulp
  rounding differences, so there the logits are compared and the softmax is checked against
  the softmax of our own logits;
* with deterministic random weights (each ``ConstantOfShape`` replaced by a ``Constant`` of
  random values fitted to its consumer: He-normal conv/FC weights, BatchNorm scale/var in
  [0.5, 1.5], small biases/means) and the pre-softmax logits added as a graph output, so that a
  channel-order or layout mistake cannot hide behind constant weights: ours vs onnxruntime.

Normalised max error ``max|ours - ref| / max|ref|`` <= 1e-3 on every output. Batch 1.
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import numpy_helper

from tests.helpers.compare import assert_outputs_close, ort_session, run_ort, run_workbench
from tests.helpers.light_models import (
    LIGHT_NAMES,
    light_dir,
    light_path,
    random_inputs,
    with_logits_output,
    with_random_weights,
)

pytestmark = pytest.mark.slow
pytest.importorskip("onnxruntime", reason="onnxruntime is the output oracle of these tests")

TOL = 1e-3


@pytest.fixture(scope="module")
def light_models():
    folder = light_dir()
    if not folder.is_dir():
        pytest.skip(f"the installed onnx package ships no light_* models ({folder})")
    return {name: onnx.load(str(light_path(name))) for name in LIGHT_NAMES}


@pytest.mark.parametrize("name", LIGHT_NAMES, ids=list(LIGHT_NAMES))
def test_light_model_as_shipped(light_models, name):
    model = with_logits_output(light_models[name])
    inputs = random_inputs(model, seed=1)
    ref = run_ort(ort_session(model), inputs)
    got = run_workbench(model, inputs)
    names = [o.name for o in model.graph.output]
    n_out = len(light_models[name].graph.output)
    # the logits (extra outputs) always match onnxruntime
    assert_outputs_close(got[n_out:], ref[n_out:], tol=TOL, names=names[n_out:],
                         what=f"light_{name} logits vs onnxruntime")
    expected_pb = light_dir() / f"light_{name}_output_0.pb"
    expected = (numpy_helper.to_array(onnx.load_tensor(str(expected_pb)))
                if expected_pb.exists() else None)
    for k in range(n_out):
        logits = ref[n_out + k] if n_out + k < len(ref) else None
        if logits is not None and _softmax_ill_conditioned(logits):
            # Constant weights make every logit the same huge number (about 7e9 for
            # SqueezeNet): one float32 ulp of it is hundreds, so a one-ulp rounding
            # difference in any channel (BLAS blocking) decides the softmax outright. The
            # logits were compared above; here the softmax must be exact for *our* logits.
            z = got[n_out + k].astype(np.float64)
            axis = 1
            e = np.exp(z - z.max(axis=axis, keepdims=True))
            want = (e / e.sum(axis=axis, keepdims=True)).astype(np.float32)
            assert_outputs_close([got[k]], [want], tol=TOL, names=names[k:k + 1],
                                 what=f"light_{name} softmax of its own logits")
            continue
        assert_outputs_close([got[k]], [ref[k]], tol=TOL, names=names[k:k + 1],
                             what=f"light_{name} vs onnxruntime")
        if k == 0 and expected is not None:  # constant weights: the output ignores the input
            assert_outputs_close([got[0]], [expected], tol=TOL, names=names[:1],
                                 what=f"light_{name} vs its shipped expected output")


def _softmax_ill_conditioned(logits: np.ndarray) -> bool:
    """True when the (float32) logits are tied and one ulp of them exceeds 1: a one-ulp change
    of any logit then multiplies its softmax weight by more than e."""
    a = np.abs(logits.astype(np.float32))
    return bool(np.ptp(logits) == 0 and np.spacing(a.max()) > 1.0)


@pytest.mark.parametrize("name", LIGHT_NAMES, ids=list(LIGHT_NAMES))
def test_light_model_random_weights(light_models, name):
    model = with_random_weights(light_models[name], seed=2)
    inputs = random_inputs(model, seed=3)
    ref = run_ort(ort_session(model), inputs)
    assert all(np.isfinite(r).all() for r in ref), "random weights overflowed in onnxruntime"
    got = run_workbench(model, inputs)
    names = [o.name for o in model.graph.output]
    assert_outputs_close(got, ref, tol=TOL, names=names,
                         what=f"light_{name} with random weights vs onnxruntime")


def test_random_weights_are_not_degenerate(light_models):
    """The randomised model really has per-channel variation (the test above is meaningful)."""
    model = with_random_weights(light_models["squeezenet"], seed=2)
    logits = run_ort(ort_session(model), random_inputs(model, seed=3))[-1]
    assert logits.std() > 1e-3 * np.abs(logits).max()
