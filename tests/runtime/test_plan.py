"""The Plan (workbench/runtime/plan.py, run.py, errors.py): phases, lifetimes, hooks, the one
constructor, errors that name the node, determinism."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper

from tests.graph.models import mlp
from workbench.errors import KernelError, ResourceError, ShapeError
from workbench.graph.load import load
from workbench.ops import registry
from workbench.runtime import Plan, Schedule, Step, node_error
from workbench.runtime.plan import plan_graph


def _ref_mlp(m, x):
    from onnx import numpy_helper
    w = {t.name: numpy_helper.to_array(t) for t in m.graph.initializer}
    return np.maximum(x @ w["w1"] + w["b1"], 0) @ w["w2"]


def test_runs_and_is_deterministic():
    m = mlp()
    plan = Plan(load(m).graph)
    x = np.random.default_rng(0).standard_normal((5, 4)).astype(np.float32)
    (y1,) = plan.run([x])
    (y2,) = plan.run({"x": x})
    np.testing.assert_allclose(y1, _ref_mlp(m, x), rtol=1e-5)
    assert np.array_equal(y1, y2)


def test_values_are_freed_after_last_use():
    plan = Plan(load(mlp()).graph)
    freed = {plan.nodes[i].name: [n for n, s in plan.slots.items() if s in step.free]
             for i, step in enumerate(plan.steps)}
    assert "h" in freed["bias1"]
    assert "hb" in freed["relu1"]
    # graph outputs are never freed
    assert all("y" not in v for v in freed.values())
    seen = []

    def hook(node, outs):
        seen.append((node.name, [o.shape for o in outs]))

    x = np.ones((2, 4), np.float32)
    plan.run([x], hook=hook)
    assert [s[0] for s in seen] == ["fc1", "bias1", "relu1", "ident", "fc2"]
    assert seen[0][1] == [(2, 8)]


def test_the_phases_make_the_schedule_the_one_constructor_runs():
    g = load(mlp()).graph
    sched = plan_graph(g)
    assert isinstance(sched, Schedule) and sched.graph is g
    assert [n.name for n in sched.nodes] == ["fc1", "bias1", "relu1", "ident", "fc2"]
    assert sched.output_names == ["y"] and [v.name for v in sched.input_infos] == ["x"]
    assert sched.n_slots == len(sched.slots) and set(sched.constants) == {
        sched.slots[k] for k in ("w1", "b1", "w2")}
    x = np.random.default_rng(2).standard_normal((3, 4)).astype(np.float32)
    a, b = Plan(sched), Plan(g)
    assert a.output_names == b.output_names and a.slots == b.slots
    np.testing.assert_array_equal(a.run([x])[0], b.run({"x": x})[0])


def test_a_schedule_made_elsewhere_is_a_whole_plan():
    """Plan.of_steps (a recorded tape) goes through the same constructor: names, inputs and
    the run loop work as for a planned graph."""
    g = load(mlp()).graph
    planned = Plan(g)
    steps = [Step(st.fn, st.ins, st.outs, st.attrs, st.free, st.node, opset=st.opset)
             for st in planned.steps]
    consts = {planned.slots[k]: v for k, v in g.initializers.items()}
    plan = Plan.of_steps(steps, n_slots=len(planned.slots), inputs=[planned.slots["x"]],
                         outputs=[planned.slots["y"]], constants=consts)
    assert plan.output_names == ["output_0"] and [v.name for v in plan.input_infos] == ["input_0"]
    assert plan.graph is None and plan.steps == steps and not plan.check_inputs
    x = np.ones((2, 4), np.float32)
    want = planned.run([x])[0]
    np.testing.assert_array_equal(plan.execute([x])[0], want)
    np.testing.assert_array_equal(plan.run({"input_0": x})[0], want)
    named = Plan.of_steps(steps, n_slots=len(planned.slots), inputs=[planned.slots["x"]],
                          outputs=[planned.slots["y"]], constants=consts, input_names=["x"],
                          output_names=["y"])
    assert named.output_names == ["y"] and named.run({"x": x})[0].shape == (2, 3)


@pytest.fixture
def failing_op():
    calls = []

    def fails(x, *, kind="value"):
        calls.append(kind)
        if kind == "memory":
            raise MemoryError("cannot allocate 8 EiB")
        if kind == "shape":
            raise ShapeError("the kernel's own message")
        raise ValueError("deep inside numpy")

    registry.register("Fails", fails, domain="test.runtime")
    yield calls
    registry.unregister("Fails", domain="test.runtime")


def _failing_graph(kind):
    g = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["r"], name="relu"),
         helper.make_node("Fails", ["r"], ["y"], domain="test.runtime", name="bad", kind=kind)],
        "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17),
                                            helper.make_opsetid("test.runtime", 1)])
    return load(m, check=False).graph


@pytest.mark.parametrize("hook", [None, lambda node, outs: None])
def test_errors_name_the_node_once(failing_op, hook):
    x = np.ones((2, 3), np.float32)
    with pytest.raises(KernelError, match=r"^node 'bad' \(Fails, opset 1\) failed: ValueError: "
                                          r"deep inside numpy; inputs: r: float32\[2, 3\]$"):
        Plan(_failing_graph("value")).run([x], hook=hook)
    with pytest.raises(ResourceError, match=r"^node 'bad' \(Fails\): out of memory"):
        Plan(_failing_graph("memory")).run([x], hook=hook)
    with pytest.raises(ShapeError, match=r"^node 'bad' \(Fails\): the kernel's own message$"):
        Plan(_failing_graph("shape")).run([x], hook=hook)
    assert failing_op == ["value", "memory", "shape"]       # each model ran once


def test_node_error_is_the_one_wrapper():
    e = ShapeError("bad shape")
    assert node_error(e, node_name="n", op_type="Op") is e
    assert str(e) == "node 'n' (Op): bad shape"
    assert node_error(e, node_name="other", op_type="Op") is e    # located once
    assert str(e) == "node 'n' (Op): bad shape"
    k = node_error(TypeError("oops"), node_name="n", op_type="Op", opset=13,
                   args=[np.zeros((1, 2), np.int64), None, [1]], input_names=["a", "", "c"])
    assert isinstance(k, KernelError) and k.node_name == "n" and k.op_type == "Op"
    assert str(k) == ("node 'n' (Op, opset 13) failed: TypeError: oops; inputs: "
                      "a: int64[1, 2], <omitted>=None, c: list")
    r = node_error(MemoryError(), node_name=None, op_type="Op")
    assert isinstance(r, ResourceError) and str(r).startswith("Op: out of memory ()")


def test_a_failed_run_frees_its_values_without_the_garbage_collector(failing_op):
    """The error that leaves the run loop holds no reference cycle: once it is dropped, the
    run's intermediate values are freed at once (a worker under a memory limit that runs many
    failing models would otherwise run out of address space)."""
    import gc
    import weakref

    refs = []

    def keep(x):
        y = np.ones((256, 256), np.float32) + x.sum()
        refs.append(weakref.ref(y))
        return y

    registry.register("KeepRef", keep, domain="test.runtime")
    g = helper.make_graph(
        [helper.make_node("KeepRef", ["x"], ["k"], domain="test.runtime", name="keep"),
         helper.make_node("Fails", ["k"], ["y"], domain="test.runtime", name="bad")],
        "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17),
                                            helper.make_opsetid("test.runtime", 1)])
    plan = Plan(load(m, check=False).graph)
    gc.disable()
    try:
        for hook in (None, lambda node, outs: None):
            with pytest.raises(KernelError):
                plan.run([np.ones((2, 3), np.float32)], hook=hook)
            assert refs[-1]() is None
    finally:
        gc.enable()
        registry.unregister("KeepRef", domain="test.runtime")
