"""The budget with slabs: the bound across processes, few shared writes, a killed process's
reservation reclaimed by the next scan."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest

from rangestream.io.cache import ByteCache
from rangestream.io.cache import byte_cache as byte_cache_module
from rangestream.io.cache.budget import LEASES, SLAB_FRACTION, read_size, scan_entries
from rangestream.io.cache.entries import HEADER
from rangestream.io.ranges import RangeRequest

URL = "s3://bucket/dataset"
KEY = "data/" + "ef" * 16 + "/shards/0/stream/c/0"
PAYLOAD = 1000
ENTRY = HEADER + PAYLOAD
SLAB = 4 * ENTRY + 64  # four entries per slab, and a rest
BUDGET = SLAB * SLAB_FRACTION


def store(cache: ByteCache, number: int) -> None:
    start = number * PAYLOAD
    cache.store(URL, RangeRequest(KEY, start, start + PAYLOAD), bytes([number % 251]) * PAYLOAD)


def entry_bytes(directory: Path) -> int:
    entries, temps = scan_entries(directory)
    return temps + sum(size for _mtime, size, _path in entries)


def test_most_entries_touch_no_shared_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cache = ByteCache(tmp_path, 64 * BUDGET)  # no eviction: slabs of 1/64 of it
    assert read_size(tmp_path) == 0 and (tmp_path / "SIZE").exists()  # made at once
    writes: list[int] = []
    real = byte_cache_module.write_size
    monkeypatch.setattr(
        byte_cache_module, "write_size", lambda d, n: (writes.append(n), real(d, n))[1]
    )
    slab = 64 * BUDGET // SLAB_FRACTION
    per_slab = slab // ENTRY
    for number in range(3 * per_slab + 1):
        store(cache, number)
    # one SIZE update per slab: a new slab reserved, the unwritten rest of the last back
    assert writes == [k * per_slab * ENTRY + slab for k in range(4)]
    assert entry_bytes(tmp_path) == (3 * per_slab + 1) * ENTRY
    del cache  # hands back the unwritten rest
    assert read_size(tmp_path) == (3 * per_slab + 1) * ENTRY
    assert os.listdir(tmp_path / LEASES) == []


def test_two_processes_never_pass_the_budget_with_their_slabs(tmp_path: Path) -> None:
    first, second = ByteCache(tmp_path, BUDGET), ByteCache(tmp_path, BUDGET)
    for number in range(2 * BUDGET // ENTRY):  # two budgets' worth: evicting throughout
        store(first if number % 3 else second, number)
        on_disk = entry_bytes(tmp_path)
        accounted = read_size(tmp_path)
        assert on_disk <= BUDGET and accounted <= BUDGET
        # the unwritten rest of each slab is accounted too: the two cannot pass it later
        assert on_disk + first._slab + second._slab <= accounted
    assert len(os.listdir(tmp_path / LEASES)) == 2


def test_a_killed_processs_slab_is_reclaimed_by_the_next_scan(tmp_path: Path) -> None:
    ready_read, ready_write = os.pipe()
    pid = os.fork()
    if pid == 0:  # a worker that takes a slab, writes one entry and is killed
        held = ByteCache(tmp_path, BUDGET)
        store(held, 0)
        os.write(ready_write, b"r")
        time.sleep(60)
        os._exit(0)
    assert os.read(ready_read, 1) == b"r"
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    (dead_lease,) = os.listdir(tmp_path / LEASES)
    leaked = SLAB - ENTRY
    assert read_size(tmp_path) == entry_bytes(tmp_path) + leaked
    cache = ByteCache(tmp_path, BUDGET)
    number = 1
    while dead_lease in os.listdir(tmp_path / LEASES):
        store(cache, number)
        number += 1
        assert number < 2 * BUDGET // ENTRY, "no scan reclaimed the dead process's lease"
        if dead_lease in os.listdir(tmp_path / LEASES):  # not scanned yet: still leaked
            assert read_size(tmp_path) == entry_bytes(tmp_path) + leaked + cache._slab
    # the scan counted the files and the live leases: the leak is gone, exactly
    assert read_size(tmp_path) == entry_bytes(tmp_path) + cache._slab
    # and it came when the leaked bytes brought SIZE to the budget, not later
    assert entry_bytes(tmp_path) < BUDGET


def test_a_forked_child_reserves_its_own_slab(tmp_path: Path) -> None:
    cache = ByteCache(tmp_path, BUDGET)
    store(cache, 0)
    assert cache._slab == SLAB - ENTRY
    done_read, done_write = os.pipe()
    pid = os.fork()
    if pid == 0:  # a DataLoader worker: the parent's slab is not its to spend
        cache.reset_after_fork()
        store(cache, 1)
        os.write(done_write, b"%d" % cache._slab)
        os._exit(0)
    child_slab = int(os.read(done_read, 32))
    os.waitpid(pid, 0)
    assert child_slab == SLAB - ENTRY  # a slab of its own, carved once
    # the parent's lease is still counted; the child's (dead, never handed back) is leaked
    # until a scan: SIZE holds both slabs
    assert read_size(tmp_path) == 2 * SLAB
