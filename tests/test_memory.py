"""The memory tools end to end: `toolbus serve` over stdio on a real journal file, no Neovim.

Seed 004's six test cases, then what SPEC.md asks of search, timeline, get_observations and
visibility, a restart, and two servers saving into one journal at once.
"""

from __future__ import annotations

import re
import sqlite3
import time
from contextlib import closing
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp import Client

from tests.conftest import JournalReader, json_of, text_of, toolbus
from toolbus.bus import Caller, CommandRecord, ObservationSaved
from toolbus.bus.commands import blank
from toolbus.journal import SqliteJournal

pytestmark = pytest.mark.anyio

SAVE_DESCRIPTION = (
    "Save observation to memory. Params: title (required), text (required), type, project, "
    "memory_session_id, facts[], concepts[], agent, department, visibility"
)
SAVE_SCHEMA = {
    "type": "object",
    "properties": {
        "title": {"type": "string", "description": "Observation title"},
        "text": {"type": "string", "description": "Observation content/narrative"},
        "type": {
            "type": "string",
            "enum": ["decision", "bugfix", "feature", "refactor", "discovery", "change"],
            "description": "Observation type (default: discovery)",
        },
        "project": {"type": "string", "description": "Project name (default: manual)"},
        "memory_session_id": {"type": "string", "description": "Session ID for grouping related saves"},
        "facts": {"type": "array", "items": {"type": "string"}, "description": "Key facts"},
        "concepts": {"type": "array", "items": {"type": "string"}, "description": "Related concepts"},
        "agent": {"type": "string", "description": "Agent identifier (default: legacy)"},
        "department": {"type": "string", "description": "Department name (default: default)"},
        "visibility": {
            "type": "string",
            "enum": ["private", "department", "project", "public"],
            "description": "Visibility level (default: project)",
        },
    },
    "required": ["title", "text"],
    "additionalProperties": True,
}
SESSION_ID = re.compile(r"^mcp-(\d+)-[0-9a-z]+$")


def now_ms() -> int:
    return time.time_ns() // 1_000_000


async def save(client: Client, **fields: Any) -> dict[str, Any]:
    reply: dict[str, Any] = json_of(await client.call_tool("save", fields))
    return reply


async def call(client: Client, tool: str, **arguments: Any) -> dict[str, Any]:
    reply: dict[str, Any] = json_of(await client.call_tool(tool, arguments))
    return reply


async def found(client: Client, query: str, **filters: Any) -> list[int]:
    """The ids a search returns, in its order."""
    return ids(await call(client, "search", query=query, **filters))


def ids(reply: dict[str, Any]) -> list[int]:
    return [row["id"] for row in reply["results"]]


# --- save (seed 004) ------------------------------------------------------------------------


async def test_memory_tools_are_listed_and_save_has_the_seed_schema(journal_path: Path, mode: str) -> None:
    async with toolbus(journal_path, None, mode=mode) as client:
        tools = {tool.name: tool for tool in (await client.list_tools()).tools}
    assert {"save", "search", "timeline", "get_observations"} <= tools.keys()
    assert tools["save"].description == SAVE_DESCRIPTION
    assert tools["save"].input_schema == SAVE_SCHEMA
    assert len(tools["save"].input_schema["properties"]) == 10


async def test_no_tool_schema_gives_a_field_more_than_one_type(journal_path: Path) -> None:
    """Strict clients refuse `"type": [...]`; two accepted types are an `anyOf` of one each."""
    async with toolbus(journal_path, None) as client:
        tools = (await client.list_tools()).tools
    listed = [(f"{tool.name}{path}", node) for tool in tools for path, node in schema_nodes(tool.input_schema)]
    assert [where for where, node in listed if isinstance(node.get("type"), list)] == []
    [date_start] = [node for where, node in listed if where == "search.properties.dateStart"]
    assert date_start["anyOf"] == [{"type": "string"}, {"type": "integer"}]


