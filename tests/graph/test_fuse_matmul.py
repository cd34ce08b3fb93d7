"""fuse_matmul_epilogue (workbench/graph/passes.py) and the FusedMatMul kernel it creates
(workbench/ops/linalg.py): every fused graph against the same graph run unoptimised."""

from __future__ import annotations

import math

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from workbench.errors import InputError
from workbench.graph import passes
from workbench.graph.load import load
from workbench.ops.linalg import fused_matmul_epilogue
from workbench.ops.registry import FUSED_DOMAIN
from workbench.runtime import Plan

RNG = np.random.default_rng(0)


def _const(name, value):
    return numpy_helper.from_array(np.asarray(value, dtype=np.float32), name)


def _gelu_erf_nodes(x, out):
    """PyTorch's export of nn.GELU(): x * (erf(x / sqrt 2) + 1) * 0.5."""
    return [helper.make_node("Div", [x, "sqrt2"], ["g_d"]),
            helper.make_node("Erf", ["g_d"], ["g_e"]),
            helper.make_node("Add", ["g_e", "one"], ["g_a"]),
            helper.make_node("Mul", [x, "g_a"], ["g_m"]),
            helper.make_node("Mul", ["g_m", "half"], [out])]


def _gelu_tanh_nodes(x, out):
    """PyTorch's export of nn.GELU(approximate='tanh')."""
    return [helper.make_node("Mul", [x, x], ["t_p"]),
            helper.make_node("Mul", [x, "t_p"], ["t_q"]),
            helper.make_node("Mul", ["c044", "t_q"], ["t_r"]),
            helper.make_node("Add", [x, "t_r"], ["t_s"]),
            helper.make_node("Mul", ["c079", "t_s"], ["t_t"]),
            helper.make_node("Tanh", ["t_t"], ["t_u"]),
            helper.make_node("Add", ["one", "t_u"], ["t_w"]),
            helper.make_node("Mul", [x, "t_w"], ["t_z"]),
            helper.make_node("Mul", ["half", "t_z"], [out])]


def _model(act, residual, *, k=16, n=24, bias_first=False, constants=None):
    consts = {"w": RNG.standard_normal((k, n)) * 0.3, "b": RNG.standard_normal(n) * 0.1,
              "sqrt2": math.sqrt(2.0), "one": 1.0, "half": 0.5, "c044": 0.044715,
              "c079": math.sqrt(2.0 / math.pi)}
    consts.update(constants or {})
    nodes = [helper.make_node("MatMul", ["x", "w"], ["m"], name="fc"),
             helper.make_node("Add", ["b", "m"] if bias_first else ["m", "b"], ["v"])]
    last = "v"
    if act == "relu":
        nodes.append(helper.make_node("Relu", ["v"], ["a"]))
        last = "a"
    elif act == "gelu":
        nodes += _gelu_erf_nodes("v", "a")
        last = "a"
    elif act == "gelu_tanh":
        nodes += _gelu_tanh_nodes("v", "a")
        last = "a"
    if residual:
        nodes.append(helper.make_node("Add", ["r", last], ["y"]))
    else:
        nodes.append(helper.make_node("Identity", [last], ["y"]))
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["b", "s", k])]
    if residual:
        inputs.append(helper.make_tensor_value_info("r", TensorProto.FLOAT, ["b", "s", n]))
    g = helper.make_graph(nodes, "mm", inputs,
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT,
                                                         ["b", "s", n])],
                          [_const(k_, v) for k_, v in consts.items()])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def _compare(model, feeds, expect_fused=True, expect_activation=None):
    g = load(model).graph
    plain = Plan(g).run(feeds)
    opt = passes.optimize(g)
    fused = [n for n in opt.nodes if n.op_type == "FusedMatMul" and n.domain == FUSED_DOMAIN]
    assert bool(fused) == expect_fused, [n.op_type for n in opt.nodes]
    if expect_activation is not None:
        assert fused[0].attrs["activation"] == expect_activation
    got = Plan(opt).run(feeds)
    # a LayerNorm folded in (no activation) computes the unfused graph's adds in the same
    # order with the same kernel: bit for bit what a plan that does not fuse computes
    exact = any(len(n.inputs) > 4 and not n.attrs.get("activation") for n in fused)
    for a, b in zip(got, plain):
        assert a.shape == b.shape and a.dtype == b.dtype
        if exact:
            np.testing.assert_array_equal(a, b)
        else:
            np.testing.assert_allclose(a, b, rtol=2e-5, atol=2e-6)
    return opt


