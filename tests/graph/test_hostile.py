"""Hostile and broken model files (issue 10): external-data confinement with planted sentinel
files, entry validation before any read, resource guards before any allocation, C++ crash
isolation, clean errors from passes and the command line."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import time
import warnings

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import workbench.backend as backend
from workbench import limits
from workbench.errors import ModelLoadError, ResourceError, WorkbenchError
from workbench.graph import isolated
from workbench.graph.load import load

SECRET = b"SENTINEL-7f3a9c-user-secret!"   # 28 bytes = 7 float32


def vi(name, shape, dt=TensorProto.FLOAT):
    return helper.make_tensor_value_info(name, dt, shape)


def model(nodes, inputs, outputs, inits=(), opset=17, **kw):
    g = helper.make_graph(nodes, "g", inputs, outputs, list(inits))
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)], **kw)


def ext_tensor(name, location, n=7, extra=()):
    """A float32 [n] tensor whose data lives in ``location``."""
    t = helper.make_tensor(name, TensorProto.FLOAT, [n], np.zeros(n, np.float32))
    t.ClearField("float_data")
    t.data_location = TensorProto.EXTERNAL
    for k, v in (("location", location), ("offset", "0"), ("length", str(4 * n)), *extra):
        e = t.external_data.add()
        e.key, e.value = k, v
    return t


# --------------------------------------------------------------------------- every carrier
def _initializer(t):
    return model([helper.make_node("Identity", [t.name], ["y"])], [], [vi("y", [7])], [t])


def _sparse_initializer(t):
    idx = numpy_helper.from_array(np.arange(7, dtype=np.int64), "idx")
    sp = helper.make_sparse_tensor(t, idx, [7])
    g = helper.make_graph([helper.make_node("Identity", [t.name], ["y"])], "g", [],
                          [vi("y", [7])], sparse_initializer=[sp])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def _constant_value(t):
    return model([helper.make_node("Constant", [], ["y"], value=t)], [], [vi("y", [7])])


def _constant_sparse_value(t):
    idx = numpy_helper.from_array(np.arange(7, dtype=np.int64), "idx")
    sp = helper.make_sparse_tensor(t, idx, [7])
    return model([helper.make_node("Constant", [], ["y"], sparse_value=sp)], [], [vi("y", [7])])


def _other_node_attribute(t):
    # ConstantOfShape's 'value' must have one element: a 1-element external tensor
    one = ext_tensor("v", t.external_data[0].value, n=1)
    shape = numpy_helper.from_array(np.array([3], np.int64), "s")
    return model([helper.make_node("ConstantOfShape", ["s"], ["y"], value=one)], [],
                 [vi("y", [3])], [shape])


def _if_body(t):
    then = helper.make_graph([helper.make_node("Constant", [], ["a"], value=t)], "then", [],
                             [vi("a", [7])])
    other = helper.make_graph([helper.make_node("Constant", [], ["b"], value=helper.make_tensor(
        "z", TensorProto.FLOAT, [7], np.zeros(7)))], "else", [], [vi("b", [7])])
    c = numpy_helper.from_array(np.array(True), "c")
    return model([helper.make_node("If", ["c"], ["y"], then_branch=then, else_branch=other)],
                 [], [vi("y", [7])], [c])


def _nested_loop_body(t):
    inner = helper.make_graph(
        [helper.make_node("Identity", ["cond_in"], ["cond_out"]),
         helper.make_node("Identity", [t.name], ["v_out"])],
        "inner", [vi("i", [], TensorProto.INT64), vi("cond_in", [], TensorProto.BOOL),
                  vi("v_in", [7])], [vi("cond_out", [], TensorProto.BOOL), vi("v_out", [7])],
        [t])
    then = helper.make_graph(
        [helper.make_node("Loop", ["m", "", "v0"], ["l"], body=inner)], "then", [],
        [vi("l", [7])])
    c = numpy_helper.from_array(np.array(True), "c")
    m = numpy_helper.from_array(np.array(1, np.int64), "m")
    v0 = numpy_helper.from_array(np.zeros(7, np.float32), "v0")
    return model([helper.make_node("If", ["c"], ["y"], then_branch=then, else_branch=then)],
                 [], [vi("y", [7])], [c, m, v0])


def _training_info(t):
    m = model([helper.make_node("Identity", ["x"], ["y"])], [vi("x", [7])], [vi("y", [7])])
    ti = m.training_info.add()
    ti.initialization.CopyFrom(helper.make_graph(
        [helper.make_node("Identity", [t.name], ["w"])], "init", [], [vi("w", [7])], [t]))
    return m


CARRIERS = {
    "initializer": _initializer,
    "sparse_initializer": _sparse_initializer,
    "constant_value": _constant_value,
    "constant_sparse_value": _constant_sparse_value,
    "other_node_attribute": _other_node_attribute,
    "if_body": _if_body,
    "nested_loop_body": _nested_loop_body,
    "training_info": _training_info,
}


@pytest.fixture
def planted(tmp_path, monkeypatch):
    """A model folder ``tmp/models/m`` and sentinel files outside it: in the working directory,
    the folder's parent, and /tmp. Returns (model_folder, {label: absolute sentinel path})."""
    work = tmp_path / "work"
    work.mkdir()
    folder = tmp_path / "models" / "m"
    folder.mkdir(parents=True)
    monkeypatch.chdir(work)
    sentinels = {
        "cwd": work / "secret.txt",
        "parent": tmp_path / "models" / "secret.txt",
        "tmp": tmp_path / "secret.txt",
    }
    for p in sentinels.values():
        p.write_bytes(SECRET)
    return folder, sentinels