def schema_nodes(node: Any, path: str = "") -> list[tuple[str, dict[str, Any]]]:
    """Every object in a JSON schema, with where it is."""
    if isinstance(node, list):
        return [found for i, item in enumerate(node) for found in schema_nodes(item, f"{path}[{i}]")]
    if not isinstance(node, dict):
        return []
    return [(path, node), *(found for key, value in node.items() for found in schema_nodes(value, f"{path}.{key}"))]


async def test_save_stores_what_was_sent_and_answers_with_its_id(
    journal_path: Path, journal: JournalReader, mode: str
) -> None:
    sent = {
        "title": "Journal uses WAL",
        "text": "Readers never block the writer.",
        "type": "decision",
        "project": "toolbus",
        "memory_session_id": "session-7",
        "facts": ["busy timeout is 5 s"],
        "concepts": ["sqlite", "concurrency"],
        "agent": "claude",
        "department": "platform",
        "visibility": "public",
        "files_read": ["/src/journal/store.py"],
        "files_modified": [],
    }
    async with toolbus(journal_path, None, mode=mode) as client:
        before = now_ms()
        reply = await save(client, **sent)
        defaults = await save(client, title="Minimal", text="Only the required fields.")
        after = now_ms()
        [record] = (await call(client, "get_observations", ids=[reply["id"]]))["observations"]

    assert set(reply) == {"success", "id", "memory_session_id", "created_at_epoch"}
    assert reply["success"] is True
    assert reply["memory_session_id"] == "session-7"
    assert before <= reply["created_at_epoch"] <= after
    [first, second] = journal.events("ObservationSaved")
    assert (reply["id"], defaults["id"]) == (first["position"], second["position"])
    named = {k: v for k, v in sent.items() if k not in ("files_read", "files_modified")}
    assert first["data"] == named | {
        "event": "ObservationSaved",
        "created_at_epoch": reply["created_at_epoch"],
        "extra": {"files_read": ["/src/journal/store.py"], "files_modified": []},
    }
    assert record == sent | {"id": reply["id"], "created_at_epoch": reply["created_at_epoch"]}
    [row] = journal.rows("SELECT * FROM observations WHERE id = ?", reply["id"])
    assert row["title"] == sent["title"] and row["visibility"] == "public"

    session = SESSION_ID.match(defaults["memory_session_id"])
    # The server's clock as it saved; the journal times the note a millisecond after the one
    # before it if that clock says no later (the same millisecond).
    assert session and before <= int(session[1]) <= defaults["created_at_epoch"] <= after + 1
    assert {k: second["data"][k] for k in ("type", "project", "agent", "department", "visibility")} == {
        "type": "discovery",
        "project": "manual",
        "agent": "legacy",
        "department": "default",
        "visibility": "project",
    }
    assert [c["status"] for c in journal.commands("save")] == ["ok", "ok"]


async def test_invalid_saves_are_errors_naming_the_field_and_store_nothing(
    journal_path: Path, journal: JournalReader
) -> None:
    cases: list[tuple[dict[str, Any], str]] = [
        ({}, "title: required field is missing"),
        ({"title": "t"}, "text: required field is missing"),
        ({"title": "", "text": "x"}, "title: expected a non-empty string"),
        ({"title": "   ", "text": "x"}, "title: expected a non-empty string"),
        ({"title": "\u200b\ufeff", "text": "x"}, "title: expected a non-empty string"),  # shows nothing
        ({"title": "t", "text": ""}, "text: expected a non-empty string"),
        ({"title": "t", "text": "x", "project": "   "}, "project: expected a non-empty string, got only whitespace"),
        ({"title": "t", "text": "x", "agent": " "}, "agent: expected a non-empty string, got only whitespace"),
        ({"title": "t", "text": "x", "department": "\t"}, "department: expected a non-empty string"),
        ({"title": "t", "text": "x", "memory_session_id": "  "}, "memory_session_id: expected a non-empty string"),
        ({"title": 7, "text": "x"}, "title: expected str, got int"),
        (
            {"title": "t", "text": "x", "type": "idea"},
            "type: expected one of decision, bugfix, feature, refactor, discovery, change",
        ),
        (
            {"title": "t", "text": "x", "visibility": "secret"},
            "visibility: expected one of private, department, project, public",
        ),
        ({"title": "t", "text": "x", "facts": "one fact"}, "facts: expected an array"),
        ({"title": "t", "text": "x", "concepts": [1]}, "concepts[0]: expected str, got int"),
        ({"title": "t", "text": "x", "id": 7}, "id: set by the store when it adds the observation, not by save"),
        ({"title": "t", "text": "x", "created_at_epoch": 0}, "created_at_epoch: set by the store"),
    ]
    async with toolbus(journal_path, None) as client:
        for arguments, expected in cases:
            result = await client.call_tool("save", arguments)
            assert result.is_error, arguments
            assert text_of(result).startswith("Invalid arguments for save: "), text_of(result)
            assert expected in text_of(result), (arguments, text_of(result))
        assert (await call(client, "search"))["total"] == 0
    assert journal.events("ObservationSaved") == []
    assert journal.rows("SELECT * FROM observations") == []
    assert len(journal.commands("save")) == len(cases)
    assert "ok" not in {c["status"] for c in journal.commands("save")}


