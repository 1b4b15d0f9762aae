"""What each call waits for on the disk, counted at the source (`tests.sync_counter`).

A change's record is durable before its answer, at two syncs at most (the write-ahead row with
the text it must keep, then the outcome). A read's record is committed before its answer but
not synced: a fresh connection sees it at once, and a power cut (simulated: each journal file
as it was at its last sync) keeps it once the next change has synced, or the background flush
has, a fraction of a second later.
"""

from __future__ import annotations

import contextlib
import sqlite3
import time
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import anyio
import pytest

from tests.journal_helpers import OutcomesFail
from tests.sync_counter import SyncCounter, counting_syncs, fresh_copy
from toolbus.bus import (
    TOOL_COMMANDS,
    Bus,
    Caller,
    CommandRecord,
    Fault,
    InvalidArguments,
    JournalUnavailable,
    blob_hash,
)
from toolbus.handlers import HANDLERS, SaveOutcome, SaveTarget, TabMatch
from toolbus.journal.location import Synchronous
from toolbus.journal.sqlite import SqliteJournal, store
from toolbus.journal.sqlite.store import _Checkpointer
from toolbus.journal.worker import Worker

JOURNAL_THREAD = "toolbus-journal"  # where the bus's commits run: syncs there delay an answer
CALLER = Caller(agent="test")
OLD, NEW, UNSAVED = b"on disk before\n", b"written\n", b"typed, never saved\n"


@pytest.fixture
def syncs(monkeypatch: pytest.MonkeyPatch) -> Iterator[SyncCounter]:
    # No background checkpoints: they sync the WAL too, and would hide whether anything else did.
    monkeypatch.setattr(_Checkpointer, "nudge", lambda self: None)
    with counting_syncs(monkeypatch) as counter:
        yield counter


@pytest.fixture
def path(tmp_path: Path) -> Path:
    return tmp_path / "journal.db"


def record(tool: str, *, changes: bool) -> CommandRecord:
    return CommandRecord(tool=tool, arguments={}, caller=CALLER, received_ns=time.time_ns(), changes=changes)


def tools(database: Path) -> list[tuple[str, str]]:
    """(tool, status) of every command a fresh connection sees in the journal at `database`."""
    conn = sqlite3.connect(database)
    try:
        return list(conn.execute("SELECT tool, status FROM commands ORDER BY id"))
    finally:
        conn.close()


def blobs(database: Path) -> set[str]:
    conn = sqlite3.connect(database)
    try:
        return {digest for (digest,) in conn.execute("SELECT hash FROM blobs")}
    finally:
        conn.close()


# --- the journal ----------------------------------------------------------------------------


