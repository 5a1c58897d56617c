"""``capabilities()``: what this installation can do, as one structured report."""

from __future__ import annotations

import platform as _platform
from typing import Callable

from jax_gpuext.common import extension as _ext
from jax_gpuext.common import gates, nvshmem_version, verified
from jax_gpuext.common import libs as _libs


def _devices() -> list[dict]:
    import jax

    out = []
    for d in jax.devices():
        entry = {"id": d.id, "platform": d.platform, "kind": d.device_kind}
        cc = getattr(d, "compute_capability", None)
        if cc is not None:
            entry["compute_capability"] = str(cc)
        try:
            stats = d.memory_stats() or {}
            if "bytes_limit" in stats:
                entry["memory_bytes"] = int(stats["bytes_limit"])
        except Exception:  # noqa: BLE001 - CPU devices have no memory stats
            pass
        out.append(entry)
    return out


def _library(key: str) -> dict:
    v, where = _libs.version(key)
    return {"name": _libs.LIBRARIES[key].name, "version": None if v is None else ".".join(map(str, v)),
            "where" if v is not None else "error": where}


# Report sections a capability package adds (formats: "fp4_layout", the measured float4 layout).
# common/ imports no capability package, so each registers its section when it is imported; the
# package root imports every capability before any submodule can be used (docs/design.md,
# "Where things are").
_SECTIONS: dict[str, Callable[[], dict]] = {}


def register_section(key: str, build: Callable[[], dict]) -> None:
    """Adds ``build()`` to the report as ``report[key]``, after the libraries."""
    _SECTIONS[key] = build


def capabilities() -> dict:
    """Versions, the extensions' builds, devices, libraries and every gate with its reason."""
    import jax
    import jaxlib

    dv = gates.driver_version()
    minor = gates.jaxlib_ffi_api_minor()
    return {
        "python": _platform.python_version(),
        "jax": jax.__version__,
        "jaxlib": jaxlib.__version__,
        "jaxlib_ffi_api": None if minor is None else f"0.{minor}",
        "extensions": {kind: (_ext.build_info(kind) or {"error": _ext.load(kind)[1]}) for kind in ("cpu", "cuda")},
        "build_parts": _ext.build_parts(),
        "build_source": _ext.build_source(),
        "devices": _devices(),
        "cuda_driver": None if dv is None else f"{dv // 1000}.{dv % 1000 // 10}",
        "libraries": {key: _library(key) for key in _libs.LIBRARIES},
        # NVSHMEM built against vs found, and whether _nvshmem may load (issue 25)
        "nvshmem": nvshmem_version.report(_ext.nvshmem_built_against(), _ext.missing_part_reason("nvshmem_allreduce")),
        **{key: build() for key, build in _SECTIONS.items()},
        "gates": {
            name: {"supported": r.supported, "reason": r.reason, "requires": g.requires, "why": g.why,
                   "category": g.category}
            for name, g in gates.GATES.items()
            for r in [g.check()]
        },
        # Issue 16: per GPU backend, where it has passed its GPU tests and whether it runs here.
        "verified": verified.report(),
    }


