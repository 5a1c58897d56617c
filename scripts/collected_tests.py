"""Which tests a GPU run's test group had selected, derived from the commit's own tests, for runs
written before the results recorded it (``gpu_tests.collected_counts``, tests/conftest.py).

    python scripts/collected_tests.py --results FILE.json --group NAME --checkout DIR -- PYTEST_ARGS...

collects PYTEST_ARGS (the group's selection, as scripts/gpu_run.sh of that commit ran it, paths
relative to DIR) in DIR, a checkout of the results' commit, and writes the group's selected tests
(junit ids, as the results name their cases) and per (component, feature) counts into
benchmarks/results/derived/collected-tests.json under the results file's name, with the arguments used.
jax_gpuext.common.verified then lets a group cut short blame only the components whose selected
tests did not all finish. Collection is deterministic from the source (markers, parameters), so
the derivation is reproducible from the commit alone.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import subprocess
import sys
import tempfile

ROOT = pathlib.Path(__file__).resolve().parents[1]
SIDECAR = ROOT / "benchmarks" / "results" / "derived" / "collected-tests.json"

PLUGIN = '''
import json, os, sys

def pytest_collection_finish(session):
    conftest = next(m for n, m in sys.modules.items() if n == "conftest" or n.endswith(".conftest")
                    and hasattr(m, "verified_components"))
    out = []
    for item in session.items:
        module, _, name = item.nodeid.partition("::")
        out.append({"test": module[:-3].replace("/", ".") + "::" + name,
                    "components": conftest.verified_components(item),
                    "features": conftest.verified_features(item)})
    with open(os.environ["GPUEXT_COLLECTED_OUT"], "w") as f:
        json.dump(out, f)
'''


def collect(checkout: pathlib.Path, pytest_args: list[str]) -> list[dict]:
    with tempfile.TemporaryDirectory() as tmp:
        (pathlib.Path(tmp) / "gpuext_collect_plugin.py").write_text(PLUGIN)
        out = pathlib.Path(tmp) / "collected.json"
        path = os.pathsep.join(p for p in (tmp, os.environ.get("PYTHONPATH", "")) if p)
        env = {**os.environ, "GPUEXT_COLLECTED_OUT": str(out), "PYTHONPATH": path}
        cmd = [sys.executable, "-P", "-m", "pytest", "-p", "no:cacheprovider", "-p", "gpuext_collect_plugin",
               "--collect-only", "-q", *pytest_args]
        r = subprocess.run(cmd, cwd=checkout, env=env, capture_output=True, text=True)
        if not out.exists():
            raise SystemExit(f"collection failed ({r.returncode}):\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}")
        return json.loads(out.read_text())


def counts(items: list[dict]) -> dict[str, dict[str, int]]:
    out: dict[str, dict[str, int]] = {}
    for it in items:
        for c in it["components"]:
            f = it["features"].get(c, "")
            out.setdefault(c, {})[f] = out.setdefault(c, {}).get(f, 0) + 1
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--results", required=True, help="the results file (benchmarks/results/...json)")
    ap.add_argument("--group", required=True, help="its test group (gpu-tests-<group>.xml)")
    ap.add_argument("--checkout", required=True, type=pathlib.Path, help="a checkout of the results' commit")
    ap.add_argument("pytest_args", nargs="+")
    args = ap.parse_args(argv)
    result = json.loads(pathlib.Path(args.results).read_text())
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=args.checkout, capture_output=True, text=True).stdout.strip()
    if not head or not result.get("commit", "").startswith(head[:len(result.get("commit", ""))]) or \
            subprocess.run(["git", "status", "--porcelain", "--", "tests"], cwd=args.checkout,
                           capture_output=True, text=True).stdout.strip():
        raise SystemExit(f"{args.checkout} is not a clean checkout of the results' commit {result.get('commit')}")
    items = collect(args.checkout, args.pytest_args)
    table = json.loads(SIDECAR.read_text()) if SIDECAR.exists() else {}
    table.setdefault(pathlib.Path(args.results).name, {})[args.group] = {
        "commit": head, "pytest_args": args.pytest_args, "counts": counts(items),
        "tests": sorted(it["test"] for it in items if it["components"])}
    SIDECAR.write_text(json.dumps(table, indent=1, sort_keys=True) + "\n")
    print(f"{args.group}: {len(items)} tests selected, {sum(1 for it in items if it['components'])} verify a component")
    return 0


if __name__ == "__main__":
    sys.exit(main())
