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
