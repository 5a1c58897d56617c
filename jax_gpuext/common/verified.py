"""The verification record: which GPU backends have passed their GPU tests, where, at which source,
for which features, and how fast they measured.

A GPU backend (our CUDA code: formats ``cuda``, the dot's ``cublaslt`` / ``cudnn`` / ``hopper_mx``,
the grouped dots, the NVSHMEM all-reduce, the ``place`` custom call) is *verified* for a feature
on an architecture at a source fingerprint when a committed GPU run (``benchmarks/results/*.json``,
written by ``scripts/gpu_run.sh``) shows that feature's tests passing there, and no test of the
whole component failing, on a build whose fingerprint of that backend's compiled sources
(``cmake/verified_sources.txt``, hashed by CMake into ``build_info()``) matches. A feature is what a
backend runs for one kind of problem (cuBLASLt: ``fp8_blockwise``, ``per_tensor``,
``per_tensor_batched``, ...; ``Backend.feature(problem)`` names it); the tests name theirs in
``@pytest.mark.verifies(component, feature=...)``; runs written before features existed get theirs
from ``LEGACY_FEATURES``. ``verified.json`` next to this file is generated from the results by
``scripts/update_verified.py``, never written by hand; a CI test regenerates it and checks it.

The record also carries the speeds the results' benchmarks measured (``speeds``). On a CUDA device
``backend="auto"``, for the ops in ``SPEED_OPS``, runs the fastest of the verified backends and
the xla path for this op, format pairing (quantize / dequantize: format and layout, ``quantize_key``)
and size class, never one measured slower than the xla path (``rank``); ``explain`` shows the
numbers. docs/design.md, "Speed-aware auto and per-feature verification", gives the rules and their
reasons.

Naming a backend runs it anyway (one warning per process); ``JAX_GPUEXT_ALLOW_UNVERIFIED=1`` turns
the record off for ``auto`` (verification and speeds: the first backend that runs, in preference
order; the GPU test run sets it, so the tests still exercise every backend).
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import pathlib
import re
import statistics

from jax_gpuext.common import env, gates
from jax_gpuext.common import extension as _ext
from jax_gpuext.common.gates import GateResult

ALLOW_ENV = "JAX_GPUEXT_ALLOW_UNVERIFIED"
RECORD_PATH = pathlib.Path(__file__).with_name("verified.json")
RESULTS_DIR = "benchmarks/results"
# The GPU backends that need a passing GPU run before `auto` takes them: component -> (op, backend).
# The components are the names of cmake/verified_sources.txt and of the tests' `verifies` markers.
COMPONENTS = {
    "formats.cuda": ("quantize / dequantize", "cuda"),
    "block_scaled_dot.cublaslt": ("block_scaled_dot", "cublaslt"),
    "block_scaled_dot.cudnn": ("block_scaled_dot", "cudnn"),
    "block_scaled_dot.hopper_mx": ("block_scaled_dot", "hopper_mx"),
    "ragged_dot.cublaslt": ("ragged_dot", "cublaslt"),
    "ragged_dot.hopper": ("ragged_dot", "hopper"),
    "all_reduce.one_shot": ("all_reduce", "one_shot"),
    "all_reduce.two_shot": ("all_reduce", "two_shot"),
    "all_reduce.graph_safe": ("all_reduce", f"graph-safe target (one_shot / two_shot / nvshmem_library "
                                            f"under JAX_GPUEXT_ALLREDUCE_GRAPH_SAFE=1)"),
    "all_reduce.nvshmem_library": ("all_reduce", "nvshmem_library"),
    "place.custom_call": ("place", "custom_call / identity (the gpuext_place CUDA handler)"),
}
# (op, backend) -> the components whose code that backend runs on CUDA. Every backend that runs
# our CUDA code is here (a test checks it); XLA's own paths and the CPU handlers are not.
BACKENDS = {
    ("quantize", "cuda"): ("formats.cuda",),
    ("dequantize", "cuda"): ("formats.cuda",),
    ("quantize_token_slots", "cuda"): ("formats.cuda",),  # the weight gradient's operands (ragged_dot/token_slots.py)
    ("block_scaled_dot", "cublaslt"): ("block_scaled_dot.cublaslt",),
    ("block_scaled_dot", "cudnn"): ("block_scaled_dot.cudnn",),
    ("block_scaled_dot", "hopper_mx"): ("block_scaled_dot.hopper_mx",),
    ("ragged_dot", "cublaslt"): ("ragged_dot.cublaslt",),
    ("ragged_dot", "hopper"): ("ragged_dot.hopper",),
    ("ragged_dot_masked", "hopper"): ("ragged_dot.hopper",),  # the same kernel, its masked mode
    ("all_reduce", "one_shot"): ("all_reduce.one_shot",),
    ("all_reduce", "two_shot"): ("all_reduce.two_shot",),
    ("all_reduce", "nvshmem_library"): ("all_reduce.nvshmem_library",),
    # identity is the same gpuext_place handler without the memory-space annotation
    ("place", "custom_call"): ("place.custom_call",),
    ("place", "identity"): ("place.custom_call",),
}
GRAPH_SAFE_ENV = "JAX_GPUEXT_ALLREDUCE_GRAPH_SAFE"  # collectives.GRAPH_SAFE_ENV: the graph-safe target
EMPTY_RECORD = {"generated_by": "scripts/update_verified.py from benchmarks/results/*.json (do not edit)",
                "entries": [], "speeds": []}

# The fingerprint scheme cmake/source_fingerprints.cmake computes (it adds "scheme=2" to the
# fingerprints it carries). Scheme 1 (commits up to eff6f45) hashed each backend's Python glue
# too; results of a scheme-1 build get scheme-2 fingerprints from SCHEME_TRANSLATIONS, computed from
# git by scripts/update_verified.py (docs/design.md, "Fingerprints: compiled code only").
FINGERPRINT_SCHEME = "2"
SCHEME_KEY = "scheme"
SCHEME_TRANSLATIONS = "benchmarks/results/source-fingerprints.tsv"

# --------------------------------------------------------------------------- features
COMPONENT_WIDE = ""  # the feature of a test that names none: it counts against every feature
# Tests of results written before the tests named features (write_results.py sets
# gpu_tests["features_recorded"] since): (component, regex on "module::test[params]", feature).
# First match wins; no match: component-wide. tests/common/test_verified.py checks that the
# markers of every test still collected name the same feature as this table does.
LEGACY_FEATURES = (
    ("formats.cuda", r"::test_cuda_matches_reference_bit_for_bit\[\w+-(MXFP8_E4M3)\]$", "MXFP8_E4M3"),
    ("formats.cuda", r"::test_cuda_matches_reference_bit_for_bit\[\w+-(MXFP8_E5M2)\]$", "MXFP8_E5M2"),
    ("formats.cuda", r"::test_cuda_matches_reference_bit_for_bit\[\w+-(MXFP4)\]$", "MXFP4"),
    ("formats.cuda", r"::test_cuda_matches_reference_bit_for_bit\[\w+-(NVFP4)\]$", "NVFP4"),
    ("formats.cuda", r"::test_cuda_matches_reference_bit_for_bit\[\w+-(FP8_1x128)\]$", "FP8_1x128"),
    ("formats.cuda", r"::test_cuda_matches_reference_bit_for_bit\[\w+-(FP8_128x128)\]$", "FP8_128x128"),
    ("formats.cuda", r"::test_cuda_per_tensor_matches_reference\[", "FP8_TENSOR"),
    ("block_scaled_dot.cublaslt", r"::test_gpu_backend_matches_reference\[cublaslt-fp8-per-tensor\]$", "per_tensor"),
    ("block_scaled_dot.cublaslt", r"::test_gpu_backend_matches_reference\[cublaslt-fp8-1x128x", "fp8_blockwise"),
    ("block_scaled_dot.cublaslt", r"::test_gpu_backend_matches_reference\[cublaslt-mxfp8\]$", "mxfp8"),
    ("block_scaled_dot.cublaslt", r"::test_gpu_backend_matches_reference\[cublaslt-nvfp4\]$", "nvfp4"),
    ("block_scaled_dot.cublaslt", r"::test_gpu_cublaslt_fp8_blockwise_ragged_and_batched\[", "fp8_blockwise"),
    ("block_scaled_dot.cublaslt", r"::test_gpu_command_buffer\[", "command_buffer"),
    ("block_scaled_dot.cublaslt", r"::test_gpu_cublaslt_executable_compiled_elsewhere", "command_buffer"),
    ("block_scaled_dot.cublaslt", r"::test_gpu_per_tensor_batched_and_vmapped$", "per_tensor_batched"),
    ("block_scaled_dot.cublaslt", r"::test_gpu_training_step_uses_cublaslt$", "training_step"),
    ("block_scaled_dot.cudnn", r"::test_gpu_backend_matches_reference\[cudnn-mxfp8\]$", "mxfp8"),
    ("block_scaled_dot.cudnn", r"::test_gpu_backend_matches_reference\[cudnn-nvfp4\]$", "nvfp4"),
    ("block_scaled_dot.cudnn", r"::test_gpu_command_buffer\[", "command_buffer"),
    ("block_scaled_dot.cudnn", r"::test_gpu_matches_reference\[.*-mxfp8\]$", "mxfp8"),
    ("block_scaled_dot.cudnn", r"::test_gpu_matches_reference\[.*-nvfp4\]$", "nvfp4"),
    ("block_scaled_dot.cudnn", r"::test_gpu_batched_mixed_mx$", "mxfp8"),
    ("block_scaled_dot.cudnn", r"::test_gpu_nvfp4_global_scale_applied_once$", "nvfp4"),
    ("block_scaled_dot.hopper_mx", r"::test_matches_float64_reference\[MXFP8_\w+-MXFP8_\w+-", "mxfp8"),
    ("block_scaled_dot.hopper_mx", r"::test_matches_float64_reference\[NVFP4-NVFP4-", "nvfp4"),
    ("block_scaled_dot.hopper_mx", r"::test_matches_float64_reference\[MXFP\w+-MXFP\w+-", "mxfp4"),
    ("block_scaled_dot.hopper_mx", r"::test_every_tile_config_and_output_dtype\[", "mxfp8"),
    ("ragged_dot.hopper", r"::test_gpu_matches_f64\[", "fp8_blockwise"),
    ("ragged_dot.hopper", r"::test_gpu_many_tiles_and_stages\[", "fp8_blockwise"),
    ("ragged_dot.hopper", r"::test_gpu_command_buffer_reads_the_sizes_of_each_call\[", "command_buffer"),
    ("ragged_dot.cublaslt", r"::test_gpu_matches_f64\[", "fp8_blockwise"),
    ("ragged_dot.cublaslt", r"::test_gpu_formats_layouts_outputs\[", "fp8_blockwise"),
    ("ragged_dot.cublaslt", r"::test_gpu_command_buffer_reads_the_sizes_of_each_call\[", "command_buffer"),
)


def legacy_feature(component: str, test: str) -> str:
    for comp, pattern, feature in LEGACY_FEATURES:
        if comp == component and re.search(pattern, test):
            return feature
    return COMPONENT_WIDE


def case_feature(result: dict, case: dict, component: str) -> str:
    """The feature a results file's test ``case`` verifies of ``component``."""
    declared = (case.get("features") or {}).get(component)
    if declared is not None:
        return declared
    if result.get("gpu_tests", {}).get("features_recorded"):
        return COMPONENT_WIDE  # the test named no feature: it is about the whole component
    return legacy_feature(component, case["test"])