def _attacks(folder, sentinels):
    """location -> what it tries."""
    out = {
        "secret.txt": "the working directory's file, by a bare name",
        "../secret.txt": "the parent folder",
        "sub/../../secret.txt": "'..' after a real folder",
        str(sentinels["tmp"]): "an absolute path",
        str(sentinels["cwd"]): "an absolute path to the working directory",
        "link.bin": "a symlink leaving the folder",
        "dirlink": "a symlink to a folder, then a file in it",
        "fifo": "a FIFO (would block)",
        "adir": "a directory",
    }
    (folder / "sub").mkdir()
    os.symlink(sentinels["tmp"], folder / "link.bin")
    os.symlink(sentinels["cwd"].parent, folder / "dirlink")
    out["dirlink/secret.txt"] = out.pop("dirlink")
    os.mkfifo(folder / "fifo")
    (folder / "adir").mkdir()
    return out


def _must_not_leak(src, **kw):
    try:
        outs = backend.prepare(src, **kw).run([np.zeros(7, np.float32)] if False else [])
    except WorkbenchError as e:
        assert SECRET not in str(e).encode(), f"the error message leaks the sentinel: {e}"
        return e
    for o in outs:
        assert SECRET[:8] not in np.asarray(o).tobytes(), "the sentinel leaked into an output"
    raise AssertionError(f"the model ran and gave {outs}; expected a refusal")


@pytest.mark.parametrize("carrier", sorted(CARRIERS))
def test_no_carrier_reads_outside_the_model_folder(planted, carrier):
    folder, sentinels = planted
    for loc, what in _attacks(folder, sentinels).items():
        m = CARRIERS[carrier](ext_tensor("w", loc))
        path = folder / "model.onnx"
        path.write_bytes(m.SerializeToString())
        err = _must_not_leak(str(path))
        assert isinstance(err, ModelLoadError), (carrier, loc, what, err)
        # bytes / ModelProto without base_dir: refused with a clear message
        err = _must_not_leak(m.SerializeToString())
        assert "base_dir" in str(err), (carrier, loc, err)
        err = _must_not_leak(m)
        assert isinstance(err, ModelLoadError)
        os.unlink(path)


@pytest.mark.parametrize("carrier", sorted(set(CARRIERS) - {"training_info"}))
def test_every_carrier_reads_inside_the_folder(tmp_path, carrier):
    data = np.arange(7, dtype=np.float32)
    (tmp_path / "w.bin").write_bytes(data.tobytes())
    m = CARRIERS[carrier](ext_tensor("w", "w.bin"))
    p = tmp_path / "model.onnx"
    p.write_bytes(m.SerializeToString())
    (y,) = backend.prepare(str(p)).run([])
    want = data[:1].repeat(3) if carrier == "other_node_attribute" else data
    np.testing.assert_array_equal(y, want)
    # the same bytes with an explicit base folder
    (y2,) = backend.prepare(m.SerializeToString(), base_dir=str(tmp_path)).run([])
    np.testing.assert_array_equal(y2, want)


