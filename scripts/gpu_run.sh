#!/usr/bin/env bash
# The one GPU script: build in place, run the GPU tests, run the benchmarks, write results.
#
#   scripts/gpu_run.sh [--quick] [--no-build] [--only tests|bench]
#
# Time budget: the device tool stops a command at 10 minutes. Every step runs under `timeout`,
# capped so the whole script ends within GPU_RUN_BUDGET_S (default 540 s) with its results
# written; steps that no longer fit are skipped and listed in the results ("not run").
#
# Writes $RESULTS_DIR/<date>-<device>.json and .md (default benchmarks/results/) with device,
# driver, versions, commit and every number. GPU_RUN_COMMIT names the commit where .git is absent
# (the device tool copies the working tree without it). Expects a machine with an NVIDIA GPU, nvcc,
# and jax with CUDA installed; nothing is downloaded (pip --no-build-isolation --no-deps).
set -uo pipefail
cd "$(dirname "$0")/.."
QUICK=0; BUILD=1; ONLY=all
while [ $# -gt 0 ]; do
  case "$1" in
    --quick) QUICK=1 ;; --no-build) BUILD=0 ;; --only) ONLY="$2"; shift ;;
    *) echo "unknown argument $1" >&2; exit 2 ;;
  esac; shift
done
PY=${PYTHON:-python3}
RESULTS_DIR=${RESULTS_DIR:-benchmarks/results}
WORK=$(mktemp -d); mkdir -p "$RESULTS_DIR"
BUDGET=${GPU_RUN_BUDGET_S:-540}

# bound NAME SECONDS: prints the timeout a step may use (its own bound, capped by what is left of
# the budget less 20 s for writing results), or records the step as not run and fails.
bound() {
  local left=$((BUDGET - SECONDS - 20))
  if [ "$left" -lt 30 ]; then
    echo "$1 (budget: ${SECONDS}s of ${BUDGET}s used)" >> "$WORK/skipped.txt"
    echo "--- $1: skipped, the time budget is spent" >&2
    return 1
  fi
  echo $(( $2 < left ? $2 : left ))
}
export PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false JAX_GPUEXT_REQUIRE_GPU=1
# The tests must exercise every GPU backend, verified or not: `auto` takes unverified ones here
# (jax_gpuext/common/verified.py). The junit files record which backend each test verifies, and the
# results carry the build's source fingerprints; scripts/update_verified.py turns them into the record.
TEST_ENV=(JAX_GPUEXT_ALLOW_UNVERIFIED=1)

nvidia-smi --query-gpu=name,driver_version,memory.total,compute_cap --format=csv,noheader \
  || { echo "no NVIDIA GPU visible (nvidia-smi failed)" >&2; exit 1; }

if [ "$BUILD" = 1 ]; then
  echo "=== build (in place, against the installed jaxlib's FFI headers)"
  # sm_90a only: the H100 is the target here, and it keeps the build short.
  JAX_GPUEXT_CUDA=ON JAX_GPUEXT_CUDA_ARCHITECTURES="${JAX_GPUEXT_CUDA_ARCHITECTURES:-90a-real}" \
    "$PY" -m pip install --no-build-isolation --no-deps -q . 2>&1 | tail -20 || exit 1
fi
(cd / && "$PY" -m jax_gpuext info) | tee "$WORK/info.txt"
(cd / && "$PY" -m jax_gpuext info --json) > "$WORK/info.json"

# Results are rewritten after every step, so a run cut short (the device tool's 10-minute limit,
# a hung kernel) still leaves every number measured before it.
write_results() {
  GPU_RUN_COMMIT=${GPU_RUN_COMMIT:-$(git rev-parse HEAD 2>/dev/null || echo unknown)} \
    "$PY" scripts/write_results.py --work "$WORK" --out-dir "$RESULTS_DIR" --tests-status "$status"
}

# One pytest per group, each bounded and with its own junit file: a hang (hopper_mx's raw-PTX
# kernel has never run) costs its own group only. 124 in the log means the bound was hit.
# At the bound pytest gets SIGINT, so it still writes the junit file for the tests it finished
# (KILL 15 s later if a hung kernel keeps it from returning to Python). -v names each test as it
# starts, so a log cut off by a hang ends with the test that hung.
run_tests() {
  local name=$1 limit=$2; shift 2
  group_rc=not-run
  limit=$(bound "gpu tests $name" "$limit") || return 0
  (cd / && env "${TEST_ENV[@]}" timeout --signal=INT --kill-after=15 "$limit" "$PY" -m pytest "$@" -m gpu -v -rfEs \
     --junitxml="$WORK/gpu-tests-$name.xml") 2>&1 | tee "$WORK/gpu-tests-$name.txt"
  local rc=${PIPESTATUS[0]}
  group_rc=$rc
  echo "gpu tests $name: exit $rc"
  echo "$name $rc" >> "$WORK/test_exits.txt"  # write_results.py keeps the log's tail of a group cut short
  [ "$rc" -ne 0 ] && status=$rc
  write_results
}