def allow_unverified() -> bool:
    return env.get(ALLOW_ENV)


@functools.cache
def record() -> dict:
    """The installed record (an empty record where the file is missing: nothing is verified)."""
    if not RECORD_PATH.exists():
        return dict(EMPTY_RECORD)
    return {**EMPTY_RECORD, **json.loads(RECORD_PATH.read_text())}


def _components_only(fps: dict) -> dict[str, str]:
    return {k: v for k, v in fps.items() if k != SCHEME_KEY}


def build_fingerprints() -> dict[str, str]:
    """The source fingerprints of the GPU code this installation runs: the CUDA extension's
    (every fingerprint is computed in the one CMake configure that builds all modules)."""
    info = _ext.build_info("cuda")
    return _components_only(dict(info.get("source_fingerprints", {}))) if info else {}


def build_scheme() -> str | None:
    info = _ext.build_info("cuda") or _ext.build_info("cpu") or {}
    return dict(info.get("source_fingerprints", {})).get(SCHEME_KEY, "1" if info.get("source_fingerprints") else None)


def source_fingerprints() -> dict[str, str]:
    """The fingerprints any installed module carries (the CPU extension's where there is no
    CUDA build): what ``info`` shows to compare with the record."""
    for kind in ("cuda", "cpu"):
        info = _ext.build_info(kind)
        if info and info.get("source_fingerprints"):
            return _components_only(dict(info["source_fingerprints"]))
    return {}


def architecture() -> str | None:
    """"sm_90" for the first CUDA device, None without one."""
    cc = gates.compute_capability()
    return None if cc is None else f"sm_{cc[0]}{cc[1]}"


def device_kind() -> str | None:
    devs = gates.cuda_devices()
    return getattr(devs[0], "device_kind", None) if devs else None


def entries(component: str | None = None) -> list[dict]:
    return [e for e in record()["entries"] if component is None or e["component"] == component]


def components(op: str, backend: str) -> tuple[str, ...]:
    """What backend ``backend`` of ``op`` runs on CUDA, as record components (() for none). The
    NVSHMEM all-reduce under JAX_GPUEXT_ALLREDUCE_GRAPH_SAFE=1 lowers to the graph-safe target,
    which must have passed too."""
    found = BACKENDS.get((op, backend), ())
    if op == "all_reduce" and found and env.get(GRAPH_SAFE_ENV):
        found += ("all_reduce.graph_safe",)
    return found


def _tally(t: dict) -> str:
    return ", ".join(f"{t[k]} {k}" for k in ("passed", "failed", "skipped") if t.get(k))


