"""The old module paths of SINGA's API are the modules themselves, so SINGA programs that assign
module globals (``autograd.training = True``) reach the real module; the tape takes the flag
from SINGA's module explicitly (``tape.set_save_all``), never by reading it."""

from __future__ import annotations

import importlib
import subprocess
import sys

import numpy as np
import pytest

import workbench
from workbench.autodiff import tape

OLD_PATHS = ["autograd", "tensor", "layer", "model", "opt", "sonnx", "device"]


@pytest.mark.parametrize("name", OLD_PATHS)
def test_old_path_is_the_module_itself(name):
    real = importlib.import_module(f"workbench.singa.{name}")
    assert importlib.import_module(f"workbench.{name}") is real
    assert getattr(workbench, name) is real
    from_import = {}
    exec(f"from workbench import {name} as m", from_import)
    assert from_import["m"] is real


def test_assigning_a_global_through_the_old_path_reaches_the_module(monkeypatch):
    from workbench import autograd
    from workbench.singa import autograd as real
    monkeypatch.setattr(autograd, "training", autograd.training)  # restored afterwards
    autograd.training = True
    assert real.training is True and real._singa_training() is True
    assert tape.save_all_enabled() is True
    autograd.training = False
    assert real.training is False and tape.save_all_enabled() is False


def test_training_flag_makes_every_op_save_for_its_own_backward(monkeypatch):
    from workbench import autograd, tensor
    monkeypatch.setattr(autograd, "training", False)
    x = tensor.from_numpy(np.array([[1.0, -2.0]], np.float32))
    assert autograd.relu(x).creator.saved_in is None      # nothing requires a gradient
    autograd.training = True
    y = autograd.relu(x)
    assert y.creator.saved_in is not None
    dx = y.creator.backward(np.ones((1, 2), np.float32))  # SINGA's per-operator backward
    np.testing.assert_array_equal(dx.numpy(), [[1.0, 0.0]])


def test_the_tape_setting_does_not_change_singas_flag():
    from workbench import autograd
    before = autograd.training
    with tape.saving_all():
        assert tape.save_all_enabled() and autograd.training is before
    assert tape.save_all_enabled() is bool(before)


def test_grad_old_path_keeps_one_copy_of_each_rule_module():
    import workbench.grad as grad  # noqa: PLC0415
    from workbench.autodiff import rules
    from workbench.autodiff.rules import norm
    from workbench.grad import norm as old_norm  # noqa: PLC0415
    assert grad is rules and old_norm is norm
    assert grad.gradient is rules.gradient


def test_the_engine_alone_records_plain_tape_nodes():
    """In a process that never imports SINGA's API, nodes are lean TapeNodes (no SINGA
    forward/backward); importing workbench.singa gives them SINGA's operator face."""
    code = (
        "import sys, numpy as np\n"
        "from workbench.autodiff import Tensor, TapeNode\n"
        "y = Tensor(data=np.ones(2, np.float32), requires_grad=True) * 2.0\n"
        "assert type(y.creator) is TapeNode and not hasattr(y.creator, 'backward')\n"
        "assert not any(m.startswith('workbench.singa') for m in sys.modules)\n"
        "from workbench import autograd\n"
        "z = Tensor(data=np.ones(2, np.float32), requires_grad=True) * 2.0\n"
        "assert type(z.creator) is autograd.OperatorNode\n"
        "print('ok')\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr[-2000:]


def test_set_node_class_takes_only_slotless_subclasses():
    class WithDict(tape.TapeNode):
        pass

    with pytest.raises(TypeError, match="__slots__"):
        tape.set_node_class(WithDict)
    with pytest.raises(TypeError, match="not a subclass"):
        tape.set_node_class(object)

    class ComparedByValue(tape.TapeNode):
        __slots__ = ()

        def __eq__(self, other):
            return isinstance(other, tape.TapeNode) and self.op_type == other.op_type

        __hash__ = tape.TapeNode.__hash__

    with pytest.raises(TypeError, match="__eq__"):
        tape.set_node_class(ComparedByValue)


def test_singa_autograd_all_is_explicit_and_complete():
    from workbench.singa import autograd
    assert len(autograd.__all__) == len(set(autograd.__all__))
    missing = [n for n in autograd.__all__ if not hasattr(autograd, n)]
    assert not missing
    ops = [n for n in dir(autograd) if isinstance(getattr(autograd, n), type)
           and issubclass(getattr(autograd, n), autograd.Operator) and not n.startswith("_")]
    assert set(ops) <= set(autograd.__all__)
    own = [n for n, v in vars(autograd).items() if not n.startswith("_") and callable(v)
           and getattr(v, "__module__", None) == autograd.__name__]
    assert sorted(set(own) - set(autograd.__all__)) == []
