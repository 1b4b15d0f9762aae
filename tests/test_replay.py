"""`toolbus replay`: the memory store rebuilt from the journal alone, and a session's saves,
restores and closes re-applied to a second Neovim."""

from __future__ import annotations

import itertools
import json
import os
import re
import shutil
import socket
import sqlite3
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest

from tests.conftest import NeovimProcess, json_of, toolbus
from tests.journal_contract import record, saved
from tests.journal_helpers import EditorSession, cli, record_editor_session
from tests.test_cmdwin import CMDWIN, command_line_window
from toolbus.bus import HistoryEntry, JournalReader, blob_hash
from toolbus.journal import EditorStep, check_path_map, editor_steps, map_path, parse_path_map
from toolbus.journal.sqlite import SqliteJournal, SqliteReader
from toolbus.journal.sqlite.memory import reset_memory_tables

pytestmark = pytest.mark.anyio

OBSERVATIONS: list[dict[str, Any]] = [
    {
        "title": "Journal is the truth",
        "text": "The memory store is a projection of events.",
        "type": "decision",
    },
    {"title": "Fix flaky save", "text": "Reload before write when the disk changed.", "type": "bugfix"},
    {
        "title": "Private note",
        "text": "Only the writer may see this projection note.",
        "visibility": "private",
    },
    {
        "title": "東京の会議",
        "text": "東京タワーの近くで会議をしました",
        "project": "travel",
        "concepts": ["会議"],
    },
    {
        "title": "Department memo",
        "text": "Replay rebuilds the store",
        "visibility": "department",
        "facts": ["rebuild"],
    },
    {
        "title": "Old idea",
        "text": "A projection can be thrown away",
        "project": "travel",
        "files_read": ["a.py"],
    },
]
SEARCHES: list[dict[str, Any]] = [
    {},
    {"query": "projection"},
    {"query": "projection", "orderBy": "date_asc"},
    {"query": "会議"},
    {"query": '"the store"'},
    {"query": "rebuild"},
    {"project": "travel"},
    {"type": "bugfix,decision"},
    {"query": "note", "limit": 1, "offset": 0},
]


async def memory_answers(journal: Path, agent: str) -> list[Any]:
    """Every search, a timeline and the full observations, as `agent` sees them."""
    async with toolbus(journal, None, "--agent", agent) as client:
        answers = [json_of(await client.call_tool("search", search)) for search in SEARCHES]
        answers.append(json_of(await client.call_tool("timeline", {"query": "store"})))
        answers.append(json_of(await client.call_tool("get_observations", {"ids": list(range(1, 10))})))
        return answers


@pytest.fixture
async def memory_journal(tmp_path: Path) -> Path:
    journal = tmp_path / "journal.db"
    async with toolbus(journal, None, "--agent", "writer") as client:
        for observation in OBSERVATIONS:
            json_of(await client.call_tool("save", observation))
    return journal


def empty_the_store(journal: Path) -> None:
    conn = sqlite3.connect(journal, isolation_level=None)
    try:
        conn.execute("BEGIN IMMEDIATE")
        reset_memory_tables(conn)
        conn.execute("COMMIT")
    finally:
        conn.close()


def tamper(journal: Path, sql: str) -> None:
    conn = sqlite3.connect(journal, isolation_level=None)
    try:
        conn.execute(sql)
    finally:
        conn.close()


# --- replay memory -------------------------------------------------------------------------


async def test_replay_memory_rebuilds_a_deleted_store(memory_journal: Path) -> None:
    before = {agent: await memory_answers(memory_journal, agent) for agent in ("writer", "stranger")}
    assert before["writer"][1]["total"] == 3  # the searches find things, or this test proves nothing

    empty_the_store(memory_journal)
    emptied = await memory_answers(memory_journal, "writer")
    assert emptied[0]["results"] == [] and emptied[1]["results"] == []

    run = cli("replay", "memory", "--journal", memory_journal)
    assert run.code == 0, run.err
    assert run.out == f"rebuilt the memory store from {len(OBSERVATIONS)} saved observations\n"
    for agent, answers in before.items():
        assert await memory_answers(memory_journal, agent) == answers
    assert cli("replay", "memory", "--check", "--journal", memory_journal).code == 0