def check(component: str, feature: str | None = None) -> GateResult:
    """Is ``component`` verified on this device's architecture at this build's fingerprint, for
    ``feature`` (None: the whole component, every test of it)?"""
    if component not in COMPONENTS:
        raise KeyError(f"unknown component {component!r}; known: {sorted(COMPONENTS)}")
    arch = architecture()
    if arch is None:
        return GateResult(False, "no CUDA device")
    fp = build_fingerprints().get(component)
    here = [e for e in entries(component) if e["architecture"] == arch]
    match = [e for e in here if e["fingerprint"] == fp]
    why = f"not verified on {arch} at this source (see {RESULTS_DIR})"
    if fp is None:
        return GateResult(False, f"{why}: this build carries no fingerprint for {component}")
    if not match:
        if here:
            scheme = build_scheme()
            old = f" (fingerprint scheme {scheme}, the record's is {FINGERPRINT_SCHEME}: reinstall)" \
                if scheme != FINGERPRINT_SCHEME else ""
            return GateResult(False, f"{why}: passed at source {', '.join(sorted({e['fingerprint'] for e in here}))}, "
                                     f"this build is {fp}{old}")
        return GateResult(False, why)
    e = match[0]
    wide = e["component_wide"]
    if e.get("cut_short"):
        return GateResult(False, f"{why}: a test group that ran its tests was cut short ({', '.join(e['cut_short'])}, "
                                 f"{e['results']})")
    if feature is None:
        if e["verified"]:
            return GateResult(True, f"verified on {arch} at this source ({e['results']})")
        failed = sorted(f for f, t in e["features"].items() if t["failed"]) + (["component-wide tests"]
                                                                                if wide["failed"] else [])
        return GateResult(False, f"{why}: failed: {', '.join(failed) or 'no test passed'} ({e['results']})")
    if wide["failed"]:
        return GateResult(False, f"not verified on {arch} at this source: component-wide tests failed "
                                 f"({_tally(wide)}; {wide['results']})")
    t = e["features"].get(feature)
    if t is None or not (t["passed"] or t["failed"]):
        tested = sorted(f for f, v in e["features"].items() if v["verified"])
        return GateResult(False, f"not verified on {arch} at this source for {feature}: no GPU test of it ran "
                                 f"(verified: {', '.join(tested) or 'none'}; {e['results']})")
    if not t["verified"]:
        return GateResult(False, f"not verified on {arch} at this source for {feature}: {_tally(t)} "
                                 f"({t['results']})")
    return GateResult(True, f"verified on {arch} at this source for {feature} ({_tally(t)}; {t['results']})")


def check_all(components, feature: str | None = None) -> GateResult:
    for c in components:
        r = check(c, feature)
        if not r.supported:
            return r
    return GateResult(True, "; ".join(check(c, feature).reason for c in components))


def caveats(component: str) -> list[str]:
    """Features of ``component`` that failed at this source on this architecture and that no
    problem's feature names (command_buffer, training_step): they gate nothing (docs/design.md
    says why), so explain shows them beside the choice."""
    arch, fp = architecture(), build_fingerprints().get(component)
    out = []
    for e in entries(component):
        if e["architecture"] == arch and e["fingerprint"] == fp:
            out += [f"{component} feature {f} failed on {arch} at this source ({_tally(t)}; {t['results']})"
                    for f, t in sorted(e["features"].items()) if t["failed"] and f in NON_PROBLEM_FEATURES]
    return out


# Features a test names that describe how XLA runs a call, not a kind of problem: no
# Backend.feature returns them, so they never gate `auto`; their failures are shown as caveats.
NON_PROBLEM_FEATURES = ("command_buffer", "training_step")


# --------------------------------------------------------------------------- building the record
def results_fingerprints(result: dict, translations: dict | None = None) -> tuple[dict, str | None]:
    """The scheme-2 fingerprints of the build a results file ran, and how they were obtained
    (None: as the build reported them). A scheme-1 build's come from ``translations``
    (``{commit: {component: fingerprint}}``, SCHEME_TRANSLATIONS); without one it names none."""
    ext = result.get("versions", {}).get("cuda_extension") or {}
    fps = ext.get("source_fingerprints") or {}
    if isinstance(fps, str):
        fps = _ext.parse_fingerprints(fps)
    if fps.get(SCHEME_KEY) == FINGERPRINT_SCHEME:
        return _components_only(fps), None
    if not fps:
        return {}, None
    commit = str(result.get("commit", ""))
    found = (translations or {}).get(commit)
    if found is None:
        return {}, None
    return dict(found), f"scheme {FINGERPRINT_SCHEME} from git at {commit[:12]} ({SCHEME_TRANSLATIONS})"


def evidence(result: dict, component: str, translations: dict | None = None) -> dict:
    """What one GPU results file says about ``component``: per feature its tests' outcomes (cases
    carrying its ``verifies`` property), the architecture, the fingerprint of the build that ran,
    and whether a test group that could hold its tests was cut short (a hang: the test that hung
    never reaches the junit file)."""
    tests = result.get("gpu_tests", {})
    cases = [c for c in tests.get("cases", []) if component in c.get("verifies", [])]
    cut = [g for g in tests.get("cut_short", []) if _blames(tests, g, component, cases, result)]
    cc = str(result.get("device", {}).get("compute_cap", ""))
    fps, how = results_fingerprints(result, translations)
    features: dict[str, dict] = {}
    for c in cases:
        t = features.setdefault(case_feature(result, c, component), {"passed": [], "failed": [], "skipped": []})
        key = {"passed": "passed", "failure": "failed", "error": "failed", "skipped": "skipped"}.get(c["outcome"])
        if key:
            t[key].append(c["test"])
    return {
        "architecture": "sm_" + cc.replace(".", "") if cc else None,
        "fingerprint": fps.get(component),
        "fingerprint_from": how,
        "features": features,
        "passed": [c["test"] for c in cases if c["outcome"] == "passed"],
        "failed": [c["test"] for c in cases if c["outcome"] in ("failure", "error")],
        "skipped": [c["test"] for c in cases if c["outcome"] == "skipped"],
        "cut_short": [g["group"] for g in cut],
    }


def _in_group(case: dict, group: str, members: set | None) -> bool:
    if "group" in case:
        return case["group"] == group
    return members is not None and case["test"] in members


def _blames(tests: dict, cut: dict, component: str, cases: list, result: dict) -> bool:
    """Does group ``cut``, cut short (a hang, or its step's bound), hide a test of ``component``?

    With the group's collected counts (``gpu_tests.collected_counts``, written since the runs
    record them; for older runs derived from the commit's own test collection, see
    scripts/collected_tests.py) only when some selected test of the component did not finish:
    a group cut after all of a component's tests ran hides nothing of it. Without them, whenever
    the group could hold its tests."""
    name = cut["group"]
    counts = (tests.get("collected_counts") or {}).get(name)
    if counts is None:
        return cut.get("verifies_collected") is None or component in cut["verifies_collected"]
    members = set((tests.get("collected_tests") or {}).get(name, [])) or None
    for feature, selected in counts.get(component, {}).items():
        finished = sum(1 for c in cases if _in_group(c, name, members)
                       and case_feature(result, c, component) == feature)
        if finished < selected:
            return True
    return False


def passes(ev: dict) -> bool:
    """A run verifies a whole component when at least one of its tests passed, none failed, no
    group that could hold its tests was cut short, and the build carried its fingerprint."""
    return bool(ev["passed"]) and not ev["failed"] and not ev["cut_short"] and bool(ev["fingerprint"]) \
        and bool(ev["architecture"])


def _counts(t: dict, path: str) -> dict:
    return {"passed": len(t["passed"]), "failed": len(t["failed"]), "skipped": len(t["skipped"]), "results": path}


