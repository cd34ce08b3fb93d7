"""Stand-in for SINGA's ``examples/cnn/data/cifar10.py`` for an offline test run.

SINGA's loader reads the CIFAR-10 pickles from ``/tmp/cifar-10-batches-py`` (downloaded by
``download_cifar10.py``); the tests have no network and this project never unpickles
downloads. ``load()`` keeps SINGA's return contract - float32 images [N, 3, 32, 32]
normalised with CIFAR-10's mean/std (on the first two channels only, as SINGA's loop does),
int32 labels [N] in 0..9 - on a few deterministic random images: enough to run the program's
training and evaluation loops, not to learn CIFAR-10. ``WORKBENCH_CIFAR_TWIN_SIZES`` =
``"train,val"`` sets the counts (default 8,4).
"""

from __future__ import annotations

import os

import numpy as np


def load():
    n_train, n_val = (int(v) for v in
                      os.environ.get("WORKBENCH_CIFAR_TWIN_SIZES", "8,4").split(","))
    print(f"NOTE: data.cifar10 is a test stand-in ({n_train} + {n_val} random images), not "
          f"the CIFAR-10 data set", flush=True)
    rng = np.random.default_rng(0)
    train_x = rng.integers(0, 256, (n_train, 3, 32, 32)).astype(np.float32)
    val_x = rng.integers(0, 256, (n_val, 3, 32, 32)).astype(np.float32)
    train_y = rng.integers(0, 10, n_train).astype(np.int32)
    val_y = rng.integers(0, 10, n_val).astype(np.int32)
    train_y[:10] = np.arange(min(10, n_train), dtype=np.int32)  # every class present
    mean, std = [0.4914, 0.4822, 0.4465], [0.2023, 0.1994, 0.2010]
    train_x /= 255
    val_x /= 255
    for ch in range(0, 2):
        train_x[:, ch] = (train_x[:, ch] - mean[ch]) / std[ch]
        val_x[:, ch] = (val_x[:, ch] - mean[ch]) / std[ch]
    return train_x, train_y, val_x, val_y
