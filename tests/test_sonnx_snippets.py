"""The SINGA ONNX page's snippets, run with only the import line changed.

The snippets are copied verbatim from the SINGA documentation page ("ONNX", version 3.2.0)
and every ``from singa import ...`` line is replaced by the one line
``from workbench import device, tensor, sonnx, opt, autograd, layer``. The names the page
leaves undefined (``INPUT``, ``tx``, ``graph``) are given values in the namespace the snippets
run in, the model file is written where the snippet's placeholder path points (relative to a
temporary working folder), and on a machine without a GPU ``device.create_cuda_gpu`` is
monkeypatched to return the CPU (a GPU-marked test runs them untouched on CUDA).
"""

from __future__ import annotations

import re

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import workbench.device as wb_device
from workbench import opt, tensor
from workbench.errors import WorkbenchError

IMPORT_LINE = "from workbench import device, tensor, sonnx, opt, autograd, layer"

LOAD = r"""
import onnx
from singa import device
from singa import sonnx

class MyModel(sonnx.SONNXModel):

    def __init__(self, onnx_model):
        super(MyModel, self).__init__(onnx_model)

    def forward(self, *x):
        y = super(MyModel, self).forward(*x)
        # Since SINGA model returns the output as a list,
        # if there is only one output,
        # you just need to take the first element.
        return y[0]

    def train_one_batch(self, x, y):
        pass

model_path = "PATH/To/ONNX/MODEL"
onnx_model = onnx.load(model_path)

# convert onnx model into SINGA model
dev = device.create_cuda_gpu()
x = tensor.PlaceHolder(INPUT.shape, device=dev)
model = MyModel(onnx_model)
model.compile([x], is_train=False, use_graph=True, sequential=True)
"""

INFERENCE = r"""
x = tensor.Tensor(device=dev, data=INPUT)
y = model.forward(x)
"""

SAVE = r"""
# x is the input tensor, y is the output tensor
sonnx.to_onnx([x], [y])
"""

RETRAIN = r"""
from singa import opt
from singa import autograd

class MyModel(sonnx.SONNXModel):

    def __init__(self, onnx_model):
        super(MyModel, self).__init__(onnx_model)

    def forward(self, *x):
        y = super(MyModel, self).forward(*x)
        return y[0]

    def train_one_batch(self, x, y, dist_option, spars):
        out = self.forward(x)
        loss = autograd.softmax_cross_entropy(out, y)
        if dist_option == 'fp32':
            self.optimizer.backward_and_update(loss)
        elif dist_option == 'fp16':
            self.optimizer.backward_and_update_half(loss)
        elif dist_option == 'partialUpdate':
            self.optimizer.backward_and_partial_update(loss)
        elif dist_option == 'sparseTopK':
            self.optimizer.backward_and_sparse_update(loss,
                                                      topK=True,
                                                      spars=spars)
        elif dist_option == 'sparseThreshold':
            self.optimizer.backward_and_sparse_update(loss,
                                                      topK=False,
                                                      spars=spars)
        return out, loss

    def set_optimizer(self, optimizer):
        self.optimizer = optimizer

sgd = opt.SGD(lr=0.005, momentum=0.9, weight_decay=1e-5)
model.set_optimizer(sgd)
model.compile([tx], is_train=True, use_graph=graph, sequential=True)
"""

TRANSFER = r"""
from singa import opt
from singa import autograd

class MyModel(sonnx.SONNXModel):

    def __init__(self, onnx_model):
        super(MyModel, self).__init__(onnx_model)
        self.linear = layer.Linear(1000, 3)

    def forward(self, *x):
        # cut off after the last third layer
        # and append a linear layer
        y = super(MyModel, self).forward(*x, last_layers=-3)[0]
        y = self.linear(y)
        return y

    def train_one_batch(self, x, y, dist_option, spars):
        out = self.forward(x)
        loss = autograd.softmax_cross_entropy(out, y)
        if dist_option == 'fp32':
            self.optimizer.backward_and_update(loss)
        elif dist_option == 'fp16':
            self.optimizer.backward_and_update_half(loss)
        elif dist_option == 'partialUpdate':
            self.optimizer.backward_and_partial_update(loss)
        elif dist_option == 'sparseTopK':
            self.optimizer.backward_and_sparse_update(loss,
                                                      topK=True,
                                                      spars=spars)
        elif dist_option == 'sparseThreshold':
            self.optimizer.backward_and_sparse_update(loss,
                                                      topK=False,
                                                      spars=spars)
        return out, loss

    def set_optimizer(self, optimizer):
        self.optimizer = optimizer

sgd = opt.SGD(lr=0.005, momentum=0.9, weight_decay=1e-5)
model.set_optimizer(sgd)
model.compile([tx], is_train=True, use_graph=graph, sequential=True)
"""


def port(src: str) -> str:
    """Replace the ``from singa import ...`` lines by the one workbench import line."""
    out, done = [], False
    for line in src.splitlines():
        if re.match(r"\s*from singa import ", line):
            if not done:
                out.append(IMPORT_LINE)
                done = True
            continue
        out.append(line)
    return "\n".join(out) + "\n"


