"""Whole graphs on a device: the conformance subset of the ops that have CUDA kernels, a small
CNN and a LayerNorm/GELU block cross-checked against the CPU path (and onnxruntime), memory
tracking, feeds on the wrong device, and the gradient rules on the GPU.

``device`` runs on CPU and CUDA:0 (skipped without a GPU); ``emulated_cuda`` runs the same
graphs through a CUDA-device Plan whose cupy is the numpy stand-in of ``tests/gpu/emulation.py``
(our kernels' C compiled for the CPU), so the dispatch and the overrides are exercised here too.
"""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import workbench.backend as backend
from tests.gpu import emulation
from workbench import conformance
from workbench import device as wbdevice
from workbench.arrays import device as engine_device
from workbench.runtime import placement

PATTERNS = ["test_conv_", "test_convtranspose", "test_maxpool", "test_averagepool",
            "test_batchnorm", "test_layer_normalization", "test_softmax", "test_logsoftmax",
            "test_gelu", "test_erf", "test_sce_", "test_relu", "test_globalaveragepool"]


@pytest.fixture
def emulated_cuda(monkeypatch):
    """A 'CUDA:0' Device whose array module is the numpy stand-in (no GPU involved)."""
    if emulation.GXX is None:
        pytest.skip("g++ is not installed (needed to emulate the CUDA kernels)")
    fake = emulation.install(monkeypatch)
    dev = wbdevice.Device("CUDA", 0)
    # the engine's devices (workbench.arrays.device): Device.xp and get_device("CUDA:0")
    monkeypatch.setattr(engine_device, "cupy_module", lambda: fake)
    monkeypatch.setattr(engine_device, "cuda", lambda index=0: dev)
    # arrays are numpy arrays here, so the feed-placement check cannot tell them apart
    monkeypatch.setattr(placement, "check_feed_device", lambda *a: None)
    return dev


def _run_subset(dev_name):
    expected = conformance.load_expected_failures()
    bad = []
    cases = conformance.collect(PATTERNS)
    assert len(cases) > 150
    for case in cases:
        r = conformance.run_case(case, dev_name)
        if not r.ok and case.name not in expected:
            bad.append(f"{case.name}: {r.message}")
    assert not bad, f"{len(bad)} of {len(cases)} cases failed on {dev_name}:\n" + "\n".join(bad)


def test_conformance_subset_on_device(device):
    _run_subset(str(device))


def test_conformance_subset_emulated_cuda(emulated_cuda):
    _run_subset("CUDA:0")


# ----------------------------------------------------------------------------- models
def _init(name, arr):
    return numpy_helper.from_array(np.asarray(arr), name)


def small_cnn(batch=2, seed=0):
    """Conv-BN-Relu, MaxPool, BN, depthwise Conv, 1x1 Conv, AveragePool, Gemm, Softmax."""
    r = np.random.default_rng(seed)
    f = lambda *s: (r.standard_normal(s) * 0.3).astype(np.float32)  # noqa: E731
    inits = [
        _init("w1", f(8, 3, 3, 3)), _init("b1", f(8)),
        _init("g1", r.uniform(0.5, 1.5, 8).astype(np.float32)), _init("be1", f(8)),
        _init("m1", f(8)), _init("v1", r.uniform(0.5, 1.5, 8).astype(np.float32)),
        _init("g2", r.uniform(0.5, 1.5, 8).astype(np.float32)), _init("be2", f(8)),
        _init("m2", f(8)), _init("v2", r.uniform(0.5, 1.5, 8).astype(np.float32)),
        _init("wd", f(16, 1, 3, 3)), _init("w3", f(12, 16, 1, 1)), _init("b3", f(12)),
        _init("wf", f(10, 12 * 4 * 4)), _init("bf", f(10)),
        _init("shape", np.array([0, -1], np.int64)),
    ]
    n = helper.make_node
    nodes = [
        n("Conv", ["x", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1], name="conv1"),
        n("BatchNormalization", ["c1", "g1", "be1", "m1", "v1"], ["bn1"], name="bn1"),
        n("Relu", ["bn1"], ["r1"], name="relu1"),
        n("MaxPool", ["r1"], ["p1"], kernel_shape=[2, 2], strides=[2, 2], name="pool1"),
        n("BatchNormalization", ["p1", "g2", "be2", "m2", "v2"], ["bn2"], name="bn2"),
        n("Conv", ["bn2", "wd"], ["dw"], group=8, pads=[1, 1, 1, 1], strides=[1, 1],
          name="depthwise"),
        n("Conv", ["dw", "w3", "b3"], ["c3"], name="pointwise"),
        n("AveragePool", ["c3"], ["p2"], kernel_shape=[3, 3], strides=[2, 2],
          pads=[1, 1, 1, 1], name="pool2"),
        n("Reshape", ["p2", "shape"], ["flat"], name="flatten"),
        n("Gemm", ["flat", "wf", "bf"], ["logits"], transB=1, name="fc"),
        n("Softmax", ["logits"], ["y"], axis=-1, name="softmax"),
    ]
    g = helper.make_graph(nodes, "small_cnn",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT,
                                                         [batch, 3, 16, 16])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [batch, 10])],
                          inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    return m, r.standard_normal((batch, 3, 16, 16)).astype(np.float32)