def test_training_info_external_data_is_resolved_inside_the_folder(tmp_path):
    data = np.arange(7, dtype=np.float32)
    (tmp_path / "w.bin").write_bytes(data.tobytes())
    m = _training_info(ext_tensor("w", "w.bin"))
    p = tmp_path / "model.onnx"
    p.write_bytes(m.SerializeToString())
    loaded = load(str(p))
    t = loaded.proto.training_info[0].initialization.initializer[0]
    np.testing.assert_array_equal(numpy_helper.to_array(t), data)


def test_user_modelproto_is_not_modified(tmp_path):
    (tmp_path / "w.bin").write_bytes(np.arange(7, dtype=np.float32).tobytes())
    m = _constant_value(ext_tensor("w", "w.bin"))
    before = m.SerializeToString()
    backend.prepare(m, base_dir=str(tmp_path)).run([])
    assert m.SerializeToString() == before


# --------------------------------------------------------------------------- entry validation
@pytest.mark.parametrize("extra,match", [
    ((("offset", "-4"),), "not a non-negative integer"),
    ((("length", "abc"),), "not a non-negative integer"),
    ((("offset", "0\x004"),), "NUL"),
    ((("offset", "+4"),), "not a non-negative integer"),
    ((("offset", "٣"),), "not a non-negative integer"),      # a non-ASCII digit
    ((("location", "w.bin"),), "given twice"),
    ((("basepath", "/"),), "unknown external data key"),
    ((("checksum", "xyz"),), "SHA-1"),
    ((("checksum", "0" * 40),), "checksum"),
])
def test_bad_entries_are_refused(tmp_path, extra, match):
    (tmp_path / "w.bin").write_bytes(np.arange(7, dtype=np.float32).tobytes())
    t = ext_tensor("w", "w.bin")
    # replace an existing key's value, or add the entry
    for k, v in extra:
        for e in t.external_data:
            if e.key == k and k != "location":
                e.value = v
                break
        else:
            e = t.external_data.add()
            e.key, e.value = k, v
    p = tmp_path / "model.onnx"
    p.write_bytes(_initializer(t).SerializeToString())
    with pytest.raises(ModelLoadError, match=match) as info:
        load(str(p))
    assert "initializer 'w'" in str(info.value) and str(p) in str(info.value)


def test_nul_in_location_refused(tmp_path):
    p = tmp_path / "model.onnx"
    p.write_bytes(_initializer(ext_tensor("w", "w.bin\x00../../etc/passwd")).SerializeToString())
    with pytest.raises(ModelLoadError, match="NUL"):
        load(str(p))


def test_valid_checksum_accepted(tmp_path):
    raw = np.arange(7, dtype=np.float32).tobytes()
    (tmp_path / "w.bin").write_bytes(raw)
    t = ext_tensor("w", "w.bin", extra=(("checksum", hashlib.sha1(raw).hexdigest()),))
    p = tmp_path / "model.onnx"
    p.write_bytes(_initializer(t).SerializeToString())
    (y,) = backend.prepare(str(p)).run([])
    np.testing.assert_array_equal(y, np.arange(7, dtype=np.float32))


@pytest.mark.parametrize("offset,length,match", [
    (0, 2**33, "does not match"),           # declared huge: refused, nothing allocated
    (0, 20, "does not match"),              # not what dims x dtype need
    (8, 28, "has only 28 bytes"),           # runs past the end of the file
    (2**62, 28, "has only 28 bytes"),
])
def test_sizes_checked_before_reading(tmp_path, offset, length, match):
    (tmp_path / "w.bin").write_bytes(np.arange(7, dtype=np.float32).tobytes())
    t = ext_tensor("w", "w.bin")
    for e in t.external_data:
        if e.key == "offset":
            e.value = str(offset)
        if e.key == "length":
            e.value = str(length)
    p = tmp_path / "model.onnx"
    p.write_bytes(_initializer(t).SerializeToString())
    t0 = time.perf_counter()
    with pytest.raises(ModelLoadError, match=match):
        load(str(p))
    assert time.perf_counter() - t0 < 30


