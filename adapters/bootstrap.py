"""The composition root: the one place that picks the journal's backend and wires it, the
editor and the handlers into a bus, for `serve` and for every command."""

from __future__ import annotations

from dataclasses import dataclass

from toolbus.adapters.config import Settings
from toolbus.adapters.files import LocalFiles
from toolbus.adapters.nvim import NvimAddress, NvimEditor, find_nvim
from toolbus.bus import TOOL_COMMANDS, Bus, Command, JournalReader, ReplayClose, ReplayWrite, RestoreFile
from toolbus.handlers import HANDLERS, Editor, Files, MemoryStore, Texts
from toolbus.journal.sqlite import JournalTexts, SqliteJournal, SqliteMemoryStore, SqliteReader
from toolbus.journal.sqlite.readonly import require_journal

# Commands only the command line runs: never listed as MCP tools.
CLI_COMMANDS: tuple[type[Command], ...] = (RestoreFile, ReplayWrite, ReplayClose)


@dataclass(frozen=True, slots=True)
class Services:
    """The collaborators handlers reach through `context.services`."""

    editor: Editor
    memory: MemoryStore
    files: Files
    texts: Texts


def open_writer(settings: Settings, *, create: bool = True) -> SqliteJournal:
    """The journal to append to. Without `create`, only an existing toolbus journal is opened:
    a command pointed at the wrong file never migrates a stranger's database."""
    if not create:
        require_journal(settings.journal)
    return SqliteJournal(
        settings.journal,
        busy_timeout=settings.journal_busy_timeout,
        synchronous=settings.journal_sync,
        create=create,
    )


def open_reader(settings: Settings) -> JournalReader:
    """The journal to read: never created, migrated or written."""
    return SqliteReader(settings.journal, settings.journal_busy_timeout)


def build_bus(settings: Settings, journal: SqliteJournal, editor: Editor | None = None, *, cli: bool = False) -> Bus:
    """The bus for `serve` (the MCP tools), or with `cli` also the commands only the command
    line runs (`recover --apply`, `replay editor`)."""
    editor = editor or NvimEditor(lambda: find_nvim(settings.nvim), settings.nvim_timeout)
    services = Services(
        editor=editor, memory=SqliteMemoryStore(journal), files=LocalFiles(), texts=JournalTexts(journal)
    )
    commands = TOOL_COMMANDS + CLI_COMMANDS if cli else TOOL_COMMANDS
    return Bus({cmd.tool: cmd for cmd in commands}, HANDLERS, journal, services)


def neovim_at(address: str, timeout: float) -> NvimEditor:
    """The editor at an address given on the command line (`replay editor --nvim`)."""
    return NvimEditor(lambda: NvimAddress(address, "--nvim"), timeout)
