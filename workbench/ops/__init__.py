"""Operator kernels, one file per op family. Importing this package registers all of them."""

from __future__ import annotations

import importlib

from workbench.ops.registry import kernel, lookup, register, registered_ops  # noqa: F401

_FAMILIES = (
    "elementwise", "activation", "logic", "cast",
    "conv", "pool", "norm", "linalg", "reduce",
    "shape", "indexing", "tensorgen", "loss",
    "controlflow", "sequence", "quant", "resize", "rnn", "signal", "misc", "nlp",
    "attention", "training", "ml", "ml_linear", "ml_trees", "contrib_tokenizer", "contrib",
    "contrib_quant", "contrib_transformer",
)

for _name in _FAMILIES:
    try:
        importlib.import_module(f"workbench.ops.{_name}")
    except ModuleNotFoundError as _e:  # families are added one at a time
        if _e.name != f"workbench.ops.{_name}":
            raise
