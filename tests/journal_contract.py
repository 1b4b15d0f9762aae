"""The contract every journal backend passes, as abstract test cases (pyeventsourcing's way):
a backend's test module subclasses `JournalContract` once and says how to open it.

Covered: append and gapless positions (also with writers in several processes), idempotent
blobs, the memory projection and its search semantics, visibility, audit filters, a file's
history (one machine's or every machine's), and recoverable texts — all through the ports
(`JournalWriter`, `JournalReader`, `MemoryStore`), never through a backend's connection.
"""

from __future__ import annotations

import functools
import multiprocessing
import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, ClassVar

import anyio
import pytest

from toolbus.bus import (
    Appended,
    AuditQuery,
    Caller,
    CommandRecord,
    DiffAcceptInDoubt,
    DiffProposed,
    DocumentSaved,
    Event,
    FileWriteInDoubt,
    JournalReader,
    JournalWriter,
    NoSuchEvent,
    ObservationSaved,
    TabClosed,
    TabCloseInDoubt,
    blob_hash,
    file_streams,
)
from toolbus.bus.moments import iso_time
from toolbus.bus.queries import SearchQuery
from toolbus.handlers import MemoryStore
from toolbus.journal import recoverable

CLAUDE = Caller(agent="claude", department="platform")
REVIEWER = Caller(agent="reviewer", department="platform")
STRANGER = Caller(agent="stranger", department="sales")


def record(tool: str, arguments: Any = None, caller: Caller = CLAUDE) -> CommandRecord:
    return CommandRecord(tool=tool, arguments=arguments or {}, caller=caller, received_ns=1_767_225_600_000_000_000)


NEW_YEAR_MS = 1_767_225_600_000  # 2026-01-01T00:00:00Z


def observation(
    title: str, text: str, *, visibility: str = "project", caller: Caller = CLAUDE, at: int = NEW_YEAR_MS
) -> ObservationSaved:
    return ObservationSaved(
        title=title,
        text=text,
        type="discovery",
        project="toolbus",
        memory_session_id="s1",
        facts=[],
        concepts=[],
        agent=caller.agent,
        department=caller.department,
        visibility=visibility,
        created_at_epoch=at,
    )


def saved(path: str, old: bytes | None, new: bytes) -> tuple[DocumentSaved, dict[str, bytes]]:
    blobs = {blob_hash(new): new} | ({blob_hash(old): old} if old is not None else {})
    event = DocumentSaved(
        path=path,
        written_blob=blob_hash(new),
        bytes_written=len(new),
        replaced_blob=blob_hash(old) if old is not None else None,
        disk_changed=False,
        reloaded=False,
    )
    return event, blobs


def _append_many(opener: Callable[[str], JournalWriter], location: str, count: int) -> None:
    """A writer in another process: `count` commands, one event each."""

    async def work() -> None:
        writer = opener(location)
        try:
            for index in range(count):
                await writer.finish(record("save"), None, "ok", events=[observation(f"n{index}", "from a process")])
        finally:
            writer.close()  # type: ignore[attr-defined]

    anyio.run(work)


HERE, ELSEWHERE = "workstation", "laptop"


