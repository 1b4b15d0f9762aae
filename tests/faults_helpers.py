"""Helpers for the fault and load tests: reading a journal the way an auditor would, bounded
waiting, and small filesystems that can fill up or turn read-only."""

from __future__ import annotations

import json
import os
import queue
import sqlite3
import subprocess
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import pytest

from tests.conftest import NeovimProcess
from tests.journal_helpers import cli
from toolbus.bus import decode_event

T = TypeVar("T")
STATUSES = {"ok", "rejected", "failed", "in_doubt"}


def wait_until(predicate: Callable[[], T], timeout: float, interval: float = 0.02) -> T:
    """Poll `predicate` until it returns something truthy; fail the test after `timeout` s."""
    deadline = time.monotonic() + timeout
    while True:
        if value := predicate():
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"gave up waiting after {timeout} s")
        time.sleep(interval)


@contextmanager
def reading(path: Path) -> Iterator[sqlite3.Connection]:
    """A read-only connection, as any SQLite tool would open the journal."""
    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=10)
    conn.row_factory = sqlite3.Row
    try:
        yield conn
    finally:
        conn.close()


def rows(path: Path, sql: str, *params: Any) -> list[dict[str, Any]]:
    with reading(path) as conn:
        return [dict(row) for row in conn.execute(sql, params)]


@dataclass(frozen=True)
class JournalState:
    commands: list[dict[str, Any]]
    events: list[dict[str, Any]]

    def commands_with(self, status: str, tool: str | None = None) -> list[dict[str, Any]]:
        return [c for c in self.commands if c["status"] == status and tool in (None, c["tool"])]

    def observation_ids(self) -> set[int]:
        return {e["position"] for e in self.events if e["type"] == "ObservationSaved"}


def journal_state(path: Path) -> JournalState:
    return JournalState(
        commands=rows(path, "SELECT * FROM commands ORDER BY id"),
        events=rows(path, "SELECT * FROM events ORDER BY position"),
    )


def assert_sound(path: Path) -> JournalState:
    """What must hold after any fault: the file is intact, positions are gapless and unique,
    every event decodes to its type and belongs to a finished (`ok`) command, but for the
    `*InDoubt` events of an `in_doubt` one (what it may have done): a rejected, failed or
    in-doubt command changed nothing for sure."""
    with reading(path) as conn:
        assert [tuple(row) for row in conn.execute("PRAGMA integrity_check")] == [("ok",)]
        assert [tuple(row) for row in conn.execute("PRAGMA foreign_key_check")] == []
    state = journal_state(path)
    positions = [e["position"] for e in state.events]
    assert positions == list(range(1, len(positions) + 1)), "event positions have a gap"
    assert len({e["event_id"] for e in state.events}) == len(state.events)
    status_of = {c["id"]: c["status"] for c in state.commands}
    assert {c["status"] for c in state.commands} <= STATUSES
    for event in state.events:
        expected = "in_doubt" if event["type"].endswith("InDoubt") else "ok"
        assert status_of.get(event["command_id"]) == expected, f"event {event['position']} of an unfinished command"
        decode_event(event["type"], event["version"], event["data"])
    observations = rows(path, "SELECT id FROM observations ORDER BY id")
    assert [o["id"] for o in observations] == sorted(state.observation_ids())
    return state


def assert_reachable(journal: Path, path: Path, position: int, words: str, kept: bytes) -> None:
    """`toolbus history`, `audit --path` and `recover` lead a person to the text a call in doubt kept."""
    history = cli("history", path, "--journal", journal)
    [line] = [line for line in history.out.splitlines() if line.startswith(f"@{position} ")]
    assert history.code == 0 and words in line, history.out + history.err
    audit = cli("audit", "--path", path, "--journal", journal)
    assert audit.code == 0 and "in_doubt" in audit.out and f"@{position} {words}" in audit.out, audit.out
    copy = journal.parent / "kept"
    recovered = cli("recover", str(position), "-o", copy, "--journal", journal)
    assert recovered.code == 0, recovered.err
    assert copy.read_bytes() == kept


def saved_titles(path: Path) -> dict[int, str]:
    """Observation id -> title, from the journal's ObservationSaved events."""
    return {
        e["position"]: json.loads(e["data"])["title"]
        for e in rows(path, "SELECT position, data FROM events WHERE type = 'ObservationSaved'")
    }


def ready(nvim: NeovimProcess, attempts: int = 3) -> NeovimProcess:
    """`nvim`, answering. The fixture's helper thread can try to attach between Neovim creating
    its socket file and listening on it (ConnectionRefused, under load); then start it again."""
    for _ in range(attempts):
        try:
            if nvim.call(lambda n: n.eval("1"), timeout=5) == 1:
                return nvim
        except (queue.Empty, OSError, EOFError):
            pass
        nvim.restart()
    pytest.fail("Neovim did not start")


def restart(nvim: NeovimProcess) -> NeovimProcess:
    nvim.restart()
    return ready(nvim)


# --- small filesystems ---------------------------------------------------------------------


def deny_writes(monkeypatch: pytest.MonkeyPatch) -> None:
    """`os.access` answers that nothing may be written, as to a user other than the owner: the
    tests run as root, whose writes are allowed."""
    real_access = os.access
    monkeypatch.setattr(os, "access", lambda path, mode: mode != os.W_OK and real_access(path, mode))


def can_mount() -> bool:
    return os.geteuid() == 0 and Path("/proc/filesystems").read_text().find("tmpfs") >= 0


@contextmanager
def small_filesystem(where: Path, size: str) -> Iterator[Path]:
    """A tmpfs of `size` (e.g. "2m") mounted at `where`; skips the test where mounting is not allowed."""
    if not can_mount():
        pytest.skip("needs root to mount a small tmpfs")
    where.mkdir(parents=True, exist_ok=True)
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size},mode=0700", "tmpfs", str(where)], capture_output=True
    )
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.decode().strip()}")
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], check=False)


def remount(where: Path, options: str) -> None:
    subprocess.run(["mount", "-o", f"remount,{options}", str(where)], check=True)
