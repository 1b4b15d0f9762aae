"""The memory store: a projection of `ObservationSaved` events, kept in the journal's own file.

It is written only by `apply_observation`, inside the transaction that appends the event,
so the journal and the store never disagree; `toolbus replay memory` rebuilds it.
"""

from __future__ import annotations

import sqlite3
from typing import TYPE_CHECKING, Any

import msgspec
import sqlite_utils

from bus import Caller, Fault, ObservationSaved, SearchObservations, Timeline

if TYPE_CHECKING:
    from journal.store import SqliteJournal

_json = msgspec.json.Encoder()


def create_memory_tables(db: sqlite_utils.Database) -> None:
    db["observations"].create(  # type: ignore[union-attr]
        {
            "id": int,  # the journal position of its ObservationSaved event
            "title": str,
            "text": str,
            "type": str,
            "project": str,
            "memory_session_id": str,
            "facts": str,  # JSON array
            "concepts": str,  # JSON array
            "agent": str,
            "department": str,
            "visibility": str,
            "created_at_epoch": int,
            "extra": str,  # JSON object
        },
        pk="id",
    )
    db["observations"].create_index(["project", "created_at_epoch"])  # type: ignore[union-attr]
    db["observations"].create_index(["created_at_epoch"])  # type: ignore[union-attr]


def apply_observation(conn: sqlite3.Connection, position: int, event: ObservationSaved) -> None:
    conn.execute(
        "INSERT INTO observations (id, title, text, type, project, memory_session_id, facts, concepts,"
        " agent, department, visibility, created_at_epoch, extra) VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?)",
        (
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
        ),
    )


class SqliteMemoryStore:
    """`handlers.ports.MemoryStore` over the journal's observation tables."""

    def __init__(self, journal: SqliteJournal) -> None:
        self._journal = journal

    async def search(self, command: SearchObservations, viewer: Caller) -> dict[str, Any]:
        raise Fault("search is being built")

    async def timeline(self, command: Timeline, viewer: Caller) -> dict[str, Any]:
        raise Fault("timeline is being built")

    async def get_observations(self, ids: list[int], viewer: Caller) -> dict[str, Any]:
        raise Fault("get_observations is being built")
