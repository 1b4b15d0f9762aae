"""Commands: one msgspec Struct per MCP tool, with the tool's published schema beside it.

Decoding a tool's arguments into its Struct *is* the argument check (see `decode_command`).
"""

from __future__ import annotations

import os
from functools import cached_property
from typing import Annotated, Any, ClassVar, Literal, get_args
from urllib.parse import unquote, urlsplit

import msgspec

ObservationType = Literal["decision", "bugfix", "feature", "refactor", "discovery", "change"]
Visibility = Literal["private", "department", "project", "public"]
OrderBy = Literal["relevance", "date_desc", "date_asc"]

# One bound for every free-text argument: big enough for any real document or note,
# small enough that one call cannot balloon the journal or the server's memory.
MAX_TEXT_BYTES = 1_000_000
Text = Annotated[str, msgspec.Meta(min_length=1, max_length=MAX_TEXT_BYTES)]
ShortText = Annotated[str, msgspec.Meta(max_length=4096)]
# What a journal's integer holds (SQLite's INTEGER, PostgreSQL's bigint): a larger number is an
# invalid argument, not an OverflowError deep in a query.
SQLITE_INT_MIN, SQLITE_INT_MAX = -(2**63), 2**63 - 1
SqliteInt = Annotated[int, msgspec.Meta(ge=SQLITE_INT_MIN, le=SQLITE_INT_MAX)]


class ToolHints(msgspec.Struct, frozen=True, kw_only=True):
    """What a tool does to the world, published as its MCP annotations: clients such as Claude
    Code run read-only tools without asking, and several at once."""

    title: str
    read_only: bool
    destructive: bool = False  # may it destroy something (not only add)? Meaningful if not read_only
    idempotent: bool  # does a second identical call change nothing more?
    # Every tool works on this machine's Neovim and journal (or the team's database): a closed
    # world, never the web.
    open_world: bool = False


def _reads(title: str) -> ToolHints:
    return ToolHints(title=title, read_only=True, idempotent=True)


class Command(msgspec.Struct, frozen=True, kw_only=True):
    """A tool call, validated. `tool` is the MCP tool name; `schema` its inputSchema;
    `hints` its MCP annotations (MCP tools only)."""

    tool: ClassVar[str]
    description: ClassVar[str]
    schema: ClassVar[dict[str, Any]]
    hints: ClassVar[ToolHints]
    # Commands that change the world: their records are durable on disk before the reply;
    # a query's is committed, and reaches the disk within a second.
    mutates: ClassVar[bool] = False
    # ...and of those, the ones whose change happens outside the journal (in Neovim, on disk):
    # their handlers call `HandlerContext.write_ahead` before they act.
    acts_outside: ClassVar[bool] = False
    # Calls to the editor take effect in the order they arrive (the MCP edge sees to it).
    editor: ClassVar[bool] = False


def typed_path(value: str) -> str:
    """A path as a person typed it on the command line: `~` expanded, relative to the current
    directory (refused if that was removed: nothing can be relative to it)."""
    try:
        return os.path.abspath(os.path.expanduser(value))
    except FileNotFoundError:  # os.getcwd(): the current directory is gone
        raise ValueError(
            f"{value!r} is relative, and the current directory no longer exists: give an absolute path"
        ) from None


# Unicode's Default_Ignorable_Code_Point (DerivedCoreProperties.txt, which Python does not
# expose): characters a font shows as nothing. Format characters that show (U+06DD ARABIC END
# OF AYAH, the Egyptian controls) are not among them; the Hangul fillers, which show as space, are.
_IGNORABLE = (
    (0x00AD, 0x00AD), (0x034F, 0x034F), (0x061C, 0x061C), (0x115F, 0x1160), (0x17B4, 0x17B5),
    (0x180B, 0x180F), (0x200B, 0x200F), (0x202A, 0x202E), (0x2060, 0x206F), (0x3164, 0x3164),
    (0xFE00, 0xFE0F), (0xFEFF, 0xFEFF), (0xFFA0, 0xFFA0), (0xFFF0, 0xFFF8), (0x1BCA0, 0x1BCA3),
    (0x1D173, 0x1D17A), (0xE0000, 0xE0FFF),
)  # fmt: skip


def _shows_nothing(char: str) -> bool:
    code = ord(char)
    return char.isspace() or any(low <= code <= high for low, high in _IGNORABLE)


