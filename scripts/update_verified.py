"""Regenerates the verification record and its generated views from the committed GPU results.

    python scripts/update_verified.py            # write jax_gpuext/common/verified.json, docs/gates.md, README.md
    python scripts/update_verified.py --check    # exit 1 if any of them is not what the results give
    python scripts/update_verified.py --fingerprints   # this tree's source fingerprints (JSON)

The record is never written by hand: it is ``jax_gpuext.common.verified.build_record`` over
``benchmarks/results/*.json`` (each written by scripts/gpu_run.sh). The generated views are the
"What is verified" and "What runs by default" blocks of docs/gates.md and the README's status
paragraph, between ``<!-- verified:begin -->`` / ``<!-- verified:end -->`` markers.

``--fingerprints`` hashes cmake/verified_sources.txt's files the way cmake/source_fingerprints.cmake
does, so a test can check that the installed build's fingerprints are this tree's.

Results of a build with scheme-1 fingerprints (Python glue included; commits up to eff6f45) get
scheme-2 ones from git (``benchmarks/results/source-fingerprints.tsv``, written here): the files of
the results' commit hashed with today's spec, after checking that the commit's own spec gives the
fingerprints the build reported (so the build that ran was that commit's tree).

Every run prints what is verified in the record but not at this tree's sources, and which files
changed: a kernel changed since its GPU run stays off until the next run passes.
"""

from __future__ import annotations

import argparse
import glob
import hashlib
import json
import os
import pathlib
import re
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]
RECORD = ROOT / "jax_gpuext" / "common" / "verified.json"
SPEC = "cmake/verified_sources.txt"
TRANSLATIONS = "benchmarks/results/source-fingerprints.tsv"  # verified.SCHEME_TRANSLATIONS
BEGIN, END = "<!-- verified:begin -->", "<!-- verified:end -->"
DEFAULTS_BEGIN, DEFAULTS_END = "<!-- defaults:begin -->", "<!-- defaults:end -->"


def parse_spec(text: str) -> dict[str, list[str]]:
    """``{component: patterns}`` of a verified_sources.txt (``common``'s patterns added to each)."""
    spec = [ln.split() for ln in text.splitlines() if ln.strip() and not ln.startswith(("#", " ", "\t"))]
    common = next((fields[1:] for fields in spec if fields[0] == "common"), [])
    return {fields[0]: common + fields[1:] for fields in spec if fields[0] != "common"}


def _digest(files: dict[str, bytes]) -> str:
    text = "".join(f"{rel} {hashlib.sha256(data).hexdigest()}\n" for rel, data in sorted(files.items()))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def matched_files(root: pathlib.Path, patterns) -> list[str]:
    """The files of the working tree ``patterns`` match (as CMake's non-recursive file(GLOB))."""
    files = set()
    for pattern in patterns:
        for path in glob.glob(str(root / pattern)):
            rel = pathlib.Path(path).relative_to(root).as_posix()
            if os.path.isfile(path) and not re.search(r"(^|/)\.", rel):
                files.add(rel)
    return sorted(files)


def fingerprints(root: pathlib.Path = ROOT) -> dict[str, str]:
    """The tree's source fingerprints (the algorithm of cmake/source_fingerprints.cmake)."""
    spec = parse_spec((root / SPEC).read_text())
    return {c: _digest({f: (root / f).read_bytes() for f in matched_files(root, pats)}) for c, pats in spec.items()}


# --------------------------------------------------------------------------- a commit's tree, from git
def _git(root: pathlib.Path, *args: str) -> bytes:
    return subprocess.run(["git", "-C", str(root), *args], capture_output=True, check=True).stdout


def _glob_regex(pattern: str) -> re.Pattern:
    # file(GLOB): '*' and '?' stay within one path component
    return re.compile("^" + re.escape(pattern).replace(r"\*", "[^/]*").replace(r"\?", "[^/]") + "$")


def commit_fingerprints(root: pathlib.Path, commit: str, spec_text: str | None = None) -> dict[str, str]:
    """The fingerprints of ``commit``'s files under ``spec_text`` (default: the commit's own spec)."""
    paths = _git(root, "ls-tree", "-r", "--name-only", commit).decode().splitlines()
    if spec_text is None:
        spec_text = _git(root, "show", f"{commit}:{SPEC}").decode()
    blobs: dict[str, bytes] = {}
    out = {}
    for component, patterns in parse_spec(spec_text).items():
        regexes = [_glob_regex(p) for p in patterns]
        files = [p for p in paths if any(r.match(p) for r in regexes) and not re.search(r"(^|/)\.", p)]
        for f in files:
            if f not in blobs:
                blobs[f] = _git(root, "show", f"{commit}:{f}")
        out[component] = _digest({f: blobs[f] for f in files})
    return out


