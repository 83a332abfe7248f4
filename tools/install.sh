#!/usr/bin/env bash
# Install into the current Python (a CPU build of torch unless torch is already importable; on a GPU
# machine, install CUDA torch first: see README):
#   bash tools/install.sh             # the contributor's: the book, its tests, grading and `jupyter lab`
#   bash tools/install.sh --learner   # a learner's: `jupyter lab` and the chapters and labs, nothing else
#                                     # (requirements-learner.txt; Triton only where torch sees a GPU)
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
LEARNER=0
case "${1:-}" in
  --learner) LEARNER=1 ;;
  "") ;;
  *) echo "usage: bash tools/install.sh [--learner]" >&2; exit 2 ;;
esac
TORCH_VERSION=${TORCH_VERSION:-2.13.0}
TORCH_INDEX_URL=${TORCH_INDEX_URL:-https://download.pytorch.org/whl/cpu}

if ! "$PY" -c "import torch" 2>/dev/null; then
  echo "[install] torch==$TORCH_VERSION (CPU build) from $TORCH_INDEX_URL"
  # --index-url keeps pip from resolving PyPI's multi-GB CUDA build; local
  # find-links (if configured) are still used, so offline mirrors work too.
  "$PY" -m pip install -q --retries 1 --timeout 20 --index-url "$TORCH_INDEX_URL" "torch==$TORCH_VERSION" \
    || "$PY" -m pip install -q "torch==$TORCH_VERSION"
fi
if [ "$LEARNER" = 1 ]; then
  echo "[install] the learner's tools (requirements-learner.txt) and the helpers package"
  "$PY" -m pip install -q -r requirements-learner.txt
  "$PY" -m pip install -q --no-deps -e .
  if "$PY" -c "import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)" 2>/dev/null; then
    echo "[install] a CUDA GPU: Triton for chapter 10's kernels"
    "$PY" -m pip install -q "$(grep -E '^triton==' requirements.txt | cut -d';' -f1)"
  fi
else
  echo "[install] book and test tooling (requirements.txt) and the helpers package"
  "$PY" -m pip install -q -r requirements.txt
  "$PY" -m pip install -q --no-deps -e .
fi
"$PY" -c "import torch, helpers; print('[install] torch', torch.__version__, '| cuda available:', torch.cuda.is_available())"
# README's local command: `jupyter lab` (JupyterLab comes from requirements.txt)
JUPYTERLAB=$("$PY" -m jupyter lab --version) || { echo "[install] 'jupyter lab' does not run" >&2; exit 1; }
echo "[install] jupyter lab $JUPYTERLAB (run: jupyter lab chapters/01_cat_mlp.ipynb)"
