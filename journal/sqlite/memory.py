"""The memory store: a projection of `ObservationSaved` events, kept in the journal's own file.

It is written only by `apply_observation`, inside the transaction that appends the event,
so the journal and the store never disagree. `toolbus replay memory` rebuilds it from the
events alone: `reset_memory_tables`, then `load_observations` with every `ObservationSaved`,
which leaves the store as `apply_observation` for each of them would.

Search runs on an FTS5 index that keeps no copy of the text (contentless): `observations`
holds the text once, the index only its tokens, in the searchable form and query phrases of
`journal.search_text` (CJK runs as bigrams), which every backend shares.
"""

from __future__ import annotations

import copy
import itertools
import operator
import sqlite3
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

import msgspec

from toolbus.bus import Caller, ObservationSaved
from toolbus.bus.queries import IndexRow, Observations, SearchPage, SearchQuery, TimelinePage, TimelineQuery
from toolbus.journal.decoding import FULL_COLUMNS, INDEX_COLUMNS, NEWEST_FIRST, OLDEST_FIRST, observations_in_order
from toolbus.journal.rows import observation_row
from toolbus.journal.search_text import (
    FTS5_TOKENIZER,
    Phrase,
    PhraseMatcher,
    query_phrases,
    searchable,
    tokens,
)

if TYPE_CHECKING:
    import sqlite_utils

T = TypeVar("T")

# Each also holds the rowid, so (created_at_epoch, id) order needs no sort.
_INDEXES = {
    "observations_by_time": "CREATE INDEX observations_by_time ON observations (created_at_epoch)",
    "observations_by_project": "CREATE INDEX observations_by_project ON observations (project, created_at_epoch)",
}
# Who may see each observation and when it was saved, by id: a search checks each match of its
# words here instead of in the wide row (a page read per match), and reads a row only for a
# visible match when it filters on project or type too. A table keyed by the rowid is quicker
# to probe than the index on (id, ...) it replaced (schema 8): counting the 11k visible matches
# of two common words among 100k observations, 7.5 ms to 6.1 (12 ms on the wide rows). Small
# entries matter at 1M: with project and type in them too, counting is 10 % slower.
_AUDIENCE = """CREATE TABLE observation_audience (
        id INTEGER PRIMARY KEY,  -- observations.id
        visibility TEXT NOT NULL,
        department TEXT NOT NULL,
        agent TEXT NOT NULL,
        created_at_epoch INTEGER NOT NULL
    )"""
_FILL_AUDIENCE = (
    "INSERT INTO observation_audience (id, visibility, department, agent, created_at_epoch)"
    " SELECT id, visibility, department, agent, created_at_epoch FROM observations"
)
# A trigger, not toolbus's code, keeps it in step (schema 9): a toolbus of schema 7 or before
# still running on the file when a newer one migrated it never looks at the schema again, and
# the observations it saves must be found by the newer one's searches all the same.
_AUDIENCE_KEPT = """CREATE TRIGGER observation_audience_kept AFTER INSERT ON observations BEGIN
        INSERT INTO observation_audience (id, visibility, department, agent, created_at_epoch)
        VALUES (new.id, new.visibility, new.department, new.agent, new.created_at_epoch);
    END"""
_TABLES = (
    """CREATE TABLE observations (
        id INTEGER PRIMARY KEY REFERENCES events (position),  -- its ObservationSaved event
        title TEXT NOT NULL,
        text TEXT NOT NULL,
        type TEXT NOT NULL,
        project TEXT NOT NULL,
        memory_session_id TEXT NOT NULL,
        facts TEXT NOT NULL,  -- JSON array of strings
        concepts TEXT NOT NULL,  -- JSON array of strings
        agent TEXT NOT NULL,
        department TEXT NOT NULL,
        visibility TEXT NOT NULL,  -- private | department | project | public
        created_at_epoch INTEGER NOT NULL,  -- milliseconds
        extra TEXT NOT NULL  -- JSON object: the fields the save schema does not name
    )""",
    *_INDEXES.values(),
    _AUDIENCE,
    _AUDIENCE_KEPT,
    # How many observations each audience has, so a search without words counts its total
    # without reading every row.
    """CREATE TABLE observation_tallies (
        project TEXT NOT NULL,
        type TEXT NOT NULL,
        visibility TEXT NOT NULL,
        department TEXT NOT NULL,
        agent TEXT NOT NULL,
        n INTEGER NOT NULL,
        PRIMARY KEY (project, type, visibility, department, agent)
    ) WITHOUT ROWID""",
    # Contentless: rowid = observations.id; the columns hold the searchable form of the title,
    # the text, and the facts and concepts (`tags`); `_RANKED_COLUMNS` weighs them in a ranking.
    f"CREATE VIRTUAL TABLE observations_fts USING fts5( title, text, tags, content='', tokenize='{FTS5_TOKENIZER}')",
)
_DROP = tuple(
    f"DROP TABLE IF EXISTS {table}"
    for table in ("observations_fts", "observation_tallies", "observation_audience", "observations")
)

