"""Every gradient rule checked by central finite differences in float64.

Each case runs one ONNX op through ``autograd.apply`` (recording a tape node), feeds random
output gradients to the node's rule, and compares the input gradients with central differences
of ``sum(R * op(x))``.
"""

from __future__ import annotations

import numpy as np
import pytest

from workbench import autograd
from workbench.autodiff import rules as grad
from workbench.autodiff import run_rule
from workbench.errors import UnsupportedOperatorError
from workbench.ops.registry import has_kernel
from workbench.tensor import Tensor

R = np.random.default_rng(1234)


def rnd(*shape, lo=-1.0, hi=1.0):
    return R.uniform(lo, hi, size=shape)


def away(*shape, gap=0.1):
    """Random values at least ``gap`` away from 0 (kinks of Relu/Abs...)."""
    a = R.uniform(gap, 1.0, size=shape)
    return a * R.choice([-1.0, 1.0], size=shape)


def distinct(*shape):
    """Values with no ties (pools, max reductions)."""
    n = int(np.prod(shape))
    return (R.permutation(n).reshape(shape) / n * 2 - 1) + R.uniform(0, 1e-3, size=shape)


def i64(a):
    return np.asarray(a, dtype=np.int64)


class Case:
    def __init__(self, op, inputs, attrs=None, opset=17, wrt=None, n_outputs=1, id=None,
                 eps=1e-6, tol=1e-6, fn=None, training=False):
        self.op, self.inputs, self.attrs, self.opset = op, inputs, attrs or {}, opset
        self.n_outputs, self.eps, self.tol, self.fn = n_outputs, eps, tol, fn
        self.training = training
        if wrt is None:
            wrt = [i for i, a in enumerate(inputs)
                   if a is not None and np.asarray(a).dtype == np.float64]
        self.wrt = wrt
        self.id = id or f"{op}-{opset}"


