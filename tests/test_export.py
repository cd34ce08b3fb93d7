"""Export (``sonnx.to_onnx`` / ``Model.export``): checker-valid models that give our numbers in
onnxruntime (normalised max error <= 1e-4), torch.onnx naming conventions, atomic writes, and
ExportError for what ONNX cannot express."""

from __future__ import annotations

import os

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from workbench import autograd, layer, model, sonnx, tensor
from workbench.errors import ExportError

ort = pytest.importorskip("onnxruntime")


def run_ort(proto, *xs):
    s = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])
    return s.run(None, {i.name: x for i, x in zip(s.get_inputs(), xs)})


def close(a, b, tol=1e-4):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    assert a.shape == b.shape
    err = float(np.abs(a - b).max()) / max(1e-12, float(np.abs(b).max()))
    assert err <= tol, f"normalised max error {err:.2e}"


class Net(model.Model):
    """Conv / BatchNorm / pooling / Dropout / Linear: the usual CNN layers."""

    def __init__(self):
        super().__init__()
        self.conv1 = layer.Conv2d(8, 3, padding=1, stride=1)
        self.bn1 = layer.BatchNorm2d()
        self.conv2 = layer.Conv2d(8, 3, padding=(1, 1), group=2, dilation=1)
        self.pool = layer.MaxPool2d(2)
        self.avg = layer.AvgPool2d(2, stride=1)
        self.flat = layer.Flatten()
        self.drop = layer.Dropout(0.3)
        self.fc = layer.Linear(5)

    def forward(self, x):
        x = self.pool(autograd.relu(self.bn1(self.conv1(x))))
        x = self.avg(autograd.leakyrelu(self.conv2(x), 0.1))
        return autograd.softmax(self.fc(self.drop(self.flat(x))), 1)


class Encoder(model.Model):
    """Embedding / LayerNorm / attention-style MatMul / Gelu / Linear on 3-D inputs."""

    def __init__(self):
        super().__init__()
        self.emb = layer.Embedding(50, 16)
        self.ln = layer.LayerNorm(16)
        self.q = layer.Linear(16)
        self.k = layer.Linear(16)
        self.ff = layer.Linear(32)
        self.gelu = layer.Gelu()
        self.out = layer.Linear(4)

    def forward(self, ids):
        h = self.ln(self.emb(ids))
        att = autograd.softmax(autograd.matmul(self.q(h), autograd.transpose(
            self.k(h), (0, 2, 1))) * 0.25, -1)
        h = h + autograd.matmul(att, h)
        h = self.gelu(self.ff(h))
        return self.out(autograd.reduce_mean(h, [1]))


def _trained_net():
    tensor.seed(0)
    m = Net()
    m.compile([tensor.PlaceHolder((2, 3, 8, 8))], is_train=False)
    rng = np.random.default_rng(0)
    for t in m.get_states().values():  # non-trivial BatchNorm statistics
        if "running" in (t.name or ""):
            t.data = rng.uniform(0.5, 1.5, t.shape).astype(np.float32)
    return m


def test_layer_cnn_export_matches_onnxruntime(tmp_path):
    m = _trained_net()
    x = np.random.default_rng(1).standard_normal((2, 3, 8, 8)).astype(np.float32)
    m.eval()
    ours = m.forward(tensor.from_numpy(x)).numpy()
    proto = m.to_onnx()
    onnx.checker.check_model(proto, full_check=True)
    ops = {n.op_type for n in proto.graph.node}
    assert {"Conv", "BatchNormalization", "MaxPool", "AveragePool", "Gemm", "Softmax"} <= ops
    assert len(proto.graph.initializer) >= 10
    close(run_ort(proto, x)[0], ours)


def test_transformer_layers_export_matches_onnxruntime():
    tensor.seed(1)
    m = Encoder()
    ids = np.random.default_rng(0).integers(0, 50, (3, 7)).astype(np.int64)
    m.compile([tensor.PlaceHolder(ids.shape, dtype=np.int64)], is_train=False)
    ours = m.forward(tensor.from_numpy(ids)).numpy()
    proto = m.to_onnx([tensor.from_numpy(ids)], input_names=["ids"], output_names=["scores"],
                      dynamic_axes={"ids": {0: "batch", 1: "seq"}, "scores": {0: "batch"}})
    onnx.checker.check_model(proto, full_check=True)
    assert {"Gather", "LayerNormalization", "MatMul", "Erf"} <= {n.op_type for n in
                                                                   proto.graph.node}
    close(run_ort(proto, ids)[0], ours)
    # dynamic axes: other batch and sequence lengths run
    ids2 = np.random.default_rng(1).integers(0, 50, (5, 4)).astype(np.int64)
    close(run_ort(proto, ids2)[0], m.forward(tensor.from_numpy(ids2)).numpy())


def test_names_and_dynamic_axes_follow_torch_onnx():
    m = _trained_net()
    x = tensor.PlaceHolder((2, 3, 8, 8))
    proto = m.to_onnx([x], input_names=["actual_input_1"], output_names=["output1"],
                      dynamic_axes={"actual_input_1": {0: "batch"}, "output1": [0]})
    assert [i.name for i in proto.graph.input] == ["actual_input_1"]
    assert [o.name for o in proto.graph.output] == ["output1"]
    dim0 = proto.graph.input[0].type.tensor_type.shape.dim[0]
    assert dim0.dim_param == "batch"
    assert proto.graph.output[0].type.tensor_type.shape.dim[0].dim_param == \
        "output1_dynamic_axes_0"
    inits = {t.name for t in proto.graph.initializer}
    assert {"conv1.W", "bn1.scale", "bn1.running_mean", "fc.W", "fc.b"} <= inits
    x5 = np.random.default_rng(2).standard_normal((5, 3, 8, 8)).astype(np.float32)
    m.eval()
    close(run_ort(proto, x5)[0], m.forward(tensor.from_numpy(x5)).numpy())


