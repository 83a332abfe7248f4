#!/usr/bin/env bash
# README command 2: install what is needed, then run every test:
# unit tests, ruff (tests/test_lint.py), text sources vs notebooks (tests/test_sources.py),
# nbval over every notebook, the Triton-free run (tests/test_no_triton.py, about 80 s),
# and (where Chromium exists) the browser tests.
set -euo pipefail
cd "$(dirname "$0")/.."
bash tools/install.sh
PY=${PYTHON:-python3}
export TRITON_INTERPRET=${TRITON_INTERPRET:-1}
"$PY" -m pytest "$@"
