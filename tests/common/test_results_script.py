"""scripts/write_results.py, the last step of the GPU run, on fabricated inputs: a GPU session
must not lose its numbers to a bug here, so it is checked on CPU in CI."""

from __future__ import annotations

import json
import os
import pathlib
import re
import subprocess
import sys

import jax_gpuext

ROOT = pathlib.Path(__file__).resolve().parents[2]


def _work_dirs(tmp_path):
    """gpu_run.sh's work directory (with this machine's `info --json`) and an empty results one."""
    work, out = tmp_path / "work", tmp_path / "results"
    work.mkdir()
    out.mkdir()
    info = subprocess.run([sys.executable, "-P", "-m", "jax_gpuext", "info", "--json"], capture_output=True,
                          text=True, check=True, cwd=tmp_path).stdout
    (work / "info.json").write_text(info)
    return work, out


def test_write_results_collects_benchmarks_probes_tests_and_plots(tmp_path):
    work, out = _work_dirs(tmp_path)
    (work / "bench_dot.json").write_text(json.dumps(
        {"benchmark": "bench_dot", "rows": [{"M": 8192, "bf16": 612.5, "cublaslt_fp8_blockwise": 901.25}],
         "notes": ["a note"]}))
    (work / "probe_cudnn.json").write_text(json.dumps(
        {"benchmark": "cudnn_probe", "rows": [{"formats": "MXFP8", "supported": False, "why_not": "sm_90"}]}))
    (work / "bench_broken.json").write_text("{not json")
    (work / "gpu-tests-main.xml").write_text(  # one junit file per pytest group of gpu_run.sh
        '<testsuites><testsuite tests="2" failures="1" errors="0" skipped="0">'
        '<testcase classname="t" name="a" time="0.5"/>'
        '<testcase classname="t" name="b" time="1"><failure message="AssertionError: max err 3.5">'
        'def test_b():\n&gt;       assert err &lt; 1e-3\nE       AssertionError: max err 3.5\nE       assert 3.5 &lt; 0.001\n\n'
        'tests/test_t.py:12: AssertionError</failure></testcase>'
        '</testsuite></testsuites>')
    (work / "gpu-tests-hopper_mx.xml").write_text(
        '<testsuite tests="1" failures="0" errors="0" skipped="1">'
        '<testcase classname="h" name="c" time="2"><skipped message="arch"/></testcase></testsuite>')
    (work / "bench_dot.png").write_bytes(b"\x89PNG fake")
    # a third group hung in a kernel and was killed before pytest could write its junit file
    (work / "test_exits.txt").write_text("main 1\nhopper_mx 0\nhung 137\n")
    (work / "gpu-tests-hung.txt").write_text("tests/test_h.py::test_ok PASSED\ntests/test_h.py::test_hangs ")
    # gpu_run.sh's exit statuses: bench_quantize died before writing JSON; its log is all we have
    (work / "bench_exits.txt").write_text("bench_dot 0\nbench_quantize 1\nprobe_cudnn 0\n")
    (work / "bench_quantize.txt").write_text("".join(f"line {i}\n" for i in range(40)) + "CUDA_ERROR_ILLEGAL_ADDRESS\n")
    (work / "sanitizer-memcheck-t.txt").write_text(
        "========= COMPUTE-SANITIZER\n========= Invalid __global__ write of size 4 bytes\n"
        "=========     at QuantizeStrided1d+0x70\n1 failed in 3.0s\n========= ERROR SUMMARY: 1 error\n")
    (work / "sanitizer-racecheck-t.txt").write_text(
        "========= COMPUTE-SANITIZER\n2 passed in 9.0s\n========= ERROR SUMMARY: 0 errors\n")
    subprocess.run([sys.executable, str(ROOT / "scripts" / "write_results.py"), "--work", str(work),
                    "--out-dir", str(out), "--tests-status", "1"], check=True,
                   env={"GPU_RUN_COMMIT": "abc123", "PATH": "/usr/bin:/bin"})
    (js,) = out.glob("*.json")
    result = json.loads(js.read_text())
    assert result["commit"] == "abc123"
    assert result["versions"]["jax"] and "cuda_extension" in result["versions"]
    t = result["gpu_tests"]
    assert (t["tests"], t["failures"], t["skipped"], t["exit_status"]) == (3, 1, 1, 1)
    assert [c["outcome"] for c in t["cases"]] == ["skipped", "passed", "failure"]
    skipped, _, failed = t["cases"]
    assert t["group_exits"] == {"main": 1, "hopper_mx": 0, "hung": 137}
    assert t["cut_short"] == [{"group": "hung", "exit_status": 137,
                               "log_tail": ["tests/test_h.py::test_ok PASSED", "tests/test_h.py::test_hangs"],
                               "verifies_collected": None}]  # no junit file: any component may have hung
    assert skipped["detail"] == "arch"
    assert "E       assert 3.5 < 0.001" in failed["detail"] and "tests/test_t.py:12: AssertionError" in failed["detail"]
    quantize = next(b for b in result["benchmarks"] if b["benchmark"] == "bench_quantize")
    assert quantize["exit_status"] == 1 and quantize["error"] == "wrote no results"
    assert quantize["log_tail"][-1] == "CUDA_ERROR_ILLEGAL_ADDRESS" and len(quantize["log_tail"]) == 25
    assert next(b for b in result["benchmarks"] if b["benchmark"] == "bench_dot")["exit_status"] == 0
    reports = result["sanitizer_reports"]  # the clean racecheck run is left out
    assert list(reports) == ["sanitizer-memcheck-t.txt"]
    assert "=========     at QuantizeStrided1d+0x70" in reports["sanitizer-memcheck-t.txt"]
    assert "1 failed in 3.0s" in reports["sanitizer-memcheck-t.txt"]
    names = [b["benchmark"] for b in result["benchmarks"]]
    assert "bench_dot" in names and "cudnn_probe" in names and "bench_broken" in names
    assert next(b for b in result["benchmarks"] if b["benchmark"] == "bench_broken")["error"].startswith(
        "bench_broken.json: ")
    assert result["plots"] == [js.stem + "-bench_dot.png"] and (out / result["plots"][0]).exists()
    md = js.with_suffix(".md").read_text()
    assert "901.2" in md and "612.5" in md and "sm_90" in md and "a note" in md
    assert f"![{result['plots'][0]}]" in md
    assert "Group `hung` was cut short (exit status 137)" in md
    assert "### Why they failed" in md and "E       AssertionError: max err 3.5" in md
    assert "exit status 1" in md and "CUDA_ERROR_ILLEGAL_ADDRESS" in md and "QuantizeStrided1d+0x70" in md
    assert jax_gpuext.__version__  # the package the info came from is importable here


