"""Coalescing merges only nearby ranges of one object, within the size bound."""

from __future__ import annotations

from rangestream.io.ranges import RangeRequest, coalesce


def test_ranges_within_the_gap_merge_and_keep_their_members() -> None:
    requests = [RangeRequest("a", 100, 200), RangeRequest("a", 0, 50), RangeRequest("a", 250, 300)]
    merged = coalesce(requests, gap=50, max_bytes=1000)
    assert [(m.start, m.end, m.members) for m in merged] == [(0, 300, (1, 0, 2))]


def test_ranges_farther_apart_than_the_gap_stay_separate() -> None:
    merged = coalesce(
        [RangeRequest("a", 0, 10), RangeRequest("a", 100, 110)], gap=89, max_bytes=10**6
    )
    assert [(m.start, m.end) for m in merged] == [(0, 10), (100, 110)]


def test_ranges_of_different_objects_never_merge() -> None:
    merged = coalesce(
        [RangeRequest("a", 0, 10), RangeRequest("b", 10, 20)], gap=100, max_bytes=10**6
    )
    assert len(merged) == 2


def test_a_merge_that_would_exceed_max_bytes_starts_a_new_request() -> None:
    requests = [RangeRequest("a", i * 100, i * 100 + 100) for i in range(5)]
    merged = coalesce(requests, gap=0, max_bytes=250)
    assert [(m.start, m.end) for m in merged] == [(0, 200), (200, 400), (400, 500)]