def test_huge_dims_with_external_data_refused_without_allocating(tmp_path):
    (tmp_path / "w.bin").write_bytes(b"\0" * 16)
    t = ext_tensor("w", "w.bin", n=4)
    del t.dims[:]
    t.dims.extend([2**20, 2**20, 2**10])       # 4 PiB of float32
    for e in t.external_data:
        if e.key == "length":
            e.key = "offset"
            e.value = "0"
    del t.external_data[2]                   # no length: the dims decide
    p = tmp_path / "model.onnx"
    p.write_bytes(_initializer(t).SerializeToString())
    with pytest.raises(ModelLoadError, match="has only 16 bytes"):
        load(str(p), check=False, shape_inference=False)


# --------------------------------------------------------------------------- inline tensors
def test_raw_data_length_mismatch_is_a_clear_error():
    t = numpy_helper.from_array(np.zeros(6, np.float32), "w")
    t.raw_data = t.raw_data[:-4]
    with pytest.raises(ModelLoadError, match=r"raw_data has 20 bytes.*need 24"):
        backend.prepare(_initializer_named(t), check=False)


def _initializer_named(t):
    return model([helper.make_node("Identity", [t.name], ["y"])], [], [vi("y", list(t.dims))],
                 [t])


def test_sparse_indices_out_of_range_are_a_clear_error():
    vals = numpy_helper.from_array(np.ones(2, np.float32), "v")
    idx = numpy_helper.from_array(np.array([1, 99], np.int64), "i")
    m = model([helper.make_node("Constant", [], ["y"],
                                sparse_value=helper.make_sparse_tensor(vals, idx, [4]))],
              [], [vi("y", [4])])
    with pytest.raises(ModelLoadError, match="out of range"):
        backend.prepare(m, check=False)


def test_huge_sparse_dims_refused_before_allocating():
    vals = numpy_helper.from_array(np.ones(1, np.float32), "v")
    idx = numpy_helper.from_array(np.array([0], np.int64), "i")
    m = model([helper.make_node("Constant", [], ["y"],
                                sparse_value=helper.make_sparse_tensor(vals, idx, [2**50]))],
              [], [vi("y", [2**50])])
    with pytest.raises(ResourceError, match="memory budget"):
        backend.prepare(m, check=False)


# --------------------------------------------------------------------------- resource guards
def _int64(name, values):
    return numpy_helper.from_array(np.array(values, np.int64), name)


def _run_one(node, inits, inputs=(), feeds=(), opset=18, outputs=None):
    outs = outputs or [vi(o, None) for o in node.output]
    m = model([node], list(inputs), outs, inits, opset=opset)
    return backend.prepare(m, check=False).run(list(feeds))


@pytest.mark.parametrize("case", ["ConstantOfShape", "Expand", "Tile", "Range", "Pad",
                                  "Resize", "OneHot", "Mul", "MatMul", "RandomNormal"])
def test_resource_guards_refuse_before_allocating(case):
    x = vi("x", [4], TensorProto.FLOAT)
    feeds = [np.ones(4, np.float32)]
    big = 2**22
    n = {
        "ConstantOfShape": (helper.make_node("ConstantOfShape", ["s"], ["y"]),
                            [_int64("s", [2**40])], [], []),
        "Expand": (helper.make_node("Expand", ["x", "s"], ["y"]),
                   [_int64("s", [2**40, 4])], [x], feeds),
        "Tile": (helper.make_node("Tile", ["x", "r"], ["y"]), [_int64("r", [2**40])], [x], feeds),
        "Range": (helper.make_node("Range", ["a", "b", "d"], ["y"]),
                  [_int64("a", 0), _int64("b", 2**62), _int64("d", 1)], [], []),
        "Pad": (helper.make_node("Pad", ["x", "p"], ["y"]), [_int64("p", [0, 2**40])], [x],
                feeds),
        "Resize": (helper.make_node("Resize", ["x", "", "sc"], ["y"], mode="nearest"),
                   [numpy_helper.from_array(np.array([1e12], np.float32), "sc")], [x], feeds),
        "OneHot": (helper.make_node("OneHot", ["i", "d", "v"], ["y"]),
                   [_int64("i", [0, 1]), _int64("d", [2**40]),
                    numpy_helper.from_array(np.array([0, 1], np.float32), "v")], [], []),
        "Mul": (helper.make_node("Mul", ["a", "b"], ["y"]), [], [
            vi("a", [big, 1]), vi("b", [1, big])],
            [np.ones((big, 1), np.float32), np.ones((1, big), np.float32)]),
        "MatMul": (helper.make_node("MatMul", ["a", "b"], ["y"]), [], [
            vi("a", [big, 1]), vi("b", [1, big])],
            [np.ones((big, 1), np.float32), np.ones((1, big), np.float32)]),
        "RandomNormal": (helper.make_node("RandomNormal", [], ["y"], shape=[2**30, 2**20]),
                         [], [], []),
    }[case]
    node, inits, inputs, fd = n
    with pytest.raises(ResourceError, match="memory budget") as info:
        _run_one(node, inits, inputs, fd)
    assert case in str(info.value)


