import os
import sys

import numpy as np
import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
for p in (HERE, ROOT):
    if p not in sys.path:
        sys.path.insert(0, p)

pytest.importorskip("anywidget")
pytest.importorskip("ipywidgets")


def runnable(model) -> bool:
    """True when the engine has kernels for every node of ``model`` (kernels arrive over
    time; tests that need to run a model skip with the missing ops named)."""
    from workbench.errors import UnsupportedOperatorError
    from workbench.graph.load import load
    from workbench.runtime.plan import Plan
    try:
        Plan(load(model, check=False).graph)
    except UnsupportedOperatorError as e:
        return str(e)
    return True


@pytest.fixture
def require_runnable():
    def check(model):
        r = runnable(model)
        if r is not True:
            pytest.skip(f"engine kernels missing: {r}")
    return check


class Recorder:
    """Stands in for a widget's comm and records what would be sent to the browser."""

    def __init__(self):
        self.messages = []

    def send(self, data=None, metadata=None, buffers=None):
        self.messages.append((data, list(buffers or [])))

    def close(self, *a, **k):
        pass

    def on_msg(self, *a, **k):
        pass

    def on_close(self, *a, **k):
        pass

    kernel = True          # ipywidgets only sends when the comm has a kernel
    comm_id = "recorder"


@pytest.fixture
def record():
    def attach(widget):
        rec = Recorder()
        widget.comm = rec
        return rec
    return attach


@pytest.fixture
def rng():
    return np.random.default_rng(0)
