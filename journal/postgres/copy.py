"""`toolbus journal copy`: a local journal's memory and file history brought into a team journal.

Every command that left events is copied with its events (under their own event ids) and the
texts they name. The command's key is derived from its first event's id, so a second copy
finds every row already there and adds nothing. A registered agent copies in its own name
(row-level security allows no other); the admin's copy keeps each command's recorded caller.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from functools import partial
from itertools import islice

import msgspec

from toolbus.bus import (
    EVENT_TYPES,
    AuditEntry,
    AuditQuery,
    Caller,
    CommandRecord,
    Event,
    JournalReader,
    ObservationSaved,
    Status,
    decode_event,
)
from toolbus.bus.moments import epoch_ns, parse_iso
from toolbus.journal.postgres.store import AlreadyRecorded, Connection, PostgresJournal, insert_outcome
from toolbus.journal.rows import Outcome

_BATCH = 500  # commands per transaction
_COPY_KEYS = uuid.UUID("5b1f6c2e-7d0a-4c59-9a55-3f1f0b6a1c00")  # namespace of copied commands' keys


@dataclass(frozen=True, slots=True)
class Copied:
    commands: int  # copied now
    events: int
    observations: int
    already: int  # commands a previous copy brought
    made_private: int  # department notes of another department, copied as the login's private ones


def copy_journal(source: JournalReader, target: PostgresJournal) -> Copied:
    """Copy `source`'s commands that left events into `target`, oldest first, in batches."""
    entries = [entry for entry in source.audit(AuditQuery(limit=None)) if entry.events]
    entries.reverse()
    as_login = None if target.department is None else Caller(agent=target.agent, department=target.department)
    commands = events = observations = already = made_private = 0
    pending = iter(entries)
    while batch := list(islice(pending, _BATCH)):
        prepared = [_prepared(source, entry, as_login) for entry in batch]
        results = target.run_sync(partial(_copy_batch, prepared=prepared))
        for entry, (fresh, outcome) in zip(batch, results, strict=True):
            if not fresh:
                already += 1
                continue
            commands += 1
            events += len(outcome.events)
            observations += sum(isinstance(event, ObservationSaved) for event in outcome.events)
            made_private += sum(
                isinstance(event, ObservationSaved) and event.visibility != stored.data["visibility"]
                for event, stored in zip(outcome.events, entry.events, strict=True)
            )
    return Copied(commands, events, observations, already, made_private)


_Prepared = tuple[Outcome, uuid.UUID, list[str], int]


def _prepared(source: JournalReader, entry: AuditEntry, as_login: Caller | None) -> _Prepared:
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
    finished_ns = epoch_ns(parse_iso(entry.finished_at).at) if entry.finished_at else record.received_ns
    key = uuid.uuid5(_COPY_KEYS, entry.events[0].event_id)
    return Outcome(record, status, entry.error, events, blobs), key, [e.event_id for e in entry.events], finished_ns


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


def _copy_batch(conn: Connection, prepared: list[_Prepared]) -> list[tuple[bool, Outcome]]:
    """Each command of the batch, and whether it was copied now (False: an earlier copy did,
    this login's or another's)."""
    with conn.transaction():
        results: list[tuple[bool, Outcome]] = []
        for outcome, key, ids, finished_ns in prepared:
            exists = conn.execute("SELECT 1 FROM commands WHERE request_key = %s", (key,)).fetchone()
            copied = exists is None
            if copied:
                try:
                    with conn.transaction():  # a savepoint: a row only another login sees undoes this one alone
                        insert_outcome(conn, outcome, None, key, ids, finished_ns)
                except AlreadyRecorded:
                    copied = False
            results.append((copied, outcome))
    return results
