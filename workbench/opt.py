"""The old path of :mod:`workbench.singa.opt` (SINGA's ``opt`` module).

``from workbench import opt`` gives that module object itself, not a copy of its names, so
a SINGA program's assignments to module globals reach it.
"""

import sys

from workbench.singa import opt as _module

sys.modules[__name__] = _module
