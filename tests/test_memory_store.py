"""The memory store without a server: the query builder, argument interpretation, and the
store's SQL over a real journal file whose events (and their times) the test chooses."""

from __future__ import annotations

import gc
import random
import re
import sqlite3
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import Any

import pytest

from toolbus.bus import Caller, CommandRecord, InvalidArguments, ObservationSaved, decode_event
from toolbus.bus.queries import SearchPage, SearchQuery, TimelineQuery
from toolbus.handlers.memory import date_ms, observation_types
from toolbus.journal import SqliteJournal
from toolbus.journal.rows import Outcome
from toolbus.journal.search_text import searchable, tokens
from toolbus.journal.sqlite import memory as store
from toolbus.journal.sqlite.memory import (
    AudienceMarks,
    apply_observation,
    get_observations_sync,
    match_expression,
    reset_memory_tables,
    search_sync,
    timeline_sync,
)
from toolbus.journal.sqlite.replay import check_memory, rebuild_memory

DAY_MS = 86_400_000
JAN_1 = 1_735_689_600_000  # 2025-01-01T00:00:00Z
ANYONE = Caller(agent="reader", department="elsewhere")

# --- the query builder ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("query", "expression"),
    [
        ("hello world", '"hello" AND "world"'),
        ('"quoted phrase" x', '"quoted phrase" AND "x"'),
        ("full-text", '"full-text"'),
        ('a AND b OR NEAR c "unbalanced', '"a" AND "b" AND "c" AND "unbalanced"'),
        ("and or near", '"and" AND "or" AND "near"'),  # only capitals are connectives
        ("OR", '"OR"'),  # ...and only between words: alone, they are what is looked for
        ("NEAR AND", '"NEAR" AND "AND"'),
        ("title:foo", '"title" AND "foo"'),
        ("optim*", '"optim"*'),
        ("数据库", '"数据 据库"'),
        ("库", '"库"*'),
        ("Python数据库", '"Python 数据 据库"'),
        ("数据库Python", '"数据 据库 库 Python"'),
        ("데이터", '"데이 이터"'),
        ("ｄａｔａ", '"data"'),
        ("x\x00y", '"x" AND "y"'),
        ("a* " * 1300 + "b a* b", '"a"* AND "b"'),  # each phrase once: a pasted word took seconds
        ('x "x" X', '"x" AND "X"'),
        ("", None),
        ("***", None),
        ('""" - :', None),
    ],
)
def test_queries_become_quoted_fts5_strings(query: str, expression: str | None) -> None:
    assert match_expression(query) == expression


def test_cjk_runs_are_indexed_as_bigrams_and_their_last_character() -> None:
    assert searchable("用Python的数据库。") == " 用 Python 的数 数据 据库 库 。"
    assert searchable("데이터 ok") == " 데이 이터 터  ok"


@pytest.fixture(scope="module")
def fts() -> Iterator[sqlite3.Connection]:
    conn = sqlite3.connect(":memory:")
    conn.execute("CREATE VIRTUAL TABLE t USING fts5(a, content='', tokenize='unicode61 remove_diacritics 2')")
    conn.execute("INSERT INTO t (rowid, a) VALUES (1, ?)", (searchable("some text 数据库 with words"),))
    yield conn
    conn.close()


# Characters that have meant trouble for FTS5 queries: its syntax, quotes, controls, and scripts
# whose tokens it splits differently.
_TROUBLE = [
    *"\"'*:^-+()[]{},.;!?/\\ \t\nxyz0123456789",
    *("AND", "OR", "NOT", "NEAR", "NEAR(", "\x00", "\u200b", "\ue000", "\u0301"),
    *("é", "ﬁ", "数", "据", "库", "か", "ー", "・", "한", "🙂"),
]


def test_no_query_is_an_fts5_error(fts: sqlite3.Connection) -> None:
    draw = random.Random(4).choice
    for _ in range(3000):
        query = "".join(draw(_TROUBLE) for _ in range(draw(range(1, 16))))
        expression = match_expression(query)
        if expression is not None:
            fts.execute("SELECT rowid FROM t WHERE t MATCH ?", (expression,)).fetchall()


@pytest.mark.parametrize("text", ["数据库连接池", "データベース接続の設定", "데이터베이스", "東京タワーへ行く"])
def test_every_cjk_substring_of_two_or_more_characters_finds_its_text(text: str) -> None:
    conn = sqlite3.connect(":memory:")
    conn.execute("CREATE VIRTUAL TABLE t USING fts5(a, content='', tokenize='unicode61 remove_diacritics 2')")
    conn.execute("INSERT INTO t (rowid, a) VALUES (1, ?)", (searchable(f"x {text}, y"),))
    for start in range(len(text)):
        for end in range(start + 1, len(text) + 1):
            expression = match_expression(text[start:end])
            found = conn.execute("SELECT rowid FROM t WHERE t MATCH ?", (expression,)).fetchall()
            assert found == [(1,)], text[start:end]