def test_model_export_writes_atomically_and_never_overwrites(tmp_path):
    m = _trained_net()
    path = tmp_path / "net.onnx"
    m.export(path)
    assert sorted(os.listdir(tmp_path)) == ["net.onnx"]
    onnx.checker.check_model(onnx.load(str(path)))
    stamp = path.read_bytes()
    with pytest.raises(FileExistsError, match="overwrite=True"):
        m.export(path)
    assert path.read_bytes() == stamp
    m.export(path, overwrite=True, opset_version=17)
    assert sorted(os.listdir(tmp_path)) == ["net.onnx"]


def test_sonnx_round_trip_keeps_names_and_numbers(torch_exports):
    proto = torch_exports.proto("resnet18")
    m = sonnx.SONNXModel(proto)
    m.compile([tensor.PlaceHolder((1, 3, 64, 64))], is_train=False)  # smaller images
    x = np.random.default_rng(0).standard_normal((1, 3, 64, 64)).astype(np.float32)
    y = m.forward(tensor.from_numpy(x))[0]
    back = sonnx.to_onnx([tensor.from_numpy(x)], [y], input_names=["input"],
                         dynamic_axes={"input": {0: "batch", 2: "h", 3: "w"}})
    onnx.checker.check_model(back)
    assert [n.name for n in back.graph.node] == [n.name for n in proto.graph.node]
    assert {t.name for t in back.graph.initializer} == {t.name for t in proto.graph.initializer}
    assert back.graph.output[0].name == proto.graph.output[0].name
    close(run_ort(back, x)[0], y.numpy())
    x224 = np.random.default_rng(0).standard_normal((1, 3, 224, 224)).astype(np.float32)
    close(run_ort(back, x224)[0], run_ort(proto, x224)[0])  # dynamic h, w


def _opset11_softmax_model():
    rng = np.random.default_rng(0)
    w = rng.standard_normal((6, 4)).astype(np.float32)
    nodes = [helper.make_node("MatMul", ["x", "w"], ["h"], name="mm"),
             helper.make_node("Softmax", ["h"], ["p"], name="sm", axis=1)]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT,
                                                                     ["N", 6])],
                          [helper.make_tensor_value_info("p", TensorProto.FLOAT, ["N", 4])],
                          [numpy_helper.from_array(w, "w")])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 11)])
    m.ir_version = 6
    return m


def test_mixed_opsets_are_converted_to_one():
    """An opset-11 import (Softmax-11) plus layers recorded at opset 17."""

    class Head(sonnx.SONNXModel):
        def __init__(self, proto):
            super().__init__(proto)
            self.fc = layer.Linear(4, 3)

        def forward(self, x):
            return autograd.relu(self.fc(super().forward(x)[0]))

    m = Head(_opset11_softmax_model())
    m.eval()
    x = np.random.default_rng(3).standard_normal((2, 6)).astype(np.float32)
    y = m.forward(tensor.from_numpy(x))
    proto = sonnx.to_onnx([tensor.from_numpy(x)], [y])
    assert proto.opset_import[0].version == 17
    onnx.checker.check_model(proto)
    close(run_ort(proto, x)[0], y.numpy())


def test_export_errors():
    w = tensor.Tensor(data=np.ones((2, 2), np.float32), requires_grad=True, stores_grad=True)
    x = tensor.PlaceHolder((1, 2))
    with autograd.inference_mode():
        hidden = autograd.relu(w)  # not recorded
    y = autograd.matmul(x, hidden)
    with pytest.raises(ExportError, match="inference_mode"):
        sonnx.to_onnx([x], [y])
    y = autograd.matmul(x, w)
    with pytest.raises(ExportError, match="dynamic_axes names"):
        sonnx.to_onnx([x], [y], dynamic_axes={"nope": {0: "b"}})
    with pytest.raises(ExportError, match="axis 3 does not exist"):
        sonnx.to_onnx([x], [y], input_names=["x"], dynamic_axes={"x": [3]})
    with pytest.raises(ExportError, match="must be Tensors"):
        sonnx.to_onnx([x], [np.zeros(2)])
    s = tensor.from_numpy(np.array([1, 2], dtype="datetime64[s]"))
    with pytest.raises(ExportError, match="no element type"):
        sonnx.to_onnx([s], [s])


def test_outputs_that_are_inputs_or_parameters_become_identity():
    w = tensor.Tensor(data=np.ones((2, 2), np.float32), requires_grad=True, stores_grad=True,
                      name="w")
    x = tensor.PlaceHolder((2, 2), name="x")
    y = x + w
    proto = sonnx.to_onnx([x], [y, x, w], output_names=["y", "x_again", "w_out"])
    onnx.checker.check_model(proto)
    xs = np.arange(4, dtype=np.float32).reshape(2, 2)
    outs = run_ort(proto, xs)
    close(outs[0], xs + 1)
    close(outs[1], xs)
    close(outs[2], np.ones((2, 2)))
