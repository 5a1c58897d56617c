"""Every stage of an FFI target decodes the same attributes (issue 36's weight-gradient target failed
on the H200 with "Wrong number of attributes: expected 0 but got 1 with name(s): m": its initialize
stage was bound without the `m` its execute stage takes). Read from the handlers' sources, so the
class of defect shows on a machine without a GPU."""

from __future__ import annotations

import pathlib
import re

import pytest

FFI = pathlib.Path(__file__).resolve().parents[2] / "ffi"
SYMBOL = re.compile(r"XLA_FFI_DEFINE_HANDLER_SYMBOL\(\s*(\w+)\s*,\s*[\w:<>]+\s*,(.*?)\);", re.S)
# a binding built by a helper templated on the stage (BindCublasLtCall<stage>()): the same attributes
# for every stage by construction
BINDER = re.compile(r"(\w+)<\s*(?:\w+::)*ExecutionStage::\w+\s*>\(\)")
ATTR = re.compile(r"\.Attr<[^>]*>\(\s*\"(\w+)\"\s*\)")
STAGE = re.compile(r"GPUEXT_REGISTER_FFI_STAGE\(\s*\"(\w+)\"\s*,\s*\"(\w+)\"\s*,\s*(\w+)\s*\)")
TARGET = re.compile(r"GPUEXT_REGISTER_FFI_TARGET\(\s*\"(\w+)\"\s*,\s*(\w+)\s*\)")
SOURCES = sorted(FFI.rglob("*.cc"))


def _stages(text: str) -> dict[str, dict[str, tuple[str, ...]]]:
    """{target: {stage: attribute names}} of one file ("execute" for the handler itself)."""
    attrs = {}
    for name, body in SYMBOL.findall(text):
        binder = BINDER.search(body)
        helper = binder is not None and binder.group(1) != "Bind"  # Ffi::Bind<stage>() is the plain binding
        attrs[name] = ("bound by", binder.group(1)) if helper else tuple(sorted(ATTR.findall(body)))
    out: dict[str, dict[str, tuple[str, ...]]] = {}
    for target, symbol in TARGET.findall(text):
        out.setdefault(target, {})["execute"] = attrs.get(symbol)
    for target, stage, symbol in STAGE.findall(text):
        out.setdefault(target, {})[stage] = attrs.get(symbol)
    return out


def test_the_scan_sees_the_multi_stage_targets():
    staged = {t for f in SOURCES for t, s in _stages(f.read_text()).items() if len(s) > 1}
    assert "gpuext_ragged_dot_hopper_wgrad" in staged and "gpuext_block_scaled_dot_cublaslt" in staged, staged


@pytest.mark.parametrize("source", SOURCES, ids=[p.name for p in SOURCES])
def test_every_stage_of_a_target_takes_the_same_attributes(source):
    for target, stages in _stages(source.read_text()).items():
        assert None not in stages.values(), f"{source.name}: {target}: a stage's binding was not found: {stages}"
        assert len(set(stages.values())) == 1, (
            f"{source.name}: {target}: the stages bind different attributes {stages}; XLA passes every "
            "attribute of the call to every stage and refuses a binding that does not take them all")