def test_every_benchmark_takes_the_run_scripts_arguments(tmp_path):
    """gpu_run.sh calls each benchmarks/bench_*.py and probe_*.py with --out (and --quick); on a
    machine without a GPU each must refuse cleanly (exit 2 with a reason), not die in argparse."""
    # The CPU benchmarks (bench_cpu.py, bench_ragged_dot_cpu.py) measure for real here and run with
    # --quick in CI's own leg (.ci/bench_cpu.sh); gpu_run.sh never calls them.
    scripts = sorted(p for p in (ROOT / "benchmarks").glob("bench_*.py") if not p.stem.endswith("_cpu"))
    scripts += sorted((ROOT / "benchmarks").glob("probe_*.py"))
    assert len(scripts) >= 5 and all(f"{p.stem}" in (ROOT / "scripts" / "gpu_run.sh").read_text() for p in scripts)
    for script in scripts:
        r = subprocess.run([sys.executable, "-P", str(script), "--quick", "--out", str(tmp_path / "x.json")],
                           capture_output=True, text=True, cwd=tmp_path, timeout=120)
        assert "unrecognized arguments" not in r.stderr and "usage:" not in r.stderr, (script.name, r.stderr)
        if r.returncode != 0:  # no GPU here: a clean refusal that names what is missing
            assert r.returncode == 2 and "need" in r.stderr, (script.name, r.returncode, r.stderr[-500:])


