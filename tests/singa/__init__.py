"""SINGA's own Python test files (apache/singa ``test/python/``), ported with only their imports
changed, run against the workbench's SINGA-compatible modules.

Shims (what SINGA's tests reach that is SINGA's C++ layer, not its Python API) live next to them,
each documented: ``singa_wrap.py`` (``singa_wrap``/``singa_api``: ``USE_CUDA`` and the few C++
handles the tests touch) and ``cuda_helper.py`` (SINGA's own helper, same content, imports changed).
"""
