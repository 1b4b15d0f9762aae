"""The team journal on PostgreSQL beside the local one on SQLite, in one run:

- `team.roundtrip`: `save` and `search` round trips through `toolbus serve`, interleaved call
  by call between a PostgreSQL journal and a SQLite one holding the same observations;
- `team.concurrent`: 8 `toolbus serve` processes saving at once into one journal: commands per
  second, and whether the positions came out gapless;
- `team.replay`: `toolbus replay memory` on the PostgreSQL journal, events per second.

PostgreSQL is a server started from the `pgserver` wheel for this run ($TOOLBUS_TEST_POSTGRES:
an existing one), reached over its Unix socket.
"""

from __future__ import annotations

import concurrent.futures
import subprocess
import sys
import time
from collections.abc import Iterator
from itertools import islice
from pathlib import Path
from typing import Any

from tests.bench.context import ROOT, Context
from tests.bench.history import queries
from tests.bench.report import Figure
from tests.bench.stats import median, ms, p50, p95, ratio_over_rounds
from tests.bench.workload import AGENTS, BATCH, Corpus, cached_journal, outcomes, scratch_copy
from tests.postgres_server import fresh_database, server_url, with_database
from tests.rpc_client import StdioServer, clean_env, result_text, toolbus_argv
from toolbus.bus import Caller
from toolbus.journal.postgres import PostgresJournal, connect, init_schema, register_agent
from toolbus.journal.rows import Outcome

SEARCH_P95_MS = 10.0
WRITERS = 8
VIEWER = "claude"  # the role the round trips run as: one of the generated notes' agents


def run(ctx: Context) -> None:
    database = fresh_database()
    admin = with_database(server_url(), database)
    with connect(admin) as conn:
        init_schema(conn)
        for agent in AGENTS:
            conn.execute(f'CREATE ROLE "{agent}_{database}" LOGIN')
            register_agent(conn, f"{agent}_{database}", "platform")
    count = ctx.options.observations
    print(f"    filling PostgreSQL with {count:,} observations", file=sys.stderr, flush=True)
    fill_postgres(admin, database, count)
    roundtrip(ctx, admin, database, count)
    writers(ctx, database)
    replay(ctx, admin)


def agent_url(database: str, agent: str) -> str:
    return with_database(server_url(), database, user=f"{agent}_{database}")


def fill_postgres(admin: str, database: str, count: int) -> None:
    """The same generated observations as the SQLite journal's, each in its agent's name."""
    journal = PostgresJournal(admin)
    source = _renamed(outcomes(count, Corpus.make(), observations_only=True), database)
    started = time.monotonic()
    try:
        while batch := list(islice(source, BATCH)):
            journal.record_many_sync(batch)
        # What autovacuum does a little later: statistics for the planner after a bulk load.
        journal.run_sync(lambda conn: conn.execute("ANALYZE"))
    finally:
        journal.close()
    print(f"    filled in {time.monotonic() - started:.1f} s", file=sys.stderr, flush=True)


def _renamed(source: Iterator[Outcome], database: str) -> Iterator[Outcome]:
    import msgspec

    for outcome in source:
        [event] = outcome.events
        agent = f"{outcome.record.caller.agent}_{database}"
        caller = Caller(agent=agent, department="platform", session_id="bench")
        note = msgspec.structs.replace(event, agent=agent, department="platform")
        yield outcome._replace(record=msgspec.structs.replace(outcome.record, caller=caller), events=(note,))


# --- round trips ----------------------------------------------------------------------------