def blank(text: str) -> bool:
    """Whether `text` shows nothing: only whitespace and characters a font draws as nothing (a
    zero-width space, a byte order mark, a soft hyphen), which no word is made of."""
    return all(_shows_nothing(char) for char in text)


def without_nul(field: str, value: str) -> str:
    """`value`, refused if it holds a NUL: no file or buffer name can, and the C calls that
    resolve names would stop at it, taking `a.txt\\0.orig` for `a.txt`."""
    if "\0" in value:
        raise ValueError(f"{field}: expected a name without NUL characters (\\u0000)")
    return value


def absolute_path(field: str, value: str) -> str:
    """`~` expanded, then required to be absolute."""
    expanded = os.path.expanduser(without_nul(field, value))
    if not os.path.isabs(expanded):
        raise ValueError(f'{field}: expected an absolute path, got "{value}"')
    return expanded


class FileCommand(Command, frozen=True, kw_only=True, dict=True):
    """A command on one file, named by an absolute path (`~` allowed) in its `path_field`.

    The path is checked and expanded once, when the command is decoded; handlers use `file`.
    The field keeps the caller's spelling, for answers that echo it.
    """

    path_field: ClassVar[str]

    @cached_property
    def file(self) -> str:
        """The file's absolute path, `~` expanded (symlinks are the editor's to resolve)."""
        return absolute_path(self.path_field, getattr(self, self.path_field))

    def __post_init__(self) -> None:
        self.file  # noqa: B018  (the check, and the one expansion, happen at decoding)


def file_uri_path(field: str, value: str) -> str:
    """The absolute path a `file://` URI names (percent-decoded)."""
    parts = urlsplit(value)
    path = without_nul(field, unquote(parts.path))
    if parts.scheme != "file" or parts.netloc not in ("", "localhost") or not os.path.isabs(path):
        raise ValueError(f'{field}: expected a file:// URI of an absolute path, got "{value}"')
    return path


_NO_INPUT: dict[str, Any] = {"type": "object", "properties": {}}


def _file_path_schema(description: str) -> dict[str, Any]:
    return {
        "type": "object",
        "properties": {"filePath": {"type": "string", "description": description}},
        "required": ["filePath"],
    }


# --- editor ----------------------------------------------------------------------------


class GetOpenEditors(Command, frozen=True, kw_only=True):
    tool = "getOpenEditors"
    editor = True
    description = "Get the list of currently open editors (buffers) in Neovim"
    schema: ClassVar[dict[str, Any]] = _NO_INPUT
    hints = _reads("Open editors")


class CheckDocumentDirty(FileCommand, frozen=True, kw_only=True):
    tool = "checkDocumentDirty"
    editor = True
    description = "Check if a document has unsaved changes (is dirty)"
    schema: ClassVar[dict[str, Any]] = _file_path_schema("Absolute path of the file to check")
    hints = _reads("Check for unsaved changes")

    path_field = "filePath"
    filePath: ShortText


class SaveDocument(FileCommand, frozen=True, kw_only=True):
    tool = "saveDocument"
    editor = True
    description = "Save a document with unsaved changes"
    schema: ClassVar[dict[str, Any]] = _file_path_schema("Absolute path of the file to save")
    # Destructive: the write replaces the file's text on disk, which is not an additive change.
    # The journal keeps the replaced text (`toolbus recover` brings it back), but a client
    # cannot know that, and the hint describes the effect on the file, not toolbus's undo.
    # Idempotent: saving again writes the same text.
    hints = ToolHints(title="Save document", read_only=False, destructive=True, idempotent=True)
    mutates = True
    acts_outside = True

    path_field = "filePath"
    filePath: ShortText


class CloseTab(Command, frozen=True, kw_only=True):
    tool = "close_tab"
    editor = True
    description = ""
    schema: ClassVar[dict[str, Any]] = {
        "type": "object",
        "properties": {"tab_name": {"type": "string"}},
        "required": ["tab_name"],
    }
    # Wipes a buffer, unsaved changes and all (kept in the journal, gone from the editor). A
    # second call finds nothing left to close.
    hints = ToolHints(title="Close tab", read_only=False, destructive=True, idempotent=True)
    mutates = True
    acts_outside = True

    tab_name: Annotated[str, msgspec.Meta(min_length=1, max_length=4096)]

    def __post_init__(self) -> None:
        without_nul("tab_name", self.tab_name)