def ln_gelu_block(seed=1):
    """MatMul -> LayerNormalization -> Gelu -> MatMul -> LogSoftmax (opset 20)."""
    r = np.random.default_rng(seed)
    f = lambda *s: (r.standard_normal(s) * 0.5).astype(np.float32)  # noqa: E731
    inits = [_init("w1", f(16, 32)), _init("s", f(32)), _init("b", f(32)),
             _init("w2", f(32, 7))]
    n = helper.make_node
    nodes = [n("MatMul", ["x", "w1"], ["h"]),
             n("LayerNormalization", ["h", "s", "b"], ["ln"], axis=-1),
             n("Gelu", ["ln"], ["ge"]),
             n("MatMul", ["ge", "w2"], ["o"]),
             n("LogSoftmax", ["o"], ["y"], axis=-1)]
    g = helper.make_graph(nodes, "ln_gelu",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3, 5, 16])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3, 5, 7])],
                          inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 20)])
    m.ir_version = 9
    return m, r.standard_normal((3, 5, 16)).astype(np.float32)


MODELS = {"small_cnn": small_cnn, "ln_gelu": ln_gelu_block}


def _cross_check(name, dev_name):
    model, x = MODELS[name]()
    ref = backend.prepare(model, "CPU").run([x])[0]
    rep = backend.prepare(model, dev_name)
    got = rep.run([x])[0]
    assert isinstance(got, np.ndarray)
    np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-5)
    if name == "small_cnn":
        ort = pytest.importorskip("onnxruntime")
        sess = ort.InferenceSession(model.SerializeToString(),
                                    providers=["CPUExecutionProvider"])
        np.testing.assert_allclose(got, sess.run(None, {"x": x})[0], rtol=1e-4, atol=1e-5)
    return rep


@pytest.mark.parametrize("name", sorted(MODELS))
def test_model_on_device_matches_cpu(device, name):
    _cross_check(name, str(device))


@pytest.mark.parametrize("name", sorted(MODELS))
def test_model_on_emulated_cuda_uses_the_overrides(emulated_cuda, name, monkeypatch):
    from workbench.ops import cuda as ov

    def no_fallback(*a, **k):
        raise AssertionError(f"override fell back to the portable kernel: {a}")
    monkeypatch.setattr(ov, "portable", no_fallback)
    rep = _cross_check(name, "CUDA:0")
    mods = {s.fn.__module__ for s in rep.plan.steps}
    assert "workbench.ops.cuda" in mods


def test_real_model_on_cuda(cuda, torch_exports):
    proto = torch_exports.proto("resnet18")
    from tests.helpers.torch_models import example_inputs
    x, = example_inputs("resnet18", batch=2)
    ref = backend.prepare(proto, "CPU").run([x])[0]
    got = backend.prepare(proto, str(cuda)).run([x])[0]
    scale = float(np.abs(ref).max())
    np.testing.assert_allclose(got, ref, rtol=1e-3, atol=1e-3 * scale)


# ----------------------------------------------------------------------------- device rules
def test_plan_on_cuda_keeps_arrays_on_the_gpu_and_tracks_memory(cuda):
    import cupy as cp
    model, x = small_cnn()
    rep = backend.prepare(model, str(cuda))
    host = {rep.plan.slots[n] for n in rep.plan.host_shape_values if n in rep.plan.slots}
    assert host == {rep.plan.slots["shape"]}   # the Reshape target stays a host value
    for i, v in enumerate(rep.plan._template):
        if hasattr(v, "dtype"):
            assert isinstance(v, np.ndarray if i in host else cp.ndarray), i
    rep.plan.track_memory = True
    cuda.reset_peak()
    y, = rep.plan.run([cuda.put(x)])
    assert isinstance(y, cp.ndarray)
    assert rep.plan.last_peak_bytes > 0
    info = cuda.memory_info()
    assert info["peak_bytes"] >= rep.plan.last_peak_bytes > 0
    assert info["total_bytes"] > 0


