"""``StreamNumpyFormat``: aligned fields (tokens, loss mask, ...) as one structured stream."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Generic, TypeVar

import numpy as np

from rangestream.errors import InvalidRecordError
from rangestream.formats.casting import cast_fitting
from rangestream.layout.dtypes import check_plain_dtype
from rangestream.types import StreamStorageFormat, Vector

DataT = TypeVar("DataT", bound=Mapping[str, Any])


class StreamNumpyFormat(StreamStorageFormat[DataT, DataT, Any], Generic[DataT]):
    """Pack a mapping of equal-length 1-D arrays into one structured stream array.

    Fields are interleaved per element, so a window of every field is one contiguous byte
    range (one request). ``unpack`` returns each field as a view of the window.

    Parameters
    ----------
    stream_dtype
        Structured dtype; its field names are the mapping's keys.
    data_type
        Only sets the type parameter for type checkers; ignored at runtime.
    """

    def __init__(self, stream_dtype: np.dtype[Any], data_type: type[DataT] | None = None) -> None:
        dtype = np.dtype(stream_dtype)
        if dtype.names is None:
            raise ValueError(f"StreamNumpyFormat needs a structured dtype, got {dtype}")
        check_plain_dtype(dtype, "StreamNumpyFormat")
        super().__init__(dtype)

    def pack(self, data: DataT) -> Vector:
        names = self.stream_dtype.names or ()
        if not isinstance(data, Mapping):
            raise InvalidRecordError(
                f"StreamNumpyFormat.pack takes a mapping of {list(names)}, "
                f"got {type(data).__name__}"
            )
        if set(data) != set(names):
            raise InvalidRecordError(
                f"record fields {sorted(data)} differ from the format's fields {sorted(names)}"
            )
        length = None
        columns = {}
        for name in names:
            column = np.asarray(data[name])
            if column.ndim != 1:
                raise InvalidRecordError(f"field {name!r} must be 1-D, got shape {column.shape}")
            if length is None:
                length = len(column)
            elif len(column) != length:
                raise InvalidRecordError(
                    f"field {name!r} has {len(column)} elements, expected {length}"
                )
            expected = self.stream_dtype.fields[name][0]  # type: ignore[index]
            # the values are checked too: same_kind alone lets 2**31 wrap into <i4
            columns[name] = cast_fitting(column, expected, f"field {name!r}")
        out = np.empty(length or 0, dtype=self.stream_dtype)
        for name, column in columns.items():
            out[name] = column
        return out

    def unpack(self, stream: Vector, shard_lengths: Vector, shards: Vector) -> DataT:
        return {name: stream[name] for name in self.stream_dtype.names or ()}  # type: ignore[return-value]
