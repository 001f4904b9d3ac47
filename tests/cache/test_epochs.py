"""The byte cache over S3, counted at the proxy: a second epoch served from local disk."""

from __future__ import annotations

import gc
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from support.s3 import S3Location

from rangestream import StatefulDataLoader, StreamNumpyFormat, StreamStorage
from rangestream.io.cache import cache_for, summarize_cache
from rangestream.io.cache.byte_cache import HEADER, scan_entries
from testkit import LatencyProxy

TOKENS = np.dtype([("tokens", "<i4")])
WINDOW = 8
WINDOWS = 2000


def write(url: str, options: dict[str, Any]) -> None:
    storage = StreamStorage(url, StreamNumpyFormat(TOKENS), storage_options=options,
                            chunk_bytes=64, block_bytes=1024)  # fmt: skip
    with storage.sync_writer(overwrite=True) as writer:
        tokens = np.arange(WINDOWS * WINDOW, dtype="<i4")
        writer.append(0, {"tokens": tokens[: len(tokens) // 3]})
        writer.append(1, {"tokens": tokens[len(tokens) // 3 :]})


def epoch_windows(loader: StatefulDataLoader) -> list[int]:
    """The windows of one epoch, each checked to hold exactly its tokens."""
    starts = []
    for batch in loader:
        tokens = batch["tokens"].numpy()
        first = tokens[:, :1]
        assert (tokens == first + np.arange(WINDOW)).all()
        assert (first % WINDOW == 0).all()
        starts += (first[:, 0] // WINDOW).tolist()
    return starts


def test_a_second_shuffled_epoch_through_two_workers_is_served_by_the_cache(
    s3_url: S3Location, s3_proxy: LatencyProxy, tmp_path: Path
) -> None:
    write(s3_url.url, s3_url.storage_options)
    cache = tmp_path / "cache"
    storage = StreamStorage(s3_url.url, StreamNumpyFormat(TOKENS),
                            storage_options=s3_proxy.merge_storage_options(s3_url.storage_options),
                            cache_dir=str(cache), cache_bytes="64M")  # fmt: skip
    loader = StatefulDataLoader.from_storage(
        storage, sequence_length=WINDOW, batch_size=5, num_workers=2, shuffle="block",
        run_windows=4, shuffle_seed=3, multiprocessing_context="fork",
    )  # fmt: skip
    s3_proxy.reset_stats()
    first = epoch_windows(loader)
    cold = s3_proxy.stats().method("GET")
    after_first = loader.source_stats()["source"]
    s3_proxy.reset_stats()
    second = epoch_windows(loader)
    warm = s3_proxy.stats().method("GET")
    after_second = loader.source_stats()["source"]
    assert sorted(first) == sorted(second) == list(range(WINDOWS))
    assert first != second  # shuffled anew
    assert cold >= 400  # a request per run of 4 windows at least (500 runs)
    assert warm <= cold // 100, (cold, warm)
    # the loader's counts, added up over its workers: what the proxy saw, and the cache's
    assert after_first["requests"] == cold and after_first["cache_misses"] >= 400
    epoch2 = {name: after_second[name] - after_first[name] for name in after_first}
    assert epoch2["requests"] == warm and epoch2["cache_misses"] == 0
    assert epoch2["cache_hits"] >= 400  # a hit per run at least (500 runs)
    assert epoch2["cache_bytes"] >= WINDOWS * WINDOW * 4  # every token from the cache
    summary = summarize_cache(cache)
    assert summary.hits > 0 and summary.dropped == 0
    stored = sum(b for _n, b in summary.datasets.values())
    assert stored == summary.bytes


def cached_storage(url: str, options: dict[str, Any], cache: Path, budget: int) -> StreamStorage:
    return StreamStorage(url, StreamNumpyFormat(TOKENS), storage_options=options,
                         cache_dir=str(cache), cache_bytes=budget)  # fmt: skip


def shuffled(storage: StreamStorage, workers: int = 2) -> StatefulDataLoader:
    context = {"multiprocessing_context": "fork"} if workers else {}
    return StatefulDataLoader.from_storage(
        storage, sequence_length=WINDOW, batch_size=5, num_workers=workers, shuffle="block",
        run_windows=4, shuffle_seed=3, **context,
    )  # fmt: skip


def test_half_the_data_as_budget_stays_exact_and_within_it(
    s3_url: S3Location, s3_proxy: LatencyProxy, tmp_path: Path
) -> None:
    write(s3_url.url, s3_url.storage_options)
    options = s3_proxy.merge_storage_options(s3_url.storage_options)
    full = tmp_path / "full"
    epoch_windows(shuffled(cached_storage(s3_url.url, options, full, 1 << 26)))
    budget = summarize_cache(full).bytes // 2  # half of what the data takes in a cache
    cache = tmp_path / "half"
    loader = shuffled(cached_storage(s3_url.url, options, cache, budget))
    s3_proxy.reset_stats()
    for _epoch in range(2):
        starts = []
        for batch in loader:
            tokens = batch["tokens"].numpy()
            assert (tokens == tokens[:, :1] + np.arange(WINDOW)).all()
            starts += (tokens[:, 0] // WINDOW).tolist()
            entries, _temps = scan_entries(cache)  # the entries a reader can see
            assert sum(size for _m, size, _p in entries) <= budget
            assert int((cache / "SIZE").read_text()) <= budget  # entries and files in transit
        assert sorted(starts) == list(range(WINDOWS))
    del loader
    gc.collect()
    summary = summarize_cache(cache)
    assert 0 < summary.bytes <= budget
    assert summary.hits > 0 and summary.misses > 0 and 0 < summary.hit_rate < 1
    assert s3_proxy.stats().method("GET") > 0


def test_corrupted_cache_files_are_dropped_refetched_and_counted(
    s3_url: S3Location, s3_proxy: LatencyProxy, tmp_path: Path
) -> None:
    write(s3_url.url, s3_url.storage_options)
    options = s3_proxy.merge_storage_options(s3_url.storage_options)
    cache = tmp_path / "cache"
    storage = cached_storage(s3_url.url, options, cache, 1 << 26)
    first = shuffled(storage)
    assert sorted(epoch_windows(first)) == list(range(WINDOWS))
    del first
    gc.collect()
    blocks = sorted(
        path for _m, _s, path in scan_entries(cache)[0] if "~stream~c~" in path.parent.name
    )
    flipped, truncated = blocks[3], blocks[-3]
    raw = bytearray(flipped.read_bytes())
    raw[HEADER + 5] ^= 0x40
    flipped.write_bytes(bytes(raw))
    truncated.write_bytes(truncated.read_bytes()[:-7])
    s3_proxy.start_request_log()
    second = shuffled(storage)  # new workers: none has checked an entry yet
    assert sorted(epoch_windows(second)) == list(range(WINDOWS))
    del second
    gc.collect()
    log = s3_proxy.stop_request_log()
    assert summarize_cache(cache).dropped == 2
    refetched = {entry.path.rsplit("/", 1)[-1] for entry in log if "/data/" in entry.path}
    assert len(refetched) in (1, 2)  # the two blocks again (one name when they share it)
    assert {p.parent.name.rsplit("~", 1)[-1] for p in (flipped, truncated)} >= refetched


@pytest.mark.parametrize("damage", ["flipped", "truncated"])
def test_an_entry_damaged_after_its_first_check_is_dropped_and_refetched(
    s3_url: S3Location, s3_proxy: LatencyProxy, tmp_path: Path, damage: str
) -> None:
    write(s3_url.url, s3_url.storage_options)
    options = s3_proxy.merge_storage_options(s3_url.storage_options)
    cache = tmp_path / "cache"
    # one process reads every epoch: it checks each entry once (epoch 2), then trusts it
    loader = shuffled(cached_storage(s3_url.url, options, cache, 1 << 26), workers=0)
    for _epoch in range(2):
        assert sorted(epoch_windows(loader)) == list(range(WINDOWS))
    blocks = sorted(
        path for _m, _s, path in scan_entries(cache)[0] if "~stream~c~" in path.parent.name
    )
    damaged = blocks[::7]
    for path in damaged:  # in place (the same file), as a disk or another program would
        with open(path, "r+b") as file:
            if damage == "flipped":
                file.seek(HEADER + 5)
                byte = file.read(1)
                file.seek(HEADER + 5)
                file.write(bytes([byte[0] ^ 0x40]))
            else:
                file.truncate(path.stat().st_size - 7)
    s3_proxy.start_request_log()
    assert sorted(epoch_windows(loader)) == list(range(WINDOWS))  # exact: no ChecksumError
    log = s3_proxy.stop_request_log()
    gets = [entry for entry in log if "/data/" in entry.path and entry.method == "GET"]
    refetched = {entry.path.split("/data/", 1)[1].split("/", 1)[1] for entry in gets}
    assert refetched == {path.parent.name.replace("~", "/") for path in damaged}
    assert len(gets) <= 2 * len(damaged), [e.range for e in gets]
    found = cache_for(s3_url.url, cache, None)
    assert found is not None
    found.flush_stats()
    assert summarize_cache(cache).dropped >= len(damaged)


def test_the_directory_counts_agree_with_the_loader_while_its_workers_live(
    s3_url: S3Location, s3_proxy: LatencyProxy, tmp_path: Path
) -> None:
    """Persistent workers live across epochs: ``rangestream cache`` must not wait for them
    to exit to show what the loader counts (one fresh directory, this loader alone)."""
    write(s3_url.url, s3_url.storage_options)
    cache = tmp_path / "cache"
    options = s3_proxy.merge_storage_options(s3_url.storage_options)
    loader = shuffled(cached_storage(s3_url.url, options, cache, 1 << 26))
    for _epoch in range(2):
        assert sorted(epoch_windows(loader)) == list(range(WINDOWS))
        counted = loader.source_stats()["source"]
        summary = summarize_cache(cache)
        assert (summary.hits, summary.misses, summary.bytes_served) == (
            counted["cache_hits"],
            counted["cache_misses"],
            counted["cache_bytes"],
        )
    assert counted["cache_hits"] >= 400 and counted["cache_misses"] >= 400  # both epochs
