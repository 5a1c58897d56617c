"""``@pytest.mark.isolated``: run tests in child processes, so that one test's device trap cannot
decide the results of the tests after it (a pytest plugin; tests/conftest.py loads it).

Why: a kernel that traps (an illegal instruction, an illegal address) poisons the process's CUDA
context, and every later test in that process fails on it. The first H200 run lost 13 of the
grouped kernel's 14 results that way (docs/design.md, "Grouped kernel trap on skewed groups").
``fork`` is unsafe once CUDA is initialised and pytest-forked is not in the GPU image, so a child
is a fresh ``python -P -m pytest <node ids>`` (``-P``: the working directory must not shadow the
installed package, as with the ``pytest`` script).

``@pytest.mark.isolated`` on a test, class or module (``pytestmark``) isolates the tests it covers;
``isolated(only="gpu")`` only those that also carry the ``gpu`` marker, so a module's CPU tests
keep running in the parent. ``--isolation`` picks how:

- ``batch`` (default): the isolated tests of one module still to run share one child, which stops
  at its first failure (``-x``); the next test starts a fresh child. So no test runs after a
  failure in the same process, which is what a trap needs, and a module whose tests pass costs one
  child's start-up (JAX and the CUDA context: seconds), not one per test, which the GPU run's
  per-step budgets could not carry for hopper_mx's 35 tests.
- ``each``: one child per test (also what an xdist worker does, whose items another worker may run).
- ``off``: in process (debugging).

Tests that would skip (a ``skip`` or true ``skipif`` marker, which is how tests/conftest.py's
closed gates skip) are skipped by the parent and never start a child: on a machine without a GPU the
marker costs nothing. Each test's own outcome (passed, failed with the child's report, skipped
with the child's reason) is raised in the parent's call phase, so the parent's report, its junit
file and the ``verifies`` properties that tests/conftest.py adds at collection are those of an
in-process run; properties the child recorded (``record_property``) are added to the parent's. A
child that dies (a signal, ``os.abort``, a timeout) fails the test it was running with the exit
status and the end of its output; the tests after it run in a new child. The parent reads the
child's records while it runs and reports each test as soon as the child has finished it, so a
parent interrupted part-way (the GPU script's step bound) has reported everything finished so far. With pytest-timeout's
``--timeout`` the child gets the same per-test timeout and the parent waits at most that per test
of the batch plus start-up.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import signal
import subprocess
import sys
import tempfile
import time

import pytest

MARKER = "isolated"
MARKER_HELP = (f"{MARKER}(only=None): run in a child process (tests/_isolation.py), so that a device trap in one "
               "test cannot fail the tests after it; only=MARKER restricts it to tests that also carry that marker")
_CHILD_START_S = 120  # bound on a child's start-up (Python, JAX, a CUDA context) where a --timeout applies
_OUTPUT_TAIL = 6000
_POLL_S = 0.05  # how often the parent reads a running child's records


@dataclasses.dataclass
class _Result:
    outcome: str  # "passed", "failed", "skipped"
    text: str = ""
    properties: list = dataclasses.field(default_factory=list)


@dataclasses.dataclass
class _State:
    mode: str
    results: dict = dataclasses.field(default_factory=dict)  # node id -> _Result, until its call phase takes it
    children: int = 0
    tests_in_children: set = dataclasses.field(default_factory=set)
    index: dict | None = None  # node id -> position in session.items
    child: object = None  # the _Child still running a batch, if any


_STATE = pytest.StashKey[_State]()


def pytest_addoption(parser):
    group = parser.getgroup("isolation", "running isolated tests in child processes (tests/_isolation.py)")
    group.addoption("--isolation", choices=("batch", "each", "off"), default="batch",
                    help="batch: a module's isolated tests share a child until one fails (default); "
                         "each: one child per test; off: run them in process")
    group.addoption("--isolated-child", default=None, help=argparse.SUPPRESS)  # the records file of a child


def pytest_configure(config):
    if not any(line.split(":")[0].split("(")[0].strip() == MARKER for line in config.getini("markers")):
        config.addinivalue_line("markers", MARKER_HELP)
    records = config.getoption("isolated_child")
    if records:
        global _child_records
        _child_records = open(records, "a", encoding="utf-8")  # noqa: SIM115 (closed at unconfigure)
        return
    mode = config.getoption("isolation")
    if mode == "batch" and hasattr(config, "workerinput"):  # xdist worker: its batch could hold others' items
        mode = "each"
    config.stash[_STATE] = _State(mode)


def pytest_unconfigure(config):
    state = config.stash.get(_STATE, None)
    if state is not None and state.child is not None:
        state.child.stop()
    global _child_records
    if _child_records is not None and config.getoption("isolated_child"):
        _child_records.close()
        _child_records = None


def is_isolated(item) -> bool:
    mark = item.get_closest_marker(MARKER)
    if mark is None:
        return False
    only = mark.kwargs.get("only")
    return only is None or item.get_closest_marker(only) is not None


def _runs_in_child(item) -> bool:
    state = item.config.stash.get(_STATE, None)
    return state is not None and state.mode != "off" and is_isolated(item)


def would_skip(item) -> bool:
    if item.get_closest_marker("skip") is not None:
        return True
    try:
        from _pytest.skipping import evaluate_skip_marks  # what pytest's own setup runs

        return evaluate_skip_marks(item) is not None
    except Exception:  # a skipif condition that raises: let the parent's setup report it
        return False


def _timeout_s(config) -> float:
    """pytest-timeout's per-test timeout (0: none or no plugin)."""
    if not config.pluginmanager.hasplugin("timeout"):
        return 0.0
    value = config.getoption("timeout", None)
    if value is None:
        try:
            value = config.getini("timeout")
        except ValueError:
            value = None
    try:
        return max(float(value or 0), 0.0)
    except (TypeError, ValueError):
        return 0.0


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config, items):
    # The parent's wait for a child is bounded by the child's own per-test timeouts (below), not
    # by pytest-timeout in the parent, which would cut a batch at one test's bound.
    if _timeout_s(config) > 0:
        for item in items:
            if _runs_in_child(item):
                item.add_marker(pytest.mark.timeout(0))


