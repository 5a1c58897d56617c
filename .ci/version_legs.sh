# Sourced by .ci/run and .ci/wheel.sh: what the two ends of the supported jax range (0.7.0 from the
# wheel, the newest on Python >= 3.12) run. They test that the package works on those jax versions:
# each jax's API, tracing, lowering and our custom calls. Every test function runs; of a
# parametrized one, only the variants needed for each parameter value to run once
# (--param-subset=each-value, tests/_param_subset.py: every format, dtype and backend still runs on
# each jax); the fuzz suite with 2 examples per area (every area's code path on that jax; the full CI
# budget runs in the README leg and under ASan in the sanitizer leg). Left to the README leg, which
# runs everything: the tests of the repository's own tooling, which test no jax behaviour of the
# package (scripts/gpu_run.sh and its results: test_results_script.py; the verification record:
# test_verified.py; the GPU benchmark harness, which runs on the GPU machine's jax only:
# test_benchmarks.py), the SASS tests (nvcc's output, no jax in them) and the heaviest tests
# (tests/version_legs_deselect.txt, which says how they were chosen). XLA compiles at LLVM -O0 here:
# most of a CPU test's time is XLA compiling small programs, and what these legs test does not
# depend on LLVM's passes; the README leg keeps XLA's default, the users'. docs/design.md, "Both
# lanes from the start, lean version legs" and "CI time: each value once in the version legs".
VERSION_LEG_ENV=(JAX_GPUEXT_FUZZ_EXAMPLES=2 XLA_FLAGS=--xla_backend_optimization_level=0)  # for env: not exported
VERSION_LEG_PYTEST_ARGS=(-q -p no:cacheprovider --param-subset=each-value
  --ignore=tests/common/test_results_script.py
  --ignore=tests/common/test_verified.py
  --ignore=tests/common/test_benchmarks.py
  --ignore=tests/formats/test_quantize_sass.py)
while IFS= read -r _deselect; do
  case "$_deselect" in ''|'#'*) ;; *) VERSION_LEG_PYTEST_ARGS+=(--deselect "$_deselect") ;; esac
done < "$(dirname "${BASH_SOURCE[0]}")/../tests/version_legs_deselect.txt"
