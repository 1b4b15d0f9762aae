"""`toolbus demo`: a newcomer's first run, end to end (headless Neovim, `toolbus serve`, journal)."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

from tests.journal_helpers import cli


def test_demo_shows_tool_calls_the_audit_and_a_recovered_text() -> None:
    run = cli("demo")
    assert run.code == 0, run.err
    out = run.out
    root = Path(re.search(r"its files are in (\S+)/project\.", out)[1])  # type: ignore[index]
    assert not root.exists()  # cleaned up
    for expected in (
        '"isDirty": true',
        '"message": "Document saved successfully"',
        "→ TAB_CLOSED",
        'expected an absolute path, got "hello.py"',
        '"title": "Greeting now names toolbus"',  # found by search
        "TIME (UTC)",
        "@1 saved 24 B, replaced 15 B",
        "@2 closed, discarded 57 B unsaved",
        "    - [ ] write the tests first",
        "@4 restored 57 B from @2",
    ):
        assert expected in out, expected
    assert "Traceback" not in run.err


def test_demo_keep_leaves_a_journal_to_explore() -> None:
    run = cli("demo", "--keep")
    assert run.code == 0, run.err
    root = Path(re.search(r"its files are in (\S+)/project\.", run.out)[1])  # type: ignore[index]
    try:
        journal = root / "state" / "toolbus" / "journal.db"
        assert f"toolbus audit --journal {journal}" in run.out
        audit = cli("audit", "--journal", journal, "--json", "--tool", "recover")
        assert [line["status"] for line in audit.json_lines()] == ["ok"]
        assert (
            (root / "project" / "notes.md").read_text().startswith("# Notes\n\n- [ ] write the tests first")
        )
    finally:
        shutil.rmtree(root)
