"""Running SINGA's ported test files inside the workbench's suite.

1. ``autograd.training`` is SINGA's global flag, and SINGA's test modules set it when they are
   imported (``autograd.training = True`` at module level), which pytest does for every file
   at collection, before any test runs. So that the flag neither leaks into the rest of the
   suite nor depends on the order files are collected in, the value each module set is
   recorded after its import, the global is put back, and each test of that module runs with
   the module's value (restored afterwards).

2. Deliberate differences: a ported test that checks SINGA behaviour the workbench does not
   copy, on purpose, is marked ``xfail(strict=True)`` here with the reason (so it is reported,
   and a change that makes it pass is noticed): ``DELIBERATE`` below, each with its reason.
"""

from __future__ import annotations

import pathlib

import pytest

from workbench import autograd

HERE = pathlib.Path(__file__).resolve().parent

#: test id (file::class::name) -> why it is not meant to pass
DELIBERATE = {
    "test_operation.py::TestPythonOperation::test_erf_cpu":
        "SINGA's Erf.backward returns 2/sqrt(pi) * exp(-dy**2) (it squares the incoming "
        "gradient instead of the input and never multiplies by it); the workbench gives the "
        "true gradient dy * 2/sqrt(pi) * exp(-x**2), which autograd.backward also uses",
    "test_operation.py::TestPythonOperation::test_erf_gpu":
        "as test_erf_cpu",
}


@pytest.hookimpl(hookwrapper=True)
def pytest_make_collect_report(collector):
    if not isinstance(collector, pytest.Module):
        yield
        return
    before = autograd.training
    yield
    collector._singa_training = autograd.training  # what the module set at import
    autograd.training = before


def pytest_collection_modifyitems(config, items):
    for item in items:
        try:
            rel = pathlib.Path(item.fspath).resolve().relative_to(HERE)
        except ValueError:
            continue
        key = f"{rel.as_posix()}::{'::'.join(item.nodeid.split('::')[1:])}"
        if key in DELIBERATE:
            item.add_marker(pytest.mark.xfail(reason=DELIBERATE[key], strict=True))


@pytest.fixture(autouse=True)
def _singa_training_flag(request):
    module = request.node.getparent(pytest.Module)
    before = autograd.training
    autograd.training = getattr(module, "_singa_training", before)
    try:
        yield
    finally:
        autograd.training = before
