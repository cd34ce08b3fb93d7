"""The model zoo: SINGA's ten demo models, downloads into a verified cache, offline twins.

``zoo.load_model(name)`` gives the real file (cached or downloaded) or, where it cannot be had,
the model's untrained architecture twin (``zoo.twins``), saying so. Pre- and post-processing
per demo: ``zoo.preprocess`` / ``zoo.postprocess``; labels: ``zoo.labels``; tokenisers:
``zoo.tokenizers``; the ten demos end to end: ``zoo.demos``.

>>> from workbench import zoo
>>> zoo.get("resnet18").sha256[:8]
'4e8f8653'
"""

from __future__ import annotations

import os
import sys

from workbench.errors import WorkbenchError
from workbench.zoo.download import cache_dir, download, is_offline, sha256_of  # noqa: F401
from workbench.zoo.registry import REGISTRY, ZooEntry, get, names  # noqa: F401


def __getattr__(attr: str):
    # the pipeline modules load on first use (twins pulls in the training stack)
    if attr in ("demos", "labels", "postprocess", "preprocess", "tokenizers", "twins"):
        import importlib

        return importlib.import_module(f"workbench.zoo.{attr}")
    raise AttributeError(f"module 'workbench.zoo' has no attribute {attr!r}")


def path(name: str) -> str:
    """Where a zoo model's file lives in the cache (it may not be there yet)."""
    e = get(name)
    return os.path.join(cache_dir(), e.name, e.file_name)


def fetch(name: str, *, offline: bool | None = None, progress: bool = True) -> str:
    """Download (or find in the cache) a zoo model's verified .onnx file; returns its path."""
    e = get(name)
    return download(e.url, path(name), sha256=e.sha256, size=e.size, offline=offline,
                    progress=progress)


def extra_path(name: str, file_name: str) -> str:
    """Where one of a zoo model's extra files (labels, vocabulary) lives in the cache."""
    e = get(name)
    if file_name not in e.extra_files:
        raise WorkbenchError(f"zoo model {e.name!r} has no extra file {file_name!r} (it has: "
                             f"{', '.join(sorted(e.extra_files)) or 'none'})")
    return os.path.join(cache_dir(), e.name, file_name)


def fetch_extra(name: str, file_name: str, *, offline: bool | None = None,
                progress: bool = True) -> str:
    """Download (or find in the cache) an extra file of a zoo model (``synset.txt``,
    ``vocab.txt``, ``vocab.json``, ``merges.txt``); returns its path."""
    e = get(name)
    dest = extra_path(name, file_name)
    url, sha = e.extra_files[file_name]
    return download(url, dest, sha256=sha, offline=offline, progress=progress)


def load_model(name: str, *, allow_twin: bool = True, offline: bool | None = None,
               progress: bool = True):
    """``(model, is_twin)``: the real model's file path if it is cached or can be downloaded;
    otherwise (offline, or the download failed) its untrained architecture twin as a
    ModelProto, with a printed note. ``allow_twin=False`` raises the download error instead.
    """
    from workbench.errors import DownloadError

    e = get(name)
    try:
        return fetch(e.name, offline=offline, progress=progress), False
    except DownloadError as err:
        if not allow_twin:
            raise
        from workbench.zoo import twins

        print(f"{e.name}: the real model is not available ({_reason(err)}); using the "
              f"untrained architecture twin of {e.name}: predictions are meaningless",
              file=sys.stderr)
        return twins.build(e.name), True


def _reason(err: Exception) -> str:
    msg = str(err)
    if "offline" in msg:
        return "not in the cache, and the workbench is offline"
    return msg if len(msg) < 160 else msg[:157] + "..."
