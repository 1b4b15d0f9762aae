"""The bus: arguments in, a typed command through its handler, the outcome journaled, a reply out.

Write ahead, answer after: a command that acts outside the journal (writes a file, wipes a
buffer) is recorded (status `in_doubt`) before it acts, with the texts the action would
destroy, in one durable transaction; its events and final status are committed in one more
before the reply leaves. A command that changes only the journal, and a query, is recorded
with its outcome in one transaction, also before the reply. A crash in between leaves an
`in_doubt` command, never a silent gap: two syncs at most for a change, none for a query.
A call cancelled by its client (or by the server stopping) finishes too, shielded from the
cancellation: `cancelled`, or `in_doubt` when it may have acted outside the journal.
"""

from __future__ import annotations

import functools
import logging
import re
import time
import typing
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, Literal, TypeVar

import anyio
import msgspec

from toolbus.bus.commands import Command
from toolbus.bus.errors import EditorLost, EditorTimeout, Fault, InvalidArguments, ToolbusError
from toolbus.bus.events import Event
from toolbus.bus.journal import Appended, Caller, CommandRecord, JournalWriter, Status

log = logging.getLogger("toolbus.bus")


@dataclass(frozen=True, slots=True)
class TextItems:
    """A reply of several text items, each sent as it is (openDiff answers `FILE_SAVED` and the
    text, or `DIFF_REJECTED` and the tab name)."""

    items: tuple[str, ...]


# Everything but TextItems and str is answered as JSON (getDiagnostics: a list of files).
Reply = str | TextItems | msgspec.Struct | Sequence[msgspec.Struct] | Mapping[str, Any]
C = TypeVar("C", bound=Command)
E = TypeVar("E", bound=Event)
CANCELLED = "cancelled by the client (or the server stopped) before it finished"


def _no_wait() -> None:
    """The edge's hook when nothing waits on a call's turn (the command line, tests)."""


@dataclass(slots=True)
class HandlerContext(Generic[C]):
    """What a handler gets besides its command: its collaborators, and the journal's two doors."""

    caller: Caller
    services: Any
    _journal: JournalWriter
    _record: CommandRecord
    # The write-ahead row's id, once `write_ahead` has written it.
    command_id: int | None = field(default=None)
    # The edge's hook for a call that goes on waiting for a person: later calls need not wait
    # for it, and its client hears that it is alive.
    _waiting: Callable[[], None] = _no_wait
    # Set once a commit is under way: from then on its outcome, not the bus, decides the status.
    commit_attempted: bool = field(default=False)
    # The status if the call is cancelled after it wrote ahead: it may have acted (a request in
    # flight still runs in Neovim), unless its handler knows better. Before, it is `cancelled`.
    on_cancel: Status = "in_doubt"
    # What the command may have done, recorded if it ends `in_doubt` (the file it may have
    # changed and the text it kept), so that `history` and `recover` reach that text. Given to
    # `write_ahead` just before the handler acts (which also records it for a crash, see
    # `JournalWriter.settle_abandoned`), and cleared by the handler once the action answered.
    if_in_doubt: tuple[Event, ...] = ()

    async def write_ahead(
        self, keep: Mapping[str, bytes] | None = None, *, durable: bool = True, if_in_doubt: tuple[Event, ...] = ()
    ) -> None:
        """Call before acting outside the journal: records the command as `in_doubt`, with `keep`
        (the texts the action would destroy) and `if_in_doubt` (the events saying what the action
        may do), in one transaction, durable on disk unless the action's effect would not outlive
        a power cut either (`durable=False`; a crash of toolbus still finds the row). Called again
        (a retry), it keeps the new texts and events in a transaction of their own, durably."""
        if self.command_id is None:
            self.command_id = await self._journal.begin(self._record, keep, durable=durable, pending=if_in_doubt)
        elif if_in_doubt:
            await self._journal.keep_blobs(keep or {}, command_id=self.command_id, pending=if_in_doubt)
        elif keep:
            await self._journal.keep_blobs(keep)
        if if_in_doubt:
            self.if_in_doubt = if_in_doubt

    async def record(self, *events: E, blobs: Mapping[str, bytes] | None = None) -> list[Appended[E]]:
        """Commit events before the outcome (a proposal shown to the user): durable at once,
        while the command stays `in_doubt` until `commit`. Only after `write_ahead`."""
        if self.command_id is None:
            raise TypeError("record() comes after write_ahead(): the command must be written ahead")
        return await self._journal.append(self.command_id, events, blobs or {})

    def waiting(self) -> None:
        """The call now waits for a person: the calls after it go on, its client is kept informed."""
        self._waiting()

    async def commit(
        self, *events: E, blobs: Mapping[str, bytes] | None = None, error: str | None = None
    ) -> list[Appended[E]]:
        """Append the outcome events (and the blobs they name) and mark the command done: `ok`,
        or `failed` with `error` (what the caller is told) when it did not do what was asked.
        Returns the events as appended: their journal positions, and what the journal set in
        them (`JournalWriter.finish`)."""
        self.commit_attempted = True
        status: Status = "ok" if error is None else "failed"
        return await self._journal.finish(
            self._record, self.command_id, status, events=events, blobs=blobs or {}, error=error
        )


