-- toolbus helpers, sent over RPC the first time a Neovim lacks them (kept in a global named
-- after this file's hash): every editor tool is then one or two requests. Paths arrive
-- absolute with `~` expanded; symlinks are resolved here, on Neovim's side.
local NAME = ... -- that global's name: autocmd groups carry it, so versions never clear each other's
local M = {}
local api = vim.api

-- A path as the file system resolves it: symlinks resolved in every part that exists, so a
-- file not created yet still gets its folder's real name (as os.path.realpath does). A `$` is
-- part of a name (`routes/$slug.tsx`), never an environment variable.
local function normalise(name)
  local real = vim.uv.fs_realpath(name)
  if real then
    return real
  end
  name = vim.fs.normalize(name, { expand_env = false })
  local folder = vim.fs.dirname(name)
  if folder == name then
    return name
  end
  return vim.fs.joinpath(normalise(folder), vim.fs.basename(name))
end

local function read_file(name)
  local stat = vim.uv.fs_stat(name)
  if stat and stat.type ~= 'file' and stat.type ~= 'directory' then -- a FIFO blocks Neovim; a device may never end
    return vim.NIL
  end
  local file = io.open(name, 'rb')
  if not file then
    return vim.NIL
  end
  local content = file:read('*a')
  file:close()
  return content
end

local LINE_BREAK = { unix = '\n', dos = '\r\n', mac = '\r' } -- by 'fileformat'

-- The text a buffer would write: its lines, each broken as its 'fileformat' says, plus a final
-- line break when it has one.
local function buffer_text(buf)
  local line_break = LINE_BREAK[vim.bo[buf].fileformat] or '\n'
  local text = table.concat(api.nvim_buf_get_lines(buf, 0, -1, false), line_break)
  if vim.bo[buf].eol or vim.bo[buf].fixeol then
    text = text .. line_break
  end
  return text
end

-- Vim's Unicode encodings, as 'fileencoding' names them: the byte order mark Vim writes first
-- when 'bomb' is set, and the name vim.iconv() converts to. It takes every name of UTF-16 for
-- the machine's byte order, so Vim's big-endian UTF-16 is made little-endian, then swapped.
local UNICODE = {
  ['utf-8'] = { bom = '\239\187\191' },
  ['utf-16'] = { bom = '\254\255', iconv = 'utf-16le', swap = true },
  ['ucs-2'] = { bom = '\254\255', iconv = 'utf-16le', swap = true },
  ['utf-16le'] = { bom = '\255\254', iconv = 'utf-16le' },
  ['ucs-2le'] = { bom = '\255\254', iconv = 'utf-16le' },
  ['ucs-4'] = { bom = '\0\0\254\255', iconv = 'utf-32be' },
  ['ucs-4le'] = { bom = '\255\254\0\0', iconv = 'utf-32le' },
}

-- The bytes a buffer would write: its text in its 'fileencoding' (its lines are UTF-8), after
-- the byte order mark 'bomb' asks for. What a close discards, to be written back as is.
local function buffer_bytes(buf)
  local text = buffer_text(buf)
  local encoding = vim.bo[buf].fileencoding
  local unicode = UNICODE[encoding == '' and 'utf-8' or encoding] or {}
  if encoding ~= '' and encoding ~= 'utf-8' then
    local converted = vim.iconv(text, 'utf-8', unicode.iconv or encoding)
    if converted and unicode.swap then
      converted = converted:gsub('(.)(.)', '%2%1')
    end
    text = converted or text -- nil: not convertible, kept as UTF-8
  end
  if unicode.bom and vim.bo[buf].bomb then
    text = unicode.bom .. text
  end
  return text
end

-- While the user is in the command-line window (q:), Neovim lets no other window or buffer
-- change (E11): a call that would is refused before it changes anything, saying what to do.
local CMDWIN = "Neovim's command-line window (q:) is open, and no other window or buffer can change "
  .. 'while it is: close it (:quit), then try again'

local function in_cmdwin()
  return vim.fn.getcmdwintype() ~= ''
end

-- A buffer's option, read without vim.bo's metatables: half the cost, on every buffer of a list.
local function option(buf, name)
  return api.nvim_get_option_value(name, { buf = buf })
end

-- A file's buffer: named, and not help, terminal, quickfix, a file tree or other scratch.
local function is_file_buffer(buf)
  return option(buf, 'buftype') == '' and api.nvim_buf_get_name(buf) ~= ''
end

-- Files the user has open: listed, loaded file buffers. Hidden and unloaded buffers are not,
-- nor a help page or a plugin's scratch buffer, even one named like a file.
local function is_open(buf)
  return option(buf, 'buflisted') and api.nvim_buf_is_loaded(buf) and is_file_buffer(buf)
end

local function open_buffers()
  local found = {}
  for _, buf in ipairs(api.nvim_list_bufs()) do
    if is_open(buf) then
      found[#found + 1] = buf
    end
  end
  return found
end

local function same_file(buf, wanted)
  local name = api.nvim_buf_get_name(buf)
  return name == wanted or normalise(name) == wanted
end

local function find_in(buffers, wanted)
  for _, buf in ipairs(buffers) do
    if same_file(buf, wanted) then
      return buf
    end
  end
  return nil
end

-- The open buffer whose name is `wanted` as it is: a string compare each, where resolving every
-- name would be a realpath each.
local function named(wanted)
  for _, buf in ipairs(api.nvim_list_bufs()) do
    if api.nvim_buf_get_name(buf) == wanted and is_open(buf) then
      return buf
    end
  end
  return nil
end

-- The open buffer whose full name is `path`: exact comparison, symlinks resolved on both sides.
local function find_open(path)
  local wanted = normalise(path)
  return named(wanted) or find_in(open_buffers(), wanted)
end

-- Any buffer named `path` by the same rule, even hidden, unlisted or unloaded: one that a
-- replay would reload or wipe.
local function find_any(path)
  return find_open(path) or find_in(vim.tbl_filter(is_file_buffer, api.nvim_list_bufs()), normalise(path))
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

local function language(buf)
  local filetype = option(buf, 'filetype')
  return filetype ~= '' and filetype or 'plaintext'
end

-- A buffer's URI and label depend on its name alone, and encoding them costs more than the
-- rest of a listed buffer: kept per name (a few hundred names at most, then forgotten).
local shown_names, shown_count = {}, 0
local function shown(buf)
  local name = api.nvim_buf_get_name(buf)
  local entry = shown_names[name]
  if not entry then
    if shown_count >= 512 then
      shown_names, shown_count = {}, 0
    end
    entry = { uri = vim.uri_from_bufnr(buf), label = vim.fn.fnamemodify(name, ':t') }
    shown_names[name], shown_count = entry, shown_count + 1
  end
  return entry
end

function M.list()
  local current = api.nvim_get_current_buf()
  local tabs = {}
  for _, buf in ipairs(open_buffers()) do
    local entry = shown(buf)
    tabs[#tabs + 1] = {
      uri = entry.uri,
      isActive = buf == current,
      label = entry.label,
      languageId = language(buf),
      isDirty = option(buf, 'modified'),
    }
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

-- What a file on disk is right now, to tell later whether anything replaced it: '' if none.
local function disk_identity(name)
  local stat = vim.uv.fs_stat(name)
  if not stat then
    return ''
  end
  return ('%d:%d:%d:%d:%d'):format(stat.ino, stat.size, stat.mtime.sec, stat.mtime.nsec, stat.ctime.nsec)
end

-- The file's modification time, as `:write` compares it with the one it read (nil if none).
local function mtime_of(name)
  local stat = vim.uv.fs_stat(name)
  return stat and { stat.mtime.sec, stat.mtime.nsec } or nil
end

-- Vim's own rule: nanoseconds differ by any; whole seconds, on Linux and Windows, only past
-- one either way (a FAT file system's rounding), elsewhere by any.
local SECONDS_SLACK = (vim.fn.has('linux') == 1 or vim.fn.has('win32') == 1) and 1 or 0
local function time_differs(now, read)
  return math.abs(now[1] - read[1]) > SECONDS_SLACK or now[2] ~= read[2]
end

-- Noted when Neovim reads or writes the buffer's own file (see the autocmd at the end).
local function note_read(buf)
  local name = api.nvim_buf_get_name(buf)
  vim.b[buf].toolbus_read = { name = name, mtime = mtime_of(name) }
end

-- Whether the file changed on disk since Neovim last read or wrote the buffer, so that :write
-- would stop at its "changed since reading it" prompt; even when a :checktime (the user's own,
-- on FocusGained, say) has reported the change already, and a second one no longer does. Not
-- known after a rename (`:file`). A user's write that skipped autocmds (`:noautocmd write`)
-- leaves the note behind (toolbus's own writes note themselves): an unmodified buffer is then reloaded (the same text), a modified one
-- refused as a conflict until the user writes again.
local function changed_since_read(buf, name)
  local read, now = vim.b[buf].toolbus_read, mtime_of(name)
  return read ~= nil and read.name == name and read.mtime ~= nil and now ~= nil and time_differs(now, read.mtime)
end

-- A save, step one: find the buffer, settle a disk change without a prompt (reload an
-- unmodified buffer; a modified one is a conflict), and return the disk text the write would
-- replace. Nothing is written yet: toolbus keeps that text in its journal first, then calls
-- M.write.
function M.inspect_save(path)
  local buf = find_open(path)
  if not buf then
    return { status = 'not_open', path = normalise(path) }
  end
  local name = api.nvim_buf_get_name(buf)
  local resolved = normalise(name)
  local ok, changed, reloaded = true, false, false
  if not in_cmdwin() then -- where :checktime is refused: a change on disk is known by its time
    ok, changed, reloaded = pcall(check_disk, buf)
  end
  if not ok then
    return { status = 'vim_error', path = resolved, message = changed }
  end
  if vim.b[buf].toolbus_disk_conflict or changed_since_read(buf, name) then
    if vim.bo[buf].modified then
      return { status = 'conflict', path = resolved }
    end
    if in_cmdwin() then
      local message = 'the file changed on disk, and its buffer must be reloaded first. ' .. CMDWIN
      return { status = 'vim_error', path = resolved, message = message }
    end
    -- The disk version wins, as for any unmodified buffer (the user undid their edits, or the
    -- change was reported to someone else): reloaded, since :write would now prompt instead.
    api.nvim_buf_call(buf, function()
      vim.cmd('silent edit!')
    end)
    vim.b[buf].toolbus_disk_conflict = nil
    changed, reloaded = true, true
  end
  local disk = disk_identity(name) -- before reading: a change while reading shows as a change
  return {
    status = 'ready',
    path = resolved,
    buffer = buf,
    tick = api.nvim_buf_get_changedtick(buf),
    disk = disk,
    before = read_file(name),
    changed = changed,
    reloaded = reloaded,
  }
end

-- Whether every character of `text` survives a trip through `encoding` (nil: none it knows).
local function holds(encoding, text)
  local encoded = vim.iconv(text, 'utf-8', encoding)
  if encoded == nil then
    return nil
  end
  return vim.iconv(encoded, encoding, 'utf-8') == text
end

-- The first line of `buf` its 'fileencoding' cannot hold, or nil. :write would write it anyway,
-- each such character replaced ("CONVERSION ERROR"), and leave the buffer modified.
local function unwritable_line(buf)
  local encoding = vim.bo[buf].fileencoding:lower()
  if encoding == '' or encoding == 'utf-8' or encoding:find('^utf%-16') or encoding:find('^ucs%-4') then
    return nil -- Unicode: every character has its bytes
  end
  local lines = api.nvim_buf_get_lines(buf, 0, -1, false)
  if holds(encoding, table.concat(lines, '\n')) ~= false then
    return nil
  end
  for number, line in ipairs(lines) do
    if not holds(encoding, line) then
      return number
    end
  end
end

-- The buffers M.write is writing, each with the diff views asked to close meanwhile: Neovim
-- serves requests while a BufWritePre autocmd waits (a slow formatter), and a view whose
-- accepted text is being written, closed under that write, would abort it (M.diff_close).
local writing = {}

-- :write `buf`, and say what came of it.
local function write_now(buf, name)
  local noted = vim.b[buf].toolbus_read
  local written, err = pcall(api.nvim_buf_call, buf, function()
    vim.cmd('silent write')
  end)
  -- toolbus's BufWritePost autocmd noted the write: it happened (whatever failed after it).
  local posted = not vim.deep_equal(vim.b[buf].toolbus_read, noted)
  if not written then
    if not posted or vim.bo[buf].modified then
      return { status = 'vim_error', message = err }
    end
    -- A hook failed after the write (a BufWritePost linter's): the file is saved. The user
    -- sees the error, as a :w of their own would show it.
    vim.schedule(function()
      vim.notify(err, vim.log.levels.ERROR)
    end)
  elseif not posted then -- BufWritePost ignored ('eventignore'): the write is noted all the same
    note_read(buf)
  end
  if vim.bo[buf].modified then
    return { status = 'vim_error', message = 'the buffer is still modified after :write' }
  end
  return { status = 'saved', after = read_file(name), encoding = vim.bo[buf].fileencoding }
end

-- A save, step two: write a buffer found by M.inspect_save, unless it or its file changed
-- since (the text kept would not be the text replaced), or its encoding cannot hold its text.
function M.write(buf, tick, disk)
  if not api.nvim_buf_is_valid(buf) or api.nvim_buf_get_changedtick(buf) ~= tick then
    return { status = 'changed' }
  end
  local name = api.nvim_buf_get_name(buf)
  if disk_identity(name) ~= disk then
    return { status = 'changed' }
  end
  local line = unwritable_line(buf)
  if line then
    local message = ("line %d holds a character 'fileencoding' %s cannot hold; :set fileencoding=utf-8 keeps it")
    return { status = 'vim_error', message = message:format(line, vim.bo[buf].fileencoding) }
  end
  local outer = writing[buf] -- a write from the write's own autocmds: the outer one closes
  writing[buf] = outer or {}
  local ok, outcome = pcall(write_now, buf, name)
  if not outer then
    local closing = writing[buf]
    writing[buf] = nil
    for _, id in ipairs(closing) do -- once the outcome is known: closing may unstage the text
      pcall(M.diff_close, id)
    end
  end
  if not ok then
    error(outcome, 0)
  end
  return outcome
end

-- The one open file buffer named `path` (exactly) or, failing that, ending in '/' .. tab_name,
-- with the text a wipe would discard: unsaved text, or all of it when its file is gone. Such a
-- buffer is not closed yet: toolbus keeps that text in its journal first, then calls M.wipe.
-- One without is wiped at once when `wipe_unmodified` (status 'wiped'): there is nothing to keep.
function M.find_tab(tab_name, path, wipe_unmodified)
  if in_cmdwin() then
    return { status = 'refused', message = CMDWIN }
  end
  local exact, suffix = {}, {}
  -- Files only: a terminal (its job), help, a plugin's scratch or `acwrite` buffer is no tab.
  local files = open_buffers()
  local wanted = path ~= vim.NIL and normalise(path) or nil
  local by_name = wanted and named(wanted)
  if by_name then
    exact = { by_name }
  elseif wanted then
    for _, each in ipairs(files) do
      if same_file(each, wanted) then
        exact[#exact + 1] = each
      end
    end
  end
  if #exact == 0 then
    local tail = '/' .. tab_name
    for _, each in ipairs(files) do
      if api.nvim_buf_get_name(each):sub(-#tail) == tail then
        suffix[#suffix + 1] = each
      end
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
  local path_found = normalise(names[1])
  -- An unmodified buffer whose file is gone holds the only copy of its text: kept like unsaved text.
  local has_text = api.nvim_buf_line_count(buf) > 1 or api.nvim_buf_get_lines(buf, 0, 1, false)[1] ~= ''
  local only_copy = not modified and has_text and not vim.uv.fs_stat(names[1])
  if wipe_unmodified and not modified and not only_copy then
    api.nvim_buf_delete(buf, { force = true })
    return { status = 'wiped', path = path_found }
  end
  return {
    status = 'found',
    buffer = buf,
    tick = api.nvim_buf_get_changedtick(buf),
    path = path_found,
    modified = modified,
    discarded = (modified or only_copy) and buffer_bytes(buf) or vim.NIL,
  }
end

-- Wipe a buffer found by M.find_tab, unless it changed since (its text kept would be stale), or
-- the command-line window opened meanwhile (M.find_tab then says so).
function M.wipe(buf, tick)
  if in_cmdwin() or not api.nvim_buf_is_valid(buf) or api.nvim_buf_get_changedtick(buf) ~= tick then
    return false
  end
  api.nvim_buf_delete(buf, { force = true })
  return true
end

-- --- IDE tools: selections, diagnostics, workspace folders, openFile -------------------
-- Positions are LSP's (and Claude Code's): 0-based lines, characters in UTF-16 code units,
-- ends exclusive. Neovim counts bytes.

local function position(buf, line, byte)
  local text = api.nvim_buf_get_lines(buf, line, line + 1, false)[1] or ''
  byte = math.max(0, math.min(byte, #text))
  return { line = line, character = vim.str_utfindex(text, 'utf-16', byte, false) }
end

local function selection(buf, text, from, to)
  return {
    text = text,
    filePath = api.nvim_buf_get_name(buf),
    fileUrl = vim.uri_from_bufnr(buf),
    selection = { start = from, ['end'] = to, isEmpty = from.line == to.line and from.character == to.character },
  }
end

-- Each mode that selects text, and the visual mode it selects as: Select mode (a snippet's
-- placeholder, `gh`) is visual mode where typing replaces the selection.
local VISUAL = { v = 'v', V = 'V', ['\22'] = '\22', s = 'v', S = 'V', ['\19'] = '\22' }

-- Whether the cursor is where `$` left it: the window's 'curswant' is then v:maxcol, and a
-- block selection reaches the end of every line.
local function at_line_ends()
  return vim.fn.getcurpos()[5] == vim.v.maxcol
end

-- The width of a block selected with `$`, as a yank takes it: from its first screen column to
-- the end of its longest line, the column past its last character included (a line the block
-- does not reach is yanked as that many spaces). getregion() would stop at the cursor's column.
local function width_to_line_ends(from, to)
  local first = math.min(vim.fn.virtcol({ from[2], from[3] }, true)[1], vim.fn.virtcol({ to[2], to[3] }, true)[1])
  local last = first
  for line = math.min(from[2], to[2]), math.max(from[2], to[2]) do
    last = math.max(last, vim.fn.virtcol({ line, '$' }))
  end
  return last - first + 1
end

-- The line whose line break a yank of a charwise selection takes after its text (nil if none),
-- which getregion() leaves out: with 'selection' inclusive, one whose last character the
-- selection's end is past (`v$`, an empty line), if another line follows; with exclusive, the
-- line before the one at whose start the selection ends.
local function line_break_taken(buf, from, to)
  local last = (to[2] > from[2] or (to[2] == from[2] and to[3] >= from[3])) and to or from
  local line, col = last[2], last[3]
  if vim.o.selection == 'old' then
    return nil
  elseif vim.o.selection == 'exclusive' and (from[2] ~= to[2] or from[3] ~= to[3]) then
    return col == 1 and line - 1 or nil
  end
  local past_end = col > #api.nvim_buf_get_lines(buf, line - 1, line, false)[1]
  return past_end and line < api.nvim_buf_line_count(buf) and line or nil
end

-- The region between two getpos() positions of the current buffer in visual `mode` (v, V or
-- CTRL-V), exactly as Vim would yank it; `to_line_ends`: selected with `$` (see at_line_ends).
local function region(buf, mode, from, to, to_line_ends)
  local opts = { type = mode, eol = true } -- eol: a position past a line's end is kept there
  if mode == '\22' and to_line_ends then
    opts.type = mode .. width_to_line_ends(from, to)
  end
  local spans = vim.fn.getregionpos(from, to, opts)
  local first, last = spans[1][1], spans[#spans][2]
  local text = table.concat(vim.fn.getregion(from, to, opts), '\n')
  -- A span ends on its last byte (1-based): that is the exclusive 0-based end.
  local finish = position(buf, last[2] - 1, last[3])
  local broken = mode == 'v' and line_break_taken(buf, from, to)
  if broken then
    text, finish = text .. '\n', { line = broken, character = 0 }
  end
  return selection(buf, text, position(buf, first[2] - 1, first[3] - 1), finish)
end

-- The visual selection the user is making now in `buf`, if any.
local function visual(buf)
  local mode = api.nvim_get_mode().mode:sub(1, 1)
  if VISUAL[mode] and api.nvim_get_current_buf() == buf then
    return region(buf, VISUAL[mode], vim.fn.getpos('v'), vim.fn.getpos('.'), at_line_ends())
  end
  return nil
end

function M.selection()
  local buf = api.nvim_get_current_buf()
  if not is_file_buffer(buf) then
    return vim.NIL
  end
  local row, col = unpack(api.nvim_win_get_cursor(0))
  local cursor = position(buf, row - 1, col)
  return visual(buf) or selection(buf, '', cursor, cursor)
end

-- The last visual selection made in a file buffer, kept when the user leaves visual mode, and
-- how many were made so far. Each toolbus that connects notes that count (`connected`) and is
-- shown only selections made after it: this module outlives the toolbus that loaded it.
local latest, selections, seen_at_connect = nil, 0, {}

function M.connected(toolbus)
  if seen_at_connect[toolbus] == nil then -- a reconnection (after a timeout) is not a new toolbus
    seen_at_connect[toolbus] = selections
  end
end

function M.latest_selection(toolbus)
  local buf = api.nvim_get_current_buf()
  local current = is_file_buffer(buf) and visual(buf)
  if current then
    return current
  end
  return (latest and selections > (seen_at_connect[toolbus] or 0)) and latest or vim.NIL
end

local SEVERITY = { 'Error', 'Warning', 'Information', 'Hint' }

-- LSP codes are numbers or strings. Some servers send `{ value = ..., target = url }` (ESLint's
-- older form): its value. Any other table has no code to show (nil: null), rather than an address.
local function code_of(code)
  if type(code) == 'table' then
    code = code.value
  end
  if code == nil or code == vim.NIL or (type(code) == 'number' and code == math.floor(code)) then
    return code
  end
  return type(code) == 'table' and vim.NIL or tostring(code)
end

-- A diagnostic's text, as text whatever a plugin put there (a number, say).
local function text_or_nil(value)
  if value == nil or value == vim.NIL or type(value) == 'string' then
    return value
  end
  return tostring(value)
end

local function diagnostics_of(buf)
  local found = {}
  for i, item in ipairs(vim.diagnostic.get(buf)) do
    found[i] = {
      message = text_or_nil(item.message) or '',
      severity = SEVERITY[item.severity] or 'Error',
      range = {
        start = position(buf, item.lnum, item.col),
        ['end'] = position(buf, item.end_lnum or item.lnum, item.end_col or item.col),
      },
      source = text_or_nil(item.source),
      code = code_of(item.code),
    }
  end
  return found
end

-- Diagnostics of the open file `path` (nil when it is not open), or of every open file with some.
function M.diagnostics(path)
  if path ~= vim.NIL then
    local buf = find_open(path)
    return buf and { { uri = vim.uri_from_bufnr(buf), diagnostics = diagnostics_of(buf) } } or vim.NIL
  end
  local files = {}
  for _, buf in ipairs(open_buffers()) do
    local found = diagnostics_of(buf)
    if #found > 0 then
      files[#files + 1] = { uri = vim.uri_from_bufnr(buf), diagnostics = found }
    end
  end
  return files
end

-- The working directory, then each workspace folder of an LSP client attached to a buffer.
function M.workspace_folders()
  local folders, seen = {}, {}
  local function add(path, name)
    local real = normalise(path)
    if not seen[real] then
      seen[real] = true
      name = name or vim.fs.basename(path)
      name = name ~= '' and name or path -- the root, '/', has no base name
      folders[#folders + 1] = { name = name, uri = vim.uri_from_fname(path), path = path }
    end
  end
  local cwd = vim.fn.getcwd()
  if cwd ~= '' then -- '' once the directory was removed
    add(cwd)
  end
  for _, client in ipairs(vim.lsp.get_clients()) do
    if next(client.attached_buffers) then
      for _, folder in ipairs(client.workspace_folders or {}) do
        add(vim.uri_to_fname(folder.uri), folder.name)
      end
      if not client.workspace_folders and client.root_dir then
        add(client.root_dir)
      end
    end
  end
  return folders
end

-- A window to show a file in: not floating, showing a file's buffer (never a terminal,
-- quickfix, help or file tree: those all set 'buftype'), free to show another.
local function is_main(win)
  return api.nvim_win_get_config(win).relative == ''
    and vim.bo[api.nvim_win_get_buf(win)].buftype == ''
    and not vim.wo[win].previewwindow
    and not vim.wo[win].winfixbuf
end

-- A window that can show `target` without a prompt or E37: it does already, or its own buffer
-- has nothing unsaved, or stays loaded when hidden.
local function can_switch(win, target)
  local buf = api.nvim_win_get_buf(win)
  return buf == target
    or not vim.bo[buf].modified
    or vim.o.hidden
    or vim.bo[buf].bufhidden == 'hide'
    or #vim.fn.win_findbuf(buf) > 1
end

local function is_diff_view(tab)
  return vim.t[tab].toolbus_diff ~= nil
end

-- The window to show `target` in: the current one if it can, else another of its tab page,
-- else one of another tab page; never one of an openDiff view. nil when there is none.
local function main_window(target)
  local current = api.nvim_get_current_win()
  local here = api.nvim_get_current_tabpage()
  local tabs = { here }
  for _, tab in ipairs(api.nvim_list_tabpages()) do
    if tab ~= here then
      tabs[#tabs + 1] = tab
    end
  end
  for _, tab in ipairs(tabs) do
    if not is_diff_view(tab) then
      local wins = api.nvim_tabpage_list_wins(tab)
      if tab == here then
        table.insert(wins, 1, current)
      end
      for _, win in ipairs(wins) do
        -- A window of the user's own :diffsplit only if it shows the file already: another
        -- file put there would break that diff.
        local shows = api.nvim_win_get_buf(win) == target
        if is_main(win) and (shows or not vim.wo[win].diff) and can_switch(win, target) then
          return win
        end
      end
    end
  end
  return nil
end

-- Why `buf`, which bufadd() gave for `path`, cannot stand for the file: a plugin's buffer, or
-- a help page, of that name (nil when it can).
local function not_the_file(path, buf)
  if is_file_buffer(buf) then
    return nil
  end
  local refusal = "%s is the name of buffer %d, which is not the file's ('buftype' %s): wipe it (:bwipeout %d) first"
  return refusal:format(path, buf, vim.bo[buf].buftype, buf)
end

-- `path` in a listed, loaded buffer. bufload() never asks about a swap file: it raises E325
-- ATTENTION once the buffer is loaded. The file is open in another Neovim (or one crashed), so
-- the buffer is made read-only, as answering "Open Read-Only" would.
local function load(path)
  local buf = find_open(path) or vim.fn.bufadd(path)
  local refusal = not_the_file(path, buf)
  if refusal then
    error(refusal, 0)
  end
  if not api.nvim_buf_is_loaded(buf) then
    local ok, err = pcall(vim.fn.bufload, buf)
    if not ok and not (api.nvim_buf_is_loaded(buf) and tostring(err):find('E325', 1, true)) then
      error(err, 0)
    end
    vim.bo[buf].readonly = vim.bo[buf].readonly or not ok
  end
  vim.bo[buf].buflisted = true
  return buf
end

-- Where the text of a buffer (its lines joined by '\n') has its `offset`-th byte: row, col, 1-based.
local function locate(lines, offset)
  for row, line in ipairs(lines) do
    if offset <= #line + 1 then
      return row, offset
    end
    offset = offset - #line - 1
  end
  return #lines, #lines[#lines] + 1
end

-- From the first `first` to the end of the first `last` after it (or of `first` itself):
-- { from_row, from_col, to_row, to_col }, and which text was not found.
local function find_texts(buf, first, last)
  local lines = api.nvim_buf_get_lines(buf, 0, -1, false)
  local text = table.concat(lines, '\n')
  local s, e = text:find(first, 1, true)
  if not s then
    return nil, 'startText'
  end
  local missing = nil
  if last then
    local _, stop = text:find(last, e + 1, true)
    e, missing = stop or e, not stop and 'endText' or nil
  end
  local from_row, from_col = locate(lines, s)
  local to_row, to_col = locate(lines, e)
  return { from_row, from_col, to_row, to_col }, missing
end

-- Select from (row, col) to (row, col), 1-based and inclusive, in visual `mode` of the current
-- window. Typed keys, not :normal (whose visual mode ends with it); from any mode, and after
-- this request returns.
local function select(mode, span)
  if mode == 'v' and vim.o.selection == 'exclusive' then -- the end is the character after the last
    local line = api.nvim_buf_get_lines(0, span[3] - 1, span[3], false)[1]
    local after = vim.fn.byteidx(line, vim.fn.charidx(line, span[4] - 1) + 1)
    span = { span[1], span[2], span[3], after >= 0 and after + 1 or #line + 1 }
  end
  local keys = ('<C-\\><C-n><Cmd>call cursor(%d, %d)<CR>%s<Cmd>call cursor(%d, %d)<CR>'):format(
    span[1], span[2], mode, span[3], span[4])
  api.nvim_feedkeys(api.nvim_replace_termcodes(keys, true, false, true), 'n', false)
end

local function nonempty(text)
  return text ~= vim.NIL and text ~= '' and text or nil
end

-- What openFile should select in `buf`: the visual mode, the span (as `select` takes it) and
-- which text was not found; nothing when it asks for no selection.
local function wanted(buf, ask)
  local count = api.nvim_buf_line_count(buf)
  local first, last = ask.startLine, ask.endLine
  if first ~= vim.NIL or last ~= vim.NIL then
    first = math.min(first ~= vim.NIL and first or last, count)
    last = math.min(last ~= vim.NIL and last or first, count)
    first, last = math.min(first, last), math.max(first, last)
    return 'V', { first, 1, last, 1 }
  end
  local start_text = nonempty(ask.startText)
  if not start_text then
    return nil
  end
  local span, missing = find_texts(buf, start_text, nonempty(ask.endText))
  if span and ask.selectToEndOfLine then
    span[4] = math.max(1, #api.nvim_buf_get_lines(buf, span[3] - 1, span[3], false)[1])
  end
  return 'v', span, missing
end

-- openFile: show `path` in the main editor window and select what `ask` names, or with
-- makeFrontmost false only load it.
function M.open_file(path, ask)
  local stat = vim.uv.fs_stat(path)
  if not find_open(path) then
    if not (stat and stat.type ~= 'directory') then
      return { status = stat and 'directory' or 'not_found' }
    end
    -- Reading a FIFO or a device would block Neovim (or read for ever); an unreadable file
    -- would load as an empty buffer, taken for an empty file.
    if stat.type ~= 'file' then
      return { status = 'refused', message = ('it is not a regular file (a %s)'):format(stat.type) }
    end
    local readable, err = vim.uv.fs_access(path, 'R')
    if not readable then
      return { status = 'refused', message = 'Neovim cannot read it: ' .. (err or 'permission denied') }
    end
  end
  if ask.makeFrontmost and in_cmdwin() then -- loading it alone changes no window
    return { status = 'refused', message = CMDWIN }
  end
  local loaded, buf = pcall(load, path)
  if not loaded then
    return { status = 'refused', message = buf }
  end
  local opened = { status = 'loaded', languageId = language(buf), lineCount = api.nvim_buf_line_count(buf) }
  if not ask.makeFrontmost then
    return opened
  end
  local win = main_window(buf)
  if win then
    api.nvim_set_current_win(win) -- its tab page's too
    api.nvim_win_set_buf(win, buf)
  elseif is_diff_view(api.nvim_get_current_tabpage()) then
    vim.cmd('tab sbuffer ' .. buf)
  else
    api.nvim_open_win(buf, true, { split = 'left', win = -1 })
  end
  opened.status = 'shown'
  local mode, span, missing = wanted(buf, ask)
  opened.missing = missing
  if span then
    api.nvim_win_set_cursor(0, { span[1], span[2] - 1 })
    select(mode, span)
    opened.selected = { span[1], span[3] }
  elseif VISUAL[api.nvim_get_mode().mode:sub(1, 1)] then
    -- "nothing selected": not the selection an earlier openFile (or the user) left showing
    api.nvim_feedkeys(api.nvim_replace_termcodes('<C-\\><C-n>', true, false, true), 'n', false)
  end
  return opened
end

-- --- `toolbus replay editor` ----------------------------------------------------------
-- A replay writes the recorded bytes to the file as they are: never through :write, whose
-- conversions (fileformat, eol, encoding) and BufWritePre hooks would change them.

local uv = vim.uv

local function write_all(fd, text, name)
  local done = 0
  while done < #text do
    local count, err = uv.fs_write(fd, text:sub(done + 1), done)
    if not count then
      error('cannot write ' .. name .. ': ' .. err, 0)
    end
    done = done + count
  end
  assert(uv.fs_fsync(fd))
end

-- `text` in a new file `name` (never an existing one) with permissions `mode`.
local function create(name, text, mode)
  local fd, err, code = uv.fs_open(name, 'wx', mode)
  if not fd then
    return nil, err, code
  end
  local ok, failed = pcall(write_all, fd, text, name)
  uv.fs_close(fd)
  if not ok then
    uv.fs_unlink(name)
    error(failed, 0)
  end
  return name
end

-- What `name` holds; nil when there is no file. A file that cannot be read is an error:
-- it must never pass for an absent one and be overwritten unkept.
local function existing_text(name)
  local stat = uv.fs_stat(name)
  if not stat then
    return nil, nil
  end
  if stat.type ~= 'file' then
    error('cannot write ' .. name .. ': it is a ' .. stat.type, 0)
  end
  local file, err = io.open(name, 'rb')
  local content = file and file:read('*a')
  if file then
    file:close()
  end
  if not content then
    error('cannot read ' .. name .. ' to keep what it holds: ' .. tostring(err), 0)
  end
  return content, bit.band(stat.mode, 4095)
end

-- `text` copied to the first free `name.~N~`: an earlier copy is never overwritten.
local function keep_copy(name, text, mode)
  for n = 1, 100000 do
    local copy, err, code = create(('%s.~%d~'):format(name, n), text, bit.band(mode, 511))
    if copy then
      return copy
    elseif code ~= 'EEXIST' then
      error('cannot keep what ' .. name .. ' holds: ' .. err, 0)
    end
  end
  error('cannot keep what ' .. name .. ' holds: too many copies of it already', 0)
end

-- `name` replaced by `text` in one rename, keeping its permissions: a reader, or a crash,
-- sees the old text or the new, never half of it.
local function write_atomically(name, text, mode)
  local folder, base = vim.fs.dirname(name), vim.fs.basename(name)
  local temp = ('%s/.%s.%d-%d.toolbus'):format(folder, base, uv.os_getpid(), uv.hrtime())
  local _, err = create(temp, text, 438) -- 0666, less the umask
  if err then
    error('cannot write ' .. name .. ': ' .. err, 0)
  end
  local ok, failed = pcall(function()
    if mode then
      assert(uv.fs_chmod(temp, mode))
    end
    assert(uv.fs_rename(temp, name))
  end)
  if not ok then
    uv.fs_unlink(temp)
    error('cannot write ' .. name .. ': ' .. tostring(failed), 0)
  end
end

-- Write `text`; if the file held anything else than `text` or one of `known` (texts the
-- journal has for it), copy that first. Returns the copy's name (or nil), and why the write
-- failed if it did: a copy made is named either way.
local function write_keeping(name, text, known)
  vim.fn.mkdir(vim.fs.dirname(name), 'p')
  local current, mode = existing_text(name)
  local kept = nil
  if current and current ~= text and not vim.list_contains(known, current) then
    kept = keep_copy(name, current, mode)
  end
  local written, failed = pcall(write_atomically, name, text, mode)
  return kept, not written and failed or nil
end

-- Show the file in a listed buffer, (re)loaded from disk. :edit! re-reads it, so Neovim
-- never finds the file "changed since reading it" later, and asks nothing.
local function show(buf)
  if api.nvim_buf_is_loaded(buf) then
    api.nvim_buf_call(buf, function()
      vim.cmd('silent edit!')
    end)
  else
    vim.bo[buf].swapfile = false -- no "ATTENTION" prompt if another Neovim has the file open
    vim.fn.bufload(buf)
  end
  vim.bo[buf].buflisted = true
end

-- Replay a save: `path` holds exactly `text`, and Neovim shows it, unmodified. A buffer with
-- unsaved changes is left alone and nothing is written.
function M.replace(path, text, known)
  if in_cmdwin() then -- the file would be written, and its buffer left stale
    return { status = 'error', message = CMDWIN }
  end
  local buf = find_any(path)
  if buf and api.nvim_buf_is_loaded(buf) and vim.bo[buf].modified then
    return { status = 'modified' }
  end
  buf = buf or vim.fn.bufadd(path)
  local refusal = not_the_file(path, buf)
  if refusal then
    return { status = 'error', message = refusal }
  end
  local name = normalise(path)
  local copied, kept, failed = pcall(write_keeping, name, text, known)
  if not copied or failed then
    return { status = 'error', message = failed or kept, kept = copied and kept or nil }
  end
  -- The file is written, whatever loading it does (a user's autocmd may fail on it).
  local shown, err = pcall(show, buf)
  return { status = 'written', path = name, kept = kept, message = not shown and err or nil }
end

-- Replay a close: wipe the buffer of `path`, unless it has unsaved changes.
function M.close(path)
  local buf = find_any(path)
  if not buf then
    return { status = 'not_open' }
  end
  if api.nvim_buf_is_loaded(buf) and vim.bo[buf].modified then
    return { status = 'modified' }
  end
  if in_cmdwin() then
    return { status = 'refused', message = CMDWIN }
  end
  local name = normalise(api.nvim_buf_get_name(buf))
  api.nvim_buf_delete(buf, { force = true })
  return { status = 'closed', path = name }
end

-- --- openDiff ---------------------------------------------------------------------------
-- A diff view is a tab page: on the left the file's current text (a read-only scratch copy),
-- on the right the proposal, an editable `acwrite` buffer. The user's decision reaches toolbus
-- as a notification on the channel that opened the view (no request stays open while the
-- user thinks): `:w` (or :ToolbusAccept) accepts, closing the proposal (or :ToolbusReject)
-- rejects.

-- view id -> { chan, path, disk, tab, proposal, shown, decided (the action), was_modified (the
-- proposal's, when accepted), staged, orphaned }
local diffs = {}
-- Ids of views asked to close when they were not open: one still opening is taken down when
-- it is (a few bytes for each id closed twice, for a Neovim session).
local closed_early = {}
local watch_for_orphans -- closes the views of a toolbus that has gone; defined with diff_close

-- Whether the toolbus on channel `chan` has gone: nobody would hear a decision sent there.
local function gone(chan)
  return next(api.nvim_get_chan_info(chan)) == nil
end

-- `text` as buffer lines, whether it ends with a line break, and its 'fileformat': 'dos' when
-- every line break in it is CRLF, 'mac' when every one is CR (its lines then hold no CR); nil
-- for any other text, split at each LF.
local function split_text(text)
  local line_break, fileformat = '\n', nil
  if text:find('\r\n', 1, true) and not text:find('[^\r]\n') and text:sub(1, 1) ~= '\n' then
    line_break, fileformat = '\r\n', 'dos'
  elseif text:find('\r', 1, true) and not text:find('\n', 1, true) then
    line_break, fileformat = '\r', 'mac'
  end
  local eol = text:sub(-#line_break) == line_break
  local body = eol and text:sub(1, -#line_break - 1) or text
  return vim.split(body, line_break, { plain = true }), eol, fileformat
end

-- Make `text` the buffer's. A CRLF text makes it a 'dos' buffer, which writes those bytes again
-- (kept in its lines, each CR would be written before a CRLF), a CR text a 'mac' one; an LF
-- text keeps the buffer's 'fileformat' (a CRLF file's buffer given LF lines writes them with
-- CRLF, as the file had them). Returns the 'fileformat' the text set, if any.
local function set_text(buf, text)
  local lines, eol, fileformat = split_text(text)
  api.nvim_buf_set_lines(buf, 0, -1, false, lines)
  vim.bo[buf].eol = eol
  vim.bo[buf].fixeol = eol
  if fileformat then
    vim.bo[buf].fileformat = fileformat
  end
  return fileformat
end

local function decide(id, action)
  local view = diffs[id]
  if not view or view.decided then
    return
  end
  view.decided = action
  local text, was_modified = nil, false
  if action == 'accept' and api.nvim_buf_is_valid(view.proposal) then
    text, was_modified = buffer_text(view.proposal), vim.bo[view.proposal].modified
    vim.bo[view.proposal].modified = false
    view.was_modified = was_modified
  end
  -- toolbus's connection may be gone (it then closes this view through a new one): keep the
  -- view undecided rather than raise in the user's face.
  if not pcall(vim.rpcnotify, view.chan, 'toolbus_diff', { id = id, action = action, text = text }) then
    view.decided = false
    if text and api.nvim_buf_is_valid(view.proposal) then
      vim.bo[view.proposal].modified = was_modified
    end
    if not gone(view.chan) then
      return -- not heard now, but its toolbus is there: it closes the view
    elseif action == 'reject' then -- the user closed a view nobody waits for: the rest of it goes too
      vim.schedule(function()
        M.diff_close(id)
      end)
    else
      vim.notify('toolbus is no longer waiting for this diff: nothing was written', vim.log.levels.WARN)
    end
  end
end

-- `:w name` in a proposal: its text written to `name`, as Vim would write a buffer there (an
-- existing file only with `!`), and no decision made.
local function write_copy(buf, name)
  if vim.uv.fs_stat(name) and vim.v.cmdbang == 0 then
    vim.notify(('E13: File exists (add ! to override): %s'):format(name), vim.log.levels.ERROR)
    return
  end
  local file, err = io.open(name, 'wb')
  if not file then
    vim.notify(('toolbus: cannot write %s: %s'):format(name, err), vim.log.levels.ERROR)
    return
  end
  file:write(buffer_text(buf))
  file:close()
  vim.notify(('"%s" written: a copy of the proposal, still undecided'):format(name))
end

-- A new scratch buffer, added to `made` at once: wiped if the view cannot open.
local function scratch(name, text, filetype, made)
  local buf = api.nvim_create_buf(false, true)
  made[#made + 1] = buf
  api.nvim_buf_set_name(buf, name)
  local fileformat = set_text(buf, text)
  vim.bo[buf].bufhidden = 'wipe'
  vim.bo[buf].filetype = filetype
  return buf, fileformat
end

local LINE_BREAK_NAME = { unix = 'LF', dos = 'CRLF', mac = 'CR' }

-- The line breaks of the file shown as current: as its bytes on disk have them (Neovim reads
-- CR ones as LF lines that hold ^M), else as its buffer (or the text shown) has them.
local function current_format(old, old_path, shown_format)
  local bytes = read_file(normalise(old_path))
  local _, _, on_disk = split_text(bytes ~= vim.NIL and bytes or '')
  if old then -- its own, unless read as LF lines ('fileformats') over CR or CRLF bytes (UTF-16's show none)
    local format = vim.bo[old].fileformat
    return format == 'unix' and on_disk or format
  end
  return bytes ~= vim.NIL and (on_disk or 'unix') or shown_format or 'unix'
end

-- The line breaks accepting writes: the proposal's own, else those of the buffer it goes into,
-- as open or as Neovim will read the file ('fileformats').
local function written_format(path, proposed)
  if proposed then
    return proposed
  end
  local target = find_open(path)
  if target then
    return vim.bo[target].fileformat
  end
  local bytes = read_file(normalise(path))
  if bytes == vim.NIL then
    return 'unix'
  end
  local _, _, found = split_text(bytes)
  return found and vim.o.fileformats:find(found, 1, true) and found or 'unix'
end

-- What a diff of lines cannot show: accepting would write `written` line breaks where the
-- current text has `current` ('fileformat' names). Said in the proposal's winbar.
local function line_break_note(current, written)
  if written == current then
    return ''
  end
  return (' Accepting writes %s line breaks: the current text has %s '):format(
    LINE_BREAK_NAME[written] or written,
    LINE_BREAK_NAME[current] or current
  )
end

-- Open the view, unless the file's buffer has unsaved changes or the command-line window is open.
function M.diff_open(id, chan, path, old_path, text, tab_name)
  if in_cmdwin() then
    return { status = 'refused', message = CMDWIN }
  end
  for _, name in ipairs({ path, old_path }) do
    local stat = vim.uv.fs_stat(normalise(name)) -- a directory is refused when accepted, in Vim's words
    if stat and stat.type ~= 'file' and stat.type ~= 'directory' then
      return { status = 'refused', message = ('%s is not a regular file (a %s)'):format(name, stat.type) }
    end
  end
  local target = find_open(path)
  if target and vim.bo[target].modified then
    return { status = 'dirty' }
  end
  local old = find_open(old_path)
  if old and not vim.bo[old].modified then
    pcall(check_disk, old) -- the left side shows what the disk holds now
  end
  local shown = old and buffer_text(old) or read_file(normalise(old_path))
  shown = shown ~= vim.NIL and shown or ''
  local base = vim.fs.basename(path)
  local filetype = vim.filetype.match({ filename = path }) or ''
  local origin = api.nvim_get_current_tabpage()
  local made = {} -- its buffers so far
  local left, right, proposal, shown_format, proposed_format
  local opened, err = pcall(function()
    left, shown_format = scratch(('toolbus://%s/%s (current)'):format(id, base), shown, filetype, made)
    vim.bo[left].modifiable = false
    proposal, proposed_format = scratch(('toolbus://%s/%s (proposed)'):format(id, base), text, filetype, made)
    vim.bo[proposal].buftype = 'acwrite'
    vim.bo[proposal].swapfile = false
    vim.bo[proposal].modified = false
    vim.cmd('tab sbuffer ' .. left)
    vim.cmd('diffthis')
    right = api.nvim_open_win(proposal, true, { split = 'right', win = 0 })
    vim.cmd('diffthis')
    vim.t.toolbus_diff = tab_name
  end)
  if not opened then -- a plugin's autocmd failed, say: nothing of the view is left
    if api.nvim_get_current_tabpage() ~= origin then -- the view's own, however far it got
      pcall(vim.cmd, 'tabclose!')
    end
    for _, buf in ipairs(made) do
      pcall(api.nvim_buf_delete, buf, { force = true })
    end
    pcall(api.nvim_set_current_tabpage, origin)
    return { status = 'refused', message = err }
  end
  local resolved = normalise(path)
  diffs[id] = {
    chan = chan,
    path = resolved,
    disk = disk_identity(resolved),
    disk_text = read_file(resolved),
    tab = api.nvim_get_current_tabpage(),
    origin = origin, -- the user's tab page, to go back to
    proposal = proposal,
    shown = left,
  }
  watch_for_orphans()
  local group = api.nvim_create_augroup(NAME .. '_diff_' .. id, { clear = true })
  api.nvim_create_autocmd('BufWriteCmd', {
    group = group,
    buffer = proposal,
    callback = function(args)
      if args.match == api.nvim_buf_get_name(proposal) then
        decide(id, 'accept')
      else -- `:w other.py`: a copy of the proposal, which stays undecided
        write_copy(proposal, args.match)
      end
    end,
  })
  -- :bd unloads it, :q or :tabclose wipes it ('bufhidden' is wipe): either is a no.
  api.nvim_create_autocmd({ 'BufUnload', 'BufWipeout' }, {
    group = group,
    buffer = proposal,
    callback = function()
      decide(id, 'reject')
    end,
  })
  if shown ~= '' then -- once the view can be decided: whatever befalls a note leaves it usable
    pcall(function()
      local current = current_format(old, old_path, shown_format)
      vim.wo[right].winbar = line_break_note(current, written_format(path, proposed_format))
    end)
  end
  -- A plugin's autocmd that waited (vim.wait, input()) let Neovim answer other requests while
  -- this one ran: toolbus may have given up on it, dropped its connection and asked to close
  -- the view before it existed. Nobody would hear its decision: take it down now.
  if closed_early[id] or gone(chan) then
    closed_early[id] = nil
    M.diff_close(id)
    return { status = 'refused', message = 'toolbus gave up on the view while it opened' }
  end
  return { status = 'open', path = resolved, shown = shown }
end

-- Put the accepted text into the file's buffer (loading it if needed), ready for M.write;
-- unless the file changed on disk since the view opened, or its buffer was changed meanwhile.
function M.diff_stage(id, text)
  local view = diffs[id]
  if not view then
    return { status = 'vim_error', message = 'the diff view is gone' }
  end
  local touched = disk_identity(view.path) ~= view.disk
  if touched and read_file(view.path) ~= view.disk_text then
    return { status = 'conflict', message = 'the file changed on disk since the diff opened' }
  end
  local buf = find_open(view.path)
  if buf and vim.bo[buf].modified then
    return { status = 'conflict', message = 'its buffer was changed in Neovim since the diff opened' }
  end
  if buf and touched then -- written again with the same bytes (a save): read again, so :write need not ask
    pcall(api.nvim_buf_call, buf, function()
      vim.cmd('silent edit!')
    end)
  end
  local ok, err = pcall(function()
    vim.fn.mkdir(vim.fs.dirname(view.path), 'p')
    local loaded, existed = buf == nil, {}
    for _, other in ipairs(api.nvim_list_bufs()) do
      existed[other] = true
    end
    buf = buf or load(view.path)
    local bo = vim.bo[buf]
    local before = { lines = api.nvim_buf_get_lines(buf, 0, -1, false), eol = bo.eol, fixeol = bo.fixeol }
    before.fileformat = bo.fileformat
    set_text(buf, text)
    local tick = api.nvim_buf_get_changedtick(buf)
    view.staged = { buf = buf, loaded = loaded, new = not existed[buf], before = before, tick = tick }
  end)
  if not ok then
    return { status = 'vim_error', message = err }
  end
  return { status = 'staged' }
end

-- An accepted text the journal could not keep (it was locked or full before the write): left
-- in its file's buffer, unsaved, when the view closes, the only copy there is; the user told.
function M.diff_keep_staged(id, notice)
  local view = diffs[id]
  if not (view and view.staged) then
    return false -- taken down meanwhile (its toolbus's connection went), the text with it
  end
  view.staged = nil
  vim.notify(notice, vim.log.levels.WARN)
  return true
end

-- An accepted text staged into its file's buffer, and left there unwritten (the write failed),
-- is taken out again: the buffer as it was before, or unloaded (wiped if new) if the accept
-- loaded it. A user who saved it meanwhile, or typed into it, keeps it.
local function unstage(staged)
  local buf = staged.buf
  if not api.nvim_buf_is_valid(buf) or not vim.bo[buf].modified then
    return
  end
  if api.nvim_buf_get_changedtick(buf) ~= staged.tick then
    return
  end
  if staged.loaded then -- as it was: not loaded, or not there at all
    api.nvim_buf_delete(buf, { unload = not staged.new, force = true })
    return
  end
  local before = staged.before
  api.nvim_buf_set_lines(buf, 0, -1, false, before.lines)
  local bo = vim.bo[buf]
  bo.eol, bo.fixeol, bo.fileformat = before.eol, before.fixeol, before.fileformat
  bo.modified = false
end

-- A closed view's buffers, and its tab page with them; a text it staged is taken out again.
local function take_down(view)
  if view.staged then
    pcall(unstage, view.staged)
  end
  local in_view = api.nvim_get_current_tabpage() == view.tab
  for _, buf in ipairs({ view.proposal, view.shown }) do
    if api.nvim_buf_is_valid(buf) then
      api.nvim_buf_delete(buf, { force = true })
    end
  end
  if in_view and api.nvim_tabpage_is_valid(view.origin) then -- not the tab page Vim picks next
    pcall(api.nvim_set_current_tabpage, view.origin)
  end
end

-- Close a view: its autocmds first, so that closing it decides nothing. The command-line window
-- (q:) keeps every buffer: the view is then taken down once the user leaves it.
function M.diff_close(id)
  local view = diffs[id]
  if not view then
    closed_early[id] = true -- if it is still opening, M.diff_open takes it down when done
    return false
  end
  local closing = view.staged and writing[view.staged.buf]
  if closing then -- its accepted text is being written: closed once that is done
    closing[#closing + 1] = id
    return true
  end
  diffs[id] = nil
  pcall(api.nvim_del_augroup_by_name, NAME .. '_diff_' .. id)
  if in_cmdwin() then
    api.nvim_create_autocmd('CmdwinLeave', {
      once = true,
      callback = function()
        vim.schedule(function() -- once the window has closed
          take_down(view)
        end)
      end,
    })
  else
    take_down(view)
  end
  return true
end

-- A view whose toolbus is gone (killed, or stopped while Neovim was busy, so that its request to
-- close the view could not run) would wait for good: nobody hears its decision. Each is closed
-- and the user told, but one whose proposal the user edited (kept: theirs to save elsewhere or
-- close) and one whose accepted text is being written (tended once that is done).
local function tend_orphan(id, view)
  local name = vim.fs.basename(view.path)
  local message
  if view.decided == 'accept' and not view.staged then
    -- Sent on a connection already closing, or heard by a toolbus that went before acting on
    -- it: nothing was written. The view is as it was before the decision.
    view.decided = false
    if api.nvim_buf_is_valid(view.proposal) then
      vim.bo[view.proposal].modified = view.was_modified
    end
  end
  if view.decided == 'accept' then -- toolbus heard it, and stopped while it applied it
    message = ('toolbus stopped while applying the change to %s you accepted: check the file'):format(name)
  elseif api.nvim_buf_is_valid(view.proposal) and vim.bo[view.proposal].modified then
    view.orphaned = true
    message = ('toolbus stopped waiting for your decision on %s: nothing was written; your edits stay in its tab'):format(name)
  else
    message = ('toolbus stopped waiting for your decision on %s: the diff is closed, nothing was written'):format(name)
  end
  if not view.orphaned then
    M.diff_close(id)
  end
  vim.notify(message, vim.log.levels.WARN)
end

-- Whether any view is left that a toolbus may yet leave orphaned.
local function tend_orphans()
  local watching = false
  for id, view in pairs(diffs) do
    local being_written = view.staged and writing[view.staged.buf]
    if not view.orphaned and not being_written and gone(view.chan) then
      tend_orphan(id, view)
    end
    watching = watching or (diffs[id] ~= nil and not view.orphaned)
  end
  return watching
end

-- For closeAllDiffTabs: at once, rather than within the second the timer below may take.
M.diff_close_orphans = tend_orphans

-- While a view is open, look for orphans now and then.
local ORPHAN_CHECK_MS = 1000
local orphan_check = nil

watch_for_orphans = function()
  if orphan_check then
    return
  end
  orphan_check = assert(vim.uv.new_timer())
  orphan_check:start(
    ORPHAN_CHECK_MS,
    ORPHAN_CHECK_MS,
    vim.schedule_wrap(function()
      if not tend_orphans() and orphan_check then
        orphan_check:close()
        orphan_check = nil
      end
    end)
  )
end

-- The view of the current tab page, for :ToolbusAccept and :ToolbusReject.
local function current_view()
  local tab = api.nvim_get_current_tabpage()
  for id, view in pairs(diffs) do
    if view.tab == tab then
      return id
    end
  end
  return nil
end

for name, action in pairs({ ToolbusAccept = 'accept', ToolbusReject = 'reject' }) do
  api.nvim_create_user_command(name, function()
    local id = current_view()
    if not id then
      vim.notify('No toolbus diff in this tab page', vim.log.levels.WARN)
      return
    end
    decide(id, action)
  end, { desc = 'toolbus: ' .. action .. ' the proposal of this diff' })
end

-- Selection tracking, for getLatestSelection: whenever the user leaves visual mode in a file
-- buffer, remember what was selected. Neovim has set the '< and '> marks by then; but an
-- operator that ends visual mode (`y`) has moved the cursor, and so forgotten a `$` (see
-- at_line_ends): that is noted before each key while visual mode lasts. An operator that
-- changes the text (`d`, `c`, `>`, `gU`) has changed what the marks point at, or removed it:
-- the selection as it stood before that key is noted too, up to SNAPSHOT_LINES lines and
-- SNAPSHOT_BYTES bytes (each key in visual mode reads it: about 1 ms a key at most). A longer
-- one changed so is not known: there is then no latest selection.
local SNAPSHOT_LINES, SNAPSHOT_BYTES = 1000, 100000
local selected_to_line_ends = false
local before_key = nil -- { buf, tick, selection? } before the latest key in visual mode
local visual_keys = api.nvim_create_namespace(NAME .. '_visual_keys')
local function note_visual()
  selected_to_line_ends = at_line_ends()
  local buf = api.nvim_get_current_buf()
  before_key = { buf = buf, tick = api.nvim_buf_get_changedtick(buf) }
  local from, to = vim.fn.getpos('v'), vim.fn.getpos('.')
  local first, last = math.min(from[2], to[2]), math.max(from[2], to[2])
  local bytes = vim.fn.line2byte(last + 1) - vim.fn.line2byte(first) -- -1 past the end: then small
  if is_file_buffer(buf) and last - first < SNAPSHOT_LINES and bytes <= SNAPSHOT_BYTES then
    local mode = VISUAL[api.nvim_get_mode().mode:sub(1, 1)]
    local ok, found = pcall(region, buf, mode, from, to, selected_to_line_ends)
    before_key.selection = ok and found or nil
  end
end

-- What was selected in `buf` when visual mode ended: read at the marks, or, if the key that
-- ended it changed the text, as it stood before that key (false if that is not known).
local function visual_ended(buf, to_line_ends)
  local noted = before_key
  before_key = nil
  if noted and noted.buf == buf and noted.tick ~= api.nvim_buf_get_changedtick(buf) then
    return noted.selection or false -- false: too long to note
  end
  local from, to = vim.fn.getpos("'<"), vim.fn.getpos("'>")
  -- Never an error in the user's face for a selection toolbus could not read.
  local ok, found = pcall(region, buf, vim.fn.visualmode(), from, to, to_line_ends)
  return ok and found or nil
end

api.nvim_create_autocmd('ModeChanged', {
  group = api.nvim_create_augroup(NAME .. '_selection', { clear = true }),
  callback = function(args)
    local was, now = vim.v.event.old_mode:sub(1, 1), vim.v.event.new_mode:sub(1, 1)
    if VISUAL[now] and not VISUAL[was] then
      note_visual()
      vim.on_key(note_visual, visual_keys) -- only while it lasts: every key would pay for it
    elseif VISUAL[was] and not VISUAL[now] then
      vim.on_key(nil, visual_keys)
      local to_line_ends = selected_to_line_ends or at_line_ends() -- noted, or still as it was
      selected_to_line_ends = false
      local found = is_file_buffer(args.buf) and visual_ended(args.buf, to_line_ends)
      if found then
        latest, selections = found, selections + 1
      elseif found == false and is_file_buffer(args.buf) then
        latest = nil -- not an older selection in its place
      end
    end
  end,
})

-- A toolbus conflict mark ends when the user writes or re-reads the buffer's file, which is
-- when `note_read` notes the file's time (as Vim notes it for :write; not for `:w other`).
api.nvim_create_autocmd({ 'BufWritePost', 'BufReadPost' }, {
  group = api.nvim_create_augroup(NAME .. '_conflicts', { clear = true }),
  callback = function(args)
    if vim.fn.fnamemodify(args.match, ':p') == api.nvim_buf_get_name(args.buf) then
      vim.b[args.buf].toolbus_disk_conflict = nil
      note_read(args.buf)
    end
  end,
})
-- Buffers read before toolbus first connected: their files as they are now.
for _, buf in ipairs(api.nvim_list_bufs()) do
  if api.nvim_buf_is_loaded(buf) and is_file_buffer(buf) and vim.b[buf].toolbus_read == nil then
    note_read(buf)
  end
end

return M
