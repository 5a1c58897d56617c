#!/usr/bin/env bash
# The one GPU script: install the wheel built beforehand, run the GPU tests and the benchmarks,
# write the results after every step (docs/design.md, "Running the GPU script through the device tool").
#
#   scripts/gpu_run.sh [--part 1|2] [--install wheel|build|installed] [--wheel FILE] [--only STEP,...]
#
# --part 1 (default) is the first call, most-wanted first, within GPU_RUN_BUDGET_S (default 480 s);
# --part 2 the optional second call (default budget 240 s): what part 1 leaves out.
# --install wheel (default): `pip install --no-index --no-deps --target $GPU_RUN_SITE` of the
#   wheel in .whl/ (scripts/gpu_wheel.sh, built on a CPU machine beforehand); nothing is compiled here.
#   build: the old in-place build (sm_90a; 2-3 minutes, so give it a larger budget); installed: the
#   jax_gpuext already importable (the CPU dry run of tests/common/test_results_script.py).
# --only: run just these steps of the part (a rerun after a fix).
#
# Every step runs under `timeout`, bounded by its own limit and by what is left of the budget less
# GPU_RUN_RESERVE_S; a step whose expected time no longer fits is not started and is listed in the
# results as not run. Each step's bound contains the bounds of what it starts (a rank < its test <
# the step), and after each step whatever it left behind (all-reduce ranks, an MPS daemon) is stopped.
# Writes $RESULTS_DIR/<date>-<time>-<device>-part<N>.{json,md} (default benchmarks/results/) after
# every step. GPU_RUN_COMMIT names the commit of this tree (the device tool copies it without .git);
# unset, the results name the commit the installed build records.
#
# GPU_RUN_DRY_RUN=1 (CPU, tests only): env, install and info run; every other step runs
# $GPU_RUN_DRY_STUB (default `true`) instead of its command, with GPU_RUN_STEP / GPU_RUN_STEP_BOUND
# set and the command as arguments, and the clock advances by the step's expected time.
set -uo pipefail
cd "$(dirname "$0")/.."
PART=1; INSTALL=wheel; WHEEL=""; ONLY=""
while [ $# -gt 0 ]; do
  case "$1" in
    --part) PART="$2"; shift ;; --install) INSTALL="$2"; shift ;; --wheel) WHEEL="$2"; shift ;;
    --only) ONLY=",$2,"; shift ;;
    *) echo "unknown argument $1" >&2; exit 2 ;;
  esac; shift
done
case "$PART" in 1|2) ;; *) echo "--part must be 1 or 2" >&2; exit 2 ;; esac
case "$INSTALL" in wheel|build|installed) ;; *) echo "--install must be wheel, build or installed" >&2; exit 2 ;; esac