def small_cnn_proto(seed: int = 0, opset: int = 11) -> onnx.ModelProto:
    """data (N,1,8,8) -> Conv -> BatchNorm -> Relu -> MaxPool -> Dropout -> Flatten ->
    Gemm(1000) -> Relu -> Gemm(10): the last three nodes make last_layers=-3 a 1000-d
    feature vector, as in the page's transfer-learning example."""
    rng = np.random.default_rng(seed)

    def f(*shape, scale=1.0):
        return (rng.standard_normal(shape) * scale).astype(np.float32)

    inits = {
        "conv_w": f(8, 1, 3, 3, scale=0.5), "conv_b": f(8, scale=0.1),
        "bn_scale": (1 + f(8, scale=0.1)), "bn_bias": f(8, scale=0.1),
        "bn_mean": f(8, scale=0.1), "bn_var": (1 + np.abs(f(8, scale=0.2))),
        "fc1_w": f(1000, 128, scale=0.05), "fc1_b": f(1000, scale=0.01),
        "fc2_w": f(10, 1000, scale=0.03), "fc2_b": f(10, scale=0.01),
    }
    nodes = [
        helper.make_node("Conv", ["data", "conv_w", "conv_b"], ["c1"], name="conv1",
                         pads=[1, 1, 1, 1], kernel_shape=[3, 3]),
        helper.make_node("BatchNormalization", ["c1", "bn_scale", "bn_bias", "bn_mean",
                                                "bn_var"], ["b1"], name="bn1"),
        helper.make_node("Relu", ["b1"], ["r1"], name="relu1"),
        helper.make_node("MaxPool", ["r1"], ["p1"], name="pool1", kernel_shape=[2, 2],
                         strides=[2, 2]),
        helper.make_node("Dropout", ["p1"], ["d1"], name="drop1", ratio=0.1),
        helper.make_node("Flatten", ["d1"], ["f1"], name="flatten1"),
        helper.make_node("Gemm", ["f1", "fc1_w", "fc1_b"], ["g1"], name="fc1", transB=1),
        helper.make_node("Relu", ["g1"], ["r2"], name="relu2"),
        helper.make_node("Gemm", ["r2", "fc2_w", "fc2_b"], ["logits"], name="fc2", transB=1),
    ]
    graph = helper.make_graph(
        nodes, "small_cnn",
        [helper.make_tensor_value_info("data", TensorProto.FLOAT, ["N", 1, 8, 8])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["N", 10])],
        [numpy_helper.from_array(v, k) for k, v in inits.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 6
    onnx.checker.check_model(model)
    return model


def digits_batch(n=16, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, 1, 8, 8)).astype(np.float32)
    y = rng.integers(0, 3, size=n).astype(np.int32)
    return x, y


SEED = 0


@pytest.fixture
def singa_ns(tmp_path, monkeypatch):
    """Namespace for the snippets: the model file at the page's placeholder path, INPUT."""
    proto = small_cnn_proto()
    (tmp_path / "PATH" / "To" / "ONNX").mkdir(parents=True)
    onnx.save(proto, str(tmp_path / "PATH" / "To" / "ONNX" / "MODEL"))
    monkeypatch.chdir(tmp_path)
    if not wb_device.cuda_available():
        monkeypatch.setattr(wb_device, "create_cuda_gpu", lambda *a, **k: wb_device.create_cpu())
    x, _ = digits_batch()
    wb_device.seed_host(0)  # the layers' initial weights do not depend on the tests run before
    return {"INPUT": x, "__name__": "singa_snippet"}, proto


def run(src: str, ns: dict, name: str) -> None:
    exec(compile(port(src), f"<SINGA snippet {name}>", "exec"), ns)


def _ort(proto, x):
    ort = pytest.importorskip("onnxruntime")
    s = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])
    return s.run(None, {s.get_inputs()[0].name: x})[0]


def test_port_changes_only_the_import_lines():
    ported = port(LOAD)
    assert IMPORT_LINE in ported
    assert "singa" not in ported.replace("SINGA", "")
    kept = [ln for ln in LOAD.splitlines() if not ln.startswith("from singa")]
    assert [ln for ln in ported.splitlines() if ln != IMPORT_LINE] == kept


def test_load_inference_and_save_snippets(singa_ns):
    ns, proto = singa_ns
    run(LOAD, ns, "load")
    run(INFERENCE, ns, "inference")
    y = ns["y"]
    assert isinstance(y, tensor.Tensor) and y.shape == (16, 10)
    np.testing.assert_allclose(tensor.to_numpy(y), _ort(proto, ns["INPUT"]), rtol=1e-4,
                               atol=1e-5)
    run(SAVE, ns, "save")
    exported = ns["sonnx"].to_onnx([ns["x"]], [ns["y"]])
    onnx.checker.check_model(exported)
    np.testing.assert_allclose(_ort(exported, ns["INPUT"]), tensor.to_numpy(y), rtol=1e-4,
                               atol=1e-5)