_json = msgspec.json.Encoder()


def create_memory_tables(db: sqlite_utils.Database) -> None:
    """Called by the journal's migration, inside its transaction."""
    _create(db.conn)


def create_missing_indexes(conn: sqlite3.Connection) -> None:
    """Add the store's indexes a journal made by an older toolbus lacks (a migration step)."""
    existing = {row[0] for row in conn.execute("SELECT name FROM sqlite_master WHERE type = 'index'")}
    for name, statement in _INDEXES.items():
        if name not in existing:
            conn.execute(statement)


def add_audience_table(conn: sqlite3.Connection) -> None:
    """Schema 8: `observation_audience`, filled from the rows, replaces the index
    `observations_visible` of schema 7 (a migration step)."""
    if conn.execute("SELECT 1 FROM sqlite_master WHERE name = 'observation_audience'").fetchone() is None:
        conn.execute(_AUDIENCE)
        conn.execute(_FILL_AUDIENCE)
    conn.execute("DROP INDEX IF EXISTS observations_visible")


def keep_audience_by_trigger(conn: sqlite3.Connection) -> None:
    """Schema 9: the trigger that fills `observation_audience`, and the rows a toolbus of an
    older schema saved since the table was made (a migration step)."""
    if conn.execute("SELECT 1 FROM sqlite_master WHERE name = 'observation_audience_kept'").fetchone() is None:
        conn.execute(_AUDIENCE_KEPT)
    conn.execute(_FILL_AUDIENCE + " WHERE id NOT IN (SELECT id FROM observation_audience)")


def reset_memory_tables(conn: sqlite3.Connection) -> None:
    """Drop and recreate the memory tables, empty, inside the caller's transaction:
    the first step of rebuilding the store from the journal's events."""
    for statement in _DROP:
        conn.execute(statement)
    _create(conn)


def _create(conn: sqlite3.Connection) -> None:
    # One statement at a time: executescript() would commit the caller's transaction.
    for statement in _TABLES:
        conn.execute(statement)


_INSERT_ROW = (
    "INSERT INTO observations (id, title, text, type, project, memory_session_id, facts, concepts,"
    " agent, department, visibility, created_at_epoch, extra) VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?)"
)
_INSERT_INDEXED = "INSERT INTO observations_fts (rowid, title, text, tags) VALUES (?, ?, ?, ?)"
_ADD_TO_TALLY = (
    "INSERT INTO observation_tallies (project, type, visibility, department, agent, n)"
    " VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT (project, type, visibility, department, agent)"
    " DO UPDATE SET n = n + excluded.n"
)
_BATCH = 1000  # observations per executemany in a rebuild
# FTS5 buffers new index entries in memory and writes them out as a segment each time the
# buffer passes `hashsize`, merging segments as they pile up. Loading every observation at
# once with a 64 MiB buffer instead of the default 1 MiB writes and merges far fewer segments:
# the index builds in about half the time. The option lives in the index's config table.
_LOAD_HASHSIZE = 64 * 2**20
_DEFAULT_HASHSIZE = 2**20  # SQLite's FTS5_DEFAULT_HASHSIZE

Audience = tuple[str, str, str, str, str]  # a tally's key: project, type, visibility, department, agent


def apply_observation(conn: sqlite3.Connection, position: int, event: ObservationSaved) -> None:
    """Project one saved observation (id = its event's journal position) into the store."""
    conn.execute(_INSERT_ROW, observation_row(position, event))  # and its audience, by trigger
    conn.execute(_INSERT_INDEXED, _indexed(position, event))
    conn.execute(_ADD_TO_TALLY, (*_audience(event), 1))


def load_observations(conn: sqlite3.Connection, observations: Iterable[tuple[int, ObservationSaved]]) -> int:
    """Project many saved observations into a store just emptied by `reset_memory_tables`,
    leaving it as `apply_observation` one by one would: rows and index entries go in a batch at
    a time, the time indexes and the audience table are built once at the end (a sort, not 3
    inserts per row), and each tally is added to once. Returns how many observations there were."""
    for name in _INDEXES:
        conn.execute(f"DROP INDEX {name}")
    conn.execute("DROP TRIGGER observation_audience_kept")
    _set_index_option(conn, "hashsize", _LOAD_HASHSIZE)
    count, tallies = _load_batches(conn, iter(observations))
    for statement in _INDEXES.values():
        conn.execute(statement)
    conn.execute(_FILL_AUDIENCE)
    conn.execute(_AUDIENCE_KEPT)
    conn.executemany(_ADD_TO_TALLY, [(*audience, n) for audience, n in sorted(tallies.items())])
    # Put the default back, and drop the row that records it: configured as a new index is.
    _set_index_option(conn, "hashsize", _DEFAULT_HASHSIZE)
    conn.execute("DELETE FROM observations_fts_config WHERE k = 'hashsize'")
    return count


