"""The composition root: the one place that picks the journal's backend and wires it, the
editor and the handlers into a bus, for `serve` and for every command."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from toolbus.adapters.config import Identity, Settings, local_identity
from toolbus.adapters.files import LocalFiles
from toolbus.bus import CLI_COMMANDS, TOOL_COMMANDS, Bus, JournalReader
from toolbus.journal.sqlite import JournalTexts, SqliteJournal, SqliteMemoryStore, SqliteReader
from toolbus.journal.sqlite.readonly import require_journal

if TYPE_CHECKING:  # psycopg loads only for a team journal, pynvim and asyncio only for an editor
    from toolbus.adapters.nvim import NvimEditor
    from toolbus.handlers import Editor, Files, MemoryStore, Texts
    from toolbus.journal.postgres import PostgresJournal


@dataclass(frozen=True, slots=True)
class Services:
    """The collaborators handlers reach through `context.services`."""

    editor: Editor
    memory: MemoryStore
    files: Files
    texts: Texts


def open_writer(settings: Settings, *, create: bool = True) -> SqliteJournal | PostgresJournal:
    """The journal to append to. Without `create`, only an existing toolbus journal is opened:
    a command pointed at the wrong file never migrates a stranger's database. A team journal
    is never created here: its admin runs `toolbus journal init`."""
    if isinstance(settings.journal, str):
        from toolbus.journal.postgres import PostgresJournal

        return PostgresJournal(settings.journal, settings.journal_busy_timeout)
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
    if isinstance(settings.journal, str):
        from toolbus.journal.postgres import PostgresReader

        return PostgresReader(settings.journal)
    return SqliteReader(settings.journal, settings.journal_busy_timeout)


class TeamLogin(Protocol):
    """What a team journal's writer or reader knows of its login."""

    location: str
    agent: str
    department: str | None
    administers: bool


def identity(settings: Settings, journal: SqliteJournal | TeamLogin) -> Identity:
    """Who the journal records as the caller. A local journal believes `--agent` and
    `--department`; a team journal knows its login: the role is the agent, the admin's table
    gives the department, and a different `--agent` or `--department` is refused."""
    if isinstance(journal, SqliteJournal):
        return local_identity(settings)
    if journal.department is None and journal.administers:
        raise ValueError(
            f"the role {journal.agent!r} administers the team journal at {journal.location}; it is no agent, "
            "so no call can be recorded in its name: run this with an agent's login (its admin registers "
            "one with `toolbus journal agent URL ROLE --department NAME`). This login reads every call "
            "with `toolbus audit` and `toolbus history`"
        )
    if journal.department is None:
        raise ValueError(
            f"the role {journal.agent!r} is not an agent of the team journal at {journal.location}: "
            f"its admin registers it with `toolbus journal agent URL {journal.agent} --department NAME`"
        )
    require_login_options(settings, journal)
    return Identity(journal.agent, journal.department, from_login=True)


def require_login_options(settings: Settings, journal: TeamLogin) -> None:
    """Refuse an `--agent` or `--department` other than the team journal's login's."""
    for option, given, known, whose in (
        ("--agent", settings.agent, journal.agent, "the role this login connects as"),
        ("--department", settings.department, journal.department, "the department the admin registered for it"),
    ):
        if given is not None and given != known:
            raise ValueError(
                f"{option} {given!r} does not match {whose} ({known!r}): on a team journal the agent is "
                "the role you connect as, and its department is the admin's to set"
            )


def build_bus(
    settings: Settings, journal: SqliteJournal | PostgresJournal, editor: Editor | None = None, *, cli: bool = False
) -> Bus:
    """The bus for `serve` (the MCP tools), or with `cli` also the commands only the command
    line runs (`recover --apply`, `replay editor`)."""
    from toolbus.handlers import HANDLERS

    if editor is None:
        from toolbus.adapters.nvim import NvimEditor, find_nvim

        editor = NvimEditor(lambda: find_nvim(settings.nvim), settings.nvim_timeout)
    memory: MemoryStore
    texts: Texts
    if isinstance(journal, SqliteJournal):
        memory, texts = SqliteMemoryStore(journal), JournalTexts(journal)
    else:
        from toolbus.journal.postgres import PostgresMemoryStore, PostgresTexts

        memory, texts = PostgresMemoryStore(journal), PostgresTexts(journal)
    services = Services(editor=editor, memory=memory, files=LocalFiles(), texts=texts)
    commands = TOOL_COMMANDS + CLI_COMMANDS if cli else TOOL_COMMANDS
    return Bus({cmd.tool: cmd for cmd in commands}, HANDLERS, journal, services)


def neovim_at(address: str, timeout: float) -> NvimEditor:
    """The editor at an address given on the command line (`replay editor --nvim`)."""
    from toolbus.adapters.nvim import NvimAddress, NvimEditor

    return NvimEditor(lambda: NvimAddress(address, "--nvim"), timeout)
