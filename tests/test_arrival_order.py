"""Calls to the editor take effect in the order they arrive, even when the client sends several
without waiting: a call sent after another sees its effects."""

from __future__ import annotations

from pathlib import Path

from tests.conftest import JournalReader, NeovimProcess
from tests.rpc_client import StdioServer, result_json, result_text, toolbus_argv


def test_calls_sent_without_waiting_take_effect_in_arrival_order(
    tmp_path: Path, nvim: NeovimProcess, files: Path, journal_path: Path
) -> None:
    paths = [files / f"f{n}.txt" for n in range(4)]
    for path in paths:
        path.write_text("old\n")
        nvim.edit(path)
        nvim.set_lines(path, [f"new {path.name}"])
    with StdioServer(toolbus_argv(journal_path, nvim=nvim.address), stderr=tmp_path / "serve.stderr") as server:
        server.initialize()
        burst: list[tuple[str, dict[str, str]]] = []
        for path in paths:
            burst += [
                ("checkDocumentDirty", {"filePath": str(path)}),
                ("saveDocument", {"filePath": str(path)}),
                ("checkDocumentDirty", {"filePath": str(path)}),
            ]
        burst += [("close_tab", {"tab_name": str(paths[0])}), ("getOpenEditors", {})]
        ids = [server.send_request("tools/call", {"name": tool, "arguments": args}) for tool, args in burst]
        results = server.wait_for_all(ids)

    answers = iter(results)
    for path in paths:
        assert result_json(next(answers))["isDirty"] is True, path  # asked before the save
        assert result_json(next(answers))["saved"] is True, path
        assert result_json(next(answers))["isDirty"] is False, path  # asked after it
        assert path.read_text() == f"new {path.name}\n"
    assert result_text(next(answers)) == "TAB_CLOSED"
    open_now = {tab["uri"] for tab in result_json(next(answers))["tabs"]}
    assert paths[0].resolve().as_uri() not in open_now
    assert {p.resolve().as_uri() for p in paths[1:]} <= open_now

    journal = JournalReader(journal_path)
    saved = [event["data"]["path"] for event in journal.events("DocumentSaved")]
    assert saved == [str(path.resolve()) for path in paths]
    [closed] = journal.events("TabClosed")
    assert closed["position"] > journal.events("DocumentSaved")[-1]["position"]


def test_a_call_refused_before_it_ran_or_cancelled_holds_no_one_back(
    tmp_path: Path, nvim: NeovimProcess, files: Path, journal_path: Path
) -> None:
    path = files / "a.txt"
    path.write_text("a\n")
    nvim.edit(path)
    with StdioServer(toolbus_argv(journal_path, nvim=nvim.address), stderr=tmp_path / "serve.stderr") as server:
        server.initialize()
        server.send_request("tools/call", {"name": "checkDocumentDirty", "arguments": "not an object"})
        cancelled = server.send_request("tools/call", {"name": "getOpenEditors", "arguments": {}})
        server.notify("notifications/cancelled", {"requestId": cancelled})
        after = server.send_request("tools/call", {"name": "checkDocumentDirty", "arguments": {"filePath": str(path)}})
        assert result_json(server.wait_for(after))["isDirty"] is False


def test_a_call_cancelled_before_its_turn_never_runs(
    tmp_path: Path, nvim: NeovimProcess, files: Path, journal_path: Path
) -> None:
    """Woken by its cancellation, it must not run before the SDK cancels it: a cancelled
    close_tab queued behind a slow save once wiped its buffer anyway."""
    slow, kept = files / "slow.txt", files / "kept.txt"
    for path in (slow, kept):
        path.write_text("old\n")
        nvim.edit(path)
    nvim.set_lines(slow, ["new"])
    # The save holds Neovim for a second: the close is still queued when its cancellation comes.
    nvim.command("autocmd BufWritePre * let g:t = reltime() | while reltimefloat(reltime(g:t)) < 1 | endwhile")
    with StdioServer(toolbus_argv(journal_path, nvim=nvim.address), stderr=tmp_path / "serve.stderr") as server:
        server.initialize()
        save = server.send_request("tools/call", {"name": "saveDocument", "arguments": {"filePath": str(slow)}})
        close = server.send_request("tools/call", {"name": "close_tab", "arguments": {"tab_name": str(kept)}})
        server.notify("notifications/cancelled", {"requestId": close})
        assert result_json(server.wait_for(save))["saved"] is True
        after = server.send_request("tools/call", {"name": "getOpenEditors", "arguments": {}})
        assert kept.resolve().as_uri() in {tab["uri"] for tab in result_json(server.wait_for(after))["tabs"]}

    journal = JournalReader(journal_path)
    assert [(c["tool"], c["status"]) for c in journal.commands("close_tab")] == [("close_tab", "cancelled")]
    assert journal.events("TabClosed") == []
    assert str(kept) in nvim.buffer_names()
