"""Events: what happened, as msgspec Structs tagged by type and versioned.

A stored event is `(type, version, data)`. Reading goes through `decode_event`, which
upcasts older versions step by step (`UPCASTERS`) and lets msgspec fill defaults for
fields added later, so stored rows are never rewritten.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from typing import Any, ClassVar, Literal, cast

import msgspec


class Event(msgspec.Struct, frozen=True, kw_only=True, tag_field="event"):
    """Base of all events. `version` is the schema version of the event type's data."""

    version: ClassVar[int] = 1

    @classmethod
    def type_name(cls) -> str:
        """The name the event's type is stored under: its tag (every event type has a str one)."""
        return cast(str, cls.__struct_config__.tag)

    @property
    def stream(self) -> str:
        """The thing the event is about, e.g. `file:/abs/path` or `memory:project`."""
        raise NotImplementedError


def file_stream(path: str) -> str:
    """The stream of a file's events: `file:` and its absolute path as Neovim resolves it."""
    return f"file:{path}"


class FileEvent(Event, frozen=True, kw_only=True):
    """An event about one file, filed under that file's stream."""

    path: str

    @property
    def stream(self) -> str:
        return file_stream(self.path)


def blob_hash(content: bytes) -> str:
    """Content address of a blob: its SHA-256, hex."""
    return hashlib.sha256(content).hexdigest()


# --- editor ----------------------------------------------------------------------------


class DocumentSaved(FileEvent, frozen=True, kw_only=True, tag="DocumentSaved"):
    """A buffer was written to its file."""

    written_blob: str
    bytes_written: int
    replaced_blob: str | None  # the text on disk before the write; None when there was no file
    disk_changed: bool  # the file had changed on disk since Neovim read it
    reloaded: bool  # ...and the unmodified buffer was reloaded from disk first


class DocumentSaveRefused(FileEvent, frozen=True, kw_only=True, tag="DocumentSaveRefused"):
    """A save that wrote nothing: the document was not open, a conflict, or a Vim error."""

    reason: Literal["not_open", "conflict", "vim_error", "busy"]  # busy: kept changing while being saved
    message: str


class TabClosed(FileEvent, frozen=True, kw_only=True, tag="TabClosed"):
    """A buffer was wiped. `discarded_blob` holds unsaved text it had, if any."""

    tab_name: str
    was_modified: bool
    discarded_blob: str | None


class FileWriteInDoubt(FileEvent, frozen=True, kw_only=True, tag="FileWriteInDoubt"):
    """A write to `path` (a save, or an accepted diff's) whose outcome is unknown: Neovim did not
    answer in time, or was lost, or the call was cancelled, after the write was asked for. The
    file holds the new text or `replaced_blob`'s, which is kept. Its command stays `in_doubt`."""

    replaced_blob: str | None  # the file before the write; None when there was none


class TabCloseInDoubt(FileEvent, frozen=True, kw_only=True, tag="TabCloseInDoubt"):
    """A wipe of `path`'s buffer whose outcome is unknown (as for `FileWriteInDoubt`): its
    unsaved text, which the wipe would discard, is kept. Its command stays `in_doubt`."""

    tab_name: str
    discarded_blob: str | None


class TabCloseSkipped(Event, frozen=True, kw_only=True, tag="TabCloseSkipped"):
    """close_tab closed nothing: no buffer matched, or several did, or the name was a diff view's."""

    tab_name: str
    # busy: it kept changing while being closed; diff_closed: the name is a diff view's (closed
    # already), and this close its clean-up (agents close their diffs by name when done), never
    # a file buffer's.
    reason: Literal["not_found", "ambiguous", "busy", "diff_closed"]
    candidates: list[str] = []

    @property
    def stream(self) -> str:
        return f"tab:{self.tab_name}"


class FileRestored(FileEvent, frozen=True, kw_only=True, tag="FileRestored"):
    """`toolbus recover --apply` wrote a recorded text back to a file."""

    from_position: int
    written_blob: str
    replaced_blob: str | None


class FileReplayed(FileEvent, frozen=True, kw_only=True, tag="FileReplayed"):
    """`toolbus replay editor` re-applied the recorded write or close at `from_position` to a
    Neovim. A replay is not replayed again: only what agents and users did is."""

    from_position: int
    action: Literal["write", "close"]
    written_blob: str | None = None  # what a write wrote
    kept_copy: str | None = None  # where the file's earlier text, unknown to the journal, was copied


class DiffProposed(FileEvent, frozen=True, kw_only=True, tag="DiffProposed"):
    """openDiff showed the user a proposal for `path` and waits for their decision. Committed
    when the view opens, so a proposal is never lost, whatever happens next."""

    tab_name: str
    old_path: str  # the file shown on the left (usually `path` itself)
    proposed_blob: str
    shown_blob: str  # the text the proposal was shown against (the buffer's, the disk's, or empty)


