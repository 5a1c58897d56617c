"""Shared test setup.

- ``@pytest.mark.gates("cuda_device", "hopper")`` skips a test unless every named gate of
  ``jax_gpuext.gates`` is open, with the gate's reason as the skip reason. Under
  ``JAX_GPUEXT_REQUIRE_GPU=1`` (the GPU run script sets it) such a skip is a failure instead, so a
  GPU run cannot pass by skipping its GPU tests, unless only architecture gates are closed (a
  Blackwell test on an H100 still skips, with the reason in the report), nor where only gates no
  GPU run can open are closed (``IMAGE_GATES``: a library newer than the lent image has).
- ``@pytest.mark.verifies("block_scaled_dot.{backend}", mode="plain")`` names the components of
  the verification record (``jax_gpuext.common.verified``) a GPU test exercises; ``{param}`` is filled
  from the test's parameters and keyword arguments restrict the marker to parameter values. The
  names go to the junit file (a ``verifies`` property per test, and ``verifies_collected`` for the
  whole group), from which ``scripts/write_results.py`` and ``scripts/update_verified.py`` build
  the record. ``feature="fp8_blockwise"`` (reserved keyword, ``{param}`` filled too) names the
  feature of the component the test verifies (``Backend.feature``): a ``verifies_feature``
  property ``component=feature``; a test with none verifies the whole component.
- ``@pytest.mark.isolated`` (``isolated(only="gpu")``) runs tests in child processes so that a
  kernel's trap, which poisons the process's CUDA context, fails only the test that trapped
  (tests/_isolation.py, loaded here as a plugin; ``--isolation=batch|each|off``).
- ``--param-subset=each-value`` (CI's version legs) runs, of each parametrized test function, only
  the variants needed for every parameter value to run once (tests/_param_subset.py).
- Tests must run against the installed package: a source checkout without the compiled
  extension would silently test only the reference paths.
"""

from __future__ import annotations

import json
import os
import pathlib

# 8 host devices for the multi-device tests (all_reduce, issue 6). XLA reads XLA_FLAGS when
# its CPU backend starts, so this must run before any test touches jax.devices().
if "xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8").strip()

import sys

# Some test modules import helpers from another capability's tests (tests/fuzz and
# tests/formats/test_formats_gpu.py from tests/formats/test_formats.py, tests/dot's dimension tests
# from test_block_scaled_dot.py). pytest puts a test file's folder on sys.path only when it collects
# that file, so `pytest tests/fuzz` alone failed to import; these folders go on the path up front.
for _folder in ("formats", "dot"):
    if str(pathlib.Path(__file__).parent / _folder) not in sys.path:
        sys.path.append(str(pathlib.Path(__file__).parent / _folder))

import pytest

import jax_gpuext
from jax_gpuext.common import env, gates

# tests/_isolation.py: the `isolated` marker and --isolation; tests/_param_subset.py:
# --param-subset (CI's version legs). This folder is on sys.path, as for the tests' other helpers.
pytest_plugins = ("_isolation", "_param_subset")

REQUIRE_GPU = env.get("JAX_GPUEXT_REQUIRE_GPU")
# Gates a GPU run cannot open by installing anything: the GPU in the machine is another
# architecture. Under JAX_GPUEXT_REQUIRE_GPU=1 these alone still skip (a Blackwell test on an
# H100); any other closed gate (a missing build part, library or device) fails.
ARCHITECTURE_GATES = {"sm80", "fp8_tensor_cores", "hopper", "blackwell"}
# Gates no step of a GPU run can open either: a library newer than any the lent image can have.
# cublaslt_grouped_fp8 needs cuBLAS >= 13.4; the image's torch pins nvidia-cublas 13.1 and the
# machine has no network (a cuBLAS wheel is far above what a device call can carry). Its tests skip
# there with the reason instead of spending the run's minutes on failures nobody can fix in it.
IMAGE_GATES = {"cublaslt_grouped_fp8"}


def pytest_configure(config):
    config.addinivalue_line("markers", "gates(*names): skip unless these jax_gpuext gates are open")
    config.addinivalue_line("markers", "verifies(*components, **params): the verification-record components "
                                       "this GPU test exercises (where its parameters equal params)")
    config.addinivalue_line("markers", "run_first(rank): within its module, runs before the unmarked tests, "
                                       "lowest rank first (the GPU script's steps have time bounds)")
    here = pathlib.Path(jax_gpuext.__file__).resolve().parent
    if not gates.check("cpu_extension").supported:
        raise pytest.UsageError(
            f"jax_gpuext imported from {here} has no usable CPU extension "
            f"({gates.check('cpu_extension').reason}). Install the package (README) and run "
            "the venv's pytest, not `python -m pytest` from the source tree.")


