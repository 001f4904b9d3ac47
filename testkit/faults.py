"""What the proxy counts and how it misbehaves: fault kinds, their configuration, the
S3 error bodies it answers with, and the snapshot of its counters.

Kept apart from :mod:`testkit.proxy` (the server) so that tests and benchmarks describe
faults and read counters without the proxy's machinery; every name is re-exported there.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any
from xml.sax.saxutils import escape

__all__ = ["DRAW_ORDER", "ERROR_RESPONSES", "FaultConfig", "FaultKind", "ProxyStats", "s3_error"]


class FaultKind(StrEnum):
    """Failure modes seen from real object stores under load.

    aiohttp (and so s3fs/aiobotocore) silently retries an idempotent request once when its
    connection drops, so a single RESET on a GET is invisible to the caller except as an extra
    request in the stats; inject two in a row to make a caller see one.
    """

    SLOWDOWN = "slowdown"  # 503 with an S3 <Code>SlowDown</Code> body (throttling)
    INTERNAL_ERROR = "internal_error"  # 500 with an S3 <Code>InternalError</Code> body
    RESET = "reset"  # TCP RST instead of any response
    TRUNCATE = "truncate"  # full Content-Length announced, part of the body sent, then close
    SLOW = "slow"  # correct response, but only after FaultConfig.slow_seconds
    ACCESS_DENIED = "access_denied"  # 403 with an S3 <Code>AccessDenied</Code> body


# Fixed draw order: with a seed, the same configuration always maps a draw to the same kind.
DRAW_ORDER = tuple(FaultKind)


@dataclass(frozen=True)
class FaultConfig:
    """Which requests fail, how often, and how; see ``LatencyProxy.set_faults``.

    Probabilities are per eligible request and must sum to at most 1: one uniform draw per
    eligible request picks at most one fault, so with a seed and requests issued one after
    another the sequence of faults is reproducible (concurrent requests may reach the proxy
    in a different order from run to run). A TRUNCATE drawn for a response without a
    non-empty Content-Length (HEAD, empty objects, chunked bodies) is not applied and not
    counted. Eligible means the method is in ``methods``
    (``None`` = every method) and ``path_regex`` (if given) matches the decoded URL path. GETs
    only by default so fixtures that write data are not disturbed by faults meant for reads.
    """

    slowdown: float = 0.0
    internal_error: float = 0.0
    reset: float = 0.0
    truncate: float = 0.0
    slow: float = 0.0
    access_denied: float = 0.0
    slow_seconds: float = 5.0
    truncate_fraction: float = 0.5
    methods: Collection[str] | None = frozenset({"GET"})
    path_regex: str | None = None
    seed: int = 0

    def __post_init__(self) -> None:
        total = 0.0
        for kind in DRAW_ORDER:
            p = self.probability(kind)
            if not 0.0 <= p <= 1.0:
                raise ValueError(f"probability of {kind} must be within [0, 1], got {p}")
            total += p
        if total > 1.0 + 1e-9:
            raise ValueError(f"fault probabilities sum to {total} > 1")
        if self.slow_seconds < 0:
            raise ValueError("slow_seconds must be >= 0")
        if not 0.0 <= self.truncate_fraction < 1.0:
            raise ValueError("truncate_fraction must be within [0, 1)")
        if self.methods is not None:
            object.__setattr__(self, "methods", frozenset(m.upper() for m in self.methods))
        if self.path_regex is not None:
            re.compile(self.path_regex)

    def probability(self, kind: FaultKind) -> float:
        return float(getattr(self, kind.value))

    def applies_to(self, method: str, path: str) -> bool:
        if self.methods is not None and method not in self.methods:
            return False
        return self.path_regex is None or re.search(self.path_regex, path) is not None


@dataclass(frozen=True)
class ProxyStats:
    """A consistent snapshot of the proxy's counters.

    Counters are updated before the corresponding bytes are handed to the client's socket, so
    once a client has seen a response, the snapshot already accounts for it.
    """

    requests: int = 0
    requests_by_method: Mapping[str, int] = field(default_factory=dict)
    range_gets: int = 0  # GET requests that carried a Range header
    response_bytes: int = 0  # body bytes sent to clients (any status, injected errors included)
    responses_by_status: Mapping[int, int] = field(default_factory=dict)
    faults: Mapping[FaultKind, int] = field(default_factory=dict)
    delay_seconds: float = 0.0  # total latency added by `delay` (not by SLOW faults)
    max_in_flight: int = 0  # peak number of requests being handled at the same time

    def method(self, name: str) -> int:
        return self.requests_by_method.get(name.upper(), 0)

    def fault(self, kind: FaultKind) -> int:
        return self.faults.get(kind, 0)

    def to_json(self) -> dict[str, Any]:
        """The snapshot as JSON-compatible values (status codes and fault kinds as strings)."""
        return {
            "requests": self.requests,
            "requests_by_method": dict(self.requests_by_method),
            "range_gets": self.range_gets,
            "response_bytes": self.response_bytes,
            "responses_by_status": {str(k): v for k, v in self.responses_by_status.items()},
            "faults": {str(k): v for k, v in self.faults.items()},
            "delay_seconds": self.delay_seconds,
            "max_in_flight": self.max_in_flight,
        }


def s3_error(code: str, message: str, resource: str, request_id: str) -> bytes:
    return (
        '<?xml version="1.0" encoding="UTF-8"?>\n'
        f"<Error><Code>{code}</Code><Message>{escape(message)}</Message>"
        f"<Resource>{escape(resource)}</Resource><RequestId>{request_id}</RequestId></Error>"
    ).encode()


ERROR_RESPONSES = {
    FaultKind.SLOWDOWN: (503, "Slow Down", "SlowDown", "Please reduce your request rate."),
    FaultKind.INTERNAL_ERROR: (
        500,
        "Internal Server Error",
        "InternalError",
        "We encountered an internal error. Please try again.",
    ),
    FaultKind.ACCESS_DENIED: (403, "Forbidden", "AccessDenied", "Access Denied"),
}
