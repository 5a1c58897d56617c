"""``--param-subset=each-value``: of each parametrized test function, only the variants needed for
every value of every parameter to run once (CI's version legs, .ci/version_legs.sh).

Those legs test that the package works on the two ends of the supported jax range: each jax's API,
tracing, lowering and our custom calls. A test function's grid (formats x dtypes x backends ...)
repeats the same jax calls with other values; running each value once keeps every function and every
format, dtype and backend on each jax, at about half the time (docs/design.md, "CI time: each value
once in the version legs"). The README leg runs the whole grid (the default, ``all``).

Per function, the variants kept are a greedy cover of its (parameter, value) pairs (the variant
that brings the most uncovered pairs first), in collection order. A variant that skips here (a
closed gate, a skip mark) is kept and covers nothing, so a value is counted only where it really
runs. Ids named by ``--deselect`` cover nothing either: pytest may remove them after this hook."""

from __future__ import annotations

import pytest

from _isolation import would_skip

OPTION = "param_subset"


def pytest_addoption(parser):
    parser.getgroup("param subset").addoption(
        "--param-subset", dest=OPTION, choices=("all", "each-value"), default="all",
        help="each-value: run only the parametrized variants needed for every parameter value to run "
             "once per test function (CI's version legs); all: every variant (default)")


def value_key(value) -> tuple:
    """A hashable key for a parameter value: the value itself where it hashes (dtypes, formats,
    strings, numbers), else its type and repr (arrays, lists)."""
    try:
        hash(value)
    except TypeError:
        return (type(value).__qualname__, repr(value))
    return (type(value).__qualname__, value)


def each_value_subset(variants) -> list[bool]:
    """``variants``: (function id, {parameter: value key} or None, counts) in order, where ``counts``
    is False for a variant that covers nothing (it skips, or is deselected). Returns, per variant,
    whether it is kept: every unparametrized or non-counting variant, and, per function, a greedy
    set cover of its (parameter, value) pairs: the variant bringing the most pairs not yet covered
    is taken first (the earliest on a tie), until every pair is covered."""
    keep = [params is None or not counts for _, params, counts in variants]
    by_function: dict[str, list[int]] = {}
    for i, (function, params, counts) in enumerate(variants):
        if params is not None and counts:
            by_function.setdefault(function, []).append(i)
    for indices in by_function.values():
        pairs = {i: set(variants[i][1].items()) for i in indices}
        uncovered = set().union(*pairs.values())
        while uncovered:
            best = max(indices, key=lambda i: (len(pairs[i] & uncovered), -i))
            keep[best] = True
            uncovered -= pairs[best]
    return keep


@pytest.hookimpl(trylast=True)  # after tests/conftest.py has added the gates' skip marks
def pytest_collection_modifyitems(config, items):
    if config.getoption(OPTION) != "each-value":
        return
    deselect = tuple(config.getoption("deselect") or ())
    variants = []
    for item in items:
        callspec = getattr(item, "callspec", None)
        params = None if callspec is None else {k: value_key(v) for k, v in callspec.params.items()}
        counts = not (would_skip(item) or (deselect and item.nodeid.startswith(deselect)))
        variants.append((item.nodeid.split("[", 1)[0], params, counts))
    keep = each_value_subset(variants)
    dropped = [item for item, k in zip(items, keep) if not k]
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = [item for item, k in zip(items, keep) if k]
