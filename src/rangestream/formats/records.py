"""``RecordFormat``: a dict of named arrays, lists of arrays and scalars, without pickle.

A record is a mapping of field name to value, where each field has a fixed *kind* for the
whole dataset (its ``RecordField``): a numpy dtype, the number of dimensions of each array
(``ndim``; 0 for scalars) and how many list levels wrap the arrays (``depth``; 0 for one
array, 1 for a list of arrays, ...). The field list is the format's *schema*: stored once in
the dataset (``schema()``, parsed back as untrusted input by ``from_schema``), not per record.

Byte layout of one encoded record (all integers little-endian uint64 unless stated)::

    offset 0   magic b"RSR" and the version byte 1
    offset 4   uint32: number of fields F (must equal the schema's)
    offset 8   F uint64: end offset of each field's section, in schema order
    offset H = 8 + 8 F: the sections; section i starts at the end of section i - 1 (or at
               H) rounded up to a multiple of 8, and ends at its stored end

    section of a scalar:            the value's bytes
    section of an array (ndim n):   n uint64 extents, then the elements in C order
    section of a list (depth d):    uint64 count k, k uint64 element ends (relative to the
                                    section's start), then k sections of depth d - 1, each
                                    starting at the previous end rounded up to 8

Every section is self-contained (offsets inside a list are relative to its start), so a
reader that knows the header can fetch and decode only the fields it wants:
``field_spans(header)`` gives each field's byte range from the first ``header_nbytes``
bytes, ``decode_field(name, section)`` decodes one section, and ``unpack_keys`` does both on
a whole record. Array data starts 8-byte aligned relative to the record's start.

Decoding checks every offset, count and extent against the bytes it has, so damaged or
hostile bytes raise ``CorruptDataError`` instead of reading out of bounds or allocating
without bound. Values decode as numpy arrays (writable copies) and numpy scalars.
"""

from __future__ import annotations

import math
import struct
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from rangestream.errors import CorruptDataError, InvalidRecordError, MetadataError
from rangestream.formats.field_values import fit_to_field
from rangestream.types import DocumentStorageFormat, StorageBufferTypes

__all__ = ["RecordField", "RecordFormat"]

#: The ``format`` name under which the schema is stored.
FORMAT_NAME = "records"
FORMAT_VERSION = 1
MAGIC = b"RSR\x01"
MAX_FIELDS = 4096
MAX_NAME_CHARS = 256
MAX_NDIM = 32
MAX_DEPTH = 8
_KINDS = "biufc"
_U64 = np.dtype("<u8")
_HEADER = struct.Struct("<4sI")


def _align(position: int) -> int:
    return (position + 7) & ~7


@dataclass(frozen=True)
class RecordField:
    """One field of a record schema.

    Parameters
    ----------
    name
        The record key.
    dtype
        Any fixed-width numeric or bool numpy dtype; stored little-endian.
    ndim
        Dimensions of each array: 0 stores scalars, 1 vectors (token ids), 2 matrices...
    depth
        List levels around the arrays: 0 for one array per record, 1 for a list of arrays
        (GRPO's ``responses``), 2 for a list of lists of arrays, and so on.
    """

    name: str
    dtype: np.dtype[Any]
    ndim: int = 1
    depth: int = 0

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not 0 < len(self.name) <= MAX_NAME_CHARS:
            raise ValueError(
                f"field names are non-empty strings of at most {MAX_NAME_CHARS} characters, "
                f"got {self.name!r}"
            )
        try:
            dtype = np.dtype(self.dtype)
        except TypeError as error:
            raise ValueError(f"field {self.name!r}: {self.dtype!r} is not a dtype") from error
        if dtype.kind not in _KINDS or dtype.fields is not None or dtype.subdtype is not None:
            raise ValueError(
                f"field {self.name!r} has dtype {dtype}: records store fixed-width numeric "
                "or bool values only"
            )
        object.__setattr__(self, "dtype", dtype.newbyteorder("<"))
        for attribute, bound in (("ndim", MAX_NDIM), ("depth", MAX_DEPTH)):
            value = getattr(self, attribute)
            if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= bound:
                raise ValueError(
                    f"field {self.name!r}: {attribute} must be an integer in 0..{bound}, "
                    f"got {value!r}"
                )

    def describe(self) -> str:
        inner = f"{self.dtype.newbyteorder('=')}" + (
            " scalar" if self.ndim == 0 else f" array of {self.ndim} dims"
        )
        for _ in range(self.depth):
            inner = f"list of ({inner})"
        return inner

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "dtype": self.dtype.str, "ndim": self.ndim, "depth": self.depth}


