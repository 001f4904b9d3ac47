"""Reads through a fault-injecting proxy in front of S3 come back byte-exact or fail loudly.

Every fault the proxy injects is either retried by the range reader (and counted in
``reader.stats``) or, for a connection reset on a reused connection, retried once by aiohttp
itself, which shows up as a proxy GET that the reader never saw. Rarely, a connection that
a fault broke fails a later attempt before the proxy admits it: a reader retry the proxy
never saw. Either way, per read,

    reader retries == faults injected - (proxy GETs - reader requests)

holds exactly, and is asserted along with the bytes.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import pytest

from rangestream import DocumentStorage, RetryPolicy, StreamNumpyFormat, StreamStorage
from rangestream.errors import RetriesExhaustedError
from rangestream.io.range_reader import IOStats
from testkit import FaultConfig, FaultKind, LatencyProxy, S3Endpoint

from .datasets import TOKENS, BytesFormat, write_documents, write_tokens

# 16 inner chunks of 64 tokens, 1024 tokens per block (block_bytes bounds the stored object:
# data, a 4-byte crc32c and a 16-byte index entry per chunk, and the index's crc32c)
LAYOUT = {"chunk_bytes": 256, "block_bytes": 16 * (256 + 4 + 16) + 4}
#: Short timeouts so a slow response costs a fraction of a second, and quick backoff.
POLICY = RetryPolicy(
    max_attempts=6, base_delay=0.01, max_delay=0.05, request_timeout=0.5, total_timeout=20
)
SLOW_SECONDS = 2.0
# Tokens [4200, 4500) of shard 0 lie in block 4 (1024 tokens per block) at rows
# [104, 404); inner chunks hold 64 tokens and are stored as 64 * 4 + 4 = 260 bytes.
WINDOW = (4200, 300)
FIRST_BYTE, END_BYTE = (104 // 64) * 260, (403 // 64 + 1) * 260


@dataclass(frozen=True)
class Stored:
    tokens_url: str
    tokens: np.ndarray
    documents_url: str
    documents: list[bytes]


@pytest.fixture(scope="module")
def stored(s3_server: S3Endpoint, s3_bucket: str) -> Stored:
    """One stream and one document dataset, written directly (not through a proxy)."""
    base = f"s3://{s3_bucket}/faults-{uuid.uuid4().hex[:8]}"
    options = s3_server.storage_options
    tokens = write_tokens(f"{base}/tokens", options, seed=1, tokens_per_shard=20_000, **LAYOUT)
    documents = write_documents(f"{base}/documents", options, seed=2, count=150, **LAYOUT)
    return Stored(tokens.storage.url, tokens.tokens, documents.storage.url, documents.documents)


@pytest.fixture
def proxy(s3_proxy: LatencyProxy) -> Iterator[LatencyProxy]:
    s3_proxy.set_faults(FaultConfig(slow_seconds=SLOW_SECONDS))
    yield s3_proxy
    s3_proxy.clear_faults()


def stream_storage(stored: Stored, proxy: LatencyProxy, **options: Any) -> StreamStorage:
    options.setdefault("retry", POLICY)
    return StreamStorage(stored.tokens_url, StreamNumpyFormat(TOKENS),
                         storage_options=proxy.storage_options, **options)  # fmt: skip


def document_storage(stored: Stored, proxy: LatencyProxy, **options: Any) -> DocumentStorage:
    options.setdefault("retry", POLICY)
    return DocumentStorage(stored.documents_url, BytesFormat(),
                           storage_options=proxy.storage_options, **options)  # fmt: skip


def assert_every_fault_accounted_for(proxy: LatencyProxy, spent: IOStats) -> None:
    """Reader retries equal the injected faults not absorbed by aiohttp's own retry."""
    stats = proxy.stats()
    faults = sum(stats.faults.values())
    unseen = stats.method("GET") - spent.requests  # aiohttp retries less unadmitted attempts
    assert -faults <= unseen <= stats.fault(FaultKind.RESET)
    assert spent.retries == faults - unseen
    assert spent.failures == spent.retries  # each failed attempt was retried, none given up


@pytest.mark.parametrize(
    ("kind", "count"),
    [
        (FaultKind.SLOWDOWN, 2),
        (FaultKind.INTERNAL_ERROR, 2),
        (FaultKind.RESET, 3),
        (FaultKind.TRUNCATE, 2),
        (FaultKind.SLOW, 2),
    ],
)
@pytest.mark.parametrize("what", ["stream", "document"])
def test_a_read_survives_each_fault_kind_byte_exact_with_its_retries_counted(
    stored: Stored, proxy: LatencyProxy, kind: FaultKind, count: int, what: str
) -> None:
    storage = stream_storage(stored, proxy) if what == "stream" else document_storage(stored, proxy)
    with storage.sync_reader() as reader:
        proxy.reset_stats()
        before = reader.stats.copy()
        proxy.fail_next(kind, count)
        started = time.monotonic()
        if what == "stream":
            window = reader.read(*WINDOW)["tokens"]  # one request: inside one block
            np.testing.assert_array_equal(window, stored.tokens[4200:4500])
        else:
            assert reader.read_many([7, 8, 120]) == [stored.documents[i] for i in (7, 8, 120)]
        elapsed = time.monotonic() - started
        spent = reader.stats - before
    stats = proxy.stats()
    assert stats.fault(kind) == count
    assert spent.retries >= 1
    assert_every_fault_accounted_for(proxy, spent)
    if kind is FaultKind.SLOW:  # abandoned after request_timeout, not after SLOW_SECONDS
        assert elapsed < count * POLICY.request_timeout + 1.0


