"""Every ``JAX_GPUEXT_*`` environment variable, in one table, parsed strictly.

The package and its test suite read these variables only through :func:`get` (a test checks that
no other module reads ``os.environ`` for a ``JAX_GPUEXT_*`` name). Each value is parsed when it is
used, so a variable set after import takes effect, and a bad value is a
:class:`EnvironmentVariableError` (a ``ValueError``) naming the variable, the value and what it
accepts, never a bare ``float()`` / ``int()`` error and never a value quietly taken as something
else (``JAX_GPUEXT_ALLOW_UNVERIFIED=false`` used to count as set).

Spellings: booleans accept exactly ``1 true yes on`` and ``0 false no off`` (any case, surrounding
whitespace ignored); numbers are decimal literals within the variable's range (``nan``, ``inf`` and
anything out of range are refused). An empty value counts as unset.

``BUILD`` lists the variables the build reads (CMake and the build backend, through pyproject.toml),
so that docs/environment.md, which a test checks against this module, names every variable in one
place; they are parsed there, not here.

Imports nothing but the standard library, so any module of the package (and the tests) may use it.
"""

from __future__ import annotations

import dataclasses
import math
import os
import re
from typing import Any, Mapping

TRUE_SPELLINGS = ("1", "true", "yes", "on")
FALSE_SPELLINGS = ("0", "false", "no", "off")


class EnvironmentVariableError(ValueError):
    """A ``JAX_GPUEXT_*`` variable holds a value outside its documented spellings or range."""

    def __init__(self, name: str, value: str, expected: str):
        shown = value if len(value) <= 60 else f"{value[:40]}... ({len(value)} characters)"
        super().__init__(f"environment variable {name}={shown!r} is not valid: expected {expected}")
        self.name, self.value, self.expected = name, value, expected


@dataclasses.dataclass(frozen=True)
class Variable:
    """One variable. ``kind``: "bool", "float", "int", "str" (free text, e.g. a path), "choice"
    (one of ``choices``) or "names" (a comma-separated list of identifiers). Numbers lie in
    [``minimum``, ``maximum``]. ``default`` is what :func:`get` returns when the variable is unset
    (``None``: the reader has its own default, described in ``default_text``). ``reader``: the
    files that read it, from the repository root (a test checks that each names it); ``scope``:
    "runtime" (the package) or "tests" (the test suite)."""

    name: str
    kind: str
    default: Any
    meaning: str
    reader: str
    scope: str = "runtime"
    minimum: float | None = None
    maximum: float | None = None
    choices: tuple[str, ...] = ()
    default_text: str | None = None

    def expected(self) -> str:
        """The accepted values, as error messages and the docs say them."""
        if self.kind == "bool":
            return "a boolean: " + "/".join(TRUE_SPELLINGS) + " or " + "/".join(FALSE_SPELLINGS) + " (any case)"
        if self.kind in ("float", "int"):
            what = "an integer" if self.kind == "int" else "a finite number"
            return f"{what} in [{self.minimum}, {self.maximum}]"
        if self.kind == "choice":
            return "one of " + ", ".join(repr(c) for c in self.choices)
        if self.kind == "names":
            return "a comma-separated list of names (letters, digits, _)"
        return "any text"

    def describe_default(self) -> str:
        if self.default_text is not None:
            return self.default_text
        if self.kind == "bool":
            return "1" if self.default else "0"
        return "unset" if self.default is None else str(self.default)


