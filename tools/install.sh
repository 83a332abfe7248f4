#!/usr/bin/env bash
# Install everything the book, its tests and local Jupyter (`jupyter lab`) need into the current Python.
# A CPU build of torch is installed unless torch is already importable
# (on a GPU machine, install CUDA torch first: see README).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
TORCH_VERSION=${TORCH_VERSION:-2.13.0}
TORCH_INDEX_URL=${TORCH_INDEX_URL:-https://download.pytorch.org/whl/cpu}

if ! "$PY" -c "import torch" 2>/dev/null; then
  echo "[install] torch==$TORCH_VERSION (CPU build) from $TORCH_INDEX_URL"
  # --index-url keeps pip from resolving PyPI's multi-GB CUDA build; local
  # find-links (if configured) are still used, so offline mirrors work too.
  "$PY" -m pip install -q --retries 1 --timeout 20 --index-url "$TORCH_INDEX_URL" "torch==$TORCH_VERSION" \
    || "$PY" -m pip install -q "torch==$TORCH_VERSION"
fi
echo "[install] book and test tooling (requirements.txt) and the helpers package"
"$PY" -m pip install -q -r requirements.txt
"$PY" -m pip install -q --no-deps -e .
"$PY" -c "import torch, helpers; print('[install] torch', torch.__version__, '| cuda available:', torch.cuda.is_available())"
# README's local command: `jupyter lab` (JupyterLab comes from requirements.txt)
JUPYTERLAB=$("$PY" -m jupyter lab --version) || { echo "[install] 'jupyter lab' does not run" >&2; exit 1; }
echo "[install] jupyter lab $JUPYTERLAB (run: jupyter lab chapters/01_cat_mlp.ipynb)"