Handler = Callable[[Any, HandlerContext[Any]], Awaitable[Reply]]


class Bus:
    """Dispatches tool calls to their handlers, journaling every call and its outcome."""

    def __init__(
        self,
        commands: Mapping[str, type[Command]],
        handlers: Mapping[type[Command], Handler],
        journal: JournalWriter,
        services: Any,
    ) -> None:
        missing = [cmd.tool for cmd in commands.values() if cmd not in handlers]
        if missing:
            raise ValueError(f"no handler for {missing}")
        self.commands = commands
        self._handlers = handlers
        self._journal = journal
        self.services = services

    async def handle(
        self,
        tool: str,
        arguments: object,
        caller: Caller,
        waiting: Callable[[], None] = _no_wait,
        its_turn: Callable[[], Awaitable[None]] | None = None,
    ) -> Reply:
        """Run one tool call. Raises `ToolbusError` (already journaled) when it cannot.
        `waiting` is called if the call goes on to wait for a person (see `HandlerContext.waiting`);
        `its_turn` is awaited before the handler runs (the calls before it finished): a call
        cancelled meanwhile is journaled `cancelled`."""
        command_type = self.commands.get(tool)
        changes = command_type is not None and command_type.mutates
        record = CommandRecord(
            tool=tool, arguments=arguments, caller=caller, received_ns=time.time_ns(), changes=changes
        )
        try:
            if command_type is None:
                raise InvalidArguments(tool, f"unknown tool; known tools: {', '.join(self.commands)}")
            command = decode_command(command_type, arguments)
        except InvalidArguments as error:  # it changed nothing: its record need not wait for the disk
            rejected = msgspec.structs.replace(record, changes=False)
            await self._journal.finish(rejected, None, "rejected", error=str(error))
            raise
        return await self._run(command, record, waiting, its_turn)

    async def _run(
        self,
        command: Command,
        record: CommandRecord,
        waiting: Callable[[], None],
        its_turn: Callable[[], Awaitable[None]] | None,
    ) -> Reply:
        context: HandlerContext[Any] = HandlerContext(
            caller=record.caller, services=self.services, _journal=self._journal, _record=record, _waiting=waiting
        )
        handler = self._handlers[type(command)]
        try:
            if its_turn is not None:
                await its_turn()
            reply = await handler(command, context)
        except anyio.get_cancelled_exc_class():
            # The reply will never be sent, but the journal still gets its outcome.
            with anyio.CancelScope(shield=True):
                if not context.commit_attempted:
                    cancelled: Status = "cancelled" if context.command_id is None else context.on_cancel
                    await self._finish_failed(record, context, CANCELLED, cancelled)
            raise
        except ToolbusError as error:
            if not _effect_unrecorded(command, context):
                await self._finish_failed(record, context, str(error), _status_of(error, command))
            raise
        except Exception as error:  # a bug: journal it, answer clearly, keep serving
            log.exception("handler for %s crashed", record.tool)
            message = f"{record.tool} failed: internal error: {error!r}"
            status: Status = "in_doubt" if context.if_in_doubt else "failed"  # past a write or wipe asked for
            if not _effect_unrecorded(command, context):
                await self._finish_failed(record, context, message, status)
            raise Fault(message) from error
        if not context.commit_attempted:
            await context.commit()
        return reply

    async def _finish_failed(
        self, record: CommandRecord, context: HandlerContext[Any], message: str, status: Status = "failed"
    ) -> None:
        # If even this cannot be written, the write-ahead row stays `in_doubt`: the truth.
        events = context.if_in_doubt if status == "in_doubt" else ()
        try:
            await self._journal.finish(record, context.command_id, status, error=message, events=events)
        except ToolbusError as error:  # said to the caller already; a traceback adds nothing
            log.error("could not journal the failure of %s: %s", record.tool, error)


