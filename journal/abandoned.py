"""Commands whose toolbus process ended mid-action (killed, or the machine lost power).

A command about to act outside the journal (a write, a wipe) records with its write-ahead row
what it may have done, as events (`pending`). Its outcome clears them. If the process dies
first, the row stays `in_doubt` with them, and the next `toolbus serve` on that machine
appends them, so that `history` and `recover` reach the text the command kept. Every backend
shares this; each stores `pending` in its `commands` row.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import NamedTuple

import msgspec

from toolbus.bus import Event
from toolbus.bus.events import decode_event, encode_event_data
from toolbus.bus.moments import parse_iso

# Where a process started, in clock ticks after boot: field 22 of /proc/PID/stat, which is
# the 20th after the command name (itself in parentheses, and free to hold spaces).
_STARTED_FIELD = 19
_STATE_FIELD = 0
# /proc's start times count in clock ticks, from a boot time given in whole seconds.
_START_SLACK_S = 1.0


class Abandoned(NamedTuple):
    """A command whose process is gone, and the events it said it may leave."""

    command_id: int
    pid: int
    events: list[Event]


def pending_text(events: Sequence[Event]) -> str | None:
    """`events` as a `commands.pending` value: a JSON array of [type, version, data]; None for none."""
    if not events:
        return None
    return msgspec.json.encode(
        [(event.__struct_config__.tag, type(event).version, msgspec.Raw(encode_event_data(event))) for event in events]
    ).decode()


def pending_events(text: str) -> list[Event]:
    """The events a `commands.pending` value holds, upcast to their current types."""
    return [
        decode_event(type_name, version, bytes(data))
        for type_name, version, data in msgspec.json.decode(text, type=list[tuple[str, int, msgspec.Raw]])
    ]


def abandoned(rows: Iterable[tuple[int, int | None, str, str]]) -> list[Abandoned]:
    """Of rows (command id, pid, received_at, pending) of this machine, those whose process is gone."""
    return [
        Abandoned(command_id, pid, pending_events(pending))
        for command_id, pid, received_at, pending in rows
        if pid is not None and process_gone(pid, parse_iso(received_at).at.timestamp())
    ]


def why_abandoned(pid: int) -> str:
    """The `error` a settled command gets, when it has none."""
    return f"the toolbus process (pid {pid}) ended before recording this command's outcome"


def process_gone(pid: int, since: float) -> bool:
    """Whether the process `pid` that was running at `since` (epoch seconds) has ended. A pid
    reused by a later process (after a reboot, say) is gone too, where /proc says when it began;
    elsewhere only a pid no process holds is. A zombie is gone: it runs no more code."""
    if pid == os.getpid():
        return False
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        if Path("/proc/self/stat").exists():
            return True
        return _no_such_process(pid)
    except OSError:
        return _no_such_process(pid)
    fields = stat[stat.rindex(")") + 2 :].split()
    if fields[_STATE_FIELD] in ("Z", "X"):
        return True
    started = _boot_time() + int(fields[_STARTED_FIELD]) / os.sysconf("SC_CLK_TCK")
    return started > since + _START_SLACK_S


def _no_such_process(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except OSError:  # PermissionError: another user's process holds it
        return False
    return False


def _boot_time() -> float:
    with contextlib.suppress(OSError, ValueError):
        for line in Path("/proc/stat").read_text().splitlines():
            if line.startswith("btime "):
                return float(line.split()[1])
    return 0.0
