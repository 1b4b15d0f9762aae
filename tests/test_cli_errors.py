"""Bad input to the journal commands: one clear line on stderr, exit code 2, and no file
created or changed — not the journal, not a stranger's database, no -wal or -shm beside it."""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
from collections.abc import Callable
from functools import partial
from pathlib import Path

import pytest

from tests.journal_contract import observation, record
from tests.journal_helpers import Run, cli
from toolbus.adapters.config import journal_location
from toolbus.bus import Caller
from toolbus.journal import SqliteJournal
from toolbus.journal.rows import Outcome

# Every journal command, as `(journal path) -> arguments`.
COMMANDS: dict[str, Callable[[Path], list[str]]] = {
    "audit": lambda j: ["audit", "--journal", str(j)],
    "audit --json": lambda j: ["audit", "--json", "--journal", str(j)],
    "history": lambda j: ["history", "/tmp/a.txt", "--journal", str(j)],
    "recover": lambda j: ["recover", "1", "--journal", str(j)],
    "recover --apply": lambda j: ["recover", "1", "--apply", "--journal", str(j)],
    "replay memory": lambda j: ["replay", "memory", "--journal", str(j)],
    "replay memory --check": lambda j: ["replay", "memory", "--check", "--journal", str(j)],
    "replay editor": lambda j: ["replay", "editor", "--dry-run", "--journal", str(j)],
}


def snapshot(folder: Path) -> dict[str, tuple[int, int, bytes]]:
    """Every file in `folder`: size, mtime and content."""
    return {p.name: (p.stat().st_size, p.stat().st_mtime_ns, p.read_bytes()) for p in folder.iterdir()}


def assert_one_line_usage_error(run: Run, command: str, *fragments: str) -> None:
    assert run.code == 2, (run.code, run.out, run.err)
    assert run.out == ""
    assert run.err.endswith("\n") and run.err.count("\n") == 1, run.err
    assert run.err.startswith(f"toolbus {command.split()[0]}: "), run.err
    for fragment in fragments:
        assert fragment in run.err


# --- journals that are not there, or not journals ----------------------------------------


def stranger_rollback(folder: Path) -> Path:
    path = folder / "notes.db"
    with sqlite3.connect(path) as conn:
        conn.execute("CREATE TABLE notes (body TEXT)")
        conn.execute("INSERT INTO notes VALUES ('mine')")
    conn.close()
    return path


def stranger_wal(folder: Path) -> Path:
    path = folder / "app.db"
    conn = sqlite3.connect(path)
    conn.execute("PRAGMA journal_mode = WAL")
    conn.execute("CREATE TABLE things (id INTEGER PRIMARY KEY)")
    conn.commit()
    conn.close()
    return path


def text_file(folder: Path) -> Path:
    path = folder / "journal.db"
    path.write_text("not a database at all, just some text that is long enough to fill a header\n" * 3)
    return path


def empty_file(folder: Path) -> Path:
    path = folder / "journal.db"
    path.touch()
    return path


NOT_JOURNALS = {
    "someone else's SQLite database": (stranger_rollback, "a SQLite database of something else"),
    "someone else's WAL database": (stranger_wal, "a SQLite database of something else"),
    "a text file": (text_file, "not a SQLite database"),
    "an empty file": (empty_file, "an empty file"),
}


@pytest.mark.parametrize("command", COMMANDS)
@pytest.mark.parametrize("kind", NOT_JOURNALS)
def test_a_file_that_is_not_a_journal_is_refused_and_left_alone(tmp_path: Path, command: str, kind: str) -> None:
    make, why = NOT_JOURNALS[kind]
    path = make(tmp_path)
    before = snapshot(tmp_path)
    run = cli(*COMMANDS[command](path))
    assert_one_line_usage_error(run, command, "not a toolbus journal", str(path), why)
    assert snapshot(tmp_path) == before


@pytest.mark.parametrize("command", COMMANDS)
def test_a_journal_that_does_not_exist_is_not_created(tmp_path: Path, command: str) -> None:
    path = tmp_path / "state" / "toolbus" / "journal.db"
    run = cli(*COMMANDS[command](path))
    assert_one_line_usage_error(run, command, f"no journal at {path}")
    assert list(tmp_path.iterdir()) == []


