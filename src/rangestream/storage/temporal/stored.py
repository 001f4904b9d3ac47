"""What a temporal dataset's root document says, checked, and the record index it locates.

Opening a temporal dataset reads the root document, and a small record index whole
(``OPEN_INDEX_BYTES``). Everything in the root is untrusted
input: the schema of the field groups, the layouts of the three index arrays
(``storage.temporal.write`` writes them at commit) and the arrays listed per shard must
agree before a window is read. This is that check, shared by the commit of an append
(``check_schema``) and by opening, which also places the index arrays of the committed
version so that ``storage.temporal.index`` reads them (whole now if small, else by range
later).
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from typing import NamedTuple

import numpy as np

from rangestream.errors import MetadataError, SchemaMismatchError
from rangestream.io.ranges import ObjectRequest
from rangestream.layout.block import ArrayLayout
from rangestream.layout.executors import Program
from rangestream.layout.manifest import ROOT_KEY, Manifest, data_prefix
from rangestream.layout.pieces import StoredArray
from rangestream.storage.temporal.index import RecordIndex
from rangestream.storage.temporal.schema import RECORD_ROWS, TemporalSchema
from rangestream.storage.temporal.write import FRAME_STARTS_ARRAY, HISTOGRAM_ARRAY, INDEX_ARRAY

__all__ = ["OPEN_INDEX_BYTES", "StoredSchema", "open_record_index", "stored_schema"]

_INT64 = np.dtype("<i8")
#: Most bytes of an index array's ``zarr.json``.
_MAX_ARRAY_JSON_BYTES = 64 * 1024
#: ``StoredArray.ident`` of the index arrays (group arrays count from 1).
_INDEX_IDENT = 1 << 20
#: A record index of at most this many stored bytes (``index/record_rows``, 16 bytes a
#: record and a 4-byte checksum per inner chunk: 65,000 records or so) is read whole at
#: open, in one request after the root, when the index cache holds it
#: (``index_cache_bytes``): no window of such a dataset ever waits on an index request.
#: Larger indexes are read by range, the chunks a window needs when it first needs them,
#: so opening stays O(1) in the records.
OPEN_INDEX_BYTES = 1 << 20


def _array_length(raw: bytes, where: str, most: int) -> int:
    """The length (first extent) of a Zarr array from its ``zarr.json``, at most ``most``."""
    try:
        shape = json.loads(raw)["shape"]
        length = shape[0]
    except (ValueError, KeyError, TypeError, IndexError, RecursionError) as error:
        raise MetadataError(f"{where} is not a Zarr array document: {error}") from error
    if type(length) is not int or not 0 <= length <= most:
        raise MetadataError(f"{where}: length {length!r} is not in [0, {most}]")
    return length


class StoredSchema(NamedTuple):
    """The root document's schema and index layouts (``None``: absent from datasets
    written before the cumulative index or the histogram)."""

    schema: TemporalSchema
    index: ArrayLayout
    frame_starts: ArrayLayout | None
    histogram: ArrayLayout | None


def stored_schema(
    manifest: Manifest,
    where: str,
    url: str | os.PathLike[str],
    field_groups: Sequence[Sequence[str]],
) -> StoredSchema:
    """The schema and index layouts the root document describes, checked against its
    arrays, and against ``field_groups`` when the reader gave any (untrusted input: the
    root document is read from the store)."""
    stored = manifest.schema
    schema = TemporalSchema.from_json(stored, where)
    index_layout = ArrayLayout.from_json(stored.get("index"), f"{where} index layout")
    if index_layout.dtype != _INT64 or index_layout.row_shape != (2,):
        raise MetadataError(f"{where}: the record index must be int64 rows of shape (2,)")
    # the cumulative index and the histogram: absent from datasets written before them
    starts_layout = histogram_layout = None
    if "frame_starts" in stored:
        starts_layout = ArrayLayout.from_json(stored["frame_starts"], f"{where} frame_starts")
        if starts_layout.dtype != _INT64 or starts_layout.row_shape != ():
            raise MetadataError(f"{where}: index/frame_starts must be int64 values")
    if "frame_histogram" in stored:
        histogram_layout = ArrayLayout.from_json(
            stored["frame_histogram"], f"{where} frame_histogram"
        )
        if histogram_layout.dtype != _INT64 or histogram_layout.row_shape != (2,):
            raise MetadataError(f"{where}: index/frame_histogram must be int64 rows of shape (2,)")
    expected = {RECORD_ROWS, *(group.array for group in schema.groups)}
    if set(manifest.arrays) != expected:
        raise MetadataError(
            f"{where}: arrays {sorted(manifest.arrays)} do not match the schema's "
            f"{sorted(expected)}"
        )
    shard_layout = manifest.arrays[RECORD_ROWS]
    if shard_layout.dtype != _INT64 or shard_layout.row_shape != (2,):
        raise MetadataError(f"{where}: {RECORD_ROWS} must be int64 rows of shape (2,)")
    for group in schema.groups:
        layout = manifest.arrays[group.array]
        if layout.dtype != group.row_dtype or layout.row_shape != group.row_shape:
            raise MetadataError(
                f"{where}: array {group.array!r} is stored as {layout.dtype} rows of shape "
                f"{layout.row_shape}, its fields need {group.row_dtype} {group.row_shape}"
            )
    wanted = {frozenset(group) for group in field_groups if len(group) > 1}
    if field_groups and schema.fields and wanted != schema.interleaved_groups:
        stored_groups = sorted(sorted(group) for group in schema.interleaved_groups)
        raise SchemaMismatchError(
            f"{url} stores field groups {stored_groups}, but field_groups="
            f"{[list(group) for group in field_groups]} was given; changing the "
            "grouping means rewriting (omit field_groups to read the stored layout)"
        )
    return StoredSchema(schema, index_layout, starts_layout, histogram_layout)


def open_record_index(
    manifest: Manifest,
    url: str | os.PathLike[str],
    field_groups: Sequence[Sequence[str]],
    cache_bytes: int,
) -> Program[RecordIndex]:
    """The record index: read whole at open when it is small (``OPEN_INDEX_BYTES``),
    else by range later (opening then reads nothing past the root)."""
    index = _record_index(manifest, url, field_groups, cache_bytes)
    rows = index.rows
    if rows is not None and index.count and index.whole_fits:
        layout = rows.layout
        stored = -(-index.count // layout.chunk_rows) * layout.stored_chunk_nbytes
        if stored <= OPEN_INDEX_BYTES:
            chunks = range(-(-index.count // index.chunk_rows))
            yield from index.load(chunks)  # one request: every entry, checked and kept
    return index


def _record_index(
    manifest: Manifest,
    url: str | os.PathLike[str],
    field_groups: Sequence[Sequence[str]],
    cache_bytes: int,
) -> RecordIndex:
    where = f"{url}/{ROOT_KEY}"
    schema, index_layout, starts_layout, histogram_layout = stored_schema(
        manifest, where, url, field_groups
    )
    total = int(manifest.lengths[RECORD_ROWS].sum())
    prefix = data_prefix(manifest.commit_id)
    # idents apart from the group arrays' (``OpenedStorage.array`` counts from 1): mapped
    # blocks are found by ident
    rows = StoredArray(f"{prefix}/{INDEX_ARRAY}", index_layout, total, "record_rows", _INDEX_IDENT)
    starts = None
    if starts_layout is not None:
        entries = -(-total // index_layout.chunk_rows) + 1
        starts = StoredArray(f"{prefix}/{FRAME_STARTS_ARRAY}", starts_layout, entries,
                             "frame_starts", _INDEX_IDENT + 1)  # fmt: skip
    histogram = None
    if histogram_layout is not None:
        key = f"{prefix}/{HISTOGRAM_ARRAY}"

        def histogram() -> Program[StoredArray]:
            # its length is the number of distinct frame counts: in its Zarr metadata
            (raw,) = yield [ObjectRequest(f"{key}/zarr.json", _MAX_ARRAY_JSON_BYTES)]
            length = _array_length(bytes(raw), f"{where}: {key}/zarr.json", total)
            return StoredArray(key, histogram_layout, length, "frame_histogram", _INDEX_IDENT + 2)

    return RecordIndex(manifest, schema, rows, starts, histogram, where, cache_bytes)
