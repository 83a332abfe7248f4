#!/usr/bin/env bash
# Every check that needs a CUDA GPU, in one run, each step logged and timed:
#   1. the GPU-only unit tests (Triton kernels compiled for real, TF32 off, fp16/bf16 paths);
#   2. nbval over every chapter and lab on CUDA: the committed (CPU-made) outputs must match;
#   3. benchmarks/flash_gpu.py (--quick by default; FULL=1 for the whole sweep), which writes
#      benchmarks/results/flash_gpu_<gpu>.{csv,json,png}.
# Needs a CUDA build of torch already installed (see pages/testing.md); it installs nothing.
# Logs go to $OUT (if set, e.g. on a lent GPU machine) or benchmarks/results/.
#
#   bash tools/gpu_check.sh            # about 5-10 minutes on an H100/H200-class GPU
#   STEPS="tests bench" bash tools/gpu_check.sh
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
LOG_DIR=${OUT:-benchmarks/results}
mkdir -p "$LOG_DIR"
STEPS=${STEPS:-"tests notebooks bench"}
export TRITON_INTERPRET=0 PYTHONUNBUFFERED=1
status=0

if ! "$PY" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)"; then
  echo "[gpu_check] no CUDA device visible to torch: nothing to check here" >&2
  exit 2
fi
"$PY" -c "import torch; p = torch.cuda.get_device_properties(0); print('[gpu_check]', p.name, 'sm_%d%d' % (p.major, p.minor), 'torch', torch.__version__)" \
  | tee "$LOG_DIR/gpu_check_device.txt"

step() {  # step NAME COMMAND...: run, log to $LOG_DIR/gpu_check_NAME.log, report rc and seconds
  local name=$1; shift
  local t0=$SECONDS
  "$@" > "$LOG_DIR/gpu_check_$name.log" 2>&1
  local rc=$?
  echo "[gpu_check] $name: rc=$rc in $((SECONDS - t0)) s (log: $LOG_DIR/gpu_check_$name.log)"
  tail -n 3 "$LOG_DIR/gpu_check_$name.log"
  [ $rc -eq 0 ] || status=1
}

for s in $STEPS; do
  case $s in
    tests)     step tests "$PY" -m pytest -q -p no:cacheprovider -m gpu tests ;;
    notebooks) step notebooks "$PY" -m pytest -q -p no:cacheprovider chapters labs ;;
    bench)     if [ "${FULL:-0}" = 1 ]; then step bench "$PY" benchmarks/flash_gpu.py
               else step bench "$PY" benchmarks/flash_gpu.py --quick; fi ;;
    *)         echo "[gpu_check] unknown step $s" >&2; status=1 ;;
  esac
done
exit $status