def _effect_unrecorded(command: Command, context: HandlerContext[Any]) -> bool:
    """The command changed something outside the journal, then failed to record it: its
    write-ahead row must stay `in_doubt`. (A failed commit of a journal-only change, like a
    memory save, rolled back whole: that is a plain failure; so is one of a command that never
    wrote ahead, for it never acted.)"""
    return context.commit_attempted and command.acts_outside and context.command_id is not None


def _status_of(error: ToolbusError, command: Command) -> Status:
    if isinstance(error, InvalidArguments):  # a handler's own argument check (dates, type lists)
        return "rejected"
    if command.mutates and isinstance(error, EditorTimeout | EditorLost):
        return "in_doubt"  # it may have run (or may still run, once Neovim is free)
    return "failed"


# --- argument decoding -----------------------------------------------------------------

_AT_PATH = re.compile(r"^(?P<msg>.*?)(?: - at `\$(?P<path>[^`]*)`)?$", re.DOTALL)
_MISSING = re.compile(r"^Object missing required field `(?P<field>[^`]+)`$")
_EXPECTED = re.compile(r"^Expected (?P<what>.+?)(?:, got (?P<got>.+))?$")
_PLAIN_WORDS = {"str of length >= 1": "a non-empty string", "array": "an array", "object": "an object"}


def decode_command(command_type: type[C], arguments: object) -> C:
    """Validate tool arguments (as the client sent them, an object or not) into their command,
    or raise `InvalidArguments` naming the field."""
    if not isinstance(arguments, Mapping | None):  # as some clients send them: a JSON string
        got = _JSON_TYPES.get(type(arguments), type(arguments).__name__)
        raise InvalidArguments(command_type.tool, f"arguments: expected an object, got {got}")
    args = dict(arguments or {})
    if (name := _field_with_lone_surrogate(args)) is not None:
        raise InvalidArguments(
            command_type.tool,
            f"{printable(name)}: expected valid Unicode text, got a lone surrogate "
            "(half of a UTF-16 pair, as when a string is cut inside an emoji)",
        )
    # A client may send null for an argument it leaves unset: the default, as when it is absent.
    args = {name: value for name, value in args.items() if value is not None or name not in _defaulted(command_type)}
    if "extra" in command_type.__struct_fields__:
        known = set(command_type.__struct_fields__)
        args = {k: v for k, v in args.items() if k in known and k != "extra"} | {
            "extra": {k: v for k, v in args.items() if k not in known or k == "extra"}
        }
    # JSON has one number type, and JSON Schema's "integer" is any number with no fraction: 10.0
    # is 10. Only the fields that take one: a title of 5.0 is a float where a str belongs, and
    # the extra fields a save keeps are journaled as sent.
    if takes_int := _int_fields(command_type) & args.keys():
        args |= {name: _integral_as_int(args[name]) for name in takes_int}
    try:
        return msgspec.convert(args, command_type)
    except msgspec.ValidationError as error:
        raise InvalidArguments(command_type.tool, _explain(command_type, str(error), args)) from None
    except UnicodeEncodeError:  # msgspec meets a lone surrogate where it compares or encodes text
        raise InvalidArguments(command_type.tool, "text must be valid Unicode (it holds a lone surrogate)") from None


@functools.cache
def _defaulted(command_type: type[Command]) -> frozenset[str]:
    """The arguments of a command that have a default (`extra`, the fields no schema names, aside)."""
    return frozenset(f.name for f in msgspec.structs.fields(command_type) if not f.required and f.name != "extra")


@functools.cache
def _int_fields(command_type: type[Command]) -> frozenset[str]:
    """The fields of a command that take an int, or a list of ints (`ids`)."""
    info = msgspec.inspect.type_info(command_type)
    assert isinstance(info, msgspec.inspect.StructType)
    return frozenset(field.name for field in info.fields if _takes_int(field.type))