# ----------------------------------------------------------------------------- the child's side
# The child's records file: one JSON line when a test starts and one per report, flushed at once,
# so a child that dies has already told which test it was running. (A module global: logstart and
# logreport get no config, and a child process has one config.)
_child_records = None


def _write(record: dict) -> None:
    _child_records.write(json.dumps(record, default=str) + "\n")
    _child_records.flush()


def pytest_runtest_logstart(nodeid, location):
    if _child_records is not None:
        _write({"event": "start", "nodeid": nodeid})


def pytest_runtest_logreport(report):
    if _child_records is None:
        return
    reason = ""
    if report.skipped and isinstance(report.longrepr, tuple):
        reason = str(report.longrepr[2]).removeprefix("Skipped: ")
    text = ""
    if report.failed:
        text = report.longreprtext
        for title, content in report.sections:
            text += f"\n----- {title} -----\n{content[-_OUTPUT_TAIL:]}"
    _write({"event": "report", "nodeid": report.nodeid, "when": report.when, "outcome": report.outcome,
            "reason": reason, "text": text[-4 * _OUTPUT_TAIL:], "wasxfail": getattr(report, "wasxfail", None),
            "properties": [list(p) for p in report.user_properties]})


# ----------------------------------------------------------------------------- the parent's side
def _result_of(reports: dict) -> _Result:
    """One test's outcome from its setup / call / teardown reports in the child."""
    props = []
    for when in ("setup", "call", "teardown"):
        props += [tuple(p) for p in reports.get(when, {}).get("properties", [])]
    setup, call, teardown = (reports.get(w) for w in ("setup", "call", "teardown"))
    if setup and setup["outcome"] == "failed":
        return _Result("failed", "error in the child's setup:\n" + setup["text"], props)
    if setup and setup["outcome"] == "skipped":
        return _Result("skipped", setup["reason"], props)
    if call and call["outcome"] == "failed":
        if call["text"].startswith("[XPASS(strict)]"):  # the parent's own xfail marker decides again
            return _Result("passed", "", props)
        return _Result("failed", call["text"], props)
    if call and call["outcome"] == "skipped":
        if call["wasxfail"] is not None:  # xfailed there: fail here, the parent's xfail marker turns it into xfail
            return _Result("failed", f"xfailed in the child process: {call['wasxfail']}", props)
        return _Result("skipped", call["reason"], props)
    if teardown and teardown["outcome"] == "failed":
        return _Result("failed", "error in the child's teardown:\n" + teardown["text"], props)
    return _Result("passed", "", props)


