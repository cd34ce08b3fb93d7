"""The trainable model's inference cache (``workbench.singa.inference_cache``): ``model.run``
on a plan prepared as ``backend.prepare`` prepares one, exactly invalidated by every edit.

The oracle of every check is ``backend.prepare`` of the model as it is at that moment (its
current graph and weights written to a ModelProto): bit for bit. Each edit is one a sampled
check would miss (one conv output channel, one element of a large weight, one bias value).
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import helper, numpy_helper

import workbench as wb
from tests.test_sonnx_snippets import digits_batch, small_cnn_proto
from workbench import autograd, backend, compiled, opt
from workbench.singa import inference_cache
from workbench.tensor import Tensor


def _proto_now(model) -> onnx.ModelProto:
    """The model as it is now (graph and current weights) as a ModelProto."""
    g = model.onnx_graph.to_proto()
    del g.initializer[:]
    g.initializer.extend(numpy_helper.from_array(np.asarray(model._weights[k].data), k)
                         for k in model.onnx_graph.initializers)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid(d, v) for d, v in
                                            model.onnx_graph.opsets.items()])
    m.ir_version = model._proto.ir_version
    return m


def _plan_of(model):
    (ent,) = model._inference_cache.values()
    return ent[2]


def _same(a, b) -> None:
    assert len(a) == len(b)
    for x, y in zip(a, b):
        assert x.dtype == y.dtype and x.shape == y.shape
        np.testing.assert_array_equal(x, y)


def _fresh(model, x):
    """Two runs after an edit (the first may run the variable-weight plan, the second the
    rebuilt prepared plan): both must be prepare's answer on the model as it is now."""
    want = backend.prepare(_proto_now(model)).run([x])
    first, second = model.run(x), model.run(x)
    _same(first, want)
    _same(second, want)
    return want[0]


@pytest.fixture(scope="module")
def data():
    x, y = digits_batch()
    return x[:8], y[:8]


def test_run_is_prepare_and_reuses_its_plan(data):
    x, _ = data
    proto = small_cnn_proto()
    m, rep = wb.load(proto), backend.prepare(proto)
    _same(m.run(x), rep.run([x]))
    plan = _plan_of(m)
    for _ in range(3):
        _same(m.run(x), rep.run([x]))
    assert _plan_of(m) is plan                       # no rebuild while nothing changed
    ops = [s.node.op_type for s in plan.steps]       # prepare's graph: BN folded once
    assert "FoldBatchNormWeights" not in ops and "BatchNormalization" not in ops
    m.eval()
    with autograd.inference_mode():                  # forward with no tape: the same plan
        out = m.forward(Tensor(data=x))
    _same([o.numpy() for o in out], rep.run([x]))
    assert _plan_of(m) is plan


@pytest.mark.parametrize("edit", ["conv_channel", "one_element", "bias", "kept_reference",
                                  "running_var", "reassigned", "copy_from"])
def test_in_place_weight_edits_give_the_new_answer(data, edit):
    x, _ = data
    m = wb.load(small_cnn_proto())
    before = m.run(x)[0]
    m.run(x)
    p, states = m.imported_params(), m.get_states()
    if edit == "conv_channel":          # one conv output channel, raw numpy
        p["conv_w"].data[5] *= -1.5
    elif edit == "one_element":         # one element of the 128k-element fc1 weight
        p["fc1_w"].data[611, 77] += 0.25
    elif edit == "bias":
        p["fc2_b"].data[3] = 2.0
    elif edit == "kept_reference":      # through a reference taken long before
        w = p["fc2_w"].data
        m.run(x)
        w[7, 999] = -3.0
    elif edit == "running_var":         # a BatchNorm running statistic (a buffer)
        states["bn_var"].data[2] *= 9.0
    elif edit == "reassigned":
        p["conv_b"].data = p["conv_b"].data + np.float32(0.5)
    elif edit == "copy_from":
        p["fc1_b"].copy_from(np.full(1000, 0.1, np.float32))
    after = _fresh(m, x)
    assert not np.array_equal(before, after)
    plan = _plan_of(m)
    m.run(x)
    assert _plan_of(m) is plan          # and kept once the weights stay put


def test_graph_edits_invalidate(data):
    x, _ = data
    m = wb.load(small_cnn_proto())
    base = m.run(x)[0]
    g = m.onnx_graph
    nodes = {n.name: n for n in g.nodes}
    nodes["fc2"].attrs["alpha"] = 0.5                    # an attribute changed
    b = m._weights["fc2_b"].data
    np.testing.assert_allclose(_fresh(m, x), 0.5 * (base - b) + b, rtol=1e-5, atol=1e-5)
    nodes["conv1"].attrs["pads"][:] = [0, 0, 2, 2]       # a list attribute, in place
    _fresh(m, x)
    drop = nodes["drop1"]                                # a node removed, rewired
    g.nodes.remove(drop)
    nodes["flatten1"].inputs[0] = drop.inputs[0]
    _fresh(m, x)
    nodes["relu2"].op_type = "Sigmoid"                   # a node's op changed
    _fresh(m, x)
    g.outputs = [m._value_info("r2")]                    # the graph's outputs changed
    out = _fresh(m, x)
    assert out.shape == (x.shape[0], 1000)


