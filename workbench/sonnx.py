"""The old path of :mod:`workbench.singa.sonnx` (SINGA's ``sonnx`` module).

``from workbench import sonnx`` gives that module object itself, not a copy of its names, so
a SINGA program's assignments to module globals reach it.
"""

import sys

from workbench.singa import sonnx as _module

sys.modules[__name__] = _module
