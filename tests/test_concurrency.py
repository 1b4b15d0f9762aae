"""Several `toolbus serve` processes appending to one journal at once: every call recorded,
positions gapless and unique, and no "database is locked" ever reaching a client."""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from tests.faults_helpers import assert_sound, saved_titles
from tests.rpc_client import StdioServer, result_text, toolbus_argv


@dataclass
class Agent:
    """One server process and the calls its client made, run on a thread of its own."""

    name: str
    server: StdioServer
    calls: int
    saved: dict[int, str] = field(default_factory=dict)
    results: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    error: BaseException | None = None

    def plan(self, index: int) -> tuple[str, dict[str, Any]]:
        """Mostly saves (two transactions each), with queries and invalid calls mixed in."""
        if index % 10 == 8:
            return "search", {"query": f"{self.name} note", "limit": 5}
        if index % 10 == 9:
            return "save", {"title": "", "text": "rejected: empty title"}
        return "save", {"title": f"{self.name} note {index}", "text": f"written by {self.name}"}

    def run(self) -> None:
        try:
            self.server.initialize()
            for index in range(self.calls):
                tool, arguments = self.plan(index)
                result = self.server.call_tool(tool, arguments, deadline=60)
                self.results.append((tool, result))
                if tool == "save" and arguments["title"] and not result.get("isError"):
                    self.saved[_id_of(result)] = arguments["title"]
        except BaseException as error:
            self.error = error


def _id_of(result: dict[str, Any]) -> int:
    import json

    return int(json.loads(result_text(result))["id"])


def run_agents(tmp_path: Path, journal: Path, processes: int, calls: int) -> list[Agent]:
    agents = [
        Agent(
            name=f"agent{n}",
            server=StdioServer(toolbus_argv(journal, "--agent", f"agent{n}"), stderr=tmp_path / f"agent{n}.stderr"),
            calls=calls,
        )
        for n in range(processes)
    ]
    threads = [threading.Thread(target=agent.run, daemon=True) for agent in agents]
    try:
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=170)
            assert not thread.is_alive(), "an agent did not finish in time"
    finally:
        for agent in agents:
            agent.server.close()
    return agents


def check(journal: Path, agents: list[Agent], calls: int) -> None:
    for agent in agents:
        assert agent.error is None, f"{agent.name}: {agent.error!r}"
        assert len(agent.results) == calls
        for tool, result in agent.results:
            assert "locked" not in result_text(result).lower(), result_text(result)
            assert "busy" not in result_text(result).lower(), result_text(result)
            expected_error = tool == "save" and "Invalid arguments" in result_text(result)
            assert bool(result.get("isError")) == expected_error, result_text(result)
    state = assert_sound(journal)
    assert len(state.commands) == len(agents) * calls
    assert state.commands_with("in_doubt") == []
    everything_saved = {i: t for agent in agents for i, t in agent.saved.items()}
    assert sum(len(agent.saved) for agent in agents) == len(everything_saved)  # ids are unique
    assert saved_titles(journal) == everything_saved
    by_agent = {agent.name: sum(1 for c in state.commands if c["agent"] == agent.name) for agent in agents}
    assert by_agent == {agent.name: calls for agent in agents}


def test_four_servers_share_one_journal(tmp_path: Path, journal_path: Path) -> None:
    agents = run_agents(tmp_path, journal_path, processes=4, calls=100)
    check(journal_path, agents, calls=100)


@pytest.mark.heavy
def test_four_servers_times_a_thousand_calls(tmp_path: Path, journal_path: Path) -> None:
    agents = run_agents(tmp_path, journal_path, processes=4, calls=1000)
    check(journal_path, agents, calls=1000)


def test_servers_opening_a_new_journal_at_once_all_succeed(tmp_path: Path) -> None:
    """Four openers race to create one journal, a hundred times over. Each must see either
    nothing or a whole journal, never a half-created one as "a database of something else",
    and none may fail on "locked" while another switches the file to WAL."""
    import shutil
    import tempfile

    from toolbus.journal import SqliteJournal

    shm = Path("/dev/shm")
    base = Path(tempfile.mkdtemp(dir=shm)) if shm.is_dir() and os.access(shm, os.W_OK) else tmp_path
    failures: list[str] = []
    try:
        for attempt in range(100):
            journal = base / f"race{attempt}" / "journal.db"
            start = threading.Barrier(4)

            def open_journal(journal: Path = journal, start: threading.Barrier = start) -> None:
                start.wait(timeout=10)
                try:
                    SqliteJournal(journal).close()
                except Exception as error:
                    failures.append(str(error))

            threads = [threading.Thread(target=open_journal) for _ in range(4)]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join(timeout=30)
            assert_sound(journal)
    finally:
        if base != tmp_path:
            shutil.rmtree(base, ignore_errors=True)
    assert failures == []
