"""The channels-last layout pass (graph/layout.py): which networks it rewrites, what becomes
channels-last, the borders, and that every output stays what the NCHW graph computes."""

from __future__ import annotations

import collections

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from workbench import autograd, backend, compiled, opt, sonnx, tensor
from workbench.graph import passes
from workbench.graph.layout import to_channels_last, wants_channels_last
from workbench.graph.load import load
from workbench.runtime import Plan

from .models import make_model, vi

RNG = np.random.default_rng(3)


def _t(a, name):
    return numpy_helper.from_array(np.asarray(a), name)


def _w(shape, name):
    return _t(RNG.standard_normal(shape).astype(np.float32) * 0.3, name)


def mobile_block(extra_nodes=(), extra_outputs=(), extra_inits=()):
    """A MobileNet-like stack: 3x3 stem, expand 1x1 + ReLU6, depthwise 3x3 + ReLU6,
    project 1x1, residual add, global pool, flatten, gemm; plus whatever a test adds."""
    c = 8
    inits = [_w((c, 3, 3, 3), "w0"), _w((c,), "b0"), _w((2 * c, c, 1, 1), "w1"),
             _w((2 * c, 1, 3, 3), "w2"), _w((c, 2 * c, 1, 1), "w3"), _w((c,), "b3"),
             _w((5, c), "wf"), _t(np.float32(0), "lo"), _t(np.float32(6), "hi"),
             *extra_inits]
    nodes = [
        helper.make_node("Conv", ["x", "w0", "b0"], ["s"], name="stem", pads=[1, 1, 1, 1],
                         strides=[2, 2]),
        helper.make_node("Relu", ["s"], ["s1"], name="stem_relu"),
        helper.make_node("Conv", ["s1", "w1"], ["e"], name="expand"),
        helper.make_node("Clip", ["e", "lo", "hi"], ["e1"], name="expand_clip"),
        helper.make_node("Conv", ["e1", "w2"], ["d"], name="dw", group=2 * c,
                         pads=[1, 1, 1, 1]),
        helper.make_node("Clip", ["d", "lo", "hi"], ["d1"], name="dw_clip"),
        helper.make_node("Conv", ["d1", "w3", "b3"], ["p"], name="project"),
        helper.make_node("Add", ["p", "s1"], ["r"], name="residual"),
        *extra_nodes,
        helper.make_node("GlobalAveragePool", ["r"], ["g"], name="gap"),
        helper.make_node("Flatten", ["g"], ["f"], name="flatten"),
        helper.make_node("Gemm", ["f", "wf"], ["y"], name="fc", transB=1),
    ]
    outs = [vi("y", ["N", 5]), *extra_outputs]
    return make_model(nodes, [vi("x", ["N", 3, 16, 16])], outs, inits)


def _outputs(model, x, **kw):
    rep = backend.prepare(model, **kw)
    return rep, [np.asarray(o) for o in rep.run([x])]


def _ops(rep):
    return collections.Counter(n.op_type for n in rep.plan.graph.nodes)


def _convs(rep):
    """Convolutions in the plan: NhwcConv nodes and the members of NhwcConvChain nodes
    (an optional expand, the depthwise, an optional project)."""
    nodes = rep.plan.graph.nodes
    return sum(n.op_type == "NhwcConv" for n in nodes) + sum(
        1 + bool(n.inputs[1]) + bool(n.inputs[5]) for n in nodes
        if n.op_type == "NhwcConvChain")


def _agree(model, x, atol=1e-5):
    ref_rep, ref = _outputs(model, x, layout=None)
    rep, got = _outputs(model, x)
    assert len(got) == len(ref)
    for a, b in zip(got, ref):
        assert a.shape == b.shape and a.dtype == b.dtype
        np.testing.assert_allclose(a, b, rtol=0, atol=atol * max(1.0, np.abs(b).max()))
    return rep


def test_a_depthwise_network_runs_channels_last():
    x = RNG.standard_normal((2, 3, 16, 16)).astype(np.float32)
    rep = _agree(mobile_block(), x)
    ops = _ops(rep)
    assert _convs(rep) == 4 and ops["NhwcGlobalAveragePool"] == 1
    # converted once in (the graph input) and once out (before Flatten): nothing per layer
    assert ops["Transpose"] == 2 and "Conv" not in ops and "FusedConv" not in ops
    names = {n.name: n for n in rep.plan.graph.nodes}
    # the inverted residual is one chain (expand, depthwise, project with the residual)
    chain = names["expand+dw+project"]
    assert chain.op_type == "NhwcConvChain" and chain.inputs[7] and ops["NhwcConv"] == 1
    # values keep their NCHW meaning under their own names
    assert all(o.endswith("__nhwc") for o in chain.outputs)