async def test_replay_memory_check_finds_nothing_in_an_intact_store_and_changes_nothing(
    memory_journal: Path,
) -> None:
    before = {p.name: (p.stat().st_mtime_ns, p.read_bytes()) for p in memory_journal.parent.iterdir()}
    run = cli("replay", "memory", "--check", "--journal", memory_journal)
    assert (run.code, run.err) == (0, "")
    assert run.out == f"checked the memory store against {len(OBSERVATIONS)} saved observations: no differences\n"
    assert {p.name: (p.stat().st_mtime_ns, p.read_bytes()) for p in memory_journal.parent.iterdir()} == before


@pytest.mark.parametrize(
    ("sql", "expected"),
    [
        ("UPDATE observations SET title = 'Forged' WHERE id = 2", "observations: row 2 differs in title"),
        ("DELETE FROM observations WHERE id = 3", "observations: row 3 is missing from the live store"),
        (
            "INSERT INTO observations SELECT 99, title, text, type, project, memory_session_id, facts, concepts,"
            " agent, department, visibility, created_at_epoch, extra FROM observations WHERE id = 1",
            "observations: row 99 is in the live store but in no journal event",
        ),
        ("DROP TABLE observations", "observations: cannot be read from the live store"),
    ],
)
async def test_replay_memory_check_detects_a_tampered_store(memory_journal: Path, sql: str, expected: str) -> None:
    tamper(memory_journal, sql)
    run = cli("replay", "memory", "--check", "--journal", memory_journal)
    assert run.code == 1, run.err
    assert expected in run.out
    assert "difference(s)" in run.out.splitlines()[-1]
    # ... and a replay mends it
    assert cli("replay", "memory", "--journal", memory_journal).code == 0
    assert cli("replay", "memory", "--check", "--journal", memory_journal).code == 0


# --- replay editor -------------------------------------------------------------------------


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory) -> tuple[EditorSession, Path]:
    """A session recorded once per module (its paths are in the journal), and a copy of its
    files and journal as they were at its end."""
    recorded = record_editor_session(tmp_path_factory.mktemp("recorded"))
    # a restore too: the unsaved text the close of b.txt discarded, written back
    closed = recorded.position("TabClosed", "b.txt")
    assert cli("recover", str(closed), "--apply", "--journal", recorded.journal).code == 0
    recorded.nvim.kill()
    pristine = tmp_path_factory.mktemp("pristine")
    shutil.copytree(recorded.root, pristine, dirs_exist_ok=True, ignore=shutil.ignore_patterns("nvim*"))
    return recorded, pristine


@pytest.fixture
def session(recorded: tuple[EditorSession, Path]) -> EditorSession:
    """That session, its files and journal as recorded (a test may change both; tests of one
    process run one at a time)."""
    session, pristine = recorded
    for name in ("work", "state"):
        shutil.rmtree(session.root / name)
        shutil.copytree(pristine / name, session.root / name)
    return session


@pytest.fixture
def second_nvim(tmp_path: Path) -> Iterator[NeovimProcess]:
    process = NeovimProcess(tmp_path / "second")
    yield process
    process.kill()


def open_buffers(nvim: NeovimProcess) -> set[str]:
    return {os.path.realpath(name) for name in nvim.buffer_names() if name}


def final_contents(session: EditorSession) -> dict[str, bytes]:
    return {name: path.read_bytes() for name, path in session.files.items()}