def build_record(results: dict[str, dict], translations: dict | None = None) -> dict:
    """The record from ``{results path: results json}``. Per (component, architecture,
    fingerprint) and per feature, the newest run that ran a test of that feature (passed or
    failed) decides: a later failure at the same source revokes an earlier pass, and a run that
    tests one feature leaves the others as earlier runs found them. A run cut short in a group
    that could hold the component's tests counts as a component-wide failure."""
    runs: dict[tuple, list] = {}
    for path, result in sorted(results.items()):
        for component in COMPONENTS:
            ev = evidence(result, component, translations)
            if not (ev["passed"] or ev["failed"] or ev["cut_short"]) or not ev["fingerprint"] or not ev["architecture"]:
                continue  # this run did not exercise it on a build that can be named
            stamp = (result.get("date", ""), path)
            runs.setdefault((component, ev["architecture"], ev["fingerprint"]), []).append((stamp, path, result, ev))
    out = []
    for (component, arch, fp), found in sorted(runs.items()):
        found.sort(key=lambda r: r[0])
        features: dict[str, dict] = {}
        for _, path, _, ev in found:  # oldest first: a newer run of a feature replaces it
            for name, t in ev["features"].items():
                if t["passed"] or t["failed"] or name not in features:
                    features[name] = _counts(t, path)
            if ev["cut_short"]:
                features[COMPONENT_WIDE] = {"passed": 0, "failed": 1, "skipped": 0, "results": path,
                                            "cut_short": ev["cut_short"]}
        wide = features.pop(COMPONENT_WIDE, {"passed": 0, "failed": 0, "skipped": 0, "results": found[-1][1]})
        for t in features.values():
            t["verified"] = bool(t["passed"]) and not t["failed"]
        newest = found[-1]
        any_passed = wide["passed"] or any(t["passed"] for t in features.values())
        any_failed = wide["failed"] or any(t["failed"] for t in features.values())
        out.append({"component": component, "architecture": arch, "fingerprint": fp,
                    **({"fingerprint_from": newest[3]["fingerprint_from"]} if newest[3]["fingerprint_from"] else {}),
                    "results": newest[1], "commit": newest[2].get("commit", "unknown"),
                    "date": newest[2].get("date", ""),
                    "verified": bool(any_passed) and not any_failed,
                    "cut_short": wide.get("cut_short", []),
                    "component_wide": {k: wide[k] for k in ("passed", "failed", "skipped", "results")},
                    "features": dict(sorted(features.items())),
                    "tests_passed": wide["passed"] + sum(t["passed"] for t in features.values()),
                    "tests_failed": wide["failed"] + sum(t["failed"] for t in features.values()),
                    "tests_skipped": wide["skipped"] + sum(t["skipped"] for t in features.values())})
    return {**EMPTY_RECORD, "entries": out, "speeds": speeds_from_results(results)}


# --------------------------------------------------------------------------- speeds
# The ops whose backends compute the same result and differ in speed: auto ranks them by the
# record. all_reduce is not (the benchmark cannot time XLA's psum on one GPU), nor is place
# (its backends differ in where the result lives, not in speed).
SPEED_OPS = ("block_scaled_dot", "ragged_dot", "quantize", "dequantize")
XLA_PATH = "xla"  # every op in SPEED_OPS has an xla backend: XLA's own code, the yardstick
# Our backend must measure at least this much faster than the xla path to be preferred: the
# spread between two runs of the same bench on one machine was 2% (bench_dot, 8192^3, parts 1 and
# 2 of the first H200 run), the quantize rows are single Python-timed runs, and a tie goes to
# XLA's own code (no custom call to capture, export or verify).
MARGIN = 1.05
# bench_dot's format keys (benchmarks/bench_dot.py FORMATS): its columns are "<backend>_<key>".
BENCH_DOT_PAIRINGS = {"fp8_blockwise": "FP8_1x128 x FP8_128x128", "mxfp8": "MXFP8_E4M3 x MXFP8_E4M3",
                      "nvfp4": "NVFP4 x NVFP4", "mxfp4": "MXFP4 x MXFP4"}
BENCH_DOT_OTHER = {"fp8_per_tensor": ("cublaslt", "FP8_TENSOR x FP8_TENSOR")}  # FP8_TENSOR through cuBLASLt
# bench_ragged_dot's columns: backend (cublaslt as its impl runs by default: row_align 16)
BENCH_RAGGED_COLUMNS = {"hopper": "hopper", "cublaslt": "cublaslt", "cublaslt_row_align16": "cublaslt",
                        "xla": "xla"}
RAGGED_PAIRING = "FP8_1x128 x FP8_128x128"


def size_class(work: float) -> int:
    """log2 of the work (FLOPs for a dot, bytes of the high-precision side for quantize and
    dequantize), rounded down: [2^c, 2^(c+1)) is class c."""
    return int(math.floor(math.log2(work))) if work >= 1 else 0


def _rnd(v: float) -> float:
    return float(f"{v:.5g}")


def measurements(result: dict, path: str) -> list[dict]:
    """Every backend speed a results file's benchmark sections hold, one row per (benchmark row,
    backend). Columns this does not know are left alone (the benchmarks may add fields)."""
    cc = str(result.get("device", {}).get("compute_cap", ""))
    if not cc:
        return []
    base = {"architecture": "sm_" + cc.replace(".", ""), "results": path,
            "commit": str(result.get("commit", "unknown")), "date": result.get("date", "")}
    out = []

    def add(op, pairing, backend, shape, work, value, unit, bench, device, **extra):
        if not pairing or not isinstance(value, (int, float)) or isinstance(value, bool) or not value > 0 \
                or not work > 0:
            return
        out.append({"op": op, "pairing": pairing, "backend": backend, "shape": list(shape), "work": work,
                    "size_class": size_class(work), "value": _rnd(value), "unit": unit, **base,
                    "device": device or result.get("device", {}).get("name") or "unknown", "benchmark": bench,
                    **{k: _rnd(v) for k, v in extra.items() if isinstance(v, (int, float)) and v}})

    for b in result.get("benchmarks", []):
        name, rows, device = b.get("benchmark"), b.get("rows") or [], b.get("device")
        if b.get("measurements"):  # the long form (benchmarks/_devtime.py): one dict per timed op
            _long_form(b["measurements"], name, device, add)
        elif name == "bench_dot":
            for r in rows:
                if not all(isinstance(r.get(d), int) for d in "MNK"):
                    continue
                shape, flops = (r["M"], r["N"], r["K"]), 2.0 * r["M"] * r["N"] * r["K"]
                bf16 = r.get("bf16") if isinstance(r.get("bf16"), (int, float)) else None
                for col, v in r.items():
                    backend, pairing = BENCH_DOT_OTHER.get(col, (None, None))
                    if backend is None and "_" in col:
                        head, key = col.rsplit("_", 1)
                        for k in BENCH_DOT_PAIRINGS:  # keys hold "_": match the longest suffix
                            if col.endswith("_" + k):
                                head, key = col[: -len(k) - 1], k
                        backend, pairing = (head, BENCH_DOT_PAIRINGS[key]) if key in BENCH_DOT_PAIRINGS else (None, None)
                    if backend is None or backend.startswith("jax_"):
                        continue
                    add("block_scaled_dot", pairing, backend, shape, flops, v, "TFLOP/s", name, device,
                        bf16=bf16 if bf16 else 0)
        elif name == "hopper_mx":
            for r in rows:
                if r.get("case") != "hopper_mx (end to end)" or not all(isinstance(r.get(d), int) for d in "MNK"):
                    continue
                shape = (r["M"], r["N"], r["K"])
                add("block_scaled_dot", f"{r.get('format')} x {r.get('format')}", "hopper_mx", shape,
                    2.0 * math.prod(shape), r.get("tflops"), "TFLOP/s", name, device)
        elif name == "bench_ragged_dot":
            for r in rows:
                if not all(isinstance(r.get(d), int) for d in ("M", "K", "N")):
                    continue
                shape, flops = (r["M"], r["K"], r["N"], r.get("G")), 2.0 * r["M"] * r["K"] * r["N"]
                for col, backend in BENCH_RAGGED_COLUMNS.items():
                    add("ragged_dot", RAGGED_PAIRING, backend, shape, flops, r.get(col), "TFLOP/s", name, device,
                        bf16=r.get("bf16_ragged_dot") or 0)
        elif name in ("quantize", "bench_quantize"):
            shapes = [tuple(r["shape"]) for r in rows if isinstance(r.get("shape"), list)]
            default_shape = tuple(b["shape"]) if isinstance(b.get("shape"), list) else (shapes[0] if shapes else None)
            for r, backend in [(r, "cuda") for r in rows] + [(r, "xla") for r in b.get("xla_rows") or []]:
                shape = tuple(r["shape"]) if isinstance(r.get("shape"), list) else default_shape
                if shape is None or not r.get("format"):
                    continue
                itemsize = {"float32": 4, "bfloat16": 2, "float16": 2}.get(r.get("dtype", "bfloat16"), 2)
                nbytes = float(math.prod(shape) * itemsize)
                for op, col in (("quantize", "time_us"), ("dequantize", "dequantize_time_us")):
                    t = r.get(col)
                    if isinstance(t, (int, float)) and t > 0:
                        add(op, r["format"], r.get("backend", backend), shape, nbytes, nbytes / t / 1e3, "GB/s", name,
                            device, time_us=t)
    return out