def test_serve_says_a_directory_is_not_a_journal(tmp_path: Path) -> None:
    run = cli("serve", "--journal", tmp_path)
    assert_one_line_usage_error(run, "serve", f"not a toolbus journal: {tmp_path} is a directory")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    ("location", "fragment"),
    [
        ("postgresl://alice:s3cret@db.example/team", "a URL"),
        ("POSTGRE://alice:s3cret@db.example/team", "a URL"),
        (" postgresql://alice:s3cret@db.example/team", "a URL"),  # a blank before it
        ("postgresql:/alice:s3cret@db.example/team", "a URL"),  # one slash
        ("postgresl://alice:123/s3cret@db.example/team", "a URL"),  # a password with a slash
        ("postgresql//alice:s3cret@db.example/team", "a URL"),  # the colon left out
        ("//alice:s3cret@db.example/team", "a URL"),  # the scheme left out
        ("postgresql;//alice:s3cret@db.example/team", "a URL"),
        ("host=db.example password=s3cret dbname=team", "a key=value connection string"),
    ],
)
@pytest.mark.parametrize("command", ["serve", "doctor", "audit"])
def test_a_mistyped_team_url_is_refused_not_made_a_file_and_its_password_never_shown(
    tmp_path: Path, command: str, location: str, fragment: str
) -> None:
    run = cli(command, "--journal", location, cwd=tmp_path)
    assert_one_line_usage_error(run, command, f"$TOOLBUS_JOURNAL: {fragment}, not a journal file")
    assert "s3cret" not in run.err
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    "location",
    [
        "user=alice.db",
        "notes port=1.db",
        "odd=name.db",
        "postgres.db",
        "postgresql-journal.db",
        "postgres/journal.db",
        "Postgres (old).db",
    ],
)
def test_a_file_name_with_an_equals_sign_is_still_a_journal_file(tmp_path: Path, location: str) -> None:
    assert journal_location(location, {}) == Path(location)


def test_journal_copy_given_the_team_url_first_says_so_without_its_password(tmp_path: Path) -> None:
    run = cli("journal", "copy", "postgresql://alice:s3cret@db.example/team", tmp_path / "journal.db")
    assert_one_line_usage_error(run, "journal", "expected the local journal's file, got a URL", "comes second")
    assert "s3cret" not in run.err


def test_journal_copy_of_a_missing_file_names_its_argument(tmp_path: Path) -> None:
    run = cli("journal", "copy", tmp_path / "nowhere.db", "postgresql://alice@db.example/team")
    assert run.code == 2
    assert (
        run.err
        == f"toolbus journal: no journal at {tmp_path / 'nowhere.db'}: SQLITE_FILE names the local journal to copy\n"
    )


def test_a_team_url_is_read_whatever_the_case_of_its_scheme() -> None:
    assert journal_location("POSTGRESQL://alice@db.example/team", {}) == "postgresql://alice@db.example/team"
    assert journal_location("Postgres://alice@db.example/team", {}) == "postgres://alice@db.example/team"


@pytest.mark.parametrize("command", ["audit", "history", "recover", "recover --apply", "replay memory"])
def test_a_directory_is_not_a_journal(tmp_path: Path, command: str) -> None:
    run = cli(*COMMANDS[command](tmp_path))
    assert_one_line_usage_error(run, command, "not a toolbus journal", "is a directory")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("option", ["--agent", "--department", "--nvim", "--journal-sync"])
def test_history_takes_no_options_that_would_change_nothing(tmp_path: Path, option: str) -> None:
    """`history --agent nobody` read as a filter would silently show every agent's events."""
    run = cli("history", "/tmp/x.py", option, "FULL", "--journal", tmp_path / "journal.db")
    assert run.code == 2 and f"unrecognized arguments: {option}" in run.err
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("command", ["recover", "recover --apply", "replay memory", "replay memory --check"])
@pytest.mark.parametrize("option", ["--nvim", "--nvim-timeout"])
def test_commands_that_never_talk_to_neovim_take_no_neovim_options(tmp_path: Path, command: str, option: str) -> None:
    """`recover --apply --nvim X` read as "and reload it in X" would do nothing of the kind."""
    run = cli(*COMMANDS[command](tmp_path / "journal.db"), option, "5")
    assert run.code == 2 and f"unrecognized arguments: {option}" in run.err
    assert list(tmp_path.iterdir()) == []