async def test_a_store_failure_is_an_error_and_the_server_keeps_serving(
    journal_path: Path, journal: JournalReader
) -> None:
    async with toolbus(journal_path, None) as client:
        await save(client, title="Before", text="stored")
        # The projection fails, so the append of its event must fail with it.
        other_writer(
            journal_path,
            "CREATE TRIGGER refuse BEFORE INSERT ON observations BEGIN SELECT RAISE(ABORT, 'no'); END",
        )
        result = await client.call_tool("save", {"title": "During", "text": "refused"})
        assert result.is_error
        assert text_of(result) == f"the journal at {journal_path} failed: no"
        other_writer(journal_path, "DROP TRIGGER refuse")
        after = await save(client, title="After", text="stored again")
        assert set(await found(client, "stored")) == {1, after["id"]}
    assert [e["data"]["title"] for e in journal.events("ObservationSaved")] == ["Before", "After"]
    journal.assert_gapless()
    assert [c["status"] for c in journal.commands("save")] == ["ok", "failed", "ok"]


def other_writer(journal_path: Path, sql: str) -> None:
    """Change the journal's schema from outside, as another program could."""
    with closing(sqlite3.connect(journal_path)) as conn:
        conn.execute(sql)


@pytest.mark.heavy
async def test_a_journal_locked_by_another_writer_is_an_error(journal_path: Path, journal: JournalReader) -> None:
    async with toolbus(journal_path, None, env={"TOOLBUS_JOURNAL_TIMEOUT": "1"}) as client:
        await save(client, title="Before", text="stored")
        locker = sqlite3.connect(journal_path, isolation_level=None)
        locker.execute("BEGIN IMMEDIATE")  # held past toolbus's busy timeout (1 s here, 5 by default)
        try:
            result = await client.call_tool("save", {"title": "During", "text": "refused"})
        finally:
            locker.execute("ROLLBACK")
            locker.close()
        assert result.is_error
        assert "locked" in text_of(result)
        assert (await call(client, "search", query="refused"))["total"] == 0
        await save(client, title="After", text="stored again")
    assert [e["data"]["title"] for e in journal.events("ObservationSaved")] == ["Before", "After"]


# --- search ---------------------------------------------------------------------------------

NOTES: list[dict[str, Any]] = [
    {
        "title": "Connection pool tuning",
        "text": "The write-ahead log keeps readers and the writer apart.",
        "facts": ["busy timeout is five seconds"],
        "concepts": ["sqlite", "concurrency"],
    },
    {"title": "Release notes", "text": "The writer keeps the readers informed, ahead of time."},
    {"title": "Café crème", "text": "Naïve coöperation with diacritics."},
    {"title": "数据库连接池", "text": "使用连接池可以减少开销。"},
    {"title": "データベース接続の設定", "text": "タイムアウトを五秒にする"},
    {"title": "데이터베이스 연결 설정", "text": "시간 제한은 오초입니다"},
]
NASTY_QUERIES = [
    '"',
    '""',
    '"unbalanced',
    "*",
    "AND",
    "OR OR",
    "NOT",
    "NEAR(",
    "NEAR(a b, 2)",
    "a:",
    ":",
    "col:word",
    "-",
    "^start",
    "foo\"bar'baz",
    "((",
    "a\x00b",
    "'; DROP TABLE observations; --",
    "{title text}: x",
    "+",
    "🙂",
]


