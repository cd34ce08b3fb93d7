"""Class labels of the zoo models: ImageNet (downloaded synset), Pascal VOC, FER+ emotions.

>>> from workbench.zoo import labels
>>> labels.voc_classes()[-1], len(labels.voc_classes())
('tvmonitor', 20)
>>> labels.ferplus_emotions()[:3]
['neutral', 'happiness', 'surprise']

The ImageNet synset (1000 lines ``"n01440764 tench, Tinca tinca"``) is downloaded into the zoo
cache like a model file. Offline and not cached, :func:`imagenet_labels` returns ``class_<i>``
names and says so once (the demos still run; only the names are missing).
"""

from __future__ import annotations

import os
import sys
from functools import lru_cache

from workbench.errors import DownloadError

_DATA = os.path.join(os.path.dirname(__file__), "data")

# the same lists as the files under data/, in case a packaged install left those out
_VOC = ("aeroplane bicycle bird boat bottle bus car cat chair cow diningtable dog horse "
        "motorbike person pottedplant sheep sofa train tvmonitor").split()
_FERPLUS = "neutral happiness surprise sadness anger disgust fear contempt".split()


def _read_lines(path: str) -> list[str]:
    with open(path, encoding="utf-8") as f:
        return [line.rstrip("\r\n") for line in f if line.strip()]


def _packaged(file_name: str, fallback) -> list[str]:
    path = os.path.join(_DATA, file_name)
    return _read_lines(path) if os.path.exists(path) else list(fallback)


def voc_classes() -> list[str]:
    """The 20 Pascal VOC classes in Tiny YOLOv2's output order (aeroplane ... tvmonitor)."""
    return _packaged("voc_classes.txt", _VOC)


def ferplus_emotions() -> list[str]:
    """The 8 FER+ emotions in the model's output order (neutral ... contempt)."""
    return _packaged("ferplus_emotions.txt", _FERPLUS)


def placeholder_labels(n: int) -> list[str]:
    return [f"class_{i}" for i in range(n)]


@lru_cache(maxsize=4)
def _imagenet_cached(path: str, mtime: float) -> tuple:
    return tuple(_read_lines(path))


def imagenet_labels(*, offline: bool | None = None, quiet: bool = False) -> list[str]:
    """The 1000 ImageNet labels (full synset lines), from the zoo cache or downloaded there.

    Offline (or on a failed download) returns ``class_0 ... class_999`` and prints a note.
    """
    from workbench import zoo

    try:
        path = zoo.fetch_extra("resnet18", "synset.txt", offline=offline, progress=False)
    except DownloadError as e:
        if not quiet:
            why = ("not in the cache, and the workbench is offline" if "offline" in str(e)
                   else _short(e))
            print(f"ImageNet labels (synset.txt) are not available ({why}); showing "
                  f"class_<i> instead of names", file=sys.stderr)
        return placeholder_labels(1000)
    lines = list(_imagenet_cached(path, os.path.getmtime(path)))
    if len(lines) != 1000:
        if not quiet:
            print(f"{path} has {len(lines)} lines, expected 1000; showing class_<i> instead",
                  file=sys.stderr)
        return placeholder_labels(1000)
    return lines


def _short(e: Exception) -> str:
    msg = str(e)
    return msg if len(msg) < 160 else msg[:157] + "..."