def translate(root: pathlib.Path, commit: str, reported: dict[str, str]) -> dict[str, str]:
    """Scheme-2 fingerprints of the build of ``commit`` that reported scheme-1 ``reported``.
    Raises ValueError unless the commit's own spec reproduces ``reported`` for every component."""
    own = commit_fingerprints(root, commit)
    differ = sorted(c for c in reported if c != "scheme" and own.get(c) != reported[c])
    if differ:
        raise ValueError(f"commit {commit[:12]}'s sources do not give the fingerprints its results report for "
                         f"{', '.join(differ)}: the build that ran was not that commit's tree")
    return commit_fingerprints(root, commit, (root / SPEC).read_text())


def read_translations(root: pathlib.Path = ROOT) -> dict[str, dict[str, str]]:
    path = root / TRANSLATIONS
    out: dict[str, dict[str, str]] = {}
    if path.exists():
        for line in path.read_text().splitlines():
            if line.strip() and not line.startswith("#"):
                commit, component, fp = line.split("\t")
                out.setdefault(commit, {})[component] = fp
    return out


def translations_text(table: dict[str, dict[str, str]]) -> str:
    head = ["# Scheme-2 source fingerprints (cmake/verified_sources.txt today) of the builds that scheme-1 GPU",
            "# results in this folder ran: the files of each commit, hashed with today's spec, after",
            "# checking that the commit's own spec gives the fingerprints its results report.",
            "# Generated by scripts/update_verified.py from git; do not edit.",
            "# commit\tcomponent\tfingerprint"]
    rows = [f"{c}\t{comp}\t{fp}" for c in sorted(table) for comp, fp in sorted(table[c].items())]
    return "\n".join(head + rows) + "\n"


def needed_translations(results: dict[str, dict], root: pathlib.Path = ROOT) -> tuple[dict, list[str]]:
    """``{commit: fingerprints}`` for every scheme-1 results file (from git), and the problems."""
    from jax_gpuext.common import verified

    table, problems = {}, []
    for path, result in sorted(results.items()):
        fps = (result.get("versions", {}).get("cuda_extension") or {}).get("source_fingerprints") or {}
        commit = str(result.get("commit", ""))
        if not fps or fps.get(verified.SCHEME_KEY) == verified.FINGERPRINT_SCHEME or commit in table:
            continue
        if (result.get("build_source") or {}).get("dirty") or not re.fullmatch(r"[0-9a-f]{40}", commit):
            problems.append(f"{path}: built from {commit!r} with uncommitted changes or no commit: its "
                            f"scheme-1 fingerprints cannot be translated; it verifies nothing")
            continue
        try:
            table[commit] = translate(root, commit, fps)
        except (ValueError, subprocess.CalledProcessError, FileNotFoundError) as e:
            why = e.stderr.decode().strip() if isinstance(e, subprocess.CalledProcessError) else str(e)
            problems.append(f"{path}: {why}; it verifies nothing")
    return table, problems


# --------------------------------------------------------------------------- results and views
def load_results(root: pathlib.Path = ROOT) -> dict[str, dict]:
    """``{path relative to the root: results json}`` for every committed GPU run."""
    out = {}
    derived_path = root / "benchmarks" / "results" / "derived" / "collected-tests.json"
    derived = json.loads(derived_path.read_text()) if derived_path.exists() else {}
    for path in sorted((root / "benchmarks" / "results").glob("*.json")):
        result = json.loads(path.read_text())
        # groups whose selected tests a run did not record, derived from its commit's tests
        # (scripts/collected_tests.py): a group cut short then blames only what it did not finish
        tests = result.get("gpu_tests")
        for group, found in derived.get(path.name, {}).items():
            if isinstance(tests, dict) and group not in (tests.get("collected_counts") or {}):
                tests.setdefault("collected_counts", {})[group] = found["counts"]
                tests.setdefault("collected_tests", {})[group] = found["tests"]
        out[path.relative_to(root).as_posix()] = result
    return out


def replace_block(text: str, body: str, where: str, begin: str = BEGIN, end: str = END) -> str:
    if text.count(begin) != 1 or text.count(end) != 1:
        raise SystemExit(f"{where}: needs exactly one {begin} ... {end} block")
    head, rest = text.split(begin)
    _, tail = rest.split(end)
    return f"{head}{begin}\n{body}\n{end}{tail}"