def _load_batches(
    conn: sqlite3.Connection, source: Iterator[tuple[int, ObservationSaved]]
) -> tuple[int, Counter[Audience]]:
    tallies: Counter[Audience] = Counter()
    count = 0
    while batch := list(itertools.islice(source, _BATCH)):
        conn.executemany(_INSERT_ROW, [observation_row(position, event) for position, event in batch])
        conn.executemany(_INSERT_INDEXED, [_indexed(position, event) for position, event in batch])
        tallies.update(map(_audience, [event for _, event in batch]))
        count += len(batch)
    return count, tallies


def _set_index_option(conn: sqlite3.Connection, name: str, value: int) -> None:
    conn.execute("INSERT INTO observations_fts (observations_fts, rank) VALUES (?, ?)", (name, value))


def _indexed(position: int, event: ObservationSaved) -> tuple[int, str, str, str]:
    tags = _tags(event.facts, event.concepts)
    return position, searchable(event.title), searchable(event.text), searchable(tags)


def _tags(facts: list[str], concepts: list[str]) -> str:
    """The `tags` column's text: a phrase may run from one fact into the next, as in the index."""
    return "\n".join([*facts, *concepts])


# A tally's key, read in C: a Counter fed through map() counts without a Python call per row.
_audience: Callable[[ObservationSaved], Audience] = operator.attrgetter(
    "project", "type", "visibility", "department", "agent"
)


# --- queries as FTS5 expressions ---------------------------------------------------------


def match_expression(query: str) -> str | None:
    """The FTS5 MATCH expression a search for `query` asks: it requires every word and
    "quoted phrase" of `query`, as far as `FTS5_TOKENS` allows (see `_asked`), or None when
    the query holds no word at all.

    User text never reaches FTS5's query syntax: each phrase becomes an FTS5 string
    (operators, column names, `*`, `:` and punctuation inside it are plain text, which the
    tokenizer splits as it split the indexed text), joined with AND.
    """
    return " AND ".join(_asked(query_phrases(query))[0]) or None


# FTS5 walks a phrase's entries once for each of its tokens, however often a token repeats: a
# pasted run of one CJK word ("数据库" * 1365, one phrase of 4,094 bigrams) took 8 s at 3,000
# observations and 20 s at 10,000, and the journal's one thread waited on it; many phrases
# cost as many tokens do. So FTS5 is asked for this many of a query's tokens at most, the
# first ones of each phrase, which narrows the matches to a few when a query is that long;
# the phrases it was not asked whole are checked on those few in Python (`_holding`).
FTS5_TOKENS = 32


def _asked(phrases: list[Phrase]) -> tuple[list[str], list[Phrase]]:
    """What FTS5 is asked for `phrases`: FTS5 strings of `FTS5_TOKENS` tokens at most in all,
    each phrase whole or its first tokens (none once they are spent), and the phrases it is
    not asked whole."""
    asked: list[str] = []
    unasked: list[Phrase] = []
    room = FTS5_TOKENS
    for phrase in phrases:
        words = tokens(phrase.text)
        if len(words) <= room:
            asked.append(_fts_string(phrase))
        else:
            unasked.append(phrase)
            if room:  # tokens joined by blanks are split into themselves again
                asked.append(_fts_string(Phrase(" ".join(words[:room]))))
        room -= min(room, len(words))
    return asked, unasked


def _asked_whole(phrases: list[Phrase]) -> bool:
    """Whether FTS5 is asked for every phrase whole (then it may be asked anything of them)."""
    return not _asked(phrases)[1]


def _fts_string(phrase: Phrase) -> str:
    return '"' + phrase.text.replace('"', '""') + '"' + ("*" if phrase.prefix else "")


# --- the query side ----------------------------------------------------------------------

# Who sees what; anything else (an unknown visibility) is seen by nobody.
_VISIBLE = (
    "(o.visibility IN ('public', 'project')"
    " OR (o.visibility = 'department' AND o.department = :viewer_department)"
    " OR (o.visibility = 'private' AND o.agent = :viewer_agent))"
)
_ROWS = "observations o"  # what a query reads when it has no words
# The matches of a search's words, checked against `observation_audience` (alias `o`). CROSS
# JOIN keeps the word index in the outer loop: a filter's index (project, time) would otherwise
# tempt the planner into probing the word index once per row of the filter.
_MATCHES = "observations_fts CROSS JOIN observation_audience o ON o.id = observations_fts.rowid"
# With a filter on project or type, the wide row (alias `r`) too, read only for visible matches.
_MATCHES_AND_ROWS = f"{_MATCHES} CROSS JOIN observations r ON r.id = o.id"


# The matches of a search's words only, checked against the viewer's `AudienceMarks`.
_MARKED_MATCHES = "observations_fts"
_MARKED = "substr(:marks, observations_fts.rowid + 1, 1) = x'01'"


