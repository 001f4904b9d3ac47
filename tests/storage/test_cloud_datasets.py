"""Datasets on Google Cloud Storage and Azure Blob (their emulators), end to end.

Each test runs on both (``cloud_location``): token windows, documents and temporal windows
read exact; bytes fetched per payload byte against the S3 path on the same data; gc,
verify, inspect and convert from the command line; appends. On the GCS emulator, which
ignores ``ifGenerationMatch``, writers declare one writer at a time (``support.cloud``).
Racing commits: ``test_cloud_commits``; the loader: ``tests/loader/test_cloud_loading``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from support.cloud import CloudLocation
from support.cloud_data import SMALL, TOKENS, write_stream
from support.corpus import make_texts, write_jsonl
from support.s3 import Location

from rangestream import (
    DocumentPickleFormat,
    DocumentStorage,
    StreamStorage,
    TemporalArrayStorage,
)
from rangestream.cli.main import main
from testkit import LatencyProxy


def _windows(seed: int, total: int, length: int, count: int) -> list[tuple[int, int]]:
    rng = np.random.default_rng(seed)
    return [(int(s), length) for s in rng.integers(0, total - length, count)]


def test_token_windows_read_exact(cloud_location: CloudLocation) -> None:
    tokens = np.random.default_rng(1).integers(0, 50_000, 30_000, dtype="<i4")
    storage = write_stream(cloud_location.url, cloud_location.storage_options, tokens)
    requests = _windows(2, len(tokens), 300, 40)
    with storage.sync_reader() as reader:
        assert reader.total_length == len(tokens)
        windows = reader.read_many(requests)
        alone = [reader.read(start, length) for start, length in requests[:5]]
    for (start, length), window in zip(requests, windows, strict=True):
        assert window["t"].tolist() == tokens[start : start + length].tolist()
    for (start, length), window in zip(requests, alone, strict=False):
        assert window["t"].tolist() == tokens[start : start + length].tolist()


def test_documents_read_exact(cloud_location: CloudLocation) -> None:
    documents = [{"i": i, "text": "x" * (i % 97)} for i in range(300)]
    storage = DocumentStorage(cloud_location.url, DocumentPickleFormat(),
                              storage_options=cloud_location.storage_options,
                              chunk_bytes=256, block_bytes=4096)  # fmt: skip
    with storage.sync_writer() as writer:
        for document in documents:
            writer.append(document["i"] % 3, document)
    with storage.sync_reader() as reader:
        picked = [7, 299, 0, 150, 151]
        got = reader.read_many(picked)
    in_order = [d for shard in range(3) for d in documents if d["i"] % 3 == shard]
    assert got == [in_order[i] for i in picked]  # numbered shard by shard


def test_temporal_windows_read_exact(cloud_location: CloudLocation) -> None:
    rng = np.random.default_rng(3)
    records = [(rng.random((n, 6), dtype=np.float32), np.arange(n, dtype=np.float64))
               for n in (40, 200, 75)]  # fmt: skip
    storage = TemporalArrayStorage(cloud_location.url, field_groups=[["clock"]],
                                   storage_options=cloud_location.storage_options)  # fmt: skip
    with storage.sync_writer() as writer:
        for features, clock in records:
            writer.append(0, {"features": features, "clock": clock})
    reopened = TemporalArrayStorage(cloud_location.url,
                                    storage_options=cloud_location.storage_options)  # fmt: skip
    assert list(reopened.frame_counts) == [40, 200, 75]
    for record, start, frames in ((1, 37, 96), (0, 0, 40), (2, 70, 5)):
        window = reopened.read_window(record, start=start, frames=frames)
        features, clock = records[record]
        np.testing.assert_array_equal(window["features"], features[start : start + frames])
        np.testing.assert_array_equal(window["clock"], clock[start : start + frames])


def _read_through(
    location: Location, options: dict[str, Any], proxy: LatencyProxy,
    requests: list[tuple[int, int]],
) -> tuple[int, int, list[Any]]:  # fmt: skip
    """(requests, response bytes, request log) of reading ``requests`` after the open."""
    storage = StreamStorage(location.url, storage_options=options)
    with storage.sync_reader() as reader:
        reader.read(0, 1)  # the open: root and index
        proxy.reset_stats()
        proxy.start_request_log()
        for start, length in requests:
            reader.read(start, length)
    stats, log = proxy.stats(), proxy.stop_request_log()
    return stats.requests, stats.response_bytes, log


def test_bytes_per_payload_byte_are_the_s3_paths_and_no_object_is_downloaded_whole(
    cloud_location: CloudLocation, cloud_proxy: LatencyProxy, s3_url: Location,
    s3_proxy: LatencyProxy,
) -> None:  # fmt: skip
    tokens = np.arange(60_000, dtype="<i4")
    write_stream(cloud_location.url, cloud_location.storage_options, tokens)
    write_stream(s3_url.url, s3_url.storage_options, tokens)
    requests = _windows(4, len(tokens), 700, 30)
    payload = sum(length for _, length in requests) * TOKENS.itemsize
    cloud = _read_through(cloud_location, cloud_location.options_for(cloud_proxy.endpoint_url),
                          cloud_proxy, requests)  # fmt: skip
    s3 = _read_through(s3_url, s3_proxy.merge_storage_options(s3_url.storage_options),
                       s3_proxy, requests)  # fmt: skip
    cloud_ratio, s3_ratio = cloud[1] / payload, s3[1] / payload
    assert cloud_ratio <= 1.2 * s3_ratio, (cloud_ratio, s3_ratio)
    assert cloud[0] == s3[0] >= len(requests)  # the same range requests as on S3
    for entry in cloud[2]:  # every GET asked for a range and got no more than it
        assert entry.method == "GET" and entry.range is not None and entry.served is not None
        first, last = (int(x) for x in entry.range.removeprefix("bytes=").split("-"))
        assert entry.body_bytes == entry.served[1] - entry.served[0] <= last - first + 1
    assert max(entry.body_bytes for entry in cloud[2]) <= 2 * SMALL["chunk_bytes"] + 700 * 4


def _cli_options(location: CloudLocation) -> list[str]:
    return [f"--storage-option={key}={value}" for key, value in location.storage_options.items()]


def test_gc_verify_and_inspect_from_the_command_line(
    cloud_location: CloudLocation, capsys: pytest.CaptureFixture[str]
) -> None:
    url, options = cloud_location.url, cloud_location.storage_options
    storage = write_stream(url, options, np.arange(3000, dtype="<i4"))
    session = storage.parallel_write(overwrite=True)
    with session.sync_writer() as writer:  # never committed: an orphan for gc
        writer.append(0, {"t": np.arange(50, dtype="<i4")})
    flags = _cli_options(cloud_location)
    assert main(["inspect", url, *flags]) == 0
    assert "3000" in capsys.readouterr().out.replace(",", "")
    assert main(["gc", url, "--grace", "0", "--json", *flags]) == 0
    listed = json.loads(capsys.readouterr().out)
    assert [o["prefix"] for o in listed["orphans"]] == [session.prefix]
    assert main(["gc", url, "--grace", "0", "--yes", *flags]) == 0
    capsys.readouterr()
    assert main(["gc", url, "--grace", "0", "--json", *flags]) == 0
    assert json.loads(capsys.readouterr().out)["orphans"] == []
    assert main(["verify", url, "--json", *flags]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["ok"] is True and report["problems"] == []
    assert report["checked"]["shards"] == 2 and report["checked"]["bytes"] >= 3000 * 4
    with storage.sync_reader() as reader:  # gc kept the committed version whole
        assert reader.read(0, 3000)["t"].tolist() == list(range(3000))


def test_convert_writes_to_the_cloud_url(
    cloud_location: CloudLocation, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    texts = make_texts(20, seed=5)
    source = write_jsonl(tmp_path / "in.jsonl", [{"text": t} for t in texts])
    arguments = [str(source), "--to", cloud_location.url, "--preset", "seq", "--tokenizer",
                 "bytes", "--workers", "0", "--no-progress"]  # fmt: skip
    arguments += _cli_options(cloud_location)
    assert main(["convert", *arguments]) == 0
    assert "records   20 from 20 input rows" in capsys.readouterr().out
    storage = StreamStorage(cloud_location.url, storage_options=cloud_location.storage_options)
    with storage.sync_reader() as reader:
        assert reader.num_records() == 20
        assert reader.total_length > sum(len(t) for t in texts)  # bytes plus separators


def test_appends_add_shards_and_read_back_whole(cloud_location: CloudLocation) -> None:
    url, options = cloud_location.url, cloud_location.storage_options
    storage = write_stream(url, options, np.arange(900, dtype="<i4"))
    with storage.sync_writer(mode="append") as writer:
        writer.append(0, {"t": np.arange(900, 1500, dtype="<i4")})
    with storage.sync_writer(mode="append") as writer:
        writer.append(1, {"t": np.arange(1500, 1600, dtype="<i4")})
    with StreamStorage(url, storage_options=options).sync_reader() as reader:
        assert reader.num_records() == 4
        assert reader.read(0, reader.total_length)["t"].tolist() == list(range(1600))