# The steps of each part, most wanted first: name, bound, expected time and (optional) the least
# bound worth starting it with, in seconds. A step starts only if what is left of the budget covers
# its expected time and that least bound; its bound is then capped by what is left. The expected
# times sum to less than the part's budget; docs/design.md's time table ("Benchmarks that measure
# the hardware") is this table.
# Expected times are those the first H200 run measured (2026-11-27, eff6f45) plus a margin, where
# the step ran to its end there; the benchmarks stop on their own at their expected time
# (--time-limit, below) and list what they left out (docs/design.md, "Benchmarks that measure the
# hardware").
STEPS_1=(
  "env 20 5"
  "install 60 10"
  "info 45 5"                  # measured 4-5 s
  "tests_main 180 120"         # every GPU test but formats', hopper_mx's, the grouped kernels' and the multi-process ones
  "tests_formats 240 170"      # the CUDA quantize / dequantize kernels, bit for bit: 87 tests, the kernel
                               # timing first (run_first); estimated, ~1-4 s a test (eff6f45: 3.5 s each)
  "tests_hopper_mx 90 55"      # the raw-PTX kernel, in isolated children (measured 42 s in process at eff6f45)
  "bench_quantize 45 25"       # --quick: bfloat16, 256 MiB, every format, both axes (measured 22 s)
  "bench_dot 55 25"            # --quick (8192^3); hopper_mx left out unless its tests passed (measured 18 s)
  "bench_hopper_mx 45 10"      # only if its tests passed (measured 8 s)
  "probe_cudnn 30 5"           # measured 2-3 s
  "memcheck 90 20"             # compute-sanitizer memcheck on one small target (measured 12-14 s)
)
STEPS_2=(
  "env 20 5"
  "install 60 10"
  "info 45 5"
  "tests_ragged_hopper 180 130"  # the grouped sm_90a kernels (forward, dgrad, wgrad, masked) and the one-pass wgrad
                                 # operand kernel (~30 s: 12 compiles and 2 training steps), isolated children
  "allreduce_2_plain 150 40 110"  # 2 ranks under MPS, every dtype x op x algorithm x size (measured 16 s)
  "allreduce_2_timeout 90 15 80"  # a missing peer is named within the timeout (measured 11-13 s)
  "allreduce_2_command_buffer 120 20 100"  # measured 6-16 s
  "bench_ragged_dot 100 60"    # forward and training step at issue 30's, DeepSeek-V3's and gpt-oss's shapes
  "memcheck_ragged 90 15"      # memcheck on the grouped kernel's skewed layout (the trap of eff6f45; measured 5 s)
  "memcheck_token_slots 60 15"  # memcheck on the one-pass wgrad operand kernel fed a hostile block table
  "bench_dot_full 110 50"      # the whole dot table (8192^3 and LLM shapes) and its plot (measured 40 s for 2 shapes)
  "bench_quantize_full 90 50"  # bfloat16, float32 and float16 at 16384^2, and PyTorch's copy beside ours
  "racecheck 75 45"            # compute-sanitizer racecheck on one tiny target (measured 44 s)
  "bench_allreduce 90 20 70"   # measured 8-9 s
  "allreduce_4_plain 150 80 120"
)
DEFAULT_BUDGET=(0 480 240)
PY=${PYTHON:-python3}
RESULTS_DIR=${RESULTS_DIR:-benchmarks/results}
BUDGET=${GPU_RUN_BUDGET_S:-${DEFAULT_BUDGET[$PART]}}
RESERVE=${GPU_RUN_RESERVE_S:-10}  # for the results written at the end
KILL_AFTER=10                     # a step's command gets SIGKILL this long after its signal
DRY=${GPU_RUN_DRY_RUN:-0}
SITE=${GPU_RUN_SITE:-/tmp/jax_gpuext_site}
WORK=$(mktemp -d); mkdir -p "$RESULTS_DIR" "$WORK/mps"
REPO=$PWD
export GPU_RUN_PART=$PART GPU_RUN_STAMP=${GPU_RUN_STAMP:-$(date -u +%Y-%m-%d-%H%M)} MPS_TMP_ROOT=$WORK/mps
export PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false JAX_GPUEXT_REQUIRE_GPU=1
# The tests must exercise every GPU backend, verified or not: `auto` takes unverified ones here
# (jax_gpuext/common/verified.py). The junit files record which backend each test verifies, and the
# results carry the build's source fingerprints; scripts/update_verified.py turns them into the record.
export JAX_GPUEXT_ALLOW_UNVERIFIED=1
if [ "$INSTALL" = wheel ]; then
  export PYTHONPATH="$SITE${PYTHONPATH:+:$PYTHONPATH}"
  if [ -z "$WHEEL" ]; then
    WHEEL=$(ls .whl/jax_gpuext-*.whl 2>/dev/null | head -1)
    [ -n "$WHEEL" ] || { echo "no wheel in .whl/: build it beforehand (scripts/gpu_wheel.sh) or pass --install build" >&2; exit 2; }
  fi
