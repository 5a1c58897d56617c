"""The verification record: which GPU backends have passed their GPU tests, where, at which source.

A GPU backend (our CUDA code: formats ``cuda``, the dot's ``cublaslt`` / ``cudnn`` / ``hopper_mx``,
the NVSHMEM all-reduce, the ``place`` custom call) is *verified* on an architecture at a source
fingerprint when a committed GPU run (``benchmarks/results/*.json``, written by
``scripts/gpu_run.sh``) shows its tests passing there, on a build whose fingerprint of that
backend's sources (``cmake/verified_sources.txt``, hashed by CMake into ``build_info()``) matches.
``verified.json`` next to this file is generated from those results by
``scripts/update_verified.py``, never written by hand; a CI test regenerates it and checks every
entry against its results file.

On a CUDA device, ``backend="auto"`` passes over a GPU backend that is not verified for the
device's architecture at this build's fingerprint (``backends.select``); ``explain`` shows why.
Naming the backend runs it anyway (one warning per process); ``JAX_GPUEXT_ALLOW_UNVERIFIED=1``
lets ``auto`` take it (the GPU test run sets it, so the tests still exercise every backend).
"""

from __future__ import annotations

import functools
import json
import pathlib

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
    ("block_scaled_dot", "cublaslt"): ("block_scaled_dot.cublaslt",),
    ("block_scaled_dot", "cudnn"): ("block_scaled_dot.cudnn",),
    ("block_scaled_dot", "hopper_mx"): ("block_scaled_dot.hopper_mx",),
    ("ragged_dot", "cublaslt"): ("ragged_dot.cublaslt",),
    ("ragged_dot", "hopper"): ("ragged_dot.hopper",),
    ("all_reduce", "one_shot"): ("all_reduce.one_shot",),
    ("all_reduce", "two_shot"): ("all_reduce.two_shot",),
    ("all_reduce", "nvshmem_library"): ("all_reduce.nvshmem_library",),
    # identity is the same gpuext_place handler without the memory-space annotation
    ("place", "custom_call"): ("place.custom_call",),
    ("place", "identity"): ("place.custom_call",),
}
GRAPH_SAFE_ENV = "JAX_GPUEXT_ALLREDUCE_GRAPH_SAFE"  # collectives.GRAPH_SAFE_ENV: the graph-safe target
EMPTY_RECORD = {"generated_by": "scripts/update_verified.py from benchmarks/results/*.json (do not edit)",
                "entries": []}


def allow_unverified() -> bool:
    return env.get(ALLOW_ENV)


@functools.cache
def record() -> dict:
    """The installed record (an empty record where the file is missing: nothing is verified)."""
    if not RECORD_PATH.exists():
        return dict(EMPTY_RECORD)
    return json.loads(RECORD_PATH.read_text())


def build_fingerprints() -> dict[str, str]:
    """The source fingerprints of the GPU code this installation runs: the CUDA extension's
    (every fingerprint is computed in the one CMake configure that builds all modules)."""
    info = _ext.build_info("cuda")
    return dict(info.get("source_fingerprints", {})) if info else {}


def source_fingerprints() -> dict[str, str]:
    """The fingerprints any installed module carries (the CPU extension's where there is no
    CUDA build): what ``info`` shows to compare with the record."""
    for kind in ("cuda", "cpu"):
        info = _ext.build_info(kind)
        if info and info.get("source_fingerprints"):
            return dict(info["source_fingerprints"])
    return {}


def architecture() -> str | None:
    """"sm_90" for the first CUDA device, None without one."""
    cc = gates.compute_capability()
    return None if cc is None else f"sm_{cc[0]}{cc[1]}"


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


def check(component: str) -> GateResult:
    """Is ``component`` verified on this device's architecture at this build's fingerprint?"""
    if component not in COMPONENTS:
        raise KeyError(f"unknown component {component!r}; known: {sorted(COMPONENTS)}")
    arch = architecture()
    if arch is None:
        return GateResult(False, "no CUDA device")
    fp = build_fingerprints().get(component)
    here = [e for e in entries(component) if e["architecture"] == arch]
    match = [e for e in here if e["fingerprint"] == fp]
    if fp is not None and match:
        return GateResult(True, f"verified on {arch} at this source ({match[0]['results']})")
    why = f"not verified on {arch} at this source (see {RESULTS_DIR})"
    if fp is None:
        return GateResult(False, f"{why}: this build carries no fingerprint for {component}")
    if here:
        return GateResult(False, f"{why}: passed at source {', '.join(sorted({e['fingerprint'] for e in here}))}, "
                                 f"this build is {fp}")
    return GateResult(False, why)


def check_all(components) -> GateResult:
    for c in components:
        r = check(c)
        if not r.supported:
            return r
    return GateResult(True, "; ".join(check(c).reason for c in components))