_ITEMSIZE = {"float32": 4, "bfloat16": 2, "float16": 2}
# formats.FORMATS's names (common/ imports no capability package; a test checks they agree): the
# long form writes a pairing as "AxB", and names hold "x" themselves (FP8_1x128).
FORMAT_NAMES = ("MXFP8_E4M3", "MXFP8_E5M2", "MXFP4", "NVFP4", "FP8_1x128", "FP8_128x128", "FP8_TENSOR")

# Quantize / dequantize are keyed by layout as well as format: the last axis (row-wise, the key the
# results have always had: the format's name), a non-last axis (column-wise, the transposed layout:
# "<format> axis -2") and the fused pair of quantize_both_axes ("<format> both axes": one read of x
# writing both copies). Their kernels differ (csrc/formats/block_scaled_cuda.cu: contiguous rows,
# strided columns, the fused kernel), and so do the xla path's, so one layout's winner says nothing
# of another's. Every non-last axis runs the same strided kernels (blocks down K of [outer, K,
# inner]); the benchmark times axis -2. A layout never measured takes the xla path (rank).
QUANTIZE_BOTH_OP = "quantize_both_axes"  # the benchmarks' op of the fused pair; auto ranks it as quantize
BOTH_AXES = (-1, -2)  # the axis of a quantize_both_axes problem (the benchmarks write [-1, -2])
SECOND_AXIS_KEY, BOTH_AXES_KEY = "axis -2", "both axes"
# Formats whose blocks do not depend on the axis: FP8_128x128's tiles cover the last two axes,
# FP8_TENSOR has one scale (quantize_both_axes runs one quantization). One key, the name, for every
# layout. A test checks them against formats.FORMATS.
AXIS_FREE_FORMATS = ("FP8_128x128", "FP8_TENSOR")


def quantize_key(fmt: str, axis, ndim: int) -> str:
    """The record's key (its "pairing") of quantize / dequantize of format ``fmt`` along ``axis``
    (an int, or BOTH_AXES for quantize_both_axes) of an ``ndim``-d array: "MXFP8_E4M3" (the last
    axis), "MXFP8_E4M3 axis -2" (any other axis), "MXFP8_E4M3 both axes"; the name alone for
    AXIS_FREE_FORMATS."""
    if fmt in AXIS_FREE_FORMATS:
        return fmt
    if isinstance(axis, (tuple, list)):
        return f"{fmt} {BOTH_AXES_KEY}"
    return fmt if axis in (-1, ndim - 1) else f"{fmt} {SECOND_AXIS_KEY}"


def _key_text(op: str, pairing: str) -> str:
    """A key as explain names it: a quantize / dequantize key with its layout said, "NVFP4 (last
    axis)", "FP8_TENSOR (every axis)"; the others (and "NVFP4 axis -2", "NVFP4 both axes") as they are."""
    if op not in ("quantize", "dequantize") or pairing != key_format(pairing):
        return pairing
    return f"{pairing} ({'every axis' if pairing in AXIS_FREE_FORMATS else 'last axis'})"


def key_format(pairing: str) -> str:
    """The format of a quantize / dequantize key (its verified feature): "NVFP4 axis -2" -> "NVFP4"."""
    return pairing.split(" ", 1)[0]


def _pairing(text: str) -> str | None:
    """"FP8_1x128xFP8_128x128" (or "A x B") -> "FP8_1x128 x FP8_128x128"; None if not two formats."""
    for i, ch in enumerate(text):
        if ch == "x" and text[:i].strip() in FORMAT_NAMES and text[i + 1:].strip() in FORMAT_NAMES:
            return f"{text[:i].strip()} x {text[i + 1:].strip()}"
    return None


def _layout_axis(m: dict):
    """The axis field of a long-form quantize / dequantize row as ``quantize_key`` takes it: an int,
    (-1, -2) for the fused pair (op quantize_both_axes, axis [-1, -2]); None where it names none."""
    if m.get("op") == QUANTIZE_BOTH_OP:
        return BOTH_AXES
    axis = m.get("axis", -1)  # rows written before the benchmark timed axis -2 carry none: the last axis
    return axis if isinstance(axis, int) and not isinstance(axis, bool) else None


