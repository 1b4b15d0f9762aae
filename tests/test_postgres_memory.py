"""The memory store on a real PostgreSQL, checked against the SQLite store: every search here
runs on both, over the same observations, and must give the same page and total."""

from __future__ import annotations

import random
import sqlite3
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import anyio
import psycopg
import pytest

from tests.postgres_server import drop_database, fresh_database, server_url, with_database
from toolbus.bus import Caller, ObservationSaved
from toolbus.bus.queries import SearchPage, SearchQuery, TimelineQuery
from toolbus.journal.postgres import memory as pg
from toolbus.journal.postgres.memory import (
    INSERT_OBSERVATION,
    MEMORY_TABLES,
    PostgresMemoryStore,
    get_observations_sync,
    observation_params,
    search_sync,
    timeline_sync,
)
from toolbus.journal.postgres.schema import SEARCH_FUNCTIONS
from toolbus.journal.sqlite import memory as lite

T = TypeVar("T")
CLAUDE = Caller(agent="claude", department="platform")
REVIEWER = Caller(agent="reviewer", department="platform")
STRANGER = Caller(agent="stranger", department="sales")
JAN_1 = 1_735_689_600_000


class Stores:
    """The same observations in PostgreSQL and in SQLite; each read asks both."""

    def __init__(self, conn: psycopg.Connection[Any]) -> None:
        self.pg = conn
        self.lite = sqlite3.connect(":memory:", isolation_level=None)
        self.lite.execute("CREATE TABLE events (position INTEGER PRIMARY KEY)")
        lite.reset_memory_tables(self.lite)
        self.position = 0

    def add(self, title: str, text: str = "", at: int | None = None, **fields: Any) -> int:
        self.position += 1
        defaults: dict[str, Any] = {
            "type": "discovery",
            "project": "toolbus",
            "memory_session_id": "s1",
            "facts": [],
            "concepts": [],
            "agent": CLAUDE.agent,
            "department": CLAUDE.department,
            "visibility": "project",
        }
        at = JAN_1 + self.position * 1000 if at is None else at
        event = ObservationSaved(title=title, text=text, created_at_epoch=at, **(defaults | fields))
        self.pg.execute("INSERT INTO events (position) VALUES (%s)", (self.position,))
        self.pg.execute(INSERT_OBSERVATION, observation_params(self.position, event))
        lite.apply_observation(self.lite, self.position, event)
        return self.position

    def page(self, viewer: Caller = CLAUDE, /, **query: Any) -> SearchPage:
        asked = SearchQuery(**query)
        found = search_sync(self.pg, asked, viewer)
        assert found == lite.search_sync(self.lite, asked, viewer), asked
        return found

    def search(self, text: str | None, viewer: Caller = CLAUDE, **query: Any) -> list[int]:
        found = self.page(viewer, text=text, **({"limit": 100} | query))
        return [row.id for row in found.results]

    def titles(self, text: str | None, viewer: Caller = CLAUDE) -> list[str]:
        found = self.page(viewer, text=text, limit=100)
        assert found.total == len(found.results)
        return sorted(row.title for row in found.results)

    def timeline(self, viewer: Caller = CLAUDE, /, **query: Any) -> list[int]:
        asked = TimelineQuery(**query)
        found = timeline_sync(self.pg, asked, viewer)
        assert found == lite.timeline_sync(self.lite, asked, viewer), asked
        return [row.id for row in found.results]

    def run(self, work: Callable[[psycopg.Connection[Any]], T]) -> T:
        return work(self.pg)


class Runner:
    """The journal's part: lends its connection to the store's work."""

    def __init__(self, conn: psycopg.Connection[Any]) -> None:
        self.conn = conn

    async def run(self, work: Callable[[psycopg.Connection[Any]], T]) -> T:
        return work(self.conn)


@pytest.fixture(scope="module")
def database() -> Iterator[str]:
    name = fresh_database()
    yield with_database(server_url(), name)
    drop_database(name)


@pytest.fixture
def stores(database: str) -> Iterator[Stores]:
    """A fresh `toolbus` schema holding the memory tables, the events and agents they refer to,
    and the functions the search goes through."""
    with psycopg.connect(database, autocommit=True) as conn:
        conn.execute("DROP SCHEMA IF EXISTS toolbus CASCADE")
        conn.execute("CREATE SCHEMA toolbus")
        conn.execute("SET search_path = toolbus")
        conn.execute("CREATE TABLE events (position bigint PRIMARY KEY)")
        conn.execute("CREATE TABLE agents (role text PRIMARY KEY, department text NOT NULL)")
        for statement in (*MEMORY_TABLES, *SEARCH_FUNCTIONS):
            conn.execute(statement)
        both = Stores(conn)
        yield both
        both.lite.close()


