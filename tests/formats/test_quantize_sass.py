"""The machine code of the quantize / dequantize vector kernels for sm_90a (issue 35; docs/design.md,
"Quantize at memory speed on Hopper"), read from the compiled translation unit with cuobjdump:

- every global load of the input (quantize) or of the codes (dequantize) is 128 bits wide and every
  kernel stores its codes (outputs) with 128-bit stores -- the first GPU run's FP8 128x128 kernel issued
  128 16-bit loads and 65 byte stores per tile, and FP8_TENSOR and dequantize one element at a time;
- no local memory (spills or stack arrays): ptxas's report and the SASS agree;
- registers per thread within the budget that keeps >= 32 KB of loads in flight per SM;
- no flush-to-zero multiply or FMA (the fast paths are exact only with subnormals kept);
- the FP8 element formats use the hardware conversion (F2FP ... E4M3 / E5M2) on sm_90a.

Needs nvcc and cuobjdump (pip: nvidia-cuda-cuobjdump; found on PATH or in site-packages); skipped
without them. Compiling the TU takes minutes on a small machine: it is done once per module."""

from __future__ import annotations

import glob
import os
import pathlib
import re
import shutil
import site
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
TU = ROOT / "csrc/formats/block_scaled_cuda.cu"


def _find(tool: str):
    found = shutil.which(tool)
    if found:
        return found
    roots = site.getsitepackages() + [site.getusersitepackages(), os.path.dirname(os.path.dirname(sys.executable))]
    for root in roots:
        for hit in sorted(glob.glob(os.path.join(root, "nvidia", "*", "bin", tool))) + sorted(
                glob.glob(os.path.join(root, "nvidia", "cuda_*", "bin", tool))):
            if os.access(hit, os.X_OK):
                return hit
    for hit in sorted(glob.glob(f"/usr/local/cuda*/bin/{tool}")):
        return hit
    return None


class Kernel:
    def __init__(self, name: str, sass: str):
        self.name = name
        self.ops = re.findall(r"/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P[T0-9]+\s+)?([A-Z0-9_.]+)", sass)
        self.registers = None
        self.spill = None

    def count(self, pred) -> int:
        return sum(1 for op in self.ops if pred(op))

    def loads(self, width: str | None = None):
        return self.count(lambda op: op.startswith("LDG") and (width is None or op.endswith(width)))

    def stores(self, width: str | None = None):
        return self.count(lambda op: op.startswith("STG") and (width is None or op.endswith(width)))


@pytest.fixture(scope="module")
def kernels(tmp_path_factory):
    nvcc, cuobjdump = _find("nvcc"), _find("cuobjdump")
    if nvcc is None or cuobjdump is None:
        pytest.skip(f"needs nvcc and cuobjdump (pip install nvidia-cuda-cuobjdump): nvcc={nvcc}, cuobjdump={cuobjdump}")
    import jax

    out = tmp_path_factory.mktemp("sass") / "formats.cubin"
    # the flags CMakeLists.txt gives every CUDA source, for the architecture the issue targets
    cmd = [nvcc, "-arch=sm_90a", "-cubin", "-std=c++17", "-O3", f"-I{ROOT}", f"-I{jax.ffi.include_dir()}",
           "-diag-suppress", "940", "--expt-relaxed-constexpr", "-Xptxas", "-v", str(TU), "-o", str(out)]
    build = subprocess.run(cmd, capture_output=True, text=True, timeout=1800)
    assert build.returncode == 0, build.stderr[-6000:]
    dump = subprocess.run([cuobjdump, "-sass", str(out)], capture_output=True, text=True, timeout=600)
    assert dump.returncode == 0, dump.stderr[-2000:]
    found = {}
    for part in re.split(r"\n\s*Function : ", dump.stdout)[1:]:
        name = part.split("\n", 1)[0].strip()
        found[name] = Kernel(name, part)
    current = None
    for line in build.stderr.splitlines():  # ptxas -v
        m = re.search(r"Compiling entry function '(\S+)'", line)
        if m:
            current = found.get(m.group(1))
        elif current is not None and (m := re.search(r"Used (\d+) registers", line)):
            current.registers = int(m.group(1))
        elif current is not None and (m := re.search(r"(\d+) bytes spill stores, (\d+) bytes spill loads", line)):
            current.spill = int(m.group(1)) + int(m.group(2))
    return found