C = Case
CASES = [
    # ---------------------------------------------------------------- elementwise
    C("Add", [rnd(3, 1, 4), rnd(4)], id="Add-broadcast"),
    C("Sub", [rnd(2, 3), rnd(3, 1, 1)], id="Sub-broadcast"),
    C("Mul", [rnd(2, 3, 4), rnd(1, 4)], id="Mul-broadcast"),
    C("Div", [rnd(2, 3), away(3, gap=0.5)], id="Div-broadcast"),
    C("Pow", [rnd(2, 3, lo=0.5, hi=2.0), rnd(3, lo=-1.5, hi=2.0)], id="Pow"),
    C("Neg", [rnd(3, 4)]),
    C("Abs", [away(3, 4)]),
    C("Exp", [rnd(3, 4)]),
    C("Log", [rnd(3, 4, lo=0.2, hi=3)]),
    C("Sqrt", [rnd(3, 4, lo=0.2, hi=3)]),
    C("Reciprocal", [away(3, 4, gap=0.3)]),
    C("Sin", [rnd(5)]), C("Cos", [rnd(5)]), C("Tan", [rnd(5)]),
    C("Asin", [rnd(5, lo=-0.8, hi=0.8)]), C("Acos", [rnd(5, lo=-0.8, hi=0.8)]),
    C("Atan", [rnd(5)]), C("Sinh", [rnd(5)]), C("Cosh", [rnd(5)]), C("Asinh", [rnd(5)]),
    C("Acosh", [rnd(5, lo=1.2, hi=3)]), C("Atanh", [rnd(5, lo=-0.8, hi=0.8)]),
    C("Erf", [rnd(6)]),
    C("Sum", [rnd(2, 3), rnd(3), rnd(1, 3)], id="Sum-variadic"),
    C("Mean", [rnd(2, 3), rnd(3)], id="Mean-variadic"),
    C("Max", [distinct(2, 3), distinct(2, 3) + 0.01, distinct(3)], id="Max-variadic"),
    C("Min", [distinct(2, 3), distinct(3) + 0.005], id="Min-variadic"),
    C("Clip", [distinct(3, 4), np.asarray(-0.5), np.asarray(0.45)], wrt=[0], id="Clip-13"),
    C("Clip", [distinct(3, 4)], {"min": -0.3, "max": 0.6}, opset=6, id="Clip-6"),
    C("Where", [R.random((2, 3)) > 0.5, rnd(2, 3), rnd(3)], id="Where"),
    C("Identity", [rnd(2, 2)]),
    C("Cast", [rnd(2, 2)], {"to": 11}, id="Cast-f64"),
    C("CastLike", [rnd(2, 2), np.zeros(1)], opset=15, wrt=[0]),
    # ---------------------------------------------------------------- activations
    C("Relu", [away(3, 4)]),
    C("LeakyRelu", [away(3, 4)], {"alpha": 0.2}),
    C("Elu", [away(3, 4)], {"alpha": 0.7}),
    C("Selu", [away(3, 4)]),
    C("Celu", [away(3, 4)], {"alpha": 1.3}),
    C("Sigmoid", [rnd(3, 4)]), C("Tanh", [rnd(3, 4)]),
    C("Softplus", [rnd(3, 4)]), C("Softsign", [away(3, 4)]),
    C("HardSigmoid", [rnd(3, 4, lo=-4, hi=4)], {"alpha": 0.3, "beta": 0.4}),
    C("HardSwish", [np.array([-4.0, -2.5, -1.0, 0.3, 2.0, 3.5])]),
    C("PRelu", [away(2, 3, 4), rnd(3, 1)], id="PRelu-broadcast"),
    C("ThresholdedRelu", [np.array([-1.0, 0.5, 1.5, 2.5])], {"alpha": 1.0}),
    C("Gelu", [rnd(3, 4, lo=-3, hi=3)], opset=20, id="Gelu-erf"),
    C("Gelu", [rnd(3, 4, lo=-3, hi=3)], {"approximate": "tanh"}, opset=20, id="Gelu-tanh"),
    C("Mish", [rnd(3, 4, lo=-3, hi=3)], opset=18),
    C("Swish", [rnd(3, 4, lo=-3, hi=3)], {"alpha": 1.5}, opset=24),
    C("Softmax", [rnd(2, 3, 4)], {"axis": 1}, opset=13, id="Softmax-13"),
    C("Softmax", [rnd(2, 3, 4)], {"axis": 1}, opset=11, id="Softmax-11-coerce"),
    C("LogSoftmax", [rnd(2, 3, 4)], {"axis": -1}, opset=13, id="LogSoftmax-13"),
    C("LogSoftmax", [rnd(2, 3, 4)], {"axis": 1}, opset=11, id="LogSoftmax-11-coerce"),
    # ---------------------------------------------------------------- linear algebra
    C("MatMul", [rnd(3, 4), rnd(4, 5)], id="MatMul-2d"),
    C("MatMul", [rnd(2, 1, 3, 4), rnd(5, 4, 2)], id="MatMul-broadcast-batch"),
    C("MatMul", [rnd(2, 3, 4), rnd(4, 5)], id="MatMul-3d-2d"),
    C("MatMul", [rnd(4), rnd(2, 4, 3)], id="MatMul-1d-3d"),
    C("MatMul", [rnd(2, 3, 4), rnd(4)], id="MatMul-3d-1d"),
    C("Gemm", [rnd(3, 4), rnd(4, 5), rnd(5)], id="Gemm-bias"),
    C("Gemm", [rnd(4, 3), rnd(5, 4), rnd(3, 1)],
      {"transA": 1, "transB": 1, "alpha": 0.7, "beta": 1.3}, id="Gemm-trans"),
    C("Gemm", [rnd(3, 4), rnd(4, 5)], id="Gemm-noC"),
    # ---------------------------------------------------------------- convolution
    C("Conv", [rnd(2, 3, 7, 6), rnd(4, 3, 3, 3), rnd(4)],
      {"pads": [1, 0, 2, 1], "strides": [2, 1]}, id="Conv2d-pads-strides"),
    C("Conv", [rnd(1, 4, 7, 7), rnd(6, 2, 3, 2)], {"group": 2, "dilations": [2, 1]},
      id="Conv2d-groups-dilations"),
    C("Conv", [rnd(2, 4, 6, 6), rnd(4, 1, 3, 3), rnd(4)],
      {"group": 4, "pads": [1, 1, 1, 1], "strides": [2, 2]}, id="Conv2d-depthwise"),
    C("Conv", [rnd(1, 2, 5, 5), rnd(4, 1, 3, 3)], {"group": 2, "pads": [1, 1, 1, 1]},
      id="Conv2d-depthwise-multiplier"),
    C("Conv", [rnd(2, 3, 9), rnd(2, 3, 3)], {"auto_pad": "SAME_UPPER", "strides": [2]},
      id="Conv1d-same-upper"),
    C("Conv", [rnd(1, 2, 4, 5, 4), rnd(3, 2, 2, 3, 2)], {"pads": [0, 1, 0, 1, 0, 1]},
      id="Conv3d"),
    C("ConvTranspose", [rnd(2, 3, 4, 3), rnd(3, 2, 3, 3), rnd(2)],
      {"strides": [2, 2], "pads": [1, 0, 1, 1]}, id="ConvTranspose-strided"),
    C("ConvTranspose", [rnd(1, 4, 3, 3), rnd(4, 1, 3, 3)],
      {"strides": [2, 2], "group": 2, "output_padding": [1, 1]}, id="ConvTranspose-groups"),
    C("ConvTranspose", [rnd(1, 2, 3, 3), rnd(2, 3, 3, 3)],
      {"strides": [2, 2], "output_shape": [6, 6]}, id="ConvTranspose-output-shape"),
    # ---------------------------------------------------------------- pooling
    C("MaxPool", [distinct(2, 3, 7, 7)],
      {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1]}, id="MaxPool-2d"),
    C("MaxPool", [distinct(1, 2, 6, 6)], {"kernel_shape": [3, 3], "strides": [2, 2],
                                          "ceil_mode": 1}, id="MaxPool-ceil"),
    C("MaxPool", [distinct(1, 2, 7, 7)], {"kernel_shape": [2, 2], "dilations": [2, 2]},
      opset=12, id="MaxPool-dilated"),
    C("MaxPool", [distinct(2, 2, 9)], {"kernel_shape": [3], "strides": [2]}, id="MaxPool-1d"),
    C("AveragePool", [rnd(2, 3, 6, 6)],
      {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1]}, id="AvgPool-excl-pad"),
    C("AveragePool", [rnd(2, 3, 6, 6)],
      {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1],
       "count_include_pad": 1}, id="AvgPool-incl-pad"),
    C("AveragePool", [rnd(1, 2, 7, 7)], {"kernel_shape": [2, 2], "strides": [2, 2],
                                         "ceil_mode": 1}, id="AvgPool-ceil"),
    C("GlobalAveragePool", [rnd(2, 3, 4, 5)]),
    C("GlobalMaxPool", [distinct(2, 3, 4, 5)]),
    # ---------------------------------------------------------------- normalisation
    C("BatchNormalization", [rnd(2, 3, 4, 4), rnd(3, lo=0.5, hi=1.5), rnd(3), rnd(3),
                             rnd(3, lo=0.5, hi=2)], {"epsilon": 1e-3}, opset=15,
      id="BatchNorm-inference"),
    C("BatchNormalization", [rnd(4, 3, 3, 3), rnd(3, lo=0.5, hi=1.5), rnd(3), rnd(3),
                             rnd(3, lo=0.5, hi=2)],
      {"epsilon": 1e-3, "momentum": 0.8, "training_mode": 1}, opset=15, wrt=[0, 1, 2],
      id="BatchNorm-training", n_outputs=3, training=True, fn="batchnorm_train"),
    C("LayerNormalization", [rnd(2, 3, 5), rnd(5, lo=0.5, hi=1.5), rnd(5)], id="LayerNorm"),
    C("LayerNormalization", [rnd(2, 3, 4), rnd(3, 4), rnd(3, 4)], {"axis": 1},
      id="LayerNorm-axis1"),
    C("InstanceNormalization", [rnd(2, 3, 4, 4), rnd(3, lo=0.5, hi=1.5), rnd(3)]),
    C("LRN", [rnd(2, 5, 3, 3)], {"size": 3, "alpha": 0.5, "beta": 0.75, "bias": 1.5},
      id="LRN-odd"),
    C("LRN", [rnd(1, 6, 2, 2)], {"size": 4, "alpha": 0.3, "beta": 0.6, "bias": 2.0},
      id="LRN-even"),
    C("GroupNormalization", [rnd(2, 4, 3, 3), rnd(4, lo=0.5, hi=1.5), rnd(4)],
      {"num_groups": 2}, opset=21, id="GroupNorm-21"),
    # ---------------------------------------------------------------- shape / indexing
    C("Reshape", [rnd(2, 3, 4), i64([4, -1])]),
    C("Flatten", [rnd(2, 3, 4)], {"axis": 2}),
    C("Squeeze", [rnd(2, 1, 4), i64([1])], opset=13, id="Squeeze-13"),
    C("Squeeze", [rnd(2, 1, 4)], {"axes": [1]}, opset=11, id="Squeeze-11"),
    C("Unsqueeze", [rnd(2, 4), i64([0, 3])], opset=13, id="Unsqueeze-13"),
    C("Transpose", [rnd(2, 3, 4)], {"perm": [2, 0, 1]}),
    C("Transpose", [rnd(2, 3, 4)], id="Transpose-default"),
    C("Concat", [rnd(2, 3), rnd(2, 1), rnd(2, 2)], {"axis": -1}),
    C("Split", [rnd(2, 7), i64([2, 5])], {"axis": 1}, opset=13, n_outputs=2, id="Split-13"),
    C("Split", [rnd(6, 2)], {"axis": 0, "num_outputs": 3}, opset=18, n_outputs=3,
      id="Split-18"),
    C("Slice", [rnd(5, 6), i64([1, -1]), i64([4, 0]), i64([0, 1]), i64([2, -2])], opset=13,
      id="Slice-13-steps"),
    C("Slice", [rnd(4, 5)], {"starts": [1, 0], "ends": [100, 3], "axes": [0, 1]}, opset=9,
      id="Slice-9"),
    C("Gather", [rnd(5, 3), i64([[0, 4], [4, -1]])], {"axis": 0}, id="Gather-axis0-repeat"),
    C("Gather", [rnd(2, 5, 3), i64([1, 3, 1])], {"axis": 1}, id="Gather-axis1"),
    C("Gather", [rnd(2, 5), i64(2)], {"axis": 1}, id="Gather-scalar"),
    C("GatherElements", [rnd(3, 4), i64([[0, 3], [1, 1], [2, 0]])], {"axis": 1}),
    C("ScatterElements", [rnd(3, 4), i64([[0, 3], [1, -2], [2, 0]]), rnd(3, 2)], {"axis": 1},
      wrt=[0, 2], id="ScatterElements"),
    C("ScatterElements", [rnd(3, 4), i64([[0, 0], [1, 2]]), rnd(2, 2)],
      {"axis": 0, "reduction": "add"}, wrt=[0, 2], id="ScatterElements-add"),
    C("Expand", [rnd(3, 1), i64([2, 3, 4])]),
    C("Tile", [rnd(2, 3), i64([2, 3])]),
    C("Pad", [rnd(2, 3), i64([1, 0, 2, 1]), np.asarray(0.5)], opset=13, wrt=[0],
      id="Pad-constant"),
    C("Pad", [rnd(3, 4), i64([1, -1, 0, 2])], opset=13, id="Pad-negative"),
    C("Pad", [rnd(3, 4), i64([2, 1, 1, 3])], {"mode": "reflect"}, opset=13, id="Pad-reflect"),
    C("Pad", [rnd(3, 4), i64([2, 1, 1, 3])], {"mode": "edge"}, opset=13, id="Pad-edge"),
    C("Pad", [rnd(2, 3)], {"pads": [0, 1, 1, 0]}, opset=2, id="Pad-2"),
    C("Resize", [rnd(1, 2, 2, 3), None, np.array([1, 1, 2, 1.5], np.float32)],
      {"mode": "nearest"}, opset=13, wrt=[0], id="Resize-nearest"),
    C("Upsample", [rnd(1, 2, 2, 3), np.array([1, 1, 2, 2], np.float32)], opset=9, wrt=[0],
      id="Upsample-9"),
    C("DepthToSpace", [rnd(1, 8, 2, 3)], {"blocksize": 2}, id="DepthToSpace-DCR"),
    C("DepthToSpace", [rnd(1, 8, 2, 3)], {"blocksize": 2, "mode": "CRD"},
      id="DepthToSpace-CRD"),
    C("SpaceToDepth", [rnd(1, 2, 4, 6)], {"blocksize": 2}),
    # ---------------------------------------------------------------- reductions
    C("ReduceSum", [rnd(2, 3, 4), i64([1])], {"keepdims": 0}, opset=13, id="ReduceSum-13"),
    C("ReduceSum", [rnd(2, 3, 4)], {"axes": [0, 2]}, opset=11, id="ReduceSum-11"),
    C("ReduceSum", [rnd(2, 3)], opset=13, id="ReduceSum-all"),
    C("ReduceMean", [rnd(2, 3, 4)], {"axes": [-1], "keepdims": 0}, opset=17,
      id="ReduceMean-17"),
    C("ReduceMean", [rnd(2, 3, 4), i64([0, 1])], opset=18, id="ReduceMean-18"),
    C("ReduceMax", [distinct(2, 3, 4)], {"axes": [1]}, opset=17),
    C("ReduceMin", [distinct(2, 3, 4)], {"axes": [2], "keepdims": 0}, opset=17),
    C("ReduceProd", [rnd(2, 3, lo=0.5, hi=1.5)], {"axes": [1]}, opset=17),
    C("ReduceProd", [np.array([[0.0, 2.0, 3.0], [1.5, 0.5, 2.0]])], {"axes": [1]}, opset=17,
      id="ReduceProd-zero"),
    C("ReduceSumSquare", [rnd(2, 3)], {"axes": [0]}, opset=17),
    C("ReduceL1", [away(2, 3)], {"axes": [1]}, opset=17),
    C("ReduceL2", [rnd(2, 3)], {"axes": [1]}, opset=17),
    C("ReduceLogSumExp", [rnd(2, 3)], {"axes": [1]}, opset=17),
    C("ReduceLogSum", [rnd(2, 3, lo=0.5, hi=2)], {"axes": [0]}, opset=17),
    C("CumSum", [rnd(3, 4), i64(1)], id="CumSum"),
    C("CumSum", [rnd(3, 4), i64(0)], {"exclusive": 1, "reverse": 1}, id="CumSum-excl-rev"),
    # ---------------------------------------------------------------- losses
    C("SoftmaxCrossEntropyLoss", [rnd(4, 5), i64([0, 4, 2, 2])], opset=13, id="SCE-mean"),
    C("SoftmaxCrossEntropyLoss", [rnd(3, 4, 2), i64([[0, 1], [3, 3], [2, -1]]),
                                  rnd(4, lo=0.2, hi=1)],
      {"reduction": "mean", "ignore_index": -1}, opset=13, wrt=[0], id="SCE-weights-ignore"),
    C("SoftmaxCrossEntropyLoss", [rnd(3, 4), i64([0, 1, 3])], {"reduction": "none"},
      opset=13, id="SCE-none"),
    C("SoftmaxCrossEntropyLoss", [rnd(3, 4), i64([0, 1, 3])], {"reduction": "sum"},
      opset=13, n_outputs=2, id="SCE-sum-logprob"),
    C("NegativeLogLikelihoodLoss", [rnd(4, 5), i64([0, 4, 2, 2])], opset=13, id="NLL-mean"),
    C("NegativeLogLikelihoodLoss", [rnd(3, 4, 2), i64([[0, 1], [3, 3], [2, 1]]),
                                    rnd(4, lo=0.2, hi=1)], {"reduction": "sum"}, opset=13,
      wrt=[0], id="NLL-weights-sum"),
]