def test_search_semantics(stores: Stores) -> None:
    stores.add("Journal uses WAL", "readers and the writer stay apart")
    stores.add("Write-ahead log", "the write-ahead row comes first; see src/store.py")
    stores.add("Café notes", "optimisation of v1.2")
    stores.add("データベース", "数据库 and 데이터 notes")
    assert stores.titles("apart writer readers") == ["Journal uses WAL"]
    assert stores.titles('"stay apart"') == ["Journal uses WAL"]
    assert stores.titles('"apart stay"') == []
    assert stores.titles("write-ahead") == ["Write-ahead log"]
    assert stores.titles("src/store.py") == ["Write-ahead log"]
    assert stores.titles("cafe") == ["Café notes"]
    assert stores.titles("CAFÉ") == ["Café notes"]
    assert stores.titles("optim*") == ["Café notes"]
    assert stores.titles("v1.2") == ["Café notes"]
    assert stores.titles("数据库") == ["データベース"]
    assert stores.titles("データ") == ["データベース"]
    assert stores.titles("데이터") == ["データベース"]
    assert stores.titles("库") == ["データベース"]
    for hostile in ['"unbalanced', "NEAR(a b)", "title:", "(*)", "^", "a AND OR", "* : ^", "it's \\ 'x'", "a & !b | c"]:
        stores.titles(hostile)  # never an error
    assert stores.titles("!!! ???") == []
    assert stores.titles("") == []
    assert len(stores.titles(None)) == 4


def test_the_store_answers_through_its_runner(stores: Stores) -> None:
    first = stores.add("shared plan", "for all")
    stores.add("claude plan", "mine alone", visibility="private")
    store = PostgresMemoryStore(Runner(stores.pg))
    page = anyio.run(store.search, SearchQuery(text="plan"), STRANGER)
    assert [row.id for row in page.results] == [first]
    timeline = anyio.run(store.timeline, TimelineQuery(anchor=first), STRANGER)
    assert [row.id for row in timeline.results] == [first]
    found = anyio.run(store.get_observations, [first, 2], STRANGER)
    assert [record["id"] for record in found.observations] == [first] and found.missing == [2]


def test_a_title_hit_ranks_above_a_tags_hit_above_a_text_hit(stores: Stores) -> None:
    in_text = stores.add("one", "the index lives here")
    in_title = stores.add("index notes", "nothing")
    in_tags = stores.add("two", "nothing", facts=["the index"])
    in_concepts = stores.add("three", "nothing", concepts=["index"])
    older_text, newer_text = stores.add("four", "index"), stores.add("five", "index")
    assert stores.search("index") == [in_title, in_concepts, in_tags, newer_text, older_text, in_text]
    # A phrase scores its best column once; phrases add up.
    both = stores.add("index", "index", facts=["index"])
    two_words = stores.add("index page", "nothing", facts=["page"])
    assert stores.search("index page")[:1] == [two_words]
    assert stores.search("index")[:4] == [two_words, both, in_title, in_concepts]  # 5 once, not 5 + 2 + 1


def test_ties_are_newest_first_and_hidden_notes_change_nothing(stores: Stores) -> None:
    ids = [stores.add(f"note {i}", "plan of work") for i in range(5)]
    assert stores.search("plan") == ids[::-1]
    order, page = stores.search("plan work"), stores.page(text="plan", limit=2, offset=1)
    for i in range(20):  # another agent's private notes, some of them far better matches
        stores.add("plan work plan", "plan", agent="other", visibility="private", facts=["plan"] * (i % 3))
    assert stores.search("plan work") == order
    assert stores.page(text="plan", limit=2, offset=1) == page
    assert len(stores.search("plan", Caller(agent="other", department="x"))) == 25


def test_visibility(stores: Stores) -> None:
    shared = stores.add("shared plan", "for all", visibility="project")
    public = stores.add("public plan", "for everyone", visibility="public")
    platform = stores.add("platform plan", "for the department", visibility="department")
    mine = stores.add("claude plan", "mine alone", visibility="private")
    odd = stores.add("odd plan", "no one", visibility="secret")
    assert stores.search("plan", CLAUDE) == [mine, platform, public, shared]
    assert stores.search("plan", REVIEWER) == [platform, public, shared]
    assert stores.search("plan", STRANGER) == [public, shared]
    assert stores.search(None, STRANGER) == [public, shared]
    assert stores.timeline(STRANGER, anchor=public, depth_before=5, depth_after=5) == [shared, public]
    assert stores.timeline(STRANGER, anchor=mine) == []
    assert stores.timeline(CLAUDE, anchor=platform) == [shared, public, platform, mine]
    assert stores.timeline(STRANGER, text="plan for") == [shared, public]
    found = stores.run(lambda conn: get_observations_sync(conn, [odd, mine, public, 999, public], STRANGER))
    assert [record["id"] for record in found.observations] == [public]
    assert found.missing == [odd, mine, 999]


