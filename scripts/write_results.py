"""Collects one GPU run (scripts/gpu_run.sh) into benchmarks/results/<date>-<device>.{json,md}.

Every benchmark writes ``{"benchmark": name, "rows": [{column: value, ...}], "notes": [...]}``;
this file adds provenance (device, driver, versions, commit) and the GPU test outcome, and renders
every number as a markdown table.

The run's logs stay on the GPU machine, so whatever explains a failure is copied in here: each
failed test's pytest error lines, each skip's reason, a failed benchmark's exit status and log
tail, and compute-sanitizer's report lines.
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


# scripts/run_allreduce_mps.sh (and so bench_allreduce) exits with this status, after a line
# "ENVIRONMENT: <why>", when the machine cannot run it (no MPS, NVSHMEM without full MPG); a test
# reports it with pytest.fail("ENVIRONMENT: ..."). Both are listed apart from code failures.
ENV_EXIT = 3
ENV_MARK = "ENVIRONMENT:"
MAX_DETAIL_CHARS = 2000  # per failed test: enough for the assertion and where it fired
LOG_TAIL_LINES = 25


def _case_detail(case: ET.Element, tag: str) -> str:
    """Why a test failed or was skipped: the junit message, pytest's `E ` lines and the line
    that names the file and line where it fired."""
    el = case.find(tag)
    message = (el.get("message") or "").strip()
    if tag == "skipped":
        return message[:300]
    lines = (el.text or "").splitlines()
    errors = [ln.rstrip() for ln in lines if ln.startswith("E ")][:15]
    frames = [ln.strip() for ln in lines if re.match(r"\S+:\d+: \S", ln.strip())]  # "path:line: in f" / ": Error"
    where = [f for f in frames if "tests/" in f][:1] + frames[-1:]  # the test's own line, where it raised
    head = errors or message.splitlines()[:1]  # the junit message repeats the first `E ` line
    text = "\n".join(head + list(dict.fromkeys(where))).strip()
    return text[:MAX_DETAIL_CHARS]


def _exits(path: str) -> dict[str, int]:
    """gpu_run.sh's `<step> <exit status>` lines."""
    return {name: int(rc) for name, rc in (line.rsplit(" ", 1) for line in _lines(path))}


def _tests(work: str) -> dict:
    """Every gpu-tests*.xml (one per pytest group of gpu_run.sh), merged. A group that hit its
    bound or left no junit file (killed in a hung kernel) keeps its exit status and log tail: the
    verbose log ends with the test that was running."""
    paths = sorted(glob.glob(os.path.join(work, "gpu-tests*.xml")))
    exits = _exits(os.path.join(work, "test_exits.txt"))
    if not paths and not exits:
        return {"ran": False}
    counts = {k: 0 for k in ("tests", "failures", "errors", "skipped")}
    cases, collected, collected_counts = [], {}, {}
    for path in paths:
        root = ET.parse(path).getroot()
        suite = root if root.tag == "testsuite" else root.find("testsuite")
        for k in counts:
            counts[k] += int(suite.get(k, 0))
        group = os.path.basename(path)[len("gpu-tests-"):-len(".xml")]
        collected[group] = _properties(suite).get("verifies_collected")
        counts_text = _properties(suite).get("verifies_collected_counts")
        if counts_text:
            collected_counts[group] = json.loads(counts_text)
        for case in suite.iter("testcase"):
            if case.get("name") is None:  # pytest's placeholder for the test a SIGINT interrupted
                continue
            outcome = "passed"
            for tag in ("failure", "error", "skipped"):
                if case.find(tag) is not None:
                    outcome = tag
            entry = {"test": f"{case.get('classname')}::{case.get('name')}", "outcome": outcome,
                     "seconds": float(case.get("time", 0)), "group": group}
            props = _properties(case, all_values=True)
            verifies = props.get("verifies")
            if verifies:  # the verification-record components this test exercises (tests/conftest.py)
                entry["verifies"] = verifies
                # and the feature of each it verifies (absent: the whole component)
                entry["features"] = dict(v.split("=", 1) for v in props.get("verifies_feature", []) if "=" in v)
            if outcome != "passed":
                entry["detail"] = _case_detail(case, outcome)
                if outcome in ("failure", "error") and ENV_MARK in entry["detail"]:
                    entry["cause"] = "environment"
            cases.append(entry)
    # A group cut short (a hang): the test that hung is not in its junit file. verifies_collected
    # names every component its tests exercise (None: no junit file, so it could be any).
    cut_short = [{"group": name, "exit_status": rc, "log_tail": _tail(os.path.join(work, f"gpu-tests-{name}.txt")),
                  "verifies_collected": None if collected.get(name) is None else
                  [c for c in collected[name].split(",") if c]}
                 for name, rc in exits.items()
                 if rc in (124, 137) or not os.path.exists(os.path.join(work, f"gpu-tests-{name}.xml"))]
    # features_recorded: a case without a feature verifies its whole component (results written
    # before tests named features get theirs from verified.LEGACY_FEATURES instead)
    # collected_counts: per group, how many selected tests verify each (component, feature): a cut
    # group then blames only what some of its selected tests did not finish
    return {"ran": True, **counts, "cases": cases, "groups": [os.path.basename(p) for p in paths],
            "group_exits": exits, "cut_short": cut_short, "features_recorded": True,
            "collected_counts": collected_counts}


