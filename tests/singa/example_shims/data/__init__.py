"""Offline stand-in for SINGA's ``examples/cnn/data`` package, which
``examples/onnx/training/train.py`` imports (``from data import cifar10``) after appending
``../../cnn`` to ``sys.path``. See ``cifar10.py``."""
