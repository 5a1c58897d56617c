"""The ``hopper_mx`` backend of ``block_scaled_dot``: our sm_90a kernel (csrc/hopper_mx/).

No library runs MXFP8 or NVFP4 on Hopper's FP8 tensor cores: XLA (jax.nn.scaled_matmul) and
cuBLASLt dequantize to bf16 there. This kernel keeps the FP8 operands and applies the block
scales to fp32 partial products: per 32-long K block one ``wgmma m64nNk32`` into a scratch
accumulator, then ``acc += partial * s_a[m] * s_b[n]`` (docs/design.md, "hopper_mx").

What this module does in XLA before the custom call (all exact):

- MXFP8 / MXFP4 (any pairing): MXFP4's E2M1 elements widen to E4M3 exactly (same block, same
  scale). E8M0 scales -> float32 on their bit patterns (2^(e-127); e = 0 -> 2^-127, e = 255 ->
  NaN), transposed to ``(B, K/32, round_up(M, 4))`` so the kernel's TMA boxes are 16-byte rows.
- NVFP4: 16-element blocks do not fit a k32 instruction, whose 32 products share one scale.
  Each E2M1 element is widened to E4M3 (every E2M1 value is exact in E4M3) and every 16-block
  is followed by 16 zeros, giving a K' = 2K problem with one scale per 32 that the same kernel
  runs. The E4M3 block scales become float32 and absorb the global scales (s_a * gs_a,
  s_b * gs_b: one extra fp32 rounding each, ~6e-8 relative). Half of the NVFP4 tensor-core work
  multiplies zeros; benchmarks/notes/hopper_mx.md gives the cost and why an exact FP8 path on
  sm_90 cannot avoid it.
- K not a multiple of the block: the data is zero-padded (the scales already cover the partial
  block).

Tile configs (``TILE_CONFIGS``) are picked in Python and passed as an attribute, so the handler
is deterministic per call site (command-buffer safe). ``autotune()`` times them and stores the
winner in ``~/.cache/jax_gpuext/hopper_mx_autotune.json`` keyed by device name, shape class and
dtypes; with ``JAX_GPUEXT_HOPPER_MX_AUTOTUNE=1`` a missing entry is tuned at trace time. Without
an entry the deterministic ``default_config`` applies.
"""

from __future__ import annotations

import json
import math
import os
import pathlib
import threading
import time

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from jax_gpuext.common import backends, env, gates
from jax_gpuext.common import extension as _ext
from jax_gpuext.common import ffi as _ffi
from jax_gpuext.common.gates import GateResult
from jax_gpuext.dot import common as _dot

TARGET = _ext.declare_target("gpuext_hopper_mx_dot", "block_scaled_dot")
BLOCK = 32  # the kernel's scale block along K (one k32 wgmma)
# Ids of csrc/hopper_mx/hopper_mx.h TileConfig (never renumbered): name -> (id, BM, BN).
TILE_CONFIGS = {"m128n128": (0, 128, 128), "m64n128": (1, 64, 128), "m128n64": (2, 128, 64)}
AUTOTUNE_ENV = "JAX_GPUEXT_HOPPER_MX_AUTOTUNE"
CACHE_ENV = "JAX_GPUEXT_CACHE_DIR"
_H100_SMS = 132  # default_config's assumption when no device is queried (H100 SXM)
_E4M3, _E5M2, _E2M1 = jnp.dtype(jnp.float8_e4m3fn), jnp.dtype(jnp.float8_e5m2), jnp.dtype(jnp.float4_e2m1fn)
_MAX_DIM = 2**31 - 1


# --------------------------------------------------------------------------- supports
def built_for_sm90a(kernel: str = "the hopper_mx kernel") -> GateResult:
    """Whether _cuda holds our sm_90a kernels (hopper_mx's object library: also ragged_dot's)."""
    info = _ext.build_info("cuda")
    if info is None:
        return GateResult(False, "no CUDA extension")
    archs = str(info.get("architectures", ""))
    ok = any(a.strip().startswith("90a") for a in archs.split(","))
    return GateResult(ok, f"CUDA extension built for {archs}: {'has' if ok else 'no'} sm_90a "
                          f"({kernel} needs 90a-real in JAX_GPUEXT_CUDA_ARCHITECTURES)")