def test_replay_editor_reproduces_the_files_in_another_place(
    session: EditorSession, second_nvim: NeovimProcess, tmp_path: Path
) -> None:
    work = os.path.realpath(session.files["a.txt"].parent)
    elsewhere = tmp_path / "elsewhere" / "work"
    run = cli(
        "replay",
        "editor",
        "--nvim",
        second_nvim.address,
        "--map",
        f"{work}={elsewhere}",
        "--journal",
        session.journal,
    )
    assert run.code == 0, run.err
    expected = final_contents(session)
    assert expected == {
        "a.txt": b"alpha 3 (edited on disk)\n",
        "b.txt": b"bravo unsaved\n",
        "c.txt": b"charlie 2\n",
    }
    assert {path.name: path.read_bytes() for path in elsewhere.iterdir()} == expected
    # the files are open in the second Neovim, unmodified, holding what was written
    assert open_buffers(second_nvim) == {str(elsewhere / name) for name in expected}
    for name, content in expected.items():
        assert second_nvim.lines(elsewhere / name) == content.decode().splitlines()
        assert not second_nvim.modified(elsewhere / name)
    lines = run.out.splitlines()
    assert lines[0] == f"@1 save {elsewhere}/a.txt (recorded as {work}/a.txt): write 8 bytes"
    # b.txt's close came before any write of it there: that step had nothing to do
    closed = session.position("TabClosed", "b.txt")
    moved = f"(recorded as {work}/b.txt)"
    assert f"@{closed} close {elsewhere}/b.txt {moved} (not open there: nothing to close)" in lines
    assert lines[-1] == (
        f"replayed {len(lines) - 1} steps to Neovim at {second_nvim.address}; "
        "1 close found the file not open there: nothing to do"
    )


def test_replay_editor_restores_files_in_place(session: EditorSession, second_nvim: NeovimProcess) -> None:
    expected = final_contents(session)
    for path in session.files.values():
        path.write_text("lost\n")
    run = cli("replay", "editor", "--nvim", second_nvim.address, "--journal", session.journal)
    assert run.code == 0, run.err
    assert final_contents(session) == expected


def test_replay_editor_writes_exact_bytes_and_replays_closes(tmp_path: Path, second_nvim: NeovimProcess) -> None:
    recorded = tmp_path / "recorded"
    nvim = NeovimProcess(recorded / "nvim")
    dos, plain = recorded / "dos.txt", recorded / "plain.txt"
    dos.write_bytes(b"one\r\ntwo\r\n")
    plain.write_bytes(b"no final newline")
    journal = recorded / "journal.db"

    async def work() -> None:
        async with toolbus(journal, nvim.address) as client:
            for path in (dos, plain):
                nvim.edit(path)
                nvim.set_lines(path, [*nvim.lines(path), "added"])
                assert json_of(await client.call_tool("saveDocument", {"filePath": str(path)}))["saved"]
            await client.call_tool("close_tab", {"tab_name": "plain.txt"})

    try:
        anyio.run(work)
    finally:
        nvim.kill()
    written = {path: path.read_bytes() for path in (dos, plain)}
    assert written[dos] == b"one\r\ntwo\r\nadded\r\n"
    for path in (dos, plain):
        path.unlink()
    run = cli("replay", "editor", "--nvim", second_nvim.address, "--journal", journal)
    assert run.code == 0, run.err
    assert {path: path.read_bytes() for path in (dos, plain)} == written
    assert open_buffers(second_nvim) == {os.path.realpath(dos)}  # plain.txt was closed again
    assert run.out.splitlines()[2] == f"@3 close {os.path.realpath(plain)}"
    # The replay went through the bus: each step a journaled command with its FileReplayed event.
    audit = cli("audit", "--json", "--journal", journal)
    replays = [json.loads(line) for line in audit.out.splitlines()][:3]
    assert [(c["tool"], c["status"]) for c in replays] == [
        ("replay_close", "ok"),
        ("replay_write", "ok"),
        ("replay_write", "ok"),
    ]
    assert {c["host"] for c in replays} == {socket.gethostname()}  # replayed on this machine
    assert [(e["type"], e["data"]["action"], e["data"]["from_position"]) for c in replays for e in c["events"]] == [
        ("FileReplayed", "close", 3),
        ("FileReplayed", "write", 2),
        ("FileReplayed", "write", 1),
    ]
    again = cli("replay", "editor", "--dry-run", "--journal", journal)
    assert again.out.splitlines()[-1].startswith("3 steps")  # a replay is not replayed again
    # The close again, with the file no longer open there: nothing to do, and it says so.
    closed_again = cli("replay", "editor", "--nvim", second_nvim.address, "--from", "3", "--journal", journal)
    assert closed_again.out.splitlines() == [
        f"@3 close {os.path.realpath(plain)} (not open there: nothing to close)",
        f"replayed 1 step to Neovim at {second_nvim.address}; 1 close found the file not open there: nothing to do",
    ], closed_again.err