def begin_and_die(opener: Callable[[str], JournalWriter], location: str, agent: str = "claude") -> None:
    """A toolbus on HERE killed mid-action: a save about to write (its retry's text and event
    replacing the first's), a close about to wipe, an accepted diff's write, and a save that
    finished; with, to be left
    alone, a command it said was of another machine and one whose pending event is not an
    action's doubt. No outcome is sent and nothing is closed, as after a kill -9."""
    here = Caller(agent=agent, department="platform", host=HERE)

    async def work() -> None:
        writer = opener(location)
        save = record("saveDocument", {"filePath": "/src/a.py"}, here)
        first = FileWriteInDoubt(path="/src/a.py", replaced_blob=blob_hash(b"first\n"))
        command_id = await writer.begin(save, {blob_hash(b"first\n"): b"first\n"}, pending=[first])
        retry = FileWriteInDoubt(path="/src/a.py", replaced_blob=blob_hash(b"retry\n"))
        await writer.keep_blobs({blob_hash(b"retry\n"): b"retry\n"}, command_id=command_id, pending=[retry])
        close = record("close_tab", {"tab_name": "b.md"}, here)
        command_id = await writer.begin(close, durable=False)
        wipe = TabCloseInDoubt(path="/src/b.md", tab_name="b.md", discarded_blob=blob_hash(b"unsaved\n"))
        await writer.keep_blobs({blob_hash(b"unsaved\n"): b"unsaved\n"}, command_id=command_id, pending=[wipe])
        accept = record("openDiff", {"new_file_path": "/src/d.py", "tab_name": "d"}, here)
        command_id = await writer.begin(accept, durable=False)
        final = blob_hash(b"accepted\n")
        accepted = [
            FileWriteInDoubt(path="/src/d.py", replaced_blob=None),
            DiffAcceptInDoubt(path="/src/d.py", tab_name="d", final_blob=final),
        ]
        await writer.keep_blobs({final: b"accepted\n"}, command_id=command_id, pending=accepted)
        done = record("saveDocument", {"filePath": "/src/c.py"}, here)
        command_id = await writer.begin(done, pending=[FileWriteInDoubt(path="/src/c.py", replaced_blob=None)])
        await writer.finish(done, command_id, "failed", error="E212: Can't open file for writing")
        elsewhere = Caller(agent=agent, department="platform", host=ELSEWHERE)
        away = FileWriteInDoubt(path="/src/away.py", replaced_blob=None)
        await writer.begin(record("saveDocument", {"filePath": "/src/away.py"}, elsewhere), pending=[away])
        await writer.begin(record("save", {}, here), pending=[observation("planted", "not a doubt", caller=here)])

    anyio.run(work)
    os._exit(0)