# --- IDE tools beyond the seeds ---------------------------------------------------------

LineNumber = Annotated[int, msgspec.Meta(ge=1, le=2**31 - 1)]  # 1-based; Neovim's lines are int32


class GetCurrentSelection(Command, frozen=True, kw_only=True):
    tool = "getCurrentSelection"
    editor = True
    description = "Get the current text selection in Neovim (the cursor, with empty text, if nothing is selected)"
    schema: ClassVar[dict[str, Any]] = _NO_INPUT
    hints = _reads("Current selection")


class GetLatestSelection(Command, frozen=True, kw_only=True):
    tool = "getLatestSelection"
    editor = True
    description = "Get the most recent text selection made in any file in Neovim, even if the user has moved on"
    schema: ClassVar[dict[str, Any]] = _NO_INPUT
    hints = _reads("Latest selection")


class GetDiagnostics(Command, frozen=True, kw_only=True, dict=True):
    tool = "getDiagnostics"
    editor = True
    description = (
        "Get diagnostics (errors, warnings, hints) from Neovim, from LSP or any other source, "
        "for one file (uri) or for every open file"
    )
    schema: ClassVar[dict[str, Any]] = {
        "type": "object",
        "properties": {
            "uri": {"type": "string", "description": "file:// URI of an open file; omit for every open file"}
        },
    }
    hints = _reads("Diagnostics")

    uri: ShortText | None = None

    @cached_property
    def file(self) -> str | None:
        """The absolute path `uri` names; None for every file."""
        return None if self.uri is None else file_uri_path("uri", self.uri)

    def __post_init__(self) -> None:
        self.file  # noqa: B018  (checked at decoding, as FileCommand does)


class GetWorkspaceFolders(Command, frozen=True, kw_only=True):
    tool = "getWorkspaceFolders"
    editor = True
    description = "Get Neovim's working directory and the workspace folders of its attached LSP clients"
    schema: ClassVar[dict[str, Any]] = _NO_INPUT
    hints = _reads("Workspace folders")


class OpenFile(FileCommand, frozen=True, kw_only=True):
    tool = "openFile"
    editor = True
    description = (
        "Open a file in Neovim's main editor window and optionally select a range: lines "
        "startLine-endLine, or from startText to the first endText after it"
    )
    schema: ClassVar[dict[str, Any]] = {
        "type": "object",
        "properties": {
            "filePath": {"type": "string", "description": "Absolute path of the file to open"},
            "preview": {"type": "boolean", "description": "Accepted and ignored: Neovim has no preview tabs"},
            "startLine": {"type": "integer", "minimum": 1, "description": "First line to select (1-based)"},
            "endLine": {"type": "integer", "minimum": 1, "description": "Last line to select (default: startLine)"},
            "startText": {"type": "string", "description": "Select from the first occurrence of this text"},
            "endText": {"type": "string", "description": "Select to the end of its first occurrence after startText"},
            "selectToEndOfLine": {"type": "boolean", "description": "Extend the selection to the end of its line"},
            "makeFrontmost": {
                "type": "boolean",
                "description": "Show the file (default true); false loads it without changing any window",
            },
        },
        "required": ["filePath"],
    }
    # It changes what the user sees (window, cursor, selection), never a file or a buffer's
    # text: not read-only, not destructive, and the same call twice shows the same thing.
    hints = ToolHints(title="Open file", read_only=False, destructive=False, idempotent=True)
    # Not `mutates`: there is nothing to write ahead, recover or replay in a view, so it is
    # journaled as queries are, with its outcome, before the answer.

    path_field = "filePath"
    filePath: ShortText
    preview: bool = False
    startLine: LineNumber | None = None
    endLine: LineNumber | None = None
    # Empty texts mean none: clients that follow VS Code's schema, where both are required, send "".
    startText: ShortText | None = None
    endText: ShortText | None = None
    selectToEndOfLine: bool = False
    makeFrontmost: bool = True


