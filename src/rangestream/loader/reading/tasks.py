"""One iteration's work on the process's I/O loop, cancelled and drained when it closes.

A process has one I/O loop thread (:func:`rangestream.io.process.io_loop`): sync readers,
writers' uploads and the loader's read-ahead all run there, sharing one set of HTTP
sessions. A thread (rather than ``run_until_complete`` on the worker's own thread) lets
reads progress while the worker collates and hands batches to the DataLoader. An iteration
does not own that loop, only its own tasks: :class:`IterationTasks` records every task it
starts and the contexts it entered, and closing it cancels those tasks, waits until they
have finished, and exits the contexts, so an abandoned, failed or finished iteration leaves
nothing running and nothing half read, while other users of the loop carry on.
"""

from __future__ import annotations

import asyncio
import atexit
import concurrent.futures
import contextlib
import os
import sys
import weakref
from collections.abc import Coroutine
from contextlib import AbstractAsyncContextManager
from typing import Any, TypeVar

from rangestream.errors import StateError
from rangestream.io.process import io_loop

__all__ = ["SHUTDOWN_SECONDS", "IterationTasks"]

T = TypeVar("T")

SHUTDOWN_SECONDS = 30.0
"""How long closing waits for the iteration's reads to cancel and its readers to exit."""


class IterationTasks:
    """The tasks and entered contexts of one iteration, on this process's I/O loop."""

    def __init__(self) -> None:
        self._pid = os.getpid()
        self._loop = io_loop()
        self._tasks: set[asyncio.Task[Any]] = set()  # touched on the loop thread only
        self._futures: set[concurrent.futures.Future[Any]] = set()  # as the caller sees them
        self._stack = contextlib.AsyncExitStack()
        self._closed = False
        _live.add(self)

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        return self._loop

    def submit(self, coroutine: Coroutine[Any, Any, T]) -> concurrent.futures.Future[T]:
        """Run ``coroutine`` as a task of this iteration; its result as a future."""
        if os.getpid() != self._pid:
            coroutine.close()
            raise StateError(
                f"a loader iteration started in process {self._pid} cannot read in process "
                f"{os.getpid()}; iterate the dataset in the process that reads"
            )
        if self._closed:
            coroutine.close()
            raise StateError("this loader iteration is closed")
        future = asyncio.run_coroutine_threadsafe(self._tracked(coroutine), self._loop)
        self._futures.add(future)
        future.add_done_callback(self._futures.discard)
        return future

    async def _tracked(self, coroutine: Coroutine[Any, Any, T]) -> T:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        try:
            return await coroutine
        finally:
            self._tasks.discard(task)

    async def enter(self, context: AbstractAsyncContextManager[T]) -> T:
        """Enter an async context (on the loop); it is exited when the iteration closes."""
        return await self._stack.enter_async_context(context)

    def close(self) -> None:
        """Cancel this iteration's tasks, wait for them, exit its contexts (idempotent).

        Never blocks for good: a forked copy has no tasks, after interpreter finalisation
        has begun the loop thread cannot run any more (live iterations are closed earlier,
        at exit), and a stuck shutdown is abandoned after :data:`SHUTDOWN_SECONDS`.
        """
        if self._closed or os.getpid() != self._pid or sys.is_finalizing():
            return
        self._closed = True
        _live.discard(self)
        if _running_loop() is self._loop:
            # dropped on the loop's own thread: it cannot wait for itself
            self._loop.create_task(self._shutdown())
            return
        future = asyncio.run_coroutine_threadsafe(self._shutdown(), self._loop)
        with contextlib.suppress(concurrent.futures.TimeoutError):
            future.result(timeout=SHUTDOWN_SECONDS)

    async def _shutdown(self) -> None:
        while tasks := [task for task in self._tasks if not task.done()]:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
        await self._stack.aclose()

    def pending(self) -> int:
        """Coroutines submitted by this iteration and not finished yet (for tests and
        diagnostics)."""
        return sum(not future.done() for future in list(self._futures))


def _running_loop() -> asyncio.AbstractEventLoop | None:
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None


#: Iterations not closed yet: closed at interpreter exit, while the loop thread can still
#: run (after finalisation starts, a daemon thread never runs again and waiting would hang).
_live: weakref.WeakSet[IterationTasks] = weakref.WeakSet()


@atexit.register
def _close_live() -> None:
    for tasks in list(_live):
        with contextlib.suppress(Exception):
            tasks.close()
