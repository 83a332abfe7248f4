#!/usr/bin/env bash
# README command 2: install what is needed, then run every test, in parallel on the machine's
# cores (pytest-xdist; at most 4 workers, TEST_JOBS=N to choose):
#   bash tools/test.sh            # the full run: unit tests, ruff, text sources, lab format, nbval
#                                 # over every notebook, the no-Triton run, the mistake catalogs,
#                                 # grading in the sandbox, the site (+ browser tests with Chromium)
#   bash tools/test.sh --fast     # the fast tier: unit tests, lint, text sources, lab format
#                                 # (no notebook runs, no sandboxed grading, no browser)
#   bash tools/test.sh --stage "lint"   # one stage (tests/conftest.py lists them)
# Other arguments go to pytest. The run prints the time of each stage at the end, and fails if it
# changed a tracked file. SKIP_INSTALL=1 skips tools/install.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
start=$(date +%s)
if [ "${SKIP_INSTALL:-0}" != 1 ]; then
  bash tools/install.sh
fi
installed=$(date +%s)
PY=${PYTHON:-python3}
export TRITON_INTERPRET=${TRITON_INTERPRET:-1}
cores=$("$PY" -c "import os; print(len(os.sched_getaffinity(0)))")
JOBS=${TEST_JOBS:-$(( cores < 4 ? cores : 4 ))}
# torch's threads per worker: the cores shared out, not a thread per core in every worker (JOBS workers
# with a thread per core each spun OpenMP threads on cores the other worker needed: on 2 cores the
# chapters' nbval took 154 s of CPU, 130 s with one thread each); the notebooks' kernels inherit it
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-$(( cores / JOBS > 1 ? cores / JOBS : 1 ))}
# matplotlib's font cache, this clone's own, built before any kernel starts: a cache another environment wrote
# (its mpl-data fonts deleted since) made every figure cell print "findfont: ... not found" (nbval fails on stderr)
export MPLCONFIGDIR=${MPLCONFIGDIR:-$PWD/_build/matplotlib}
mkdir -p "$MPLCONFIGDIR"
"$PY" -c "import matplotlib.font_manager" 2>/dev/null || true
status=0
# the time per stage is written here by tests/conftest.py and printed last, below pytest's summary
export BBH_STAGES_FILE=${BBH_STAGES_FILE:-_build/test-stages.txt}
rm -f "$BBH_STAGES_FILE"
# loadscope: a notebook's cells (and a test file's module fixtures) stay on one worker, in order
"$PY" -m pytest -n "$JOBS" --dist loadscope "$@" || status=$?
if [ -s "$BBH_STAGES_FILE" ]; then
  echo "========================== figures and time per stage =========================="
  cat "$BBH_STAGES_FILE"
fi
# the full run (no arguments) or the fast tier alone: `python benchmarks/suite_stages.py --page` copies a
# passing full run's table, this line included, into pages/testing.md
# (the budgets, on a quiet 2-core machine: the full run 600 s, the fast tier 120 s; printed, never enforced)
case "$*" in "") tier=full budget=" (budget 600 s)" ;; "--fast") tier=fast budget=" (budget 120 s)" ;; *) tier=partial budget="" ;; esac
line="[test] $tier run, install $(( installed - start )) s, tests $(( $(date +%s) - installed )) s$budget on $JOBS workers ($cores cores), exit $status"
echo "$line"
if [ -s "$BBH_STAGES_FILE" ]; then echo "$line" >> "$BBH_STAGES_FILE"; fi
exit $status
