"""Benchmark figures: one JSON object on stdout, a short table on stderr."""

from __future__ import annotations

import json
import math
import sys
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, TextIO

# What JSON can hold. Figures take any mapping of it, so a dict[str, float] is a fine measurement.
Value = float | int | str | bool | None | Mapping[str, "Value"] | Sequence["Value"]


@dataclass
class Figure:
    """One measured figure, its baseline measured side by side, and its target."""

    key: str  # stable name in the JSON, e.g. "editor.checkDocumentDirty"
    summary: str  # one line for the table: what was measured, e.g. "p50 2.01 ms, p99 3.2 ms"
    target: str  # the target as the issue states it
    met: bool | None  # None: nothing to compare (skipped, or informational)
    measured: Mapping[str, Value] = field(default_factory=dict)
    baseline: Mapping[str, Value] = field(default_factory=dict)
    note: str = ""


@dataclass
class Report:
    settings: dict[str, Value]
    environment: Mapping[str, Value]
    figures: list[Figure] = field(default_factory=list)

    def add(self, figure: Figure) -> Figure:
        self.figures.append(figure)
        print(f"  {figure.key}: {figure.summary} [{_verdict(figure)}]", file=sys.stderr, flush=True)
        return figure

    def skip(self, key: str, target: str, why: str) -> Figure:
        return self.add(Figure(key=key, summary=f"skipped: {why}", target=target, met=None, note=why))

    def as_json(self) -> dict[str, Any]:
        return {
            "settings": self.settings,
            "environment": self.environment,
            "figures": {f.key: _clean(asdict(f)) for f in self.figures},
            "met": [f.key for f in self.figures if f.met is True],
            "missed": [f.key for f in self.figures if f.met is False],
            "not_judged": [f.key for f in self.figures if f.met is None],
        }

    def print_json(self, out: TextIO = sys.stdout) -> None:
        json.dump(self.as_json(), out, indent=2, ensure_ascii=False)
        out.write("\n")

    def print_table(self, out: TextIO = sys.stderr) -> None:
        rows = [("figure", "measured", "target", "verdict")]
        rows += [(f.key, f.summary, f.target, _verdict(f)) for f in self.figures]
        widths = [max(len(row[i]) for row in rows) for i in range(4)]
        out.write("\n")
        for index, row in enumerate(rows):
            out.write("  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip())
            out.write("\n")
            if index == 0:
                out.write("  ".join("-" * width for width in widths) + "\n")


def _verdict(figure: Figure) -> str:
    return {True: "met", False: "MISSED", None: "-"}[figure.met]


def _clean(value: Any) -> Any:
    """NaN is not JSON: report it as null."""
    if isinstance(value, float):
        return None if math.isnan(value) else round(value, 4)
    if isinstance(value, dict):
        return {k: _clean(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_clean(v) for v in value]
    return value
