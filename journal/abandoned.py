"""Commands whose toolbus process ended mid-action (killed, or the machine lost power).

A command about to act outside the journal (a write, a wipe) records with its write-ahead row
what it may have done, as events, and which process it is (`pending`). Its outcome clears
them. If the process dies first, the row stays `in_doubt` with them, and the next
`toolbus serve` on that machine appends them, so that `history` and `recover` reach the text
the command kept. Every backend shares this; each stores `pending` in its `commands` row.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import NamedTuple

import msgspec

from toolbus.bus import DiffAcceptInDoubt, Event, FileWriteInDoubt, TabCloseInDoubt
from toolbus.bus.events import EVENT_TYPES, decode_event, encode_event_data

log = logging.getLogger(__name__)

# The only events a settle appends: what an action in doubt may have done to a file. Anything
# else in a row's `pending` (written by hand, or by a newer toolbus) is left alone.
SETTLED_TYPES: frozenset[str] = frozenset(
    cls.type_name() for cls in (FileWriteInDoubt, TabCloseInDoubt, DiffAcceptInDoubt)
)
# Field 22 of /proc/PID/stat, the process's start in clock ticks after boot: the 20th after
# the command name, which is in parentheses and may hold spaces.
_STARTED_FIELD = 19


class ProcessMark(NamedTuple):
    """A process as Linux names it for all its life: the boot, its pid namespace, and when it
    started after boot. Pids are reused; these three together are not."""

    boot: str
    pid_namespace: int
    started: int


class _Pending(msgspec.Struct, frozen=True):
    """A `commands.pending` value: the process that wrote it (None where /proc is missing),
    and each event as [type, version, data]."""

    process: ProcessMark | None
    events: list[tuple[str, int, msgspec.Raw]]


class Abandoned(NamedTuple):
    """A command whose process is gone, and the events it said it may leave."""

    command_id: int
    pid: int
    events: list[Event]


def pending_text(events: Sequence[Event]) -> str | None:
    """`events` as a `commands.pending` value, marked with this process; None for none."""
    if not events:
        return None
    entries = [(event.type_name(), type(event).version, msgspec.Raw(encode_event_data(event))) for event in events]
    return msgspec.json.encode(_Pending(this_process(), entries)).decode()


def dead_commands(rows: Iterable[tuple[int, int | None, str]]) -> list[Abandoned]:
    """Of rows (command id, pid, pending) of this machine, those whose process has ended. A row
    whose `pending` this toolbus cannot read is skipped, with a warning: it never stops the others."""
    found = []
    for command_id, pid, text in rows:
        try:
            pending = msgspec.json.decode(text, type=_Pending)
            events = [_settled_event(*entry) for entry in pending.events]
        except Exception as error:  # whatever one row holds, it never stops the others
            log.warning("command %d: its pending events are left alone: %s", command_id, error)
            continue
        if pid is not None and process_gone(pid, pending.process):
            found.append(Abandoned(command_id, pid, events))
    return found


def _settled_event(type_name: str, version: int, data: msgspec.Raw) -> Event:
    if type_name not in SETTLED_TYPES:
        raise ValueError(f"{type_name} is not an event a settle appends")
    if version > EVENT_TYPES[type_name].version:
        raise ValueError(f"{type_name} version {version} is newer than this toolbus knows")
    return decode_event(type_name, version, bytes(data))


def why_abandoned(pid: int) -> str:
    """The `error` a settled command gets, when it has none."""
    return f"the toolbus process (pid {pid}) ended before recording this command's outcome"


def process_gone(pid: int, mark: ProcessMark | None) -> bool:
    """Whether the process `pid`, which wrote `mark`, has ended: the machine booted since, or no
    process of its start holds `pid` (a zombie runs no more code). One of another pid namespace
    (a container sharing the host's name) cannot be judged from here: it counts as alive, as
    does any where /proc tells only one side. Without /proc, only a pid no process holds is gone."""
    here = this_process()
    if mark is None or here is None:  # judged by the pid alone only where neither side has /proc
        return mark is None and here is None and _no_such_process(pid)
    if mark.boot != here.boot:
        return True
    if mark.pid_namespace != here.pid_namespace:
        return False
    try:
        state, started = _state_and_start(pid)
    except OSError:  # no such process, or one /proc hides (hidepid): the pid says which
        return _no_such_process(pid)
    return state in ("Z", "X") or started != mark.started


def this_process() -> ProcessMark | None:
    """This process's mark; None where /proc does not tell it."""
    pid = os.getpid()  # by pid: a forked child is another process
    if (mark := _marks.get(pid)) is None and (mark := process_mark(pid)) is not None:
        _marks[pid] = mark  # a failure is not kept: /proc may answer next time
    return mark


_marks: dict[int, ProcessMark] = {}


def process_mark(pid: int) -> ProcessMark | None:
    """The mark of the process `pid` of this pid namespace; None where /proc does not tell it."""
    try:
        boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
        return ProcessMark(boot, os.stat("/proc/self/ns/pid").st_ino, _state_and_start(pid)[1])
    except OSError:
        return None


def _state_and_start(pid: int) -> tuple[str, int]:
    """A process's state letter and start, from /proc/PID/stat."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    fields = stat[stat.rindex(")") + 2 :].split()
    return fields[0], int(fields[_STARTED_FIELD])


def _no_such_process(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except OSError:  # PermissionError: another user's process holds it
        return False
    return False