def _run(case, arrays, requires):
    ts = [None if a is None else Tensor(data=np.asarray(a), requires_grad=(i in requires))
          for i, a in enumerate(arrays)]
    fn = None
    if case.fn == "batchnorm_train":
        from workbench.autodiff.rules.norm import batchnorm_train
        fn = batchnorm_train
    out = autograd.apply(case.op, ts, case.attrs, n_outputs=case.n_outputs,
                         opset=case.opset, fn=fn, training_mode=case.training)
    return out if isinstance(out, tuple) else (out,)


def _objective(case, arrays, weights):
    with autograd.no_grad():
        outs = _run(case, arrays, ())
    return sum(float((o.numpy() * w).sum()) for o, w in zip(outs, weights) if w is not None)


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_gradient_rule(case):
    if not has_kernel(case.op, "", case.opset):
        pytest.skip(f"no kernel for {case.op} at opset {case.opset} yet")
    assert grad.rule_for(case.op) is not None, f"no gradient rule for {case.op}"
    arrays = [None if a is None else np.array(a) for a in case.inputs]
    try:
        outs = _run(case, arrays, set(case.wrt))
    except UnsupportedOperatorError as e:  # pragma: no cover
        pytest.skip(str(e))
    node = outs[0].creator
    assert node is not None and node.requires_grad
    # random output gradients on the float outputs (training-mode BN: only Y counts)
    weights = []
    for k, o in enumerate(outs):
        float_out = o.dtype == np.float64 and not (case.training and k > 0)
        weights.append(R.standard_normal(o.shape) if float_out else None)
    gins = run_rule(node, [w for w in weights])
    for i in case.wrt:
        analytic = gins[i]
        assert analytic is not None, f"input {i}: rule returned None"
        assert analytic.shape == arrays[i].shape
        numeric = np.zeros_like(arrays[i])
        flat = arrays[i].reshape(-1)
        for j in range(flat.size):
            old = flat[j]
            flat[j] = old + case.eps
            fp = _objective(case, arrays, weights)
            flat[j] = old - case.eps
            fm = _objective(case, arrays, weights)
            flat[j] = old
            numeric.reshape(-1)[j] = (fp - fm) / (2 * case.eps)
        scale = max(1.0, float(np.abs(numeric).max()))
        err = float(np.abs(analytic - numeric).max()) / scale
        assert err < case.tol, f"input {i}: max error {err:.2e}\nanalytic={analytic}\n" \
                               f"numeric={numeric}"


