"""A real PostgreSQL for the tests: the one at `$TOOLBUS_TEST_POSTGRES` (a superuser's URL),
or one started from the `pgserver` wheel, once per test process.

Each test gets a database of its own (`fresh_database`), so tests never see each other's
journal; roles are the cluster's, so a test names its roles after its database.
"""

from __future__ import annotations

import atexit
import os
import tempfile
import uuid
from functools import cache
from urllib.parse import quote, urlencode

import psycopg
from psycopg.conninfo import conninfo_to_dict


@cache
def server_url() -> str:
    """A superuser's URL for the cluster the tests use."""
    if url := os.environ.get("TOOLBUS_TEST_POSTGRES"):
        return url
    import pgserver  # only when no server is given

    # A short directory: the server's Unix socket path must fit in 107 bytes.
    root = tempfile.mkdtemp(prefix="tbpg")
    server = pgserver.get_server(root, cleanup_mode="stop")
    atexit.register(server.cleanup)
    return str(server.get_uri())


def admin(database: str = "postgres") -> psycopg.Connection[tuple[object, ...]]:
    return psycopg.connect(with_database(server_url(), database), autocommit=True)


def with_database(url: str, database: str, user: str | None = None, password: str | None = None) -> str:
    """A `postgresql://` URL for another database (as another user) on `url`'s server."""
    params = conninfo_to_dict(url)
    login = quote(user or str(params.get("user", "postgres")), safe="")
    if password is not None:
        login += ":" + quote(password, safe="")
    host = str(params.get("host", ""))
    query = {"host": host} if host.startswith("/") else {}
    netloc = "" if query else host + (f":{params['port']}" if "port" in params else "")
    return f"postgresql://{login}@{netloc}/{quote(database, safe='')}" + (f"?{urlencode(query)}" if query else "")


def fresh_database() -> str:
    """Create an empty database; return its name."""
    name = f"t_{uuid.uuid4().hex[:12]}"
    with admin() as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    return name


def drop_database(name: str) -> None:
    with admin() as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