def test_cuts_and_last_layers(data):
    x, _ = data
    m = wb.load(small_cnn_proto())
    full = m.run(x)
    feat = m.run(x, last_layers=-3)[0]
    assert feat.shape == (x.shape[0], 1000)
    _same(m.run(x), full)
    head = m.cut(-3)
    _same(head.run(x), backend.prepare(_proto_now(head)).run([x]))
    _same([feat], head.run(x))
    assert len(m._inference_cache) == 2                  # one plan per set of outputs


def test_training_steps_then_eval_runs_are_fresh(data):
    x, y = data
    m = wb.load(small_cnn_proto())
    sgd = opt.SGD(lr=0.05, momentum=0.9)
    onehot = np.eye(10, dtype=np.float32)[y]
    seen = [m.run(x)[0]]
    for _ in range(2):
        m.train()
        for _ in range(2):
            out = m.forward(Tensor(data=x))[0]
            loss = autograd.softmax_cross_entropy(out, Tensor(data=onehot))
            sgd.backward_and_update(loss)
        m.eval()
        seen.append(_fresh(m, x))
        with autograd.inference_mode():
            _same([m.forward(Tensor(data=x))[0].numpy()], [seen[-1]])
    assert not np.array_equal(seen[0], seen[1]) and not np.array_equal(seen[1], seen[2])


def test_kernels_disabled_and_numpy_compare(data, monkeypatch):
    x, _ = data
    m = wb.load(small_cnn_proto())
    with compiled.disabled():
        _same(m.run(x), backend.prepare(_proto_now(m)).run([x]))
        m.imported_params()["conv_w"].data[0, 0, 1, 1] += 1.0
        _fresh(m, x)
    monkeypatch.setattr(inference_cache, "_MEMCMP", None)    # no libc memcmp: numpy bytes
    m.imported_params()["conv_w"].data[1, 0, 0, 0] -= 1.0
    _fresh(m, x)


def test_other_float_inputs_and_batches_keep_the_variable_path(data):
    x, _ = data
    m = wb.load(small_cnn_proto())
    out = m.run(x.astype(np.float64))[0]     # computed in float64 by the variable plan
    assert out.dtype == np.float64
    np.testing.assert_allclose(out, m.run(x)[0], rtol=1e-4, atol=1e-4)
    fixed = small_cnn_proto()                # a file that fixes the batch at 8
    fixed.graph.input[0].type.tensor_type.shape.dim[0].dim_value = x.shape[0]
    f = wb.load(fixed)
    _same(f.run(x), m.run(x))
    five = f.run(x[:5])[0]                   # forward takes another batch: so does run
    np.testing.assert_allclose(five, m.run(x[:5])[0], rtol=1e-5, atol=1e-5)


def test_tracked_graph_behaves_as_the_plain_one():
    m = wb.load(small_cnn_proto())
    g = m.onnx_graph
    n = g.nodes[0]
    assert isinstance(n, wb.graph.ir.Node) and isinstance(g, wb.graph.ir.Graph)
    import copy
    import pickle
    for c in (copy.deepcopy(n), pickle.loads(pickle.dumps(n))):
        assert type(c) is wb.graph.ir.Node and c == n and n == c
        assert type(c.attrs) is dict and type(c.inputs) is list
    before = m._graph_version.n
    g.copy().nodes[0].attrs["pads"] = [0, 0, 0, 0]     # a copy is not the model's graph
    assert m._graph_version.n == before


@pytest.mark.parametrize("how", ["deepcopy", "pickle"])
def test_copies_of_a_model_track_their_own_edits(data, how):
    import copy
    import pickle
    x, _ = data
    m = wb.load(small_cnn_proto())
    m.run(x)
    c = copy.deepcopy(m) if how == "deepcopy" else pickle.loads(pickle.dumps(m))
    _same(c.run(x), m.run(x))
    c.imported_params()["fc2_w"].data[0, 0] += 1.0      # the copy's weights are its own
    _fresh(c, x)
    next(n for n in c.onnx_graph.nodes if n.name == "fc2").attrs["alpha"] = 2.0
    _fresh(c, x)
    _same(m.run(x), backend.prepare(_proto_now(m)).run([x]))  # the original is untouched


def test_a_model_over_the_snapshot_budget_keeps_the_variable_plan(data, monkeypatch):
    """Weights above ``WORKBENCH_INFERENCE_CACHE_MB`` get no snapshot (no second copy of a
    big model): the variable-weight plan runs, with the same numbers."""
    x, _ = data
    proto = small_cnn_proto()
    m, want = wb.load(proto), backend.prepare(proto).run([x])
    monkeypatch.setenv("WORKBENCH_INFERENCE_CACHE_MB", "0")
    _same(m.run(x), want)
    assert not m.__dict__.get("_inference_cache")
    monkeypatch.setenv("WORKBENCH_INFERENCE_CACHE_MB", "1024")
    node = m.onnx_graph.nodes[0]
    node.name = node.name               # a tracked edit: the budget is decided again
    _same(m.run(x), want)
    assert m.__dict__.get("_inference_cache")
