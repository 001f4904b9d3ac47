"""RequestLog: requests in arrival order, each returned once, only when complete."""

from __future__ import annotations

import pytest

from testkit.request_log import LoggedRequest, RequestLog, served_range


@pytest.mark.parametrize(
    ("header", "expected"),
    [
        ("bytes 0-99/1000", (0, 100)),
        ("bytes 5-5/*", (5, 6)),
        ("bytes 4194254-4194353/6291777", (4194254, 4194354)),
        (None, None),
        ("", None),
        ("bytes */1000", None),
        ("items 0-9/10", None),
    ],
)
def test_served_range_is_the_half_open_range_of_a_content_range_header(
    header: str | None, expected: tuple[int, int] | None
) -> None:
    assert served_range(header) == expected


def _request(log: RequestLog, path: str, arrived: float) -> object:
    return log.open("GET", path, "", None, arrived)


def test_nothing_is_recorded_before_start() -> None:
    log = RequestLog()
    assert _request(log, "/b/k", 1.0) is None
    assert log.take() == []


def test_take_returns_finished_requests_in_arrival_order_and_keeps_running_ones() -> None:
    log = RequestLog()
    log.start()
    first, second, third = (_request(log, f"/b/k{i}", float(i)) for i in range(3))
    log.finish(third, 10.0)  # type: ignore[arg-type]
    log.finish(first, 11.0)  # type: ignore[arg-type]

    assert [e.path for e in log.take()] == ["/b/k0", "/b/k2"]
    assert log.take() == []
    log.finish(second, 12.0)  # type: ignore[arg-type]
    assert [(e.path, e.arrived, e.finished) for e in log.take()] == [("/b/k1", 1.0, 12.0)]


def test_stop_returns_the_rest_and_drops_running_requests() -> None:
    log = RequestLog()
    log.start()
    done, running = _request(log, "/b/done", 0.0), _request(log, "/b/running", 1.0)
    log.finish(done, 2.0)  # type: ignore[arg-type]

    assert [e.path for e in log.stop()] == ["/b/done"]
    log.finish(running, 3.0)  # type: ignore[arg-type]
    assert log.take() == []
    assert not log.recording
    assert _request(log, "/b/later", 4.0) is None


def test_start_again_empties_the_log() -> None:
    log = RequestLog()
    log.start()
    log.finish(_request(log, "/b/old", 0.0), 1.0)  # type: ignore[arg-type]
    log.start()
    assert log.take() == []


def test_requests_beyond_the_limit_are_counted_as_dropped() -> None:
    log = RequestLog(limit=2)
    log.start()
    kept = [_request(log, f"/b/{i}", float(i)) for i in range(5)]

    assert sum(k is not None for k in kept) == 2
    assert log.dropped == 3
    for pending in kept[:2]:
        log.finish(pending, 9.0)  # type: ignore[arg-type]
    assert [e.path for e in log.take()] == ["/b/0", "/b/1"]
    assert _request(log, "/b/5", 5.0) is not None  # room again after the take


def test_limit_must_be_positive() -> None:
    with pytest.raises(ValueError, match="limit"):
        RequestLog(limit=0)


def test_logged_request_splits_bucket_and_key_and_round_trips_through_json() -> None:
    entry = LoggedRequest(
        method="GET",
        path="/bench/full/rangestream/tokens/ds/c/0",
        query="",
        range="bytes=-7",
        status=206,
        served=(93, 100),
        body_bytes=7,
        arrived=1.5,
        finished=1.75,
    )

    assert (entry.bucket, entry.key) == ("bench", "full/rangestream/tokens/ds/c/0")
    assert LoggedRequest.from_json(entry.to_json()) == entry
    bucket_level = LoggedRequest("GET", "/bench", "list-type=2", None, 200, None, 10, 0.0, 1.0)
    assert (bucket_level.bucket, bucket_level.key) == ("bench", "")
