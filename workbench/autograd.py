"""The old path of :mod:`workbench.singa.autograd` (SINGA's ``autograd`` module).

``from workbench import autograd`` gives that module object itself, not a copy of its names, so
a SINGA program's assignments to module globals reach it.
"""

import sys

from workbench.singa import autograd as _module

sys.modules[__name__] = _module
