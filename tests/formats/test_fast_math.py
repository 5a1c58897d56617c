"""The CUDA kernels' per-element fast paths (csrc/formats/block_scaled_fast.h), compiled for the host
with g++ and checked against the scalar rules of block_scaled_math.h (the CPU handler's, tested
against the float64 model in test_formats.py): every bf16 value at every MX scale exponent, FP8
divisors around the 2^-91 fast-path bound and E4M3 ties, NVFP4 threshold tables for 8 global scales
and every E4M3 block scale, dequantize of every code at every 8-bit scale. The hardware conversions
the GPU uses instead of two of these functions are checked on the GPU (test_formats_gpu.py)."""

from __future__ import annotations

import pathlib
import shutil
import subprocess

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]


def test_fast_paths_match_the_scalar_rules(tmp_path):
    cxx = shutil.which("g++") or shutil.which("c++")
    if cxx is None:
        pytest.skip("no C++ compiler (g++) on PATH")
    exe = tmp_path / "fast_math_check"
    # -ffp-contract=off: no FMA contraction, as the rules' single IEEE operations require
    build = subprocess.run([cxx, "-O2", "-std=c++17", "-ffp-contract=off", f"-I{ROOT}",
                            str(ROOT / "tests/formats/fast_math_check.cc"), "-o", str(exe)],
                           capture_output=True, text=True, timeout=600)
    assert build.returncode == 0, build.stderr[-4000:]
    run = subprocess.run([str(exe)], capture_output=True, text=True, timeout=600)
    assert run.returncode == 0 and run.stdout.startswith("ok "), run.stdout[-2000:] + run.stderr[-2000:]
    assert int(run.stdout.split()[1]) > 300_000_000  # the sweep ran whole
