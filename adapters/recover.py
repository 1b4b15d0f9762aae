"""`toolbus recover --apply`: write a recovered text back to its file, journaled like a tool call.

Write ahead, as the bus does: the `recover` command is recorded before the file is touched,
and its `FileRestored` event (with the text written and the text it replaced, as blobs) is
committed after. A restore is itself recoverable: `toolbus recover` on its event gives back
what it overwrote.
"""

from __future__ import annotations

import os
import tempfile
import time
from pathlib import Path

import anyio

from adapters.config import Settings
from bus import Caller, CommandRecord, Fault, FileRestored, blob_hash
from journal.audit import Recoverable
from journal.readonly import require_journal


def apply_recovery(settings: Settings, found: Recoverable) -> int:
    """Restore `found` to its file; returns the position of the FileRestored event."""
    from adapters.bootstrap import open_journal
    from adapters.cli import version

    require_journal(settings.journal)  # never let a writer migrate a stranger's file
    journal = open_journal(settings, create=False)
    record = CommandRecord(
        tool="recover",
        arguments={"event": found.event.position, "event_id": found.event.event_id, "path": found.path},
        caller=Caller(
            agent=settings.agent,
            department=settings.department,
            client_name="toolbus recover",
            client_version=version(),
        ),
        received_ns=time.time_ns(),
    )

    async def restore() -> int:
        command_id = await journal.begin(record)
        try:
            replaced = _read(found.path)
            write_atomically(Path(found.path), found.content)
        except OSError as error:
            message = f"cannot write {found.path}: {error.strerror or error}"
            await journal.finish(record, command_id, "failed", error=message)
            raise Fault(message) from error
        written = blob_hash(found.content)
        blobs = {written: found.content}
        if replaced is not None:
            blobs[blob_hash(replaced)] = replaced
        event = FileRestored(
            path=found.path,
            from_position=found.event.position,
            written_blob=written,
            replaced_blob=blob_hash(replaced) if replaced is not None else None,
        )
        [position] = await journal.finish(record, command_id, "ok", events=[event], blobs=blobs)
        return position

    try:
        return anyio.run(restore)
    finally:
        journal.close()


def _read(path: str) -> bytes | None:
    try:
        return Path(path).read_bytes()
    except FileNotFoundError:
        return None


def write_atomically(path: Path, content: bytes) -> None:
    """Replace `path` with `content` in one rename, keeping its permissions: a reader (or a
    crash) sees the old text or the new, never half of it."""
    try:
        mode = path.stat().st_mode & 0o7777
    except FileNotFoundError:
        umask = os.umask(0)
        os.umask(umask)
        mode = 0o666 & ~umask
    handle, temporary = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".toolbus", dir=path.parent)
    try:
        with os.fdopen(handle, "wb") as file:
            file.write(content)
            file.flush()
            os.fsync(file.fileno())
        os.chmod(temporary, mode)
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise
