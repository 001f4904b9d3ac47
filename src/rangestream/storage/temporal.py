"""``TemporalArrayStorage``: records of named arrays sharing a frame axis, read by window.

Per shard: one array per field group (``rangestream.formats.temporal``: a lone field keeps
its dtype and shape, the fields of a listed group are interleaved per frame) and
``record_rows``, the first and end row of each record in those arrays. Every group's
blocks share one grid, and the writer starts a record that would straddle a grid boundary
at the next boundary instead (zero rows in between), so a window of a record that fits in
a block is one range request per group, never two. The commit gathers every shard's
``record_rows`` into one small array, ``index/record_rows``, so opening reads the root
document and that array (two requests up to a quarter of a million records) and every
window afterwards, the first one included, costs one range request per selected group (one
more only where a record longer than a block crosses a boundary): no per-window metadata.

The storage object stays a cheap, picklable description. What reading needs (store, range
reader, manifest, frame index) is opened per process on first use and rebuilt after a fork,
so ``read_window`` and ``aread_window`` can be called on the storage itself, in DataLoader
workers too; the async path serves any number of event loops.

On a plain local path with dense chunks, windows inside one block are gathered straight out
of memory-mapped blocks (``rangestream.io.local_map``, bounded and per process), each inner
chunk verified the first time this process reads it: a window then costs a few numpy calls
instead of a ``pread`` plus a crc32c pass over bytes already verified (``_MappedWindows``).
Anything else takes the generic read program, with the same counts and errors.
"""

from __future__ import annotations

import asyncio
import copy
import operator
import os
import threading
import weakref
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from google_crc32c import extend as crc32c_extend
from google_crc32c import value as crc32c_value

from rangestream.errors import (
    ChecksumError,
    CorruptDataError,
    DatasetNotFoundError,
    MetadataError,
    MissingObjectError,
    OutOfRangeError,
    SchemaMismatchError,
    UnknownFieldError,
    WindowError,
)
from rangestream.formats.temporal import (
    RECORD_ROWS,
    GroupSpec,
    TemporalSchema,
    normalize_field_groups,
)
from rangestream.io.local_map import DEFAULT_MAX_MAPPED_FILES, LocalMapCache, MappedFile
from rangestream.io.loop import current_pid
from rangestream.io.range_reader import IOStats, RangeReader, ReadProgram
from rangestream.io.ranges import ObjectRequest, RangeRequest
from rangestream.io.store import INLINE_READ_BYTES, LocalStore, ObjectStore
from rangestream.layout import chunked
from rangestream.layout.block import (
    CRC32C_RESIDUE,
    ArrayLayout,
    encode_block,
    first_bad_mapped_chunk,
)
from rangestream.layout.manifest import (
    MAX_ROOT_BYTES,
    ROOT_KEY,
    Manifest,
    data_prefix,
    parse_root,
)
from rangestream.layout.rows import BlockIndexCache, RowRange, read_rows
from rangestream.layout.zarr_json import array_document, dumps
from rangestream.storage.base import Storage, close_store_sync
from rangestream.storage.writing import ShardEncoder

__all__ = [
    "DEFAULT_CHUNK_FRAMES",
    "DEFAULT_TEMPORAL_BLOCK_BYTES",
    "DEFAULT_TEMPORAL_CHUNK_BYTES",
    "TemporalArrayStorage",
]

_INT64 = np.dtype("<i8")
#: Target bytes of one inner chunk of a group array: the unit of checksums and of the
#: over-fetch at each end of a window.
DEFAULT_TEMPORAL_CHUNK_BYTES = 8 * 1024
#: Bound on one block of a group array. Larger than other storages' 4 MiB because a record
#: that would cross a block boundary starts at the next one instead: the padding this costs
#: is about ``frames / (2 * block_frames)`` of the rows (11% at 4 MiB, under 3% at 16 MiB
#: for 1 KiB frames of 300-1500-frame records). Reads never fetch whole blocks.
DEFAULT_TEMPORAL_BLOCK_BYTES = 16 * 1024 * 1024
#: Most frames in one inner chunk, so a narrow group (a few bytes per frame) is not
#: over-fetched by hundreds of frames around a short window.
DEFAULT_CHUNK_FRAMES = 32
#: The whole-dataset record index written by the commit, relative to the data prefix:
#: every shard's ``record_rows`` (first and end row of each record) in shard order.
INDEX_ARRAY = "index/record_rows"
_INDEX_CHUNK_BYTES = 8 * 1024
_MAX_CACHED_SELECTIONS = 64
#: Rows of a mapped group's precomputed gather positions: a window whose rows, counted from
#: its block's start or else from its first inner chunk, fit in this many is one fancy index
#: per field; a longer one takes the generic path.
_GATHER_ROWS = 8192
#: Blocks a reader keeps mapped (per process): see ``rangestream.io.local_map``.
_MAX_MAPPED_BLOCKS = DEFAULT_MAX_MAPPED_FILES


class _TemporalShardEncoder(ShardEncoder):
    """Encodes records into group rows, padding so that no record straddles a block.

    ``aligned_rows`` is the block grid every group's blocks share (each group's
    ``block_rows`` is a multiple of it). A record that would cross one of its boundaries
    but fits within ``aligned_rows`` frames starts at the next boundary instead, after
    zero rows in every group: a window of it is then one range per group, never two, as
    LitData's chunks never split a sample. Longer records are stored unpadded (they cross
    boundaries wherever they start). Padding costs on average ``frames / (2 *
    aligned_rows)`` of a record's rows.
    """

    def __init__(self, schema: TemporalSchema, aligned_rows: int) -> None:
        self.schema = schema
        self.first_array = schema.groups[0].array
        self.aligned_rows = aligned_rows

    def encode(self, data: Any, lengths: Mapping[str, int]) -> Mapping[str, np.ndarray]:
        rows, frames = self.schema.encode(data)
        first = lengths[self.first_array]
        used = first % self.aligned_rows
        if used and frames <= self.aligned_rows and used + frames > self.aligned_rows:
            pad = self.aligned_rows - used
            for array, values in rows.items():
                padded = np.zeros((pad + frames, *values.shape[1:]), dtype=values.dtype)
                padded[pad:] = values
                rows[array] = padded
            first += pad
        rows[RECORD_ROWS] = np.asarray([[first, first + frames]], dtype=_INT64)
        return rows


def _integer(value: Any, what: str) -> int:
    if isinstance(value, bool):
        raise TypeError(f"{what} must be an integer, got {value!r}")
    try:
        return operator.index(value)
    except TypeError:
        raise TypeError(f"{what} must be an integer, got {value!r}") from None