def format_table(report: dict) -> str:
    """The report as aligned text tables, for ``python -m jax_gpuext info``."""
    rows = [("python", report["python"]), ("jax", report["jax"]), ("jaxlib", report["jaxlib"]),
            ("jaxlib FFI API", report["jaxlib_ffi_api"] or "?"), ("CUDA driver", report["cuda_driver"] or "none")]
    for kind, info in report["extensions"].items():
        if "error" in info:
            rows.append((f"extension _{kind}", f"unavailable: {info['error']}"))
        else:
            desc = f"FFI API {info['ffi_api_major']}.{info['ffi_api_minor']}"
            if kind == "cuda":
                desc += f", CUDA {info['cuda_version']}, archs {info['architectures']}"
            if "cpu_kernels" in info:
                desc += f", CPU kernels {info['cpu_kernels']}"
            rows.append((f"extension _{kind}", desc))
    src = report.get("build_source")
    if src:
        rows.append(("build source", f"commit {src['commit']}" + (" with uncommitted changes" if src["dirty"] else "")))
    for part, rec in report.get("build_parts", {}).items():
        rows.append((f"part {part}", "built: " + rec["detail"] if rec["built"] else
                     f"NOT BUILT: {rec['why']}; to get it: {rec['fix']}"))
    for d in report["devices"]:
        desc = d["kind"]
        if "compute_capability" in d:
            desc += f", compute capability {d['compute_capability']}"
        if "memory_bytes" in d:
            desc += f", {d['memory_bytes'] / 2**30:.1f} GiB"
        rows.append((f"device {d['platform']}:{d['id']}", desc))
    for key, lib in report["libraries"].items():
        rows.append((lib["name"], lib["version"] + f" ({lib['where']})" if lib["version"] else
                     "not available: " + lib["error"]))
    nv = report.get("nvshmem")
    if nv and nv["built_against"]:
        rows.append(("NVSHMEM build/host", f"built against {nv['built_against']}, host {nv['host'] or 'none'}: "
                     + ("compatible" if nv["compatible"] else "REFUSED") + f" ({nv['reason']})"))
    for platform, f in report.get("fp4_layout", {}).items():
        rows.append((f"float4 layout {platform}", f"{f['layout']} ({f['how']})"))
    width = max(len(k) for k, _ in rows)
    out = ["jax-gpuext capabilities", ""] + [f"{k:<{width}}  {v}" for k, v in rows]
    out += ["", "gates"]
    gw = max(len(n) for n in report["gates"])
    for name, g in report["gates"].items():
        out.append(f"  {name:<{gw}}  {'yes' if g['supported'] else 'no ':<3}  {g['reason']}")
    v = report["verified"]
    allowed = "; JAX_GPUEXT_ALLOW_UNVERIFIED=1 is set" if v["allow_unverified"] else ""
    out += ["", f"verified GPU backends (auto runs only these on a GPU, per feature, the fastest measured{allowed})"]
    vw = max(len(n) for n in v["backends"])
    for name, b in v["backends"].items():
        where = ", ".join(a + ("" if e["at_this_source"] else " (older source)")
                          + (f" [{', '.join(f for f, ok in e['features'].items() if ok)}]"
                             if any(e.get("features", {}).values()) else "")
                          for a, e in b["architectures"].items())
        here = "yes" if b["here"]["verified"] else "no "
        out.append(f"  {name:<{vw}}  {here}  {b['here']['reason']}; tested on: {where or 'none'}")
        for feature, reason in b["here"].get("features", {}).items():  # per feature, on this GPU at this source
            out.append(f"  {'':<{vw}}       {feature}: {reason}")
    return "\n".join(out)


def gates_markdown() -> str:
    """The gates table for docs/gates.md (static parts only: what each gate requires and why)."""
    lines = ["| gate | category | requires | why |", "|---|---|---|---|"]
    for g in gates.GATES.values():
        lines.append(f"| `{g.name}` | {g.category} | {g.requires} | {g.why} |")
    return "\n".join(lines)


def backends_markdown() -> str:
    """"Which backend will I get": every op's backends in ``auto``'s preference order, with the
    gates each needs (what they require, from the gates table) and what problems it takes."""
    # Every op's backends are registered: the package root imports each capability package, and
    # it runs before any submodule of it (this one included) can be imported.
    from jax_gpuext.common import backends

    out = []
    for op in backends.ops():
        out += [f"### `{op}`", "", "| order | backend | platforms | gates (requires) | auto on CUDA needs verified | "
                "takes | what it is |", "|---|---|---|---|---|---|---|"]
        for i, b in enumerate(backends.backends(op), 1):
            needs = "; ".join(f"`{g}` ({gates.GATES[g].requires})" for g in b.gates) or "-"
            checked = ", ".join(f"`{c}`" for c in verified.BACKENDS.get((op, b.name), ())) or "-"
            out.append(f"| {i} | `{b.name}` | {', '.join(b.platforms)} | {needs} | {checked} | {b.takes} | "
                       f"{b.description} |")
        out.append("")
    return "\n".join(out).rstrip()
