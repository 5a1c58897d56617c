"""The machine code of the quantize / dequantize vector kernels for sm_90a (issue 35; docs/design.md,
"Quantize at memory speed on Hopper"), read from the compiled translation unit with cuobjdump:

- every global load of the input (quantize) is 128 bits wide, and dequantize stores its outputs with
  128-bit stores -- the first GPU run's FP8 128x128 kernel issued 128 16-bit loads and 65 byte stores
  per tile, and FP8_TENSOR and dequantize one element at a time;
- round 2 (the second H200 run): every such instruction is warp-contiguous (32 lanes x its width of
  contiguous bytes: offsets 32 x width apart on one base register), all of a thread's loads are in
  flight before the first is used (a dependence walk over the SASS), and registers and shared memory
  leave each SM the bytes in flight Little's law asks for;
- no local memory (spills or stack arrays): ptxas's report and the SASS agree;
- registers per thread within each family's bound;
- no flush-to-zero multiply or FMA (the fast paths are exact only with subnormals kept);
- the FP8 element formats use the hardware conversion (F2FP ... E4M3 / E5M2) on sm_90a.

Needs nvcc, cuobjdump and nvdisasm (pip, in the test extra: nvidia-cuda-cuobjdump,
nvidia-cuda-nvdisasm; found on PATH or in site-packages); skipped without them. Compiling the TU
takes ~30 s on a small machine: it is done once per module."""

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


_INSTR = re.compile(r"/\*[0-9a-f]{4,}\*/\s+(@!?U?P[T0-9]+\s+)?([A-Z0-9_.]+)([^;]*);")
_REG = re.compile(r"\bR(\d+)(\.64)?\b")
_ADDR = re.compile(r"\[(R\d+)(?:\.64)?(?:\+(-?0x[0-9a-f]+|-?\d+))?\]")


def _width(op: str) -> int:
    return 4 if op.endswith(".128") else 2 if op.endswith(".64") else 1


class Kernel:
    def __init__(self, name: str, sass: str):
        self.name = name
        found = _INSTR.findall(sass)
        self.instrs = [(op, args.strip()) for _, op, args in found]
        self.predicated = [bool(p) for p, _, _ in found]
        self.ops = [op for op, _ in self.instrs]
        self.registers = None
        self.spill = None
        self.smem = 0

    def count(self, pred) -> int:
        return sum(1 for op in self.ops if pred(op))

    def loads(self, width: str | None = None):
        return self.count(lambda op: op.startswith("LDG") and (width is None or op.endswith(width)))

    def stores(self, width: str | None = None):
        return self.count(lambda op: op.startswith("STG") and (width is None or op.endswith(width)))

    def offsets(self, pred) -> dict:
        """{base register: {immediate offsets}} of the global accesses whose opcode satisfies pred."""
        found: dict = {}
        for op, args in self.instrs:
            if pred(op):
                m = _ADDR.search(args)
                if m:
                    found.setdefault(m.group(1), set()).add(int(m.group(2) or "0", 0))
        return found

    def max_loads_in_flight(self, pred, weight=None) -> int:
        """The most loads (opcode satisfying pred) issued and not yet consumed at one point of the
        instruction stream, read in address order: a load's destination registers stay pending until
        an instruction reads one of them (consumed) or writes one (dead: this point is on another path,
        such as a kernel's tail loads after its whole-span ones). A thread that consumes each load
        before issuing the next scores 1; one that issues W loads back to back, W. After an
        unconditional branch the stream continues with code reached from elsewhere: nothing pending.
        With `weight` (opcode -> bytes), the most bytes in flight instead of loads."""
        pending: list = []  # (destination registers, weight)
        best = 0
        for (op, args), predicated in zip(self.instrs, self.predicated):
            if op.startswith(("BRA", "EXIT", "RET")) and not predicated:
                pending = []
                continue
            operands = [a.strip() for a in args.split(",")] if args else []
            writes = set()
            m = _REG.match(operands[0]) if operands else None
            if m and not op.startswith(("ST", "RED")):
                first = int(m.group(1))
                n = _width(op) if op.startswith(("LD", "CS2R")) else (2 if ".WIDE" in op or m.group(2) else 1)
                writes = set(range(first, first + (2 if op.startswith("CS2R") else n)))
            reads = set()
            for i, operand in enumerate(operands):
                if i == 0 and writes:
                    continue
                for r in _REG.finditer(operand):
                    first = int(r.group(1))
                    n = 2 if r.group(2) else (_width(op) if "[" not in operand else 1)
                    reads.update(range(first, first + n))
            pending = [(regs, w) for regs, w in pending if not regs & (reads | writes)]
            if op.startswith("LDG") and pred(op) and writes:
                pending.append((writes, 1 if weight is None else weight(op)))
                best = max(best, sum(w for _, w in pending))
        return best


