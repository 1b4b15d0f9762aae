"""The composition root: the one place that wires adapters into the bus."""

from __future__ import annotations

from dataclasses import dataclass

from adapters.config import Settings
from adapters.nvim import NvimEditor, find_nvim
from bus import TOOL_COMMANDS, Bus
from handlers import HANDLERS, Editor, MemoryStore
from journal import SqliteJournal
from journal.memory import SqliteMemoryStore


@dataclass(frozen=True, slots=True)
class Services:
    """The collaborators handlers reach through `context.services`."""

    editor: Editor
    memory: MemoryStore


def open_journal(settings: Settings, *, create: bool = True) -> SqliteJournal:
    return SqliteJournal(
        settings.journal,
        busy_timeout=settings.journal_busy_timeout,
        synchronous=settings.journal_sync,
        create=create,
    )


def build_bus(settings: Settings, journal: SqliteJournal, editor: Editor | None = None) -> Bus:
    editor = editor or NvimEditor(lambda: find_nvim(settings.nvim), settings.nvim_timeout)
    services = Services(editor=editor, memory=SqliteMemoryStore(journal))
    return Bus({cmd.tool: cmd for cmd in TOOL_COMMANDS}, HANDLERS, journal, services)
