"""The outside world as handlers see it: small Protocols that adapters implement."""

from __future__ import annotations

from typing import Any, Literal, Protocol

import msgspec

from bus import Caller


class OpenEditor(msgspec.Struct, frozen=True):
    """One open file buffer, as getOpenEditors reports it."""

    uri: str
    isActive: bool
    label: str
    languageId: str
    isDirty: bool


class SaveOutcome(msgspec.Struct, frozen=True, kw_only=True):
    """What happened when Neovim was asked to write a buffer."""

    status: Literal["saved", "not_open", "conflict", "vim_error"]
    message: str = ""
    before: bytes | None = None  # the file on disk just before the write (None: no file)
    after: bytes | None = None  # the file on disk just after it
    changed: bool = False  # the file had changed on disk since Neovim read it
    reloaded: bool = False  # ...and the unmodified buffer was reloaded first


class TabMatch(msgspec.Struct, frozen=True, kw_only=True):
    """The buffer close_tab would wipe (found, not yet wiped), or why there is none."""

    status: Literal["found", "not_found", "ambiguous"]
    buffer: int = 0
    tick: int = 0  # b:changedtick when found: the wipe happens only if it is unchanged
    path: str = ""
    modified: bool = False
    discarded: bytes | None = None  # unsaved text the wipe would throw away
    candidates: list[str] = []


class Editor(Protocol):
    """The user's Neovim. Paths are absolute with `~` expanded; the editor resolves symlinks.
    Faults raise `bus.Fault`s."""

    async def open_editors(self) -> list[OpenEditor]: ...

    async def is_dirty(self, path: str) -> bool | None:
        """True/False for an open document, None when it is not open."""
        ...

    async def save(self, path: str) -> SaveOutcome: ...

    async def find_tab(self, tab_name: str, path: str | None) -> TabMatch:
        """The one open buffer named exactly `path`, else the one ending in `/tab_name`."""
        ...

    async def wipe(self, buffer: int, tick: int) -> bool:
        """Wipe a found buffer; False (nothing done) if it changed since it was found."""
        ...

    def disconnect(self) -> None:
        """Let go of any connection (the server is stopping)."""
        ...


OrderBy = Literal["relevance", "date_desc", "date_asc"]


class SearchQuery(msgspec.Struct, frozen=True, kw_only=True):
    """A search with its arguments interpreted: what the memory store runs."""

    text: str | None = None  # words and "phrases" as the user typed them; None: filters only
    limit: int = 20
    offset: int = 0
    project: str | None = None
    types: tuple[str, ...] = ()  # any of these; empty: every type
    start_ms: int | None = None  # created_at_epoch >= start_ms
    end_ms: int | None = None  # created_at_epoch <= end_ms
    order_by: OrderBy = "relevance"  # relevance without text means date_desc


class TimelineQuery(msgspec.Struct, frozen=True, kw_only=True):
    """The observations around an anchor: an id, or the best hit of `text`."""

    anchor: int | None = None
    text: str | None = None
    depth_before: int = 3
    depth_after: int = 3
    project: str | None = None


class IndexRow(msgspec.Struct, frozen=True):
    """An observation as search and timeline list it: enough to choose, not the full text."""

    id: int
    title: str
    type: str
    project: str
    created_at_epoch: int
    agent: str
    visibility: str


class SearchPage(msgspec.Struct, frozen=True, kw_only=True):
    results: list[IndexRow]
    total: int  # every visible match, not just this page
    limit: int
    offset: int


class TimelinePage(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    anchor: int | None  # None when no visible observation fits the anchor or query
    results: list[IndexRow]  # in time order, the anchor among them
    message: str | None = None


class Observations(msgspec.Struct, frozen=True, kw_only=True):
    observations: list[dict[str, Any]]  # full records, in the order asked
    missing: list[int]  # ids that do not exist or that the caller may not see


class MemoryStore(Protocol):
    """The query side of memory; observations are written only as journal events.
    Every method shows only what `viewer` may see."""

    async def search(self, query: SearchQuery, viewer: Caller) -> SearchPage: ...

    async def timeline(self, query: TimelineQuery, viewer: Caller) -> TimelinePage: ...

    async def get_observations(self, ids: list[int], viewer: Caller) -> Observations: ...
