"""Text for a person's terminal, which obeys what it is sent."""

from __future__ import annotations

import re

# Control characters, and the marks that reorder text on screen: a journal's texts come from
# agents, and a terminal would obey them (clear the screen, retitle the window, forge a line).
_UNPRINTABLE = re.compile("[\x00-\x1f\x7f-\x9f\u200e\u200f\u202a-\u202e\u2066-\u2069]")


def for_terminal(text: str) -> str:
    """`text` with its control characters shown as escapes (`\\n`, `\\x1b`), never acted on."""
    return _UNPRINTABLE.sub(lambda found: found.group().encode("unicode_escape").decode(), text)