def test_replay_editor_from_and_to(session: EditorSession, second_nvim: NeovimProcess, tmp_path: Path) -> None:
    work = os.path.realpath(session.files["a.txt"].parent)
    first_save = session.position("DocumentSaved", "c.txt")
    out = tmp_path / "partial"
    args = ["--nvim", second_nvim.address, "--map", f"{work}={out}", "--journal", str(session.journal)]
    run = cli("replay", "editor", "--to", str(first_save), *args)
    assert run.code == 0, run.err
    assert {p.name: p.read_bytes() for p in out.iterdir()} == {"a.txt": b"alpha 2\n", "c.txt": b"charlie 2\n"}
    later = cli("replay", "editor", "--from", f"@{first_save + 1}", *args)
    assert later.code == 0, later.err
    assert (out / "a.txt").read_bytes() == b"alpha 3 (edited on disk)\n"
    assert (out / "b.txt").read_bytes() == b"bravo unsaved\n"


def test_replaying_again_copies_aside_no_text_an_earlier_replay_wrote(
    session: EditorSession, second_nvim: NeovimProcess, tmp_path: Path
) -> None:
    # a.txt's third write: its first text back. A replay up to its second then leaves a text
    # that no recorded write of a.txt around its first step holds, but a replay wrote.
    assert cli("recover", "1", "--apply", "--journal", session.journal).code == 0
    work = os.path.realpath(session.files["a.txt"].parent)
    out, link = tmp_path / "out", tmp_path / "link"
    out.mkdir()
    link.symlink_to(out)
    args = ["--to", str(session.position("DocumentSaved", "a.txt")), "--nvim", second_nvim.address]
    for target in (link, out):  # the same folder, spelled through a symlink and not
        run = cli("replay", "editor", *args, "--map", f"{work}={target}", "--journal", session.journal)
        assert run.code == 0, run.err
        assert "kept" not in run.out
    assert sorted(p.name for p in out.iterdir()) == ["a.txt", "c.txt"]
    assert (out / "a.txt").read_bytes() == b"alpha 3 (edited on disk)\n"
    # Each replay is under the file's resolved path, as Neovim's own saves are.
    replayed = [row["data"]["path"] for row in session.reader.events("FileReplayed")]
    assert replayed == [os.path.join(os.path.realpath(out), name) for name in ("a.txt", "c.txt", "a.txt")] * 2


def test_a_replayed_write_neovim_then_fails_to_load_is_done_and_says_so(
    session: EditorSession, second_nvim: NeovimProcess, tmp_path: Path
) -> None:
    work, out = os.path.realpath(session.files["a.txt"].parent), tmp_path / "out"
    second_nvim.command("autocmd BufReadPost *.txt lua error('no such plugin')")
    args = ("--to", "1", "--nvim", second_nvim.address, "--map", f"{work}={out}", "--journal", session.journal)
    run = cli("replay", "editor", *args)
    assert run.code == 0, run.err
    assert (out / "a.txt").read_bytes() == b"alpha 2\n"
    assert run.out.splitlines()[0] == (
        f"@1 save {out}/a.txt (recorded as {work}/a.txt): write 8 bytes; Neovim could not load it: no such plugin"
    )
    history = cli("history", out / "a.txt", "--journal", session.journal)
    assert "replayed 8 B from @1" in history.out, history.err


