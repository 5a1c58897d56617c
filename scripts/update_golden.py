"""Golden lowerings of the GPU backends' Python glue (tests/golden/<component>/<case>.mlir).

    python scripts/update_golden.py            # compare with tests/golden; print the diff; exit 1 if it differs
    python scripts/update_golden.py --write    # after reviewing that diff: write the new goldens

A backend's source fingerprint (cmake/verified_sources.txt) covers its compiled code only, so a
refactor of Python glue does not unverify a kernel that did not change. What the glue hands the
kernel is pinned here instead: for each component, small cases of the public op with that backend
named, lowered for CUDA on this CPU (no GPU, no gates: selection is forced), as StableHLO text
without locations: the custom call's target, operand and result types and layouts, attributes,
and every op that computes its operands (scale layouts, padding, packing) and consumes its results.
tests/golden/test_golden_lowering.py compares them. A difference is a change in how our kernels
are called, which the GPU run that verified them did not see: review the diff, write the goldens
with --write, and say in the commit whether the kernel's GPU tests must run again (a changed
attribute, layout or operand computation: yes, and change the kernel side with it; a renamed
private function: no).

The text depends on the jax version that lowers it, so the goldens record the jaxlib they were
made with, and the test compares only under that jaxlib's minor version (it says so otherwise).
"""

from __future__ import annotations

import argparse
import contextlib
import difflib
import pathlib
import re
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]
GOLDEN = ROOT / "tests" / "golden"
HEADER = "// golden lowering: {component} / {case}; jax {jax}, jaxlib {jaxlib}; python scripts/update_golden.py"


def _cases():
    """``{component: {case: (function, args)}}``: every GPU component whose fingerprint leaves its
    Python out (all but the all-reduce), one case per feature of its tests, small shapes."""
    import jax
    import jax.numpy as jnp
    from jax import lax

    import jax_gpuext as gx

    def q(shape, fmt, **kw):
        return jax.eval_shape(lambda: gx.quantize(jnp.zeros(shape, jnp.float32), fmt, **kw))

    def dot(fl, fr, backend, lhs=(64, 256), rhs=(128, 256), dn=None, out=jnp.float32):
        a, b = q(lhs, fl), q(rhs, fr)
        return (lambda x, y: gx.block_scaled_dot(x, y, dn, preferred_element_type=out, backend=backend)), (a, b)

    batched = (((2,), (2,)), ((0,), (0,)))
    x = jax.ShapeDtypeStruct((256, 256), jnp.bfloat16)
    formats = {}
    for fmt in gx.formats.FORMATS.values():
        formats[f"quantize_{fmt.name}"] = (lambda v, f=fmt: gx.quantize(v, f, backend="cuda"), (x,))
        formats[f"dequantize_{fmt.name}"] = (lambda v, f=fmt: gx.dequantize(v, jnp.bfloat16, backend="cuda"),
                                             (q((256, 256), fmt),))

    from jax_gpuext.ragged_dot import grouped

    # the weight gradient's operands, one pass (op quantize_token_slots): the table and the gather back
    formats["token_slots"] = (
        lambda v, s: grouped.quantize_tokens_for_wgrad(v, gx.FP8_1x128, s, tokens_last=True, backend="cuda"),
        (jax.ShapeDtypeStruct((300, 264), jnp.bfloat16), jax.ShapeDtypeStruct((5,), jnp.int32)))

    def ragged(backend, rhs_contract):
        g, m, k, n = 3, 48, 256, 128
        lhs = q((m, k), gx.FP8_1x128)
        rhs = q((g, n, k) if rhs_contract == 2 else (g, k, n), gx.FP8_128x128)
        dn = lax.RaggedDotDimensionNumbers(dot_dimension_numbers=(([1], [rhs_contract]), ([], [])),
                                           lhs_ragged_dimensions=[0], rhs_group_dimensions=[0])
        sizes = jax.ShapeDtypeStruct((g,), jnp.int32)
        return (lambda a, b, s: gx.ragged_dot(a, b, s, dn, preferred_element_type=jnp.bfloat16,
                                              backend=backend)), (lhs, rhs, sizes)

    v = jax.ShapeDtypeStruct((1024,), jnp.float32)
    return {
        "formats.cuda": formats,
        "block_scaled_dot.cublaslt": {
            "per_tensor": dot(gx.FP8_TENSOR, gx.FP8_TENSOR, "cublaslt"),
            "per_tensor_batched": dot(gx.FP8_TENSOR, gx.FP8_TENSOR, "cublaslt", (3, 64, 256), (3, 128, 256), batched),
            "fp8_blockwise_1x128_128x128": dot(gx.FP8_1x128, gx.FP8_128x128, "cublaslt", out=jnp.bfloat16),
            "fp8_blockwise_1x128_1x128": dot(gx.FP8_1x128, gx.FP8_1x128, "cublaslt", (40, 256)),
            "mxfp8": dot(gx.MXFP8_E4M3, gx.MXFP8_E4M3, "cublaslt"),
            "nvfp4": dot(gx.NVFP4, gx.NVFP4, "cublaslt"),
        },
        "block_scaled_dot.cudnn": {
            "mxfp8": dot(gx.MXFP8_E4M3, gx.MXFP8_E4M3, "cudnn"),
            "nvfp4": dot(gx.NVFP4, gx.NVFP4, "cudnn", out=jnp.bfloat16),
        },
        "block_scaled_dot.hopper_mx": {
            "mxfp8": dot(gx.MXFP8_E4M3, gx.MXFP8_E4M3, "hopper_mx", (2, 64, 256), (2, 128, 256), batched),
            "mxfp8_e4m3_e5m2": dot(gx.MXFP8_E4M3, gx.MXFP8_E5M2, "hopper_mx", out=jnp.bfloat16),
            "mxfp4": dot(gx.MXFP4, gx.MXFP8_E4M3, "hopper_mx"),
            "nvfp4": dot(gx.NVFP4, gx.NVFP4, "hopper_mx"),
        },
        "ragged_dot.cublaslt": {"fp8_blockwise_gkn": ragged("cublaslt", 1), "fp8_blockwise_gnk": ragged("cublaslt", 2)},
        "ragged_dot.hopper": {"fp8_blockwise_gkn": ragged("hopper", 1), "fp8_blockwise_gnk": ragged("hopper", 2)},
        "place.custom_call": {
            "collective": (lambda a: gx.place(a, gx.MemorySpace.COLLECTIVE, backend="custom_call"), (v,)),
            "temp": (lambda a: gx.place(a, gx.MemorySpace.TEMP, backend="custom_call"), (v,)),
            "identity": (lambda a: gx.place(a, gx.MemorySpace.COLLECTIVE, backend="identity"), (v,)),
        },
    }


