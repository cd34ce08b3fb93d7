"""Operator kernels, one file per op family. Importing this package registers all of them.

Every family file listed in ``_FAMILIES`` must import: a renamed or missing family is an
``ImportError`` here, never a silently smaller set of operators. (No family depends on an
optional package at import time; the optional ones -- cupy for the overrides in ``cuda.py``,
loaded on the first cupy lookup -- are imported where they are used.)
"""

from __future__ import annotations

import importlib

from workbench.ops.registry import kernel, lookup, register, registered_ops  # noqa: F401

_FAMILIES = (
    "elementwise", "activation", "logic", "cast",
    "conv", "conv_nhwc", "nhwc", "pool", "norm", "linalg", "reduce",
    "shape", "indexing", "tensorgen", "loss",
    "controlflow", "sequence", "quant", "resize", "rnn", "signal", "misc", "nlp",
    "attention", "training", "ml", "ml_linear", "ml_trees", "contrib_tokenizer",
    "contrib_quant", "contrib_transformer", "chain",
)


def load_families(families=_FAMILIES) -> None:
    """Import (and so register) the given family files; a missing one raises."""
    for name in families:
        importlib.import_module(f"workbench.ops.{name}")


load_families()