def test_replay_editor_dry_run_changes_nothing(session: EditorSession, tmp_path: Path) -> None:
    work = os.path.realpath(session.files["a.txt"].parent)
    run = cli("replay", "editor", "--dry-run", "--map", f"{work}={tmp_path / 'out'}", "--journal", session.journal)
    assert run.code == 0, run.err
    steps = run.out.splitlines()
    assert steps[0].startswith(f"would @1 save {tmp_path / 'out'}/a.txt")
    assert any(" close " in step for step in steps) and any(" restore " in step for step in steps)
    assert steps[-1] == f"{len(steps) - 1} steps to replay (dry run: nothing changed)"
    assert not (tmp_path / "out").exists()


def test_replay_editor_maps_a_directory_named_through_a_symlink(session: EditorSession, tmp_path: Path) -> None:
    """Paths are recorded resolved; a FROM spelled through a link still moves them. A map that
    moves nothing is refused: the replay would write the recorded files themselves."""
    link = tmp_path / "link"
    link.symlink_to(session.files["a.txt"].parent)
    out = tmp_path / "out"
    run = cli("replay", "editor", "--dry-run", "--map", f"{link}={out}", "--journal", session.journal)
    assert run.code == 0, run.err
    assert run.out.splitlines()[0].startswith(f"would @1 save {out}/a.txt")
    before = {path: path.read_bytes() for path in session.files.values() if path.exists()}
    unused = cli(
        "replay", "editor", "--nvim", "/nowhere", "--map", f"{tmp_path}/elsewhere={out}", "--journal", session.journal
    )
    assert unused.code == 2
    assert unused.err.strip() == (
        f"toolbus replay: --map {tmp_path}/elsewhere={out}: none of the {len(run.out.splitlines()) - 1} steps is"
        f" a file under {tmp_path}/elsewhere, as typed or with its symlinks resolved; nothing was replayed"
    )
    assert {path: path.read_bytes() for path in session.files.values() if path.exists()} == before


def test_replay_editor_goes_only_to_the_neovim_it_is_named(tmp_path: Path) -> None:
    """A replay changes files: it never finds a Neovim by itself, as its help says."""
    journal = tmp_path / "journal.db"
    run = cli("replay", "editor", "--journal", journal, env={"TOOLBUS_NVIM": str(tmp_path / "nvim.sock")})
    assert run.code == 2 and "--nvim ADDRESS is required" in run.err
    assert "$TOOLBUS_NVIM and $NVIM are not used" in run.err
    assert not journal.exists()
    shutil.copyfile(Path(__file__).parent / "fixtures" / "journal-schema5.db", journal)  # saves to replay
    gone = cli("replay", "editor", "--journal", journal, "--all-hosts", "--nvim", tmp_path / "nvim.sock")
    assert gone.code == 2 and "pass it with --nvim (or, to serve, $TOOLBUS_NVIM)" in gone.err, gone.err
    help_text = " ".join(cli("replay", "editor", "--help").out.split())
    assert "--nvim ADDRESS socket path or host:port of the Neovim to replay to (required unless --dry-run)" in help_text


def b_open_elsewhere(session: EditorSession, nvim: NeovimProcess, tmp_path: Path, text: str) -> tuple[str, Path]:
    """The session's folder, and a folder `out` to replay it to, whose b.txt holds `text` and is open in `nvim`."""
    out = tmp_path / "out"
    out.mkdir()
    (out / "b.txt").write_text(text)
    nvim.edit(out / "b.txt")
    return os.path.realpath(session.files["a.txt"].parent), out


def test_a_replay_stopped_part_way_says_where_to_go_on_from(
    session: EditorSession, second_nvim: NeovimProcess, tmp_path: Path
) -> None:
    work, out = b_open_elsewhere(session, second_nvim, tmp_path, "mine\n")
    second_nvim.set_lines(out / "b.txt", ["my unsaved work"])
    closed = session.position("TabClosed", "b.txt")
    run = cli("replay", "editor", "--nvim", second_nvim.address, "--map", f"{work}={out}", "--journal", session.journal)
    done = run.out.splitlines()
    # 1, not 2 (bad input, nothing changed): the steps before it changed files
    assert run.code == 1 and done and all(int(line.split()[0][1:]) < closed for line in done)
    assert run.err == (
        f"toolbus replay: replay stopped at @{closed}: {out}/b.txt has unsaved changes in this Neovim: save or close"
        f" it, then replay again ({len(done)} step{'s' if len(done) != 1 else ''} before it done: --from {closed}"
        " goes on from here)\n"
    )


