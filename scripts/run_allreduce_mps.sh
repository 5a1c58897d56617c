#!/usr/bin/env bash
# Runs NPROC jax.distributed ranks of scripts/allreduce_mps_worker.py on ONE GPU under a CUDA
# MPS daemon that this script starts and stops (several NVSHMEM PEs on one GPU work fully only
# under MPS, with CUDA_MPS_ACTIVE_THREAD_PERCENTAGE summing to <= 100: REFERENCE section 5).
#   usage: run_allreduce_mps.sh NPROC MODE     MODE: plain | command_buffer | timeout | bench [args]
set -euo pipefail
NPROC=${1:?nproc}; MODE=${2:?mode}; shift 2
PY=${PYTHON:-python3}
HERE=$(cd "$(dirname "$0")" && pwd)
TMP=$(mktemp -d)
export CUDA_MPS_PIPE_DIRECTORY=$TMP/pipe CUDA_MPS_LOG_DIRECTORY=$TMP/log
mkdir -p "$CUDA_MPS_PIPE_DIRECTORY" "$CUDA_MPS_LOG_DIRECTORY"
nvidia-cuda-mps-control -d
stop_mps() { echo quit | nvidia-cuda-mps-control || true; rm -rf "$TMP"; }
trap stop_mps EXIT
export CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=$((100 / NPROC))
export XLA_PYTHON_CLIENT_PREALLOCATE=false NVSHMEM_DISABLE_NCCL=1 NVSHMEM_REMOTE_TRANSPORT=none
PORT=$((20000 + RANDOM % 20000))
pids=()
for ((r = 0; r < NPROC; r++)); do
  "$PY" "$HERE/allreduce_mps_worker.py" --rank "$r" --nproc "$NPROC" --port "$PORT" --mode "$MODE" "$@" &
  pids+=($!)
done
rc=0
for p in "${pids[@]}"; do wait "$p" || rc=1; done
exit $rc