class RecordFormat(DocumentStorageFormat[Mapping[str, Any], dict[str, Any]]):
    """Records of named arrays, lists of arrays and scalars, for ``DocumentStorage``.

    The safe alternative to ``DocumentPickleFormat``: decoding runs no code chosen by the
    data, and the schema lives in the dataset rather than in each record. Used by the
    ``dpo`` and ``grpo`` presets.

    Parameters
    ----------
    fields
        The schema, in stored order. ``RecordFormat.from_record(example)`` infers it.
    """

    #: Recorded in the dataset's schema beside the fields (``DocumentStorage``).
    payload_encoding = FORMAT_NAME

    def __init__(self, fields: Iterable[RecordField]) -> None:
        self.fields: tuple[RecordField, ...] = tuple(fields)
        if not 0 < len(self.fields) <= MAX_FIELDS:
            raise ValueError(f"a record schema has 1..{MAX_FIELDS} fields, got {len(self.fields)}")
        names = [spec.name for spec in self.fields]
        if len(set(names)) != len(names):
            raise ValueError(f"field names repeat: {names}")
        self._by_name = {spec.name: i for i, spec in enumerate(self.fields)}
        self.header_nbytes = 8 + 8 * len(self.fields)

    def __repr__(self) -> str:
        return f"RecordFormat({list(self.fields)!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, RecordFormat) and other.fields == self.fields

    def __hash__(self) -> int:
        return hash(self.fields)

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.fields,))

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(spec.name for spec in self.fields)

    # -- schema ---------------------------------------------------------------------------
    @classmethod
    def from_record(cls, record: Mapping[str, Any]) -> RecordFormat:
        """The schema of ``record``: its keys in order, each value's dtype and nesting.

        A list of numbers is a 1-D array; a list whose items are arrays or lists is a list
        field. Empty lists say nothing about their items: pass an explicit schema then.
        """
        if not isinstance(record, Mapping) or not record:
            raise InvalidRecordError(
                f"a record is a non-empty mapping of names to values, got {type(record).__name__}"
            )
        return cls(_infer(str(name), value) for name, value in record.items())

    def schema(self) -> dict[str, Any]:
        """The JSON form stored in the dataset (see ``from_schema``)."""
        return {
            "format": FORMAT_NAME,
            "version": FORMAT_VERSION,
            "fields": [spec.to_json() for spec in self.fields],
        }

    @classmethod
    def from_schema(cls, value: Any, where: str = "stored record schema") -> RecordFormat:
        """Parse a stored schema, refusing anything malformed (it is untrusted input)."""
        if not isinstance(value, dict) or value.get("format") != FORMAT_NAME:
            raise MetadataError(f"{where} is not a {FORMAT_NAME!r} schema: {value!r:.200}")
        if value.get("version") != FORMAT_VERSION:
            raise MetadataError(
                f"{where} has version {value.get('version')!r}; this library reads {FORMAT_VERSION}"
            )
        fields = value.get("fields")
        if not isinstance(fields, list) or not 0 < len(fields) <= MAX_FIELDS:
            raise MetadataError(f"{where}: fields must be a list of 1..{MAX_FIELDS} entries")
        parsed = []
        for number, item in enumerate(fields):
            if not isinstance(item, dict) or set(item) != {"name", "dtype", "ndim", "depth"}:
                raise MetadataError(f"{where}: field {number} is malformed: {item!r:.200}")
            dtype = item["dtype"]
            if not isinstance(dtype, str) or len(dtype) > 8:
                raise MetadataError(f"{where}: field {number} has a bad dtype {dtype!r:.50}")
            try:
                parsed.append(
                    RecordField(item["name"], np.dtype(dtype), item["ndim"], item["depth"])
                )
            except (TypeError, ValueError) as error:
                raise MetadataError(f"{where}: field {number}: {error}") from error
        try:
            return cls(parsed)
        except ValueError as error:
            raise MetadataError(f"{where}: {error}") from error

    # -- encoding -------------------------------------------------------------------------
    def pack(self, data: Mapping[str, Any]) -> bytes:
        """Encode one record; every value is checked (and cast only if its values fit)."""
        if not isinstance(data, Mapping):
            raise InvalidRecordError(
                f"RecordFormat.pack takes a mapping of {list(self.names)}, "
                f"got {type(data).__name__}"
            )
        if len(data) != len(self.fields) or any(name not in data for name in self.names):
            raise InvalidRecordError(
                f"record fields {sorted(map(str, data))} differ from the schema's "
                f"{sorted(self.names)}"
            )
        out = bytearray(self.header_nbytes)
        ends = []
        for spec in self.fields:
            out += bytes(_align(len(out)) - len(out))
            start = len(out)
            _encode(out, start, data[spec.name], spec, spec.depth, f"field {spec.name!r}")
            ends.append(len(out))
        _HEADER.pack_into(out, 0, MAGIC, len(self.fields))
        out[8 : self.header_nbytes] = np.asarray(ends, dtype=_U64).tobytes()
        return bytes(out)

    # -- decoding -------------------------------------------------------------------------
    def field_spans(
        self, header: StorageBufferTypes, size: int | None = None
    ) -> dict[str, tuple[int, int]]:
        """Each field's ``[start, stop)`` byte range in its record, from the record's header.

        ``header`` is at least the first ``header_nbytes`` bytes of an encoded record;
        ``size``, if known, is the whole record's length and bounds the spans.
        """
        view = memoryview(header).cast("B")
        if len(view) < self.header_nbytes:
            raise CorruptDataError(
                f"a record header is {self.header_nbytes} bytes for {len(self.fields)} fields, "
                f"got {len(view)}"
            )
        magic, count = _HEADER.unpack_from(view, 0)
        if magic != MAGIC:
            raise CorruptDataError(
                f"not an encoded record (magic {bytes(magic)!r}, expected {MAGIC!r})"
            )
        if count != len(self.fields):
            raise CorruptDataError(
                f"an encoded record has {count} fields, the schema has {len(self.fields)}"
            )
        ends = np.frombuffer(view[8 : self.header_nbytes], dtype=_U64)
        spans = {}
        position = self.header_nbytes
        for spec, end in zip(self.fields, ends.tolist(), strict=True):
            start = _align(position)
            if end < start or (size is not None and end > size):
                raise CorruptDataError(
                    f"field {spec.name!r} of an encoded record spans [{start}, {end}), "
                    f"outside the record of {size} bytes"
                )
            spans[spec.name] = (start, end)
            position = end
        return spans

    def decode_field(self, name: str, section: StorageBufferTypes) -> Any:
        """Decode one field from its section's bytes (the span ``field_spans`` gives)."""
        index = self._by_name.get(name)
        if index is None:
            from rangestream.errors import UnknownFieldError

            raise UnknownFieldError(
                f"no field {name!r} in the record schema; fields are {list(self.names)}"
            )
        spec = self.fields[index]
        view = memoryview(section).cast("B")
        return _decode(view, spec, spec.depth, f"field {name!r}")

    def unpack_keys(self, encoded_data: StorageBufferTypes, keys: Sequence[str]) -> dict[str, Any]:
        """Decode only ``keys`` of one record (the others' bytes are never touched)."""
        view = memoryview(encoded_data).cast("B")
        spans = self.field_spans(view, len(view))
        if spans and max(stop for _, stop in spans.values()) != len(view):
            raise CorruptDataError(
                f"an encoded record is {len(view)} bytes but its fields end at "
                f"{max(stop for _, stop in spans.values())}"
            )
        out = {}
        for name in keys:
            if name not in spans:
                self.decode_field(name, b"")  # raises UnknownFieldError
            start, stop = spans[name]
            out[name] = self.decode_field(name, view[start:stop])
        return out

    def unpack(self, encoded_data: StorageBufferTypes, shard: int) -> dict[str, Any]:
        """Decode a whole record (``shard`` is not needed)."""
        return self.unpack_keys(encoded_data, self.names)