def _select(kernels, stem: str):
    hits = {n: k for n, k in kernels.items() if re.search(rf"3vec\d+{stem}I", n)}
    assert hits, f"no {stem} kernels in the SASS"
    return hits


# Template arguments in the mangled names: <format, input kind, ...>; input kind 0 f32, 1 bf16, 2 f16.
def _args(name: str):
    return [int(a) for a in re.findall(r"L[ib](\d+)E", name.split("I", 1)[1])]


FP8_ELEMENT_FORMATS = {0: "E4M3", 1: "E5M2", 3: "E4M3", 4: "E4M3", 5: "E4M3"}


def _check_common(k: Kernel, max_registers: int):
    assert k.count(lambda op: op.startswith(("LDL", "STL"))) == 0, f"{k.name}: local memory"
    assert k.spill in (0, None), f"{k.name}: {k.spill} bytes spilled"
    assert k.registers is not None and k.registers <= max_registers, f"{k.name}: {k.registers} registers"
    assert k.count(lambda op: op.startswith(("FMUL.FTZ", "FFMA.FTZ"))) == 0, f"{k.name}: flush-to-zero arithmetic"


def test_row_kernels(kernels):
    for name, k in _select(kernels, "QuantizeRowsVec").items():
        fmt, kind = _args(name)[:2]
        per_thread_bytes = (32 if fmt in (2, 6) else 16) * (4 if kind == 0 else 2)
        assert k.loads(".128") == per_thread_bytes // 16, f"{name}: {k.loads('.128')} 128-bit loads"
        assert k.stores(".128") >= 1, f"{name}: codes not stored 128 bits wide"
        _check_common(k, 80)
        if fmt in FP8_ELEMENT_FORMATS:
            assert k.count(lambda op: op.startswith("F2FP") and FP8_ELEMENT_FORMATS[fmt] in op), name


def test_column_and_fused_kernels(kernels):
    for name, k in _select(kernels, "QuantizeColsVec").items():
        args = _args(name)
        fmt, kind, fused = args[0], args[1], args[3]
        wide = k.loads(".128")
        assert wide >= 1 and k.loads() - wide <= 1, f"{name}: {k.loads() - wide} narrow loads"  # +1: the global scale
        assert k.stores(".128") >= (2 if fused else 1), f"{name}: codes not stored 128 bits wide"
        _check_common(k, 128)
        if fmt in FP8_ELEMENT_FORMATS:
            assert k.count(lambda op: op.startswith("F2FP") and FP8_ELEMENT_FORMATS[fmt] in op), name


def test_tile_kernels_load_and_store_128_bits(kernels):
    """FP8_128x128 was 128 16-bit loads and 65 byte stores per tile; now R rows x 16 columns a thread."""
    for name, k in _select(kernels, "QuantizeTilesVec").items():
        kind = _args(name)[0]
        assert k.loads() == k.loads(".128") == (8 if kind == 0 else 8), f"{name}: loads {k.loads()}"
        assert k.stores(".128") >= 1 and k.stores() - k.stores(".128") <= 1, f"{name}: stores"  # +1: the scale
        _check_common(k, 80)


def test_per_tensor_kernels(kernels):
    for name, k in _select(kernels, "TensorAmaxVec").items():
        assert k.loads() == k.loads(".128") >= 2, name  # two chunks in flight, all 128-bit
        _check_common(k, 64)
    for name, k in _select(kernels, "QuantizeTensorVec").items():
        assert k.loads(".128") >= 2 and k.loads() - k.loads(".128") <= 1, name  # +1: the amax slot
        assert k.stores() == k.stores(".128") == 1, name
        _check_common(k, 64)


def test_dequantize_kernels(kernels):
    for name, k in _select(kernels, "DequantRowsVec").items():
        fmt, out = _args(name)[:2]
        outputs = (32 if fmt in (2, 6) else 16) * (4 if out == 0 else 2)
        # all stores 128 bits wide (the fast path and the scalar path each store a chunk's outputs)
        assert k.stores() == k.stores(".128") and k.stores() % (outputs // 16) == 0, f"{name}: stores {k.stores()}"
        assert k.loads(".128") == 1, f"{name}: the codes in one 128-bit load"
        _check_common(k, 64)