fi
# The tests after the reorganisation of tests/ by capability, or before it.
HOPPER_TESTS=$(ls tests/dot/test_hopper_mx.py tests/test_hopper_mx.py 2>/dev/null | head -1)
RAGGED_HOPPER_TESTS=tests/ragged_dot/test_ragged_dot_hopper.py
# the one-pass wgrad operand kernel: in the grouped kernels' step, whose junit file the bench reads
# (its training step runs this kernel too)
TOKEN_SLOTS_TESTS=tests/ragged_dot/test_token_slots.py
FORMATS_TESTS=tests/formats/test_formats_gpu.py  # the CUDA quantize kernels: their own step and budget
# The GPU tests of what auto runs on CUDA while our kernels are unverified (the xla backends of the
# dense and grouped dots): tests_main runs these files first, so its bound cuts other tests, never
# these (the run of 3ff9b82 stopped tests_main at its bound before the grouped xla path's GPU tests)
XLA_PATH_TESTS="tests/ragged_dot/test_ragged_dot_xla_tiles.py tests/ragged_dot/test_ragged_dot_xla_nonfinite.py
  tests/ragged_dot/test_ragged_extreme_scales.py tests/dot/test_dot_xla.py"
ALLREDUCE_TESTS=$(ls tests/collectives/test_allreduce.py tests/test_allreduce.py 2>/dev/null | head -1)

write_results() {
  "$PY" scripts/write_results.py --work "$WORK" --out-dir "$RESULTS_DIR" --tests-status "$status" >/dev/null
}

# Whatever a step left behind: ranks of a run_allreduce_mps.sh that was killed outright (its trap
# never ran) and the MPS daemon it started. Each such run leaves its directory under $MPS_TMP_ROOT.
sweep() {
  local d pg
  for d in "$WORK"/mps/allreduce.*; do
    [ -d "$d" ] || continue
    if [ -f "$d/rank_pgids" ]; then
      while read -r pg; do
        kill -KILL -- "-$pg" 2>/dev/null && echo "after $1: killed the leftover rank process group $pg" >> "$WORK/cleanup.txt"
      done < "$d/rank_pgids"
    fi
    if [ -d "$d/pipe" ] && command -v nvidia-cuda-mps-control >/dev/null 2>&1; then
      echo quit | CUDA_MPS_PIPE_DIRECTORY="$d/pipe" timeout 10 nvidia-cuda-mps-control >/dev/null 2>&1 \
        && echo "after $1: stopped a leftover MPS daemon" >> "$WORK/cleanup.txt"
    fi
    rm -rf "$d"
  done
}

status=0
finish() { sweep "the run"; write_results; echo "results: $RESULTS_DIR (work files: $WORK)"; }
trap finish EXIT
trap 'exit 143' TERM
trap 'exit 130' INT

# ---------------------------------------------------------------- the steps' commands
step_env() {  # what the machine has, before anything is installed: the results keep it
  {
    echo "## nvidia-smi"
    nvidia-smi --query-gpu=name,driver_version,memory.total,compute_cap,compute_mode,mig.mode.current --format=csv 2>&1
    nvidia-smi -L 2>&1
    echo "## python"; "$PY" -VV
    echo "## pip: jax and NVIDIA packages"
    "$PY" -m pip list 2>/dev/null | grep -iE '^(jax|jaxlib|jax-cuda|nvidia|cuda|ml.dtypes|numpy|pytest|flax) '
    echo "## tools"
    for t in nvidia-cuda-mps-control compute-sanitizer ncu nvcc; do echo "$t: $(command -v "$t" || echo MISSING)"; done
    echo "## /dev/shm (NVSHMEM's intra-node bootstrap and MPS use it)"; df -h /dev/shm 2>&1 | tail -1
    echo "## glibc"; ldd --version 2>&1 | head -1
    echo "## CPU"; nproc
  } > "$WORK/environment.txt" 2>&1
  cat "$WORK/environment.txt"
}