@dataclass(frozen=True, slots=True)
class _FieldOutput:
    """One requested field: where it sits in its group's rows and how it is returned."""

    name: str
    dtype: np.dtype[Any]
    shape: tuple[int, ...]
    offset: int
    nbytes: int
    whole_row: bool  # the only field of its group


@dataclass(frozen=True, slots=True)
class _Selection:
    """The groups a ``fields`` argument needs, with the fields to cut out of each."""

    outputs: tuple[_FieldOutput, ...]  # in the order the caller asked for
    groups: tuple[tuple[int, tuple[_FieldOutput, ...]], ...]  # (group number, its fields)


class _GroupArray:
    """A group's array in every shard, with its layout constants for window planning."""

    def __init__(self, spec: GroupSpec, layout: ArrayLayout, manifest: Manifest) -> None:
        self.spec = spec
        self.layout = layout
        ids = manifest.shard_ids
        self.keys = tuple(manifest.array_key(int(s), spec.array) for s in ids)
        self.lengths = tuple(int(n) for n in manifest.lengths[spec.array])
        self.suffix = "/0" * layout.stored_trailing_ndim
        self.dense = layout.dense_chunks
        self.block_rows = layout.block_rows
        self.chunk_rows = layout.chunk_rows
        self.chunk_nbytes = layout.chunk_nbytes
        self.stored = layout.stored_chunk_nbytes
        self.row_nbytes = layout.row_nbytes
        zeros = bytes(self.chunk_nbytes)
        self._valid_chunk = zeros + crc32c_value(zeros).to_bytes(4, "little")
        self._valid_crcs = [0]  # crc32c of 0, 1, 2... valid chunks back to back

    def valid_crc(self, chunks: int) -> int:
        """The crc32c of any ``chunks`` valid inner chunks stored back to back.

        A chunk followed by its own crc32c leaves the CRC register in a fixed state, so the
        CRC of a run of valid chunks depends only on how many there are: one pass over a
        fetched run checks every chunk in it (a single bad chunk always changes the result).
        """
        table = self._valid_crcs
        if chunks >= len(table):
            table = list(table)  # replaced whole, so concurrent readers never see a gap
            while len(table) <= chunks:
                table.append(crc32c_extend(table[-1], self._valid_chunk))
            self._valid_crcs = table
        return table[chunks]


class _TemporalIndex:
    """What opening read: the manifest, the schema and every record's frames and offset."""

    def __init__(
        self, manifest: Manifest, schema: TemporalSchema, rows: np.ndarray, where: str
    ) -> None:
        """``rows``: every record's ``(first_row, end_row)``, shard by shard (untrusted)."""
        self.manifest = manifest
        self.schema = schema
        records_per_part = manifest.lengths[RECORD_ROWS]
        total = int(records_per_part.sum())
        if rows.shape != (total, 2):
            raise CorruptDataError(
                f"{where}: the record index holds {len(rows)} records, the manifest {total}"
            )
        firsts, ends = rows[:, 0], rows[:, 1]
        counts = ends - firsts
        if total and int(counts.min()) <= 0:
            bad = int(np.flatnonzero(counts <= 0)[0])
            raise CorruptDataError(f"{where}: record {bad} has {int(counts[bad])} frames")
        # within a shard, records start at or after the previous one's end, the first at or
        # after row 0; the last ends at the length every group array of the shard has
        part_starts = np.cumsum(records_per_part) - records_per_part
        previous = np.empty(total, dtype=np.int64)
        if total:
            previous[1:] = ends[:-1]
            previous[part_starts[records_per_part > 0]] = 0
        if total and bool((firsts < previous).any()):
            bad = int(np.flatnonzero(firsts < previous)[0])
            raise CorruptDataError(
                f"{where}: record {bad} starts at row {int(firsts[bad])}, before row "
                f"{int(previous[bad])} where the record before it (or the shard) ends"
            )
        part_rows = np.zeros(len(records_per_part), dtype=np.int64)
        nonempty = records_per_part > 0
        part_rows[nonempty] = ends[part_starts[nonempty] + records_per_part[nonempty] - 1]
        for group in schema.groups:
            if not np.array_equal(manifest.lengths[group.array], part_rows):
                raise CorruptDataError(
                    f"{where}: array {group.array!r} has per-shard lengths "
                    f"{manifest.lengths[group.array].tolist()}, the record index says "
                    f"{part_rows.tolist()}"
                )
        counts.flags.writeable = False
        self.frame_counts = counts
        self.record_start = np.ascontiguousarray(firsts)
        self.record_part = np.repeat(np.arange(len(records_per_part)), records_per_part)
        self.groups = tuple(
            _GroupArray(spec, manifest.arrays[spec.array], manifest) for spec in schema.groups
        )
        self.dense = all(group.dense for group in self.groups)
        self.block_indexes = BlockIndexCache()
        self._selections: dict[tuple[str, ...] | None, _Selection] = {}

    # -- arguments -------------------------------------------------------------------------
    def check_record(self, record: Any) -> int:
        record = _integer(record, "record")
        count = len(self.frame_counts)
        if not 0 <= record < count:
            raise OutOfRangeError(
                f"record {record} is outside the dataset's {count} records [0, {count})"
            )
        return record

    def check_window(self, record: Any, start: Any, frames: Any) -> tuple[int, int, int]:
        if type(record) is not int or type(start) is not int or type(frames) is not int:
            record = _integer(record, "record")
            start = _integer(start, "start")
            frames = _integer(frames, "frames")
        if not 0 <= record < len(self.frame_counts):
            self.check_record(record)  # raises
        count = self.frame_counts.item(record)
        if frames <= 0:
            raise WindowError(f"frames must be >= 1, got {frames} (record {record})")
        if start < 0 or start + frames > count:
            raise WindowError(
                f"window [{start}, {start + frames}) is outside record {record}'s {count} "
                f"frames [0, {count}); windows are neither padded nor truncated"
            )
        return record, start, frames

    def selection(self, fields: Sequence[str] | None) -> _Selection:
        if isinstance(fields, (str, bytes)):
            raise TypeError(f"fields must be a list of field names, got the string {fields!r}")
        key = None if fields is None else tuple(fields)
        found = self._selections.get(key)
        if found is not None:
            return found
        schema = self.schema
        names = schema.field_names if key is None else list(dict.fromkeys(key))
        unknown = [name for name in names if name not in schema.by_name]
        if unknown:
            raise UnknownFieldError(
                f"unknown field(s) {unknown}; the dataset's fields are {schema.field_names}"
            )
        outputs = []
        by_group: dict[int, list[_FieldOutput]] = {}
        for name in names:
            number, position = schema.location[name]
            group = schema.groups[number]
            spec = group.fields[position]
            output = _FieldOutput(
                name,
                spec.dtype,
                spec.shape,
                group.offsets[position],
                spec.frame_nbytes,
                not group.interleaved,
            )
            outputs.append(output)
            by_group.setdefault(number, []).append(output)
        selection = _Selection(
            tuple(outputs),
            tuple((number, tuple(found)) for number, found in sorted(by_group.items())),
        )
        if len(self._selections) >= _MAX_CACHED_SELECTIONS:
            self._selections.clear()
        self._selections[key] = selection
        return selection

    # -- the window read ---------------------------------------------------------------------
    def window(
        self,
        record: int,
        start: int,
        frames: int,
        selection: _Selection,
        *,
        verify: bool,
        describe: Callable[[str], str],
        serial: bool = False,
    ) -> ReadProgram[dict[str, np.ndarray]]:
        """Program reading one checked window: one range per selected group and block.

        ``serial`` yields the requests one at a time (for ``pread``, which reads one range
        per call anyway); otherwise all in one round, fetched concurrently.
        """
        part = self.record_part.item(record)
        first = self.record_start.item(record) + start
        stop = first + frames
        result = {
            output.name: np.empty((frames, *output.shape), dtype=output.dtype)
            for output in selection.outputs
        }
        if not self.dense:
            yield from self._window_generic(part, first, stop, selection, result, verify, describe)
            return result
        requests: list[RangeRequest] = []
        pieces: list[tuple[_GroupArray, tuple[_FieldOutput, ...], int, int, int]] = []
        for number, outputs in selection.groups:
            group = self.groups[number]
            key = group.keys[part]
            block_rows, chunk_rows, stored = group.block_rows, group.chunk_rows, group.stored
            row = first
            while row < stop:
                block = row // block_rows
                base = block * block_rows
                end = min(stop, base + block_rows)
                first_chunk = (row - base) // chunk_rows
                last_chunk = (end - base - 1) // chunk_rows
                requests.append(
                    RangeRequest(
                        f"{key}/c/{block}{group.suffix}",
                        first_chunk * stored,
                        (last_chunk + 1) * stored,
                    )
                )
                skip = row - base - first_chunk * chunk_rows
                pieces.append((group, outputs, skip, end - row, row - first))
                row = end
        if serial:  # decode each range as it arrives
            for request, piece in zip(requests, pieces, strict=True):
                (data,) = yield [request]
                _fill(piece, request, data, result, frames, verify, describe)
        else:
            datas = yield requests
            for request, piece, data in zip(requests, pieces, datas, strict=True):
                _fill(piece, request, data, result, frames, verify, describe)
        return result

    def _window_generic(
        self,
        part: int,
        first: int,
        stop: int,
        selection: _Selection,
        result: dict[str, np.ndarray],
        verify: bool,
        describe: Callable[[str], str],
    ) -> ReadProgram[None]:
        """Layouts without dense chunks: ``read_rows`` fetches (and caches) chunk indexes."""
        ranges = [
            RowRange(group.keys[part], group.layout, group.lengths[part], first, stop)
            for group in (self.groups[number] for number, _ in selection.groups)
        ]
        parts = yield from read_rows(
            ranges, self.block_indexes, describe=describe, verify_checksums=verify
        )
        for (_, outputs), rows in zip(selection.groups, parts, strict=True):
            for output in outputs:
                target = result[output.name].reshape(len(rows), -1).view(np.uint8)
                target[...] = rows[:, output.offset : output.offset + output.nbytes]


