"""Environment variables (issue 26, finding 12): one table (jax_gpuext.common.env), strict parsing,
every reader going through it, and docs/environment.md holding exactly the table."""

from __future__ import annotations

import importlib
import pathlib
import re

import pytest

from jax_gpuext.common import env

REPO = pathlib.Path(__file__).resolve().parents[2]
# CMake variables that share the prefix but are not environment variables (set with -D / in CMake).
CMAKE_ONLY = {"JAX_GPUEXT_FFI_INCLUDE_DIR", "JAX_GPUEXT_EXPORTS"}
NAME = re.compile(r"JAX_GPUEXT_[A-Z0-9_]*[A-Z0-9]")

VALID = {
    "bool": [("1", True), ("true", True), ("TRUE", True), (" yes ", True), ("On", True),
             ("0", False), ("false", False), ("False", False), ("no", False), ("OFF", False)],
    "float": [("30", 30.0), ("0.5", 0.5), ("1e-3", 1e-3), ("1E6", 1e6), ("+2.5", 2.5)],
    "int": [("1", 1), ("4096", 4096), ("+8", 8)],
}
INVALID = {
    "bool": ["maybe", "2", "-1", "y", "n", "truee", "1.0", "enable"],
    "float": ["abc", "nan", "NaN", "inf", "-inf", "-1", "0", "1e-46", "1e7", "0x10", "1_000", "30s", "true",
              "9" * 401, "9" * 5000],
    # 401 and 5,000 digits (issue 34): never Python's OverflowError or its int digit-limit error
    "int": ["abc", "1.5", "1e3", "-1", "0x10", "nan", "99999999999999999999999", "4096 bytes", "9" * 401, "9" * 5000],
    "choice": ["short", "LONGER", "1"],
    "names": ["a,,b", "bad name", "dequantize;rm", ","],
}


def _cases(table):
    for v in env.VARIABLES.values():
        for case in table.get(v.kind, []):
            value = case[0] if isinstance(case, tuple) else case
            if v.kind in ("float", "int") and isinstance(case, tuple) and not (v.minimum <= case[1] <= v.maximum):
                continue
            shown = value if len(value) <= 30 else f"{value[:8]}...({len(value)} chars)"
            yield pytest.param(v.name, case, id=f"{v.name}={shown!r}")


@pytest.mark.parametrize("name,case", list(_cases(VALID)))
def test_documented_spellings_parse(name, case):
    text, want = case
    assert env.get(name, {name: text}) == want


@pytest.mark.parametrize("name,text", list(_cases(INVALID)))
def test_other_spellings_are_refused_naming_the_variable(name, text):
    with pytest.raises(env.EnvironmentVariableError) as e:
        env.get(name, {name: text})
    msg = str(e.value)
    # a long value is shown by its first 40 characters and its length
    assert name in msg and (repr(text) in msg or (text[:40] in msg and str(len(text)) in msg)) and "expected" in msg
    assert isinstance(e.value, ValueError)


def test_unset_and_empty_give_the_default():
    for v in env.VARIABLES.values():
        assert env.get(v.name, {}) == v.default
        assert env.get(v.name, {v.name: ""}) == v.default
        assert env.get(v.name, {v.name: "   "}) == v.default


def test_choice_names_and_text():
    assert env.get("JAX_GPUEXT_FUZZ", {"JAX_GPUEXT_FUZZ": "LONG"}) == "long"
    assert env.get("JAX_GPUEXT_FORCE_REFERENCE", {"JAX_GPUEXT_FORCE_REFERENCE": "quantize, dequantize"}) == (
        "quantize", "dequantize")
    assert env.get("JAX_GPUEXT_CACHE_DIR", {"JAX_GPUEXT_CACHE_DIR": "/tmp/x y"}) == "/tmp/x y"
    with pytest.raises(KeyError, match="not a variable"):
        env.get("JAX_GPUEXT_" + "NO_SUCH_THING")


