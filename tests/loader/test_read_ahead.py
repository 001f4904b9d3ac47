"""The one read-ahead: budget, whole and divisible units, the first read alone, on demand."""

from __future__ import annotations

from typing import Any

import pytest

from rangestream.loader.reading.read_ahead import Deferred, ReadAhead, ReadUnit


class Reads:
    """Records what was issued and when; results are the requests themselves."""

    def __init__(self) -> None:
        self.issued: list[list[Any]] = []
        self.performed: list[list[Any]] = []

    def read(self, requests: list[Any]) -> Deferred:
        self.issued.append(list(requests))

        def perform() -> list[Any]:
            self.performed.append(list(requests))
            return list(requests)

        return Deferred(perform)


def units(*sizes: int, divisible: bool = False) -> list[ReadUnit[int]]:
    out, first = [], 0
    for number, size in enumerate(sizes):
        out.append(ReadUnit(number, list(range(first, first + size)), divisible=divisible))
        first += size
    return out


def drain(ahead: ReadAhead[int]) -> list[tuple[int, list[Any]]]:
    taken = []
    while (found := ahead.take()) is not None:
        taken.append(found)
    return taken


def test_the_first_read_goes_alone_then_reads_fill_the_budget() -> None:
    reads = Reads()
    ahead = ReadAhead(iter(units(2, 2, 2, 2)), reads.read, budget=6, first_alone=True)
    ahead.fill()
    assert reads.issued == [[0, 1]]  # alone until it is taken
    assert ahead.take() == (0, [0, 1])
    assert reads.issued == [[0, 1], [2, 3], [4, 5], [6, 7]]  # 6 in flight, the budget


def test_a_whole_unit_waits_until_it_fits_and_goes_alone_when_larger_than_the_budget() -> None:
    reads = Reads()
    ahead = ReadAhead(iter(units(3, 5, 2)), reads.read, budget=4, first_alone=False)
    ahead.fill()
    assert reads.issued == [[0, 1, 2]]  # 3 + 5 > 4: the run of 5 waits
    ahead.take()
    assert reads.issued[1] == [3, 4, 5, 6, 7]  # nothing else in flight: it goes, whole
    assert len(reads.issued) == 2  # 5 + 2 > 4
    assert [tag for tag, _ in drain(ahead)] == [1, 2]
    assert reads.issued[2] == [8, 9]


@pytest.mark.parametrize("budget", [1, 3, 4, 7])
def test_a_divisible_unit_is_read_in_parts_never_beyond_the_budget(budget: int) -> None:
    reads = Reads()
    ahead = ReadAhead(
        iter(units(5, 5, divisible=True)), reads.read, budget=budget, first_alone=False
    )
    in_flight_peak = 0
    ahead.fill()
    taken: list[Any] = []
    while True:
        in_flight_peak = max(in_flight_peak, ahead._in_flight)
        found = ahead.take()
        if found is None:
            break
        taken.extend(found[1])
    assert taken == list(range(10))  # in order, each once
    assert in_flight_peak <= budget
    assert all(len(part) <= budget for part in reads.issued)
    assert all(max(part) < 5 or min(part) >= 5 for part in reads.issued)  # never two units


def test_on_demand_reads_one_whole_unit_when_the_last_was_taken() -> None:
    reads = Reads()
    ahead = ReadAhead(iter(units(3, 9, 1)), reads.read, budget=None, first_alone=False)
    ahead.fill()
    assert reads.issued == [[0, 1, 2]] and reads.performed == []  # nothing read yet
    assert ahead.take() == (0, [0, 1, 2])
    assert reads.performed == [[0, 1, 2]]
    assert reads.issued[1] == list(range(3, 12))  # whole, whatever its size
    assert [tag for tag, _ in drain(ahead)] == [1, 2]
    assert reads.performed == reads.issued  # each unit read once, in order
