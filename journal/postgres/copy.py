"""`toolbus journal copy`: a local journal's memory and file history brought into a team journal.

Every command that left events is copied with its events (under their own event ids, each at
the time it was recorded) and the texts they name. The command's key is derived from its first
event's id, so a second copy finds every row already there and adds only what a command gained
since: an openDiff the user decided after the first copy, a command settled after its process
died. A command under way is copied unfinished, as it is. A registered agent copies in its own
name (row-level security allows no other); the admin's copy keeps each command's recorded
caller. A position is a journal's own: a command or event that names another event by its
position (a restore, a replayed step) names it by its place in the team journal once copied.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from functools import partial
from itertools import islice
from typing import NamedTuple

import msgspec

from toolbus.bus import (
    EVENT_TYPES,
    AuditEntry,
    AuditQuery,
    Caller,
    CommandRecord,
    Event,
    FileReplayed,
    FileRestored,
    JournalReader,
    ObservationSaved,
    ReplayClose,
    ReplayWrite,
    RestoreFile,
    Status,
    ToolbusError,
    Unfinished,
    decode_event,
)
from toolbus.bus.moments import epoch_ns, parse_iso
from toolbus.journal.postgres.store import (
    AlreadyRecorded,
    Connection,
    PostgresJournal,
    append_events,
    finish_command,
    insert_blobs,
    insert_command,
)
from toolbus.journal.rows import Outcome, without_nul

COMMANDS_PER_BATCH = 500  # commands per transaction
_COPY_KEYS = uuid.UUID("5b1f6c2e-7d0a-4c59-9a55-3f1f0b6a1c00")  # namespace of copied commands' keys
# Commands whose `event` argument, and events whose `from_position`, is another event's position.
_NAMING_AN_EVENT = frozenset(command.tool for command in (RestoreFile, ReplayWrite, ReplayClose))
_FromEvent = FileRestored | FileReplayed


@dataclass(frozen=True, slots=True)
class Copied:
    commands: int  # copied now
    events: int
    observations: int
    already: int  # commands a previous copy brought
    updated: int  # of those, the ones with events, an error or an outcome recorded since, copied now
    stale: int  # of those, the ones an older copy finished in doubt that have an outcome here: kept as they were
    made_private: int  # department notes of another department, copied as the login's private ones


def copy_journal(source: JournalReader, target: PostgresJournal) -> Copied:
    """Copy `source`'s commands that left events into `target`, oldest first, in batches."""
    entries = [entry for entry in source.audit(AuditQuery(limit=None)) if entry.events]
    entries.reverse()
    as_login = None if target.department is None else Caller(agent=target.agent, department=target.department)
    event_ids = {stored.position: stored.event_id for entry in entries for stored in entry.events}
    commands = events = observations = already = updated = stale = made_private = 0
    pending = iter(entries)
    while batch := list(islice(pending, COMMANDS_PER_BATCH)):
        try:
            prepared = [_prepared(source, entry, as_login, event_ids) for entry in batch]
            results = target.run_sync(partial(_copy_batch, prepared=prepared))
        except (ToolbusError, ValueError) as error:
            if not commands + updated:
                raise
            also = f", {updated} brought up to date" if updated else ""
            raise Unfinished(
                f"{error} ({commands} commands were copied before it{also}, and stay: "
                "copy again to go on, it copies nothing twice)"
            ) from error
        for entry, result in zip(batch, results, strict=True):
            if result.fresh:
                commands += 1
            else:
                already += 1
                updated += result.updated
                stale += result.stale
            events += len(result.added)
            observations += sum(isinstance(event, ObservationSaved) for _, event in result.added)
            made_private += sum(
                isinstance(event, ObservationSaved) and event.visibility != entry.events[index].data["visibility"]
                for index, event in result.added
            )
    return Copied(commands, events, observations, already, updated, stale, made_private)


@dataclass(frozen=True, slots=True)
class _Prepared:
    outcome: Outcome
    key: uuid.UUID
    event_ids: list[str]
    recorded_at: list[str]  # each event's time
    finished_ns: int | None  # None: still under way, or its process died before an outcome
    pid: int | None
    named: dict[int, str]  # the local positions its arguments and events name, and their events' ids