def _takes_int(kind: msgspec.inspect.Type) -> bool:
    if isinstance(kind, msgspec.inspect.UnionType):
        return any(_takes_int(member) for member in kind.types)
    if isinstance(kind, msgspec.inspect.ListType):
        return _takes_int(kind.item_type)
    return isinstance(kind, msgspec.inspect.IntType)


def _integral_as_int(value: Any) -> Any:
    """`value`, or the items of a list (`ids`), with a float that has no fraction (`10.0`) as an
    int. Not past 64 bits: no field takes one, and `1e308` would be quoted with 309 digits."""
    if isinstance(value, list):
        return [_integral_as_int(item) for item in value]
    return int(value) if isinstance(value, float) and value.is_integer() and abs(value) < 2**63 else value


_JSON_TYPES: dict[type, str] = {str: "str", list: "array", bool: "bool", int: "int", float: "float"}
_LONE_SURROGATE = re.compile("[\ud800-\udfff]")  # in a Python str, a pair is one code point


def holds_lone_surrogate(value: Any) -> bool:
    """Whether any string in `value` (keys included, at any depth) holds a lone surrogate, which
    no UTF-8 can carry. Iterative: the nesting depth is the client's to choose."""
    pending = [value]
    while pending:
        item = pending.pop()
        if isinstance(item, str):
            if not item.isascii() and _LONE_SURROGATE.search(item):
                return True
        elif isinstance(item, dict):
            pending.extend(item)
            pending.extend(item.values())
        elif isinstance(item, list | tuple):
            pending.extend(item)
    return False


def _field_with_lone_surrogate(args: Mapping[str, Any]) -> str | None:
    return next((name for name, value in args.items() if holds_lone_surrogate([name, value])), None)


def without_lone_surrogates(text: str) -> str:
    """`text` with each lone surrogate (a byte Neovim gave that was not UTF-8: a Latin-1 file
    name, say) as U+FFFD, so that a reply can carry it."""
    return text if text.isascii() else _LONE_SURROGATE.sub("\ufffd", text)


def printable(text: str) -> str:
    """`text` safe to put in a reply: lone surrogates as `\\udXXX` escapes."""
    return text.encode("utf-8", "backslashreplace").decode()


def _explain(command_type: type[Command], message: str, args: Mapping[str, Any]) -> str:
    """Turn msgspec's message into `field: expected ..., got ...`."""
    match = _AT_PATH.match(message)
    assert match is not None
    text, path = match["msg"], (match["path"] or "").lstrip(".")
    if missing := _MISSING.match(text):
        return f"{_join(path, missing['field'])}: required field is missing"
    if text.startswith("Invalid enum value"):
        allowed = _literal_values(command_type, path.split(".")[0].split("[")[0])
        got = text.removeprefix("Invalid enum value").strip()
        return f"{path}: expected one of {', '.join(allowed)}, got {got}"
    if expected := _EXPECTED.match(text):
        what = expected["what"].replace("`", "")
        got = f", got {expected['got'].replace('`', '')}" if expected["got"] else _number_given(args, path)
        if what == "str" and got and path in _literal_fields(command_type):
            return f"{path}: expected one of {', '.join(_literal_values(command_type, path))}{got}"
        return f"{path or 'arguments'}: expected {_PLAIN_WORDS.get(what, what)}{got}"
    if ": expected" in text:  # our own __post_init__ messages already name the field
        return text
    return f"{path}: {text}" if path else text


def _number_given(args: Mapping[str, Any], path: str) -> str:
    """`, got N` for a number out of its field's range (msgspec names only the range)."""
    value = args.get(path)
    return f", got {value}" if isinstance(value, int | float) and not isinstance(value, bool) else ""


def _join(path: str, name: str) -> str:
    return f"{path}.{name}" if path else name


def _literal_fields(command_type: type[Command]) -> set[str]:
    hints = typing.get_type_hints(command_type)
    return {name for name, hint in hints.items() if _literal_args(hint)}


def _literal_values(command_type: type[Command], field_name: str) -> list[str]:
    hint = typing.get_type_hints(command_type).get(field_name)
    return [str(v) for v in _literal_args(hint)] if hint is not None else []


def _literal_args(hint: Any) -> tuple[Any, ...]:
    if typing.get_origin(hint) is Literal:
        return typing.get_args(hint)
    for arg in typing.get_args(hint):
        if found := _literal_args(arg):
            return found
    return ()
