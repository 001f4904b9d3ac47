"""The proxy's request log: which object and which bytes each request asked for, in order.

Counters say how many requests a reader made; a replay needs more: the exact sequence of
(key, byte range) a reader fetched, so that a bare client can repeat precisely those GETs on
the same objects and show what the server and the network alone allow for that pattern.
The log is off until started (recording costs memory per request), and is read in pieces
(:meth:`RequestLog.take`) so a caller can cut the sequence at points of its choosing, e.g.
between timed repeats.

An entry is complete once its response is fully handed to the client's socket (the same
moment the proxy's counters account for it), so a client that has seen its responses finds
them in the next ``take``.
"""

from __future__ import annotations

import re
import threading
from dataclasses import asdict, dataclass
from typing import Any

__all__ = ["LoggedRequest", "RequestLog", "served_range"]

_CONTENT_RANGE = re.compile(r"^\s*bytes\s+(\d+)-(\d+)/(?:\d+|\*)\s*$")


def served_range(content_range: str | None) -> tuple[int, int] | None:
    """``[start, stop)`` of a ``Content-Range: bytes a-b/size`` header, else None."""
    if not content_range:
        return None
    match = _CONTENT_RANGE.match(content_range)
    if match is None:
        return None
    return int(match.group(1)), int(match.group(2)) + 1


@dataclass(frozen=True)
class LoggedRequest:
    """One request the proxy answered while recording.

    ``served`` is the byte range the server answered with (from ``Content-Range``), so a
    suffix or open-ended ``Range`` is resolved to absolute offsets; None for a whole body
    or no body. ``status`` is None when no HTTP response was sent (an injected connection
    reset, or a client that went away). ``arrived`` and ``finished`` are the proxy's
    ``time.monotonic()`` at arrival and when the last body byte was handed over.
    """

    method: str
    path: str  # decoded URL path as the client sent it: "/bucket/key" (path-style)
    query: str
    range: str | None  # the Range header as sent
    status: int | None
    served: tuple[int, int] | None
    body_bytes: int
    arrived: float
    finished: float

    @property
    def bucket(self) -> str:
        return self.path.lstrip("/").partition("/")[0]

    @property
    def key(self) -> str:
        """Object key inside the bucket ("" for bucket-level requests such as listings)."""
        return self.path.lstrip("/").partition("/")[2]

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        out["served"] = list(self.served) if self.served is not None else None
        return out

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> LoggedRequest:
        served = data.get("served")
        return cls(**{**data, "served": tuple(served) if served is not None else None})


class _Pending:
    """An entry while its request runs; filled in by the proxy as the response goes out."""

    __slots__ = (
        "arrived",
        "body_bytes",
        "finished",
        "method",
        "path",
        "query",
        "range",
        "served",
        "status",
    )

    def __init__(self, method: str, path: str, query: str, range_: str | None, arrived: float):
        self.method, self.path, self.query, self.range = method, path, query, range_
        self.arrived = arrived
        self.status: int | None = None
        self.served: tuple[int, int] | None = None
        self.body_bytes = 0
        self.finished: float | None = None

    def frozen(self) -> LoggedRequest:
        assert self.finished is not None
        return LoggedRequest(
            method=self.method,
            path=self.path,
            query=self.query,
            range=self.range,
            status=self.status,
            served=self.served,
            body_bytes=self.body_bytes,
            arrived=self.arrived,
            finished=self.finished,
        )


class RequestLog:
    """Requests in arrival order while recording; thread-safe (the proxy has its own loop).

    ``limit`` bounds the entries held between two takes; requests beyond it are counted in
    :attr:`dropped` instead of recorded, so a forgotten log cannot exhaust memory.
    """

    def __init__(self, limit: int = 1_000_000) -> None:
        if limit < 1:
            raise ValueError("limit must be >= 1")
        self._limit = limit
        self._lock = threading.Lock()
        self._entries: list[_Pending] = []
        self._recording = False
        self._dropped = 0

    @property
    def recording(self) -> bool:
        return self._recording

    @property
    def dropped(self) -> int:
        """Requests not recorded because ``limit`` entries were waiting to be taken."""
        return self._dropped

    def start(self) -> None:
        """Record every request from now on; the log starts empty."""
        with self._lock:
            self._entries = []
            self._dropped = 0
            self._recording = True

    def take(self) -> list[LoggedRequest]:
        """Completed requests recorded since the last take, in arrival order; removed.

        Requests still running stay for a later take.
        """
        with self._lock:
            done = [e for e in self._entries if e.finished is not None]
            self._entries = [e for e in self._entries if e.finished is None]
        return [e.frozen() for e in done]

    def stop(self) -> list[LoggedRequest]:
        """Stop recording; return the completed requests not taken yet (running ones are
        dropped: they finish after the recording ended)."""
        taken = self.take()
        with self._lock:
            self._recording = False
            self._entries = []
        return taken

    # -- the proxy's side ------------------------------------------------------------------

    def open(
        self, method: str, path: str, query: str, range_: str | None, arrived: float
    ) -> _Pending | None:
        """A new entry for a request that just arrived, or None when not recording."""
        if not self._recording:
            return None
        pending = _Pending(method, path, query, range_, arrived)
        with self._lock:
            if not self._recording:
                return None
            if len(self._entries) >= self._limit:
                self._dropped += 1
                return None
            self._entries.append(pending)
        return pending

    def finish(self, pending: _Pending, when: float) -> None:
        """Mark ``pending`` complete: from now on a take returns it."""
        with self._lock:
            if pending.finished is None:
                pending.finished = when
