"""Rebuilding the memory store from the journal, and checking it against a rebuild.

The memory store is a projection of `ObservationSaved` events. Rebuilding it projects every
such event, in journal order, after `reset_memory_tables` has emptied it — in bulk
(`journal.memory.load_observations`), to the same store `apply_observation` builds one event
at a time — in one transaction, so a reader never sees a half-built store.
"""

from __future__ import annotations

import gc
import sqlite3
import tempfile
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import msgspec

from toolbus.bus import MemoryCheck, ObservationSaved, decode_event
from toolbus.journal.sqlite.memory import load_observations, reset_memory_tables
from toolbus.journal.sqlite.sql import transaction

_OBSERVATIONS = "SELECT position, version, data FROM events WHERE type = 'ObservationSaved' ORDER BY position"
# FTS5 and FTS4 keep their index in shadow tables named after the virtual table.
_SHADOW_SUFFIXES = ("_data", "_idx", "_content", "_docsize", "_config", "_segments", "_segdir", "_stat")
_MAX_REPORTED = 20  # differences listed per table; the count covers all


# --- memory --------------------------------------------------------------------------------


def rebuild_memory(conn: sqlite3.Connection) -> int:
    """Empty the memory store and re-project every saved observation, in one transaction.
    Returns the number of observations."""
    # Every observation's id is the position of the event it is read from, in this very
    # transaction: checking each against `events` (the foreign key) would only cost time.
    # The setting can change only outside a transaction, hence here.
    with _settings(conn, {"foreign_keys": "OFF"}), transaction(conn):
        return project_observations(conn, conn)


def project_observations(source: sqlite3.Connection, target: sqlite3.Connection) -> int:
    """Reset `target`'s memory tables and apply `source`'s ObservationSaved events to them.
    Runs in the caller's transaction on `target`."""
    with _settings(target, _REBUILD_PRAGMAS), _without_gc():
        reset_memory_tables(target)
        return load_observations(target, _saved_observations(source))


# While a rebuild writes (on what may be the journal's own connection, so put back after):
# secure_delete FAST, because the system's SQLite may be built to zero every page freed by
# dropping the old store, which writes it all out a second time through the WAL (its text is
# in the events anyway).
_REBUILD_PRAGMAS: dict[str, str | int] = {"secure_delete": "FAST"}


@contextmanager
def _settings(conn: sqlite3.Connection, pragmas: dict[str, str | int]) -> Iterator[None]:
    saved = {name: conn.execute(f"PRAGMA {name}").fetchone()[0] for name in pragmas}
    for name, value in pragmas.items():
        conn.execute(f"PRAGMA {name} = {value}")
    try:
        yield
    finally:
        for name, value in saved.items():
            conn.execute(f"PRAGMA {name} = {value}")


@contextmanager
def _without_gc() -> Iterator[None]:
    """No cyclic garbage collection while hundreds of thousands of events are decoded: they
    form no cycles, and the collections their allocations set off cost about 5 % of a rebuild."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def _saved_observations(conn: sqlite3.Connection) -> Iterator[tuple[int, ObservationSaved]]:
    for position, version, data in conn.execute(_OBSERVATIONS):
        yield position, _observation(version, data)


_decode_observation = msgspec.json.Decoder(ObservationSaved).decode


def _observation(version: int, data: str | bytes) -> ObservationSaved:
    """`decode_event`, without its detour through a dict for data already in the current shape."""
    if version == ObservationSaved.version:
        try:
            return _decode_observation(data)
        except msgspec.ValidationError:
            pass  # decode_event says what is wrong, or mends a type tag that is off
    event = decode_event("ObservationSaved", version, data)
    assert isinstance(event, ObservationSaved)
    return event


def check_memory(live: sqlite3.Connection) -> MemoryCheck:
    """Rebuild the store into a scratch database and compare it with the live one, table by
    table and row by row. Reads the live journal only."""
    with tempfile.TemporaryDirectory(prefix="toolbus-check-") as folder:
        scratch = sqlite3.connect(Path(folder) / "memory.db", isolation_level=None)
        try:
            scratch.execute("BEGIN")
            count = project_observations(live, scratch)
            scratch.execute("COMMIT")
            differences = [line for name in _compared_tables(scratch) for line in _compare(name, scratch, live)]
        finally:
            scratch.close()
    return MemoryCheck(observations=count, differences=differences)


def _compared_tables(scratch: sqlite3.Connection) -> list[str]:
    """The store's tables. Of a full-text index's shadow tables only `_docsize` (per-row token
    counts) is compared: the others' layout depends on the order of merges, not on content."""
    rows = scratch.execute(
        "SELECT name, sql FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%' ORDER BY name"
    ).fetchall()
    virtual = [name for name, sql in rows if (sql or "").upper().startswith("CREATE VIRTUAL TABLE")]

    def is_internal(name: str) -> bool:
        return any(name.startswith(v + "_") and name.endswith(_SHADOW_SUFFIXES) for v in virtual)

    return [name for name, _ in rows if not is_internal(name) or name.endswith("_docsize")]


def _compare(table: str, scratch: sqlite3.Connection, live: sqlite3.Connection) -> list[str]:
    info = scratch.execute(f"PRAGMA table_info({_quoted(table)})").fetchall()
    columns = [row[1] for row in info]
    key = [row[1] for row in sorted(info, key=lambda row: row[5]) if row[5]] or ["rowid"]
    select = f"SELECT {', '.join(map(_quoted, key))}, {', '.join(map(_quoted, columns))} FROM {_quoted(table)}"
    rebuilt = _rows_by_key(scratch, select, len(key))
    try:
        live_rows = _rows_by_key(live, select, len(key))
    except sqlite3.OperationalError as error:
        return [f"{table}: cannot be read from the live store ({error})"]
    problems = [
        *(
            f"{table}: row {_key(k)} is missing from the live store"
            for k in sorted(rebuilt.keys() - live_rows.keys(), key=str)
        ),
        *(
            f"{table}: row {_key(k)} is in the live store but in no journal event"
            for k in sorted(live_rows.keys() - rebuilt.keys(), key=str)
        ),
        *(
            f"{table}: row {_key(k)} differs in {_changed(columns, rebuilt[k], live_rows[k])}"
            for k in sorted(rebuilt.keys() & live_rows.keys(), key=str)
            if rebuilt[k] != live_rows[k]
        ),
    ]
    if len(problems) > _MAX_REPORTED:
        problems = [*problems[:_MAX_REPORTED], f"{table}: ... and {len(problems) - _MAX_REPORTED} more"]
    return problems


def _rows_by_key(conn: sqlite3.Connection, select: str, width: int) -> dict[tuple[Any, ...], tuple[Any, ...]]:
    return {tuple(row[:width]): tuple(row[width:]) for row in conn.execute(select)}


def _key(key: tuple[Any, ...]) -> str:
    return str(key[0]) if len(key) == 1 else "(" + ", ".join(map(str, key)) + ")"


def _changed(columns: Sequence[str], expected: Sequence[Any], actual: Sequence[Any]) -> str:
    return ", ".join(
        f"{name} ({_short(want)} from the journal, {_short(got)} in the store)"
        for name, want, got in zip(columns, expected, actual, strict=True)
        if want != got
    )


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:39] + "…"


def _quoted(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'
