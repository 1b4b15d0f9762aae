"""Where a journal is: a SQLite file, or a team journal's PostgreSQL URL (told apart, and shown
to people, without importing either backend)."""

from __future__ import annotations

from pathlib import Path
from urllib.parse import urlsplit


def is_postgres_url(location: str) -> bool:
    return location.startswith(("postgresql://", "postgres://"))


def shown(location: Path | str) -> str:
    """The journal's location as logs and messages may show it: a URL without its password
    (and without its query, which may hold one too)."""
    if isinstance(location, Path):
        return str(location)
    try:
        parts = urlsplit(location)
        user = f"{parts.username}@" if parts.username else ""
        host = parts.hostname or ""
        port = f":{parts.port}" if parts.port else ""
    except ValueError:
        return "a PostgreSQL URL that cannot be read"
    return f"{parts.scheme}://{user}{host}{port}{parts.path}"
