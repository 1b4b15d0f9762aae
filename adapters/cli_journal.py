"""The journal's command line: audit, history, recover, replay."""

from __future__ import annotations

import argparse
from typing import Any


def add_commands(commands: argparse._SubParsersAction[Any]) -> None:
    """Register the journal subcommands (none yet)."""
