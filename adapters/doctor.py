"""`toolbus doctor`: what toolbus would connect to, and whether it works."""

from __future__ import annotations

import os
import platform
import sqlite3
from importlib import metadata
from typing import TYPE_CHECKING

from toolbus.adapters.bootstrap import identity, open_reader
from toolbus.adapters.config import Settings, local_identity
from toolbus.adapters.nvim import ProbeFailed, find_nvim, probe
from toolbus.bus import JournalUnavailable
from toolbus.journal.sqlite.store import why_not_creatable

if TYPE_CHECKING:
    import pynvim


def diagnose(settings: Settings, toolbus_version: str) -> tuple[str, bool]:
    """A short report for people, and whether everything is usable."""
    lines: list[str] = []
    nvim_ok = _check_nvim(settings, lines)
    journal_ok = _check_journal(settings, lines)
    lines.append(
        f"versions: toolbus {toolbus_version}, Python {platform.python_version()}, "
        f"SQLite {sqlite3.sqlite_version}, "
        + ", ".join(f"{name} {_version(name)}" for name in ("mcp", "pynvim", "msgspec", "sqlite-utils", "psycopg"))
    )
    if not isinstance(settings.journal, str):  # a team journal's identity is its login: shown with it
        caller = local_identity(settings)
        lines.append(f"identity: agent {caller.agent!r}, department {caller.department!r}")
    healthy = nvim_ok and journal_ok
    lines.append("ok: toolbus is ready" if healthy else "not ready: fix the lines marked ✗ above")
    return "\n".join(lines), healthy


def _check_nvim(settings: Settings, lines: list[str]) -> bool:
    found = find_nvim(settings.nvim)
    if found is None:
        lines.append(
            "✗ neovim: none found (no --nvim, $TOOLBUS_NVIM or $NVIM, and no running Neovim socket). "
            "Start Neovim with --listen ADDRESS and pass that address with --nvim or $TOOLBUS_NVIM"
        )
        return False
    try:
        info, cwd = probe(found.address, _version_and_cwd, timeout=settings.nvim_timeout)
    except ProbeFailed as failed:
        lines.append(
            f"✗ neovim: {found.address} (from {found.source}) {failed}. "
            "Is that Neovim running? Check :echo v:servername inside it"
        )
        return False
    lines.append(f"✓ neovim: {found.address} (from {found.source}) answers: NVIM v{info}, cwd {cwd}")
    return True


def _version_and_cwd(nvim: pynvim.Nvim) -> tuple[str, str]:
    version = "local v = vim.version() return ('%d.%d.%d'):format(v.major, v.minor, v.patch)"
    return str(nvim.request("nvim_exec_lua", version, [])), str(nvim.funcs.getcwd())


def _check_journal(settings: Settings, lines: list[str]) -> bool:
    if isinstance(settings.journal, str):
        return _check_team_journal(settings, lines)
    path = settings.journal
    if not path.exists():
        if (why := why_not_creatable(path)) is None:
            lines.append(f"✓ journal: {path} (will be created on first use)")
            return True
        lines.append(f"✗ journal: {path} cannot be created ({why}); choose another with --journal or $TOOLBUS_JOURNAL")
        return False
    try:
        reader = open_reader(settings)  # looking must not create, migrate or change anything
    except JournalUnavailable as error:
        lines.append(f"✗ journal: {error}")
        return False
    try:
        commands, events = reader.counts()
    finally:
        reader.close()
    writable = os.access(path, os.W_OK) and os.access(path.parent, os.W_OK)
    mark = "✓" if writable else "✗"
    state = "writable" if writable else "NOT writable: fix its permissions or choose another with --journal"
    lines.append(f"{mark} journal: {path} ({state}; {commands} commands, {events} events)")
    return writable


def _check_team_journal(settings: Settings, lines: list[str]) -> bool:
    from toolbus.journal.postgres import PostgresReader

    try:
        reader = PostgresReader(str(settings.journal))
    except JournalUnavailable as error:
        lines.append(f"✗ journal: {error}")
        return False
    try:
        commands, events = reader.counts()
        version = reader.schema_version()
    finally:
        reader.close()
    lines.append(f"✓ journal: {reader.location} (a team journal; {commands} commands, {events} events visible)")
    if missing := _schema_additions_missing(version):
        lines.append(
            "⚠ journal: its schema is older than this toolbus's; the team's admin brings it up to date with "
            f"`toolbus journal init URL` (no data changes). Until then it lacks {'; '.join(missing)}"
        )
    try:
        caller = identity(settings, reader)  # as `serve` judges it
    except ValueError as error:
        lines.append(f"✗ identity: {error}")
        return False
    lines.append(f"identity: agent {caller.agent!r}, department {caller.department!r} (from the login)")
    return True


def _schema_additions_missing(version: int | None) -> list[str]:
    from toolbus.journal.postgres.schema import SCHEMA_ADDITIONS

    return [added for number, added in SCHEMA_ADDITIONS.items() if version is not None and number > version]


def _version(distribution: str) -> str:
    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return "missing"