def _prepared(
    source: JournalReader, entry: AuditEntry, as_login: Caller | None, event_ids: dict[int, str]
) -> _Prepared:
    caller = as_login or Caller(
        agent=entry.agent or "legacy",
        department=entry.department or "default",
        client_name=entry.client_name,
        client_version=entry.client_version,
        session_id=entry.session_id,
        host=entry.host,
    )
    if as_login is not None:
        caller = msgspec.structs.replace(
            as_login,
            client_name=entry.client_name,
            client_version=entry.client_version,
            session_id=entry.session_id,
            host=entry.host,
        )
    events = [_in_name_of(_event(stored.type, stored.data), as_login) for stored in entry.events]
    blobs = {
        digest: text for stored in entry.events for digest in stored.blobs if (text := source.blob(digest)) is not None
    }
    record = CommandRecord(
        tool=entry.tool, arguments=entry.arguments, caller=caller, received_ns=epoch_ns(parse_iso(entry.received_at).at)
    )
    status: Status = entry.status  # type: ignore[assignment]
    finished_ns = epoch_ns(parse_iso(entry.finished_at).at) if entry.finished_at else None
    key = uuid.uuid5(_COPY_KEYS, entry.events[0].event_id)
    named: dict[int, str] = {}
    for position in _named_positions(entry.tool, entry.arguments, events):
        if (event_id := event_ids.get(position)) is None:
            raise ValueError(f"the {entry.tool} command {entry.id} names event {position}, which the journal lacks")
        named[position] = event_id
    outcome = Outcome(record, status, entry.error, events, blobs)
    return _Prepared(
        outcome,
        key,
        [stored.event_id for stored in entry.events],
        [stored.recorded_at for stored in entry.events],
        finished_ns,
        entry.pid,
        named,
    )


def _named_positions(tool: str, arguments: object, events: list[Event]) -> set[int]:
    named = {event.from_position for event in events if isinstance(event, _FromEvent)}
    if (position := _argument_position(tool, arguments)) is not None:
        named.add(position)
    return named


def _argument_position(tool: str, arguments: object) -> int | None:
    """The position a command's `event` argument names, if its tool takes one."""
    if tool in _NAMING_AN_EVENT and isinstance(arguments, dict) and isinstance(arguments.get("event"), int):
        return int(arguments["event"])
    return None


def _renumbered(conn: Connection, prepared: _Prepared) -> Outcome:
    """The outcome with each position it names made the team journal's: the position of the
    event with the same id, copied before it (by this copy, or an earlier one of this login)."""
    outcome = prepared.outcome
    if not prepared.named:
        return outcome
    here: dict[int, int] = {}
    for position, event_id in prepared.named.items():
        row = conn.execute("SELECT position FROM events WHERE event_id = %s", (event_id,)).fetchone()
        if row is None:
            raise _HiddenEvent(
                f"event {position} of the local journal, which its {outcome.record.tool} command names, is in the "
                "team journal under another login: copy this journal with that login"
            )
        here[position] = int(row[0])
    events = [
        msgspec.structs.replace(event, from_position=here[event.from_position])
        if isinstance(event, _FromEvent)
        else event
        for event in outcome.events
    ]
    arguments = outcome.record.arguments
    if (named := _argument_position(outcome.record.tool, arguments)) is not None:
        arguments = {**arguments, "event": here[named]}
    record = msgspec.structs.replace(outcome.record, arguments=arguments)
    return outcome._replace(record=record, events=events)


class _HiddenEvent(ValueError):
    """An event a command names is another login's."""


def _event(type_name: str, data: dict[str, object]) -> Event:
    """A stored event (its data already upcast by the reader) as its Struct again."""
    cls = EVENT_TYPES.get(type_name)
    if cls is None:
        raise ValueError(f"the journal holds an event of a type this toolbus does not know ({type_name})")
    return decode_event(type_name, cls.version, msgspec.json.encode(data))


def _in_name_of(event: Event, as_login: Caller | None) -> Event:
    """An observation in the login's name. One for another department alone becomes private:
    in the login's name, the login's department would see what was never for it."""
    if as_login is None or not isinstance(event, ObservationSaved):
        return event
    visibility = event.visibility
    if visibility == "department" and event.department != as_login.department:
        visibility = "private"
    return msgspec.structs.replace(event, agent=as_login.agent, department=as_login.department, visibility=visibility)


