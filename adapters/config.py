"""Settings from flags and environment variables; flags win."""

from __future__ import annotations

import argparse
import os
import socket
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar, cast, get_args

from toolbus.bus import Caller, typed_path
from toolbus.journal.location import Synchronous as SyncMode
from toolbus.journal.location import default_journal_path, is_postgres_url, not_a_file, postgres_url


@dataclass(frozen=True, slots=True)
class Settings:
    journal: Path | str  # a SQLite file, or a team journal's postgresql:// URL
    nvim: str | None  # explicit --nvim; None means $TOOLBUS_NVIM, $NVIM, then discovery
    nvim_timeout: float
    agent: str | None  # None: not given (a team journal takes it from the login)
    department: str | None
    journal_sync: SyncMode
    journal_busy_timeout: float


T = TypeVar("T")

JOURNAL_HELP = (
    "journal file, or a team journal's postgresql:// URL ($TOOLBUS_JOURNAL; default $XDG_STATE_HOME/toolbus/journal.db)"
)


NVIM_HELP = "Neovim socket path or host:port ($TOOLBUS_NVIM, then $NVIM, then a discovered running Neovim)"


def add_settings_arguments(parser: argparse.ArgumentParser, nvim_help: str = NVIM_HELP, *, editor: bool = True) -> None:
    """The flags every command that talks to the journal or Neovim shares; without `editor`,
    those of one that never talks to Neovim (an option that would change nothing is refused)."""
    parser.add_argument(
        "--journal",
        metavar="PATH|URL",
        help=JOURNAL_HELP,
    )
    if editor:
        parser.add_argument(
            "--nvim",
            metavar="ADDRESS",
            help=nvim_help,
        )
        parser.add_argument(
            "--nvim-timeout",
            type=float,
            metavar="SECONDS",
            help="timeout for each Neovim request ($TOOLBUS_NVIM_TIMEOUT; default 5)",
        )
    parser.add_argument(
        "--agent",
        help="this caller's agent name ($TOOLBUS_AGENT; default legacy; a team journal's is the login role)",
    )
    parser.add_argument("--department", help="this caller's department ($TOOLBUS_DEPARTMENT; default default)")
    parser.add_argument(
        "--journal-sync",
        choices=get_args(SyncMode),
        type=str.upper,
        help="SQLite synchronous mode ($TOOLBUS_JOURNAL_SYNC; default FULL: durable)",
    )


def settings_from(args: argparse.Namespace, env: Mapping[str, str] | None = None) -> Settings:
    env = os.environ if env is None else env
    if getattr(args, "journal", None) == "":  # `--journal "$UNSET"`: never the default journal instead
        raise ValueError("--journal: expected a journal file or a postgresql:// URL, got an empty one")
    journal = getattr(args, "journal", None) or env.get("TOOLBUS_JOURNAL")
    return Settings(
        journal=journal_location(journal, env),
        nvim=getattr(args, "nvim", None),
        nvim_timeout=_positive(*_chosen(getattr(args, "nvim_timeout", None), "--nvim-timeout", env, 5.0)),
        agent=getattr(args, "agent", None) or env.get("TOOLBUS_AGENT") or None,
        department=getattr(args, "department", None) or env.get("TOOLBUS_DEPARTMENT") or None,
        journal_sync=_sync_mode(*_chosen(getattr(args, "journal_sync", None), "--journal-sync", env, "FULL")),
        # How long a write waits for a lock another process holds (a team journal: and twice
        # that for a server that does not answer).
        journal_busy_timeout=_positive(env.get("TOOLBUS_JOURNAL_TIMEOUT") or 5.0, "$TOOLBUS_JOURNAL_TIMEOUT"),
    )


def journal_location(given: str | None, env: Mapping[str, str]) -> Path | str:
    """A team journal's URL; a file path expanded; nothing given: the default file. Text that is
    neither (a mistyped URL) is refused: it would make a local journal in a strange place."""
    if not given:
        return default_journal_path(env)
    if is_postgres_url(given):
        return postgres_url(given)
    if why := not_a_file(given):
        raise ValueError(
            f"--journal / $TOOLBUS_JOURNAL: {why}, not a journal file; "
            "a team journal's is a postgresql://USER@HOST/DATABASE URL"
        )
    typed_path(given)  # refuses a relative one if the current directory is gone
    return Path(given).expanduser()


LONGEST_TIMEOUT = 86_400


def _chosen(flag: float | str | None, option: str, env: Mapping[str, str], default: T) -> tuple[float | str | T, str]:
    """The flag's value if it was given at all (0 counts: it is refused, not replaced), else its
    environment variable's (`--nvim-timeout`: `$TOOLBUS_NVIM_TIMEOUT`), else `default`; with the
    name an error about it should quote, so that a value set in the environment is found there."""
    if flag is not None and flag != "":
        return flag, option
    variable = "TOOLBUS_" + option.removeprefix("--").replace("-", "_").upper()
    return env.get(variable) or default, f"${variable}"


def _positive(value: float | str, option: str = "--nvim-timeout") -> float:
    """A timeout in seconds: more than none, and a day at most (`inf` would wait forever)."""
    try:
        number = float(value)
    except ValueError:
        number = 0.0
    if not 0 < number <= LONGEST_TIMEOUT:
        raise ValueError(f"{option}: expected a positive number of seconds up to {LONGEST_TIMEOUT}, got {value}")
    return number


def _sync_mode(value: float | str, option: str) -> SyncMode:
    mode = str(value).upper()
    if mode not in get_args(SyncMode):
        raise ValueError(f"{option}: expected {' or '.join(get_args(SyncMode))}, got {value}")
    return cast(SyncMode, mode)


def version() -> str:
    from importlib import metadata  # 25 ms: only `--version` and `doctor` ask

    try:
        return metadata.version("toolbus")
    except metadata.PackageNotFoundError:
        return "unknown"


@dataclass(frozen=True, slots=True)
class Identity:
    """Who the journal records as the caller: an agent and its department."""

    agent: str
    department: str
    from_login: bool = False  # a team journal's login, which no call may change


def local_identity(settings: Settings) -> Identity:
    """The caller a local journal records: as given, or `legacy` of `default`."""
    return Identity(settings.agent or "legacy", settings.department or "default")


def this_host() -> str:
    """The machine toolbus runs on, as the journal names it: one file path on two machines is two
    histories."""
    return socket.gethostname()


def cli_caller(identity: Identity, client: str) -> Caller:
    """Who a command-line command acts as, for the journal."""
    return Caller(
        agent=identity.agent,
        department=identity.department,
        client_name=client,
        client_version=version(),
        host=this_host(),
        from_login=identity.from_login,
    )