def roundtrip(ctx: Context, admin: str, database: str, count: int) -> None:
    cached = cached_journal(ctx.options.cache, "observations", count, fresh=ctx.options.fresh)
    local = scratch_copy(cached, ctx.scratch / "team-local.db")
    kinds = {kind: texts for kind, texts in queries().items() if kind != "common_words"}
    servers = {
        "postgres": _server(ctx, agent_url(database, VIEWER), "team-postgres"),
        "sqlite": _server(ctx, local, "team-sqlite", "--agent", VIEWER, "--department", "platform"),
    }
    samples: dict[str, dict[str, list[list[float]]]] = {name: {"save": [], "search": []} for name in servers}
    try:
        for _ in range(ctx.options.rounds):
            for name in servers:
                samples[name]["save"].append([])
                samples[name]["search"].append([])
            for call in range(max(ctx.options.calls // 10, 20)):
                for name, server in servers.items():  # interleaved: both see the same machine load
                    samples[name]["save"][-1].append(_timed(server, "save", _note(call)))
                    query = [text for texts in kinds.values() for text in texts][call % 9]
                    samples[name]["search"][-1].append(_timed(server, "search", {"query": query, "limit": 20}))
    finally:
        for server in servers.values():
            server.close()
    measured = {
        name: {
            action: {
                "p50_ms": ms(median([p50(r) for r in rounds])),
                "p95_ms": ms(median([p95(r) for r in rounds])),
            }
            for action, rounds in actions.items()
        }
        for name, actions in samples.items()
    }
    ratios = {
        action: round(ratio_over_rounds(samples["postgres"][action], samples["sqlite"][action]), 3)
        for action in ("save", "search")
    }
    search_p95 = measured["postgres"]["search"]["p95_ms"]
    ctx.report.add(
        Figure(
            key="team.roundtrip",
            summary=f"PostgreSQL save p50 {measured['postgres']['save']['p50_ms']:.2f} ms "
            f"({ratios['save']:.2f}x SQLite), search p50 {measured['postgres']['search']['p50_ms']:.2f}/"
            f"p95 {search_p95:.2f} ms ({ratios['search']:.2f}x SQLite) at {count:,} observations",
            target=f"search p95 <= {SEARCH_P95_MS:g} ms at 100k observations",
            met=search_p95 <= SEARCH_P95_MS if count >= 100_000 else None,
            measured=measured["postgres"] | {"observations": count, "ratio_p50_to_sqlite": ratios},
            baseline=measured["sqlite"],
            note="MCP round trips over stdio, each journaled; PostgreSQL over a Unix socket with "
            "row-level security on; queries: the search benchmark's rare, multi-word, phrase, prefix and CJK",
        )
    )


def _server(ctx: Context, journal: Path | str, stderr: str, *flags: str) -> StdioServer:
    server = StdioServer(
        toolbus_argv(journal, *flags),  # type: ignore[arg-type]
        env=clean_env(),
        stderr=ctx.scratch / f"{stderr}.stderr",
        cwd=ROOT,
    )
    server.initialize()
    return server


def _note(index: int) -> dict[str, Any]:
    return {"title": f"bench note {index}", "text": "measured round trip", "project": "toolbus"}


def _timed(server: StdioServer, tool: str, arguments: dict[str, Any]) -> float:
    started = time.perf_counter()
    result = server.call_tool(tool, arguments)
    elapsed = time.perf_counter() - started
    if result.get("isError"):
        raise RuntimeError(f"{tool} failed: {result_text(result)}")
    return elapsed


# --- several writers at once -----------------------------------------------------------------


def writers(ctx: Context, database: str) -> None:
    calls = max(ctx.options.calls // 4, 50)
    results = {}
    for name in ("postgres", "sqlite"):
        if name == "postgres":
            journals: list[Path | str] = [agent_url(database, AGENTS[i % len(AGENTS)]) for i in range(WRITERS)]
        else:
            journals = [ctx.scratch / "team-concurrent.db"] * WRITERS
        servers = [_server(ctx, journal, f"team-writer-{i}") for i, journal in enumerate(journals)]
        try:
            started = time.perf_counter()
            with concurrent.futures.ThreadPoolExecutor(WRITERS) as pool:
                list(pool.map(lambda server: [_timed(server, "save", _note(i)) for i in range(calls)], servers))
            elapsed = time.perf_counter() - started
        finally:
            for server in servers:
                server.close()
        results[name] = {
            "commands_per_s": round(WRITERS * calls / elapsed, 1),
            "gapless": _gapless(name, database, ctx),
        }
    ctx.report.add(
        Figure(
            key="team.concurrent",
            summary=f"{WRITERS} writers: PostgreSQL {results['postgres']['commands_per_s']:.0f} saves/s "
            f"(gapless: {results['postgres']['gapless']}), SQLite {results['sqlite']['commands_per_s']:.0f}/s "
            f"(gapless: {results['sqlite']['gapless']})",
            target="informational: throughput, and one gapless order",
            met=None,
            measured=results["postgres"] | {"writers": WRITERS, "saves_each": calls},
            baseline=results["sqlite"],
            note="each writer a `toolbus serve` process with its own MCP client, saving as fast as it is answered",
        )
    )


def _gapless(name: str, database: str, ctx: Context) -> bool:
    if name == "postgres":
        with connect(with_database(server_url(), database)) as conn:
            positions = [row[0] for row in conn.execute("SELECT position FROM events ORDER BY position")]
    else:
        import sqlite3

        with sqlite3.connect(ctx.scratch / "team-concurrent.db") as conn:
            positions = [row[0] for row in conn.execute("SELECT position FROM events ORDER BY position")]
    return positions == list(range(1, len(positions) + 1))


# --- replay ------------------------------------------------------------------------------------


def replay(ctx: Context, admin: str) -> None:
    argv = [sys.executable, "-m", "toolbus.adapters.cli", "replay", "memory", "--journal", admin]
    started = time.perf_counter()
    done = subprocess.run(argv, capture_output=True, text=True, timeout=3600, cwd=ROOT, env=clean_env())
    elapsed = time.perf_counter() - started
    if done.returncode != 0:
        ctx.report.skip("team.replay", "informational", done.stderr.strip()[-200:])
        return
    rebuilt = int(done.stdout.split()[5])  # "rebuilt the memory store from N saved observations"
    ctx.report.add(
        Figure(
            key="team.replay",
            summary=f"replay memory on PostgreSQL: {rebuilt / elapsed:,.0f} observations/s ({elapsed:.1f} s)",
            target="informational",
            met=None,
            measured={"events_per_s": round(rebuilt / elapsed, 1), "seconds": round(elapsed, 2), "events": rebuilt},
            note="the whole command, process start included",
        )
    )