def test_replay_editor_never_takes_a_plugins_buffer_for_the_file(
    session: EditorSession, second_nvim: NeovimProcess, tmp_path: Path
) -> None:
    work = os.path.realpath(session.files["a.txt"].parent)
    out = tmp_path / "out"
    out.mkdir()
    second_nvim.plugin_buffer(out / "a.txt", ["plugin"])
    run = cli("replay", "editor", "--nvim", second_nvim.address, "--map", f"{work}={out}", "--journal", session.journal)
    assert run.code == 2 and "which is not the file's ('buftype' nofile): wipe it" in run.err, run.err
    assert second_nvim.lines(out / "a.txt") == ["plugin"]
    assert not (out / "a.txt").exists()  # refused before anything was written


def test_replay_editor_never_overwrites_unsaved_changes(
    session: EditorSession, second_nvim: NeovimProcess, tmp_path: Path
) -> None:
    work = os.path.realpath(session.files["a.txt"].parent)
    out = tmp_path / "out"
    out.mkdir()
    (out / "a.txt").write_text("mine\n")
    second_nvim.edit(out / "a.txt")
    second_nvim.set_lines(out / "a.txt", ["my unsaved work"])
    run = cli(
        "replay",
        "editor",
        "--nvim",
        second_nvim.address,
        "--map",
        f"{work}={out}",
        "--journal",
        session.journal,
    )
    assert run.code == 2
    assert run.err == (
        f"toolbus replay: replay stopped at @1: {out}/a.txt has unsaved changes in this Neovim: "
        "save or close it, then replay again\n"
    )
    assert second_nvim.lines(out / "a.txt") == ["my unsaved work"]
    assert (out / "a.txt").read_text() == "mine\n"


def test_replay_editor_keeps_what_a_file_held_that_the_journal_does_not_have(
    session: EditorSession, second_nvim: NeovimProcess
) -> None:
    a = Path(os.path.realpath(session.files["a.txt"]))
    args = ("replay", "editor", "--nvim", second_nvim.address, "--journal", session.journal)
    untouched = cli(*args)  # every file holds what the journal has for it: nothing to keep
    assert untouched.code == 0, untouched.err
    assert sorted(p.name for p in a.parent.iterdir()) == ["a.txt", "b.txt", "c.txt"]
    assert "kept" not in untouched.out

    for attempt, mine in enumerate(["mine\n", "mine again\n"], start=1):
        a.write_text(mine)
        run = cli(*args)
        assert run.code == 0, run.err
        assert a.read_text() == "alpha 3 (edited on disk)\n"
        assert f"@1 save {a}: write 8 bytes; kept the text the file held in {a}.~{attempt}~" in run.out
    # numbered copies: a later one never overwrites an earlier one
    assert (a.parent / "a.txt.~1~").read_text() == "mine\n"
    assert (a.parent / "a.txt.~2~").read_text() == "mine again\n"
    assert sorted(p.name for p in a.parent.iterdir()) == ["a.txt", "a.txt.~1~", "a.txt.~2~", "b.txt", "c.txt"]


