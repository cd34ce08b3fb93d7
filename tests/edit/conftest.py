"""Models the edit tests work on: real torch.onnx exports (ResNet-18 at 64x64, the BERT-like
and GPT-2-like models of ``tests/helpers/torch_models.py``, with a dynamic batch and with the
batch baked in), a tiny ViT-like export baked at batch 2 (expand + concat + a folded zeros
tensor), a Paddle-style graph built by hand with paddle2onnx's names and ops, and a
scikit-learn pipeline converted by skl2onnx. Each is made once per session."""

from __future__ import annotations

import io
import warnings

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from tests.conftest import TORCH_SKIP_REASON


@pytest.fixture(scope="session")
def exports(torch_exports):
    pytest.importorskip("torch", reason=TORCH_SKIP_REASON)
    return _Exports(torch_exports)


class _Exports:
    """Exports made once per session; the torch models come from the suite's own cache
    (``torch_exports``, tests/conftest.py), so they are built once for all tests."""

    def __init__(self, torch_exports=None):
        self._cache: dict = {}
        self._torch = torch_exports

    def _get(self, key, make):
        if key not in self._cache:
            self._cache[key] = make()
        m = onnx.ModelProto()
        m.CopyFrom(self._cache[key])
        return m

    def torch_model(self, name):
        if self._torch is not None:
            return self._torch.model(name)[0]
        from tests.helpers import torch_models  # noqa: PLC0415
        key = ("torch", name)
        if key not in self._cache:
            self._cache[key] = torch_models.build(name)
        return self._cache[key][0]

    def transformer(self, name: str, baked: bool) -> onnx.ModelProto:
        """``bert`` / ``gpt2`` exported at batch 1, sequence 8; ``baked``: no dynamic axes."""
        from tests.helpers import torch_models  # noqa: PLC0415

        def make():
            model = self.torch_model(name)
            example = tuple(__import__("torch").from_numpy(a)
                            for a in torch_models.example_inputs(name, 1, seq=8))
            return torch_models.export_onnx(model, example, None, opset=17,
                                            dynamic_batch=not baked)
        return self._get((name, baked), make)

    def resnet(self, baked: bool = False) -> onnx.ModelProto:
        """ResNet-18 exported on 64x64 images (dynamic batch unless ``baked``)."""
        from tests.helpers import torch_models  # noqa: PLC0415

        def make():
            torch = __import__("torch")
            model = self.torch_model("resnet18")
            x = torch.from_numpy(torch_models.example_inputs("resnet18", 1, image=64)[0])
            return torch_models.export_onnx(model, (x,), None, opset=17,
                                            dynamic_batch=not baked)
        return self._get(("resnet", baked), make)

    def vit(self) -> onnx.ModelProto:
        """A ViT-like classifier exported at batch 2, nothing dynamic: the class token is
        ``expand``-ed to the batch and concatenated, ``torch.zeros(b, 16)`` is folded to a
        [2, 16] constant, ``view(b, -1)`` is a Reshape to [2, -1]."""
        return self._get(("vit",), _export_vit)

    def vit_torch(self):
        self.vit()
        return _VIT[0]


_VIT: list = []


