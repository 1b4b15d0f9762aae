"""The outside world as handlers see it: small Protocols that adapters implement."""

from __future__ import annotations

from typing import Any, Literal, Protocol

import msgspec


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


class CloseOutcome(msgspec.Struct, frozen=True, kw_only=True):
    """What happened when Neovim was asked to wipe a buffer."""

    status: Literal["closed", "not_found", "ambiguous"]
    path: str = ""
    modified: bool = False
    discarded: bytes | None = None  # unsaved text the wipe threw away
    candidates: list[str] = []


class Editor(Protocol):
    """The user's Neovim. Paths are absolute and normalised. Faults raise `bus.Fault`s."""

    async def open_editors(self) -> list[OpenEditor]: ...

    async def is_dirty(self, path: str) -> bool | None:
        """True/False for an open document, None when it is not open."""
        ...

    async def save(self, path: str) -> SaveOutcome: ...

    async def close_tab(self, tab_name: str, path: str | None) -> CloseOutcome: ...

    def disconnect(self) -> None:
        """Let go of any connection (the server is stopping)."""
        ...


class MemoryStore(Protocol):
    """The query side of memory; observations are written only as journal events."""

    async def search(self, command: Any, viewer: Any) -> dict[str, Any]: ...

    async def timeline(self, command: Any, viewer: Any) -> dict[str, Any]: ...

    async def get_observations(self, ids: list[int], viewer: Any) -> dict[str, Any]: ...