# -- inference ------------------------------------------------------------------------------
def _is_number(value: Any) -> bool:
    return isinstance(value, (bool, int, float, complex, np.generic))


def _infer(name: str, value: Any) -> RecordField:
    depth = 0
    while isinstance(value, (list, tuple)) and value and not all(_is_number(v) for v in value):
        depth += 1
        value = value[0]
    if isinstance(value, (list, tuple)) and not value:
        raise InvalidRecordError(
            f"field {name!r}: an empty list does not tell its item type; pass a RecordFormat "
            "with an explicit RecordField for it"
        )
    array = _as_array(value, f"field {name!r}")
    try:
        return RecordField(name, array.dtype, array.ndim, depth)
    except ValueError as error:
        raise InvalidRecordError(str(error)) from error


def _as_array(value: Any, what: str) -> np.ndarray:
    if isinstance(value, (str, bytes, Mapping)) or value is None:
        raise InvalidRecordError(
            f"{what} is a {type(value).__name__}; records hold numbers, arrays and lists"
        )
    module = type(value).__module__ or ""
    if module.split(".")[0] == "torch" and hasattr(value, "detach"):
        value = value.detach().cpu().numpy()
    try:
        array = np.asarray(value)
    except ValueError as error:  # ragged nested lists
        raise InvalidRecordError(f"{what} is not a regular array: {error}") from error
    if array.dtype.kind not in _KINDS or array.dtype.fields is not None:
        raise InvalidRecordError(
            f"{what} has dtype {array.dtype}; records hold numeric or bool values only"
        )
    return array


