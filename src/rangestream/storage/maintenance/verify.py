"""Scanning a committed dataset for damage: every block, chunk index, checksum and index.

Reads check only what they touch, so damage in data nobody has read yet stays silent. A
scan reads every block of the committed version and checks, per block: that the object
exists and has the size its array's length implies, its chunk index (crc32c and every
entry), and the crc32c of every inner chunk (each bad one is reported). Blocks are read
whole up to ``PIECE_BYTES`` and in pieces beyond, so memory is bounded by what is read,
never by what a damaged layout claims. Per array: that the Zarr array metadata
agrees with the manifest and that no block objects lie past the array's end. Across
arrays: ``record_ends`` never decrease and end at the stream's length;
``payload_offsets`` start at 0, never decrease and end at the heap's length; the two
columns of ``runs`` (element ends, payload ends) start at 0, never decrease and end at the
stream's and the heap's lengths; the end rows of temporal ``record_rows`` never decrease
and end at the shard's group length. Finally, the index arrays for Zarr-only readers must
agree with the manifest. The root document is read within the metadata cap.

Problems are collected, not raised, so one scan reports all the damage it finds. Versions
under ``data/`` that no reader can reach (``rangestream gc``) are listed with their size;
they are not damage.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import numpy as np

from rangestream.errors import (
    CorruptDataError,
    DatasetNotFoundError,
    MetadataError,
    MissingObjectError,
)
from rangestream.io.local import LocalStore
from rangestream.io.process import run_blocking
from rangestream.io.range_reader import RangeReader
from rangestream.io.ranges import ObjectRequest
from rangestream.io.retry import RetryPolicy
from rangestream.io.store import ObjectStore
from rangestream.io.stores import open_store
from rangestream.layout.block import ArrayLayout
from rangestream.layout.executors import RemoteExecutor
from rangestream.layout.manifest import (
    MAX_ROOT_BYTES,
    ROOT_KEY,
    Manifest,
    data_prefix,
    read_shard_table,
)
from rangestream.layout.manifest_parsing import parse_root
from rangestream.layout.pieces import RowRead, StoredArray
from rangestream.storage.core.store_errors import library_errors
from rangestream.storage.maintenance.gc import find_orphans
from rangestream.storage.maintenance.verify_blocks import (
    Block,
    OffsetCheck,
    offset_checks,
    scan_blocks,
)
from rangestream.storage.maintenance.verify_report import Problem, VerifyReport

__all__ = ["Problem", "VerifyReport", "averify_dataset", "verify_dataset"]

#: Blocks fetched at once; bounds the scan's memory to about this many blocks.
DEFAULT_VERIFY_CONCURRENCY = 8
_INT64 = np.dtype("<i8")
#: Runs of missing blocks reported per array; a wrong length could make millions.
MAX_REPORTED_GAPS = 20


def verify_dataset(
    url: str,
    storage_options: dict[str, Any] | None = None,
    *,
    progress: Callable[[int], Any] | None = None,
    on_total: Callable[[int], Any] | None = None,
    max_concurrency: int = DEFAULT_VERIFY_CONCURRENCY,
    retry: RetryPolicy | None = None,
) -> VerifyReport:
    """Scan the dataset at ``url``; see ``averify_dataset``."""
    return run_blocking(
        averify_dataset(
            url,
            storage_options,
            progress=progress,
            on_total=on_total,
            max_concurrency=max_concurrency,
            retry=retry,
        )
    )


async def averify_dataset(
    url: str,
    storage_options: dict[str, Any] | None = None,
    *,
    progress: Callable[[int], Any] | None = None,
    on_total: Callable[[int], Any] | None = None,
    max_concurrency: int = DEFAULT_VERIFY_CONCURRENCY,
    retry: RetryPolicy | None = None,
) -> VerifyReport:
    """Check every block, checksum and index invariant of the committed dataset at ``url``.

    Parameters
    ----------
    url, storage_options
        The dataset, as given to a storage.
    progress
        Called with the number of blocks just checked (e.g. a tqdm bar's ``update``).
    on_total
        Called once with the number of blocks the scan will check, before it starts.
    max_concurrency
        Blocks fetched at once (each is read whole, so this bounds memory).
    retry
        Retry policy for transient storage errors.

    Returns
    -------
    VerifyReport
        Damage is reported there; only an absent dataset raises (``DatasetNotFoundError``).
    """
    store = open_store(url, storage_options)
    reader = RangeReader(store, max_concurrency=max_concurrency, retry=retry)
    report = VerifyReport(url=str(url))
    try:
        with library_errors(f"scanning {url}"):  # listings: reads convert their own
            manifest = await _read_manifest(reader, report)
            if manifest is not None:
                await _scan(reader, manifest, report, progress, on_total, max_concurrency)
    finally:
        if isinstance(store, LocalStore):
            store.close_files()
        else:
            await store.aclose()
    return report


async def _read_manifest(reader: RangeReader, report: VerifyReport) -> Manifest | None:
    store = reader.store
    try:  # bounded by the metadata cap, as the readers' open is
        (raw,) = await reader.fetch([ObjectRequest(ROOT_KEY, MAX_ROOT_BYTES)])
    except MissingObjectError as error:
        raise DatasetNotFoundError(
            f"no dataset at {report.url}: {ROOT_KEY} not found (never committed?)"
        ) from error
    try:
        if len(raw) > MAX_ROOT_BYTES:
            raise MetadataError(f"larger than the {MAX_ROOT_BYTES}-byte metadata cap")
        manifest = parse_root(bytes(raw), store.describe(ROOT_KEY))
    except CorruptDataError as error:
        report.add(store.describe(ROOT_KEY), f"unreadable dataset metadata: {error}")
        return None
    if not manifest.complete:
        try:
            manifest = await RemoteExecutor(reader, verify=True).run(
                read_shard_table(manifest, store.describe)
            )
        except CorruptDataError as error:
            report.add(store.describe(manifest.table_key), f"unreadable shard table: {error}")
            return None
    report.kind, report.commit_id = manifest.kind, manifest.commit_id
    report.shards = len(manifest.shard_ids)
    return manifest


async def _scan(
    reader: RangeReader,
    manifest: Manifest,
    report: VerifyReport,
    progress: Callable[[int], Any] | None,
    on_total: Callable[[int], Any] | None,
    max_concurrency: int,
) -> None:
    store = reader.store
    blocks: list[Block] = []
    checks: list[OffsetCheck] = []
    for position, shard in enumerate(int(s) for s in manifest.shard_ids):
        for name in manifest.arrays:
            report.arrays += 1
            length = int(manifest.lengths[name][position])
            layout = manifest.stored_layout(name, length)
            key = manifest.array_key(shard, name)
            await _check_array_metadata(reader, key, layout, length, report)
            present = await _block_objects(store, key, layout, length, report)
            array_checks = offset_checks(manifest, name, layout, position, store.describe(key))
            checks.extend(array_checks)
            if len(present) < layout.num_blocks(length):
                for check in array_checks:
                    check.broken = True  # values cannot be followed across a missing block
            for block, size in present:
                first = block * layout.block_rows
                rows = min(layout.block_rows, length - first)
                blocks.append(
                    Block(layout.block_key(key, block), layout, rows, first, array_checks, size)
                )
    if on_total is not None:
        on_total(len(blocks))
    await scan_blocks(reader, blocks, report, progress, max_concurrency)
    for check in checks:
        check.finish(report)
    await _check_index_arrays(reader, manifest, report)
    report.orphans = (await find_orphans(store, report.url, grace=0)).orphans


async def _get_json(reader: RangeReader, key: str) -> Any:
    """A small JSON document, read with the reader's retries (``FileNotFoundError`` if absent)."""
    try:
        (raw,) = await reader.fetch([ObjectRequest(key)])
    except MissingObjectError as error:
        raise FileNotFoundError(key) from error
    return json.loads(bytes(raw))


async def _check_array_metadata(
    reader: RangeReader, key: str, layout: ArrayLayout, length: int, report: VerifyReport
) -> None:
    """The array's ``zarr.json`` must give the manifest's length and the layout's chunks."""
    where = reader.store.describe(f"{key}/zarr.json")
    try:
        document = await _get_json(reader, f"{key}/zarr.json")
        shape = document["shape"]
        block_rows = document["chunk_grid"]["configuration"]["chunk_shape"][0]
        chunk_rows = document["codecs"][0]["configuration"]["chunk_shape"][0]
    except FileNotFoundError:
        report.add(where, "array metadata is missing")
        return
    except (ValueError, KeyError, TypeError, IndexError, RecursionError) as error:
        report.add(where, f"array metadata is unreadable: {error!r}")
        return
    if not isinstance(shape, list) or not shape or shape[0] != length:
        report.add(where, f"shape {shape!r} disagrees with the manifest's length {length}")
    if (block_rows, chunk_rows) != (layout.block_rows, layout.chunk_rows):
        report.add(
            where,
            f"blocks of {block_rows!r} rows in chunks of {chunk_rows!r} disagree with the "
            f"manifest's {layout.block_rows} and {layout.chunk_rows}",
        )


async def _block_objects(
    store: ObjectStore, key: str, layout: ArrayLayout, length: int, report: VerifyReport
) -> list[tuple[int, int]]:
    """``(number, size)`` of the array's stored blocks, in order; missing and extra ones
    are reported.

    Works from the listing, never from ``range(number of blocks)``: the length comes from
    the manifest, and a damaged one may claim more blocks than any store could hold.
    """
    expected = layout.num_blocks(length)
    present: list[tuple[int, int]] = []
    for found in await store.list_details(f"{key}/c"):
        number = found.key[len(key) + 3 :].split("/", 1)[0]
        block = int(number) if number.isdigit() and len(number) < 20 else -1
        if 0 <= block < expected and found.key == layout.block_key(key, block):
            present.append((block, found.size))
        else:
            report.add(
                store.describe(found.key),
                f"object lies past the array's end ({length} rows in the manifest)",
            )
    present.sort()
    gaps = 0
    numbers = [block for block, _ in present]
    for first, stop in zip([-1, *numbers], [*numbers, expected], strict=True):
        if stop - first > 1 and gaps < MAX_REPORTED_GAPS:
            gaps += 1
            missing = layout.block_key(key, first + 1)
            more = f" and the {stop - first - 2} blocks after it" if stop - first > 2 else ""
            report.add(store.describe(missing), f"block object is missing{more}")
    return present


async def _check_shard_table(reader: RangeReader, manifest: Manifest, report: VerifyReport) -> None:
    """``index/shards`` (what readers of many shards open with) must equal the manifest."""
    where = reader.store.describe(manifest.table_key)
    count = manifest.num_shards
    array = StoredArray(manifest.table_key, manifest.table_layout, count, "shards")
    read = RowRead.whole(array, 0, count, _INT64)
    try:
        await RemoteExecutor(reader, verify=True).execute([read])
    except CorruptDataError as error:
        report.add(where, f"cannot be read: {error}")
        return
    if not np.array_equal(read.target.reshape(count, -1), manifest.table_rows()):
        report.add(where, "its rows differ from the shards the root lists")


async def _check_index_arrays(
    reader: RangeReader, manifest: Manifest, report: VerifyReport
) -> None:
    """The per-shard counts stored for Zarr-only readers must equal the manifest's."""
    store = reader.store
    if manifest.format_version >= 2:
        await _check_shard_table(reader, manifest, report)
    expected = {"shard_ids": manifest.shard_ids}
    expected.update({f"{name}_length": values for name, values in manifest.lengths.items()})
    prefix = f"{data_prefix(manifest.commit_id)}/index"
    for name, values in expected.items():
        key = f"{prefix}/{name}"
        where = store.describe(key)
        try:
            document = await _get_json(reader, f"{key}/zarr.json")
            chunk_rows = int(document["codecs"][0]["configuration"]["chunk_shape"][0])
            block_rows = int(document["chunk_grid"]["configuration"]["chunk_shape"][0])
            if not (1 <= chunk_rows <= 1 << 28 and 1 <= block_rows <= 1 << 40):
                raise MetadataError(f"chunks of {chunk_rows} rows in blocks of {block_rows}")
            layout = ArrayLayout(_INT64, (), chunk_rows, block_rows)
            length = int(document["shape"][0])
        except FileNotFoundError:
            report.add(where, "index array is missing")
            continue
        except (
            ValueError,
            KeyError,
            TypeError,
            IndexError,
            RecursionError,
            CorruptDataError,
        ) as error:
            report.add(where, f"index array metadata is unreadable: {error!r}")
            continue
        if length != len(values):
            report.add(where, f"holds {length} values, the manifest {len(values)}")
            continue
        read = RowRead.whole(StoredArray(key, layout, length, name), 0, length)
        try:
            await RemoteExecutor(reader, verify=True).execute([read])
        except CorruptDataError as error:
            report.add(where, f"cannot be read: {error}")
            continue
        stored = read.target.reshape(-1).view(_INT64)
        if not np.array_equal(stored, values):
            shown = f"{stored[:8].tolist()}{'...' if len(stored) > 8 else ''}"
            report.add(where, f"values {shown} differ from the manifest's")
