"""Which storage errors are worth retrying, and how long to keep trying.

Object stores throttle (503 SlowDown), reset connections and cut bodies short; all of
those pass if retried with backoff. A missing key or a denied request never does, so those
surface at once.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import random
import socket
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from typing import TypeVar

from rangestream.errors import (
    CorruptDataError,
    EndpointUnreachableError,
    RangestreamError,
    RetriesExhaustedError,
    StorageError,
    TruncatedObjectError,
)

T = TypeVar("T")


class ShortReadError(OSError):
    """A response carried fewer bytes than the range asked for (a truncated body)."""


class WrongRangeError(OSError):
    """An answer for another byte range than asked: a misbehaving server or proxy.

    Not transient (asking again gets the same answer) and never silently accepted: every
    dense inner chunk carries a valid crc32c of its own bytes, so bytes from the wrong
    offset would pass every checksum.
    """


_TRANSIENT_MARKERS = (
    "slowdown",
    "slow down",
    "throttl",
    "serviceunavailable",
    "service unavailable",
    "internalerror",
    "internal error",
    "503",
    "500",
    "502",
    "504",
    "requesttimeout",
    "timed out",
    "timeout",
    "connection reset",
    "connection aborted",
    "server disconnected",
    "payload",
    "cannot connect",
    "could not connect",
    "connect call failed",
    "broken pipe",
    "response ended prematurely",
)


#: HTTP statuses worth another attempt, where a client library's error carries one: gcsfs's
#: ``HttpError.code``, azure-core's ``HttpResponseError.status_code``.
_TRANSIENT_STATUSES = frozenset({408, 429, 500, 502, 503, 504})
#: Client-library errors raised before any answer arrived, or for an answer cut short:
#: azure-core (``ServiceRequestError``, ``ServiceResponseError``) and requests (gcsfs turns a
#: 502 into ``ProxyError``, a body cut short into ``ChunkedEncodingError``).
_TRANSIENT_NAMES = frozenset(
    {"ServiceRequestError", "ServiceResponseError", "ProxyError", "ChunkedEncodingError"}
)


def _transient_status(error: BaseException) -> bool:
    for attribute in ("status_code", "code"):
        status = getattr(error, attribute, None)
        if isinstance(status, int) and status in _TRANSIENT_STATUSES:
            return True
    return False


def is_transient(error: BaseException) -> bool:
    """True for errors that a later attempt of the same request may not hit."""
    if isinstance(error, (FileNotFoundError, PermissionError, IsADirectoryError, WrongRangeError)):
        return False
    if isinstance(error, (RangestreamError, CorruptDataError)):
        return False
    if isinstance(error, (ShortReadError, asyncio.TimeoutError, TimeoutError, ConnectionError)):
        return True
    seen: set[int] = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        module = type(current).__module__ or ""
        if module.startswith("aiohttp") or type(current).__name__ in {
            "EndpointConnectionError",
            "ConnectTimeoutError",
            "ReadTimeoutError",
            "ConnectionClosedError",
            "IncompleteReadError",
            "ResponseStreamingError",
        }:
            return True
        if type(current).__name__ in _TRANSIENT_NAMES or _transient_status(current):
            return True
        text = f"{type(current).__name__} {current}".lower()
        if any(marker in text for marker in _TRANSIENT_MARKERS):
            return True
        current = current.__cause__ or current.__context__
    return False


def is_range_not_satisfiable(error: BaseException) -> bool:
    """True for an HTTP 416 answer: the range starts at or past the end of the object.

    S3 answers a range that starts beyond the object's last byte with ``InvalidRange``
    (s3fs raises it as ``OSError(EINVAL)``) rather than with an empty body; for a reader
    that asked for bytes the metadata promised, both mean the object is shorter.
    """
    seen: set[int] = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        response = getattr(current, "response", None)
        if isinstance(response, dict):
            code = (response.get("Error") or {}).get("Code")
            status = (response.get("ResponseMetadata") or {}).get("HTTPStatusCode")
            if code == "InvalidRange" or status == 416:
                return True
        current = current.__cause__ or current.__context__
    return False


#: Errors of botocore and aiohttp raised when no connection to the endpoint was made.
_UNREACHABLE_NAMES = frozenset(
    {"EndpointConnectionError", "ConnectTimeoutError", "ClientConnectorError"}
)


def is_unreachable(error: BaseException) -> bool:
    """True when the endpoint itself could not be reached (DNS, refused, connect timeout)."""
    seen: set[int] = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        # By class name along the MRO, so subclasses count (aiohttp's DNS failure is a
        # ClientConnectorDNSError) without importing botocore or aiohttp here.
        names = {cls.__name__ for cls in type(current).__mro__}
        if names & _UNREACHABLE_NAMES:
            return True
        if isinstance(current, (ConnectionRefusedError, socket.gaierror)):
            return True
        current = current.__cause__ or current.__context__
    return False


@dataclass(frozen=True)
class RetryPolicy:
    """Retries with exponential backoff and full jitter, bounded by time.

    By default only ``total_timeout`` ends the retries of a request: an endpoint that is
    down or throttling for 30 s (a restart, a failover) is ridden out, where a count of
    attempts with sub-second backoff would give up after about 1.6 s. Like Google's API
    clients (a deadline, no attempt count), not botocore's few attempts, because a training
    run that dies of a short outage costs far more than a request that waits.

    Parameters
    ----------
    max_attempts
        Attempts per request, the first included; ``None`` (the default) bounds them only
        by ``total_timeout``.
    base_delay, max_delay
        Backoff before attempt ``n`` is uniform in ``[0, min(max_delay, base_delay * 2**n)]``
        (full jitter spreads a throttled fleet instead of retrying in lockstep).
    request_timeout
        Seconds one attempt may take before it is abandoned and retried.
    total_timeout
        Seconds all attempts of one request may take together; bounds every read.
    """

    max_attempts: int | None = None
    base_delay: float = 0.05
    max_delay: float = 2.0
    request_timeout: float = 30.0
    total_timeout: float = 120.0

    def __post_init__(self) -> None:
        if self.max_attempts is not None and self.max_attempts < 1:
            raise ValueError(f"max_attempts must be >= 1 or None, got {self.max_attempts}")
        if self.request_timeout <= 0 or self.total_timeout <= 0:
            raise ValueError("request_timeout and total_timeout must be positive")

    def backoff(self, attempt: int, rng: random.Random | None = None) -> float:
        """Seconds to sleep after failed attempt number ``attempt`` (0-based)."""
        ceiling = min(self.max_delay, self.base_delay * (2**attempt))
        return (rng or random).uniform(0.0, ceiling)

    def attempts(self, rng: random.Random | None = None) -> Iterator[tuple[int, float, float]]:
        """``(attempt number, deadline, backoff to sleep first)`` per attempt.

        Stops when the next backoff would pass ``total_timeout`` (or when ``max_attempts``,
        if set, run out first). The caller sleeps the backoff, ``continue``s after a
        transient failure and returns or raises otherwise. A plain generator on purpose: an
        async one left unfinished by a ``return`` costs a finalizer task on the event loop
        for every request.
        """
        deadline = time.monotonic() + self.total_timeout
        numbers = itertools.count() if self.max_attempts is None else range(self.max_attempts)
        for attempt in numbers:
            delay = self.backoff(attempt - 1, rng) if attempt else 0.0
            if time.monotonic() + delay >= deadline:
                return
            yield attempt, deadline, delay


#: Errors an attempt may raise that end the loop at once, as they are: a library error
#: already names what is wrong; a missing object, an existing one or a denied request will
#: not change on a retry (the caller knows what they mean for it).
_PERMANENT = (RangestreamError, FileNotFoundError, FileExistsError, PermissionError)


async def retrying(
    policy: RetryPolicy,
    rng: random.Random,
    attempt: Callable[[int], Awaitable[T]],
    where: str,
    *,
    timeout: bool = True,
) -> T:
    """Run ``attempt(number)`` until it returns, fails for good, or the policy runs out.

    The one retry loop of the package: range reads (``RangeReader``) and every other store
    call (``RetryingStore``: puts, lists, deletes) both go through it, so backoff, time
    bounds and the errors raised when giving up are the same everywhere. ``attempt`` does
    one try and may count it; it raises a permanent error as it wants it seen, and anything
    else is classified here: transient errors (``is_transient``) are retried, others end
    the loop as a ``StorageError`` naming ``where``. ``timeout=False`` leaves attempts
    unbounded in time (local files: nothing to time out on).
    """
    last_error: BaseException | None = None
    made = 0
    for number, deadline, delay in policy.attempts(rng):
        if delay:
            await asyncio.sleep(delay)
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            break
        made += 1
        try:
            if not timeout:
                return await attempt(number)
            # A deadline on the running task, not ``asyncio.wait_for``: that wraps every
            # attempt in a task of its own (and the cyclic garbage of one per request);
            # ``asyncio.timeout`` is one timer handle that cancels this task when it fires.
            async with asyncio.timeout(min(policy.request_timeout, remaining)):
                return await attempt(number)
        except _PERMANENT:
            raise
        except Exception as error:
            if not is_transient(error):
                raise StorageError(f"{where} failed: {error}") from error
            if is_unreachable(error):
                announce_unreachable(where, error, deadline)
            last_error = error
    raise _gave_up(policy, where, last_error, made)


#: Seconds between two notices of an unreachable endpoint (one process, any endpoint).
UNREACHABLE_NOTICE_INTERVAL = 30.0
_log = logging.getLogger("rangestream.retry")
_last_notice = [-UNREACHABLE_NOTICE_INTERVAL]


def announce_unreachable(where: str, error: BaseException, deadline: float) -> None:
    """Say, at the first failed attempt, that an endpoint cannot be reached and is retried.

    Retries ride out an outage for up to ``total_timeout`` (two minutes by default): without
    a word, a command or a training run looked hung all that time. A warning of the
    ``rangestream.retry`` logger (shown on stderr by the CLI, and by Python's last-resort
    handler when logging is not configured), at most one per ``UNREACHABLE_NOTICE_INTERVAL``.
    """
    now = time.monotonic()
    if now - _last_notice[0] < UNREACHABLE_NOTICE_INTERVAL:
        return
    _last_notice[0] = now
    _log.warning(
        "cannot reach the object store for %s (%s); retrying for up to %.0f s more",
        where,
        " ".join(str(error).split()) or type(error).__name__,
        max(0.0, deadline - now),
    )


def _gave_up(
    policy: RetryPolicy, where: str, error: BaseException | None, made: int
) -> RangestreamError:
    if error is not None and is_unreachable(error):
        gave_up: RangestreamError = EndpointUnreachableError(
            f"cannot reach the object store for {where} after {made} attempts: {error}"
        )
    elif isinstance(error, ShortReadError):
        gave_up = TruncatedObjectError(
            f"{where}: the object is shorter than the dataset's metadata says (truncated?): {error}"
        )
    else:
        gave_up = RetriesExhaustedError(
            f"{where} failed after {made} attempts (max_attempts={policy.max_attempts}, "
            f"total_timeout={policy.total_timeout}s): {error!r}"
        )
    gave_up.__cause__ = error
    return gave_up
