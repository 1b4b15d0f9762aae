"""The shape of the code: dependencies point inward, no import cycles, one import package."""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("bus", "handlers", "adapters", "journal")


def _toolbus_folder(tmp_path: Path) -> Path:
    """A `toolbus` folder whose four packages are the repository's own folders, as installed."""
    (tmp_path / "toolbus").mkdir()
    for name in PACKAGES:
        (tmp_path / "toolbus" / name).symlink_to(ROOT / name)
    return tmp_path


def _run_tool(name: str, args: list[str], folder: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(Path(sys.executable).with_name(name)), *args],
        env=dict(os.environ, PYTHONPATH=str(folder), MYPYPATH=str(folder)),
        cwd=folder,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_import_contracts_hold(tmp_path: Path) -> None:
    """import-linter's contracts in pyproject.toml: layers bus < handlers < journal < adapters,
    and no cycles between sibling modules (imports inside functions count)."""
    args = ["--no-cache", "--no-logo", "--config", str(ROOT / "pyproject.toml")]
    run = _run_tool("lint-imports", args, _toolbus_folder(tmp_path))
    assert run.returncode == 0, run.stdout + run.stderr
    assert "2 kept, 0 broken" in run.stdout


def test_the_code_type_checks_strictly(tmp_path: Path) -> None:
    """mypy --strict (pyproject.toml) over the four packages and tests/ (benchmarks too) finds nothing."""
    folder = _toolbus_folder(tmp_path)
    (folder / "tests").symlink_to(ROOT / "tests")
    packages = [arg for name in PACKAGES for arg in ("-p", f"toolbus.{name}")]
    packages += ["-p", "tests"]
    args = ["--config-file", str(ROOT / "pyproject.toml"), "--python-executable", sys.executable, *packages]
    run = _run_tool("mypy", args, folder)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "Success: no issues found in" in run.stdout


def test_ruff_finds_nothing() -> None:
    """The lint rules and the formatting in pyproject.toml hold everywhere."""
    for args in (["check", "--no-cache", "."], ["format", "--check", "--no-cache", "."]):
        run = _run_tool("ruff", args, ROOT)
        assert run.returncode == 0, run.stdout + run.stderr


def test_the_wheel_holds_only_the_toolbus_package(tmp_path: Path) -> None:
    run = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(tmp_path), str(ROOT)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0, run.stderr
    [wheel] = tmp_path.glob("toolbus-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    dist_info = "-".join(wheel.name.split("-")[:2]) + ".dist-info"
    assert {name.split("/")[0] for name in names} == {"toolbus", dist_info}
    for package in PACKAGES:
        assert f"toolbus/{package}/__init__.py" in names
    assert "toolbus/adapters/nvim.lua" in names


def test_a_journal_command_loads_no_server_editor_or_schema_code(tmp_path: Path) -> None:
    """`toolbus audit` on an existing journal, or with a bad option, imports only what it runs:
    not the MCP SDK, pynvim, asyncio, the handlers, sqlite-utils (only to create or migrate a
    journal) or importlib.metadata (only for `--version`). Each would cost every command time."""
    from toolbus.journal import SqliteJournal

    SqliteJournal(tmp_path / "journal.db").close()
    heavy = ("mcp", "pynvim", "asyncio", "toolbus.handlers", "sqlite_utils", "importlib.metadata", "psycopg")
    for args in (["audit"], ["audit", "--status", "fine"]):
        probe = (
            "import sys; from toolbus.adapters.cli import main; "
            f"code = main({[*args, '--journal', str(tmp_path / 'journal.db')]!r}); "
            f"print(code, [name for name in {heavy!r} if name in sys.modules], file=sys.stderr)"
        )
        run = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60)
        *_, last = run.stderr.splitlines()
        assert last == ("0 []" if args == ["audit"] else "2 []"), run.stderr