def test_a_replay_from_after_its_end_is_refused(tmp_path: Path) -> None:
    """It printed `0 steps`, as if the journal held none."""
    run = cli("replay", "editor", "--dry-run", "--from", "8", "--to", "@1", "--journal", tmp_path / "journal.db")
    assert_one_line_usage_error(run, "replay", "--from 8 is after --to 1: no event could be replayed")
    assert list(tmp_path.iterdir()) == []


# --- bad values, on a real (empty) journal ------------------------------------------------


@pytest.fixture
def journal(tmp_path: Path) -> Path:
    path = tmp_path / "journal.db"
    SqliteJournal(path).close()
    return path


def assert_untouched(journal: Path, run: Callable[[], Run], command: str, *fragments: str) -> None:
    before = snapshot(journal.parent)
    assert_one_line_usage_error(run(), command, *fragments)
    assert snapshot(journal.parent) == before


@pytest.mark.parametrize(
    ("event", "fragment"),
    [
        ("999", "no event 999 in the journal"),
        ("@999", "no event @999 in the journal"),
        ("0123456789abcdef0123456789abcdef", "no event 0123456789abcdef0123456789abcdef"),
        (
            "last-one",
            "EVENT: expected an event position (e.g. 12) or an event id (32 hex digits), got 'last-one'",
        ),
    ],
)
@pytest.mark.parametrize("apply", [False, True])
def test_an_unknown_event(journal: Path, event: str, fragment: str, apply: bool) -> None:
    args = ["recover", event, "--journal", str(journal), *(["--apply"] if apply else [])]
    assert_untouched(journal, lambda: cli(*args), "recover", fragment)


@pytest.mark.parametrize(
    ("option", "value"),
    [("--since", "yesterday"), ("--until", "2026-13-45"), ("--since", "5 parsecs"), ("--until", "")],
)
def test_a_malformed_time(journal: Path, option: str, value: str) -> None:
    run = lambda: cli("audit", option, value, "--journal", str(journal))  # noqa: E731
    assert_untouched(journal, run, "audit", f"{option}: expected an ISO time", repr(value))


def test_a_malformed_time_is_reported_before_the_journal_is_looked_for(tmp_path: Path) -> None:
    run = cli("audit", "--since", "soon", "--journal", str(tmp_path / "missing.db"))
    assert_one_line_usage_error(run, "audit", "--since: expected an ISO time")


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (
            ["audit", "--status", "fine"],
            "--status: expected one of ok, rejected, failed, in_doubt, cancelled, got 'fine'",
        ),
        (["audit", "--limit", "-3"], "--limit: expected a whole number (0 for all), got '-3'"),
        (["history", "/tmp/x", "--limit", "many"], "--limit: expected a whole number"),
        (["replay", "editor", "--from", "first", "--dry-run"], "--from: expected an event position"),
        (["replay", "editor", "--map", "/only/one/side", "--dry-run"], "--map: expected FROM=TO"),
        (
            ["replay", "editor", "--map", "/src=/b", "--map", "/src=/c", "--dry-run"],
            "--map /src=/c: /src is mapped to /b already; nothing was replayed",
        ),
        (["audit", "--limit", "²"], "--limit: expected a whole number (0 for all), got '²'"),
        (["replay", "editor"], "--nvim ADDRESS is required"),
    ],
)
def test_other_bad_values(journal: Path, args: list[str], fragment: str) -> None:
    assert_untouched(journal, lambda: cli(*args, "--journal", str(journal)), args[0], fragment)


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (["recover", "99999999999999999999999"], "EVENT: expected an event position"),
        (["audit", "--since", "1000000d"], "--since: '1000000d' is out of range"),
        (["audit", "--until", "9999-12-31T23:59:59-14:00"], "--until: '9999-12-31T23:59:59-14:00' is out of range"),
        (["audit", "--limit", "99999999999999999999999"], "--limit: expected at most"),
        (["audit", "--since", "2h", "--until", "3h"], "--since 2h is not before --until 3h: no call could match"),
        (["history", "/tmp/x", "--limit", "99999999999999999999999"], "--limit: expected at most"),
        (["replay", "editor", "--from", "99999999999999999999", "--dry-run"], "--from: expected an event position"),
        (["replay", "editor", "--to", "@99999999999999999999", "--dry-run"], "--to: expected an event position"),
    ],
)
def test_numbers_out_of_range(journal: Path, args: list[str], fragment: str) -> None:
    assert_untouched(journal, lambda: cli(*args, "--journal", str(journal)), args[0], fragment)