def test_networks_without_depthwise_stay_nchw_unless_worth_it():
    c = 4
    m = make_model([helper.make_node("Conv", ["x", "w"], ["c"], name="conv", pads=[1, 1, 1, 1]),
                    helper.make_node("Relu", ["c"], ["y"], name="relu")],
                   [vi("x", ["N", c, 8, 8])], [vi("y", ["N", c, 8, 8])], [_w((c, c, 3, 3), "w")])
    g = passes.optimize(load(m).graph)
    with compiled.disabled():   # the KxK rule needs the compiled kernel
        assert not wants_channels_last(g)
    # with it, one convolution is not worth a conversion in and one out
    assert [n.op_type for n in g.nodes] == ["FusedConv"]
    x = RNG.standard_normal((2, c, 8, 8)).astype(np.float32)
    rep, y = _outputs(m, x, layout="nhwc")
    assert _ops(rep)["NhwcConv"] == 1
    np.testing.assert_allclose(y[0], _outputs(m, x, layout=None)[1][0], atol=1e-5)
    assert to_channels_last(g, mode=None) is g
    with pytest.raises(ValueError, match="layout mode"):
        to_channels_last(g, mode="nchwc")


def test_borders_outputs_and_shape_reads():
    """A region value that is a graph output, read by an op without a channels-last form
    (Softmax over channels), by Shape (feeding a Reshape) and by Transpose."""
    extra = [
        helper.make_node("Softmax", ["d1"], ["sm"], name="softmax", axis=1),
        helper.make_node("Shape", ["d1"], ["shp"], name="shape"),
        helper.make_node("Shape", ["d1"], ["shp_hw"], name="shape_hw", start=2),
        helper.make_node("Reshape", ["sm", "shp"], ["sm2"], name="reshape"),
        helper.make_node("Transpose", ["r"], ["rt"], name="transpose", perm=[0, 2, 3, 1]),
    ]
    outs = [vi("d1", ["N", 16, 8, 8]), vi("sm2", ["N", 16, 8, 8]),
            vi("shp_hw", [2], TensorProto.INT64), vi("rt", ["N", 8, 8, 8])]
    x = RNG.standard_normal((3, 3, 16, 16)).astype(np.float32)
    rep = _agree(mobile_block(extra, outs), x)
    ops = _ops(rep)
    assert ops["Gather"] == 2  # each Shape reads the logical (NCHW) order
    # the depthwise output is read elsewhere: only expand + depthwise are one chain
    assert ops["Softmax"] == 1 and _convs(rep) == 4 and ops["NhwcConvChain"] == 1


def test_channel_ops_follow_the_layout():
    """Concat and Split over channels, Slice with axes, ReduceMean keeping dims,
    pointwise ops with constants of every broadcast rank, a non-constant rank-4 operand."""
    c2 = 16
    extra = [
        helper.make_node("Concat", ["d1", "e1"], ["cat"], name="concat", axis=1),
        helper.make_node("Split", ["cat", "split"], ["sa", "sb"], name="split", axis=-3),
        helper.make_node("Slice", ["sa", "st", "en", "ax"], ["sl"], name="slice"),
        helper.make_node("ReduceMean", ["sl"], ["rm0"], name="rmean", axes=[1, 2, 3]),
        helper.make_node("ReduceSum", ["rm0", "rax"], ["rm"], name="rsum", keepdims=1),
        helper.make_node("Mul", ["sb", "k4"], ["m4"], name="mul_c4"),
        helper.make_node("Add", ["m4", "k3"], ["m3"], name="add_c3"),
        helper.make_node("Sub", ["m3", "k1"], ["m1"], name="sub_w"),
        helper.make_node("Div", ["m1", "two"], ["m0"], name="div_scalar"),
        helper.make_node("Add", ["m0", "rm"], ["mm"], name="add_pooled"),
        helper.make_node("HardSigmoid", ["mm"], ["hs"], name="hsig"),
        helper.make_node("MaxPool", ["hs"], ["mp"], name="maxpool", kernel_shape=[3, 3],
                         strides=[2, 2], pads=[1, 1, 1, 1]),
    ]
    inits = [_t(np.array([c2, c2], np.int64), "split"), _t(np.array([3, 2], np.int64), "st"),
             _t(np.array([-1, 7], np.int64), "en"), _t(np.array([1, -2], np.int64), "ax"),
             _t(np.array([-1], np.int64), "rax"),
             _w((1, c2, 1, 1), "k4"), _w((c2, 1, 1), "k3"), _w((8,), "k1"),
             _t(np.float32(2), "two")]
    outs = [vi("mp", ["N", c2, 4, 4])]
    x = RNG.standard_normal((2, 3, 16, 16)).astype(np.float32)
    rep = _agree(mobile_block(extra, outs, inits), x)
    ops = _ops(rep)
    assert ops["Concat"] == 1 and ops["Split"] == 1 and ops["Slice"] == 1
    assert ops["NhwcMaxPool"] == 1 and ops["ReduceMean"] == 1 and ops["ReduceSum"] == 1
    nodes = {n.name: n for n in rep.plan.graph.nodes}
    assert nodes["concat"].attrs["axis"] == 3 and nodes["split"].attrs["axis"] == 3
    assert all(o.endswith("__nhwc") for o in nodes["hsig"].outputs)


