"""The ``isolated`` marker (tests/_isolation.py) on the CPU: a throw-away pytest project whose
tests pass, abort the process, fail, skip inside and skip by marker, run by a child pytest; its
junit file and a log of which process ran each test say what the mechanism did. No JAX here: the
children start in a fraction of a second."""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys
import textwrap
import xml.etree.ElementTree as ET

import pytest

TESTS = pathlib.Path(__file__).resolve().parents[1]

CONFTEST = f"""
import sys
sys.path.insert(0, {str(TESTS)!r})
pytest_plugins = ["_isolation"]


def pytest_collection_modifyitems(items):
    for item in items:  # as tests/conftest.py adds `verifies` at collection
        item.user_properties.append(("verifies", "demo." + item.name))
"""

TESTS_PY = """
import os
import pathlib

import pytest

pytestmark = pytest.mark.isolated(only="dev")
LOG = pathlib.Path(__file__).with_name("ran.log")


def _ran(name):
    with open(LOG, "a") as f:
        f.write(f"{name} {os.getpid()}\\n")


@pytest.mark.dev
def test_a_passes():
    _ran("a")


@pytest.mark.dev
def test_b_aborts():
    _ran("b")
    import resource
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))  # no core file
    os.abort()  # as a process that a fatal device error takes down


@pytest.mark.dev
def test_c_passes_after_the_crash(record_property):
    _ran("c")
    record_property("child_says", "hello")


@pytest.mark.dev
def test_d_fails():
    _ran("d")
    assert 1 == 2, "d is wrong"


@pytest.mark.dev
def test_e_skips_inside():
    _ran("e")
    pytest.skip("no device here")


@pytest.mark.dev
@pytest.mark.skip(reason="gate closed")
def test_f_marked_skip():
    _ran("f")


def test_g_not_dev_runs_in_the_parent():
    _ran("g")


@pytest.mark.dev
def test_h_last():
    _ran("h")
"""


