"""The event log behind the journal ports: one subpackage per backend (`sqlite`), and what
every backend shares (the editor steps a replay re-applies, what an event lets one recover).

Names load on first use: a command that only needs `journal.location` (every command, to read
its settings) does not pay for the SQLite backend's import."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from toolbus.journal.location import default_journal_path
    from toolbus.journal.recovery import Recoverable, recoverable
    from toolbus.journal.replay import EditorStep, PathMap, check_path_map, editor_steps, map_path, parse_path_map
    from toolbus.journal.sqlite import SCHEMA_VERSION, SqliteJournal

_HOMES = {
    "SCHEMA_VERSION": "toolbus.journal.sqlite",
    "EditorStep": "toolbus.journal.replay",
    "PathMap": "toolbus.journal.replay",
    "Recoverable": "toolbus.journal.recovery",
    "SqliteJournal": "toolbus.journal.sqlite",
    "check_path_map": "toolbus.journal.replay",
    "default_journal_path": "toolbus.journal.location",
    "editor_steps": "toolbus.journal.replay",
    "map_path": "toolbus.journal.replay",
    "parse_path_map": "toolbus.journal.replay",
    "recoverable": "toolbus.journal.recovery",
}
__all__ = [
    "SCHEMA_VERSION",
    "EditorStep",
    "PathMap",
    "Recoverable",
    "SqliteJournal",
    "check_path_map",
    "default_journal_path",
    "editor_steps",
    "map_path",
    "parse_path_map",
    "recoverable",
]


if not TYPE_CHECKING:  # for mypy, the imports above: a misspelt name stays an error

    def __getattr__(name: str) -> Any:
        home = _HOMES.get(name)
        if home is None:
            raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(home), name)
        globals()[name] = value  # found once
        return value

    def __dir__() -> list[str]:
        return sorted(set(globals()) | set(__all__))
