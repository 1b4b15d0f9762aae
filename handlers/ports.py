"""The outside world as handlers see it: small Protocols that adapters implement."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal, Protocol

import msgspec

from toolbus.bus import Caller, OpenFile
from toolbus.bus.queries import Observations, SearchPage, SearchQuery, TimelinePage, TimelineQuery


class OpenEditor(msgspec.Struct, frozen=True):
    """One open file buffer, as getOpenEditors reports it."""

    uri: str
    isActive: bool
    label: str
    languageId: str
    isDirty: bool


class SaveTarget(msgspec.Struct, frozen=True, kw_only=True):
    """The buffer a save would write (inspected, not yet written), or why there is none."""

    status: Literal["ready", "not_open", "conflict", "vim_error"]
    path: str  # the file as Neovim resolves it (symlinks resolved): its events' stream
    message: str = ""
    buffer: int = 0
    tick: int = 0  # b:changedtick when inspected: the write happens only if it is unchanged
    disk: str = ""  # the file's identity when inspected ('' none): likewise
    before: bytes | None = None  # the file on disk the write would replace (None: no file)
    changed: bool = False  # the file had changed on disk since Neovim read it
    reloaded: bool = False  # ...and the unmodified buffer was reloaded first


class SaveOutcome(msgspec.Struct, frozen=True, kw_only=True):
    """What happened when Neovim was asked to write an inspected buffer."""

    status: Literal["saved", "changed", "vim_error"]  # changed: since inspected; nothing written
    message: str = ""
    after: bytes | None = None  # the file on disk just after the write
    encoding: str = ""  # how Neovim encoded it ('fileencoding'; '' for UTF-8)


class TabMatch(msgspec.Struct, frozen=True, kw_only=True):
    """The buffer close_tab would wipe (found, not yet wiped), the one it wiped at once (nothing
    unsaved), or why there is none; or why Neovim cannot close a buffer now (refused)."""

    status: Literal["found", "wiped", "not_found", "ambiguous", "refused"]
    message: str = ""  # why it was refused
    buffer: int = 0
    tick: int = 0  # b:changedtick when found: the wipe happens only if it is unchanged
    path: str = ""  # the buffer's file as Neovim resolves it (symlinks resolved)
    modified: bool = False
    discarded: bytes | None = None  # unsaved text the wipe would throw away
    candidates: list[str] = []


class FileClosed(msgspec.Struct, frozen=True, kw_only=True):
    """What `Editor.close_file` did."""

    status: Literal["closed", "not_open", "modified", "refused"]  # refused: Neovim cannot close it now
    message: str = ""
    path: str | None = None  # the file closed, as Neovim resolves it


class FileReplaced(msgspec.Struct, frozen=True, kw_only=True):
    """What `Editor.replace_file` did."""

    status: Literal["written", "modified", "error"]  # modified: a buffer has unsaved changes
    message: str = ""  # why it failed; when written, why Neovim could not load it, if it could not
    kept: str | None = None  # where what the file held was copied (`path.~N~`), if it was
    path: str | None = None  # the file written, as Neovim resolves it


class Position(msgspec.Struct, frozen=True):
    """A place in a file as LSP counts: 0-based line, 0-based character in UTF-16 code units."""

    line: int
    character: int


class Range(msgspec.Struct, frozen=True):
    start: Position
    end: Position  # exclusive


class SelectionRange(msgspec.Struct, frozen=True):
    start: Position
    end: Position  # exclusive
    isEmpty: bool


class Selection(msgspec.Struct, frozen=True, kw_only=True):
    """A selection (or the cursor, with empty text) in a file buffer, as the selection tools
    report it."""

    success: bool = True
    text: str
    filePath: str
    fileUrl: str
    selection: SelectionRange


class Diagnostic(msgspec.Struct, frozen=True):
    message: str
    severity: Literal["Error", "Warning", "Information", "Hint"]
    range: Range
    source: str | None = None
    code: str | int | None = None


class FileDiagnostics(msgspec.Struct, frozen=True):
    uri: str
    diagnostics: list[Diagnostic]


class WorkspaceFolder(msgspec.Struct, frozen=True):
    name: str
    uri: str
    path: str


class FileOpened(msgspec.Struct, frozen=True, kw_only=True):
    """What `Editor.open_file` did."""

    status: Literal["shown", "loaded", "not_found", "directory", "refused"]  # loaded: in a buffer, no window changed
    message: str = ""  # why it was refused
    languageId: str = "plaintext"
    lineCount: int = 0
    selected: tuple[int, int] | None = None  # the first and last line selected (1-based)
    missing: Literal["startText", "endText"] | None = None  # a text to select that was not found


class DiffRequest(msgspec.Struct, frozen=True, kw_only=True):
    """A proposal to show: `text` for `path`, against the current text of `old_path`."""

    path: str
    old_path: str
    text: bytes
    tab_name: str


class DiffView(msgspec.Struct, frozen=True, kw_only=True):
    """What `Editor.open_diff` did: a view opened (`id`), or none because the file's buffer
    has unsaved changes, or Neovim could not open one (refused: `message` says why)."""

    status: Literal["open", "dirty", "refused"]
    message: str = ""
    id: str = ""
    path: str = ""  # the file as Neovim resolves it (symlinks resolved): its events' stream
    shown: bytes = b""  # the text the proposal is shown against


DiffCloser = Literal["user", "closeAllDiffTabs", "close_tab"]


class DiffDecision(msgspec.Struct, frozen=True, kw_only=True):
    """How a waiting diff ended: accepted (with the proposal's text as the user left it),
    rejected (by the user, or closed by a tool), or `lost`: Neovim went away."""

    action: Literal["accept", "reject", "lost"]
    text: bytes = b""
    by: DiffCloser = "user"


class DiffStaged(msgspec.Struct, frozen=True, kw_only=True):
    """What `Editor.stage_diff` did: the accepted text is in the file's buffer, ready to save."""

    status: Literal["staged", "conflict", "vim_error"]
    message: str = ""


class Editor(Protocol):
    """The user's Neovim. Paths are absolute with `~` expanded; the editor resolves symlinks.
    Faults raise `bus.Fault`s."""

    async def open_editors(self) -> list[OpenEditor]: ...

    async def is_dirty(self, path: str) -> bool | None:
        """True/False for an open document, None when it is not open."""
        ...

    async def inspect_save(self, path: str) -> SaveTarget:
        """Settle a disk change under the buffer of `path` (no prompt), and read what a save
        would replace. Writes nothing."""
        ...

    async def write(self, target: SaveTarget) -> SaveOutcome:
        """Write an inspected buffer, unless it or its file changed since."""
        ...

    async def find_tab(self, tab_name: str, path: str | None, *, wipe_unmodified: bool = False) -> TabMatch:
        """The one open buffer named exactly `path`, else the one ending in `/tab_name`; with
        `wipe_unmodified`, wiped at once if it has no unsaved text (status `wiped`)."""
        ...

    async def wipe(self, buffer: int, tick: int) -> bool:
        """Wipe a found buffer; False (nothing done) if it changed since it was found."""
        ...

    async def current_selection(self) -> Selection | None:
        """The visual selection in the current buffer, else its cursor; None when the current
        buffer is not a file's."""
        ...

    async def latest_selection(self) -> Selection | None:
        """The visual selection now, else the last one made in any file buffer since toolbus's
        helpers were installed in this Neovim; None before the first."""
        ...

    async def diagnostics(self, path: str | None) -> list[FileDiagnostics] | None:
        """The diagnostics of the open file `path` (None when it is not open), or of every open
        file that has some."""
        ...

    async def workspace_folders(self) -> list[WorkspaceFolder]:
        """Neovim's working directory, then each workspace folder of an attached LSP client, once."""
        ...

    async def open_file(self, command: OpenFile) -> FileOpened:
        """Show `command.file` in the main editor window and select what it asks, or only load
        it (`makeFrontmost` false)."""
        ...

    async def replace_file(self, path: str, text: bytes, known: Sequence[bytes] = ()) -> FileReplaced:
        """Write `text` to `path` byte for byte and show it in a buffer reloaded from it. A file
        holding anything but `text` or one of `known` is copied to `path.~N~` first. Nothing
        is done when a buffer of `path` has unsaved changes."""
        ...

    async def close_file(self, path: str) -> FileClosed:
        """Wipe the buffer of `path`, unless it has unsaved changes."""
        ...

    async def open_diff(self, request: DiffRequest) -> DiffView:
        """Open a diff view of `request` in a new tab page, the proposal's window current, unless
        the file's buffer has unsaved changes. The view waits for the user's decision."""
        ...

    def diff_waiting(self, tab_name: str) -> bool:
        """Whether a view named `tab_name` is open and undecided."""
        ...

    async def decision(self, view: str) -> DiffDecision:
        """Wait, without a time limit, for the decision on an open view."""
        ...

    async def stage_diff(self, view: str, text: bytes) -> DiffStaged:
        """Put an accepted text into its file's buffer (loaded if need be) for `write`; nothing,
        if the file changed on disk since the view opened or its buffer was changed since."""
        ...

    async def keep_staged(self, view: str, notice: str) -> bool:
        """Leave the text `stage_diff` put into the file's buffer there, unsaved, when the view
        closes (instead of taking it out again), and tell the user `notice`; whether it was
        still there to keep."""
        ...

    async def close_diff(self, view: str) -> None:
        """Close a view (deciding nothing), if it is still there; one whose decision was lost
        with its connection is left to the editor, which keeps a proposal the user edited.
        Never raises."""
        ...

    async def close_diffs(self, tab_name: str | None, by: DiffCloser) -> int:
        """Reject and close the undecided views named `tab_name` (all, for None); how many."""
        ...

    def forget_diff_tab(self, tab_name: str) -> bool:
        """Whether `tab_name` named a diff view since toolbus started that no close_tab has
        named since (the agent's clean-up after the diff, which then closes no file buffer
        that happens to match it). The name is forgotten: the next close_tab of it is a file's."""
        ...

    def disconnect(self) -> None:
        """Let go of any connection (the server is stopping)."""
        ...


class MemoryStore(Protocol):
    """The query side of memory; observations are written only as journal events.
    Every method shows only what `viewer` may see."""

    async def search(self, query: SearchQuery, viewer: Caller) -> SearchPage: ...

    async def timeline(self, query: TimelineQuery, viewer: Caller) -> TimelinePage: ...

    async def get_observations(self, ids: list[int], viewer: Caller) -> Observations: ...


class Files(Protocol):
    """Files on this machine, for restores. A file that cannot be read or written raises a
    `bus.Fault` saying it cannot be written (reading it is the first step of replacing it)."""

    async def read(self, path: str) -> bytes | None:
        """What `path` holds now; None when there is no file."""
        ...

    async def replace(self, path: str, content: bytes) -> bytes | None:
        """Write `content` to `path` in one rename, keeping its permissions; return the bytes it
        replaced (None when there was no file)."""
        ...


class Texts(Protocol):
    """Texts the journal keeps (saved, replaced and discarded), by content address."""

    async def text(self, digest: str) -> bytes | None:
        """The text whose SHA-256 is `digest`; None when the journal does not hold it."""
        ...