def test_save_snippet_with_the_placeholder_of_compile(singa_ns):
    """The page exports with the PlaceHolder given to compile and y from real data."""
    ns, proto = singa_ns
    run(LOAD, ns, "load")
    placeholder = ns["x"]
    run(INFERENCE, ns, "inference")
    exported = ns["sonnx"].to_onnx([placeholder], [ns["y"]])
    assert [i.name for i in exported.graph.input] == ["input"]
    np.testing.assert_allclose(_ort(exported, ns["INPUT"]), tensor.to_numpy(ns["y"]),
                               rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("graph", [False, True], ids=["eager", "graph"])
def test_retraining_snippet(singa_ns, graph):
    ns, proto = singa_ns
    run(LOAD, ns, "load")
    x, y = digits_batch()
    ns["tx"] = tensor.PlaceHolder(x.shape, device=ns["dev"])
    ns["graph"] = graph
    run(RETRAIN, ns, "re-training")
    model = ns["MyModel"](ns["onnx_model"])
    model.set_optimizer(opt.SGD(lr=0.05, momentum=0.9, weight_decay=1e-5))
    model.compile([ns["tx"]], is_train=True, use_graph=graph, sequential=True)
    tx = tensor.Tensor(device=ns["dev"], data=x)
    ty = tensor.Tensor(device=ns["dev"], data=y)
    losses = []
    for _ in range(8):
        out, loss = model(tx, ty, "fp32", None)
        losses.append(tensor.to_numpy(loss).item())
    assert out.shape == (16, 10)
    assert losses[-1] < 0.5 * losses[0], losses
    # the running statistics of the imported BatchNormalization were updated in training
    assert not np.allclose(model.get_states()["bn_mean"].numpy(),
                           numpy_helper.to_array(proto.graph.initializer[4]))
    out, loss = model(tx, ty, "fp16", None)  # mixed-precision branch: loss-scaled step
    assert np.isfinite(tensor.to_numpy(loss).item())
    for option in ("partialUpdate", "sparseTopK", "sparseThreshold"):
        with pytest.raises(WorkbenchError, match="DistOpt"):
            model(tx, ty, option, 0.05)


@pytest.mark.parametrize("graph", [False, True], ids=["eager", "graph"])
def test_transfer_learning_snippet(singa_ns, graph):
    ns, proto = singa_ns
    run(LOAD, ns, "load")
    ns["dev"].SetRandSeed(SEED)   # the appended Linear's initial weights: not test-order's
    x, y = digits_batch()
    ns["tx"] = tensor.PlaceHolder(x.shape, device=ns["dev"])
    ns["graph"] = graph
    run(TRANSFER, ns, "transfer-learning")
    model = ns["MyModel"](ns["onnx_model"])
    model.set_optimizer(opt.SGD(lr=0.02, momentum=0.9, weight_decay=1e-5))
    model.compile([ns["tx"]], is_train=True, use_graph=graph, sequential=True)
    tx = tensor.Tensor(device=ns["dev"], data=x)
    ty = tensor.Tensor(device=ns["dev"], data=y)
    losses = []
    for _ in range(10):
        out, loss = model(tx, ty, "fp32", None)
        losses.append(tensor.to_numpy(loss).item())
    assert out.shape == (16, 3)  # Linear(1000, 3) appended after last_layers=-3
    assert losses[-1] < 0.5 * losses[0], losses
    assert "linear.W" in model.get_params() and model.get_params()["linear.W"].shape == (
        1000, 3)


@pytest.mark.gpu
@pytest.mark.skipif(not wb_device.cuda_available(), reason="needs a CUDA GPU and cupy")
def test_snippets_verbatim_on_cuda(tmp_path, monkeypatch):
    proto = small_cnn_proto()
    (tmp_path / "PATH" / "To" / "ONNX").mkdir(parents=True)
    onnx.save(proto, str(tmp_path / "PATH" / "To" / "ONNX" / "MODEL"))
    monkeypatch.chdir(tmp_path)
    x, y = digits_batch()
    ns = {"INPUT": x}
    run(LOAD, ns, "load")
    run(INFERENCE, ns, "inference")
    assert ns["dev"].is_cuda
    np.testing.assert_allclose(tensor.to_numpy(ns["y"]), _ort(proto, x), rtol=1e-3, atol=1e-4)
    run(SAVE, ns, "save")
    ns["tx"] = tensor.PlaceHolder(x.shape, device=ns["dev"])
    ns["graph"] = True
    run(TRANSFER, ns, "transfer-learning")
    model = ns["MyModel"](ns["onnx_model"])
    model.set_optimizer(opt.SGD(lr=0.02, momentum=0.9))
    model.compile([ns["tx"]], is_train=True, use_graph=True, sequential=True)
    tx = tensor.Tensor(device=ns["dev"], data=x)
    ty = tensor.Tensor(device=ns["dev"], data=y)
    first = tensor.to_numpy(model(tx, ty, "fp32", None)[1]).item()
    for _ in range(8):
        out, loss = model(tx, ty, "fp32", None)
    assert tensor.to_numpy(loss).item() < first
