"""Writes survive transient S3 errors: every put, list and get of a write is retried."""

from __future__ import annotations

import numpy as np
from support.s3 import S3Location

from rangestream import DocumentPickleFormat, DocumentStorage, RetryPolicy
from testkit import FaultConfig, FaultKind, LatencyProxy

RETRY = RetryPolicy(max_attempts=8, base_delay=0.01, max_delay=0.05, request_timeout=10)


def test_a_write_through_503s_resets_and_500s_commits_every_document(
    s3_url: S3Location, s3_proxy: LatencyProxy
) -> None:
    options = s3_proxy.merge_storage_options(s3_url.storage_options)
    s3_proxy.set_faults(
        FaultConfig(
            slowdown=0.15,
            internal_error=0.05,
            reset=0.05,
            methods=frozenset({"GET", "PUT", "HEAD"}),
            seed=7,
        )
    )
    storage = DocumentStorage(s3_url.url, DocumentPickleFormat(), storage_options=options,
                              chunk_bytes=256, block_bytes=4096, retry=RETRY)  # fmt: skip
    documents = [{"i": i, "payload": np.arange(i % 50).tolist()} for i in range(200)]
    with storage.sync_writer() as writer:
        for i, document in enumerate(documents):
            writer.append(i % 3, document)
    stats = s3_proxy.stats()
    injected = sum(stats.faults.values())
    assert injected > 0, "no fault was injected: the test would prove nothing"
    s3_proxy.set_faults(FaultConfig())
    in_order = [d for shard in range(3) for i, d in enumerate(documents) if i % 3 == shard]
    with storage.sync_reader() as reader:
        assert reader.read_many(range(len(in_order))) == in_order
    assert FaultKind.SLOWDOWN in stats.faults