def test_memory_budget_is_configurable(monkeypatch):
    node = helper.make_node("ConstantOfShape", ["s"], ["y"])
    limits.set_memory_budget(1000)
    try:
        with pytest.raises(ResourceError, match="1,000 bytes"):
            _run_one(node, [_int64("s", [1000])])
    finally:
        limits.set_memory_budget(None)
    (y,) = _run_one(node, [_int64("s", [1000])])
    assert y.shape == (1000,)
    monkeypatch.setenv("WORKBENCH_MEMORY_BUDGET", "2KiB")
    assert limits.memory_budget() == 2048
    monkeypatch.setenv("WORKBENCH_MEMORY_BUDGET", "0.5")
    assert 0 < limits.memory_budget() <= limits.usable_memory()


@pytest.mark.filterwarnings("ignore:.*shape inference failed")
def test_split_num_outputs_huge_is_refused_at_once():
    node = helper.make_node("Split", ["x"], ["a", "b"], axis=0, num_outputs=2**31)
    t0 = time.perf_counter()
    with pytest.raises(WorkbenchError, match="num_outputs"):
        _run_one(node, [], [vi("x", [4])], [np.ones(4, np.float32)])
    assert time.perf_counter() - t0 < 20


def _loop_model(trip):
    body = helper.make_graph(
        [helper.make_node("Identity", ["c"], ["c_out"]),
         helper.make_node("Add", ["v", "one"], ["v_out"])],
        "body", [vi("i", [], TensorProto.INT64), vi("c", [], TensorProto.BOOL),
                 vi("v", [1])], [vi("c_out", [], TensorProto.BOOL), vi("v_out", [1])],
        [numpy_helper.from_array(np.ones(1, np.float32), "one")])
    return model([helper.make_node("Loop", ["M", "", "v0"], ["y"], body=body)], [],
                 [vi("y", [1])], [_int64("M", trip),
                                  numpy_helper.from_array(np.zeros(1, np.float32), "v0")])


def test_loop_iteration_ceiling():
    limits.set_max_loop_iterations(1000)
    try:
        with pytest.raises(ResourceError, match="iteration ceiling of 1,000") as info:
            backend.prepare(_loop_model(2**62)).run([])
        assert "set_max_loop_iterations" in str(info.value)
        (y,) = backend.prepare(_loop_model(999)).run([])
        assert y[0] == 999
    finally:
        limits.set_max_loop_iterations(None)
    assert limits.max_loop_iterations() == 10**7


