"""fuse_scalar_chains (workbench/graph/passes.py) and the ScalarChain kernel it creates
(workbench/ops/chain.py): every fused graph against the same graph run unoptimised, bit for
bit, and the chains the pass must leave alone."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from workbench.errors import InputError, ShapeError
from workbench.graph import passes
from workbench.graph.load import load
from workbench.ops.chain import scalar_chain
from workbench.runtime import Plan

F, I64 = TensorProto.FLOAT, TensorProto.INT64


def _mask_model(opset=17, extra_reader=False, mid_output=False, const_shape=()):
    """attention_mask (b, s) int64 -> Unsqueeze(1) -> Unsqueeze(2) -> Cast(float) ->
    Sub(1, .) -> Mul(., -10000) -> Add(scores, .): the BERT export's mask bias."""
    inits = [numpy_helper.from_array(np.ones(const_shape, np.float32), "one"),
             numpy_helper.from_array(np.full(const_shape, -10000.0, np.float32), "big")]
    if opset >= 13:
        inits += [numpy_helper.from_array(np.array([1], np.int64), "ax1"),
                  numpy_helper.from_array(np.array([2], np.int64), "ax2")]
        unsq = [helper.make_node("Unsqueeze", ["m", "ax1"], ["u1"]),
                helper.make_node("Unsqueeze", ["u1", "ax2"], ["u2"])]
    else:
        unsq = [helper.make_node("Unsqueeze", ["m"], ["u1"], axes=[1]),
                helper.make_node("Unsqueeze", ["u1"], ["u2"], axes=[2])]
    nodes = unsq + [helper.make_node("Cast", ["u2"], ["c"], to=F),
                    helper.make_node("Sub", ["one", "c"], ["d"]),
                    helper.make_node("Mul", ["d", "big"], ["bias"]),
                    helper.make_node("Add", ["s", "bias"], ["y"])]
    outs = [helper.make_tensor_value_info("y", F, ["b", 2, "t", "t"])]
    if extra_reader:   # a second reader of the Cast's output
        nodes.append(helper.make_node("Neg", ["c"], ["z"]))
        outs.append(helper.make_tensor_value_info("z", F, ["b", 1, 1, "t"]))
    if mid_output:     # an intermediate value that is also a graph output
        outs.append(helper.make_tensor_value_info("d", F, ["b", 1, 1, "t"]))
    g = helper.make_graph(
        nodes, "mask",
        [helper.make_tensor_value_info("m", I64, ["b", "t"]),
         helper.make_tensor_value_info("s", F, ["b", 2, "t", "t"])], outs, inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])


def _run_both(model, feeds, variables=frozenset()):
    g = load(model).graph
    plain = Plan(g).run(feeds)
    opt = passes.optimize(g, variables=variables)
    got = Plan(opt).run(feeds)
    assert len(got) == len(plain)
    for a, b in zip(got, plain):
        assert a.dtype == b.dtype and a.shape == b.shape
        assert a.tobytes() == b.tobytes()   # bit for bit (NaN payloads and -0.0 included)
    return [n.op_type for n in opt.nodes]