# Characters of each kind unicode61 treats its own way: letters and emoji assigned after
# Unicode 6.1 (parts of words to it), letters it folds otherwise than Python, accents it drops,
# marks, full-width forms, private use, CJK, and separators of several scripts.
_CHARACTERS = "ab Z9_'-.\t\u00a0éÉßﬁσΣçÇ\u0301\u0308ᏸᎠᲐაǠǡ🤖🙂😀✅🛠ｄＡ\ue000数据库かナ한・、。«»—\u200b"


def test_tokens_are_unicode61_s() -> None:
    """Whatever the characters, `tokens` splits and folds a text as the SQLite index does."""
    conn = sqlite3.connect(":memory:")
    conn.execute("CREATE VIRTUAL TABLE t USING fts5(a, tokenize='unicode61 remove_diacritics 2')")
    conn.execute("CREATE VIRTUAL TABLE v USING fts5vocab(t, 'instance')")
    draw = random.Random(6).choice
    texts = ["".join(draw(_CHARACTERS) for _ in range(draw(range(1, 30)))) for _ in range(2000)]
    conn.executemany("INSERT INTO t (rowid, a) VALUES (?, ?)", enumerate(map(searchable, texts), start=1))
    found: dict[int, list[str]] = {}
    for term, row in conn.execute("SELECT term, doc FROM v ORDER BY doc, offset"):
        found.setdefault(row, []).append(term)
    assert [tokens(searchable(text)) for text in texts] == [found.get(row, []) for row in range(1, 2001)]


# --- interpreting arguments -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "end_of_day", "expected"),
    [
        (None, False, None),
        (JAN_1, False, JAN_1),
        (str(JAN_1), True, JAN_1),
        ("2025-01-01", False, JAN_1),
        ("2025-01-01", True, JAN_1 + DAY_MS - 1),  # a bare end date includes its whole day
        ("2025-01-01T00:00:01Z", True, JAN_1 + 1000),
        ("2025-01-01T00:00:00.5", False, JAN_1 + 500),  # no zone: UTC
        ("2025-01-01T02:00:00+02:00", False, JAN_1),
    ],
)
def test_dates_are_iso_or_epoch_milliseconds(value: str | int | None, end_of_day: bool, expected: int) -> None:
    assert date_ms("search", "dateEnd", value, end_of_day=end_of_day) == expected


@pytest.mark.parametrize("value", ["yesterday", "2025-13-01", "01/02/2025", "", "１７００", "١٧٠٠"])
def test_a_date_that_is_neither_is_invalid(value: str) -> None:
    with pytest.raises(InvalidArguments, match="dateStart: expected an ISO date"):
        date_ms("search", "dateStart", value, end_of_day=False)


def test_types_are_one_or_a_comma_list_of_known_types() -> None:
    assert observation_types("search", None) == ()
    assert observation_types("search", " bugfix , feature,bugfix,") == ("bugfix", "feature")
    with pytest.raises(InvalidArguments, match="type: expected one or a comma list of decision, bugfix"):
        observation_types("search", "bugfix,idea")


# --- the store over a journal whose events the test writes ----------------------------------


class Memory:
    """A journal file with observations appended directly, at the times a test chooses."""

    def __init__(self, path: Path) -> None:
        self.journal = SqliteJournal(path)
        self._record = CommandRecord(tool="save", arguments={}, caller=Caller(), received_ns=0)
        self.marks: AudienceMarks | None = AudienceMarks()  # as the server's store keeps them

    def add(self, title: str, at: int, **fields: Any) -> int:
        defaults: dict[str, Any] = {
            "text": title,
            "type": "discovery",
            "project": "p",
            "memory_session_id": "s",
            "facts": [],
            "concepts": [],
            "agent": "writer",
            "department": "d",
            "visibility": "public",
        }
        event = ObservationSaved(title=title, created_at_epoch=at, **(defaults | fields))
        # At the time given, as a copy brings it: a call saved now is timed after the latest.
        [[position]] = self.journal.run_sync(
            lambda conn: self.journal.record_many_sync(conn, [Outcome(self._record, "ok", events=[event])])
        )
        return position

    def search(self, viewer: Caller = ANYONE, /, **query: Any) -> list[int]:
        return [row.id for row in self.page(viewer, **query).results]

    def total(self, viewer: Caller = ANYONE, /, **query: Any) -> int:
        return self.page(viewer, **query).total

    def page(self, viewer: Caller = ANYONE, /, **query: Any) -> SearchPage:
        return self.journal.run_sync(lambda conn: search_sync(conn, SearchQuery(**query), viewer, self.marks))

    def timeline(self, viewer: Caller = ANYONE, /, **query: Any) -> list[int]:
        page = self.journal.run_sync(lambda conn: timeline_sync(conn, TimelineQuery(**query), viewer, self.marks))
        return [row.id for row in page.results]


@pytest.fixture
def memory(tmp_path: Path) -> Iterator[Memory]:
    store = Memory(tmp_path / "journal.db")
    yield store
    store.journal.close()


def test_date_bounds_are_inclusive(memory: Memory) -> None:
    before, start, inside, end, after = (memory.add(f"n{i}", JAN_1 + i * DAY_MS) for i in range(-1, 4))
    window = {"start_ms": JAN_1, "end_ms": JAN_1 + 2 * DAY_MS}
    assert memory.search(order_by="date_asc", **window) == [start, inside, end]
    assert memory.search(text="n0 OR n1 OR n2", order_by="date_asc", **window) == []  # all words must match
    assert memory.search(text="n1", **window) == [inside]
    assert memory.total(limit=1, **window) == 3
    assert memory.total(limit=1) == 5
    assert memory.search(end_ms=JAN_1 - 1) == [before]
    assert memory.search(start_ms=JAN_1 + 3 * DAY_MS) == [after]