def _sanitizer_targets() -> dict[str, str]:
    lines = (ROOT / "tests" / "sanitizer_targets.txt").read_text().splitlines()
    return dict(ln.split() for ln in lines if ln.strip() and not ln.startswith("#"))


def test_every_sanitizer_target_and_mps_step_names_collected_tests():
    """gpu_run.sh runs compute-sanitizer on the target tests/sanitizer_targets.txt names for each
    tool, and its all-reduce steps select test_gpu_processes_under_mps by parameter id; a typo there
    would spend scarce GPU minutes on a pytest usage error, so each must collect on CPU."""
    targets = _sanitizer_targets()
    assert set(targets) == {"memcheck", "racecheck", "memcheck:ragged", "memcheck:token_slots"}
    script = (ROOT / "scripts" / "gpu_run.sh").read_text()
    mps = {f"collectives/test_allreduce.py::test_gpu_processes_under_mps[{mode}-{n}]"
           for n, mode in re.findall(r"step_mps_test (\d) (\w+)", script)}
    assert len(mps) == 4, mps
    r = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider",
                        *(str(ROOT / "tests" / t) for t in [*targets.values(), *sorted(mps)])],
                       capture_output=True, text=True, cwd="/")  # as gpu_run.sh runs them: from /
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    assert r.stdout.count("::") == len(targets) + len(mps), r.stdout[-2000:]


# ------------------------------------------------------------------ scripts/gpu_run.sh on CPU
PART_1 = ["env", "install", "info", "tests_main", "tests_formats", "tests_hopper_mx", "bench_quantize", "bench_dot",
          "bench_hopper_mx", "probe_cudnn", "memcheck"]  # docs/design.md's order
PART_2 = ["env", "install", "info", "tests_ragged_hopper", "allreduce_2_plain", "allreduce_2_timeout",
          "allreduce_2_command_buffer", "bench_ragged_dot", "memcheck_ragged", "memcheck_token_slots", "bench_dot_full",
          "bench_quantize_full",
          "racecheck", "bench_allreduce", "allreduce_4_plain"]
RESERVE_S = 10  # gpu_run.sh's GPU_RUN_RESERVE_S default
PART_1_BUDGET = 480  # gpu_run.sh's DEFAULT_BUDGET for part 1

# Stands in for every step but env, install and info: records the step, its bound, the command and
# how many steps the results file already lists (the results must be rewritten after every step).
DRY_STUB = """#!/usr/bin/env python3
import glob, json, os, sys
files = glob.glob(os.path.join(os.environ["RESULTS_DIR"], "*.json"))
done = len(json.load(open(files[0]))["steps"]) if len(files) == 1 else -1
with open(os.environ["STUB_LOG"], "a") as f:
    f.write(json.dumps([os.environ["GPU_RUN_STEP"], int(os.environ["GPU_RUN_STEP_BOUND"]), done, sys.argv[1:]]) + "\\n")
"""