# -- encoding -------------------------------------------------------------------------------
def _encode(
    out: bytearray, section_start: int, value: Any, spec: RecordField, depth: int, what: str
) -> None:
    if depth == 0:
        array = _as_array(value, what)
        if array.ndim != spec.ndim:
            raise InvalidRecordError(
                f"{what} has {array.ndim} dimensions, the schema has {spec.describe()}"
            )
        array = fit_to_field(array, spec.dtype, spec.name).astype(spec.dtype, copy=False)
        if spec.ndim:
            out += np.asarray(array.shape, dtype=_U64).tobytes()
        out += np.ascontiguousarray(array).tobytes()
        return
    if isinstance(value, np.ndarray) and value.ndim >= 1:
        items: Sequence[Any] = list(value)
    elif isinstance(value, (list, tuple)):
        items = value
    else:
        raise InvalidRecordError(f"{what} must be a list (the schema has {spec.describe()})")
    count = len(items)
    table = len(out) + 8
    out += np.asarray([count], dtype=_U64).tobytes()
    out += bytes(8 * count)
    ends = []
    for number, item in enumerate(items):
        out += bytes(_align(len(out)) - len(out))
        _encode(out, len(out), item, spec, depth - 1, f"{what}[{number}]")
        ends.append(len(out) - section_start)
    if count:
        out[table : table + 8 * count] = np.asarray(ends, dtype=_U64).tobytes()


# -- decoding -------------------------------------------------------------------------------
def _decode(view: memoryview, spec: RecordField, depth: int, what: str) -> Any:
    size = len(view)
    if depth == 0:
        itemsize = spec.dtype.itemsize
        if spec.ndim == 0:
            if size != itemsize:
                raise CorruptDataError(
                    f"{what}: a scalar of {spec.dtype} is {itemsize} bytes, got {size}"
                )
            return np.frombuffer(view, dtype=spec.dtype)[0].copy()
        head = 8 * spec.ndim
        if size < head:
            raise CorruptDataError(f"{what}: {size} bytes cannot hold {spec.ndim} extents")
        shape = tuple(int(n) for n in np.frombuffer(view[:head], dtype=_U64))
        if any(n >= 1 << 48 for n in shape) or math.prod(shape) * itemsize != size - head:
            raise CorruptDataError(
                f"{what}: extents {shape} of {spec.dtype} do not match the {size - head} "
                "bytes stored"
            )
        return np.frombuffer(view[head:], dtype=spec.dtype).reshape(shape).copy()
    if size < 8:
        raise CorruptDataError(f"{what}: {size} bytes cannot hold a list's count")
    count = int(np.frombuffer(view[:8], dtype=_U64)[0])
    if count > (size - 8) // 8:
        raise CorruptDataError(f"{what}: a list of {count} items does not fit in {size} bytes")
    ends = np.frombuffer(view[8 : 8 + 8 * count], dtype=_U64).tolist()
    items = []
    position = 8 + 8 * count
    for number, end in enumerate(ends):
        start = _align(position)
        if not start <= end <= size:
            raise CorruptDataError(
                f"{what}[{number}] spans [{start}, {end}), outside the list's {size} bytes"
            )
        items.append(_decode(view[start:end], spec, depth - 1, f"{what}[{number}]"))
        position = end
    if position != size:
        raise CorruptDataError(f"{what}: items end at {position}, the list has {size} bytes")
    return items