def _run(tmp_path, *args):
    project = tmp_path / "project"
    project.mkdir()
    (project / "pytest.ini").write_text("[pytest]\nmarkers =\n    dev: a stand-in for gpu\n")
    (project / "conftest.py").write_text(textwrap.dedent(CONFTEST))
    (project / "test_demo.py").write_text(textwrap.dedent(TESTS_PY))
    junit = tmp_path / "junit.xml"
    # No entry-point plugins (hypothesis's alone takes a second a process); the children inherit it.
    env = {**os.environ, "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"}
    cmd = [sys.executable, "-P", "-m", "pytest", "-p", "no:cacheprovider", "-q", f"--junitxml={junit}", *args,
           str(project)]
    p = subprocess.Popen(cmd, cwd=project, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    out, _ = p.communicate(timeout=300)
    cases = {}
    for case in ET.parse(junit).getroot().iter("testcase"):
        outcome = [c for c in case if c.tag in ("failure", "error", "skipped")]
        kind = outcome[0].tag if outcome else "passed"
        detail = outcome[0].get("message", "") + (outcome[0].text or "") if outcome else ""
        props = {(q.get("name"), q.get("value")) for q in case.iter("property")}
        cases[case.get("name")[5]] = (kind, detail, props)  # test_X_... -> "X"
    log = project / "ran.log"
    ran = {}
    for line in (log.read_text().splitlines() if log.exists() else []):
        name, pid = line.split()
        ran[name] = int(pid)
    return p.pid, out, cases, ran


def test_batch_mode_fails_only_the_crashed_test_and_restarts(tmp_path):
    parent, out, cases, ran = _run(tmp_path)
    assert {k: v[0] for k, v in cases.items()} == {
        "a": "passed", "b": "failure", "c": "passed", "d": "failure", "e": "skipped", "f": "skipped",
        "g": "passed", "h": "passed"}, out
    assert "SIGABRT" in cases["b"][1] and "while running this test" in cases["b"][1]
    assert "d is wrong" in cases["d"][1] and "no device here" in cases["e"][1] and "gate closed" in cases["f"][1]
    # junit keeps the parent's collection-time properties and gains the child's own
    assert ("verifies", "demo.test_c_passes_after_the_crash") in cases["c"][2]
    assert ("child_says", "hello") in cases["c"][2]
    assert ("verifies", "demo.test_b_aborts") in cases["b"][2]
    # a and b shared a child; the crash and the failure each ended one, e and h shared the last
    assert "f" not in ran and ran["g"] == parent
    assert ran["a"] == ran["b"] != parent
    assert ran["c"] == ran["d"] not in (ran["b"], parent)
    assert ran["e"] == ran["h"] not in (ran["d"], ran["b"], parent)
    assert "isolated: 6 test(s) ran in 3 child process(es)" in out


def test_each_mode_gives_every_test_its_own_process(tmp_path):
    parent, out, cases, ran = _run(tmp_path, "--isolation=each", "-k", "a_passes or c_passes or d_fails or g_not")
    assert {k: v[0] for k, v in cases.items()} == {"a": "passed", "c": "passed", "d": "failure", "g": "passed"}, out
    pids = [ran[k] for k in "acd"]
    assert len(set(pids)) == 3 and parent not in pids and ran["g"] == parent


def test_skipped_tests_start_no_child(tmp_path):
    parent, out, cases, ran = _run(tmp_path, "-k", "f_marked or g_not")
    assert cases["f"][0] == "skipped" and cases["g"][0] == "passed", out
    assert ran == {"g": parent} and "child process" not in out


def test_off_mode_runs_in_process(tmp_path):
    parent, out, cases, ran = _run(tmp_path, "--isolation=off", "-k", "a_passes or c_passes")
    assert cases["a"][0] == "passed" and cases["c"][0] == "passed", out
    assert ran == {"a": parent, "c": parent}


SLOW_PY = """
import pathlib
import time

import pytest

pytestmark = pytest.mark.isolated
STARTED = pathlib.Path(__file__).with_name("started.txt")


def test_1_quick():
    pass


def test_2_quick():
    pass


def test_3_never_ends():
    STARTED.write_text("3")
    time.sleep(600)


def test_4_after():
    pass
"""


def test_a_parent_stopped_mid_batch_has_reported_what_the_child_finished(tmp_path):
    """The GPU script's step bound interrupts pytest (SIGINT) while a batch's child runs: the tests
    the child had finished are in the parent's junit file already (the H200 run of 3ff9b82 lost a
    whole 35-test batch that way), and the child is not left behind."""
    import signal
    import threading
    import time

    project = tmp_path / "project"
    project.mkdir()
    (project / "conftest.py").write_text(textwrap.dedent(CONFTEST))
    (project / "test_slow.py").write_text(textwrap.dedent(SLOW_PY))
    junit = tmp_path / "junit.xml"
    # faulthandler: should the parent outlive its SIGINT, the SIGABRT below prints where each of its
    # threads is, which the failure then shows.
    env = {**os.environ, "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1", "PYTHONFAULTHANDLER": "1"}
    pytest_argv = [sys.executable, "-P", "-m", "pytest", "-p", "no:cacheprovider", "-q", f"--junitxml={junit}",
                   str(project)]
    # The parent starts with SIGINT at its default, as under the GPU script's `timeout` (which catches
    # SIGINT itself, so exec gives its child the default). A shell's background job ignores SIGINT,
    # and CI runs every step as one: that SIG_IGN is inherited, and Python then installs no
    # KeyboardInterrupt handler, so the parent would never see the signal this test sends.
    restore = "import os, signal, sys; signal.signal(signal.SIGINT, signal.SIG_DFL); os.execv(sys.argv[1], sys.argv[1:])"
    cmd = [sys.executable, "-c", restore, *pytest_argv]
    p = subprocess.Popen(cmd, cwd=project, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    chars: list[str] = []
    reader = threading.Thread(target=lambda: chars.extend(iter(lambda: p.stdout.read(1), "")), daemon=True)
    reader.start()
    # The signal comes once the child runs test 3 and the parent has printed the two quick tests'
    # passes: on a loaded machine the parent may lag its child by seconds, and what this test asks
    # is that what the parent had to report is in the junit file, not a race with its polling.
    deadline = time.monotonic() + 120
    while not ((project / "started.txt").exists() and "".join(chars).count(".") >= 2) and time.monotonic() < deadline:
        time.sleep(0.1)
    signalled_after = 120 - (deadline - time.monotonic())
    p.send_signal(signal.SIGINT)
    try:
        p.wait(timeout=60)
    except subprocess.TimeoutExpired:
        p.send_signal(signal.SIGABRT)  # faulthandler prints every thread's stack, then the process ends
        try:
            p.wait(timeout=20)
        except subprocess.TimeoutExpired:
            p.kill()
        reader.join(timeout=10)
        child = subprocess.run(["pgrep", "-af", str(project / "test_slow.py")], capture_output=True, text=True).stdout
        pytest.fail(f"the parent, sent SIGINT {signalled_after:.1f} s after its start (started.txt: "
                    f"{(project / 'started.txt').exists()}), was still running 60 s later; its processes "
                    f"left:\n{child}\nits output (with the stacks faulthandler printed on SIGABRT):\n{''.join(chars)}")
    reader.join(timeout=60)
    out = "".join(chars)
    cases = {c.get("name"): [x.tag for x in c if x.tag in ("failure", "error", "skipped")]
             for c in ET.parse(junit).getroot().iter("testcase")}
    assert cases.get("test_1_quick") == [] and cases.get("test_2_quick") == [], (cases, out)
    assert "test_4_after" not in cases or cases["test_4_after"], cases
    assert "KeyboardInterrupt" in out, out
    leftovers = subprocess.run(["pgrep", "-f", str(project / "test_slow.py")], capture_output=True, text=True).stdout
    assert not leftovers.strip(), leftovers
