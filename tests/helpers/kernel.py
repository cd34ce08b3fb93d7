"""Run a notebook in a Jupyter kernel of this interpreter (as nbval's --nbval-current-env
does, not whatever the ``python3`` kernelspec points at) and shut the kernel down gracefully
afterwards, as a notebook server does."""

from __future__ import annotations

import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def run_notebook(nb, cwd: Path, env: dict | None = None, timeout: int = 600):
    """Execute ``nb`` (an nbformat notebook, changed in place) in ``cwd``; ``env`` is added to
    this process's environment (the working tree is put first on PYTHONPATH)."""
    import nbclient
    from jupyter_client.kernelspec import KernelSpec, KernelSpecManager
    from jupyter_client.manager import AsyncKernelManager
    from jupyter_core.utils import run_sync

    class ThisInterpreter(KernelSpecManager):
        def get_kernel_spec(self, kernel_name):
            return KernelSpec(argv=[sys.executable, "-m", "ipykernel_launcher", "-f",
                                    "{connection_file}"], display_name=kernel_name,
                              language="python")

    full_env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get(
        "PYTHONPATH", ""))
    full_env.update(env or {})
    km = AsyncKernelManager(kernel_spec_manager=ThisInterpreter(), kernel_name="python3")
    client = nbclient.NotebookClient(nb, km=km, timeout=timeout, kernel_name="python3",
                                     resources={"metadata": {"path": str(cwd)}})
    try:
        client.execute(env=full_env)
    finally:        # nbclient leaves a kernel it was handed running
        if km.has_kernel:
            run_sync(km.shutdown_kernel)(now=False)
    return nb