def _gpu_run(tmp_path, *args, dry: bool, extra_env=None, timeout=300):
    """gpu_run.sh with a stand-in nvidia-smi and JAX on CPU; its results JSON, the process, the file."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    smi = bin_dir / "nvidia-smi"
    smi.write_text('#!/bin/sh\necho "Stand-in GPU, 1.0, 1 MiB, 9.0"\n')
    smi.chmod(0o755)
    out = tmp_path / "results"
    env = os.environ | {"PATH": f"{bin_dir}:{os.environ['PATH']}", "PYTHON": sys.executable, "RESULTS_DIR": str(out),
                        "JAX_PLATFORMS": "cpu", "CUDA_VISIBLE_DEVICES": "", "GPU_RUN_SITE": str(tmp_path / "site")}
    env.pop("GPU_RUN_COMMIT", None)
    if dry:
        stub = tmp_path / "stub.py"
        stub.write_text(DRY_STUB)
        stub.chmod(0o755)
        env |= {"GPU_RUN_DRY_RUN": "1", "GPU_RUN_DRY_STUB": str(stub), "STUB_LOG": str(tmp_path / "stub.log")}
    env |= extra_env or {}
    r = subprocess.run(["bash", str(ROOT / "scripts" / "gpu_run.sh"), "--install", "installed", *args],
                       env=env, capture_output=True, text=True, timeout=timeout, cwd=tmp_path)
    files = list(out.glob("*-stand-in-gpu-part*.json"))
    assert len(files) == 1, (files, r.stdout[-3000:], r.stderr[-3000:])
    return json.loads(files[0].read_text()), r, files[0]


def _stub_calls(tmp_path) -> list:
    log = tmp_path / "stub.log"
    return [json.loads(ln) for ln in log.read_text().splitlines()] if log.exists() else []


def test_gpu_run_part_1_dry_run_order_bounds_and_results_after_every_step(tmp_path):
    """The whole first call on CPU, every GPU step stubbed and the clock advanced by each step's
    expected time: the steps run in the documented order, each under a bound that fits in what is
    left of the part's budget, the expected times fit the budget, and the results file is rewritten
    after every step (each stubbed step sees all earlier ones in it)."""
    result, r, path = _gpu_run(tmp_path, "--part", "1", dry=True)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    steps = result["steps"]
    assert [s["step"] for s in steps] == PART_1, r.stdout[-3000:]
    assert result["not_run"] == [] and result["part"] == 1 and path.name.endswith("-part1.json")
    for s in steps:
        assert s["exit_status"] == 0, s
        assert 20 <= s["bound_s"] <= PART_1_BUDGET - s["started_s"] - RESERVE_S, s  # inside what was left
        assert s["expected_s"] <= s["bound_s"], s
    # the expected times fit with a second per step to spare for writing the results and the sweep
    assert sum(s["expected_s"] for s in steps) + len(steps) <= PART_1_BUDGET - RESERVE_S
    calls = _stub_calls(tmp_path)
    assert [c[0] for c in calls] == PART_1[3:]
    for i, (name, bound, done, _) in enumerate(calls):
        assert done == 3 + i, (name, done)  # env, install, info and every stubbed step before it
        assert bound == next(s["bound_s"] for s in steps if s["step"] == name)
    argv = {c[0]: " ".join(c[3]) for c in calls}
    assert "step_sanitizer memcheck" in argv["memcheck"] and "test_formats_gpu.py" in argv["tests_formats"]
    assert "test_formats_gpu.py" in argv["tests_main"]  # ignored there: its own step
    assert "--quick" in argv["bench_dot"] and argv["bench_dot"].endswith(" _ ")  # hopper_mx passed (stub)
    # what the real steps recorded: the machine, the installed build and where the commit came from
    assert any("nvidia-cuda-mps-control" in ln for ln in result["environment"])
    assert any("/dev/shm" in ln for ln in result["environment"])
    assert result["commit_from"].startswith("the installed build") and result["versions"]["jax"]
    md = path.with_suffix(".md").read_text()
    assert "## Steps" in md and "memcheck" in md and "part 1" in md


def test_gpu_run_part_2_dry_run_skips_what_no_longer_fits(tmp_path):
    """A budget too small for the second call: the steps that no longer fit are not started and
    the results list them as not run; the rest keep the documented order."""
    budget = 170  # room for env, install, info and the grouped kernels' tests, not for the benchmarks
    result, r, _ = _gpu_run(tmp_path, "--part", "2", dry=True, extra_env={"GPU_RUN_BUDGET_S": str(budget)})
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    ran = [s["step"] for s in result["steps"]]
    assert ran == [s for s in PART_2 if s in ran] and ran[:4] == PART_2[:4]
    skipped = [ln.split()[0] for ln in result["not_run"]]
    assert skipped and sorted(ran + skipped) == sorted(PART_2), (ran, skipped)
    assert "bench_dot_full" in skipped and all("budget" in ln for ln in result["not_run"])
    for s in result["steps"]:
        assert s["bound_s"] <= budget - s["started_s"] - RESERVE_S, s


def test_gpu_run_real_steps_on_a_machine_without_a_gpu(tmp_path):
    """The real commands of a few steps (no stub): a benchmark and a probe refuse (exit 2, the
    reason in their log), the 2-rank MPS test is selected by its id and fails its GPU gate, the
    sanitizer step fails without compute-sanitizer; the results name each with its exit status
    and log, and the run's exit status is the failed test group's."""
    only = "env,allreduce_2_timeout,bench_ragged_dot,memcheck_ragged"  # the dry runs cover install, info
    result, r, _ = _gpu_run(tmp_path, "--part", "2", "--only", only, dry=False, extra_env={"GPU_RUN_COMMIT": "dry"})
    assert r.returncode != 0, r.stdout[-3000:]  # the GPU test failed (its gate is closed here)
    assert result["commit"] == "dry" and [s["step"] for s in result["steps"]] == only.split(",")
    steps = {b["benchmark"]: b for b in result["benchmarks"]}
    assert sorted(steps) == ["bench_ragged_dot"]
    for name, b in steps.items():
        assert b["exit_status"] == 2 and b["error"] == "wrote no results", (name, b)
        assert any("need" in line for line in b["log_tail"]), (name, b["log_tail"])
    t = result["gpu_tests"]
    assert t["group_exits"]["allreduce_2_timeout"] != 0
    (case,) = t["cases"]
    assert case["test"].endswith("test_gpu_processes_under_mps[timeout-2]") and case["outcome"] in ("failure", "error")
    memcheck = next(s for s in result["steps"] if s["step"] == "memcheck_ragged")
    assert memcheck["exit_status"] != 0 and "sanitizer-memcheck_ragged.txt" in result["sanitizer_reports"]
    assert "memcheck:ragged ragged_dot/test_ragged_dot_hopper.py::" in result["sanitizer"]


def _run_mps_script(tmp_path, stand_in: str | None):
    """run_allreduce_mps.sh with PATH holding the system tools and, optionally, a stand-in
    nvidia-cuda-mps-control; no rank ever starts on this machine."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    if stand_in is not None:
        tool = bin_dir / "nvidia-cuda-mps-control"
        tool.write_text("#!/bin/bash\n" + stand_in)
        tool.chmod(0o755)
    return subprocess.run(["bash", str(ROOT / "scripts" / "run_allreduce_mps.sh"), "2", "plain"],
                          capture_output=True, text=True, timeout=60,
                          env={"PATH": f"{bin_dir}:/usr/bin:/bin", "MPS_WAIT_S": "1", "PYTHON": sys.executable})