def _node_arg(item) -> str:
    """The test's node id with an absolute file path: the child runs from the parent's directory,
    which need not be the rootdir (scripts/gpu_run.sh runs pytest from /)."""
    _, _, rest = item.nodeid.partition("::")
    return f"{item.path}::{rest}" if rest else str(item.path)


def _exit_status(rc: int | None, timed_out: bool) -> str:
    if timed_out:
        return "was killed after the run's timeout"
    if rc is not None and rc < 0:
        try:
            return f"died from signal {signal.Signals(-rc).name}"
        except ValueError:
            return f"died from signal {-rc}"
    return f"exited with status {rc}"


def _tail(path: str) -> str:
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return f.read()[-_OUTPUT_TAIL:]
    except OSError:
        return ""


class _Child:
    """One child process running a batch, read test by test while it runs: the parent reports each
    test as soon as the child has finished it, so a parent stopped part-way (the GPU script's step
    bound sends SIGINT) has already reported every test the child completed (the H200 run of 3ff9b82
    lost 35 finished-or-not hopper_mx results at once because the parent waited for the whole batch)."""

    def __init__(self, config, state: _State, batch: list):
        state.children += 1
        self.state, self.batch = state, batch
        self.ids = {item.nodeid for item in batch}
        workdir = tempfile.mkdtemp(prefix="pytest-isolated-")
        self.records, self.log = os.path.join(workdir, "records.jsonl"), os.path.join(workdir, "child.log")
        self.timeout = _timeout_s(config)
        cmd = [sys.executable, "-P", "-m", "pytest", "-p", "no:cacheprovider", "-p", "no:xdist", "-x", "-q",
               "--rootdir", str(config.rootpath), f"--isolated-child={self.records}"]
        if config.inipath is not None:
            cmd += ["-c", str(config.inipath)]
        for override in config.getoption("override_ini", None) or []:
            cmd += ["-o", override]
        if self.timeout > 0:
            cmd.append(f"--timeout={self.timeout:g}")
        cmd += [_node_arg(item) for item in batch]
        self.cmd = cmd
        # The command line above is the child's whole configuration: PYTEST_ADDOPTS (say, xdist's -n)
        # and xdist's worker variables are the parent's. The parent may hold a JAX GPU client that
        # preallocated 75% of the device: the child allocates on demand unless told otherwise.
        env = {k: v for k, v in os.environ.items() if k != "PYTEST_ADDOPTS" and not k.startswith("PYTEST_XDIST")}
        env.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
        self.out = open(self.log, "w", encoding="utf-8")  # noqa: SIM115 (closed in _finish)
        self.proc = subprocess.Popen(cmd, cwd=str(config.invocation_params.dir), stdin=subprocess.DEVNULL,
                                     stdout=self.out, stderr=subprocess.STDOUT, env=env)
        self.started_at = time.monotonic()
        self.timed_out, self.rc = False, None

    def _collect(self) -> None:
        """Moves every test the child has finished into state.results."""
        reports, started = _read_records(self.records)
        self.state.tests_in_children.update(n for n in started if n in self.ids)
        for nodeid in started:
            if nodeid in self.ids and nodeid not in self.state.results and "teardown" in reports.get(nodeid, {}):
                self.state.results[nodeid] = _result_of(reports[nodeid])

    def _finish(self) -> None:
        """After the child ended: the test it was running (or the first, if it never got to one) fails
        with its exit status; tests it never started stay unresolved (a new child takes them)."""
        self.out.close()
        self._collect()
        reports, started = _read_records(self.records)
        unfinished = [n for n in started if n in self.ids and n not in self.state.results]
        victim = unfinished[-1] if unfinished else (None if started else self.batch[0].nodeid)
        if victim is not None:
            where = "while running this test" if unfinished else "before running any test"
            self.state.results[victim] = _Result(
                "failed", f"the isolated child process {_exit_status(self.rc, self.timed_out)} {where} "
                          f"(command: {' '.join(self.cmd[:4])} ... ); the end of its output:\n{_tail(self.log)}",
                [tuple(p) for r in reports.get(victim, {}).values() for p in r.get("properties", [])])

    def wait_for(self, nodeid: str) -> None:
        """Returns once ``nodeid`` has a result or the child has ended (then _finish ran)."""
        limit = self.timeout * len(self.batch) + _CHILD_START_S if self.timeout > 0 else None
        try:
            while True:
                self._collect()
                if nodeid in self.state.results:
                    return
                if self.proc.poll() is not None:
                    self.rc = self.proc.returncode
                    self._finish()
                    return
                if limit is not None and time.monotonic() - self.started_at > limit:
                    self.timed_out = True
                    self.proc.kill()
                    self.rc = self.proc.wait()
                    self._finish()
                    return
                time.sleep(_POLL_S)
        except BaseException:  # KeyboardInterrupt (the GPU script's step bound): say where the child was
            self.stop()
            running = [n for n in _read_records(self.records)[1] if n in self.ids]
            sys.stderr.write(f"\nisolated child process stopped while running {running[-1] if running else nodeid}; "
                             f"its output: {self.log}\n")
            raise

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        if not self.out.closed:
            self.out.close()


