"""The model zoo: SINGA's ten demo models, downloads into a verified cache, offline twins.

>>> from workbench import zoo
>>> zoo.get("resnet18").sha256[:8]
'4e8f8653'
"""

from __future__ import annotations

import os

from workbench.zoo.download import cache_dir, download, is_offline, sha256_of  # noqa: F401
from workbench.zoo.registry import REGISTRY, ZooEntry, get, names  # noqa: F401


def path(name: str) -> str:
    """Where a zoo model's file lives in the cache (it may not be there yet)."""
    e = get(name)
    return os.path.join(cache_dir(), e.name, e.file_name)


def fetch(name: str, *, offline: bool | None = None, progress: bool = True) -> str:
    """Download (or find in the cache) a zoo model's verified .onnx file; returns its path."""
    e = get(name)
    return download(e.url, path(name), sha256=e.sha256, size=e.size, offline=offline,
                    progress=progress)