class DiffAccepted(FileEvent, frozen=True, kw_only=True, tag="DiffAccepted"):
    """The user accepted a proposal: its text as they left it was written to `path`."""

    tab_name: str
    written_blob: str
    bytes_written: int
    replaced_blob: str | None  # the file before the write; None when there was no file
    user_edited: bool  # the user changed the proposal before accepting it


class DiffAcceptFailed(FileEvent, frozen=True, kw_only=True, tag="DiffAcceptFailed"):
    """The user accepted a proposal, but nothing was written (the file changed on disk since the
    diff opened, or Vim refused the write). The text they accepted is kept."""

    tab_name: str
    final_blob: str
    reason: Literal["conflict", "vim_error", "busy"]
    message: str


class DiffAcceptInDoubt(FileEvent, frozen=True, kw_only=True, tag="DiffAcceptInDoubt"):
    """The user accepted a proposal, and its write is in doubt (beside its `FileWriteInDoubt`):
    the text they accepted, as they left it, is kept, for the file may not hold it and the view
    that did is closed. Its command stays `in_doubt`."""

    tab_name: str
    final_blob: str


class DiffRejected(FileEvent, frozen=True, kw_only=True, tag="DiffRejected"):
    """The proposal was turned down, by the user or by closeAllDiffTabs/close_tab. Nothing was written."""

    tab_name: str
    proposed_blob: str
    by: Literal["user", "closeAllDiffTabs", "close_tab"] = "user"


# --- memory ----------------------------------------------------------------------------


class ObservationSaved(Event, frozen=True, kw_only=True, tag="ObservationSaved"):
    """An observation was saved to memory. Its id is the event's journal position."""

    title: str
    text: str
    type: str
    project: str
    memory_session_id: str
    facts: list[str]
    concepts: list[str]
    agent: str
    department: str
    visibility: str
    created_at_epoch: int
    extra: dict[str, Any] = {}

    @property
    def stream(self) -> str:
        return f"memory:{self.project}"


AnyEvent = (
    DocumentSaved
    | DocumentSaveRefused
    | TabClosed
    | FileWriteInDoubt
    | TabCloseInDoubt
    | TabCloseSkipped
    | FileRestored
    | FileReplayed
    | DiffProposed
    | DiffAccepted
    | DiffAcceptFailed
    | DiffAcceptInDoubt
    | DiffRejected
    | ObservationSaved
)

EVENT_TYPES: dict[str, type[Event]] = {
    cls.type_name(): cls
    for cls in (
        DocumentSaved,
        DocumentSaveRefused,
        TabClosed,
        FileWriteInDoubt,
        TabCloseInDoubt,
        TabCloseSkipped,
        FileRestored,
        FileReplayed,
        DiffProposed,
        DiffAccepted,
        DiffAcceptFailed,
        DiffAcceptInDoubt,
        DiffRejected,
        ObservationSaved,
    )
}

# (event type, stored version) -> function turning that version's data into the next version's.
#
# How an event type's schema grows:
# - a new field with a default: nothing else to do; msgspec fills the default for old events;
# - anything else (a rename, a new required field, a changed meaning): raise the type's
#   `version` and register an upcaster from the previous version with `@upcaster`.
# Stored events are never rewritten: they are upcast every time they are read.
Upcaster = Callable[[dict[str, Any]], dict[str, Any]]
UPCASTERS: dict[tuple[str, int], Upcaster] = {}


def upcaster(type_name: str, from_version: int) -> Callable[[Upcaster], Upcaster]:
    """Register a function that upgrades `type_name` data from `from_version` to the next."""

    def register(function: Upcaster) -> Upcaster:
        UPCASTERS[(type_name, from_version)] = function
        return function

    return register


_encoder = msgspec.json.Encoder()


def encode_event_data(event: Event) -> bytes:
    """The event's data as stored: JSON, tagged with its type under `event`."""
    return _encoder.encode(event)


def decode_event(type_name: str, version: int, data: bytes | str) -> Event:
    """A stored event as its current Struct, upcasting older versions on the way.

    Raises ValueError for an unknown type or a missing upcaster, and `msgspec.ValidationError`
    for data that does not fit the type."""
    cls = EVENT_TYPES.get(type_name)
    if cls is None:
        raise ValueError(f"unknown event type {type_name!r}")
    fields: dict[str, Any] = msgspec.json.decode(data)
    while version < cls.version:
        step = UPCASTERS.get((type_name, version))
        if step is None:
            raise ValueError(f"no upcaster for {type_name} from version {version} to {version + 1}")
        fields = step(dict(fields))
        version += 1
    fields["event"] = type_name
    return msgspec.convert(fields, cls)