def _applicable_verifies(item):
    params = getattr(getattr(item, "callspec", None), "params", {})
    for m in item.iter_markers("verifies"):
        filters = {k: v for k, v in m.kwargs.items() if k != "feature"}
        if all(k in params and str(params[k]) == str(v) for k, v in filters.items()):
            feature = m.kwargs.get("feature")
            yield [c.format(**params) for c in m.args], None if feature is None else feature.format(**params)


def verified_components(item) -> list[str]:
    """The components named by ``item``'s ``verifies`` markers that apply to its parameters."""
    return sorted({c for comps, _ in _applicable_verifies(item) for c in comps})


def collected_counts(items) -> dict[str, dict[str, int]]:
    """{component: {feature or "": number of the items that verify it}}."""
    out: dict[str, dict[str, int]] = {}
    for item in items:
        features = verified_features(item)
        for component in verified_components(item):
            per = out.setdefault(component, {})
            per[features.get(component, "")] = per.get(features.get(component, ""), 0) + 1
    return out


def verified_features(item) -> dict[str, str]:
    """``{component: feature}`` for the components whose applicable markers name a feature; two
    different features for one component is a mistake in the markers."""
    out: dict[str, str] = {}
    for comps, feature in _applicable_verifies(item):
        for c in comps if feature is not None else ():
            if out.setdefault(c, feature) != feature:
                raise pytest.UsageError(f"{item.nodeid}: verifies markers name two features of {c}: "
                                        f"{out[c]!r} and {feature!r}")
    return out


def _run_first_order(items):
    """Within each module (modules keep their order), tests marked run_first(rank) come first, lowest
    rank first, the rest in file order: the GPU script's steps are time-bounded, and the tests a step
    is for must not be the ones its bound cuts (tests/formats/test_formats_gpu.py's kernel timing)."""
    first_seen: dict = {}
    keyed = []
    for i, item in enumerate(items):
        module = first_seen.setdefault(item.nodeid.split("::", 1)[0], i)
        marker = item.get_closest_marker("run_first")
        keyed.append(((module, marker.args[0] if marker else float("inf"), i), item))
    items[:] = [item for _, item in sorted(keyed, key=lambda k: k[0])]


def pytest_collection_modifyitems(config, items):
    _run_first_order(items)
    for item in items:
        for component in verified_components(item):
            item.user_properties.append(("verifies", component))
        for component, feature in sorted(verified_features(item).items()):
            item.user_properties.append(("verifies_feature", f"{component}={feature}"))
        names = [n for m in item.iter_markers("gates") for n in m.args]
        if item.get_closest_marker("gpu") and "cuda_device" not in names:
            names = ["cuda_extension", "cuda_device"] + names
        if not names:
            continue
        r = gates.check_all(names)
        if r.supported:
            continue
        closed = [n for n in names if not gates.check(n).supported]
        if REQUIRE_GPU and not set(closed) <= ARCHITECTURE_GATES | IMAGE_GATES:
            item.add_marker(pytest.mark.usefixtures("_gate_closed_is_failure"))
            item.user_properties.append(("closed_gate", r.reason))
        else:
            item.add_marker(pytest.mark.skip(reason=f"gate closed: {r.reason}"))


@pytest.fixture
def _gate_closed_is_failure(request):
    reason = dict(request.node.user_properties)["closed_gate"]
    pytest.fail(f"JAX_GPUEXT_REQUIRE_GPU=1 but a gate is closed: {reason}")


@pytest.fixture(scope="session", autouse=True)
def _verifies_collected(request, record_testsuite_property):
    """Every component the selected tests exercise, for the junit file: if this group is cut short
    (a hang), none of them counts as verified by the run (the hung test is not in the file)."""
    names = sorted({c for item in request.session.items for c in verified_components(item)})
    record_testsuite_property("verifies_collected", ",".join(names))
    # ...and how many tests of each (component, feature) were selected ("" for the whole component):
    # a group cut short then blames only what it did not finish (jax_gpuext/common/verified.py)
    record_testsuite_property("verifies_collected_counts", json.dumps(collected_counts(request.session.items),
                                                                      sort_keys=True))
