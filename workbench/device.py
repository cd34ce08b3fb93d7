"""The old path of :mod:`workbench.singa.device` (SINGA's ``device`` module).

``from workbench import device`` gives that module object itself, not a copy of its names, so
a SINGA program's assignments to module globals reach it.
"""

import sys

from workbench.singa import device as _module

sys.modules[__name__] = _module
