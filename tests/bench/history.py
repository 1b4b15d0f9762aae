"""Reading big journals through toolbus's public interfaces: the `search` tool over MCP at
100k observations, `toolbus replay memory` and `toolbus audit` on a 1M-event journal.

The journals are generated once (see `workload`) and cached; each benchmark works on a
private copy. A tool or command that does not exist yet is reported as skipped.
"""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import time
from pathlib import Path
from typing import Any

from tests.bench.context import ROOT, Context, toolbus_script
from tests.bench.report import Figure
from tests.bench.stats import median, ms, p50, p95
from tests.bench.workload import (
    CJK_PHRASES,
    PHRASES,
    TECH_WORDS,
    Corpus,
    cached_journal,
    file_path,
    scratch_copy,
)
from tests.rpc_client import StdioServer, clean_env, result_text

SEARCH_P95_MS = 5.0  # typical queries at 100k observations
COMMON_P95_MS = 10.0  # common words at 100k, and typical queries at 1M
REPLAY_RATE = 50_000
AUDIT_P95_MS = 50.0


def queries() -> dict[str, list[str]]:
    """Query kinds. `multi_word` combines words of middling frequency, as people search (each
    word in 0.5-10 % of observations); `common_words` pairs the most frequent ones (9-64 %),
    a stress case with a target of its own."""
    words = Corpus.make().words
    return {
        "multi_word": [
            f"{words[150]} {words[400]}",
            f"{words[90]} {words[700]}",
            f"{words[300]} {words[1200]}",
            f"{words[120]} {words[250]} {words[60]}",
        ],
        "phrase": [f'"{phrase}"' for phrase in PHRASES],
        "cjk": [CJK_PHRASES[0], CJK_PHRASES[1][:4], CJK_PHRASES[2], CJK_PHRASES[3].split()[0]],
        "common_words": [f"{TECH_WORDS[0]} {TECH_WORDS[3]}", f"{TECH_WORDS[12]} {TECH_WORDS[2]}"],
    }


JUDGED = ("multi_word", "phrase", "cjk")


def run(ctx: Context) -> None:
    search(ctx)
    mixed = cached_journal(ctx.options.cache, "mixed", ctx.options.events, fresh=ctx.options.fresh)
    replay(ctx, mixed)
    audit(ctx, mixed)


def _cli(*args: str, timeout: float = 600) -> tuple[float, subprocess.CompletedProcess[str]]:
    started = time.perf_counter()
    done = subprocess.run(
        [*toolbus_script(), *args], capture_output=True, text=True, env=clean_env(), cwd=ROOT, timeout=timeout
    )
    return time.perf_counter() - started, done


def _count(journal: Path, sql: str) -> int:
    with sqlite3.connect(f"file:{journal}?mode=ro", uri=True) as conn:
        return int(conn.execute(sql).fetchone()[0])


# --- search ----------------------------------------------------------------------------------