class _Where:
    """SQL conditions and their parameters, always starting with what the viewer may see, and
    the rows they are conditions on (`source`, alias `o`; `_MARKED_MATCHES` has none)."""

    def __init__(self, viewer: Caller, source: str = _ROWS, marks: bytearray | None = None) -> None:
        self.source = source
        self.conditions = [_VISIBLE]
        self.params: dict[str, Any] = {"viewer_agent": viewer.agent, "viewer_department": viewer.department}
        if marks is not None:
            self.conditions, self.params = [_MARKED], {"marks": marks}

    def add(self, condition: str, **params: Any) -> None:
        self.conditions.append(condition)
        self.params.update(params)

    def sql(self) -> str:
        return " AND ".join(self.conditions)

    def matching(self, expression: str) -> _Where:
        """The same conditions with another FTS5 expression for `_matching`'s MATCH."""
        other = copy.copy(self)
        other.params = self.params | {"match": expression}
        return other

    def newer_than(self, id_: int) -> _Where:
        """The same conditions on the matches after `id_`, where FTS5 starts its walk."""
        other = copy.copy(self)
        other.conditions = [*self.conditions, "observations_fts.rowid > :newer_than"]
        other.params = self.params | {"newer_than": id_}
        return other


def _search_where(query: SearchQuery, viewer: Caller, *, dates: bool = True, source: str = _ROWS) -> _Where:
    """`query`'s filters on `source`, whose alias `r` holds project and type when it has one."""
    where = _Where(viewer, source)
    row = "r" if source == _MATCHES_AND_ROWS else "o"
    if query.project is not None:
        where.add(f"{row}.project = :project", project=query.project)
    if query.types:
        names = {f"type{i}": name for i, name in enumerate(query.types)}
        where.add(f"{row}.type IN ({', '.join(':' + key for key in names)})", **names)
    if dates and query.start_ms is not None:
        where.add("o.created_at_epoch >= :start_ms", start_ms=query.start_ms)
    if dates and query.end_ms is not None:
        where.add("o.created_at_epoch <= :end_ms", end_ms=query.end_ms)
    return where


def _matching(
    conn: sqlite3.Connection, query: SearchQuery, viewer: Caller, marks: AudienceMarks | None
) -> tuple[_Where, list[Phrase]] | None:
    """The conditions of a search with words and its phrases, or None when its words can
    match nothing."""
    phrases = query_phrases(query.text or "")
    if not phrases:
        return None
    marked = marks.of(conn, viewer) if marks is not None and _by_words_alone(query) else None
    if marked is not None:
        where = _Where(viewer, _MARKED_MATCHES, marked)
    else:
        source = _MATCHES_AND_ROWS if query.project is not None or query.types else _MATCHES
        where = _search_where(query, viewer, source=source)
    asked, unasked = _asked(phrases)
    where.add("observations_fts MATCH :match", match=" AND ".join(asked))
    if unasked:
        held = _json.encode(_holding(conn, where, unasked)).decode()
        where.add("observations_fts.rowid IN (SELECT value FROM json_each(:held))", held=held)
    return where, phrases


_SEARCHED = "SELECT id, title, text, facts, concepts FROM observations WHERE id IN (SELECT value FROM json_each(?))"
_IN_ROW = "SELECT 1 FROM observations_fts WHERE observations_fts MATCH ? AND rowid = ?"


def _holding(conn: sqlite3.Connection, where: _Where, phrases: list[Phrase]) -> list[int]:
    """The matches of `where` with each of `phrases` in one of their columns, as the index
    would find them: by the tokenizer's rules in Python (`PhraseMatcher`), or by FTS5 for the
    one row whose text those cannot be sure of."""
    candidates = _ids(conn, where, "observations_fts.rowid", -1, 0)
    matcher = PhraseMatcher(phrases)
    every = set(range(len(phrases)))
    held: list[int] = []
    for id_, title, text, facts, concepts in conn.execute(_SEARCHED, (_json.encode(candidates).decode(),)):
        columns = (title, text, _tags(_strings.decode(facts), _strings.decode(concepts)))
        if all(map(matcher.exact_for, columns)):
            found = set(itertools.chain.from_iterable(map(matcher.held_in, columns)))
        else:  # a query token FTS5 cuts (32 KiB), in a text long enough to hold one: rare
            whole = " AND ".join(map(_fts_string, phrases))
            found = every if conn.execute(_IN_ROW, (whole, id_)).fetchone() else set()
        if found == every:
            held.append(id_)
    return held


def _by_words_alone(query: SearchQuery) -> bool:
    """By relevance, with no filter: its matches need nothing but the word index (and marks)."""
    unfiltered = query.project is None and not query.types and query.start_ms is None and query.end_ms is None
    return unfiltered and query.order_by == "relevance"


_VISIBLE_SINCE = f"SELECT o.id FROM observation_audience o WHERE o.id > :seen AND o.id <= :highest AND {_VISIBLE}"