async def test_search_matches_words_in_any_order_phrases_hyphens_and_stray_syntax(journal_path: Path) -> None:
    async with toolbus(journal_path, None) as client:
        pool, notes, cafe, *_ = [(await save(client, **note))["id"] for note in NOTES]

        assert await found(client, "apart writer readers") == [pool]
        assert set(await found(client, "readers writer")) == {pool, notes}
        assert await found(client, '"readers and the writer"') == [pool]
        assert await found(client, '"writer readers"') == []
        assert await found(client, "write-ahead") == [pool]
        assert await found(client, "concurrency five seconds") == [pool]  # facts and concepts
        assert await found(client, 'sqlite AND concurrency OR "busy timeout') == [pool]
        assert await found(client, "connection:pool* (writer) [readers]!") == [pool]
        assert await found(client, "CAFE creme naive") == [cafe]
        assert await found(client, "readers nowhere-to-be-found") == []
        for query in NASTY_QUERIES:
            result = await client.call_tool("search", {"query": query})
            assert not result.is_error, (query, text_of(result))
            assert isinstance(json_of(result)["results"], list)


async def test_search_finds_chinese_japanese_and_korean(journal_path: Path) -> None:
    async with toolbus(journal_path, None) as client:
        *_, chinese, japanese, korean = [(await save(client, **note))["id"] for note in NOTES]
        for query in ("连接", "数据库", "减少开销", "连接池 开销", "库"):
            assert await found(client, query) == [chinese], query
        for query in ("データベース", "タイムアウト", "接続", "五秒", "設定 データ"):
            assert await found(client, query) == [japanese], query
        for query in ("데이터베이스", "데이터", "연결 설정", "제한"):
            assert await found(client, query) == [korean], query
        assert await found(client, "连接 开销 nothing") == []
        assert await found(client, "数据连接") == []  # not a substring of any text


async def test_search_filters_pages_and_orders(journal_path: Path, journal: JournalReader) -> None:
    async with toolbus(journal_path, None) as client:
        saved = [
            await save(client, title="zebra in the title", text="stripes", project="zoo", type="decision"),
            await save(client, title="plain", text="a zebra among many other words", project="zoo", type="bugfix"),
            await save(client, title="other", text="nothing striped", project="farm", type="feature"),
            await save(client, title="late", text="the zebra crossing", project="farm", type="bugfix"),
        ]
        first, second, third, fourth = (s["id"] for s in saved)

        everything = await call(client, "search")
        assert (ids(everything), everything["total"]) == ([fourth, third, second, first], 4)
        assert {"limit": 20, "offset": 0}.items() <= everything.items()
        assert set(everything["results"][0]) >= {"id", "title", "type", "project", "created_at_epoch"}
        assert "text" not in everything["results"][0]
        assert ids(await call(client, "search", orderBy="date_asc")) == [first, second, third, fourth]
        for nothing_shown in (" ", "\u3000", "\u200b", "\u3000\u200b\n"):  # as no query: the filters only
            assert ids(await call(client, "search", query=nothing_shown)) == [fourth, third, second, first]

        page = await call(client, "search", limit=2, offset=1)
        assert (ids(page), page["total"], page["limit"], page["offset"]) == ([third, second], 4, 2, 1)
        beyond = await call(client, "search", query="zebra", offset=10)
        assert (beyond["results"], beyond["total"]) == ([], 3)

        assert await found(client, "zebra") == [first, fourth, second]  # title weighs most
        assert await found(client, "zebra", orderBy="date_desc") == [fourth, second, first]
        assert await found(client, "zebra", orderBy="date_asc") == [first, second, fourth]
        assert await found(client, "zebra", project="zoo") == [first, second]
        assert ids(await call(client, "search", project="farm")) == [fourth, third]
        assert ids(await call(client, "search", type="bugfix")) == [fourth, second]
        assert ids(await call(client, "search", type="decision, feature")) == [third, first]
        assert await found(client, "zebra", type="bugfix,feature", project="farm") == [fourth]

        assert ids(await call(client, "search", dateStart=saved[2]["created_at_epoch"])) == [
            s["id"] for s in reversed(saved) if s["created_at_epoch"] >= saved[2]["created_at_epoch"]
        ]
        assert ids(await call(client, "search", dateEnd=str(saved[1]["created_at_epoch"]))) == [
            s["id"] for s in reversed(saved) if s["created_at_epoch"] <= saved[1]["created_at_epoch"]
        ]
        today = time.strftime("%Y-%m-%d", time.gmtime())
        assert (await call(client, "search", dateStart=today, dateEnd=today))["total"] == 4
        assert (await call(client, "search", dateEnd="2001-09-09"))["total"] == 0
        assert (await call(client, "search", query="zebra", dateStart="2001-09-09T01:46:40Z"))["total"] == 3

        invalid: list[tuple[dict[str, object], str]] = [
            ({"limit": 101}, "limit"),
            ({"limit": 0}, "limit"),
            ({"offset": -1}, "offset"),
            ({"orderBy": "best"}, "orderBy: expected one of relevance, date_desc, date_asc"),
            ({"type": "bugfix,idea"}, "type: expected one or a comma list of decision, bugfix"),
            ({"dateStart": "last tuesday"}, "dateStart: expected an ISO date"),
            ({"query": 42}, "query"),
        ]
        for arguments, field in invalid:
            result = await client.call_tool("search", arguments)
            assert result.is_error and field in text_of(result), (arguments, text_of(result))
    # Checked by msgspec or by the handler, bad arguments are recorded alike: rejected.
    assert [c["status"] for c in journal.commands("search")][-7:] == ["rejected"] * 7


