"""Shape segments (workbench/runtime/segments.py): the fast schedule of plain CPU runs against the
plain schedule (a run with a hook takes the plain one), on dynamic shapes, data-dependent
shapes, errors and shape-derived graph outputs."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from workbench.errors import KernelError, WorkbenchError
from workbench.graph.load import load
from workbench.ops import registry
from workbench.runtime import Plan


def _plain(plan, inputs):
    return plan.run(inputs, hook=lambda node, outs: None)


def _attention_like():
    """x (batch, seq, 8) -> heads reshape via Shape/Gather/Unsqueeze/Concat, a causal mask
    from Range/LessOrEqual/Where, position rows gathered from a table by Range."""
    c = {name: numpy_helper.from_array(np.asarray(v, dtype=np.int64), name)
         for name, v in (("i0", 0), ("i1", 1), ("two", [2]), ("four", [4]), ("ax0", [0]),
                         ("ax1", [1]), ("one", 1), ("zero", 0))}
    table = numpy_helper.from_array(
        np.random.default_rng(0).standard_normal((64, 8)).astype(np.float32), "table")
    neg = numpy_helper.from_array(np.array(-1e4, np.float32), "neg")
    nodes = [
        helper.make_node("Shape", ["x"], ["s"]),
        helper.make_node("Gather", ["s", "i0"], ["b"], axis=0),
        helper.make_node("Gather", ["s", "i1"], ["t"], axis=0),
        helper.make_node("Unsqueeze", ["b", "ax0"], ["bu"]),
        helper.make_node("Unsqueeze", ["t", "ax0"], ["tu"]),
        helper.make_node("Concat", ["bu", "tu", "two", "four"], ["shape4"], axis=0),
        helper.make_node("Range", ["zero", "t", "one"], ["pos"]),
        helper.make_node("Gather", ["table", "pos"], ["pe"], axis=0),
        helper.make_node("Add", ["x", "pe"], ["xp"]),
        helper.make_node("Reshape", ["xp", "shape4"], ["heads"]),
        helper.make_node("Unsqueeze", ["pos", "ax0"], ["prow"]),
        helper.make_node("Unsqueeze", ["pos", "ax1"], ["pcol"]),
        helper.make_node("LessOrEqual", ["prow", "pcol"], ["causal"]),
        helper.make_node("Transpose", ["x"], ["xT"], perm=[0, 2, 1]),
        helper.make_node("MatMul", ["x", "xT"], ["scores"]),
        helper.make_node("Where", ["causal", "scores", "neg"], ["masked"]),
    ]
    g = helper.make_graph(
        nodes, "attn_like",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "seq", 8])],
        [helper.make_tensor_value_info("heads", TensorProto.FLOAT, ["batch", "seq", 2, 4]),
         helper.make_tensor_value_info("masked", TensorProto.FLOAT, ["batch", "seq", "seq"])],
        list(c.values()) + [table, neg])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def test_fast_schedule_matches_plain_over_changing_shapes():
    plan = Plan(load(_attention_like()).graph)
    assert plan.fast_schedule is not None
    segs = [f.segment for f in plan.fast_schedule if f.segment is not None]
    assert segs and sum(len(s.members) for s in segs) >= 10
    rng = np.random.default_rng(1)
    for shape in [(1, 5, 8), (3, 7, 8), (1, 5, 8), (2, 1, 8), (3, 7, 8), (1, 64, 8)]:
        x = rng.standard_normal(shape).astype(np.float32)
        fast = plan.run([x])
        plain = _plain(plan, [x])
        for a, b in zip(fast, plain):
            assert a.shape == b.shape and np.array_equal(a, b)
        b_, t = shape[:2]
        assert fast[0].shape == (b_, t, 2, 4)
        keep = np.tril(np.ones((t, t), bool))  # causal[i, j] = j <= i
        assert np.all(fast[1][:, ~keep] == np.float32(-1e4))
        scores = x @ x.transpose(0, 2, 1)
        np.testing.assert_allclose(fast[1][:, keep], scores[:, keep], rtol=1e-5, atol=1e-5)
    assert sum(s.hits for s in segs) > 0      # repeated shapes were remembered


def test_remembered_values_are_read_only_and_outputs_writable():
    plan = Plan(load(_attention_like()).graph)
    x = np.ones((2, 3, 8), np.float32)
    for _ in range(2):
        heads, masked = plan.run([x])
    heads += 1       # graph outputs belong to the caller
    masked[...] = 0
    again = plan.run([x])
    assert np.array_equal(again[0], _plain(plan, [x])[0])
    seg = next(f.segment for f in plan.fast_schedule if f.segment is not None and f.segment.memo)
    for out, _ in seg.memo.values():
        assert all(not v.flags.writeable for v in out)


def test_data_dependent_shape_follows_the_data():
    """Shape(NonZero(x)): the same input shape, different data, different results."""
    g = helper.make_graph(
        [helper.make_node("NonZero", ["x"], ["nz"]),
         helper.make_node("Shape", ["nz"], ["s"]),
         helper.make_node("ReduceProd", ["s"], ["n"], keepdims=1),
         helper.make_node("Cast", ["n"], ["nf"], to=TensorProto.FLOAT),
         helper.make_node("Mul", ["nf", "x"], ["y"])],
        "nonzero",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4])])
    plan = Plan(load(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])).graph)
    assert plan.fast_schedule is not None
    for x in ([1, 0, 0, 0], [1, 2, 0, 0], [1, 0, 0, 0], [1, 2, 3, 4]):
        x = np.asarray(x, np.float32)
        (y,) = plan.run([x])
        assert np.array_equal(y, np.count_nonzero(x) * x)


def test_errors_in_a_segment_name_the_node():
    m = _attention_like()
    plan = Plan(load(m).graph)
    x = np.ones((2, 3, 5), np.float32)   # 5 features: the (b, t, 2, 4) reshape cannot hold them
    with pytest.raises(WorkbenchError) as fast:
        plan.run([x])
    with pytest.raises(WorkbenchError) as plain:
        _plain(plan, [x])
    assert str(fast.value) == str(plain.value)


def test_shape_derived_graph_output_is_not_remembered():
    g = helper.make_graph(
        [helper.make_node("Shape", ["x"], ["s"]),
         helper.make_node("Concat", ["s", "s"], ["ss"], axis=0),
         helper.make_node("Reshape", ["x", "s"], ["y"])],
        "shape_out",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 3])],
        [helper.make_tensor_value_info("ss", TensorProto.INT64, [4]),
         helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 3])])
    plan = Plan(load(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])).graph)
    for n in (2, 5, 2):
        ss, y = plan.run([np.zeros((n, 3), np.float32)])
        assert list(ss) == [n, 3, n, 3] and ss.flags.writeable
        ss[0] = 99   # must not leak into the next run
        assert y.shape == (n, 3)


# --------------------------------------------------------------------------- failures and retries
DOM = "test.segments"


@pytest.fixture
def test_ops():
    """Kernels of a test domain: ``Boom`` (counts its calls; raises when told to) and
    ``CheckDim`` (x, idx, dim: raises unless dim == x.shape[idx])."""
    calls = {"boom": 0, "check": 0, "fail": True}

    def boom(x):
        calls["boom"] += 1
        if calls["fail"]:
            raise ValueError("boom")
        return x

    def check_dim(x, idx, dim):
        calls["check"] += 1
        if int(np.asarray(dim).reshape(-1)[0]) != x.shape[int(idx[0])]:
            raise ValueError(f"dim {dim} is not x.shape[{int(idx[0])}] = {x.shape}")
        return x

    registry.register("Boom", boom, domain=DOM)
    registry.register("CheckDim", check_dim, domain=DOM)
    yield calls
    registry.unregister("Boom", domain=DOM)
    registry.unregister("CheckDim", domain=DOM)


def _shape_then(last_nodes, extra_inits=(), outputs=("z",)):
    """x [n, 4] -> Reshape by a target computed from Shape(x) (a shape segment) -> the given
    nodes."""
    inits = [numpy_helper.from_array(np.asarray(v, dtype=np.int64), k)
             for k, v in (("i0", 0), ("ax0", [0]), ("four", [4]))] + list(extra_inits)
    nodes = [
        helper.make_node("Shape", ["x"], ["s"]),
        helper.make_node("Gather", ["s", "i0"], ["b"], axis=0),
        helper.make_node("Unsqueeze", ["b", "ax0"], ["bu"]),
        helper.make_node("Concat", ["bu", "four"], ["target"], axis=0),
        helper.make_node("Reshape", ["x", "target"], ["xr"]),
    ] + list(last_nodes)
    g = helper.make_graph(
        nodes, "shape_then",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 4])],
        [helper.make_tensor_value_info(o, TensorProto.FLOAT, None) for o in outputs], inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17),
                                            helper.make_opsetid(DOM, 1)])
    return load(m, check=False).graph


def test_a_failing_model_runs_once_and_names_the_node(test_ops):
    plan = Plan(_shape_then([helper.make_node("Boom", ["xr"], ["z"], domain=DOM,
                                              name="the_boom")]))
    assert plan.fast_schedule is not None
    x = np.ones((2, 4), np.float32)
    for run in (1, 2):      # the second run takes the remembered segment results
        with pytest.raises(KernelError, match=r"node 'the_boom' \(Boom, opset 1\) failed: "
                                              r"ValueError: boom; inputs: xr: float32\[2, 4\]"):
            plan.run([x])
        assert test_ops["boom"] == run
    assert sum(f.segment.hits for f in plan.fast_schedule if f.segment is not None) == 1
    test_ops["fail"] = False
    np.testing.assert_array_equal(plan.run([x])[0], x)


def test_an_unseeded_random_op_draws_once_in_a_failing_run(test_ops):
    nodes = [helper.make_node("RandomNormalLike", ["xr"], ["noise"]),   # no seed attribute
             helper.make_node("Add", ["xr", "noise"], ["y"]),
             helper.make_node("Boom", ["y"], ["z"], domain=DOM)]
    failing = Plan(_shape_then(nodes), seed=7)
    assert failing.fast_schedule is not None
    reference = Plan(_shape_then(nodes[:2], outputs=("y",)), seed=7)
    x = np.zeros((3, 4), np.float32)
    with pytest.raises(KernelError):
        failing.run([x])
    reference.run([x])                   # one draw of the same shape
    assert failing._rng.bit_generator.state == reference._rng.bit_generator.state


def test_a_stale_remembered_result_is_forgotten_and_the_run_made_again(test_ops):
    """A remembered segment result goes stale when an initializer it read is written in place
    (the key does not see it); the failure it causes is retried once, recomputed (a failure
    that the remembered results do not explain is not retried:
    test_a_failing_model_runs_once_and_names_the_node)."""
    idx = numpy_helper.from_array(np.array([0], np.int64), "idx")
    nodes = [helper.make_node("Gather", ["s", "idx"], ["dim"], axis=0),   # joins the segment
             helper.make_node("CheckDim", ["xr", "idx", "dim"], ["z"], domain=DOM)]
    graph = _shape_then(nodes, [idx])
    graph.initializers["idx"] = np.array([0], np.int64)    # a weight the user can write
    plan = Plan(graph)
    seg = next(f.segment for f in plan.fast_schedule
               if f.segment is not None and len(f.segment.members) >= 3)
    assert plan.slots["idx"] in seg.bound and plan.slots["idx"] not in seg.ext_in
    x = np.ones((2, 4), np.float32)
    plan.run([x])
    plan.run([x])                        # remembered
    assert test_ops["check"] == 2 and seg.hits == 1
    graph.initializers["idx"][0] = 1     # in place: the key does not see it
    np.testing.assert_array_equal(plan.run([x])[0], x)
    assert test_ops["check"] == 4        # failed on the stale dim, then ran again
    np.testing.assert_array_equal(plan.run([x])[0], x)
    assert test_ops["check"] == 5        # the fresh result is remembered now


def test_values_for_a_bound_initializer_take_the_plain_schedule(test_ops):
    """``execute(values=...)`` replacing an initializer a segment reads runs every step with
    the given value (the segments bind the plan's own initializers)."""
    idx = numpy_helper.from_array(np.array([0], np.int64), "idx")
    nodes = [helper.make_node("Gather", ["s", "idx"], ["dim"], axis=0),
             helper.make_node("CheckDim", ["xr", "idx", "dim"], ["z"], domain=DOM)]
    plan = Plan(_shape_then(nodes, [idx]))
    x = np.ones((2, 4), np.float32)
    plan.run([x])
    hits = sum(f.segment.hits for f in plan.fast_schedule if f.segment is not None)
    for k in (1, 0, 1):
        np.testing.assert_array_equal(
            plan.execute([x], values={"idx": np.array([k], np.int64)})[0], x)
    assert sum(f.segment.hits for f in plan.fast_schedule if f.segment is not None) == hits


# --------------------------------------------------------------------------- memo rules
def _model(nodes, inputs, outputs, inits=(), opsets=(("", 17),)):
    g = helper.make_graph(nodes, "g", inputs, outputs, list(inits))
    m = helper.make_model(g, opset_imports=[helper.make_opsetid(d, v) for d, v in opsets])
    return load(m, check=False).graph


def _i64(name, v):
    return numpy_helper.from_array(np.asarray(v, dtype=np.int64), name)


def _roots_graph():
    """Shape with start/end, and Size, as roots: x [a, b, 4] -> Reshape to [a*b, 4] by
    Shape(x, end=2) -> ReduceProd, and y = x * Size(x) (cast) + Shape(x, start=-1)."""
    return _model(
        [helper.make_node("Shape", ["x"], ["lead"], end=2),
         helper.make_node("ReduceProd", ["lead"], ["rows"], keepdims=1),
         helper.make_node("Shape", ["x"], ["last"], start=-1),
         helper.make_node("Concat", ["rows", "last"], ["target"], axis=0),
         helper.make_node("Reshape", ["x", "target"], ["flat"]),
         helper.make_node("Size", ["x"], ["n"]),
         helper.make_node("Cast", ["n"], ["nf"], to=TensorProto.FLOAT),
         helper.make_node("Cast", ["last"], ["lf"], to=TensorProto.FLOAT),
         helper.make_node("Add", ["nf", "lf"], ["k"]),
         helper.make_node("Mul", ["flat", "k"], ["y"])],
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["a", "b", 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])


def test_the_switch_turns_the_memo_off_and_the_bits_agree(monkeypatch):
    """Plans with and without the memo (``WORKBENCH_SHAPE_MEMO=0``, ``plan.shape_memo``)
    agree bit for bit while batch and sequence length change (b1 -> b3 -> b1)."""
    for graph in (load(_attention_like()).graph, _roots_graph()):
        on = Plan(graph)
        monkeypatch.setenv("WORKBENCH_SHAPE_MEMO", "0")
        off = Plan(graph)
        monkeypatch.delenv("WORKBENCH_SHAPE_MEMO")
        assert not off.shape_memo and off.fast_schedule is None
        assert on.shape_memo and on.fast_schedule is not None
        rng = np.random.default_rng(3)
        for shape in [(1, 5, 4), (3, 5, 4), (1, 5, 4), (1, 9, 4), (1, 5, 4), (3, 9, 4)]:
            if graph.inputs[0].shape[-1] == 8:
                shape = shape[:2] + (8,)
            x = rng.standard_normal(shape).astype(np.float32)
            for a, b in zip(on.run([x]), off.run([x])):
                assert a.dtype == b.dtype and a.shape == b.shape
                assert a.tobytes() == b.tobytes()
    on.shape_memo = False                # the option: every step every run from now on
    assert on.fast_schedule is None
    on.shape_memo = True
    assert on.fast_schedule is not None


def test_shape_start_end_and_size_roots_follow_each_dimension():
    plan = Plan(_roots_graph())
    seg = next(f.segment for f in plan.fast_schedule if f.segment is not None)
    assert {m.node.op_type for m in seg.members} >= {"Shape", "Size", "ReduceProd", "Concat"}
    for shape in [(2, 3, 4), (2, 5, 4), (6, 1, 4), (2, 3, 4)]:
        x = np.arange(np.prod(shape), dtype=np.float32).reshape(shape)
        (y,) = plan.run([x])
        assert np.array_equal(y, x.reshape(-1, 4) * np.float32(x.size + 4))


def test_a_random_op_fed_by_a_shape_is_not_remembered():
    plan = Plan(_model(
        [helper.make_node("Shape", ["x"], ["s"]),
         helper.make_node("ConstantOfShape", ["s"], ["z"]),
         helper.make_node("RandomUniformLike", ["z"], ["r"], dtype=TensorProto.FLOAT),
         helper.make_node("Add", ["x", "r"], ["y"])],
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 3])]), seed=0)
    fast = plan.fast_schedule
    assert fast is not None
    assert all(m.node.op_type != "RandomUniformLike"
               for f in fast if f.segment is not None for m in f.segment.members)
    x = np.zeros((4, 3), np.float32)
    draws = [plan.run([x])[0] for _ in range(3)]
    assert not np.array_equal(draws[0], draws[1]) and not np.array_equal(draws[1], draws[2])
    assert all(((0 <= d) & (d < 1)).all() for d in draws)


