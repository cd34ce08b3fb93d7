"""The trunk cache (``workbench.trunk_cache``): the same training with and without it, each
invalidation rule, augmentation detection, memory and disk, the size estimate, atomic writes,
and what must keep working (export, graph mode, SINGA's own loop)."""

from __future__ import annotations

import os

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from workbench import autograd, layer, opt, sonnx, tensor, training
from workbench.trunk_cache import TrunkCache, state_of, trunk_of

POOL = "pooled"


def _model(*, bn=True, act="Relu", mix=False, seed=0) -> onnx.ModelProto:
    """x[N,1,8,8] -> Conv(4) -> [BatchNormalization] -> act -> GlobalAveragePool 'pooled'
    -> Flatten -> Gemm(3) -> y. ``mix``: subtract the batch mean before pooling (a trunk
    whose sample outputs depend on the rest of the batch)."""
    rng = np.random.default_rng(seed)
    inits = {"cw": rng.standard_normal((4, 1, 3, 3)).astype(np.float32),
             "cb": rng.standard_normal(4).astype(np.float32),
             "fw": rng.standard_normal((3, 4)).astype(np.float32),
             "fb": np.zeros(3, np.float32)}
    nodes = [helper.make_node("Conv", ["x", "cw", "cb"], ["c"], name="conv", pads=[1] * 4)]
    h = "c"
    if bn:
        inits.update(scale=rng.uniform(0.5, 1.5, 4).astype(np.float32),
                     bias=rng.normal(0, 0.1, 4).astype(np.float32),
                     mean=rng.normal(0, 0.5, 4).astype(np.float32),
                     var=rng.uniform(0.5, 2.0, 4).astype(np.float32))
        nodes.append(helper.make_node("BatchNormalization", ["c", "scale", "bias", "mean",
                                                             "var"], ["b"], name="bn"))
        h = "b"
    nodes.append(helper.make_node(act, [h], ["a"], name="act"))
    h = "a"
    if mix:
        nodes += [helper.make_node("ReduceMean", [h], ["bm"], name="batch_mean", axes=[0]),
                  helper.make_node("Sub", [h, "bm"], ["centred"], name="centre")]
        h = "centred"
    nodes += [helper.make_node("GlobalAveragePool", [h], [POOL], name="pool"),
              helper.make_node("Flatten", [POOL], ["flat"], name="flatten"),
              helper.make_node("Gemm", ["flat", "fw", "fb"], ["y"], name="fc", transB=1)]
    g = helper.make_graph(nodes, "tiny",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT,
                                                         ["N", 1, 8, 8])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 3])],
                          [numpy_helper.from_array(v, k) for k, v in inits.items()])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])
    m.ir_version = 8
    return m


class Head(sonnx.SONNXModel):
    """SINGA's pattern: the imported graph up to ``cut``, then a new Linear layer."""

    def __init__(self, proto, cut=POOL):
        super().__init__(proto)
        self.cut_at = cut
        self.fc = layer.Linear(4, 2)

    def forward(self, *x):
        f = super().forward(*x, last_layers=self.cut_at)[0]
        return self.fc(autograd.flatten(f, 1))

    def train_one_batch(self, x, y):
        loss = autograd.softmax_cross_entropy(self.forward(x), y)
        self.optimizer.backward_and_update(loss)
        return loss


def _data(n=48, seed=1):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, 1, 8, 8)).astype(np.float32)
    y = (x[:, 0, :4].mean(axis=(1, 2)) > 0).astype(np.int64)
    return x, y


X, Y = _data()
XV, YV = _data(16, seed=2)


def _net(proto=None, *, inference=True, cut=POOL):
    tensor.seed(0)
    return Head(proto if proto is not None else _model(), cut).freeze_imported(
        inference=inference)


def _fit(net, cache, log=None, **kw):
    kw.setdefault("epochs", 3)
    if isinstance(cache, TrunkCache) and log is not None:
        cache.log = log
    return training.fit(net, X, Y, batch_size=16, optimizer=opt.SGD(lr=0.1, momentum=0.9),
                        validation=(XV, YV), cache_trunk=cache, **kw)


