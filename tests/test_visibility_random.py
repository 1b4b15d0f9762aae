"""Visibility, randomized: several agents in several departments save observations with every
visibility into one journal, then ask search, timeline and get_observations random questions.
No answer may show, count or anchor on an observation its caller may not see.

Each observation carries a unique token, so "counted" is checked exactly: searching for an
observation's token gives total 1 to a caller who may see it and 0 to everyone else.
"""

from __future__ import annotations

import json
import random
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.faults_helpers import assert_sound
from tests.rpc_client import StdioServer, result_json, result_text, toolbus_argv

CALLERS = [("alice", "eng"), ("bob", "eng"), ("carol", "ops"), ("dave", "ops"), ("erin", "legal")]
VISIBILITIES = ["private", "department", "project", "public"]
PROJECTS = ["alpha", "beta"]
WORDS = ["lemon", "harbor", "quartz", "violet", "ember", "orbit", "maple", "tundra"]


@dataclass(frozen=True)
class Observation:
    id: int
    agent: str
    department: str
    visibility: str
    project: str
    token: str

    def visible_to(self, agent: str, department: str) -> bool:
        if self.visibility in ("public", "project"):
            return True
        if self.visibility == "department":
            return self.department == department
        return self.agent == agent


@dataclass
class Caller:
    agent: str
    department: str
    server: StdioServer

    def ask(self, tool: str, arguments: dict[str, Any]) -> Any:
        result = self.server.call_tool(tool, arguments, deadline=30)
        assert not result.get("isError"), f"{tool} {arguments}: {result_text(result)}"
        return json.loads(result_text(result))


def start_callers(tmp_path: Path, journal: Path) -> Iterator[list[Caller]]:
    callers = []
    try:
        for agent, department in CALLERS:
            argv = toolbus_argv(journal, "--agent", agent, "--department", department)
            server = StdioServer(argv, stderr=tmp_path / f"{agent}.stderr")
            callers.append(Caller(agent, department, server))
            server.initialize()
        yield callers
    finally:
        for caller in callers:
            caller.server.close()


def save_randomly(rng: random.Random, callers: list[Caller], count: int) -> list[Observation]:
    saved = []
    for index in range(count):
        caller = rng.choice(callers)
        arguments: dict[str, Any] = {
            "title": f"{rng.choice(WORDS)} note {index}",
            "text": f"{' '.join(rng.sample(WORDS, 3))} tok{index}x",
            "visibility": rng.choice(VISIBILITIES),
            "project": rng.choice(PROJECTS),
            "facts": [rng.choice(WORDS)],
        }
        agent, department = caller.agent, caller.department
        if rng.random() < 0.15:  # saved on someone else's behalf: the stored owner decides
            agent, department = rng.choice(CALLERS)
            arguments |= {"agent": agent, "department": department}
        reply = result_json(caller.server.call_tool("save", arguments, deadline=30))
        saved.append(
            Observation(
                id=int(reply["id"]),
                agent=agent,
                department=department,
                visibility=arguments["visibility"],
                project=arguments["project"],
                token=f"tok{index}x",
            )
        )
    return saved


def check_search(rng: random.Random, caller: Caller, saved: list[Observation]) -> None:
    visible = {o.id for o in saved if o.visible_to(caller.agent, caller.department)}
    target = rng.choice(saved)
    reply = caller.ask("search", {"query": target.token})
    expected = 1 if target.id in visible else 0
    assert reply["total"] == expected and [r["id"] for r in reply["results"]] == [target.id] * expected
    project = rng.choice(PROJECTS)
    in_project = {o.id for o in saved if o.project == project} & visible
    shown: list[int] = []
    for offset in range(0, len(saved) + 100, 100):  # every page; the last one is empty
        reply = caller.ask("search", {"project": project, "limit": 100, "offset": offset})
        assert reply["total"] == len(in_project)
        shown += [r["id"] for r in reply["results"]]
    assert sorted(shown) == sorted(in_project)
    words = " ".join(rng.sample(WORDS, rng.randint(1, 2)))
    offset = rng.randint(0, 5)
    reply = caller.ask("search", {"query": words, "limit": rng.randint(1, 20), "offset": offset})
    assert {r["id"] for r in reply["results"]} <= visible
    assert reply["total"] <= len(visible)


def check_timeline(rng: random.Random, caller: Caller, saved: list[Observation]) -> None:
    visible = {o.id for o in saved if o.visible_to(caller.agent, caller.department)}
    anchor = rng.choice(saved)
    reply = caller.ask("timeline", {"anchor": anchor.id, "depth_before": 5, "depth_after": 5})
    ids = [r["id"] for r in reply["results"]]
    assert set(ids) <= visible
    if anchor.id in visible:
        assert reply["anchor"] == anchor.id and anchor.id in ids
    else:
        assert reply["anchor"] is None and ids == []
    reply = caller.ask("timeline", {"query": anchor.token})
    assert reply["anchor"] == (anchor.id if anchor.id in visible else None)
    assert {r["id"] for r in reply["results"]} <= visible


def check_get_observations(rng: random.Random, caller: Caller, saved: list[Observation]) -> None:
    visible = {o.id for o in saved if o.visible_to(caller.agent, caller.department)}
    asked = [o.id for o in rng.sample(saved, min(8, len(saved)))] + [10_000_000]
    reply = caller.ask("get_observations", {"ids": asked})
    shown = [o["id"] for o in reply["observations"]]
    assert shown == [i for i in asked if i in visible]
    assert sorted(reply["missing"]) == sorted(i for i in asked if i not in visible)


def run(tmp_path: Path, journal: Path, seed: int, observations: int, questions: int) -> None:
    rng = random.Random(seed)
    for callers in start_callers(tmp_path, journal):
        saved = save_randomly(rng, callers, observations)
        for _ in range(questions):
            caller = rng.choice(callers)
            rng.choice([check_search, check_timeline, check_get_observations])(rng, caller, saved)
    assert_sound(journal)


def test_no_caller_ever_sees_what_they_may_not(tmp_path: Path, journal_path: Path) -> None:
    run(tmp_path, journal_path, seed=1, observations=60, questions=150)


@pytest.mark.heavy
def test_no_caller_ever_sees_what_they_may_not_at_scale(tmp_path: Path, journal_path: Path) -> None:
    run(tmp_path, journal_path, seed=2, observations=400, questions=800)
