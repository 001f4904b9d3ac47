"""Per-process state: what this process made, forgotten by a forked child in one place.

DataLoader workers are often forked from a parent that has already read: it may hold open
files, memory maps, an event loop thread and HTTP sessions bound to that loop. None of that
may be used in the child (the loop thread does not exist there; a session's sockets are
shared with the parent). fsspec keeps this discipline in ``asyn.py``; here it lives in one
registry too: every per-process value sits in a :class:`ProcessLocal`, and one at-fork hook
empties them all in the child, which then makes its own on first use. Nothing else in the
package compares process ids.

The child keeps the inherited values alive and never touches them: collecting an inherited
HTTP session would close its sockets, and in the child that also removes them from the
parent's epoll set.
"""

from __future__ import annotations

import asyncio
import os
import threading
import weakref
from collections.abc import Callable, Coroutine
from typing import Any, Generic, TypeVar

__all__ = ["ProcessLocal", "after_fork", "io_loop", "run_blocking"]

T = TypeVar("T")

#: Every live holder; emptied in a forked child by ``_forget_in_child``.
_holders: weakref.WeakSet[ProcessLocal[Any]] = weakref.WeakSet()
#: Values a forked child inherited: kept alive, never used (see the module docstring).
_inherited: list[Any] = []
#: Functions run in a forked child after the holders are emptied, in registration order.
_child_hooks: list[Callable[[], None]] = []
#: Functions run in the parent just before it forks.
_parent_hooks: list[Callable[[], None]] = []


class ProcessLocal(Generic[T]):
    """A value that belongs to the process that made it.

    ``value`` is ``None`` until set, and again in a forked child. Hot paths read ``value``
    directly (one attribute load); ``get_or_make`` makes it once, under a lock, when
    several threads race for it.
    """

    __slots__ = ("__weakref__", "_lock", "value")

    def __init__(self) -> None:
        self.value: T | None = None
        self._lock = threading.Lock()
        _holders.add(self)

    def get_or_make(self, make: Callable[[], T]) -> T:
        value = self.value
        if value is None:
            with self._lock:
                value = self.value
                if value is None:
                    value = self.value = make()
        return value

    def pop(self) -> T | None:
        """Forget the value (the caller releases it) and return it."""
        with self._lock:
            value, self.value = self.value, None
        return value

    def _forget(self) -> None:
        if self.value is not None:
            _inherited.append(self.value)
        self.value = None
        self._lock = threading.Lock()  # a fork copies a lock held by a thread that is gone

    def __reduce__(self) -> tuple[Any, ...]:  # a pickled copy starts empty in its new process
        return (ProcessLocal, ())


def after_fork(*, in_child: Callable[[], None] | None = None,
               before: Callable[[], None] | None = None) -> None:  # fmt: skip
    """Register module-level fork handling that is not a value (counters, caches of ids)."""
    if in_child is not None:
        _child_hooks.append(in_child)
    if before is not None:
        _parent_hooks.append(before)


def _before_fork() -> None:
    for hook in _parent_hooks:
        hook()


def _forget_in_child() -> None:
    for holder in list(_holders):
        holder._forget()
    for hook in _child_hooks:
        hook()


os.register_at_fork(before=_before_fork, after_in_child=_forget_in_child)


# -- the process's I/O loop ------------------------------------------------------------


class _LoopThread:
    """An event loop running on a daemon thread, for sync callers of the async core."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(
            target=self.loop.run_forever, name="rangestream-io", daemon=True
        )
        self.thread.start()


_io = ProcessLocal[_LoopThread]()


def io_loop() -> asyncio.AbstractEventLoop:
    """This process's I/O loop, started on first use in a daemon thread.

    Sync readers, writers' uploads and DataLoader workers all run their coroutines here: one
    loop thread per process, one set of HTTP sessions bound to it.
    """
    loop_thread = _io.value
    if loop_thread is None:
        loop_thread = _io.get_or_make(_LoopThread)
    return loop_thread.loop


def io_loop_started() -> asyncio.AbstractEventLoop | None:
    """The I/O loop if this process has started it (nothing is started by asking)."""
    loop_thread = _io.value
    return None if loop_thread is None else loop_thread.loop


def run_blocking(coroutine: Coroutine[Any, Any, T]) -> T:
    """Run ``coroutine`` on the process's I/O loop and wait for its result."""
    loop = io_loop()
    try:
        running = asyncio.get_running_loop()
    except RuntimeError:
        running = None
    if running is loop:
        coroutine.close()
        raise RuntimeError("a blocking rangestream call was made from inside its own I/O loop")
    return asyncio.run_coroutine_threadsafe(coroutine, loop).result()
