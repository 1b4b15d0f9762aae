-- toolbus helpers, sent over RPC the first time a Neovim lacks them (kept in a global named
-- after this file's hash): every editor tool is then one or two requests. Paths arrive
-- absolute with `~` expanded; symlinks are resolved here, on Neovim's side.
local M = {}
local api = vim.api

local function normalise(name)
  return vim.uv.fs_realpath(name) or vim.fs.normalize(name)
end

local function read_file(name)
  local file = io.open(name, 'rb')
  if not file then
    return vim.NIL
  end
  local content = file:read('*a')
  file:close()
  return content
end

-- The text a buffer would write: its lines, plus a final newline when it has one.
local function buffer_text(buf)
  local text = table.concat(api.nvim_buf_get_lines(buf, 0, -1, false), '\n')
  if vim.bo[buf].eol or vim.bo[buf].fixeol then
    text = text .. '\n'
  end
  return text
end

-- Buffers the user has open: listed, loaded and named. Hidden and unloaded buffers are not.
local function open_buffers()
  local found = {}
  for _, buf in ipairs(api.nvim_list_bufs()) do
    if vim.bo[buf].buflisted and api.nvim_buf_is_loaded(buf) and api.nvim_buf_get_name(buf) ~= '' then
      found[#found + 1] = buf
    end
  end
  return found
end

local function same_file(buf, wanted)
  local name = api.nvim_buf_get_name(buf)
  return name == wanted or normalise(name) == wanted
end

-- The open buffer whose full name is `path`: exact comparison, symlinks resolved on both sides.
local function find_open(path)
  local wanted = normalise(path)
  for _, buf in ipairs(open_buffers()) do
    if same_file(buf, wanted) then
      return buf
    end
  end
  return nil
end

-- :checktime without its prompt. An unmodified buffer is reloaded; a modified one is left
-- alone and remembered as conflicting (a second :checktime would no longer report it).
local function check_disk(buf)
  local changed, reloaded = false, false
  local group = api.nvim_create_augroup('toolbus_checktime', { clear = true })
  api.nvim_create_autocmd('FileChangedShell', {
    group = group,
    buffer = buf,
    callback = function()
      local reason = vim.v.fcs_reason
      changed = reason ~= 'mode' and reason ~= 'time'
      if not changed then
        vim.v.fcs_choice = ''
      elseif reason == 'conflict' then
        vim.b[buf].toolbus_disk_conflict = true
        vim.v.fcs_choice = ''
      elseif reason == 'deleted' or vim.bo[buf].modified then
        vim.v.fcs_choice = ''
      else
        vim.v.fcs_choice = 'reload'
        reloaded = true
      end
    end,
  })
  -- With 'autoread', Vim reloads an unmodified buffer itself and only this one fires.
  api.nvim_create_autocmd('FileChangedShellPost', {
    group = group,
    buffer = buf,
    callback = function()
      changed, reloaded = true, true
    end,
  })
  local ok, err = pcall(vim.cmd, 'checktime ' .. buf)
  api.nvim_del_augroup_by_id(group)
  if not ok then
    error(err, 0)
  end
  return changed, reloaded
end

function M.list()
  local current = api.nvim_get_current_buf()
  local tabs = {}
  for _, buf in ipairs(open_buffers()) do
    local name = api.nvim_buf_get_name(buf)
    if vim.bo[buf].buftype == '' then
      local filetype = vim.bo[buf].filetype
      tabs[#tabs + 1] = {
        uri = vim.uri_from_bufnr(buf),
        isActive = buf == current,
        label = vim.fn.fnamemodify(name, ':t'),
        languageId = filetype ~= '' and filetype or 'plaintext',
        isDirty = vim.bo[buf].modified,
      }
    end
  end
  return tabs
end

function M.dirty(path)
  local buf = find_open(path)
  if not buf then
    return vim.NIL
  end
  return vim.bo[buf].modified
end

function M.save(path)
  local buf = find_open(path)
  if not buf then
    return { status = 'not_open' }
  end
  local name = api.nvim_buf_get_name(buf)
  local ok, changed, reloaded = pcall(check_disk, buf)
  if not ok then
    return { status = 'vim_error', message = changed }
  end
  if vim.b[buf].toolbus_disk_conflict then
    if vim.bo[buf].modified then
      return { status = 'conflict' }
    end
    -- The user undid their edits: the disk version wins, as for any unmodified buffer.
    -- (Vim was told of the change already, so :write would now prompt instead.)
    api.nvim_buf_call(buf, function()
      vim.cmd('silent edit!')
    end)
    vim.b[buf].toolbus_disk_conflict = nil
    changed, reloaded = true, true
  end
  local before = read_file(name)
  local written, err = pcall(api.nvim_buf_call, buf, function()
    vim.cmd('silent write')
  end)
  if not written then
    return { status = 'vim_error', message = err }
  end
  if vim.bo[buf].modified then
    return { status = 'vim_error', message = 'the buffer is still modified after :write' }
  end
  return { status = 'saved', before = before, after = read_file(name), changed = changed, reloaded = reloaded }
end

-- The one open buffer named `path` (exactly) or, failing that, ending in '/' .. tab_name,
-- with the unsaved text a wipe would discard. Nothing is closed yet: toolbus keeps that
-- text in its journal first, then calls M.wipe.
function M.find_tab(tab_name, path)
  local exact, suffix = {}, {}
  local wanted = path ~= vim.NIL and normalise(path) or nil
  local tail = '/' .. tab_name
  for _, buf in ipairs(open_buffers()) do
    if wanted and same_file(buf, wanted) then
      exact[#exact + 1] = buf
    elseif api.nvim_buf_get_name(buf):sub(-#tail) == tail then
      suffix[#suffix + 1] = buf
    end
  end
  local matches = #exact > 0 and exact or suffix
  if #matches == 0 then
    return { status = 'not_found' }
  end
  local names = {}
  for i, buf in ipairs(matches) do
    names[i] = api.nvim_buf_get_name(buf)
  end
  if #matches > 1 then
    return { status = 'ambiguous', candidates = names }
  end
  local buf = matches[1]
  local modified = vim.bo[buf].modified
  return {
    status = 'found',
    buffer = buf,
    tick = api.nvim_buf_get_changedtick(buf),
    path = names[1],
    modified = modified,
    discarded = modified and buffer_text(buf) or vim.NIL,
  }
end

-- Wipe a buffer found by M.find_tab, unless it changed since (its text kept would be stale).
function M.wipe(buf, tick)
  if not api.nvim_buf_is_valid(buf) or api.nvim_buf_get_changedtick(buf) ~= tick then
    return false
  end
  api.nvim_buf_delete(buf, { force = true })
  return true
end

-- A toolbus conflict mark ends when the user writes or re-reads the buffer.
local group = api.nvim_create_augroup('toolbus_conflicts', { clear = true })
api.nvim_create_autocmd({ 'BufWritePost', 'BufReadPost' }, {
  group = group,
  callback = function(args)
    vim.b[args.buf].toolbus_disk_conflict = nil
  end,
})

return M
