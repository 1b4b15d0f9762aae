"""What an event lets a person recover: the text a save (or an accepted diff) replaced, a close
discarded, or a proposal the user rejected."""

from __future__ import annotations

from dataclasses import dataclass

from toolbus.bus import RECOVERABLE_FIELDS, JournalReader, StoredEvent


@dataclass(frozen=True, slots=True)
class Recoverable:
    """Text a save replaced or a close discarded, and where it belongs."""

    event: StoredEvent
    path: str
    blob: str
    content: bytes
    description: str


def recoverable(reader: JournalReader, event: StoredEvent) -> Recoverable:
    """The text `event`'s save replaced, or its close discarded; ValueError when it has none."""
    field = RECOVERABLE_FIELDS.get(event.type)
    where = f"event @{event.position} ({event.type})"
    if field is None:
        raise ValueError(f"{where} holds no recoverable text: only saves, closes, restores and diff decisions do")
    name, description = field
    digest = event.data.get(name)
    if digest is None:
        reason = "the buffer had no unsaved text" if name == "discarded_blob" else "the file did not exist before"
        raise ValueError(f"{where} has nothing to recover: {reason}")
    content = reader.blob(digest)
    if content is None:
        raise ValueError(f"the journal has lost blob {digest}: it cannot be recovered")
    return Recoverable(event=event, path=str(event.data["path"]), blob=digest, content=content, description=description)
