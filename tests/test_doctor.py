"""`toolbus doctor`: what toolbus would use, whether it works, and what to do when it does not."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

from tests.conftest import NeovimProcess


def doctor(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if k not in ("NVIM", "TOOLBUS_NVIM", "TOOLBUS_JOURNAL")}
    return subprocess.run(
        [sys.executable, "-m", "toolbus.adapters.cli", "doctor", *args],
        env=base | (env or {}),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_doctor_reports_a_working_setup(nvim: NeovimProcess, journal_path: Path) -> None:
    result = doctor("--journal", str(journal_path), env={"NVIM": nvim.address})
    assert result.returncode == 0, result.stdout + result.stderr
    version = nvim.lua("local v = vim.version() return v.major .. '.' .. v.minor .. '.' .. v.patch")
    assert f"✓ neovim: {nvim.address} (from $NVIM) answers: NVIM v{version}, cwd" in result.stdout
    assert f"✓ journal: {journal_path} (will be created on first use)" in result.stdout
    assert "versions: toolbus" in result.stdout and "mcp 2." in result.stdout
    assert not journal_path.exists()  # looking is not creating


def test_doctor_prefers_the_flag_over_the_environment(nvim: NeovimProcess, journal_path: Path) -> None:
    result = doctor("--journal", str(journal_path), "--nvim", nvim.address, env={"TOOLBUS_NVIM": "/nowhere"})
    assert "(from --nvim) answers" in result.stdout


def test_doctor_fails_and_says_what_to_do_without_neovim(tmp_path: Path, journal_path: Path) -> None:
    gone = str(tmp_path / "gone.sock")
    result = doctor("--journal", str(journal_path), env={"TOOLBUS_NVIM": gone})
    assert result.returncode == 1
    assert f"✗ neovim: {gone} (from $TOOLBUS_NVIM) cannot be reached: No such file or directory." in result.stdout
    assert "v:servername" in result.stdout


def test_doctor_says_a_neovim_that_is_there_but_silent_does_not_answer(tmp_path: Path, journal_path: Path) -> None:
    silent = socket.socket(socket.AF_UNIX)  # listens, never answers: a Neovim stopped in its tracks
    silent.bind(str(tmp_path / "silent.sock"))
    silent.listen()
    with silent:
        result = doctor(
            "--journal", str(journal_path), "--nvim", str(tmp_path / "silent.sock"), "--nvim-timeout", "0.5"
        )
    assert result.returncode == 1
    assert f"✗ neovim: {tmp_path / 'silent.sock'} (from --nvim) does not answer within 0.5 s." in result.stdout


def test_doctor_flags_a_file_that_is_not_a_journal(nvim: NeovimProcess, tmp_path: Path) -> None:
    garbage = tmp_path / "journal.db"
    garbage.write_bytes(b"not sqlite at all" * 100)
    result = doctor("--journal", str(garbage), "--nvim", nvim.address)
    assert result.returncode == 1
    assert "✗ journal: not a toolbus journal" in result.stdout
    assert garbage.read_bytes() == b"not sqlite at all" * 100


def test_doctor_never_turns_an_empty_file_into_a_journal(nvim: NeovimProcess, tmp_path: Path) -> None:
    empty = tmp_path / "journal.db"
    empty.touch()
    result = doctor("--journal", str(empty), "--nvim", nvim.address)
    assert result.returncode == 1
    assert "✗ journal: not a toolbus journal" in result.stdout and "empty file" in result.stdout
    assert empty.read_bytes() == b""
    assert sorted(p.name for p in tmp_path.iterdir()) == ["journal.db", "nvim"]


def test_doctor_says_a_journal_under_a_file_cannot_be_created(nvim: NeovimProcess, tmp_path: Path) -> None:
    (tmp_path / "afile").write_text("mine\n")
    journal = tmp_path / "afile" / "state" / "journal.db"
    result = doctor("--journal", str(journal), "--nvim", nvim.address)
    assert result.returncode == 1, result.stdout
    assert f"✗ journal: {journal} cannot be created ({tmp_path / 'afile'} is a file, not a folder)" in result.stdout
    assert (tmp_path / "afile").read_text() == "mine\n"
