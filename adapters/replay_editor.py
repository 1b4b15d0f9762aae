"""`toolbus replay editor`: re-apply recorded saves, restores and closes to a Neovim.

A replayed save writes the exact bytes the journal recorded (through Neovim, so the Neovim
may be on another machine) and leaves the file open there, loaded from what was written;
a replayed close wipes the buffer. A buffer with unsaved changes in the target Neovim is
never overwritten or wiped: the replay stops and says so.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

import pynvim

from adapters.nvim import attach
from bus import EditorUnavailable, Fault
from journal.replay import EditorStep

_LUA = r"""
local action, path, text = ...
local api = vim.api
local function find(name)
  for _, buf in ipairs(api.nvim_list_bufs()) do
    local bufname = api.nvim_buf_get_name(buf)
    if bufname ~= '' and (bufname == name or vim.uv.fs_realpath(bufname) == name) then
      return buf
    end
  end
  return nil
end
local buf = find(path)
if buf and api.nvim_buf_is_loaded(buf) and vim.bo[buf].modified then
  error(path .. ' has unsaved changes in this Neovim: save or close it, then replay again', 0)
end
if action == 'close' then
  if buf then
    api.nvim_buf_delete(buf, { force = true })
  end
  return buf ~= nil
end
vim.fn.mkdir(vim.fn.fnamemodify(path, ':h'), 'p')
local file, err = io.open(path, 'wb')
if not file then
  error('cannot write ' .. path .. ': ' .. tostring(err), 0)
end
file:write(text)
file:close()
if buf and api.nvim_buf_is_loaded(buf) then
  api.nvim_buf_call(buf, function() vim.cmd('silent edit!') end)
else
  buf = buf or vim.fn.bufadd(path)
  vim.bo[buf].swapfile = false
  vim.bo[buf].buflisted = true
  vim.fn.bufload(buf)
end
return true
"""


def replay_to_neovim(address: str, steps: Iterable[EditorStep]) -> Iterator[EditorStep]:
    """Apply each step in order, yielding it once done."""
    try:
        nvim = attach(address)
    except OSError as error:
        raise EditorUnavailable(f"Neovim at {address} is not reachable ({error}): is it running?") from None
    try:
        for step in steps:
            _apply(nvim, step)
            yield step
    finally:
        nvim.close()


def _apply(nvim: pynvim.Nvim, step: EditorStep) -> None:
    try:
        nvim.exec_lua(_LUA, step.action, step.path, step.content or b"")
    except pynvim.NvimError as error:
        message = str(error).removeprefix("Error executing lua: ").split("\n")[0]
        raise Fault(f"replay stopped at @{step.position}: {message}") from None