def test_trainable_weights_are_transposed_in_the_plan():
    """SONNXModel.run optimises with the weights as variables: the HWIO weights are computed
    in the plan (so a trained model runs its current weights)."""
    m = mobile_block()
    g = load(m).graph
    variables = set(g.initializers)
    g2 = passes.optimize(g, variables=variables)
    hwio = [n for n in g2.nodes if n.op_type == "Transpose" and n.attrs["perm"] == [2, 3, 1, 0]]
    assert len(hwio) == 4
    x = RNG.standard_normal((2, 3, 16, 16)).astype(np.float32)
    ref = Plan(passes.optimize(g, layout=None)).run([x])[0]
    np.testing.assert_allclose(Plan(g2).run([x])[0], ref, atol=1e-4)


def test_graphs_with_subgraphs_are_left_alone():
    body = helper.make_graph([helper.make_node("Identity", ["d1"], ["o"])], "b", [],
                             [vi("o", ["N", 16, 8, 8])])
    extra = [helper.make_node("If", ["cond"], ["iff"], name="if", then_branch=body,
                              else_branch=body)]
    m = mobile_block(extra, [vi("iff", ["N", 16, 8, 8])])
    m.graph.input.append(vi("cond", [], TensorProto.BOOL))
    g = passes.optimize(load(m).graph)
    assert not any(n.op_type == "NhwcConv" for n in g.nodes)


def _any_image_size(proto):
    """The export with its image height and width symbolic (it fixes them at 224), so the
    test can run small images."""
    dims = proto.graph.input[0].type.tensor_type.shape.dim
    dims[2].dim_param, dims[3].dim_param = "height", "width"
    return proto


@pytest.mark.parametrize("name,layout,transposes", [
    ("shufflenetv2", "auto", 2), ("mobilenetv2", "auto", 2), ("resnet18", "nhwc", 2)])
def test_real_networks(torch_exports, name, layout, transposes):
    """torch.onnx exports: ShuffleNetV2 (its channel shuffles and splits stay channels-last),
    MobileNetV2 and ResNet-18 (forced; "auto" only with the compiled KxK convolution): one
    conversion in, one out."""
    proto = _any_image_size(torch_exports.proto(name))
    x = np.random.default_rng(0).random((2, 3, 64, 64), dtype=np.float32)
    ref_rep, ref = _outputs(proto, x, layout=None)
    rep, got = _outputs(proto, x, layout=layout)
    np.testing.assert_allclose(got[0], ref[0], rtol=0,
                               atol=2e-5 * max(1.0, float(np.abs(ref[0]).max())))
    ops = _ops(rep)
    assert ops["Transpose"] == transposes
    assert "Conv" not in ops and "FusedConv" not in ops
    assert _convs(rep) == _ops(ref_rep)["FusedConv"] + _ops(ref_rep)["Conv"]
    if name == "shufflenetv2":
        assert ops["NhwcChannelShuffle"] == 16
        # each branch's chain writes into its block's concat + shuffle
        assert "NhwcConcatShuffle" not in ops and sum(
            n.op_type == "NhwcConvChain" and len(n.inputs) > 8 and bool(n.inputs[8])
            for n in rep.plan.graph.nodes) == 16
    if name == "resnet18":
        assert ops["NhwcMaxPool"] == 1
        # "auto": a network without depthwise convolutions goes channels-last only when the
        # compiled KxK convolution is ready at prepare (on numpy it would be slower)
        with compiled.disabled():
            assert "NhwcConv" not in _ops(backend.prepare(proto))
        if compiled.kernel("gemm_avx2.iconv") is not None:
            assert _ops(backend.prepare(proto))["NhwcConv"] == ops["NhwcConv"]


