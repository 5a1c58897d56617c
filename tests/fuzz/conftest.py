"""Fuzz suite fixtures: one worker process per session (tests/fuzz/_pool.py) and the summary
line with the number of cases per area (tests/fuzz/_budget.py)."""

from __future__ import annotations

import pytest

from _budget import summary
from _pool import Worker


@pytest.fixture(scope="session")
def worker():
    w = Worker()
    yield w
    w.close()


def pytest_terminal_summary(terminalreporter):
    line = summary()
    if line:
        terminalreporter.write_line(line)
