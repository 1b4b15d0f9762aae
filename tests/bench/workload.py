"""Synthetic but plausible journal content, generated through the journal's own append path.

Observations use a Zipf-distributed vocabulary, so words range from everywhere to rare, with
planted phrases and CJK text the search benchmark can look for. Big journals are built in
batches with `SqliteJournal.record_many_sync` (the same insert, projection and index code as
a tool call, minus the MCP round trip) and cached, keyed by the journal code that wrote them.
"""

from __future__ import annotations

import hashlib
import itertools
import random
import shutil
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from functools import partial
from pathlib import Path

from toolbus.bus import Caller, CommandRecord, DocumentSaved, Event, ObservationSaved, TabClosed
from toolbus.journal import SqliteJournal
from toolbus.journal.rows import Outcome

GENERATOR_VERSION = 2
SEED = 20260728
BATCH = 1000
DAY_NS = 86_400 * 1_000_000_000

PHRASES = ["write ahead log", "buffer reload conflict", "event sourcing", "gapless position order"]
CJK_PHRASES = ["日志提交顺序", "検索エンジンの索引", "内存存储重建", "버퍼 저장 충돌"]
TECH_WORDS = [
    *("journal", "commit", "fsync", "neovim", "buffer", "save", "close", "tab", "memory", "search"),
    *("timeline", "observation", "sqlite", "wal", "index", "query", "phrase", "token", "agent"),
    *("department", "project", "session", "replay", "audit", "recover", "blob", "hash", "position"),
    *("event", "command", "handler", "adapter", "bus", "schema", "migration", "timeout", "prompt"),
]
AGENTS = ["claude", "codex", "gemini", "legacy"]
DEPARTMENTS = ["platform", "editor", "research"]
VISIBILITIES = ["public", "project", "department", "private"]
TYPES = ["decision", "bugfix", "feature", "refactor", "discovery", "change"]
PROJECTS = ["toolbus", "webapp", "infra", "manual"]


def vocabulary(size: int, rng: random.Random) -> list[str]:
    """Pronounceable made-up words, most frequent first, with the tech words among the frequent."""
    syllables = [c + v for c in "bdfgklmnprstvz" for v in "aeiou"]
    words: set[str] = set()
    while len(words) < size - len(TECH_WORDS):
        words.add("".join(rng.choice(syllables) for _ in range(rng.randint(2, 4))))
    ordered = sorted(words)
    rng.shuffle(ordered)
    for rank, word in zip(range(5, 5 * len(TECH_WORDS), 5), TECH_WORDS, strict=False):
        ordered.insert(rank, word)
    return ordered


@dataclass(frozen=True)
class Corpus:
    """Draws titles and texts from a Zipf vocabulary."""

    words: list[str]
    cumulative_weights: list[float]  # precomputed: `choices` would redo it on every call
    rng: random.Random

    @classmethod
    def make(cls, seed: int = SEED, size: int = 5000) -> Corpus:
        rng = random.Random(seed)
        words = vocabulary(size, rng)
        return cls(words, list(itertools.accumulate(1 / (rank + 1) for rank in range(len(words)))), rng)

    def phrase(self, count: int) -> str:
        return " ".join(self.rng.choices(self.words, cum_weights=self.cumulative_weights, k=count))

    def text(self) -> str:
        parts = [self.phrase(self.rng.randint(20, 60))]
        if self.rng.random() < 0.02:
            parts.insert(self.rng.randint(0, 1), self.rng.choice(PHRASES))
        if self.rng.random() < 0.03:
            parts.append(self.rng.choice(CJK_PHRASES))
        return " ".join(parts) + "."

    def observation(self, created_ms: int) -> ObservationSaved:
        rng = self.rng
        agent = rng.choice(AGENTS)
        return ObservationSaved(
            title=self.phrase(rng.randint(3, 8)).capitalize(),
            text=self.text(),
            type=rng.choice(TYPES),
            project=rng.choice(PROJECTS),
            memory_session_id=f"bench-{rng.randrange(10_000)}",
            facts=[self.phrase(rng.randint(4, 10)) for _ in range(rng.randint(0, 3))],
            concepts=[self.phrase(1) for _ in range(rng.randint(0, 3))],
            agent=agent,
            department=rng.choice(DEPARTMENTS),
            visibility=rng.choice(VISIBILITIES),
            created_at_epoch=created_ms,
        )