@dataclass(frozen=True, slots=True)
class _Where:
    """The place of a request, for error messages; formatted only when one is raised."""

    describe: Callable[[str], str]
    request: RangeRequest

    def __call__(self) -> str:
        request = self.request
        return f"{self.describe(request.key)} bytes [{request.start}, {request.end})"


def _fill(
    piece: tuple[_GroupArray, tuple[_FieldOutput, ...], int, int, int],
    request: RangeRequest,
    data: Any,
    result: dict[str, np.ndarray],
    frames: int,
    verify: bool,
    describe: Callable[[str], str],
) -> None:
    """Check the inner chunks of one fetched range and copy its rows into the outputs."""
    group, outputs, skip, count, at = piece
    stored = group.stored
    chunks = len(data) // stored
    if chunks * stored != len(data) or chunks == 0:
        raise CorruptDataError(
            f"{_Where(describe, request)()}: {len(data)} bytes is not a whole number "
            f"of {stored}-byte chunks"
        )
    if verify:
        crc = crc32c_value(data if type(data) is bytes else np.frombuffer(data, np.uint8))
        if crc != group.valid_crc(chunks):
            _raise_checksum_error(group, data, request, describe)
    if outputs[0].whole_row:  # the group's only field: copied as byte runs
        target = memoryview(result[outputs[0].name]).cast("B")
        _copy_whole_rows(group, memoryview(data), skip, count, target, at)
        return
    rows = (
        np.frombuffer(data, dtype=np.uint8)
        .reshape(chunks, stored)[:, : group.chunk_nbytes]
        .reshape(chunks, group.chunk_rows, group.row_nbytes)
    )
    for output in outputs:
        target = result[output.name].reshape(frames, -1).view(np.uint8)
        _copy_rows(rows, skip, count, target, at, output)


def _raise_checksum_error(
    group: _GroupArray, data: Any, request: RangeRequest, describe: Callable[[str], str]
) -> None:
    """Name the first inner chunk of a failed read whose own checksum does not match."""
    stored = group.stored
    for number, chunk in enumerate(np.frombuffer(data, np.uint8).reshape(-1, stored)):
        if crc32c_value(chunk) != CRC32C_RESIDUE:
            chunk_number = request.start // stored + number
            raise ChecksumError(
                f"{_Where(describe, request)()}: checksum mismatch in inner chunk "
                f"{chunk_number} of the block"
            )
    raise ChecksumError(f"{_Where(describe, request)()}: checksum mismatch")


def _copy_whole_rows(
    group: _GroupArray, source: memoryview, skip: int, count: int, target: memoryview, at: int
) -> None:
    """Copy ``count`` whole rows, from ``skip`` rows into the fetched chunks, to row ``at``.

    One byte-run copy per inner chunk: the rows of a chunk are contiguous in ``source``
    (only the chunk's 4-byte checksum separates it from the next).
    """
    row_nbytes, stored = group.row_nbytes, group.stored
    position = at * row_nbytes
    begin = skip * row_nbytes
    available = group.chunk_rows - skip
    chunk_start = 0
    while count:
        rows = available if available < count else count
        nbytes = rows * row_nbytes
        target[position : position + nbytes] = source[
            chunk_start + begin : chunk_start + begin + nbytes
        ]
        position += nbytes
        count -= rows
        chunk_start += stored
        begin = 0
        available = group.chunk_rows


