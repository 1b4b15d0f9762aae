"""Settings: flags win over environment variables, and a bad value is refused, not replaced."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from toolbus.adapters.config import Identity, add_settings_arguments, local_identity, settings_from


def settings(*flags: str, **env: str):  # type: ignore[no-untyped-def]
    parser = argparse.ArgumentParser()
    add_settings_arguments(parser)
    return settings_from(parser.parse_args(flags), env)


def test_defaults_follow_the_xdg_state_directory() -> None:
    current = settings(XDG_STATE_HOME="/state")
    assert current.journal == Path("/state/toolbus/journal.db")
    assert (current.nvim_timeout, local_identity(current), current.journal_sync) == (
        5.0,
        Identity("legacy", "default"),
        "FULL",
    )


@pytest.mark.parametrize("relative", ["state", "./state", "~/state"])
def test_a_relative_xdg_state_directory_is_ignored(relative: str) -> None:
    assert settings(XDG_STATE_HOME=relative).journal == Path.home() / ".local/state/toolbus/journal.db"


def test_flags_win_over_the_environment() -> None:
    current = settings(
        "--journal",
        "/j.db",
        "--nvim-timeout",
        "2",
        "--agent",
        "a",
        "--department",
        "d",
        "--journal-sync",
        "normal",
        TOOLBUS_JOURNAL="/env.db",
        TOOLBUS_NVIM_TIMEOUT="9",
        TOOLBUS_AGENT="x",
        TOOLBUS_DEPARTMENT="y",
        TOOLBUS_JOURNAL_SYNC="FULL",
    )
    assert (
        current.journal,
        current.nvim_timeout,
        current.agent,
        current.department,
        current.journal_sync,
    ) == (
        Path("/j.db"),
        2.0,
        "a",
        "d",
        "NORMAL",
    )


def test_the_environment_is_used_without_flags() -> None:
    current = settings(TOOLBUS_JOURNAL="~/j.db", TOOLBUS_NVIM_TIMEOUT="0.5", TOOLBUS_AGENT="claude")
    assert current.journal == Path("~/j.db").expanduser()
    assert (current.nvim_timeout, current.agent) == (0.5, "claude")


@pytest.mark.parametrize(
    ("flags", "env", "message"),
    [
        (("--nvim-timeout", "0"), {}, "--nvim-timeout: expected a positive number of seconds up to 86400, got 0"),
        (("--nvim-timeout", "inf"), {}, "--nvim-timeout: expected a positive number of seconds up to 86400, got inf"),
        ((), {"TOOLBUS_NVIM_TIMEOUT": "1e12"}, r"\$TOOLBUS_NVIM_TIMEOUT: expected .* up to 86400, got 1e12"),
        ((), {"TOOLBUS_JOURNAL_TIMEOUT": "inf"}, r"\$TOOLBUS_JOURNAL_TIMEOUT: expected .* up to 86400, got inf"),
        (("--journal", ""), {}, "--journal: expected a journal file or a postgresql:// URL, got an empty one"),
        (
            (),
            {"TOOLBUS_NVIM_TIMEOUT": "soon"},
            r"\$TOOLBUS_NVIM_TIMEOUT: expected a positive number of seconds up to 86400, got soon",
        ),
        ((), {"TOOLBUS_JOURNAL_SYNC": "OFF"}, r"\$TOOLBUS_JOURNAL_SYNC: expected FULL or NORMAL, got OFF"),
    ],
)
def test_bad_values_are_refused(flags: tuple[str, ...], env: dict[str, str], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        settings(*flags, **env)


def test_the_journal_timeout_comes_from_the_environment_and_must_be_positive() -> None:
    assert settings(TOOLBUS_JOURNAL_TIMEOUT="1.5").journal_busy_timeout == 1.5
    assert settings().journal_busy_timeout == 5.0
    with pytest.raises(ValueError, match=r"\$TOOLBUS_JOURNAL_TIMEOUT: expected a positive number"):
        settings(TOOLBUS_JOURNAL_TIMEOUT="0")
