"""Opening a journal for reading without creating, migrating or touching anything else.

A read-only command is often pointed at the wrong file. Before SQLite opens it (which could
create the file, or `-wal`/`-shm` files beside a stranger's database), the file's 100-byte
SQLite header is read directly and must carry toolbus's application id.
"""

from __future__ import annotations

import os
import sqlite3
from pathlib import Path

from toolbus.bus import JournalNotFound, JournalUnavailable
from toolbus.journal.regular_files import NotARegularFile, read_regular
from toolbus.journal.sqlite.schema import APPLICATION_ID, check_identity
from toolbus.journal.sqlite.store import explain_sqlite, is_contention

_SQLITE_MAGIC = b"SQLite format 3\x00"
_HEADER_SIZE = 100


def require_journal(path: Path) -> None:
    """Raise unless `path` is an existing toolbus journal; reads the file's header only."""
    path = Path(os.path.realpath(path))  # its -wal, if any, is beside the file a link leads to
    try:
        header = read_regular(path, _HEADER_SIZE)
    except NotARegularFile:
        raise JournalUnavailable(f"not a toolbus journal: {path} is not a regular file") from None
    except FileNotFoundError:
        raise JournalNotFound(f"no journal at {path}: check --journal or $TOOLBUS_JOURNAL") from None
    except IsADirectoryError:
        raise JournalUnavailable(f"not a toolbus journal: {path} is a directory") from None
    except OSError as error:
        raise JournalUnavailable(f"cannot read the journal at {path}: {error.strerror}") from None
    if len(header) < _HEADER_SIZE or not header.startswith(_SQLITE_MAGIC):
        what = "an empty file" if not header else "not a SQLite database"
        raise JournalUnavailable(f"not a toolbus journal: {path} is {what}")
    application_id = int.from_bytes(header[68:72], "big")
    if application_id == APPLICATION_ID:
        return
    # A journal whose first commits still sit in its write-ahead log has a stale header:
    # only then is SQLite asked (read-only; the -wal file already exists).
    if application_id == 0 and _has_wal(path):
        _check_with_sqlite(path)
        return
    raise JournalUnavailable(f"not a toolbus journal: {path} is a SQLite database of something else")


def open_readonly(path: Path, busy_timeout: float = 5.0) -> sqlite3.Connection:
    """A connection to a toolbus journal that cannot write (`query_only`).

    A WAL database needs its `-shm` index even to read. A normal connection creates it and
    removes it again when it is the last to close; `mode=ro` would leave it (and a `-wal`
    file) behind, which would then keep a writer out of a journal made writable again. So the
    journal is opened normally with writes switched off. One we may not write to (the file,
    or its directory) is read as immutable when no connection has it open: all of it is in the
    file, and nothing is created. Otherwise `mode=ro` is the last resort.
    """
    require_journal(path)
    path = Path(os.path.realpath(path))  # SQLite keeps -wal and -shm beside the file a link leads to
    at_rest = _at_rest(path)  # before the first attempt, which may leave files behind
    # SQLite opens a file it may not write read-only without a word, and such a connection
    # leaves its -wal and -shm files behind: ask first.
    if os.access(path, os.W_OK) and os.access(path.parent, os.W_OK):
        try:
            conn = _connect(path, busy_timeout, uri_mode=None)
        except sqlite3.OperationalError:
            conn = _connect_read_only(path, busy_timeout, at_rest)
        except sqlite3.DatabaseError as error:  # damaged: no other way of opening it does better
            raise JournalUnavailable(explain_sqlite(path, error)) from None
    else:
        conn = _connect_read_only(path, busy_timeout, at_rest)
    try:
        if check_identity(conn) == 0:
            raise JournalUnavailable(f"not a toolbus journal: {path} holds no journal tables")
    except sqlite3.DatabaseError as error:
        conn.close()
        raise JournalUnavailable(f"cannot read the journal at {path}: {error}") from error
    except JournalUnavailable:
        conn.close()
        raise
    return conn


# A live connection maps the -shm index in pieces of this size: a shorter one is a leftover.
_SHM_PIECE = 32768


def _at_rest(path: Path) -> bool:
    """Whether no connection has the journal open: no -wal with frames and no -shm index, but
    for the empty ones an attempt to open it left when it failed (a full disk)."""
    return _size(f"{path}-wal") == 0 and _size(f"{path}-shm") < _SHM_PIECE


def _size(name: str) -> int:
    try:
        return os.path.getsize(name)
    except FileNotFoundError:
        return 0


def _connect_read_only(path: Path, busy_timeout: float, at_rest: bool) -> sqlite3.Connection:
    """A journal we may not write to (or whose -shm cannot be made: a full disk): immutable when
    no connection had it open (`at_rest`: no -wal, no -shm, so all of it is in the file; an
    immutable reader takes no locks, so a writer checkpointing under it would mix old pages and
    new), else `mode=ro`."""
    try:
        return _connect(path, busy_timeout, uri_mode="ro&immutable=1" if at_rest else "ro")
    except sqlite3.OperationalError as error:
        if is_contention(error):  # a writer holding it exclusively (locking_mode=EXCLUSIVE)
            raise JournalUnavailable(explain_sqlite(path, error)) from None
        raise JournalUnavailable(
            f"cannot read the journal at {path}: {error}; SQLite needs to create {path.name}-shm beside"
            " its write-ahead log to read it: copy the journal with its -wal file somewhere writable"
        ) from None
    except sqlite3.DatabaseError as error:
        raise JournalUnavailable(explain_sqlite(path, error)) from None


def _connect(path: Path, busy_timeout: float, uri_mode: str | None) -> sqlite3.Connection:
    target = f"file:{_quote(path)}" + (f"?mode={uri_mode}" if uri_mode else "?mode=rw")
    conn = sqlite3.connect(target, uri=True, timeout=busy_timeout, isolation_level=None, check_same_thread=False)
    try:
        conn.execute("PRAGMA query_only = ON")
        conn.execute(f"PRAGMA busy_timeout = {int(busy_timeout * 1000)}")
        conn.execute("SELECT count(*) FROM sqlite_master").fetchone()  # opens the file now
    except sqlite3.DatabaseError:
        conn.close()
        raise
    return conn


def _check_with_sqlite(path: Path) -> None:
    try:
        conn = sqlite3.connect(f"file:{_quote(path)}?mode=ro", uri=True, isolation_level=None)
    except sqlite3.DatabaseError as error:
        raise JournalUnavailable(f"cannot read the journal at {path}: {error}") from error
    try:
        if check_identity(conn) == 0:
            raise JournalUnavailable(f"not a toolbus journal: {path} holds no journal tables")
    except sqlite3.DatabaseError as error:
        raise JournalUnavailable(f"cannot read the journal at {path}: {error}") from error
    finally:
        conn.close()


def _has_wal(path: Path) -> bool:
    try:
        return os.path.getsize(f"{path}-wal") > 0
    except OSError:
        return False


def _quote(path: Path) -> str:
    # URI filenames: `?` and `#` would end the path; `%` starts an escape.
    return str(path).replace("%", "%25").replace("?", "%3f").replace("#", "%23")