# --- timeline and get_observations ----------------------------------------------------------


async def test_timeline_around_an_id_and_around_a_query(journal_path: Path) -> None:
    async with toolbus(journal_path, None) as client:
        saved = [
            (await save(client, title=f"step {n}", text=f"word{n}", project="odd" if n % 2 else "even"))["id"]
            for n in range(1, 10)
        ]
        around = await call(client, "timeline", anchor=saved[4])
        assert (around["anchor"], ids(around)) == (saved[4], saved[1:8])
        assert around["results"][3]["title"] == "step 5"
        narrow = await call(client, "timeline", anchor=saved[4], depth_before=1, depth_after=2)
        assert ids(narrow) == saved[3:7]
        assert ids(await call(client, "timeline", anchor=saved[0], depth_after=1)) == saved[:2]
        assert ids(await call(client, "timeline", anchor=saved[8], depth_before=0)) == saved[8:]

        by_query = await call(client, "timeline", query="word6", depth_before=2, depth_after=1)
        assert (by_query["anchor"], ids(by_query)) == (saved[5], saved[3:7])
        odd = await call(client, "timeline", query="word5", project="odd", depth_before=1, depth_after=1)
        assert ids(odd) == [saved[2], saved[4], saved[6]]

        assert await call(client, "timeline", anchor=999) == {
            "anchor": None,
            "results": [],
            "message": "No observation 999 found",
        }
        assert (await call(client, "timeline", query="nowhere"))["anchor"] is None
        for arguments in ({"depth_before": 2}, {"query": "\u200b"}, {"query": " \u3000"}):
            result = await client.call_tool("timeline", arguments)
            assert result.is_error and "anchor: expected an observation id, or a non-empty query" in text_of(result)


TOO_BIG = 2**63  # one past what an SQLite INTEGER holds


