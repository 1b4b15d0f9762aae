"""kill -9 of `toolbus serve` in the middle of a stream of saves: nothing acknowledged is lost,
the file is intact, the unfinished command is visible as in doubt (and, once a server starts
again, what it may have done, under its file), and a restarted server goes on appending
without a gap."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from tests.conftest import NeovimProcess
from tests.faults_helpers import assert_reachable, assert_sound, journal_state, saved_titles, wait_until
from tests.rpc_client import NoAnswer, ServerGone, StdioServer, result_json, toolbus_argv
from toolbus.bus import FileWriteInDoubt
from toolbus.bus.events import encode_event_data
from toolbus.journal.abandoned import dead_commands, process_gone, process_mark, this_process


def save(server: StdioServer, title: str) -> int:
    reply = result_json(server.call_tool("save", {"title": title, "text": f"text of {title}"}, deadline=20))
    return int(reply["id"])


def test_kill_9_mid_stream_loses_nothing_acknowledged(
    tmp_path: Path, journal_path: Path, nvim: NeovimProcess, files: Path
) -> None:
    document = files / "held.py"
    document.write_text("x = 1\n")
    nvim.edit(document)
    # Holds saveDocument inside Neovim, after its write-ahead row, for as long as we like.
    nvim.command("autocmd BufWritePre * sleep 30")
    acknowledged: dict[int, str] = {}
    argv = toolbus_argv(journal_path, "--nvim-timeout", "60", nvim=nvim.address)
    with StdioServer(argv, stderr=tmp_path / "first.stderr") as server:
        server.initialize()
        for index in range(30):
            acknowledged[save(server, f"before {index}")] = f"before {index}"
        server.send_request("tools/call", {"name": "saveDocument", "arguments": {"filePath": str(document)}})
        wait_until(lambda: journal_state(journal_path).commands_with("in_doubt", "saveDocument"), timeout=20)
        for index in range(10):  # the server keeps serving while the save is held
            acknowledged[save(server, f"during {index}")] = f"during {index}"
        server.send_request("tools/call", {"name": "save", "arguments": {"title": "unanswered", "text": "t"}})
        server.kill()

    state = assert_sound(journal_path)
    titles = saved_titles(journal_path)
    assert {i: titles.get(i) for i in acknowledged} == acknowledged
    [held] = state.commands_with("in_doubt", "saveDocument")
    assert held["finished_at"] is None
    assert {c["status"] for c in state.commands} <= {"ok", "in_doubt"}
    last_position = max(titles)

    assert not [e for e in state.events if e["command_id"] == held["id"]]  # nothing said yet

    nvim.command("autocmd! BufWritePre")
    with StdioServer(toolbus_argv(journal_path, nvim=nvim.address), stderr=tmp_path / "second.stderr") as server:
        server.initialize()
        after = [save(server, f"after {index}") for index in range(10)]
    # Before answering, the restarted server said under the file what the dead one may have
    # done, with the text it kept; then it goes on appending without a gap.
    state = assert_sound(journal_path)
    [doubt] = [e for e in state.events if e["command_id"] == held["id"]]
    assert (doubt["type"], doubt["position"]) == ("FileWriteInDoubt", last_position + 1)
    assert after == list(range(last_position + 2, last_position + 12))
    [settled] = state.commands_with("in_doubt", "saveDocument")  # the truth stays as it was, and says why
    assert settled | {"error": None, "pending": None} == held | {"pending": None}
    assert settled["error"] == f"the toolbus process (pid {held['pid']}) ended before recording this command's outcome"
    assert_reachable(journal_path, document, doubt["position"], "may have been written", b"x = 1\n")


class SaveStream:
    """Sends saves one after another from a thread until the server dies; remembers the acked."""

    def __init__(self, server: StdioServer, prefix: str) -> None:
        self.server = server
        self.prefix = prefix
        self.acknowledged: dict[int, str] = {}
        self.error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> None:
        self._thread.start()

    def join(self) -> None:
        self._thread.join(timeout=30)
        assert not self._thread.is_alive()

    def _run(self) -> None:
        try:
            for index in range(100_000):  # ends when the server is killed
                title = f"{self.prefix} {index}"
                self.acknowledged[save(self.server, title)] = title
        except (ServerGone, NoAnswer, OSError, ValueError):
            return  # the kill: the call in flight is unacknowledged
        except BaseException as error:  # anything else is a finding
            self.error = error


@pytest.mark.heavy
def test_kill_9_at_random_moments_loses_nothing_acknowledged(tmp_path: Path, journal_path: Path) -> None:
    rng = random.Random(5)
    acknowledged: dict[int, str] = {}
    for attempt in range(4):
        argv = toolbus_argv(journal_path)
        with StdioServer(argv, stderr=tmp_path / f"run{attempt}.stderr") as server:
            server.initialize()
            stream = SaveStream(server, f"run {attempt}")
            stream.start()
            time.sleep(rng.uniform(0.05, 1.0))
            server.kill()
            stream.join()
        assert stream.error is None, stream.error
        acknowledged |= stream.acknowledged
        state = assert_sound(journal_path)
        titles = saved_titles(journal_path)
        assert {i: titles.get(i) for i in acknowledged} == acknowledged
        # At most the one call in flight is unfinished, and it never has an event.
        assert len(state.commands_with("in_doubt")) <= attempt + 1
    assert len(acknowledged) > 0


def test_a_process_counts_as_gone_once_ended_a_zombie_or_its_pid_taken_by_a_later_one() -> None:
    """What `toolbus serve` checks before saying what a command's process may have done."""
    child = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)
    try:
        here, mark = this_process(), process_mark(child.pid)
        assert here is not None and mark is not None
        assert not process_gone(os.getpid(), here)
        assert not process_gone(child.pid, mark)  # alive, and the one that wrote the mark
        assert not process_gone(child.pid, None)  # /proc told the writer nothing: not judged here
        assert process_gone(child.pid, mark._replace(started=mark.started - 1))  # the pid was reused
        assert process_gone(child.pid, mark._replace(boot="another boot"))  # the machine restarted
        assert not process_gone(2**22 + 1, mark._replace(pid_namespace=1))  # another namespace: unknowable
        child.stdin.close()  # type: ignore[union-attr]
        wait_until(lambda: process_gone(child.pid, mark), timeout=20)  # a zombie: not reaped yet
    finally:
        child.wait(timeout=20)
    assert process_gone(child.pid, mark) and not process_gone(child.pid, None)


def test_a_pending_row_that_cannot_be_settled_is_skipped_and_stops_no_other() -> None:
    """Whatever a row holds (by hand, or from a newer toolbus), the others are settled."""
    doubt = FileWriteInDoubt(path="/src/a.py", replaced_blob=None)

    def pending(*events: object) -> str:
        return json.dumps({"process": ["a boot before this one", 1, 1], "events": list(events)})

    data = json.loads(encode_event_data(doubt))
    rows = [
        (1, 100, "not json"),
        (2, 100, pending(["FileWriteInDoubt", 1, [1]])),  # data that is not an object
        (3, 100, pending(["FileWriteInDoubt", 99, data])),  # a version this toolbus does not know
        (4, 100, pending(["ObservationSaved", 1, data])),  # not an action's doubt
        (5, 100, pending(["FileWriteInDoubt", 1, data])),
    ]
    assert dead_commands(rows) == [(5, 100, [doubt])]
