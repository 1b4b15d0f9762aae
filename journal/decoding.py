"""Rows of the journal's tables as the ports return them, the same for every backend: commands
and events (read by column name: sqlite3.Row or a psycopg dict row), and the memory store's
observations (read by position, in the column orders named here)."""

from __future__ import annotations

import functools
import os
from collections.abc import Callable, Collection, Iterable, Iterator, Sequence
from typing import Any, Protocol

import msgspec

from toolbus.bus import (
    CLI_COMMANDS,
    STATUSES,
    TOOL_COMMANDS,
    AuditEntry,
    HistoryEntry,
    StoredEvent,
    decode_event,
    file_stream,
)
from toolbus.bus.commands import FileCommand
from toolbus.bus.queries import Observations


class Row(Protocol):
    """A row read by column name: a sqlite3.Row or a psycopg dict row."""

    def __getitem__(self, column: str, /) -> Any: ...


def audit_entry(row: Row, events: list[StoredEvent], host: str | None) -> AuditEntry:
    """A `commands` row and its events as one entry of the audit (`host`: the row's, where the
    journal keeps one)."""
    arguments = json_or_text(row["arguments"])
    return AuditEntry(
        id=row["id"],
        received_at=row["received_at"],
        finished_at=row["finished_at"],
        duration_ms=row["duration_ms"],
        tool=row["tool"],
        target=target_of(arguments, events),
        status=row["status"],
        error=row["error"],
        agent=row["agent"],
        department=row["department"],
        client_name=row["client_name"],
        client_version=row["client_version"],
        session_id=row["session_id"],
        host=host,
        pid=row["pid"],
        arguments=arguments,
        events=events,
    )


# --- a file's calls that failed before any event ----------------------------------------------

# The calls that change a file, by tool, and the argument naming it. One that fails before any
# event (Neovim unreachable, say) is in no stream of the file: `toolbus audit --path` finds it
# among the few calls whose status is not ok.
FILE_CHANGING_TOOLS: dict[str, str] = {
    command.tool: command.path_field
    for command in (*TOOL_COMMANDS, *CLI_COMMANDS)
    if issubclass(command, FileCommand) and command.mutates
}


def not_ok_statuses(status: str | None) -> tuple[str, ...]:
    """The statuses a file's failed calls may have under a `--status` filter."""
    return tuple(each for each in STATUSES if each != "ok" and status in (None, each))


# The arguments that name a file (`FILE_CHANGING_TOOLS`), read without the rest: an openDiff's
# megabyte of proposed text is skipped, not decoded.
_NamedPaths = msgspec.defstruct(
    "_NamedPaths", [(name, Any, None) for name in sorted(set(FILE_CHANGING_TOOLS.values()))]
)


def eventless_matcher(streams: Collection[str], hosts: bool, here: str | None) -> Callable[[Row], AuditEntry | None]:
    """For a call that changed nothing and recorded no event (a row of `commands`): its entry
    if its arguments name the file of `streams` (`file_streams`), however they spell it (`//`,
    `..`, a link; `~` for a call made on this machine, `here`), else None."""
    named = functools.lru_cache(maxsize=1024)(_streams_named)
    wanted = set(streams)

    def match(row: Row) -> AuditEntry | None:
        try:
            arguments = msgspec.json.decode(row["arguments"], type=_NamedPaths)
        except msgspec.DecodeError:  # not an object, or not JSON: it names no file
            return None
        path = getattr(arguments, FILE_CHANGING_TOOLS.get(row["tool"], ""), None)
        home = hosts and here is not None and row["host"] == here  # whose `~` it was: this machine's
        if isinstance(path, str) and not named(path, home).isdisjoint(wanted):
            return audit_entry(row, [], row["host"] if hosts else None)
        return None

    return match


def _streams_named(path: str, home: bool) -> frozenset[str]:
    """The streams an absolute path as a call named it may stand for (`~` only if `home`)."""
    if "\0" in path:  # rejected when sent; a journal from before may hold one
        return frozenset()
    expanded = os.path.expanduser(path) if home else path
    if not os.path.isabs(expanded):
        return frozenset()
    return frozenset({file_stream(os.path.normpath(expanded)), file_stream(os.path.realpath(expanded))})