def test_replay_editor_against_a_blocked_neovim_stops_with_a_clear_error(
    session: EditorSession, second_nvim: NeovimProcess, tmp_path: Path
) -> None:
    work = os.path.realpath(session.files["a.txt"].parent)
    second_nvim.command('autocmd BufReadPost * call input("x")')  # loading a replayed file prompts
    run = cli(  # bounded by cli()'s own subprocess timeout: a hang fails the test
        "replay",
        "editor",
        "--nvim",
        second_nvim.address,
        "--nvim-timeout",
        "1",
        "--map",
        f"{work}={tmp_path / 'out'}",
        "--journal",
        session.journal,
    )
    # The write may have happened (here it did, and loading it prompted): exit 1, not the 2 that
    # says nothing was changed, and the journal has the step in doubt.
    assert (run.code, run.out) == (1, ""), run.err
    assert run.err.startswith(
        f"toolbus replay: replay stopped at @1: Neovim at {second_nvim.address} did not answer within 1 s"
    )
    assert (tmp_path / "out" / "a.txt").read_text() == "alpha 2\n"  # @1, the first save
    with sqlite3.connect(session.journal) as conn:
        statuses = conn.execute("SELECT status FROM commands WHERE tool = 'replay_write'").fetchall()
    assert statuses == [("in_doubt",)]
    assert second_nvim.call(lambda n: n.eval("1 + 1")) == 2  # interrupted, not left at the prompt


@pytest.mark.parametrize(
    "hook", ['call input("Really write? ")', 'call setline(1, "formatted")'], ids=["prompt", "formatter"]
)
def test_replay_editor_writes_the_recorded_bytes_without_the_write_hooks(
    session: EditorSession, second_nvim: NeovimProcess, tmp_path: Path, hook: str
) -> None:
    work = os.path.realpath(session.files["a.txt"].parent)
    out = tmp_path / "out"
    second_nvim.command(f"autocmd BufWritePre * {hook}")
    run = cli(
        "replay",
        "editor",
        "--nvim",
        second_nvim.address,
        "--nvim-timeout",
        "1",
        "--map",
        f"{work}={out}",
        "--journal",
        session.journal,
    )
    assert run.code == 0, run.err
    assert {path.name: path.read_bytes() for path in out.iterdir()} == final_contents(session)
    assert not second_nvim.modified(out / "a.txt")


def test_replay_editor_never_wipes_a_buffer_with_unsaved_changes(
    session: EditorSession, second_nvim: NeovimProcess
) -> None:
    b = Path(os.path.realpath(session.files["b.txt"]))
    second_nvim.edit(b)
    second_nvim.set_lines(b, ["my unsaved work"])
    closed = session.position("TabClosed", "b.txt")
    run = cli("replay", "editor", "--nvim", second_nvim.address, "--from", str(closed), "--journal", session.journal)
    assert run.code == 2
    assert run.err == (
        f"toolbus replay: replay stopped at @{closed}: {b} has unsaved changes in this Neovim: "
        "save or close it, then replay again\n"
    )
    assert second_nvim.lines(b) == ["my unsaved work"]


class CountingReader:
    """A journal reader that counts the histories and texts it is asked for."""

    def __init__(self, reader: JournalReader) -> None:
        self._reader = reader
        self.asked: Counter[str] = Counter()

    def history(self, path: str, limit: int | None = None, host: str | None = None) -> list[HistoryEntry]:
        self.asked["history"] += 1
        return self._reader.history(path, limit, host)

    def blob(self, digest: str) -> bytes | None:
        self.asked[digest] += 1
        return self._reader.blob(digest)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._reader, name)


def test_a_replay_reads_each_files_history_once_however_many_steps_it_has(tmp_path: Path) -> None:
    """A replay of a file saved thousands of times took the square of that: its whole history
    was read again for each step."""
    path = tmp_path / "journal.db"
    writer = SqliteJournal(path)
    texts = [f"version {i}\n".encode() for i in range(21)]

    async def save_twenty_times() -> None:
        for old, new in itertools.pairwise(texts):
            for file in ("/src/a.py", "/src/b.py"):
                event, blobs = saved(file, old, new)
                await writer.finish(record("saveDocument"), None, "ok", events=[event], blobs=blobs)

    anyio.run(save_twenty_times)
    writer.close()
    reader = CountingReader(SqliteReader(path))
    steps = [step for step in editor_steps(reader) if step.path == "/src/a.py"]
    assert [step.blob for step in steps] == [blob_hash(text) for text in texts[1:]]
    # The texts it may overwrite: what it replaced (the last write before it) and the last of all.
    assert steps[4].known == tuple(sorted({blob_hash(texts[4]), blob_hash(texts[20])}))
    assert steps[19].known == (blob_hash(texts[19]),)
    assert reader.asked["history"] == 2  # one per file
    # Each step's text read once, and whether the journal holds a text asked once per text.
    assert reader.asked.total() - reader.asked["history"] <= 40 + len(texts)


