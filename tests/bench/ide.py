"""IDE figures: each read tool beyond the seeds, and openDiff's set-up, against the bare no-op.

The read tools run interleaved with the no-op in one block, as the editor section runs its
queries. openDiff's answer waits for the user, so its set-up is timed as the round trip of an
openDiff and a `closeAllDiffTabs` sent right behind it: editor calls take effect in arrival
order, so the close runs once the view is shown and answers after closing it (the no-op pair
beside it is two no-op calls sent the same way).
"""

from __future__ import annotations

import time

from tests.bench.context import Context
from tests.bench.editor import Block, Call, Samples, failed, latency, measure_blocks
from tests.bench.report import Figure
from tests.bench.stats import ms, over_rounds, p50, ratio_over_rounds
from tests.rpc_client import StdioServer

READ_TOOLS = ("getCurrentSelection", "getLatestSelection", "getDiagnostics", "getWorkspaceFolders")
DIFF_WARMUP = 10


def run(ctx: Context) -> None:
    path = ctx.open_file("ide.py", "print('hello')\n" * 40)
    with ctx.toolbus(ctx.scratch / "ide.db") as toolbus, ctx.noop_server() as noop:
        toolbus.initialize()
        noop.initialize()
        block: Block = {"noop": Call(noop, "noop")}
        block |= {tool: Call(toolbus, tool) for tool in READ_TOOLS}
        block["openFile"] = Call(toolbus, "openFile", {"filePath": str(path), "makeFrontmost": False})
        samples = measure_blocks([block], ctx.options.rounds, ctx.options.calls)
        for tool in (*READ_TOOLS, "openFile"):
            _report_read(ctx, tool, samples)
        _report_diff(ctx, _diff_pairs(toolbus, noop, str(path), ctx.options.rounds, ctx.options.calls // 4))


def _report_read(ctx: Context, tool: str, samples: dict[str, Samples]) -> None:
    figures = latency(samples[tool])
    ratio = ratio_over_rounds(samples[tool], samples["noop"])
    ctx.report.add(
        Figure(
            key=f"ide.{tool}_round_trip",
            summary=f"p50 {figures['p50_ms']:.3f} ms: ratio {ratio:.2f} to the no-op",
            target="measured beside the bare no-op",
            met=None,
            measured=figures | {"p50_ratio": ratio},
            baseline=latency(samples["noop"]),
        )
    )


def _diff_pairs(toolbus: StdioServer, noop: StdioServer, path: str, rounds: int, calls: int) -> dict[str, Samples]:
    proposal = {"old_file_path": path, "new_file_path": path, "new_file_contents": "print('bye')\n", "tab_name": "b"}
    pairs: dict[str, tuple[StdioServer, tuple[str, dict[str, str]], tuple[str, dict[str, str]]]] = {
        "openDiff": (toolbus, ("openDiff", proposal), ("closeAllDiffTabs", {})),
        "noop": (noop, ("noop", {}), ("noop", {})),
    }
    samples: dict[str, Samples] = {name: [] for name in pairs}
    for round_index in range(-1, rounds):  # round -1 warms up
        timings: dict[str, list[float]] = {name: [] for name in pairs}
        for _ in range(calls if round_index >= 0 else DIFF_WARMUP):
            for name, (server, first, second) in pairs.items():
                timings[name].append(_pair(server, first, second))
        if round_index >= 0:
            for name, values in timings.items():
                samples[name].append(values)
    return samples


def _pair(server: StdioServer, first: tuple[str, dict[str, str]], second: tuple[str, dict[str, str]]) -> float:
    """Send two calls without waiting; the time until both have answered."""
    started = time.perf_counter()
    ids = [server.send_request("tools/call", {"name": tool, "arguments": args}) for tool, args in (first, second)]
    results = server.wait_for_all(ids, deadline=30)
    elapsed = time.perf_counter() - started
    for (tool, _), result in zip((first, second), results, strict=True):
        if failed(result):
            raise RuntimeError(f"{tool} failed during the benchmark: {result}")
    return elapsed


def _report_diff(ctx: Context, samples: dict[str, Samples]) -> None:
    diff = ms(over_rounds(samples["openDiff"], p50))
    noop = ms(over_rounds(samples["noop"], p50))
    ratio = ratio_over_rounds(samples["openDiff"], samples["noop"])
    ctx.report.add(
        Figure(
            key="ide.openDiff_setup_round_trip",
            summary=f"openDiff shown then closed: p50 {diff:.3f} ms vs two no-ops {noop:.3f} ms: ratio {ratio:.2f}",
            target="measured beside the bare no-op",
            met=None,
            measured={"p50_ms": diff, "p50_ratio": ratio},
            baseline={"p50_ms": noop},
            note="openDiff and closeAllDiffTabs sent together; the close runs after the view is shown",
        )
    )