def test_loop_is_interruptible_and_the_process_stays_usable():
    """KeyboardInterrupt (Jupyter's stop button) between iterations propagates as itself, not
    as a KernelError, and the next run works."""
    from workbench.ops import registry

    calls = {"n": 0}

    def boom(x):
        calls["n"] += 1
        if calls["n"] == 50:
            raise KeyboardInterrupt
        return x

    registry.register("InterruptAt50", boom, domain="com.test.hostile", since=1)
    body = helper.make_graph(
        [helper.make_node("Identity", ["c"], ["c_out"]),
         helper.make_node("InterruptAt50", ["v"], ["v_out"], domain="com.test.hostile")],
        "body", [vi("i", [], TensorProto.INT64), vi("c", [], TensorProto.BOOL), vi("v", [1])],
        [vi("c_out", [], TensorProto.BOOL), vi("v_out", [1])])
    g = helper.make_graph([helper.make_node("Loop", ["M", "", "v0"], ["y"], body=body)], "g", [],
                          [vi("y", [1])],
                          [_int64("M", 2**62), numpy_helper.from_array(np.zeros(1, np.float32),
                                                                        "v0")])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17),
                                            helper.make_opsetid("com.test.hostile", 1)])
    try:
        rep = backend.prepare(m, check=False)
        with pytest.raises(KeyboardInterrupt):
            rep.run([])
    finally:
        registry.unregister("InterruptAt50", domain="com.test.hostile")
    assert calls["n"] == 50
    (y,) = backend.prepare(_loop_model(3)).run([])
    assert y[0] == 3


# --------------------------------------------------------------------------- passes
def test_conv_bn_folding_with_wrong_scale_length_is_a_clear_error():
    w = numpy_helper.from_array(np.ones((4, 2, 3, 3), np.float32), "w")
    params = [numpy_helper.from_array(np.ones(n, np.float32), nm)
              for nm, n in (("s", 3), ("b", 4), ("mu", 4), ("var", 4))]
    m = model([helper.make_node("Conv", ["x", "w"], ["c"], name="conv"),
               helper.make_node("BatchNormalization", ["c", "s", "b", "mu", "var"], ["y"],
                                name="bn")],
              [vi("x", [1, 2, 5, 5])], [vi("y", [1, 4, 3, 3])], [w, *params])
    with pytest.raises(WorkbenchError) as info:
        backend.prepare(m, check=False).run([np.ones((1, 2, 5, 5), np.float32)])
    assert "bn" in str(info.value) or "BatchNormalization" in str(info.value)


def test_a_failing_pass_names_itself(monkeypatch):
    from workbench.graph import passes

    def broken(g):
        raise ValueError("operands could not be broadcast together")

    monkeypatch.setattr(passes, "fold_batchnorm", broken)
    m = _loop_model(2)
    with pytest.raises(ModelLoadError, match="inference pass broken failed.*optimize=False"):
        backend.prepare(m)


# --------------------------------------------------------------------------- C++ isolation
def test_huge_axis_refused_before_onnx_sees_it():
    node = helper.make_node("LayerNormalization", ["x", "s"], ["y"], axis=2**31, name="ln")
    m = model([node], [vi("x", [2, 3, 4]), vi("s", [4])], [vi("y", [2, 3, 4])])
    with pytest.raises(ModelLoadError, match=r"'ln' \(LayerNormalization\).*axis=2147483648"):
        load(m)


def test_a_crash_in_onnx_cpp_code_becomes_a_model_load_error(monkeypatch):
    crashing = isolated._WORKER_SOURCE.replace(
        "        m = onnx.ModelProto()\n",
        "        import signal; os.kill(os.getpid(), signal.SIGSEGV)\n"
        "        m = onnx.ModelProto()\n", 1)
    assert crashing != isolated._WORKER_SOURCE
    isolated._helper.kill()
    monkeypatch.setattr(isolated, "_WORKER_SOURCE", crashing)
    m = _loop_model(2)
    with pytest.raises(ModelLoadError, match="crashed.*SIGSEGV.*unharmed"):
        load(m)
    monkeypatch.setattr(isolated, "_WORKER_SOURCE", isolated._WORKER_SOURCE)
    monkeypatch.undo()
    isolated._helper.kill()
    assert load(m).graph.nodes[0].op_type == "Loop"        # a fresh helper next time


def test_a_hang_in_onnx_cpp_code_is_stopped(monkeypatch):
    hanging = isolated._WORKER_SOURCE.replace(
        "        m = onnx.ModelProto()\n", "        import time; time.sleep(600)\n"
        "        m = onnx.ModelProto()\n", 1)
    isolated._helper.kill()
    monkeypatch.setattr(isolated, "_WORKER_SOURCE", hanging)
    monkeypatch.setenv("WORKBENCH_SHAPE_INFERENCE_TIMEOUT", "2")
    with pytest.raises(ModelLoadError, match="did not finish in 2 s"):
        load(_loop_model(2))
    monkeypatch.undo()
    isolated._helper.kill()