@pytest.mark.parametrize(
    ("tool", "arguments", "field", "accepts"),
    [
        ("timeline", {"anchor": TOO_BIG}, "anchor", "<= 9223372036854775807"),
        ("timeline", {"anchor": -TOO_BIG - 1}, "anchor", ">= -9223372036854775808"),
        ("timeline", {"anchor": 1, "depth_before": TOO_BIG}, "depth_before", "<= 100"),
        ("search", {"dateStart": TOO_BIG}, "dateStart", "9223372036854775807"),
        ("search", {"dateEnd": "9999999999999999999999999"}, "dateEnd", "9223372036854775807"),
        ("search", {"dateStart": str(-TOO_BIG - 1)}, "dateStart", "-9223372036854775808"),
        ("search", {"limit": TOO_BIG}, "limit", "<= 100"),
        ("search", {"offset": TOO_BIG**2}, "offset", "<= 1000000"),
        ("get_observations", {"ids": [1, TOO_BIG]}, "ids[1]", "<= 9223372036854775807"),
    ],
)
async def test_numbers_past_sqlite_integers_are_invalid_arguments_naming_the_field(
    journal_path: Path, journal: JournalReader, tool: str, arguments: dict[str, Any], field: str, accepts: str
) -> None:
    async with toolbus(journal_path, None) as client:
        await save(client, title="t", text="x")
        result = await client.call_tool(tool, arguments)
        assert result.is_error
        assert text_of(result).startswith(f"Invalid arguments for {tool}: {field}: expected ")
        assert accepts in text_of(result)
        assert (await call(client, "search"))["total"] == 1  # still serving, nothing changed
    [command] = journal.commands(tool)[:1]
    assert command["status"] == "rejected"
    assert len(journal.events()) == 1


async def test_null_means_the_default_and_a_whole_float_an_integer(journal_path: Path) -> None:
    """As clients send them: null for what they leave unset, 10.0 for 10 (JSON Schema's
    "integer" is any number with no fraction). A field no schema names keeps its null and its float."""
    async with toolbus(journal_path, None) as client:
        saved = await save(client, title="t", text="x", type=None, project=None, facts=None, files_read=None, n=2.0)
        [note] = (await call(client, "get_observations", ids=[float(saved["id"])]))["observations"]
        assert (note["type"], note["project"], note["facts"], note["files_read"]) == ("discovery", "manual", [], None)
        assert repr(note["n"]) == "2.0"
        page = await call(client, "search", query="t", limit=None, offset=None, orderBy=None)
        assert (page["total"], page["limit"], page["offset"]) == (1, 20, 0)
        page = await call(client, "search", query="t", limit=10.0, offset=0.0)
        assert (page["total"], page["limit"], page["offset"]) == (1, 10, 0)
        for limit in (10.5, 1e308):  # past 64 bits no whole float is an int: never quoted in 309 digits
            refused = await client.call_tool("search", {"query": "t", "limit": limit})
            assert text_of(refused) == "Invalid arguments for search: limit: expected int, got float"
        refused = await client.call_tool("save", {"title": 5.0, "text": "x"})  # a number where text belongs
        assert refused.is_error and text_of(refused) == "Invalid arguments for save: title: expected str, got float"
        assert (await call(client, "timeline", anchor=saved["id"], depth_before=None))["anchor"] == saved["id"]
        refused = await client.call_tool("save", {"title": None, "text": "x"})  # required: null is no title
        assert refused.is_error and text_of(refused) == "Invalid arguments for save: title: expected str, got null"


async def test_facts_are_bounded_in_all_not_only_each(journal_path: Path, journal: JournalReader) -> None:
    """One call cannot balloon the journal: 1,000 facts of a million characters each are refused."""
    async with toolbus(journal_path, None) as client:
        result = await client.call_tool("save", {"title": "t", "text": "x", "facts": ["f" * 600_000] * 2})
        assert result.is_error and text_of(result) == (
            "Invalid arguments for save: facts: expected at most 1000000 characters in all, got 1200000"
        )
        result = await client.call_tool("save", {"title": "t", "text": "x", "concepts": ["c" * 4000] * 251})
        assert result.is_error and text_of(result) == (
            "Invalid arguments for save: concepts: expected at most 1000000 characters in all, got 1004000"
        )
        await save(client, title="t", text="x", facts=["f" * 500_000] * 2)  # up to the bound
    assert [command["status"] for command in journal.commands("save")] == ["rejected", "rejected", "ok"]


