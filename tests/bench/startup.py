"""Start-up and memory: `toolbus serve` from exec to its `initialize` reply, against
`python -c "import mcp"` (the floor any mcp server pays), alternating; then the server's
resident memory after many calls."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tests.bench.context import ROOT, Context, toolbus_script
from tests.bench.report import Figure
from tests.bench.stats import median
from tests.rpc_client import StdioServer, clean_env

RSS_LIMIT_MB = 100
START_ALLOWANCE_S = 0.3


def run(ctx: Context) -> None:
    start_to_initialize(ctx)
    rss_after_calls(ctx)


def _import_mcp() -> float:
    started = time.perf_counter()
    subprocess.run([sys.executable, "-c", "import mcp"], check=True, env=clean_env(), cwd=ROOT)
    return time.perf_counter() - started


def _serve_until_initialized(journal: Path, stderr: Path) -> float:
    argv = [*toolbus_script(), "serve", "--journal", str(journal), "--nvim", "/nonexistent/nvim.sock"]
    started = time.perf_counter()
    with StdioServer(argv, env=clean_env(), stderr=stderr, cwd=ROOT) as server:
        server.initialize(deadline=30)
        elapsed = time.perf_counter() - started
    return elapsed


def start_to_initialize(ctx: Context) -> None:
    journal = ctx.scratch / "startup.db"
    stderr = ctx.scratch / "startup.stderr"
    _serve_until_initialized(journal, stderr)  # creates the journal: later starts open it
    _import_mcp()
    serve: list[float] = []
    imports: list[float] = []
    for index in range(ctx.options.startups):
        pair: list[tuple[str, Callable[[], float]]] = [
            ("serve", lambda: _serve_until_initialized(journal, stderr)),
            ("import", _import_mcp),
        ]
        for name, measure in pair if index % 2 == 0 else pair[::-1]:
            (serve if name == "serve" else imports).append(measure())
    excess = median([s - i for s, i in zip(serve, imports, strict=True)])
    ctx.report.add(
        Figure(
            key="startup.serve_to_initialize",
            summary=f"{median(serve) * 1000:.0f} ms vs import mcp {median(imports) * 1000:.0f} ms: "
            f"{excess * 1000:+.0f} ms",
            target=f"start <= import + {START_ALLOWANCE_S * 1000:.0f} ms",
            met=excess <= START_ALLOWANCE_S,
            measured={"median_s": median(serve), "excess_over_import_s": excess, "runs": len(serve)},
            baseline={"import_mcp_median_s": median(imports)},
        )
    )


def _rss_mb(pid: int) -> dict[str, float]:
    fields: dict[str, float] = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        name, _, value = line.partition(":")
        if name in ("VmRSS", "VmHWM"):
            fields[name] = int(value.split()[0]) / 1024
    return fields


def rss_after_calls(ctx: Context) -> None:
    path = ctx.open_file("rss.py", "value = 0\n")
    calls: list[tuple[str, dict[str, Any]]] = [
        ("checkDocumentDirty", {"filePath": str(path)}),
        ("save", {"title": "RSS probe", "text": "memory after many calls " * 20, "facts": ["a", "b"]}),
        ("getOpenEditors", {}),
        ("saveDocument", {"filePath": str(path)}),
        ("search", {"query": "memory calls", "limit": 5}),
        ("checkDocumentDirty", {"filePath": "relative/path.py"}),  # rejected: an invalid call
    ]
    with ctx.toolbus(ctx.scratch / "rss.db", stderr="rss") as server:
        server.initialize()
        after_start = _rss_mb(server.pid)
        errors: dict[str, int] = {}
        for index in range(ctx.options.rss_calls):
            tool, arguments = calls[index % len(calls)]
            if server.call_tool(tool, arguments).get("isError"):
                errors[tool] = errors.get(tool, 0) + 1
        after_calls = _rss_mb(server.pid)
    rss = after_calls["VmRSS"]
    ctx.report.add(
        Figure(
            key="startup.rss_after_calls",
            summary=f"RSS {rss:.1f} MB after {ctx.options.rss_calls:,} calls "
            f"({after_start['VmRSS']:.1f} MB after start; peak {after_calls['VmHWM']:.1f} MB)",
            target=f"RSS <= {RSS_LIMIT_MB} MB",
            met=rss <= RSS_LIMIT_MB,
            measured={"rss_mb": rss, "peak_mb": after_calls["VmHWM"], "calls": ctx.options.rss_calls}
            | {"rss_after_start_mb": after_start["VmRSS"], "error_results_by_tool": errors},
            note="a mix of editor, memory and invalid calls; error results are expected for the "
            "invalid call (and for search until it is built)",
        )
    )