class _Result(NamedTuple):
    fresh: bool  # the command was copied now (False: an earlier copy did, this login's or another's)
    updated: bool  # an earlier copy's, given the events, error or outcome it gained since
    stale: bool  # an earlier copy's, finished there otherwise than here (kept: history is not rewritten)
    added: list[tuple[int, Event]]  # the events copied now, by index, as copied


_ALREADY = _Result(fresh=False, updated=False, stale=False, added=[])


class _Found(NamedTuple):
    """The team journal's row of a command an earlier copy brought."""

    id: int
    owner: Caller  # its agent and department: its events are in their name
    status: str
    finished: bool
    error: str | None


def _copy_batch(conn: Connection, prepared: list[_Prepared]) -> list[_Result]:
    """Each command of the batch, copied or brought up to date."""
    with conn.transaction():
        results: list[_Result] = []
        for command in prepared:
            row = conn.execute(
                "SELECT id, agent, department, status, finished_at IS NOT NULL, error FROM commands"
                " WHERE request_key = %s",
                (command.key,),
            ).fetchone()
            try:
                with conn.transaction():  # a savepoint: a row only another login sees undoes this one alone
                    if row is None:
                        results.append(_copied(conn, command))
                    else:
                        found = _Found(int(row[0]), Caller(agent=row[1], department=row[2]), row[3], row[4], row[5])
                        results.append(_brought_up_to_date(conn, command, found))
            except AlreadyRecorded:
                results.append(_ALREADY)
    return results


def _copied(conn: Connection, command: _Prepared) -> _Result:
    try:
        outcome = _renumbered(conn, command)
    except _HiddenEvent:
        # Most likely the command is that login's too (its copy of this journal brought both):
        # inserting the row as it stands raises AlreadyRecorded if so. If not, the error stands,
        # and the savepoint it leaves by takes the row back.
        insert_command(conn, command.key, command.outcome.record, command.outcome.status, None, None)
        raise
    record = outcome.record
    command_id = insert_command(
        conn, command.key, record, outcome.status, outcome.error, command.finished_ns, pid=command.pid
    )
    added = list(enumerate(outcome.events))
    _add_events(conn, command_id, command, added, record.caller)
    return _Result(fresh=True, updated=False, stale=False, added=added)


def _brought_up_to_date(conn: Connection, command: _Prepared, found: _Found) -> _Result:
    """Add the events the team journal lacks of a command an earlier copy brought, in its owner's
    name; give it the error or outcome it gained since if it is unfinished there (a finished
    command is history: never rewritten)."""
    present = conn.execute("SELECT event_id FROM events WHERE event_id = ANY(%s)", (command.event_ids,)).fetchall()
    known = {row[0] for row in present}
    missing = [index for index, event_id in enumerate(command.event_ids) if event_id not in known]
    outcome = command.outcome
    finished_ns = None if found.finished else command.finished_ns
    error = outcome.error if not found.finished and found.error is None else None
    stale = found.finished and found.status != outcome.status
    if not missing and finished_ns is None and error is None:
        return _Result(fresh=False, updated=False, stale=stale, added=[])
    outcome = _renumbered(conn, command)
    added = [(index, _in_name_of(outcome.events[index], found.owner)) for index in missing]
    _add_events(conn, found.id, command, added, found.owner)
    if finished_ns is not None:
        finish_command(conn, found.id, outcome.status, outcome.error, outcome.record.received_ns, finished_ns)
    elif error is not None:  # settled after its process died: why it has no outcome
        conn.execute("UPDATE commands SET error = %s WHERE id = %s", (without_nul(error), found.id))
    return _Result(fresh=False, updated=True, stale=stale, added=added)


def _add_events(
    conn: Connection, command_id: int, command: _Prepared, events: list[tuple[int, Event]], owner: Caller
) -> None:
    """The command's events (by index), each at the time it was recorded, with the texts they name."""
    insert_blobs(conn, command.outcome.blobs or {}, owner.agent)
    for index, event in events:
        event_id, recorded_at = command.event_ids[index], command.recorded_at[index]
        append_events(conn, command_id, owner.agent, owner.department, [event], [event_id], recorded_at)
