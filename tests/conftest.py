"""Shared fixtures. Kept small: model builders live in ``tests/helpers``."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # ``tests.helpers`` importable however pytest is started
    sys.path.insert(0, str(ROOT))

TORCH_SKIP_REASON = ("PyTorch is not installed: the real-model tests export their models with "
                     "torch.onnx (pip install torch, CPU build)")


class _ExportCache:
    """Builds each torch model once and exports it once per opset, for the whole session."""

    def __init__(self):
        self._models: dict = {}
        self._protos: dict = {}

    def model(self, name: str):
        from tests.helpers import torch_models  # noqa: PLC0415

        if name not in self._models:
            self._models[name] = torch_models.build(name)
        return self._models[name]

    def proto(self, name: str, opset: int = 17):
        from tests.helpers import torch_models  # noqa: PLC0415

        key = (name, opset)
        if key not in self._protos:
            model, example = self.model(name)
            self._protos[key] = torch_models.export_onnx(model, example, None, opset=opset)
        return self._protos[key]


@pytest.fixture(scope="session")
def torch_exports():
    """Session cache of the PyTorch-built models: ``.model(name)``, ``.proto(name, opset)``."""
    pytest.importorskip("torch", reason=TORCH_SKIP_REASON)
    return _ExportCache()
