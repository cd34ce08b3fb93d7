"""``wb.load(m).run`` and ``backend.prepare(m).run`` run the same inference passes, the same
nodes with the same kernels: the same numbers, also after training has changed the weights and
running statistics.

What "the same" promises: bit for bit while BLAS runs on one thread; within float32 rounding
at any BLAS thread count. Every CPU run pins BLAS to one thread now (see docs/architecture.md,
CPU performance; ``model.run`` runs a prepared plan, ``workbench.singa.inference_cache``), but a
multi-threaded BLAS may add a product's terms in another order, so each test checks both: bit
for bit under ``threadpool_limits(1)``, and to float32 rounding as the environment has it.
``tests/test_model_inference_cache.py`` checks the cached plan against edits of the model.
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import numpy_helper
from threadpoolctl import threadpool_limits

import workbench as wb
from tests.test_sonnx_snippets import digits_batch, small_cnn_proto
from workbench import autograd, backend, opt
from workbench.tensor import Tensor


def _with_weights(model, proto: onnx.ModelProto) -> onnx.ModelProto:
    """``proto`` with its initializers replaced by ``model``'s current weights."""
    out = onnx.ModelProto()
    out.CopyFrom(proto)
    weights = model._weights
    for i, t in enumerate(out.graph.initializer):
        out.graph.initializer[i].CopyFrom(numpy_helper.from_array(weights[t.name].numpy(),
                                                                  t.name))
    return out


def _same(a, b) -> None:
    assert len(a) == len(b)
    for x, y in zip(a, b):
        assert x.dtype == y.dtype and x.shape == y.shape
        np.testing.assert_array_equal(x, y)


def _agree(run_a, run_b) -> None:
    """Bit for bit with BLAS on one thread; to float32 rounding at the configured count."""
    with threadpool_limits(limits=1):
        _same(run_a(), run_b())
    a, b = run_a(), run_b()
    assert len(a) == len(b)
    for x, y in zip(a, b):
        assert x.dtype == y.dtype and x.shape == y.shape
        scale = float(np.max(np.abs(y))) if y.size else 0.0
        np.testing.assert_allclose(x, y, rtol=0, atol=1e-5 * max(scale, 1e-30))


def test_run_and_prepare_agree():
    proto = small_cnn_proto()
    x, _ = digits_batch()
    model, rep = wb.load(proto), backend.prepare(proto)
    _agree(lambda: model.run(x), lambda: rep.run([x]))


def test_the_trainable_model_folds_batchnorm_on_its_current_weights():
    proto = small_cnn_proto()
    model = wb.load(proto)
    model.eval()
    plan, _ = model._tplan(model._outputs_for(-1, ()), True)
    ops = [s.node.op_type for s in plan.steps]
    # the inference passes ran (BatchNorm folded into the Conv, epilogue fused)...
    assert "BatchNormalization" not in ops and "FusedConv" in ops
    # ...but the folded weights are computed in the plan from the variables, not baked in
    assert "FoldBatchNormWeights" in ops
    rep = backend.prepare(proto)
    assert "FoldBatchNormWeights" not in [s.node.op_type for s in rep.plan.steps]


def test_changed_running_statistics_change_run():
    proto = small_cnn_proto()
    x, _ = digits_batch()
    model = wb.load(proto)
    before = model.run(x)[0]
    var = model._weights["bn_var"]
    var.copy_from_numpy(var.numpy() * 4)
    after = model.run(x)[0]
    assert not np.allclose(before, after)
    rep = backend.prepare(_with_weights(model, proto))
    _agree(lambda: model.run(x), lambda: rep.run([x]))


def test_after_training_run_equals_prepare_of_the_trained_weights():
    proto = small_cnn_proto()
    x, y = digits_batch()
    model = wb.load(proto)
    model.train()
    sgd = opt.SGD(lr=0.05, momentum=0.9)
    onehot = np.eye(10, dtype=np.float32)[y] if y.ndim == 1 else y
    for _ in range(3):
        out = model.forward(Tensor(data=x))[0]
        loss = autograd.softmax_cross_entropy(out, Tensor(data=onehot))
        sgd.backward_and_update(loss)
    # the running statistics moved too (training-mode BatchNorm)
    assert not np.array_equal(model._weights["bn_mean"].numpy(),
                              numpy_helper.to_array(next(
                                  t for t in proto.graph.initializer if t.name == "bn_mean")))
    model.eval()
    rep = backend.prepare(_with_weights(model, proto))
    _agree(lambda: model.run(x), lambda: rep.run([x]))
    # cut outputs (last_layers) agree too
    cut = model.run(x, last_layers=-3)[0]
    assert cut.shape == (x.shape[0], 1000)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["resnet18", "mobilenetv2", "bert", "gpt2"])
def test_exported_models_agree(name, torch_exports):
    from tests.helpers import torch_models
    proto = torch_exports.proto(name)
    feeds = torch_models.example_inputs(name, 2)
    model, rep = wb.load(proto), backend.prepare(proto)
    _agree(lambda: model.run(*feeds), lambda: rep.run(list(feeds)))