def _read_records(path: str) -> tuple[dict, list]:
    reports, started = {}, []
    try:
        with open(path, encoding="utf-8") as f:
            lines = f.read().splitlines()
    except OSError:
        return reports, started
    for line in lines:
        try:
            r = json.loads(line)
        except ValueError:  # a line cut by the child's death
            continue
        if r["event"] == "start":
            started.append(r["nodeid"])
        else:
            reports.setdefault(r["nodeid"], {})[r["when"]] = r
    return reports, started


def _batch_for(item, state: _State) -> list:
    if state.mode == "each":
        return [item]
    items = item.session.items
    if state.index is None:
        state.index = {it.nodeid: i for i, it in enumerate(items)}
    start = state.index.get(item.nodeid)
    if start is None:
        return [item]
    rest = [it for it in items[start + 1:]
            if it.path == item.path and it.nodeid not in state.results and _runs_in_child(it) and not would_skip(it)]
    return [item, *rest]


@pytest.hookimpl(tryfirst=True)
def pytest_pyfunc_call(pyfuncitem):
    config = pyfuncitem.config
    if not _runs_in_child(pyfuncitem):
        return None  # run here, as usual
    state = config.stash[_STATE]
    if pyfuncitem.nodeid not in state.results:
        child = state.child
        if child is None or pyfuncitem.nodeid not in child.ids or child.out.closed:
            if child is not None:
                child.stop()  # a batch whose remaining tests the parent no longer runs (deselected, -x)
            child = state.child = _Child(config, state, _batch_for(pyfuncitem, state))
        child.wait_for(pyfuncitem.nodeid)
        if pyfuncitem.nodeid not in state.results:  # the child ended before it: a new child for the rest
            child = state.child = _Child(config, state, _batch_for(pyfuncitem, state))
            child.wait_for(pyfuncitem.nodeid)
    result = state.results.pop(pyfuncitem.nodeid, None)
    if result is None:  # cannot happen: _run_child resolves the batch's first test at least
        result = _Result("failed", "the isolated child process did not report this test")
    for prop in result.properties:
        if prop not in pyfuncitem.user_properties:
            pyfuncitem.user_properties.append(prop)
    if result.outcome == "skipped":
        pytest.skip(result.text)
    if result.outcome == "failed":
        pytest.fail(result.text, pytrace=False)
    return True


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    state = config.stash.get(_STATE, None)
    if state is not None and state.children:
        terminalreporter.write_line(f"isolated: {len(state.tests_in_children)} test(s) ran in {state.children} "
                                    f"child process(es) (tests/_isolation.py, --isolation={state.mode})")