async def test_the_last_day_a_date_holds_is_a_valid_bound(journal_path: Path) -> None:
    async with toolbus(journal_path, None) as client:
        await save(client, title="t", text="x")
        assert (await call(client, "search", dateStart="0001-01-01", dateEnd="9999-12-31"))["total"] == 1


async def test_get_observations_in_the_order_asked_with_missing_ids(journal_path: Path) -> None:
    async with toolbus(journal_path, None) as client:
        first = await save(client, title="first", text="one", facts=["a", "b"], concepts=["c"])
        second = await save(client, title="second", text="two", files_modified=["/x.py"])
        reply = await call(client, "get_observations", ids=[second["id"], 404, first["id"], 404])
        assert [o["id"] for o in reply["observations"]] == [second["id"], first["id"]]
        assert reply["missing"] == [404]
        full_second, full_first = reply["observations"]
        assert (full_first["facts"], full_first["concepts"], full_first["text"]) == (["a", "b"], ["c"], "one")
        assert full_second["files_modified"] == ["/x.py"]
        assert full_second["memory_session_id"] == second["memory_session_id"]
        assert await call(client, "get_observations", ids=[]) == {"observations": [], "missing": []}
        result = await client.call_tool("get_observations", {"ids": ["1"]})
        assert result.is_error and "ids[0]" in text_of(result)


# --- visibility -----------------------------------------------------------------------------


async def test_each_caller_sees_only_what_its_visibility_allows(journal_path: Path) -> None:
    async with toolbus(journal_path, None, "--agent", "alice", "--department", "eng") as alice:
        saved = {
            level: (await save(alice, title=f"{level} plan", text="the launch plan", visibility=level))["id"]
            for level in ("private", "department", "project", "public")
        }
        for_bob = (await save(alice, title="note for bob", text="launch plan", agent="bob", visibility="private"))["id"]
        everyone = {*saved.values(), for_bob}
        expected = {
            "alice": everyone - {for_bob},
            "bob": everyone - {saved["private"]},  # same department, and owns the note for bob
            "carol": {saved["project"], saved["public"]},  # another department
        }
        async with (
            toolbus(journal_path, None, "--agent", "bob", "--department", "eng") as bob,
            toolbus(journal_path, None, env={"TOOLBUS_AGENT": "carol", "TOOLBUS_DEPARTMENT": "sales"}) as carol,
        ):
            for name, client in (("alice", alice), ("bob", bob), ("carol", carol)):
                await sees_exactly(client, expected[name], everyone, name)
            # The best match of a query is never one the caller may not see.
            assert (await call(alice, "timeline", query="private plan"))["anchor"] == saved["private"]
            assert (await call(carol, "timeline", query="private plan"))["anchor"] is None


async def sees_exactly(client: Client, visible: set[int], everyone: set[int], name: str) -> None:
    """Search (with and without words, counted on full and partial pages), timeline and
    get_observations all show `visible` and nothing else of `everyone`."""
    for arguments in ({"query": "launch plan"}, {}, {"query": "plan", "limit": 1}, {"limit": 1}):
        reply = await call(client, "search", **arguments)
        assert reply["total"] == len(visible), (name, arguments)
        if "limit" not in arguments:
            assert set(ids(reply)) == visible, (name, arguments)
    fetched = await call(client, "get_observations", ids=sorted(everyone))
    assert {o["id"] for o in fetched["observations"]} == visible, name
    assert set(fetched["missing"]) == everyone - visible, name
    for anchor in everyone:
        around = await call(client, "timeline", anchor=anchor, depth_before=10, depth_after=10)
        if anchor in visible:
            assert set(ids(around)) == visible, (name, anchor)
        else:
            assert (around["anchor"], around["results"]) == (None, []), (name, anchor)


# --- durability and concurrency -------------------------------------------------------------


async def test_everything_saved_is_found_after_a_restart(journal_path: Path) -> None:
    async with toolbus(journal_path, None) as client:
        first = await save(client, title="Survives restarts", text="durable memory 持久化")
    async with toolbus(journal_path, None) as client:
        assert await found(client, "durable memory") == [first["id"]]
        assert await found(client, "持久") == [first["id"]]
        [record] = (await call(client, "get_observations", ids=[first["id"]]))["observations"]
        assert record["created_at_epoch"] == first["created_at_epoch"]
        second = await save(client, title="After the restart", text="durable too")
        assert await found(client, "durable", orderBy="date_desc") == [second["id"], first["id"]]


