"""What the host CPU can do, where a CPU choice depends on it (read once, from /proc/cpuinfo).

Only what a decision uses: whether XLA:CPU's bf16 dot runs on bf16 dot-product instructions
(x86 AVX512_BF16 or AMX-BF16, Arm BF16). Measured (docs/design.md "CPU speed (issue 18)"), a
2048^3 bf16 x bf16 -> f32 dot on XLA:CPU took about half the f32 dot's time on a CPU with
AVX512_BF16 (AMD EPYC, Zen 4) and 1.4x the f32 dot's time on one without (AMD EPYC, Zen 3:
250 ms against 174 ms; block_scaled_dot's bf16 path there: MXFP8 0.9-1.1x, NVFP4 1.2-2.1x the
f32 reference's time). Where the file is missing or unreadable (not Linux), the answer is
"no": the f32 reference that choice falls back to is exact everywhere.
"""

from __future__ import annotations

import functools

BF16_DOT_FLAGS = ("avx512_bf16", "amx_bf16", "bf16")  # x86 flags, Arm "Features"
_CPUINFO = "/proc/cpuinfo"


@functools.cache
def cpu_flags() -> frozenset[str]:
    """The first CPU's feature flags (x86 "flags", Arm "Features"); empty where unknown."""
    try:
        with open(_CPUINFO, encoding="ascii", errors="replace") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key.strip() in ("flags", "Features"):
                    return frozenset(value.split())
    except OSError:
        pass
    return frozenset()


def has_bf16_dot_instructions() -> bool:
    """Whether XLA:CPU's bf16 dots run on bf16 dot-product instructions here."""
    return any(f in cpu_flags() for f in BF16_DOT_FLAGS)