_V = Variable
VARIABLES: dict[str, Variable] = {v.name: v for v in (
    _V("JAX_GPUEXT_ALLOW_UNVERIFIED", "bool", False,
       "let `auto` choose GPU backends that the verification record (verified.json) does not list for "
       "this GPU and build", "jax_gpuext/common/verified.py"),
    _V("JAX_GPUEXT_FORCE_REFERENCE", "names", (),
       "ops whose pure-jnp reference backend runs whatever is asked for (`all` for every op); for bisecting",
       "jax_gpuext/common/backends.py", default_text="unset (none)"),
    _V("JAX_GPUEXT_ALLREDUCE_TIMEOUT_S", "float", 30.0,
       "seconds an all_reduce waits for its peers before failing with the missing ones named "
       "(the default of `all_reduce(timeout_s=None)`)", "jax_gpuext/collectives/all_reduce.py",
       minimum=1e-3, maximum=1e6),
    _V("JAX_GPUEXT_ALLREDUCE_WORKSPACE_BYTES", "int", None,
       "all_reduce workspace per rank: on CPU per call site, on CUDA the symmetric workspace that "
       "`distributed.initialize` allocates (at least 4096 there)",
       "jax_gpuext/collectives/all_reduce.py, jax_gpuext/collectives/distributed.py",
       minimum=1, maximum=1 << 32, default_text="1048576 on CPU, 33554432 on CUDA"),
    _V("JAX_GPUEXT_ALLREDUCE_ONE_SHOT_MAX_BYTES", "int", None,
       "largest message for which `auto` picks one_shot over two_shot on CUDA",
       "jax_gpuext/collectives/all_reduce.py",
       minimum=0, maximum=1 << 40, default_text="the alpha-beta model (docs/allreduce_model.md)"),
    _V("JAX_GPUEXT_ALLREDUCE_GRAPH_SAFE", "bool", False,
       "lower the CUDA all-reduce to the command-buffer compatible target (timeouts reported by "
       "`distributed.check_status()`)",
       "jax_gpuext/collectives/all_reduce.py, jax_gpuext/common/verified.py, scripts/allreduce_mps_worker.py"),
    _V("JAX_GPUEXT_MEMORY_SHIELD", "bool", True,
       "wrap memory-space annotated calls in optimization barriers (the openxla/xla#47461 workaround); "
       "0 lowers without them, for bisecting", "jax_gpuext/memory/spaces.py"),
    _V("JAX_GPUEXT_NVSHMEM_FINALIZE", "bool", True,
       "free the NVSHMEM workspace and finalize NVSHMEM at exit (both collective)",
       "jax_gpuext/collectives/distributed.py"),
    _V("JAX_GPUEXT_HOPPER_MX_AUTOTUNE", "bool", False,
       "tune hopper_mx tile configurations missing from the cache at trace time", "jax_gpuext/dot/hopper_mx.py"),
    _V("JAX_GPUEXT_CACHE_DIR", "str", None, "directory of the hopper_mx autotune cache",
       "jax_gpuext/dot/hopper_mx.py",
       default_text="~/.cache/jax_gpuext"),
    _V("JAX_GPUEXT_REQUIRE_GPU", "bool", False,
       "a test skipped for a closed GPU gate fails instead (the GPU run sets it)", "tests/conftest.py",
       scope="tests"),
    _V("JAX_GPUEXT_MPS_TEST_TIMEOUT_S", "float", 600.0,
       "bound of each multi-process GPU all-reduce test (scripts/gpu_run.sh derives it from its step's bound)",
       "tests/collectives/test_allreduce.py", scope="tests", minimum=30.0, maximum=86400.0),
    _V("JAX_GPUEXT_FUZZ", "choice", "ci", "fuzz suite mode: `ci` (small fixed-seed budget) or `long` (50x the "
       "cases, a fresh seed, shrinking)", "tests/fuzz/_budget.py", scope="tests", choices=("ci", "long")),
    _V("JAX_GPUEXT_FUZZ_EXAMPLES", "int", None, "fuzz cases per area, in either mode", "tests/fuzz/_budget.py",
       scope="tests", minimum=1, maximum=10_000_000, default_text="each area's own budget"),
    _V("JAX_GPUEXT_FUZZ_SEED", "int", None, "seed of a long fuzz campaign (replays one)", "tests/fuzz/_budget.py",
       scope="tests", minimum=0, maximum=(1 << 32) - 1, default_text="random, printed in the summary"),
    _V("JAX_GPUEXT_FUZZ_KEEP_GOING", "str", None,
       "file to which every failing fuzz case is appended instead of stopping at an area's first failure",
       "tests/fuzz/_budget.py", scope="tests"),
    _V("JAX_GPUEXT_PEER_SUITE", "choice", "ci", "jax's block-scaled tests ported as our peer suite: `ci` (a subset "
       "covering every dtype and layout) or `full` (jax's whole grid)", "tests/dot/test_jax_parity.py",
       scope="tests", choices=("ci", "full")),
)}
del _V