def _long_form(rows: list[dict], bench: str, device, add) -> None:
    """The benchmarks' long-form ``measurements`` (each: op, backend, format, shape, time_us, and
    tflops for dots): the ranked ops' rows that timed something. Dots: format "AxB"; ragged_dot:
    the forward (ragged_m) rows, shape [M, K, N, G]; quantize / dequantize: every layout's rows,
    under the layout's key (``quantize_key``: the row's "axis", and op quantize_both_axes for the
    fused pair, recorded as op quantize), as GB/s of the high-precision side (the key auto ranks
    by). A dot's ratio to bf16 comes from the run's bf16 row (backend "xla_bf16" / "bf16") of the
    same shape."""
    bf16 = {tuple(m["shape"]): m.get("tflops") for m in rows
            if m.get("backend") in ("xla_bf16", "bf16") and not m.get("error") and isinstance(m.get("shape"), list)}
    for m in rows:
        op, fmt, shape, t = m.get("op"), m.get("format"), m.get("shape"), m.get("time_us")
        if op == QUANTIZE_BOTH_OP:
            op = "quantize"  # what quantize_both_axes selects a backend of; its key names the layout
        if op not in SPEED_OPS or m.get("error") or not isinstance(shape, list) or not fmt or \
                not isinstance(t, (int, float)) or t <= 0 or not all(isinstance(d, int) for d in shape):
            continue
        if op == "block_scaled_dot" and len(shape) == 3:
            flops = 2.0 * math.prod(shape)
            add(op, _pairing(fmt), m["backend"], shape, flops, m.get("tflops") or flops / t / 1e6, "TFLOP/s",
                bench, device, bf16=bf16.get(tuple(shape)) or 0)
        elif op == "ragged_dot" and m.get("mode", "forward") == "forward" and len(shape) >= 3:
            mm, k, n = shape[:3]
            flops = float(m.get("flops") or 2.0 * mm * k * n)
            add(op, _pairing(fmt), m["backend"], shape, flops, m.get("tflops") or flops / t / 1e6, "TFLOP/s",
                bench, device, bf16=bf16.get(tuple(shape)) or 0)
        elif op in ("quantize", "dequantize") and _layout_axis(m) is not None:
            # x's bytes (read once, by the fused pair too), as speed_key counts them
            nbytes = float(math.prod(shape) * _ITEMSIZE.get(m.get("dtype", "bfloat16"), 2))
            add(op, quantize_key(fmt, _layout_axis(m), len(shape)), m["backend"], shape, nbytes, nbytes / t / 1e3,
                "GB/s", bench, device, time_us=t)


def speeds_from_results(results: dict[str, dict]) -> list[dict]:
    """Every measurement of the committed results; for one (device, op, pairing, backend, shape)
    only the newest commit's (a kernel that changed is measured again; parts of one run, one
    commit, are kept together)."""
    rows = [m for path, result in sorted(results.items()) for m in measurements(result, path)]
    newest: dict[tuple, tuple] = {}
    for m in rows:
        key = (m["device"], m["architecture"], m["op"], m["pairing"], m["backend"], tuple(m["shape"]))
        newest[key] = max(newest.get(key, ("", "")), (m["date"], m["commit"]))
    keep = [m for m in rows if newest[(m["device"], m["architecture"], m["op"], m["pairing"], m["backend"],
                                       tuple(m["shape"]))][1] == m["commit"]]
    return sorted(keep, key=lambda m: (m["architecture"], m["op"], m["pairing"], m["size_class"], m["backend"],
                                       m["results"]))


def speed_key(op: str, problem) -> tuple[str, float, str] | None:
    """(format pairing, work, what the work counts) of a problem of ``op``, as the record keys its
    speeds; None where the op is not ranked. One place for both sides of the key: the benchmark
    columns above and each op's problem (block_scaled_dot: dot.common.DotProblem; ragged_dot:
    ragged_dot.common.RaggedProblem; quantize / dequantize: (format, shape, dtype, axis), axis the
    blocks' (BOTH_AXES for quantize_both_axes; a problem without it is the last axis), keyed by
    ``quantize_key``; the work is x's bytes, read once by the fused pair too, as ``_long_form``
    counts them). Output dtypes are not part of the key: the benchmarks write bfloat16, and a
    float32 result changes only the epilogue."""
    if op == "block_scaled_dot":
        b, m, n, k = problem.bmnk
        return f"{problem.lhs_format.name} x {problem.rhs_format.name}", 2.0 * b * m * n * k, "FLOP"
    if op == "ragged_dot":
        if problem.mode != "ragged_m":
            return None
        return (f"{problem.lhs_format.name} x {problem.rhs_format.name}",
                2.0 * problem.M * problem.K * problem.N, "FLOP")
    if op in ("quantize", "dequantize"):
        fmt, shape, dtype, *axis = problem
        import numpy as np

        return (quantize_key(fmt.name, axis[0] if axis else -1, len(shape)),
                float(math.prod(shape) * np.dtype(dtype).itemsize), "B")
    return None


@dataclasses.dataclass
class Speed:
    """One backend's speed in one size class: the median over shapes of each shape's median."""

    backend: str
    value: float
    unit: str
    shapes: list
    vs_bf16: float | None
    results: list
    time_us: float | None = None

    def text(self) -> str:
        v = f"{self.value:,.0f} {self.unit}" if self.value >= 10 else f"{self.value:,.3g} {self.unit}"
        if self.time_us is not None:
            v = f"{self.time_us:,.0f} us ({v})"
        return v + (f" ({self.vs_bf16:.2f}x bf16)" if self.vs_bf16 else "")


@dataclasses.dataclass
class Ranking:
    """What ``rank`` found: the chosen backend, why each other was passed over, the numbers."""

    chosen: str
    reason: str
    passed_over: dict
    speeds: list = dataclasses.field(default_factory=list)


def _shape_text(shape) -> str:
    shape = [s for s in shape if s is not None]
    if len(shape) == 3 and len(set(shape)) == 1:
        return f"{shape[0]}^3"
    return "x".join(str(s) for s in shape)


def _median(values):
    return statistics.median(values) if values else None


def _aggregate(rows: list[dict]) -> Speed:
    by_shape: dict[tuple, list] = {}
    for r in rows:
        by_shape.setdefault(tuple(r["shape"]), []).append(r)
    per_shape = [_median([r["value"] for r in rs]) for rs in by_shape.values()]
    ratios = [r["value"] / r["bf16"] for r in rows if r.get("bf16")]
    times = [_median([r["time_us"] for r in rs if r.get("time_us")]) for rs in by_shape.values()]
    times = [t for t in times if t]
    return Speed(rows[0]["backend"], _median(per_shape), rows[0]["unit"], sorted(by_shape),
                 _median(ratios), sorted({r["results"] for r in rows}), _median(times))


def measured(op: str, pairing: str, arch: str, device: str | None) -> list[dict]:
    """The record's speeds of (op, pairing) on ``arch``: those of this device where it was
    measured, else those of every device of the architecture."""
    rows = [m for m in record().get("speeds", []) if m["op"] == op and m["pairing"] == pairing
            and m["architecture"] == arch]
    mine = [m for m in rows if device and m["device"] == device]
    return mine or rows


