"""The editor steps a journal holds: recorded writes and closes, to re-apply to a Neovim.

Backend-neutral: everything is read through the `JournalReader` port.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Literal

from toolbus.bus import JournalReader, StoredEvent, file_stream, typed_path

# An accepted diff is a write. A replay (FileReplayed) is not replayed again.
_WRITE_TYPES = ("DocumentSaved", "DiffAccepted", "FileRestored")
_EDITOR_TYPES = (*_WRITE_TYPES, "TabClosed")


@dataclass(frozen=True, slots=True)
class EditorStep:
    """One recorded change to re-apply: write a file's recorded text, or close its buffer."""

    position: int
    action: Literal["write", "close"]
    path: str
    recorded_path: str
    source: str  # the event type it comes from
    blob: str | None = None  # what a write writes, by content address
    content: bytes | None = None
    # Texts the journal has for this file around this step (what it replaced, what the last
    # write before it and the last write of all wrote): a file holding one loses nothing
    # when it is overwritten.
    known: tuple[str, ...] = ()

    def describe(self) -> str:
        moved = f" (recorded as {self.recorded_path})" if self.path != self.recorded_path else ""
        if self.action == "close":
            return f"@{self.position} close {self.path}{moved}"
        verb = {"FileRestored": "restore", "DiffAccepted": "accepted diff"}.get(self.source, "save")
        return f"@{self.position} {verb} {self.path}{moved}: write {len(self.content or b'')} bytes"


PathMap = list[tuple[str, str]]


def parse_path_map(pairs: Sequence[str]) -> PathMap:
    """`--map FROM=TO` pairs as absolute directory prefixes, longest first. FROM is matched as
    typed and with its symlinks resolved: paths are recorded as Neovim resolves them."""
    mapping: PathMap = []
    for pair in pairs:
        old, sep, new = pair.partition("=")
        if not sep or not old or not new:
            raise ValueError(f"--map: expected FROM=TO (two directories), got {pair!r}")
        typed = typed_path(old)
        for spelling in dict.fromkeys((os.path.realpath(typed), typed)):
            mapping.append((spelling, typed_path(new)))
    return sorted(mapping, key=lambda item: len(item[0]), reverse=True)


def check_path_map(pairs: Sequence[str], steps: Sequence[EditorStep]) -> None:
    """Refuse a `--map` that moves none of the steps: the files it was meant to keep out of
    harm's way would be written where they were recorded."""
    for pair in pairs:
        mapping = parse_path_map([pair])
        if not any(map_path(step.recorded_path, mapping) != step.recorded_path for step in steps):
            old = pair.partition("=")[0]
            raise ValueError(
                f"--map {pair}: none of the {len(steps)} steps is a file under {typed_path(old)},"
                " as typed or with its symlinks resolved; nothing was replayed"
            )


def map_path(path: str, mapping: PathMap) -> str:
    for old, new in mapping:
        if path == old or path.startswith(old.rstrip("/") + "/"):
            return new + path[len(old) :]
    return path


def editor_steps(
    reader: JournalReader,
    start: int | None = None,
    end: int | None = None,
    mapping: PathMap | None = None,
    host: str | None = None,
) -> Iterator[EditorStep]:
    """Saves, restores and closes between positions `start` and `end` (inclusive), in order; with
    `host`, only that machine's (and those recorded before machines were)."""
    for event in reader.events(_EDITOR_TYPES, start or 0, end):
        recorded = str(event.data["path"])
        # The file's events on that machine, newest first: the same path elsewhere is another file.
        story = [entry.event for entry in reader.history(recorded, host=host)]
        if host is not None and all(other.position != event.position for other in story):
            continue
        path = map_path(recorded, mapping or [])
        if event.type == "TabClosed":
            yield EditorStep(
                position=event.position, action="close", path=path, recorded_path=recorded, source=event.type
            )
            continue
        written = str(event.data["written_blob"])
        content = reader.blob(written)
        if content is None:
            raise ValueError(f"the journal has lost blob {written} (event @{event.position}): it cannot be replayed")
        yield EditorStep(
            position=event.position,
            action="write",
            path=path,
            recorded_path=recorded,
            source=event.type,
            blob=written,
            content=content,
            known=_known_texts(reader, event, story),
        )


def _known_texts(reader: JournalReader, event: StoredEvent, story: list[StoredEvent]) -> tuple[str, ...]:
    """What the save replaced, and what the last write before it and the last write of all
    wrote to its file (of its `story`): the texts a file may hold without losing anything when
    overwritten."""
    stream = file_stream(str(event.data["path"]))
    writes = [other for other in story if other.type in _WRITE_TYPES and other.stream == stream]  # newest first
    before = next((e for e in writes if e.position < event.position), None)
    candidates = (
        event.data.get("replaced_blob"),
        before.data.get("written_blob") if before else None,
        writes[0].data.get("written_blob") if writes else None,
    )
    written = event.data["written_blob"]
    return tuple(sorted({d for d in candidates if isinstance(d, str) and d != written and reader.blob(d) is not None}))
