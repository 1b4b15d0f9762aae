"""Where a journal is: a SQLite file, or a team journal's PostgreSQL URL (told apart, and shown
to people, without importing either backend)."""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Literal
from urllib.parse import urlsplit

Synchronous = Literal["FULL", "NORMAL"]  # a SQLite journal's `PRAGMA synchronous`


def default_journal_path(env: Mapping[str, str] | None = None) -> Path:
    """`$XDG_STATE_HOME/toolbus/journal.db`, i.e. `~/.local/state/toolbus/journal.db`. A
    relative `$XDG_STATE_HOME` is ignored, as the XDG spec says: it would put the journal
    wherever the agent happened to start toolbus."""
    state_home = (os.environ if env is None else env).get("XDG_STATE_HOME", "")
    if not os.path.isabs(state_home):
        state_home = os.path.join(os.path.expanduser("~"), ".local", "state")
    return Path(state_home) / "toolbus" / "journal.db"


_SCHEME = re.compile(r"([A-Za-z][A-Za-z0-9+.-]*)://")
_POSTGRES_SCHEMES = ("postgresql", "postgres")
# Text shaped like a URL whatever its typos (a blank before it, one slash, none, a colon left
# out): a scheme and a colon, then a login (`@`); a login after `//` (`//alice:secret@`); or
# `postgres` or `postgresql` then `:`, `//` or `;`. Never a journal file's path.
_URL_LIKE = re.compile(
    r"\s*(?:[A-Za-z][A-Za-z0-9+.-]*:/*[^/@\s]*@|//[^\s/:@]+:[^\s/@]*@|postgres(?:ql)?(?:\s*:|//|;))", re.IGNORECASE
)
# libpq's key=value form of a connection, which toolbus does not take: a password, or two keys.
_CONNINFO_KEY = re.compile(r"(?:^|\s)(host|hostaddr|port|dbname|user|password|service|sslmode)\s*=")


def is_postgres_url(location: str) -> bool:
    return (scheme := _SCHEME.match(location)) is not None and scheme[1].lower() in _POSTGRES_SCHEMES


def postgres_url(location: str) -> str:
    """A team journal's URL with its scheme in lower case, the only case libpq reads."""
    scheme = location.split("://", 1)[0]
    return scheme.lower() + location[len(scheme) :]


def not_a_file(location: str) -> str | None:
    """What `location`, not a team journal's URL, is instead of a journal file's path (said
    without the text, which may hold a password): some other URL, or libpq's key=value form;
    None if it may be a path."""
    if _SCHEME.match(location) or _URL_LIKE.match(location):
        return "a URL"
    keys = _CONNINFO_KEY.findall(location)
    if "password" in keys or len(set(keys)) > 1:
        return "a key=value connection string"
    return None


def ambiguous_login(url: str) -> bool:
    """Whether a URL's user and password (before its last '@') hold an '@', '#', '?' or '/'
    that was not percent-encoded: parsers then split it differently, and a piece of the password
    would pass for a host or a port."""
    login = url.partition("://")[2].rpartition("@")[0]
    return any(mark in login for mark in "@#?/")


def shown(location: Path | str) -> str:
    """The journal's location as logs and messages may show it: a URL without its password
    (and without its query, which may hold one too)."""
    if isinstance(location, Path):
        return str(location)
    if ambiguous_login(location):
        return "a URL that cannot be read"
    try:
        parts = urlsplit(location)
        user = f"{parts.username}@" if parts.username else ""
        host = parts.hostname or ""
        port = f":{parts.port}" if parts.port else ""
    except ValueError:
        return "a URL that cannot be read"
    if "@" in parts.path:  # a password holding a '/', read as the host's port and a path
        return "a URL that cannot be read"
    return f"{parts.scheme}://{user}{host}{port}{parts.path}"