def rank(op: str, problem, names: list[str], ours: set[str]) -> Ranking | None:
    """Which of ``names`` (backends of ``op`` that can run the problem, in preference order;
    ``ours`` the ones running our GPU code) auto takes by the record's speeds: the fastest of
    ours measured at least MARGIN times the xla path's speed in the nearest size class where the
    xla path was measured; the xla path where none is. None: not ranked (the op is not ranked,
    the xla path cannot run it, or no architecture)."""
    arch = architecture()
    key = speed_key(op, problem) if op in SPEED_OPS else None
    if key is None or arch is None or XLA_PATH not in names:
        return None
    pairing, work, unit = key
    shown = _key_text(op, pairing)  # the key looked up, as explain names it (with the layout)
    here = size_class(work)
    rows = measured(op, pairing, arch, device_kind())
    xla_classes = sorted({m["size_class"] for m in rows if m["backend"] == XLA_PATH})
    candidates = [n for n in names if n in ours]
    if not candidates:
        return None  # nothing of ours runs this problem: preference order (xla before the reference)
    passed_over = {n: "lower preference" for n in names if n not in ours and n != XLA_PATH}
    if not xla_classes:
        for n in candidates:
            passed_over[n] = (f"not measured against the xla path for {shown} on {arch} (see {RESULTS_DIR}): an "
                              f"unmeasured backend is not preferred over XLA's own")
        return Ranking(XLA_PATH, f"the xla path: no committed benchmark measured {shown} on {arch}", passed_over)
    # the nearest class with an xla measurement; a tie goes to the smaller class (nearer in work)
    cls = min(xla_classes, key=lambda c: (abs(c - here), c))
    at = [m for m in rows if m["size_class"] == cls]
    speeds = {n: _aggregate([m for m in at if m["backend"] == n]) for n in [XLA_PATH] + candidates
              if any(m["backend"] == n for m in at)}
    xla = speeds[XLA_PATH]
    where = (f"{shown} on {arch}" + (f" {at[0]['device']}" if len({m['device'] for m in at}) == 1 else "")
             + f" at {', '.join(_shape_text(s) for s in xla.shapes)} (size class 2^{cls} {unit}"
             + (f"; this call 2^{here} {unit}, the nearest measured" if cls != here else "") + ")")
    eligible = []
    for n in candidates:
        s = speeds.get(n)
        if s is None:
            passed_over[n] = (f"not measured at size class 2^{cls} {unit} for {shown} on {arch}: an unmeasured "
                              f"backend is not preferred over the xla path ({xla.text()})")
        elif s.value < MARGIN * xla.value:
            relation = "slower than" if s.value < xla.value else f"within {MARGIN:.2f}x of"
            passed_over[n] = f"measured {s.text()}, {relation} the xla path's {xla.text()} for {where}"
        else:
            eligible.append(s)
    chosen = max(eligible, key=lambda s: s.value) if eligible else xla
    for s in eligible:
        if s is not chosen:
            passed_over[s.backend] = f"measured {s.text()}, slower than {chosen.backend}'s {chosen.text()} for {where}"
    if chosen is xla:
        passed_over.pop(XLA_PATH, None)
    else:
        passed_over[XLA_PATH] = f"measured {xla.text()}, slower than {chosen.backend}'s {chosen.text()} for {where}"
    shown = [chosen] + [s for n, s in speeds.items() if s is not chosen]
    sources = sorted({r for s in shown for r in s.results})
    reason = (("measured fastest" if chosen is not xla else "the xla path, measured fastest" if len(speeds) > 1
               else "the xla path (no backend of ours measured here)")
              + f" for {where}: " + "; ".join(f"{s.backend}: {s.text()}" for s in shown)
              + f" ({', '.join(sources)})")
    table = [{"backend": s.backend, "value": s.value, "unit": s.unit, "vs_bf16": s.vs_bf16, "time_us": s.time_us,
              "shapes": [list(x) for x in s.shapes], "size_class": cls, "results": s.results,
              "chosen": s is chosen} for s in shown]
    return Ranking(chosen.backend, reason, passed_over, table)


# --------------------------------------------------------------------------- visible state
def report() -> dict:
    """The ``"verified"`` entry of ``capabilities()``: per backend, the architectures where it is
    verified (and whether at this build's source, and for which features), and how it answers on
    this machine."""
    arch, fps = architecture(), build_fingerprints()
    shown = source_fingerprints()
    out = {}
    for component, (op, backend) in COMPONENTS.items():
        archs = {e["architecture"]: {"fingerprint": e["fingerprint"], "results": e["results"],
                                      "at_this_source": e["fingerprint"] == shown.get(component),
                                      "verified": e["verified"],
                                      "features": {f: t["verified"] for f, t in e["features"].items()}}
                 for e in entries(component)}
        here = check(component)
        feats = {}
        for e in entries(component):
            if e["architecture"] == arch and e["fingerprint"] == fps.get(component):
                feats = {f: check(component, f).reason for f in e["features"]}
        out[component] = {"op": op, "backend": backend, "source_fingerprint": shown.get(component),
                          "architectures": archs, "here": {"verified": here.supported, "reason": here.reason,
                                                           "features": feats}}
    return {"architecture": arch, "allow_unverified": allow_unverified(), "cuda_build": bool(fps),
            "fingerprint_scheme": {"build": build_scheme(), "record": FINGERPRINT_SCHEME}, "backends": out}


def _feature_list(e: dict, verdict: bool) -> str:
    return ", ".join(f for f, t in e["features"].items() if t["verified"] == verdict and (t["passed"] or t["failed"]))


def markdown(rec: dict | None = None) -> str:
    """The "What is verified" table (docs/gates.md), from the record alone."""
    rec = record() if rec is None else rec
    lines = ["| op | GPU backend | on | at source | verified features | failed features | results |",
             "|---|---|---|---|---|---|---|"]
    for component, (op, backend) in COMPONENTS.items():
        es = [e for e in rec["entries"] if e["component"] == component]
        if not es:
            lines.append(f"| {op} | `{component}` | not run on any GPU | - | - | - | - |")
        for e in es:
            ok = _feature_list(e, True) or "-"
            bad = _feature_list(e, False)
            if e["component_wide"]["failed"]:
                bad = ", ".join(x for x in ("component-wide tests" + (" (cut short)" if e["cut_short"] else ""), bad)
                                if x)
            lines.append(f"| {op} | `{component}` | {e['architecture']} | `{e['fingerprint']}` | {ok} | {bad or '-'} "
                         f"| [{pathlib.PurePath(e['results']).name}](../{e['results']}) |")
    return "\n".join(lines)


def _usable(e: dict) -> bool:
    """Does auto take anything of this entry? Per feature where its tests name features."""
    if e["features"]:
        return not e["component_wide"]["failed"] and not e.get("cut_short") and \
            any(t["verified"] for t in e["features"].values())
    return e["verified"]


def _default_rows(rec: dict, arch: str) -> list[dict]:
    """Per (op, pairing, size class) measured on ``arch``: the backend auto runs with a build of
    the passing run's sources (verified features, MARGIN over the xla path), and the numbers."""
    speeds = [m for m in rec.get("speeds", []) if m["architecture"] == arch]
    rows = []
    for op, pairing, cls in sorted({(m["op"], m["pairing"], m["size_class"]) for m in speeds}):
        at = [m for m in speeds if (m["op"], m["pairing"], m["size_class"]) == (op, pairing, cls)]
        by = {b: _aggregate([m for m in at if m["backend"] == b]) for b in sorted({m["backend"] for m in at})}
        xla, best = by.get(XLA_PATH), XLA_PATH
        for b, s in by.items():
            verified_here = any(e["component"] in BACKENDS.get((op, b), ()) and e["architecture"] == arch
                                and _feature_ok(e, op, b, pairing) for e in rec["entries"])
            if b != XLA_PATH and verified_here and xla is not None and s.value >= MARGIN * xla.value \
                    and (best == XLA_PATH or s.value > by[best].value):
                best = b
        rows.append({"op": op, "pairing": pairing, "class": cls, "unit": at[0]["unit"], "by": by, "best": best,
                     "xla": xla, "shapes": next(iter(by.values())).shapes})
    return rows