def test_mps_script_reports_the_environment_apart_from_code_failures(tmp_path):
    """No MPS control binary, or a daemon that never answers: exit status 3 and an ENVIRONMENT
    line, before any rank starts (issue 14 item 9)."""
    (tmp_path / "none").mkdir()
    r = _run_mps_script(tmp_path / "none", None)
    assert r.returncode == 3, r.stderr
    assert "ENVIRONMENT: nvidia-cuda-mps-control is not on PATH" in r.stderr
    (tmp_path / "mute").mkdir()
    r = _run_mps_script(tmp_path / "mute", 'if [ "$1" = -d ]; then exit 0; fi\nexit 1\n')
    assert r.returncode == 3, r.stderr
    assert "ENVIRONMENT: the MPS control daemon does not answer" in r.stderr
    assert "RANK" not in r.stdout


def test_write_results_lists_environment_failures_apart(tmp_path):
    work, out = _work_dirs(tmp_path)
    (work / "gpu-tests-main.xml").write_text(
        '<testsuite tests="2" failures="2" errors="0" skipped="0">'
        '<testcase classname="t" name="mps" time="1"><failure message="Failed: ENVIRONMENT: no MPS">'
        "E       Failed: ENVIRONMENT: this machine cannot run 2 ranks under MPS: ['ENVIRONMENT: no MPS']\n"
        "tests/collectives/test_allreduce.py:266: Failed</failure></testcase>"
        '<testcase classname="t" name="code" time="1"><failure message="AssertionError">'
        "E       AssertionError: wrong sum\ntests/test_allreduce.py:12: AssertionError</failure></testcase>"
        "</testsuite>")
    (work / "test_exits.txt").write_text("main 1\n")
    (work / "bench_exits.txt").write_text("bench_allreduce 3\n")
    (work / "bench_allreduce.txt").write_text("starting\nENVIRONMENT: nvidia-cuda-mps-control is not on PATH\n")
    subprocess.run([sys.executable, str(ROOT / "scripts" / "write_results.py"), "--work", str(work),
                    "--out-dir", str(out), "--tests-status", "1"], check=True, env={"PATH": "/usr/bin:/bin"})
    (js,) = out.glob("*.json")
    result = json.loads(js.read_text())
    mps, code = result["gpu_tests"]["cases"]
    assert mps["cause"] == "environment" and "cause" not in code
    (bench,) = result["benchmarks"]
    assert bench["cause"] == "environment" and "not on PATH" in bench["error"]
    md = js.with_suffix(".md").read_text()
    env_at, code_at = md.index("### Failed for an environment reason"), md.index("### Why they failed")
    assert md.index("`t::code`", code_at) < env_at < md.index("`t::mps`", env_at)


