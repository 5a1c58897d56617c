"""Collects one GPU run (scripts/gpu_run.sh) into benchmarks/results/<date>-<device>.{json,md}.

Every benchmark writes ``{"benchmark": name, "rows": [{column: value, ...}], "notes": [...]}``;
this file adds provenance (device, driver, versions, commit) and the GPU test outcome, and renders
every number as a markdown table.
"""

from __future__ import annotations

import argparse
import datetime
import glob
import json
import os
import re
import shutil
import subprocess
import xml.etree.ElementTree as ET


def _nvidia_smi() -> dict:
    fields = "name,driver_version,memory.total,compute_cap,clocks.max.sm,power.limit"
    try:
        out = subprocess.run(["nvidia-smi", f"--query-gpu={fields}", "--format=csv,noheader"],
                             capture_output=True, text=True).stdout.strip().splitlines()
    except FileNotFoundError:  # no driver tools (the CPU test of this script)
        return {}
    if not out:
        return {}
    return dict(zip(fields.split(","), [v.strip() for v in out[0].split(",")]))


def _tests(work: str) -> dict:
    """Every gpu-tests*.xml (one per pytest group of gpu_run.sh), merged."""
    paths = sorted(glob.glob(os.path.join(work, "gpu-tests*.xml")))
    if not paths:
        return {"ran": False}
    counts = {k: 0 for k in ("tests", "failures", "errors", "skipped")}
    cases = []
    for path in paths:
        root = ET.parse(path).getroot()
        suite = root if root.tag == "testsuite" else root.find("testsuite")
        for k in counts:
            counts[k] += int(suite.get(k, 0))
        for case in suite.iter("testcase"):
            outcome = "passed"
            for tag in ("failure", "error", "skipped"):
                if case.find(tag) is not None:
                    outcome = tag
            cases.append({"test": f"{case.get('classname')}::{case.get('name')}", "outcome": outcome,
                          "seconds": float(case.get("time", 0))})
    return {"ran": True, **counts, "cases": cases, "groups": [os.path.basename(p) for p in paths]}


def _lines(path: str) -> list[str]:
    return [ln.strip() for ln in open(path) if ln.strip()] if os.path.exists(path) else []


def _table(rows: list[dict]) -> str:
    cols = []
    for r in rows:
        cols += [k for k in r if k not in cols]
    fmt = lambda v: f"{v:.4g}" if isinstance(v, float) else str(v)  # noqa: E731
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    lines += ["| " + " | ".join(fmt(r.get(c, "")) for c in cols) + " |" for r in rows]
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--work", required=True)
    ap.add_argument("--out-dir", required=True)
    ap.add_argument("--tests-status", type=int, default=None)
    args = ap.parse_args()

    info = json.load(open(os.path.join(args.work, "info.json")))
    smi = _nvidia_smi()
    benches = []
    for path in sorted(glob.glob(os.path.join(args.work, "bench_*.json")) +
                       glob.glob(os.path.join(args.work, "probe_*.json"))):
        try:
            benches.append(json.load(open(path)))
        except json.JSONDecodeError as e:
            benches.append({"benchmark": os.path.basename(path), "error": str(e), "rows": []})
    sanitizer = open(os.path.join(args.work, "sanitizer.txt")).read() if os.path.exists(
        os.path.join(args.work, "sanitizer.txt")) else None
    device = re.sub(r"[^A-Za-z0-9]+", "-", smi.get("name", "unknown-gpu")).strip("-").lower()
    stamp = datetime.datetime.now(datetime.timezone.utc)
    result = {
        "date": stamp.isoformat(timespec="seconds"),
        "commit": os.environ.get("GPU_RUN_COMMIT", "unknown"),
        "device": smi,
        "versions": {k: info.get(k) for k in ("python", "jax", "jaxlib", "jaxlib_ffi_api", "cuda_driver")}
        | {"cuda_extension": info["extensions"].get("cuda"),
           "libraries": {k: v.get("version") for k, v in info["libraries"].items()}},
        "gates": {k: [v["supported"], v["reason"]] for k, v in info["gates"].items()},
        "gpu_tests": _tests(args.work) | {"exit_status": args.tests_status},
        "sanitizer": sanitizer,
        "not_run": _lines(os.path.join(args.work, "skipped.txt")),
        "benchmarks": benches,
    }
    base = os.path.join(args.out_dir, f"{stamp:%Y-%m-%d}-{device}")
    plots = []
    for png in sorted(glob.glob(os.path.join(args.work, "*.png"))):  # e.g. bench_dot's LLM-shape chart
        dest = f"{base}-{os.path.basename(png)}"
        shutil.copyfile(png, dest)
        plots.append(os.path.basename(dest))
    result["plots"] = plots
    with open(base + ".json", "w") as f:
        json.dump(result, f, indent=2)

    md = [f"# GPU run {result['date']} on {smi.get('name', '?')}", "",
          f"- commit: `{result['commit']}`",
          f"- driver: {smi.get('driver_version', '?')}, compute capability {smi.get('compute_cap', '?')}, "
          f"memory {smi.get('memory.total', '?')}",
          "- versions: " + ", ".join(f"{k} {v}" for k, v in result["versions"].items() if k != "libraries"
                                     and not isinstance(v, dict)),
          "- libraries: " + ", ".join(f"{k} {v}" for k, v in result["versions"]["libraries"].items()),
          ""]
    t = result["gpu_tests"]
    if t.get("ran"):
        md += ["## GPU tests", "",
               f"{t['tests']} tests, {t['failures']} failures, {t['errors']} errors, {t['skipped']} skipped "
               f"(exit status {t['exit_status']})", "", _table([{k: c[k] for k in ("test", "outcome", "seconds")}
                                                               for c in t["cases"]]), ""]
    if sanitizer:
        md += ["## compute-sanitizer", "", "```", sanitizer.strip(), "```", ""]
    if result["not_run"]:
        md += ["## Not run (time budget)", ""] + [f"- {s}" for s in result["not_run"]] + [""]
    for b in benches:
        md += [f"## {b.get('benchmark')}", ""]
        if b.get("error"):
            md += [f"error: {b['error']}", ""]
        if b.get("rows"):
            md += [_table(b["rows"]), ""]
        md += [f"- {n}" for n in b.get("notes", [])] + [""]
    md += [f"![{p}]({p})" for p in plots]
    with open(base + ".md", "w") as f:
        f.write("\n".join(md))
    print(f"wrote {base}.json and {base}.md")


if __name__ == "__main__":
    main()