def test_defaults_agree_with_the_readers():
    all_reduce = importlib.import_module("jax_gpuext.collectives.all_reduce")
    distributed = importlib.import_module("jax_gpuext.collectives.distributed")
    assert env.variable(all_reduce.TIMEOUT_ENV).default == all_reduce.DEFAULT_TIMEOUT_S
    lo, hi = all_reduce.TIMEOUT_RANGE_S
    assert (env.variable(all_reduce.TIMEOUT_ENV).minimum, env.variable(all_reduce.TIMEOUT_ENV).maximum) == (lo, hi)
    assert f"{all_reduce.DEFAULT_CPU_WORKSPACE_BYTES} on CPU" in env.variable(all_reduce.WORKSPACE_ENV).default_text
    assert f"{distributed.DEFAULT_GPU_WORKSPACE_BYTES} on CUDA" in env.variable(all_reduce.WORKSPACE_ENV).default_text


def test_the_issue_examples(monkeypatch):
    """The values issue 26 reported: each is refused by name, or means what it says."""
    from jax_gpuext.common import verified

    monkeypatch.setenv("JAX_GPUEXT_ALLOW_UNVERIFIED", "false")
    assert verified.allow_unverified() is False  # counted as set before
    monkeypatch.setenv("JAX_GPUEXT_ALLOW_UNVERIFIED", "maybe")
    with pytest.raises(ValueError, match="JAX_GPUEXT_ALLOW_UNVERIFIED='maybe'"):
        verified.allow_unverified()
    all_reduce = importlib.import_module("jax_gpuext.collectives.all_reduce")
    for bad in ("abc", "nan", "-1"):  # a bare float() error, then "got None"
        monkeypatch.setenv(all_reduce.TIMEOUT_ENV, bad)
        with pytest.raises(ValueError, match=f"JAX_GPUEXT_ALLREDUCE_TIMEOUT_S={bad!r}"):
            all_reduce._default_timeout()
    monkeypatch.setenv(all_reduce.WORKSPACE_ENV, "1MiB")  # a bare int() error
    with pytest.raises(ValueError, match="JAX_GPUEXT_ALLREDUCE_WORKSPACE_BYTES='1MiB'"):
        all_reduce._workspace_bytes("cpu")


def _sources():
    for top in ("jax_gpuext", "tests", "scripts", "benchmarks", "build_backend", "docs", ".ci", "cmake"):
        for path in (REPO / top).rglob("*"):
            if path.is_file() and path.suffix in (".py", ".sh", ".md", ".cmake", ".txt", ".toml", ".cc", ".h") \
                    and "_build" not in path.parts:
                yield path
    for name in ("CMakeLists.txt", "pyproject.toml", "README.md"):
        yield REPO / name


def test_every_variable_in_the_repository_is_in_the_table():
    known = set(env.VARIABLES) | set(env.BUILD) | CMAKE_ONLY
    found = {}
    for path in _sources():
        for name in NAME.findall(path.read_text(errors="replace")):
            found.setdefault(name, path.relative_to(REPO))
    unknown = {n: str(p) for n, p in found.items() if n not in known}
    assert not unknown, f"JAX_GPUEXT_* names missing from jax_gpuext/common/env.py: {unknown}"


def test_only_env_reads_the_variables():
    """No module reads a JAX_GPUEXT_* variable from os.environ itself (writing one is fine)."""
    read = re.compile(r"(os\.environ\.get|os\.getenv|environ\.get)\(\s*[\"']JAX_GPUEXT_|"
                      r"os\.environ\[[\"']JAX_GPUEXT_\w+[\"']\](?!\s*=)")
    offenders = []
    for path in _sources():
        if path.suffix != ".py" or path.name == "env.py":
            continue
        for i, line in enumerate(path.read_text().splitlines(), 1):
            if read.search(line):
                offenders.append(f"{path.relative_to(REPO)}:{i}: {line.strip()}")
    assert not offenders, "read these through jax_gpuext.common.env:\n" + "\n".join(offenders)


def test_each_reader_named_in_the_table_reads_the_variable():
    for v in env.VARIABLES.values():
        for reader in v.reader.split(", "):
            assert v.name in (REPO / reader).read_text(), f"{reader} does not read {v.name}"


def test_docs_page_holds_exactly_the_table():
    text = (REPO / "docs" / "environment.md").read_text()
    for scope in ("runtime", "tests", "build"):
        marker = f"<!-- env-table: {scope} -->\n"
        assert marker in text, f"docs/environment.md lacks the {scope} table"
        table = text.split(marker, 1)[1].split("\n\n", 1)[0].strip()
        assert table == env.markdown_table(scope), (
            f"docs/environment.md's {scope} table differs from jax_gpuext.common.env; regenerate it with "
            f"jax_gpuext.common.env.markdown_table({scope!r})")