def _properties(element: ET.Element, all_values: bool = False) -> dict:
    """A junit element's <properties>: name -> value (all_values: name -> [values])."""
    out: dict = {}
    for prop in element.findall("./properties/property"):
        name, value = prop.get("name"), prop.get("value", "")
        if all_values:
            out.setdefault(name, []).append(value)
        else:
            out[name] = value
    return out


def _verification_table(cases: list[dict]) -> str:
    """Per verification-record component and feature: how its tests went (the record is built
    from the cases by scripts/update_verified.py)."""
    rows = {}
    for c in cases:
        for comp in c.get("verifies", []):
            feature = c.get("features", {}).get(comp, "(whole component)")
            row = rows.setdefault((comp, feature), {"backend": comp, "feature": feature, "passed": 0, "failure": 0,
                                                    "error": 0, "skipped": 0})
            row[c["outcome"]] += 1
    return _table([rows[k] for k in sorted(rows)]) if rows else ""


def _lines(path: str) -> list[str]:
    return [ln.strip() for ln in open(path) if ln.strip()] if os.path.exists(path) else []


def _tail(path: str, n: int = LOG_TAIL_LINES) -> list[str]:
    return [ln.rstrip() for ln in open(path, errors="replace")][-n:] if os.path.exists(path) else []


def _benchmarks(work: str) -> list[dict]:
    """Every benchmark's JSON, in the order the steps ran, each with its exit status; a step that
    failed keeps its log's tail (with or without the rows it saved before failing)."""
    exits = _exits(os.path.join(work, "bench_exits.txt"))
    found = [os.path.splitext(os.path.basename(p))[0] for p in
             sorted(glob.glob(os.path.join(work, "bench_*.json")) + glob.glob(os.path.join(work, "probe_*.json")))]
    benches = []
    for name in list(exits) + [f for f in found if f not in exits]:
        path = os.path.join(work, name + ".json")
        if os.path.exists(path):
            try:
                b = json.load(open(path))
            except json.JSONDecodeError as e:
                b = {"benchmark": name, "error": f"{os.path.basename(path)}: {e}", "rows": []}
        else:
            b = {"benchmark": name, "error": "wrote no results", "rows": []}
        if name in exits:
            b["exit_status"] = exits[name]
            if exits[name] != 0:
                b["log_tail"] = _tail(os.path.join(work, name + ".txt"))
                if exits[name] == 124:
                    b["error"] = (b.get("error", "") + "; timed out (the step's bound)").lstrip("; ")
                if exits[name] == ENV_EXIT:
                    why = [ln for ln in b["log_tail"] if ENV_MARK in ln] or ["(no ENVIRONMENT line in the log)"]
                    b["cause"] = "environment"
                    b["error"] = (b.get("error", "") + "; the machine could not run it: " + why[0]).lstrip("; ")
        benches.append(b)
    return benches


def _sanitizer_reports(work: str) -> dict:
    """For every compute-sanitizer run that was not clean (errors found, tests failed, or the run
    broke off): the sanitizer's own lines (those starting `=========`) and the log's last lines.
    Clean runs are left out; sanitizer.txt lists every run's exit status."""
    reports = {}
    for path in sorted(glob.glob(os.path.join(work, "sanitizer-*.txt"))):
        lines = [ln.rstrip() for ln in open(path, errors="replace")]
        own = [ln for ln in lines if ln.startswith("=========")]
        summary = next((ln for ln in reversed(own) if "ERROR SUMMARY" in ln), "")
        outcome = next((ln for ln in reversed(lines) if not ln.startswith("=========")
                        and re.search(r"\d+ (passed|failed|error)", ln)), "")
        if "ERROR SUMMARY: 0 errors" in summary and "passed" in outcome and not re.search("failed|error", outcome):
            continue
        if len(own) > 60:  # keep the first reports and the summary that ends them
            own = own[:58] + [f"... {len(own) - 59} more sanitizer lines ..."] + own[-1:]
        reports[os.path.basename(path)] = own + [ln for ln in lines[-10:] if not ln.startswith("=========")]
    return reports


