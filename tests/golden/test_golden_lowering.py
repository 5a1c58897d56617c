"""The GPU backends' Python glue, pinned by golden lowerings (scripts/update_golden.py): a
backend's source fingerprint covers its compiled code only, so what the glue hands the kernel is
checked here, on CPU, instead (docs/design.md, "Fingerprints: compiled code only")."""

from __future__ import annotations

import pathlib
import sys

import jaxlib
import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts"))
import update_golden  # noqa: E402
import update_verified  # noqa: E402

MADE_WITH = update_golden.golden_jaxlib()
same_jaxlib = pytest.mark.skipif(
    MADE_WITH is None or MADE_WITH.split(".")[:2] != jaxlib.__version__.split(".")[:2],
    reason=f"the goldens were lowered by jaxlib {MADE_WITH}; jaxlib {jaxlib.__version__} prints StableHLO "
           "differently (regenerate with scripts/update_golden.py under it to compare there)")


@same_jaxlib
def test_the_glue_lowers_as_the_goldens_say():
    diffs = update_golden.differences(update_golden.render())
    assert not diffs, ("the custom calls our GPU kernels receive changed; review, then run "
                       "python scripts/update_golden.py --write:\n" + "\n".join(diffs)[:6000])


def test_every_component_without_python_in_its_fingerprint_has_goldens():
    """The fingerprint leaves a component's Python out only where a golden pins it."""
    spec = update_verified.parse_spec((ROOT / update_verified.SPEC).read_text())
    for component, patterns in spec.items():
        has_python = any(p.startswith("jax_gpuext/") for p in patterns)
        goldens = list((update_golden.GOLDEN / component).glob("*.mlir"))
        assert has_python or goldens, f"{component}: neither its Python nor a golden lowering is checked"
        assert not any(p.endswith(".py") for p in patterns if not p.startswith("jax_gpuext/")), patterns


@same_jaxlib
def test_a_changed_scale_layout_is_caught(monkeypatch):
    """The kind of glue change the goldens exist for: cuBLASLt's VEC128_32F scales passed K-major
    instead of M-major have the same shape (quietly wrong results on the GPU, REFERENCE 9)."""
    from jax_gpuext.dot import cublaslt

    monkeypatch.setattr(cublaslt, "rows_fastest", lambda s: s.reshape(s.shape[0], -1))
    diffs = update_golden.differences(update_golden.render({"block_scaled_dot.cublaslt"}))
    changed = {d.splitlines()[0] for d in diffs}
    assert any("fp8_blockwise_1x128_128x128.mlir" in c for c in changed), changed
    assert not any("per_tensor" in c for c in changed), changed  # the per-tensor call has no 1x128 scales


def test_rendering_leaves_selection_and_the_fp4_layout_as_they_were():
    from jax_gpuext.common import backends, gates
    from jax_gpuext.formats import FP4_PACKED

    select, check = backends.select, gates.check
    update_golden.render({"place.custom_call"})
    assert backends.select is select and gates.check is check
    assert "cuda" not in FP4_PACKED._overrides