class AudienceMarks:
    """Which observations each viewer may see, a byte per id (1: may see it), in memory. A
    search checks each match of its words here (`_MARKED`), not in `observation_audience`,
    whose b-tree outgrows the CPU's caches: at 1M observations counting a phrase's 3k visible
    matches took 6-8 ms there, 1-2 ms here. Observations are only added, each with an id above
    every one before it (its event's position), so the marks are kept in step by reading the
    ids above the highest seen, in the search's own snapshot; a rebuild of the tables
    (`toolbus replay memory`, which changes the schema's version) has them marked anew."""

    # Marks are bound to each statement, a copy each time: past this many journal positions
    # (0.2 ms a copy) a search checks on the table.
    UP_TO = 4 * 2**20

    def __init__(self, viewers: int = 4) -> None:
        self._viewers = viewers  # the most kept; a server has one or two
        self._marks: dict[tuple[str, str], tuple[bytearray, int, int]] = {}

    def of(self, conn: sqlite3.Connection, viewer: Caller) -> bytearray | None:
        """The viewer's marks, brought up to date; None past `UP_TO`."""
        key = (viewer.agent, viewer.department)
        schema = conn.execute("PRAGMA schema_version").fetchone()[0]
        marks, seen, marked_in = self._marks.pop(key, None) or (bytearray(), 0, schema)
        if marked_in != schema:
            marks, seen = bytearray(), 0
        params = {"seen": seen, "viewer_agent": viewer.agent, "viewer_department": viewer.department}
        highest = conn.execute("SELECT max(id) FROM observation_audience WHERE id > :seen", params).fetchone()[0]
        if max(seen, highest or 0) >= self.UP_TO:
            return None
        if highest is not None:
            marks.extend(bytes(highest + 1 - len(marks)))
            for (id_,) in conn.execute(_VISIBLE_SINCE, params | {"highest": highest}):
                marks[id_] = 1
            seen = highest
        self._marks[key] = (marks, seen, schema)  # the most recent last
        if len(self._marks) > self._viewers:
            del self._marks[next(iter(self._marks))]
        return marks


def search_sync(
    conn: sqlite3.Connection, query: SearchQuery, viewer: Caller, marks: AudienceMarks | None = None
) -> SearchPage:
    """One page of the observations `viewer` may see that match `query`, and their total."""
    if query.text is None:
        results, total = _list(conn, query, viewer)
    elif (matching := _matching(conn, query, viewer, marks)) is None:
        results, total = [], 0
    else:
        ids, total = _match_page(conn, query, *matching)
        results = _index_rows(conn, ids, viewer)
    return SearchPage(results=results, total=total, limit=query.limit, offset=query.offset)


# Up to this many visible matches, ranking them all in Python is as quick as reading a page
# score level by score level, which pays for a query per level; `_levelled_page` beyond.
RANK_ALL_UP_TO = 1000
# Levels grow as 3 ** phrases; a query of more phrases matches few observations anyway.
_LEVELLED_PHRASES = 3


def _match_page(
    conn: sqlite3.Connection, query: SearchQuery, where: _Where, phrases: list[Phrase]
) -> tuple[list[int], int]:
    """The ids of one page of the visible matches, in the order asked, and their total. SQL
    pages by date, and by relevance when there are many matches: only the page's ids are read,
    never all of them. A walk over the matches is never made twice."""
    if query.order_by != "relevance":
        total = _count(conn, where)
        return (_ids(conn, where, _date_order(query), query.limit, query.offset) if query.offset < total else []), total
    # Up to one more than are ranked whole, oldest first (FTS5 walks backwards 20-40 % slower):
    # when fewer come, they are all, and counted.
    matches = _ids(conn, where, "observations_fts.rowid", RANK_ALL_UP_TO + 1, 0)
    if len(matches) > RANK_ALL_UP_TO:
        newer = where.newer_than(matches[-1])
        if len(phrases) <= _LEVELLED_PHRASES and _asked_whole(phrases):
            total = len(matches) + _count(conn, newer)
            return (_levelled_page(conn, query, where, phrases) if query.offset < total else []), total
        matches += _ids(conn, newer, "observations_fts.rowid", -1, 0)
    page = _best_first(conn, matches[::-1], phrases)[query.offset : query.offset + query.limit]
    return page, len(matches)


# The index's own order (no sort), newest first: the order among equal scores.
_INDEX_ORDER = "observations_fts.rowid DESC"


def _ids(conn: sqlite3.Connection, where: _Where, order: str, limit: int, offset: int) -> list[int]:
    """The ids of matches (any source with words) in `order`."""
    sql = (
        f"SELECT observations_fts.rowid FROM {where.source} WHERE {where.sql()}"
        f" ORDER BY {order} LIMIT :limit OFFSET :offset"
    )
    return [row[0] for row in conn.execute(sql, where.params | {"limit": limit, "offset": offset})]


