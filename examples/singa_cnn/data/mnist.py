# Licensed under the Apache License, Version 2.0 (see the project's licence).
"""MNIST-shaped synthetic data for the ported SINGA CNN example (offline, deterministic).

SINGA's ``data/mnist.py`` reads the MNIST files from /tmp; this stand-in has the same
``load()`` contract - ``train_x, train_y, val_x, val_y``: float32 images of shape
``(n, 1, 28, 28)`` in [0, 1] and int32 labels 0..9 - with images drawn from ten class
templates (blocky strokes, small shifts, noise), so a CNN can learn them. The same on every
rank (fixed seed). Sizes: ``SYNTHETIC_MNIST_TRAIN`` (default 2048) and ``SYNTHETIC_MNIST_VAL``
(default 512) environment variables.
"""

import os

import numpy as np


def _images(n, rng, templates):
    y = rng.integers(0, 10, n).astype(np.int32)
    x = np.empty((n, 1, 28, 28), np.float32)
    for i in range(n):
        t = templates[y[i]]
        dy, dx = rng.integers(-2, 3, 2)
        x[i, 0] = np.roll(np.roll(t, dy, 0), dx, 1)
    x += rng.normal(0, 0.15, x.shape).astype(np.float32)
    return np.clip(x, 0, 1), y


def load():
    n_train = int(os.environ.get("SYNTHETIC_MNIST_TRAIN", 2048))
    n_val = int(os.environ.get("SYNTHETIC_MNIST_VAL", 512))
    print(f"NOTE: data.mnist is a synthetic MNIST-shaped stand-in ({n_train} + {n_val} "
          f"images from ten templates, examples/singa_cnn/data/mnist.py), not the MNIST "
          f"data set", flush=True)
    rng = np.random.default_rng(1234)
    coarse = rng.random((10, 7, 7)) > 0.6
    templates = np.kron(coarse, np.ones((4, 4))).astype(np.float32)   # 28x28 strokes
    train_x, train_y = _images(n_train, rng, templates)
    val_x, val_y = _images(n_val, rng, templates)
    return train_x, train_y, val_x, val_y
