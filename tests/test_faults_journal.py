"""Journal and disk faults: a read-only place, a full disk, garbage where the journal should be,
the file replaced or removed under a running server. Each gives a clear error (at start or on
the call), the server keeps serving, and nothing is half-written.

"Full" and "read-only" use a small tmpfs (needs root; skipped otherwise). A file system cannot
be remounted read-only while a server holds the journal open for writing (EBUSY), so read-only
is tested at start; a running server meets a full disk instead.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import sqlite3
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from tests.faults_helpers import assert_sound, can_mount, deny_writes, remount, saved_titles, small_filesystem
from tests.journal_helpers import cli
from tests.rpc_client import ServerGone, StdioServer, result_json, result_text, toolbus_argv
from toolbus.bus import JournalUnavailable
from toolbus.journal import SqliteJournal
from toolbus.journal.sqlite.readonly import open_readonly, require_journal
from toolbus.journal.sqlite.store import explain_sqlite


def start_fails(tmp_path: Path, journal: Path) -> tuple[int | None, str]:
    """Start `toolbus serve`; it must refuse: its exit code and what it said on stderr."""
    stderr = tmp_path / "refused.stderr"
    with StdioServer(toolbus_argv(journal), stderr=stderr) as server:
        with pytest.raises(ServerGone):
            server.initialize(deadline=30)
        code = server.process.wait(timeout=30)
    return code, stderr.read_text()


def save(server: StdioServer, title: str, text: str = "t") -> dict[str, object]:
    return server.call_tool("save", {"title": title, "text": text}, deadline=30)


# --- garbage and strangers ---------------------------------------------------------------------


@pytest.mark.parametrize(
    "content",
    [os.urandom(64 * 1024), b"SQLite format 3\x00" + os.urandom(4000), b"not a journal\n" * 10],
    ids=["random", "sqlite-header-then-garbage", "text"],
)
def test_garbage_at_the_journal_path_is_refused_at_start_and_left_alone(tmp_path: Path, content: bytes) -> None:
    journal = tmp_path / "journal.db"
    journal.write_bytes(content)
    code, said = start_fails(tmp_path, journal)
    assert code == 2 and "journal" in said and str(journal) in said, said
    assert journal.read_bytes() == content
    assert sorted(p.name for p in tmp_path.iterdir()) == ["journal.db", "refused.stderr"]


def test_another_programs_database_is_refused_and_left_alone(tmp_path: Path) -> None:
    journal = tmp_path / "journal.db"
    with sqlite3.connect(journal) as conn:
        conn.execute("CREATE TABLE accounts (id INTEGER PRIMARY KEY, balance REAL)")
        conn.execute("INSERT INTO accounts (balance) VALUES (42)")
    conn.close()
    before = journal.read_bytes()
    code, said = start_fails(tmp_path, journal)
    assert code == 2 and "not a toolbus journal" in said, said
    assert journal.read_bytes() == before
    assert not Path(f"{journal}-wal").exists()


def test_a_journal_replaced_under_a_running_server_is_refused_on_the_call(tmp_path: Path) -> None:
    journal = tmp_path / "journal.db"
    garbage = os.urandom(32 * 1024)
    with StdioServer(toolbus_argv(journal), stderr=tmp_path / "server.stderr") as server:
        server.initialize()
        result_json(save(server, "before"))
        (tmp_path / "incoming").write_bytes(garbage)
        os.replace(tmp_path / "incoming", journal)
        for title in ("after 1", "after 2"):
            result = save(server, title)
            assert result.get("isError") and "replaced" in result_text(result), result
        assert server.alive()
        assert server.request("tools/list", {})["tools"]
        journal.unlink()
        result = save(server, "after removal")
        assert result.get("isError") and "removed" in result_text(result), result
    assert not journal.exists()  # nothing recreated it, nothing half-wrote it


# --- read-only -----------------------------------------------------------------------------------


def test_a_read_only_directory_is_a_clear_error_at_start(tmp_path: Path) -> None:
    journal = tmp_path / "state" / "journal.db"
    if can_mount():
        with small_filesystem(tmp_path / "state", "1m") as place:
            remount(place, "ro")
            code, said = start_fails(tmp_path, journal)
    else:
        journal.parent.mkdir()
        journal.parent.chmod(0o500)
        code, said = start_fails(tmp_path, journal)
        journal.parent.chmod(0o700)
    assert code == 2 and "cannot create the journal" in said and "--journal" in said, said
    assert not journal.exists()


def test_a_journal_under_a_file_names_that_file_at_start(tmp_path: Path) -> None:
    (tmp_path / "hello.py").write_text("x")
    journal = tmp_path / "hello.py" / "journal.db"
    code, said = start_fails(tmp_path, journal)
    assert code == 2, said
    assert f"cannot create the journal at {journal}: {tmp_path}/hello.py is a file, not a folder" in said


def test_a_journal_on_a_read_only_file_system_is_a_clear_error(tmp_path: Path) -> None:
    with small_filesystem(tmp_path / "state", "2m") as place:
        journal = place / "journal.db"
        with StdioServer(toolbus_argv(journal), stderr=tmp_path / "first.stderr") as server:
            server.initialize()
            result_json(save(server, "kept"))
        before = journal.read_bytes()
        remount(place, "ro")
        code, said = start_fails(tmp_path, journal)
        assert code == 2 and str(journal) in said, said
        assert "read-only" in said and "--journal" in said, said
        assert journal.read_bytes() == before
        remount(place, "rw")
        assert_sound(journal)
        assert list(saved_titles(journal).values()) == ["kept"]


def test_read_commands_read_a_journal_on_a_read_only_file_system(tmp_path: Path) -> None:
    """Nothing can be created there, not even the -shm index SQLite reads a log with: a journal
    whose log is empty is read whole from its file; one with a log is a one-line error."""
    with small_filesystem(tmp_path / "state", "2m") as place:
        journal = place / "journal.db"
        with StdioServer(toolbus_argv(journal), stderr=tmp_path / "first.stderr") as server:
            server.initialize()
            result_json(save(server, "kept"))
        remount(place, "ro")
        audit = cli("audit", "--tool", "save", "--journal", journal)
        assert audit.code == 0 and "kept" in audit.out, audit.err
        remount(place, "rw")
        with StdioServer(toolbus_argv(journal), stderr=tmp_path / "second.stderr") as server:
            server.initialize()
            result_json(save(server, "in the log"))
            server.process.kill()  # its log stays behind, unread into the file
        remount(place, "ro")
        audit = cli("audit", "--journal", journal)
        remount(place, "rw")
    assert audit.code == 0 and "in the log" in audit.out, audit.err


def test_read_commands_read_a_journal_on_a_full_disk(tmp_path: Path) -> None:
    """Nothing can be created there either: the -shm index a first attempt fails to make (and
    may leave behind, empty) does not stop the journal, whose log is empty, being read whole."""
    with small_filesystem(tmp_path / "state", "1m") as place:
        journal = place / "journal.db"
        with StdioServer(toolbus_argv(journal), stderr=tmp_path / "first.stderr") as server:
            server.initialize()
            result_json(save(server, "kept"))
        with open(place / "filler", "wb", buffering=0) as filler, contextlib.suppress(OSError):
            while True:
                filler.write(b"\0" * 4096)
        audits = [cli("audit", "--tool", "save", "--journal", journal) for _ in range(2)]  # what one leaves
    for audit in audits:
        assert audit.code == 0 and "kept" in audit.out, audit.err


def test_a_reader_that_may_not_write_still_sees_a_live_writers_commits(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A journal some connection has open, even with an empty log, is not read as immutable:
    such a reader takes no locks and would miss, or mix, what the writer checkpoints under it.
    (Root may write anything, so the answer of `os.access` is played here.)"""
    journal = tmp_path / "journal.db"
    SqliteJournal(journal).close()
    writer = sqlite3.connect(journal, isolation_level=None)
    try:
        writer.execute("PRAGMA wal_checkpoint(TRUNCATE)")  # open, with its log empty
        deny_writes(monkeypatch)
        link = tmp_path / "elsewhere" / "link.db"  # its -wal and -shm are beside the file it leads to
        link.parent.mkdir()
        link.symlink_to(journal)
        reader = open_readonly(link)
        tables = "SELECT count(*) FROM sqlite_master"
        before = reader.execute(tables).fetchone()[0]
        writer.execute("CREATE TABLE written_meanwhile (x)")
        writer.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        assert reader.execute(tables).fetchone()[0] == before + 1
        reader.close()
    finally:
        writer.close()