def test_full_records_are_the_sqlite_stores(stores: Stores) -> None:
    ids = [
        stores.add("a", "text", facts=["f1", "f2"], concepts=["c"], extra={"files": ["x.py"], "title": "not me"}),
        stores.add("b", "more", visibility="private"),
    ]
    found = stores.run(lambda conn: get_observations_sync(conn, [*ids, 3], CLAUDE))
    assert found == lite.get_observations_sync(stores.lite, [*ids, 3], CLAUDE)
    assert found.observations[0]["facts"] == ["f1", "f2"]
    assert found.observations[0]["files"] == ["x.py"] and found.observations[0]["title"] == "a"


def test_filters_paging_and_total(stores: Stores) -> None:
    for i in range(30):
        stores.add(
            f"item {i}",
            "common words" + (" rare" if i % 7 == 0 else ""),
            at=JAN_1 + (i % 10) * 1000,  # times repeat: ties between times are broken by id
            project="p" if i % 2 else "q",
            type=("bugfix", "feature", "discovery")[i % 3],
        )
    queries: list[dict[str, object]] = [
        {"text": "common", "project": "p"},
        {"text": "common", "types": ("bugfix", "feature")},
        {"text": "common", "start_ms": JAN_1 + 3000, "end_ms": JAN_1 + 6000},
        {"text": "common rare"},
        {"text": None, "project": "q", "types": ("discovery",)},
        {"text": None, "start_ms": JAN_1 + 8000},
    ]
    for query in queries:
        for order_by in ("relevance", "date_desc", "date_asc"):
            whole = stores.page(**query, order_by=order_by, limit=100)
            assert whole.total == len(whole.results) > 0
            for offset in (0, 3, whole.total - 1, whole.total, whole.total + 5):
                part = stores.page(**query, order_by=order_by, limit=4, offset=offset)
                assert part.total == whole.total
                assert part.results == whole.results[offset : offset + 4]


def test_a_project_holding_nul_is_found_as_it_was_saved(stores: Stores) -> None:
    """PostgreSQL keeps a NUL as U+FFFD; a filter naming the project with its NUL failed the
    call as a journal fault ("text fields cannot contain NUL")."""
    odd = stores.add("odd project", "words", project="p\x00q")
    stores.add("other project", "words", project="p")
    for text in (None, "words"):
        found = search_sync(stores.pg, SearchQuery(text=text, project="p\x00q"), CLAUDE)
        assert [row.id for row in found.results] == [odd]
    around = timeline_sync(stores.pg, TimelineQuery(anchor=odd, project="p\x00q"), CLAUDE)
    assert [row.id for row in around.results] == [odd]


def test_a_huge_text_saves_and_is_found_by_its_first_words(stores: Stores) -> None:
    long_word = "x" * 5000
    words = [f"w{i}" for i in range(200_000)]
    text = f"opening words {long_word} " + " ".join(words) + " and " + "é" * 3000
    assert len(text) > 1_000_000
    huge = stores.add("huge", text[:1_000_000] + text, facts=["fact"])
    other = stores.add("small", "opening words")
    assert stores.search('"opening words"') == [other, huge]
    assert stores.search(long_word) == [huge]
    assert stores.search("w10 w20000") == [huge]
    # Past the tsvector's room the latest words are left out: PostgreSQL finds less than SQLite.
    assert search_sync(stores.pg, SearchQuery(text="w199999"), CLAUDE).total == 0


def test_lexemes_with_quotes_and_backslashes_survive_the_literal(stores: Stores) -> None:
    lexemes = ["it's", "a\\b", "''", "\\'", "x y"]
    literal = " ".join(f"{pg._quoted(lexeme)}:1" for lexeme in lexemes)
    row = stores.pg.execute("SELECT tsvector_to_array(%s::tsvector)", (literal,)).fetchone()
    assert row is not None and sorted(row[0]) == sorted(lexemes)
    query = " & ".join(pg._quoted(lexeme) for lexeme in lexemes)
    row = stores.pg.execute("SELECT %s::tsvector @@ %s::tsquery", (literal, query)).fetchone()
    assert row == (True,)


