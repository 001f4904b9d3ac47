"""Records into a stream with metadata: a format's ``pack`` checked, then encoded as rows.

The write half of :mod:`rangestream.storage.stream.with_meta`: everything a record must
satisfy is checked in :func:`pack_record` before the writer stores anything, and
:class:`MetaShardEncoder` turns one packed record into the rows of the shard's five arrays.
"""

from __future__ import annotations

from collections.abc import Generator, Hashable, Mapping
from typing import Any

import numpy as np

from rangestream.errors import InvalidRecordError
from rangestream.storage.core.kind import ShardEncoder
from rangestream.storage.stream.storage import check_stream_array
from rangestream.types import StreamWithMetaStorageFormat

_INT64 = np.dtype("<i8")
_UINT8 = np.dtype("u1")


class _NoKey:
    """The key before the first element: equal to nothing a format can yield."""


_NO_KEY = _NoKey()


def pack_record(
    storage_format: StreamWithMetaStorageFormat[Any, Any, Any], data: Any
) -> tuple[np.ndarray, np.ndarray, list[bytes]]:
    """Run the format's ``pack`` on one record and check it against the packing contract.

    Everything is validated here, before the writer stores anything, so a bad record
    raises ``InvalidRecordError`` and leaves the shard as it was.

    Parameters
    ----------
    storage_format
        The format whose ``size`` and ``pack`` encode the record.
    data
        The record passed to ``append``.

    Returns
    -------
    tuple
        ``(stream, run_lengths, payloads)``: the stream array, the element count of each
        run of equal consecutive keys (int64) and each run's payload, in order.

    Raises
    ------
    InvalidRecordError
        If ``size`` is not a non-negative integer, ``pack`` is not a generator, it yields
        something other than ``(key, payload)`` pairs or a different count than ``size``,
        a key reappears after its run ended, a run starts without a payload, a payload is
        not bytes-like or differs from its run's first payload, or the returned stream
        array has the wrong type, shape, dtype or length.
    """
    who = type(storage_format).__name__
    size = storage_format.size(data)
    if isinstance(size, bool) or not isinstance(size, (int, np.integer)) or size < 0:
        raise InvalidRecordError(f"{who}.size must return a non-negative int, got {size!r}")
    size = int(size)
    generator = storage_format.pack(data)
    if not isinstance(generator, Generator):
        raise InvalidRecordError(
            f"{who}.pack must be a generator that yields one (key, payload) pair per element "
            f"and returns the stream array; it returned {type(generator).__name__}"
        )
    run_lengths: list[int] = []
    payloads: list[bytes] = []
    ended: set[Hashable] = set()
    key: Hashable = _NO_KEY
    count = 0
    try:
        while True:
            try:
                item = next(generator)
            except StopIteration as stop:
                stream = stop.value
                break
            if isinstance(item, np.ndarray):
                raise InvalidRecordError(
                    f"{who}.pack yielded a numpy array as element {count}: return the stream "
                    "array from the generator ('return tokens'), do not yield it"
                )
            if count == size:
                raise InvalidRecordError(
                    f"{who}.pack yielded more than size(data) = {size} (key, payload) pairs"
                )
            if not isinstance(item, (tuple, list)) or len(item) != 2:
                raise InvalidRecordError(
                    f"{who}.pack must yield (key, payload) pairs; element {count} is {item!r:.80}"
                )
            new_key, payload = item
            try:
                hash(new_key)
            except TypeError as error:
                raise InvalidRecordError(
                    f"{who}.pack: the key of element {count} ({new_key!r:.80}) is not hashable"
                ) from error
            if payload is not None and not isinstance(payload, (bytes, bytearray, memoryview)):
                raise InvalidRecordError(
                    f"{who}.pack: the payload of element {count} must be bytes, bytearray, "
                    f"memoryview or None, got {type(payload).__name__}"
                )
            if key is not _NO_KEY and bool(new_key == key):
                if payload is not None and bytes(payload) != payloads[-1]:
                    raise InvalidRecordError(
                        f"{who}.pack: element {count} repeats key {new_key!r:.80} with a "
                        "payload that differs from the one its run started with; a run "
                        "shares one payload (yield None for the run's later elements)"
                    )
                run_lengths[-1] += 1
            else:
                if new_key in ended:
                    raise InvalidRecordError(
                        f"{who}.pack: key {new_key!r:.80} reappears at element {count} after "
                        "its run ended; equal keys must be contiguous ([0, 0, 1] is valid, "
                        "[0, 1, 0] is not)"
                    )
                if payload is None:
                    raise InvalidRecordError(
                        f"{who}.pack: element {count} starts the run of key {new_key!r:.80} "
                        "but has no payload; the first element of a run must carry it"
                    )
                if key is not _NO_KEY:
                    ended.add(key)
                key = new_key
                run_lengths.append(1)
                payloads.append(bytes(payload))
            count += 1
    finally:
        generator.close()
    if count != size:
        raise InvalidRecordError(
            f"{who}.pack yielded {count} (key, payload) pairs, but size(data) is {size}"
        )
    if stream is None:
        raise InvalidRecordError(
            f"{who}.pack returned None: return the stream array from the generator "
            "('return tokens' after the last yield)"
        )
    check_stream_array(stream, storage_format.stream_dtype, who)
    if len(stream) != size:
        raise InvalidRecordError(
            f"{who}.pack returned {len(stream)} stream elements, but size(data) is {size}"
        )
    return stream, np.asarray(run_lengths, dtype=_INT64), payloads


class MetaShardEncoder(ShardEncoder):
    def __init__(
        self, storage_format: StreamWithMetaStorageFormat[Any, Any, Any], run_chunk_rows: int
    ) -> None:
        self.format = storage_format
        self.run_chunk_rows = run_chunk_rows

    def initial_rows(self) -> Mapping[str, np.ndarray]:
        return {"runs": np.zeros((1, 2), _INT64), "run_index": np.zeros((1, 2), _INT64)}

    def encode(self, data: Any, lengths: Mapping[str, int]) -> Mapping[str, np.ndarray]:
        stream, run_lengths, payloads = pack_record(self.format, data)
        heap = np.frombuffer(b"".join(payloads), dtype=_UINT8)
        runs = np.empty((len(run_lengths), 2), dtype=_INT64)
        runs[:, 0] = lengths["stream"] + np.cumsum(run_lengths)
        runs[:, 1] = lengths["payload_heap"] + np.cumsum([len(p) for p in payloads], dtype=_INT64)
        positions = lengths["runs"] + np.arange(len(runs))
        return {
            "stream": stream,
            "record_ends": np.asarray([lengths["stream"] + len(stream)], dtype=_INT64),
            "runs": runs,
            "payload_heap": heap,
            "run_index": runs[positions % self.run_chunk_rows == 0],
        }