def generated(root: pathlib.Path = ROOT, translations: dict | None = None) -> dict[pathlib.Path, str]:
    """Every file this script writes, with its content as the committed results give it."""
    from jax_gpuext.common import verified

    table = read_translations(root) if translations is None else translations
    record = verified.build_record(load_results(root), table)
    out = {root / "jax_gpuext" / "common" / "verified.json": json.dumps(record, indent=2) + "\n"}
    if table:
        out[root / TRANSLATIONS] = translations_text(table)
    gates_md = root / "docs" / "gates.md"
    if gates_md.exists():
        text = replace_block(gates_md.read_text(), verified.markdown(record), "docs/gates.md")
        if DEFAULTS_BEGIN in text:
            text = replace_block(text, verified.defaults_markdown(record), "docs/gates.md", DEFAULTS_BEGIN,
                                 DEFAULTS_END)
        out[gates_md] = text
    readme = root / "README.md"
    if readme.exists():
        # A tree without the fingerprint spec (a test's minimal tree) cannot tell this checkout's sources apart.
        tree = fingerprints(root) if (root / SPEC).exists() else None
        out[readme] = replace_block(readme.read_text(), verified.summary(record, tree), "README.md")
    return out


def changed_since(root: pathlib.Path, component: str, commit: str) -> list[str]:
    """The files of ``component``'s fingerprint that differ between ``commit`` and the tree."""
    patterns = parse_spec((root / SPEC).read_text()).get(component, [])
    now = {f: hashlib.sha1(b"blob %d\0" % len(d) + d).hexdigest()
           for f in matched_files(root, patterns) for d in [(root / f).read_bytes()]}
    try:
        listing = _git(root, "ls-tree", "-r", commit).decode().splitlines()
    except (subprocess.CalledProcessError, FileNotFoundError):
        return sorted(now)
    regexes = [_glob_regex(p) for p in patterns]
    then = {}
    for line in listing:
        meta, path = line.split("\t", 1)
        if any(r.match(path) for r in regexes) and not re.search(r"(^|/)\.", path):
            then[path] = meta.split()[2]
    return sorted(f for f in set(now) | set(then) if now.get(f) != then.get(f))


def unverified_here(record: dict, root: pathlib.Path = ROOT) -> list[str]:
    """Lines for what the record verifies that this tree's sources no longer match, and why."""
    tree = fingerprints(root)
    lines = []
    for e in record["entries"]:
        if tree.get(e["component"]) == e["fingerprint"]:
            continue
        verified = [f for f, t in e["features"].items() if t["verified"]] or (["all"] if e["verified"] else [])
        if not verified:
            continue
        files = changed_since(root, e["component"], e["commit"])
        lines.append(f"{e['component']} ({e['architecture']}; verified: {', '.join(verified)}) becomes unverified at "
                     f"this tree: its sources changed since {e['commit'][:12]} ({e['results']}): "
                     + (", ".join(files[:8]) + (f" and {len(files) - 8} more" if len(files) > 8 else "")
                        if files else "the spec cmake/verified_sources.txt changed"))
    return lines


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="fail if a generated file is out of date")
    ap.add_argument("--fingerprints", action="store_true", help="print this tree's source fingerprints")
    args = ap.parse_args(argv)
    if args.fingerprints:
        print(json.dumps(fingerprints(), indent=2))
        return 0
    table = read_translations()
    results = load_results()
    fresh, problems = needed_translations({p: r for p, r in results.items()
                                           if str(r.get("commit", "")) not in table})
    for line in problems:
        print("warning: " + line, file=sys.stderr)
    if args.check:
        for commit, fps in table.items():  # the committed translations still hold, where git can tell
            try:
                again = commit_fingerprints(ROOT, commit, (ROOT / SPEC).read_text())
            except (subprocess.CalledProcessError, FileNotFoundError):
                continue  # no history here (a shallow checkout): the committed table stands
            if again != fps:
                print(f"out of date: {TRANSLATIONS} for {commit[:12]} (cmake/verified_sources.txt changed?); "
                      "run python scripts/update_verified.py", file=sys.stderr)
                return 1
    table = {**table, **fresh}
    stale = []
    files = generated(ROOT, table)
    for path, text in files.items():
        if not path.exists() or path.read_text() != text:
            stale.append(path.relative_to(ROOT).as_posix())
            if not args.check:
                path.write_text(text)
    record = json.loads(files[RECORD])
    for line in unverified_here(record):
        print("unverified here: " + line)
    if args.check and stale:
        print("out of date (run python scripts/update_verified.py): " + ", ".join(stale), file=sys.stderr)
        return 1
    print(("rewrote " + ", ".join(stale)) if stale and not args.check else "verification record is current")
    return 0


if __name__ == "__main__":
    sys.exit(main())