def _range(values: list[str]) -> str:
    return values[0] if len(set(values)) == 1 else f"{values[0]} - {values[-1]}"


def defaults_markdown(rec: dict | None = None, compact: bool = False) -> str:
    """What auto runs by default on each architecture the record holds, and how fast (docs/gates.md;
    ``compact``: consecutive size classes with the same choice in one row, for the README), from the
    record alone."""
    rec = record() if rec is None else rec
    arches = sorted({m["architecture"] for m in rec.get("speeds", [])})
    if not arches:
        return "No committed GPU run measured any speed: `auto` runs XLA's own paths on every GPU."
    lines = []
    for arch in arches:
        devices = sorted({m["device"] for m in rec["speeds"] if m["architecture"] == arch})
        lines += [f"**{arch}** (measured on {', '.join(devices)}): the backend `auto` runs with a build of the "
                  "sources that passed, and the measured speeds (median over shapes and runs; size class: "
                  "log2 of the FLOPs of a dot, of the bytes of the high-precision side of quantize / "
                  "dequantize).", ""]
        rows = _default_rows(rec, arch)
        if compact:
            lines += ["| op | formats | size classes | auto runs | its speed | xla path |", "|---|---|---|---|---|---|"]
            groups: list[list[dict]] = []
            for r in rows:
                if groups and (groups[-1][-1]["op"], groups[-1][-1]["pairing"], groups[-1][-1]["best"]) == \
                        (r["op"], r["pairing"], r["best"]):
                    groups[-1].append(r)
                else:
                    groups.append([r])
            for g in groups:
                best = g[0]["best"]
                mine = [r["by"][best].text() for r in g if best in r["by"]]
                xla = [r["xla"].text() for r in g if r["xla"]]
                classes = _range([f"2^{r['class']}" for r in g])
                why = "" if any(r["xla"] for r in g) else " (xla path not measured)"
                lines.append(f"| {g[0]['op']} | {g[0]['pairing']} | {classes} | `{best}`{why} | "
                             f"{_range(mine) if mine else '-'} | {_range(xla) if xla else '-'} |")
        else:
            lines += ["| op | formats | size (class) | auto runs | its speed | xla path | also measured |",
                      "|---|---|---|---|---|---|---|"]
            for r in rows:
                others = "; ".join(f"{b} {s.text()}" for b, s in r["by"].items() if b not in (r["best"], XLA_PATH))
                mine = r["by"][r["best"]].text() if r["best"] in r["by"] else "-"
                why = "" if r["xla"] else " (xla path not measured)"
                lines.append(f"| {r['op']} | {r['pairing']} | {', '.join(_shape_text(s) for s in r['shapes'])} "
                             f"(2^{r['class']}) | `{r['best']}`{why} | {mine} | {r['xla'].text() if r['xla'] else '-'} "
                             f"| {others or '-'} |")
        lines.append("")
    return "\n".join(lines).rstrip()


# The feature of a benchmark's format pairing, per backend (what Backend.feature returns for the
# benchmarked problems): used only by the generated defaults table, which has no problem objects.
_BENCH_FEATURES = {
    ("block_scaled_dot", "cublaslt", "FP8_1x128 x FP8_128x128"): "fp8_blockwise",
    ("block_scaled_dot", "cublaslt", "FP8_TENSOR x FP8_TENSOR"): "per_tensor",
    ("block_scaled_dot", "cublaslt", "MXFP8_E4M3 x MXFP8_E4M3"): "mxfp8",
    ("block_scaled_dot", "cublaslt", "NVFP4 x NVFP4"): "nvfp4",
    ("block_scaled_dot", "cudnn", "MXFP8_E4M3 x MXFP8_E4M3"): "mxfp8",
    ("block_scaled_dot", "cudnn", "NVFP4 x NVFP4"): "nvfp4",
    ("block_scaled_dot", "hopper_mx", "MXFP8_E4M3 x MXFP8_E4M3"): "mxfp8",
    ("block_scaled_dot", "hopper_mx", "NVFP4 x NVFP4"): "nvfp4",
    ("ragged_dot", "hopper", RAGGED_PAIRING): "fp8_blockwise",
    ("ragged_dot", "cublaslt", RAGGED_PAIRING): "fp8_blockwise",
}


def _feature_ok(e: dict, op: str, backend: str, pairing: str) -> bool:
    feature = key_format(pairing) if op in ("quantize", "dequantize") else _BENCH_FEATURES.get((op, backend, pairing))
    if feature is None or e["component_wide"]["failed"] or e.get("cut_short"):
        return False
    t = e["features"].get(feature)
    return bool(t and t["verified"])


def summary(rec: dict | None = None, tree_fingerprints: dict | None = None) -> str:
    """One paragraph for the README's status section. With ``tree_fingerprints`` (the checkout's,
    scripts/update_verified.py), what a build of this checkout runs is told apart from what passed
    only at an earlier source (it needs a new GPU run before `auto` takes it again)."""
    rec = record() if rec is None else rec
    usable = [e for e in rec["entries"] if _usable(e)]
    if tree_fingerprints is not None:
        here = [e for e in usable if tree_fingerprints.get(e["component"]) == e["fingerprint"]]
        here_names = {(e["component"], e["architecture"]) for e in here}
        earlier = sorted({f"`{e['component']}` ({e['architecture']})" for e in usable
                          if (e["component"], e["architecture"]) not in here_names})
        done = sorted({f"`{e['component']}` ({e['architecture']}: {_feature_list(e, True) or 'all'})" for e in here})
        if done or earlier:
            head = ("**Verified on a GPU at this checkout's sources** (per feature; `auto` on that GPU takes only these "
                    "of our kernels): " + (", ".join(done) or "none") + ". "
                    + ("Verified at an earlier source only (their compiled sources changed since; the next GPU run "
                       "verifies them again): " + ", ".join(earlier) + ". " if earlier else ""))
            return (head + "Among the verified backends `auto` runs the one the committed benchmarks measured fastest "
                    "for the op, formats and size, and XLA's own path where it measured faster or nothing of ours was "
                    "measured (`jax_gpuext.explain` prints the numbers; docs/gates.md has every measured size).\n\n"
                    + defaults_markdown(rec, compact=True))
    done = sorted({f"`{e['component']}` ({e['architecture']}: {_feature_list(e, True) or 'all'})" for e in usable})
    if not done:
        return ("**Verified on a GPU: nothing yet.** No committed GPU run has passed any GPU backend's tests, so on "
                "a GPU `backend=\"auto\"` runs XLA's own paths (bf16 dequantize + XLA dot, the jnp quantize, "
                "XLA's collectives) and `jax_gpuext.explain` says why each of our kernels was passed over. "
                "Name a backend to run it anyway, or set `JAX_GPUEXT_ALLOW_UNVERIFIED=1`.")
    return ("**Verified on a GPU** (per feature, at the source fingerprint of the passing run; a later change to a "
            "backend's compiled sources turns it off until a GPU run passes again): " + ", ".join(done) + ". "
            "Among the verified backends `auto` runs the one the committed benchmarks measured fastest for the "
            "op, formats and size, and XLA's own path where it measured faster or nothing of ours was measured "
            "(`jax_gpuext.explain` prints the numbers; docs/gates.md has every measured size).\n\n"
            + defaults_markdown(rec, compact=True))