def search(ctx: Context) -> None:
    count = ctx.options.observations
    key = "memory.search"
    target = (
        f"p95 <= {SEARCH_P95_MS:g} ms at 100k observations (common words <= {COMMON_P95_MS:g} ms),"
        f" <= {COMMON_P95_MS:g} ms at 1M"
    )
    cached = cached_journal(ctx.options.cache, "observations", count, fresh=ctx.options.fresh)
    journal = scratch_copy(cached, ctx.scratch / "search.db")
    kinds = queries()
    with ctx.toolbus(journal, nvim=False, stderr="search") as server:
        server.initialize()
        started = time.perf_counter()
        probe = server.call_tool("search", {"query": kinds["multi_word"][0]})
        first_search = time.perf_counter() - started  # the caller's marks built (`AudienceMarks`)
        if probe.get("isError"):
            ctx.report.skip(key, target, f"the search tool answers an error: {result_text(probe)[:120]}")
            return
        samples: dict[str, list[float]] = {kind: [] for kind in kinds}
        hits: dict[str, list[int]] = {kind: [] for kind in kinds}
        repeats = max(ctx.options.calls // 10, 10)
        for _ in range(repeats):
            for kind, texts in kinds.items():
                for query in texts:
                    elapsed, found = _timed_search(server, query)
                    samples[kind].append(elapsed)
                    hits[kind].append(found)
    measured: dict[str, Any] = {
        kind: {"p50_ms": ms(p50(values)), "p95_ms": ms(p95(values)), "median_hits": median(hits[kind])}
        for kind, values in samples.items()
    }
    ctx.report.add(
        Figure(
            key=key,
            summary=", ".join(f"{k} p50 {v['p50_ms']:.2f}/p95 {v['p95_ms']:.2f} ms" for k, v in measured.items())
            + f" ({count:,} observations)",
            target=target,
            met=_search_met(samples, count),
            measured=measured | {"observations": count, "first_search_ms": ms(first_search), "queries": kinds},
            note="MCP round trip over stdio, the query journaled as every call is; typical queries: "
            f"{', '.join(JUDGED)}; the first search, untimed above, marks what the caller may see",
        )
    )


def _search_met(samples: dict[str, list[float]], count: int) -> bool | None:
    typical = max(p95(samples[kind]) for kind in JUDGED) * 1000
    if count >= 1_000_000:
        return typical <= COMMON_P95_MS
    if count >= 100_000:
        return typical <= SEARCH_P95_MS and p95(samples["common_words"]) * 1000 <= COMMON_P95_MS
    return None


def _timed_search(server: StdioServer, query: str) -> tuple[float, int]:
    started = time.perf_counter()
    result = server.call_tool("search", {"query": query, "limit": 20})
    elapsed = time.perf_counter() - started
    if result.get("isError"):
        raise RuntimeError(f"search {query!r} failed: {result_text(result)}")
    return elapsed, _rows(json.loads(result_text(result)))


def _rows(reply: Any) -> int:
    """How many rows a search reply holds, whatever it names its list."""
    if isinstance(reply, list):
        return len(reply)
    if isinstance(reply, dict):
        for value in reply.values():
            if isinstance(value, list):
                return len(value)
    return 0


# --- replay -----------------------------------------------------------------------------------


def replay(ctx: Context, mixed: Path) -> None:
    key = "journal.replay_memory"
    target = f">= {REPLAY_RATE:,} events/s on 1M events"
    events = _count(mixed, "SELECT count(*) FROM events")
    observations = _count(mixed, "SELECT count(*) FROM events WHERE type = 'ObservationSaved'")
    journal = ctx.scratch / "replay.db"
    times: list[float] = []
    for _ in range(1 if ctx.options.quick else 3):
        _on_disk(scratch_copy(mixed, journal))
        elapsed, done = _cli("replay", "memory", "--journal", str(journal))
        if done.returncode != 0:
            ctx.report.skip(key, target, f"toolbus replay memory failed: {done.stderr.strip()[:160]}")
            return
        times.append(elapsed)
    rate = events / median(times)
    ctx.report.add(
        Figure(
            key=key,
            summary=f"{events:,} events ({observations:,} observations) in {median(times):.2f} s: {rate:,.0f} events/s",
            target=target,
            met=rate >= REPLAY_RATE if events >= 1_000_000 else None,
            measured={"events": events, "observations": observations, "median_s": median(times)}
            | {"events_per_s": rate, "observations_per_s": observations / median(times), "runs": len(times)},
            note="wall time of the whole `toolbus replay memory` process, start-up included",
        )
    )


def _on_disk(path: Path) -> None:
    """Write the fresh copy back before the clock starts: otherwise the replay's first fsync
    also waits for the benchmark's own 1.8 GB copy to reach the disk (1-2 s of the figure)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


# --- audit ------------------------------------------------------------------------------------


def audit(ctx: Context, mixed: Path) -> None:
    key = "journal.audit"
    target = f"p95 <= {AUDIT_P95_MS:g} ms on a 1M-event journal"
    events = _count(mixed, "SELECT count(*) FROM events")
    filters = {
        "path": ["--path", file_path(7)],
        "tool": ["--tool", "saveDocument"],
        "since": ["--since", "2h"],
    }
    _, probe = _cli("audit", "--journal", str(mixed), "--limit", "1", "--json")
    if probe.returncode != 0:
        ctx.report.skip(key, target, f"toolbus audit failed: {probe.stderr.strip()[:160]}")
        return
    floor: list[float] = []
    samples: dict[str, list[float]] = {name: [] for name in filters}
    for _ in range(max(ctx.options.calls // 20, 10)):
        floor.append(_cli("--version")[0])
        for name, args in filters.items():
            elapsed, done = _cli("audit", "--journal", str(mixed), *args, "--json")
            if done.returncode != 0:
                raise RuntimeError(f"toolbus audit {args} failed: {done.stderr}")
            samples[name].append(elapsed)
    queries = _audit_queries_in_process(mixed, filters)
    worst_query = max(p95(values) for values in queries.values())
    measured: dict[str, Any] = {
        name: {
            "cli_p50_ms": ms(p50(values)),
            "cli_p95_ms": ms(p95(values)),
            "query_p50_ms": ms(p50(queries[name])),
            "query_p95_ms": ms(p95(queries[name])),
        }
        for name, values in samples.items()
    }
    ctx.report.add(
        Figure(
            key=key,
            summary=", ".join(
                f"--{name} query p95 {v['query_p95_ms']:.1f} ms (CLI {v['cli_p95_ms']:.0f} ms)"
                for name, v in measured.items()
            )
            + f"; `toolbus --version` {median(floor) * 1000:.0f} ms ({events:,} events)",
            target=target,
            met=worst_query <= AUDIT_P95_MS / 1000 if events >= 1_000_000 else None,
            measured=measured | {"events": events},
            baseline={"toolbus_version_p50_ms": ms(p50(floor)), "toolbus_version_p95_ms": ms(p95(floor))},
            note="judged on the query (journal.audit.audit, 50 newest with their events, as --json "
            "prints them); the CLI figure adds process start-up, which `toolbus --version` shows",
        )
    )


def _audit_queries_in_process(journal: Path, filters: dict[str, list[str]]) -> dict[str, list[float]]:
    """The queries `toolbus audit` runs, through the journal package's public functions."""
    import msgspec

    from toolbus.adapters.cli_journal import parse_time
    from toolbus.bus import AuditQuery, file_streams
    from toolbus.journal.sqlite.audit import audit
    from toolbus.journal.sqlite.readonly import open_readonly

    encoder = msgspec.json.Encoder()
    conn = open_readonly(journal)
    samples: dict[str, list[float]] = {name: [] for name in filters}
    try:
        for _ in range(50):
            for name, (_, value) in filters.items():
                query = {
                    "path": lambda v: AuditQuery(paths=file_streams(v)),
                    "tool": lambda v: AuditQuery(tool=v),
                    "since": lambda v: AuditQuery(since=parse_time("--since", v)),
                }[name](value)
                started = time.perf_counter()
                for entry in audit(conn, query):
                    encoder.encode(entry)
                samples[name].append(time.perf_counter() - started)
    finally:
        conn.close()
    return samples
