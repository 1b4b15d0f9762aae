"""The journal's two ports: the writer the bus appends through, and the reader that audit,
history, recover, replay, the demo and the doctor read through. Backends implement both;
nothing outside a backend holds a database connection."""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Generic, Literal, NamedTuple, Protocol, TypeVar, get_args

import msgspec

from toolbus.bus.commands import typed_path
from toolbus.bus.events import Event, file_stream

Status = Literal["ok", "rejected", "failed", "in_doubt", "cancelled"]
STATUSES: tuple[Status, ...] = get_args(Status)

# Event data fields that name a blob, and what the blob's text is to a person.
RECOVERABLE_FIELDS: dict[str, tuple[str, str]] = {
    "DocumentSaved": ("replaced_blob", "the text on disk that the save replaced"),
    "TabClosed": ("discarded_blob", "the unsaved text that the close discarded"),
    "FileWriteInDoubt": ("replaced_blob", "the text on disk that the write, if it happened, replaced"),
    "TabCloseInDoubt": ("discarded_blob", "the unsaved text that the close, if it happened, discarded"),
    "FileRestored": ("replaced_blob", "the text on disk that the restore replaced"),
    "DiffAccepted": ("replaced_blob", "the text on disk that the accepted diff replaced"),
    "DiffRejected": ("proposed_blob", "the proposal the user rejected"),
    # Every diff's proposal; the only text of one that ended undecided (Neovim gone, cancelled).
    "DiffProposed": ("proposed_blob", "the proposal shown to the user"),
    "DiffAcceptFailed": ("final_blob", "the text the user accepted, which could not be written"),
    "DiffAcceptInDoubt": ("final_blob", "the text the user accepted, whose write is in doubt"),
}


class Caller(msgspec.Struct, frozen=True, kw_only=True):
    """Who is calling: the configured identity, the MCP client behind it, and the machine."""

    agent: str = "legacy"
    department: str = "default"
    client_name: str | None = None
    client_version: str | None = None
    session_id: str | None = None
    # The machine the call ran on (its hostname): one file path on two machines is two files.
    host: str | None = None
    # The identity is a team journal's login: a call may not name another agent or department.
    from_login: bool = False


class CommandRecord(msgspec.Struct, frozen=True, kw_only=True):
    """A call as the journal records it, before anything is known of its outcome."""

    tool: str
    arguments: Any
    caller: Caller
    received_ns: int  # time.time_ns() at arrival
    # False for a call that changes nothing (a query, a rejected call): its record need not
    # wait for the disk (see `JournalWriter.finish`).
    changes: bool = True


E = TypeVar("E", bound=Event)


class Appended(NamedTuple, Generic[E]):
    """An event as the journal appended it: at `position`, as stored (an observation with the
    time `JournalWriter.finish` gave it)."""

    position: int
    event: E


class JournalWriter(Protocol):
    """The write side of the journal, as the bus needs it."""

    async def begin(
        self,
        record: CommandRecord,
        keep: Mapping[str, bytes] | None = None,
        *,
        durable: bool = True,
        pending: Sequence[Event] = (),
    ) -> int:
        """Record a command as `in_doubt` with `keep` (texts its action would destroy), in one
        transaction durable on disk when this returns; return the command's id. Not `durable`
        (for an action whose effect a power cut would undo too): committed, so it survives a
        crash of toolbus, and brought to the disk by the outcome's sync. `pending`: the events
        saying what its action may have done, which `settle_abandoned` appends if its process
        ends before `finish` (which drops them)."""
        ...

    async def finish(
        self,
        record: CommandRecord,
        command_id: int | None,
        status: Status,
        *,
        error: str | None = None,
        events: Sequence[E] = (),
        blobs: Mapping[str, bytes] | None = None,
    ) -> list[Appended[E]]:
        """Commit the outcome (inserting the command first when `command_id` is None);
        return `events` as appended. The record of a call that `changes` something is durable
        on disk when this returns; any other is committed (it survives a crash of toolbus) and
        reaches the disk with the next change's sync, within a second at most.

        An observation (`ObservationSaved`) timed no later than the latest one in the journal
        is timed a millisecond after it: `created_at_epoch` grows with the position (the id),
        so an agent asking for the observations after the latest time it saw misses none,
        whatever the clocks of the servers saving and however long a save waited for another's."""
        ...

    async def append(self, command_id: int, events: Sequence[E], blobs: Mapping[str, bytes]) -> list[Appended[E]]:
        """Commit events (and the blobs they name) of a command still under way, which stays
        `in_doubt` until `finish`; return them as appended (an observation timed as by `finish`)."""
        ...

    async def keep_blobs(
        self, blobs: Mapping[str, bytes], *, command_id: int | None = None, pending: Sequence[Event] = ()
    ) -> None:
        """Store texts (content-addressed, so idempotent) in a transaction of their own,
        durable on disk when this returns, and every commit before it with them: texts kept
        already included. With `command_id` (a begun command about to act again), its
        `pending` events become these, in the same transaction."""
        ...

    async def settle_abandoned(self, host: str) -> int:
        """Append the pending events of the commands begun on `host` whose toolbus process has
        ended without finishing them, once each; they stay `in_doubt`. Returns how many."""
        ...