def _export_vit() -> onnx.ModelProto:
    import torch  # noqa: PLC0415

    torch.manual_seed(0)

    class TinyViT(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.patch = torch.nn.Conv2d(3, 16, 4, 4)
            self.cls = torch.nn.Parameter(torch.randn(1, 1, 16))
            self.pos = torch.nn.Parameter(torch.randn(1, 17, 16))
            self.head = torch.nn.Linear(16, 5)

        def forward(self, x):
            b = x.size(0)
            p = self.patch(x).flatten(2).transpose(1, 2)
            t = torch.cat([self.cls.expand(b, -1, -1), p], 1) + self.pos
            h = torch.zeros(b, 16) + t.mean(1)
            return self.head(h.view(b, -1))

    model = TinyViT().eval()
    _VIT[:] = [model]
    buf = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(model, (torch.randn(2, 3, 16, 16),), buf, input_names=["x"],
                          output_names=["y"], opset_version=17, dynamo=False)
    return onnx.load_from_string(buf.getvalue())


def torch_run(model, *arrays):
    import torch  # noqa: PLC0415
    with torch.no_grad():
        out = model(*(torch.from_numpy(np.ascontiguousarray(a)) for a in arrays))
    out = out if isinstance(out, (tuple, list)) else (out,)
    return [o.numpy() for o in out]


# ---------------------------------------------------------------------------- Paddle style
def paddle_style() -> onnx.ModelProto:
    """A small CNN classifier written the way paddle2onnx writes graphs: ``p2o.<Op>.<n>`` node
    names, ``<layer>.tmp_<n>`` values, ``conv2d_0.w_0`` / ``batch_norm_0.w_1`` weights, the
    batch as ``p2o.DynamicDimension.0``, a Reshape to ``[0, -1]`` and a Scale written as
    Mul + Add of constants, ending in a Softmax."""
    rng = np.random.default_rng(0)

    def w(name, *shape, scale=0.2):
        return numpy_helper.from_array((rng.standard_normal(shape) * scale).astype(np.float32),
                                       name)
    inits = [
        w("conv2d_0.w_0", 8, 3, 3, 3), w("conv2d_0.b_0", 8),
        numpy_helper.from_array(rng.uniform(0.5, 1.5, 8).astype(np.float32),
                                "batch_norm_0.w_0"),
        w("batch_norm_0.b_0", 8),
        w("batch_norm_0.w_1", 8, scale=0.1),
        numpy_helper.from_array(rng.uniform(0.5, 1.5, 8).astype(np.float32),
                                "batch_norm_0.w_2"),
        w("linear_0.w_0", 8, 4), w("linear_0.b_0", 4),
        numpy_helper.from_array(np.array([0, -1], np.int64), "p2o.helper.constant.0"),
        numpy_helper.from_array(np.array(0.5, np.float32), "p2o.helper.constant.1"),
        numpy_helper.from_array(np.array(0.1, np.float32), "p2o.helper.constant.2"),
    ]
    nodes = [
        helper.make_node("Conv", ["x", "conv2d_0.w_0", "conv2d_0.b_0"], ["conv2d_1.tmp_0"],
                         name="p2o.Conv.0", pads=[1, 1, 1, 1], strides=[1, 1]),
        helper.make_node("BatchNormalization",
                         ["conv2d_1.tmp_0", "batch_norm_0.w_0", "batch_norm_0.b_0",
                          "batch_norm_0.w_1", "batch_norm_0.w_2"], ["batch_norm_0.tmp_2"],
                         name="p2o.BatchNormalization.0", epsilon=1e-5),
        helper.make_node("Relu", ["batch_norm_0.tmp_2"], ["relu_0.tmp_0"], name="p2o.Relu.0"),
        helper.make_node("GlobalAveragePool", ["relu_0.tmp_0"], ["pool2d_0.tmp_0"],
                         name="p2o.GlobalAveragePool.0"),
        helper.make_node("Reshape", ["pool2d_0.tmp_0", "p2o.helper.constant.0"],
                         ["reshape2_0.tmp_0"], name="p2o.Reshape.0"),
        helper.make_node("MatMul", ["reshape2_0.tmp_0", "linear_0.w_0"], ["linear_1.tmp_0"],
                         name="p2o.MatMul.0"),
        helper.make_node("Add", ["linear_1.tmp_0", "linear_0.b_0"], ["linear_1.tmp_1"],
                         name="p2o.Add.0"),
        helper.make_node("Mul", ["linear_1.tmp_1", "p2o.helper.constant.1"], ["scale_0.tmp_0"],
                         name="p2o.Mul.0"),
        helper.make_node("Add", ["scale_0.tmp_0", "p2o.helper.constant.2"], ["scale_0.tmp_1"],
                         name="p2o.Add.1"),
        helper.make_node("Softmax", ["scale_0.tmp_1"], ["softmax_0.tmp_0"],
                         name="p2o.Softmax.0", axis=-1),
    ]
    dyn = "p2o.DynamicDimension.0"
    g = helper.make_graph(nodes, "paddle-inference",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT,
                                                         [dyn, 3, 16, 16])],
                          [helper.make_tensor_value_info("softmax_0.tmp_0", TensorProto.FLOAT,
                                                         [dyn, 4])], inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 11)],
                          producer_name="PaddlePaddle")
    m.ir_version = 7
    return m


@pytest.fixture
def paddle():
    return paddle_style()


# ---------------------------------------------------------------------------- scikit-learn
@pytest.fixture(scope="session")
def sklearn_pipeline():
    """(pipeline, ModelProto, X): StandardScaler + LogisticRegression on iris, converted by
    skl2onnx (Scaler, LinearClassifier, Normalizer, Cast, ZipMap)."""
    pytest.importorskip("skl2onnx", reason="skl2onnx converts the scikit-learn pipeline")
    from skl2onnx import to_onnx  # noqa: PLC0415
    from sklearn.datasets import load_iris  # noqa: PLC0415
    from sklearn.linear_model import LogisticRegression  # noqa: PLC0415
    from sklearn.pipeline import make_pipeline  # noqa: PLC0415
    from sklearn.preprocessing import StandardScaler  # noqa: PLC0415

    X, y = load_iris(return_X_y=True)
    X = X.astype(np.float32)
    pipe = make_pipeline(StandardScaler(), LogisticRegression(max_iter=500)).fit(X, y)
    m = to_onnx(pipe, X[:1], target_opset={"": 17, "ai.onnx.ml": 3})
    return pipe, m, X


@pytest.fixture
def digits():
    """The embedded digits CNN (the workbench's default model)."""
    import os  # noqa: PLC0415

    import workbench  # noqa: PLC0415
    return os.path.join(os.path.dirname(workbench.__file__), "data", "default_model.onnx")


def model_bytes(session) -> bytes:
    return session.model.SerializeToString(deterministic=True)


def ort_run(model: onnx.ModelProto, feeds: dict) -> list:
    ort = pytest.importorskip("onnxruntime", reason="onnxruntime is the oracle here")
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run(None, feeds)
