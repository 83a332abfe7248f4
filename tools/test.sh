#!/usr/bin/env bash
# README command 2: install what is needed, then run every test:
# unit tests, nbval over every notebook, and (where Chromium exists) the browser tests.
set -euo pipefail
cd "$(dirname "$0")/.."
bash tools/install.sh
PY=${PYTHON:-python3}
export TRITON_INTERPRET=${TRITON_INTERPRET:-1}
"$PY" -m pytest "$@"
