# Sourced by .ci/run and .ci/wheel.sh: what the two ends of the supported jax range (0.7.0 from the
# wheel, the newest on Python >= 3.12) run. They test that the package works on those jax versions:
# every test of the package runs, the fuzz suite with 2 examples per area (every area's code path on
# that jax; the full CI budget runs in the README leg and under ASan in the sanitizer leg). Left to
# the README leg (jax of Python 3.11's newest release): the tests of the repository's own tooling,
# which tests no jax behaviour of the package: scripts/gpu_run.sh and its results
# (test_results_script.py), the verification record (test_verified.py) and the GPU benchmark
# harness, which runs on the GPU machine's jax only (test_benchmarks.py). docs/design.md, "CI time".
# Also left to the README leg: the SASS tests (nvcc's output, no jax in them) and the heaviest tests
# (tests/version_legs_deselect.txt: each >= 5 s there, ~50 % of the suite's time in 96 tests; the
# lighter tests exercise the same ops, transformations and export paths on each jax). XLA compiles
# at LLVM -O0 here: most of a CPU test's time is XLA compiling small programs, and what these legs
# test (each jax's API, tracing, lowering, the custom calls) does not depend on LLVM's passes; the
# README leg keeps XLA's default, the users'. docs/design.md, "Both lanes from the start, lean version legs".
VERSION_LEG_ENV=(JAX_GPUEXT_FUZZ_EXAMPLES=2 XLA_FLAGS=--xla_backend_optimization_level=0)  # for env: not exported
VERSION_LEG_PYTEST_ARGS=(-q -p no:cacheprovider
  --ignore=tests/common/test_results_script.py
  --ignore=tests/common/test_verified.py
  --ignore=tests/common/test_benchmarks.py
  --ignore=tests/formats/test_quantize_sass.py)
while IFS= read -r _deselect; do
  case "$_deselect" in ''|'#'*) ;; *) VERSION_LEG_PYTEST_ARGS+=(--deselect "$_deselect") ;; esac
done < "$(dirname "${BASH_SOURCE[0]}")/../tests/version_legs_deselect.txt"