@pytest.fixture
def recoverable_journal(tmp_path: Path) -> tuple[Path, int]:
    """A journal holding one save that replaced a text, and that event's position."""
    from toolbus.bus import Caller, CommandRecord, DocumentSaved, blob_hash
    from toolbus.journal.sqlite import Outcome

    path = tmp_path / "journal" / "journal.db"
    old, new = b"old text\n", b"new text\n"
    event = DocumentSaved(
        path="/src/a.txt",
        written_blob=blob_hash(new),
        bytes_written=len(new),
        replaced_blob=blob_hash(old),
        disk_changed=False,
        reloaded=False,
    )
    record = CommandRecord(tool="saveDocument", arguments={"filePath": "/src/a.txt"}, caller=Caller(), received_ns=1)
    store = SqliteJournal(path)
    try:
        [[position]] = store.run_sync(
            lambda conn: store.record_many_sync(
                conn, [Outcome(record, "ok", events=[event], blobs={blob_hash(old): old, blob_hash(new): new})]
            )
        )
    finally:
        store.close()
    return path, position


def test_recover_into_a_directory_or_a_missing_one(recoverable_journal: tuple[Path, int], tmp_path: Path) -> None:
    journal, position = recoverable_journal
    for target, fragment in [
        (tmp_path, f"-o: {tmp_path} is a directory"),
        (tmp_path / "missing" / "x.txt", f"-o: {tmp_path / 'missing'} does not exist"),
    ]:
        run = lambda target=target: cli("recover", str(position), "-o", str(target), "--journal", str(journal))  # noqa: E731
        assert_untouched(journal, run, "recover", fragment)
    assert not (tmp_path / "missing").exists()


def test_recover_onto_an_existing_file_needs_force(recoverable_journal: tuple[Path, int], tmp_path: Path) -> None:
    journal, position = recoverable_journal
    target = tmp_path / "kept.txt"
    target.write_bytes(b"precious\n")
    args = ["recover", str(position), "-o", str(target), "--journal", str(journal)]
    assert_one_line_usage_error(cli(*args), "recover", f"-o: {target} exists: add --force")
    assert target.read_bytes() == b"precious\n"
    forced = cli(*args, "--force")
    assert forced.code == 0, forced.err
    assert target.read_bytes() == b"old text\n"


@pytest.mark.parametrize("mode", [[], ["--apply"]])
def test_recover_refuses_force_without_a_file_to_overwrite(
    recoverable_journal: tuple[Path, int], mode: list[str]
) -> None:
    journal, position = recoverable_journal
    run = lambda: cli("recover", str(position), *mode, "--force", "--journal", str(journal))  # noqa: E731
    assert_untouched(journal, run, "recover", "--force goes only with -o FILE")


@pytest.mark.parametrize(
    ("command", "unbuffered"),
    [(["doctor"], False), (["audit"], False), (["--help"], False), (["--version"], False), (["--version"], True)],
)
def test_quiet_into_a_closed_pipe(journal: Path, command: list[str], unbuffered: bool) -> None:
    """`toolbus doctor | head -1`: the reader stops early; no traceback, no complaint."""
    import subprocess
    import sys

    argv = [sys.executable, "-m", "toolbus.adapters.cli", *command]
    argv += [] if command[0].startswith("--") else ["--journal", str(journal)]
    env = _buffered_env() | ({"PYTHONUNBUFFERED": "1"} if unbuffered else {})
    reader = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    assert reader.stdout is not None
    reader.stdout.close()  # as `head` does once it has its line, before toolbus writes
    _, err = reader.communicate(timeout=60)
    assert b"Traceback" not in err and b"BrokenPipe" not in err, err
    assert reader.returncode == 0, err