def test_cuda_plan_refuses_host_feeds_naming_both_devices(cuda):
    from workbench.errors import DeviceError
    model, x = small_cnn()
    rep = backend.prepare(model, str(cuda))
    with pytest.raises(DeviceError, match=r"input 'x' is on CPU but the plan runs on CUDA:0"):
        rep.plan.run([x])
    cpu = backend.prepare(model, "CPU")
    with pytest.raises(DeviceError, match=r"input 'x' is on CUDA:0 but the plan runs on CPU"):
        cpu.plan.run([cuda.put(x)])


def test_out_of_memory_on_cuda_is_a_device_error(cuda):
    import cupy as cp

    from workbench.errors import DeviceError
    free, total = cp.cuda.runtime.memGetInfo()
    n = int(total // 4 * 2)                      # 2x the GPU's memory in float32
    m = helper.make_model(helper.make_graph(
        [helper.make_node("ConstantOfShape", ["s"], ["y"], name="huge",
                          value=numpy_helper.from_array(np.zeros(1, np.float32)))], "g",
        [helper.make_tensor_value_info("s", TensorProto.INT64, [1])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n"])]),
        opset_imports=[helper.make_opsetid("", 17)])
    rep = backend.prepare(m, str(cuda))
    with pytest.raises(DeviceError, match=r"out of memory on CUDA:0 in node 'huge'") as ei:
        rep.run([np.array([n], np.int64)])
    assert ei.value.bytes_requested and ei.value.bytes_requested >= n * 4


# ----------------------------------------------------------------------------- gradients
def _grad_cases():
    try:
        from tests.autograd import test_grad_rules as g
    except Exception:  # pragma: no cover - the autograd package is not there
        return []
    return g.CASES


GRAD_CASES = _grad_cases()


@pytest.mark.parametrize("case", GRAD_CASES, ids=[c.id for c in GRAD_CASES])
def test_gradient_rule_on_cuda_matches_cpu(cuda, case):
    """The gradient rules run on cupy arrays and give the CPU's (finite-difference-checked)
    gradients; reuses the autograd helper's cases."""
    from tests.autograd.test_grad_rules import R
    from workbench import autograd
    from workbench.autodiff import run_rule
    from workbench.ops.registry import has_kernel
    from workbench.tensor import Tensor
    if not has_kernel(case.op, "", case.opset):
        pytest.skip(f"no kernel for {case.op} at opset {case.opset}")

    def grads(dev, weights):
        arrays = [None if a is None else np.array(a) for a in case.inputs]
        ts = [None if a is None else Tensor(data=a, device=dev, requires_grad=i in case.wrt)
              for i, a in enumerate(arrays)]
        fn = None
        if case.fn == "batchnorm_train":
            from workbench.autodiff.rules.norm import batchnorm_train
            fn = batchnorm_train
        out = autograd.apply(case.op, ts, case.attrs, n_outputs=case.n_outputs,
                             opset=case.opset, fn=fn, training_mode=case.training)
        outs = out if isinstance(out, tuple) else (out,)
        gins = run_rule(outs[0].creator,
                        [None if w is None else dev.put(w) for w in weights])
        return [None if g is None else wbdevice.create_cpu().put(g) for g in gins]

    cpu = wbdevice.create_cpu()
    arrays = [None if a is None else np.asarray(a) for a in case.inputs]
    with_outs = autograd.apply(case.op, [None if a is None else Tensor(data=a)
                                         for a in arrays], case.attrs,
                               n_outputs=case.n_outputs, opset=case.opset,
                               training_mode=case.training)
    outs = with_outs if isinstance(with_outs, tuple) else (with_outs,)
    weights = [R.standard_normal(o.shape) if o.dtype == np.float64 and
               not (case.training and k > 0) else None for k, o in enumerate(outs)]
    want = grads(cpu, weights)
    got = grads(cuda, weights)
    for i in case.wrt:
        np.testing.assert_allclose(got[i], want[i], rtol=1e-6, atol=1e-8,
                                   err_msg=f"input {i}")


# ----------------------------------------------------------------------------- host shapes
def dynamic_reshape_model():
    """x (N, S, 8) -> Shape -> Gather(0), Gather(1) -> Unsqueeze -> Concat([N, S, 2, 4])
    -> Reshape -> Transpose -> Mul by a Cast of the sequence length; plus a Range of positions
    gathered from an embedding (a host value used as device data)."""
    n = helper.make_node
    inits = [_init("i0", np.array(0, np.int64)), _init("i1", np.array(1, np.int64)),
             _init("ax0", np.array([0], np.int64)), _init("tail", np.array([2, 4], np.int64)),
             _init("one", np.array(1, np.int64)),
             _init("emb", np.arange(40, dtype=np.float32).reshape(10, 4))]
    nodes = [
        n("Shape", ["x"], ["sh"], name="shape"),
        n("Gather", ["sh", "i0"], ["N"], name="g0"),
        n("Gather", ["sh", "i1"], ["S"], name="g1"),
        n("Unsqueeze", ["N", "ax0"], ["N1"], name="u0"),
        n("Unsqueeze", ["S", "ax0"], ["S1"], name="u1"),
        n("Concat", ["N1", "S1", "tail"], ["target"], axis=0, name="cat"),
        n("Reshape", ["x", "target"], ["r"], name="reshape"),
        n("Cast", ["S"], ["Sf"], to=TensorProto.FLOAT, name="cast"),
        n("Mul", ["r", "Sf"], ["scaled"], name="scale"),
        n("Range", ["i0", "S", "one"], ["pos"], name="range"),
        n("Gather", ["emb", "pos"], ["pe"], name="embed"),
    ]
    g = helper.make_graph(nodes, "dyn",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", "S", 8])],
                          [helper.make_tensor_value_info("scaled", TensorProto.FLOAT,
                                                         ["N", "S", 2, 4]),
                           helper.make_tensor_value_info("pe", TensorProto.FLOAT, ["S", 4])],
                          inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    return m, np.random.default_rng(3).standard_normal((2, 5, 8)).astype(np.float32)


def test_shape_logic_stays_on_the_host_in_device_plans(emulated_cuda):
    m, x = dynamic_reshape_model()
    rep = backend.prepare(m, "CUDA:0")
    hv = rep.plan.host_shape_values
    assert {"sh", "N", "S", "N1", "S1", "target", "Sf", "pos", "i0", "i1", "ax0",
            "tail", "one"} <= hv
    assert not {"x", "r", "scaled", "emb", "pe"} & hv
    host_ops = {st.node.name for st in rep.plan.steps if st.shape_on_host}
    assert host_ops == {"shape", "g0", "g1", "u0", "u1", "cat", "cast", "range"}
    got = rep.run([x])
    want = backend.prepare(m).run([x])
    for a, b in zip(got, want):
        np.testing.assert_allclose(a, b, rtol=1e-6)


def test_shape_values_are_numpy_on_a_real_gpu(cuda):
    import cupy as cp
    m, x = dynamic_reshape_model()
    rep = backend.prepare(m, str(cuda))
    seen = {}
    rep.plan.run([cuda.put(x)], hook=lambda node, outs: seen.__setitem__(node.name, outs[0]))
    for name in ("shape", "g0", "cat", "range"):
        assert isinstance(seen[name], np.ndarray), name
    for name in ("reshape", "scale", "embed"):
        assert isinstance(seen[name], cp.ndarray), name
    want = backend.prepare(m).run([x])
    for a, b in zip(rep.run([x]), want):
        np.testing.assert_allclose(a, b, rtol=1e-6)


# ----------------------------------------------------------------------------- optimizers
@pytest.mark.parametrize("kw", [dict(momentum=0.0), dict(momentum=0.9),
                                dict(momentum=0.9, nesterov=True, weight_decay=1e-3),
                                dict(momentum=0.8, dampening=0.3, weight_decay=1e-2)],
                         ids=["plain", "momentum", "nesterov-wd", "dampening-wd"])
def test_fused_sgd_on_cuda_matches_cpu(cuda, kw):
    """SGD's one-kernel GPU update gives the portable update's numbers over several steps."""
    from workbench import opt
    from workbench.tensor import Tensor
    r = np.random.default_rng(0)
    w0 = r.standard_normal((7, 5)).astype(np.float32)
    grads = [r.standard_normal((7, 5)).astype(np.float32) for _ in range(4)]
    results = []
    for dev in (wbdevice.create_cpu(), cuda):
        p = Tensor(data=w0.copy(), device=dev, requires_grad=True, stores_grad=True)
        o = opt.SGD(lr=0.1, **kw)
        for g in grads:
            o.update(p, dev.put(g))
        results.append(p.numpy())
    np.testing.assert_allclose(results[1], results[0], rtol=1e-5, atol=1e-6)
