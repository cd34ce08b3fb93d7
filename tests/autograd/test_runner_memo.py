"""The Tensor runner's remembered shape arithmetic and reused Constants
(workbench/autodiff/runner.py: ``_Memo``, ``_Reused``): the same losses and weights bit for bit
as running every kernel every step, a changed input shape or an edited Constant never served a
stale value, the tape and ``to_onnx`` still hold every original node, graph-mode replays and
``inference_mode`` unchanged."""

from __future__ import annotations

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

from workbench import autograd, backend, opt, sonnx, tensor  # noqa: E402
from workbench.autodiff import runner as _runner  # noqa: E402
from workbench.autodiff.tape import inference_mode, tape_order  # noqa: E402


def _const(name, value, dtype=np.int64):
    return helper.make_node("Constant", [], [name], name=name,
                            value=numpy_helper.from_array(np.array(value, dtype), name))


def shape_chain_mlp(inner=(2, 4), constant_output=False):
    """X(N,6) @ W1 -> Reshape to (N, *inner) with a target computed in the graph (Shape ->
    Gather -> Unsqueeze -> Concat with a Constant) -> Transpose -> Reshape back to (N, 8) the
    same way -> Mul by a Cast of a shape value -> @ W2 (3 classes)."""
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array((rng.standard_normal((6, 8)) * 0.5).astype(np.float32),
                                     "W1"),
             numpy_helper.from_array((rng.standard_normal((8, 3)) * 0.3).astype(np.float32),
                                     "W2")]
    nodes = [helper.make_node("MatMul", ["X", "W1"], ["h"], name="mm1"),
             helper.make_node("Shape", ["X"], ["sx"], name="shape_x"),
             _const("zero", 0),
             helper.make_node("Gather", ["sx", "zero"], ["n"], name="batch", axis=0),
             _const("axes0", [0]),
             helper.make_node("Unsqueeze", ["n", "axes0"], ["n1"], name="n1"),
             _const("inner", list(inner)),
             helper.make_node("Concat", ["n1", "inner"], ["target"], name="target", axis=0),
             helper.make_node("Reshape", ["h", "target"], ["h3"], name="to3d"),
             helper.make_node("Transpose", ["h3"], ["t3"], name="swap", perm=[0, 2, 1]),
             helper.make_node("Shape", ["t3"], ["st"], name="shape_t"),
             helper.make_node("Gather", ["st", "zero"], ["m"], name="batch2", axis=0),
             helper.make_node("Unsqueeze", ["m", "axes0"], ["m1"], name="m1"),
             _const("minus1", [-1]),
             helper.make_node("Concat", ["m1", "minus1"], ["back"], name="back", axis=0),
             helper.make_node("Reshape", ["t3", "back"], ["flat"], name="to2d"),
             helper.make_node("Cast", ["n"], ["nf"], name="nf", to=TensorProto.FLOAT),
             _const("tenth", 0.1, np.float32),
             helper.make_node("Mul", ["nf", "tenth"], ["scale"], name="scale"),
             helper.make_node("Mul", ["flat", "scale"], ["scaled"], name="scaled"),
             helper.make_node("MatMul", ["scaled", "W2"], ["logits"], name="head")]
    outs = [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["N", 3])]
    if constant_output:     # a Constant's value is also a graph output
        outs.append(helper.make_tensor_value_info("inner", TensorProto.INT64, [2]))
    g = helper.make_graph(nodes, "shape_chain_mlp",
                          [helper.make_tensor_value_info("X", TensorProto.FLOAT, ["N", 6])],
                          outs, inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def _data(n, seed=1):
    rng = np.random.default_rng(seed)
    return (rng.standard_normal((n, 6)).astype(np.float32),
            rng.integers(0, 3, size=n).astype(np.int64))


def train(proto, batches=(4, 4, 4, 5, 5, 4), use_graph=False):
    """(losses, weights, the model, the last step's tape) of SGD steps on ``batches``."""
    m = sonnx.SONNXModel(proto)
    x0, _ = _data(batches[0])
    m.compile([tensor.PlaceHolder(x0.shape)], is_train=True, use_graph=use_graph)
    sgd = opt.SGD(lr=0.1, momentum=0.9)
    losses, nodes = [], []
    for i, n in enumerate(batches):
        x, y = _data(n, seed=i)
        outs = m.forward(tensor.from_numpy(x))
        loss = autograd.softmax_cross_entropy(outs[0], y)
        nodes = tape_order([loss])
        losses.append(loss.item())
        sgd.backward_and_update(loss)
    return losses, {k: v.numpy().copy() for k, v in m.get_params().items()}, m, nodes


def _runner_of(m):
    (_, r), = [tp for tp in m._tplans.values()]
    return r


def test_remembered_steps_train_bit_for_bit_as_every_kernel_run(monkeypatch):
    on = train(shape_chain_mlp())
    monkeypatch.setenv("WORKBENCH_SHAPE_MEMO", "0")
    off = train(shape_chain_mlp())
    assert on[0] == off[0]          # bit for bit, across the batch change 4 -> 5 -> 4
    for k in off[1]:
        assert np.array_equal(on[1][k], off[1][k])
    # the tape holds every original node, in the same order
    assert [n.op_type for n in on[3]] == [n.op_type for n in off[3]]
    graph_names = {n.name for n in shape_chain_mlp().graph.node}
    assert [n.name for n in on[3] if n.name in graph_names] == \
        [n.name for n in off[3] if n.name in graph_names] == \
        [n.name for n in shape_chain_mlp().graph.node]
    # the memo served the shape chain; nothing is remembered with the switch off
    special = _runner_of(on[2])._special
    memos = [s for s in special.values() if isinstance(s, _runner._Memo)]
    assert sum(1 for s in memos if s.entries) >= 8
    assert sum(isinstance(s, _runner._Reused) for s in special.values()) == 5
    assert not _runner_of(off[2])._special
    for s in memos:     # private, read-only copies
        for given in s.entries.values():
            assert all(not a.flags.writeable for a in given())


def test_a_changed_batch_and_an_edited_constant_are_never_served_stale():
    m = sonnx.SONNXModel(shape_chain_mlp())
    x4, _ = _data(4)
    x5, _ = _data(5)
    m.compile([tensor.PlaceHolder(x4.shape)], is_train=True)
    ref = backend.prepare(shape_chain_mlp())
    for x in (x4, x4, x5, x4, x5):
        got = m.forward(tensor.from_numpy(x))[0].numpy()
        np.testing.assert_array_equal(got, ref.run([x])[0])
    # the Constant edited (its array is read-only: an edit replaces it): the next step
    # computes the new Reshape target
    node = next(n for n in m.onnx_graph.nodes if n.name == "inner")
    with pytest.raises(ValueError):
        node.attrs["value"][...] = [4, 2]
    node.attrs["value"] = np.array([4, 2], np.int64)
    edited = backend.prepare(shape_chain_mlp(inner=(4, 2)))
    for x in (x4, x5):
        got = m.forward(tensor.from_numpy(x))[0].numpy()
        np.testing.assert_array_equal(got, edited.run([x])[0])
    assert not np.array_equal(edited.run([x4])[0], ref.run([x4])[0])


def test_export_graph_mode_and_inference_mode_see_the_original_nodes(monkeypatch):
    m = sonnx.SONNXModel(shape_chain_mlp())
    x4, _ = _data(4)
    m.compile([tensor.PlaceHolder(x4.shape)], is_train=True)
    x = tensor.from_numpy(x4)
    outs = [m.forward(x)[0] for _ in range(3)]   # the later ones served from the memo
    first, last = tape_order(outs[0:1]), tape_order(outs[2:3])
    assert [(n.op_type, n.name) for n in first] == [(n.op_type, n.name) for n in last]
    assert len(first) == 21
    # a remembered node keeps its real kernel (graph-mode replays run it)
    gather = next(n for n in last if n.name == "batch")
    assert gather.fn.__module__.startswith("workbench.ops")
    # the Constants' nodes are the same objects from one step to the next
    assert {id(n) for n in first if n.op_type == "Constant"} == \
        {id(n) for n in last if n.op_type == "Constant"}
    exported = sonnx.to_onnx([x], [outs[2]])
    ops = sorted(n.op_type for n in exported.graph.node)
    assert ops.count("Constant") == 5 and ops.count("Shape") == 2 and ops.count("Concat") == 2
    np.testing.assert_array_equal(backend.prepare(exported).run([x4])[0],
                                  backend.prepare(shape_chain_mlp()).run([x4])[0])
    # without recording, nothing recorded; recording again records afresh
    with inference_mode():
        plain = m.forward(x)[0]
    assert plain.creator is None
    again = m.forward(x)[0]
    assert again.creator is not None and len(tape_order([again])) == len(last)
    # graph mode (a replayed tape) trains as the eager memo'd and plain runs do
    eager = train(shape_chain_mlp(), batches=(4, 4, 4, 4))
    graph = train(shape_chain_mlp(), batches=(4, 4, 4, 4), use_graph=True)
    monkeypatch.setenv("WORKBENCH_SHAPE_MEMO", "0")
    plain_graph = train(shape_chain_mlp(), batches=(4, 4, 4, 4), use_graph=True)
    assert graph[0] == plain_graph[0]
    (rep,) = graph[2]._replays.values()     # the replayed tape remembered its shape steps
    assert sum(isinstance(s, _runner._Memo) and bool(s.entries)
               for s in rep.runner._special.values()) >= 8
    assert sum(isinstance(s, _runner._Reused) for s in rep.runner._special.values()) == 5
    (rep,) = plain_graph[2]._replays.values()
    assert not rep.runner._special
    np.testing.assert_allclose(graph[0], eager[0], rtol=1e-6)


def test_a_constant_output_changed_by_the_caller_is_not_handed_out_again():
    m = sonnx.SONNXModel(shape_chain_mlp(constant_output=True))
    x4, _ = _data(4)
    m.compile([tensor.PlaceHolder(x4.shape)], is_train=True)
    x = tensor.from_numpy(x4)
    m.forward(x)
    first = m.forward(x)[1]
    assert m.forward(x)[1] is first          # reused while nobody changed it
    first.data = first.data * 3              # the caller's Tensor given other data
    again = m.forward(x)[1]
    assert again is not first and again.numpy().tolist() == [2, 4]
    again.requires_grad = True
    assert m.forward(x)[1] is not again


@pytest.mark.parametrize("memo", ["1", "0"])
@pytest.mark.parametrize("compiled", [False, True])
def test_writing_into_a_constant_output_cannot_change_the_model(monkeypatch, memo, compiled):
    # the Constant's kernel hands out its attribute's own array (writable in a model used
    # without compile), run once per runner: a caller's in-place write into that graph output
    # changed the Constant, and every output reading it, for all later steps
    monkeypatch.setenv("WORKBENCH_SHAPE_MEMO", memo)
    m = sonnx.SONNXModel(shape_chain_mlp(constant_output=True))
    x4, _ = _data(4)
    if compiled:
        m.compile([tensor.PlaceHolder(x4.shape)], is_train=True)
    else:
        m.train()
    x = tensor.from_numpy(x4)
    want = [t.numpy().copy() for t in m.forward(x)]
    for _ in range(2):
        inner = m.forward(x)[1]
        with pytest.raises(ValueError, match="read-only"):
            inner.data *= 3
    got = m.forward(x)
    assert got[1].numpy().tolist() == [2, 4]
    assert np.array_equal(got[0].numpy(), want[0])