# --------------------------------------------------------------------------- building the record
def evidence(result: dict, component: str) -> dict:
    """What one GPU results file says about ``component``: its tests' outcomes (cases carrying
    its ``verifies`` property), the architecture, the fingerprint of the build that ran, and
    whether a test group that could hold its tests was cut short (a hang: the test that hung
    never reaches the junit file)."""
    tests = result.get("gpu_tests", {})
    cases = [c for c in tests.get("cases", []) if component in c.get("verifies", [])]
    cut = [g for g in tests.get("cut_short", [])
           if g.get("verifies_collected") is None or component in g["verifies_collected"]]
    cc = str(result.get("device", {}).get("compute_cap", ""))
    ext = (result.get("versions", {}).get("cuda_extension") or {})
    fps = ext.get("source_fingerprints") or {}
    if isinstance(fps, str):
        fps = _ext.parse_fingerprints(fps)
    return {
        "architecture": "sm_" + cc.replace(".", "") if cc else None,
        "fingerprint": fps.get(component),
        "passed": [c["test"] for c in cases if c["outcome"] == "passed"],
        "failed": [c["test"] for c in cases if c["outcome"] in ("failure", "error")],
        "skipped": [c["test"] for c in cases if c["outcome"] == "skipped"],
        "cut_short": [g["group"] for g in cut],
    }


def passes(ev: dict) -> bool:
    """A run verifies a component when at least one of its tests passed, none failed, no group
    that could hold its tests was cut short, and the build carried its fingerprint."""
    return bool(ev["passed"]) and not ev["failed"] and not ev["cut_short"] and bool(ev["fingerprint"]) \
        and bool(ev["architecture"])


def build_record(results: dict[str, dict]) -> dict:
    """The record from ``{results path: results json}``. Per (component, architecture,
    fingerprint) the newest run that exercised the component decides: a later failure at the same
    source revokes an earlier pass."""
    latest: dict[tuple, tuple] = {}
    for path, result in sorted(results.items()):
        for component in COMPONENTS:
            ev = evidence(result, component)
            if not (ev["passed"] or ev["failed"] or ev["cut_short"]) or not ev["fingerprint"]:
                continue  # this run did not exercise it on a build that can be named
            key = (component, ev["architecture"], ev["fingerprint"])
            stamp = (result.get("date", ""), path)
            if key not in latest or stamp > latest[key][0]:
                latest[key] = (stamp, path, result, ev)
    out = []
    for (component, arch, fp), (_, path, result, ev) in sorted(latest.items()):
        if passes(ev):
            out.append({"component": component, "architecture": arch, "fingerprint": fp, "results": path,
                        "commit": result.get("commit", "unknown"), "date": result.get("date", ""),
                        "tests_passed": len(ev["passed"]), "tests_skipped": len(ev["skipped"])})
    return {**EMPTY_RECORD, "entries": out}


# --------------------------------------------------------------------------- visible state
def report() -> dict:
    """The ``"verified"`` entry of ``capabilities()``: per backend, the architectures where it is
    verified (and whether at this build's source), and how it answers on this machine."""
    arch, fps = architecture(), build_fingerprints()
    shown = source_fingerprints()
    out = {}
    for component, (op, backend) in COMPONENTS.items():
        archs = {e["architecture"]: {"fingerprint": e["fingerprint"], "results": e["results"],
                                      "at_this_source": e["fingerprint"] == shown.get(component)}
                 for e in entries(component)}
        here = check(component)
        out[component] = {"op": op, "backend": backend, "source_fingerprint": shown.get(component),
                          "architectures": archs, "here": {"verified": here.supported, "reason": here.reason}}
    return {"architecture": arch, "allow_unverified": allow_unverified(), "cuda_build": bool(fps),
            "backends": out}


def markdown(rec: dict | None = None) -> str:
    """The "What is verified" table (docs/gates.md, README), from the record alone."""
    rec = record() if rec is None else rec
    lines = ["| op | GPU backend | verified on | at source | results |", "|---|---|---|---|---|"]
    for component, (op, backend) in COMPONENTS.items():
        es = [e for e in rec["entries"] if e["component"] == component]
        if not es:
            lines.append(f"| {op} | `{component}` | not verified on any GPU | - | - |")
        for e in es:
            lines.append(f"| {op} | `{component}` | {e['architecture']} | `{e['fingerprint']}` | "
                         f"[{pathlib.PurePath(e['results']).name}](../{e['results']}) |")
    return "\n".join(lines)


def summary(rec: dict | None = None) -> str:
    """One paragraph for the README's status section."""
    rec = record() if rec is None else rec
    done = sorted({f"`{e['component']}` ({e['architecture']})" for e in rec["entries"]})
    if not done:
        return ("**Verified on a GPU: nothing yet.** No committed GPU run has passed any GPU backend's tests, so on "
                "a GPU `backend=\"auto\"` runs XLA's own paths (bf16 dequantize + XLA dot, the jnp quantize, "
                "XLA's collectives) and `jax_gpuext.explain` says why each of our kernels was passed over. "
                "Name a backend to run it anyway, or set `JAX_GPUEXT_ALLOW_UNVERIFIED=1`.")
    return ("**Verified on a GPU** (at the source fingerprint of the passing run; a later change to a "
            "backend's sources turns it off until a GPU run passes again): " + ", ".join(done) + ". "
            "Everything else runs XLA's own path under `auto` on a GPU.")
