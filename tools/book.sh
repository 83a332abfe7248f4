#!/usr/bin/env bash
# README command 1: install what is needed, then build the website from committed outputs.
set -euo pipefail
cd "$(dirname "$0")/.."
bash tools/install.sh
PY=${PYTHON:-python3}
rm -rf _build/html
jupyter-book build -W -n --keep-going .
echo "Website built: $(pwd)/_build/html/index.html"