class OpenDiff(FileCommand, frozen=True, kw_only=True, dict=True):
    tool = "openDiff"
    editor = True
    description = (
        "Open a side-by-side diff in Neovim of a file's current text against a proposal, and wait for "
        "the user: accepting (:w in the proposal) writes the proposal, with the user's edits, to "
        "new_file_path and answers FILE_SAVED and the text; rejecting (closing it) answers DIFF_REJECTED"
    )
    schema: ClassVar[dict[str, Any]] = {
        "type": "object",
        "properties": {
            "old_file_path": {"type": "string", "description": "Absolute path of the file to compare against"},
            "new_file_path": {"type": "string", "description": "Absolute path the accepted text is written to"},
            "new_file_contents": {"type": "string", "description": "The proposed text of the file"},
            "tab_name": {"type": "string", "description": "Name of the diff view (unique among waiting diffs)"},
        },
        "required": ["old_file_path", "new_file_path", "new_file_contents", "tab_name"],
    }
    # Destructive: an accepted proposal replaces the file's text (the journal keeps the old one).
    # Not idempotent: each call asks the user again, and each decision is its own.
    hints = ToolHints(title="Open diff", read_only=False, destructive=True, idempotent=False)
    mutates = True
    acts_outside = True

    path_field = "new_file_path"
    old_file_path: ShortText
    new_file_path: ShortText
    # May be empty: a proposal to empty a file.
    new_file_contents: Annotated[str, msgspec.Meta(max_length=MAX_TEXT_BYTES)]
    tab_name: Annotated[str, msgspec.Meta(min_length=1, max_length=4096)]

    @cached_property
    def old_file(self) -> str:
        return absolute_path("old_file_path", self.old_file_path)

    def __post_init__(self) -> None:
        self.file  # noqa: B018  (checked at decoding, as FileCommand does)
        self.old_file  # noqa: B018
        without_nul("tab_name", self.tab_name)


class CloseAllDiffTabs(Command, frozen=True, kw_only=True):
    tool = "closeAllDiffTabs"
    editor = True
    description = "Close every diff view toolbus opened in Neovim (rejecting the proposals still waiting)"
    schema: ClassVar[dict[str, Any]] = _NO_INPUT
    # Closing a waiting diff rejects it: a decision, written ahead like other changes. A second
    # call finds none left.
    hints = ToolHints(title="Close all diff tabs", read_only=False, destructive=True, idempotent=True)
    mutates = True
    acts_outside = True


# --- the command line -------------------------------------------------------------------

BlobHash = Annotated[str, msgspec.Meta(pattern="^[0-9a-f]{64}$")]


class _RecordedFileChange(FileCommand, frozen=True, kw_only=True):
    """A command-line command that changes a file as a recorded event (`event`) did."""

    mutates = True
    acts_outside = True

    path_field = "path"
    path: ShortText
    event: Annotated[int, msgspec.Meta(ge=1)]


class RestoreFile(_RecordedFileChange, frozen=True, kw_only=True):
    """`toolbus recover --apply`: write a text the journal keeps back to a file. Not an MCP
    tool (it is not in `TOOL_COMMANDS`): only the command line runs it."""

    tool = "recover"
    description = "Write a text the journal keeps (a replaced or discarded text) back to its file"
    schema: ClassVar[dict[str, Any]] = {
        "type": "object",
        "properties": {
            "path": {"type": "string", "description": "Absolute path of the file to write"},
            "blob": {"type": "string", "description": "SHA-256 of the journal's text to write"},
            "event": {"type": "integer", "minimum": 1, "description": "Position of the event it comes from"},
            "event_id": {"type": "string", "description": "That event's id"},
        },
        "required": ["path", "blob", "event"],
    }

    blob: BlobHash
    event_id: ShortText | None = None


class ReplayWrite(_RecordedFileChange, frozen=True, kw_only=True):
    """`toolbus replay editor`: write a recorded text to a file through Neovim. Command line only."""

    tool = "replay_write"
    description = "Write a text the journal recorded to a file, through Neovim, and show it there"
    schema: ClassVar[dict[str, Any]] = {
        "type": "object",
        "properties": {
            "path": {"type": "string", "description": "Absolute path of the file to write"},
            "blob": {"type": "string", "description": "SHA-256 of the journal's text to write"},
            "event": {"type": "integer", "minimum": 1, "description": "Position of the event it replays"},
            "known": {"type": "array", "items": {"type": "string"}, "description": "Texts the file may hold"},
        },
        "required": ["path", "blob", "event"],
    }

    blob: BlobHash
    known: list[BlobHash] = []


