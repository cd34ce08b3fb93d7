"""Device dispatch without a GPU: override registration/lookup, Plan(device=...), input-less
kernels' array module, feed/device checks, out-of-memory wrapping, memory info, geometry of the
CUDA kernels against the portable kernels' shapes. Runs on the CPU."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import workbench.backend as backend
from workbench import device as wbdevice
from workbench.errors import DeviceError
from workbench.graph.load import load
from workbench.ops import registry
from workbench.ops.registry import kernel, lookup, portable
from workbench.runtime import Plan, placement

DOM = "test.gpu.dispatch"


@pytest.fixture
def fake_ops():
    yield
    for op in ("Twice", "Seen", "Boom", "Newer"):
        registry.unregister(op, domain=DOM)
        registry.unregister(op, domain=DOM, xp="cupy")


def _graph(op, domain=DOM, inputs=("x",), shape=(2, 3), ctx_out=False):
    node = helper.make_node(op, list(inputs), ["y"], domain=domain, name=f"{op.lower()}_node")
    g = helper.make_graph([node], "g",
                          [helper.make_tensor_value_info(i, TensorProto.FLOAT, shape)
                           for i in inputs],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17),
                                            helper.make_opsetid(DOM, 1)])
    return load(m, check=False).graph


# ----------------------------------------------------------------------------- registry
def test_override_is_preferred_for_its_array_module_only(fake_ops):
    @kernel("Twice", since=1, domain=DOM)
    def twice(x):
        return x * 2

    @kernel("Twice", since=1, domain=DOM, xp="cupy")
    def twice_cuda(x):
        return x * 2

    assert lookup("Twice", DOM, 1).fn is twice
    assert lookup("Twice", DOM, 1, xp="numpy").fn is twice
    assert lookup("Twice", DOM, 5, xp="cupy").fn is twice_cuda
    assert portable("Twice", 1, DOM) is twice
    assert registry.overrides("cupy")[(DOM, "Twice")] == [1]
    # registering an override never changes the portable table
    assert registry.registered_ops()[(DOM, "Twice")] == [1]


def test_override_older_than_the_portable_behaviour_is_not_used(fake_ops):
    @kernel("Newer", since=1, domain=DOM)
    def newer_1(x):
        return x

    @kernel("Newer", since=3, domain=DOM)
    def newer_3(x):
        return x

    @kernel("Newer", since=1, domain=DOM, xp="cupy")
    def newer_1_cuda(x):
        return x

    assert lookup("Newer", DOM, 2, xp="cupy").fn is newer_1_cuda
    # opset 3 changed behaviour: the since-1 override must not shadow it
    assert lookup("Newer", DOM, 3, xp="cupy").fn is newer_3


def test_cuda_overrides_are_registered_without_cupy():
    over = registry.overrides("cupy")
    for op in ("Conv", "ConvTranspose", "MaxPool", "AveragePool", "BatchNormalization",
               "LayerNormalization", "Softmax", "LogSoftmax", "SoftmaxCrossEntropyLoss",
               "Gelu", "Erf"):
        assert ("", op) in over, op
    # and a CPU plan never sees them
    assert lookup("Conv", "", 17).fn.__module__ == "workbench.ops.conv"
    assert lookup("Conv", "", 17, xp="cupy").fn.__module__ == "workbench.ops.cuda"


# ----------------------------------------------------------------------------- plan
def test_input_less_kernels_get_the_device_array_module(fake_ops):
    seen = {}

    @kernel("Seen", since=1, domain=DOM, wants_ctx=True)
    def seen_kernel(x, *, ctx=None):
        seen["xp"] = ctx.extra.get("xp")
        return x

    g = _graph("Seen")
    Plan(g, device="CPU").run([np.ones((2, 3), np.float32)])
    assert seen["xp"] is np
    seen.clear()
    Plan(g).run([np.ones((2, 3), np.float32)])      # no device: nothing is named
    assert seen["xp"] is None


def test_constant_kernel_reads_ctx_xp():
    from workbench.ops.registry import NodeContext
    from workbench.ops.tensorgen import _ctx_xp
    ctx = NodeContext("c", "Constant", 17, 1, extra={"xp": np})
    assert _ctx_xp(ctx) is np


def test_cpu_plan_checks_feed_devices_and_backend_builds_device_plan():
    m = helper.make_model(helper.make_graph(
        [helper.make_node("Relu", ["x"], ["y"])], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])]),
        opset_imports=[helper.make_opsetid("", 17)])
    rep = backend.prepare(m, device="CPU")
    assert rep.plan.device == wbdevice.create_cpu()
    np.testing.assert_array_equal(rep.run([np.array([-1, 2], np.float32)])[0], [0, 2])


def test_feed_on_another_device_is_a_clear_error():
    cuda0 = wbdevice.Device("CUDA", 0)          # constructed directly: no GPU needed
    with pytest.raises(DeviceError, match=r"input 'x' is on CPU but the plan runs on CUDA:0"):
        placement.check_feed_device(cuda0, "x", np.zeros(3, np.float32))
    placement.check_feed_device(wbdevice.create_cpu(), "x", np.zeros(3, np.float32))  # fine


def test_cuda_without_cupy_or_gpu_is_a_device_error():
    if wbdevice.cuda_available():
        pytest.skip("a CUDA GPU is available here")
    with pytest.raises(DeviceError, match="CUDA was asked for"):
        wbdevice.create_cuda_gpu()
    with pytest.raises(DeviceError, match="CUDA was asked for"):
        backend.prepare(onnx.helper.make_model(onnx.helper.make_graph(
            [], "g", [], [])), device="CUDA:0")
    with pytest.raises(DeviceError):
        Plan(_graph("Relu", domain=""), device="CUDA:0")
    assert backend.supports_device("CUDA") is False


def test_out_of_memory_becomes_device_error_naming_device_node_and_bytes(fake_ops,
                                                                         monkeypatch):
    class FakeOutOfMemoryError(MemoryError):
        def __init__(self, size, total):
            super().__init__(f"Out of memory allocating {size:,} bytes "
                             f"(allocated so far: {total:,} bytes).")
            self._size = size

    monkeypatch.setattr(placement, "_OOM_TYPES", [FakeOutOfMemoryError])

    @kernel("Boom", since=1, domain=DOM)
    def boom(x):
        raise FakeOutOfMemoryError(3 * 2 ** 30, 10 ** 9)

    plan = Plan(_graph("Boom"), device="CPU")
    with pytest.raises(DeviceError) as ei:
        plan.run([np.ones((2, 3), np.float32)])
    msg = str(ei.value)
    assert "out of memory on CPU" in msg and "'boom_node'" in msg and "(Boom)" in msg
    assert "3,221,225,472 bytes" in msg
    assert ei.value.bytes_requested == 3 * 2 ** 30


def test_memory_info_on_cpu_and_tracking_flag():
    info = wbdevice.create_cpu().memory_info()
    assert info["device"] == "CPU" and info["used_bytes"] == 0 and "peak_bytes" in info
    plan = Plan(_graph("Relu", domain=""), device="CPU")
    plan.track_memory = True
    plan.run([np.ones((2, 3), np.float32)])
    assert plan.last_peak_bytes is None            # nothing to sample on the CPU


# ----------------------------------------------------------------------------- geometry
CONV_GEOMS = [
    dict(shape=(1, 2, 7, 9), ks=(3, 3), strides=(1, 1), pads=(1, 1, 1, 1), dil=(1, 1)),
    dict(shape=(1, 2, 8, 8), ks=(3, 2), strides=(2, 3), pads=(0, 1, 2, 0), dil=(2, 1)),
    dict(shape=(1, 2, 10, 5), ks=(5, 1), strides=(3, 1), pads=None, dil=(1, 1),
         auto_pad="SAME_UPPER"),
    dict(shape=(1, 2, 10, 5), ks=(4, 2), strides=(3, 2), pads=None, dil=(1, 1),
         auto_pad="SAME_LOWER"),
    dict(shape=(1, 2, 10, 6), ks=(3, 3), strides=(2, 2), pads=None, dil=(2, 1),
         auto_pad="VALID"),
]


@pytest.mark.parametrize("g", CONV_GEOMS)
def test_conv_geometry_matches_portable_kernel(g):
    from workbench.arrays.cuda.conv import conv_geometry
    x = np.zeros(g["shape"], np.float32)
    w = np.zeros((4, g["shape"][1]) + g["ks"], np.float32)
    ap = g.get("auto_pad", "NOTSET")
    y = portable("Conv", 17)(x, w, auto_pad=ap, dilations=list(g["dil"]), group=1,
                             kernel_shape=list(g["ks"]), pads=g["pads"],
                             strides=list(g["strides"]))
    pb, pe, out = conv_geometry(g["shape"][2:], g["ks"], g["strides"], g["dil"], g["pads"], ap)
    assert list(y.shape[2:]) == out


POOL_GEOMS = CONV_GEOMS + [
    dict(shape=(1, 1, 7, 7), ks=(2, 2), strides=(2, 2), pads=(0, 0, 0, 0), dil=(1, 1),
         ceil_mode=1),
    dict(shape=(1, 1, 6, 9), ks=(3, 3), strides=(2, 2), pads=(1, 1, 1, 1), dil=(1, 1),
         ceil_mode=1),
]


@pytest.mark.parametrize("g", POOL_GEOMS)
def test_pool_geometry_matches_portable_kernel(g):
    from workbench.arrays.cuda.pool import pool_geometry
    x = np.zeros(g["shape"], np.float32)
    ap = g.get("auto_pad", "NOTSET")
    cm = g.get("ceil_mode", 0)
    y = portable("MaxPool", 12)(x, auto_pad=ap, ceil_mode=cm, dilations=list(g["dil"]),
                                kernel_shape=list(g["ks"]), pads=g["pads"], storage_order=0,
                                strides=list(g["strides"]), ctx=None)
    pb, pe, out = pool_geometry(g["shape"][2:], g["ks"], g["strides"], g["dil"], g["pads"], ap,
                                cm)
    assert list(y.shape[2:]) == out


def test_fuse_elementwise_builds_operation_text():
    from workbench.arrays.cuda.elementwise import fuse_elementwise
    k = fuse_elementwise([("Add", 1), "Relu", ("Clip", {"min": 0, "max": 6})])
    assert k.n_inputs == 2
    assert "x1" in k.operation and "fmaxf(v, 0.f)" in k.operation and "6.0f" in k.operation
    with pytest.raises(ValueError, match="unsupported op"):
        fuse_elementwise(["NoSuchOp"])


def test_out_of_memory_message_parsed_from_cupy_text():
    e = MemoryError("Out of memory allocating 2,048 bytes (allocated so far: 10 bytes).")
    err = placement.oom_error(e, wbdevice.Device("CUDA", 1), "conv1", "Conv")
    assert isinstance(err, DeviceError) and err.bytes_requested == 2048
    assert "out of memory on CUDA:1 in node 'conv1' (Conv): it requested 2,048 bytes" in str(err)