def supports(p) -> GateResult:
    """Problem check of the backend; gates (Hopper, extension, driver) are checked separately."""
    fam = p.lhs_format.family
    if fam not in ("mx", "nvfp4"):
        return GateResult(False, f"{p.lhs_format.name} x {p.rhs_format.name}: hopper_mx runs MXFP8, MXFP4 and NVFP4 "
                                 "only (FP8 blockwise goes to cuBLASLt)")
    if p.rhs_format.family != fam:
        return GateResult(False, "lhs and rhs formats must be of one family")
    if jnp.dtype(p.out_dtype) not in (jnp.dtype(jnp.float32), jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float16)):
        return GateResult(False, f"output dtype {p.out_dtype} not supported")
    b, m, n, k = p.bmnk
    if k == 0:
        # the handler rejects it at run time; rejecting here lets the selector fall back instead
        return GateResult(False, "K=0: nothing to contract (the kernel needs K >= 1)")
    if b > 65535:
        return GateResult(False, f"batch {b} > 65535 (grid.y limit)")
    k_kernel = _kernel_k(k, fam)
    if max(m, n, k_kernel) > _MAX_DIM:
        return GateResult(False, f"M={m}, N={n}, kernel K={k_kernel} must each be < 2^31")
    # csrc/hopper_mx Validate's grid and output limits (every tile config is >= 64 x 64)
    if -(-m // 64) * -(-n // 64) >= 2**31:
        return GateResult(False, f"M={m}, N={n}: too many output tiles for grid.x (< 2^31)")
    if b * m * n >= 2**62:
        return GateResult(False, f"B*M*N={b * m * n} output elements: must be < 2^62")
    r = built_for_sm90a()
    if not r.supported:
        return r
    return GateResult(True, p.describe())


def _kernel_k(k: int, family: str) -> int:
    if family == "nvfp4":
        return -(-k // 16) * 32
    return -(-k // BLOCK) * BLOCK


# --------------------------------------------------------------------------- operand preparation
def _round_up(x: int, m: int) -> int:
    return -(-x // m) * m


def e8m0_to_f32(s):
    """E8M0 -> float32, exactly, on bit patterns (no float arithmetic that could flush 2^-127)."""
    e = lax.bitcast_convert_type(s, jnp.uint8).astype(jnp.uint32)
    bits = jnp.where(e == 0, jnp.uint32(0x00400000), e << 23)
    bits = jnp.where(e == 255, jnp.uint32(0x7FC00000), bits)
    return lax.bitcast_convert_type(bits, jnp.float32)


def _scales_for_kernel(s):
    """(B, X, Kb) float32 -> (B, Kb, round_up(X, 4)): TMA needs 16-byte row strides."""
    bsz, x, _ = s.shape
    s = jnp.pad(s, ((0, 0), (0, _round_up(x, 4) - x), (0, 0)))
    return jnp.swapaxes(s, 1, 2)


def _pad_k(data, multiple: int):
    k = data.shape[-1]
    if k % multiple == 0:
        return data
    return jnp.pad(data, ((0, 0), (0, 0), (0, _round_up(k, multiple) - k)))


def prepare_mx(data, scale):
    """Canonical MX (B, X, K) data, (B, X, ceil(K/32)) E8M0 scales -> kernel operands. MXFP4's
    E2M1 elements are widened to E4M3 first: every E2M1 value (0, 0.5 ... 6) is an E4M3 normal,
    so the widening is exact and the block (32) and its scale stay as they are."""
    if data.dtype == jnp.float4_e2m1fn:
        data = data.astype(jnp.float32).astype(jnp.float8_e4m3fn)
    return _pad_k(data, BLOCK), _scales_for_kernel(e8m0_to_f32(scale))


def prepare_nvfp4(data, scale, global_scale):
    """Canonical NVFP4 (B, X, K) E2M1 data, (B, X, ceil(K/16)) E4M3 scales, fp32 global scale
    (a scalar, or (B, 1, 1): one per batch entry) -> E4M3 data (B, X, 32*ceil(K/16)) with 16 zeros
    after every 16-block, fp32 scales per 32."""
    bsz, x, _ = data.shape
    wide = _pad_k(data, 16).astype(jnp.float32).astype(jnp.float8_e4m3fn)  # E2M1 -> E4M3 is exact
    blocks = wide.shape[-1] // 16
    wide = wide.reshape(bsz, x, blocks, 16)
    wide = jnp.concatenate([wide, jnp.zeros_like(wide)], axis=-1).reshape(bsz, x, blocks * 32)
    s = scale.astype(jnp.float32)
    if global_scale is not None:
        s = s * jnp.asarray(global_scale, jnp.float32)
    return wide, _scales_for_kernel(s)


def _prepare(q, contract, batch, info):
    data, scale = _dot.to_canonical(q, contract, batch)
    if info.family == "nvfp4":  # per batch entry: the global scale may have leading batch dims
        gs = _dot.per_batch(q.global_scale, q.data.shape, batch).reshape(-1, 1, 1)
        return prepare_nvfp4(data, scale, gs)
    return prepare_mx(data, scale)


# --------------------------------------------------------------------------- tile configs
def shape_class(b: int, m: int, n: int, k: int) -> str:
    """Bucket of a problem for the autotune cache: M (the dimension that separates decode from
    prefill) finely, N and K by power of two, batch folded into M's work."""
    def p2(v):
        return 1 << max(0, math.ceil(math.log2(max(v, 1))))
    mb = "le64" if m <= 64 else ("le256" if m <= 256 else f"p2_{p2(m)}")
    return f"m{mb}_n{p2(n)}_k{p2(k)}_b{'1' if b == 1 else 'n'}"


def default_config(b: int, m: int, n: int, k: int, sms: int = _H100_SMS) -> str:
    """Deterministic choice when nothing is tuned. Decode-sized M wastes half a 128-row tile, so
    it gets 64 rows; when 128x128 tiles would leave SMs idle, halve N to double the CTAs."""
    if m <= 64:
        return "m64n128"
    tiles = b * (-(-m // 128)) * (-(-n // 128))
    if tiles < sms:
        return "m128n64"
    return "m128n128"


def cache_path() -> pathlib.Path:
    root = env.get(CACHE_ENV) or os.path.join(os.path.expanduser("~"), ".cache", "jax_gpuext")
    return pathlib.Path(root) / "hopper_mx_autotune.json"


_cache_lock = threading.Lock()


def _cache_key(device_kind: str, cls: str, a_dtype, b_dtype, out_dtype) -> str:
    return f"{device_kind}|{cls}|{jnp.dtype(a_dtype).name}x{jnp.dtype(b_dtype).name}->{jnp.dtype(out_dtype).name}"


def _load_cache() -> dict:
    try:
        with open(cache_path()) as f:
            data = json.load(f)
        return data if isinstance(data, dict) else {}
    except (OSError, ValueError):
        return {}


def _store_cache(key: str, entry: dict) -> None:
    with _cache_lock:
        data = _load_cache()
        data[key] = entry
        path = cache_path()
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".tmp{os.getpid()}")
        tmp.write_text(json.dumps(data, indent=1, sort_keys=True))
        os.replace(tmp, path)  # atomic: concurrent processes never read half a file


def _device_kind() -> str:
    devs = gates.cuda_devices()
    return devs[0].device_kind if devs else "unknown"


def choose_config(b, m, n, k, a_dtype, b_dtype, out_dtype) -> tuple[str, str]:
    """(config name, where it came from)."""
    key = _cache_key(_device_kind(), shape_class(b, m, n, k), a_dtype, b_dtype, out_dtype)
    entry = _load_cache().get(key)
    if isinstance(entry, dict) and entry.get("config") in TILE_CONFIGS:
        return entry["config"], f"autotune cache ({cache_path()})"
    if env.get(AUTOTUNE_ENV):
        return autotune(b, m, n, k, a_dtype, b_dtype, out_dtype), "autotuned now"
    return default_config(b, m, n, k), "default (no autotune entry)"


# --------------------------------------------------------------------------- the call
def kernel_call(a, b, a_scale, b_scale, out_dtype, config: str = "m128n128"):
    """The raw custom call on prepared operands (see the module docstring for the layouts)."""
    bsz, m, _ = a.shape
    n = b.shape[1]
    return _ffi.ffi_call(TARGET, jax.ShapeDtypeStruct((bsz, m, n), out_dtype), a, b, a_scale, b_scale,
                         vmap_method="sequential", config=np.int32(TILE_CONFIGS[config][0]))


def impl(lhs, rhs, p, sel, config: str | None = None):
    a, sa = _prepare(lhs, p.lhs_contract, p.lhs_batch, p.lhs_format)
    b, sb = _prepare(rhs, p.rhs_contract, p.rhs_batch, p.rhs_format)
    if config is None:
        config, source = choose_config(a.shape[0], a.shape[1], b.shape[1], a.shape[2], a.dtype, b.dtype,
                                       p.out_dtype)
        backends.note(sel, f"tile config {config} ({source})")
    if _E2M1 in (p.lhs_format.element_dtype, p.rhs_format.element_dtype) and p.lhs_format.family == "mx":
        backends.note(sel, "MXFP4 E2M1 elements widened to E4M3 (exact), 32-blocks and E8M0 scales unchanged")
    if p.lhs_format.family == "nvfp4":
        backends.note(sel, "NVFP4 widened to E4M3 with zero-padded 16-blocks (2x tensor-core work); "
                           "global scales folded into the block scales")
    out = kernel_call(a, b, sa, sb, p.out_dtype, config)
    return _dot.from_canonical(out, p)


# --------------------------------------------------------------------------- autotune
def autotune(b, m, n, k, a_dtype=_E4M3, b_dtype=_E4M3, out_dtype=jnp.bfloat16, *, iters: int = 20) -> str:
    """Times every tile config on random operands of this (kernel-side) shape, stores the best.

    ``k`` is the kernel's K (after NVFP4 widening). Runs on the default CUDA device; needs the
    hopper gate. Returns the winning config name.
    """
    gates.require("hopper", "hopper_mx autotune")
    key = _cache_key(_device_kind(), shape_class(b, m, n, k), a_dtype, b_dtype, out_dtype)
    rng = np.random.default_rng(0)
    a = jnp.asarray(rng.standard_normal((b, m, k), np.float32)).astype(a_dtype)
    bb = jnp.asarray(rng.standard_normal((b, n, k), np.float32)).astype(b_dtype)
    sa = jnp.ones((b, k // BLOCK, _round_up(m, 4)), jnp.float32)
    sb = jnp.ones((b, k // BLOCK, _round_up(n, 4)), jnp.float32)
    times = {}
    for name in TILE_CONFIGS:
        f = jax.jit(lambda x, y, u, v, name=name: kernel_call(x, y, u, v, jnp.dtype(out_dtype), name))
        f(a, bb, sa, sb).block_until_ready()
        t0 = time.perf_counter()
        for _ in range(iters):
            out = f(a, bb, sa, sb)
        out.block_until_ready()
        times[name] = (time.perf_counter() - t0) / iters
    best = min(times, key=times.get)
    _store_cache(key, {"config": best, "seconds": times, "shape": [b, m, n, k]})
    return best


# --------------------------------------------------------------------------- registration
def feature(p) -> str | None:
    """The GPU tests' feature of a problem (``verifies(..., feature=)``): mxfp8, mxfp4 (an E2M1
    operand, widened in the kernel) or nvfp4; None for formats it does not take."""
    if p.lhs_format.family == "mx":
        return "mxfp4" if _dot.mx_fp4_operand(p) else "mxfp8"
    return "nvfp4" if p.lhs_format.family == "nvfp4" else None


# Backend ``hopper_mx`` of ``block_scaled_dot``: dot/block_scaled_dot.py registers it with ``impl``.
BACKEND = backends.Backend(
    "hopper_mx", ("cuda",), ("cuda_extension", "cuda_device", "cuda_driver", "hopper"),
    "our sm_90a kernel: FP8 wgmma with per-32 block scales applied to fp32 partials "
    "(MXFP8; MXFP4 and NVFP4 widened to E4M3)", supports,
    takes="MXFP8 / MXFP4 in any pairing, or NVFP4 x NVFP4, any M, N, 0 < K < 2^31, batch <= 65535; _cuda built for 90a",
    feature=feature)
