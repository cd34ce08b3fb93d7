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

3. ``test_opt.py``'s own helper ``assertTensorEqual`` reads the values through SINGA's C++
   tensor handle (``x.data.GetFloatValue(n)``: ``Tensor.data`` is a CTensor in SINGA, a numpy
   or cupy array here). The shim ``_assert_tensor_equal`` below replaces that one helper in
   the module's namespace with the same checks (shape, dtype, device, values to ``decimal``
   places) reading the values with ``tensor.to_numpy``; the test file itself is unchanged.

4. SINGA's tests draw their data from numpy's global generator unseeded, and one of them
   (``test_numerical_gradients_check_for_vallina_rnn_cpu``, a finite-difference check that
   never restores the weights it perturbs) misses its tolerance on about one draw in ten:
   every test here starts from the same seed, so a run is reproducible.

5. SINGA's tests write files into the working directory (``test_model.py`` saves
   ``snapshot1_<test>.zip`` and leaves it there); each test here runs in its own temporary
   directory (``_own_working_directory`` below) so nothing lands in the repository.
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


def _assert_tensor_equal(x, y, decimal=6):
    """SINGA's ``test_opt.assertTensorEqual`` without the C++ handle (see 3. above)."""
    import numpy as np  # noqa: PLC0415

    from workbench import tensor  # noqa: PLC0415

    assert x.shape == y.shape
    assert x.dtype == y.dtype
    assert x.device.id() == y.device.id()
    np.testing.assert_array_almost_equal(tensor.to_numpy(x).reshape(-1),
                                         tensor.to_numpy(y).reshape(-1), decimal)


@pytest.fixture(autouse=True)
def _test_opt_helper(request, monkeypatch):
    module = request.node.getparent(pytest.Module)
    if module is not None and module.path.name == "test_opt.py":
        monkeypatch.setattr(module.obj, "assertTensorEqual", _assert_tensor_equal)


@pytest.fixture(autouse=True)
def _own_working_directory(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)


@pytest.fixture(autouse=True)
def _seeded_global_generators():
    import random  # noqa: PLC0415

    import numpy as np  # noqa: PLC0415
    state = np.random.get_state()
    np.random.seed(0)
    random.seed(0)
    try:
        yield
    finally:
        np.random.set_state(state)

