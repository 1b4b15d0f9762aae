"""The memory store on PostgreSQL: a projection of `ObservationSaved` events, written in the
transaction that appends the event, searched through a GIN index over a weighted tsvector.

The tsvector and the tsqueries are built here, never by PostgreSQL's text parser (whose words
depend on the locale and differ from SQLite's): the tokens are those of `journal.search_text`,
so both backends find the same observations for the same query. Relevance is the SQLite
store's: each phrase scores the best column it occurs in (title 5, facts and concepts 2, text
1), summed, ties newest first; it reads nothing but the observation itself, so observations
the caller may not see never change the order.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from typing import Any, NamedTuple, Protocol, TypeVar

import psycopg
from psycopg.pq import TransactionStatus

from toolbus.bus import Caller, ObservationSaved
from toolbus.bus.queries import IndexRow, Observations, SearchPage, SearchQuery, TimelinePage, TimelineQuery
from toolbus.journal.decoding import FULL_COLUMNS, INDEX_COLUMNS, NEWEST_FIRST, OLDEST_FIRST, observations_in_order
from toolbus.journal.rows import observation_row, storable_row, without_nul
from toolbus.journal.search_text import Phrase, query_phrases, searchable, tokens

T = TypeVar("T")


# Created by `journal.postgres.schema`, in the `toolbus` schema (connections set search_path).
MEMORY_TABLES: tuple[str, ...] = (
    """CREATE TABLE IF NOT EXISTS observations (
        id bigint PRIMARY KEY REFERENCES events (position),  -- its ObservationSaved event
        title text NOT NULL,
        text text NOT NULL,
        type text NOT NULL,
        project text NOT NULL,
        memory_session_id text NOT NULL,
        facts text NOT NULL,  -- JSON array of strings
        concepts text NOT NULL,  -- JSON array of strings
        agent text NOT NULL,
        department text NOT NULL,
        visibility text NOT NULL,  -- private | department | project | public
        created_at_epoch bigint NOT NULL,  -- milliseconds
        extra text NOT NULL,  -- JSON object: the fields the save schema does not name
        document tsvector NOT NULL  -- title weight A, facts and concepts B, text D
    )""",
    "CREATE INDEX IF NOT EXISTS observations_document ON observations USING gin (document)",
    "CREATE INDEX IF NOT EXISTS observations_by_time ON observations (created_at_epoch, id)",
    "CREATE INDEX IF NOT EXISTS observations_by_project ON observations (project, created_at_epoch, id)",
)

INSERT_OBSERVATION = (
    "INSERT INTO observations (id, title, text, type, project, memory_session_id, facts, concepts,"
    " agent, department, visibility, created_at_epoch, extra, document)"
    " VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s::tsvector)"
)


def observation_params(position: int, event: ObservationSaved) -> tuple[object, ...]:
    """The parameters of `INSERT_OBSERVATION` for one saved observation (id = its event's
    journal position)."""
    tags = "\n".join([*event.facts, *event.concepts])  # one column, as in the SQLite index
    return storable_row(
        (
            *observation_row(position, event),
            document((event.title, "A"), (tags, "B"), (event.text, "D")),
        )
    )


# --- the document: a tsvector literal ----------------------------------------------------

# PostgreSQL's bounds: a longer lexeme is an error, a later position is read as the last one,
# and a lexeme keeps its first 256 positions.
_MAX_LEXEME_BYTES = 2046
_LAST_POSITION = 16383
_MAX_POSITIONS = 256
# Lexemes and positions of a tsvector must stay under 1 MiB; what does not fit is left out,
# the latest words first, so a huge text saves and is still found by its first words.
_DOCUMENT_BYTES = 1_000_000
_LEXEME_OVERHEAD = 3  # its alignment byte and its count of positions
_POSITION_BYTES = 2


def document(*columns: tuple[str, str]) -> str:
    """A tsvector literal of (text, weight) columns, in that order: the tokens of each column's
    searchable form at their positions. A gap between columns keeps phrases inside one."""
    found: dict[str, list[str]] = {}
    room = _DOCUMENT_BYTES
    position = 0
    for text, weight in columns:
        label = "" if weight == "D" else weight  # D is a position's default weight
        for token in tokens(searchable(text)):
            position += 1
            at = f"{min(position, _LAST_POSITION)}{label}"
            lexeme = _lexeme(token)
            if (positions := found.get(lexeme)) is None:
                cost = len(lexeme.encode()) + _LEXEME_OVERHEAD + _POSITION_BYTES
                if cost <= room:
                    found[lexeme] = [at]
                    room -= cost
            elif len(positions) < _MAX_POSITIONS and room >= _POSITION_BYTES and position <= _LAST_POSITION:
                positions.append(at)
                room -= _POSITION_BYTES
        position += 1
    return " ".join(f"{_quoted(lexeme)}:{','.join(positions)}" for lexeme, positions in found.items())


def _lexeme(token: str) -> str:
    """`token` cut to the longest lexeme PostgreSQL takes (queries cut theirs the same way)."""
    if len(token) * 4 <= _MAX_LEXEME_BYTES:
        return token
    return token.encode()[:_MAX_LEXEME_BYTES].decode(errors="ignore")


def _quoted(lexeme: str) -> str:
    return "'" + lexeme.replace("\\", "\\\\").replace("'", "''") + "'"


# --- queries: tsquery literals -----------------------------------------------------------


class _Words(NamedTuple):
    """A query phrase as lexemes in order, the last one a prefix when `prefix`."""

    lexemes: tuple[str, ...]
    prefix: bool

    def tsquery(self, weights: str = "") -> str:
        """The phrase as a tsquery, matching only positions of these weights (any when empty)."""
        *first, last = [_quoted(lexeme) for lexeme in self.lexemes]
        label = ":" + weights if weights else ""
        last += ":*" + weights if self.prefix else label
        return " <-> ".join([*(word + label for word in first), last])

    @staticmethod
    def of(phrase: Phrase) -> _Words | None:
        lexemes = tuple(map(_lexeme, tokens(phrase.text)))
        return _Words(lexemes, phrase.prefix) if lexemes else None


def _words(text: str) -> list[_Words]:
    return [words for words in map(_Words.of, query_phrases(text)) if words]


def _all_of(phrases: list[_Words], weights: str = "") -> str:
    return " & ".join(f"({words.tsquery(weights)})" for words in phrases)


def _any_of(phrases: list[_Words]) -> str:
    return " | ".join(f"({words.tsquery()})" for words in phrases)


# --- the query side ----------------------------------------------------------------------

# Who sees what; anything else (an unknown visibility) is seen by nobody. Row-level security
# says the same, but the store does not count on it.
_VISIBLE = (
    "(o.visibility IN ('public', 'project')"
    " OR (o.visibility = 'department' AND o.department = %(viewer_department)s)"
    " OR (o.visibility = 'private' AND o.agent = %(viewer_agent)s))"
)
# Among matches of equal score: the newest saved first, as the SQLite store does (its index's
# order, by id = journal position).
_TIES = "o.id DESC"
# The matches with a phrase in a title or tags (see `_found`).
_RANKED = "o.id = ANY(%(ranked)s)"

Conn = psycopg.Connection[Any]


class _Where:
    """SQL conditions and their parameters, always starting with what the viewer may see."""

    def __init__(self, viewer: Caller) -> None:
        self.conditions = [_VISIBLE]
        self.params: dict[str, Any] = {"viewer_agent": viewer.agent, "viewer_department": viewer.department}

    def add(self, condition: str, **params: Any) -> None:
        self.conditions.append(condition)
        self.params.update(params)

    def also(self, condition: str, **params: Any) -> _Where:
        """These conditions and one more, leaving these as they are."""
        other = _Where.__new__(_Where)
        other.conditions = [*self.conditions, condition]
        other.params = self.params | params
        return other

    def sql(self) -> str:
        return " AND ".join(self.conditions)


def _search_where(query: SearchQuery, viewer: Caller) -> _Where:
    where = _Where(viewer)
    if query.project is not None:
        where.add("o.project = %(project)s", project=without_nul(query.project))  # as saved
    if query.types:
        where.add("o.type = ANY(%(types)s)", types=list(query.types))
    if query.start_ms is not None:
        where.add("o.created_at_epoch >= %(start_ms)s", start_ms=query.start_ms)
    if query.end_ms is not None:
        where.add("o.created_at_epoch <= %(end_ms)s", end_ms=query.end_ms)
    return where


def _matching(query: SearchQuery, viewer: Caller) -> tuple[_Where, list[_Words]] | None:
    """The filters of a search with words (its tsqueries, `match` and `any`, among their
    parameters, for `_found`) and its phrases, or None when its words can match nothing."""
    phrases = _words(query.text or "")
    if not phrases:
        return None
    where = _search_where(query, viewer)
    where.params |= {"match": _all_of(phrases), "any": _any_of(phrases)}
    return where, phrases


def search_sync(conn: Conn, query: SearchQuery, viewer: Caller) -> SearchPage:
    """One page of the observations `viewer` may see that match `query`, and their total."""
    if query.text is None:
        results, total = _list(conn, query, viewer)
    elif (matching := _matching(query, viewer)) is None:
        results, total = [], 0
    else:
        where, phrases = matching
        found = _found(conn, viewer, where)
        total = len(found.params["ids"])
        results = _match_page(conn, query, found, phrases, total) if query.offset < total else []
    return SearchPage(results=results, total=total, limit=query.limit, offset=query.offset)


def _found(conn: Conn, viewer: Caller, where: _Where) -> _Where:
    """The matches, found once through the word index by the schema's `matching_observations`
    (a search's page queries would otherwise each find them again), as a condition checked by
    primary key; with `ranked`, those among them with a phrase in a title or tags, for `_RANKED`."""
    rows = conn.execute(
        f"SELECT o.id, o.titled FROM matching_observations(%(match)s::tsquery, %(any)s::tsquery) AS o"
        f" WHERE {where.sql()}",
        where.params,
    )
    ids, ranked = [], []
    for observation_id, titled in rows:
        ids.append(observation_id)
        if titled:
            ranked.append(observation_id)
    found = _Where(viewer)
    found.add("o.id = ANY(%(ids)s)", ids=ids, ranked=ranked)
    return found


# Up to this many visible matches with a phrase in a title or tags, scoring them all is as
# quick as reading a page score level by level, which pays for a query per level.
RANK_ALL_UP_TO = 200
# Levels grow as 3 ** phrases; a query of more phrases matches few observations anyway.
_LEVELLED_PHRASES = 3
_WEIGHTS = ((5, "A"), (2, "B"))  # title; facts and concepts
_TEXT_WEIGHT = 1  # every phrase of a match occurs in some column: if in neither above, the text
# From this many matches on, a page newest first walks the primary key backwards and stops
# when the page is full; below, the matches are too sparse for that: they are found through
# the word index and sorted (`+ 0` keeps the planner from walking the key).
_WALK_FROM = 2000


def _match_page(conn: Conn, query: SearchQuery, where: _Where, phrases: list[_Words], total: int) -> list[IndexRow]:
    """One page of the visible matches (`where`, as `_found` gives them), in the order asked.
    Only matches with a phrase in a title or tags score above the least (the number of
    phrases), and they are few: they are scored; the rest follow newest first, never scored."""
    if query.order_by != "relevance":
        return _page(conn, where, _date_order(query), query.limit, query.offset)
    ties = _TIES if total >= _WALK_FROM else "o.id + 0 DESC"
    score, scores = _score(phrases)
    ranked = where.also(_RANKED, **scores)
    above = len(where.params["ranked"])  # `_found` read them
    if above > RANK_ALL_UP_TO and len(phrases) <= _LEVELLED_PHRASES:
        return _levelled_page(conn, query, where, phrases, ties)
    page: list[IndexRow] = []
    if query.offset < above:
        page = _page(conn, ranked, f"{score} DESC, {_TIES}", query.limit, query.offset)
    if len(page) < query.limit:
        # The rest, newest first (ties: by id), chosen from the ids in hand: only the page's rows are read.
        titled = set(where.params["ranked"])
        rest = sorted((i for i in where.params["ids"] if i not in titled), reverse=True)
        start = max(0, query.offset - above)
        chosen = rest[start : start + query.limit - len(page)]
        page += _page(conn, where.also("o.id = ANY(%(chosen)s)", chosen=chosen), _TIES, len(chosen), 0)
    return page


def _score(phrases: list[_Words]) -> tuple[str, dict[str, str]]:
    """The relevance of a match as SQL: each phrase adds the weight of the best column it occurs in."""
    cases: list[str] = []
    params: dict[str, str] = {}
    for i, words in enumerate(phrases):
        whens = []
        for weight, label in _WEIGHTS:
            params[f"{label}{i}"] = words.tsquery(label)
            whens.append(f"WHEN o.document @@ %({label}{i})s::tsquery THEN {weight}")
        cases.append(f"CASE {' '.join(whens)} ELSE {_TEXT_WEIGHT} END")
    return "(" + " + ".join(cases) + ")", params


def _levelled_page(conn: Conn, query: SearchQuery, where: _Where, phrases: list[_Words], ties: str) -> list[IndexRow]:
    """A page of the ranked order read level by level, best first: each level is one SQL
    condition read newest first, so a level that fills the rest of the page stops there; only
    a level wholly before the page is counted."""
    page: list[IndexRow] = []
    skip = query.offset
    for condition, params in _score_levels(phrases):
        at_level = where.also(condition, **params)
        rows = _page(conn, at_level, ties, query.limit - len(page), skip)
        if rows:
            skip = 0
        elif skip:
            skip -= _count(conn, at_level)
        page += rows
        if len(page) == query.limit:
            break
    return page


def _score_levels(phrases: list[_Words]) -> list[tuple[str, dict[str, str]]]:
    """SQL conditions of the matches with each score, highest first: every phrase in the best
    column it occurs in, each way of placing them summed to its score."""
    params: dict[str, str] = {}
    placings: list[list[tuple[int, str]]] = []
    for i, words in enumerate(phrases):
        params |= {f"A{i}": words.tsquery("A"), f"AB{i}": words.tsquery("AB")}
        placings.append(
            [
                (5, f"o.document @@ %(A{i})s::tsquery"),
                (2, f"o.document @@ %(AB{i})s::tsquery AND NOT o.document @@ %(A{i})s::tsquery"),
                (_TEXT_WEIGHT, f"NOT o.document @@ %(AB{i})s::tsquery"),
            ]
        )
    by_score: dict[int, list[str]] = {}
    for placing in itertools.product(*placings):
        score = sum(weight for weight, _ in placing)
        by_score.setdefault(score, []).append(" AND ".join(condition for _, condition in placing))
    least = _TEXT_WEIGHT * len(phrases)
    levels = []
    for score in sorted(by_score, reverse=True):
        condition = " OR ".join(f"({each})" for each in by_score[score])
        # Above the least, some phrase is in a title or tags: their index finds those rows.
        levels.append((f"{_RANKED} AND ({condition})" if score > least else f"NOT {_RANKED}", params))
    return levels


def _list(conn: Conn, query: SearchQuery, viewer: Caller) -> tuple[list[IndexRow], int]:
    """Filters only, by date: walks a time index, so it stops as soon as the page is full."""
    where = _search_where(query, viewer)
    results = _page(conn, where, _date_order(query), query.limit, query.offset)
    if query.offset == 0 and len(results) < query.limit:
        return results, len(results)  # the first page, not full: it holds every match
    return results, _count(conn, where)


def _count(conn: Conn, where: _Where) -> int:
    """How many rows match."""
    row = conn.execute(
        f"SELECT count(*) FROM observations o WHERE {where.sql()}", where.params, prepare=False
    ).fetchone()
    return int(row[0]) if row else 0


def _date_order(query: SearchQuery) -> str:
    return OLDEST_FIRST if query.order_by == "date_asc" else NEWEST_FIRST


def _page(conn: Conn, where: _Where, order: str, limit: int, offset: int) -> list[IndexRow]:
    rows = conn.execute(
        f"SELECT {INDEX_COLUMNS} FROM observations o WHERE {where.sql()}"
        f" ORDER BY {order} LIMIT %(limit)s OFFSET %(offset)s",
        where.params | {"limit": limit, "offset": offset},
        prepare=False,  # a plan for these words: one for any words is often far slower
    )
    return [IndexRow(*row) for row in rows]


def timeline_sync(conn: Conn, query: TimelineQuery, viewer: Caller) -> TimelinePage:
    """The anchor and up to `depth_before`/`depth_after` observations around it, in time order."""
    anchor = _anchor(conn, query, viewer)
    if anchor is None:
        wanted = f"observation {query.anchor}" if query.anchor is not None else f"match for {query.text!r}"
        return TimelinePage(anchor=None, results=[], message=f"No {wanted} found")
    where = _Where(viewer)
    if query.project is not None:
        where.add("o.project = %(project)s", project=without_nul(query.project))
    where.params |= {"at": anchor.created_at_epoch, "id": anchor.id}
    earlier = where.also("(o.created_at_epoch, o.id) < (%(at)s, %(id)s)")
    later = where.also("(o.created_at_epoch, o.id) > (%(at)s, %(id)s)")
    before = _page(conn, earlier, NEWEST_FIRST, query.depth_before, 0)
    after = _page(conn, later, OLDEST_FIRST, query.depth_after, 0)
    return TimelinePage(anchor=anchor.id, results=[*reversed(before), anchor, *after])


def _anchor(conn: Conn, query: TimelineQuery, viewer: Caller) -> IndexRow | None:
    if query.anchor is not None:
        where = _Where(viewer)
        where.add("o.id = %(anchor)s", anchor=query.anchor)
        found = _page(conn, where, _TIES, 1, 0)
    else:
        found = search_sync(conn, SearchQuery(text=query.text, limit=1, project=query.project), viewer).results
    return found[0] if found else None


def get_observations_sync(conn: Conn, ids: list[int], viewer: Caller) -> Observations:
    """Full records of `ids` the viewer may see, in the order asked; the rest as missing."""
    wanted = list(dict.fromkeys(ids))
    where = _Where(viewer)
    where.add("o.id = ANY(%(ids)s)", ids=wanted)
    rows = conn.execute(f"SELECT {FULL_COLUMNS} FROM observations o WHERE {where.sql()}", where.params)
    return observations_in_order(wanted, rows)


def _read(work: Callable[[Conn], T]) -> Callable[[Conn], T]:
    """`work` inside one read-only snapshot, so a page and its total agree; inside the
    caller's transaction when one is open."""

    def run(conn: Conn) -> T:
        if conn.info.transaction_status != TransactionStatus.IDLE:
            return work(conn)
        with conn.transaction():
            conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")
            return work(conn)

    return run


class _Runner(Protocol):
    """A connection of the journal's, lent on a thread of its own."""

    async def run(self, work: Callable[[Conn], T]) -> T: ...


class PostgresMemoryStore:
    """The memory store the handlers ask (`handlers.ports.MemoryStore`): the observations
    table, queried off the event loop."""

    def __init__(self, journal: _Runner) -> None:
        self._journal = journal

    async def search(self, query: SearchQuery, viewer: Caller) -> SearchPage:
        return await self._journal.run(_read(lambda conn: search_sync(conn, query, viewer)))

    async def timeline(self, query: TimelineQuery, viewer: Caller) -> TimelinePage:
        return await self._journal.run(_read(lambda conn: timeline_sync(conn, query, viewer)))

    async def get_observations(self, ids: list[int], viewer: Caller) -> Observations:
        return await self._journal.run(_read(lambda conn: get_observations_sync(conn, ids, viewer)))
