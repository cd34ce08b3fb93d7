"""The old path of :mod:`workbench.singa.model` (SINGA's ``model`` module).

``from workbench import model`` gives that module object itself, not a copy of its names, so
a SINGA program's assignments to module globals reach it.
"""

import sys

from workbench.singa import model as _module

sys.modules[__name__] = _module
