"""A real PostgreSQL for the tests: the one at `$TOOLBUS_TEST_POSTGRES` (a superuser's URL),
or one started from the `pgserver` wheel, once per test process.

Each test gets a database of its own (`fresh_database`), so tests never see each other's
journal; roles are the cluster's, so a test names its roles after its database.
"""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile
import uuid
from functools import cache
from typing import Any
from urllib.parse import quote, urlencode

import psycopg
from psycopg.conninfo import conninfo_to_dict

from toolbus.journal.postgres import connect, init_schema, register_agent


@cache
def server_url() -> str:
    """A superuser's URL for the cluster the tests use."""
    if url := os.environ.get("TOOLBUS_TEST_POSTGRES"):
        return url
    from pgserver.postgres_server import get_server  # only when no server is given

    # A short directory: the server's Unix socket path must fit in 107 bytes.
    root = tempfile.mkdtemp(prefix="tbpg")
    server = get_server(root, cleanup_mode="delete")  # a cluster is hundreds of MB: none left behind
    atexit.register(shutil.rmtree, root, ignore_errors=True)
    atexit.register(server.cleanup)  # first: atexit runs the last registered first
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
        conn.execute(f'DROP ROLE IF EXISTS "toolbus_agent_{name}"')  # its journal's agent group


def initialised_database() -> tuple[str, str]:
    """A new database with a toolbus journal in it: its name and the admin's URL."""
    name = fresh_database()
    url = with_database(server_url(), name)
    with connect(url) as conn:
        init_schema(conn)
    return name, url


class Team:
    """A team journal with three agents: two of platform, one of sales (roles named after the
    database: roles belong to the whole server)."""

    def __init__(self) -> None:
        self.database, self.admin_url = initialised_database()
        suffix = self.database.removeprefix("t_")
        self.roles = {name: f"{name}_{suffix}" for name in ("alice", "bob", "carol")}
        with connect(self.admin_url) as conn:
            for name, department in (("alice", "platform"), ("bob", "platform"), ("carol", "sales")):
                conn.execute(f"CREATE ROLE \"{self.roles[name]}\" LOGIN PASSWORD 's3cret-{name}'")
                register_agent(conn, self.roles[name], department)

    def url(self, name: str) -> str:
        return with_database(server_url(), self.database, user=self.roles[name], password=f"s3cret-{name}")

    def sql(self, name: str) -> psycopg.Connection[tuple[Any, ...]]:
        """A plain SQL session as that agent, as psql would have."""
        return psycopg.connect(self.url(name), autocommit=True, options="-c search_path=toolbus")

    def drop(self) -> None:
        drop_database(self.database)
        with psycopg.connect(server_url(), autocommit=True) as conn:
            for role in self.roles.values():
                conn.execute(f'DROP ROLE IF EXISTS "{role}"')