# --- what the reader returns ----------------------------------------------------------------


class NoSuchEvent(ValueError):
    """The event asked for is not in the journal."""


class StoredEvent(msgspec.Struct, frozen=True, kw_only=True):
    """An event as the journal holds it, its data upcast to the current schema."""

    position: int
    event_id: str
    command_id: int | None
    type: str
    version: int
    stream: str
    recorded_at: str
    data: dict[str, Any]
    blobs: dict[str, int]  # size in bytes of each blob the data names


class AuditEntry(msgspec.Struct, frozen=True, kw_only=True):
    """One command and its events: a line of `toolbus audit --json`."""

    id: int
    received_at: str
    finished_at: str | None
    duration_ms: float | None
    tool: str
    target: str | None
    status: str
    error: str | None
    agent: str | None
    department: str | None
    client_name: str | None
    client_version: str | None
    session_id: str | None
    host: str | None  # None: recorded before journals kept the machine
    pid: int | None
    arguments: Any
    events: list[StoredEvent]


class HistoryEntry(msgspec.Struct, frozen=True, kw_only=True):
    """One event in a file's story, with the command that caused it."""

    event: StoredEvent
    tool: str | None
    status: str | None
    agent: str | None
    session_id: str | None
    host: str | None  # None: recorded before journals kept the machine


@dataclass(frozen=True, slots=True)
class AuditQuery:
    """Filters of `toolbus audit`; None means "any". Times are journal timestamps (UTC ISO)."""

    tool: str | None = None
    paths: tuple[str, ...] = ()  # streams of each spelling of one file (`file_streams`)
    status: Status | None = None
    since: str | None = None
    until: str | None = None
    session: str | None = None
    agent: str | None = None
    # Only this machine's commands, and those recorded before journals kept the machine.
    host: str | None = None
    limit: int | None = 50
    # The machine the query is made on: a path with `~` that a call there sent is this user's.
    here: str | None = None


@dataclass(frozen=True, slots=True)
class MemoryCheck:
    """The memory store against a rebuild from the journal's events."""

    observations: int
    differences: list[str]


def file_streams(path: str) -> tuple[str, ...]:
    """The streams a file's events may be under: the path as Neovim resolves it (symlinks
    followed), and as typed, for a file since deleted or moved."""
    typed = typed_path(path)
    # Resolved before `..` is taken off: after a symlink it leads to the link target's parent.
    # An absolute path needs no current directory (which may have been deleted).
    expanded = os.path.expanduser(path)
    resolved = os.path.realpath(expanded if os.path.isabs(expanded) else os.path.join(os.getcwd(), expanded))
    return tuple(dict.fromkeys((file_stream(resolved), file_stream(typed))))


class JournalReader(Protocol):
    """Reading a journal: never creates, migrates or writes anything."""

    def audit(self, query: AuditQuery) -> Iterator[AuditEntry]:
        """Commands matching `query`, newest first, each with its events."""
        ...

    def history(self, path: str, limit: int | None = None, host: str | None = None) -> list[HistoryEntry]:
        """Every event about one file (under any of its `file_streams`), newest first; with
        `host`, only that machine's, and those recorded before journals kept the machine."""
        ...

    def event_at(self, position: int) -> StoredEvent:
        """The event at `position`; `NoSuchEvent` when there is none."""
        ...

    def event_by_id(self, event_id: str) -> StoredEvent:
        """The event whose id is `event_id` (32 hex digits); `NoSuchEvent` when there is none."""
        ...

    def events(self, types: Sequence[str], start: int = 0, end: int | None = None) -> Iterator[StoredEvent]:
        """Events of these types between positions `start` and `end` (inclusive), in order."""
        ...

    def blob(self, digest: str) -> bytes | None:
        """The text whose SHA-256 is `digest`; None when the journal does not hold it."""
        ...

    def check_memory(self) -> MemoryCheck:
        """Rebuild the memory store aside and list how the live one differs."""
        ...

    def counts(self) -> tuple[int, int]:
        """How many commands and events the journal holds."""
        ...

    def close(self) -> None: ...