# Read by the build (CMakeLists.txt through pyproject.toml's [tool.scikit-build.cmake.define], and
# build_backend/), never by the installed package: listed for the docs only.
BUILD: dict[str, str] = {
    "JAX_GPUEXT_CUDA": "AUTO, ON or OFF: build the CUDA extension (AUTO: where a CUDA compiler is found)",
    "JAX_GPUEXT_CUDA_ARCHITECTURES": "CUDA architectures to build for (e.g. 90a-real); empty: every supported one",
    "JAX_GPUEXT_NVSHMEM": "AUTO, ON or OFF: build the NVSHMEM all-reduce module `_nvshmem`",
    "JAX_GPUEXT_NVSHMEM_HOME": "NVSHMEM installation to build `_nvshmem` against (empty: the pip wheel)",
    "JAX_GPUEXT_CUBLASLT_INCLUDE_DIR": "directory of cublasLt.h (empty: the CUDA toolkit, then the pip wheels)",
    "JAX_GPUEXT_CUDNN": "AUTO, ON or OFF: build the cuDNN block-scaled dot",
    "JAX_GPUEXT_CUDNN_INCLUDE_DIRS": "include directories of cudnn-frontend, cudnn.h and nvrtc.h",
    "JAX_GPUEXT_SANITIZE": "-fsanitize= list for the CPU extension (.ci/sanitizers.sh)",
    "JAX_GPUEXT_CPU_AVX512": "ON or OFF: the AVX-512 clone of the CPU format kernels",
    "JAX_GPUEXT_CPU_MULTIVERSION": "ON or OFF: CPU kernel clones per ISA level (OFF: the baseline alone)",
}

_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
# ASCII digits only: Python's \d and int() also take other scripts' digits ("١" is 1).
_NUMBER = re.compile(r"[+-]?([0-9]+(\.[0-9]*)?|\.[0-9]+)([eE][+-]?[0-9]+)?\Z")
_INTEGER = re.compile(r"[+-]?[0-9]+\Z")


def variable(name: str) -> Variable:
    try:
        return VARIABLES[name]
    except KeyError:
        raise KeyError(f"{name} is not a variable of jax_gpuext.common.env (add it to VARIABLES)") from None


def raw(name: str, environ: Mapping[str, str] | None = None) -> str | None:
    """The variable's text, or None when it is unset or empty."""
    variable(name)
    value = (os.environ if environ is None else environ).get(name)
    return value if value is not None and value.strip() != "" else None


def is_set(name: str, environ: Mapping[str, str] | None = None) -> bool:
    return raw(name, environ) is not None


def get(name: str, environ: Mapping[str, str] | None = None):
    """The parsed value of ``name`` (its default when unset or empty); raises
    :class:`EnvironmentVariableError` for a value outside its spellings or range."""
    var = variable(name)
    text = raw(name, environ)
    return var.default if text is None else parse(var, text)


def parse(var: Variable, text: str):
    """``text`` as ``var`` reads it (the rules in the module docstring)."""
    s = text.strip()
    if var.kind == "bool":
        if s.lower() in TRUE_SPELLINGS:
            return True
        if s.lower() in FALSE_SPELLINGS:
            return False
    elif var.kind in ("float", "int"):
        pattern = _INTEGER if var.kind == "int" else _NUMBER
        # An integer of at most 40 digits: every range here fits, and a longer one never reaches
        # int() (Python's digit limit) or isfinite() (OverflowError for an int beyond a float).
        if pattern.match(s) and (var.kind != "int" or len(s) <= 40):
            value = int(s) if var.kind == "int" else float(s)
            if (var.kind == "int" or math.isfinite(value)) and (
                    var.minimum is None or value >= var.minimum) and (var.maximum is None or value <= var.maximum):
                return value
    elif var.kind == "choice":
        if s.lower() in var.choices:
            return s.lower()
    elif var.kind == "names":
        names = tuple(n.strip() for n in s.split(","))
        if all(_NAME.match(n) for n in names):
            return names
    else:
        return text
    raise EnvironmentVariableError(var.name, text, var.expected())


def markdown_table(scope: str) -> str:
    """The table of docs/environment.md for ``scope`` ("runtime", "tests" or "build"); the page holds
    exactly these (tests/common/test_env.py)."""
    if scope == "build":
        rows = ["| Variable | Meaning |", "|---|---|"]
        rows += [f"| `{n}` | {m} |" for n, m in BUILD.items()]
        return "\n".join(rows)
    rows = ["| Variable | Values | Default | Meaning | Read by |", "|---|---|---|---|---|"]
    for v in VARIABLES.values():
        if v.scope == scope:
            rows.append(f"| `{v.name}` | {v.expected()} | {v.describe_default()} | {v.meaning} | {v.reader} |")
    return "\n".join(rows)

