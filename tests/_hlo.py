"""Reading compiled HLO text in tests."""

from __future__ import annotations

import re

_HEADER = re.compile(r"^%?(command_buffer[\w.]*)\s*\(")
_TARGET = re.compile(r'custom_call_target="([^"]+)"')


def custom_calls_in_command_buffers(hlo_text: str) -> set[str]:
    """Targets of the custom calls inside the computations XLA outlined as command buffers.

    XLA's command-buffer scheduling moves each captured sequence into a computation named
    ``command_buffer[.N]`` (called with ``to_apply=%command_buffer``); computations start at
    column 0 and end with a ``}`` line, instructions are indented.
    """
    found, inside = set(), False
    for line in hlo_text.splitlines():
        if _HEADER.match(line):
            inside = True
        elif line.startswith("}"):
            inside = False
        elif inside:
            found.update(_TARGET.findall(line))
    return found