step_install() {
  case "$INSTALL" in
    wheel)
      [ -f "$WHEEL" ] || { echo "no wheel $WHEEL" >&2; return 1; }
      cp "$(dirname "$WHEEL")/wheel.json" "$WORK/wheel.json" 2>/dev/null || echo "(no wheel.json next to $WHEEL)"
      rm -rf "$SITE"
      # with the runtime dependencies the image may lack (scripts/gpu_wheel.sh puts them in deps/)
      local deps=("$(dirname "$WHEEL")"/deps/*.whl)
      [ -e "${deps[0]}" ] || deps=()
      "$PY" -m pip install -q --no-index --no-deps --target "$SITE" "$WHEEL" "${deps[@]}" || return 1 ;;
    build)
      # sm_90a only: the H100 is the target here, and it keeps the build short.
      JAX_GPUEXT_CUDA=ON JAX_GPUEXT_CUDA_ARCHITECTURES="${JAX_GPUEXT_CUDA_ARCHITECTURES:-90a-real}" \
        "$PY" -m pip install --no-build-isolation --no-deps -q . 2>&1 | tail -20
      [ "${PIPESTATUS[0]}" = 0 ] || return 1 ;;
    installed) ;;
  esac
  (cd / && "$PY" -P -c 'import jax_gpuext; print("jax_gpuext from", jax_gpuext.__file__)')
}

step_info() {  # one process for the table and the JSON the results are built from
  (cd / && "$PY" -P -c '
import json, sys
from jax_gpuext.common.capabilities import capabilities, format_table
report = capabilities()
json.dump(report, open(sys.argv[1], "w"), indent=2)
print(format_table(report))' "$WORK/info.json") | tee "$WORK/info.txt"
}

# pytest group NAME ARGS...: from / (the source tree must not shadow the installed package), -v so
# a log cut off by a hang ends with the test that hung, its own junit file. A module that cannot be
# collected there (a test-only package the image lacks) must not cost the whole group: its error
# is reported and the other tests still run.
step_pytest() {
  local name=$1; shift
  cd / && "$PY" -m pytest -p no:cacheprovider -v -rfEs --continue-on-collection-errors \
    --junitxml="$WORK/gpu-tests-$name.xml" "$@"
}

# step_sanitizer KEY: the one target tests/sanitizer_targets.txt names for KEY, "TOOL" or "TOOL:what"
# (a second target of one tool, a step of its own). XLA's allocator
# would hide most out-of-bounds accesses inside its pool: the platform allocator gives every
# buffer its own allocation.
step_sanitizer() {
  local key=$1 tool=${1%%:*} target
  target=$(awk -v t="$key" '$1 == t {print $2; exit}' "$REPO/tests/sanitizer_targets.txt")
  [ -n "$target" ] || { echo "no $key target in tests/sanitizer_targets.txt"; return 2; }
  echo "compute-sanitizer --tool $tool on $target"
  cd / && XLA_PYTHON_CLIENT_ALLOCATOR=platform compute-sanitizer --tool "$tool" --error-exitcode 9 \
    "$PY" -m pytest -p no:cacheprovider -q -x --isolation=off "$REPO/tests/$target"
}

step_mps_test() {  # step_mps_test NPROC MODE BOUND: one all-reduce check under MPS, its bound inside the step's
  local nproc=$1 mode=$2 bound=$3
  # the test < this step: 25 s for pytest's start (JAX, the GPU) before the test and for stopping
  # it (10 s from SIGTERM to SIGKILL) and writing junit after it; the ranks' bound is the test's
  # less MPS_MARGIN_S, 25 s (tests/collectives/test_allreduce.py): bound 150 gives the ranks 90 s
  JAX_GPUEXT_MPS_TEST_TIMEOUT_S=$((bound - KILL_AFTER - 25)) \
    step_pytest "allreduce_${nproc}_$mode" "$REPO/$ALLREDUCE_TESTS::test_gpu_processes_under_mps[$mode-$nproc]"
}

step_bench() {  # step_bench NAME ARGS...
  local name=$1; shift
  cd / && "$PY" "$REPO/benchmarks/$name.py" --out "$WORK/$name.json" "$@"
}

# step_bench_ragged LIMIT SKIP_HOPPER: bench_ragged_dot (the hopper kernel's cells per feature its
# tests passed: --hopper-tests, when that step ran here), with tokamax's ragged_dot beside ours where
# scripts/gpu_wheel.sh --deps fetched its wheels (.whl/deps/tokamax): installed into a folder of
# their own for this step only (the image lacks them; no other step should see them).
step_bench_ragged() {
  local limit=$1 skip=$2 t0=$SECONDS site=$WORK/tokamax_site dir extra=()
  dir=$(cd "$REPO" && cd "$(dirname "${WHEEL:-.whl/none}")" 2>/dev/null && pwd)/deps/tokamax
  if ls "$dir"/*.whl >/dev/null 2>&1; then
    if "$PY" -m pip install -q --no-index --no-deps --target "$site" "$dir"/*.whl; then
      extra=(--extra-site "$site")
    else
      echo "tokamax: installing the wheels of $dir failed: bench_ragged_dot runs without it"
    fi
  else
    echo "tokamax: no wheels in $dir (scripts/gpu_wheel.sh --deps fetches them): bench_ragged_dot runs without it"
  fi
  [ -f "$WORK/gpu-tests-ragged_hopper.xml" ] && extra+=(--hopper-tests "$WORK/gpu-tests-ragged_hopper.xml")
  step_bench bench_ragged_dot --time-limit $((limit - (SECONDS - t0))) ${skip:+--skip-backends hopper} "${extra[@]}"
}
export -f step_env step_install step_info step_pytest step_sanitizer step_mps_test step_bench step_bench_ragged
export PY WORK SITE WHEEL INSTALL REPO ALLREDUCE_TESTS KILL_AFTER

# The command of step NAME with bound BOUND and expected time EST, into the array CMD; returns 1
# (with a reason in SKIP_WHY) for a step that must not run. A benchmark gets --time-limit LIMIT:
# it stops starting work at its expected time (less 2 s to write its results and exit), so the
# steps after it keep theirs, and always well inside its bound.
step_command() {
  local name=$1 bound=$2 est=${3:-$2} limit
  limit=$((est - 2 < bound - KILL_AFTER - 5 ? est - 2 : bound - KILL_AFTER - 5))
  SKIP_WHY=""
  case "$name" in
    env) CMD=(bash -c step_env) ;;
    install) CMD=(bash -c step_install) ;;
    info) CMD=(bash -c step_info) ;;
    # tests/fuzz has no GPU tests and needs hypothesis, which the GPU image need not have
    # pytest collects a file named twice once, where it is first named: XLA_PATH_TESTS run first
    tests_main) CMD=(bash -c 'first=(); for f in $5; do first+=("$REPO/$f"); done
                      step_pytest main "${first[@]}" "$REPO/tests" -m "gpu and not multiprocess" --ignore="$REPO/$1" \
                      --ignore="$REPO/$2" --ignore="$REPO/$3" --ignore="$REPO/$4" --ignore="$REPO/tests/fuzz"' _ \
                      "$HOPPER_TESTS" "$RAGGED_HOPPER_TESTS" "$FORMATS_TESTS" "$TOKEN_SLOTS_TESTS" "$XLA_PATH_TESTS") ;;
    tests_formats) CMD=(bash -c 'step_pytest formats "$REPO/$1" -m gpu' _ "$FORMATS_TESTS") ;;
    tests_hopper_mx) CMD=(bash -c 'step_pytest hopper_mx "$REPO/$1" -m gpu' _ "$HOPPER_TESTS") ;;
    tests_ragged_hopper) CMD=(bash -c 'step_pytest ragged_hopper "$REPO/$1" "$REPO/$2" -m gpu' _ "$RAGGED_HOPPER_TESTS" \
                              "$TOKEN_SLOTS_TESTS") ;;
    bench_ragged_dot)  # the hopper kernel's cells only where its tests passed (per feature: the bench reads them)
      CMD=(bash -c 'step_bench_ragged "$1" "$2"' _ "$limit" "$([ "$RAGGED_HOPPER_OK" = 1 ] || echo skip)") ;;
    bench_quantize) CMD=(bash -c "step_bench bench_quantize --quick --time-limit $limit") ;;
    bench_quantize_full) CMD=(bash -c "step_bench bench_quantize --time-limit $limit") ;;
    bench_dot)
      # a hopper_mx kernel that failed its tests (it may hang) stays out of the dot table
      CMD=(bash -c "step_bench bench_dot --quick --time-limit $limit"' ${1:+--skip-backends hopper_mx}' _ "$([ "$HOPPER_MX_OK" = 1 ] || echo skip)") ;;
    bench_hopper_mx)
      [ "$HOPPER_MX_OK" = 1 ] || { SKIP_WHY="the hopper_mx tests did not pass; its numbers would mean nothing"; return 1; }
      CMD=(bash -c 'step_bench bench_hopper_mx --quick') ;;
    probe_cudnn) CMD=(bash -c 'step_bench probe_cudnn') ;;
    allreduce_2_plain) CMD=(bash -c 'step_mps_test 2 plain "$1"' _ "$bound") ;;
    allreduce_2_timeout) CMD=(bash -c 'step_mps_test 2 timeout "$1"' _ "$bound") ;;
    allreduce_2_command_buffer) CMD=(bash -c 'step_mps_test 2 command_buffer "$1"' _ "$bound") ;;
    allreduce_4_plain) CMD=(bash -c 'step_mps_test 4 plain "$1"' _ "$bound") ;;
    bench_allreduce)
      # its ranks < this step (run_allreduce_mps.sh's WORKER_TIMEOUT_S)
      CMD=(bash -c 'WORKER_TIMEOUT_S=$(($1 - KILL_AFTER - 25)) step_bench bench_allreduce --nproc 2 --quick' _ "$bound") ;;
    bench_dot_full) CMD=(bash -c "step_bench bench_dot --time-limit $limit"' --plot "$WORK/bench_dot.png" ${1:+--skip-backends hopper_mx}' _ "$([ "$HOPPER_MX_OK" = 1 ] || echo skip)") ;;
    memcheck) CMD=(bash -c 'step_sanitizer memcheck') ;;
    memcheck_ragged) CMD=(bash -c 'step_sanitizer memcheck:ragged') ;;
    memcheck_token_slots) CMD=(bash -c 'step_sanitizer memcheck:token_slots') ;;
    racecheck) CMD=(bash -c 'step_sanitizer racecheck') ;;
    *) echo "no command for step $name" >&2; return 2 ;;
  esac
}

# Part 2 may run on a fresh machine: whether hopper_mx passed in part 1 comes from HOPPER_MX_OK.
HOPPER_MX_OK=${HOPPER_MX_OK:-1}
RAGGED_HOPPER_OK=${RAGGED_HOPPER_OK:-1}
steps_var="STEPS_$PART[@]"
for spec in "${!steps_var}"; do
  read -r name want est least <<< "$spec"
  [ -z "$ONLY" ] || [[ $ONLY == *",$name,"* ]] || continue
  # the in-place build: 2-3 minutes of nvcc on the GPU machine (give it GPU_RUN_BUDGET_S to match)
  if [ "$name" = install ] && [ "$INSTALL" = build ]; then want=330; est=180; fi
  left=$((BUDGET - SECONDS - RESERVE))
  least=${least:-$est}; [ "$least" -ge $((KILL_AFTER + 10)) ] || least=$((KILL_AFTER + 10))
  if [ "$left" -lt "$est" ] || [ "$left" -lt "$least" ]; then
    echo "$name (needs ~${est}s and a bound of ${least}s, ${left}s of the budget left)" >> "$WORK/skipped.txt"
    echo "--- $name: not run, the time budget is spent (${SECONDS}s of ${BUDGET}s used)"
    continue
  fi
  bound=$((want < left ? want : left))
  if ! step_command "$name" "$bound" "$est"; then
    echo "$name ($SKIP_WHY)" >> "$WORK/skipped.txt"
    echo "--- $name: not run: $SKIP_WHY"
    continue
  fi
  echo "=== $name (bound ${bound}s, expected ~${est}s; ${SECONDS}s of ${BUDGET}s used)"
  # Its log, under the name write_results.py looks for: gpu-tests-<group>.txt for a test group,
  # <benchmark>.txt for a benchmark, sanitizer-<tool>.txt for compute-sanitizer.
  case "$name" in
    tests_*) id=${name#tests_}; log=$WORK/gpu-tests-$id.txt ;;
    allreduce_*) id=$name; log=$WORK/gpu-tests-$id.txt ;;
    bench_*|probe_*) id=${name%_full}; log=$WORK/$id.txt ;;
    memcheck|racecheck|memcheck_*) id=$name; log=$WORK/sanitizer-$name.txt ;;
    *) id=$name; log=$WORK/$name.txt ;;
  esac
  start=$SECONDS
  if [ "$DRY" = 1 ] && [[ ! " env install info " == *" $name "* ]]; then
    GPU_RUN_STEP=$name GPU_RUN_STEP_BOUND=$bound RESULTS_DIR=$RESULTS_DIR ${GPU_RUN_DRY_STUB:-true} "${CMD[@]}"
    rc=$?
  else
    # pytest at its bound gets SIGINT, so it still writes the junit file of the tests it finished;
    # GNU timeout signals its whole process group, and SIGKILL follows KILL_AFTER later.
    timeout --signal=INT --kill-after="$KILL_AFTER" "$((bound - KILL_AFTER))" "${CMD[@]}" > "$log" 2>&1
    rc=$?
    tail -n 40 "$log"
  fi
  [ "$DRY" = 1 ] && SECONDS=$((start + est))  # the clock a real run would have (see below)
  echo "--- $name: exit $rc after $((SECONDS - start))s"
  echo "$name $bound $est $start $((SECONDS - start)) $rc" >> "$WORK/steps.txt"
  case "$name" in
    tests_*|allreduce_*) echo "$id $rc" >> "$WORK/test_exits.txt"; [ "$rc" = 0 ] || status=$rc ;;
    bench_*|probe_*) echo "$id $rc" >> "$WORK/bench_exits.txt" ;;
    memcheck|racecheck|memcheck_*)
      key=${name/_/:}
      echo "$key $(awk -v t="$key" '$1 == t {print $2; exit}' tests/sanitizer_targets.txt): exit $rc" >> "$WORK/sanitizer.txt" ;;
    install) [ "$rc" = 0 ] || { echo "the install failed: nothing else can run" >&2; exit 1; } ;;
  esac
  # pytest's exit status, not the junit file: one interrupted at its bound (a hang) still writes one
  [ "$name" = tests_hopper_mx ] && HOPPER_MX_OK=$([ "$rc" = 0 ] && echo 1 || echo 0)
  # the grouped kernel's bench cells follow its tests per feature (bench_ragged_dot.py --hopper-tests);
  # a tests step that left no junit file keeps the kernel out of the bench altogether
  [ "$name" = tests_ragged_hopper ] && [ ! -f "$WORK/gpu-tests-ragged_hopper.xml" ] && RAGGED_HOPPER_OK=0
  sweep "$name"
  write_results
  [ "$DRY" = 1 ] && SECONDS=$((start + est))  # the dry run's clock: the expected times alone
done
exit $status