# Relevance is a score of each observation on its own: every word or phrase of the query adds
# the weight of the most important column it occurs in (title 5, facts and concepts 2, text 1),
# ties newest first. FTS5's bm25 was dropped because its statistics (how many rows, their
# average length, how many rows hold a word) count every observation, those the caller may not
# see too: another agent's private notes changed the order of the caller's results and the
# timeline's anchor. bm25 over the caller's visible rows alone would need per-row term
# frequencies that only an FTS5 auxiliary function can read (Python's sqlite3 cannot register
# one), or an index per visibility group, whose number grows with departments and agents. This
# score needs no statistics, and PostgreSQL computes it the same way (a tsquery per column).
_RANKED_COLUMNS = (("title", 5), ("tags", 2))
_TEXT_WEIGHT = 1  # every phrase of a match occurs in some column: if in neither above, the text


def _best_first(conn: sqlite3.Connection, newest_first: list[int], phrases: list[Phrase]) -> list[int]:
    """`newest_first` (the visible matches) ranked by score. Only matches with a phrase in a
    title or tags score above the least, and they are few; the rest keep their order. A query
    FTS5 is not asked whole (`FTS5_TOKENS`) is scored from the rows, however many match."""
    bonus = None
    if not _asked_whole(phrases) or (
        len(phrases) >= SCORED_ON_ROWS_FROM
        and (len(newest_first) <= RANK_ALL_UP_TO or len(phrases) >= ROWS_FOR_ANY_COUNT_FROM)
    ):
        bonus = _bonus_on_rows(conn, newest_first, phrases)
    if bonus is None:
        bonus = _bonus_in_index(conn, list(map(_fts_string, phrases)))
    visible = set(newest_first)
    best = sorted((i for i in bonus if i in visible), key=lambda i: (-bonus[i], -i))
    return best + [i for i in newest_first if i not in bonus]


# From this many phrases, a match's score comes from its row's title and tags (2-4 µs a row),
# for as many matches as are ranked whole: each of FTS5's column queries walks every phrase's
# entries, 2 ms at 1M observations for three middling words, and a query asks two per phrase.
# One phrase's walks are cheap.
SCORED_ON_ROWS_FROM = 2
# FTS5's column queries grow as the square of the phrases (each query walks them all), the rows'
# scores only as the phrases: from this many, the rows win at any count of matches (a pasted
# sentence of 50 words over 1,100 matches: 270 ms from the index, 300 words 13 s).
ROWS_FOR_ANY_COUNT_FROM = 6
_TITLE_AND_TAGS = "SELECT id, title, facts, concepts FROM observations WHERE id IN (SELECT value FROM json_each(?))"
_strings = msgspec.json.Decoder(list[str])


def _bonus_on_rows(conn: sqlite3.Connection, ids: list[int], phrases: list[Phrase]) -> Counter[int] | None:
    """What `ids` score above the least, from their rows: each phrase, in the best column
    that holds it (the tokenizer's rules, `search_text.PhraseMatcher`). None when they cannot be
    sure of a text (`PhraseMatcher.exact_for`): FTS5 alone can tell."""
    bonus: Counter[int] = Counter()
    matcher = PhraseMatcher(phrases)
    for id_, title, facts, concepts in conn.execute(_TITLE_AND_TAGS, (_json.encode(ids).decode(),)):
        texts = {"title": title, "tags": _tags(_strings.decode(facts), _strings.decode(concepts))}
        if not all(map(matcher.exact_for, texts.values())):
            return None
        best: dict[int, int] = {}  # phrase -> the weight of its best column (the first)
        for column, weight in _RANKED_COLUMNS:
            for phrase in matcher.held_in(texts[column]):
                best.setdefault(phrase, weight)
        if best:
            bonus[id_] += sum(best.values()) - _TEXT_WEIGHT * len(best)
    return bonus


# The matches holding one phrase in one column: the index alone answers, no row is read.
_IN_COLUMN = "SELECT rowid FROM observations_fts WHERE observations_fts MATCH ?"


def _bonus_in_index(conn: sqlite3.Connection, phrases: list[str]) -> Counter[int]:
    """What the matches of `phrases` (FTS5 strings) score above the least, from the index: its
    sets hold hidden rows too, but are only looked up, never counted or shown."""
    bonus: Counter[int] = Counter()
    for phrase in phrases:
        # The phrase in the column, the others anywhere: the matches, without FTS5 walking the
        # phrase's own entries twice (a quarter of each query's time at 1M observations).
        others = "".join(f" AND {other}" for other in phrases if other != phrase)
        found: set[int] = set()  # a phrase scores its best column only
        for column, weight in _RANKED_COLUMNS:
            rows = conn.execute(_IN_COLUMN, (f"{{{column}}} : {phrase}{others}",))
            in_column = {row[0] for row in rows} - found
            bonus.update(dict.fromkeys(in_column, weight - _TEXT_WEIGHT))
            found |= in_column
    return bonus