def _buffered_env() -> dict[str, str]:
    """The environment without PYTHONUNBUFFERED: stdout into a pipe or a file is then written
    when toolbus is done, as it is for most users."""
    return {name: value for name, value in os.environ.items() if name != "PYTHONUNBUFFERED"}


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="needs /dev/full")
# Not --help unbuffered: argparse itself drops a failed write of its help then.
@pytest.mark.parametrize(
    ("command", "unbuffered"),
    [
        (command, unbuffered)
        for command in (["doctor"], ["audit"], ["audit", "--json"], ["--version"])
        for unbuffered in (False, True)
    ]
    + [(["--help"], False)],
)
def test_a_full_disk_under_stdout_is_one_line(
    recoverable_journal: tuple[Path, int], command: list[str], unbuffered: bool
) -> None:
    """`toolbus audit > /dev/full`: a one-line error and exit 1, not a traceback, whether stdout
    is written as the command goes or when it is done."""
    import subprocess
    import sys

    journal, _ = recoverable_journal
    argv = [sys.executable, "-m", "toolbus.adapters.cli", *command]
    argv += [] if command[0].startswith("--") else ["--journal", str(journal)]
    env = _buffered_env() | ({"PYTHONUNBUFFERED": "1"} if unbuffered else {})
    with open("/dev/full", "wb") as full:
        run = subprocess.run(argv, stdout=full, stderr=subprocess.PIPE, timeout=60, text=True, env=env)
    who = "toolbus" if command[0].startswith("--") else f"toolbus {command[0]}"
    assert (run.returncode, run.stderr) == (1, f"{who}: cannot write its output: No space left on device\n")


def damaged_journal(path: Path) -> Path:
    """A journal of 100 notes cut short at 8 KiB: its header reads well, its pages do not."""
    journal = SqliteJournal(path)
    try:
        caller = Caller(agent="claude", department="platform")
        notes = [observation(f"note {i}", "words " * 400, caller=caller) for i in range(100)]
        outcomes = [Outcome(record("save", caller=caller), "ok", events=[note]) for note in notes]
        journal.run_sync(partial(journal.record_many_sync, outcomes=outcomes))
    finally:
        journal.close()
    with open(path, "r+b") as file:
        file.truncate(8192)
    return path


def test_a_damaged_journal_is_said_in_one_line_by_every_command_that_reads_it(tmp_path: Path) -> None:
    """A journal cut short (a disk that failed, a copy stopped half way): its header reads
    well, its pages do not. No traceback, and nothing written."""
    path = damaged_journal(tmp_path / "journal.db")
    before = snapshot(tmp_path)
    for command in (("audit",), ("history", "/src/a.py"), ("recover", "5"), ("replay", "memory", "--check")):
        run = cli(*command, "--journal", path)
        assert_one_line_usage_error(run, command[0], f"the journal at {path} is damaged")
    assert snapshot(tmp_path) == before


def test_a_relative_path_once_the_current_directory_is_gone_is_refused_in_one_line(tmp_path: Path) -> None:
    gone = tmp_path / "gone"
    gone.mkdir()
    toolbus = [sys.executable, "-m", "toolbus.adapters.cli"]
    for args in (["audit", "--journal", "rel.db"], ["audit", "--path", "a.py", "--journal", str(tmp_path / "j.db")]):
        done = subprocess.run(
            ["sh", "-c", 'cd "$1" && rmdir "$1" && shift && exec "$@"', "sh", gone, *toolbus, *args],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert done.returncode == 2, done.stderr
        [line] = done.stderr.splitlines()
        assert line.endswith("is relative, and the current directory no longer exists: give an absolute path")
        gone.mkdir()
