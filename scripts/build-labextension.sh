#!/usr/bin/env bash
# Rebuilds the JupyterLab extension's prebuilt assets, workbench/labextension/ (committed, and
# shipped in the wheel), from extensions/jupyterlab-onnx/ and the GraphView drawing code
# workbench/widgets/static/graph_core.js + graph_view.js. Run it after changing any of them,
# then commit workbench/labextension/. Needs node (>= 18) and npm, and jupyterlab (for
# `jupyter labextension build`); CI and users never run it.
set -euo pipefail
cd "$(dirname "$0")/../extensions/jupyterlab-onnx"
command -v npm >/dev/null 2>&1 || { echo "error: npm not found (install node.js >= 18)" >&2; exit 1; }
command -v jupyter >/dev/null 2>&1 || { echo "error: jupyter not found (pip install -e '.[lab]')" >&2; exit 1; }
if [ -d node_modules ]; then
  npm install --no-audit --no-fund
else
  npm ci --no-audit --no-fund
fi
npm run clean
npm run build
echo "built workbench/labextension/ -- commit it (git add -A workbench/labextension)"
