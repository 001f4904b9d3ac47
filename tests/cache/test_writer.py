"""The cache's writer thread: a lookup waits only for queued entries over its own bytes."""

from __future__ import annotations

import threading

from rangestream.io.cache.claims import ClaimedParts
from rangestream.io.cache.writer import EntryWriter
from rangestream.io.ranges import ByteRequest, RangeRequest

KEY = "data/" + "01" * 16 + "/shards/0/stream/c/0"


class BlockedKeeper:
    """Keeps entries only once ``go`` is set (a slow disk), and notes what it kept."""

    def __init__(self) -> None:
        self.go = threading.Event()
        self.kept: list[ByteRequest] = []
        self.released = 0

    def store(self, url: str, request: ByteRequest, data: bytes | memoryview) -> None:
        assert self.go.wait(60)
        self.kept.append(request)

    def release(self, parts: ClaimedParts) -> None:
        self.released += 1


def waiter(writer: EntryWriter, keeper: BlockedKeeper, start: int, end: int) -> tuple:
    """A thread that waits for ``[start, end)`` and notes how many entries were kept then."""
    seen: list[int] = []

    def run() -> None:
        writer.wait_for(KEY, start, end)
        seen.append(len(keeper.kept))

    thread = threading.Thread(target=run)
    thread.start()
    return thread, seen


def test_a_lookup_waits_only_for_queued_entries_over_its_bytes() -> None:
    writer, keeper = EntryWriter(), BlockedKeeper()
    writer.submit(keeper, "s3://b/d", [(RangeRequest(KEY, 0, 100), b"x" * 100)], ClaimedParts())
    # the next run of the same object: not held up by the entry being written
    apart, apart_seen = waiter(writer, keeper, 100, 200)
    apart.join(10)  # (a wait for the whole key would block here until the entry is kept)
    if apart_seen != [0]:
        keeper.go.set()  # let the writer go before failing
    assert apart_seen == [0]
    # bytes of the queued entry: waits until it is kept
    over, over_seen = waiter(writer, keeper, 50, 150)
    keeper.go.set()
    over.join(60)
    writer.drain()
    assert over_seen == [1] and keeper.kept == [RangeRequest(KEY, 0, 100)]
    assert keeper.released == 1
    # a whole-object wait (suffixes, objects: no span known) waits for any entry of the key
    writer.wait_for(KEY)
