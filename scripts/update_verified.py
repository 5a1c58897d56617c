"""Regenerates the verification record and its generated views from the committed GPU results.

    python scripts/update_verified.py            # write jax_gpuext/common/verified.json, docs/gates.md, README.md
    python scripts/update_verified.py --check    # exit 1 if any of them is not what the results give
    python scripts/update_verified.py --fingerprints   # this tree's source fingerprints (JSON)

The record is never written by hand: it is ``jax_gpuext.common.verified.build_record`` over
``benchmarks/results/*.json`` (each written by scripts/gpu_run.sh). The generated views are the
"What is verified" table of docs/gates.md and the README's status paragraph, between
``<!-- verified:begin -->`` / ``<!-- verified:end -->`` markers.

``--fingerprints`` hashes cmake/verified_sources.txt's files the way cmake/source_fingerprints.cmake
does, so a test can check that the installed build's fingerprints are this tree's.
"""

from __future__ import annotations

import argparse
import glob
import hashlib
import json
import os
import pathlib
import re
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]
RECORD = ROOT / "jax_gpuext" / "common" / "verified.json"
BEGIN, END = "<!-- verified:begin -->", "<!-- verified:end -->"


def fingerprints(root: pathlib.Path = ROOT) -> dict[str, str]:
    """The tree's source fingerprints (the algorithm of cmake/source_fingerprints.cmake)."""
    spec = [ln.split() for ln in (root / "cmake" / "verified_sources.txt").read_text().splitlines()
            if ln.strip() and not ln.startswith(("#", " ", "\t"))]
    common = next(fields[1:] for fields in spec if fields[0] == "common")
    out = {}
    for component, *patterns in spec:
        if component == "common":
            continue
        files = set()
        for pattern in common + patterns:
            for path in glob.glob(str(root / pattern)):
                rel = pathlib.Path(path).relative_to(root).as_posix()
                if os.path.isfile(path) and not re.search(r"(^|/)\.", rel):
                    files.add(rel)
        text = "".join(f"{rel} {hashlib.sha256((root / rel).read_bytes()).hexdigest()}\n" for rel in sorted(files))
        out[component] = hashlib.sha256(text.encode()).hexdigest()[:16]
    return out


def load_results(root: pathlib.Path = ROOT) -> dict[str, dict]:
    """``{path relative to the root: results json}`` for every committed GPU run."""
    out = {}
    for path in sorted((root / "benchmarks" / "results").glob("*.json")):
        out[path.relative_to(root).as_posix()] = json.loads(path.read_text())
    return out


def replace_block(text: str, body: str, where: str) -> str:
    if text.count(BEGIN) != 1 or text.count(END) != 1:
        raise SystemExit(f"{where}: needs exactly one {BEGIN} ... {END} block")
    head, rest = text.split(BEGIN)
    _, tail = rest.split(END)
    return f"{head}{BEGIN}\n{body}\n{END}{tail}"


def generated(root: pathlib.Path = ROOT) -> dict[pathlib.Path, str]:
    """Every file this script writes, with its content as the committed results give it."""
    from jax_gpuext.common import verified

    record = verified.build_record(load_results(root))
    out = {root / "jax_gpuext" / "common" / "verified.json": json.dumps(record, indent=2) + "\n"}
    for rel, body in (("docs/gates.md", verified.markdown(record)), ("README.md", verified.summary(record))):
        path = root / rel
        if path.exists():
            out[path] = replace_block(path.read_text(), body, rel)
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="fail if a generated file is out of date")
    ap.add_argument("--fingerprints", action="store_true", help="print this tree's source fingerprints")
    args = ap.parse_args(argv)
    if args.fingerprints:
        print(json.dumps(fingerprints(), indent=2))
        return 0
    stale = []
    for path, text in generated().items():
        if not path.exists() or path.read_text() != text:
            stale.append(path.relative_to(ROOT).as_posix())
            if not args.check:
                path.write_text(text)
    if args.check and stale:
        print("out of date (run python scripts/update_verified.py): " + ", ".join(stale), file=sys.stderr)
        return 1
    print(("rewrote " + ", ".join(stale)) if stale and not args.check else "verification record is current")
    return 0


if __name__ == "__main__":
    sys.exit(main())
