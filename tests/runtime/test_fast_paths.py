"""The plain CPU run's fast paths (workbench/runtime/run.py ``bind_steps``/``run_bound``, the
feed check of ``Plan._feeds_to_slots``, ``WorkbenchRep.run``'s host path, the BLAS thread
switch of ``ops/parallel.py``), each against the general path it shortcuts."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import workbench.backend as backend
from workbench.errors import InputError, ShapeError
from workbench.graph.load import load
from workbench.runtime import Plan, run

F = TensorProto.FLOAT


def _model(nodes, inputs, outputs, inits=(), opset=17):
    g = helper.make_graph(nodes, "g", inputs, outputs, list(inits))
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])


def _mixed_model():
    """Steps of every shape the pre-bound loop tells apart: one input, two, three (one
    omitted), none (Constant), several outputs (Split), an omitted first output (TopK's
    values; onnx.checker refuses an empty single output, the engine runs it), a subgraph
    (If), values freed midway."""
    then_g = helper.make_graph([helper.make_node("Neg", ["a"], ["t"])], "then", [],
                               [helper.make_tensor_value_info("t", F, [2, 4])])
    else_g = helper.make_graph([helper.make_node("Abs", ["a"], ["e"])], "else", [],
                               [helper.make_tensor_value_info("e", F, [2, 4])])
    nodes = [
        helper.make_node("Relu", ["x"], ["a"], name="one_in"),
        helper.make_node("Add", ["a", "x"], ["b"], name="two_in"),
        helper.make_node("Clip", ["b", "", "hi"], ["c"], name="three_in_one_omitted"),
        helper.make_node("Constant", [], ["k"], name="no_in",
                         value=numpy_helper.from_array(np.float32(0.5).reshape(()))),
        helper.make_node("Mul", ["c", "k"], ["d"], name="mul"),
        helper.make_node("Split", ["d"], ["s0", "s1"], name="two_out", axis=1,
                         num_outputs=2),
        helper.make_node("TopK", ["s0", "kk"], ["", "idx"], name="first_out_omitted", axis=1),
        helper.make_node("ReduceSum", ["x"], ["sx"], name="sum", keepdims=0),
        helper.make_node("Greater", ["sx", "zero"], ["cond"], name="cond"),
        helper.make_node("If", ["cond"], ["f"], name="if", then_branch=then_g,
                         else_branch=else_g),
        helper.make_node("Concat", ["s1", "f"], ["y"], name="concat", axis=1),
    ]
    inits = [numpy_helper.from_array(np.float32(2.0).reshape(()), "hi"),
             numpy_helper.from_array(np.asarray([1], np.int64), "kk"),
             numpy_helper.from_array(np.float32(0.0).reshape(()), "zero")]
    return _model(nodes, [helper.make_tensor_value_info("x", F, [2, 4])],
                  [helper.make_tensor_value_info("y", F, [2, 6]),
                   helper.make_tensor_value_info("idx", TensorProto.INT64, [2, 1])],
                  inits, opset=18)


def _general_loop(plan, inputs):
    env = plan._env(inputs, None, None)
    run.loop(plan.steps, env, None, run.bind_arrays)
    return plan._outputs(env)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_the_pre_bound_loop_matches_the_general_loop(seed):
    plan = Plan(load(_mixed_model(), check=False).graph)
    x = np.random.default_rng(seed).standard_normal((2, 4)).astype(np.float32)
    x *= -1 if seed == 1 else 1      # both branches of the If
    got = plan.run([x])
    want = _general_loop(plan, [x])
    hooked = plan.run([x], hook=lambda node, outs: None)    # the general loop, through Plan
    assert len(got) == len(want) == 2
    for g, w, h in zip(got, want, hooked):
        assert g.dtype == w.dtype and g.shape == w.shape
        np.testing.assert_array_equal(g, w)
        np.testing.assert_array_equal(h, w)


def test_bind_steps_decides_arguments_and_outputs_once():
    plan = Plan(load(_mixed_model(), check=False).graph)
    prog = {st.node.name: p for st, p in zip(plan.steps, run.bind_steps(plan.steps))}
    assert prog["one_in"][0] == run._ONE and prog["two_in"][0] == run._TWO
    assert prog["three_in_one_omitted"][0] == run._ANY
    assert prog["three_in_one_omitted"][4][1] == -1          # the omitted input reads None
    assert prog["no_in"][0] == run._ANY and prog["no_in"][2] == -1
    assert prog["if"][0] == run._GENERAL
    assert prog["two_out"][5] == -2 and prog["first_out_omitted"][5] == -2
    assert prog["mul"][5] == plan.slots["d"]


def test_the_fast_schedule_runs_pre_bound():
    """A plan with a shape segment runs its fast schedule through the same lean loop."""
    nodes = [helper.make_node("Shape", ["x"], ["s"]),
             helper.make_node("Gather", ["s", "i0"], ["n"], axis=0),
             helper.make_node("Unsqueeze", ["n", "ax"], ["t"]),
             helper.make_node("Concat", ["t", "m1"], ["shape"], axis=0),
             helper.make_node("Reshape", ["x", "shape"], ["r"]),
             helper.make_node("Relu", ["r"], ["y"])]
    inits = [numpy_helper.from_array(np.asarray(0, np.int64), "i0"),
             numpy_helper.from_array(np.asarray([0], np.int64), "ax"),
             numpy_helper.from_array(np.asarray([-1], np.int64), "m1")]
    m = _model(nodes, [helper.make_tensor_value_info("x", F, ["n", 3, 2])],
               [helper.make_tensor_value_info("y", F, ["n", 6])], inits)
    plan = Plan(load(m).graph)
    assert plan.fast_schedule is not None and plan._bound_fast is not None
    for n in (1, 4, 4, 2):
        x = np.random.default_rng(n).standard_normal((n, 3, 2)).astype(np.float32)
        (y,) = plan.run([x])
        np.testing.assert_array_equal(y, np.maximum(x.reshape(n, -1), 0))
        np.testing.assert_array_equal(y, _general_loop(plan, [x])[0])


# --------------------------------------------------------------------------- feeds
def _two_inputs():
    nodes = [helper.make_node("Add", ["a", "b"], ["y"])]
    return _model(nodes, [helper.make_tensor_value_info("a", F, ["n", 3]),
                          helper.make_tensor_value_info("b", F, [1, 3])],
                  [helper.make_tensor_value_info("y", F, ["n", 3])])


def test_matching_feeds_take_the_short_check_with_the_same_results():
    plan = Plan(load(_two_inputs()).graph)
    a = np.arange(6, dtype=np.float32).reshape(2, 3)
    b = np.ones((1, 3), np.float32)
    assert plan._feeds_to_slots([a, b])[0] is a
    want = a + b
    for feeds in ([a, b], (a, b), {"a": a, "b": b}, {"b": b, "a": a}):
        np.testing.assert_array_equal(plan.run(feeds)[0], want)


@pytest.mark.parametrize("feeds, err, match", [
    (lambda a, b: [a.astype(np.float64), b], InputError, "expects dtype"),
    (lambda a, b: [a, b.reshape(3, 1)], ShapeError, "dimension 0 differs"),
    (lambda a, b: [a.reshape(-1), b], ShapeError, "expects rank 2"),
    (lambda a, b: [a], InputError, "takes 2 input"),
    (lambda a, b: {"a": a, "c": b}, InputError, "unknown input name"),
    (lambda a, b: {"a": a}, InputError, "missing input"),
    (lambda a, b: [a.tolist(), b], InputError, "must be an array"),
])
def test_feeds_that_do_not_match_get_the_full_check(feeds, err, match):
    plan = Plan(load(_two_inputs()).graph)
    a = np.zeros((2, 3), np.float32)
    b = np.zeros((1, 3), np.float32)
    with pytest.raises(err, match=match):
        plan.run(feeds(a, b))


def test_remembered_feed_shapes_still_reject_what_does_not_match():
    """The shapes a plan remembers as matching (per input) let nothing else through: after
    good runs, another dtype, shape or rank still gets the full check and its error."""
    plan = Plan(load(_two_inputs()).graph)
    b = np.ones((1, 3), np.float32)
    for n in (2, 5, 2):
        a = np.full((n, 3), n, np.float32)
        np.testing.assert_array_equal(plan.run([a, b])[0], a + b)
    assert plan._feed_shapes[0] == {(2, 3), (5, 3)} and plan._feed_shapes[1] == {(1, 3)}
    a = np.zeros((2, 3), np.float32)
    with pytest.raises(InputError, match="expects dtype"):
        plan.run([a.astype(np.float64), b])
    with pytest.raises(ShapeError, match="dimension 0 differs"):
        plan.run([a, b.reshape(3, 1)])
    with pytest.raises(ShapeError, match="dimension 1 differs|expects"):
        plan.run([np.zeros((2, 4), np.float32), b])
    with pytest.raises(ShapeError, match="expects rank 2"):
        plan.run([a.reshape(-1), b])


def test_backend_host_path_matches_the_general_path():
    rep = backend.prepare(_two_inputs())
    a = np.arange(6, dtype=np.float32).reshape(2, 3)
    b = np.full((1, 3), 2, np.float32)
    want = a + b
    for feeds in ([a, b], (a, b), {"a": a, "b": b}):
        out = rep.run(feeds)
        np.testing.assert_array_equal(out[0], want)
        np.testing.assert_array_equal(out["y"], want)
    with pytest.raises(InputError, match="expects dtype"):
        rep.run([a.astype(np.float64), b])


def test_backend_single_array_and_map_inputs():
    rep = backend.prepare(_model([helper.make_node("Relu", ["x"], ["y"])],
                                 [helper.make_tensor_value_info("x", F, [2])],
                                 [helper.make_tensor_value_info("y", F, [2])]))
    x = np.asarray([-1, 2], np.float32)
    np.testing.assert_array_equal(rep.run(x)[0], [0, 2])
    np.testing.assert_array_equal(rep.run({"x": x})[0], [0, 2])


# --------------------------------------------------------------------------- BLAS threads
def test_one_blas_thread_switches_and_restores_through_the_c_functions():
    from workbench.ops import parallel

    ctls = parallel.blas_controller()
    if not ctls:
        pytest.skip("threadpoolctl is not available")
    ctx = parallel.one_blas_thread()
    assert parallel.one_blas_thread() is ctx            # made once
    for c, (get, put) in zip(ctls, ctx._acc):
        before = c.get_num_threads()
        try:
            c.set_num_threads(2)
            two = c.get_num_threads()                   # 2 unless the library caps it
            assert get() == two                         # the accessor reads what it set
            with ctx:
                assert c.get_num_threads() == 1 and get() == 1
                with parallel.one_blas_thread():       # nested: still one, restored once
                    assert get() == 1
                assert get() == 1
            assert c.get_num_threads() == two
            put(1)
            assert c.get_num_threads() == 1
        finally:
            c.set_num_threads(before)


def test_blas_stays_single_threaded_during_a_run_and_is_restored():
    from workbench.ops import parallel, registry

    ctls = parallel.blas_controller()
    if not ctls:
        pytest.skip("threadpoolctl is not available")
    seen = []

    def probe(x):
        seen.append([c.get_num_threads() for c in ctls])
        return x

    registry.register("Probe", probe, domain="test.fastpaths")
    try:
        g = helper.make_graph([helper.make_node("Probe", ["x"], ["y"], domain="test.fastpaths")],
                              "g", [helper.make_tensor_value_info("x", F, [1])],
                              [helper.make_tensor_value_info("y", F, None)])
        m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17),
                                                helper.make_opsetid("test.fastpaths", 1)])
        plan = Plan(load(m, check=False).graph)
        before = [c.get_num_threads() for c in ctls]
        try:
            for c in ctls:
                c.set_num_threads(2)
            set_to = [c.get_num_threads() for c in ctls]    # 2 unless a library caps it
            plan.run([np.ones(1, np.float32)])
            assert seen == [[1] * len(ctls)]
            assert [c.get_num_threads() for c in ctls] == set_to
        finally:
            for c, n in zip(ctls, before):
                c.set_num_threads(n)
    finally:
        registry.unregister("Probe", domain="test.fastpaths")