def test_a_read_commits_without_a_sync_and_the_next_change_syncs_it(
    syncs: SyncCounter, path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(store, "READ_FLUSH_DELAY", 60)  # no flush while we look
    journal = SqliteJournal(path)
    try:
        syncs.reset()
        anyio.run(journal.finish, record("search", changes=False), None, "ok")
        assert syncs.count(path) == 0
        assert tools(fresh_copy(path, tmp_path / "crash")) == [("search", "ok")]  # committed
        assert tools(syncs.power_cut(path, tmp_path / "cut1")) == []  # not yet on disk

        anyio.run(journal.finish, record("save", changes=True), None, "ok")
        assert syncs.count(path, JOURNAL_THREAD) == 1
        assert tools(syncs.power_cut(path, tmp_path / "cut2")) == [("search", "ok"), ("save", "ok")]
    finally:
        journal.close()


def test_a_read_reaches_the_disk_within_a_second_without_a_change(
    syncs: SyncCounter, path: Path, tmp_path: Path
) -> None:
    assert store.READ_FLUSH_DELAY < 1  # SPEC: on disk within one second at most
    journal = SqliteJournal(path)
    try:
        syncs.reset()
        anyio.run(journal.finish, record("search", changes=False), None, "ok")
        deadline = time.monotonic() + 10  # a loaded machine may be slow; the bound is the delay above
        while syncs.count(path, "toolbus-flush") == 0 and time.monotonic() < deadline:
            time.sleep(0.02)
        assert syncs.count(path) == syncs.count(path, "toolbus-flush") == 1
        assert tools(syncs.power_cut(path, tmp_path / "cut")) == [("search", "ok")]
    finally:
        journal.close()


def test_a_read_is_committed_by_its_caller_without_the_journal_thread(
    path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    journal = SqliteJournal(path)

    def no_hop(*args: object) -> None:
        raise AssertionError("a read's record went to the journal's thread")

    monkeypatch.setattr(Worker, "submit", no_hop)
    try:
        for _ in range(2):  # the second on the connection the first opened
            anyio.run(journal.finish, record("search", changes=False), None, "ok")
        assert tools(fresh_copy(path, tmp_path / "crash")) == [("search", "ok"), ("search", "ok")]
    finally:
        journal.close()


def test_a_read_is_committed_on_the_connection_searches_read_through(path: Path) -> None:
    """A commit by any other connection makes this one's page cache, and FTS5's, stale: the
    next search would read them again (~0.7 ms at 100k observations). `data_version` changes
    exactly when another connection has committed."""
    journal = SqliteJournal(path)

    def data_version() -> int:
        return int(journal.run_sync(lambda conn: conn.execute("PRAGMA data_version").fetchone()[0]))

    try:
        before = data_version()
        anyio.run(journal.finish, record("search", changes=False), None, "ok")
        assert data_version() == before
        assert tools(path) == [("search", "ok")]
    finally:
        journal.close()


def test_a_record_committed_at_once_is_never_committed_again(path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Resetting the connection after an at-once commit fails: the call fails, the record stays
    the one that was committed, and the journal's thread does not write it a second time."""
    journal = SqliteJournal(path)
    reset = journal._wait_for_others

    def failing_reset(wait: bool) -> None:
        if wait:
            raise sqlite3.OperationalError("disk I/O error")
        reset(wait)

    monkeypatch.setattr(journal, "_wait_for_others", failing_reset)
    try:
        with pytest.raises(sqlite3.OperationalError):
            anyio.run(journal.finish, record("search", changes=False), None, "ok")
        monkeypatch.setattr(journal, "_wait_for_others", reset)
        reset(True)
        assert tools(path) == [("search", "ok")]
    finally:
        journal.close()


@pytest.mark.parametrize(("synchronous", "size", "hops"), [("NORMAL", 10, 0), ("NORMAL", 1 << 17, 1), ("FULL", 10, 2)])
def test_only_a_change_that_waits_for_no_disk_and_writes_little_skips_the_journal_thread(
    path: Path, monkeypatch: pytest.MonkeyPatch, synchronous: Synchronous, size: int, hops: int
) -> None:
    assert store.AT_ONCE_BYTES < 1 << 17
    submitted: list[object] = []
    submit = Worker.submit

    def spy(self: Worker, *args: Any) -> Any:
        submitted.append(args)
        return submit(self, *args)

    monkeypatch.setattr(Worker, "submit", spy)
    text = b"x" * size
    journal = SqliteJournal(path, synchronous=synchronous)
    try:

        async def save() -> None:
            command_id = await journal.begin(record("saveDocument", changes=True), {blob_hash(text): text})
            await journal.finish(record("saveDocument", changes=True), command_id, "ok")

        anyio.run(save)
        assert len(submitted) == hops  # at NORMAL only the write-ahead carries the big text
        assert tools(path) == [("saveDocument", "ok")]
        assert blobs(path) == {blob_hash(text)}
    finally:
        journal.close()


def test_a_read_waits_for_another_writer_on_the_journal_thread_not_on_the_event_loop(path: Path) -> None:
    journal = SqliteJournal(path)
    other = sqlite3.connect(path, isolation_level=None)
    other.execute("BEGIN IMMEDIATE")  # another toolbus process, in the middle of its commit

    async def main() -> None:
        async with anyio.create_task_group() as calls:
            calls.start_soon(journal.finish, record("search", changes=False), None, "ok")
            await anyio.sleep(0.05)
            # The event loop runs on while the record waits: only it ends the other's transaction.
            other.execute("INSERT INTO commands (tool, received_at, status) VALUES ('other', 'now', 'ok')")
            other.execute("COMMIT")

    try:
        anyio.run(main)
        assert tools(path) == [("other", "ok"), ("search", "ok")]
    finally:
        other.close()
        journal.close()


def test_with_journal_sync_normal_nothing_waits_for_the_disk(syncs: SyncCounter, path: Path) -> None:
    journal = SqliteJournal(path, synchronous="NORMAL")
    try:
        syncs.reset()
        anyio.run(journal.finish, record("search", changes=False), None, "ok")
        anyio.run(journal.begin, record("saveDocument", changes=True), {blob_hash(OLD): OLD})
        assert syncs.count(path) == 0  # the user's choice: safe from a crash of toolbus only
    finally:
        journal.close()


def test_begin_keeps_its_texts_in_its_one_durable_transaction(syncs: SyncCounter, path: Path, tmp_path: Path) -> None:
    journal = SqliteJournal(path)
    try:
        syncs.reset()
        anyio.run(journal.begin, record("close_tab", changes=True), {blob_hash(UNSAVED): UNSAVED})
        assert syncs.count(path, JOURNAL_THREAD) == 1
        cut = syncs.power_cut(path, tmp_path / "cut")
        assert (tools(cut), blobs(cut)) == ([("close_tab", "in_doubt")], {blob_hash(UNSAVED)})
    finally:
        journal.close()


# --- tool calls through the bus ---------------------------------------------------------------


class FakeEditor:
    """One open file with unsaved text; before each action, checks what a power cut would keep."""

    def __init__(self, syncs: SyncCounter, journal: Path, scratch: Path, *, unsaved: bytes | None = UNSAVED) -> None:
        self.syncs, self.journal, self.scratch = syncs, journal, scratch
        self.unsaved = unsaved  # the buffer's text that is not on disk; None: not modified
        self.on_disk_before_acting: list[tuple[list[tuple[str, str]], set[str]]] = []
        self.committed_before_acting: list[list[tuple[str, str]]] = []  # what a crash of toolbus leaves

    def _look(self) -> None:
        seen = len(self.on_disk_before_acting)
        cut = self.syncs.power_cut(self.journal, self.scratch / f"cut{seen}")
        self.on_disk_before_acting.append((tools(cut), blobs(cut)))
        self.committed_before_acting.append(tools(fresh_copy(self.journal, self.scratch / f"crash{seen}")))

    async def is_dirty(self, path: str) -> bool | None:
        return True

    async def inspect_save(self, path: str) -> SaveTarget:
        return SaveTarget(status="ready", path=path, buffer=1, tick=1, before=OLD)

    async def write(self, target: SaveTarget) -> SaveOutcome:
        self._look()
        return SaveOutcome(status="saved", after=NEW)

    async def find_tab(self, tab_name: str, path: str | None, *, wipe_unmodified: bool = False) -> TabMatch:
        if self.unsaved is None and wipe_unmodified:
            self._look()
            return TabMatch(status="wiped", path=path or tab_name)
        modified = self.unsaved is not None
        return TabMatch(
            status="found", buffer=1, tick=1, path=path or tab_name, modified=modified, discarded=self.unsaved
        )

    async def wipe(self, buffer: int, tick: int) -> bool:
        self._look()
        return True

    async def close_diffs(self, tab_name: str | None, by: str) -> int:
        return 0  # no diff views: close_tab goes on to the file's buffer

    def forget_diff_tab(self, tab_name: str) -> bool:
        return False

    def diff_waiting(self, tab_name: str) -> bool:
        return False


def _bus(journal: Any, editor: FakeEditor) -> Bus:
    return Bus({c.tool: c for c in TOOL_COMMANDS}, HANDLERS, journal, SimpleNamespace(editor=editor))


@pytest.mark.parametrize(
    ("tool", "arguments", "kept"),
    [
        ("saveDocument", {"filePath": "/src/a.py"}, OLD),
        ("close_tab", {"tab_name": "/src/a.py"}, UNSAVED),
    ],
)
def test_a_change_takes_two_syncs_and_keeps_its_text_on_disk_before_it_acts(
    syncs: SyncCounter, path: Path, tmp_path: Path, tool: str, arguments: dict[str, str], kept: bytes
) -> None:
    journal = SqliteJournal(path)
    editor = FakeEditor(syncs, path, tmp_path)
    try:
        syncs.reset()
        anyio.run(_bus(journal, editor).handle, tool, arguments, CALLER)
        assert syncs.count(path, JOURNAL_THREAD) == 2
        assert editor.on_disk_before_acting == [([(tool, "in_doubt")], {blob_hash(kept)})]
        assert editor.committed_before_acting == [[(tool, "in_doubt")]]
        assert tools(syncs.power_cut(path, tmp_path / "after")) == [(tool, "ok")]
    finally:
        journal.close()


class GarbledEditor(FakeEditor):
    """Its write happens, then its answer makes the handler fail: a bug after the write."""

    async def write(self, target: SaveTarget) -> SaveOutcome:
        await super().write(target)
        raise TypeError("an answer the adapter did not expect")


def test_a_save_that_fails_by_a_bug_after_its_write_was_asked_is_in_doubt(
    syncs: SyncCounter, path: Path, tmp_path: Path
) -> None:
    journal = SqliteJournal(path)
    try:
        bus = _bus(journal, GarbledEditor(syncs, path, tmp_path))
        with pytest.raises(Fault, match="internal error"):
            anyio.run(bus.handle, "saveDocument", {"filePath": "/a"}, CALLER)
        assert tools(fresh_copy(path, tmp_path / "after")) == [("saveDocument", "in_doubt")]
        [doubt] = journal.run_sync(lambda conn: conn.execute("SELECT type, data FROM events").fetchall())
        assert doubt[0] == "FileWriteInDoubt" and blob_hash(OLD) in doubt[1]
    finally:
        journal.close()


def test_a_close_whose_unsaved_text_the_journal_holds_already_is_on_disk_before_the_wipe(
    syncs: SyncCounter, path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The text kept once already makes keeping it again an empty transaction, which SQLite
    neither writes nor syncs: the write-ahead row before it, committed without a sync, must
    reach the disk all the same before the wipe."""
    monkeypatch.setattr(store, "READ_FLUSH_DELAY", 60)  # no background flush while we look
    journal = SqliteJournal(path)
    editor = FakeEditor(syncs, path, tmp_path)
    try:
        bus = _bus(journal, editor)
        for _ in range(2):
            anyio.run(bus.handle, "close_tab", {"tab_name": "/src/a.py"}, CALLER)
        commands, texts = editor.on_disk_before_acting[1]
        assert commands == [("close_tab", "ok"), ("close_tab", "in_doubt")]
        assert texts == {blob_hash(UNSAVED)}
    finally:
        journal.close()


def test_closing_an_unmodified_buffer_takes_one_sync_and_writes_ahead_for_a_crash_of_toolbus(
    syncs: SyncCounter, path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Nothing to keep: the wipe changes only Neovim's memory, which a power cut takes too. The
    write-ahead row is committed before the wipe (a crash of toolbus finds the close in doubt)
    without waiting for the disk; the outcome's one sync brings both there before the answer."""
    monkeypatch.setattr(store, "READ_FLUSH_DELAY", 60)  # no background flush while we look
    journal = SqliteJournal(path)
    editor = FakeEditor(syncs, path, tmp_path, unsaved=None)
    try:
        syncs.reset()
        anyio.run(_bus(journal, editor).handle, "close_tab", {"tab_name": "/src/a.py"}, CALLER)
        assert syncs.count(path) == syncs.count(path, JOURNAL_THREAD) == 1
        assert editor.committed_before_acting == [[("close_tab", "in_doubt")]]
        assert editor.on_disk_before_acting == [([], set())]
        assert tools(syncs.power_cut(path, tmp_path / "after")) == [("close_tab", "ok")]
    finally:
        journal.close()


@pytest.mark.parametrize(
    ("tool", "arguments", "rejected"),
    [
        ("checkDocumentDirty", {"filePath": "/src/a.py"}, False),
        ("checkDocumentDirty", {"filePath": "src/a.py"}, True),
        ("no_such_tool", {}, True),
    ],
)
def test_a_read_or_a_rejected_call_takes_no_sync(
    syncs: SyncCounter, path: Path, tmp_path: Path, tool: str, arguments: dict[str, str], rejected: bool
) -> None:
    journal = SqliteJournal(path)
    try:
        syncs.reset()
        with pytest.raises(InvalidArguments) if rejected else contextlib.nullcontext():
            anyio.run(_bus(journal, FakeEditor(syncs, path, tmp_path)).handle, tool, arguments, CALLER)
        assert syncs.count(path, JOURNAL_THREAD) == 0
        status = "rejected" if rejected else "ok"
        assert tools(fresh_copy(path, tmp_path / "crash")) == [(tool, status)]  # committed before the answer
    finally:
        journal.close()


def test_a_memory_save_takes_one_sync(syncs: SyncCounter, path: Path, tmp_path: Path) -> None:
    journal = SqliteJournal(path)
    try:
        syncs.reset()
        anyio.run(_bus(journal, FakeEditor(syncs, path, tmp_path)).handle, "save", {"title": "t", "text": "x"}, CALLER)
        assert syncs.count(path, JOURNAL_THREAD) == 1
        assert tools(syncs.power_cut(path, tmp_path / "cut")) == [("save", "ok")]
    finally:
        journal.close()


def test_a_close_whose_outcome_cannot_be_recorded_stays_in_doubt_with_its_text(
    syncs: SyncCounter, path: Path, tmp_path: Path
) -> None:
    journal = SqliteJournal(path)
    try:
        with pytest.raises(JournalUnavailable):
            bus = _bus(OutcomesFail(journal), FakeEditor(syncs, path, tmp_path))
            anyio.run(bus.handle, "close_tab", {"tab_name": "/src/a.py"}, CALLER)
        cut = syncs.power_cut(path, tmp_path / "cut")
        assert (tools(cut), blobs(cut)) == ([("close_tab", "in_doubt")], {blob_hash(UNSAVED)})
    finally:
        journal.close()
