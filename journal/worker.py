"""One long-lived thread per journal connection, which runs the journal's blocking database
work handed over from event loops (any loop: each `anyio.run` may be another)."""

from __future__ import annotations

import contextlib
import queue
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

if TYPE_CHECKING:  # asyncio loads lazily: commands that only read never pay for it
    import asyncio

T = TypeVar("T")
C = TypeVar("C")  # the connection the work is given


class Worker:
    """One long-lived thread that runs journal work handed over from event loops.

    Cheaper than a thread-pool hop per transaction (no limiter, no context copy, no pool
    bookkeeping): a queue put to get there, one `call_soon_threadsafe` to come back.
    """

    def __init__(self) -> None:
        self._jobs: queue.SimpleQueue[_Job | None] = queue.SimpleQueue()
        threading.Thread(target=self._serve, name="toolbus-journal", daemon=True).start()

    def submit(self, run: Callable[[Callable[[C], T]], T], work: Callable[[C], T]) -> asyncio.Future[T]:
        import asyncio

        loop = asyncio.get_running_loop()
        future: asyncio.Future[T] = loop.create_future()
        self._jobs.put((lambda: run(work), future, loop))
        return future

    def stop(self) -> None:
        self._jobs.put(None)

    def _serve(self) -> None:
        while (job := self._jobs.get()) is not None:
            call, future, loop = job
            try:
                result = call()
            except BaseException as error:  # delivered to the awaiting caller
                _deliver(loop, future, None, error)
            else:
                _deliver(loop, future, result, None)


_Job = tuple[Callable[[], object], "asyncio.Future[Any]", "asyncio.AbstractEventLoop"]


def _deliver(
    loop: asyncio.AbstractEventLoop, future: asyncio.Future[Any], result: Any, error: BaseException | None
) -> None:
    with contextlib.suppress(RuntimeError):  # the loop has closed: nobody is waiting any more
        loop.call_soon_threadsafe(_settle, future, result, error)


def _settle(future: asyncio.Future[Any], result: Any, error: BaseException | None) -> None:
    if future.done():
        return
    if error is not None:
        future.set_exception(error)
    else:
        future.set_result(result)
