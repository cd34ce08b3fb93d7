"""Kernel modules: numba-subset Python compiled by :mod:`workbench.compiled.build`.

Only the builder process imports these modules (they import numba); the engine loads their
compiled objects (:mod:`workbench.compiled`). Each module's kernels are tested against the
numpy path they replace (``tests/compiled/``).
"""