def test_a_graph_output_that_views_a_remembered_value_belongs_to_the_caller():
    plan = Plan(_model(
        [helper.make_node("Shape", ["x"], ["s"]),
         helper.make_node("Concat", ["s", "s"], ["ss"], axis=0),
         helper.make_node("Unsqueeze", ["ss", "ax"], ["u"]),
         helper.make_node("Identity", ["u"], ["o1"]),
         helper.make_node("Squeeze", ["u", "ax"], ["o2"])],
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 3])],
        [helper.make_tensor_value_info("o1", TensorProto.INT64, [1, 4]),
         helper.make_tensor_value_info("o2", TensorProto.INT64, [4])], [_i64("ax", [0])]))
    assert plan.fast_schedule is not None
    for n in (2, 2, 5, 2):
        o1, o2 = plan.run([np.zeros((n, 3), np.float32)])
        assert o1.tolist() == [[n, 3, n, 3]] and o2.tolist() == [n, 3, n, 3]
        o1[...] = -1     # the caller's arrays: writable, and the next run is not affected
        o2[...] = -1


def test_the_memo_is_a_bounded_lru_and_keeps_no_activation(monkeypatch):
    import gc
    import weakref

    from workbench.runtime import segments
    monkeypatch.setattr(segments, "MEMO_KEYS", 4)
    plan = Plan(load(_attention_like()).graph)
    seg = next(f.segment for f in plan.fast_schedule if f.segment is not None)
    first = np.ones((1, 2, 8), np.float32)
    ref = weakref.ref(first)
    plan.run([first])
    for t in range(3, 12):
        plan.run([np.ones((1, t, 8), np.float32)])
        plan.run([np.ones((1, 2, 8), np.float32)])    # the first shape stays in use
        assert len(seg.memo) <= 4
    assert any(k[0] == (1, 2, 8) for k in seg.memo)   # the most recently used survives
    assert not any(k[0] == (1, 3, 8) for k in seg.memo)  # the oldest went first
    del first
    gc.collect()
    assert ref() is None          # a remembered result keeps only a stand-in of its shape
    for _, kept in seg.memo.values():
        assert all(v.nbytes == 0 or 0 in v.strides or v.size <= 256
                   for v in kept if isinstance(v, np.ndarray))


