# Sourced by .ci/run and .ci/wheel.sh: what the two ends of the supported jax range (0.7.0 from the
# wheel, the newest on Python >= 3.12) run. They test that the package works on those jax versions:
# every test of the package runs, the fuzz suite with 2 examples per area (every area's code path on
# that jax; the full CI budget runs in the README leg and under ASan in the sanitizer leg). Left to
# the README leg (jax of Python 3.11's newest release): the tests of the repository's own tooling,
# which tests no jax behaviour of the package: scripts/gpu_run.sh and its results
# (test_results_script.py), the verification record (test_verified.py) and the GPU benchmark
# harness, which runs on the GPU machine's jax only (test_benchmarks.py). docs/design.md, "CI time".
VERSION_LEG_ENV=(JAX_GPUEXT_FUZZ_EXAMPLES=2)  # for env: not exported, the sanitizer leg runs the CI budget
VERSION_LEG_PYTEST_ARGS=(-q -p no:cacheprovider
  --ignore=tests/common/test_results_script.py
  --ignore=tests/common/test_verified.py
  --ignore=tests/common/test_benchmarks.py)