def test_a_new_journal_named_through_a_symlink_is_a_journal(tmp_path: Path) -> None:
    """Its first commits still sit in its log, beside the file the link leads to."""
    journal = tmp_path / "journal.db"
    writer = SqliteJournal(journal)
    try:
        assert int.from_bytes(journal.read_bytes()[68:72], "big") == 0  # the header does not say so yet
        link = tmp_path / "link.db"
        link.symlink_to(journal)
        require_journal(link)
    finally:
        writer.close()


def test_a_read_of_a_journal_file_it_may_not_write_leaves_nothing_behind(tmp_path: Path) -> None:
    """Not even the -wal and -shm files a read-only SQLite connection makes, which would keep a
    writer out once the journal is writable again. Read as another user where the tests are root."""
    place = Path(tempfile.mkdtemp(prefix="toolbus-ro-"))  # not under pytest's private directory
    try:
        place.chmod(0o777)
        journal = place / "journal.db"
        with StdioServer(toolbus_argv(journal), stderr=tmp_path / "server.stderr") as server:
            server.initialize()
            result_json(save(server, "kept"))
        journal.chmod(0o444)
        as_another_user = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"] if os.geteuid() == 0 else []
        audit = [sys.executable, "-m", "toolbus.adapters.cli", "audit", "--journal", str(journal)]
        run = subprocess.run([*as_another_user, *audit], capture_output=True, text=True, timeout=60, cwd=place)
        assert run.returncode == 0 and "kept" in run.stdout, run.stderr
        assert [path.name for path in place.iterdir()] == ["journal.db"]
        with StdioServer(toolbus_argv(journal), stderr=tmp_path / "server.stderr") as server:
            server.initialize()
            result_json(save(server, "only in the log"))  # the server has it open: a read takes its locks
            run = subprocess.run([*as_another_user, *audit], capture_output=True, text=True, timeout=60, cwd=place)
        assert run.returncode == 0 and "only in the log" in run.stdout, run.stderr
    finally:
        shutil.rmtree(place)