def _levelled_page(conn: sqlite3.Connection, query: SearchQuery, where: _Where, phrases: list[Phrase]) -> list[int]:
    """A page of `_best_first`'s order read level by level, best first: each level is one
    FTS5 expression, and FTS5 yields its rows newest first lazily, so a level that fills the
    rest of the page stops after it; only a level wholly before the page is counted."""
    fts_phrases = list(map(_fts_string, phrases))
    if not _ids(conn, where.matching(_in_ranked_columns(fts_phrases)), "observations_fts.rowid", 1, 0):
        # Often so for phrases: every match scores the least, and the page is the newest. One
        # walk of the words instead of one per level (two for a level excluding those above).
        return _ids(conn, where, _INDEX_ORDER, query.limit, query.offset)
    page: list[int] = []
    skip = query.offset
    for level in _score_levels(fts_phrases):
        at_level = where.matching(level)
        ids = _ids(conn, at_level, _INDEX_ORDER, query.limit - len(page), skip)
        if ids:
            skip = 0
        elif skip:
            skip -= _count(conn, at_level)
        page += ids
        if len(page) == query.limit:
            break
    return page


def _in_ranked_columns(phrases: list[str]) -> str:
    """An FTS5 expression of the matches of `phrases` with any of them in a ranked column."""
    columns = " ".join(column for column, _ in _RANKED_COLUMNS)
    every = "".join(f" AND {phrase}" for phrase in phrases) if len(phrases) > 1 else ""
    return f"{{{columns}}} : ({' OR '.join(phrases)}){every}"


def _score_levels(phrases: list[str]) -> list[str]:
    """FTS5 expressions of the matches with each score, highest first: every phrase in the best
    column it occurs in, each way of placing them summed to its score."""
    by_score: dict[int, list[str]] = {}
    for placing in itertools.product(*map(_best_columns, phrases)):
        score = sum(weight for weight, _ in placing)
        by_score.setdefault(score, []).append(" AND ".join(f"({condition})" for _, condition in placing))
    return [" OR ".join(f"({each})" for each in by_score[score]) for score in sorted(by_score, reverse=True)]


def _best_columns(phrase: str) -> list[tuple[int, str]]:
    """For each weight `phrase` can score, the FTS5 condition that it scores exactly that."""
    placed: list[tuple[int, str]] = []
    above: list[str] = []  # the columns that weigh more
    for column, weight in (*_RANKED_COLUMNS, (None, _TEXT_WEIGHT)):
        found = f"{{{column}}} : {phrase}" if column else phrase
        placed.append((weight, f"({found}) NOT ({{{' '.join(above)}}} : {phrase})" if above else found))
        if column:
            above.append(column)
    return placed


def _index_rows(conn: sqlite3.Connection, ids: list[int], viewer: Caller) -> list[IndexRow]:
    """The index rows of `ids`, in that order (visibility applied again: every read says it)."""
    if not ids:
        return []
    where = _Where(viewer)
    where.add("o.id IN (SELECT value FROM json_each(:ids))", ids=_json.encode(ids).decode())
    rows = conn.execute(f"SELECT {INDEX_COLUMNS} FROM observations o WHERE {where.sql()}", where.params)
    found = {row[0]: IndexRow(*row) for row in rows}
    return [found[i] for i in ids if i in found]


def _list(conn: sqlite3.Connection, query: SearchQuery, viewer: Caller) -> tuple[list[IndexRow], int]:
    """Filters only, by date: walks a time index, so it stops as soon as the page is full."""
    results = _page(conn, _search_where(query, viewer), _date_order(query), query)
    if _whole(results, query):
        return results, len(results)
    if query.start_ms is None and query.end_ms is None:
        tallies = _search_where(query, viewer, dates=False, source="observation_tallies o")
        sql = f"SELECT coalesce(sum(o.n), 0) FROM {tallies.source} WHERE {tallies.sql()}"
        return results, int(conn.execute(sql, tallies.params).fetchone()[0])
    return results, _count(conn, _search_where(query, viewer))


def _count(conn: sqlite3.Connection, where: _Where) -> int:
    return int(conn.execute(f"SELECT count(*) FROM {where.source} WHERE {where.sql()}", where.params).fetchone()[0])


def _date_order(query: SearchQuery) -> str:
    return OLDEST_FIRST if query.order_by == "date_asc" else NEWEST_FIRST


def _page(conn: sqlite3.Connection, where: _Where, order: str, query: SearchQuery) -> list[IndexRow]:
    rows = conn.execute(
        f"SELECT {INDEX_COLUMNS} FROM {where.source} WHERE {where.sql()} ORDER BY {order} LIMIT :limit OFFSET :offset",
        where.params | {"limit": query.limit, "offset": query.offset},
    )
    return [IndexRow(*row) for row in rows]


def _whole(results: list[IndexRow], query: SearchQuery) -> bool:
    """The first page, not full: it holds every match, so there is nothing left to count."""
    return query.offset == 0 and len(results) < query.limit