class _Classifier(sonnx.SONNXModel):
    def train_one_batch(self, x, y):
        out = self.forward(x)[0]
        loss = autograd.softmax_cross_entropy(out, y)
        self.optimizer.backward_and_update(loss)
        return out, loss


def _trained(proto, x, y, *, run_first):
    m = _Classifier(proto)
    m.set_optimizer(opt.SGD(lr=0.1, momentum=0.9))
    m.compile([tensor.PlaceHolder(x.shape)], is_train=True)
    if run_first:   # builds the channels-last inference plan before training
        m.run(x)
    m.train()
    for _ in range(2):
        m(tensor.from_numpy(x), tensor.from_numpy(y))
    return m, {k: v.numpy().copy() for k, v in m.get_params().items()}


def test_training_runs_as_written_and_inference_sees_the_new_weights():
    """Training (forward + gradients) runs the NCHW graph as written, untouched by the
    inference plan's layout; ``model.run`` (channels-last, the weights transposed in its
    plan) then gives what the trained weights give NCHW."""
    proto = mobile_block()
    x = RNG.standard_normal((4, 3, 16, 16)).astype(np.float32)
    y = np.array([0, 3, 1, 4], np.int32)
    m, after = _trained(proto, x, y, run_first=True)
    _, after_plain = _trained(proto, x, y, run_first=False)
    assert after.keys() == after_plain.keys() and len(after) == 7   # every weight, bias
    for k in after:
        np.testing.assert_array_equal(after[k], after_plain[k], err_msg=k)
    assert any(not np.array_equal(after[k], numpy_helper.to_array(i))
               for i in proto.graph.initializer for k in after if k == i.name)
    got = m.run(x)[0]
    plan, _ = m._tplan(m._outputs_for(None, ()), inference=True)
    assert any(n.op_type == "NhwcConv" for n in plan.graph.nodes)
    m.eval()
    want = m.forward(tensor.from_numpy(x))[0].numpy()
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-4 * max(1.0, np.abs(want).max()))


def test_convnext_like_blocks_use_the_graphs_own_transposes():
    """depthwise 7x7 -> Transpose to NHWC -> LayerNorm over channels -> MLP -> Transpose
    back -> residual Add: the graph's own transposes cost nothing (one conversion in, one
    out for the whole net)."""
    c = 8
    inits = [_w((c, 1, 7, 7), "dw1"), _w((c,), "db1"), _w((c, 1, 3, 3), "dw2"),
             _t(np.ones(c, np.float32), "g"), _t(np.zeros(c, np.float32), "bt"),
             _w((c, 4 * c), "m1"), _w((4 * c, c), "m2")]
    nodes = [
        helper.make_node("Conv", ["x", "dw1", "db1"], ["d"], name="dw7", group=c,
                         pads=[3, 3, 3, 3]),
        helper.make_node("Transpose", ["d"], ["t"], name="to_last", perm=[0, 2, 3, 1]),
        helper.make_node("LayerNormalization", ["t", "g", "bt"], ["ln"], name="ln", axis=-1),
        helper.make_node("MatMul", ["ln", "m1"], ["h"], name="fc1"),
        helper.make_node("Relu", ["h"], ["hr"], name="act"),
        helper.make_node("MatMul", ["hr", "m2"], ["o"], name="fc2"),
        helper.make_node("Transpose", ["o"], ["ob"], name="to_first", perm=[0, 3, 1, 2]),
        helper.make_node("Add", ["ob", "x"], ["r"], name="residual"),
        helper.make_node("Conv", ["r", "dw2"], ["y"], name="dw3", group=c, pads=[1, 1, 1, 1]),
    ]
    m = make_model(nodes, [vi("x", ["N", c, 10, 12])], [vi("y", ["N", c, 10, 12])], inits)
    x = RNG.standard_normal((2, c, 10, 12)).astype(np.float32)
    rep = _agree(m, x, atol=2e-5)
    ops = _ops(rep)
    assert ops["NhwcConv"] == 2 and ops["Transpose"] == 2 and ops["Identity"] <= 1
    names = {n.name: n for n in rep.plan.graph.nodes}
    assert names["residual"].outputs[0].endswith("__nhwc")   # the Add stayed channels-last
