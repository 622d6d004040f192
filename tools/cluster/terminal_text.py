"""Text from a cluster (pod logs, termination messages) made safe to print on a terminal.

A pod's log is written by whatever runs in it: bytes such as OSC 52 (write the clipboard), a
clear screen, cursor moves or a title change would act on the user's terminal when `kubeddp
logs` or `status` prints them. What is kept: printable text (any script), spaces, tabs and
newlines; escape sequences go whole, other control characters one by one.
"""

from __future__ import annotations

import re

# ESC or its one-character C1 form, and what follows up to the end of the sequence:
_SEQUENCES = re.compile(
    r"""
    (?:\x1b\[|\x9b)[\x30-\x3f]*[\x20-\x2f]*[\x40-\x7e]?      # CSI: cursor, colour, clear
    | (?:\x1b[\]PX^_]|[\x9d\x90\x98\x9e\x9f])               # OSC, DCS, SOS, PM, APC ...
      [^\x07\x1b\x9c\n]*(?:\x07|\x1b\\|\x9c)?               # ... to BEL, ST or the line end
    | \x1b[\x20-\x2f]*[\x30-\x7e]?                          # any other escape (ESC c: reset)
    """,
    re.VERBOSE,
)
# Other C0/C1 controls and DEL (tab and newline kept), and the bidirectional overrides that
# make a line read differently from what it holds.
_CONTROLS = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")


def printable(text: str) -> str:
    """`text` without terminal control sequences and control characters (tabs, newlines kept)."""
    return _CONTROLS.sub("", _SEQUENCES.sub("", text))