def timeline_sync(
    conn: sqlite3.Connection, query: TimelineQuery, viewer: Caller, marks: AudienceMarks | None = None
) -> TimelinePage:
    """The anchor and up to `depth_before`/`depth_after` observations around it, in time order."""
    anchor = _anchor(conn, query, viewer, marks)
    if anchor is None:
        wanted = f"observation {query.anchor}" if query.anchor is not None else f"match for {query.text!r}"
        return TimelinePage(anchor=None, results=[], message=f"No {wanted} found")
    where = _Where(viewer)
    if query.project is not None:
        where.add("o.project = :project", project=query.project)
    where.params |= {"at": anchor.created_at_epoch, "id": anchor.id}
    before = conn.execute(
        f"SELECT {INDEX_COLUMNS} FROM observations o WHERE {where.sql()}"
        f" AND (o.created_at_epoch, o.id) < (:at, :id) ORDER BY {NEWEST_FIRST} LIMIT :n",
        where.params | {"n": query.depth_before},
    ).fetchall()
    after = conn.execute(
        f"SELECT {INDEX_COLUMNS} FROM observations o WHERE {where.sql()}"
        f" AND (o.created_at_epoch, o.id) > (:at, :id) ORDER BY {OLDEST_FIRST} LIMIT :n",
        where.params | {"n": query.depth_after},
    ).fetchall()
    rows = [*(IndexRow(*row) for row in reversed(before)), anchor, *(IndexRow(*row) for row in after)]
    return TimelinePage(anchor=anchor.id, results=rows)


def _anchor(
    conn: sqlite3.Connection, query: TimelineQuery, viewer: Caller, marks: AudienceMarks | None
) -> IndexRow | None:
    if query.anchor is not None:
        where = _Where(viewer)
        where.add("o.id = :anchor", anchor=query.anchor)
        row = conn.execute(f"SELECT {INDEX_COLUMNS} FROM observations o WHERE {where.sql()}", where.params)
        found = row.fetchone()
        return IndexRow(*found) if found else None
    best = SearchQuery(text=query.text, limit=1, project=query.project)
    if (matching := _matching(conn, best, viewer, marks)) is None:
        return None
    found = _index_rows(conn, _match_page(conn, best, *matching)[0], viewer)
    return found[0] if found else None


def get_observations_sync(conn: sqlite3.Connection, ids: list[int], viewer: Caller) -> Observations:
    """Full records of `ids` the viewer may see, in the order asked; the rest as missing."""
    wanted = list(dict.fromkeys(ids))
    where = _Where(viewer)
    where.add("o.id IN (SELECT value FROM json_each(:ids))", ids=_json.encode(wanted).decode())
    rows = conn.execute(f"SELECT {FULL_COLUMNS} FROM observations o WHERE {where.sql()}", where.params)
    return observations_in_order(wanted, rows)


# Searches read observation rows and index pages scattered over the file. Mapped, SQLite
# reads them in place instead of copying each one into its page cache through a system call,
# which cuts about 40 % off a search with hundreds of matches. Mapped pages the searches touch
# count in the process's RSS (shared, reclaimable file pages): this bounds them.
_MMAP_BYTES = 256 * 2**20


def _read(work: Callable[[sqlite3.Connection], T]) -> Callable[[sqlite3.Connection], T]:
    """`work` inside one read transaction, so a page and its total see the same snapshot."""

    def run(conn: sqlite3.Connection) -> T:
        conn.execute("BEGIN")
        try:
            return work(conn)
        finally:
            if conn.in_transaction:
                conn.execute("ROLLBACK")

    return run


class _Runner(Protocol):
    """The journal's connection, lent on its own thread (`SqliteJournal.run`)."""

    async def run(self, work: Callable[[sqlite3.Connection], T]) -> T: ...


class SqliteMemoryStore:
    """The memory store the handlers ask (`handlers.ports.MemoryStore`): the observation
    tables, queried off the event loop."""

    def __init__(self, journal: _Runner) -> None:
        self._journal = journal
        self._mapped = False
        self._marks = AudienceMarks()

    async def search(self, query: SearchQuery, viewer: Caller) -> SearchPage:
        return await self._run(lambda conn: search_sync(conn, query, viewer, self._marks))

    async def timeline(self, query: TimelineQuery, viewer: Caller) -> TimelinePage:
        return await self._run(lambda conn: timeline_sync(conn, query, viewer, self._marks))

    async def get_observations(self, ids: list[int], viewer: Caller) -> Observations:
        return await self._run(lambda conn: get_observations_sync(conn, ids, viewer))

    async def _run(self, work: Callable[[sqlite3.Connection], T]) -> T:
        read = _read(work)

        def run(conn: sqlite3.Connection) -> T:
            if not self._mapped:  # the journal's connection, set up on the first query
                conn.execute(f"PRAGMA mmap_size = {_MMAP_BYTES}")
                self._mapped = True
            return read(conn)

        return await self._journal.run(run)
