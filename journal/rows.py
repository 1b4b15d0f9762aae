"""What every backend writes the same way: a finished command (`Outcome`), the columns of a
`commands` row, event ids, observations timed in order, and text every database can store."""

from __future__ import annotations

import functools
import json
import os
import re
import time
from collections.abc import Callable, Mapping, Sequence
from typing import NamedTuple, TypeVar

import msgspec

from toolbus.bus import Caller, CommandRecord, Event, ObservationSaved, Status
from toolbus.bus.moments import iso_time

_json = msgspec.json.Encoder()
_LONE_SURROGATE = re.compile("[\ud800-\udfff]")

# Arguments of a rejected call are kept for the audit, but never more than this.
REJECTED_ARGUMENTS_LIMIT = 64 * 1024


class Outcome(NamedTuple):
    """A command with its final status and what it emitted, ready to be recorded."""

    record: CommandRecord
    status: Status
    error: str | None = None
    events: Sequence[Event] = ()
    blobs: Mapping[str, bytes] | None = None


# UUIDv7 (RFC 9562) as hex: after the 48-bit millisecond stamp, the version digit `7`; the
# 17th digit carries the variant (0b10) in its top bits and two random bits: 8, 9, a or b.
_UUID7_VARIANT = {digit: "89ab"[int(digit, 16) & 3] for digit in "0123456789abcdef"}


def event_ids(count: int) -> list[str]:
    """`count` UUIDv7s as 32 hex digits. Time-ordered, unlike random UUIDv4s, so inserts into the
    unique `event_id` index land on its last pages instead of anywhere in it. One clock read and
    one urandom call for all: a batch's events share their millisecond anyway. Built from hex
    text (3 + 1 + 15 random digits each) rather than integer arithmetic: half the time a batch."""
    stamp = f"{time.time_ns() // 1_000_000:012x}7"
    noise = os.urandom(10 * count).hex()
    return [
        f"{stamp}{noise[at : at + 3]}{_UUID7_VARIANT[noise[at + 3]]}{noise[at + 4 : at + 19]}"
        for at in range(0, 20 * count, 20)
    ]


E = TypeVar("E", bound=Event)


def timed_in_order(events: Sequence[E], latest: Callable[[], int | None]) -> list[E]:
    """`events` with each observation timed after `latest()` (the latest time of the
    observations in the journal, asked inside the transaction that appends them, only if there
    is an observation) and after those before it among them (`JournalWriter.finish`): a
    millisecond after, when its own clock says no later."""
    timed: list[E] = []
    floor = latest() if any(isinstance(event, ObservationSaved) for event in events) else None
    for event in events:
        if isinstance(event, ObservationSaved):
            at = event.created_at_epoch if floor is None else max(event.created_at_epoch, floor + 1)
            if at != event.created_at_epoch:
                event = msgspec.structs.replace(event, created_at_epoch=at)
            floor = at
        timed.append(event)
    return timed


def command_row(
    record: CommandRecord,
    status: Status,
    error: str | None,
    pid: int,
    finished_ns: int | None,
    finished_at: str | None,
) -> tuple[object, ...]:
    """A `commands` row but its id: tool, arguments, agent, department, client name and version,
    session id, host, pid, received_at, finished_at, duration_ms, status, error."""
    return (
        valid_text(record.tool),
        _arguments_json(record.arguments, status),
        *_caller_columns(record.caller),
        pid,
        iso_time(record.received_ns),
        finished_at,
        (finished_ns - record.received_ns) / 1e6 if finished_ns is not None else None,
        status,
        valid_text(error),
    )


@functools.lru_cache(maxsize=64)
def _caller_columns(caller: Caller) -> tuple[str | None, ...]:
    # One caller (a frozen Struct) makes every call of a session: check its text once.
    return (
        valid_text(caller.agent),
        valid_text(caller.department),
        valid_text(caller.client_name),
        valid_text(caller.client_version),
        valid_text(caller.session_id),
        valid_text(caller.host),
    )


def _arguments_json(arguments: object, status: Status) -> str:
    text = _encode_arguments(arguments)
    if status == "rejected" and len(text) > REJECTED_ARGUMENTS_LIMIT:
        return _json.encode({"_truncated": True, "bytes": len(text), "head": text[:4096]}).decode()
    return text


def _encode_arguments(arguments: object) -> str:
    """The arguments as JSON text, whatever a client sent, so that every call can be recorded:
    values JSON cannot hold become their repr, lone surrogates U+FFFD (SQLite stores UTF-8)."""
    try:
        return _json.encode(arguments).decode()
    except (TypeError, ValueError, RecursionError, msgspec.EncodeError):  # ValueError: surrogates
        pass
    try:
        text = json.dumps(arguments, ensure_ascii=False, allow_nan=False, default=repr)
    except (TypeError, ValueError, RecursionError):
        return _json.encode({"_unencodable": type(arguments).__name__}).decode()
    return _LONE_SURROGATE.sub("\ufffd", text)


def valid_text(value: str | None) -> str | None:
    """`value` as text SQLite can store: lone surrogates (which no UTF-8 can hold) become U+FFFD."""
    if value is None or value.isascii():
        return value
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return _LONE_SURROGATE.sub("\ufffd", value)
    return value


def without_nul(value: str) -> str:
    """`value` as PostgreSQL's text can hold it: NUL, which it cannot, becomes U+FFFD."""
    return value.replace("\x00", "\ufffd") if "\x00" in value else value


# JSON's escape of NUL, not an escaped backslash followed by "u0000".
_NUL_ESCAPE = re.compile(r"(?<!\\)((?:\\\\)*)\\u0000")


def json_without_nul(text: str) -> str:
    """JSON text as PostgreSQL's jsonb can read it: NUL, whose escape it refuses, becomes U+FFFD,
    as `without_nul` makes it in text."""
    return _NUL_ESCAPE.sub(r"\1\\ufffd", text) if "\\u0000" in text else text


def storable_row(row: tuple[object, ...]) -> tuple[object, ...]:
    """A row's text values `without_nul`."""
    return tuple(without_nul(value) if isinstance(value, str) else value for value in row)


def observation_row(position: int, event: ObservationSaved) -> tuple[int | str, ...]:
    """An `observations` row (id = its event's journal position), in `decoding.FULL_COLUMNS`' order."""
    return (
        position,
        event.title,
        event.text,
        event.type,
        event.project,
        event.memory_session_id,
        _json.encode(event.facts).decode(),
        _json.encode(event.concepts).decode(),
        event.agent,
        event.department,
        event.visibility,
        event.created_at_epoch,
        _json.encode(event.extra).decode(),
    )
