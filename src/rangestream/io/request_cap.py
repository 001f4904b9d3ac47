"""The process's request cap: how many requests its readers may have in flight at once.

Requests in flight are bounded twice, and both bounds are derived from one number:

- **Per reader call** (one window, one ``read_many``): ``RangeReader.max_concurrency`` or
  the call's ``max_concurrency``. The concurrency a caller asks for is therefore *reader
  calls in flight x ranges per call*, and that is what the process admits, up to
- **the process cap** (this module): a ceiling across every reader and call of the
  process's event loop, so that no number of calls can open unbounded connections. It is
  ``DEFAULT_PROCESS_MAX_REQUESTS`` (1,024, or half the soft file-descriptor limit where
  that is smaller: every request in flight holds a socket), ``RANGESTREAM_PROCESS_MAX_REQUESTS``
  in the environment, or ``set_process_max_concurrency``.
- **The connection pool** of the lean S3 client (and of s3fs's botocore client) is sized to
  the process cap, unless ``config_kwargs["max_pool_connections"]`` says otherwise: a pool
  smaller than the cap is a second, hidden cap (a pool of 64 held 64 document batches in
  flight, 1,009 wanted requests, to 64 requests: 14-19 batches/s against 24-57 with both
  raised, docs/design.md). Connections open only as requests need them, so a large pool
  costs nothing until the concurrency asked for reaches it.

Why 1,024: 64 ``read_many`` calls of 16 documents (or 64 loader windows of up to 16 ranges)
fit whole. A DataLoader worker is its own process with its own cap.
"""

from __future__ import annotations

import asyncio
import os
import weakref

from rangestream.io.process import ProcessLocal

__all__ = [
    "DEFAULT_PROCESS_MAX_REQUESTS",
    "PROCESS_MAX_REQUESTS_ENV",
    "process_max_requests",
    "process_slots",
    "set_process_max_concurrency",
]

#: Environment override of the process cap (a positive integer).
PROCESS_MAX_REQUESTS_ENV = "RANGESTREAM_PROCESS_MAX_REQUESTS"
#: The cap where file descriptors allow it.
PROCESS_MAX_REQUESTS_TARGET = 1024


def _default_cap() -> int:
    """The environment's cap, else the target within half the soft descriptor limit."""
    override = os.environ.get(PROCESS_MAX_REQUESTS_ENV, "").strip()
    if override.isdigit() and int(override) > 0:
        return int(override)
    try:
        import resource

        soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    except (ImportError, OSError, ValueError):  # not a POSIX system: no such limit to heed
        return PROCESS_MAX_REQUESTS_TARGET
    if soft < 0:  # RLIM_INFINITY
        return PROCESS_MAX_REQUESTS_TARGET
    return max(64, min(PROCESS_MAX_REQUESTS_TARGET, soft // 2))


#: The process cap this process starts with.
DEFAULT_PROCESS_MAX_REQUESTS = _default_cap()

_cap = DEFAULT_PROCESS_MAX_REQUESTS
#: Per event loop of this process: the semaphore of its requests in flight.
_slots = ProcessLocal[weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, asyncio.Semaphore]]()
#: The last loop asked for (weakly) and its semaphore: every request asks, and a weak-keyed
#: lookup makes a weak reference each time.
_last = ProcessLocal[tuple[weakref.ref[asyncio.AbstractEventLoop], asyncio.Semaphore]]()


def process_max_requests() -> int:
    """The process cap now: requests in flight across every reader of a loop, and the
    size of connection pools made from now on."""
    return _cap


def set_process_max_concurrency(limit: int) -> None:
    """Set the process cap (``DEFAULT_PROCESS_MAX_REQUESTS`` by default).

    It bounds requests in flight at once; connection pools made after this call are sized
    to it (set it before the first read to size the first pool).
    """
    global _cap
    if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
        raise ValueError(f"the process request bound must be an integer >= 1, got {limit!r}")
    _cap = limit
    _slots.pop()
    _last.pop()


def process_slots() -> asyncio.Semaphore:
    """The running loop's semaphore of requests in flight (``process_max_requests`` slots)."""
    loop = asyncio.get_running_loop()
    last = _last.value
    if last is not None and last[0]() is loop:
        return last[1]
    by_loop = _slots.value or _slots.get_or_make(weakref.WeakKeyDictionary)
    semaphore = by_loop.get(loop)
    if semaphore is None:
        semaphore = by_loop[loop] = asyncio.Semaphore(_cap)
    _last.value = (weakref.ref(loop), semaphore)
    return semaphore
