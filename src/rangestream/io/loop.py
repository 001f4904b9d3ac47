"""One background event loop per process, for the sync wrappers.

Sync calls into the async core run their coroutine on this loop (the fsspec pattern).
After ``fork`` the child must not touch the parent's loop or thread, so the loop is
forgotten in the child and made anew on first use.
"""

from __future__ import annotations

import asyncio
import os
import threading
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")

_lock = threading.Lock()
_loop: asyncio.AbstractEventLoop | None = None
_loop_pid: int | None = None
_pid = os.getpid()


def current_pid() -> int:
    """This process's id, kept up to date across fork without a syscall per call."""
    return _pid


def _forget_after_fork() -> None:
    global _loop, _loop_pid, _lock, _pid
    _loop = None
    _loop_pid = None
    _lock = threading.Lock()
    _pid = os.getpid()


os.register_at_fork(after_in_child=_forget_after_fork)


def io_loop() -> asyncio.AbstractEventLoop:
    """This process's I/O loop, started on first use in a daemon thread."""
    global _loop, _loop_pid
    pid = os.getpid()
    if _loop is not None and _loop_pid == pid:
        return _loop
    with _lock:
        if _loop is None or _loop_pid != pid:
            loop = asyncio.new_event_loop()
            thread = threading.Thread(target=loop.run_forever, name="rangestream-io", daemon=True)
            thread.start()
            _loop, _loop_pid = loop, pid
    return _loop


def run_sync(coroutine: Coroutine[Any, Any, T]) -> T:
    """Run ``coroutine`` on the process's I/O loop and wait for its result."""
    loop = io_loop()
    try:
        running = asyncio.get_running_loop()
    except RuntimeError:
        running = None
    if running is loop:
        coroutine.close()
        raise RuntimeError("a sync rangestream call was made from inside its own I/O loop")
    return asyncio.run_coroutine_threadsafe(coroutine, loop).result()
