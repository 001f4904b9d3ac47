"""``StreamNumpyFormat``: aligned fields (tokens, loss mask, ...) as one structured stream."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Generic, TypeVar

import numpy as np

from rangestream.errors import InvalidRecordError, MetadataError
from rangestream.formats.field_values import fit_to_field
from rangestream.layout.dtypes import check_plain_dtype
from rangestream.types import StreamStorageFormat, Vector

DataT = TypeVar("DataT", bound=Mapping[str, Any])


class StreamNumpyFormat(StreamStorageFormat[DataT, DataT, Any], Generic[DataT]):
    """Pack a mapping of equal-length 1-D arrays into one structured stream array.

    Fields are interleaved per element, so a window of every field is one contiguous byte
    range (one request). ``unpack`` returns each field as a view of the window.

    Field values may be arrays of any numeric dtype or Python sequences; every value must
    fit its field's dtype (an id over 2**31 is refused by an ``"<i4"`` field, not wrapped).

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
        self.names: tuple[str, ...] = dtype.names

    #: The ``format`` name of the stored schema (``formats.described``).
    format_name = "stream_numpy"
    format_version = 1

    def schema(self) -> dict[str, Any]:
        """What the dataset records, beside its ``stream_dtype``, to reopen without this
        object: the dtype is the whole of the format."""
        return {"format": self.format_name, "version": self.format_version}

    @classmethod
    def from_schema(
        cls, value: Any, stream_dtype: np.dtype[Any] | None, where: str = "stored format"
    ) -> StreamNumpyFormat[Any]:
        """The format of a stored schema and the dataset's stored ``stream_dtype``."""
        if not isinstance(value, dict) or value.get("format") != cls.format_name:
            raise MetadataError(f"{where} is not a {cls.format_name!r} schema: {value!r:.200}")
        if value.get("version") != cls.format_version:
            raise MetadataError(
                f"{where} has {cls.format_name} version {value.get('version')!r:.40}; this "
                f"library reads {cls.format_version}"
            )
        if stream_dtype is None or stream_dtype.names is None:
            raise MetadataError(
                f"{where}: a {cls.format_name!r} stream needs a structured stream_dtype, "
                f"the store has {stream_dtype}"
            )
        return cls(stream_dtype)

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
            # values, not dtype kinds: an int64 id over 2**31 must not wrap into "<i4"
            columns[name] = fit_to_field(column, self.stream_dtype.fields[name][0], name)  # type: ignore[index]
        out = np.empty(length or 0, dtype=self.stream_dtype)
        for name, column in columns.items():
            out[name] = column
        return out

    def lone_field(self) -> tuple[str, np.dtype[Any]] | None:
        """``(name, dtype)`` when ``unpack`` of a window is just its one field, which fills
        the whole element (a token stream): a reader may then copy the window straight
        into a plain array of that dtype and return ``{name: array}``, the same values
        without the structured array and its field view. ``None`` otherwise, and for a
        subclass with its own ``unpack``."""
        if type(self).unpack is not StreamNumpyFormat.unpack or len(self.names) != 1:
            return None
        dtype, offset = self.stream_dtype.fields[self.names[0]][:2]  # type: ignore[index]
        if offset != 0 or dtype.itemsize != self.stream_dtype.itemsize or dtype.subdtype:
            return None
        return self.names[0], dtype

    def unpack(self, stream: Vector, shard_lengths: Vector, shards: Vector) -> DataT:
        names = self.names
        if len(names) == 1:  # a comprehension's frame costs more than the view it makes
            return {names[0]: stream[names[0]]}  # type: ignore[return-value]
        return {name: stream[name] for name in names}  # type: ignore[return-value]
