"""The old path of :mod:`workbench.singa.layer` (SINGA's ``layer`` module).

``from workbench import layer`` gives that module object itself, not a copy of its names, so
a SINGA program's assignments to module globals reach it.
"""

import sys

from workbench.singa import layer as _module

sys.modules[__name__] = _module