def test_timeline_orders_by_time_then_id_even_when_times_are_equal(memory: Memory) -> None:
    late = memory.add("late", JAN_1 + 10)
    same = [memory.add(f"same {i}", JAN_1) for i in range(3)]
    early = memory.add("early", JAN_1 - 10)
    assert memory.search(order_by="date_asc") == [early, *same, late]
    assert memory.timeline(anchor=same[1], depth_before=2, depth_after=2) == [early, *same, late]
    assert memory.timeline(anchor=same[1], depth_before=1, depth_after=1) == same


@pytest.mark.parametrize("order_by", ["relevance", "date_desc", "date_asc"])
def test_pages_of_a_search_with_words_add_up_to_its_ranking_and_total(memory: Memory, order_by: str) -> None:
    owner = Caller(agent="writer", department="d")
    levels = ["public", "private", "department", "project"]
    for i in range(23):
        words = " ".join(["apple"] * (1 + i % 4))  # varied relevance, and ties
        memory.add(f"{words} {i}", JAN_1 + (i * 7) % 5, visibility=levels[i % 4], agent=["writer", "x"][i % 2])
    expected = {viewer: memory.search(viewer, text="apple", limit=100, order_by=order_by) for viewer in (owner, ANYONE)}
    assert len(expected[owner]) > len(expected[ANYONE]) > 0  # visibility matters here
    for viewer, ranking in expected.items():
        pages = [memory.search(viewer, text="apple", limit=4, offset=o, order_by=order_by) for o in range(0, 40, 4)]
        assert [i for page in pages for i in page] == ranking
        totals = {memory.total(viewer, text="apple", limit=4, offset=o, order_by=order_by) for o in (0, 8, 100)}
        assert totals == {len(ranking)}


def test_an_unknown_visibility_is_seen_by_nobody(memory: Memory) -> None:
    odd = memory.add("odd", JAN_1, visibility="team")
    owner = Caller(agent="writer", department="d")
    assert memory.search(owner) == []
    assert memory.total(owner, limit=1) == 0
    reply = memory.journal.run_sync(lambda conn: get_observations_sync(conn, [odd], owner))
    assert reply.missing == [odd]


def test_the_store_is_rebuilt_from_events_alone(memory: Memory) -> None:
    for i, level in enumerate(["private", "department", "project", "public"] * 3):
        memory.add(
            f"note {i} 数据库",
            JAN_1 + i,
            visibility=level,
            facts=[f"fact {i}"],
            extra={"files_read": [f"/f{i}"]},
        )
    viewers = [ANYONE, Caller(agent="writer", department="d"), Caller(agent="x", department="d")]

    def answers() -> list[Any]:
        return [
            (
                memory.search(viewer, text="数据库 note"),
                memory.search(viewer, limit=2, offset=1),
                memory.total(viewer, limit=1),
                memory.timeline(viewer, text="fact 5"),
                memory.journal.run_sync(partial(get_observations_sync, ids=list(range(14)), viewer=viewer)),
            )
            for viewer in viewers
        ]

    before = answers()

    def rebuild(conn: sqlite3.Connection) -> None:
        with SqliteJournal.transaction(conn):
            reset_memory_tables(conn)
            assert conn.execute("SELECT count(*) FROM observations").fetchone() == (0,)
            events = "SELECT position, version, data FROM events WHERE type = 'ObservationSaved'"
            for position, version, data in conn.execute(events).fetchall():
                event = decode_event("ObservationSaved", version, data)
                assert isinstance(event, ObservationSaved)
                apply_observation(conn, position, event)

    memory.journal.run_sync(rebuild)
    assert answers() == before


# What a rebuild must reproduce: every row of the store, the index's per-row token counts and
# its configuration, and the schema of the memory tables.
_STORE_DUMPS = (
    "SELECT * FROM observations ORDER BY id",
    "SELECT * FROM observation_tallies ORDER BY project, type, visibility, department, agent",
    "SELECT * FROM observations_fts_docsize ORDER BY id",
    "SELECT * FROM observations_fts_config ORDER BY k",
    "SELECT type, name, tbl_name, sql FROM sqlite_master WHERE name LIKE 'observation%' ORDER BY name",
)


def _store_dump(memory: Memory) -> list[list[Any]]:
    return memory.journal.run_sync(lambda conn: [conn.execute(sql).fetchall() for sql in _STORE_DUMPS])