# --- full --------------------------------------------------------------------------------------


def fill(place: Path) -> Path:
    """Take every free byte of the file system with one file; return it (delete it to free)."""
    filler = place / "filler"
    with open(filler, "wb") as out:
        try:
            while True:
                out.write(b"\0" * 65536)
                out.flush()
        except OSError:
            pass
    return filler


def test_a_full_disk_is_an_error_on_the_call_and_nothing_is_lost(tmp_path: Path) -> None:
    with small_filesystem(tmp_path / "state", "4m") as place:
        journal = place / "journal.db"
        acknowledged: dict[int, str] = {}
        with StdioServer(toolbus_argv(journal), stderr=tmp_path / "server.stderr") as server:
            server.initialize()
            for index in range(5):
                acknowledged[int(result_json(save(server, f"early {index}"))["id"])] = f"early {index}"
            filler = fill(place)
            refused = 0
            for index in range(20):  # bounded: the disk stays full, so these must all be refused
                result = save(server, f"while full {index}", "q" * 50_000)
                if result.get("isError"):
                    refused += 1
                    assert "full" in result_text(result) and str(journal) in result_text(result)
                else:  # a page the journal already had may still fit
                    acknowledged[int(result_json(result)["id"])] = f"while full {index}"
            assert refused > 0 and server.alive()
            filler.unlink()
            for index in range(5):
                acknowledged[int(result_json(save(server, f"late {index}"))["id"])] = f"late {index}"
        state = assert_sound(journal)
        titles = saved_titles(journal)
        assert {i: titles.get(i) for i in acknowledged} == acknowledged
        assert all(c["status"] in ("ok", "in_doubt", "failed") for c in state.commands)


def fill_leaving(place: Path, headroom: int) -> Path:
    """A file taking all free space of `place` but `headroom` bytes."""
    stats = os.statvfs(place)
    filler = place / "filler"
    filler.write_bytes(b"\0" * max(stats.f_bavail * stats.f_frsize - headroom, 0))
    return filler


