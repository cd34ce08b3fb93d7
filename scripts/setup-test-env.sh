#!/usr/bin/env bash
# Installs everything the test suite needs, from the repo's own files:
#   the package with its test, lab and dist extras (its JupyterLab extension comes with it), PyTorch CPU
#   (test oracle for real models and gradients), and Debian's Chromium for the real-browser tests.
#   dist: mpi4py, the MPICH wheel's mpiexec and ipyparallel, for the 2-process DistOpt tests.
# Safe to run again. Used by the README's test command and by .ci/run.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}

# Into this Python's own prefix (a venv, or a Python you may write to), never a user-level
# install: pip falls back to ~/.local when site-packages is not writable, and there the lab
# extensions (ipyparallel's, ours) land in ~/.local/share/jupyter, which EVERY JupyterLab of
# this user loads, venvs included, while their server side is switched on in
# ~/.local/etc/jupyter, which a venv's Jupyter never reads: ipyparallel's extension then shows
# "IPP Extension Server Error" on every page load. PIP_USER=0 also overrides a pip.conf `user`.
export PIP_USER=0
if ! $PY -c 'import os, sys, sysconfig; sys.exit(not os.access(sysconfig.get_paths()["purelib"], os.W_OK))'; then
  echo "error: $PY installs into $($PY -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])'), which you cannot write." >&2
  echo "  Make a virtual environment first (README, 'Start here'): python3 -m venv .venv && . .venv/bin/activate" >&2
  echo "  (a user-level install, pip's fallback, would leave JupyterLab extensions every JupyterLab loads" >&2
  echo "  with their server side missing in other environments)" >&2
  exit 1
fi
$PY -m pip install --quiet --upgrade pip
# An earlier version of this script linked the JupyterLab extension's folder into the
# environment; pip would now write the installed copy through that link into the source tree
# (and remove it there on uninstall): take the link away first.
PREFIX=$($PY -c "import sys; print(sys.prefix)")
LABEXT_DEST="$PREFIX/share/jupyter/labextensions/@onnx-workbench/jupyterlab-onnx"
if [ -L "$LABEXT_DEST" ]; then rm "$LABEXT_DEST"; fi
# The package with its extras. The build backend (hatchling) installs the JupyterLab
# extension -- the prebuilt "ONNX Graph" front-end and the config that enables its server
# side -- for an editable install as for a wheel: nothing to register by hand.
$PY -m pip install --quiet -e ".[test,lab,dist]"
# PyTorch CPU: 'torch==2.13.0' resolves to a local CPU wheel on the project's machines.
if ! $PY -c "import torch" 2>/dev/null; then
  $PY -m pip install --quiet "torch==2.13.0" || echo "warning: torch not installed; torch-based tests will skip"
fi
# Chromium for the Playwright browser tests (Playwright's own browser download does not work
# offline; the tests point Playwright at /usr/bin/chromium).
if [ ! -x /usr/bin/chromium ] && command -v apt-get >/dev/null 2>&1; then
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  ($SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq chromium >/dev/null) \
    || echo "warning: chromium not installed; browser tests will skip"
fi
echo "test environment ready"
