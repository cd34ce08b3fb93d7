"""Automatic differentiation: the tape, back-propagation, the gradient rules and export.

- :mod:`workbench.autodiff.tape`: :class:`Tensor`, :func:`apply` / :func:`run_op` (run a
  kernel and record a :class:`TapeNode`), :func:`no_grad`, :func:`inference_mode`,
  :func:`tape_order`;
- :mod:`workbench.autodiff.backprop`: :func:`backward`, :func:`gradients`;
- :mod:`workbench.autodiff.runner`: :class:`TapeRunner` (a Plan's steps on Tensors);
- :mod:`workbench.autodiff.rules`: the gradient rules per op family (``@gradient("Op")``) and
  the training forms of the ops that have one; ``rules.cuda`` their GPU overrides;
- :mod:`workbench.autodiff.export`: ``to_onnx``, the walk from output Tensors back over the
  tape to an ONNX ModelProto;
- :mod:`workbench.autodiff.collector`: :func:`training_step`, the garbage collector's policy
  for one training step (``training.fit`` wraps each step in it).

This package is the engine's: it imports the arrays, ops and graph layers, never SINGA's API
(``workbench.singa``), the widgets or the facade.
"""

from workbench.autodiff.backprop import backward, gradients, run_rule
from workbench.autodiff.collector import training_step
from workbench.autodiff.runner import StepCall, TapeRunner
from workbench.autodiff.tape import (
    DEFAULT_OPSET,
    PlaceHolder,
    TapeNode,
    Tensor,
    apply,
    as_tensor,
    enable_grad,
    inference_mode,
    is_float_dtype,
    is_grad_enabled,
    no_grad,
    parse_dtype,
    run_op,
    save_all_enabled,
    saving_all,
    set_node_class,
    set_save_all,
    tape_order,
    walk_tape,
)

__all__ = [
    "DEFAULT_OPSET", "PlaceHolder", "StepCall", "TapeNode", "TapeRunner", "Tensor", "apply",
    "as_tensor", "backward", "enable_grad", "gradients", "inference_mode", "is_float_dtype",
    "is_grad_enabled",
    "no_grad", "parse_dtype", "run_op", "run_rule", "save_all_enabled", "saving_all",
    "set_node_class", "set_save_all", "tape_order", "training_step", "walk_tape",
]