@pytest.mark.heavy
def test_filling_up_while_four_servers_write(tmp_path: Path) -> None:
    """The disk fills under concurrent writers: the errors say so (never "locked"), every
    acknowledged save survives, and once space is freed every server works again."""
    import threading

    with small_filesystem(tmp_path / "state", "16m") as place:
        journal = place / "journal.db"
        servers = [StdioServer(toolbus_argv(journal), stderr=tmp_path / f"s{n}.stderr") for n in range(4)]
        acknowledged: dict[int, str] = {}
        errors: list[str] = []
        lock = threading.Lock()

        def writer(server: StdioServer, name: str) -> None:
            for index in range(100):
                result = save(server, f"{name} {index}", "w" * 20_000)
                with lock:
                    if result.get("isError"):
                        errors.append(result_text(result))
                    else:
                        acknowledged[int(result_json(result)["id"])] = f"{name} {index}"

        try:
            for server in servers:
                server.initialize()
            filler = fill_leaving(place, 2 * 1024 * 1024)
            threads = [threading.Thread(target=writer, args=(s, f"s{n}")) for n, s in enumerate(servers)]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join(timeout=150)
                assert not thread.is_alive()
            assert errors, "the disk never filled"
            assert all("full" in error for error in errors), {e[:120] for e in errors}
            filler.unlink()
            for n, server in enumerate(servers):
                acknowledged[int(result_json(save(server, f"s{n} after"))["id"])] = f"s{n} after"
        finally:
            for server in servers:
                server.close()
        assert_sound(journal)
        titles = saved_titles(journal)
        assert {i: titles.get(i) for i in acknowledged} == acknowledged


HOLD_EXCLUSIVELY = """
import sqlite3, sys
conn = sqlite3.connect(sys.argv[1], isolation_level=None)
conn.execute("PRAGMA locking_mode = EXCLUSIVE")
conn.execute("BEGIN IMMEDIATE")
conn.execute("CREATE TABLE IF NOT EXISTS held (x)")
conn.execute("COMMIT")  # the lock stays: the mode keeps it until the connection closes
print("held", flush=True)
sys.stdin.read()
"""


def test_a_journal_another_process_holds_exclusively_is_said_to_be_locked(tmp_path: Path) -> None:
    """Not taken for one whose -shm cannot be made: the reader is told to try again."""
    journal = tmp_path / "journal.db"
    SqliteJournal(journal).close()
    with subprocess.Popen(
        [sys.executable, "-c", HOLD_EXCLUSIVELY, str(journal)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    ) as holder:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        audit = cli("audit", "--journal", journal, env={"TOOLBUS_JOURNAL_TIMEOUT": "0.3"})
        holder.communicate("")
    assert audit.code == 2 and audit.err.strip().endswith("is locked by another process (waited for it): try again")


def test_an_answer_for_an_act_done_drops_the_journals_advice_to_try_again(tmp_path: Path) -> None:
    """The act was done (or its text kept): a retry would repeat or undo it, so the answer keeps
    what failed and drops "try again", in the words each journal really uses."""
    journal = tmp_path / "journal.db"
    with contextlib.closing(sqlite3.connect(journal, isolation_level=None)) as holder:
        holder.execute("CREATE TABLE t (x)")
        holder.execute("BEGIN IMMEDIATE")
        with (
            contextlib.closing(sqlite3.connect(journal, timeout=0)) as writer,
            pytest.raises(sqlite3.DatabaseError) as held,
        ):
            writer.execute("INSERT INTO t VALUES (1)")
    locked = JournalUnavailable(explain_sqlite(journal, held.value))
    assert str(locked).endswith(": try again")
    assert locked.without_retry() == f"the journal at {journal} is locked by another process (waited for it)"
    saved = JournalUnavailable(f"{locked}. /src/a.py was not saved: it is unchanged")
    assert saved.without_retry() == f"{locked.without_retry()}. /src/a.py was not saved: it is unchanged"
    unanswered = "the team journal at postgresql://db/team did not answer within 10 s"
    assert JournalUnavailable(f"{unanswered}: check the server, and try again").without_retry() == unanswered
    full = JournalUnavailable(f"the disk holding the journal at {journal} is full: free space, nothing was written")
    assert full.without_retry() == str(full)
