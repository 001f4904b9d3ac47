"""A full epoch through the DataLoader over S3 with 5% 503s and 2% resets: byte-exact.

Two DataLoader workers read every window of a stream dataset through a proxy that answers
5% of GETs with 503 SlowDown and resets 2% of connections. Every window must equal the
ground truth, none missing and none repeated, in the same shuffled order as without faults.
The order is shuffled so that every window is its own range request (adjacent windows of
one batch would be coalesced into one): enough requests for the seeded faults to hit. The
same epoch without faults gives the baseline for the figures printed at the end (run with
``pytest -s``).
"""

from __future__ import annotations

import os
import time
import uuid
from dataclasses import dataclass
from typing import Any

import numpy as np
import pytest

from rangestream import RetryPolicy, StreamNumpyFormat, StreamStorage
from rangestream.io import process_io_stats
from rangestream.io.range_reader import IOStats
from rangestream.loader import StatefulDataLoader, stack_collate
from testkit import FaultConfig, FaultKind, LatencyProxy, S3Endpoint

from .datasets import TOKENS, write_tokens

SEQUENCE_LENGTH = 2048
BATCH_SIZE = 8
WINDOWS = 768  # 96 batches; 1.5 M tokens
#: First-byte latency added to every request, as from a nearby object store.
LATENCY = 0.005
FAULTS = FaultConfig(slowdown=0.05, reset=0.02, seed=2026)


def collate_with_io_stats(samples: list[Any]) -> tuple[Any, int, IOStats]:
    """Stack the windows and attach this worker's exact I/O totals so far."""
    return stack_collate(samples), os.getpid(), process_io_stats()


@dataclass(frozen=True)
class Epoch:
    windows: np.ndarray  # (windows, sequence_length), in the order the loader gave them
    seconds: float
    reader: IOStats  # summed over the workers
    proxy_gets: int
    slowdowns: int
    resets: int


def run_epoch(url: str, proxy: LatencyProxy) -> Epoch:
    storage = StreamStorage(
        url,
        StreamNumpyFormat(TOKENS),
        storage_options=proxy.storage_options,
        retry=RetryPolicy(max_attempts=8, request_timeout=10, total_timeout=60),
    )
    loader = StatefulDataLoader.from_storage(
        storage,
        collate_with_io_stats,
        sequence_length=SEQUENCE_LENGTH,
        batch_size=BATCH_SIZE,
        num_workers=2,
        shuffle="window",  # a request per window: enough requests for faults to hit
        token_dtype=None,  # the stored bytes, compared with the ground truth's
    )
    proxy.reset_stats()
    per_worker: dict[int, IOStats] = {}
    batches = []
    started = time.perf_counter()
    for batch, pid, stats in loader:
        batches.append(np.asarray(batch["tokens"]))
        per_worker[pid] = stats
    seconds = time.perf_counter() - started
    total = IOStats()
    for stats in per_worker.values():
        total.requests += stats.requests
        total.retries += stats.retries
        total.bytes += stats.bytes
    proxy_stats = proxy.stats()
    return Epoch(
        np.concatenate(batches),
        seconds,
        total,
        proxy_stats.method("GET"),
        proxy_stats.fault(FaultKind.SLOWDOWN),
        proxy_stats.fault(FaultKind.RESET),
    )


@pytest.fixture(scope="module")
def tokens_url(s3_server: S3Endpoint, s3_bucket: str) -> tuple[str, np.ndarray]:
    url = f"s3://{s3_bucket}/loader-faults-{uuid.uuid4().hex[:8]}"
    # shard lengths are not multiples of the window length: windows cross shard boundaries
    data = write_tokens(url, s3_server.storage_options, seed=5, shards=3,
                        tokens_per_shard=WINDOWS * SEQUENCE_LENGTH // 3 + 17)  # fmt: skip
    return url, data.tokens


def test_an_epoch_with_injected_503s_and_resets_is_byte_identical_to_the_ground_truth(
    tokens_url: tuple[str, np.ndarray], s3_server: S3Endpoint
) -> None:
    url, tokens = tokens_url
    expected = tokens[: WINDOWS * SEQUENCE_LENGTH].reshape(WINDOWS, SEQUENCE_LENGTH)
    with LatencyProxy(s3_server, delay=LATENCY) as proxy:
        clean = run_epoch(url, proxy)
        proxy.set_faults(FAULTS)
        faulty = run_epoch(url, proxy)

    position_of = {row.tobytes(): i for i, row in enumerate(expected)}
    assert len(position_of) == WINDOWS  # random tokens: every window is unique
    for epoch in (clean, faulty):
        # every window byte-exact, none missing, none repeated
        assert epoch.windows.shape == expected.shape
        positions = [position_of.get(row.tobytes(), -1) for row in epoch.windows]
        assert sorted(positions) == list(range(WINDOWS))
    np.testing.assert_array_equal(faulty.windows, clean.windows)  # and in the same order
    assert clean.reader.retries == 0 and clean.slowdowns == clean.resets == 0
    assert faulty.slowdowns > 0 and faulty.resets > 0
    # every 503 and every reset not absorbed by aiohttp's own retry was retried and counted
    unseen = faulty.proxy_gets - faulty.reader.requests
    assert -(faulty.slowdowns + faulty.resets) <= unseen <= faulty.resets
    assert faulty.reader.retries == faulty.slowdowns + faulty.resets - unseen
    print(
        f"\nloader epoch over S3 via proxy (+{LATENCY * 1000:.0f} ms/request), "
        f"{WINDOWS} windows of {SEQUENCE_LENGTH} tokens, 2 workers, batch {BATCH_SIZE}:\n"
        f"  fault-free: {clean.reader.requests} requests, {clean.reader.retries} retries, "
        f"{clean.seconds:.2f} s\n"
        f"  faults ({FAULTS.slowdown:.0%} 503 SlowDown, {FAULTS.reset:.0%} resets of GETs): "
        f"{faulty.reader.requests} reader requests ({faulty.proxy_gets} GETs at the proxy), "
        f"{faulty.slowdowns} 503s and {faulty.resets} resets injected, "
        f"{faulty.reader.retries} retries, {faulty.seconds:.2f} s "
        f"({faulty.seconds / clean.seconds - 1:+.0%} time vs fault-free)"
    )
