"""Fuzz: every JAX_GPUEXT_* variable with valid spellings, near misses and arbitrary text (issue 26).
Each value must mean exactly what docs/environment.md says, through jax_gpuext.common.env and
through the package function that reads it, or be refused with a ValueError naming the variable and
the value; never taken as something else, never a bare float()/int() error."""

from __future__ import annotations

import importlib
import math
import os
from unittest import mock

from hypothesis import given
from hypothesis import strategies as st

from _budget import fuzz, judged, record
from jax_gpuext.common import env

TRUE, FALSE = {"1", "true", "yes", "on"}, {"0", "false", "no", "off"}
NEAR_MISSES = ["", " ", "1 ", " TRUE", "y", "n", "2", "-1", "-0", "+1", "0.0", "1e3", "1E-3", "1e-46", "nan", "-nan",
               "inf", "Infinity", "0x10", "1_000", "١", "30s", "4096", "1048576", "99999999999999999999", "long",
               "LONG", "ci", "all", "quantize,dequantize", "quantize,,x", "a b", "/tmp/x", "None", "null"]


def model(var, text):
    """What the docs say ``text`` means for ``var``: ("ok", value) or ("refused",). Independent of
    env.py: spelled out from the documented rules."""
    s = text.strip()
    if s == "":
        return ("ok", var.default)
    if var.kind == "bool":
        return ("ok", s.lower() in TRUE) if s.lower() in TRUE | FALSE else ("refused",)
    if var.kind in ("int", "float"):
        allowed = set("0123456789+-") | (set(".eE") if var.kind == "float" else set())
        if not set(s) <= allowed:  # only ASCII decimal literals: no nan, inf, hex, "_", other digits
            return ("refused",)
        if var.kind == "int" and len(s) > 40:  # an integer of at most 40 characters (every range fits)
            return ("refused",)
        try:
            value = int(s) if var.kind == "int" else float(s)
        except (ValueError, OverflowError):
            return ("refused",)
        ok = math.isfinite(value) and var.minimum <= value <= var.maximum
        return ("ok", value) if ok else ("refused",)
    if var.kind == "choice":
        return ("ok", s.lower()) if s.lower() in var.choices else ("refused",)
    if var.kind == "names":
        names = [n.strip() for n in s.split(",")]
        ok = all(n and (n[0].isascii() and (n[0].isalpha() or n[0] == "_")) and all(
            c.isascii() and (c.isalnum() or c == "_") for c in n) for n in names)
        return ("ok", tuple(names)) if ok else ("refused",)
    return ("ok", text)


def _reader(name):
    """The package function that reads ``name`` (None for the test suite's own variables)."""
    ar = importlib.import_module("jax_gpuext.collectives.all_reduce")
    readers = {
        "JAX_GPUEXT_ALLOW_UNVERIFIED": lambda: importlib.import_module("jax_gpuext.common.verified").allow_unverified(),
        "JAX_GPUEXT_ALLREDUCE_TIMEOUT_S": ar._default_timeout,
        "JAX_GPUEXT_ALLREDUCE_GRAPH_SAFE": ar._graph_safe,
        "JAX_GPUEXT_MEMORY_SHIELD": lambda: importlib.import_module("jax_gpuext.memory.spaces")._shield_enabled(),
        "JAX_GPUEXT_ALLREDUCE_WORKSPACE_BYTES": lambda: ar._workspace_bytes("cpu"),
    }
    return readers.get(name)


def _shown(text: str) -> str:
    """How a refusal quotes the value: whole, or its start and length when long."""
    return text if len(text) <= 60 else f"{text[:40]}... ({len(text)} characters)"


# Huge integers (issue 34): 401 digits overflowed a float comparison, 5,000 hit Python's digit
# limit; both must be the package's refusal naming the variable. Leading zeros and signs too.
HUGE = st.one_of(
    st.integers(10**38, 10**45).map(str), st.integers(-(10**45), -(10**38)).map(str),
    st.sampled_from([400, 401, 4300, 4301, 5000, 20_000]).map(lambda n: "9" * n),
    st.sampled_from([39, 40, 41, 4301]).map(lambda n: "0" * n + "1"),
    st.sampled_from(["+" + "0" * 39 + "1", "-" + "9" * 401, "1" + "0" * 400 + ".5", "1e" + "9" * 400,
                     "0." + "0" * 5000 + "1", "9" * 310 + ".0"]))


@fuzz("environment", 60)
@given(name=st.sampled_from(sorted(env.VARIABLES)),
       text=st.one_of(st.sampled_from(NEAR_MISSES), st.text(max_size=12),
                      st.floats(allow_nan=True, allow_infinity=True).map(repr), st.integers(-2, 2**34).map(str),
                      HUGE))
def test_every_variable_means_what_the_docs_say(name, text):
    var = env.variable(name)
    if "\x00" in text:  # not a value an environment can hold
        text = text.replace("\x00", "")
    want = model(var, text)
    case = f"{name}={_shown(text)!r}"
    with judged("environment"):
        try:
            got = ("ok", env.get(name, {name: text}))
        except env.EnvironmentVariableError as e:
            assert name in str(e) and repr(_shown(text)) in str(e), (
                f"refusal does not name the variable and value: {_shown(str(e))}")
            got = ("refused",)
        assert got == want, f"{case}: env gives {got}, the documented rule {want}"
        reader = _reader(name)
        if reader is not None and want[0] == "ok" and want[1] is not None:
            with mock.patch.dict(os.environ, {name: text}):
                value = reader()
            default_cpu = 1 << 20 if name.endswith("WORKSPACE_BYTES") else None
            assert value == (want[1] if want[1] is not None else default_cpu), f"{case}: the reader got {value!r}"
        elif reader is not None and want[0] == "refused":
            with mock.patch.dict(os.environ, {name: text}):
                try:
                    reader()
                except ValueError as e:
                    assert name in str(e), f"{_shown(case)}: {_shown(str(e))}"
                else:
                    raise AssertionError(f"{case}: the reader accepted it")
        record("environment", want[0])
