"""`toolbus demo`: a guided tour on a private headless Neovim (being written)."""

from __future__ import annotations

import argparse
from typing import Any


def add_demo(commands: argparse._SubParsersAction[Any]) -> None:
    """Register `toolbus demo`."""