@pytest.mark.skipif(os.name != "posix", reason="POSIX sessions")
def test_the_helper_is_outside_our_process_group():
    """A Jupyter kernel that shuts down signals the children in its process group and waits
    until none is left; the helper (a zombie until close() reaps it at exit) kept the kernel
    from exiting, so it was killed before its exit handlers ran. The helper has its own
    session; a script that ends still closes and reaps it."""
    load(_loop_model(2))                              # starts the helper
    pid = isolated._helper.proc.pid
    assert os.getsid(pid) == pid and os.getpgid(pid) != os.getpgrp()
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    code = (f"import sys; sys.path.insert(0, {root!r})\n"
            "from workbench.graph import isolated\nfrom workbench.graph.load import load\n"
            "from workbench.cli import default_model_path\nload(default_model_path())\n"
            "print(isolated._helper.proc.pid)\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stderr
    child = int(r.stdout.split()[-1])
    with pytest.raises(ProcessLookupError):           # closed and reaped at exit
        os.kill(child, 0)


def test_shape_inference_results_match_in_process(monkeypatch):
    """The helper's skeleton (big initializers as inputs) infers the same shapes."""
    w = numpy_helper.from_array(np.ones((64, 64), np.float32), "w")       # 16 KiB: moved
    shape = _int64("shape", [-1, 32])                                      # small: kept
    m = model([helper.make_node("MatMul", ["x", "w"], ["h"]),
               helper.make_node("Reshape", ["h", "shape"], ["r"]),
               helper.make_node("Relu", ["r"], ["y"])],
              [vi("x", [2, 64])], [vi("y", None)], [w, shape])
    isolated_graph = load(m, check=False).proto.graph
    monkeypatch.setenv("WORKBENCH_SHAPE_INFERENCE", "inprocess")
    inproc_graph = load(m, check=False).proto.graph
    assert [v.SerializeToString() for v in isolated_graph.value_info] == \
        [v.SerializeToString() for v in inproc_graph.value_info]
    assert isolated_graph.output[0].type == inproc_graph.output[0].type
    assert [t.name for t in isolated_graph.initializer] == ["w", "shape"]
    assert [i.name for i in isolated_graph.input] == ["x"]


# --------------------------------------------------------------------------- user-facing
def test_cli_prints_one_line_and_exits_nonzero(tmp_path):
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(_initializer(ext_tensor("w", "../secret.txt")).SerializeToString())
    r = subprocess.run([sys.executable, "-m", "workbench", "info", str(bad)],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2
    assert "Traceback" not in r.stderr
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and "outside the model's folder" in lines[0], r.stderr
    r = subprocess.run([sys.executable, "-m", "workbench", "--debug", "info", str(bad)],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "Traceback" in r.stderr


def test_rnn_sigmoid_is_warning_free_on_large_inputs():
    x = np.full((3, 1, 2), 1e4, np.float32)
    x[1] = -1e4
    w = numpy_helper.from_array(np.ones((1, 12, 2), np.float32), "W")
    r = numpy_helper.from_array(np.ones((1, 12, 3), np.float32), "R")
    m = model([helper.make_node("LSTM", ["x", "W", "R"], ["y"], hidden_size=3)],
              [vi("x", [3, 1, 2])], [vi("y", None)], [w, r], opset=14)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        (y,) = backend.prepare(m, check=False).run([x])
    assert np.isfinite(y).all()


def test_limits_reject_bad_settings(monkeypatch):
    with pytest.raises(ValueError):
        limits.set_memory_budget(-1)
    with pytest.raises(ValueError):
        limits.set_max_loop_iterations(0)
    monkeypatch.setenv("WORKBENCH_MEMORY_BUDGET", "lots")
    with pytest.raises(ResourceError, match="WORKBENCH_MEMORY_BUDGET"):
        limits.memory_budget()


def test_onnx_model_with_external_data_saved_by_onnx_round_trips(tmp_path):
    """What onnx.save_model(..., save_as_external_data=True) writes loads unchanged."""
    w = np.random.default_rng(0).standard_normal((64, 64)).astype(np.float32)
    m = model([helper.make_node("MatMul", ["x", "w"], ["y"])], [vi("x", [1, 64])],
              [vi("y", [1, 64])], [numpy_helper.from_array(w, "w")])
    p = tmp_path / "m.onnx"
    onnx.save_model(m, str(p), save_as_external_data=True, location="m.data",
                    size_threshold=0)
    x = np.ones((1, 64), np.float32)
    (y,) = backend.prepare(str(p)).run([x])
    np.testing.assert_allclose(y, x @ w, rtol=1e-5)


@pytest.mark.parametrize("kind", ["device", "fifo"])
def test_special_files_are_not_read_as_models(tmp_path, kind):
    if kind == "device":
        path = "/dev/zero"          # would be read forever
    else:
        path = str(tmp_path / "pipe.onnx")
        os.mkfifo(path)             # would block forever
    with pytest.raises(ModelLoadError, match="not a regular file"):
        load(path)


def test_tfidf_huge_gram_length_and_skip_count_finish_at_once():
    node = helper.make_node("TfIdfVectorizer", ["x"], ["y"], mode="TF", min_gram_length=1,
                            max_gram_length=2**31, max_skip_count=2**62, ngram_counts=[0, 2],
                            ngram_indexes=[0, 1, 2], pool_int64s=[1, 2, 1, 2])
    t0 = time.perf_counter()
    (y,) = _run_one(node, [], [vi("x", [6], TensorProto.INT64)],
                    [np.array([1, 2, 1, 3, 2, 2], np.int64)], opset=9)
    assert time.perf_counter() - t0 < 10
    assert y.tolist() == [2.0, 3.0, 5.0]       # unigrams 1, 2; bigram (1, 2) with any skip


def test_reduction_of_an_empty_input_to_a_huge_output_is_refused():
    node = helper.make_node("ReduceL2", ["x"], ["y"], keepdims=1, axes=[1])
    m = model([node], [vi("x", [2, 0, 4, 2**31])], [vi("y", None)], opset=17)
    rep = backend.prepare(m, check=False)
    big = np.lib.stride_tricks.as_strided(np.zeros(1, np.float32), (2, 0, 4, 2**31),
                                          (0, 0, 0, 0))
    with pytest.raises(ResourceError, match="ReduceL2: the output"):
        rep.run([big])


def test_huge_attribute_lists_do_not_make_huge_messages():
    node = helper.make_node("MaxPool", ["x"], ["y"], kernel_shape=[2, 2], strides=[0] * 100000)
    with pytest.raises(WorkbenchError) as info:
        _run_one(node, [], [vi("x", [1, 1, 4, 4])], [np.ones((1, 1, 4, 4), np.float32)])
    assert len(str(info.value)) < 3000 and "characters cut" in str(info.value)


def test_einsum_equation_with_control_characters_is_refused_before_onnx():
    node = helper.make_node("Einsum", ["a"], ["y"], equation="\x00", name="e")
    m = model([node], [vi("a", [2])], [vi("y", [2])], opset=12)
    t0 = time.perf_counter()
    with pytest.raises(ModelLoadError, match="'e' \\(Einsum\\): equation"):
        load(m)
    assert time.perf_counter() - t0 < 10


@pytest.mark.parametrize("mode", ["helper", "inprocess"])
def test_a_value_outside_its_ops_type_constraints_is_refused(mode, monkeypatch):
    """Float Gather indices (an exporter bug): refused at load with the op, node and input
    named, as onnxruntime refuses the graph; never run with indices silently truncated."""
    from onnx import TensorProto, helper

    import workbench.backend as wbb
    if mode == "inprocess":
        monkeypatch.setenv("WORKBENCH_SHAPE_INFERENCE", "inprocess")
    n = helper.make_node("Gather", ["x", "i"], ["y"], axis=0, name="gather_7")
    g = helper.make_graph([n], "g", [
        helper.make_tensor_value_info("x", TensorProto.FLOAT, [3]),
        helper.make_tensor_value_info("i", TensorProto.FLOAT, [1])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])
    with pytest.raises(ModelLoadError) as e:
        wbb.prepare(m)
    msg = str(e.value)
    assert "Gather" in msg and "gather_7" in msg and "tensor(float)" in msg