@contextlib.contextmanager
def _as_lowered_for_the_golden():
    """Selection forced to the named backend (no gates, no verification, no trace-time probing:
    only the lowering matters here), and the facts the glue reads from the machine fixed to those
    of the GPU run's image (H200, cuDNN 9.19: the fused NVFP4 global scale; float4 packed two per
    byte, low nibble first), so the goldens are the same on every machine."""
    from jax_gpuext.common import backends, gates
    from jax_gpuext.dot import hopper_mx
    from jax_gpuext.formats import FP4_PACKED

    real_select, real_check, real_choose = backends.select, gates.check, hopper_mx.choose_config
    fixed = {"cudnn_fused_global_scale": True, "jaxlib_custom_call_memory_spaces": True}

    def select(op, requested="auto", *, problem=None):
        backends.check_requested(op, requested)
        return backends.Selection(op, requested, "cuda", requested, "forced for the golden lowering", [], False)

    backends.select = select
    gates.check = lambda name: gates.GateResult(fixed[name], "fixed for the golden") if name in fixed else real_check(name)
    hopper_mx.choose_config = lambda b, m, n, k, *rest: (hopper_mx.default_config(b, m, n, k), "default")
    FP4_PACKED["cuda"] = True
    try:
        with backends.platform("cuda"):  # traced for CUDA alone (no CPU branch: common/export.py per_platform)
            yield
    finally:
        backends.select, gates.check, hopper_mx.choose_config = real_select, real_check, real_choose
        del FP4_PACKED["cuda"]


def lower(fn, args) -> str:
    import jax

    text = jax.jit(fn).trace(*args).lower(lowering_platforms=("cuda",)).as_text(debug_info=False)
    # jax numbers the module after the traced function's name; a lambda is a lambda
    return re.sub(r"module @\S+", "module @golden", text).rstrip() + "\n"


def render(only=None) -> dict[pathlib.Path, str]:
    """Every golden file, as this tree lowers it."""
    import jax
    import jaxlib

    out = {}
    cases_by_component = _cases()  # the operands come from auto's quantize, outside the forcing
    with _as_lowered_for_the_golden():
        for component, cases in cases_by_component.items():
            if only and component not in only:
                continue
            for case, (fn, args) in cases.items():
                head = HEADER.format(component=component, case=case, jax=jax.__version__, jaxlib=jaxlib.__version__)
                out[GOLDEN / component / f"{case}.mlir"] = head + "\n" + lower(fn, args)
    return out


def golden_jaxlib(root: pathlib.Path = GOLDEN) -> str | None:
    """The jaxlib the committed goldens were made with."""
    for path in sorted(root.glob("*/*.mlir")):
        m = re.search(r"jaxlib (\S+);", path.read_text().splitlines()[0])
        if m:
            return m.group(1)
    return None


def differences(rendered: dict[pathlib.Path, str]) -> list[str]:
    """A unified diff per golden that differs, is new, or is gone."""
    out = []
    existing = set(GOLDEN.glob("*/*.mlir"))
    for path in sorted(set(rendered) | existing):
        old = path.read_text().splitlines(keepends=True)[1:] if path.exists() else []
        new = rendered[path].splitlines(keepends=True)[1:] if path in rendered else []
        if old != new:
            rel = path.relative_to(ROOT).as_posix()
            out.append("".join(difflib.unified_diff(old, new, f"a/{rel}", f"b/{rel}")) or f"{rel}: header only\n")
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--write", action="store_true", help="write the goldens (after reviewing the diff)")
    ap.add_argument("components", nargs="*", help="only these components")
    args = ap.parse_args(argv)
    rendered = render(set(args.components) or None)
    diffs = differences(rendered) if not args.components else [
        d for d in differences(rendered) if any(f"/{c}/" in d.splitlines()[0] for c in args.components)]
    for d in diffs:
        print(d)
    if args.write:
        for path, text in rendered.items():
            path.parent.mkdir(parents=True, exist_ok=True)
            if not path.exists() or path.read_text() != text:
                path.write_text(text)
        if not args.components:
            for path in set(GOLDEN.glob("*/*.mlir")) - set(rendered):
                path.unlink()
        print(f"wrote {len(rendered)} goldens" + (f" ({len(diffs)} changed: say in the commit whether their "
                                                  "kernels need a GPU run)" if diffs else ""))
        return 0
    print(f"{len(diffs)} golden(s) differ (review, then --write)" if diffs else "goldens are current")
    return 1 if diffs else 0


if __name__ == "__main__":
    sys.exit(main())
