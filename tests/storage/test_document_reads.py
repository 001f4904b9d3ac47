"""The mapped path of local document reads (``OpenedDocuments.read_mapped``): the read
program's documents, errors and request counts, from mapped blocks in one pass."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from support.copies import Copies

from rangestream import DocumentStorage, RecordField, RecordFormat
from rangestream.errors import ChecksumError, OutOfRangeError
from rangestream.io import IOStats
from rangestream.types import DocumentStorageFormat

#: Small blocks so that documents cross block boundaries; 512-byte heap chunks (default).
LAYOUT = {"block_bytes": 1 << 14}


class RawBytes(DocumentStorageFormat[bytes, tuple[int, bytes]]):
    def pack(self, data: bytes) -> bytes:
        return data

    def unpack(self, encoded_data: Any, shard: int) -> tuple[int, bytes]:
        return shard, bytes(encoded_data)


def documents(count: int, seed: int) -> list[bytes]:
    rng = np.random.default_rng(seed)
    sizes = rng.integers(0, 3000, count)
    sizes[::17] = 0  # empty documents among them
    return [rng.integers(0, 256, int(n), dtype=np.uint8).tobytes() for n in sizes]


def write(path: Path, docs: list[bytes], shards: int = 3, **options: Any) -> None:
    storage = DocumentStorage(path, RawBytes(), **LAYOUT, **options)
    per_shard = -(-len(docs) // shards)
    with storage.sync_writer() as writer:
        for i, doc in enumerate(docs):
            writer.append(i // per_shard, doc)


def readers(path: Path, **options: Any) -> tuple[Any, Any]:
    """(mapped reader, the same dataset read by the program with ``pread``)."""
    mapped = DocumentStorage(path, RawBytes(), **options).sync_reader()
    program = DocumentStorage(path, RawBytes(), mapped=False, **options).sync_reader()
    assert mapped.opened.mapped is not None and program.opened.mapped is None
    return mapped, program


def spent(reader: Any, call: Any) -> tuple[Any, IOStats]:
    before = reader.stats.copy()
    got = call()
    return got, reader.stats - before


def test_batches_match_the_program_in_documents_and_exact_request_counts(
    tmp_path: Path, copies: Copies
) -> None:
    docs = documents(600, seed=1)
    write(tmp_path / "ds", docs)
    per_shard = 200
    expected = [(i // per_shard, doc) for i, doc in enumerate(docs)]
    mapped, program = readers(tmp_path / "ds")
    for reader in (mapped, program):  # every offsets chunk kept: one heap round per batch
        assert reader.read_many(list(range(600))) == expected
    heap_rows = mapped.opened.manifest.arrays["payload_heap"].block_rows
    ends = np.cumsum([0] + [len(d) for d in docs])
    crossing = [
        i
        for i in range(600)
        if docs[i] and (ends[i] // heap_rows != (ends[i + 1] - 1) // heap_rows)
    ]
    assert crossing  # the batches below include documents read as two pieces
    rng = np.random.default_rng(2)
    batches = [rng.integers(-600, 600, int(n)).tolist() for n in rng.integers(1, 40, 30)]
    batches += [crossing[:8], [5, 5, 5], [0, 17, 34], list(range(300, 340))]
    for batch in batches:
        assert mapped.opened.read_mapped(batch) is not None  # served by the mapped path
        got, mapped_spent = spent(mapped, lambda b=batch: mapped.read_many(b))
        want, program_spent = spent(program, lambda b=batch: program.read_many(b))
        assert got == want == [expected[i] for i in batch]
        assert mapped_spent == program_spent
        assert set(mapped_spent.by_key_kind) <= {"payload_heap"}
    as_array, array_spent = spent(mapped, lambda: mapped.read_many(np.asarray(crossing[:5])))
    assert as_array == [expected[i] for i in crossing[:5]]
    assert array_spent == spent(program, lambda: program.read_many(crossing[:5]))[1]
    scalars = list(np.asarray([3, -2, 3], dtype=np.int32))  # numpy integers in a list
    assert mapped.opened.read_mapped(scalars) is not None
    assert mapped.read_many(scalars) == program.read_many(scalars) == [expected[i] for i in scalars]
    got, one = spent(mapped, lambda: mapped.read(-1))
    assert got == expected[-1] and one == spent(program, lambda: program.read(-1))[1]
    if copies.kind == "compiled":  # one compiled copy per piece of a non-empty document
        calls = copies.calls
        mapped.read_many([*crossing[:3], 0, 17])  # documents 0 and 17 are empty
        assert copies.calls - calls == 6


def test_offsets_not_kept_are_read_by_the_mapped_path_as_the_program_reads_them(
    tmp_path: Path, copies: Copies
) -> None:
    docs = documents(400, seed=3)
    write(tmp_path / "ds", docs, shards=1)
    mapped, program = readers(tmp_path / "ds")
    batch = [3, 390, 200, 127]  # offsets chunks 0, 1 (document 127 ends there) and 3: cold
    got, mapped_spent = spent(mapped, lambda: mapped.opened.read_mapped(batch))
    want, program_spent = spent(program, lambda: program.read_many(batch))
    assert got == want == [(0, docs[i]) for i in batch]
    assert mapped_spent == program_spent
    assert mapped_spent.by_key_kind["payload_offsets"] == 1  # chunks 0, 1 and 3: coalesced
    assert len(mapped.opened.offsets) == 3  # kept now: the next batch reads only the heap
    again, warm = spent(mapped, lambda: mapped.opened.read_mapped([128, 2]))
    assert again == [(0, docs[128]), (0, docs[2])] and set(warm.by_key_kind) == {"payload_heap"}


def test_offsets_that_would_evict_kept_ones_go_to_the_program(tmp_path: Path) -> None:
    from rangestream.storage.document.offset_chunks import OffsetChunks

    docs = documents(400, seed=3)
    write(tmp_path / "ds", docs, shards=1)
    budget = {"offsets_cache_bytes": 2 * OffsetChunks(0, 128).slot_nbytes}  # two chunks
    mapped, program = readers(tmp_path / "ds", **budget)
    batch = [3, 390, 200, 127]  # three chunks to read: more than the cache holds
    assert mapped.opened.read_mapped(batch) is None  # nothing read or counted
    assert mapped.stats.by_key_kind.keys() == {"zarr.json"}
    got, mapped_spent = spent(mapped, lambda: mapped.read_many(batch))
    want, program_spent = spent(program, lambda: program.read_many(batch))
    assert got == want == [(0, docs[i]) for i in batch]
    assert mapped_spent == program_spent


def test_out_of_range_and_non_integer_indexes_fail_as_the_program_fails(tmp_path: Path) -> None:
    write(tmp_path / "ds", documents(50, seed=4), shards=1)
    mapped, _ = readers(tmp_path / "ds")
    mapped.read_many(list(range(50)))
    for batch in ([0, 50], [-51]):
        assert mapped.opened.read_mapped(batch) is None
        with pytest.raises(OutOfRangeError, match="outside the 50 documents"):
            mapped.read_many(batch)
    assert mapped.opened.read_mapped([True, 1]) is None
    with pytest.raises(TypeError, match="document index must be an integer"):
        mapped.read_many([True, 1])
    assert mapped.opened.read_mapped([]) is None and mapped.read_many([]) == []


def test_a_damaged_chunk_fails_with_the_programs_error_and_counts(tmp_path: Path) -> None:
    docs = [bytes([i % 251]) * 700 for i in range(100)]
    write(tmp_path / "ds", docs, shards=1)
    root = json.loads((tmp_path / "ds" / "zarr.json").read_bytes())["attributes"]["rangestream"]
    block = next((tmp_path / "ds" / root["data_prefix"]).glob("shards/0/payload_heap/c/1"))
    mapped, program = readers(tmp_path / "ds")
    heap = mapped.opened.manifest.arrays["payload_heap"]
    data = bytearray(block.read_bytes())
    data[heap.stored_chunk_nbytes + 100] ^= 0xFF  # inner chunk 1 of heap block 1
    block.write_bytes(bytes(data))
    victim = (heap.block_rows + heap.chunk_rows + 100) // 700  # the document holding it
    failures = []
    for reader in (mapped, program):
        reader.read_many([0, 99])  # offsets kept (one chunk of 128), block 1 not touched
        assert reader is program or reader.opened.read_mapped([victim - 4]) is not None
        before = reader.stats.copy()
        with pytest.raises(ChecksumError, match=r"payload_heap/c/1 .*inner chunk 1 "):
            reader.read_many([victim, 2])
        failures.append(reader.stats - before)
        assert reader.read(victim + 3) == (0, docs[victim + 3])  # other chunks still read
    assert failures[0] == failures[1] and failures[0].by_key_kind == {"payload_heap": 2}


def test_keys_of_small_records_are_read_whole_from_the_mapping(tmp_path: Path) -> None:
    fields = RecordFormat(
        [RecordField("tokens", np.dtype("<i4")), RecordField("id", np.dtype("<i8"), ndim=0)]
    )
    storage = DocumentStorage(tmp_path / "rec", fields, **LAYOUT)
    with storage.sync_writer() as writer:
        for i in range(300):
            writer.append(i % 2, {"tokens": np.arange(i % 50, dtype="<i4"), "id": np.int64(i)})
    mapped = DocumentStorage(tmp_path / "rec").sync_reader()
    program = DocumentStorage(tmp_path / "rec", mapped=False).sync_reader()
    for reader in (mapped, program):
        reader.read_many(list(range(300)))
    batch = [299, 0, 151, 150, 7]
    assert mapped.opened.read_mapped(batch, ["id"]) is not None
    for keys in (["id"], None, ["tokens", "id"]):
        got, mapped_spent = spent(mapped, lambda k=keys: mapped.read_many(batch, k))
        want, program_spent = spent(program, lambda k=keys: program.read_many(batch, k))
        assert mapped_spent == program_spent
        for record, other in zip(got, want, strict=True):
            assert record.keys() == other.keys()
            for key in record:
                np.testing.assert_array_equal(record[key], other[key])
        # global order: shard 0's records (even appends), then shard 1's (odd ones)
        assert [int(r["id"]) for r in got] == [2 * j if j < 150 else 2 * (j - 150) + 1
                                               for j in batch]  # fmt: skip


def test_the_async_reader_takes_the_mapped_path_too(tmp_path: Path) -> None:
    docs = documents(300, seed=5)
    write(tmp_path / "ds", docs)
    expected = [(i // 100, doc) for i, doc in enumerate(docs)]
    storage = DocumentStorage(tmp_path / "ds", RawBytes())

    async def main() -> tuple[list[Any], IOStats, bool]:
        async with storage.async_reader() as reader:
            await reader.read_many(list(range(300)))
            before = reader.stats.copy()
            got = await reader.read_many([5, 250, -1, 101])
            one = await reader.read(7)
            used = reader.stats - before
            return [*got, one], used, reader.opened.read_mapped([1]) is not None

    got, async_spent, served = asyncio.run(main())
    _, program = readers(tmp_path / "ds")
    program.read_many(list(range(300)))
    want, program_spent = spent(
        program, lambda: [*program.read_many([5, 250, -1, 101]), program.read(7)]
    )
    assert served and got == want == [expected[i] for i in (5, 250, -1, 101, 7)]
    assert async_spent == program_spent


class SeenTypes(RawBytes):
    """Raw bytes that note the type each ``unpack`` was handed."""

    def __init__(self) -> None:
        self.seen: list[type] = []

    def unpack(self, encoded_data: Any, shard: int) -> tuple[int, bytes]:
        self.seen.append(type(encoded_data))
        return super().unpack(encoded_data, shard)


def test_unpack_gets_bytes_on_both_paths_and_unverified_chunks_are_checked_once(
    tmp_path: Path, copies: Copies
) -> None:
    """Offsets kept, heap chunks never read: the mapped path checks each chunk it touches
    (crc32c, once per process) and hands ``unpack`` a ``bytes``, as the program does."""
    docs = documents(300, seed=6)
    write(tmp_path / "ds", docs, shards=1)
    seen = {}
    got = {}
    for name, mapped in (("mapped", True), ("program", False)):
        storage_format = SeenTypes()
        reader = DocumentStorage(tmp_path / "ds", storage_format, mapped=mapped).sync_reader()
        reader.read(0)  # offsets chunk 0 (documents 0..127) kept; heap block 0 chunk 0 read
        if mapped:
            heap_block = reader.opened.mapped.maps.entries()
            flags = [m.verified for m in heap_block.values() if len(m.verified) > 1]
            assert flags and sum(flags[0]) == 1  # only the chunk of document 0 checked yet
            assert reader.opened.read_mapped([1]) is not None
        batch = [120, 3, 3, 64, 17, 1]  # unsorted, repeated, empty (17)
        got[name] = spent(reader, lambda r=reader, b=batch: r.read_many(b))
        seen[name] = storage_format.seen
    assert got["mapped"] == got["program"]
    assert got["mapped"][0] == [(0, docs[i]) for i in [120, 3, 3, 64, 17, 1]]
    # read(0), read_mapped([1]) on the mapped reader only, then the batch
    assert seen["mapped"] == [bytes] * 8 and seen["program"] == [bytes] * 7


def _read_after_truncating(path: str, block: str, cut: int, queue: Any) -> None:
    """In a child (a SIGBUS kills it, not the test): map and verify a heap block, cut it,
    then read a batch lying past the cut, and one before it."""
    reader = DocumentStorage(path, RawBytes()).sync_reader()
    reader.read_many(list(range(40)))  # offsets kept, block 0 mapped and verified
    outcomes: list[Any] = [reader.opened.read_mapped([18, 19]) is not None]  # the mapped path
    with open(block, "r+b") as handle:
        handle.truncate(cut)
    for batch in ([18, 19], [0, 1]):
        try:
            got = reader.read_many(batch)
        except Exception as error:  # the test compares what it was
            outcomes.append((type(error).__name__, str(error)))
        else:
            outcomes.append(("read", got))
    queue.put(outcomes)


def test_a_heap_block_truncated_while_mapped_fails_as_the_program_names_it(
    tmp_path: Path, copies: Copies
) -> None:
    import multiprocessing

    docs = [bytes([i]) * 700 for i in range(40)]  # 28,000 bytes: heap blocks 0 and 1
    write(tmp_path / "ds", docs, shards=1)
    root = json.loads((tmp_path / "ds" / "zarr.json").read_bytes())["attributes"]["rangestream"]
    block = next((tmp_path / "ds" / root["data_prefix"]).glob("shards/0/payload_heap/c/0"))
    # block 0 holds heap bytes [0, 15,872): documents 18 and 19 at [12,600, 14,000) lie in
    # its stored chunks 24..27, past the cut in pages wholly gone
    cut = 3 * 4096
    context = multiprocessing.get_context("fork")
    queue = context.Queue()
    child = context.Process(
        target=_read_after_truncating, args=(str(tmp_path / "ds"), str(block), cut, queue)
    )
    child.start()
    child.join(120)
    assert child.exitcode == 0, f"the reader died (exit code {child.exitcode}, -7 is SIGBUS)"
    served, past, before = queue.get(timeout=5)
    assert served
    assert past[0] == "TruncatedObjectError" and str(block) in past[1]
    assert before == ("read", [(0, docs[0]), (0, docs[1])])


def test_kept_offsets_give_each_documents_pair_across_chunks_and_shards() -> None:
    from rangestream.storage.document.offset_chunks import PART_SHIFT, OffsetChunks

    rng = np.random.default_rng(7)
    shards = [np.concatenate([[0], np.cumsum(rng.integers(0, 900, n))]) for n in (10, 7)]
    kept = OffsetChunks(1 << 20, 4)  # chunks of 4 offsets: documents 3, 7 end in the next
    for position, offsets in enumerate(shards):
        for chunk in range(-(-len(offsets) // 4)):
            kept.put((position << PART_SHIFT) + chunk, offsets[4 * chunk : 4 * chunk + 4])
    located = [(0, 3), (1, 6), (0, 0), (1, 3), (0, 9), (0, 3), (1, 0)]
    want = [int(v) for part, row in located for v in shards[part][row : row + 2]]
    keys = [part << PART_SHIFT for part, _ in located]
    assert kept.pairs(keys, [row for _, row in located]) == want
    assert kept.value(1 << PART_SHIFT, 2) == int(shards[1][2])
    partial = OffsetChunks(1 << 20, 4)
    partial.put(0, shards[0][:4])  # chunk 0 only: document 3 ends in chunk 1, not kept
    first = [int(v) for v in shards[0][:4]]
    assert partial.pairs([0, 0], [1, 2]) == [first[1], first[2], first[2], first[3]]
    assert partial.pairs([0], [3]) is None and partial.pairs([0], [4]) is None


def test_damaged_offsets_read_cold_fail_with_the_programs_error_and_counts(
    tmp_path: Path,
) -> None:
    from rangestream.errors import CorruptDataError
    from rangestream.layout.block import ArrayLayout, encode_block

    docs = [bytes([i]) * 20 for i in range(10)]
    write(tmp_path / "ds", docs, shards=1)
    root = json.loads((tmp_path / "ds" / "zarr.json").read_bytes())["attributes"]["rangestream"]
    block = next((tmp_path / "ds" / root["data_prefix"]).glob("shards/0/payload_offsets/c/0"))
    layout = ArrayLayout.from_json(root["arrays"]["payload_offsets"], "offsets").stored_for(11)
    offsets = np.arange(11, dtype="<i8") * 20
    offsets[4] = 200  # document 3 ends after document 4 starts: the chunk is not kept
    block.write_bytes(encode_block(layout, offsets.view(np.uint8)))
    mapped, program = readers(tmp_path / "ds")
    outcomes = []
    for reader in (mapped, program):
        before = reader.stats.copy()
        with pytest.raises(CorruptDataError, match="document 4 spans \\[200, 100\\)"):
            reader.read_many([1, 4])
        outcomes.append(reader.stats - before)
        # documents whose offsets are sound are still read, from the same damaged chunk
        assert reader.read_many([7, 1]) == [(0, docs[7]), (0, docs[1])]
    assert outcomes[0] == outcomes[1] and outcomes[0].by_key_kind == {"payload_offsets": 1}
    assert len(mapped.opened.offsets) == 0  # never kept
