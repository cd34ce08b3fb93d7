"""numpy, plus what SINGA's test files were written with and later numpy removed: the aliases
(``np.int``, ``np.float``, ``np.bool``, ``np.object``, ``np.complex``, ``np.str``: the Python
builtins, as they were). The ported files import numpy through this module instead of
``import numpy as np``; that is their only change besides the ``singa`` imports."""

import builtins as _builtins

import numpy as _np

int = _builtins.int  # noqa: A001
float = _builtins.float  # noqa: A001
bool = _builtins.bool  # noqa: A001
object = _builtins.object  # noqa: A001
complex = _builtins.complex  # noqa: A001
str = _builtins.str  # noqa: A001


def __getattr__(name):
    return getattr(_np, name)


def arange(*args, **kwargs):
    """``numpy.arange`` taking one-element arrays as the numbers they hold, as numpy did
    before 2.0 (SINGA's ``onehot`` test passes ``depth = np.array([10])``)."""
    args = [a.reshape(()).item() if isinstance(a, _np.ndarray) and a.size == 1 else a
            for a in args]
    return _np.arange(*args, **kwargs)