def _same(h1, h2):
    np.testing.assert_allclose(h1["loss"], h2["loss"], rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(h1["val_loss"], h2["val_loss"], rtol=1e-5, atol=1e-7)
    assert h1["accuracy"] == h2["accuracy"] and h1["val_accuracy"] == h2["val_accuracy"]


@pytest.fixture(autouse=True)
def _home(tmp_path, monkeypatch):
    monkeypatch.setenv("WORKBENCH_HOME", str(tmp_path / "home"))


# ----------------------------------------------------------------------------- same results
@pytest.mark.parametrize("storage", ["memory", "disk"])
def test_same_losses_and_accuracy_with_and_without_the_cache(storage, capsys):
    plain = _fit(_net(), False)
    net = _net()
    cached = _fit(net, storage)
    _same(plain, cached)
    st = cached["trunk_cache"]
    n = len(X) + len(XV)
    assert st["computed"] == n and st["on"]
    assert st["reused"] == 3 * n - n + 1            # 3 epochs, the probe's sample reused once
    out = capsys.readouterr().out
    assert f"trunk cache: ({storage}) {n} samples x 16 bytes = 1.0 KiB" in out
    assert "runs once per sample, in inference form" in out
    assert f"the trunk ran on {n} sample(s)" in out
    assert net.trunk_cache is None                  # fit put the model back as it was
    # the trained head is the same too
    np.testing.assert_allclose(net.fc.W.numpy(), _trained_head_without_cache(), rtol=1e-5)


def _trained_head_without_cache():
    net = _net()
    _fit(net, False)
    return net.fc.W.numpy()


def test_no_batchnorm_needs_no_inference_form(capsys):
    """A trunk without training forms computes the same in both modes: freeze_imported()
    alone gives the same training with and without the cache, and no warning."""
    proto = _model(bn=False)
    plain = _fit(_net(proto, inference=False), False)
    cached = _fit(_net(proto, inference=False), True)
    _same(plain, cached)
    assert "inference form (" not in capsys.readouterr().out


def test_batchnorm_in_training_form_is_said(capsys):
    net = _net(inference=False)
    hist = _fit(net, True, epochs=1)
    out = capsys.readouterr().out
    assert "the trunk runs in inference form (1 BatchNormalization node(s)" in out
    assert "freeze_imported(inference=True)" in out
    assert hist["trunk_cache"]["on"]
    # without the cache that model trains BatchNormalization with batch statistics: not the
    # same numbers (that is why it is said)
    plain = _fit(_net(inference=False), False, epochs=1)
    assert not np.allclose(plain["loss"], hist["loss"], rtol=1e-4)


# ----------------------------------------------------------------------------- invalidation
def _forward(net, x=X[:8]):
    net.eval()
    with autograd.no_grad():
        return net.forward(tensor.from_numpy(x)).numpy()


def _cached_net(storage="memory", proto=None, **kw):
    net = _net(proto)
    msgs = []
    cache = net.cache_trunk(storage, log=msgs.append, **kw)
    return net, cache, msgs


def test_weights_changed():
    net, cache, msgs = _cached_net()
    first = _forward(net)
    assert cache.computed == 8 and cache.entries == 8
    _forward(net)
    assert cache.computed == 8 and cache.reused == 8
    w = net.get_params()["cw"]
    w.data = w.data * 2                          # a new array
    changed = _forward(net)
    assert cache.computed == 16 and cache.entries == 8
    assert any("the trunk's weights changed: 8 cached sample(s) dropped" in m for m in msgs)
    net.cache_trunk(False)
    np.testing.assert_allclose(changed, _forward(net), rtol=1e-5)
    assert not np.allclose(first, changed)
    # an in-place change and a buffer (running statistics) count too
    net.cache_trunk(cache)
    net.get_params()["cw"].data[0, 0, 0, 0] += 1.0
    _forward(net)
    assert cache.computed == 24
    net._buffers["mean"].data[:] += 0.5
    _forward(net)
    assert cache.computed == 32 and sum("weights changed" in m for m in msgs) == 3


def test_cut_changed():
    net, cache, msgs = _cached_net()
    _forward(net)
    net.cut_at = "a"                             # the activation before pooling: [N, 4, 8, 8]
    net.fc = layer.Linear(4 * 64, 2)
    out = _forward(net)
    assert cache.computed == 16 and out.shape == (8, 2)
    assert any("the cut (last_layers) changed" in m for m in msgs)
    assert cache.layout == [("float32", (4, 8, 8))]
    # the same cut named another way (by number, same resolved output) keeps the entries
    net.cut_at, net.fc = POOL, layer.Linear(4, 2)
    _forward(net)
    n_before = cache.computed
    net.cut_at = -3                              # after GlobalAveragePool: the same value
    _forward(net)
    assert cache.computed == n_before and cache.reused == 8
    # the counting is part of the key: SINGA's counting resolves -3 elsewhere
    net.last_layers_counting = "singa"
    net.cut_at = -2                              # SINGA: (-2 + 1) % N -> the whole graph
    net.fc = layer.Linear(3, 2)
    _forward(net)
    assert cache.computed == n_before + 8


def test_graph_changed_disk_and_memory(tmp_path):
    folder = tmp_path / "tc"
    a, ca, _ = _cached_net("disk", folder=folder)
    _forward(a)
    # another model with the same weights and cut but another graph (Sigmoid for Relu)
    b, cb, msgs = _cached_net("disk", proto=_model(act="Sigmoid"), folder=folder)
    out = _forward(b)
    assert cb.computed == 8 and cb.reused == 0 and cb.folder != ca.folder
    b.cache_trunk(False)
    np.testing.assert_allclose(out, _forward(b), rtol=1e-5)
    # one cache moved from one model to the other, in memory: said and dropped
    c, cache, msgs = _cached_net("memory")
    _forward(c)
    d = _net(_model(act="Sigmoid"))
    d.cache_trunk(cache)
    _forward(d)
    assert any("the graph changed" in m for m in msgs) and cache.computed == 16


def test_input_data_and_preprocessing_change_the_keys():
    net, cache, msgs = _cached_net()
    _forward(net, X[:8])
    _forward(net, X[:8] * 2)                     # other preprocessing: other samples
    assert cache.computed == 16 and cache.reused == 0
    _forward(net, X[:8].astype(np.float64).astype(np.float32))
    assert cache.reused == 8                     # the same bytes: the same samples
    both = _forward(net, np.concatenate([X[:4], X[8:12]]))     # half known, half new
    assert cache.computed == 20 and cache.reused == 12
    net.cache_trunk(False)
    np.testing.assert_allclose(both, _forward(net, np.concatenate([X[:4], X[8:12]])),
                               rtol=1e-5)


def test_device_is_part_of_the_state():
    net = _net()
    outputs = net._outputs_for(POOL, ())
    s = state_of(net, trunk_of(net, outputs))
    moved = type(s)(s.graph, s.cut, s.weights, "CUDA:0")
    assert s.changes(moved) == ["the device"] and s.digest != moved.digest
    assert s.device == "CPU"


def test_device_changed(cuda):
    net, cache, msgs = _cached_net()
    cpu = _forward(net)
    net.to_device(cuda)
    net.eval()
    with autograd.no_grad():
        out = net.forward(tensor.Tensor(device=cuda, data=cuda.put(X[:8]))).numpy()
    assert any("the device changed" in m for m in msgs) and cache.computed == 16
    np.testing.assert_allclose(out, cpu, rtol=1e-4, atol=1e-5)


# ----------------------------------------------------------------------------- skipped
def test_augment_skips_the_cache(capsys):
    def jitter(xb, rng):
        return xb + rng.normal(0, 0.01, xb.shape).astype(np.float32)

    hist = _fit(_net(), True, augment=jitter, epochs=1)
    out = capsys.readouterr().out
    assert "off: augment= makes every epoch's inputs different" in out
    assert "trunk_cache" not in hist or hist["trunk_cache"]["computed"] == 0


class Augmented:
    """Indexable data whose samples change every time they are read (augmentation that
    fit does not know about)."""

    def __init__(self, x):
        self.x, self.rng = x, np.random.default_rng(0)

    def __len__(self):
        return len(self.x)

    def __getitem__(self, idx):
        b = self.x[idx]
        return b + self.rng.normal(0, 0.01, b.shape).astype(np.float32)


def test_changing_inputs_are_detected(capsys):
    hist = training.fit(_net(), Augmented(X), Y, epochs=2, batch_size=16,
                        optimizer=opt.SGD(lr=0.1), cache_trunk=True)
    out = capsys.readouterr().out
    assert "differ from the last time it was seen: data augmentation" in out
    st = hist["trunk_cache"]
    assert not st["on"] and len(hist["loss"]) == 2 and np.isfinite(hist["loss"]).all()


def test_trainable_trunk_is_not_cached():
    net = _net()
    net.unfreeze_imported()
    msgs = []
    cache = net.cache_trunk(log=msgs.append)
    hist = _fit(net, None, epochs=1)
    assert cache.computed == 0 and cache.entries == 0
    assert any("parameter(s) of the trunk are trainable" in m for m in msgs)
    assert np.isfinite(hist["loss"]).all()


def test_a_trunk_that_draws_random_numbers_is_not_cached():
    m = _model(bn=False)
    g = m.graph
    at = [n.name for n in g.node].index("pool")
    g.node.insert(at, helper.make_node("Add", ["a", "noise"], ["noisy"], name="add_noise"))
    g.node.insert(at, helper.make_node("RandomNormalLike", ["a"], ["noise"], name="noise",
                                       scale=0.1))
    g.node[at + 2].input[0] = "noisy"
    net, cache, msgs = _cached_net(proto=m)
    a, b = _forward(net), _forward(net)
    assert cache.computed == 0 and cache.entries == 0
    assert not np.allclose(a, b)                 # a new draw on every call, as without a cache
    assert msgs == ["trunk cache: not used: the trunk draws random numbers (RandomNormalLike "
                    "'noise'), so its outputs for a sample differ from call to call"]
    # Dropout is no such node: the cache runs its inference form (passing through)
    m = _model(bn=False)
    at = [n.name for n in m.graph.node].index("pool")
    m.graph.node.insert(at, helper.make_node("Dropout", ["a"], ["dropped"], name="drop"))
    m.graph.node[at + 1].input[0] = "dropped"
    net, cache, msgs = _cached_net(proto=m)
    assert trunk_of(net, (POOL,)).random == []
    a = _forward(net)
    np.testing.assert_allclose(_forward(net), a, rtol=1e-6)
    assert cache.computed == 8 and cache.reused == 8


def test_a_trunk_that_mixes_the_batch_is_refused():
    net, cache, msgs = _cached_net(proto=_model(mix=True))
    out = _forward(net)
    assert not cache.enabled and "mixes the samples of a batch" in cache.off_reason
    net.cache_trunk(False)
    np.testing.assert_allclose(out, _forward(net), rtol=1e-5)


# ----------------------------------------------------------------------------- storage
def test_disk_cache_is_found_again_by_a_later_session(tmp_path):
    folder = tmp_path / "tc"
    net, cache, _ = _cached_net("disk", folder=folder)
    first = _forward(net, X[:12])
    files = sorted(os.listdir(cache.folder))
    assert len([f for f in files if f.endswith(".bin")]) == 12 and "meta.json" in files
    assert not [f for f in files if f.endswith(".tmp")]
    again, cache2, _ = _cached_net("disk", folder=folder)      # a new model, a new cache
    np.testing.assert_allclose(_forward(again, X[:12]), first, rtol=1e-6)
    assert cache2.computed == 0 and cache2.reused == 12 and cache2.folder == cache.folder
    cache2.clear()
    assert not os.listdir(folder)


def test_clear_removes_only_the_caches_own_folders(tmp_path):
    import json
    folder = tmp_path / "project"                # a folder= the user also keeps things in
    mine = {"notes/meta.json": "{}", "0123456789abcdef0123456789abcdef/meta.json":
            json.dumps({"format": "workbench-trunk-cache/1"}),
            "0123456789abcdef0123456789abcdef/results.csv": "a,b\n",
            "fedcba9876543210fedcba9876543210/meta.json": json.dumps({"format": "other/1"})}
    for name, text in mine.items():
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_text(text)
    (folder / "link").symlink_to(folder / "notes")
    net, cache, _ = _cached_net("disk", folder=folder)
    _forward(net)
    damaged, _, _ = _cached_net("disk", proto=_model(act="Sigmoid"), folder=folder)
    _forward(damaged)
    with open(os.path.join(damaged.trunk_cache.folder, "meta.json"), "w") as f:
        f.write("{not json")                     # damaged, but only entries of ours beside it
    cache.clear()
    left = sorted(str(p.relative_to(folder)) for p in folder.rglob("*"))
    assert left == sorted(["link", "notes", "0123456789abcdef0123456789abcdef",
                           "fedcba9876543210fedcba9876543210"] + list(mine))


def test_memory_budget_and_estimate(capsys):
    net, cache, msgs = _cached_net(budget=16 * 10)     # ten samples of 16 bytes
    assert cache.estimate(100)["per_sample"] is None
    _forward(net, X[:16])
    assert msgs[0] == ("trunk cache: (memory) 16 bytes per sample ('pooled' float32 "
                       "[4, 1, 1]); the budget holds about 10 samples")   # at the first use
    assert cache.entries == 10 and cache.nbytes == 160
    assert any("the memory budget (160 bytes) is full with 10 samples" in m for m in msgs)
    e = cache.estimate(100)
    assert e == {"samples": 100, "per_sample": 16, "total": 1600, "limit": 160, "fits": False}
    assert "100 samples x 16 bytes = 1.6 KiB (budget 160 bytes)" in \
        cache.describe_estimate(100)
    # fit says it before it starts
    _fit(_net(), TrunkCache(budget=200), log=print, epochs=1)
    out = capsys.readouterr().out
    assert out.index("64 samples x 16 bytes") < out.index("the trunk ran on")
    assert "about 12 samples will be cached" in out


def test_disk_estimate_checks_free_space(monkeypatch, capsys):
    import shutil
    from collections import namedtuple
    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr(shutil, "disk_usage", lambda p: usage(1 << 30, 0, 1 << 20))
    hist = _fit(_net(), "disk", epochs=1)
    out = capsys.readouterr().out
    assert "does not fit the free disk space" in out and not hist["trunk_cache"]["on"]


def test_an_unusable_disk_folder_turns_the_cache_off(tmp_path, capsys):
    not_a_folder = tmp_path / "a_file"
    not_a_folder.write_text("the user's file")
    net, cache, msgs = _cached_net("disk", folder=not_a_folder)
    assert cache.estimate(10)["limit"] >= 0          # creates nothing
    out = _forward(net)
    assert not cache.enabled and "cannot use the disk cache folder" in cache.off_reason
    assert not_a_folder.read_text() == "the user's file"
    net.cache_trunk(False)
    np.testing.assert_allclose(out, _forward(net), rtol=1e-6)
    # in fit: said, and training goes on without it
    hist = _fit(_net(), TrunkCache("disk", folder=not_a_folder, log=print), epochs=1)
    assert not hist["trunk_cache"]["on"] and "cannot use the disk cache folder" in \
        capsys.readouterr().out
    assert not (tmp_path / "nowhere").exists()
    TrunkCache("disk", folder=tmp_path / "nowhere").estimate(3)
    assert not (tmp_path / "nowhere").exists()


def test_disk_writes_are_atomic(tmp_path, monkeypatch):
    folder = tmp_path / "tc"
    net, cache, msgs = _cached_net("disk", folder=folder)
    real = os.replace
    calls = {"n": 0}

    def failing_replace(src, dst):
        if str(dst).endswith(".bin"):
            calls["n"] += 1
            raise OSError(28, "No space left on device")
        return real(src, dst)

    monkeypatch.setattr(os, "replace", failing_replace)
    out = _forward(net)
    monkeypatch.setattr(os, "replace", real)
    assert calls["n"] == 1 and not cache.enabled and "cannot write" in cache.off_reason
    left = os.listdir(cache.folder)
    assert left == ["meta.json"]                 # no partial entry, no temporary file
    net.cache_trunk(False)
    np.testing.assert_allclose(out, _forward(net), rtol=1e-6)


def test_damaged_disk_files_are_recomputed(tmp_path):
    folder = tmp_path / "tc"
    net, cache, _ = _cached_net("disk", folder=folder)
    first = _forward(net)
    bins = sorted(f for f in os.listdir(cache.folder) if f.endswith(".bin"))
    with open(os.path.join(cache.folder, bins[0]), "r+b") as f:
        f.truncate(5)
    with open(os.path.join(cache.folder, "meta.json"), "a") as f:
        f.write("garbage")
    again, cache2, msgs = _cached_net("disk", folder=folder)
    np.testing.assert_allclose(_forward(again), first, rtol=1e-6)
    assert any("could not be read" in m for m in msgs)       # meta.json: rewritten
    assert cache2.computed == 8                              # no layout: all recomputed
    third, cache3, msgs = _cached_net("disk", folder=folder)
    with open(os.path.join(cache.folder, bins[0]), "r+b") as f:
        f.truncate(5)
    np.testing.assert_allclose(_forward(third), first, rtol=1e-6)
    assert cache3.computed == 1 and cache3.reused == 7
    assert any("not the 16 bytes of a sample" in m for m in msgs)


def _any_size_model():
    """_model() with its input's height and width symbolic (a fully convolutional trunk up
    to the activation 'a')."""
    m = _model()
    dims = m.graph.input[0].type.tensor_type.shape.dim
    dims[2].dim_param, dims[3].dim_param = "H", "W"
    return m


class _Spatial(Head):
    def __init__(self, proto):
        super().__init__(proto, cut="a")
        self.fc = layer.Linear(4 * 64, 2)


@pytest.mark.parametrize("storage", ["memory", "disk"])
def test_outputs_of_another_layout_turn_the_cache_off(tmp_path, storage):
    # 4x16 and 16x4 images give trunk outputs of the same size in bytes but another shape:
    # a disk entry read back with the first layout would be silently wrong
    tensor.seed(0)
    net = _Spatial(_any_size_model()).freeze_imported(inference=True)
    msgs = []
    cache = net.cache_trunk(storage, log=msgs.append, folder=tmp_path / "tc")
    wide, tall = X[:8].reshape(8, 1, 4, 16), X[8:16].reshape(8, 1, 16, 4)
    first = _forward(net, wide)
    assert cache.layout == [("float32", (4, 4, 16))]
    got = [_forward(net, tall), _forward(net, tall), _forward(net, wide)]
    assert not cache.enabled and "float32 [4, 16, 4] per sample" in cache.off_reason
    assert any("one layout per trunk state" in m for m in msgs)
    net.cache_trunk(False)
    for a, b in zip([first] + got, [wide, tall, tall, wide]):
        np.testing.assert_allclose(a, _forward(net, b), rtol=1e-5)


@pytest.mark.parametrize("layout", [[["object", [4, 1, 1]]], [["__class__", [4, 1, 1]]],
                                    [["float32", [2**30, 2**30]]], [["float32", [-4]]],
                                    [["float32"]], 7, [["V16", [1]]]])
def test_a_hostile_meta_json_is_not_trusted(tmp_path, layout):
    import json
    folder = tmp_path / "tc"
    net, cache, _ = _cached_net("disk", folder=folder)
    first = _forward(net)
    meta = os.path.join(cache.folder, "meta.json")
    with open(meta) as f:
        info = json.load(f)
    info["layout"] = layout
    with open(meta, "w") as f:
        json.dump(info, f)
    again, cache2, msgs = _cached_net("disk", folder=folder)
    np.testing.assert_allclose(_forward(again), first, rtol=1e-6)
    assert any("could not be read" in m for m in msgs)
    assert any("8 cached file(s)" in m and "removed" in m for m in msgs)
    assert cache2.computed == 8 and cache2.folder == cache.folder
    assert os.path.realpath(cache2.folder).startswith(os.path.realpath(folder) + os.sep)


def test_a_meta_json_claiming_huge_samples_allocates_nothing(tmp_path):
    import json
    import tracemalloc
    folder = tmp_path / "tc"
    net, cache, _ = _cached_net("disk", folder=folder)
    first = _forward(net)
    meta = os.path.join(cache.folder, "meta.json")
    with open(meta) as f:
        info = json.load(f)
    info["layout"] = [["float32", [1 << 30]]]          # 4 GiB a sample, the files 16 bytes
    with open(meta, "w") as f:
        json.dump(info, f)
    again, cache2, msgs = _cached_net("disk", folder=folder)
    tracemalloc.start()
    try:
        out = _forward(again)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    np.testing.assert_allclose(out, first, rtol=1e-6)
    assert peak < 64 << 20
    assert any("holds 16 bytes, not the 4,294,967,296 bytes" in m for m in msgs)
    assert not cache2.enabled and "one layout per trunk state" in cache2.off_reason


def test_entries_without_a_meta_json_are_removed(tmp_path):
    folder = tmp_path / "tc"
    net, cache, _ = _cached_net("disk", folder=folder)
    first = _forward(net)
    os.remove(os.path.join(cache.folder, "meta.json"))
    again, cache2, msgs = _cached_net("disk", folder=folder)
    np.testing.assert_allclose(_forward(again), first, rtol=1e-6)
    assert cache2.computed == 8 and cache2.reused == 0
    assert any("had no readable meta.json" in m for m in msgs)


def test_the_disk_cache_lives_in_the_workbench_home(tmp_path):
    net, cache, _ = _cached_net("disk")
    _forward(net)
    home = os.path.realpath(tmp_path / "home")
    assert os.path.realpath(cache.folder).startswith(home + os.sep)
    assert os.path.basename(cache.folder) == cache.state.digest.hex()[:32]
    assert all(f == "meta.json" or (f.endswith(".bin") and len(f) == 2 * 16 + 4)
               for f in os.listdir(cache.folder))


# ----------------------------------------------------------------------------- still working
def test_export_records_the_trunk():
    net, cache, _ = _cached_net()
    _forward(net)
    proto = net.to_onnx([tensor.from_numpy(X[:2])])
    assert {"Conv", "BatchNormalization", "GlobalAveragePool"} <= \
        {n.op_type for n in proto.graph.node}
    from workbench import backend
    np.testing.assert_allclose(backend.prepare(proto).run([X[:8]])[0], _forward(net),
                               rtol=1e-5, atol=1e-6)


def test_graph_mode_falls_back_to_eager():
    plain = _fit(_net(), False, use_graph=True)
    _same(plain, _fit(_net(), True, use_graph=True))


def test_singa_loop_with_the_models_cache():
    """SINGA's own loop (compile, set_optimizer, model(x, y)) with the cache attached to the
    model; the batch's indices tell it about augmentation."""
    losses = {}
    for cached in (False, True):
        net = _net()
        net.set_optimizer(opt.SGD(lr=0.1, momentum=0.9))
        net.compile([tensor.PlaceHolder((16, 1, 8, 8))], is_train=True, use_graph=False)
        cache = net.cache_trunk(log=None) if cached else None
        out = []
        for _ in range(3):
            for i in range(0, len(X), 16):
                tx = tensor.from_numpy(X[i:i + 16])
                if cache is not None:
                    with cache.samples(np.arange(i, i + 16)):
                        out.append(net(tx, Y[i:i + 16]).item())
                else:
                    out.append(net(tx, Y[i:i + 16]).item())
        losses[cached] = out
        if cached:
            assert cache.computed == len(X) and cache.reused == 2 * len(X)
    np.testing.assert_allclose(losses[True], losses[False], rtol=1e-5)


def test_options_are_checked():
    from workbench.errors import InputError
    with pytest.raises(InputError, match="storage is one of"):
        TrunkCache("gpu")
    net = _net()
    with pytest.raises(InputError, match="no further options"):
        net.cache_trunk(TrunkCache(), budget=1)
    assert net.cache_trunk(False) is None and net.trunk_cache is None
    assert "memory, budget" in repr(net.cache_trunk())
