"""Counting the syncs SQLite makes, and what a power cut would leave: a test-only SQLite VFS.

`SyncCounter` registers, as SQLite's default, a copy of the default VFS whose files answer
`xSync` through Python: every sync SQLite makes on a journal's files is counted (by file and
thread) before it reaches the real one. That is the `fsync`/`fdatasync` the unix VFS issues,
seen at its source rather than guessed from timings. `os.fsync`, which toolbus calls itself
(the background flush of reads' records), is counted too.

It also keeps, for each file, a copy of its bytes as they were when a sync was asked for:
what the disk is sure to hold after a power cut (writes since may be lost). `power_cut()`
writes those copies to a folder, so a fresh open shows what would survive.

Needs Python's `sqlite3` to use the shared libsqlite3 that ctypes can load (as on Debian and
most Linux Pythons); `SyncCounter.start()` skips the test otherwise.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import shutil
import sqlite3
import tempfile
import threading
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

_P = ctypes.c_void_p
# The file name stays a raw pointer: SQLite keeps it (and reads URI parameters after it), so a
# copy that ctypes would free after the call must never be handed on.
_OPEN = ctypes.CFUNCTYPE(ctypes.c_int, _P, _P, _P, ctypes.c_int, _P)
_SYNC = ctypes.CFUNCTYPE(ctypes.c_int, _P, ctypes.c_int)


class _Vfs(ctypes.Structure):
    """`sqlite3_vfs` up to `xOpen`, then the other 15 methods of version 3, untouched."""

    _fields_ = [
        ("iVersion", ctypes.c_int),
        ("szOsFile", ctypes.c_int),
        ("mxPathname", ctypes.c_int),
        ("pNext", _P),
        ("zName", ctypes.c_char_p),
        ("pAppData", _P),
        ("xOpen", _P),
        *((f"method{index}", _P) for index in range(15)),
    ]


class _IoMethods(ctypes.Structure):
    """`sqlite3_io_methods` (version 3): `xSync` is the fifth method."""

    _fields_ = [
        ("iVersion", ctypes.c_int),
        ("xClose", _P),
        ("xRead", _P),
        ("xWrite", _P),
        ("xTruncate", _P),
        ("xSync", _P),
        *((f"method{index}", _P) for index in range(13)),
    ]


# Every counter ever started: a connection opened through its VFS may outlive a test, and
# SQLite would then call into freed memory.
_KEPT_ALIVE: list[SyncCounter] = []


def _library() -> ctypes.CDLL | None:
    name = ctypes.util.find_library("sqlite3")
    if name is None:
        return None
    lib = ctypes.CDLL(name)
    lib.sqlite3_vfs_find.restype = ctypes.POINTER(_Vfs)
    lib.sqlite3_vfs_find.argtypes = [ctypes.c_char_p]
    lib.sqlite3_vfs_register.argtypes = [ctypes.POINTER(_Vfs), ctypes.c_int]
    lib.sqlite3_vfs_unregister.argtypes = [ctypes.POINTER(_Vfs)]
    return lib


class SyncCounter:
    """Syncs by (file path, thread name); a copy of each file as of its last sync."""

    def __init__(self) -> None:
        self.syncs: Counter[tuple[str, str]] = Counter()  # (path, thread) -> syncs
        self.synced: dict[str, bytes] = {}  # full path -> bytes as of its last sync
        self._paths: dict[int, str] = {}  # sqlite3_file* -> path
        self._methods: dict[int, tuple[_IoMethods, Callable[..., int]]] = {}
        self._lock = threading.Lock()
        self._lib = _library()
        self._ours = _Vfs()
        self._real: ctypes._Pointer[_Vfs] | None = None

    # --- what the tests read -------------------------------------------------------------

    def count(self, database: Path, thread: str | None = None) -> int:
        """Syncs of the journal at `database` (its file and its -wal), on `thread` or on any."""
        return sum(
            n
            for (path, by), n in self.syncs.items()
            if path in (str(database), f"{database}-wal") and thread in (None, by)
        )

    def reset(self) -> None:
        with self._lock:
            self.syncs.clear()

    def power_cut(self, database: Path, into: Path) -> Path:
        """The journal as a power cut now would leave it: each of its files as of its last sync
        (a file never synced is lost whole). Returns the copy's path."""
        into.mkdir(parents=True, exist_ok=True)
        copy = into / database.name
        with self._lock:
            for suffix in ("", "-wal"):
                content = self.synced.get(str(database) + suffix)
                if content is not None:
                    (into / (database.name + suffix)).write_bytes(content)
        return copy

    # --- the VFS ---------------------------------------------------------------------------

    def start(self) -> None:
        if self._lib is None:
            pytest.skip("no shared libsqlite3 to count syncs with")
        self._real = self._lib.sqlite3_vfs_find(None)
        ctypes.memmove(ctypes.byref(self._ours), self._real, ctypes.sizeof(_Vfs))
        self._ours.zName = b"toolbus-sync-counter"
        self._ours.pNext = None
        real_open = _OPEN(self._real.contents.xOpen)
        real_vfs = ctypes.cast(self._real, _P)

        def x_open(vfs: int, name: int | None, file: int, flags: int, out_flags: int) -> int:
            result = real_open(real_vfs, name, file, flags, out_flags)
            slot = ctypes.cast(file, ctypes.POINTER(_P))
            if result == 0 and slot[0]:
                self._paths[file] = ctypes.string_at(name).decode() if name else ""
                slot[0] = self._counting(slot[0])
            return int(result)

        self._open = _OPEN(x_open)  # kept alive as long as SQLite may call it
        self._ours.xOpen = ctypes.cast(self._open, _P).value
        _KEPT_ALIVE.append(self)
        self._lib.sqlite3_vfs_register(ctypes.byref(self._ours), 1)
        self._check_in_use()

    def stop(self) -> None:
        if self._lib is not None and self._real is not None:
            self._lib.sqlite3_vfs_unregister(ctypes.byref(self._ours))
            self._lib.sqlite3_vfs_register(self._real, 1)

    def _counting(self, real_methods: int) -> int:
        """A copy of a file type's methods whose xSync counts and keeps the file's bytes first."""
        if real_methods not in self._methods:
            methods = _IoMethods()
            ctypes.memmove(ctypes.byref(methods), real_methods, ctypes.sizeof(_IoMethods))
            real_sync = _SYNC(methods.xSync)

            def x_sync(file: int, flags: int) -> int:
                self.note(self._paths.get(file, ""))
                return int(real_sync(file, flags))

            counting = _SYNC(x_sync)
            methods.xSync = ctypes.cast(counting, _P).value
            self._methods[real_methods] = (methods, counting)
        return ctypes.addressof(self._methods[real_methods][0])

    def note(self, path: str) -> None:
        """A sync of `path` is about to happen: count it, and keep what it makes durable (a copy
        taken before the sync holds no byte the sync does not)."""
        with self._lock:
            self.syncs[(path, threading.current_thread().name)] += 1
            if path and os.path.exists(path):
                self.synced[path] = Path(path).read_bytes()

    def _check_in_use(self) -> None:
        """Python's sqlite3 may carry its own SQLite, which this VFS would never see."""
        with tempfile.TemporaryDirectory() as folder:
            self.reset()
            conn = sqlite3.connect(Path(folder) / "probe.db", isolation_level=None)
            try:
                conn.execute("PRAGMA synchronous = FULL")
                conn.execute("CREATE TABLE probe (x)")
            finally:
                conn.close()
        if not self.syncs:
            self.stop()
            pytest.skip("Python's sqlite3 does not use the libsqlite3 ctypes loads: syncs cannot be counted")
        self.reset()
        self.synced.clear()


@contextmanager
def counting_syncs(monkeypatch: pytest.MonkeyPatch) -> Iterator[SyncCounter]:
    """A `SyncCounter` for SQLite's syncs and toolbus's own `os.fsync` calls."""
    counter = SyncCounter()
    counter.start()
    real_fsync = os.fsync

    def fsync(fd: int) -> None:
        counter.note(os.readlink(f"/proc/self/fd/{fd}") if os.path.isdir("/proc/self/fd") else "")
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    try:
        yield counter
    finally:
        counter.stop()


def fresh_copy(path: Path, into: Path) -> Path:
    """The journal's files as they are now (every commit, synced or not): what a crash of
    toolbus would leave."""
    into.mkdir(parents=True, exist_ok=True)
    for suffix in ("", "-wal"):
        if Path(str(path) + suffix).exists():
            shutil.copyfile(str(path) + suffix, into / (path.name + suffix))
    return into / path.name