class ReplayClose(_RecordedFileChange, frozen=True, kw_only=True):
    """`toolbus replay editor`: close a file's buffer in Neovim, as a recorded close did."""

    tool = "replay_close"
    description = "Close a file's buffer in Neovim unless it has unsaved changes"
    schema: ClassVar[dict[str, Any]] = {
        "type": "object",
        "properties": {
            "path": {"type": "string", "description": "Absolute path of the file to close"},
            "event": {"type": "integer", "minimum": 1, "description": "Position of the event it replays"},
        },
        "required": ["path", "event"],
    }


# --- memory ----------------------------------------------------------------------------

_OBSERVATION_TYPES = list(get_args(ObservationType))
_VISIBILITIES = list(get_args(Visibility))


# What an observation's record holds that no save names: the answer's, and get_observations'.
STORE_SET_FIELDS = ("id", "created_at_epoch")


class SaveObservation(Command, frozen=True, kw_only=True):
    tool = "save"
    description = (
        "Save observation to memory. Params: title (required), text (required), type, project, "
        "memory_session_id, facts[], concepts[], agent, department, visibility"
    )
    schema: ClassVar[dict[str, Any]] = {
        "type": "object",
        "properties": {
            "title": {"type": "string", "description": "Observation title"},
            "text": {"type": "string", "description": "Observation content/narrative"},
            "type": {
                "type": "string",
                "enum": _OBSERVATION_TYPES,
                "description": "Observation type (default: discovery)",
            },
            "project": {"type": "string", "description": "Project name (default: manual)"},
            "memory_session_id": {"type": "string", "description": "Session ID for grouping related saves"},
            "facts": {"type": "array", "items": {"type": "string"}, "description": "Key facts"},
            "concepts": {"type": "array", "items": {"type": "string"}, "description": "Related concepts"},
            "agent": {"type": "string", "description": "Agent identifier (default: legacy)"},
            "department": {"type": "string", "description": "Department name (default: default)"},
            "visibility": {
                "type": "string",
                "enum": _VISIBILITIES,
                "description": "Visibility level (default: project)",
            },
        },
        "required": ["title", "text"],
        "additionalProperties": True,
    }
    # Adds an observation and never changes one: not destructive; each call adds another.
    hints = ToolHints(title="Save to memory", read_only=False, destructive=False, idempotent=False)
    mutates = True

    title: Annotated[str, msgspec.Meta(min_length=1, max_length=4096)]
    text: Text
    type: ObservationType = "discovery"
    project: Annotated[str, msgspec.Meta(min_length=1, max_length=256)] = "manual"
    memory_session_id: Annotated[str, msgspec.Meta(min_length=1, max_length=256)] | None = None
    facts: Annotated[list[Annotated[str, msgspec.Meta(max_length=MAX_TEXT_BYTES)]], msgspec.Meta(max_length=1000)] = []
    concepts: Annotated[list[Annotated[str, msgspec.Meta(max_length=4096)]], msgspec.Meta(max_length=1000)] = []
    agent: Annotated[str, msgspec.Meta(min_length=1, max_length=256)] | None = None
    department: Annotated[str, msgspec.Meta(min_length=1, max_length=256)] | None = None
    visibility: Visibility = "project"
    # Fields the schema does not name (files_read, files_modified, ...), kept verbatim.
    extra: dict[str, Any] = {}

    def __post_init__(self) -> None:
        for name in STORE_SET_FIELDS:
            if name in self.extra:  # kept, it would never be shown: the store's value takes its place
                raise ValueError(f"{name}: set by the store when it adds the observation, not by save")
        if self.extra and len(msgspec.json.encode(self.extra)) > MAX_TEXT_BYTES:
            raise ValueError(f"extra fields: expected at most {MAX_TEXT_BYTES} bytes of JSON in all")
        for name, texts in (("facts", self.facts), ("concepts", self.concepts)):
            if (given := sum(map(len, texts))) > MAX_TEXT_BYTES:
                raise ValueError(f"{name}: expected at most {MAX_TEXT_BYTES} characters in all, got {given}")


# One JSON type per schema node (`anyOf` for two): strict clients reject a list-valued `type`.
_DATE_TYPES: list[dict[str, Any]] = [{"type": "string"}, {"type": "integer"}]