@pytest.mark.parametrize("act,name", [("none", ""), ("relu", "Relu"), ("gelu", "Gelu"),
                                      ("gelu_tanh", "GeluTanh")])
@pytest.mark.parametrize("residual", [False, True])
@pytest.mark.parametrize("batch,seq", [(1, 1), (1, 7), (3, 5)])
def test_fused_matches_unfused(act, name, residual, batch, seq):
    x = (RNG.standard_normal((batch, seq, 16)) * 3).astype(np.float32)
    feeds = [x] + ([RNG.standard_normal((batch, seq, 24)).astype(np.float32)]
                   if residual else [])
    opt = _compare(_model(act, residual), feeds, expect_activation=name)
    assert [n.op_type for n in opt.nodes if n.op_type != "Identity"] == ["FusedMatMul"]


def test_bias_first_and_two_d_input():
    m = _model("gelu", False, bias_first=True)
    _compare(m, [RNG.standard_normal((2, 3, 16)).astype(np.float32)], expect_activation="Gelu")


def test_a_chain_that_is_not_gelu_is_left_alone():
    """The same chain with a different constant (0.0447 instead of 0.044715) or a scale that
    changes the function is not a GELU: MatMul + bias is fused, the chain stays."""
    for consts in ({"c044": 0.0447}, {"half": 0.6}):
        m = _model("gelu_tanh", False, constants=consts)
        opt = _compare(m, [RNG.standard_normal((2, 3, 16)).astype(np.float32) * 3],
                       expect_activation="")
        assert any(n.op_type == "Tanh" for n in opt.nodes)


def test_not_fused_when_an_intermediate_is_read_elsewhere():
    m = _model("relu", False)
    m.graph.output.append(helper.make_tensor_value_info("v", TensorProto.FLOAT, None))
    m.graph.output[-1].type.tensor_type.shape.dim.add().dim_param = "b"
    opt = _compare(m, [RNG.standard_normal((2, 3, 16)).astype(np.float32)],
                   expect_activation="")   # MatMul + bias (v is their output), not the Relu
    assert [n.op_type for n in opt.nodes][:2] == ["FusedMatMul", "Relu"]


def test_weight_not_constant_is_not_fused():
    g = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["m"]), helper.make_node("Add", ["m", "b"], ["y"])],
        "mm", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4]),
               helper.make_tensor_value_info("w", TensorProto.FLOAT, [4, 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])], [_const("b", [1, 2, 3])])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    _compare(m, [np.ones((2, 4), np.float32), np.ones((4, 3), np.float32)], expect_fused=False)


@pytest.mark.parametrize("act", ["", "Relu", "Gelu", "GeluTanh"])
def test_kernel_against_numpy(act):
    a = RNG.standard_normal((2, 5, 7)).astype(np.float32)
    w = RNG.standard_normal((7, 3)).astype(np.float32)
    b = RNG.standard_normal(3).astype(np.float32)
    z = RNG.standard_normal((2, 5, 3)).astype(np.float32)
    y = (a.astype(np.float64) @ w + b)
    if act == "Relu":
        y = np.maximum(y, 0)
    elif act == "Gelu":
        from scipy.special import erf
        y = 0.5 * y * (1 + erf(y / math.sqrt(2)))
    elif act == "GeluTanh":
        y = 0.5 * y * (1 + np.tanh(math.sqrt(2 / math.pi) * (y + 0.044715 * y ** 3)))
    got = fused_matmul_epilogue(a, w, b, z, activation=act)
    np.testing.assert_allclose(got, y + z, rtol=1e-5, atol=1e-5)
    # a residual that broadcasts the other way (Add broadcasts both operands)
    zb = RNG.standard_normal((4, 1, 1, 3)).astype(np.float32)
    got = fused_matmul_epilogue(a, w, b, zb, activation=act)
    assert got.shape == (4, 2, 5, 3)
    np.testing.assert_allclose(got, (y + zb).astype(np.float32), rtol=1e-5, atol=1e-5)


