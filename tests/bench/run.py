"""Run the benchmarks: JSON on stdout, a table on stderr.

.venv/bin/python -m tests.bench            # full scale (100k observations, 1M events)
.venv/bin/python -m tests.bench --quick    # small scale, under two minutes
.venv/bin/python -m tests.bench --only editor,append
"""

from __future__ import annotations

import argparse
import os
import platform
import sqlite3
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from importlib import metadata
from pathlib import Path

from tests.bench import editor, history, ide, journal_append, peer, startup, team
from tests.bench.context import Context, Options
from tests.bench.report import Report, Value


def _editor(ctx: Context) -> None:
    editor.run(ctx)
    peer.run(ctx)  # the same round trips beside nvim-mcp, on the same Neovim


SECTIONS: dict[str, Callable[[Context], None]] = {
    "editor": _editor,
    "ide": ide.run,
    "append": journal_append.run,
    "startup": startup.run,
    "history": history.run,
    "team": team.run,
}


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m tests.bench", description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="small scale: a run under two minutes")
    parser.add_argument("--only", help=f"comma list of sections: {', '.join(SECTIONS)}")
    parser.add_argument("--rounds", type=int, help="repeated runs per figure (median reported)")
    parser.add_argument("--calls", type=int, help="calls per round in round-trip figures")
    parser.add_argument("--observations", type=int, help="observations for the search figure (100000)")
    parser.add_argument("--events", type=int, help="events for the replay and audit figures (1000000)")
    parser.add_argument("--rss-calls", type=int, help="calls before reading the server's RSS (10000)")
    parser.add_argument("--startups", type=int, help="server starts timed")
    parser.add_argument(
        "--cache",
        type=Path,
        default=Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "toolbus-bench",
        help="where generated journals are kept between runs",
    )
    parser.add_argument("--fresh", action="store_true", help="regenerate the cached journals")
    return parser


def options_from(args: argparse.Namespace) -> Options:
    quick = bool(args.quick)

    def pick(value: int | None, full: int, small: int) -> int:
        return value if value is not None else (small if quick else full)

    return Options(
        quick=quick,
        rounds=pick(args.rounds, 7, 5),
        calls=pick(args.calls, 600, 200),
        observations=pick(args.observations, 100_000, 20_000),
        events=pick(args.events, 1_000_000, 100_000),
        rss_calls=pick(args.rss_calls, 10_000, 2_000),
        startups=pick(args.startups, 10, 5),
        cache=args.cache,
        fresh=bool(args.fresh),
    )


def environment() -> dict[str, Value]:
    versions = {name: _version(name) for name in ("mcp", "pynvim", "msgspec", "eventsourcing", "nvim-mcp")}
    return {
        "python": platform.python_version(),
        "sqlite": sqlite3.sqlite_version,
        "platform": platform.platform(),
        "cpus": os.cpu_count(),
        "versions": versions,
    }


def _version(name: str) -> str:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return "missing"


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    options = options_from(args)
    chosen = args.only.split(",") if args.only else list(SECTIONS)
    unknown = [name for name in chosen if name not in SECTIONS]
    if unknown:
        print(f"unknown sections: {', '.join(unknown)}; choose from {', '.join(SECTIONS)}", file=sys.stderr)
        return 2
    settings = {k: str(v) if isinstance(v, Path) else v for k, v in vars(options).items()}
    report = Report(settings=settings | {"sections": chosen}, environment=environment())
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="toolbus-bench-") as scratch:
        ctx = Context(options=options, scratch=Path(scratch), report=report)
        try:
            for name in chosen:
                print(f"{name} ...", file=sys.stderr, flush=True)
                SECTIONS[name](ctx)
        finally:
            ctx.close()
    report.settings["elapsed_s"] = round(time.monotonic() - started, 1)
    report.print_json()
    report.print_table()
    return 0


if __name__ == "__main__":
    sys.exit(main())