@pytest.mark.parametrize(
    ("pair", "recorded", "replayed"),
    [
        ("/=/tmp/dest", "/src/a.py", "/tmp/dest/src/a.py"),
        ("//=/tmp/dest/", "/src/a.py", "/tmp/dest/src/a.py"),
        ("/src=/", "/src/lib/a.py", "/lib/a.py"),
        ("/src/=/tmp/dest", "/src", "/tmp/dest"),
        ("/src=/tmp/dest", "/srcs/a.py", "/srcs/a.py"),  # a folder is a whole name
    ],
)
def test_map_moves_a_path_under_its_folder_root_included(pair: str, recorded: str, replayed: str) -> None:
    assert map_path(recorded, parse_path_map([pair])) == replayed


@pytest.mark.parametrize(
    ("pairs", "refusal"),
    [
        (["/src=/elsewhere"], None),
        (["/src/lib=/tmp/lib", "/src=/elsewhere"], None),
        (["/src/lib=/tmp/lib", "/docs=/tmp/docs"], "--map /docs=/tmp/docs: none of the 2 steps is a file under /docs"),
        (["/src/lib=/tmp/lib", "/src/lib/b.py=/tmp/b.py"], "every step under /src/lib is under a longer --map's"),
        (["/src/=/src"], "--map /src/=/src: /src and /src are one folder: it moves nothing"),
    ],
)
def test_each_map_must_move_a_step(pairs: list[str], refusal: str | None) -> None:
    steps = [
        EditorStep(position=position, action="close", path="", recorded_path=path, source="TabClosed")
        for position, path in ((1, "/src/a.py"), (2, "/src/lib/b.py"))
    ]
    if refusal is None:
        check_path_map(pairs, steps)
    else:
        with pytest.raises(ValueError, match=re.escape(refusal)):
            check_path_map(pairs, steps)
    check_path_map(pairs, [])  # no steps: nothing to replay, and it is said so


def test_a_map_onto_its_own_folder_through_a_symlink_is_refused(tmp_path: Path) -> None:
    work, alias = tmp_path / "work", tmp_path / "alias"
    work.mkdir()
    alias.symlink_to(work)
    real = os.path.realpath(work)
    steps = [EditorStep(position=1, action="close", path="", recorded_path=f"{real}/a.py", source="TabClosed")]
    with pytest.raises(ValueError, match=re.escape(f"{real} and {alias} are one folder: it moves nothing")):
        check_path_map([f"{real}={alias}"], steps)


def test_replay_editor_into_a_command_line_window_stops_before_changing_anything(
    session: EditorSession, second_nvim: NeovimProcess, tmp_path: Path
) -> None:
    work, out = b_open_elsewhere(session, second_nvim, tmp_path, "open there\n")
    args = ("replay", "editor", "--nvim", second_nvim.address, "--map", f"{work}={out}", "--journal", session.journal)
    closed = session.position("TabClosed", "b.txt")
    with command_line_window(second_nvim):
        save = cli(*args)
        close = cli(*args, "--from", str(closed))
    for run, step in ((save, 1), (close, closed)):
        assert run.code == 2, run.err
        assert run.err.startswith(f"toolbus replay: replay stopped at @{step}: {CMDWIN}")
        assert run.err.endswith(": close it (:quit), then try again\n")
    assert sorted(path.name for path in out.iterdir()) == ["b.txt"]  # a.txt was not written
    assert str(out / "b.txt") in open_buffers(second_nvim)  # nor b.txt's buffer closed