def file_path(index: int) -> str:
    return f"/home/dev/project/src/module{index % 200}/file{index}.py"


def outcomes(count: int, corpus: Corpus, *, observations_only: bool = False) -> Iterator[Outcome]:
    """`count` finished commands of one event each, received over the last 30 days in order:
    70 % memory saves, 25 % document saves over 2,000 files, 5 % tab closes."""
    rng = corpus.rng
    end_ns = time.time_ns()
    start_ns = end_ns - 30 * DAY_NS
    step = (end_ns - start_ns) // max(count, 1)
    for index in range(count):
        received_ns = start_ns + index * step
        draw = 0.0 if observations_only else rng.random()
        event: Event
        if draw < 0.70:
            event = corpus.observation(received_ns // 1_000_000)
            tool, arguments = "save", {"title": event.title, "text": event.text[:64]}
        elif draw < 0.95:
            path = file_path(rng.randrange(2000))
            digest = hashlib.sha256(f"{index}".encode()).hexdigest()
            event = DocumentSaved(
                path=path,
                written_blob=digest,
                bytes_written=rng.randint(100, 20_000),
                replaced_blob=None,
                disk_changed=False,
                reloaded=False,
            )
            tool, arguments = "saveDocument", {"filePath": path}
        else:
            path = file_path(rng.randrange(2000))
            event = TabClosed(path=path, tab_name=path, was_modified=False, discarded_blob=None)
            tool, arguments = "close_tab", {"tab_name": path}
        caller = Caller(agent=rng.choice(AGENTS), department=rng.choice(DEPARTMENTS), session_id="bench")
        record = CommandRecord(tool=tool, arguments=arguments, caller=caller, received_ns=received_ns)
        yield Outcome(record, "ok", events=(event,))


def fill(journal: SqliteJournal, source: Iterator[Outcome], count: int, label: str) -> None:
    """Append `count` outcomes in transactions of `BATCH`, reporting progress on stderr."""
    done = 0
    started = time.monotonic()
    while done < count:
        batch = [next(source) for _ in range(min(BATCH, count - done))]
        journal.run_sync(partial(journal.record_many_sync, outcomes=batch))
        done += len(batch)
        if done % (BATCH * 50) == 0 or done == count:
            rate = done / max(time.monotonic() - started, 1e-9)
            print(f"    {label}: {done:,}/{count:,} ({rate:,.0f}/s)", file=sys.stderr, flush=True)


def journal_schema_version() -> str:
    """A digest of what a new journal's schema is (tables, indexes, FTS, triggers): the cache
    key, so an unrelated code change does not cost a regeneration. `--fresh` forces one."""
    import tempfile

    with tempfile.TemporaryDirectory() as folder:
        journal = SqliteJournal(Path(folder) / "schema.db")
        try:
            schema = journal.run_sync(
                lambda conn: conn.execute("SELECT type, name, sql FROM sqlite_master ORDER BY name").fetchall()
            )
        finally:
            journal.close()
    digest = hashlib.sha256(f"{GENERATOR_VERSION} {schema}".encode())
    return digest.hexdigest()[:12]


def cached_journal(cache: Path, kind: str, count: int, *, fresh: bool = False) -> Path:
    """A journal of `count` generated commands (one event each), built once per code version.

    kind "mixed": saves, document saves and closes; kind "observations": memory saves only.
    """
    path = cache / f"{kind}-{count}-{journal_schema_version()}.db"
    if path.exists() and not fresh:
        return path
    cache.mkdir(parents=True, exist_ok=True)
    for stale in cache.glob(f"{kind}-{count}-*"):
        stale.unlink()
    building = path.with_suffix(".building")
    for leftover in cache.glob(building.name + "*"):
        leftover.unlink()
    journal = SqliteJournal(building, synchronous="NORMAL")
    try:
        corpus = Corpus.make()
        fill(journal, outcomes(count, corpus, observations_only=kind == "observations"), count, kind)
        journal.run_sync(lambda conn: conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchall())
    finally:
        journal.close()
    building.rename(path)
    return path


def scratch_copy(source: Path, target: Path) -> Path:
    """A private copy of a cached journal, for benchmarks that write to it. A -wal or -shm
    left beside the target would be applied to the new copy and corrupt it: removed first."""
    for stale in (Path(f"{target}-wal"), Path(f"{target}-shm")):
        stale.unlink(missing_ok=True)
    shutil.copyfile(source, target)
    return target