def _copy_rows(
    rows: np.ndarray, skip: int, count: int, target: np.ndarray, at: int, output: _FieldOutput
) -> None:
    """Copy ``count`` rows starting ``skip`` rows into ``rows`` to ``target[at:]``.

    ``rows`` is ``(chunks, chunk_rows, row_nbytes)``; only the field's bytes are copied. At
    most three copies whatever the number of chunks: the partial first and last chunks and
    every whole chunk between them.
    """
    low, high = output.offset, output.offset + output.nbytes
    chunk_rows = rows.shape[1]
    head = min(chunk_rows - skip, count)
    target[at : at + head] = rows[0, skip : skip + head, low:high]
    done = head
    whole = (count - done) // chunk_rows
    if whole:
        target[at + done : at + done + whole * chunk_rows].reshape(whole, chunk_rows, -1)[...] = (
            rows[1 : 1 + whole, :, low:high]
        )
        done += whole * chunk_rows
    if done < count:
        target[at + done : at + count] = rows[1 + whole, : count - done, low:high]


class _MappedField:
    """How to copy one field's values out of a mapped block of its group's array.

    A block is inner chunks of ``chunk_rows`` rows, each followed by its 4-byte checksum,
    so row ``i`` of a block starts at byte ``(i // chunk_rows) * stored + (i % chunk_rows)
    * row_nbytes``. Two ways to reach a field's values through one cached view per block:

    - The only field of its group (``whole_row``) is viewed as ``(chunks, chunk_rows,
      *shape)``: a window is its first chunk's tail, then the following chunks as one
      strided copy whose inner runs are whole contiguous chunks (two numpy copies, close to
      a memmap slice's one, whatever the window's length).
    - A field interleaved with others is viewed with a first-axis stride of ``unit`` bytes
      (the largest of 4, 2, 1 dividing the row size; the "rows" overlap, only the gathered
      ones are real), and a window is one fancy index with precomputed positions: it skips
      checksums and the group's other fields in one call. Its rows are narrow, so the
      gather's per-row cost is small next to the calls the chunk copy would take.
    """

    __slots__ = (
        "chunk_rows",
        "dtype",
        "inner_strides",
        "name",
        "nbytes",
        "offset",
        "shape",
        "stored",
        "unit",
        "whole_row",
    )

    def __init__(self, output: _FieldOutput, group: _GroupArray, unit: int) -> None:
        self.name = output.name
        self.dtype = output.dtype
        self.shape = output.shape
        self.offset = output.offset
        self.nbytes = output.nbytes  # per frame
        self.whole_row = output.whole_row
        self.chunk_rows = group.chunk_rows
        self.stored = group.stored
        self.unit = unit
        strides = [output.dtype.itemsize]  # C order within the field's trailing shape
        for size in reversed(output.shape[1:]):
            strides.insert(0, strides[0] * size)
        self.inner_strides = tuple(strides[: len(output.shape)])

    def view(self, mapped: MappedFile) -> np.ndarray:
        """The field's view over all of ``mapped`` (cached there): chunks or unit rows."""
        found = mapped.views.get(self)
        if found is None:
            if self.whole_row:
                chunks = mapped.size // self.stored
                found = np.ndarray(
                    (chunks, self.chunk_rows, *self.shape),
                    dtype=self.dtype,
                    buffer=mapped.data,
                    strides=(self.stored, self.nbytes, *self.inner_strides),
                )
            else:
                rows = max(0, (mapped.size - self.offset - self.nbytes) // self.unit + 1)
                found = np.ndarray(
                    (rows, *self.shape),
                    dtype=self.dtype,
                    buffer=mapped.data,
                    offset=self.offset if rows else 0,
                    strides=(self.unit, *self.inner_strides),
                )
            mapped.views[self] = found
        return found


class _MappedGroup:
    """A group's array in every shard, as mapped blocks: geometry, gather positions, paths."""

    __slots__ = (
        "block_rows",
        "chunk_rows",
        "chunk_units",
        "chunks_per_block",
        "counter",
        "gather_rows",
        "group",
        "keys",
        "kind",
        "number",
        "paths",
        "positions",
        "row_nbytes",
        "store",
        "stored",
        "stride",
        "unit",
        "whole_row",
    )

    def __init__(
        self, group: _GroupArray, number: int, groups: int, store: LocalStore, reader: RangeReader
    ) -> None:
        self.group = group
        # a block's key in the mapping cache is ((part << 40) + block) * stride + number:
        # an int made without building the path, unique across groups, shards and blocks
        self.number = number
        self.stride = groups
        self.store = store
        self.kind = group.spec.array  # the array name the counters use
        self.counter = reader.mapped_tally(self.kind)  # [requests, bytes] of this array
        self.block_rows = group.block_rows
        self.chunk_rows = group.chunk_rows
        self.chunks_per_block = -(-group.block_rows // group.chunk_rows)
        self.stored = group.stored
        self.row_nbytes = group.row_nbytes
        self.unit = 4 if group.row_nbytes % 4 == 0 else 2 if group.row_nbytes % 2 == 0 else 1
        self.chunk_units = group.stored // self.unit
        self.whole_row = not group.spec.interleaved  # one field: copied as chunk runs
        self.keys = group.keys
        self.paths: tuple[dict[int, tuple[str, str]], ...] = tuple({} for _ in group.keys)
        # windows whose rows, counted from a block's start (or, past that, from the
        # window's first inner chunk), lie below gather_rows are one fancy index
        self.gather_rows = min(group.block_rows, _GATHER_ROWS)
        rows = np.arange(self.gather_rows, dtype=np.intp)
        self.positions = (
            (rows // group.chunk_rows) * group.stored + (rows % group.chunk_rows) * group.row_nbytes
        ) // self.unit

    def block(self, part: int, block: int) -> tuple[str, str]:
        """(key, file path) of block ``block`` of shard number ``part``, made once."""
        found = self.paths[part].get(block)
        if found is None:
            key = f"{self.keys[part]}/c/{block}{self.group.suffix}"
            found = self.paths[part][block] = (key, self.store.local_path(key))
        return found


class _MappedPlan:
    """What a ``fields`` argument reads on the mmap path: groups, their fields, the order."""

    __slots__ = ("frame_nbytes", "groups", "order", "reorder")

    def __init__(
        self,
        groups: tuple[tuple[_MappedGroup, tuple[_MappedField, ...]], ...],
        order: tuple[str, ...],
    ) -> None:
        self.groups = groups
        self.order = order  # the caller's order of the returned fields
        # whether gathering group by group returns the fields in another order
        self.reorder = order != tuple(field.name for _, fields in groups for field in fields)
        self.frame_nbytes = sum(field.nbytes for _, fields in groups for field in fields)


class _MappedWindows:
    """Sync windows of a local dataset gathered straight out of a bounded mmap cache.

    Everything a window needs that does not depend on the window is computed once (per
    group: block geometry, gather positions, block paths; per ``fields`` argument: the
    groups and field views to use), so a window costs little more than its copies: the
    budget is a raw memmap slice's. The copies are one call per field of the compiled
    ``chunked.copy_rows``; without it, a handful of numpy calls (about 2.5 µs a field more,
    0.6x of memmap rather than 0.9x on the benchmark's windows). Windows this path does not
    serve (crossing a block boundary, longer than the numpy path's gather positions, a block
    that is missing or shorter than the layout says) return ``None`` before anything is
    counted and take the generic path, which reports damage with its usual errors.

    Checksums: each inner chunk is verified the first time this process reads it from its
    mapping, then marked in the mapping's ``verified`` flags; committed blocks never change,
    so later windows trust it. A chunk that fails is never marked, so every window that
    touches it keeps failing. Counting: one request per group and block with the bytes of
    the whole inner chunks the window covers, exactly as the ``pread`` it replaces counted.
    """

    def __init__(
        self, index: _TemporalIndex, store: LocalStore, reader: RangeReader, verify: bool
    ) -> None:
        self.index = index
        self.maps = LocalMapCache(_MAX_MAPPED_BLOCKS)
        self.reader = reader
        self.verify = verify
        self.describe = store.describe
        self.copy_rows = chunked.copy_rows  # None without the compiled helper: numpy copies
        groups = len(index.groups)
        self.groups = tuple(
            _MappedGroup(group, number, groups, store, reader)
            for number, group in enumerate(index.groups)
        )
        self.fields: dict[tuple[int, str], _MappedField] = {}
        self.plans: dict[tuple[str, ...] | None, _MappedPlan] = {}
        self.records = len(index.frame_counts)

    def plan(self, fields: Sequence[str] | None) -> _MappedPlan:
        """The plan of a ``fields`` argument (validated like any), made once and cached."""
        selection = self.index.selection(fields)  # raises for a string or unknown names
        key = None if fields is None else tuple(fields)
        plan = _MappedPlan(
            tuple(
                (self.groups[number], tuple(self._field(number, output) for output in outputs))
                for number, outputs in selection.groups
            ),
            tuple(output.name for output in selection.outputs),
        )
        if len(self.plans) >= _MAX_CACHED_SELECTIONS:
            self.plans.clear()
        self.plans[key] = plan
        return plan

    def _field(self, number: int, output: _FieldOutput) -> _MappedField:
        """One ``_MappedField`` per field, so every plan shares the views cached per block."""
        found = self.fields.get((number, output.name))
        if found is None:
            group = self.groups[number]
            found = self.fields[(number, output.name)] = _MappedField(
                output, group.group, group.unit
            )
        return found

    def window(
        self, record: Any, start: Any, frames: Any, fields: Sequence[str] | None
    ) -> dict[str, np.ndarray] | None:
        """The window, or ``None`` where the generic path must serve (or refuse) it.

        Arguments that are not plain ints inside the record, and a ``fields`` argument
        without a plan yet, return ``None`` before anything is read: the generic path checks
        and names them (``read_window`` then makes the plan of a valid ``fields``).
        """
        plan = self.plans.get(None if fields is None else tuple(fields))
        if plan is None or type(record) is not int or type(start) is not int:
            return None
        if type(frames) is not int or not 0 <= record < self.records or frames <= 0:
            return None
        index = self.index
        if start < 0 or start + frames > index.frame_counts.item(record):
            return None
        part = index.record_part.item(record)
        first = index.record_start.item(record) + start
        copy_rows = self.copy_rows
        maps = self.maps
        if maps.pid != current_pid():
            maps.check_process()  # a forked child maps its own files
        files = maps.files
        part_key = part << 40
        result = {}
        spent = []
        for group, group_fields in plan.groups:
            block_rows = group.block_rows
            block = first // block_rows
            low = first - block * block_rows
            high = low + frames
            if high > block_rows:
                return None  # crosses a block boundary: two ranges, the generic path
            chunk_rows = group.chunk_rows
            first_chunk = low // chunk_rows
            end_chunk = (high - 1) // chunk_rows + 1
            if copy_rows is None:  # numpy: views per block, positions per window
                skip = low - first_chunk * chunk_rows  # rows of the first chunk before the window
                shift = 0  # where the positions start in the field's unit-rows view
                if group.whole_row:
                    positions = None
                elif high <= group.gather_rows:
                    positions = group.positions[low:high]  # counted from the block's start
                else:
                    if skip + frames > group.gather_rows:
                        return None  # longer than the gather positions
                    positions = group.positions[skip : skip + frames]  # from the first chunk's
                    shift = first_chunk * group.chunk_units
            cache_key = (part_key + block) * group.stride + group.number
            mapped = files.get(cache_key)
            if mapped is None:
                try:
                    mapped = maps.open(
                        group.block(part, block)[1], group.chunks_per_block, cache_key
                    )
                except OSError:
                    return None  # missing or unreadable: the generic path names it
            else:
                try:  # noqa: SIM105 - contextlib.suppress costs more than the move itself
                    files.move_to_end(cache_key)
                except KeyError:  # dropped by another thread just now: still valid to use
                    pass
            if end_chunk * group.stored > mapped.size:
                return None  # shorter than the layout says: the generic path reports it
            spent.append((group.counter, (end_chunk - first_chunk) * group.stored))
            if self.verify and mapped.verified.find(0, first_chunk, end_chunk) >= 0:
                try:
                    self._verify(group, group.block(part, block)[0], mapped, first_chunk, end_chunk)
                except ChecksumError:
                    _count(spent)  # the reads happened, then failed
                    raise
            if copy_rows is not None:  # the compiled helper: one call per field
                data = mapped.data
                stored = group.stored
                row_nbytes = group.row_nbytes
                for field in group_fields:
                    out = np.empty((frames, *field.shape), field.dtype)
                    copy_rows(
                        data, out, low, frames, chunk_rows, stored, row_nbytes,
                        field.offset, field.nbytes,
                    )  # fmt: skip
                    result[field.name] = out
                continue
            views = mapped.views
            for field in group_fields:
                view = views.get(field)
                if view is None:
                    view = field.view(mapped)
                if positions is not None:
                    result[field.name] = (view[shift:] if shift else view)[positions]
                    continue
                # the field alone in its group: the first chunk's tail, then whole chunks
                head = chunk_rows - skip
                if head >= frames:
                    result[field.name] = view[first_chunk, skip : skip + frames].copy()
                    continue
                whole = (frames - head + chunk_rows - 1) // chunk_rows
                shape = field.shape
                out = np.empty((head + whole * chunk_rows, *shape), field.dtype)
                out[:head] = view[first_chunk, skip:]
                out[head:].reshape(whole, chunk_rows, *shape)[...] = view[
                    first_chunk + 1 : first_chunk + 1 + whole
                ]
                if head + whole * chunk_rows != frames:
                    out.resize((frames, *shape), refcheck=False)  # in place: stays owned
                result[field.name] = out
        for counter, nbytes in spent:  # _count, written out: it runs for every window
            counter[0] += 1
            counter[1] += nbytes
        if plan.reorder:
            result = {name: result[name] for name in plan.order}
        return result

    def _verify(
        self, group: _MappedGroup, key: str, mapped: MappedFile, first: int, end: int
    ) -> None:
        """Check the not yet verified inner chunks in ``[first, end)``; mark those that pass."""
        stored = group.stored
        bad = first_bad_mapped_chunk(mapped.data, mapped.verified, stored, first, end)
        if bad is not None:
            raise ChecksumError(
                f"{self.describe(key)} bytes [{first * stored}, {end * stored}): "
                f"checksum mismatch in inner chunk {bad} of the block"
            )


def _count(spent: list[tuple[list[int], int]]) -> None:
    """Count mapped reads as the ``pread`` each replaces (``RangeReader.mapped_tally``)."""
    for counter, nbytes in spent:
        counter[0] += 1
        counter[1] += nbytes


#: Guards making a storage's per-process state, so concurrent first reads share it.
_state_lock = threading.Lock()


def _new_state_lock() -> None:
    global _state_lock
    _state_lock = threading.Lock()  # a fork may copy it locked by a thread that is gone


os.register_at_fork(after_in_child=_new_state_lock)


class _OpenState:
    """Per-process reading state: store, range reader, the frame index once loaded."""

    def __init__(self, storage: TemporalArrayStorage) -> None:
        self.pid = os.getpid()
        self.store = storage._new_store()
        self.reader = RangeReader(
            self.store,
            max_concurrency=storage.max_concurrency,
            coalesce_gap=storage.coalesce_gap,
            retry=storage.retry,
        )
        self.index: _TemporalIndex | None = None
        #: The mmap fast path, made with the index for a plain local store with dense chunks.
        self.mapped: _MappedWindows | None = None
        self.verify = storage.verify_checksums
        self.lock = threading.Lock()
        self.opening: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, asyncio.Task[Any]] = (
            weakref.WeakKeyDictionary()
        )

    def set_index(self, index: _TemporalIndex) -> None:
        """Keep the opened index and, where it applies, make the mmap fast path over it.

        Only a plain ``LocalStore`` qualifies (a subclass may change how reads behave), and
        only dense layouts, whose byte offsets follow from the layout alone.
        """
        if self.mapped is None and type(self.store) is LocalStore and index.dense:
            self.mapped = _MappedWindows(index, self.store, self.reader, self.verify)
        self.index = index


class TemporalArrayStorage(Storage):
    """Records of named arrays with a common frame axis, read as windows of frames.

    A record is a flat mapping of field name to a numpy array (or torch tensor) shaped
    ``(frames, ...)``; names, dtypes and trailing shapes are fixed by the first record
    written, frame counts vary. Reading a window of some fields costs one range request per
    field group involved, so training can sample short windows out of long recordings
    straight from object storage.

    Parameters
    ----------
    url
        Where the dataset lives (local path, ``s3://``, ``memory://``, any fsspec URL).
    field_groups
        Lists of fields stored interleaved per frame, e.g. ``[["clock", "valid", "pose"]]``:
        a window of a group is one contiguous range, so fields read together should be
        grouped. Selecting one field of a group still fetches the whole group's rows for the
        window (over-fetch). Unlisted fields are stored alone with their own dtype and shape.
        Readers discover the grouping from the store; if given when reading, it must match.
    chunk_bytes
        Target size of an inner chunk of a group array (default 8 KiB): the unit of
        checksums and of over-fetch at each end of a window.
    chunk_frames
        Most frames per inner chunk (default 32), so narrow groups are not over-fetched.
        Inner chunks hold a power of two of frames.
    block_bytes
        Bound on one stored block (default 16 MiB). A record that would cross a block
        boundary starts at the next block instead (zero rows in between), so its windows
        are one request per group; larger blocks waste less of that padding.
    **options
        See ``Storage``: ``storage_options``, ``max_concurrency``,
        ``coalesce_gap``, ``retry``, ``verify_checksums``, ``dense_chunks``.
    """

    kind = "temporal"

    def __init__(
        self,
        url: str | os.PathLike[str],
        field_groups: Sequence[Sequence[str]] | None = None,
        *,
        chunk_bytes: int = DEFAULT_TEMPORAL_CHUNK_BYTES,
        chunk_frames: int = DEFAULT_CHUNK_FRAMES,
        block_bytes: int = DEFAULT_TEMPORAL_BLOCK_BYTES,
        **options: Any,
    ) -> None:
        super().__init__(url, chunk_bytes=chunk_bytes, block_bytes=block_bytes, **options)
        self.field_groups = normalize_field_groups(field_groups)
        if isinstance(chunk_frames, bool) or not isinstance(chunk_frames, int) or chunk_frames < 1:
            raise ValueError(f"chunk_frames must be a positive integer, got {chunk_frames!r}")
        self.chunk_frames = chunk_frames
        self._bound: TemporalSchema | None = None  # set on writer copies by the first record
        self._state: _OpenState | None = None

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_state"] = None  # reading state is per process
        return state

    def __bool__(self) -> bool:  # never let a truth test open the dataset through __len__
        return True

    # -- layout and schema (writing) ------------------------------------------------------
    def _index_layout(self) -> ArrayLayout:
        return ArrayLayout.for_sizes(
            _INT64,
            (2,),
            chunk_bytes=_INDEX_CHUNK_BYTES,
            block_bytes=max(self.block_bytes, _INDEX_CHUNK_BYTES),
            dense_chunks=self.dense_chunks,
        )

    def _group_layouts(self, schema: TemporalSchema) -> dict[str, ArrayLayout]:
        """Each group's layout, all on one block grid so records can be kept inside blocks.

        Inner chunks hold a power of two of frames (at most ``chunk_frames`` and
        ``chunk_bytes``), so the largest chunk row count is a multiple of every other. The
        shared grid is the smallest block (the widest group's), cut to a multiple of that;
        every group's block is the largest multiple of the grid within ``block_bytes``
        (at least one), so each grid boundary that a record avoids is the only kind of
        block boundary in any group (see ``_TemporalShardEncoder``).
        """
        natural = {}
        for group in schema.groups:
            frames = max(1, min(self.chunk_frames, self.chunk_bytes // group.row_nbytes))
            frames = 1 << (frames.bit_length() - 1)
            natural[group.array] = self._layout(
                group.row_dtype, group.row_shape, chunk_bytes=frames * group.row_nbytes
            )
        if not natural:
            return {}
        step = max(layout.chunk_rows for layout in natural.values())
        grid = min(layout.block_rows for layout in natural.values())
        grid = max(step, grid - grid % step)
        return {
            array: ArrayLayout(
                layout.dtype,
                layout.row_shape,
                layout.chunk_rows,
                grid * max(1, layout.block_rows // grid),
                layout.dense_chunks,
            )
            for array, layout in natural.items()
        }

    def _array_layouts(self) -> dict[str, ArrayLayout]:
        layouts = {RECORD_ROWS: self._layout(_INT64, (2,), chunk_bytes=max(self.chunk_bytes, 8192))}
        if self._bound is not None:
            layouts.update(self._group_layouts(self._bound))
        return layouts

    def _array_attributes(self, name: str) -> dict[str, Any]:
        if self._bound is None or name == RECORD_ROWS:
            return {}
        for group in self._bound.groups:
            if group.array == name:
                return {"rangestream_fields": [spec.name for spec in group.fields]}
        return {}

    def _schema(self) -> dict[str, Any]:
        schema = self._bound if self._bound is not None else TemporalSchema([], [])
        return {**schema.to_json(), "index": self._index_layout().to_json()}

    def _bind_record(self, data: Any) -> TemporalArrayStorage:
        if self._bound is not None:
            return self
        bound = copy.copy(self)
        bound._bound = TemporalSchema.from_record(data, self.field_groups)
        return bound

    def _bind_schema(self, schema: dict[str, Any], where: str) -> TemporalArrayStorage:
        parsed = TemporalSchema.from_json(schema, where)
        if self._bound is None:
            bound = copy.copy(self)
            bound._bound = parsed
            return bound
        if parsed != self._bound:
            raise SchemaMismatchError(
                f"{where} was written with another schema than an earlier part: "
                f"{self._bound.difference(parsed)}"
            )
        return self

    def _shard_encoder(self) -> ShardEncoder:
        if self._bound is None:
            raise RuntimeError("the schema is fixed by the first record (see _bind_record)")
        grid = min(layout.block_rows for layout in self._group_layouts(self._bound).values())
        return _TemporalShardEncoder(self._bound, grid)

    async def _write_derived_index(self, store: ObjectStore, manifest: Manifest) -> None:
        shard_layout = manifest.arrays[RECORD_ROWS]
        ranges = [
            RowRange(manifest.array_key(int(shard), RECORD_ROWS), shard_layout, int(n), 0, int(n))
            for shard, n in zip(manifest.shard_ids, manifest.lengths[RECORD_ROWS], strict=True)
            if n
        ]
        reader = RangeReader(store, retry=self.retry)
        parts = await reader.run(read_rows(ranges, BlockIndexCache(), describe=store.describe))
        rows = (
            np.concatenate([part.reshape(-1).view(_INT64) for part in parts]).reshape(-1, 2)
            if parts
            else np.empty((0, 2), dtype=_INT64)
        )
        schema = self._bound if self._bound is not None else TemporalSchema([], [])
        _TemporalIndex(manifest, schema, rows, f"{self.url} (commit)")  # validates
        layout = self._index_layout()
        key = f"{data_prefix(manifest.commit_id)}/{INDEX_ARRAY}"
        for block in range(layout.num_blocks(len(rows))):
            piece = rows[block * layout.block_rows : (block + 1) * layout.block_rows]
            encoded = encode_block(layout, piece.view(np.uint8))
            await store.put(layout.block_key(key, block), encoded)
        attributes = {
            "description": "first and end row of each record in its shard's group arrays, "
            "shard by shard"
        }
        await store.put(f"{key}/zarr.json", dumps(array_document(layout, len(rows), attributes)))

    # -- schema (reading) ---------------------------------------------------------------------
    def _stored_schema(self, manifest: Manifest, where: str) -> tuple[TemporalSchema, ArrayLayout]:
        stored = manifest.schema
        schema = TemporalSchema.from_json(stored, where)
        index_layout = ArrayLayout.from_json(stored.get("index"), f"{where} index layout")
        if index_layout.dtype != _INT64 or index_layout.row_shape != (2,):
            raise MetadataError(f"{where}: the record index must be int64 rows of shape (2,)")
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
        wanted = {frozenset(group) for group in self.field_groups if len(group) > 1}
        if self.field_groups and schema.fields and wanted != schema.interleaved_groups:
            stored_groups = sorted(sorted(group) for group in schema.interleaved_groups)
            raise SchemaMismatchError(
                f"{self.url} stores field groups {stored_groups}, but field_groups="
                f"{[list(group) for group in self.field_groups]} was given; changing the "
                "grouping means rewriting (omit field_groups to read the stored layout)"
            )
        return schema, index_layout

    def _check_schema(self, manifest: Manifest) -> None:
        self._stored_schema(manifest, f"{self.url}/{ROOT_KEY}")

    def _open_program(self, store: ObjectStore, opened_root: list[bool]) -> ReadProgram[Any]:
        where = store.describe(ROOT_KEY)
        (raw,) = yield [ObjectRequest(ROOT_KEY, MAX_ROOT_BYTES)]
        opened_root.append(True)
        manifest = parse_root(bytes(raw), where, self.kind)
        schema, index_layout = self._stored_schema(manifest, where)
        total = int(manifest.lengths[RECORD_ROWS].sum())
        records = np.empty((0, 2), dtype=_INT64)
        if total:
            key = f"{data_prefix(manifest.commit_id)}/{INDEX_ARRAY}"
            (rows,) = yield from read_rows(
                [RowRange(key, index_layout, total, 0, total)],
                BlockIndexCache(),
                describe=store.describe,
                verify_checksums=self.verify_checksums,
            )
            records = rows.reshape(-1).view(_INT64).reshape(-1, 2).copy()
        return _TemporalIndex(manifest, schema, records, where)

    def _not_found(self, error: MissingObjectError) -> DatasetNotFoundError:
        return DatasetNotFoundError(
            f"no dataset at {self.url}: {ROOT_KEY} not found (never committed?)"
        )

    # -- per-process reading state -----------------------------------------------------------
    def _process_state(self) -> _OpenState:
        state = self._state
        if state is None or state.pid != os.getpid():  # first use, or a forked child
            with _state_lock:  # threads racing here must share one state (and one open)
                state = self._state
                if state is None or state.pid != os.getpid():
                    state = self._state = _OpenState(self)
        return state

    def _index(self) -> _TemporalIndex:
        state = self._process_state()
        index = state.index
        if index is None:
            with state.lock:
                if state.index is None:
                    opened_root: list[bool] = []
                    try:
                        state.set_index(
                            state.reader.run_sync(self._open_program(state.store, opened_root))
                        )
                    except MissingObjectError as error:
                        if opened_root:
                            raise
                        raise self._not_found(error) from error
                index = state.index
        return index

    async def _aindex(self) -> _TemporalIndex:
        state = self._process_state()
        if state.index is not None:
            return state.index
        loop = asyncio.get_running_loop()
        task = state.opening.get(loop)
        if task is None:
            task = loop.create_task(self._aopen(state))
            task.add_done_callback(_retrieve_exception)
            state.opening[loop] = task
        try:
            index = await asyncio.shield(task)  # a cancelled caller leaves the open running
        except BaseException:
            if task.done():  # the open failed: the next call tries again
                state.opening.pop(loop, None)
            raise
        if state.index is None:
            state.set_index(index)
        return state.index

    async def _aopen(self, state: _OpenState) -> _TemporalIndex:
        opened_root: list[bool] = []
        try:
            return await state.reader.run(self._open_program(state.store, opened_root))  # type: ignore[no-any-return]
        except MissingObjectError as error:
            if opened_root:
                raise
            raise self._not_found(error) from error

    # -- reading -----------------------------------------------------------------------------
    @property
    def frame_counts(self) -> np.ndarray:
        """Frames of every record (read-only ``int64``), in global shard-by-shard order."""
        return self._index().frame_counts

    def __len__(self) -> int:
        """Number of records."""
        return len(self._index().frame_counts)

    def __getitem__(self, record: int) -> dict[str, np.ndarray]:
        """The whole record: every field, all frames (negative indexes count from the end)."""
        index = self._index()
        record = _integer(record, "record")
        if record < 0:
            record += len(index.frame_counts)
        record = index.check_record(record)
        return self.read_window(record, 0, index.frame_counts.item(record))

    def read_window(
        self, record: int, start: int, frames: int, fields: Sequence[str] | None = None
    ) -> dict[str, np.ndarray]:
        """Frames ``[start, start + frames)`` of some fields of one record.

        Parameters
        ----------
        record
            Global record index (shard by shard, in append order within a shard).
        start, frames
            The window; it must lie inside the record (no padding, no truncation).
        fields
            Field names to return; ``None`` means all, ``[]`` returns ``{}`` without reading.

        Returns
        -------
        dict
            Field name to a new numpy array ``(frames, *trailing)`` with the stored dtype,
            writable and owning its memory. On a local path the window is copied out of
            memory-mapped blocks (``pread`` where a window crosses a block boundary) in the
            calling thread; elsewhere the bytes are fetched on the process's I/O loop.
        """
        state = self._state
        if state is not None and state.pid == current_pid() and state.mapped is not None:
            result = state.mapped.window(record, start, frames, fields)
            if result is not None:
                return result
        if state is None or state.index is None or state.pid != current_pid():
            self._index()
            state = self._state
            assert state is not None and state.index is not None
        index = state.index
        record, start, frames = index.check_window(record, start, frames)
        mapped = state.mapped
        if mapped is not None:
            if mapped.plans.get(None if fields is None else tuple(fields)) is None:
                mapped.plan(fields)  # validates the names; the next line uses the plan
            result = mapped.window(record, start, frames, fields)
            if result is not None:
                return result
        selection = index.selection(fields)
        if not selection.outputs:
            return {}
        program = index.window(
            record,
            start,
            frames,
            selection,
            verify=self.verify_checksums,
            describe=state.store.describe,
            serial=state.store.supports_sync_reads,
        )
        return state.reader.run_sync(program)

    async def aread_window(
        self,
        record: int,
        start: int,
        frames: int,
        fields: Sequence[str] | None = None,
        *,
        max_concurrent_reads: int = 8,
    ) -> dict[str, np.ndarray]:
        """``read_window`` for async callers; many may run at once on any event loop.

        ``max_concurrent_reads`` bounds the requests of this call in flight; the process-wide
        bound (``set_process_max_concurrency``) holds across all calls. Cancelling a call
        cancels and drains its requests. Local windows are copied out of mapped blocks
        inline (a window over ``INLINE_READ_BYTES`` in a worker thread), like small local
        reads; windows the mapped path does not serve are read as usual.
        """
        if _integer(max_concurrent_reads, "max_concurrent_reads") < 1:
            raise ValueError(f"max_concurrent_reads must be >= 1, got {max_concurrent_reads!r}")
        index = await self._aindex()
        record, start, frames = index.check_window(record, start, frames)
        state = self._process_state()
        mapped = state.mapped
        if mapped is not None:
            # Copying a window out of mapped, page-cached blocks takes microseconds, less
            # than a hop to a worker thread, so it runs inline as ``LocalStore`` runs small
            # preads inline; a window over ``INLINE_READ_BYTES`` (or one on a cold disk's
            # scale) goes to a thread so the event loop is not stalled for long.
            plan = mapped.plans.get(None if fields is None else tuple(fields))
            if plan is None:
                plan = mapped.plan(fields)
            if not plan.groups:
                return {}
            if frames * plan.frame_nbytes <= INLINE_READ_BYTES:
                result = mapped.window(record, start, frames, fields)
            else:
                result = await asyncio.to_thread(mapped.window, record, start, frames, fields)
            if result is not None:
                return result
        selection = index.selection(fields)
        if not selection.outputs:
            return {}
        program = index.window(
            record,
            start,
            frames,
            selection,
            verify=self.verify_checksums,
            describe=state.store.describe,
        )
        return await state.reader.run(program, max_concurrency=max_concurrent_reads)  # type: ignore[no-any-return]

    @property
    def fields(self) -> list[str]:
        """Field names, in the order of the first record written."""
        return self._index().schema.field_names

    @property
    def stats(self) -> IOStats:
        """Exact requests and bytes this process has issued for this storage (opening too)."""
        return self._process_state().reader.stats

    def close(self) -> None:
        """Release this process's open files or I/O-loop connections; reads reopen them."""
        state = self._state
        if state is not None and state.pid == os.getpid():
            close_store_sync(state.store)
            if state.mapped is not None:
                state.mapped.maps.clear()

    async def aclose(self) -> None:
        """Release the connections the running event loop holds (or local open files)."""
        state = self._state
        if state is None or state.pid != os.getpid():
            return
        if state.mapped is not None:
            state.mapped.maps.clear()
        if isinstance(state.store, LocalStore):
            state.store.close_files()
        else:
            await state.store.aclose()


def _retrieve_exception(task: asyncio.Task[Any]) -> None:
    if not task.cancelled():
        task.exception()  # consumed here so an open nobody awaits any more does not warn