def test_every_rule_has_a_case():
    covered = {c.op for c in CASES}
    missing = [op for dom, op in grad.registered_rules()
               if dom == "" and op not in covered and op not in (
                   "Floor", "Ceil", "Round", "Sign", "Dropout")]  # tested below
    assert not missing, f"rules without a finite-difference case: {missing}"


def test_dropout_training_gradient_uses_the_mask():
    autograd.manual_seed(0)
    x = Tensor(data=rnd(50, 40), requires_grad=True)
    y = autograd.dropout(x, ratio=0.3, training=True)
    kept = y.numpy() != 0
    assert 0.6 < kept.mean() < 0.8
    np.testing.assert_allclose(y.numpy()[kept], x.numpy()[kept] / 0.7)
    (gx,) = [g for _, g in autograd.backward(y, np.ones(y.shape))]
    np.testing.assert_allclose(gx.numpy(), kept / 0.7)


def test_dropout_eval_is_identity():
    x = Tensor(data=rnd(4, 5), requires_grad=True)
    y = autograd.dropout(x, ratio=0.5, training=False)
    np.testing.assert_array_equal(y.numpy(), x.numpy())
    (gx,) = [g for _, g in autograd.backward(y, np.full(y.shape, 2.0))]
    np.testing.assert_array_equal(gx.numpy(), np.full(y.shape, 2.0))


def test_float_op_without_rule_raises_gradient_error():
    from workbench.errors import GradientError
    from workbench.ops.registry import register, unregister

    def twice(x):
        return x * 2

    register("TwiceNoGrad", twice, since=1, domain="test.nograd")
    try:
        w = Tensor(data=rnd(3), requires_grad=True, stores_grad=True)
        y = autograd.apply("TwiceNoGrad", [w], domain="test.nograd", name="my_twice")
        loss = autograd.reduce_sum(y)
        with pytest.raises(GradientError, match="my_twice.*TwiceNoGrad"):
            autograd.backward(loss)
    finally:
        unregister("TwiceNoGrad", domain="test.nograd")


@pytest.mark.parametrize("op", ["Floor", "Ceil", "Round", "Sign"])
def test_piecewise_constant_ops_pass_no_gradient(op):
    w = Tensor(data=rnd(3) + 0.3, requires_grad=True, stores_grad=True)
    y = autograd.apply(op, [w])
    assert y.requires_grad  # float output on the path...
    loss = autograd.reduce_sum(y * w)  # ...but only the direct use of w gets a gradient
    (g,) = [g for _, g in autograd.backward(loss)]
    np.testing.assert_array_equal(g.numpy(), y.numpy())