status=0
if [ "$ONLY" != bench ]; then
  echo "=== GPU tests (closed gates fail under JAX_GPUEXT_REQUIRE_GPU=1, architecture gates skip)"
  run_tests main "${TEST_TIMEOUT_S:-300}" "$PWD/tests" --ignore="$PWD/tests/dot/test_hopper_mx.py"
  run_tests hopper_mx "${HOPPER_TEST_TIMEOUT_S:-150}" "$PWD/tests/dot/test_hopper_mx.py"
  # pytest's exit status, not the junit file: one interrupted at its bound (a hang) still writes one
  HOPPER_MX_OK=$([ "$group_rc" = 0 ] && echo 1 || echo 0)
  if command -v compute-sanitizer >/dev/null 2>&1 && [ -f tests/sanitizer_targets.txt ]; then
    echo "=== compute-sanitizer (memcheck, racecheck) on tests/sanitizer_targets.txt"
    while read -r target; do
      [ -z "$target" ] && continue
      for tool in memcheck racecheck; do
        # Bounded: racecheck over a whole JAX process is slow, and a device command has 10 minutes.
        limit=$(bound "compute-sanitizer $tool $target" "${SANITIZER_TIMEOUT_S:-150}") || continue
        (cd / && env "${TEST_ENV[@]}" timeout --kill-after=15 "$limit" compute-sanitizer --tool "$tool" --error-exitcode 9 \
           "$PY" -m pytest -q -x "$OLDPWD/tests/$target") \
          > "$WORK/sanitizer-$tool-$(echo "$target" | tr '/:' '__').txt" 2>&1
        echo "$tool $target: exit $?" | tee -a "$WORK/sanitizer.txt"
      done
    done < tests/sanitizer_targets.txt
  fi
fi

if [ "$ONLY" != tests ]; then
  echo "=== benchmarks and probes"
  # Most wanted first (issue targets, then the long multi-process all-reduce), then any others.
  ordered=(benchmarks/bench_quantize.py benchmarks/probe_cudnn.py benchmarks/bench_dot.py
           benchmarks/bench_hopper_mx.py benchmarks/bench_allreduce.py)
  # bench_cpu is the CPU table (issue 18) that CI prints (.ci/bench_cpu.sh): no device time for it.
  for f in benchmarks/bench_*.py benchmarks/probe_*.py; do
    [ "$f" = benchmarks/bench_cpu.py ] && continue
    [[ " ${ordered[*]} " == *" $f "* ]] || ordered+=("$f")
  done
  for bench in "${ordered[@]}"; do
    [ -f "$bench" ] || continue
    name=$(basename "$bench" .py)
    if [ "$name" = bench_hopper_mx ] && [ "${HOPPER_MX_OK:-1}" = 0 ]; then
      echo "bench_hopper_mx: skipped (the hopper_mx tests failed or timed out; its numbers would mean nothing)"
      echo "bench_hopper_mx (the hopper_mx tests failed or timed out)" >> "$WORK/skipped.txt"
      continue
    fi
    args=(--out "$WORK/$name.json")
    [ "$QUICK" = 1 ] && args+=(--quick)
    [ "$name" = bench_dot ] && args+=(--plot "$WORK/bench_dot.png")  # issue 4's LLM-shape plot
    # a hopper_mx kernel that failed its tests (it may hang) stays out of the dot table
    [ "$name" = bench_dot ] && [ "${HOPPER_MX_OK:-1}" = 0 ] && args+=(--skip-backends hopper_mx)
    limit=$(bound "$name" "${BENCH_TIMEOUT_S:-240}") || continue
    (cd / && timeout "$limit" "$PY" "$OLDPWD/$bench" "${args[@]}") 2>&1 | tee "$WORK/$name.txt"
    rc=${PIPESTATUS[0]}
    echo "$name: exit $rc"
    # write_results.py reports a step that left no JSON by this exit status and its log's tail
    echo "$name $rc" >> "$WORK/bench_exits.txt"
    write_results
  done
fi

echo "=== results"
write_results
exit $status
