"""Both row copiers (compiled and numpy) give numpy's slices, for whole rows and interleaved
fields, and refuse anything outside their buffers instead of reading or writing past them."""

from __future__ import annotations

import mmap
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from rangestream.layout import copy as row_copy
from rangestream.layout.block import ArrayLayout, encode_block

NOT_BUILT = (
    "the compiled helper rangestream.layout._chunked is not built: "
    "install a C compiler and reinstall rangestream (pip install -e .)"
)


@pytest.fixture(params=["compiled", "numpy"])
def copy_rows(request: pytest.FixtureRequest) -> row_copy.CopyRows:
    """Each copier; the compiled one's absence fails rather than skips (as CI must see it)."""
    if request.param == "numpy":
        return row_copy.numpy_copy_rows
    assert row_copy.compiled(), NOT_BUILT
    return row_copy.copy_rows


def block_of(rows: np.ndarray, chunk_rows: int) -> tuple[np.ndarray, int]:
    """A block's inner chunks as the writer stores them, each with its crc, and their stride.

    The chunk index after them is cut off, so a read past the last chunk is past the buffer.
    """
    row_nbytes = rows.shape[1]
    chunks = -(-len(rows) // chunk_rows)
    layout = ArrayLayout(np.dtype(np.uint8), (row_nbytes,), chunk_rows, chunks * chunk_rows)
    stored = layout.stored_chunk_nbytes
    encoded = np.frombuffer(encode_block(layout, rows), np.uint8)
    return encoded[: chunks * stored], stored


def expected(rows: np.ndarray, start: int, count: int, low: int, high: int) -> np.ndarray:
    return np.ascontiguousarray(rows[start : start + count, low:high])


@pytest.mark.parametrize(("row_nbytes", "chunk_rows"), [(1, 1), (5, 3), (37, 32), (64, 8)])
def test_every_window_of_whole_rows_and_of_each_field_equals_numpy(
    copy_rows: row_copy.CopyRows, row_nbytes: int, chunk_rows: int
) -> None:
    total = 5 * chunk_rows + 2  # a partial last chunk
    rows = np.random.default_rng(row_nbytes).integers(0, 256, (total, row_nbytes), np.uint8)
    source, stored = block_of(rows, chunk_rows)
    fields = [(0, row_nbytes), (0, 1), (row_nbytes - 1, 1), (row_nbytes // 3, row_nbytes // 2)]
    for low, nbytes in fields:
        if nbytes <= 0:
            continue
        for start in range(total):
            for count in {1, chunk_rows, chunk_rows + 1, total - start}:
                if start + count > total:
                    continue
                target = np.full((count, nbytes), 0xEE, np.uint8)
                copy_rows(source, target, start, count, chunk_rows, stored, row_nbytes, low, nbytes)
                want = expected(rows, start, count, low, low + nbytes)
                np.testing.assert_array_equal(target, want)


def test_typed_targets_get_the_field_values(copy_rows: row_copy.CopyRows) -> None:
    """The use in temporal windows: a ``(frames, 7)`` float32 field at byte 9 of 37."""
    records = np.zeros(
        100, dtype=np.dtype([("clock", "<f8"), ("valid", "?"), ("pose", "<f4", (7,))])
    )
    records["clock"] = np.arange(100) * 0.5
    records["pose"] = np.arange(700, dtype=np.float32).reshape(100, 7)
    rows = records.view(np.uint8).reshape(100, 37)
    source, stored = block_of(rows, 32)
    pose = np.empty((50, 7), np.float32)
    copy_rows(source, pose, 30, 50, 32, stored, 37, 9, 28)
    np.testing.assert_array_equal(pose, records["pose"][30:80])
    clock = np.empty(50, "<f8")
    copy_rows(source, clock, 30, 50, 32, stored, 37, 0, 8)
    np.testing.assert_array_equal(clock, records["clock"][30:80])


def test_a_mapped_file_is_a_valid_source_and_stays_open_while_exported(
    copy_rows: row_copy.CopyRows, tmp_path: Path
) -> None:
    rows = np.arange(64 * 16, dtype=np.uint8).reshape(64, 16)
    source, stored = block_of(rows, 8)
    path = tmp_path / "block"
    path.write_bytes(source.tobytes())
    with open(path, "rb") as handle:
        mapping = mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ)
    target = np.empty((20, 16), np.uint8)
    copy_rows(mapping, target, 5, 20, 8, stored, 16, 0, 16)
    np.testing.assert_array_equal(target, rows[5:25])
    mapping.close()  # nothing is exported after the call: closing works


@pytest.mark.parametrize(
    ("start", "count", "low", "nbytes", "target_rows"),
    [
        (0, 65, 0, 16, 65),  # one row past the block
        (60, 5, 0, 16, 5),  # ends past the block
        (-1, 2, 0, 16, 2),  # negative start
        (0, 0, 0, 16, 0),  # no rows
        (0, 4, 10, 8, 4),  # the field reaches past its row
        (0, 4, -1, 4, 4),  # negative field offset
        (0, 4, 0, 16, 3),  # target one row short
        (0, 4, 0, 16, 5),  # target one row long
        (2**62, 2, 0, 16, 2),  # offsets that would overflow
        (0, 2**62, 0, 16, 2),
    ],
)
def test_rows_or_targets_that_do_not_fit_raise_before_copying(
    copy_rows: row_copy.CopyRows, start: int, count: int, low: int, nbytes: int, target_rows: int
) -> None:
    rows = np.arange(64 * 16, dtype=np.uint8).reshape(64, 16)
    source, stored = block_of(rows, 8)
    target = np.full(target_rows * nbytes, 0xEE, np.uint8)
    with pytest.raises(ValueError, match="do not fit"):
        copy_rows(source, target, start, count, 8, stored, 16, low, nbytes)
    assert (target == 0xEE).all()


@pytest.mark.parametrize(
    ("chunk_rows", "stored", "row_nbytes"),
    [(0, 132, 16), (8, 100, 16), (8, 132, 0), (2**40, 132, 16), (8, 2**62, 16)],
)
def test_impossible_geometry_raises(
    copy_rows: row_copy.CopyRows, chunk_rows: int, stored: int, row_nbytes: int
) -> None:
    source = np.zeros(8 * 132, np.uint8)
    target = np.empty(10 * 16, np.uint8)
    with pytest.raises(ValueError, match="do not fit"):  # rows 0..9: across a chunk
        copy_rows(source, target, 0, 10, chunk_rows, stored, row_nbytes, 0, 16)


def test_wrong_arguments_raise_type_errors(copy_rows: row_copy.CopyRows) -> None:
    source = np.zeros(132, np.uint8)
    target = np.empty(16, np.uint8)
    with pytest.raises(TypeError, match=r"9 arguments, 3 given|missing 6 required"):
        copy_rows(source, target, 0)  # type: ignore[call-arg]
    with pytest.raises(TypeError):
        copy_rows(source, target, 0.5, 1, 8, 132, 16, 0, 16)  # type: ignore[arg-type]
    with pytest.raises(BufferError):  # bytes are read-only: not a target
        copy_rows(source, bytes(16), 0, 1, 8, 132, 16, 0, 16)
    with pytest.raises((TypeError, BufferError, ValueError)):  # a strided view: not contiguous
        copy_rows(source, np.empty(32, np.uint8)[::2], 0, 1, 8, 132, 16, 0, 16)


@pytest.fixture(params=["compiled", "numpy"])
def copy_piece(request: pytest.FixtureRequest) -> row_copy.CopyPiece:
    if request.param == "numpy":
        return row_copy.numpy_copy_piece
    assert row_copy.compiled(), NOT_BUILT
    return row_copy.copy_piece


def test_a_piece_is_copied_to_every_output_and_counted_once_when_its_chunks_are_verified(
    copy_piece: row_copy.CopyPiece,
) -> None:
    records = np.zeros(
        64, dtype=np.dtype([("clock", "<f8"), ("valid", "?"), ("pose", "<f4", (7,))])
    )
    records["clock"] = np.arange(64) * 0.25
    records["pose"] = np.arange(64 * 7, dtype=np.float32).reshape(64, 7)
    source, stored = block_of(records.view(np.uint8).reshape(64, 37), 8)
    verified = bytearray(8)
    counter = [3, 100]
    clock, pose = np.full(20, -1.0), np.full((20, 7), -1.0, np.float32)
    outputs = ((clock, 0, 8), (pose, 9, 28))
    assert copy_piece(source, outputs, 5, 20, 8, stored, 37, verified, counter) == 1
    assert counter == [3, 100] and (clock == -1).all()  # nothing done before verification
    verified[0:4] = b"\x01" * 4  # rows 5..24 lie in chunks 0..3
    assert copy_piece(source, outputs, 5, 20, 8, stored, 37, verified, counter) == 0
    assert counter == [4, 100 + 4 * stored]
    np.testing.assert_array_equal(clock, records["clock"][5:25])
    np.testing.assert_array_equal(pose, records["pose"][5:25])
    assert copy_piece(source, ((clock, 0, 8),), 5, 20, 8, stored, 37, None, counter) == 0
    assert counter == [5, 100 + 8 * stored]  # no flags: checksums off, still counted


def test_a_piece_outside_its_source_or_target_is_refused_before_anything(
    copy_piece: row_copy.CopyPiece,
) -> None:
    rows = np.arange(64 * 16, dtype=np.uint8).reshape(64, 16)
    source, stored = block_of(rows, 8)
    counter = [0, 0]
    verified = bytearray(b"\x01" * 8)
    short = source[: 3 * stored]  # chunks 0..2 only
    target = np.full((20, 16), 0xEE, np.uint8)
    assert copy_piece(short, ((target, 0, 16),), 10, 20, 8, stored, 16, verified, counter) == 2
    assert (
        copy_piece(source, ((target[:10], 0, 16),), 10, 20, 8, stored, 16, verified, counter) == 2
    )
    assert copy_piece(source, ((target, 0, 16),), 60, 20, 8, stored, 16, verified, counter) == 2
    assert counter == [0, 0] and (target == 0xEE).all()
    with pytest.raises((TypeError, ValueError, BufferError)):
        copy_piece(source, ((bytes(320), 0, 16),), 0, 20, 8, stored, 16, verified, counter)


def test_a_piece_whose_file_is_shorter_now_is_gone_and_not_counted(
    copy_piece: row_copy.CopyPiece,
) -> None:
    """``size_now`` says the file was cut before the piece's end (a small source: the
    piece ends in its last page, so even the compiled copier asks)."""
    rows = np.arange(64 * 16, dtype=np.uint8).reshape(64, 16)
    source, stored = block_of(rows, 8)
    counter = [0, 0]
    verified = bytearray(b"\x01" * 8)
    target = np.zeros((20, 16), np.uint8)
    args = (source, ((target, 0, 16),), 10, 20, 8, stored, 16, verified, counter)
    assert copy_piece(*args, lambda: 3 * stored) == 3  # rows 10..29 need chunks 1..3
    assert counter == [0, 0]
    assert copy_piece(*args, lambda: 4 * stored) == 0  # still there
    assert counter == [1, 3 * stored]
    np.testing.assert_array_equal(target, rows[10:30])


def _copy_out_of_a_truncated_mapping(path: str, queue: Any) -> None:
    page = mmap.PAGESIZE
    with open(path, "rb") as handle:
        mapping = mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ)
    data = np.frombuffer(mapping, dtype=np.uint8)
    stored = page  # one "chunk" per page: rows of page - 4 bytes
    results = []
    with open(path, "r+b") as handle:
        handle.truncate(page + 100)  # page 0 whole, page 1 cut, pages 2.. gone
    for chunk in (3, 1, 0):  # wholly past the end; in the cut page; before the cut
        target = np.zeros(page - 4, np.uint8)
        status = row_copy.copy_piece(data, ((target, 0, page - 4),), chunk, 1, 1, stored,
                                     page - 4, None, [0, 0], mapping.size)  # fmt: skip
        results.append((status, bool((target == (chunk % 251)).all())))
    queue.put(results)


def test_the_compiled_copier_survives_a_mapping_truncated_under_it(tmp_path: Path) -> None:
    """A page wholly past the new end faults (SIGBUS): the guard turns it into status 3;
    the cut page would read as zeros: the byte read past the piece faults, status 3 too."""
    import multiprocessing

    assert row_copy.compiled(), NOT_BUILT
    page = mmap.PAGESIZE
    path = tmp_path / "block"
    path.write_bytes(b"".join(bytes([k % 251]) * page for k in range(6)))
    context = multiprocessing.get_context("fork")
    queue = context.Queue()
    child = context.Process(target=_copy_out_of_a_truncated_mapping, args=(str(path), queue))
    child.start()
    child.join(60)
    assert child.exitcode == 0, f"the copier died (exit code {child.exitcode}, -7 is SIGBUS)"
    assert queue.get(timeout=5) == [(3, False), (3, False), (0, True)]


@pytest.fixture(params=["compiled", "numpy"])
def copy_bytes(request: pytest.FixtureRequest) -> row_copy.CopyBytes:
    if request.param == "numpy":
        return row_copy.numpy_copy_bytes
    assert row_copy.compiled(), NOT_BUILT
    return row_copy.copy_bytes


@pytest.mark.parametrize(("row_nbytes", "chunk_rows"), [(1, 1), (1, 512), (5, 3), (37, 32)])
def test_rows_as_bytes_equal_numpy_for_every_run_once_verified(
    copy_bytes: row_copy.CopyBytes, row_nbytes: int, chunk_rows: int
) -> None:
    rng = np.random.default_rng(row_nbytes * 1000 + chunk_rows)
    count = 4 * chunk_rows + 3
    rows = rng.integers(0, 256, (count, row_nbytes), dtype=np.uint8)
    source, stored = block_of(rows, chunk_rows)
    chunks = -(-count // chunk_rows)
    verified = bytearray(b"\x01" * chunks)
    runs = [(0, count), (count - 1, 1), (0, 0), (count, 0)]
    starts, lengths = rng.integers(0, count, 40), rng.integers(1, 2 * chunk_rows + 2, 40)
    runs += [(int(a), int(n)) for a, n in zip(starts, lengths, strict=True)]
    for start, n in runs:
        n = min(n, count - start)
        want = rows[start : start + n].tobytes()
        for flags in (verified, None):
            got = copy_bytes(source, start, n, chunk_rows, stored, row_nbytes, flags)
            assert type(got) is bytes and got == want
            assert copy_bytes(source, start, n, chunk_rows, stored, row_nbytes, flags,
                              lambda: source.size) == want  # fmt: skip


def test_rows_as_bytes_wait_for_verification_and_stay_inside_the_source(
    copy_bytes: row_copy.CopyBytes,
) -> None:
    rows = np.arange(64 * 16, dtype=np.uint8).reshape(64, 16)
    source, stored = block_of(rows, 8)
    verified = bytearray(8)
    assert copy_bytes(source, 10, 20, 8, stored, 16, verified) == 1  # chunks 1..3 unchecked
    verified[1:4] = b"\x01" * 3
    assert copy_bytes(source, 10, 20, 8, stored, 16, verified) == rows[10:30].tobytes()
    assert copy_bytes(source[: 3 * stored], 10, 20, 8, stored, 16, None) == 2  # chunk 3 cut
    assert copy_bytes(source, 60, 5, 8, stored, 16, None) == 2  # rows past the block
    assert copy_bytes(source, -1, 5, 8, stored, 16, None) == 2
    assert copy_bytes(source, 0, -1, 8, stored, 16, None) == 2
    assert copy_bytes(source, 0, 4, 8, stored, 16, bytearray(0)) == 2  # flags too few
    assert copy_bytes(source, 0, 0, 8, stored, 16, bytearray(0)) == b""
    assert copy_bytes(source, 10, 20, 8, stored, 16, None, lambda: 3 * stored) == 3  # cut now
    assert copy_bytes(source, 10, 20, 8, stored, 16, None, lambda: 4 * stored) == (
        rows[10:30].tobytes()
    )


def _bytes_out_of_a_truncated_mapping(path: str, queue: Any) -> None:
    page = mmap.PAGESIZE
    with open(path, "rb") as handle:
        mapping = mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ)
    data = np.frombuffer(mapping, dtype=np.uint8)
    with open(path, "r+b") as handle:
        handle.truncate(page + 100)  # page 0 whole, page 1 cut, pages 2.. gone
    results = []
    for chunk in (3, 1, 0):  # wholly past the end; in the cut page; before the cut
        got = row_copy.copy_bytes(data, chunk, 1, 1, page, page - 4, None, mapping.size)
        results.append(got if isinstance(got, int) else got == bytes([chunk % 251]) * (page - 4))
    queue.put(results)


def test_compiled_rows_as_bytes_survive_a_mapping_truncated_under_them(tmp_path: Path) -> None:
    """As ``copy_piece``: a fault past the new end, or the zeros of the cut page, is status 3."""
    import multiprocessing

    assert row_copy.compiled(), NOT_BUILT
    page = mmap.PAGESIZE
    path = tmp_path / "block"
    path.write_bytes(b"".join(bytes([k % 251]) * page for k in range(6)))
    context = multiprocessing.get_context("fork")
    queue = context.Queue()
    child = context.Process(target=_bytes_out_of_a_truncated_mapping, args=(str(path), queue))
    child.start()
    child.join(60)
    assert child.exitcode == 0, f"the copier died (exit code {child.exitcode}, -7 is SIGBUS)"
    assert queue.get(timeout=5) == [3, 3, True]