def test_a_custom_op_on_shape_values_runs_every_time():
    calls = []

    def counted(s):
        calls.append(1)
        return s

    registry.register("Counted", counted, domain=DOM)
    try:
        plan = Plan(_model(
            [helper.make_node("Shape", ["x"], ["s"]),
             helper.make_node("Counted", ["s"], ["c"], domain=DOM),
             helper.make_node("Reshape", ["x", "c"], ["y"])],
            [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 3])],
            [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
            opsets=(("", 17), (DOM, 1))))
        x = np.ones((2, 3), np.float32)
        for _ in range(3):
            plan.run([x])
        assert len(calls) == 3
    finally:
        registry.unregister("Counted", domain=DOM)


def test_one_plan_run_from_several_threads():
    from concurrent.futures import ThreadPoolExecutor

    graph = load(_attention_like()).graph
    plan, off = Plan(graph), Plan(graph)
    off.shape_memo = False
    rng = np.random.default_rng(5)
    xs = [rng.standard_normal((1 + k % 3, 2 + k % 5, 8)).astype(np.float32)
          for k in range(48)]
    with ThreadPoolExecutor(4) as pool:
        got = list(pool.map(lambda x: plan.run([x]), xs))
    for x, outs in zip(xs, got):
        for a, b in zip(outs, off.run([x])):
            assert a.tobytes() == b.tobytes()