def test_kernel_float16_and_bad_activation():
    a = RNG.standard_normal((3, 4)).astype(np.float16)
    w = RNG.standard_normal((4, 2)).astype(np.float16)
    b = RNG.standard_normal(2).astype(np.float16)
    y = fused_matmul_epilogue(a, w, b, activation="Gelu")
    assert y.dtype == np.float16
    ref = a.astype(np.float32) @ w.astype(np.float32) + b.astype(np.float32)
    from scipy.special import erf
    ref = 0.5 * ref * (1 + erf(ref / math.sqrt(2)))
    np.testing.assert_allclose(y.astype(np.float32), ref, rtol=1e-2, atol=1e-2)
    with pytest.raises(InputError, match="unknown activation"):
        fused_matmul_epilogue(a, w, b, activation="Swish")


def _with_layer_norm(act, residual, *, beta=True, axis=-1, outputs=1, scale_const=True):
    """``_model`` followed by LayerNormalization(axis) of its result (Scale, B constants;
    ``scale_const`` False: Scale is a graph input)."""
    m = _model(act, residual)
    g = m.graph
    for n in g.node:
        n.output[:] = ["pre" if o == "y" else o for o in n.output]
    ins = ["pre", "gamma"] + (["beta"] if beta else [])
    outs = ["y", "mean", "inv"][:outputs]
    g.node.append(helper.make_node("LayerNormalization", ins, outs, axis=axis, epsilon=1e-3))
    if scale_const:
        g.initializer.append(_const("gamma", RNG.standard_normal(24) + 1))
    else:
        g.input.append(helper.make_tensor_value_info("gamma", TensorProto.FLOAT, [24]))
    g.initializer.append(_const("beta", RNG.standard_normal(24)))
    return m


@pytest.mark.parametrize("act,residual,beta", [("none", True, True), ("none", False, False),
                                               ("gelu", True, True)])
def test_layer_norm_epilogue(act, residual, beta):
    """MatMul + bias [+ GELU] [+ residual] + LayerNormalization(-1) is one FusedMatMul; with
    the compiled kernels (bias and residual in the LayerNorm's pass) and without them the
    result is the unfused graph's, rows of NaN and Inf included."""
    from workbench import compiled

    x = (RNG.standard_normal((2, 5, 16)) * 3).astype(np.float32)
    x[0, 1, 3], x[1, 4, 0] = np.nan, np.inf
    feeds = [x] + ([RNG.standard_normal((2, 5, 24)).astype(np.float32)] if residual else [])
    m = _with_layer_norm(act, residual, beta=beta)
    with np.errstate(all="ignore"):   # the NaN/Inf rows
        _check_layer_norm_epilogue(m, feeds, act, beta, compiled)


def _check_layer_norm_epilogue(m, feeds, act, beta, compiled):
    for ctx in (compiled.disabled, None):
        if ctx is None:
            opt = _compare(m, feeds, expect_activation="" if act == "none" else "Gelu")
        else:
            with ctx():
                opt = _compare(m, feeds, expect_activation="" if act == "none" else "Gelu")
        fused = [n for n in opt.nodes if n.op_type != "Identity"]
        assert [n.op_type for n in fused] == ["FusedMatMul"]
        assert fused[0].attrs["epsilon"] == pytest.approx(1e-3)
        assert fused[0].inputs[4] == "gamma" and fused[0].inputs[5] == ("beta" if beta else "")
    y = Plan(passes.optimize(load(m).graph)).run(feeds)[0]
    assert np.isnan(y[0, 1]).all() and np.isfinite(y[0, 0]).all()