@pytest.fixture(scope="module")
def kernels(tmp_path_factory):
    nvcc, cuobjdump, nvdisasm = _find("nvcc"), _find("cuobjdump"), _find("nvdisasm")
    if nvcc is None or cuobjdump is None or nvdisasm is None:
        pytest.skip("needs nvcc, cuobjdump and nvdisasm (the test extra installs the last two from pip: "
                    f"nvidia-cuda-cuobjdump, nvidia-cuda-nvdisasm): nvcc={nvcc}, cuobjdump={cuobjdump}, "
                    f"nvdisasm={nvdisasm}")
    import jax

    out = tmp_path_factory.mktemp("sass") / "formats.cubin"
    # the flags CMakeLists.txt gives every CUDA source, for the architecture the issue targets
    cmd = [nvcc, "-arch=sm_90a", "-cubin", "-std=c++17", "-O3", f"-I{ROOT}", f"-I{jax.ffi.include_dir()}",
           "-diag-suppress", "940", "--expt-relaxed-constexpr", "-Xptxas", "-v", str(TU), "-o", str(out)]
    build = subprocess.run(cmd, capture_output=True, text=True, timeout=1800)
    assert build.returncode == 0, build.stderr[-6000:]
    # cuobjdump -sass runs nvdisasm, which it looks for on PATH (the pip wheels install each in its
    # own package's bin/)
    env = dict(os.environ, PATH=os.pathsep.join([os.path.dirname(nvdisasm), os.environ.get("PATH", "")]))
    dump = subprocess.run([cuobjdump, "-sass", str(out)], capture_output=True, text=True, timeout=600, env=env)
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
        if current is not None and (m := re.search(r"Used \d+ registers.*?(\d+) bytes smem", line)):
            current.smem = int(m.group(1))
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