def with_eventless(
    walked: Iterable[AuditEntry],
    candidates: Iterable[Row],
    match: Callable[[Row], AuditEntry | None],
    streams: Collection[str],
) -> Iterator[AuditEntry]:
    """A file's commands as the walk of its events gives them (by their newest event on the
    file, newest first), with the calls among `candidates` (newest first by when they were
    received) that `match` the file placed among them. Both are read lazily, and a candidate is
    looked at only once the walk has reached its time."""
    rows = iter(candidates)
    row = next(rows, None)
    for entry in walked:
        newest = max((e for e in entry.events if e.stream in streams), key=lambda e: e.position, default=None)
        when = newest.recorded_at if newest is not None else entry.received_at
        while row is not None and row["received_at"] > when:
            if (found := match(row)) is not None:
                yield found
            row = next(rows, None)
        yield entry
    while row is not None:
        if (found := match(row)) is not None:
            yield found
        row = next(rows, None)


def target_of(arguments: Any, events: Sequence[StoredEvent]) -> str | None:
    """What a command was about, for a person: the file, tab, title or query."""
    for event in events:
        if path := event.data.get("path"):
            return str(path)
    if not isinstance(arguments, dict):
        return None
    for key in ("filePath", "new_file_path", "tab_name", "path", "uri", "title", "query", "anchor", "ids", "event"):
        if arguments.get(key) not in (None, ""):
            value = arguments[key]
            return value if isinstance(value, str) else msgspec.json.encode(value).decode()
    return None


def decode_stored_events(rows: Sequence[Row], blob_sizes: Callable[[set[str]], dict[str, int]]) -> list[StoredEvent]:
    """Rows of `events` as StoredEvents, with the sizes of the blobs they name (`blob_sizes`
    answers for all of them at once)."""
    datas = [event_data(row["type"], row["version"], row["data"]) for row in rows]
    sizes = blob_sizes({v for data in datas for k, v in data.items() if k.endswith("_blob") and v})
    return [
        StoredEvent(
            position=row["position"],
            event_id=row["event_id"],
            command_id=row["command_id"],
            type=row["type"],
            version=row["version"],
            stream=row["stream"],
            recorded_at=row["recorded_at"],
            data=data,
            blobs={v: sizes[v] for k, v in data.items() if k.endswith("_blob") and v in sizes},
        )
        for row, data in zip(rows, datas, strict=True)
    ]


def event_data(type_name: str, version: int, data: str) -> dict[str, Any]:
    """The data upcast to the current schema; the stored JSON as it is for a type this
    toolbus does not know."""
    try:
        decoded: dict[str, Any] = msgspec.to_builtins(decode_event(type_name, version, data))
    except (ValueError, KeyError, msgspec.ValidationError):
        raw = json_or_text(data)
        return raw if isinstance(raw, dict) else {"raw": raw}
    return decoded


def json_or_text(text: str | None) -> Any:
    if text is None:
        return None
    try:
        return msgspec.json.decode(text)
    except msgspec.DecodeError:
        return text


def history_entry(row: Row, event: StoredEvent) -> HistoryEntry:
    """An event of a file's history with its command's columns (`c_tool`, `c_status`, `c_agent`,
    `c_session`, `c_host`)."""
    return HistoryEntry(
        event=event,
        tool=row["c_tool"],
        status=row["c_status"],
        agent=row["c_agent"],
        session_id=row["c_session"],
        host=row["c_host"],
    )


# --- memory rows -------------------------------------------------------------------------------

# The `observations` columns a search or timeline lists (an `IndexRow`), and a full record's.
INDEX_COLUMNS = "o.id, o.title, o.type, o.project, o.created_at_epoch, o.agent, o.visibility"
FULL_COLUMNS = (
    "o.id, o.title, o.text, o.type, o.project, o.memory_session_id, o.facts, o.concepts,"
    " o.agent, o.department, o.visibility, o.created_at_epoch, o.extra"
)
_FULL_NAMES = tuple(column.strip().removeprefix("o.") for column in FULL_COLUMNS.split(","))
_JSON_FIELDS = frozenset({"facts", "concepts"})
NEWEST_FIRST = "o.created_at_epoch DESC, o.id DESC"
OLDEST_FIRST = "o.created_at_epoch ASC, o.id ASC"


def observations_in_order(wanted: list[int], rows: Iterable[Sequence[Any]]) -> Observations:
    """Rows of `FULL_COLUMNS` as full records in the order `wanted`; the ids without a row missing."""
    found = {record["id"]: record for record in map(_full_record, rows)}
    return Observations(
        observations=[found[i] for i in wanted if i in found],
        missing=[i for i in wanted if i not in found],
    )


def _full_record(row: Sequence[Any]) -> dict[str, Any]:
    record = dict(zip(_FULL_NAMES, row, strict=True))
    for name in _JSON_FIELDS:
        record[name] = msgspec.json.decode(record[name])
    extra: dict[str, Any] = msgspec.json.decode(record.pop("extra"))
    # Extra fields sit beside the named ones, but never replace them.
    return record | {key: value for key, value in extra.items() if key not in record}
