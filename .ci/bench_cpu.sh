#!/usr/bin/env bash
# CPU speed tables (issues 18, 30): quantize / dequantize, a scaled_dot_general training step and
# the grouped dot, against baselines measured in the same run. Prints the table; no pass/fail on timings.
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
# Issue 30: the grouped dot (ragged_dot / scaled_ragged_dot) against lax.ragged_dot in bf16.
"$venv/bin/python" -P "$root/benchmarks/bench_ragged_dot_cpu.py" --quick