class JournalContract:
    """Subclass as `TestXJournal(JournalContract)` and give `location`, `open_writer`,
    `open_reader` and `memory_store` for the backend."""

    # For writers in other processes: a module-level function `location -> writer`.
    writer_factory: ClassVar[staticmethod[[str], JournalWriter]]

    @pytest.fixture
    def location(self, tmp_path: Path) -> str:
        raise NotImplementedError

    def open_writer(self, location: str) -> JournalWriter:
        return type(self).writer_factory(location)

    def open_reader(self, location: str) -> JournalReader:
        raise NotImplementedError

    def memory_store(self, writer: JournalWriter) -> MemoryStore:
        raise NotImplementedError

    @pytest.fixture
    def writer(self, location: str) -> Iterator[JournalWriter]:
        writer = self.open_writer(location)
        yield writer
        writer.close()  # type: ignore[attr-defined]

    @pytest.fixture
    def read(self, location: str) -> Iterator[Callable[[], JournalReader]]:
        """A fresh reader each call (it sees what was committed before it opened)."""
        opened: list[JournalReader] = []

        def open_one() -> JournalReader:
            opened.append(self.open_reader(location))
            return opened[-1]

        yield open_one
        for reader in opened:
            reader.close()

    # --- append --------------------------------------------------------------------------

    def test_appends_get_gapless_positions_in_commit_order(
        self, writer: JournalWriter, read: Callable[[], JournalReader]
    ) -> None:
        async def work() -> list[int]:
            positions: list[int] = []
            for batch in (1, 3, 0, 2):
                events = [observation(f"t{batch}-{i}", "x") for i in range(batch)]
                positions += [a.position for a in await writer.finish(record("save"), None, "ok", events=events)]
            return positions

        positions = anyio.run(work)
        assert positions == list(range(positions[0], positions[0] + 6))
        stored = list(read().events(["ObservationSaved"]))
        assert [event.position for event in stored] == positions
        assert [event.data["title"] for event in stored] == ["t1-0", "t3-0", "t3-1", "t3-2", "t2-0", "t2-1"]

    @pytest.mark.parametrize("durable", [True, False])
    def test_a_command_begun_stays_in_doubt_until_finished(
        self, writer: JournalWriter, read: Callable[[], JournalReader], durable: bool
    ) -> None:
        """Written ahead durably or not (a close with nothing to keep), it is committed: others see it."""
        call = record("saveDocument", {"filePath": "/src/a.py"})
        command_id = anyio.run(functools.partial(writer.begin, call, durable=durable))
        [entry] = read().audit(AuditQuery())
        assert (entry.id, entry.status, entry.events) == (command_id, "in_doubt", [])
        event, blobs = saved("/src/a.py", b"old\n", b"new\n")

        async def finish() -> list[Appended[DocumentSaved]]:
            return await writer.finish(call, command_id, "ok", events=[event], blobs=blobs)

        [(position, _)] = anyio.run(finish)
        [entry] = read().audit(AuditQuery())
        assert entry.status == "ok" and [e.position for e in entry.events] == [position]

    def test_a_command_that_ends_in_doubt_keeps_what_it_may_have_done(
        self, writer: JournalWriter, read: Callable[[], JournalReader]
    ) -> None:
        """Its event, under the file, leads `history` and `recover` to the text written ahead."""
        call = record("saveDocument", {"filePath": "/src/a.py"})
        kept = {blob_hash(b"before\n"): b"before\n"}
        doubt = FileWriteInDoubt(path="/src/a.py", replaced_blob=blob_hash(b"before\n"))

        async def work() -> list[Appended[FileWriteInDoubt]]:
            command_id = await writer.begin(call, kept)
            return await writer.finish(call, command_id, "in_doubt", error="Neovim did not answer", events=[doubt])

        [(position, _)] = anyio.run(work)
        reader = read()
        [entry] = reader.history("/src/a.py")
        assert (entry.event.position, entry.event.type, entry.status) == (position, "FileWriteInDoubt", "in_doubt")
        assert recoverable(reader, entry.event).content == b"before\n"

    def test_what_a_dead_process_was_doing_is_said_once_under_its_files(
        self, location: str, writer: JournalWriter, read: Callable[[], JournalReader]
    ) -> None:
        """`settle_abandoned` appends the pending events of this machine's commands whose process
        ended unfinished (its latest write-ahead's), not those of a live process, of another
        machine or of a finished command; a second call finds nothing."""
        dead = multiprocessing.get_context("spawn").Process(
            target=begin_and_die, args=(type(self).writer_factory, location)
        )
        dead.start()
        dead.join(timeout=120)
        assert dead.exitcode == 0
        live = FileWriteInDoubt(path="/src/live.py", replaced_blob=None)
        for host in (HERE, ELSEWHERE):  # this very process, alive; a process of another machine
            caller = Caller(agent="claude", department="platform", host=host)
            anyio.run(functools.partial(writer.begin, record("saveDocument", {}, caller), pending=[live]))

        assert anyio.run(writer.settle_abandoned, HERE) == 3
        assert anyio.run(writer.settle_abandoned, HERE) == 0
        reader = read()
        [save] = reader.history("/src/a.py", host=HERE)
        [close] = reader.history("/src/b.md", host=HERE)
        assert (save.event.type, save.status, close.event.type, close.status) == (
            "FileWriteInDoubt",
            "in_doubt",
            "TabCloseInDoubt",
            "in_doubt",
        )
        assert recoverable(reader, save.event).content == b"retry\n"
        assert recoverable(reader, close.event).content == b"unsaved\n"
        accepted, written = reader.history("/src/d.py", host=HERE)  # newest first
        assert (written.event.type, accepted.event.type) == ("FileWriteInDoubt", "DiffAcceptInDoubt")
        assert recoverable(reader, accepted.event).content == b"accepted\n"
        assert reader.history("/src/c.py") == reader.history("/src/live.py") == reader.history("/src/away.py") == []
        assert list(reader.events(["ObservationSaved"])) == []
        settled = [entry.error for entry in reader.audit(AuditQuery()) if entry.events]
        assert settled == 3 * [f"the toolbus process (pid {dead.pid}) ended before recording this command's outcome"]

    def test_writers_in_several_processes_share_one_gapless_order(
        self, location: str, read: Callable[[], JournalReader]
    ) -> None:
        context = multiprocessing.get_context("spawn")
        workers = [
            context.Process(target=_append_many, args=(type(self).writer_factory, location, 25)) for _ in range(3)
        ]
        for worker in workers:
            worker.start()
        for worker in workers:
            worker.join(timeout=120)
            assert worker.exitcode == 0
        positions = [event.position for event in read().events(["ObservationSaved"])]
        assert len(positions) == 75
        assert positions == list(range(positions[0], positions[0] + 75))

    # --- blobs ---------------------------------------------------------------------------

    def test_blobs_are_content_addressed_and_kept_once(
        self, writer: JournalWriter, read: Callable[[], JournalReader]
    ) -> None:
        text = "Grüße, 数据库\n".encode()

        async def work() -> None:
            await writer.keep_blobs({blob_hash(text): text})
            await writer.keep_blobs({blob_hash(text): text})  # a retry changes nothing

        anyio.run(work)
        reader = read()
        assert reader.blob(blob_hash(text)) == text
        assert reader.blob(blob_hash(b"never kept")) is None

    # --- memory --------------------------------------------------------------------------

    def _save(self, writer: JournalWriter, *observations: ObservationSaved) -> list[int]:
        async def work() -> list[int]:
            return [
                appended.position
                for item in observations
                for appended in await writer.finish(record("save"), None, "ok", events=[item])
            ]

        return anyio.run(work)

    def _search(self, writer: JournalWriter, text: str | None, viewer: Caller = CLAUDE) -> list[str]:
        store = self.memory_store(writer)
        page = anyio.run(store.search, SearchQuery(text=text, limit=100), viewer)
        assert page.total == len(page.results)
        return sorted(row.title for row in page.results)

    def test_search_semantics(self, writer: JournalWriter) -> None:
        self._save(
            writer,
            observation("Journal uses WAL", "readers and the writer stay apart"),
            observation("Write-ahead log", "the write-ahead row comes first; see src/store.py"),
            observation("Café notes", "optimisation of v1.2"),
            observation("データベース", "数据库 and 데이터 notes"),
        )
        assert self._search(writer, "apart writer readers") == ["Journal uses WAL"]
        assert self._search(writer, '"stay apart"') == ["Journal uses WAL"]
        assert self._search(writer, '"apart stay"') == []
        assert self._search(writer, "write-ahead") == ["Write-ahead log"]
        assert self._search(writer, "src/store.py") == ["Write-ahead log"]
        assert self._search(writer, "cafe") == ["Café notes"]
        assert self._search(writer, "optim*") == ["Café notes"]
        assert self._search(writer, "v1.2") == ["Café notes"]
        assert self._search(writer, "数据库") == ["データベース"]
        assert self._search(writer, "データ") == ["データベース"]
        for hostile in ['"unbalanced', "NEAR(a b)", "title:", "(*)", "^", "a AND OR", "* : ^"]:
            self._search(writer, hostile)  # never an error
        assert self._search(writer, "!!! ???") == []
        assert len(self._search(writer, None)) == 4

    def test_visibility(self, writer: JournalWriter) -> None:
        self._save(
            writer,
            observation("shared plan", "for all", visibility="project"),
            observation("platform plan", "for the department", visibility="department"),
            observation("claude plan", "mine alone", visibility="private"),
        )
        assert self._search(writer, "plan", CLAUDE) == ["claude plan", "platform plan", "shared plan"]
        assert self._search(writer, "plan", REVIEWER) == ["platform plan", "shared plan"]
        assert self._search(writer, "plan", STRANGER) == ["shared plan"]

    def test_get_observations_hides_what_the_caller_may_not_see(self, writer: JournalWriter) -> None:
        public, private = self._save(
            writer, observation("open", "x", visibility="public"), observation("closed", "y", visibility="private")
        )
        store = self.memory_store(writer)
        found = anyio.run(store.get_observations, [private, public, 999_999], STRANGER)
        assert [item["title"] for item in found.observations] == ["open"]
        assert sorted(found.missing) == sorted([private, 999_999])

    def test_observations_are_timed_in_the_order_of_their_ids(
        self, location: str, writer: JournalWriter, read: Callable[[], JournalReader]
    ) -> None:
        """Two servers on one journal: one read its clock (`at`), then waited while the other
        saved a note timed later. Its note comes after, and is timed a millisecond after: times
        grow with the ids, so an agent asking for the notes after the latest time it saw misses
        none. The time given back is the one stored, which a rebuild of the store keeps; a
        later clock keeps its own, and events of other types are not touched."""
        other = self.open_writer(location)
        at = NEW_YEAR_MS
        document, blobs = saved("/src/a.py", None, b"a\n")

        async def work() -> list[Appended[Event]]:
            appended: list[Appended[Event]] = []
            appended += await other.finish(record("save"), None, "ok", events=[observation("later", "x", at=at + 78)])
            appended += await writer.finish(record("save"), None, "ok", events=[observation("waited", "x", at=at)])
            several: list[Event] = [observation(f"batch {i}", "x", at=at + t) for i, t in enumerate((50, 200, 100))]
            appended += await writer.finish(record("save"), None, "ok", events=[*several, document], blobs=blobs)
            command_id = await writer.begin(record("save"))
            appended += await writer.append(command_id, [observation("appended", "x", at=at)], {})
            appended += await writer.finish(record("save"), None, "ok", events=[observation("ahead", "x", at=at + 500)])
            return appended

        try:
            appended = anyio.run(work)
        finally:
            other.close()  # type: ignore[attr-defined]
        assert [position for position, _ in appended] == list(range(appended[0].position, appended[0].position + 8))
        assert appended[5].event == document
        timed = {
            position: event.created_at_epoch for position, event in appended if isinstance(event, ObservationSaved)
        }
        assert list(timed.values()) == [at + delta for delta in (78, 79, 80, 200, 201, 202, 500)]
        stored = {event.position: event.data["created_at_epoch"] for event in read().events(["ObservationSaved"])}
        assert stored == timed
        listed = anyio.run(self.memory_store(writer).search, SearchQuery(limit=100, order_by="date_asc"), CLAUDE)
        assert [row.id for row in listed.results] == sorted(stored)
        assert read().check_memory().differences == []

    # --- audit, history, recovery ---------------------------------------------------------

    def test_audit_filters_and_history(self, writer: JournalWriter, read: Callable[[], JournalReader]) -> None:
        first, blobs_first = saved("/src/a.py", None, b"one\n")
        second, blobs_second = saved("/src/a.py", b"one\n", b"two\n")
        other, blobs_other = saved("/src/b.py", None, b"bee\n")

        async def work() -> None:
            await writer.finish(record("saveDocument"), None, "ok", events=[first], blobs=blobs_first)
            await writer.finish(
                record("saveDocument", caller=REVIEWER), None, "ok", events=[second], blobs=blobs_second
            )
            await writer.finish(record("saveDocument"), None, "ok", events=[other], blobs=blobs_other)
            await writer.finish(record("saveDocument", {"filePath": "rel"}), None, "rejected", error="filePath: ...")
            await writer.finish(record("search"), None, "ok")

        anyio.run(work)
        reader = read()
        assert [e.tool for e in reader.audit(AuditQuery())] == ["search"] + ["saveDocument"] * 4
        assert [e.status for e in reader.audit(AuditQuery(status="rejected"))] == ["rejected"]
        assert len(list(reader.audit(AuditQuery(tool="saveDocument", limit=2)))) == 2
        assert [e.agent for e in reader.audit(AuditQuery(agent="reviewer"))] == ["reviewer"]
        path_a = list(reader.audit(AuditQuery(paths=file_streams("/src/a.py"))))
        assert [e.events[0].data["written_blob"] for e in path_a] == [blob_hash(b"two\n"), blob_hash(b"one\n")]
        history = reader.history("/src/a.py")
        assert [(h.event.type, h.agent) for h in history] == [
            ("DocumentSaved", "reviewer"),
            ("DocumentSaved", "claude"),
        ]
        assert history[0].event.blobs == {blob_hash(b"two\n"): 4, blob_hash(b"one\n"): 4}

    def test_a_files_audit_lists_each_command_once_and_limits_commands(
        self, writer: JournalWriter, read: Callable[[], JournalReader]
    ) -> None:
        """A command with two events on the file (a diff proposed, then written) is one entry."""
        older, older_blobs = saved("/src/a.py", None, b"one\n")
        proposed = DiffProposed(path="/src/a.py", tab_name="t", old_path="/src/a.py", proposed_blob="p", shown_blob="s")
        doubt = FileWriteInDoubt(path="/src/a.py", replaced_blob=blob_hash(b"one\n"))

        async def work() -> int:
            await writer.finish(record("saveDocument"), None, "ok", events=[older], blobs=older_blobs)
            command_id = await writer.begin(record("openDiff"))
            await writer.append(command_id, [proposed], {})
            await writer.finish(record("openDiff"), command_id, "in_doubt", events=[doubt])
            return command_id

        diff = anyio.run(work)
        reader = read()
        paths = file_streams("/src/a.py")
        assert [(e.tool, len(e.events)) for e in reader.audit(AuditQuery(paths=paths))] == [
            ("openDiff", 2),
            ("saveDocument", 1),
        ]
        assert [e.id for e in reader.audit(AuditQuery(paths=paths, limit=1))] == [diff]
        assert [e.tool for e in reader.audit(AuditQuery(paths=paths, limit=2))] == ["openDiff", "saveDocument"]

    def test_a_files_audit_shows_its_changes_that_failed_before_any_event(
        self, writer: JournalWriter, read: Callable[[], JournalReader]
    ) -> None:
        """Neovim unreachable, say: no event names the file, the call's arguments do, however
        spelled (`~` only for a call made on the machine asking). Each is placed by when it was
        received among the rest, which are in the order of their newest event on the file (a
        diff cancelled with no event of its own: by its proposal), and every filter applies to
        it. A failed read of the file, or a failed change of another, is not the file's story."""
        first, blobs = saved("/src/a.py", None, b"one\n")
        proposed = DiffProposed(path="/src/a.py", tab_name="t", old_path="/src/a.py", proposed_blob="p", shown_blob="s")
        on_laptop = Caller(agent="claude", department="platform", host="laptop")
        home_file = os.path.expanduser("~/src/h.py")
        a_py = {"filePath": "/src/a.py"}

        def now(tool: str, arguments: dict[str, str], caller: Caller = CLAUDE) -> CommandRecord:
            return CommandRecord(tool=tool, arguments=arguments, caller=caller, received_ns=time.time_ns())

        async def work() -> str:
            await writer.finish(now("saveDocument", a_py), None, "failed", error="before all")
            await writer.finish(now("saveDocument", a_py), None, "ok", events=[first], blobs=blobs)
            diff = await writer.begin(now("openDiff", {"new_file_path": "/src/a.py"}))
            await writer.append(diff, [proposed], {})
            since = iso_time(time.time_ns())
            # A NUL in any argument: PostgreSQL's json operators could not read these arguments.
            spelled = {"filePath": "//src/../src/a.py", "note": "\x00"}
            await writer.finish(now("saveDocument", spelled), None, "failed", error="Neovim is not reachable")
            await writer.finish(now("checkDocumentDirty", a_py), None, "failed", error="a read")
            await writer.finish(now("openDiff", {"new_file_path": "/src/b.py"}), None, "rejected", error="b.py")
            await writer.finish(now("saveDocument", a_py, REVIEWER), None, "failed", error="reviewer")
            await writer.finish(
                now("saveDocument", {"filePath": "~/src/h.py"}, on_laptop), None, "failed", error="home"
            )
            # As a journal from before NUL was refused may hold it.
            await writer.finish(now("saveDocument", {"filePath": "~\x00/x"}, on_laptop), None, "rejected", error="nul")
            await writer.finish(now("openDiff", {}), diff, "cancelled")
            return since

        since = anyio.run(work)
        reader = read()
        paths = file_streams("/src/a.py")

        def errors(**filters: Any) -> list[str | None]:
            return [e.error or e.status for e in reader.audit(AuditQuery(paths=paths, **filters))]

        assert errors() == ["reviewer", "Neovim is not reachable", "cancelled", "ok", "before all"]
        assert [len(e.events) for e in reader.audit(AuditQuery(paths=paths))] == [0, 0, 1, 1, 0]
        assert errors(limit=2) == ["reviewer", "Neovim is not reachable"]
        assert errors(status="failed") == ["reviewer", "Neovim is not reachable", "before all"]
        assert errors(agent="claude") == ["Neovim is not reachable", "cancelled", "ok", "before all"]
        assert errors(since=since) == ["reviewer", "Neovim is not reachable"]
        assert errors(until=since) == ["cancelled", "ok", "before all"]
        assert errors(tool="openDiff") == ["cancelled"]
        [_, spelled] = reader.audit(AuditQuery(paths=paths, limit=2))
        assert spelled.target == "//src/../src/a.py"
        home = file_streams(home_file)
        assert [e.error for e in reader.audit(AuditQuery(paths=home, here="laptop"))] == ["home"]
        assert [e.error for e in reader.audit(AuditQuery(paths=home, here="server"))] == []  # another's `~`

    def test_history_keeps_machines_apart(self, writer: JournalWriter, read: Callable[[], JournalReader]) -> None:
        """One path on two machines is two files; a command whose machine is unknown (recorded
        before machines were) belongs to every machine's story."""
        laptop, server = Caller(agent="claude", host="laptop"), Caller(agent="claude", host="server")
        unknown, blobs_unknown = saved("/src/a.py", None, b"unknown\n")
        on_laptop, blobs_laptop = saved("/src/a.py", b"unknown\n", b"laptop\n")
        on_server, blobs_server = saved("/src/a.py", b"unknown\n", b"server\n")

        async def work() -> list[int]:
            [(position, _)] = await writer.finish(
                record("saveDocument"), None, "ok", events=[unknown], blobs=blobs_unknown
            )
            positions = [position]
            for caller, event, blobs in ((laptop, on_laptop, blobs_laptop), (server, on_server, blobs_server)):
                call = record("saveDocument", caller=caller)
                [(position, _)] = await writer.finish(call, None, "ok", events=[event], blobs=blobs)
                positions.append(position)
            return positions

        at_unknown, at_laptop, at_server = anyio.run(work)
        reader = read()

        def story(host: str | None) -> list[tuple[int, str | None]]:
            return [(h.event.position, h.host) for h in reader.history("/src/a.py", host=host)]

        assert story("laptop") == [(at_laptop, "laptop"), (at_unknown, None)]
        assert story("server") == [(at_server, "server"), (at_unknown, None)]
        assert story("elsewhere") == [(at_unknown, None)]
        assert story(None) == [(at_server, "server"), (at_laptop, "laptop"), (at_unknown, None)]
        assert [h.event.position for h in reader.history("/src/a.py", limit=1, host="laptop")] == [at_laptop]

        def audited(host: str | None) -> list[str | None]:
            return [e.host for e in reader.audit(AuditQuery(paths=file_streams("/src/a.py"), host=host))]

        assert audited("server") == ["server", None]
        assert audited(None) == ["server", "laptop", None]
        assert [e.host for e in reader.audit(AuditQuery(host="laptop"))] == ["laptop", None]

    def test_recoverable_texts(self, writer: JournalWriter, read: Callable[[], JournalReader]) -> None:
        save, blobs = saved("/src/a.py", b"before\n", b"after\n")
        close = TabClosed(path="/src/n.md", tab_name="n.md", was_modified=True, discarded_blob=blob_hash(b"unsaved\n"))

        async def work() -> list[int]:
            [(saved_at, _)] = await writer.finish(record("saveDocument"), None, "ok", events=[save], blobs=blobs)
            [(closed_at, _)] = await writer.finish(
                record("close_tab"), None, "ok", events=[close], blobs={blob_hash(b"unsaved\n"): b"unsaved\n"}
            )
            return [saved_at, closed_at]

        save_at, close_at = anyio.run(work)
        reader = read()
        assert recoverable(reader, reader.event_at(save_at)).content == b"before\n"
        found = recoverable(reader, reader.event_by_id(reader.event_at(close_at).event_id))
        assert (found.path, found.content) == ("/src/n.md", b"unsaved\n")
        with pytest.raises(NoSuchEvent):
            reader.event_at(close_at + 1)

    # --- text any client may send -----------------------------------------------------------

    def test_text_with_nul_is_recorded(self, writer: JournalWriter, read: Callable[[], JournalReader]) -> None:
        # The bus refuses lone surrogates before anything is recorded; a NUL it lets through.
        note = observation("nul\x00title", "text with a nul\x00 inside")

        async def work() -> None:
            await writer.finish(record("save", {"title": "nul\x00title"}), None, "ok", events=[note])
            await writer.finish(record("saveDocument", {"filePath": "\x00"}), None, "rejected", error="bad \x00 path")

        anyio.run(work)
        [title] = self._search(writer, "inside")
        assert self._search(writer, "nul") == [title] and title.startswith("nul") and title.endswith("title")
        [rejected, saved_note] = read().audit(AuditQuery())
        assert rejected.status == "rejected" and rejected.error is not None and rejected.error.startswith("bad ")
        assert saved_note.arguments == {"title": "nul\x00title"}  # the arguments, as JSON, keep it
