"""CI's version legs deselect the heaviest tests by id (tests/version_legs_deselect.txt, read by
.ci/version_legs.sh). pytest ignores a --deselect that matches nothing, so a renamed test would
silently come back into those legs' time: every id must still name a test function of its file."""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
LIST = ROOT / "tests" / "version_legs_deselect.txt"


def _ids():
    return [line.strip() for line in LIST.read_text().splitlines() if line.strip() and not line.startswith("#")]


def test_every_deselected_id_names_a_test_of_its_file():
    ids = _ids()
    assert ids, "the list is empty: the version legs would run every test"
    missing = []
    for node in ids:
        path, _, name = node.partition("::")
        function = re.sub(r"\[.*\]$", "", name)
        source = ROOT / path
        if not source.is_file() or not re.search(rf"^def {re.escape(function)}\(", source.read_text(), re.M):
            missing.append(node)
    assert not missing, f"no such test (renamed or removed? update {LIST.name}): {missing}"
    assert len(set(ids)) == len(ids), "an id is listed twice"


def test_the_version_legs_read_the_list():
    script = (ROOT / ".ci" / "version_legs.sh").read_text()
    assert "version_legs_deselect.txt" in script and "--deselect" in script


def test_the_version_legs_run_each_value_once():
    script = (ROOT / ".ci" / "version_legs.sh").read_text()
    assert "--param-subset=each-value" in script


def test_each_value_subset_keeps_a_variant_for_every_value_that_runs():
    import sys

    sys.path.insert(0, str(ROOT / "tests"))
    from _param_subset import each_value_subset

    grid = [("f", {"fmt": a, "dtype": b}, True) for a in "ABC" for b in "xy"]
    keep = each_value_subset(grid)
    kept = [p for (_, p, _), k in zip(grid, keep) if k]
    assert {p["fmt"] for p in kept} == set("ABC") and {p["dtype"] for p in kept} == set("xy")
    assert len(kept) == 3  # the greedy cover: (A,x), then (B,y) brings two, then (C,x)
    # a skipped or deselected variant covers nothing: the value it had is taken from the next one
    marked = [("g", {"fmt": "A"}, False), ("g", {"fmt": "A"}, True), ("g", {"fmt": "A"}, True)]
    assert each_value_subset(marked) == [True, True, False]
    # the cover takes the variant that brings the most: after (A,x,1), (B,y,2) covers all that is left
    cube = [("k", {"a": a, "b": b, "c": c}, True) for a in "AB" for b in "xy" for c in "12"]
    assert sum(each_value_subset(cube)) == 2
    # functions are separate; an unparametrized test is always kept
    assert each_value_subset([("h", {"fmt": "A"}, True), ("i", {"fmt": "A"}, True), ("j", None, True)]) == [True] * 3


def test_the_option_in_a_throwaway_project(tmp_path):
    """The plugin as pytest loads it: a 3 x 2 grid with one skipped variant and a --deselect."""
    import os
    import subprocess
    import sys
    import textwrap

    (tmp_path / "conftest.py").write_text(textwrap.dedent(f"""
        import sys
        sys.path.insert(0, {str(ROOT / "tests")!r})
        pytest_plugins = ["_param_subset"]
    """))
    (tmp_path / "test_grid.py").write_text(textwrap.dedent("""
        import pytest

        @pytest.mark.parametrize("dtype", ["x", "y"])
        @pytest.mark.parametrize("fmt", ["A", pytest.param("B", marks=pytest.mark.skip(reason="gate")), "C"])
        def test_grid(fmt, dtype):
            pass

        def test_plain():
            pass
    """))
    env = {**os.environ, "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"}
    out = subprocess.run([sys.executable, "-P", "-m", "pytest", "-p", "no:cacheprovider", "--collect-only", "-q",
                          "--param-subset=each-value", "--deselect", "test_grid.py::test_grid[A-x]", str(tmp_path)],
                         cwd=tmp_path, capture_output=True, text=True, env=env, timeout=120).stdout
    ids = sorted(line.split("::", 1)[1] for line in out.splitlines() if "::" in line)
    # A-x deselected and the B variants skipped: those stay (they cost nothing) and cover nothing;
    # the cover of A, C, x, y from A-y, C-x, C-y takes A-y (A, y) and C-x (C, x).
    assert ids == ["test_grid[A-y]", "test_grid[B-x]", "test_grid[B-y]", "test_grid[C-x]", "test_plain"], out