def test_random_faults_of_every_kind_leave_many_concurrent_reads_byte_exact(
    stored: Stored, proxy: LatencyProxy
) -> None:
    # slow faults never answer and attempts get 5 s (see NEVER_ANSWERS): with 0.5 s, a loaded
    # machine timed out honest answers too, a retry no fault explains (27 for 24 faults once)
    faults = FaultConfig(slowdown=0.08, internal_error=0.04, reset=0.06, truncate=0.04,
                         slow=0.02, slow_seconds=NEVER_ANSWERS, seed=7)  # fmt: skip
    rng = np.random.default_rng(3)
    total = len(stored.tokens)
    windows = [(int(start), 700) for start in rng.integers(0, total - 700, 120)]
    with stream_storage(stored, proxy, retry=DETERMINISTIC_POLICY).sync_reader() as reader:
        proxy.reset_stats()
        before = reader.stats.copy()
        proxy.set_faults(faults)
        reads = reader.read_many(windows)  # concurrent requests in one call
        for (start, length), read in zip(windows, reads, strict=True):
            np.testing.assert_array_equal(read["tokens"], stored.tokens[start : start + length])
        spent = reader.stats - before
    assert sum(proxy.stats().faults.values()) >= 10
    assert_every_fault_accounted_for(proxy, spent)


#: For the test below: its one SLOW fault never answers (the proxy drops the handler when
#: the client gives up), and an honest answer never comes near the attempt timeout, however
#: loaded the machine; so every retry is an injected fault and none is a slow answer timed
#: out (with 0.5 s per attempt a loaded machine once made 50 retries of 36 faults).
NEVER_ANSWERS = 3600.0
DETERMINISTIC_POLICY = RetryPolicy(
    max_attempts=6, base_delay=0.01, max_delay=0.05, request_timeout=5.0, total_timeout=60
)


def test_async_reads_survive_faults_byte_exact(stored: Stored, proxy: LatencyProxy) -> None:
    storage = document_storage(stored, proxy, retry=DETERMINISTIC_POLICY)
    faults = FaultConfig(slowdown=0.1, reset=0.05, truncate=0.05, slow_seconds=NEVER_ANSWERS,
                         seed=11)  # fmt: skip

    groups = [list(range(i, 150, 10)) for i in range(10)]

    async def main() -> tuple[list[list[bytes]], IOStats]:
        async with storage.async_reader() as reader:
            proxy.reset_stats()
            before = reader.stats.copy()
            proxy.set_faults(faults)
            proxy.fail_next(FaultKind.SLOW, 1)
            batches = await asyncio.gather(*(reader.read_many(group) for group in groups))
            return list(batches), reader.stats - before

    batches, spent = asyncio.run(main())
    for group, batch in zip(groups, batches, strict=True):
        assert batch == [stored.documents[i] for i in group]
    assert proxy.stats().fault(FaultKind.SLOW) == 1
    assert_every_fault_accounted_for(proxy, spent)


def test_when_retries_run_out_the_error_names_the_url_and_the_byte_range(
    stored: Stored, proxy: LatencyProxy
) -> None:
    policy = RetryPolicy(max_attempts=3, base_delay=0.01, max_delay=0.02, request_timeout=2)
    with stream_storage(stored, proxy, retry=policy).sync_reader() as reader:
        before = reader.stats.copy()
        proxy.fail_next(FaultKind.SLOWDOWN, 100)
        with pytest.raises(RetriesExhaustedError) as caught:
            reader.read(*WINDOW)
        spent = reader.stats - before
    message = str(caught.value)
    assert f"{stored.tokens_url}/data/" in message and "/shards/0/stream/c/4/0 " in message
    assert f"bytes [{FIRST_BYTE}, {END_BYTE})" in message
    assert "max_attempts=3" in message
    assert spent.requests == 3 and spent.retries == 2


def test_the_total_timeout_bounds_a_read_whose_every_response_is_too_slow(
    stored: Stored, proxy: LatencyProxy
) -> None:
    policy = RetryPolicy(max_attempts=50, base_delay=0.01, request_timeout=0.2, total_timeout=1.0)
    with stream_storage(stored, proxy, retry=policy).sync_reader() as reader:
        proxy.set_faults(FaultConfig(slow=1.0, slow_seconds=30))
        started = time.monotonic()
        where = rf"c/4/0 bytes \[{FIRST_BYTE}, {END_BYTE}\)"
        with pytest.raises(RetriesExhaustedError, match=where):
            reader.read(*WINDOW)
        elapsed = time.monotonic() - started
    assert 0.9 < elapsed < 2.0
