"""`toolbus demo`: a newcomer's first run, end to end (headless Neovim, `toolbus serve`, journal)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
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
        "→ FILE_SAVED\n          print('hello, toolbus')\n          print('goodbye')\n",  # as the user edited it
        "→ DIFF_REJECTED",
        "→ TAB_CLOSED",
        'expected an absolute path, got "hello.py"',
        '"title": "Greeting now names toolbus"',  # found by search
        "TIME (UTC)",
        "@1 saved 24 B, replaced 15 B",
        "@3 diff accepted, edited by the user: saved 41 B, replaced 24 B",
        "@5 diff rejected by the user",
        "12 B proposal, rejected",  # hello.py's history: the rejected proposal is recoverable
        "@6 closed, discarded 57 B unsaved",
        "    - [ ] write the tests first",
        "@8 restored 57 B from @6",
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
        assert (root / "project" / "notes.md").read_text().startswith("# Notes\n\n- [ ] write the tests first")
    finally:
        shutil.rmtree(root)


def test_demo_piped_into_a_reader_that_stops_early_ends_quietly_and_cleans_up() -> None:
    """`toolbus demo | head -2`: the reader closes the pipe while the demo's task group runs."""
    demo = subprocess.Popen(
        [sys.executable, "-m", "toolbus.adapters.cli", "demo"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env={k: v for k, v in os.environ.items() if k not in ("NVIM", "TOOLBUS_NVIM", "TOOLBUS_JOURNAL")},
    )
    assert demo.stdout is not None and demo.stderr is not None
    first = demo.stdout.readline().decode()
    demo.stdout.close()  # as `head -1` exits
    err = demo.stderr.read().decode()
    assert demo.wait(timeout=60) == 0, err
    assert "Traceback" not in err
    root = Path(re.search(r"its files are in (\S+)/project\.", first)[1])  # type: ignore[index]
    assert not root.exists()
