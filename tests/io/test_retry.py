"""``RetryPolicy``: by default the time bound, not a count of attempts, ends the retries."""

from __future__ import annotations

import random
import socket
import uuid
from typing import Any

import numpy as np
import pytest

from rangestream import RetryPolicy, StreamNumpyFormat, StreamStorage
from rangestream.errors import StorageError
from rangestream.io import retry
from testkit import FaultKind, LatencyProxy, S3Endpoint

TOKENS = np.dtype([("tokens", "<i4")])


class FakeClock:
    """``time.monotonic`` for the policy: advances only by the backoffs it hands out."""

    def __init__(self) -> None:
        self.now = 1000.0

    def monotonic(self) -> float:
        return self.now


def outage_ridden_out(policy: RetryPolicy, monkeypatch: pytest.MonkeyPatch) -> tuple[int, float]:
    """Attempts and seconds of backoff the policy allows while every attempt fails at once."""
    clock = FakeClock()
    monkeypatch.setattr(retry.time, "monotonic", clock.monotonic)
    attempts = 0
    for _attempt, _deadline, delay in policy.attempts(random.Random(7)):
        clock.now += delay
        attempts += 1
        assert attempts < 100_000, "the policy never gave up"
    return attempts, clock.now - 1000.0


def test_the_default_policy_keeps_retrying_for_its_total_timeout(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    policy = RetryPolicy()
    attempts, seconds = outage_ridden_out(policy, monkeypatch)
    assert seconds >= 30.0  # an endpoint down for 30 s is ridden out
    # it stops only because the next backoff would pass total_timeout
    assert policy.total_timeout - policy.max_delay <= seconds <= policy.total_timeout
    assert attempts > 6


def test_an_explicit_attempt_bound_still_ends_the_retries_first(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    attempts, seconds = outage_ridden_out(RetryPolicy(max_attempts=4), monkeypatch)
    assert attempts == 4 and seconds < 1.0


def test_a_bound_below_one_attempt_is_refused() -> None:
    with pytest.raises(ValueError, match="max_attempts"):
        RetryPolicy(max_attempts=0)


def test_a_read_rides_out_more_failures_than_the_old_six_attempts_by_default(
    s3_server: S3Endpoint, s3_bucket: str
) -> None:
    url = f"s3://{s3_bucket}/outage-{uuid.uuid4().hex[:8]}"
    tokens = np.arange(5000, dtype="<i4")
    storage = StreamStorage(
        url, StreamNumpyFormat(TOKENS), storage_options=s3_server.storage_options
    )
    with storage.sync_writer() as writer:
        writer.append(0, {"tokens": tokens})
    with LatencyProxy(s3_server, delay=0.0) as proxy:
        options: dict[str, Any] = proxy.storage_options
        reader_storage = StreamStorage(url, StreamNumpyFormat(TOKENS), storage_options=options)
        proxy.fail_next(FaultKind.SLOWDOWN, 9)  # the open's first nine GETs answer 503
        with reader_storage.sync_reader() as reader:  # the default RetryPolicy
            window = reader.read(1000, 50)
            stats = reader.stats
        assert proxy.stats().fault(FaultKind.SLOWDOWN) == 9
    assert stats.retries == 9
    np.testing.assert_array_equal(window["tokens"], tokens[1000:1050])


def _dns_failure() -> BaseException:
    import aiohttp

    key = aiohttp.client_reqrep.ConnectionKey("no-such-host", 9000, False, True, None, None, None)
    return aiohttp.ClientConnectorDNSError(key, OSError(-2, "Name or service not known"))


@pytest.mark.parametrize(
    ("make_error", "unreachable"),
    [
        (lambda: ConnectionRefusedError(111, "refused"), True),
        (lambda: socket.gaierror(-2, "Name or service not known"), True),
        (_dns_failure, True),  # a subclass of ClientConnectorError, matched along its MRO
        (lambda: ConnectionResetError(104, "reset"), False),
        (lambda: TimeoutError("read timed out"), False),
    ],
)
def test_unreachable_means_no_connection_was_made(make_error: Any, unreachable: bool) -> None:
    try:
        try:
            raise make_error()
        except Exception as cause:
            raise StorageError("wrapped") from cause
    except StorageError as error:
        assert retry.is_unreachable(error) is unreachable