# sm_90 per SM: 64 Ki registers (allocated per thread in multiples of 8), 227 KiB of shared memory for
# CTAs (1 KiB of it reserved per CTA), at most 2048 threads.
def _threads_per_sm(k: Kernel, threads: int = 256) -> int:
    regs = -(-k.registers // 8) * 8
    by_smem = (227 * 1024) // (k.smem + 1024)
    return min(65536 // (regs * threads), by_smem, 2048 // threads) * threads


_LOAD_BYTES = {".128": 16, ".64": 8, ".U16": 2, ".S16": 2, ".U8": 1, ".S8": 1}


def _load_bytes(op: str) -> int:
    return next((b for suffix, b in _LOAD_BYTES.items() if op.endswith(suffix)), 4)


def _bytes_in_flight(k: Kernel, pred) -> int:
    """Bytes of global loads a thread has in flight at most (max_loads_in_flight, weighted by width)."""
    return k.max_loads_in_flight(pred, _load_bytes)


# Little's law (docs/design.md, issue 35): ~4.3 TB/s x ~0.7 us of loaded latency over 132 SMs is ~23 KB
# of reads in flight per SM for a pure read stream; a kernel that also writes needs its read share.
LITTLE_BYTES_PER_SM = 24 * 1024


def _check_in_flight(k: Kernel, per_thread_bytes: int, read_fraction: float, threads: int = 256):
    per_sm = _threads_per_sm(k, threads) * per_thread_bytes
    assert per_sm >= LITTLE_BYTES_PER_SM * read_fraction, (
        f"{k.name}: {per_sm} bytes of loads in flight per SM ({_threads_per_sm(k, threads)} threads x "
        f"{per_thread_bytes}), Little's law wants {LITTLE_BYTES_PER_SM * read_fraction:.0f}")


def _warp_contiguous(k: Kernel, pred, step: int, n: int) -> bool:
    """Some base register carries n accesses step bytes apart: lane l's access u at u * step + l * width,
    i.e. each instruction covers 32 lanes x width contiguous bytes (step = 32 x width)."""
    return any({o + step * i for i in range(n)} <= offs for offs in k.offsets(pred).values() for o in offs)


def test_row_kernels(kernels):
    """Round 2: a thread's W 16-byte loads used to be its own contiguous 16 W bytes (+0x10 apart), so each
    load instruction read half of every sector it touched; now load j of lane l is piece 32 j + l of the
    warp's span (+0x200 apart), staged through shared memory back to the thread's own elements."""
    for name, k in _select(kernels, "QuantizeRowsVec").items():
        fmt, kind = _args(name)[:2]
        per_thread_bytes = (32 if fmt in (2, 6) else 16) * (4 if kind == 0 else 2)
        w = per_thread_bytes // 16
        # two paths of W loads each: staged (rows of whole blocks) and direct (padded rows)
        assert k.loads(".128") == 2 * w, f"{name}: {k.loads('.128')} 128-bit loads"
        assert _warp_contiguous(k, lambda op: op == "LDG.E.128", 512, w), f"{name}: loads not warp-contiguous"
        assert k.count(lambda op: op == "STS.128") >= w and k.count(lambda op: op == "LDS.128") >= w, name
        assert k.max_loads_in_flight(lambda op: op == "LDG.E.128") >= w, f"{name}: a load used before the next issued"
        assert k.stores(".128") >= 1, f"{name}: codes not stored 128 bits wide"
        _check_common(k, 80)
        codes = 0.5 if fmt in (2, 6) else 1.0
        _check_in_flight(k, per_thread_bytes, (4 if kind == 0 else 2) / ((4 if kind == 0 else 2) + codes))
        if fmt in FP8_ELEMENT_FORMATS:
            assert k.count(lambda op: op.startswith("F2FP") and FP8_ELEMENT_FORMATS[fmt] in op), name


def _run_host_check(tmp_path, name: str, source: str):
    """Builds `source` (C++17 against the repository's headers) with the host compiler and runs it;
    the program prints "ok" when every check passed."""
    cxx = shutil.which("g++") or shutil.which("c++")
    if cxx is None:
        pytest.skip("no C++ compiler (g++) on PATH")
    src, exe = tmp_path / f"{name}.cc", tmp_path / name
    src.write_text(source)
    build = subprocess.run([cxx, "-O1", "-std=c++17", f"-I{ROOT}", str(src), "-o", str(exe)], capture_output=True,
                           text=True, timeout=300)
    assert build.returncode == 0, build.stderr[-3000:]
    run = subprocess.run([str(exe)], capture_output=True, text=True, timeout=60)
    assert run.returncode == 0 and run.stdout.strip() == "ok", run.stdout + run.stderr


BLOCK_LEN = {2: 16, 3: 128}  # NVFP4, FP8_1x128; the MX formats 32
CODE_STORE = {8: "STG.E.64", 4: "STG.E", 2: "STG.E.U16"}


def _cols_shape(fmt: int, kind: int, fused: bool):
    """cols_layout.h's Shape: (rows a lane holds, threads per CTA, elements per 16-byte piece, CTAs
    (one cluster) per block-row)."""
    block = BLOCK_LEN.get(fmt, 32)
    rows = (16 if block >= 128 else 8) // (2 if fused else 1)
    warps_along = block // rows
    ctas = warps_along // 8 if warps_along > 8 else 1
    return rows, 32 * max(8, warps_along // ctas), 4 if kind == 0 else 8, ctas


def test_column_and_fused_kernels(kernels):
    """Round 3 (docs/design.md): round 1's column / fused kernels gave a thread 16 adjacent columns
    and stacked a block's rows in adjacent lanes, so each load instruction read 16 bytes of 8-32 rows,
    two loads 16 bytes apart per row (+0x10: half of every sector per instruction). Now a lane holds
    one 16-byte piece of each of its R rows (no two loads of a thread 16 bytes apart), all R issued
    before the first is used, and stores the piece's codes in one access (8 / 4 bytes of FP8, 4 / 2
    of packed FP4) per row and per axis; registers leave each SM Little's bytes in flight. That the
    32 lanes of an instruction hold consecutive pieces is cols_layout.h's mapping, checked on the host
    below. Template arguments: <format, input kind, packed, fused>."""
    seen = set()
    for name, k in _select(kernels, "QuantizeColsVec").items():
        fmt, kind, _packed, fused = _args(name)[:4]
        seen.add((fmt, kind, fused))
        rows, threads, e, ctas = _cols_shape(fmt, kind, bool(fused))
        wide = k.loads(".128")
        # two paths of R loads: block-rows inside K (unpredicated) and the ragged last one
        assert wide == 2 * rows, f"{name}: {wide} 128-bit loads, want 2 x {rows}"
        assert k.loads() - wide <= 1, f"{name}: {k.loads() - wide} narrow loads"  # +1: the global scale
        pairs = [o for offs in k.offsets(lambda op: op == "LDG.E.128").values() for o in offs if o + 16 in offs]
        assert not pairs, f"{name}: a thread loads 16 contiguous bytes twice (not one piece per row)"
        assert k.max_loads_in_flight(lambda op: op == "LDG.E.128") >= rows, f"{name}: a load used before the next issued"
        code_bytes = e // 2 if fmt in (2, 6) else e
        store = CODE_STORE[code_bytes]
        assert k.count(lambda op: op == store) >= rows * (2 if fused else 1), f"{name}: codes not stored {store}"
        assert k.stores(".128") == 0, f"{name}: 16-byte code stores (a thread owns one piece per row)"
        _check_common(k, 128)
        in_bytes = 4 if kind == 0 else 2
        written = (code_bytes / e) * (2 if fused else 1)
        _check_in_flight(k, 16 * rows, in_bytes / (in_bytes + written), threads)
        if fmt in FP8_ELEMENT_FORMATS:
            assert k.count(lambda op: op.startswith("F2FP") and FP8_ELEMENT_FORMATS[fmt] in op), name
        _check_cluster(k, ctas)
    assert {(f, kd, fu) for f in (0, 1, 2, 3, 6) for kd in (0, 1, 2) for fu in (0, 1)} <= seen, sorted(seen)


def _check_cluster(k: Kernel, ctas: int):
    """The fused FP8_1x128 kernel's two CTAs of a cluster (2026-11-28, docs/design.md "Round 3"):
    two cluster arrives (maxima out; done reading the peer), two waits (the peer's maxima; the peer
    done before this CTA's shared memory goes), only the first with a memory barrier before it
    (release: the second must not wait for the scale stores in flight), and one load from the peer's
    shared memory per column a thread derives. Every other kernel: no cluster instruction."""
    arrives, waits = k.count(lambda op: op == "UCGABAR_ARV"), k.count(lambda op: op == "UCGABAR_WAIT")
    if ctas == 1:
        assert arrives == waits == 0, f"{k.name}: cluster barriers in a one-CTA kernel"
        return
    assert (arrives, waits) == (2, 2), f"{k.name}: {arrives} cluster arrives, {waits} waits"
    assert k.count(lambda op: op.startswith("MEMBAR")) == 1, f"{k.name}: a memory barrier before the relaxed arrive"
    before_first = k.ops[:k.ops.index("UCGABAR_ARV")]
    assert any(op.startswith("MEMBAR") for op in before_first[-6:]), f"{k.name}: the first arrive does not release"
    generic = [i for i, op in enumerate(k.ops) if op.startswith("LD.")]  # ld.shared::cluster of a mapped address
    assert len(generic) >= 1, f"{k.name}: no load of the peer's shared memory"
    # the relaxed arrive says "done reading the peer" only if every such read came before it
    second_arrive = [i for i, op in enumerate(k.ops) if op == "UCGABAR_ARV"][1]
    assert max(generic) < second_arrive, f"{k.name}: a read of the peer's shared memory after the relaxed arrive"


def test_column_ownership_is_warp_contiguous(tmp_path):
    """cols_layout.h's mapping, compiled for the host, for every block length, input width and kernel
    (column, fused): the lanes of every (warp, row) own each element of the CTA's B x W tile once; the
    32 lanes of one load instruction hold 32 consecutive 16-byte pieces of one row (512 contiguous
    bytes); a row block of B columns is B / E aligned consecutive lanes of one warp (the fused
    kernel's shuffles); and the shared memory the kernel declares fits the 48 KiB of static memory.
    The fused FP8_1x128 kernel's block-row is split over a cluster of two CTAs: the ranks' rows
    together are the block-row, each element once."""
    _run_host_check(tmp_path, "cols_layout", r'''
#include <cstdio>
#include <vector>
#include "csrc/formats/cols_layout.h"
namespace c = gpuext::formats::cols;
template <int B, int kIn, bool kBoth> int Check() {
  using S = c::Shape<B, kIn, kBoth>;
  std::vector<int> owners(static_cast<size_t>(B) * S::W, 0);
  if (S::kCtas * S::kCtaRows != B || S::kCtaT * S::R != S::kCtaRows) return 9;
  for (int rank = 0; rank < S::kCtas; ++rank) {
    for (int w = 0; w < S::kWarps; ++w)
      for (int j = 0; j < S::R; ++j) {
        const int local = c::RowOf<S>(w) + j, row = rank * S::kCtaRows + local;
        if (local < 0 || local >= S::kCtaRows || row >= B) return 1;
        for (int l = 0; l < 32; ++l) {
          const int piece = c::PieceOf<S>(w, l);
          if (piece < 0 || piece >= S::kPieces) return 2;
          if (piece != c::PieceOf<S>(w, 0) + l) return 3;  // one instruction: 32 consecutive pieces
          if ((piece * S::E) / B != (c::PieceOf<S>(w, l - l % S::G) * S::E) / B) return 4;  // G lanes, one block
          if ((piece * S::E) % B == 0 && l % S::G != 0) return 5;  // blocks start on a group's first lane
          for (int e = 0; e < S::E; ++e) ++owners[size_t(row) * S::W + piece * S::E + e];
        }
      }
  }
  for (int n : owners)
    if (n != 1) return 6;
  // QuantizeColsVec's static shared memory: NVFP4 table (B == 16), column partials and parameters,
  // the fused kernel's row maxima and parameters (12-byte SmemParams)
  const long smem = (B == 16 ? 4096 : 4) + 4L * S::kCtaT * S::W + 4L * (S::kCtas > 1 ? S::W : 1) + 12L * S::W +
                    (kBoth ? 4L * S::kCtaRows * (S::W / B) + 12L * S::kCtaRows * (S::W / B) : 16);
  if (smem > 48 * 1024) return 7;
  if (S::kThreads != 256) return 8;  // every kernel 256 threads (the launch bounds' register caps)
  if (S::kCtas != (B >= 128 && kBoth ? 2 : 1)) return 10;  // a cluster only where one CTA would hold 16 warps
  return 0;
}
int main() {
  const int r[] = {Check<16, 2, false>(), Check<16, 4, false>(), Check<32, 2, false>(), Check<32, 4, false>(),
                   Check<128, 2, false>(), Check<128, 4, false>(), Check<16, 2, true>(), Check<16, 4, true>(),
                   Check<32, 2, true>(), Check<32, 4, true>(), Check<128, 2, true>(), Check<128, 4, true>()};
  for (int i = 0; i < 12; ++i)
    if (r[i] != 0) { std::printf("case %d failed: %d\n", i, r[i]); return 1; }
  std::printf("ok\n");
  return 0;
}
''')


def test_tile_kernels_load_and_store_128_bits(kernels):
    """FP8_128x128 was 128 16-bit loads and 65 byte stores per tile; then 16 columns a thread, two loads
    per row (+0x10: each instruction half of every sector it touched); now one 16-byte piece a thread
    per row, 8 rows, all 8 loads in flight before the amax (the f16 kernel had 2: its per-row widening
    sat between the loads), the codes one 8- or 4-byte store per row."""
    for name, k in _select(kernels, "QuantizeTilesVec").items():
        kind = _args(name)[0]
        assert k.loads() == k.loads(".128") == 8, f"{name}: loads {k.loads()}"
        pairs = [o for offs in k.offsets(lambda op: op == "LDG.E.128").values() for o in offs if o + 16 in offs]
        assert not pairs, f"{name}: a thread loads 16 contiguous bytes twice (not one piece per row)"
        assert k.max_loads_in_flight(lambda op: op == "LDG.E.128") == 8, f"{name}: a load used before the next issued"
        store = "STG.E" if kind == 0 else "STG.E.64"  # 4 or 8 codes per row
        assert k.count(lambda op: op == store) == 8 + (1 if kind == 0 else 0), f"{name}: stores"  # f32: + the scale
        assert k.stores() == 9, f"{name}: {k.stores()} stores (8 rows of codes and the scale)"
        _check_common(k, 80)
        _check_in_flight(k, 128, 2 / 3, 512 if kind == 0 else 256)


def test_per_tensor_kernels(kernels):
    """Every element has the tensor's scale, so lane l takes pieces 32 j + l: warp-contiguous loads (and,
    quantizing, warp-contiguous stores of each piece's 8 or 4 codes), all issued before any is used."""
    for name, k in _select(kernels, "TensorAmaxVec").items():
        w = 4 if _args(name)[0] == 0 else 2  # 16-byte pieces of a 16-element chunk
        # 4 loads a step (4 / W spans), whole spans unpredicated and the tail predicated: 8, all 128-bit
        assert k.loads() == k.loads(".128") == 8, name
        assert _warp_contiguous(k, lambda op: op == "LDG.E.128", 512, w), f"{name}: loads not warp-contiguous"
        assert k.max_loads_in_flight(lambda op: op == "LDG.E.128") >= 4, f"{name}: a load used before the next issued"
        _check_common(k, 64)
        _check_in_flight(k, 64, 1.0)
    for name, k in _select(kernels, "QuantizeTensorVec").items():
        w = 4 if _args(name)[0] == 0 else 2
        e = 16 // w  # elements (and code bytes) per piece
        store = "STG.E.64" if e == 8 else "STG.E"
        assert k.loads(".128") == w and k.loads() - k.loads(".128") <= 1, name  # +1: the amax slot
        assert k.stores() == k.count(lambda op: op == store) == w, f"{name}: stores"
        assert _warp_contiguous(k, lambda op: op == "LDG.E.128", 512, w), f"{name}: loads not warp-contiguous"
        assert _warp_contiguous(k, lambda op: op == store, 32 * e, w), f"{name}: stores not warp-contiguous"
        assert k.max_loads_in_flight(lambda op: op == "LDG.E.128") >= w, name
        _check_common(k, 64)
        _check_in_flight(k, 16 * w, 2 / 3)


def test_dequantize_kernels(kernels):
    """Round 2: a thread stored 32-128 contiguous bytes (each store instruction half of every sector it
    touched) after one 16-byte load of codes. Now a thread owns 16-byte pieces of the output, lane l
    piece 32 u + l of its warp's span: every output store 128 bits and warp-contiguous (+0x200), the
    codes of U pieces loaded warp-contiguously (+32 x their width) and all in flight before the first
    is converted. Template arguments: <format, output kind, packed, layout (0 rows, 1 tiles, 2 cols)>."""
    layouts = set()
    for name, k in _select(kernels, "DequantVec").items():
        fmt, out, _packed, layout = _args(name)[:4]
        layouts.add(layout)
        e = 4 if out == 0 else 8  # outputs per 16-byte store
        code_bytes = e // 2 if fmt in (2, 6) else e
        u = 2 if layout == 2 else 4
        code_op = {8: "LDG.E.64", 4: "LDG.E", 2: "LDG.E.U16"}[code_bytes]
        assert k.stores() == k.stores(".128") == u, f"{name}: stores {k.stores()}"
        assert _warp_contiguous(k, lambda op: op == "STG.E.128", 512, u), f"{name}: stores not warp-contiguous"
        assert _warp_contiguous(k, lambda op: op == code_op, 32 * code_bytes, u), f"{name}: codes not warp-contiguous"
        assert k.max_loads_in_flight(lambda op: op == code_op) >= u, f"{name}: codes used before all are loaded"
        _check_common(k, 64)
        out_bytes = 4 if out == 0 else 2
        _check_in_flight(k, _bytes_in_flight(k, lambda op: op.startswith("LDG")),
                         code_bytes / e / (code_bytes / e + out_bytes))
    assert layouts == {0, 1, 2}, f"dequantize layouts compiled: {sorted(layouts)}"


def test_stage_slots_are_a_conflict_free_bijection(tmp_path):
    """fast::StageSlot (the row kernels' shared-memory staging), compiled for the host: for W = 1, 2, 4, 8
    pieces per thread it maps the warp's 32 W pieces one to one onto 32 W slots, and both the writes
    (lane l, piece 32 j + l) and the reads (lane l, piece l W + i) of every quarter-warp touch 8
    distinct 16-byte bank groups (one shared-memory wavefront each)."""
    _run_host_check(tmp_path, "stage_slots", r'''
#include <cstdio>
#include <set>
#include "csrc/formats/block_scaled_fast.h"
using gpuext::formats::fast::StageSlot;
template <int W> int Check() {
  std::set<int> slots;
  for (int p = 0; p < 32 * W; ++p) {
    const int s = StageSlot<W>(p);
    if (s < 0 || s >= 32 * W || !slots.insert(s).second) return 1;
  }
  for (int j = 0; j < W; ++j)
    for (int q = 0; q < 4; ++q) {
      std::set<int> wr, rd;
      for (int l = 8 * q; l < 8 * q + 8; ++l) {
        wr.insert(StageSlot<W>(32 * j + l) % 8);
        rd.insert(StageSlot<W>(l * W + j) % 8);
      }
      if (wr.size() != 8) return 2;
      if (rd.size() != 8) return 3;
    }
  return 0;
}
int main() {
  const int r[4] = {Check<1>(), Check<2>(), Check<4>(), Check<8>()};
  for (int i = 0; i < 4; ++i)
    if (r[i] != 0) { std::printf("W=%d failed: %d\n", 1 << i, r[i]); return 1; }
  std::printf("ok\n");
  return 0;
}
''')


def test_token_slot_kernels(kernels):
    """The weight gradient's one-pass operand kernel (csrc/formats/token_slots_kernel.cuh; template
    argument: input kind): the column kernel's loads (one 16-byte piece of each of a lane's 16 rows,
    two paths of 16: whole blocks and a group's partial last block, all issued before the first is
    used), plus the (first row, count) table entry (one 8-byte load); its E columns' transposed codes
    staged in shared memory with one 16-byte store each; the codes leave as 16-byte stores (8
    consecutive threads write one column's 128-byte line) and the scales as one 4-byte store per
    column; no local memory, registers for 2 CTAs of 256 threads an SM."""
    seen = set()
    for name, k in _select(kernels, "QuantizeTokenSlotsT").items():
        kind = _args(name)[0]
        seen.add(kind)
        e = 4 if kind == 0 else 8
        assert k.loads(".128") == 32, f"{name}: {k.loads('.128')} 128-bit loads, want 2 x 16"
        assert k.loads() - k.loads(".128") == k.loads(".64") == 1, f"{name}: loads besides the rows and the table"
        pairs = [o for offs in k.offsets(lambda op: op == "LDG.E.128").values() for o in offs if o + 16 in offs]
        assert not pairs, f"{name}: a thread loads 16 contiguous bytes twice (not one piece per row)"
        assert k.max_loads_in_flight(lambda op: op == "LDG.E.128") >= 16, f"{name}: a load used before the next issued"
        assert k.count(lambda op: op == "STS.128") == e, f"{name}: the transposed codes not staged 16 bytes a column"
        assert k.stores(".128") >= 1 and k.stores() - k.stores(".128") == 1, f"{name}: stores {k.stores()}"
        assert k.count(lambda op: op.startswith("F2FP") and "E4M3" in op), name
        _check_common(k, 128)
        _check_in_flight(k, 16 * 16, (4 if kind == 0 else 2) / ((4 if kind == 0 else 2) + 1))
    assert seen == {0, 1, 2}, f"input kinds compiled: {sorted(seen)}"


def test_token_slot_staging_is_conflict_free(tmp_path):
    """cols::TokenSlot (the token-slot kernel's staging of each column's 128 codes), compiled for the
    host with the kernel's shapes: every line's 8 runs fill its 8 slots once and the swizzle is its own
    inverse (the copy-out reads run TokenSlot(slot, line) from slot `slot`); the 8 lanes of each
    quarter-warp of every staging store (lane l holds piece l, line l E + c, its warp's run) touch 8
    distinct 16-byte bank groups (a line is 128 bytes: slot s of any line is bank group s)."""
    _run_host_check(tmp_path, "token_slots", r'''
#include <cstdio>
#include <set>
#include "csrc/formats/cols_layout.h"
namespace c = gpuext::formats::cols;
template <int kInBytes> int Check() {
  using S = c::Shape<128, kInBytes, false>;
  static_assert(S::kCtas == 1 && S::R == 16 && S::B / S::R == 8 && S::kPieces == 32, "the kernel's shape");
  constexpr int E = S::E;
  for (int line = 0; line < S::W; ++line) {
    std::set<int> slots;
    for (int run = 0; run < 8; ++run) {
      const int s = c::TokenSlot<E>(run, line);
      if (s < 0 || s >= 8 || !slots.insert(s).second || c::TokenSlot<E>(s, line) != run) return 1;
    }
  }
  for (int warp = 0; warp < S::kWarps; ++warp) {
    const int run = c::RowOf<S>(warp) / S::R;
    for (int col = 0; col < E; ++col)
      for (int q = 0; q < 4; ++q) {
        std::set<int> banks;
        for (int l = 8 * q; l < 8 * q + 8; ++l) banks.insert(c::TokenSlot<E>(run, c::PieceOf<S>(warp, l) * E + col));
        if (banks.size() != 8) return 2;
      }
  }
  return 0;
}
int main() {
  const int r = Check<2>() | Check<4>();
  std::printf(r ? "fail %d\n" : "ok\n", r);
  return r;
}
''')
