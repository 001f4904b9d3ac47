"""Claims on their own: a live claim is waited for, a released or abandoned one is not."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

from rangestream.io.cache import ByteCache
from rangestream.io.cache.claims import CLAIMS, LOCKS, split_covered
from rangestream.io.ranges import RangeRequest

URL = "s3://bucket/dataset"
KEY = "data/" + "cd" * 16 + "/shards/0/stream/c/0"
OBJECT = bytes(range(256)) * 16


def test_split_covered_cuts_a_range_around_what_is_covered() -> None:
    assert split_covered(0, 100, []) == ([(0, 100)], [])
    assert split_covered(0, 100, [(20, 30), (25, 40), (90, 200)]) == (
        [(0, 20), (40, 90)],
        [(20, 30), (30, 40), (90, 100)],
    )
    assert split_covered(10, 20, [(0, 50)]) == ([], [(10, 20)])


def test_a_second_claimer_waits_for_a_live_claim_and_reads_its_entry(tmp_path: Path) -> None:
    first, second = ByteCache(tmp_path, 1 << 20), ByteCache(tmp_path, 1 << 20)
    mine = first.claim(URL, [RangeRequest(KEY, 100, 300)])
    assert mine.mine == [RangeRequest(KEY, 100, 300)] and not mine.theirs
    # another process (a descriptor of its own: OFD locks conflict across them)
    other = second.claim(URL, [RangeRequest(KEY, 0, 400)])
    assert other.mine == [RangeRequest(KEY, 0, 100), RangeRequest(KEY, 300, 400)]
    assert other.theirs == [RangeRequest(KEY, 100, 300)]
    assert len(other.awaited) == 1 and second.claim_is_live(other.awaited[0])
    first.store(URL, RangeRequest(KEY, 100, 300), OBJECT[100:300])
    first.release(mine)
    assert not second.claim_is_live(other.awaited[0])
    counts = [0, 0, 0, 0]
    pieces, holes = second.kept(URL, RangeRequest(KEY, 100, 300), counts)
    assert pieces == [(100, OBJECT[100:300])] and holes == [] and counts == [0, 0, 200, 0]
    second.release(other)
    # every claim let go of: a new claimer waits for none, fetches what no entry holds
    again = ByteCache(tmp_path, 1 << 20).claim(URL, [RangeRequest(KEY, 0, 400)])
    assert again.mine == [RangeRequest(KEY, 0, 100), RangeRequest(KEY, 300, 400)]
    assert again.theirs == [RangeRequest(KEY, 100, 300)] and not again.awaited
    assert os.listdir(tmp_path / CLAIMS) == [LOCKS]  # no file made per claim
    # an entry kept and released: a later claimer neither fetches nor waits for it
    later = ByteCache(tmp_path, 1 << 20).claim(URL, [RangeRequest(KEY, 150, 250)])
    assert later.mine == [] and later.theirs == [RangeRequest(KEY, 150, 250)] and not later.awaited


def test_the_claim_of_a_process_that_died_is_not_waited_for(tmp_path: Path) -> None:
    ready_read, ready_write = os.pipe()
    pid = os.fork()
    if pid == 0:  # a process that claims a range and is killed before fetching it
        ByteCache(tmp_path, 1 << 20).claim(URL, [RangeRequest(KEY, 0, 100)])
        os.write(ready_write, b"r")
        time.sleep(60)
        os._exit(0)
    assert os.read(ready_read, 1) == b"r"
    cache = ByteCache(tmp_path, 1 << 20)
    while_alive = cache.claim(URL, [RangeRequest(KEY, 0, 100)])
    assert while_alive.mine == [] and while_alive.theirs == [RangeRequest(KEY, 0, 100)]
    assert cache.claim_is_live(while_alive.awaited[0])
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    assert not cache.claim_is_live(while_alive.awaited[0])
    parts = cache.claim(URL, [RangeRequest(KEY, 0, 100)])
    assert parts.mine == [RangeRequest(KEY, 0, 100)] and not parts.awaited


def test_a_forked_child_does_not_keep_its_parents_claims_alive(tmp_path: Path) -> None:
    cache = ByteCache(tmp_path, 1 << 20)
    parts = cache.claim(URL, [RangeRequest(KEY, 0, 100)])
    ((path, fd),) = parts.held
    read, write = os.pipe()
    ready_read, ready_write = os.pipe()
    pid = os.fork()
    if pid == 0:  # a DataLoader worker forked while its parent fetches
        cache.reset_after_fork()
        os.write(ready_write, b"r")
        os.read(read, 1)  # lives on after its parent let go of the claim
        os._exit(0)
    try:
        assert os.read(ready_read, 1) == b"r"
        assert cache.claim_is_live(path)
        os.close(fd)  # the parent dies mid-fetch: its lock goes, the child's copy is closed
        assert not cache.claim_is_live(path)
    finally:
        os.write(write, b"x")
        os.waitpid(pid, 0)


def test_entries_kept_later_are_hits_at_once_and_released_once_written(tmp_path: Path) -> None:
    cache, other = ByteCache(tmp_path, 1 << 20), ByteCache(tmp_path, 1 << 20)
    parts = cache.claim(URL, [RangeRequest(KEY, 0, 500)])
    assert parts.mine == [RangeRequest(KEY, 0, 500)]
    cache.keep_later(URL, [(RangeRequest(KEY, 0, 500), OBJECT[:500])], parts)
    counts = [0, 0, 0, 0]
    # this process waits for its own queued entry: a hit, not a miss
    assert cache.lookup(URL, RangeRequest(KEY, 100, 200), counts) == OBJECT[100:200]
    assert counts == [1, 0, 100, 0]
    cache.drain()
    later = other.claim(URL, [RangeRequest(KEY, 0, 500)])
    assert later.mine == [] and later.theirs == [RangeRequest(KEY, 0, 500)] and not later.awaited


def test_a_released_claims_descriptor_is_reused_unlocked(tmp_path: Path) -> None:
    cache, other = ByteCache(tmp_path, 1 << 20), ByteCache(tmp_path, 1 << 20)
    parts = cache.claim(URL, [RangeRequest(KEY, 0, 100)])
    ((_claim, fd),) = parts.held
    assert other.claim(URL, [RangeRequest(KEY, 0, 100)]).awaited  # locked
    cache.release(parts)
    # unlocked on release (no other claimer waits), its descriptor kept for the next claim
    free = other.claim(URL, [RangeRequest(KEY, 0, 100)])
    assert free.mine == [RangeRequest(KEY, 0, 100)] and not free.awaited
    other.release(free)
    again = cache.claim(URL, [RangeRequest(KEY, 0, 100)])
    assert again.mine == [RangeRequest(KEY, 0, 100)] and not again.awaited
    assert [held_fd for _c, held_fd in again.held] == [fd]
    # and a reused descriptor's lock is a claim as before: another process waits for it
    assert other.claim(URL, [RangeRequest(KEY, 50, 60)]).awaited