@pytest.mark.parametrize("how", ["axis", "mean_output", "scale_input"])
def test_layer_norm_not_folded(how):
    """A LayerNormalization over another axis, one whose Mean is read, or one whose Scale is
    not a constant stays its own node."""
    m = _with_layer_norm("none", True, axis=1 if how == "axis" else -1,
                         outputs=2 if how == "mean_output" else 1,
                         scale_const=how != "scale_input")
    feeds = [RNG.standard_normal((2, 5, 16)).astype(np.float32),
             RNG.standard_normal((2, 5, 24)).astype(np.float32)]
    if how == "scale_input":
        feeds.append((RNG.standard_normal(24) + 1).astype(np.float32))
    opt = _compare(m, feeds, expect_activation="")
    assert "LayerNormalization" in [n.op_type for n in opt.nodes]


def _skip_layer_norm_model(outputs=1, skip_first=False):
    """MatMul(x, w) -> com.microsoft SkipLayerNormalization(., r, gamma, beta, bias), as
    onnxruntime's transformer optimizer writes a BERT layer's output projection."""
    ins = ["r", "m"] if skip_first else ["m", "r"]
    nodes = [helper.make_node("MatMul", ["x", "w"], ["m"], name="fc"),
             helper.make_node("SkipLayerNormalization", ins + ["gamma", "beta", "b"],
                              ["y", "mean", "inv", "sum"][:outputs], domain="com.microsoft",
                              epsilon=1e-5)]
    g = helper.make_graph(
        nodes, "sln",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["b", "s", 16]),
         helper.make_tensor_value_info("r", TensorProto.FLOAT, ["b", "s", 24])],
        [helper.make_tensor_value_info(v, TensorProto.FLOAT, ["b", "s", d])
         for v, d in [("y", 24), ("mean", 1), ("inv", 1), ("sum", 24)][:outputs]],
        [_const("w", RNG.standard_normal((16, 24)) * 0.3), _const("b", RNG.standard_normal(24)),
         _const("gamma", RNG.standard_normal(24) + 1), _const("beta", RNG.standard_normal(24))])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17),
                                               helper.make_opsetid("com.microsoft", 1)])


@pytest.mark.parametrize("skip_first", [False, True])
def test_skip_layer_norm_epilogue(skip_first):
    """MatMul -> SkipLayerNormalization (bias, skip) is one FusedMatMul, compiled or not."""
    from workbench import compiled

    feeds = [(RNG.standard_normal((2, 5, 16)) * 3).astype(np.float32),
             RNG.standard_normal((2, 5, 24)).astype(np.float32)]
    m = _skip_layer_norm_model(skip_first=skip_first)
    for off in (True, False):
        with compiled.disabled() if off else np.errstate():
            opt = _compare(m, feeds, expect_activation="")
        assert [n.op_type for n in opt.nodes] == ["FusedMatMul"]
        assert opt.nodes[0].inputs[2:] == ["b", "r", "gamma", "beta"]
        assert opt.nodes[0].attrs["epsilon"] == pytest.approx(1e-5)
    # its sum output read: not folded
    opt = _compare(_skip_layer_norm_model(outputs=4), feeds, expect_fused=False)
    assert "SkipLayerNormalization" in [n.op_type for n in opt.nodes]


@pytest.mark.parametrize("dtype", [np.float16, np.float64])
def test_layer_norm_epilogue_other_dtypes(dtype):
    """float16 and float64 products take the numpy epilogue, then the LayerNormalization op:
    the same as the two nodes run one after the other."""
    from workbench.ops.norm import layer_norm

    a, w = RNG.standard_normal((2, 3, 8)).astype(dtype), RNG.standard_normal((8, 6)).astype(dtype)
    b, z = RNG.standard_normal(6).astype(dtype), RNG.standard_normal((2, 3, 6)).astype(dtype)
    g, be = (RNG.standard_normal(6) + 1).astype(dtype), RNG.standard_normal(6).astype(dtype)
    got = fused_matmul_epilogue(a, w, b, z, g, be, epsilon=1e-3)
    ref = layer_norm(fused_matmul_epilogue(a, w, b, z), g, be, epsilon=1e-3)
    assert got.dtype == dtype and got.shape == (2, 3, 6)
    np.testing.assert_array_equal(got, ref)