class SearchObservations(Command, frozen=True, kw_only=True):
    tool = "search"
    description = (
        "Search memory. All words must match (any order) across title, text, facts and concepts; "
        '"quoted phrases" match as phrases. Params: query, limit (default 20, max 100), offset, '
        "project, type (one or comma list), dateStart, dateEnd (ISO date or epoch ms), "
        "orderBy (relevance|date_desc|date_asc). Returns index rows; fetch full text with get_observations"
    )
    schema: ClassVar[dict[str, Any]] = {
        "type": "object",
        "properties": {
            "query": {"type": "string", "description": 'Words and "quoted phrases" to find'},
            "limit": {
                "type": "integer",
                "minimum": 1,
                "maximum": 100,
                "description": "Max rows (default 20)",
            },
            "offset": {"type": "integer", "minimum": 0, "description": "Rows to skip (default 0)"},
            "project": {"type": "string", "description": "Only this project"},
            "type": {"type": "string", "description": "Observation type, or a comma list of types"},
            "dateStart": {"anyOf": _DATE_TYPES, "description": "From this ISO date or epoch ms"},
            "dateEnd": {"anyOf": _DATE_TYPES, "description": "Up to this ISO date or epoch ms"},
            "orderBy": {"type": "string", "enum": list(get_args(OrderBy))},
        },
    }
    hints = _reads("Search memory")

    query: Annotated[str, msgspec.Meta(max_length=4096)] | None = None
    limit: Annotated[int, msgspec.Meta(ge=1, le=100)] = 20
    offset: Annotated[int, msgspec.Meta(ge=0, le=1_000_000)] = 0
    project: ShortText | None = None
    type: ShortText | None = None
    dateStart: ShortText | SqliteInt | None = None
    dateEnd: ShortText | SqliteInt | None = None
    orderBy: OrderBy | None = None


class Timeline(Command, frozen=True, kw_only=True):
    tool = "timeline"
    description = (
        "Observations around an anchor in time. Params: anchor (observation id) or query (its best hit "
        "is the anchor), depth_before, depth_after (default 3 each), project"
    )
    schema: ClassVar[dict[str, Any]] = {
        "type": "object",
        "properties": {
            "anchor": {"type": "integer", "description": "Observation id to center on"},
            "query": {"type": "string", "description": "Search query; its best hit is the anchor"},
            "depth_before": {"type": "integer", "minimum": 0, "maximum": 100, "description": "Default 3"},
            "depth_after": {"type": "integer", "minimum": 0, "maximum": 100, "description": "Default 3"},
            "project": {"type": "string", "description": "Only this project"},
        },
    }
    hints = _reads("Memory timeline")

    anchor: SqliteInt | None = None
    query: Annotated[str, msgspec.Meta(max_length=4096)] | None = None
    depth_before: Annotated[int, msgspec.Meta(ge=0, le=100)] = 3
    depth_after: Annotated[int, msgspec.Meta(ge=0, le=100)] = 3
    project: ShortText | None = None

    def __post_init__(self) -> None:
        if self.anchor is None and blank(self.query or ""):
            raise ValueError("anchor: expected an observation id, or a non-empty query")


class GetObservations(Command, frozen=True, kw_only=True):
    tool = "get_observations"
    description = "Full observations by id, in the order asked. Params: ids (array of observation ids)"
    schema: ClassVar[dict[str, Any]] = {
        "type": "object",
        "properties": {"ids": {"type": "array", "items": {"type": "integer"}, "description": "Observation ids"}},
        "required": ["ids"],
    }
    hints = _reads("Get observations")

    ids: Annotated[list[SqliteInt], msgspec.Meta(max_length=1000)]


TOOL_COMMANDS: tuple[type[Command], ...] = (
    GetOpenEditors,
    CheckDocumentDirty,
    SaveDocument,
    CloseTab,
    OpenFile,
    OpenDiff,
    CloseAllDiffTabs,
    GetCurrentSelection,
    GetLatestSelection,
    GetDiagnostics,
    GetWorkspaceFolders,
    SaveObservation,
    SearchObservations,
    Timeline,
    GetObservations,
)

# Commands only the command line runs: never listed as MCP tools.
CLI_COMMANDS: tuple[type[Command], ...] = (RestoreFile, ReplayWrite, ReplayClose)