def test_segments_go_where_their_results_are_needed_and_merge():
    """The reshape targets of q, k (needed at the Reshapes) and a (whose last other reader is
    Neg: a later place would keep ``a`` alive for it) can all be computed between Neg and Abs:
    one segment there, one key for the three Shape roots."""
    w = numpy_helper.from_array(np.eye(4, dtype=np.float32), "w")
    chain = []
    for v in ("q", "k", "a"):
        chain += [helper.make_node("Shape", [v], [f"{v}s"]),
                  helper.make_node("Gather", [f"{v}s", "i0"], [f"{v}b"], axis=0),
                  helper.make_node("Unsqueeze", [f"{v}b", "ax0"], [f"{v}u"]),
                  helper.make_node("Concat", [f"{v}u", "m1"], [f"{v}t"], axis=0)]
    graph = _model(
        [helper.make_node("MatMul", ["x", "w"], ["q"]),
         helper.make_node("MatMul", ["x", "w"], ["k"]),
         helper.make_node("Relu", ["x"], ["a"]),
         helper.make_node("Neg", ["a"], ["b"]),
         helper.make_node("Abs", ["b"], ["c"]),
         helper.make_node("Reshape", ["q", "qt"], ["qr"]),
         helper.make_node("Reshape", ["k", "kt"], ["kr"]),
         helper.make_node("Add", ["qr", "kr"], ["s"]),
         helper.make_node("Reshape", ["c", "at"], ["cr"]),
         helper.make_node("Add", ["s", "cr"], ["y"])] + chain,
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [w, _i64("i0", 0), _i64("ax0", [0]), _i64("m1", [-1])])
    plan = Plan(graph)
    order = [f.segment.label if f.segment is not None else f.step.node.op_type + ":" +
             f.step.node.outputs[0] for f in plan.fast_schedule]
    segs = [f.segment for f in plan.fast_schedule if f.segment is not None]
    assert len(segs) == 1 and len(segs[0].members) == 12, "|".join(order)
    assert order.index("Neg:b") + 1 == order.index(segs[0].label) == order.index("Abs:c") - 1
    assert sorted(segs[0].ext_in) == sorted(plan.slots[v] for v in ("q", "k", "a"))
    assert all(segs[0].shape_keyed)
    off = Plan(graph)
    off.shape_memo = False
    for n in (2, 5, 2):
        x = np.arange(4 * n, dtype=np.float32).reshape(n, 4) - 3
        assert plan.run([x])[0].tobytes() == off.run([x])[0].tobytes()
