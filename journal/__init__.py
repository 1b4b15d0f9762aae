"""The event log behind the journal ports: one subpackage per backend (`sqlite`), and what
every backend shares (the editor steps a replay re-applies, what an event lets one recover)."""

from toolbus.journal.recovery import Recoverable, recoverable
from toolbus.journal.replay import EditorStep, PathMap, check_path_map, editor_steps, map_path, parse_path_map
from toolbus.journal.sqlite import SCHEMA_VERSION, SqliteJournal, default_journal_path

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
