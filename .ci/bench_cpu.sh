#!/usr/bin/env bash
# CPU speed table (issue 18): quantize / dequantize and a scaled_dot_general training step
# against baselines measured in the same run. Prints the table; no pass/fail on timings.
# Run from the repo root with the README's .venv built. About a minute on the 2-core dev machine.
# On the newest leg's venv where .ci/run built one: the training step's target is against jax 0.12's
# jax.nn.scaled_dot_general, which jax 0.7 and 0.10 (tried) cannot lower on CPU.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
# From /tmp, so the source tree does not shadow the installed package (tests/conftest.py's rule).
cd /tmp
venv="$root/.venv-newest"
[ -x "$venv/bin/python" ] || venv="$root/.venv"
"$venv/bin/python" -P "$root/benchmarks/bench_cpu.py" --quick