def test_words_past_the_last_position_are_still_found(stores: Stores) -> None:
    late = stores.add("title " * 20_000, "tail", facts=["fact"])
    assert stores.search("tail") == [late]
    assert stores.search("fact") == [late]


# --- the same answers as SQLite, over many observations and queries ---------------------------

_VOCABULARY = [
    *["alpha", "beta", "gamma", "delta", "write-ahead", "src/store.py", "v1.2", "index", "plan", "journal", "note"],
    *["Café", "cafe", "naïve", "ÉCOLE", "ǖber", "Straße", "σοφία", "ΣΟΦΊΑ", "Ärger", "übung", "ﬁle", "½", "x\u0301y"],
    *["数据库", "データベース", "데이터", "東京タワー", "库", "ー", "한"],
    *["deploy🤖", "🤔", "fix🛠deploy", "😀", "ᏸ", "Ᏸ", "Ა", "ა", "Ǡ", "ǡ"],  # Unicode 6.1 and since
    *["it's", "a\\b", '"quoted"', "(x)", "[y]", "{z}", "42", "3.14", "foo_bar", "a\tb", "end."],
]
_QUERY_WORDS = [
    *_VOCABULARY,
    *["al*", '"alpha beta"', '"beta alpha"', '"gamma delta alpha"', "dat*", "数据", "据库", "データ", "東京", "タワ"],
    *["ecole", "uber", "strasse", "σοφια", "NEAR(alpha beta)", "title:", "(*)", "^", "AND", "OR", '"unbalanced'],
    *["*", ":", "!!!", "caf*", "x*", "ｄａｔａ", "-alpha", "alpha*beta", '"v1.2 index"'],
]


def _corpus(stores: Stores, seed: int, count: int) -> None:
    draw = random.Random(seed)

    def words(n: int) -> str:
        return " ".join(draw.choice(_VOCABULARY) for _ in range(draw.randrange(n)))

    for _ in range(count):
        stores.add(
            words(5),
            words(30),
            at=JAN_1 + draw.randrange(50) * 1000,
            facts=[words(4) for _ in range(draw.randrange(3))],
            concepts=[words(2) for _ in range(draw.randrange(2))],
            project=draw.choice(["p", "q"]),
            type=draw.choice(["bugfix", "feature"]),
            agent=draw.choice(["claude", "reviewer", "other"]),
            department=draw.choice(["platform", "sales"]),
            visibility=draw.choice(["public", "project", "department", "private"]),
        )


@pytest.mark.parametrize("rank_all_up_to", [0, 10**9])
def test_every_search_is_the_sqlites(stores: Stores, monkeypatch: pytest.MonkeyPatch, rank_all_up_to: int) -> None:
    """Both ways of reading a relevance page (scoring the few matches that rank above the
    rest, or reading score levels) give SQLite's page, for queries of one to four phrases."""
    monkeypatch.setattr(pg, "RANK_ALL_UP_TO", rank_all_up_to)
    monkeypatch.setattr(pg, "_WALK_FROM", rank_all_up_to)  # and both ways of reading newest first
    _corpus(stores, seed=7, count=300)
    draw = random.Random(8)
    matched = 0
    for _ in range(300):
        text = " ".join(draw.choice(_QUERY_WORDS) for _ in range(draw.randrange(1, 5)))
        viewer = draw.choice([CLAUDE, REVIEWER, STRANGER])
        query = {
            "order_by": draw.choice(["relevance", "relevance", "date_desc", "date_asc"]),
            "limit": draw.choice([1, 5, 20]),
            "offset": draw.choice([0, 0, 3, 17]),
            **draw.choice([{}, {}, {"project": "p"}, {"types": ("bugfix",)}, {"start_ms": JAN_1 + 20_000}]),
        }
        matched += stores.page(viewer, text=text, **query).total > 0
        stores.timeline(viewer, text=text, project=query.get("project"))
    assert matched > 100  # the queries found things to compare


def test_search_text_tokens_are_sqlites(stores: Stores) -> None:
    """Every observation of a varied corpus is found by each of its words, and by each pair of
    neighbouring words as a phrase, as in SQLite."""
    _corpus(stores, seed=9, count=60)
    rows = stores.pg.execute("SELECT title, text FROM observations").fetchall()
    for title, text in rows:
        words = f"{title} {text}".split()
        for i in range(0, len(words) - 1, 3):
            stores.page(CLAUDE, text=words[i], limit=100)
            stores.page(CLAUDE, text='"' + " ".join(words[i : i + 2]).replace('"', "") + '"', limit=100)