def _saved(rng: random.Random, i: int) -> ObservationSaved:
    words = ["apple", "pear", "数据库", "データ", "café", "fsync", "Ｗｉｄｅ", "plum"]
    return ObservationSaved(
        title=" ".join(rng.choices(words, k=rng.randint(1, 4))) + f" {i}",
        text=" ".join(rng.choices(words, k=rng.randint(1, 12))),
        type=rng.choice(["decision", "bugfix", "discovery"]),
        project=rng.choice(["p", "q"]),
        memory_session_id=f"s{i % 7}",
        facts=rng.choices(words, k=rng.randint(0, 2)),
        concepts=rng.choices(words, k=rng.randint(0, 2)),
        agent=rng.choice(["writer", "x"]),
        department=rng.choice(["d", "e"]),
        visibility=rng.choice(["private", "department", "project", "public"]),
        created_at_epoch=JAN_1 + rng.randrange(10 * DAY_MS),
        extra={"files_read": [f"/f{i}"]} if i % 3 else {},
    )


def test_a_rebuilt_store_equals_the_one_written_live(memory: Memory) -> None:
    rng = random.Random(7)
    record = CommandRecord(tool="save", arguments={}, caller=Caller(), received_ns=0)

    def save(count: int) -> None:  # many events per command: one commit, each projected live
        events = [_saved(rng, i) for i in range(count)]
        memory.journal.run_sync(lambda conn: memory.journal.finish_sync(conn, record, None, "ok", events=events))

    viewers = [ANYONE, Caller(agent="writer", department="d"), Caller(agent="x", department="e")]
    queries: list[dict[str, Any]] = [
        {"text": "apple 数据库"},
        {"text": '"pear plum"', "limit": 100},
        {"text": "cafe"},
        {"limit": 5},
    ]

    def answers() -> list[Any]:
        return [
            memory.journal.run_sync(partial(search_sync, query=SearchQuery(**q), viewer=v))
            for q in queries
            for v in viewers
        ]

    def settings(conn: sqlite3.Connection) -> list[Any]:
        return [conn.execute(f"PRAGMA {name}").fetchone() for name in ("foreign_keys", "secure_delete", "cache_size")]

    save(1300)  # more than one batch of a bulk load
    live, found, before = _store_dump(memory), answers(), memory.journal.run_sync(settings)
    assert memory.journal.run_sync(rebuild_memory) == 1300
    assert _store_dump(memory) == live
    assert answers() == found
    # the journal's connection is left as it was
    assert memory.journal.run_sync(settings) == before and gc.isenabled()
    # a live write after a rebuild lands as it would have without one
    save(40)
    assert memory.journal.run_sync(check_memory).differences == []
    live = _store_dump(memory)
    memory.journal.run_sync(rebuild_memory)
    assert _store_dump(memory) == live


# --- ranking sees only what the caller may see ----------------------------------------------

HIDDEN = Caller(agent="zed", department="zz")  # the owner of the notes no viewer below may see


def _answers(memory: Memory, viewer: Caller, text: str) -> list[Any]:
    """Everything a caller can observe of a search with words: each order's ranking, its pages
    and total, and the timeline anchor its best match gives."""
    answers: list[Any] = []
    for order_by in ("relevance", "date_desc", "date_asc"):
        answers.append(memory.search(viewer, text=text, limit=100, order_by=order_by))
        answers.append([memory.search(viewer, text=text, limit=3, offset=o, order_by=order_by) for o in (0, 3, 6)])
        answers.append(memory.total(viewer, text=text, limit=3, order_by=order_by))
    return [*answers, memory.timeline(viewer, text=text, depth_before=0, depth_after=0)]


def _hide(memory: Memory, rng: random.Random, words: list[str], count: int) -> None:
    """Notes only HIDDEN may see, heavy in `words`, of varied lengths and columns."""
    for i in range(count):
        heavy = " ".join(rng.choices(words, k=rng.randint(1, 30)))
        memory.add(
            f"{heavy} hidden {i}",
            JAN_1 + rng.randrange(10 * DAY_MS),
            text=" ".join(["filler"] * rng.randint(0, 200)) + " " + heavy,
            facts=[heavy] if i % 2 else [],
            visibility=rng.choice(["private", "department", "secret"]),
            agent=HIDDEN.agent,
            department=HIDDEN.department,
        )


def test_notes_a_caller_may_not_see_do_not_change_its_ranking_or_anchor(memory: Memory) -> None:
    # Under bm25 the title holding the rarer word came first, and rarity counted every note:
    # another agent's private notes full of "alpha" put "beta" in the title first.
    in_title_alpha = memory.add("alpha", JAN_1, text="beta", facts=["beta"])
    in_title_beta = memory.add("beta", JAN_1 + 1, text="alpha")
    for i in range(3):
        memory.add(f"beta {i}", JAN_1 + 2 + i)
    before = _answers(memory, ANYONE, "alpha beta")
    assert before[0][:2] == [in_title_alpha, in_title_beta] and before[-1] == [in_title_alpha]
    _hide(memory, random.Random(1), ["alpha"], 40)
    after = _answers(memory, ANYONE, "alpha beta")
    assert after[-1] == [in_title_alpha]  # the timeline's anchor
    assert after[0] == before[0]
    assert after == before


