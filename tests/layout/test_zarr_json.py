"""Every stored array is plain Zarr v3: zarr-python and tensorstore read the same values.

Two independent Zarr implementations open every array of every storage kind (found by
walking the ``zarr.json`` documents, not from a list the library keeps) and must agree
with each other and with what was written. Every ``bytes`` codec names its byte order,
single-byte types included: old readers (zarrita) refuse one without it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tensorstore
import zarr

from rangestream import (
    DocumentPickleFormat,
    DocumentStorage,
    StreamNumpyFormat,
    StreamStorage,
    StreamWithMetaStorage,
    TemporalArrayStorage,
)

SMALL = {"chunk_bytes": 256, "block_bytes": 4096}
TOKENS = np.dtype([("tokens", "<i4"), ("loss_mask", "u1")])


class Spans:
    """int32 tokens with one payload per run of equal keys."""

    stream_dtype = np.dtype("<i4")

    def size(self, data: dict[str, Any]) -> int:
        return len(data["tokens"])

    def pack(self, data: dict[str, Any]) -> Any:
        for key in data["keys"]:
            yield int(key), f"span-{key}".encode()
        return np.asarray(data["tokens"], dtype="<i4")

    def unpack(self, stream: Any, shards: Any, index: Any, payloads: Any) -> Any:
        return stream


def write_every_kind(base: Path) -> dict[str, Path]:
    rng = np.random.default_rng(0)
    stream = StreamStorage(base / "stream", StreamNumpyFormat(TOKENS), **SMALL)
    with stream.sync_writer() as writer:
        for record in range(30):
            n = int(rng.integers(1, 300))
            writer.append(record % 3, {"tokens": rng.integers(0, 1000, n), "loss_mask": [1] * n})
    documents = DocumentStorage(base / "documents", DocumentPickleFormat(), **SMALL)
    with documents.sync_writer() as writer:
        for record in range(40):
            writer.append(record % 2, {"id": record, "text": "x" * record})
    spans = StreamWithMetaStorage(base / "spans", Spans(), **SMALL)
    with spans.sync_writer() as writer:
        for record in range(10):
            writer.append(
                record % 2, {"tokens": np.arange(50) + record, "keys": np.arange(50) // 7}
            )
    tracks = TemporalArrayStorage(base / "tracks", field_groups=[["clock", "valid"]])
    with tracks.sync_writer() as writer:
        for record in range(5):
            frames = 20 + record
            writer.append(
                record % 2,
                {
                    "clock": np.arange(frames, dtype="<f8"),
                    "valid": np.arange(frames) % 2 == 0,
                    "pose": rng.standard_normal((frames, 3)).astype("<f4"),
                },
            )
    return {name: base / name for name in ("stream", "documents", "spans", "tracks")}


def stored_arrays(root: Path) -> list[Path]:
    """Every Zarr array under the committed version, from the documents themselves."""
    prefix = json.loads((root / "zarr.json").read_bytes())["attributes"]["rangestream"]
    found = []
    for document in sorted((root / prefix["data_prefix"]).rglob("zarr.json")):
        if json.loads(document.read_bytes())["node_type"] == "array":
            found.append(document.parent)
    return found


@pytest.fixture(scope="module")
def datasets(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return write_every_kind(tmp_path_factory.mktemp("kinds"))


@pytest.mark.parametrize("kind", ["stream", "documents", "spans", "tracks"])
def test_zarr_python_and_tensorstore_read_every_array_alike(
    datasets: dict[str, Path], kind: str
) -> None:
    arrays = stored_arrays(datasets[kind])
    assert len(arrays) >= 5  # the shards' arrays and the index arrays
    for path in arrays:
        by_zarr = zarr.open_array(path, mode="r")[...]
        spec = {"driver": "zarr3", "kvstore": {"driver": "file", "path": str(path)}}
        by_tensorstore = tensorstore.open(spec, read=True).result().read().result()
        assert by_zarr.dtype == by_tensorstore.dtype, path
        np.testing.assert_array_equal(by_zarr, by_tensorstore, err_msg=str(path))


def test_the_stream_read_by_tensorstore_is_what_was_written(datasets: dict[str, Path]) -> None:
    root = datasets["stream"]
    storage = StreamStorage(root, StreamNumpyFormat(TOKENS))
    with storage.sync_reader() as reader:
        expected = np.asarray(reader.read(0, reader.length(0))["tokens"])
        prefix = reader.opened.manifest.commit_id
    spec = {
        "driver": "zarr3",
        "kvstore": {"driver": "file", "path": str(root / "data" / prefix / "shards/0/stream")},
    }
    rows = tensorstore.open(spec, read=True).result().read().result()
    np.testing.assert_array_equal(np.ascontiguousarray(rows).view(TOKENS)["tokens"][:, 0], expected)


@pytest.mark.parametrize("kind", ["stream", "documents", "spans", "tracks"])
def test_every_bytes_codec_names_its_byte_order(datasets: dict[str, Path], kind: str) -> None:
    for path in stored_arrays(datasets[kind]):
        document = json.loads((path / "zarr.json").read_bytes())
        sharding = document["codecs"][0]["configuration"]
        for codec in [*sharding["codecs"], *sharding["index_codecs"]]:
            if codec["name"] == "bytes":
                assert codec.get("configuration") == {"endian": "little"}, path