def _table(rows: list[dict]) -> str:
    cols = []
    for r in rows:
        cols += [k for k in r if k not in cols]
    fmt = lambda v: f"{v:.4g}" if isinstance(v, float) else str(v)  # noqa: E731
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    lines += ["| " + " | ".join(fmt(r.get(c, "")) for c in cols) + " |" for r in rows]
    return "\n".join(lines)


STEP_FIELDS = ("step", "bound_s", "expected_s", "started_s", "seconds", "exit_status")


def _steps(work: str) -> list[dict]:
    """gpu_run.sh's `<step> <bound> <expected> <started at> <seconds> <exit status>` lines."""
    return [dict(zip(STEP_FIELDS, [ln.split()[0]] + [int(v) for v in ln.split()[1:]]))
            for ln in _lines(os.path.join(work, "steps.txt"))]


def _json(path: str) -> dict:
    try:
        return json.load(open(path))
    except (OSError, ValueError):
        return {}


def _commit(build_source: dict) -> tuple[str, str]:
    """The commit the results name, and where it came from: GPU_RUN_COMMIT (the tree the scripts
    and tests ran from), else the commit the installed build records (the wheel's)."""
    if os.environ.get("GPU_RUN_COMMIT"):
        return os.environ["GPU_RUN_COMMIT"], "GPU_RUN_COMMIT"
    commit = build_source.get("commit") or "unknown"
    return commit + ("-dirty" if build_source.get("dirty") else ""), "the installed build (build_source.json)"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--work", required=True)
    ap.add_argument("--out-dir", required=True)
    ap.add_argument("--tests-status", type=int, default=None)
    args = ap.parse_args()

    # info.json exists once the run's `info` step has run; results written before it (the
    # environment check, the install) carry what there is.
    info = _json(os.path.join(args.work, "info.json"))
    smi = _nvidia_smi()
    benches = _benchmarks(args.work)
    sanitizer = open(os.path.join(args.work, "sanitizer.txt")).read() if os.path.exists(
        os.path.join(args.work, "sanitizer.txt")) else None
    device = re.sub(r"[^A-Za-z0-9]+", "-", smi.get("name", "unknown-gpu")).strip("-").lower()
    now = datetime.datetime.now(datetime.timezone.utc)
    stamp = os.environ.get("GPU_RUN_STAMP") or f"{now:%Y-%m-%d-%H%M}"  # fixed for the whole run
    part = os.environ.get("GPU_RUN_PART")
    build_source = info.get("build_source") or {}
    commit, commit_from = _commit(build_source)
    result = {
        "date": now.isoformat(timespec="seconds"),
        "part": None if part is None else int(part),
        "commit": commit,
        "commit_from": commit_from,
        "build_source": build_source,
        "wheel": _json(os.path.join(args.work, "wheel.json")) or None,
        "device": smi,
        "environment": _lines(os.path.join(args.work, "environment.txt")),
        "versions": {k: info.get(k) for k in ("python", "jax", "jaxlib", "jaxlib_ffi_api", "cuda_driver")}
        | {"cuda_extension": info.get("extensions", {}).get("cuda"),
           "libraries": {k: v.get("version") for k, v in info.get("libraries", {}).items()}},
        "nvshmem": info.get("nvshmem"),
        "gates": {k: [v["supported"], v["reason"]] for k, v in info.get("gates", {}).items()},
        "steps": _steps(args.work),
        "gpu_tests": _tests(args.work) | {"exit_status": args.tests_status},
        "sanitizer": sanitizer,
        "sanitizer_reports": _sanitizer_reports(args.work),
        "not_run": _lines(os.path.join(args.work, "skipped.txt")),
        "cleanup": _lines(os.path.join(args.work, "cleanup.txt")),
        "benchmarks": benches,
    }
    base = os.path.join(args.out_dir, f"{stamp}-{device}" + (f"-part{part}" if part else ""))
    plots = []
    for png in sorted(glob.glob(os.path.join(args.work, "*.png"))):  # e.g. bench_dot's LLM-shape chart
        dest = f"{base}-{os.path.basename(png)}"
        shutil.copyfile(png, dest)
        plots.append(os.path.basename(dest))
    result["plots"] = plots
    with open(base + ".json", "w") as f:
        json.dump(result, f, indent=2)

    wheel = result["wheel"] or {}
    nv = result["nvshmem"] or {}
    md = [f"# GPU run {result['date']} on {smi.get('name', '?')}" + (f", part {part}" if part else ""), "",
          f"- commit: `{result['commit']}` (from {commit_from})",
          f"- build: commit `{build_source.get('commit', '?')}`" + (" with uncommitted changes" if build_source.get("dirty")
                                                                 else "")
          + (f"; wheel {wheel['wheel']} ({wheel.get('size_bytes', 0) / 1e6:.1f} MB, sha256 {wheel.get('sha256', '?')[:12]})"
             if wheel.get("wheel") else ""),
          f"- driver: {smi.get('driver_version', '?')}, compute capability {smi.get('compute_cap', '?')}, "
          f"memory {smi.get('memory.total', '?')}",
          "- versions: " + ", ".join(f"{k} {v}" for k, v in result["versions"].items() if k != "libraries"
                                     and not isinstance(v, dict)),
          "- libraries: " + ", ".join(f"{k} {v}" for k, v in result["versions"]["libraries"].items()),
          f"- NVSHMEM: built against {nv.get('built_against')}, host {nv.get('host')}: "
          + ("compatible" if nv.get("compatible") else "refused") + f" ({nv.get('reason')})"
          if nv.get("built_against") else f"- NVSHMEM: {nv.get('reason', '?')}",
          ""]
    if result["steps"]:
        md += ["## Steps", "", _table(result["steps"]), ""]
    if result["cleanup"]:
        md += ["Left behind by a step and stopped:", ""] + [f"- {c}" for c in result["cleanup"]] + [""]
    if result["environment"]:
        md += ["## Environment (before the install)", "", "```", *result["environment"], "```", ""]
    t = result["gpu_tests"]
    if t.get("ran"):
        cases = t["cases"]
        md += ["## GPU tests", "",
               f"{t['tests']} tests, {t['failures']} failures, {t['errors']} errors, "
               f"{t['skipped']} skipped (exit status {t['exit_status']}; per group: "
               + ", ".join(f"{g} {rc}" for g, rc in t["group_exits"].items()) + ")", ""]
        table = _verification_table(cases)
        if table:
            fps = (result["versions"]["cuda_extension"] or {}).get("source_fingerprints", {})
            md += ["### Per backend (verification record)", "",
                   f"Source fingerprints of the build that ran: `{json.dumps(fps)}`", "", table, ""]
        if cases:
            md += [_table([{k: c[k] for k in ("test", "outcome", "seconds")} for c in cases]), ""]
        for g in t["cut_short"]:
            md += [f"### Group `{g['group']}` was cut short (exit status {g['exit_status']}); its log ends", "",
                   "```", *g["log_tail"], "```", ""]
        failed = [c for c in cases if c["outcome"] in ("failure", "error")]
        for title, group in (("Why they failed", [c for c in failed if c.get("cause") != "environment"]),
                             ("Failed for an environment reason (not a code failure)",
                              [c for c in failed if c.get("cause") == "environment"])):
            if group:
                md += [f"### {title}", ""]
                for c in group:
                    md += [f"`{c['test']}` ({c['outcome']})", "", "```", c.get("detail") or "(no message)", "```", ""]
        skipped = [c for c in cases if c["outcome"] == "skipped"]
        if skipped:
            md += ["### Why they were skipped", ""] + [f"- `{c['test']}`: {c.get('detail', '')}" for c in skipped] + [""]
    if sanitizer:
        md += ["## compute-sanitizer", "", "```", sanitizer.strip(), "```", ""]
    for name, lines in result["sanitizer_reports"].items():
        md += [f"### {name}", "", "```", *lines, "```", ""]
    if result["not_run"]:
        md += ["## Not run", ""] + [f"- {s}" for s in result["not_run"]] + [""]
    for b in benches:
        md += [f"## {b.get('benchmark')}", ""]
        if b.get("exit_status"):
            md += [f"exit status {b['exit_status']}", ""]
        if b.get("error"):
            md += [f"error: {b['error']}", ""]
        if b.get("log_tail"):
            md += ["```", *b["log_tail"], "```", ""]
        if b.get("rows"):
            md += [_table(b["rows"]), ""]
        md += [f"- {n}" for n in b.get("notes", [])] + [""]
    md += [f"![{p}]({p})" for p in plots]
    with open(base + ".md", "w") as f:
        f.write("\n".join(md))
    print(f"wrote {base}.json and {base}.md")


if __name__ == "__main__":
    main()
