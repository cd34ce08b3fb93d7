"""The argument vocabulary of compiled kernels, shared by the builder and the loader.

A kernel's arguments are written as one string of space-separated words:

- ``f32[]``, ``f64[]``, ``i64[]``, ``i32[]``, ``u8[]``, ``i8[]``: a C-contiguous numpy array
  of that dtype (the kernel receives its data pointer; the caller passes shapes as integers);
  ``f32[]!`` (and so on): an array the kernel writes (it must be writeable);
- ``i64``, ``f32``, ``f64``: a scalar.

Example: ``"f32[] f32[]! i64 i64 f32"``. Kernels cannot allocate: scratch space is an argument.
"""

from __future__ import annotations

import numpy as np

ARRAY_DTYPES = {"f32": np.float32, "f64": np.float64, "i64": np.int64, "i32": np.int32,
                "u8": np.uint8, "i8": np.int8}
SCALARS = ("i64", "f32", "f64")


def parse(spec: str) -> tuple:
    """``((kind, code), ...)`` for an argument string; kind is "array", "out" (an array the
    kernel writes) or "scalar"."""
    out = []
    for word in spec.split():
        if word.endswith("[]!") and word[:-3] in ARRAY_DTYPES:
            out.append(("out", word[:-3]))
        elif word.endswith("[]") and word[:-2] in ARRAY_DTYPES:
            out.append(("array", word[:-2]))
        elif word in SCALARS:
            out.append(("scalar", word))
        else:
            raise ValueError(f"unknown kernel argument type {word!r} in {spec!r} (arrays: "
                             f"{', '.join(k + '[]' for k in ARRAY_DTYPES)}, with a trailing "
                             f"'!' when written; scalars: {', '.join(SCALARS)})")
    return tuple(out)
