"""A fixture for test modules that train through the SINGA-compatible model API."""

import pytest


@pytest.fixture(autouse=True)
def singa_training_flag():
    """Training a model sets SINGA's global ``autograd.training`` (``Model.train``): put it
    back after each test. Import it into a test module to apply it there."""
    from workbench.singa import autograd as singa_autograd
    before = singa_autograd.training
    yield
    singa_autograd.training = before
