"""The old path of :mod:`workbench.singa.tensor` (SINGA's ``tensor`` module).

``from workbench import tensor`` gives that module object itself, not a copy of its names, so
a SINGA program's assignments to module globals reach it.
"""

import sys

from workbench.singa import tensor as _module

sys.modules[__name__] = _module
