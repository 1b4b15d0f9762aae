"""The composition root: the one place that wires adapters into the bus."""

from __future__ import annotations

from dataclasses import dataclass

from toolbus.adapters.config import Settings
from toolbus.adapters.files import LocalFiles
from toolbus.adapters.nvim import NvimEditor, find_nvim
from toolbus.bus import TOOL_COMMANDS, Bus, Command, RestoreFile
from toolbus.handlers import HANDLERS, Editor, Files, MemoryStore, Texts
from toolbus.journal import SqliteJournal
from toolbus.journal.sqlite.audit import JournalTexts
from toolbus.journal.sqlite.memory import SqliteMemoryStore

# Commands only the command line runs: never listed as MCP tools.
CLI_COMMANDS: tuple[type[Command], ...] = (RestoreFile,)


@dataclass(frozen=True, slots=True)
class Services:
    """The collaborators handlers reach through `context.services`."""

    editor: Editor
    memory: MemoryStore
    files: Files
    texts: Texts


def open_journal(settings: Settings, *, create: bool = True) -> SqliteJournal:
    return SqliteJournal(
        settings.journal,
        busy_timeout=settings.journal_busy_timeout,
        synchronous=settings.journal_sync,
        create=create,
    )


def build_bus(
    settings: Settings, journal: SqliteJournal, editor: Editor | None = None, *, cli: bool = False
) -> Bus:
    """The bus for `serve` (the MCP tools), or with `cli` also the commands only the command
    line runs (`toolbus recover --apply`)."""
    editor = editor or NvimEditor(lambda: find_nvim(settings.nvim), settings.nvim_timeout)
    services = Services(
        editor=editor, memory=SqliteMemoryStore(journal), files=LocalFiles(), texts=JournalTexts(journal)
    )
    commands = TOOL_COMMANDS + CLI_COMMANDS if cli else TOOL_COMMANDS
    return Bus({cmd.tool: cmd for cmd in commands}, HANDLERS, journal, services)