def test_feature_markers_reach_the_results_and_the_record(tmp_path):
    """Issue 33: the tests' `verifies(..., feature=)` markers go through the junit file (conftest),
    write_results.py and the record, as on the GPU machine: pytest runs real GPU tests (skipped
    here, closed gates), their outcomes are then set as the H200 run had them (the per-tensor
    batched layouts failing), and FP8 blockwise stays verified."""
    import xml.etree.ElementTree as ET

    from jax_gpuext.common import verified

    work, out = _work_dirs(tmp_path)
    info = json.loads((work / "info.json").read_text())
    info["extensions"]["cuda"] = {"source_fingerprints": {"scheme": verified.FINGERPRINT_SCHEME,
                                                          **{c: "a" * 16 for c in verified.COMPONENTS}}}
    (work / "info.json").write_text(json.dumps(info))
    junit = work / "gpu-tests-main.xml"
    r = subprocess.run([sys.executable, "-m", "pytest", str(ROOT / "tests" / "dot" / "test_block_scaled_dot.py"), "-q",
                        "-p", "no:cacheprovider", f"--junitxml={junit}", "-k",
                        "test_gpu_per_tensor_batched_and_vmapped or test_gpu_cublaslt_fp8_blockwise_ragged_and_batched"],
                       capture_output=True, text=True, cwd="/")
    assert r.returncode == 0 and junit.exists(), r.stdout[-2000:] + r.stderr[-2000:]
    tree = ET.parse(junit)
    for case in tree.getroot().iter("testcase"):
        case.remove(case.find("skipped"))
        if "batched-" in case.get("name"):  # the two batched layouts fail, the vmapped one passes
            ET.SubElement(case, "failure", message="CUBLAS_STATUS_NOT_SUPPORTED").text = "E   CUBLAS_STATUS_NOT_SUPPORTED"
    tree.write(junit)
    (work / "test_exits.txt").write_text("main 1\n")
    subprocess.run([sys.executable, str(ROOT / "scripts" / "write_results.py"), "--work", str(work),
                    "--out-dir", str(out), "--tests-status", "1"], check=True, env={"PATH": "/usr/bin:/bin"})
    (js,) = out.glob("*.json")
    result = json.loads(js.read_text())
    features = {c["test"].split("::")[1]: c["features"] for c in result["gpu_tests"]["cases"]}
    assert features["test_gpu_per_tensor_batched_and_vmapped[vmapped]"] == {"block_scaled_dot.cublaslt": "per_tensor"}
    assert features["test_gpu_cublaslt_fp8_blockwise_ragged_and_batched[1x128]"] == {
        "block_scaled_dot.cublaslt": "fp8_blockwise"}
    result["device"]["compute_cap"] = "9.0"  # no nvidia-smi here
    (entry,) = verified.build_record({"r.json": result})["entries"]
    verdicts = {f: (t["passed"], t["failed"], t["verified"]) for f, t in entry["features"].items()}
    assert verdicts == {"fp8_blockwise": (2, 0, True), "per_tensor": (1, 0, True), "per_tensor_batched": (0, 2, False)}
    md = js.with_suffix(".md").read_text()
    assert "| block_scaled_dot.cublaslt | per_tensor_batched | 0 | 2 |" in md