async def test_a_save_after_another_servers_is_never_timed_before_it(journal_path: Path) -> None:
    """Another server on the journal saved a note timed ahead of this one's clock (it read its
    clock later, or runs ahead): a note saved here after it is timed a millisecond after, so an
    agent asking for the notes after the latest time it saw misses none; the answer says the
    time stored."""
    async with toolbus(journal_path, None) as client:
        first = await save(client, title="first", text="in order")
        ahead = first["created_at_epoch"] + 3_600_000
        note = ObservationSaved(
            title="ahead",
            text="in order",
            type="discovery",
            project="manual",
            memory_session_id="other",
            facts=[],
            concepts=[],
            agent="other",
            department="default",
            visibility="public",
            created_at_epoch=ahead,
        )
        other = SqliteJournal(journal_path)  # another server's journal, as a process of its own has it
        try:
            saving = CommandRecord(tool="save", arguments={}, caller=Caller(agent="other"), received_ns=time.time_ns())
            [(at, _)] = await other.finish(saving, None, "ok", events=[note])
        finally:
            other.close()
        second = await save(client, title="second", text="in order")
        assert (second["id"], second["created_at_epoch"]) == (at + 1, ahead + 1)
        [stored] = (await call(client, "get_observations", ids=[second["id"]]))["observations"]
        assert stored["created_at_epoch"] == ahead + 1
        assert await found(client, "in order", dateStart=ahead + 1) == [second["id"]]


async def test_two_servers_saving_into_one_journal_lose_nothing(journal_path: Path, journal: JournalReader) -> None:
    per_server = 50
    replies: dict[str, list[dict[str, Any]]] = {}

    async def save_many(agent: str) -> None:
        async with toolbus(journal_path, None, "--agent", agent) as client:
            replies[agent] = [
                await save(client, title=f"{agent} {n}", text="concurrent save", visibility="public")
                for n in range(per_server)
            ]

    async with anyio.create_task_group() as group:
        group.start_soon(save_many, "left")
        group.start_soon(save_many, "right")

    saved_ids = sorted(r["id"] for agent_replies in replies.values() for r in agent_replies)
    assert saved_ids == list(range(1, 2 * per_server + 1))
    # Each answer says the time stored, and times grow with the ids, however the saves interleaved.
    times = {r["id"]: r["created_at_epoch"] for agent_replies in replies.values() for r in agent_replies}
    stored = {e["position"]: e["data"]["created_at_epoch"] for e in journal.events("ObservationSaved")}
    in_order = [times[i] for i in saved_ids]
    assert stored == times and in_order == sorted(set(in_order))
    journal.assert_gapless()
    assert [e["position"] for e in journal.events("ObservationSaved")] == saved_ids
    async with toolbus(journal_path, None) as client:
        reply = await call(client, "search", query="concurrent save", limit=100)
        assert (sorted(ids(reply)), reply["total"]) == (saved_ids, 2 * per_server)
        assert (await call(client, "search", query="left", limit=100))["total"] == per_server


@pytest.mark.parametrize(
    ("text", "shows_nothing"),
    [
        ("", True),
        (" \t\n\u3000\u00a0", True),
        ("\u200b\u200d\ufeff\u00ad\u2060", True),  # zero-width, byte order mark, soft hyphen
        ("\u3164\uffa0", True),  # Hangul fillers, drawn as space
        ("\ufe0f", True),  # a variation selector alone
        ("\u06dd", False),  # ARABIC END OF AYAH: a format character that shows
        ("\U00013430", False),  # an Egyptian hieroglyph format control
        ("\u2800", False),  # BRAILLE PATTERN BLANK: a character of its own
        ("\u200ba", False),
    ],
)
def test_blank_means_shows_nothing(text: str, shows_nothing: bool) -> None:
    assert blank(text) is shows_nothing
