"""The gradient rules' GPU fast paths (overrides registered for cupy in
``workbench/autodiff/rules/cuda.py``: CUDA kernels for Conv, MaxPool/AveragePool,
SoftmaxCrossEntropyLoss and training BatchNormalization) against the portable rules, float32.

Without a GPU the CUDA C is emulated on the CPU (``tests/gpu/emulation.py``: compiled with g++,
numpy stand-in for cupy), which checks argument order, geometry and index math; on a machine
with cupy and a GPU, ``tests/gpu`` runs the rules on the device."""

from __future__ import annotations

import numpy as np
import pytest

from tests.autograd.test_grad_rules import CASES
from workbench import autograd
from workbench.autodiff import run_rule
from workbench.tensor import Tensor

emulation = pytest.importorskip("tests.gpu.emulation")

FAST = [c for c in CASES if c.op in ("Conv", "MaxPool", "AveragePool",
                                     "SoftmaxCrossEntropyLoss")
        and len(c.inputs[0].shape) == (2 if c.op == "SoftmaxCrossEntropyLoss" else 4)]


def _grads(case, weights):
    arrays = [None if a is None else np.asarray(a) for a in case.inputs]
    arrays = [a.astype(np.float32) if a is not None and a.dtype == np.float64 else a
              for a in arrays]
    ts = [None if a is None else Tensor(data=a, requires_grad=i in case.wrt)
          for i, a in enumerate(arrays)]
    out = autograd.apply(case.op, ts, case.attrs, n_outputs=case.n_outputs, opset=case.opset)
    outs = out if isinstance(out, tuple) else (out,)
    return run_rule(outs[0].creator, weights), outs


@pytest.mark.skipif(emulation.GXX is None, reason="g++ is needed to emulate the CUDA kernels")
@pytest.mark.parametrize("case", FAST, ids=[c.id for c in FAST])
def test_gpu_fast_path_matches_portable_rule(case, monkeypatch):
    rng = np.random.default_rng(0)
    arrays = [None if a is None else np.asarray(a) for a in case.inputs]
    ts = [None if a is None else Tensor(data=a.astype(np.float32) if a.dtype == np.float64
                                        else a) for a in arrays]
    with autograd.no_grad():
        ref = autograd.apply(case.op, ts, case.attrs, n_outputs=case.n_outputs,
                             opset=case.opset)
    ref = ref if isinstance(ref, tuple) else (ref,)
    weights = [rng.standard_normal(o.shape).astype(np.float32) if k == 0 else None
               for k, o in enumerate(ref)]
    portable, _ = _grads(case, weights)

    emulation.install(monkeypatch)
    import workbench.autodiff.rules as wg
    assert wg.rule_for(case.op, xp=np) is wg.portable_rule(case.op)  # numpy: the portable rule
    fast_rule = wg.rule_for(case.op, xp="cupy")
    assert fast_rule is not wg.portable_rule(case.op)

    def no_fallback(op, domain=""):
        raise AssertionError(f"the CUDA override of {op} fell back to the portable rule")

    monkeypatch.setattr("workbench.autodiff.rules.cuda.portable_rule", no_fallback)
    # the tape's rule lookup sees numpy arrays: ask for the cupy override instead
    real_rule_for = wg.rule_for
    monkeypatch.setattr(wg, "rule_for", lambda op, domain="", xp=None: real_rule_for(
        op, domain, xp="cupy"))
    fast, _ = _grads(case, weights)
    for i in case.wrt:
        np.testing.assert_allclose(fast[i], portable[i], rtol=2e-5, atol=2e-5,
                                   err_msg=f"input {i}")


@pytest.mark.skipif(emulation.GXX is None, reason="g++ is needed to emulate the CUDA kernels")
@pytest.mark.parametrize("shape", [(4, 3, 5, 6), (6, 5)], ids=["NCHW", "NC"])
def test_gpu_batchnorm_training_matches_portable(shape, monkeypatch):
    """Training BatchNorm on the GPU path (statistics kernel, apply kernel; backward reduction
    and dx kernels) against the portable forward and rule, float32."""
    from workbench.autodiff.rules import GradContext
    from workbench.autodiff.rules import norm as gnorm
    r = np.random.default_rng(1)
    C = shape[1]
    x = (r.standard_normal(shape) * 2 + 1).astype(np.float32)
    s = r.uniform(0.5, 1.5, C).astype(np.float32)
    b, m = r.standard_normal(C).astype(np.float32), r.standard_normal(C).astype(np.float32)
    v = r.uniform(0.5, 2, C).astype(np.float32)
    g = r.standard_normal(shape).astype(np.float32)
    ctx = GradContext("BatchNormalization", 15, (True, True, True, False, False), np)
    kw = dict(epsilon=1e-3, momentum=0.8)

    def run(train, rule):
        outs = train(x, s, b, m, v, **kw)
        grads = rule(ctx, [g, None, None], [x, s, b, m, v], list(outs), epsilon=1e-3,
                     training_mode=1)
        return outs, grads
    want_outs, want_grads = run(gnorm.batchnorm_train, gnorm.batch_norm_grad)
    emulation.install(monkeypatch)
    from workbench.autodiff import rules as wg
    from workbench.autodiff.rules import cuda as cuda_grads
    from workbench.ops import registry

    def no_fallback(*args, **kw):
        raise AssertionError("the CUDA override fell back to the portable path")

    assert registry.train_form("BatchNormalization", "", 15, xp="cupy").fn is \
        cuda_grads.batchnorm_train_cuda
    assert wg.rule_for("BatchNormalization", xp="cupy") is cuda_grads.batch_norm_grad_cuda
    monkeypatch.setattr(cuda_grads, "batchnorm_train", no_fallback)
    monkeypatch.setattr(cuda_grads, "portable_rule", no_fallback)
    got_outs, got_grads = run(cuda_grads.batchnorm_train_cuda, cuda_grads.batch_norm_grad_cuda)
    for k, (a, w) in enumerate(zip(got_outs[:3], want_outs[:3])):
        np.testing.assert_allclose(a, w, rtol=2e-5, atol=2e-5, err_msg=f"output {k}")
    for k in range(3):
        np.testing.assert_allclose(got_grads[k], want_grads[k], rtol=2e-4, atol=2e-4,
                                   err_msg=f"gradient {k}")