@pytest.mark.parametrize("seed", range(3))
def test_hidden_notes_never_change_what_a_caller_observes(memory: Memory, seed: int) -> None:
    rng = random.Random(seed)
    for i in range(40):
        saved = _saved(rng, i)
        memory.add(
            saved.title,
            saved.created_at_epoch,
            **{
                name: getattr(saved, name)
                for name in ("text", "type", "project", "facts", "concepts", "agent", "department", "visibility")
            },
        )
    viewers = [ANYONE, Caller(agent="writer", department="d"), Caller(agent="x", department="e")]
    queries = ["apple", "apple pear", '"pear plum"', "数据库 apple", "cafe fsync", "pl*", "データ"]
    before = [_answers(memory, viewer, text) for viewer in viewers for text in queries]
    _hide(memory, rng, ["apple", "pear", "plum", "数据库", "café", "fsync", "データ"], 60)
    assert [_answers(memory, viewer, text) for viewer in viewers for text in queries] == before


def _trace_into(statements: list[str], conn: sqlite3.Connection) -> None:
    conn.set_trace_callback(statements.append)


def test_marks_of_what_each_caller_may_see_answer_as_the_audience_table(tmp_path: Path) -> None:
    """A search of words by relevance checks its matches against the caller's marks, kept in
    step with observations another process saves: the same pages, totals and anchors as
    checking them against `observation_audience`, and no audience row read once marked."""
    memory, other = Memory(tmp_path / "journal.db"), Memory(tmp_path / "journal.db")
    rng = random.Random(5)
    viewers = [ANYONE, Caller(agent="writer", department="d"), Caller(agent="x", department="e"), HIDDEN]
    queries = ["apple", "apple pear", '"pear plum"', "数据库 apple", "cafe fsync", "pl*", "データ"]
    marks = AudienceMarks()
    for rounds in range(3):
        for i in range(30):  # saved by another connection: this one's marks must catch up
            saved = _saved(rng, 100 * rounds + i)
            fields = ("text", "type", "project", "facts", "concepts", "agent", "department", "visibility")
            other.add(saved.title, saved.created_at_epoch, **{name: getattr(saved, name) for name in fields})
        _hide(other, rng, ["apple", "pear", "plum", "数据库", "fsync", "データ"], 10)
        memory.marks = marks
        marked = [_answers(memory, viewer, text) for viewer in viewers for text in queries]
        memory.marks = None
        assert [_answers(memory, viewer, text) for viewer in viewers for text in queries] == marked
    memory.marks = AudienceMarks(viewers=1)  # each caller's marks made anew, the last one's dropped
    assert [_answers(memory, viewer, text) for viewer in viewers for text in queries] == marked
    for order_by, audience_read in (("relevance", False), ("date_desc", True)):  # by date: its times
        statements: list[str] = []
        memory.journal.run_sync(partial(_trace_into, statements))
        assert memory.total(text="apple", order_by=order_by) > 0
        matched = [sql for sql in statements if "MATCH" in sql]
        assert matched and all(("observation_audience" in sql) == audience_read for sql in matched), matched
    memory.journal.close()
    other.journal.close()


