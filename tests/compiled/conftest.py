"""What the compiled-kernel tests share."""

from __future__ import annotations

import pytest

from workbench import compiled


@pytest.fixture
def fresh_home(tmp_path, monkeypatch):
    """An empty cache home and a fresh engine state; the session's state restored after
    (loaded from the cache again, a bounded wait; still off if the session turned it off)."""
    was_enabled = compiled.enabled()
    monkeypatch.setenv("WORKBENCH_HOME", str(tmp_path))
    monkeypatch.delenv("WORKBENCH_KERNEL_CACHE", raising=False)
    monkeypatch.delenv("WORKBENCH_COMPILED", raising=False)
    compiled._forget()
    yield tmp_path
    compiled._forget()
    monkeypatch.undo()
    compiled._forget()
    compiled.set_enabled(was_enabled)
    if was_enabled:
        compiled.wait(timeout=120)
