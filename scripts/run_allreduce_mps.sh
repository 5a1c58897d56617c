#!/usr/bin/env bash
# Runs NPROC jax.distributed ranks of scripts/allreduce_mps_worker.py on ONE GPU under a CUDA
# MPS daemon that this script starts and stops (several NVSHMEM PEs on one GPU work fully only
# under MPS, with CUDA_MPS_ACTIVE_THREAD_PERCENTAGE summing to <= 100: REFERENCE section 5).
# GPU_PER_RANK=1 instead gives rank r GPU r alone (CUDA_VISIBLE_DEVICES) and starts no MPS daemon
# (benchmarks/bench_allreduce.py, where there are enough GPUs).
#   usage: run_allreduce_mps.sh NPROC MODE     MODE: plain | command_buffer | timeout | bench [args]
# Never hangs: every rank runs under `timeout` (WORKER_TIMEOUT_S, default 540 s; whoever bounds
# this script passes a smaller one: ranks < this script < its caller) in a process group of its
# own, and the first rank to fail ends the run: the others would wait for it in NVSHMEM until
# their own timeouts. On any exit, SIGTERM and SIGINT included, the ranks' groups are killed and
# the MPS daemon is stopped. MPS_TMP_ROOT (default: the system's temporary directory) holds this
# run's directory, with the MPS pipe and the ranks' process-group ids (rank_pgids): should this
# script be killed outright (SIGKILL runs no trap), scripts/gpu_run.sh finds them there and stops
# both.
# Exit status 3 (ENV_EXIT) with a line "ENVIRONMENT: <why>" on stderr: this machine cannot run the
# ranks (no MPS control binary, an MPS daemon that does not answer, NVSHMEM without full
# multi-process-per-GPU support), as distinct from a failure of our code; write_results.py and
# tests/collectives/test_allreduce.py report it as such.
set -euo pipefail
ENV_EXIT=3
env_fail() { echo "ENVIRONMENT: $*" >&2; exit "$ENV_EXIT"; }
NPROC=${1:?nproc}; MODE=${2:?mode}; shift 2
PY=${PYTHON:-python3}
HERE=$(cd "$(dirname "$0")" && pwd)
WORKER_TIMEOUT_S=${WORKER_TIMEOUT_S:-540}
GPU_PER_RANK=${GPU_PER_RANK:-0}
mkdir -p "${MPS_TMP_ROOT:=${TMPDIR:-/tmp}}"
TMP=$(mktemp -d "$MPS_TMP_ROOT/allreduce.XXXXXX")
export CUDA_MPS_PIPE_DIRECTORY=$TMP/pipe CUDA_MPS_LOG_DIRECTORY=$TMP/log
mkdir -p "$CUDA_MPS_PIPE_DIRECTORY" "$CUDA_MPS_LOG_DIRECTORY" "$TMP/nvshmem"

pids=()  # one per rank; each is its process group's id (setsid below)
cleanup() {
  local rc=$?
  for p in "${pids[@]}"; do kill -KILL -- "-$p" 2>/dev/null || true; done
  wait
  # NVSHMEM's init log, bounded: whether full MPG support was found; every log's tail on failure.
  grep -h "MPG" "$TMP"/nvshmem/* 2>/dev/null | head -n "$((2 * NPROC))" >&2 || true
  if ((rc != 0)); then
    for f in "$TMP"/nvshmem/* "$CUDA_MPS_LOG_DIRECTORY"/*; do
      if [[ -f $f ]]; then echo "== ${f#"$TMP"/} (last 30 lines)"; tail -n 30 "$f"; fi >&2
    done
  fi
  if [[ $GPU_PER_RANK != 1 ]]; then echo quit | timeout 5 nvidia-cuda-mps-control >/dev/null 2>&1 || true; fi
  rm -rf "$TMP"
}
trap cleanup EXIT
trap 'exit 143' TERM
trap 'exit 130' INT
if [[ $GPU_PER_RANK != 1 ]]; then
  command -v nvidia-cuda-mps-control >/dev/null \
    || env_fail "nvidia-cuda-mps-control is not on PATH: several NVSHMEM PEs on one GPU need CUDA MPS"
  nvidia-cuda-mps-control -d || env_fail "nvidia-cuda-mps-control -d failed with exit status $?"
  # The daemon forks and opens its pipe in CUDA_MPS_PIPE_DIRECTORY: wait until it answers a query
  # (an empty server list is an answer), so a dead daemon is this reason, not NVSHMEM's limited MPG.
  # At most MPS_WAIT_S (+2 s for the last query): part of the margin between a rank's bound and
  # whoever bounds this script.
  answered=0 deadline=$((SECONDS + ${MPS_WAIT_S:-8}))
  while ((SECONDS < deadline)); do
    if echo get_server_list | timeout 2 nvidia-cuda-mps-control >/dev/null 2>&1; then answered=1; break; fi
    sleep 0.25
  done
  ((answered)) || env_fail "the MPS control daemon does not answer on $CUDA_MPS_PIPE_DIRECTORY (see its log below)"
  export CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=$((100 / NPROC))
fi
export XLA_PYTHON_CLIENT_PREALLOCATE=false NVSHMEM_DISABLE_NCCL=1 NVSHMEM_REMOTE_TRANSPORT=none
# Every rank is on this host: NVSHMEM's unique-id bootstrap would prefer a non-loopback interface.
export NVSHMEM_BOOTSTRAP_UID_SOCK_IFNAME=lo
# NVSHMEM's INFO log says whether full MPG support is available; one file per rank (%p: pid),
# summarized by cleanup so the output stays bounded.
export NVSHMEM_DEBUG=${NVSHMEM_DEBUG:-INFO} NVSHMEM_DEBUG_FILE=$TMP/nvshmem/%h.%p.log
# Every all_reduce wait's deadline (the timeout mode passes its own). The worker meets its peers
# at a barrier before running each compiled program, so this bounds a real hang, not compile skew.
export JAX_GPUEXT_ALLREDUCE_TIMEOUT_S=${JAX_GPUEXT_ALLREDUCE_TIMEOUT_S:-60}
PORT=$((20000 + RANDOM % 20000))
for ((r = 0; r < NPROC; r++)); do
  # setsid: the rank leads a new process group (its pid), so one kill reaches all it started.
  # timeout: SIGTERM after WORKER_TIMEOUT_S, SIGKILL 5 s later.
  if [[ $GPU_PER_RANK == 1 ]]; then export CUDA_VISIBLE_DEVICES=$r; fi
  setsid timeout -k 5 "$WORKER_TIMEOUT_S" \
    "$PY" "$HERE/allreduce_mps_worker.py" --rank "$r" --nproc "$NPROC" --port "$PORT" --mode "$MODE" "$@" &
  pids+=($!)
  echo "$!" >> "$TMP/rank_pgids"
done
rc=0
for ((r = 0; r < NPROC; r++)); do
  wait -n || {
    rc=$?
    if ((rc == ENV_EXIT)); then
      echo "ENVIRONMENT: a rank could not run here (its ENVIRONMENT line says why): stopping the others" >&2
    else
      echo "a rank exited with status $rc: stopping the others" >&2
    fi
    break
  }
done
exit $rc