def _mask_feeds(b=2, t=5):
    rng = np.random.default_rng(b * 100 + t)
    m = np.ones((b, t), np.int64)
    m[-1, t // 2:] = 0
    return [m, rng.standard_normal((b, 2, t, t)).astype(np.float32)]


@pytest.mark.parametrize("opset", [11, 17])
def test_mask_chain_fused_bit_for_bit(opset):
    model = _mask_model(opset)
    ops = _run_both(model, _mask_feeds())
    assert ops.count("ScalarChain") == 1
    assert not {"Unsqueeze", "Cast", "Sub", "Mul"} & set(ops), ops
    # the same plan on another batch and length (the remembered Unsqueeze shapes per input)
    g = passes.optimize(load(model).graph)
    plan, ref = Plan(g), Plan(load(model).graph)
    for b, t in ((1, 7), (3, 4), (1, 7)):
        feeds = _mask_feeds(b, t)
        assert np.array_equal(plan.run(feeds)[0], ref.run(feeds)[0])


@pytest.mark.parametrize("how", ["extra_reader", "mid_output"])
def test_chain_stops_at_a_shared_value(how):
    ops = _run_both(_mask_model(**{how: True}), _mask_feeds())
    # the Cast's output (or Sub's) is read elsewhere: the chain is cut there, not fused over
    if how == "extra_reader":
        # [Unsqueeze, Unsqueeze, Cast] and [Sub, Mul]
        assert ops.count("ScalarChain") == 2 and "Cast" not in ops
    else:
        assert "Sub" not in ops and "Mul" in ops


def test_constants_that_are_variables_or_not_scalars_are_left_alone():
    model = _mask_model()
    ops = _run_both(model, _mask_feeds(), variables={"one", "big"})
    assert "Sub" in ops and "Mul" in ops    # a trainable parameter is never baked in
    ops = _run_both(_mask_model(const_shape=(1, 1)), _mask_feeds())
    assert "ScalarChain" in ops             # one element of rank 2: numpy's broadcasting
    g = load(_mask_model()).graph
    g.initializers["big"] = np.full((5,), -10000.0, np.float32)   # not one element
    opt = passes.optimize(g)
    assert "Mul" in [n.op_type for n in opt.nodes]


def test_integer_and_float64_chains_keep_each_kernels_semantics():
    """Integer Div truncates toward zero (ONNX), not numpy's floor; float64 stays float64;
    a constant on the left of Div; NaN and infinities pass through."""
    inits = [numpy_helper.from_array(np.array(3, np.int64), "three"),
             numpy_helper.from_array(np.array(-2, np.int64), "m2"),
             numpy_helper.from_array(np.array(0.5, np.float64), "half")]
    nodes = [helper.make_node("Div", ["x", "three"], ["a"]),
             helper.make_node("Mul", ["m2", "a"], ["b"]),
             helper.make_node("Cast", ["b"], ["c"], to=TensorProto.DOUBLE),
             helper.make_node("Div", ["half", "c"], ["d"]),
             helper.make_node("Add", ["d", "half"], ["y"]),
             helper.make_node("Cast", ["f"], ["g"], to=TensorProto.DOUBLE),
             helper.make_node("Div", ["g", "half"], ["h"])]
    g = helper.make_graph(
        nodes, "ints",
        [helper.make_tensor_value_info("x", I64, ["n"]),
         helper.make_tensor_value_info("f", F, ["n"])],
        [helper.make_tensor_value_info("y", TensorProto.DOUBLE, ["n"]),
         helper.make_tensor_value_info("h", TensorProto.DOUBLE, ["n"])], inits)
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    x = np.array([-7, -6, -1, 0, 1, 5, 7, 9], np.int64)
    f = np.array([np.nan, np.inf, -np.inf, 0.0, -0.0, 1e-30, 3.5, -2.0], np.float32)
    with np.errstate(divide="ignore"):
        ops = _run_both(model, [x, f])
    assert ops == ["ScalarChain", "ScalarChain"], ops


def test_kernel_errors_name_the_fused_op():
    with pytest.raises(InputError, match="ScalarChain: 2 ops need 2 params"):
        scalar_chain(np.ones(3, np.float32), None, ops=["Cast", "Neg"], swap=[0, 0],
                     cast_to=[1, 0])
    with pytest.raises(InputError, match="unknown op 'Neg'"):
        scalar_chain(np.ones(3, np.float32), None, None, ops=["Cast", "Neg"], swap=[0, 0],
                     cast_to=[1, 0])
    with pytest.raises(ShapeError, match="Unsqueeze"):
        scalar_chain(np.ones(3, np.float32), np.array([5]), np.array(1.0, np.float32),
                     ops=["Unsqueeze", "Mul"], swap=[0, 0], cast_to=[0, 0])


def test_replayed_program_matches_every_run():
    """A node's program (remembered per input type, shape and dtype) replays the same bits,
    and another input dtype or shape builds a new one: 0-d, NaN/inf, -0.0, Div by zero."""
    inits = [numpy_helper.from_array(np.array(-0.0, np.float32), "nz"),
             numpy_helper.from_array(np.array(0.0, np.float32), "zero"),
             numpy_helper.from_array(np.array(3.0, np.float32), "three")]
    nodes = [helper.make_node("Mul", ["x", "three"], ["a"]),
             helper.make_node("Div", ["a", "zero"], ["b"]),
             helper.make_node("Add", ["nz", "b"], ["c"]),
             helper.make_node("Div", ["three", "x"], ["d"]),
             helper.make_node("Sub", ["d", "nz"], ["y"])]
    g = helper.make_graph(nodes, "f", [helper.make_tensor_value_info("x", F, None)],
                          [helper.make_tensor_value_info("c", F, None),
                           helper.make_tensor_value_info("y", F, None)], inits)
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    graph = load(model, check=False).graph
    plain, fused = Plan(graph), Plan(passes.optimize(graph))
    assert [n.op_type for n in fused.graph.nodes] == ["ScalarChain", "ScalarChain"]
    feeds = [np.array([np.nan, np.inf, -np.inf, 0.0, -0.0, 1.5, -2.0], np.float32),
             np.array(2.5, np.float32), np.zeros((2, 0, 3), np.float32),
             np.array([[1.0, -0.0]], np.float32)]
    with np.errstate(all="ignore"):
        for x in feeds + feeds[::-1]:
            for a, b in zip(fused.run([x]), plain.run([x])):
                assert a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()
