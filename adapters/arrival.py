"""Editor calls take effect in the order they arrive.

The SDK runs every request in a task of its own, so two calls sent without waiting race: one
that arrived later can reach Neovim first (a checkDocumentDirty sent before a saveDocument
could report the state after it). The read stream notes each editor call as it arrives; its
handler waits for the calls noted before it to finish. A call leaves the queue when its handler
finishes, when its answer goes out (the SDK refused it before any handler ran) or when the
client cancels it before its turn, so no call can hold the others back for good. A call
cancelled before its turn never takes it: the SDK cancels its task once it sees the same
notice, and the journal records it `cancelled`.

It also keeps count of the requests not yet answered, so that a client that closes stdin
after its last requests still gets their answers (`answered_all`), but for calls waiting for a
person, which the end of the session cancels.
"""

from __future__ import annotations

import collections
import contextlib
import math
from collections.abc import AsyncIterator, Awaitable, Callable, Collection
from typing import TYPE_CHECKING, Any

import anyio
import anyio.lowlevel
import mcp.types as types
from mcp.shared.dispatcher import coerce_request_id
from mcp.shared.message import SessionMessage

if TYPE_CHECKING:
    from mcp.shared._stream_protocols import WriteStream

RequestId = int | str


class ArrivalOrder:
    """The editor calls not yet finished, in the order they arrived."""

    def __init__(self, ordered_tools: Collection[str]) -> None:
        self._ordered_tools = frozenset(ordered_tools)
        self._waiting: dict[RequestId, None] = {}  # insertion-ordered: arrival order
        self._started: set[RequestId] = set()  # took their turn: under way
        self._cancelled: set[RequestId] = set()  # cancelled by the client before their turn
        # Made by the first call that waits, set and dropped when one leaves: most calls find
        # nobody before them, and should not pay for an event per call.
        self._moved: anyio.Event | None = None
        # Requests owed an answer (ids as the SDK correlates them), and what wakes `answered_all`.
        # Counted: the SDK runs two requests of one id ("7" and 7 too) side by side.
        self._unanswered: collections.Counter[RequestId] = collections.Counter()
        self._answered: anyio.Event | None = None

    def arrived(self, message: Any) -> None:
        """Note a message from the client, in the order they come."""
        if isinstance(message, types.JSONRPCRequest):
            self._unanswered[coerce_request_id(message.id)] += 1
            if self._is_ordered_call(message):
                self._waiting[message.id] = None
        elif isinstance(message, types.JSONRPCNotification) and message.method == "notifications/cancelled":
            request_id = (message.params or {}).get("requestId")
            if isinstance(request_id, int | str) and not isinstance(request_id, bool):
                self.settled(request_id)  # a cancelled request is not answered
            if isinstance(request_id, int | str) and request_id in self._waiting and request_id not in self._started:
                # Marked before the SDK sees the notice: woken by `left`, it must not run meanwhile.
                self._cancelled.add(request_id)
                self.left(request_id)

    def left(self, request_id: RequestId) -> None:
        """`request_id` no longer holds back the calls after it."""
        if request_id in self._waiting:
            del self._waiting[request_id]
            if self._moved is not None:
                self._moved.set()  # wakes every waiter: each checks whether it is now first
                self._moved = None

    def waits_for_a_person(self, request_id: RequestId) -> None:
        """The call now waits for a person: the calls after it go on, and the end of the session
        cancels it rather than waiting for its answer."""
        self.left(request_id)
        self.settled(request_id)

    def settled(self, request_id: RequestId) -> None:
        """`request_id` is owed no answer any more: it was answered, or will not be."""
        key = coerce_request_id(request_id)
        if self._unanswered[key] > 1:
            self._unanswered[key] -= 1
        else:
            self._unanswered.pop(key, None)
        if not self._unanswered and self._answered is not None:
            self._answered.set()

    async def answered_all(self, seconds: float) -> None:
        """Wait, at most `seconds`, until every request is answered but those waiting for a person."""
        with anyio.move_on_after(seconds):
            while self._unanswered:
                self._answered = anyio.Event()
                await self._answered.wait()

    @contextlib.asynccontextmanager
    async def turn(self, request_id: RequestId | None) -> AsyncIterator[Callable[[], Awaitable[None]]]:
        """For the length of a call: what waits until every editor call that arrived before it
        has finished (at once for any other call)."""
        try:
            yield lambda: self._take_turn(request_id)
        finally:
            if request_id is not None:
                self._started.discard(request_id)
                self._cancelled.discard(request_id)
                self.left(request_id)

    async def _take_turn(self, request_id: RequestId | None) -> None:
        if request_id is None:
            return
        while request_id in self._waiting and next(iter(self._waiting)) != request_id:
            if self._moved is None:
                self._moved = anyio.Event()
            await self._moved.wait()
        # Cancelled before its turn, even before its task began: the SDK, which saw the same
        # notice, cancels it.
        if request_id in self._cancelled:
            await anyio.sleep_forever()
        if request_id in self._waiting:  # an editor call (any other was never noted)
            self._started.add(request_id)

    def answers(self, write: WriteStream[SessionMessage]) -> WriteStream[SessionMessage]:
        """`write`, noting each answer that goes out: its call holds back no one any more. An
        answer the SDK writes from a cancelled scope goes out all the same, within LATE_ANSWER_S:
        the SDK writes one there only for a call whose work went on, shielded, to its end (an
        accepted diff's write) when the end of the session cancelled it, never for one its client
        cancelled; and its own write would stop at its first checkpoint, having sent nothing."""
        return _AnswerWatch(write, self)

    def _is_ordered_call(self, request: types.JSONRPCRequest) -> bool:
        params = request.params
        return request.method == "tools/call" and isinstance(params, dict) and params.get("name") in self._ordered_tools


# How long an answer to a call the end of the session cut short may wait on the client.
LATE_ANSWER_S = 1.0


class _AnswerWatch:
    def __init__(self, write: WriteStream[SessionMessage], order: ArrivalOrder) -> None:
        self._write = write
        self._order = order

    async def send(self, item: SessionMessage) -> None:
        answer = item.message
        answered = answer.id if isinstance(answer, types.JSONRPCResponse | types.JSONRPCError) else None
        if answered is not None:
            self._order.left(answered)
            if anyio.current_effective_deadline() == -math.inf:
                await self._send_late(item, answered)
        await self._write.send(item)
        if answered is not None:
            self._order.settled(answered)

    async def _send_late(self, item: SessionMessage, answered: RequestId) -> None:
        """Send an answer past its call's cancellation, then raise that as the SDK expects."""
        gone = (anyio.ClosedResourceError, anyio.BrokenResourceError)
        with anyio.move_on_after(LATE_ANSWER_S, shield=True), contextlib.suppress(*gone):
            await self._write.send(item)
        self._order.settled(answered)
        await anyio.lowlevel.checkpoint()

    async def aclose(self) -> None:
        await self._write.aclose()

    async def __aenter__(self) -> _AnswerWatch:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()
