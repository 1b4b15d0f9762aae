"""Changes are committed durably (synchronous=FULL); records of calls that changed nothing
need not wait for the disk, and never leave the journal less durable for what follows."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from bus import Caller, CommandRecord
from journal import SqliteJournal

pytestmark = pytest.mark.anyio


def record() -> CommandRecord:
    return CommandRecord(tool="getOpenEditors", arguments={}, caller=Caller(), received_ns=time.time_ns())


def synchronous(journal: SqliteJournal) -> int:
    return int(journal.run_sync(lambda conn: conn.execute("PRAGMA synchronous").fetchone()[0]))


async def test_a_query_record_relaxes_sync_only_for_its_own_commit(tmp_path: Path) -> None:
    journal = SqliteJournal(tmp_path / "journal.db")
    seen: list[int] = []
    original = journal.transaction

    def spying(conn):  # type: ignore[no-untyped-def]
        seen.append(conn.execute("PRAGMA synchronous").fetchone()[0])
        return original(conn)

    journal.transaction = spying  # type: ignore[method-assign]
    await journal.finish(record(), None, "ok")  # a query: no write-ahead row
    change = record()
    await journal.finish(change, await journal.begin(change), "ok")
    assert seen == [1, 2, 2]  # NORMAL for the query; FULL for the write-ahead row and its outcome
    assert synchronous(journal) == 2
    journal.close()


async def test_a_journal_configured_normal_stays_normal(tmp_path: Path) -> None:
    journal = SqliteJournal(tmp_path / "journal.db", synchronous="NORMAL")
    await journal.finish(record(), None, "ok")
    assert synchronous(journal) == 1
    journal.close()
