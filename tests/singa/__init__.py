"""SINGA's own Python test files (apache/singa ``test/python/``), ported with only their imports
changed, run against the workbench's SINGA-compatible modules.

Shims (what SINGA's tests reach that is SINGA's C++ layer, not its Python API) live next to them,
each documented: ``singa_wrap.py`` (``singa_wrap``/``singa_api``: ``USE_CUDA`` and the few C++
handles the tests touch), ``cuda_helper.py`` (SINGA's own helper, same content, imports changed)
and ``numpy_compat.py`` (numpy with what SINGA's tests used and later numpy removed: ``np.int``,
``arange`` of one-element arrays). ``conftest.py`` keeps SINGA's global ``autograd.training``
flag, which the test modules set at import, inside the tests of the module that set it, and
marks xfail (with the reason) the ported tests that check SINGA behaviour not copied on purpose.
"""
