"""The team journal's memory store, rebuilt from its events (`toolbus replay memory`) or
checked against such a rebuild (`toolbus doctor`, `replay memory --check`)."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from itertools import islice
from typing import Any

import msgspec
import psycopg

from toolbus.bus import JournalUnavailable, MemoryCheck, ObservationSaved, decode_event
from toolbus.journal.postgres.memory import INSERT_OBSERVATION, observation_params

log = logging.getLogger("toolbus.journal")
_BATCH = 1000
_MAX_REPORTED = 20
_OBSERVATIONS = "SELECT position, version, data FROM events WHERE type = 'ObservationSaved' ORDER BY position"


def rebuild_memory(conn: psycopg.Connection[Any]) -> int:
    """Empty the store and project every saved observation again, in one transaction; the
    observation count. Only the journal's owner (the team's admin) may: agents cannot delete."""
    try:
        with conn.transaction():
            conn.execute("TRUNCATE observations")
            count, unreadable = _project(conn, "observations")
    except psycopg.errors.InsufficientPrivilege:
        raise JournalUnavailable(
            "only the team's admin may rebuild the memory store (every agent's notes): run it with the"
            " admin's URL; `toolbus replay memory --check` works for any agent"
        ) from None
    conn.execute("ANALYZE observations")  # the planner's statistics for the new rows: searches pick the word index
    if unreadable:
        log.warning("left out %d ObservationSaved events no toolbus wrote (unreadable): %s", *_listed(unreadable))
    return count


def check_memory(conn: psycopg.Connection[Any]) -> MemoryCheck:
    """Project the events into a temporary table and compare it with the live store, row by row
    (inside the caller's transaction; the temporary table goes with it)."""
    conn.execute("CREATE TEMPORARY TABLE rebuilt (LIKE observations) ON COMMIT DROP")
    count, unreadable = _project(conn, "rebuilt")
    missing = _ids(conn, "SELECT id FROM rebuilt EXCEPT SELECT id FROM observations")
    unknown = _ids(conn, "SELECT id FROM observations EXCEPT SELECT id FROM rebuilt")
    differing = _ids(
        conn,
        "SELECT id FROM (SELECT * FROM rebuilt EXCEPT SELECT * FROM observations) AS changed"
        " WHERE id IN (SELECT id FROM observations)",
    )
    problems = [
        *(f"events: @{p} is an ObservationSaved no toolbus wrote (unreadable): left out" for p in unreadable),
        *(f"observations: row {i} is missing from the live store" for i in missing),
        *(f"observations: row {i} is in the live store but in no journal event" for i in unknown),
        *(f"observations: row {i} differs from its event" for i in differing),
    ]
    if len(problems) > _MAX_REPORTED:
        problems = [*problems[:_MAX_REPORTED], f"observations: ... and {len(problems) - _MAX_REPORTED} more"]
    return MemoryCheck(observations=count, differences=problems)


def _project(conn: psycopg.Connection[Any], table: str) -> tuple[int, list[int]]:
    """The observations projected, and the positions of the events that could not be: an agent
    may insert any event in its own name over plain SQL, and one would stop every rebuild."""
    insert = INSERT_OBSERVATION.replace("INSERT INTO observations", f"INSERT INTO {table}", 1)
    count, unreadable = 0, list[int]()
    saved = _saved_observations(conn, unreadable)
    with conn.cursor() as cursor:
        while batch := list(islice(saved, _BATCH)):
            cursor.executemany(insert, [observation_params(position, event) for position, event in batch])
            count += len(batch)
    return count, unreadable


def _listed(positions: list[int]) -> tuple[int, str]:
    shown = ", ".join(f"@{p}" for p in positions[:_MAX_REPORTED])
    return len(positions), shown + (" ..." if len(positions) > _MAX_REPORTED else "")


def _saved_observations(conn: psycopg.Connection[Any], unreadable: list[int]) -> Iterator[tuple[int, ObservationSaved]]:
    # A server-side cursor: the events stream in, however many there are.
    with conn.cursor(name="toolbus_observations") as cursor:
        cursor.itersize = _BATCH
        for position, version, data in cursor.execute(_OBSERVATIONS):
            try:
                event = decode_event("ObservationSaved", version, data)
            except (msgspec.DecodeError, ValueError, TypeError, KeyError):
                unreadable.append(position)
                continue
            assert isinstance(event, ObservationSaved)
            yield position, event


def _ids(conn: psycopg.Connection[Any], sql: str) -> list[int]:
    return sorted(int(row[0]) for row in conn.execute(sql))
