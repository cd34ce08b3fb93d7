"""The old path of :mod:`workbench.autodiff.rules` (the gradient rules):
``from workbench.grad import gradient`` and ``workbench.grad.<family>`` give those modules
themselves (each rule module is imported once; its rules are registered once).
"""

import sys

from workbench.autodiff import rules as _module

_module._ensure_loaded()
for _name in _module._FAMILIES:
    sys.modules[f"{__name__}.{_name}"] = sys.modules[f"{_module.__name__}.{_name}"]
sys.modules[__name__] = _module
