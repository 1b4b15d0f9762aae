"""The editor steps a journal holds: recorded writes and closes, to re-apply to a Neovim.

Backend-neutral: everything is read through the `JournalReader` port.
"""

from __future__ import annotations

import bisect
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
    # write before it and the last write of all wrote, what the last write to `path`, a
    # replay's too, left there): a file holding one loses nothing when it is overwritten.
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
    mapping: dict[str, str] = {}
    for pair in pairs:
        old, sep, new = pair.partition("=")
        if not sep or not old or not new:
            raise ValueError(f"--map: expected FROM=TO (two directories), got {pair!r}")
        typed, target = typed_path(old), typed_path(new)
        for spelling in dict.fromkeys((os.path.realpath(typed), typed)):
            if mapping.setdefault(spelling, target) != target:
                raise ValueError(
                    f"--map {pair}: {spelling} is mapped to {mapping[spelling]} already; nothing was replayed"
                )
    return sorted(mapping.items(), key=lambda item: len(item[0]), reverse=True)


def check_path_map(pairs: Sequence[str], steps: Sequence[EditorStep]) -> None:
    """Refuse a `--map` that moves none of the steps: the files it was meant to keep out of
    harm's way would be written where they were recorded."""
    if not steps:
        return
    mapping = parse_path_map(pairs)
    for pair in pairs:
        own = parse_path_map([pair])
        under = [step.recorded_path for step in steps if _taken_by(step.recorded_path, own)]
        old, new = (typed_path(side) for side in pair.split("=", 1))
        if not under:
            raise ValueError(
                f"--map {pair}: none of the {len(steps)} steps is a file under {old},"
                " as typed or with its symlinks resolved; nothing was replayed"
            )
        if not any(_taken_by(path, mapping) in own for path in under):
            raise ValueError(
                f"--map {pair}: every step under {old} is under a longer --map's folder, which moves it;"
                " nothing was replayed"
            )
        if all(os.path.realpath(map_path(path, own)) == path for path in under):  # TO may be FROM's symlink
            raise ValueError(f"--map {pair}: {old} and {new} are one folder: it moves nothing; nothing was replayed")


def _taken_by(path: str, mapping: PathMap) -> tuple[str, str] | None:
    """The entry of `mapping` that moves `path`: the longest folder holding it."""
    for old, new in mapping:
        folder = old.rstrip("/")  # "" for the root
        if path == old or path.startswith(folder + "/"):
            return old, new
    return None


def map_path(path: str, mapping: PathMap) -> str:
    if (taken := _taken_by(path, mapping)) is None:
        return path
    old, new = taken
    return new.rstrip("/") + path[len(old.rstrip("/")) :] or "/"


def editor_steps(
    reader: JournalReader,
    start: int | None = None,
    end: int | None = None,
    mapping: PathMap | None = None,
    host: str | None = None,
) -> Iterator[EditorStep]:
    """Saves, restores and closes between positions `start` and `end` (inclusive), in order; with
    `host`, only that machine's (and those recorded before machines were)."""
    stories: dict[str, _Story] = {}  # each file's read once: a replay is linear in its steps
    last_texts: dict[str, str | None] = {}  # what each written file holds by the journal's account
    blobs = _KnownBlobs(reader)
    for event in reader.events(_EDITOR_TYPES, start or 0, end):
        recorded = str(event.data["path"])
        if (story := stories.get(recorded)) is None:
            # The file's events on that machine: the same path elsewhere is another file.
            story = stories[recorded] = _Story([entry.event for entry in reader.history(recorded, host=host)])
        if host is not None and event.position not in story.positions:
            continue
        path = map_path(recorded, mapping or [])
        if path not in last_texts:  # read before this replay writes it
            own = path == recorded and host is None
            last_texts[path] = story.last_text if own else _Story.last_text_of(reader, path)
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
            known=_known_texts(event, story, blobs, last_texts[path]),
        )


class _Story:
    """One file's events (its `history`, newest first), indexed for each of its steps."""

    def __init__(self, events: list[StoredEvent]) -> None:
        self.positions = {event.position for event in events}
        # The text the last journaled write (a replay's too) left in the file.
        self.last_text = next((d for e in events if isinstance(d := e.data.get("written_blob"), str)), None)
        self._writes: dict[str, list[StoredEvent]] = {}  # by stream, oldest first
        for event in reversed(events):
            if event.type in _WRITE_TYPES:
                self._writes.setdefault(event.stream, []).append(event)

    @staticmethod
    def last_text_of(reader: JournalReader, path: str) -> str | None:
        return _Story([entry.event for entry in reader.history(path)]).last_text

    def writes(self, stream: str, before: int) -> tuple[StoredEvent | None, StoredEvent | None]:
        """The last write to `stream` before position `before`, and the last write of all."""
        writes = self._writes.get(stream, [])
        earlier = bisect.bisect_left(writes, before, key=lambda event: event.position)
        return (writes[earlier - 1] if earlier else None), (writes[-1] if writes else None)


class _KnownBlobs:
    """Whether the journal holds a text, asked once per text."""

    def __init__(self, reader: JournalReader) -> None:
        self._reader = reader
        self._held: dict[str, bool] = {}

    def __contains__(self, digest: str) -> bool:
        if (held := self._held.get(digest)) is None:
            held = self._held[digest] = self._reader.blob(digest) is not None
        return held


def _known_texts(event: StoredEvent, story: _Story, blobs: _KnownBlobs, held: str | None) -> tuple[str, ...]:
    """What the save replaced, what the last write before it and the last write of all wrote
    to its file (of its `story`), and what the file it is replayed to `held` when the replay
    began (an earlier replay may have written it): the texts a file may hold without losing
    anything when overwritten."""
    before, last = story.writes(file_stream(str(event.data["path"])), event.position)
    candidates = (
        event.data.get("replaced_blob"),
        before.data.get("written_blob") if before else None,
        last.data.get("written_blob") if last else None,
        held,
    )
    written = event.data["written_blob"]
    return tuple(sorted({d for d in candidates if isinstance(d, str) and d != written and d in blobs}))
