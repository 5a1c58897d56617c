"""What this GPU's cuDNN supports for block-scaled matmuls, asked directly (issue 4: "on an H100,
probe what cuDNN supports and record it"). Our `blackwell` gate keeps the cuDNN backend off
Hopper; this script goes past the gate and asks cuDNN to build the backend's exact graph
(block_scale_dequantize x2 + matmul [+ global-scale multiply]) for each format pair, output type
and a few shapes, then records supported / the failing stage and cuDNN's message. Nothing runs.

    python benchmarks/probe_cudnn.py [--out FILE.json] [--quick]

Refuses to run (exit 2) without a CUDA GPU and a _cuda built with the cuDNN backend.
"""

from __future__ import annotations

import argparse
import json
import sys


def _cell(reason: str, limit: int = 240) -> str:
    """A markdown-safe table cell; the JSON keeps the whole reason."""
    one_line = " ".join(reason.replace("|", "/").split())
    return one_line if len(one_line) <= limit else one_line[:limit] + " ..."


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", help="write the results as JSON here")
    p.add_argument("--quick", action="store_true", help="one shape only")
    args = p.parse_args(argv)

    import jax
    import jax.numpy as jnp

    import jax_gpuext as gx
    from jax_gpuext.common import gates
    from jax_gpuext.common import libs as _libs
    from jax_gpuext.dot import cudnn as dot_cudnn

    ok = gates.check_all(["cuda_extension", "cuda_device", "cudnn_dot_built"])
    if not ok:
        print(f"probe_cudnn: needs a CUDA GPU and _cuda built with the cuDNN dot ({ok.reason}); refusing to run",
              file=sys.stderr)
        return 2
    pairs = {"MXFP8 E4M3 x E4M3": (gx.MXFP8_E4M3, gx.MXFP8_E4M3), "MXFP8 E5M2 x E4M3": (gx.MXFP8_E5M2, gx.MXFP8_E4M3),
             "NVFP4 x NVFP4": (gx.NVFP4, gx.NVFP4)}
    # N multiple of 8: bf16 output rows stay 16-byte aligned, so a "no" is about the format or
    # the architecture, not alignment.
    shapes = [(1, 256, 512, 1024)] if args.quick else [(1, 128, 4096, 4096), (1, 8192, 8192, 8192),
                                                       (3, 200, 320, 512)]
    # Variants that mean nothing on this cuDNN are not asked: the graph-safety note exists from
    # 9.15 (before, the filter removes nothing), and below 9.13 a fused global scale is accepted
    # and ignored (REFERENCE section 3), so "supported" would be a false answer.
    drops = (False, True) if gates.check("cudnn_graph_safety_notes").supported else (False,)
    fuses = (False, True) if gates.check("cudnn_fused_global_scale").supported else (False,)
    rows = []
    for name, (fl, fr) in pairs.items():
        for out in (jnp.bfloat16, jnp.float32):
            for fuse in (fuses if fl is gx.NVFP4 else (False,)):
                for drop in drops:
                    for b, m, n, k in shapes:
                        r = dot_cudnn.probe(fl, fr, m, n, k, batch=b, out_dtype=out, fuse_alpha=fuse,
                                            drop_cublaslt_plans=drop)
                        rows.append({"formats": name, "out": jnp.dtype(out).name, "fused_global_scale": fuse,
                                     "drop_cublaslt_plans": drop, "B": b, "M": m, "N": n, "K": k,
                                     "supported": r["supported"], "workspace_bytes": r["workspace_bytes"],
                                     "why_not": r["reason"]})
    version, where = _libs.version("cudnn")
    dev = jax.devices("cuda")[0]
    notes = [f"cuDNN {'.'.join(map(str, version)) if version else '?'} ({where}) on {dev.device_kind}",
             f"{sum(r['supported'] for r in rows)} of {len(rows)} configurations build a plan",
             "gate blackwell: " + gates.check("blackwell").reason,
             "graph-safety filter rows: " + ("probed" if len(drops) == 2 else "not probed (cuDNN < 9.15)"),
             "fused global scale rows: " + ("probed" if len(fuses) == 2 else "not probed (cuDNN < 9.13 ignores it)")]
    result = {"benchmark": "cudnn_probe", "device": dev.device_kind, "rows": rows, "notes": notes}
    print("| formats | out | fused gs | drop cuBLASLt plans | B,M,N,K | supported | why not |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['formats']} | {r['out']} | {r['fused_global_scale']} | {r['drop_cublaslt_plans']} | "
              f"{r['B']},{r['M']},{r['N']},{r['K']} | {r['supported']} | {_cell(r['why_not'])} |")
    print("\n".join(notes))
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
