#!/usr/bin/env bash
# Installs everything the test suite needs, from the repo's own files:
#   the package with its test, lab and dist extras (and its JupyterLab extension), PyTorch CPU
#   (test oracle for real models and gradients), and Debian's Chromium for the real-browser tests.
#   dist: mpi4py, the MPICH wheel's mpiexec and ipyparallel, for the 2-process DistOpt tests.
# Safe to run again. Used by the README's test command and by .ci/run.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}

$PY -m pip install --quiet --upgrade pip
$PY -m pip install --quiet -e ".[test,lab,dist]"
# The JupyterLab extension (ONNX Graph viewer for .onnx files). A wheel installs it through
# setuptools data-files; an editable install does not install data-files, so do the same here:
# the server-extension config into <prefix>/etc/jupyter (`jupyter server extension enable`
# refuses extensions that are not in a config yet), and the prebuilt front-end (committed in
# workbench/labextension; no node needed) linked into <prefix>/share/jupyter/labextensions --
# what `jupyter labextension develop --overwrite .` does, without depending on which
# jupyter-builder is first on PATH (JupyterLab 4.6 runs that command through it).
PREFIX=$($PY -c "import sys; print(sys.prefix)")
mkdir -p "$PREFIX/etc/jupyter/jupyter_server_config.d" \
  "$PREFIX/share/jupyter/labextensions/@onnx-workbench"
cp jupyter-config/jupyter_server_config.d/onnx_workbench.json \
  "$PREFIX/etc/jupyter/jupyter_server_config.d/onnx_workbench.json"
LABEXT_DEST="$PREFIX/share/jupyter/labextensions/@onnx-workbench/jupyterlab-onnx"
rm -rf "$LABEXT_DEST"
ln -s "$PWD/workbench/labextension" "$LABEXT_DEST"
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
