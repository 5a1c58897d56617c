#!/usr/bin/env bash
# CI sanitizer leg (issue 15). Run from the repo root after the newest leg built .venv-newest (or the
# README's test command built .venv): the CPU kernel clone that venv loads is the one the other legs run.
#  1. _cpu built with AddressSanitizer + UndefinedBehaviorSanitizer into .venv-asan (own build dir),
#     then the CPU handler tests and the fuzz suite run with libasan/libubsan preloaded into python:
#     any report stops the process (halt_on_error) and fails the leg.
#  2. ThreadSanitizer over the CPU all-reduce protocol's host threads (tests/native/cpu_protocol_tsan.cc).
# Subset (23 min here on 2 slow AVX2 cores, 2026-11-28, ASan build included): the tests whose code reaches our C++ on CPU
# (formats, memory, all_reduce and its protocol semantics, the handlers' size checks) plus
# tests/fuzz; the dot / hopper_mx / cuDNN tests run the jnp reference or skip on CPU and would add
# minutes without executing a line of sanitized code. XLA compiles at LLVM -O0 (as in the version legs,
# .ci/version_legs.sh): most of a test's time is XLA compiling, and none of XLA is instrumented.
set -euo pipefail
cd "$(dirname "$0")/.."
export PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_PROGRESS_BAR=off
step() { echo; echo "=== $* ($(date +%H:%M:%S))"; }

step "build _cpu with -fsanitize=address,undefined,float-cast-overflow"
python3 -m venv .venv-asan
# The CPU format kernels come in clones (x86-64-v4, v3, SSE2 baseline) and the loader runs the
# best this CPU takes: the other legs test that one. This leg builds one level below it, so each
# CI run tests the bits of two: without the v4 clone on an AVX-512 machine (v3 runs), without
# clones on an AVX2 one (the baseline runs, which only pre-AVX2 CPUs would otherwise reach).
kernels() { "$1" -P -c "import jax_gpuext._cpu as m; print(m.build_info()['cpu_kernels'])"; }
main_py=.venv-newest/bin/python
[ -x "$main_py" ] || main_py=.venv/bin/python
main_clone=$(kernels "$main_py")
case "$main_clone" in
  x86-64-v4*) below="JAX_GPUEXT_CPU_AVX512=OFF"; expect="x86-64-v3" ;;
  x86-64-v3*) below="JAX_GPUEXT_CPU_MULTIVERSION=OFF"; expect="baseline" ;;
  *) below="JAX_GPUEXT_CPU_MULTIVERSION=ON"; expect="${main_clone%% *}" ;;  # the lowest already
esac
env $below JAX_GPUEXT_CUDA=OFF JAX_GPUEXT_SANITIZE=address,undefined,float-cast-overflow \
  .venv-asan/bin/pip install -q -C build-dir=build/asan '.[test]'
libs="$(gcc -print-file-name=libasan.so) $(gcc -print-file-name=libubsan.so)"
# (the sanitized module loads only with the runtimes preloaded, as for the tests below)
asan_clone=$(ASAN_OPTIONS=detect_leaks=0:verify_asan_link_order=0 LD_PRELOAD="$libs" kernels .venv-asan/bin/python)
echo "CPU kernels: the other legs ran $main_clone; this leg runs $asan_clone ($below)"
case "$asan_clone" in
  "$expect"*) ;;
  *) echo "FAILED: this leg was to run the $expect clone, it runs $asan_clone" >&2; exit 1 ;;
esac

step "CPU tests + fuzz suite under ASan/UBSan"
log=$(mktemp)
# detect_leaks=0: CPython and XLA keep allocations until exit by design. Python itself is not
# instrumented, so only our module's accesses (and interposed malloc/free) are checked.
ASAN_OPTIONS=detect_leaks=0:halt_on_error=1:abort_on_error=1:verify_asan_link_order=0:allocator_may_return_null=1 \
UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 LD_PRELOAD="$libs" \
XLA_FLAGS=--xla_backend_optimization_level=0 \
  .venv-asan/bin/pytest -q -p no:cacheprovider tests/formats/test_formats.py tests/memory/test_memory.py tests/collectives/test_allreduce.py \
  tests/collectives/test_allreduce_semantics.py tests/common/test_handler_size_checks.py tests/fuzz 2>&1 | tee "$log"
status=${PIPESTATUS[0]}
if grep -qE "ERROR: AddressSanitizer|runtime error:|SUMMARY: (Address|UndefinedBehavior)Sanitizer" "$log"; then
  echo "FAILED: sanitizer reports above" >&2; exit 1
fi
[ "$status" -eq 0 ] || { echo "FAILED: tests under the sanitizers (exit $status)" >&2; exit "$status"; }

step "ThreadSanitizer: CPU all-reduce protocol"
g++ -std=c++17 -O1 -g -fsanitize=thread -I. tests/native/cpu_protocol_tsan.cc csrc/allreduce/cpu_protocol.cc \
  -o build/cpu_protocol_tsan -pthread
TSAN_OPTIONS=halt_on_error=1 build/cpu_protocol_tsan
echo "sanitizer leg passed"
