"""LayerCutter's "cache the trunk" option (``workbench.trunk_cache``)."""

import numpy as np
import synth

from workbench import opt, tensor, training
from workbench.widgets import LayerCutter


def _fit(model):
    rng = np.random.default_rng(0)
    x = rng.standard_normal((40, 8)).astype(np.float32)
    y = (x[:, 0] > 0).astype(np.int64)
    return training.fit(model, x, y, epochs=3, batch_size=8, optimizer=opt.SGD(lr=0.1))


def test_cache_the_trunk_option(capsys):
    cutter = LayerCutter(synth.mlp(), last_layers="relu1", head_classes=2, freeze=True)
    assert not cutter.cache_box.value and "trunk cache" not in cutter.info.value
    tensor.seed(0)
    plain = cutter.model
    assert plain.base.trunk_cache is None
    h_plain = _fit(plain)
    cutter.cache_box.value = True                    # ticking the box
    assert cutter.cache_trunk and "computed once per sample" in cutter.info.value
    assert "trunk cached" in repr(cutter)
    tensor.seed(0)
    cached = cutter.model
    assert cached.base.trunk_cache is not None       # the cut base caches its outputs
    h_cached = _fit(cached)
    np.testing.assert_allclose(h_cached["loss"], h_plain["loss"], rtol=1e-5)
    assert h_cached["trunk_cache"]["computed"] == 40
    assert "the trunk ran on 40 sample(s)" in capsys.readouterr().out
    assert cached.base.trunk_cache is not None       # the model's own cache stays with it


def test_cache_needs_a_frozen_base():
    cutter = LayerCutter(synth.mlp(), last_layers="relu1", head_classes=2, cache_trunk=True)
    assert cutter.cache_box.value and "needs a frozen base" in cutter.info.value
    assert cutter.model.base.trunk_cache is None
    cutter.freeze_box.value = True
    assert "computed once per sample" in cutter.info.value
