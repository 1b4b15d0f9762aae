"""The journal's write-ahead log stays small under a steady stream of commits.

SQLite starts the WAL over only when a commit finds every frame already copied into the
database; background checkpoints must leave it that way, or the WAL grows until the fallback
checkpoint and each commit extends the file.
"""

from __future__ import annotations

import time
from functools import partial
from pathlib import Path

from toolbus.bus import Caller, CommandRecord, DocumentSaved
from toolbus.journal import SqliteJournal
from toolbus.journal.rows import Outcome
from toolbus.journal.sqlite.store import FALLBACK_CHECKPOINT_PAGES

PAGE = 4096
WAL_HEADER = 32
COMMITS = 2000


def _save(index: int) -> Outcome:
    path = f"/project/src/file{index % 50}.py"
    caller = Caller(agent="test", department="test", client_name="test", session_id="s1")
    record = CommandRecord(tool="saveDocument", arguments={"filePath": path}, caller=caller, received_ns=time.time_ns())
    event = DocumentSaved(
        path=path,
        written_blob=f"{index:064x}",
        bytes_written=index,
        replaced_blob=None,
        disk_changed=False,
        reloaded=False,
    )
    return Outcome(record, "ok", events=(event,))


def _salt(wal: Path) -> bytes:
    """The WAL header's salts: SQLite changes them each time it starts the log over."""
    with wal.open("rb") as file:
        return file.read(WAL_HEADER)[16:24]


def test_steady_commits_keep_restarting_the_wal(tmp_path: Path) -> None:
    journal = SqliteJournal(tmp_path / "journal.db")
    wal = tmp_path / "journal.db-wal"
    restarts, largest = 0, 0
    try:
        salt = b""
        for index in range(COMMITS):
            journal.run_sync(partial(journal.record_many_sync, outcomes=[_save(index)]))
            if (now := _salt(wal)) != salt:
                restarts, salt = restarts + 1, now
            largest = max(largest, wal.stat().st_size // PAGE)
        assert journal.run_sync(lambda conn: conn.execute("SELECT count(*) FROM commands").fetchone()[0]) == COMMITS
    finally:
        journal.close()
    assert restarts >= 5, f"the WAL started over {restarts} times in {COMMITS} commits"
    assert largest < FALLBACK_CHECKPOINT_PAGES // 2, f"the WAL reached {largest} pages"
