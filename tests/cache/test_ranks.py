"""Two gloo ranks of two DataLoader workers each share one cache directory over S3.

Each epoch is one job (``set_epoch``), as a later run would be; the proxy logs every request
with the bytes it served. Within an epoch no byte of the dataset's committed objects is
fetched twice across the four readers, and the second epoch fetches none of them: the
first left every byte it read in the directory.

With the reader's default coalescing (64 KiB gaps), and readers whose reads share bytes:
runs of 3 windows cut inner chunks of 64 bytes (two readers need the chunk at a run
boundary), and the per-window shuffle's batches coalesce across the windows of other
readers. Each byte still comes from S3 once: the parts other readers claimed are waited for
(``io/cache/claims``).
"""

from __future__ import annotations

import json
import os
import socket
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch.distributed
import torch.multiprocessing
from support.s3 import S3Location

from rangestream import StatefulDataLoader, StreamNumpyFormat, StreamStorage
from testkit import LatencyProxy

TOKENS = np.dtype([("tokens", "<i4")])
WINDOW = 8
SHARD_WINDOWS = 256


def run_rank(rank: int, world_size: int, job_text: str) -> None:
    job = json.loads(job_text)
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    torch.distributed.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{job['port']}", rank=rank, world_size=world_size
    )
    try:
        storage = StreamStorage(job["url"], StreamNumpyFormat(TOKENS),
                                storage_options=job["options"], cache_dir=job["cache"],
                                cache_bytes="64M")  # fmt: skip
        order = {"shuffle": job["shuffle"]}
        if job["shuffle"] == "block":
            order["run_windows"] = 3  # runs that cut inner chunks: shared by two readers
        loader = StatefulDataLoader.from_storage(
            storage, sequence_length=WINDOW, batch_size=4, num_workers=2, shuffle_seed=11,
            multiprocessing_context="fork", **order,
        )  # fmt: skip
        loader.set_epoch(job["epoch"])
        starts = []
        for batch in loader:
            tokens = batch["tokens"].numpy()
            assert (tokens == tokens[:, :1] + np.arange(WINDOW)).all()
            starts += (tokens[:, 0] // WINDOW).tolist()
        Path(job["out"], f"rank{rank}.json").write_text(json.dumps(starts))
        torch.distributed.barrier()
    finally:
        torch.distributed.destroy_process_group()


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def play_epoch(job: dict[str, Any]) -> list[int]:
    torch.multiprocessing.start_processes(
        run_rank, args=(2, json.dumps(job)), nprocs=2, join=True, start_method="fork"
    )
    return [s for r in range(2) for s in json.loads(Path(job["out"], f"rank{r}.json").read_text())]


def fetched_twice(log: list[Any]) -> tuple[int, int]:
    """Bytes of committed objects fetched, and of them fetched more than once."""
    served: dict[str, list[tuple[int, int]]] = defaultdict(list)
    for entry in log:
        if "/data/" in entry.path and entry.method == "GET" and entry.served is not None:
            served[entry.path].append(entry.served)
    total = twice = 0
    for spans in served.values():
        spans.sort()
        reach = -1
        for start, end in spans:  # [start, end)
            total += end - start
            twice += max(0, min(reach, end) - start)
            reach = max(reach, end)
    return total, twice


@pytest.mark.parametrize("shuffle", ["block", "window"])
def test_two_ranks_of_two_workers_fetch_each_byte_once_per_epoch(
    s3_url: S3Location, s3_proxy: LatencyProxy, tmp_path: Path, shuffle: str
) -> None:
    storage = StreamStorage(s3_url.url, StreamNumpyFormat(TOKENS),
                            storage_options=s3_url.storage_options, chunk_bytes=64,
                            block_bytes=1024)  # fmt: skip
    with storage.sync_writer(overwrite=True) as writer:
        for shard in range(2):
            first = shard * SHARD_WINDOWS * WINDOW
            writer.append(shard, {"tokens": np.arange(first, first + SHARD_WINDOWS * WINDOW,
                                                      dtype="<i4")})  # fmt: skip
    job = {"url": s3_url.url, "options": s3_proxy.merge_storage_options(s3_url.storage_options),
           "cache": str(tmp_path / "cache"), "out": str(tmp_path), "shuffle": shuffle}  # fmt: skip
    s3_proxy.start_request_log()
    per_epoch = []
    for epoch in range(2):
        starts = play_epoch({**job, "epoch": epoch, "port": free_port()})
        assert sorted(starts) == list(range(2 * SHARD_WINDOWS))
        per_epoch.append(fetched_twice(s3_proxy.take_request_log()))
    s3_proxy.stop_request_log()
    (cold, cold_twice), (warm, warm_twice) = per_epoch
    assert cold >= 2 * SHARD_WINDOWS * WINDOW * 4 and cold_twice == 0
    assert warm == warm_twice == 0