def test_marks_follow_a_rebuilt_memory_and_give_way_past_their_bound(
    memory: Memory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`replay memory` may change who sees what (a store that drifted from its events): the
    marks are made anew. Past `AudienceMarks.UP_TO` positions a search checks on the table."""
    hidden = memory.add("apple", JAN_1, visibility="private")
    seen = memory.add("apple", JAN_1 + 1)

    def drift(conn: sqlite3.Connection) -> None:
        conn.execute("UPDATE observation_audience SET visibility = 'public' WHERE id = ?", (hidden,))

    memory.journal.run_sync(drift)
    assert memory.total(text="apple") == 2  # counted as the drifted store says (never shown)
    memory.journal.run_sync(rebuild_memory)
    assert memory.total(text="apple") == 1
    memory.journal.run_sync(drift)
    assert memory.total(text="apple") == 1  # the same marks: nothing was added
    monkeypatch.setattr(AudienceMarks, "UP_TO", seen)  # no marks: the table, drifted again
    assert memory.total(text="apple") == 2


# --- a relevance page read score level by score level ---------------------------------------


@pytest.mark.parametrize("seed", range(2))
def test_pages_read_by_score_level_equal_the_whole_ranking(
    memory: Memory, seed: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Past `RANK_ALL_UP_TO` matches a relevance page comes level by level from SQL: the same
    pages, whether they lie in one level, straddle two, or start past the title and tag hits.
    The total is the same, counted on from the matches read first."""
    rng = random.Random(seed)
    for i in range(80):
        saved = _saved(rng, i)
        memory.add(
            saved.title,
            saved.created_at_epoch,
            **{
                name: getattr(saved, name)
                for name in ("text", "type", "project", "facts", "concepts", "agent", "department", "visibility")
            },
        )
    for i in range(5):  # a word only in texts, but in the titles of hidden notes
        memory.add(f"untitled {i}", JAN_1 + i, text=f"quince {i}")
    _hide(memory, rng, ["apple", "pear", "plum", "fsync", "quince"], 20)
    viewers = [ANYONE, Caller(agent="writer", department="d"), HIDDEN]
    queries: list[dict[str, str | tuple[str, ...]]] = [
        {"text": t} for t in ("apple", "apple pear", '"pear plum"', "数据库 apple", "pl* fsync", "apple pear plum")
    ]
    queries.append({"text": "apple pear plum fsync"})  # too many phrases for levels: all its matches ranked
    queries += [{"text": "quince"}, {"text": "quince 3"}]
    queries += [{"text": "apple", "project": "q"}, {"text": "pear fsync", "types": ("bugfix", "discovery")}]
    for viewer in viewers:
        for query in queries:
            monkeypatch.setattr(store, "RANK_ALL_UP_TO", 10**9)
            ranking = memory.search(viewer, limit=100, **query)
            anchor = memory.timeline(
                viewer, text=query["text"], project=query.get("project"), depth_before=0, depth_after=0
            )
            monkeypatch.setattr(store, "RANK_ALL_UP_TO", 0)
            for limit in (1, 3, 7):
                pages = [
                    memory.search(viewer, limit=limit, offset=o, **query) for o in range(0, len(ranking) + 8, limit)
                ]
                assert [i for page in pages for i in page] == ranking, (viewer, query, limit)
            assert memory.total(viewer, limit=3, offset=len(ranking) + 2, **query) == len(ranking)
            assert (
                memory.timeline(viewer, text=query["text"], project=query.get("project"), depth_before=0, depth_after=0)
                == anchor
            )


# Words whose tokens unicode61 folds or cuts in ways worth checking: accents, ligatures, other
# scripts' cases, full-width letters, CJK runs, punctuation inside and around words.
_TRICKY = [
    *["alpha", "beta", "gamma", "v1.2", "3.14", "foo_bar", "it's", "a\\b", "src/store.py", "end."],
    *["Café", "cafe", "naïve", "ÉCOLE", "ecole", "Straße", "strasse", "σοφία", "ΣΟΦΊΑ", "ﬁle", "file", "x\u0301y"],
    *["Ｗｉｄｅ", "wide", "数据库", "データベース", "데이터", "東京タワー", "库", "ー"],
]
_TRICKY_QUERIES = [*_TRICKY, "caf*", "ec*", "fi*", "σοφια", "数", "東京", "据库", "タワ"]
_TRICKY_QUERIES += ['"alpha beta"', '"beta alpha"']


@pytest.mark.parametrize("seed", range(2))
def test_scores_read_from_the_rows_are_the_index_s(memory: Memory, seed: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """Queries of several phrases score their matches from the rows' title and tags, by the
    tokenizer's rules in Python: the same ranking as FTS5's column queries give."""
    rng = random.Random(seed)

    def words(most: int) -> str:
        return " ".join(rng.choices(_TRICKY, k=rng.randint(1, most)))

    for i in range(150):
        facts, concepts = [words(3) for _ in range(rng.randint(0, 2))], [words(2) for _ in range(rng.randint(0, 1))]
        memory.add(words(4), JAN_1 + i, text=words(10), facts=facts, concepts=concepts)
    scored = _scored_on_rows(monkeypatch)
    reordered = 0
    for _ in range(200):
        text = " ".join(rng.choices(_TRICKY_QUERIES, k=rng.randint(1, 8)))
        monkeypatch.setattr(store, "SCORED_ON_ROWS_FROM", 1)
        on_rows = memory.search(text=text, limit=200)
        monkeypatch.setattr(store, "SCORED_ON_ROWS_FROM", 10**9)
        assert memory.search(text=text, limit=200) == on_rows, text
        reordered += on_rows != sorted(on_rows, reverse=True)
    assert reordered > 50  # titles and tags did reorder matches: the scores were compared
    assert None not in scored and len(scored) > 100  # and each came from the rows


def test_a_query_of_many_words_is_scored_from_the_rows_however_many_match(
    memory: Memory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """FTS5's column queries grow as the square of the phrases: a pasted sentence over more
    matches than are ranked whole is scored from the rows, to the same ranking."""
    words = [f"w{i}" for i in range(store.ROWS_FOR_ANY_COUNT_FROM)]
    for i in range(30):
        title = " ".join(words[: i % 4]) or "none"
        memory.add(title, JAN_1 + i, text=" ".join(words), facts=[words[i % len(words)]])
    monkeypatch.setattr(store, "RANK_ALL_UP_TO", 10)
    scored = _scored_on_rows(monkeypatch)
    query = " ".join(reversed(words))
    on_rows = memory.search(text=query, limit=100)
    assert len(on_rows) == 30 and len(scored) == 1 and scored[0]  # scored from the rows
    monkeypatch.setattr(store, "SCORED_ON_ROWS_FROM", 10**9)
    assert memory.search(text=query, limit=100) == on_rows
    assert on_rows != sorted(on_rows, reverse=True)  # titles and tags did reorder matches


def _scored_on_rows(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """What each ranking from the rows comes to from now on (None: left to FTS5)."""
    scored: list[Any] = []
    score = store._bonus_on_rows

    def noted(*args: Any) -> Any:
        scored.append(score(*args))
        return scored[-1]

    monkeypatch.setattr(store, "_bonus_on_rows", noted)
    return scored


def test_texts_python_s_unicode_tables_split_otherwise_score_as_in_fts5(
    memory: Memory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """unicode61 keeps Unicode 6.1's tables: emoji and letters assigned since are parts of
    words to it, not to Python's, and some letters fold otherwise. Scored from the rows, such
    texts rank as FTS5's column queries say. FTS5 cuts tokens at 32 KiB: only where the query
    holds a token that long too can the cut matter, and then such a text is left to FTS5."""
    first = memory.add("fixed deploy🤖", JAN_1, text="deploy fix")  # 🤖: "deploy🤖" one word to FTS5
    newer = memory.add("noted", JAN_1 + 1, text="deploy fix")
    third = memory.add("ᏸ deploy", JAN_1 + 2, text="fix", facts=["Ǡ fix"])
    scored = _scored_on_rows(monkeypatch)
    for rows_from in (1, 10**9):
        monkeypatch.setattr(store, "SCORED_ON_ROWS_FROM", rows_from)
        assert memory.search(text="deploy fix") == [third, newer, first]
        assert memory.search(text="deploy🤖 fixed") == [first]
        assert memory.search(text="ᏸ ǡ deploy") == [third]
    assert len(scored) == 3 and None not in scored
    long = memory.add("deploy " * 2000 + "fix", JAN_1 + 3)
    monkeypatch.setattr(store, "SCORED_ON_ROWS_FROM", 1)
    assert memory.search(text="deploy fix") == [long, third, newer, first] and scored[-1] is not None
    cut = memory.add("deploy " + "y" * 40_000, JAN_1 + 4)  # FTS5 keeps its first 32 KiB
    assert memory.search(text="deploy " + "y" * 32_768 + "z") == [cut] and scored[-1] is None


# --- a query longer than FTS5 is asked -----------------------------------------------------

_RUN = "数据库" * 40  # one phrase of 119 bigrams: FTS5 is asked its first ones only
_CHAIN = "-".join(f"w{i % 3}" for i in range(60))  # one phrase of 60 words
_WORDS = " ".join(f"v{i}" for i in range(40))  # 40 phrases: FTS5 is asked the first ones
_PARAGRAPH = (  # punctuation joins it into one phrase, of 109 tokens
    "数据库连接池在高并发时会被耗尽，请求排队等待直到超时。我们把最大连接数从十提高到五十，"
    "并给每个查询加上三秒的超时和一次重试。上线之后错误率从百分之二降到万分之三，平均延迟也下降了一半。"
    "下一步是把慢查询记录到日志里，按周汇总给负责的同事。"
)
_LONG_QUERIES = [_RUN, _CHAIN, _WORDS, f"{_RUN} {_CHAIN}", _PARAGRAPH, "数据库" * 1365]


def _add_long_phrase_notes(memory: Memory) -> dict[str, int]:
    """Notes that hold the phrases of `_LONG_QUERIES` whole, in each column, and notes that
    hold only their first tokens, or a run broken, or that a caller may not see."""
    words = _WORDS.split()
    notes: dict[str, tuple[str, dict[str, Any]]] = {
        "in text": ("note", {"text": f"前 {_RUN} 后, {_CHAIN}; {_WORDS}\n\n{_PARAGRAPH}"}),
        "first tokens": ("note", {"text": f"{_RUN[:60]} {_CHAIN[:100]} {' '.join(words[:35])} {_PARAGRAPH[:60]}"}),
        "in title": (f"笔记{_RUN}", {"text": _CHAIN, "facts": [_WORDS, _PARAGRAPH]}),
        # The chain runs on from one fact into the next, as in the index; a CJK run does not.
        "over two facts": ("note", {"text": "x", "facts": [_RUN[:60], _RUN[60:], _CHAIN[:90], _CHAIN[90:]]}),
        "broken run": ("note", {"text": f"{_RUN[:60]}。{_RUN[60:]}"}),
        "in concepts": ("note", {"text": "x", "concepts": [_RUN, _CHAIN, *words, _PARAGRAPH]}),
        "long text": ("note", {"text": "filler " * 2000 + f"{_RUN} {_CHAIN} {_WORDS} {_PARAGRAPH} " + "数据库" * 2000}),
    }
    hidden = {"visibility": "private", "agent": HIDDEN.agent}
    notes["hidden"] = ("note", {"text": f"{_RUN} {_CHAIN} {_WORDS} {_PARAGRAPH} " + "数据库" * 1400, **hidden})
    return {name: memory.add(title, JAN_1 + len(name), **fields) for name, (title, fields) in notes.items()}


_FTS5_STRING = re.compile(r'"((?:[^"]|"")*)"')


@pytest.mark.parametrize("text", _LONG_QUERIES)
def test_fts5_is_asked_a_bounded_part_of_a_long_query(
    memory: Memory, text: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """FTS5 walks a phrase's entries once per token: a pasted run of "数据库" took seconds
    and held the journal's thread. Whatever a search does with such a query, counting, paging
    by date or by score levels, scoring in the index, finding a timeline's anchor, each FTS5
    query asks for 32 tokens at most (`FTS5_TOKENS`: FTS5 walks as many in a millisecond or two)."""
    _add_long_phrase_notes(memory)
    monkeypatch.setattr(store, "RANK_ALL_UP_TO", 0)  # pages by score levels, if it may
    monkeypatch.setattr(store, "SCORED_ON_ROWS_FROM", 10**9)  # scores in the index, if it may
    statements: list[str] = []
    memory.journal.run_sync(partial(_trace_into, statements))
    for viewer in (ANYONE, HIDDEN):
        _answers(memory, viewer, text)
    asked = [sql for sql in statements if "MATCH" in sql]
    assert asked
    for sql in asked:
        strings = {found.replace('""', '"') for found in _FTS5_STRING.findall(sql)}
        assert sum(len(tokens(string)) for string in strings) <= 32, sql[:300]


def test_a_long_query_finds_ranks_and_counts_what_fts5_asked_whole_would(
    memory: Memory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What FTS5 is not asked is checked on its matches in Python: a note holding only the
    first tokens of a long phrase, or the phrase split over two facts or broken by a stop, is
    no match; each that holds it whole is, in every column, in a text of any length, ranked
    and counted as when FTS5 was asked for the whole query."""
    notes = _add_long_phrase_notes(memory)
    everywhere = ["in text", "in title", "in concepts", "long text"]
    expected = {
        _RUN: everywhere,
        _CHAIN: [*everywhere, "over two facts"],
        _WORDS: everywhere,
        f"{_RUN} {_CHAIN}": everywhere,
        _PARAGRAPH: everywhere,
        "数据库" * 1365: ["long text"],
    }
    for text, names in expected.items():
        assert sorted(memory.search(text=text, limit=100)) == sorted(notes[name] for name in names), text
        assert memory.total(text=text, limit=1, offset=3) == len(names)
        assert memory.total(HIDDEN, text=text, limit=1) == len(names) + 1
    best_first = [notes[name] for name in ("in title", "in concepts", "long text", "in text")]
    assert memory.search(text=_RUN) == best_first
    queries = _LONG_QUERIES[:-1]  # the last one, asked whole, is what took seconds
    answers = [_answers(memory, viewer, text) for viewer in (ANYONE, HIDDEN) for text in queries]
    monkeypatch.setattr(store, "FTS5_TOKENS", 10**9)  # FTS5 asked for every query whole, as before
    assert [_answers(memory, viewer, text) for viewer in (ANYONE, HIDDEN) for text in queries] == answers


def test_an_observation_an_older_toolbus_saved_is_found(memory: Memory) -> None:
    """A toolbus of schema 7 or before, still running on a journal a newer one migrated, writes
    the row and its words and knows nothing of `observation_audience`: a trigger fills it."""
    first = memory.add("apple", JAN_1)

    def save_as_schema_7(conn: sqlite3.Connection) -> None:
        conn.execute("PRAGMA foreign_keys = OFF")  # the row's event is not the point here
        with conn:
            conn.execute(
                "INSERT INTO observations (id, title, text, type, project, memory_session_id, facts, concepts,"
                " agent, department, visibility, created_at_epoch, extra)"
                " VALUES (1000, 'apple', 'apple', 'discovery', 'p', 's', '[]', '[]', 'old', 'd', 'public', ?, '{}')",
                (JAN_1 + 1,),
            )
            conn.execute("INSERT INTO observations_fts (rowid, title, text, tags) VALUES (1000, 'apple', 'apple', '')")
        conn.execute("PRAGMA foreign_keys = ON")

    memory.journal.run_sync(save_as_schema_7)
    assert memory.search(text="apple") == [1000, first]
    assert memory.total(text="apple") == 2


# --- what a search reads ----------------------------------------------------------------------


def _query_plan(sql: str, conn: sqlite3.Connection) -> list[Any]:
    return conn.execute(f"EXPLAIN QUERY PLAN {sql}").fetchall()


@pytest.mark.parametrize(
    "query",
    [
        {"text": "apple"},
        {"text": "apple", "order_by": "date_asc"},
        {"text": "apple pear", "project": "p", "types": ("discovery",), "start_ms": JAN_1, "end_ms": JAN_1 + DAY_MS},
    ],
)
def test_a_search_checks_its_matches_on_the_narrow_table_and_reads_rows_only_to_filter(
    memory: Memory, query: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Common words match thousands of observations: each is checked for visibility on
    `observation_audience`, a page holding a hundred of them, not on its row (a page per
    observation), in relevance or date order. Filters on project or type read the rows."""
    for i in range(30):
        memory.add(f"apple pear {i}", JAN_1 + i, visibility=["public", "private", "department"][i % 3])
    monkeypatch.setattr(store, "RANK_ALL_UP_TO", 0)  # the level-by-level page too
    statements: list[str] = []

    def traced(conn: sqlite3.Connection) -> list[int]:
        conn.set_trace_callback(statements.append)
        try:
            return [row.id for row in search_sync(conn, SearchQuery(limit=5, offset=5, **query), ANYONE).results]
        finally:
            conn.set_trace_callback(None)

    assert len(memory.journal.run_sync(traced)) == 5
    joined = [sql for sql in statements if "MATCH" in sql and "JOIN" in sql]  # the words' matches, checked
    assert joined
    for sql in joined:
        steps = memory.journal.run_sync(partial(_query_plan, sql))
        plan = " | ".join(step[3] for step in steps)
        assert "CROSS JOIN observation_audience o ON" in sql and "SEARCH o USING INTEGER PRIMARY KEY" in plan, plan
        assert ("SEARCH r USING INTEGER PRIMARY KEY" in plan) == ("project" in query), plan
